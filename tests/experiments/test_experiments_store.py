"""The run store's lock: atomic claims, stale takeover, unreadable locks."""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time

import pytest

from diffusionformer.experiments.store import (
    LOCK_NAME,
    UNREADABLE_GRACE_S,
    acquire_lock,
    live_holder,
    read_lock,
    release_lock,
)

ROUNDS = 500  # per kind of round: fresh run folder, and a folder holding a stale lock


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _claimer(root: str, rounds: int, barrier, results) -> None:
    claimed = []
    for i in range(rounds):
        barrier.wait()
        claimed.append(acquire_lock(os.path.join(root, f"r{i}")) is None)
    results.put((os.getpid(), claimed))


def test_two_processes_racing_for_the_same_lock_never_both_claim_it(tmp_path):
    """2 x ROUNDS rounds of two processes claiming one run folder at the same instant (a
    barrier releases both): exactly one claims it, on a fresh folder and on one holding a
    stale lock (a dead process of this host, which both see and both try to take over)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs the fork start method")
    ctx = multiprocessing.get_context("fork")
    dead = _dead_pid()
    stale = json.dumps({"pid": dead, "host": platform.node()})
    for i in range(ROUNDS, 2 * ROUNDS):  # the second half starts from a stale lock
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / LOCK_NAME).write_text(stale)
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(str(tmp_path), 2 * ROUNDS, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    outcomes = dict(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    (pa, a), (pb, b) = outcomes.items()
    double = [i for i in range(2 * ROUNDS) if a[i] and b[i]]
    nobody = [i for i in range(2 * ROUNDS) if not a[i] and not b[i]]
    assert not double, f"both processes claimed rounds {double[:10]} ({len(double)} of {2 * ROUNDS})"
    assert not nobody, f"nobody claimed rounds {nobody[:10]}"
    for i in range(2 * ROUNDS):  # the lock names the winner, and no claim file is left behind
        winner = pa if a[i] else pb
        assert read_lock(tmp_path / f"r{i}") == (winner, platform.node())
        assert sorted(q.name for q in (tmp_path / f"r{i}").iterdir()) == [LOCK_NAME]


def test_claim_release_and_reclaim(tmp_path):
    rdir = tmp_path / "run"
    assert acquire_lock(rdir) is None  # creates the folder
    assert read_lock(rdir) == (os.getpid(), platform.node())
    assert live_holder(rdir) == (os.getpid(), platform.node())
    assert acquire_lock(rdir) is None  # already ours
    release_lock(rdir)
    assert not (rdir / LOCK_NAME).exists() and live_holder(rdir) is None
    release_lock(rdir)  # nothing to release: no error


def test_a_live_holder_keeps_the_lock_and_release_leaves_it_alone(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": sleeper.pid, "host": platform.node()}))
        assert acquire_lock(tmp_path) == f"process {sleeper.pid} on {platform.node()}"
        release_lock(tmp_path)
        assert read_lock(tmp_path) == (sleeper.pid, platform.node())
    finally:
        sleeper.kill()
        sleeper.wait()


def test_locks_of_other_hosts_count_as_live(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": _dead_pid(), "host": "elsewhere-" + platform.node()}))
    assert acquire_lock(tmp_path).endswith("on elsewhere-" + platform.node())


def test_a_stale_lock_is_taken_over(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": _dead_pid(), "host": platform.node()}))
    assert live_holder(tmp_path) is None
    assert acquire_lock(tmp_path) is None
    assert read_lock(tmp_path) == (os.getpid(), platform.node())


@pytest.mark.parametrize("content", ["", "{not json", '{"pid": 1}'])
def test_an_unreadable_lock_is_held_while_young_and_stale_when_old(tmp_path, content):
    """An empty or half-written lock is being filled by someone: never delete it under them."""
    lock = tmp_path / LOCK_NAME
    lock.write_text(content)
    assert live_holder(tmp_path) == (-1, "")
    assert acquire_lock(tmp_path) == f"a process that is still writing {lock}"
    assert lock.read_text() == content
    old = time.time() - UNREADABLE_GRACE_S - 5
    os.utime(lock, (old, old))
    assert live_holder(tmp_path) is None
    assert acquire_lock(tmp_path) is None and read_lock(tmp_path) == (os.getpid(), platform.node())


def test_a_takeover_in_progress_elsewhere_counts_as_held_and_an_abandoned_one_is_cleared(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": _dead_pid(), "host": platform.node()}))
    brk = tmp_path / (LOCK_NAME + ".break")
    brk.write_text(json.dumps({"pid": 1, "host": platform.node()}))
    assert acquire_lock(tmp_path) is not None  # someone is taking the stale lock over right now
    old = time.time() - UNREADABLE_GRACE_S - 5
    os.utime(brk, (old, old))  # ... or was killed doing so long ago
    assert acquire_lock(tmp_path) is None
    assert not brk.exists()
