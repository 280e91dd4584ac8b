"""Edge-case probes of the experiment runner's concurrency and resume, third round (``runner``, ``store``, the
``--workers`` pool, ``results``).

Probed: two fresh interpreters running one comparison at once (every run trained exactly once, no lock or temporary
left, ``results.json`` equal to one process's but for wall times; a one-off check, as
``test_experiments_runner.py`` runs several processes on one comparison); a hard kill (``os._exit`` in a child process)
just before and just after every one of the 23 atomic writes of a two-run comparison (manifest, run configs,
checkpoints, summaries, learned operator values, results, plots), each resumed to the uninterrupted ``results.json``
(run as a sweep, not repeated here: ``test_edge_probes_runner_second.py`` samples it); ``--restart`` while another
process holds a run's lock (of this host and of another host); two processes running configs of one name with
different definitions; ``--workers 0``, negative, and more workers than runs; a run that raises under
``--workers 2`` (its lock is released, the exit code is 1); stale locks of dead or reused
pids and of other hosts; truncated and unreadable summaries. Not repeated: what
``tests/reliability/test_edge_probes_runner*.py``, ``test_edge_probes_resume_matrix.py``,
``test_edge_probes_gpu_workers.py`` and ``test_experiments_store.py`` cover.

Found and fixed (tests named ``test_bug_...``):

* ``runner.run_experiment``: ``resume=False`` (``run --restart``) while another live process held a run's lock
  skipped that run instead of discarding it, exited 0, and read it back into the table once that process finished
  it: a restart with a changed config (``--set ...lr=0.5``) averaged the new seeds with an old-config seed under one
  name. It is now refused before anything is discarded, naming the lock and its holder (and a run claimed by another
  process after that check stops the restart, naming the run).
* ``results.finished_runs``: two processes running configs of the same name but different definitions (a config
  edited and started again while the first process still ran) each read the other's finished runs back into their
  ``results.json`` and table, averaging two definitions under one name: the refusal the runner makes for runs on
  disk (``run_config.json``) was bypassed for runs finished meanwhile by another process. Such a run is now left out
  of the results, with a warning naming its folder and the changed entries.

Seen, not changed: a worker whose run raises an unexpected error prints a traceback that does not name the run
(task / setting / seed; the progress bar shows it, ``--no-progress`` hides it), and after the workers the parent's
pass trains that run once more (and fails the same way, exit code 1); a lock of another host counts as held for
ever (documented: a container restarted under a new host name leaves its runs to be unlocked by hand); a hard kill
right before an ``os.replace`` of a JSON or text file leaves its small ``.<name>.<random>.tmp`` beside it (the
checkpoint's and the plots' are cleaned up by the next write, these are not; nothing reads them); ``results.json``
is a read-modify-write of every finished run: two processes finishing at the same instant can have the one that
read first write last (a window of one ``aggregate`` call, not seen in the runs of this probe), until the next write.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments import runner
from diffusionformer.experiments.runner import run_dir, run_experiment


def _raw(seeds=(0, 1), lr=1e-3, operators=("attention",)):
    return {"name": "tiny", "seeds": list(seeds), "tasks": [{
        "name": "digits", "dataset": "digits", "model": "vit-digits",
        "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2},
        "train": {"max_steps": 2, "batch_size": 16, "lr": lr, "warmup_steps": 0, "eval_interval": 2,
                  "log_interval": 1, "checkpoint_interval": 2}}],
        "operators": [{"name": "attention"} if o == "attention"
                      else {"name": o, "heads": "attention:1,heat(t=0.5, learnable=True, steps=2):1"}
                      for o in operators]}


def _cfg(**kwargs):
    return load_experiment_config(_raw(**kwargs))


def _lr(out, seed):
    return json.loads((run_dir(out, "digits", "attention", seed) / "run_config.json").read_text())["train"]["lr"]


def _hold(rdir, host="elsewhere", pid=4242):
    """The lock of a live process that trains ``rdir`` (another host's: its liveness cannot be checked, it holds)."""
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / ".lock").write_text(json.dumps({"pid": pid, "host": host}))


# ---------------------------------------------------------------------------------- --restart and held runs


def test_bug_restart_refuses_a_run_another_process_is_training(tmp_path):
    """Bug: ``run --restart --set tasks.digits.train.lr=0.5`` while another process held seed 1's lock retrained
    seed 0 at lr 0.5, skipped seed 1 ("skipped: process 4242 on elsewhere is training it"), returned both seeds and
    wrote ``results.json`` averaging seed 0 (lr 0.5) with seed 1 (lr 0.001, the old run read back), exit code 0.
    Now refused before anything is discarded, naming the lock and its holder."""
    run_experiment(_cfg(), tmp_path, progress=False, log=lambda m: None)
    out = tmp_path / "tiny"
    _hold(run_dir(out, "digits", "attention", 1))
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    lock = run_dir(out, "digits", "attention", 1) / ".lock"
    with pytest.raises(ValueError, match=r"resume=False \(--restart\): 1 run\(s\) to discard are being trained") as err:
        run_experiment(_cfg(lr=0.5), tmp_path, progress=False, resume=False, log=lambda m: None)
    assert f"{lock} (process 4242 on elsewhere)" in str(err.value) and "nothing was discarded" in str(err.value)
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before  # seed 0 not retrained
    assert (_lr(out, 0), _lr(out, 1)) == (1e-3, 1e-3)


