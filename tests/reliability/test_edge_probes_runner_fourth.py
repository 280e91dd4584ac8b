"""Edge-case probes of several worker processes on one comparison (runner, run locks, threads, outputs), fourth round.

Probed: the comparison's ``manifest.json`` written by two invocations starting at once (its read-merge-write of
``git_commits`` / ``cpu_kernel_sets``); ``run --workers N`` with more workers than runs against the same comparison
run by one worker (every run trained once, ``results.json`` equal but for the wall times, no lock left); the
torch thread count of each worker. Not repeated: the lock semantics (dead, live, remote, reused pids, junk locks,
racing takeovers) that ``test_edge_probes_config_store.py`` and ``test_edge_probes_runner*.py`` cover.

Found and fixed (tests named ``test_bug_...``):

* ``runner.run_experiment``: the manifest's read-merge-write ran outside the comparison's folder lock: an
  invocation that wrote between another's read and write (two calls on one comparison, one per seed, or two
  machines with another commit or CPU kernel set on a shared folder) had its commit dropped from ``git_commits``
  (and its kernel set from ``cpu_kernel_sets``) for good. It now runs under :func:`diffusionformer._files.folder_lock`, as the
  results tables do.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments import runner as runner_mod
from diffusionformer._files import folder_lock as _folder_lock
from diffusionformer.experiments.outputs import merged_manifest
from diffusionformer.experiments.results import read_json_dict
from diffusionformer.experiments.runner import run_experiment
from diffusionformer.train.metrics import write_json_atomic


def _config(steps=2, seeds=(0,)):
    return load_experiment_config({"name": "tiny", "seeds": list(seeds), "tasks": [{
        "name": "digits", "dataset": "digits", "model": "vit-digits",
        "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
        "train": {"max_steps": steps, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
                  "checkpoint_interval": 2}}],
        "operators": [{"name": "attention"}]})


def _locked(folder: Path) -> bool:
    """Whether another open file description holds an exclusive flock of ``folder``."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_bug_two_invocations_writing_the_manifest_at_once_keep_both_commits(tmp_path, monkeypatch):
    """Bug: ``run_experiment`` read ``manifest.json``, merged its commit into ``git_commits`` and wrote it back
    without the comparison's lock: another invocation's manifest written in between (its commit ``other``) was
    overwritten, and ``git_commits`` lost ``other`` for good."""
    out = tmp_path / "tiny"
    out.mkdir()
    write_json_atomic(out / "manifest.json", {"git_commit": "first", "git_commits": ["first"]})
    real = runner_mod.merged_manifest
    other: list[threading.Thread] = []

    def other_invocation():  # what a second invocation's manifest write does (under the lock, as after the fix)
        with _folder_lock(out):
            write_json_atomic(out / "manifest.json",
                              merged_manifest(read_json_dict(out / "manifest.json"), {"git_commit": "other"}))

    def merged(previous, current):  # called once this invocation has read the manifest
        if not other:
            t = threading.Thread(target=other_invocation)
            other.append(t)
            t.start()
            t.join(timeout=0.5)  # unlocked: it writes now; locked: it waits for this invocation's write
        return real(previous, current)

    monkeypatch.setattr(runner_mod, "merged_manifest", merged)
    monkeypatch.setattr(runner_mod, "git_commit", lambda *a: "mine")
    monkeypatch.setattr("diffusionformer.experiments.outputs.git_commit", lambda *a: "mine")
    run_experiment(_config(), tmp_path, progress=False, log=lambda m: None)
    other[0].join(timeout=10)
    assert not other[0].is_alive()
    commits = json.loads((out / "manifest.json").read_text())["git_commits"]
    assert set(commits) == {"first", "mine", "other"}, commits
    assert not _locked(out)  # released

