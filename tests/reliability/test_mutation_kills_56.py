"""Mutation audit, sitting 56: experiments/store.py, experiments/gaps.py, experiments/minibatch.py,
experiments/tables.py, data/augment.py. Each test kills a mutant the suite let live."""

from __future__ import annotations

import errno
import json
import os


from diffusionformer.experiments import store


def test_a_dead_process_in_state_x_holds_no_lock(monkeypatch):
    """Kills: ``_zombie`` reading only state ``Z`` (``X``, dead, is as gone as a zombie)."""
    pid = os.getpid()
    real_listdir = os.listdir
    monkeypatch.setattr(store, "_stat_fields", lambda p: [b"X"])
    monkeypatch.setattr(os, "listdir", lambda p: [str(pid)] if str(p).startswith("/proc/") else real_listdir(p))
    assert store._zombie(pid)
    monkeypatch.setattr(store, "_stat_fields", lambda p: [b"S"])
    assert not store._zombie(pid)


def test_a_zombie_main_thread_with_live_threads_still_runs(monkeypatch):
    """Kills: ``_zombie`` counting ``<= 2`` tasks as exited (one live thread left keeps the process running)."""
    pid = os.getpid()
    real_listdir = os.listdir
    monkeypatch.setattr(store, "_stat_fields", lambda p: [b"Z"])
    monkeypatch.setattr(os, "listdir", lambda p: [str(pid), "7"] if str(p).startswith("/proc/") else real_listdir(p))
    assert not store._zombie(pid)
    monkeypatch.setattr(os, "listdir", lambda p: [str(pid)] if str(p).startswith("/proc/") else real_listdir(p))
    assert store._zombie(pid)


def test_a_lock_written_without_hard_links_is_synced_to_disk(monkeypatch, tmp_path):
    """Kills: the no-hard-link fallback of ``_link_exclusive`` writing ``.lock`` without its fsync (a crash after the
    claim left an empty lock, held by no one for a minute)."""
    def no_links(src, dst):
        raise OSError(errno.EPERM, "hard links not supported")

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "link", no_links)
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_ino), real_fsync(fd))[1])
    run = tmp_path / "run"
    assert store.acquire_lock(run) is None
    lock = run / store.LOCK_NAME
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert lock.stat().st_ino in synced  # the lock itself, not only the claim's temporary


def test_runs_of_unrecorded_devices_come_last_in_the_time_cell():
    """Kills: ``_elapsed_by_device`` sorting its labels alphabetically alone ("device not recorded" before "mps")."""
    from diffusionformer.experiments.results import RunResult
    from diffusionformer.experiments.tables import _elapsed_by_device

    runs = [RunResult("t", "a", s, "completed", "acc", 0.5, elapsed=e, device=d)
            for s, (e, d) in enumerate([(1.0, "mps"), (2.0, None), (3.0, "cpu"), (4.0, "mps:0")])]
    assert list(_elapsed_by_device(runs).items()) == [("cpu", (3.0, 1)), ("mps", (5.0, 2)),
                                                      ("device not recorded", (2.0, 1))]