def test_bug_restart_stops_at_a_run_claimed_after_its_check(tmp_path, monkeypatch):
    """Bug: a run whose lock another process took after the restart's check (here: while this one loaded the data)
    was skipped and later read back, old config and all; the restart now stops there, naming the run."""
    run_experiment(_cfg(), tmp_path, progress=False, log=lambda m: None)
    out = tmp_path / "tiny"
    real = runner._checked_task_data

    def claimed_meanwhile(*args, **kwargs):
        _hold(run_dir(out, "digits", "attention", 1))
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "_checked_task_data", claimed_meanwhile)
    with pytest.raises(ValueError, match=r"\[digits / attention / seed 1\] resume=False \(--restart\) cannot discard "
                                         r".*process 4242 on elsewhere is training it"), \
            pytest.warns(UserWarning, match="seed1 holds a finished run made with a different train"):
        run_experiment(_cfg(lr=0.5), tmp_path, progress=False, resume=False, log=lambda m: None)
    assert (_lr(out, 0), _lr(out, 1)) == (0.5, 1e-3)  # seed 0 was restarted; seed 1 kept, and not tabled with it
    assert [r["seed"] for r in json.loads((out / "results.json").read_text())["runs"]] == [0]


def test_restart_takes_over_a_dead_processs_lock(tmp_path):
    """Held: a lock of a process of this host that no longer runs is stale: ``--restart`` discards that run too."""
    import platform

    run_experiment(_cfg(), tmp_path, progress=False, log=lambda m: None)
    out = tmp_path / "tiny"
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _hold(run_dir(out, "digits", "attention", 1), host=platform.node(), pid=int(child.stdout))
    with pytest.warns(UserWarning, match="seed1 holds a finished run .* not yet restarted"):  # while seed 0 is new
        results = run_experiment(_cfg(lr=0.5), tmp_path, progress=False, resume=False, log=lambda m: None)
    assert [r.seed for r in results] == [0, 1] and (_lr(out, 0), _lr(out, 1)) == (0.5, 0.5)
    assert not list(out.rglob(".lock"))


# ------------------------------------------------------------------------ two definitions, one name


def test_bug_a_run_finished_meanwhile_under_another_definition_is_not_averaged(tmp_path, monkeypatch):
    """Bug: process A (lr 0.001) trains seed 0 while process B (same name, lr 0.5) skips it and trains seed 1;
    A finishes seed 0 before B writes its tables, and B read it back into ``results.json``: both seeds averaged, two
    definitions under one name (the refusal made for a finished sibling on disk is bypassed by the timing). Now
    left out, with a warning naming the folder and the change."""
    run_experiment(_cfg(seeds=(0,)), tmp_path / "a", progress=False, log=lambda m: None)  # what A will have made
    out = tmp_path / "b" / "tiny"
    seed0 = run_dir(out, "digits", "attention", 0)
    _hold(seed0)  # A is training it
    real = runner.finished_runs

    def a_finishes_meanwhile(*args, **kwargs):
        if (seed0 / ".lock").exists():
            shutil.rmtree(seed0)
            shutil.copytree(run_dir(tmp_path / "a" / "tiny", "digits", "attention", 0), seed0)
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "finished_runs", a_finishes_meanwhile)
    with pytest.warns(UserWarning, match=r"seed0 holds a finished run made with a different train \(lr: 0\.001 "
                                         r"then 0\.5\).*left out of the results"):
        results = run_experiment(_cfg(lr=0.5), tmp_path / "b", progress=False, log=lambda m: None)
    assert [r.seed for r in results] == [1]
    assert [r["seed"] for r in json.loads((out / "results.json").read_text())["runs"]] == [1]
    assert (_lr(out, 0), _lr(out, 1)) == (1e-3, 0.5)  # both folders kept as they are


def test_bug_a_restart_interrupted_between_seeds_tables_the_new_seeds_only(tmp_path, monkeypatch):
    """Bug: ``run --restart`` with a changed lr, stopped by Ctrl-C as seed 1 started, left ``results.json`` and
    ``results.md`` averaging the restarted seed 0 (lr 0.5) with seed 1 as it was (lr 0.001, finished on disk); the
    table now holds seed 0 alone until seed 1 is restarted too."""
    run_experiment(_cfg(), tmp_path, progress=False, log=lambda m: None)
    out = tmp_path / "tiny"
    real = runner._one_run

    def ctrl_c_at_seed_1(out_, task, setting, seed, *args):
        if seed == 1:
            raise KeyboardInterrupt
        return real(out_, task, setting, seed, *args)

    monkeypatch.setattr(runner, "_one_run", ctrl_c_at_seed_1)
    with pytest.warns(UserWarning, match=r"seed1 holds a finished run made with a different train \(lr: 0\.001 "
                                         r"then 0\.5\).*not yet restarted"), pytest.raises(KeyboardInterrupt):
        run_experiment(_cfg(lr=0.5), tmp_path, progress=False, resume=False, log=lambda m: None)
    data = json.loads((out / "results.json").read_text())
    assert [r["seed"] for r in data["runs"]] == [0] and data["summary"][0]["n"] == 1
    assert (_lr(out, 0), _lr(out, 1)) == (0.5, 1e-3)


def test_finished_runs_of_the_same_definition_are_read_back_without_a_warning(tmp_path):
    """Held: the check leaves a run alone whose definition matches (seeds differ only in ``train.seed``)."""
    run_experiment(_cfg(), tmp_path, progress=False, log=lambda m: None)
    out = tmp_path / "tiny"
    mine = runner.finished_runs(out, _cfg(), [])  # both from disk
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.seed for r in runner.finished_runs(out, _cfg(), mine[:1])] == [0, 1]
