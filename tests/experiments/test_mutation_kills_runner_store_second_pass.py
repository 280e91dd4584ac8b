"""Tests that kill mutants which survived a second manual mutation audit of the run loop
(``experiments/runner.py``), the run store's locks (``experiments/store.py``) and the run files
read back (``experiments/results.py``), after the first audit (``test_mutation_kills_runner_data.py``,
``test_mutation_kills_gaps_results_store.py``).

The audit looked at the promises users rely on: a killed comparison resumes exactly, two workers
never train one run twice nor leave litter that blocks the other, a changed config is refused
rather than mixed with old results (and an unchanged one is never refused), corrupt files are
rebuilt or named, and failed or diverged runs are reported rather than dropped.

Each test's docstring names the mutant it kills (file and the mutation), or starts with "Bug:" for
a defect fixed with it. Every test is CPU-only,
deterministic and fast: the runner tests swap the trainer for a stub that writes a finished
``summary.json`` at once (or raises what the real trainer raises), so the code under test (skip,
lock, identity, restart, failure reporting) runs for real and nothing trains. Run folders, locks
and logs are written by hand.
"""

from __future__ import annotations

import json
import os
import re
import platform
import time

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments import runner as runner_mod
from diffusionformer.experiments import store
from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
from diffusionformer.experiments.results import finished_runs, first_reach, run_dir, run_status, select_evaluation
from diffusionformer.experiments.runner import run_experiment
from diffusionformer.experiments.store import LOCK_NAME, UNREADABLE_GRACE_S, acquire_lock, live_holder, read_lock
from diffusionformer.train import CheckpointError, NonFiniteLossError

ME = (os.getpid(), platform.node())
_EVAL = {"loss": 1.0, "val_acc": 0.5, "test_loss": 1.0, "test_acc": 0.25}


def _raw_config(tasks=("digits",), operators=({"name": "attention"},), **task_extra):
    """A one-seed comparison on digits as a plain dict (what a TOML file parses to)."""
    def task(name):
        return {"name": name, "dataset": "digits", "model": "vit-digits",
                "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                "train": {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
                          "log_interval": 1, "checkpoint_interval": 2}, **task_extra}
    return {"name": "mk2", "seeds": [0], "tasks": [task(n) for n in tasks], "operators": [dict(o) for o in operators]}


def _config(*overrides, **kw):
    return load_experiment_config(_raw_config(**kw), list(overrides))


class _StubTrainer:
    """Stands in for :class:`~diffusionformer.train.Trainer`: records the run it was handed, then
    raises ``raises[run folder name]`` if set, else writes a completed summary at once."""

    calls: list = []
    raises: dict = {}
    weights: list = []

    def __init__(self, model, adapter, cfg, rdir, resume=True):
        self.rdir = rdir
        _StubTrainer.calls.append(rdir)
        _StubTrainer.weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    def fit(self):
        exc = _StubTrainer.raises.get(self.rdir.parent.name)
        if exc is not None:
            raise exc
        summary = {"status": "completed", "step": 2, "elapsed": 0.0, "num_parameters": 1,
                   "eval": {"split": "eval", "step": 2, "loss": 1.0, "metrics": dict(_EVAL)}}
        (self.rdir / "summary.json").write_text(json.dumps(summary))
        return summary


@pytest.fixture
def stub(monkeypatch):
    _StubTrainer.calls, _StubTrainer.raises, _StubTrainer.weights = [], {}, []
    monkeypatch.setattr(runner_mod, "Trainer", _StubTrainer)
    monkeypatch.setattr(runner_mod, "_write_outputs", lambda *a, **k: None)  # no plots: fast
    return _StubTrainer


def _logged():
    lines: list[str] = []
    return lines, lines.append


# ---------------------------------------------------------------------------------------- runner.py


def test_restart_of_a_finished_comparison_records_its_manifest(tmp_path, stub):
    """Kills runner.py ``done_before = resume and _completed(...)`` -> ``_completed(...)`` (``--restart``
    retrains a finished run but, counting it as done, never writes the manifest: the commit and
    machine that produced the new results are not recorded)."""
    cfg = _config()
    run_experiment(cfg, tmp_path, progress=False)
    (tmp_path / "mk2" / "manifest.json").unlink()
    run_experiment(cfg, tmp_path, progress=False, resume=False)
    assert len(stub.calls) == 2
    assert json.loads((tmp_path / "mk2" / "manifest.json").read_text())["config"]["name"] == "mk2"


