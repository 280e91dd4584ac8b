"""The run store's takeover of a stale lock runs under an exclusive ``flock`` of the run's folder.

Bug (left open in sitting 37, closed in 38): ``_take_over`` removed an abandoned ``.lock.break`` (older than
``UNREADABLE_GRACE_S``) by a stat then an unlink. Of three workers at one abandoned ``.lock.break``, one could
stat it, a second remove it and link its own, and the first then remove the second's fresh one: both went on to
take the run over, and two workers trained one run. The takeover now holds a ``flock`` of the run's folder, so
workers taking over one run take turns (no file is added; the kernel drops the lock of a killed worker).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from diffusionformer.experiments import store
from diffusionformer.experiments.store import LOCK_NAME, acquire_lock, read_lock

fcntl = pytest.importorskip("fcntl")
ME = (os.getpid(), platform.node())


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _folder_is_locked(folder) -> bool:
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_bug_takeover_runs_under_a_folder_flock(tmp_path, monkeypatch):
    """Bug: the takeover's critical section (re-read the stale lock, remove it, link ours, and the removal of an
    abandoned ``.lock.break`` before it) ran without a lock that a killed worker cannot leave behind: another
    process could enter it at the same time (the three-worker race above)."""
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": _dead_pid(), "host": ME[1]}))
    seen, real_state = [], store._state

    def spying_state(path):
        if (tmp_path / store._BREAK_NAME).exists():  # inside the takeover
            seen.append(_folder_is_locked(tmp_path))
        return real_state(path)

    monkeypatch.setattr(store, "_state", spying_state)
    assert acquire_lock(tmp_path) is None
    assert read_lock(tmp_path) == ME
    assert seen and all(seen), seen
    assert not _folder_is_locked(tmp_path)  # released after the takeover
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]  # the flock adds no file


def test_abandoned_break_is_removed_under_the_folder_flock(tmp_path, monkeypatch):
    """The removal of a ``.lock.break`` older than the grace runs inside the flock too (it is the racy step)."""
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": _dead_pid(), "host": ME[1]}))
    brk = tmp_path / store._BREAK_NAME
    brk.write_text("{}")
    old = os.stat(brk).st_mtime - 2 * store.UNREADABLE_GRACE_S
    os.utime(brk, (old, old))
    removals, real_unlink = [], type(brk).unlink

    def spying_unlink(self, missing_ok=False):
        if self.name == store._BREAK_NAME and self.exists() and os.stat(self).st_mtime == old:
            removals.append(_folder_is_locked(tmp_path))
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(type(brk), "unlink", spying_unlink)
    assert acquire_lock(tmp_path) is None and read_lock(tmp_path) == ME
    assert removals == [True]
    assert not brk.exists()
