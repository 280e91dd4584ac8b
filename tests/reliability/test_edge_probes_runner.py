"""Edge-case probes of the experiment runner's reliability (run loop, run store, locks, ``run`` / ``status``).

Probed: a run killed mid-step and resumed (weights, every logged record and the final evaluation against an
uninterrupted run), resumed past a lock left by a killed worker; a run folder with a checkpoint but no summary and
with a completed summary but no checkpoint; a results folder moved elsewhere (as if copied from another machine);
configs edited between invocations (a changed hyper-parameter, a removed train setting, a new seed, a changed
metric, ``--restart`` of part of a comparison); an output folder whose path has spaces and non-ASCII characters.
Already covered elsewhere and not repeated here: two CLI processes on one folder, live / stale / unreadable locks,
lock races, a changed model or data seed under the same name, unreadable summaries and checkpoints.

Found and fixed (``experiments/runner.py``, ``outputs.py``, ``results.py``, ``cli.py``):

* a new seed trained with a changed definition (e.g. ``--set seeds=[2] --set tasks.digits.train.lr=0.5`` after
  seeds 0 and 1 at lr 0.001) was accepted and its row averaged with the old seeds' in ``results.json`` /
  ``results.md``: the silent mixing the runner's docs say is refused. It is refused now, naming the finished run;
* ``--restart`` of part of a comparison with a changed definition kept the other seeds' rows (old definition)
  in the table, averaged with the new runs; they are dropped from the table now (their folders are kept);
* ``run`` printed the command to watch its progress (``... status CONFIG --out OUT``) with ``--out`` quoted
  but the config path not: a config path with a space gave a command that ``status`` could not run
  (``experiments/cli.py``);
* the refusal named only the top-level key ("made with a different train"), leaving the user to diff JSON files
  to find which hyper-parameter changed; it names the changed entries now ("train (lr: 0.001 then 0.5)").

Seen, not changed: ``summary.json`` records the checkpoint's absolute path (nothing reads it back); a resumed
run's ``elapsed`` leaves out the time between its last checkpoint and the kill.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys

import pytest
import torch

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.cli import main as cli_main
from diffusionformer.experiments.runner import run_dir, run_experiment, run_status
from diffusionformer.train import read_metrics


def _raw(seeds=(0, 1), steps=4):
    return {"name": "tiny", "seeds": list(seeds), "tasks": [{
        "name": "digits", "dataset": "digits", "model": "vit-digits",
        "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2},
        "train": {"max_steps": steps, "batch_size": 16, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
                  "log_interval": 1, "checkpoint_interval": 2}}],
        "operators": [{"name": "attention"}]}


def _cfg(raw=None, *overrides):
    return load_experiment_config(raw or _raw(steps=2), list(overrides))


def _results(root):
    return json.loads((root / "tiny" / "results.json").read_text())


def _timeless(records):
    return [{k: v for k, v in r.items() if k not in ("elapsed", "time")} for r in records]


def test_bug_a_new_seed_with_a_changed_hyper_parameter_is_refused_not_averaged(tmp_path):
    """Bug: after seeds 0 and 1 at lr 0.001, ``--set seeds=[2] --set ...lr=0.5`` trained seed 2 at lr 0.5 and
    averaged it with the old seeds in ``results.json`` (n = 3): two experiments under one name, silently."""
    run_experiment(_cfg(), tmp_path, progress=False)
    before = _results(tmp_path)
    with pytest.raises(ValueError, match=r"seed0 holds a finished run .* different train \(lr: 0\.001 then 0\.5\)"
                                         r".*--restart"):
        run_experiment(_cfg(None, "seeds=[2]", "tasks.digits.train.lr=0.5"), tmp_path, progress=False)
    seed2 = run_dir(tmp_path / "tiny", "digits", "attention", 2)
    assert not any((seed2 / f).exists() for f in ("run_config.json", "checkpoint.pt", "metrics.jsonl", ".lock"))
    assert _results(tmp_path) == before
    # the same definition with a new seed still adds to the comparison
    run_experiment(_cfg(None, "seeds=[2]"), tmp_path, progress=False)
    assert sorted(r["seed"] for r in _results(tmp_path)["runs"]) == [0, 1, 2]


def test_bug_restarting_part_of_a_comparison_with_a_changed_definition_drops_the_old_rows(tmp_path):
    """Bug: ``--restart --set seeds=[0]`` with a changed lr retrained seed 0 and kept seed 1 (old lr) in the
    table, averaging the two definitions."""
    run_experiment(_cfg(), tmp_path, progress=False)
    results = run_experiment(_cfg(None, "seeds=[0]", "tasks.digits.train.lr=0.5"), tmp_path, progress=False,
                             resume=False)
    data = _results(tmp_path)
    assert [r["seed"] for r in data["runs"]] == [0] and data["summary"][0]["n"] == 1
    assert data["runs"][0]["value"] == results[0].value
    assert (run_dir(tmp_path / "tiny", "digits", "attention", 1) / "summary.json").is_file()  # folder kept
    # a restart with the same definition keeps the other seeds' rows
    run_experiment(_cfg(None, "tasks.digits.train.lr=0.5"), tmp_path / "b", progress=False)
    run_experiment(_cfg(None, "seeds=[0]", "tasks.digits.train.lr=0.5"), tmp_path / "b", progress=False, resume=False)
    assert [r["seed"] for r in _results(tmp_path / "b")["runs"]] == [0, 1]


@pytest.mark.parametrize("edit, named", [
    (lambda t: t["train"].update(lr=0.5), "train (lr: 0.001 then 0.5)"),
    (lambda t: t["train"].pop("eval_interval"), "train (eval_interval: 2 then "),
    (lambda t: t["model_overrides"].update(dim=32), "model_config (dim: 16 then 32)"),
])
def test_bug_an_edited_run_definition_names_the_changed_entry(tmp_path, edit, named):
    """Bug: the refusal said only "made with a different train" (or model_config), not which entry changed."""
    run_experiment(_cfg(_raw(seeds=[0])), tmp_path, progress=False)
    raw = _raw(seeds=[0])
    edit(raw["tasks"][0])
    with pytest.raises(ValueError) as err:
        run_experiment(_cfg(raw), tmp_path, progress=False)
    assert f"seed0 holds a run of task 'digits' / setting 'attention' made with a different {named}" in str(err.value)


def test_a_reading_setting_changed_between_runs_reuses_the_runs(tmp_path):
    """The metric is how a run is read, not what it is: changing it reuses the runs, read from their logs."""
    first = run_experiment(_cfg(_raw(seeds=[0])), tmp_path, progress=False)
    ckpt = run_dir(tmp_path / "tiny", "digits", "attention", 0) / "checkpoint.pt"
    mtime = ckpt.stat().st_mtime_ns
    raw = _raw(seeds=[0])
    raw["tasks"][0]["metric"] = "test_loss"
    again = run_experiment(_cfg(raw), tmp_path, progress=False)
    assert ckpt.stat().st_mtime_ns == mtime and first[0].metric == "test_acc" and again[0].metric == "test_loss"
    last_eval = [r for r in read_metrics(ckpt.parent / "metrics.jsonl") if r["split"] == "eval"][-1]
    assert again[0].value == last_eval["metrics"]["test_loss"]


@pytest.mark.parametrize("killed_in_call", [3, 4])
def test_a_run_killed_mid_step_with_its_lock_left_resumes_to_the_uninterrupted_run(tmp_path, killed_in_call):
    """Weights, every logged record (but times) and the final evaluation equal the uninterrupted run's, also when
    the killed worker left its lock behind."""
    from diffusionformer.experiments.tasks import ClassificationTask
    from diffusionformer.testing import interrupt_on_call

    cfg = _cfg(_raw(seeds=[0]))
    run_experiment(cfg, tmp_path / "clean", progress=False)
    with interrupt_on_call(ClassificationTask, "loss", killed_in_call), pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "killed", progress=False)
    clean = run_dir(tmp_path / "clean" / "tiny", "digits", "attention", 0)
    rdir = run_dir(tmp_path / "killed" / "tiny", "digits", "attention", 0)
    assert (rdir / "checkpoint.pt").is_file() and not (rdir / "summary.json").exists()
    assert run_status(cfg, tmp_path / "killed")[0]["state"] == "interrupted"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import platform

    (rdir / ".lock").write_text(json.dumps({"pid": int(dead.stdout), "host": platform.node()}))  # a SIGKILLed worker's
    resumed = run_experiment(cfg, tmp_path / "killed", progress=False)
    assert resumed[0].status == "completed" and not (rdir / ".lock").exists()
    a = torch.load(clean / "checkpoint.pt", weights_only=False)["model"]
    b = torch.load(rdir / "checkpoint.pt", weights_only=False)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _timeless(read_metrics(rdir / "metrics.jsonl")) == _timeless(read_metrics(clean / "metrics.jsonl"))
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (clean, rdir))
    assert _timeless([sb["eval"]]) == _timeless([sa["eval"]]) and sb["resumed_from"] == 2


def test_a_completed_summary_without_a_checkpoint_is_read_back_not_retrained(tmp_path):
    first = run_experiment(_cfg(_raw(seeds=[0])), tmp_path, progress=False)
    rdir = run_dir(tmp_path / "tiny", "digits", "attention", 0)
    (rdir / "checkpoint.pt").unlink()
    again = run_experiment(_cfg(_raw(seeds=[0])), tmp_path, progress=False)
    assert [(r.status, r.value) for r in again] == [(r.status, r.value) for r in first]
    assert not (rdir / "checkpoint.pt").exists()
    assert run_status(_cfg(_raw(seeds=[0])), tmp_path)[0]["state"] == "completed"


def test_a_results_folder_moved_elsewhere_reads_back_and_resumes(tmp_path):
    """As if copied from another machine: nothing the runner reads back holds the old absolute path."""
    from diffusionformer.experiments.tasks import ClassificationTask
    from diffusionformer.testing import interrupt_on_call

    cfg = _cfg(_raw())
    first = run_experiment(_cfg(_raw(), "seeds=[0]"), tmp_path / "a", progress=False)
    with interrupt_on_call(ClassificationTask, "loss", 3), pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "a", progress=False)
    for name in ("results.json", "manifest.json", "runs/digits/attention/seed0/run_config.json"):
        assert str(tmp_path) not in (tmp_path / "a" / "tiny" / name).read_text(), name
    shutil.move(tmp_path / "a", tmp_path / "b")
    moved = run_experiment(cfg, tmp_path / "b", progress=False)
    assert [(r.seed, r.status) for r in moved] == [(0, "completed"), (1, "completed")]
    assert moved[0].value == first[0].value
    assert json.loads((run_dir(tmp_path / "b" / "tiny", "digits", "attention", 1) / "summary.json").read_text()
                      )["resumed_from"] == 2


def test_bug_an_output_folder_with_spaces_and_unicode_runs_and_the_printed_status_command_works(tmp_path, capsys):
    """Bug: the printed ``status`` command left a config path with a space unquoted (two arguments once pasted)."""
    root = tmp_path / "my results é 日本"
    toml = tmp_path / "tiny cfg é.toml"
    raw = _raw(seeds=[0], steps=2)
    t = raw["tasks"][0]
    train = ", ".join(f"{k} = {json.dumps(v)}" for k, v in t["train"].items())
    toml.write_text(
        f'name = "tiny"\nseeds = [0]\n\n[[tasks]]\nname = "digits"\ndataset = "digits"\nmodel = "vit-digits"\n'
        f"model_overrides = {{ dim = 16, depth = 1, num_heads = 2 }}\ntrain = {{ {train} }}\n\n"
        f'[[operators]]\nname = "attention"\n', encoding="utf-8")
    assert cli_main(["run", str(toml), "--out", str(root), "--no-progress", "--threads", "1"]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "from another shell" in x)
    import shlex

    assert shlex.split(line.split("from another shell: ")[1])[-4:] == ["status", str(toml), "--out", str(root)]
    assert (run_dir(root / "tiny", "digits", "attention", 0) / "summary.json").is_file()
    assert cli_main(["status", str(toml), "--out", str(root)]) == 0  # the command as printed, once split
    assert capsys.readouterr().out.startswith("1 of 1 runs completed")


def test_the_identity_check_leaves_the_seed_and_fold_out_of_a_definition():
    from diffusionformer.experiments.results import _definition, _identity_changes

    a = {"data_seed": 0, "fold": 0, "train": {"seed": 0, "lr": 0.1}}
    b = copy.deepcopy(a)
    b.update(fold=1, train={"seed": 1, "lr": 0.1})
    assert _definition(a) == _definition(b) == {"data_seed": 0, "train": {"lr": 0.1}}
    assert _identity_changes({"x": 1, "train": {"lr": 0.1}}, {"x": 2, "train": {"lr": 0.2, "wd": 0}}) == (
        "train (lr: 0.1 then 0.2, wd: 'unset' then 0), x")
