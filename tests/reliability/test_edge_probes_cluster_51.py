"""Edge-case probes of a SLURM cluster user's comparison (``store``, ``runner``, ``results.run_status``,
``tables.format_status``): results on a shared file system seen by several nodes, array jobs each running
``run CONFIG --tasks T``, jobs killed at their time limit, nodes that fail (their process vanishes without clean-up),
requeued jobs on another node. Other hosts are simulated by lock records written by hand with another ``host`` and
by ``os.utime``.

Found and fixed (tests named ``test_bug_...``):

* ``runner._one_run`` / ``results.run_status`` / ``tables.format_status``: a run whose lock was left by a node that
  failed was skipped by every later job on every other node for ever ("skipped: process N on nodeA is training it")
  and shown "running" by ``status`` for ever, with nothing to tell a dead node from a live one, nor what to do. The
  lock is still never taken over automatically (a live but slow node would train the run twice), but the skip
  message and ``status`` now give, for a lock of another host, how long ago the run last showed a sign of life (the
  newest change of its metrics log, checkpoint or lock; the trainer appends to its log every ``log_interval``
  updates and rewrites its checkpoint every ``checkpoint_interval``), and name the lock to remove when that node is
  gone; removing it lets ``run`` resume the run from its checkpoint.

* ``store``: a lock of this host's name written by another node of the same short name (two clusters sharing a file
  system, each with a ``cn001``) was judged by this node's process table: its pid not running here (or running with
  another start time) made it "stale", and the run was taken over while the other node still trained it, both
  writing its checkpoint and log. A lock now records the holder's machine id (``/etc/machine-id``, where there is
  one); a lock of this host's name but another machine id is another host's: held, never taken over, and reported
  with its last sign of life as above. A lock without one (older versions, machines without an id) is judged as
  before.

Probed, fine as it is: a time limit's SIGTERM during the checkpoint write (the earlier checkpoint whole, no
temporary, no lock; the requeue resumes bit-identically); two array jobs with different ``--tasks`` writing ``results.json`` / ``results.md`` of one
comparison at once (each a read-merge-write of the runs on disk under the comparison's ``flock``, written by
``os.replace``: neither loses the other's rows); mtimes ahead of this host's clock (said as such, not "-3 h ago").

Seen, not changed: a lock of another host (a failed node, or this node under its former name after a requeue) is
still never taken over by itself (by design: a live but slow node would train the run twice); SIGKILL in the grace
period leaves the lock (taken over on this host, held elsewhere: the note above applies) and at most a
checkpoint-sized temporary, removed by the next save; where the file system has no ``flock`` (some Lustre/FUSE mounts)
the comparison's outputs and manifest are written unlocked, so two jobs finishing at one instant can drop each other's
row until the next write (every write rebuilds the rows from the runs on disk).
"""

from __future__ import annotations

import json
import os
import platform
import re
import threading
import time

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments import store
from diffusionformer.experiments.results import run_dir, run_status
from diffusionformer.experiments.runner import run_experiment
from diffusionformer.experiments.tables import format_status
from diffusionformer.train import trainer as trainer_mod


def _raw(tasks=("digits",), max_steps=4):
    return {"name": "cluster", "seeds": [0], "tasks": [{
        "name": name, "dataset": "digits", "model": "vit-digits",
        "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2},
        "train": {"max_steps": max_steps, "batch_size": 16, "lr": 1e-3, "warmup_steps": 0, "eval_interval": max_steps,
                  "log_interval": 1, "checkpoint_interval": 2}} for name in tasks],
        "operators": [{"name": "attention"}]}


def _cfg(**kwargs):
    return load_experiment_config(_raw(**kwargs))


def _node_lock(rdir, host="nodeA", pid=4242, age=None):
    """The lock a job on ``host`` left (its node failed: nobody removes it), ``age`` seconds old."""
    rdir.mkdir(parents=True, exist_ok=True)
    lock = rdir / ".lock"
    lock.write_text(json.dumps({"pid": pid, "host": host, "start": 123}))
    if age is not None:
        os.utime(lock, (time.time() - age, time.time() - age))
    return lock


def _metrics(rdir):
    return [json.loads(line) for line in (rdir / "metrics.jsonl").read_text().splitlines()]