def test_an_earlier_manifests_commits_are_kept_and_a_corrupt_one_is_rewritten(tmp_path, stub):
    """Kills runner.py ``merged_manifest(_read_manifest(out), ...)`` -> ``_manifest(config)`` (the
    commits of earlier invocations are lost) and runner._read_manifest catching only OSError (a
    truncated ``manifest.json`` stops the comparison with a JSONDecodeError instead of being rewritten)."""
    out = tmp_path / "mk2"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"git_commit": "0ldc0mm1t", "git_commits": ["0ldc0mm1t"]}))
    run_experiment(_config(), tmp_path, progress=False)
    assert json.loads((out / "manifest.json").read_text())["git_commits"][0] == "0ldc0mm1t"
    (out / "manifest.json").write_text('{"git_commit": "abc"')  # killed mid-write by an old version
    (run_dir(out, "digits", "attention", 0) / "summary.json").unlink()  # so that something trains
    assert run_experiment(_config(), tmp_path, progress=False)[0].status == "completed"
    assert json.loads((out / "manifest.json").read_text())["config"]["name"] == "mk2"


def test_a_tasks_filter_keeps_config_order(tmp_path, stub):
    """Kills runner._choose_tasks returning the tasks in the order of the filter (``--tasks b,a``
    trains and reports ``b`` first: results.json rows and the returned runs follow the command
    line instead of the config)."""
    cfg = _config(tasks=("a", "b"))
    got = run_experiment(cfg, tmp_path, progress=False, tasks=["b", "a"])
    assert [r.task for r in got] == ["a", "b"]
    assert [p.parent.parent.name for p in stub.calls] == ["a", "b"]


def test_an_unknown_task_name_is_refused_by_name(tmp_path, stub):
    """Kills runner._choose_tasks ``if unknown or not names`` -> ``if not names`` (a misspelt ``--tasks``
    name trains nothing and reports success)."""
    with pytest.raises(ValueError, match=r"unknown task\(s\) \['digitz'\] for 'mk2'; its tasks are \['digits'\]"):
        run_experiment(_config(), tmp_path, progress=False, tasks=["digits", "digitz"])
    assert stub.calls == [] and not (tmp_path / "mk2").exists()