def _interrupted_after_first_checkpoint(cfg, out, monkeypatch):
    """Train ``cfg``'s run up to its first checkpoint (step 2), then stop as a killed job does (its lock removed by
    the clean-up of a SIGTERM; the caller then writes the lock a failed node leaves)."""
    real = trainer_mod.Trainer._save

    def save_then_die(self, done):
        real(self, done)
        raise KeyboardInterrupt  # SIGTERM is a KeyboardInterrupt under `run` (cli._raise_terminated)

    monkeypatch.setattr(trainer_mod.Trainer, "_save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, out, progress=False, log=lambda m: None)
    monkeypatch.setattr(trainer_mod.Trainer, "_save", real)


def test_bug_a_failed_nodes_lock_says_its_last_sign_of_life_and_what_to_do(tmp_path, monkeypatch):
    """Bug: a run whose lock was left by a node that failed was skipped by every later job on any other node for
    ever ("skipped: process 4242 on nodeA is training it") and ``status`` showed it "running (pid 4242 on nodeA)" for
    ever: nothing told a dead node from a live one, nor what to do. The skip message and ``status`` now give how long
    ago the run last showed a sign of life (its log, checkpoint, lock) and name the lock to remove once that node is
    gone; the lock is still never taken over by itself. Removing it lets ``run`` resume the run from its checkpoint,
    bit-identically to an uninterrupted run."""
    cfg = _cfg()
    whole = tmp_path / "whole"
    run_experiment(cfg, whole, progress=False, log=lambda m: None)
    out = tmp_path / "out"
    _interrupted_after_first_checkpoint(cfg, out, monkeypatch)
    rdir = run_dir(out / "cluster", "digits", "attention", 0)
    assert not (rdir / ".lock").exists()  # the clean-up released it
    lock = _node_lock(rdir, age=3 * 3600 + 300)  # nodeA claimed it (a requeue) and failed 3 h 5 min ago
    then = time.time() - 3 * 3600 - 300
    for name in ("metrics.jsonl", "checkpoint.pt", "run_config.json"):
        os.utime(rdir / name, (then - 60, then - 60))

    logs = []
    results = run_experiment(cfg, out, progress=False, log=logs.append)
    assert results == []  # never taken over by itself
    skip = next(m for m in logs if "skipped" in m)
    assert "process 4242 on nodeA is training it" in skip
    assert "last showed a sign of life 3 h 5 min ago" in skip, skip
    assert f"remove {lock} and run again" in skip and "resumes from its checkpoint" in skip, skip

    row, = run_status(cfg, out)
    assert row["state"] == "running"
    assert row["holder"].startswith("pid 4242 on nodeA; nodeA is another host; the run last showed a sign of life 3 h")
    assert row["other_host"] is True  # the structured flag format_status reads (sitting 52)
    text = format_status(run_status(cfg, out))
    assert "last showed a sign of life 3 h" in text
    assert "remove that run's lock in the comparison's folder (runs/digits/attention/seed0/.lock)" in text, text

    # the advice is right: with the lock removed, `run` resumes from the checkpoint, as the uninterrupted run
    lock.unlink()
    logs.clear()
    result, = run_experiment(cfg, out, progress=False, log=logs.append)
    assert result.status == "completed"
    summary = json.loads((rdir / "summary.json").read_text())
    assert summary["resumed_from"] == 2
    strip = ("elapsed", "time", "wall_time", "steps_per_s", "samples_per_s", "tokens_per_s")
    mine = [{k: v for k, v in r.items() if k not in strip} for r in _metrics(rdir)]
    ref = [{k: v for k, v in r.items() if k not in strip}
           for r in _metrics(run_dir(whole / "cluster", "digits", "attention", 0))]
    assert mine == ref
    assert not (rdir / ".lock").exists()


def test_a_lock_of_a_node_with_a_clock_ahead_is_said_so(tmp_path):
    """Pins (of the fix above): mtimes ahead of this host's clock (clock skew between the nodes, or the file server's)
    are said to be so, not "-3 min ago"; a lock of this host gets no note (its process is checked)."""
    cfg = _cfg()
    rdir = run_dir(tmp_path / "cluster", "digits", "attention", 0)
    _node_lock(rdir, age=-200)
    row, = run_status(cfg, tmp_path)
    assert re.fullmatch(r"pid 4242 on nodeA; nodeA is another host; the run last showed a sign of life at a time "
                        r"3 min (19|20) s ahead of this host's clock \(the hosts' clocks differ\)", row["holder"]), \
        row["holder"]
    (rdir / ".lock").write_text(json.dumps({"pid": os.getpid(), "host": platform.node()}))
    row, = run_status(cfg, tmp_path)
    assert row["holder"] == f"pid {os.getpid()} on {platform.node()}" and row["other_host"] is False
    assert "other hosts" not in format_status([row])


def test_two_array_jobs_with_other_tasks_keep_each_others_rows(tmp_path):
    """Probe: two array jobs (``--tasks a`` and ``--tasks b``, threads here) finishing one comparison at once each
    rewrite ``results.json`` / ``results.md`` from the runs on disk under the comparison's lock: both rows are there,
    whichever wrote last, and no temporary is left."""
    cfg = _cfg(tasks=("a", "b"), max_steps=2)
    errors = []

    def job(task):
        try:
            run_experiment(cfg, tmp_path, progress=False, tasks=[task], log=lambda m: None)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=job, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    out = tmp_path / "cluster"
    rows = json.loads((out / "results.json").read_text())["runs"]
    assert sorted(r["task"] for r in rows) == ["a", "b"]
    table = (out / "results.md").read_text()
    assert "### a" in table and "### b" in table, table
    assert not list(out.glob(".*.tmp"))


_OTHER_MACHINE = "0123456789abcdef0123456789abcdef"


def test_bug_a_lock_of_another_machine_of_this_hosts_name_is_not_taken_over(tmp_path, monkeypatch):
    """Bug: a lock of this host's name written by another node of the same short name (clusters sharing a file
    system) was judged by this node's processes: its pid dead here, or alive with another start time, made it stale
    and the run was taken over while that node still trained it (trained twice, one checkpoint and log). The lock
    records its machine id now, and one of another machine id holds as another host's lock does."""
    monkeypatch.setattr(store, "_machine_id", lambda: "f" * 32, raising=False)  # this machine's id
    node = platform.node()
    for pid, start in ((4194304 + 7, 1), (os.getpid(), (store._start_time(os.getpid()) or 5) - 1)):
        rdir = tmp_path / f"run{pid}"
        rdir.mkdir()
        record = {"pid": pid, "host": node, "start": start, "machine": _OTHER_MACHINE}
        (rdir / ".lock").write_text(json.dumps(record))
        assert store.acquire_lock(rdir) == f"process {pid} on {node}"
        assert store.live_holder(rdir) == (pid, node)
        store.release_lock(rdir)  # not ours: another machine's process that had our pid
        assert json.loads((rdir / ".lock").read_text()) == record
    cfg = _cfg()
    rdir = run_dir(tmp_path / "cluster", "digits", "attention", 0)
    rdir.mkdir(parents=True)
    (rdir / ".lock").write_text(json.dumps({"pid": 4194311, "host": node, "machine": _OTHER_MACHINE}))
    row, = run_status(cfg, tmp_path)
    assert row["state"] == "running"
    assert f"{node} is another host (another machine of this host's name); the run last showed" in row["holder"]


def test_a_lock_of_this_machine_or_without_a_machine_id_is_judged_as_before(tmp_path, monkeypatch):
    """Pins (of the fix above): a lock records this machine's id, and is taken over when its pid is dead here; so is
    a lock of this host's name without one (older versions), or written where this machine has no id."""
    monkeypatch.setattr(store, "_machine_id", lambda: "f" * 32)
    rdir = tmp_path / "run"
    assert store.acquire_lock(rdir) is None
    assert json.loads((rdir / ".lock").read_text())["machine"] == "f" * 32
    store.release_lock(rdir)
    assert not (rdir / ".lock").exists()
    for record in ({"pid": 4194311, "host": platform.node(), "machine": "f" * 32},
                   {"pid": 4194311, "host": platform.node()}):
        (rdir / ".lock").write_text(json.dumps(record))
        assert store.live_holder(rdir) is None
        assert store.acquire_lock(rdir) is None
        store.release_lock(rdir)
    monkeypatch.setattr(store, "_machine_id", lambda: None)
    (rdir / ".lock").write_text(json.dumps({"pid": 4194311, "host": platform.node(), "machine": _OTHER_MACHINE}))
    assert store.acquire_lock(rdir) is None  # no id here to compare with: judged by its pid, as before
    store.release_lock(rdir)
    assert not (rdir / ".lock").exists()


def test_a_time_limit_sigterm_during_the_checkpoint_write_resumes_bit_identically(tmp_path, monkeypatch):
    """Probe: SIGTERM (a ``KeyboardInterrupt`` under ``run``) arriving while the final checkpoint is written leaves the
    step-2 checkpoint whole, no temporary and no lock; the requeued job resumes from step 2 to the uninterrupted run's
    metrics, bit for bit."""
    cfg = _cfg()
    whole = tmp_path / "whole"
    run_experiment(cfg, whole, progress=False, log=lambda m: None)
    import diffusionformer.train.checkpoint as ckpt

    real = ckpt.torch.save
    calls = []

    def save(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the final checkpoint (step 4): half written, then the signal
            f.write(b"PK\x03\x04 half")
            raise KeyboardInterrupt
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", save)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, out, progress=False, log=lambda m: None)
    monkeypatch.setattr(ckpt.torch, "save", real)
    rdir = run_dir(out / "cluster", "digits", "attention", 0)
    assert sorted(p.name for p in rdir.iterdir()) == ["checkpoint.pt", "metrics.jsonl", "preprocessing.json",
                                                      "run_config.json"]
    result, = run_experiment(cfg, out, progress=False, log=lambda m: None)
    assert result.status == "completed" and json.loads((rdir / "summary.json").read_text())["resumed_from"] == 2
    strip = ("elapsed", "time", "wall_time", "steps_per_s", "samples_per_s", "tokens_per_s")
    assert [{k: v for k, v in r.items() if k not in strip} for r in _metrics(rdir)] == \
        [{k: v for k, v in r.items() if k not in strip}
         for r in _metrics(run_dir(whole / "cluster", "digits", "attention", 0))]