def test_a_runs_initial_weights_depend_on_its_seed_only(tmp_path, stub):
    """Kills runner._train_one without ``seed_everything(seed)`` before the model is built (a resumed
    or re-run seed starts from other initial weights than the uninterrupted run: results are not
    reproducible and a resume from step 0 differs)."""
    import torch

    cfg = _config()
    run_experiment(cfg, tmp_path / "a", progress=False)
    torch.rand(17)  # the global generator moves on, as other work in the process would move it
    run_experiment(cfg, tmp_path / "b", progress=False)
    first, second = stub.weights
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_world_size_one_runs_without_a_process_group(tmp_path, stub, monkeypatch):
    """Kills runner._maybe_init_distributed ``WORLD_SIZE <= 1`` -> ``< 1`` (a plain run under a
    launcher that sets ``WORLD_SIZE=1`` tries to join a process group that does not exist)."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    calls = []
    import diffusionformer.train as train_pkg

    monkeypatch.setattr(train_pkg, "init_distributed", lambda *a, **k: calls.append(a) or pytest.fail("joined"))
    assert run_experiment(_config(), tmp_path, progress=False)[0].status == "completed"
    assert calls == []


def test_the_identity_leaves_out_fields_at_their_new_defaults():
    """Kills runner._without_new_defaults: the ``key != "loggers"`` exception dropped (``loggers = ["jsonl"]``,
    the default, joins every run's identity: each run made before loggers existed is refused), ``value in
    default`` -> ``value == default`` (``rope_base`` at either of its defaults joins the identity), and
    the ``rope_base`` defaults changed."""
    f = runner_mod._without_new_defaults
    d = {"loggers": ["jsonl"], "grad_accum_steps": 1, "weight_decay_rule": "default", "lr": 0.1}
    assert f(d, runner_mod._NEW_TRAIN_FIELDS) == {"lr": 0.1}
    assert f({"loggers": ("jsonl",)}, runner_mod._NEW_TRAIN_FIELDS) == {}
    assert f({"loggers": ["jsonl", "csv"], "grad_accum_steps": 2}, runner_mod._NEW_TRAIN_FIELDS) == {
        "loggers": ["jsonl", "csv"], "grad_accum_steps": 2}
    m = runner_mod._NEW_MODEL_FIELDS
    assert f({"rope_base": 100.0, "rope": False, "dim": 8}, m) == {"dim": 8}
    assert f({"rope_base": 10000.0, "pe": None, "pe_dim": 8}, m) == {}
    assert f({"rope_base": 500.0, "pe_dim": 16}, m) == {"rope_base": 500.0, "pe_dim": 16}


def test_a_run_made_before_the_new_fields_existed_still_resumes(tmp_path, stub):
    """Kills the same mutants end to end: the identity a run records holds no ``loggers``, ``rope_base``
    nor ``grad_accum_steps`` (fields added after runs were published), and a ``run_config.json``
    written by hand the way an older version wrote it is accepted on resume."""
    cfg = _config()
    run_experiment(cfg, tmp_path, progress=False)
    rdir = run_dir(tmp_path / "mk2", "digits", "attention", 0)
    stored = json.loads((rdir / "run_config.json").read_text())
    assert {"loggers", "grad_accum_steps", "weight_decay_rule"}.isdisjoint(stored["train"])
    assert {"rope", "rope_base", "n_kv_head", "pe", "pe_dim"}.isdisjoint(stored["model_config"])
    (rdir / "summary.json").unlink()  # interrupted: it must resume, not be refused
    run_experiment(cfg, tmp_path, progress=False)
    assert len(stub.calls) == 2


def test_the_recorded_identity_has_the_data_keys_and_a_changed_data_seed_is_refused_by_name(tmp_path, stub):
    """Kills runner._run_identity without ``data_seed`` (a changed split is mixed with the old runs),
    without ``dataset_options``, and runner._check_identity naming every key instead of the changed
    ones (``changed`` list built ``if True``)."""
    run_experiment(_config(), tmp_path, progress=False)
    rdir = run_dir(tmp_path / "mk2", "digits", "attention", 0)
    stored = json.loads((rdir / "run_config.json").read_text())
    assert set(stored) == {"dataset", "dataset_options", "data_seed", "model", "model_config", "train",
                           "eval_batch_size"}  # null: unset (sitting 57)
    assert (stored["dataset"], stored["dataset_options"], stored["model"]) == ("digits", {}, "vit-digits")
    with pytest.raises(ValueError) as err:
        run_experiment(_config("tasks.digits.data_seed=7"), tmp_path, progress=False)
    assert "made with a different data_seed;" in str(err.value) and str(rdir) in str(err.value)
    assert len(stub.calls) == 1


def test_label_smoothing_and_augment_join_the_identity_only_when_set(tmp_path, stub):
    """Kills runner._run_identity dropping ``label_smoothing`` or ``augment`` (a run trained without them
    resumes under a config that sets them: old and new results mixed)."""
    run_experiment(_config(), tmp_path, progress=False)
    rdir = run_dir(tmp_path / "mk2", "digits", "attention", 0)
    (rdir / "summary.json").unlink()
    # interrupted after a checkpoint (the stub writes none): one that stopped before its first starts again instead
    (rdir / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="different label_smoothing"):
        run_experiment(_config("tasks.digits.label_smoothing=0.1"), tmp_path, progress=False)
    with pytest.raises(ValueError, match="different augment"):
        run_experiment(_config("tasks.digits.augment.flip=true"), tmp_path, progress=False)
    assert len(stub.calls) == 1


def test_the_device_is_not_part_of_a_runs_identity(tmp_path, stub):
    """Kills runner._run_identity keeping ``device`` (``("progress", "device")`` -> ``("progress",)``:
    a run started with ``--device cpu`` is refused when resumed without it)."""
    cfg = _config()
    run_experiment(cfg, tmp_path, progress=False, device="cpu")
    (run_dir(tmp_path / "mk2", "digits", "attention", 0) / "summary.json").unlink()
    assert run_experiment(cfg, tmp_path, progress=False)[0].status == "completed"
    assert len(stub.calls) == 2


def test_a_diverged_or_unresumable_run_is_reported_failed_and_the_others_go_on(tmp_path, stub):
    """Kills runner._train_one returning None for a run stopped by a non-finite loss or a checkpoint
    that cannot be read (the run vanishes from the results instead of being reported failed), its
    except clauses narrowed (one bad run stops the whole comparison), and run_experiment keeping only
    completed results."""
    cfg = _config(operators=({"name": "attention"}, {"name": "lap", "laplacian_heads": 1}, {"name": "lap2",
                                                                                             "laplacian_heads": 2}))
    stub.raises = {"attention": NonFiniteLossError("loss is nan at step 1", step=1, last_checkpoint_step=None),
                   "lap": CheckpointError("checkpoint.pt is not a checkpoint")}
    lines, log = _logged()
    got = run_experiment(cfg, tmp_path, progress=False, log=log)
    assert [(r.operator, r.status, r.value) for r in got] == [
        ("attention", "failed: loss is nan at step 1", None),
        ("lap", "failed: checkpoint.pt is not a checkpoint", None),
        ("lap2", "completed", _EVAL["test_acc"])]
    # the non-finite note: the error's own words (which name the checkpoint kept, if any) and the run folder
    assert any("loss is nan at step 1 (run folder" in m for m in lines) and any("Delete" in m for m in lines)


def test_a_diverged_summary_on_disk_is_trained_again_not_read_as_finished(tmp_path, stub):
    """Kills runner._train_one ``status == "completed"`` -> ``status != "failed"`` (a run whose summary
    says ``non_finite`` is read back as a finished result)."""
    rdir = run_dir(tmp_path / "mk2", "digits", "attention", 0)
    rdir.mkdir(parents=True)
    (rdir / "summary.json").write_text(json.dumps({"status": "non_finite", "step": 1}))
    got = run_experiment(_config(), tmp_path, progress=False)
    assert len(stub.calls) == 1 and got[0].value == _EVAL["test_acc"]


def test_restart_wipes_the_runs_subfolders_too(tmp_path, stub):
    """Kills runner._train_one's restart wiping files only (``shutil.rmtree`` of a folder dropped: a run
    restarted with ``--restart`` keeps stale artefacts, e.g. old plots or per-step dumps)."""
    cfg = _config()
    run_experiment(cfg, tmp_path, progress=False)
    rdir = run_dir(tmp_path / "mk2", "digits", "attention", 0)
    (rdir / "old_dumps").mkdir()
    (rdir / "old_dumps" / "x.txt").write_text("old")
    run_experiment(cfg, tmp_path, progress=False, resume=False)
    assert not (rdir / "old_dumps").exists() and len(stub.calls) == 2


def test_learned_operator_values_are_recorded_with_the_run(tmp_path, stub):
    """Kills runner._train_one skipping ``learned_operators.json`` (``if learned`` -> ``if False``: the
    learned diffusion times of a finished run are lost and its tables show none)."""
    cfg = _config(operators=({"name": "heat", "heads": "attention:1,heat(t=0.5, learnable=True, steps=2):1"},))
    (r,) = run_experiment(cfg, tmp_path, progress=False)
    path = run_dir(tmp_path / "mk2", "digits", "heat", 0) / "learned_operators.json"
    learned = json.loads(path.read_text())
    assert learned and r.learned == learned
    assert all(isinstance(v, list) and v for v in learned.values())


# ---------------------------------------------------------------------------------------- store.py


def _dead_pid():
    """A process id that runs nowhere on this host (the highest ids are free)."""
    for pid in range(4_000_000, 3_000_000, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    pytest.skip("no free pid")


def _old(path):
    t = time.time() - UNREADABLE_GRACE_S - 5
    os.utime(path, (t, t))


def test_a_takeover_leaves_only_the_lock_behind(tmp_path):
    """Kills store._take_over without ``brk.unlink`` in its ``finally`` (a ``.lock.break`` left after every
    takeover makes the next worker's takeover of that run fail for a minute) and store.acquire_lock without
    ``tmp.unlink`` (a ``.lock.<pid>.<hex>.tmp`` left per claim)."""
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": _dead_pid(), "host": platform.node()}))
    assert acquire_lock(tmp_path) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]
    assert read_lock(tmp_path) == ME
    other = tmp_path / "held"
    other.mkdir()
    (other / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    assert acquire_lock(other) == "process 1 on elsewhere"
    assert sorted(p.name for p in other.iterdir()) == [LOCK_NAME]


def test_an_abandoned_takeover_is_cleared_and_the_stale_lock_then_claimed(tmp_path):
    """Kills store.acquire_lock ``if taken is not None`` -> ``if True`` (after clearing an abandoned
    ``.lock.break`` it reports the run as claimed while the dead worker's lock is still there: it trains
    without holding the lock, and a third worker may train it too)."""
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": _dead_pid(), "host": platform.node()}))
    (tmp_path / ".lock.break").write_text("{}")
    _old(tmp_path / ".lock.break")
    assert acquire_lock(tmp_path) is None
    assert read_lock(tmp_path) == ME and not (tmp_path / ".lock.break").exists()


def test_a_takeover_in_progress_elsewhere_means_held(tmp_path):
    """Kills store.acquire_lock ``return None if taken else _describe(...)`` -> ``return None`` (a worker
    that loses the ``.lock.break`` race claims the run without holding its lock)."""
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": _dead_pid(), "host": platform.node()}))
    (tmp_path / ".lock.break").write_text("{}")  # fresh: another worker is taking it over now
    assert acquire_lock(tmp_path) is not None
    assert read_lock(tmp_path) != ME


def test_a_lock_that_keeps_reappearing_is_reported_not_claimed(tmp_path, monkeypatch):
    """Kills store.acquire_lock returning None after its three attempts (claimed without a lock)."""
    def link(src, dst):
        raise FileExistsError(dst)  # a lock is there at each link, gone again at each read

    monkeypatch.setattr(store.os, "link", link)
    assert acquire_lock(tmp_path) == f"a process that keeps re-creating {tmp_path / LOCK_NAME}"
    assert list(tmp_path.iterdir()) == []


def test_a_filesystem_without_hard_links_is_an_error_not_a_held_run(tmp_path, monkeypatch):
    """Kills store._link_exclusive catching every OSError as "held" (a results folder on a filesystem without hard
    links would report every run as held by some process and train nothing, silently): there the lock is created
    exclusively (``O_EXCL``) instead, and an error that is not a missing hard link still raises."""
    def link(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(store.os, "link", link)
    assert acquire_lock(tmp_path) is None
    assert read_lock(tmp_path) == ME

    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.os, "link", full)
    with pytest.raises(OSError, match="No space left"):
        acquire_lock(tmp_path / "other")


def test_read_lock_of_a_lock_that_is_a_folder_is_none(tmp_path):
    """Kills store.read_lock catching only FileNotFoundError (a ``.lock`` that is a folder, or cannot be
    read, crashes ``release_lock`` at the end of a run)."""
    (tmp_path / LOCK_NAME).mkdir()
    assert read_lock(tmp_path) is None
    store.release_lock(tmp_path)  # not ours: left alone, no error
    assert (tmp_path / LOCK_NAME).is_dir()


def test_the_lock_records_this_host(tmp_path):
    """Kills store.acquire_lock writing another host name (a worker killed on this host leaves a lock
    that never counts as stale: its runs are skipped forever)."""
    assert acquire_lock(tmp_path) is None
    record = json.loads((tmp_path / LOCK_NAME).read_text())
    assert {k: record[k] for k in ("pid", "host")} == {"pid": ME[0], "host": ME[1]}
    # start: this process's start time where /proc has it; machine: this machine's id where it has one
    assert set(record) <= {"pid", "host", "start", "machine"}
    assert live_holder(tmp_path) == ME


# ---------------------------------------------------------------------------------------- results.py


def _eval(step, **metrics):
    return {"split": "eval", "step": step, "metrics": metrics}


def _digits(seeds=(0,), **task):
    return ExperimentConfig("r", [TaskConfig("d", "digits", "vit-digits", **task)], [OperatorSetting("attention")],
                            seeds=list(seeds))


def test_run_folders_follow_the_documented_layout(tmp_path):
    """Kills results.run_dir swapping task and operator (``runs/<operator>/<task>/seed<k>``: folders
    written by earlier versions and scripts that read them are no longer found)."""
    assert run_dir(tmp_path, "cora", "heat", 3) == tmp_path / "runs" / "cora" / "heat" / "seed3"


def test_a_summary_folder_is_an_unfinished_run(tmp_path):
    """Kills results.read_json_dict catching only ValueError (a ``summary.json`` that is a folder crashes
    ``finished_runs`` and ``run_status`` with IsADirectoryError instead of counting the run unfinished)."""
    rdir = run_dir(tmp_path / "r", "d", "attention", 0)
    (rdir / "summary.json").mkdir(parents=True)
    assert finished_runs(tmp_path / "r", _digits()) == []
    assert run_status(_digits(), tmp_path)[0]["state"] == "missing"


def test_run_status_of_a_failed_and_a_diverged_run(write_run, tmp_path):
    """Kills results._failed without ``status == "non_finite"`` and with ``startswith("failed")`` ->
    ``== "failed"`` (a failed or diverged run shows as interrupted or missing: it looks like it will
    finish on the next ``run``)."""
    config = _digits(seeds=(0, 1))
    write_run(tmp_path / "r", "d", "attention", 0, [], status="failed: loss is nan")
    write_run(tmp_path / "r", "d", "attention", 1, [], status="non_finite")
    assert [row["state"] for row in run_status(config, tmp_path)] == ["failed", "failed"]


def test_run_status_of_a_completed_run_and_of_a_run_with_only_a_checkpoint(write_run, tmp_path):
    """Kills results.run_status dropping ``elapsed`` of a completed run, and counting a run with a checkpoint
    but no log yet as missing (``or checkpoint.pt`` dropped); its budget comes from the resolved defaults."""
    config = _digits(seeds=(0, 1), train={"batch_size": 8})
    write_run(tmp_path / "r", "d", "attention", 0, [], step=12, elapsed=3.5)
    rdir = run_dir(tmp_path / "r", "d", "attention", 1)
    rdir.mkdir(parents=True)
    (rdir / "checkpoint.pt").write_bytes(b"x")
    rows = run_status(config, tmp_path)
    from diffusionformer.experiments.config import train_config

    budget = train_config(config.tasks[0], 0).max_steps
    assert budget is not None and rows[0]["max_steps"] == budget
    assert [(r["state"], r["step"], r["elapsed"]) for r in rows] == [("completed", 12, 3.5), ("interrupted", 0, None)]


def test_the_number_of_parameters_is_read_back(write_run, tmp_path):
    """Kills results._result_from_files dropping ``num_parameters`` (the tables' parameter column empty for
    every run read back from disk)."""
    write_run(tmp_path / "r", "d", "attention", 0, [], num_parameters=1234, elapsed=2.0,
               eval=_eval(7, test_acc=0.5))
    (r,) = finished_runs(tmp_path / "r", _digits())
    assert (r.num_parameters, r.elapsed, r.value) == (1234, 2.0, 0.5)


def test_select_by_a_loss_is_minimised_and_ties_keep_the_earliest():
    """Kills results.select_evaluation maximising a loss (``sign`` always 1) and ``score > best`` -> ``>=``
    (the latest of tied evaluations)."""
    task = TaskConfig("t", "digits", "vit-digits", select_by="val_loss")
    records = [_eval(10, val_loss=0.9, test_acc=0.1), _eval(20, val_loss=0.4, test_acc=0.6),
               _eval(30, val_loss=0.4, test_acc=0.7), _eval(40, val_loss=0.8, test_acc=0.9)]
    assert select_evaluation(records, task) == (0.6, 20)


def test_first_reach_sorts_by_step_meets_an_equal_threshold_and_minimises_a_loss():
    """Kills results.first_reach without sorting by step (a log appended out of order after a resume
    reports a later step), ``>=`` -> ``>`` (a value equal to the threshold does not count) and a loss
    key maximised."""
    acc = TaskConfig("t", "digits", "vit-digits", reach={"val_acc": 0.9})
    assert first_reach([_eval(30, val_acc=0.95), _eval(20, val_acc=0.9), _eval(10, val_acc=0.5)], acc) == 20
    loss = TaskConfig("t", "digits", "vit-digits", reach={"val_loss": 0.5})
    assert first_reach([_eval(10, val_loss=2.0), _eval(20, val_loss=0.5), _eval(30, val_loss=0.1)], loss) == 20


@pytest.mark.parametrize("record", [["eval", 7], "eval", {"split": "eval", "metrics": [0.5]}])
def test_bug_a_summary_whose_evaluation_is_not_a_record_is_named(write_run, tmp_path, record):
    """Bug: a completed ``summary.json`` whose ``eval`` is not an evaluation record (a list, a string, or
    ``metrics`` a list: a file edited by hand or written by another tool) stopped ``finished_runs`` (and so
    ``run``, ``table`` and ``publish``) with an AttributeError naming no file; it is now a ValueError naming
    the file, and the file is left as it was."""
    rdir = write_run(tmp_path / "r", "d", "attention", 0, [], eval=record)
    before = (rdir / "summary.json").read_bytes()
    with pytest.raises(ValueError, match=re.escape(f"{rdir / 'summary.json'}: 'eval' is not an evaluation record")):
        finished_runs(tmp_path / "r", _digits())
    assert (rdir / "summary.json").read_bytes() == before


def test_bug_a_summary_without_the_tasks_metric_is_named(write_run, tmp_path):
    """Bug: a completed ``summary.json`` whose evaluation lacks the task's metric was refused naming the task
    only; with many runs the user could not tell which file; the error now names the file."""
    rdir = write_run(tmp_path / "r", "d", "attention", 0, [], eval=_eval(7, val_acc=0.5))
    with pytest.raises(ValueError, match=re.escape(f"evaluation keys ['val_acc'] of {rdir / 'summary.json'}")):
        finished_runs(tmp_path / "r", _digits())


def test_a_metrics_log_that_is_a_folder_is_no_log(tmp_path):
    """Kills results.read_curves ``path.is_file()`` -> ``path.exists()`` (a ``metrics.jsonl`` that is a
    folder crashes ``run_status`` with FileNotFoundError instead of showing the run's state)."""
    rdir = run_dir(tmp_path / "r", "d", "attention", 0)
    (rdir / "metrics.jsonl").mkdir(parents=True)
    (rdir / "checkpoint.pt").write_bytes(b"x")
    (row,) = run_status(_digits(), tmp_path)
    assert (row["state"], row["step"]) == ("interrupted", 0)


# ---------------------------------------------------------------------------------------- equivalent mutants
#
# runner.py ``if not done_before and not recorded`` -> ``if not done_before`` (the manifest rewritten before
#   every run trained, not once per invocation): merged_manifest(previous, current) is idempotent (the
#   commit is added once), so the file ends the same; only extra atomic writes.
# runner.py ``... and not done_before`` dropped from the tables-after-each-run condition: the tables are
#   also rewritten after a run read back from disk; each write holds finished_runs() (every finished run on
#   disk), the same as the next write and the final one, so only extra I/O differs.
# runner.py ``Trainer(..., resume=True)`` -> ``resume=resume``: with ``resume=False`` the runner has already
#   emptied the run folder (all but the lock) before the Trainer is built, so the Trainer finds no
#   checkpoint to resume either way.
# results.py run_status ``elif not rdir.is_dir()`` -> ``not rdir.exists()``, and that branch dropped: a run
#   path that is missing (or a file) reaches the else branch with no log, no lock (live_holder of a missing
#   folder is None), no summary and no checkpoint, which also gives state "missing", step 0.
# store.py acquire_lock ``if not _is_stale(holder, st): return _describe(...)`` -> never: every present lock
#   goes to _take_over, which re-reads the lock under ``.lock.break`` and returns False (held) unless it is
#   still stale, so a live or young-unreadable lock is still reported held by the same description; only
#   a short-lived ``.lock.break`` is created and removed meanwhile.
