"""Edge probes of the run-folder locks (``diffusionformer.experiments.store``): claim temporaries left by killed
claimants, ``release_lock`` against a recycled process id, and who a lost takeover names as the run's holder.

Concurrency and kills use fresh interpreters (``subprocess``), never ``fork``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

import pytest

from diffusionformer.experiments import store
from diffusionformer.experiments.store import LOCK_NAME, UNREADABLE_GRACE_S, acquire_lock, read_lock, release_lock

HOST = platform.node()
ME = (os.getpid(), HOST)
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _age(path, seconds) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t), follow_symlinks=False)


def _claim_killed_before_its_link(rdir) -> str:
    """Run ``acquire_lock(rdir)`` in a fresh interpreter that is killed (``os._exit``, no cleanup) right before its
    ``os.link``: what a claimant killed mid-claim leaves behind. Returns the temporary's name."""
    code = ("import os, sys\n"
            "from diffusionformer.experiments import store\n"
            "store.os.link = lambda *a, **k: os._exit(9)\n"
            "store.acquire_lock(sys.argv[1])\n")
    env = {**os.environ, "PYTHONPATH": _REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    rc = subprocess.run([sys.executable, "-c", code, str(rdir)], env=env, timeout=120).returncode
    assert rc == 9
    (left,) = [p.name for p in rdir.iterdir() if p.name.endswith(".tmp")]
    return left


def test_bug_lock_temporaries_of_killed_claimants_are_swept_once_old(tmp_path):
    """Bug: a claimant killed between writing ``.lock.<pid>.<random>.tmp`` and its ``finally`` left the temporary in
    the run folder for ever (one per kill; ``--restart`` skips every ``.lock*`` name, and nothing else removed them).
    Now the next claim of the run removes those of dead writers (or unreadable ones) once older than
    UNREADABLE_GRACE_S, and keeps young ones, those of live processes, and names that are not claim temporaries."""
    rdir = tmp_path / "run"
    rdir.mkdir()
    killed = _claim_killed_before_its_link(rdir)
    assert json.loads((rdir / killed).read_text())["host"] == HOST  # a whole record of a now dead process
    dead = _dead_pid()
    truncated = f"{LOCK_NAME}.{dead}.0123456789ab.tmp"  # killed while writing it
    (rdir / truncated).write_text("")
    young = f"{LOCK_NAME}.{dead}.aaaaaaaaaaaa.tmp"
    (rdir / young).write_text(json.dumps({"pid": dead, "host": HOST}))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        live = f"{LOCK_NAME}.{sleeper.pid}.bbbbbbbbbbbb.tmp"  # a claim in flight (a stopped process): never removed
        (rdir / live).write_text(json.dumps({"pid": sleeper.pid, "host": HOST,
                                             **({} if store._start_time(sleeper.pid) is None else
                                                {"start": store._start_time(sleeper.pid)})}))
        other = f"{LOCK_NAME}.{dead}.cccccccccccc.tmp.keep"  # not a claim temporary's name
        (rdir / other).write_text("")
        for name in (killed, truncated, live, other):
            _age(rdir / name, 2 * UNREADABLE_GRACE_S)
        assert acquire_lock(rdir) is None
        assert sorted(p.name for p in rdir.iterdir()) == sorted([LOCK_NAME, young, live, other])
        release_lock(rdir)
        _age(rdir / young, 2 * UNREADABLE_GRACE_S)
        assert acquire_lock(rdir) is None  # the next claim sweeps the one that is old now
        assert sorted(p.name for p in rdir.iterdir()) == sorted([LOCK_NAME, live, other])
    finally:
        sleeper.kill()
        sleeper.wait()


def test_bug_a_stale_lock_takeover_sweeps_killed_claims_too(tmp_path):
    """Bug: as above, on the takeover path: a run whose worker was killed (stale ``.lock``) and whose claimant was
    killed mid-claim kept the claimant's temporary after the next worker took the run over."""
    rdir = tmp_path / "run"
    rdir.mkdir()
    killed = _claim_killed_before_its_link(rdir)
    _age(rdir / killed, 2 * UNREADABLE_GRACE_S)
    (rdir / LOCK_NAME).write_text(json.dumps({"pid": _dead_pid(), "host": HOST}))
    assert acquire_lock(rdir) is None and read_lock(rdir) == ME
    assert sorted(p.name for p in rdir.iterdir()) == [LOCK_NAME]


def test_pins_claim_temporaries_of_another_host_wait_longer(tmp_path):
    """A claim temporary of another host (its writer cannot be checked from here) is kept past UNREADABLE_GRACE_S and
    removed once older than ten times that."""
    rdir = tmp_path / "run"
    rdir.mkdir()
    name = f"{LOCK_NAME}.12.0123456789ab.tmp"
    (rdir / name).write_text(json.dumps({"pid": 12, "host": "elsewhere-" + HOST}))
    _age(rdir / name, 2 * UNREADABLE_GRACE_S)
    assert acquire_lock(rdir) is None and (rdir / name).exists()
    release_lock(rdir)
    _age(rdir / name, 11 * UNREADABLE_GRACE_S)
    assert acquire_lock(rdir) is None and not (rdir / name).exists()


def test_bug_release_lock_leaves_the_lock_of_a_dead_process_that_had_this_pid(tmp_path):
    """Bug: ``release_lock`` compared the lock's pid and host only, not the start time the lock records: a lock of a
    dead worker whose id this process got (start time another) was removed as "ours". That read-then-unlink can
    remove the lock a worker taking the stale lock over has just linked, and a third worker then trains the run
    too. Reference: the docstring ("remove it if this process holds it, else leave it alone") and ``_is_stale``,
    which tells the two apart by the start time."""
    mine = store._start_time(os.getpid())
    if mine is None:
        pytest.skip("needs /proc start times")
    lock = tmp_path / LOCK_NAME
    record = json.dumps({"pid": os.getpid(), "host": HOST, "start": mine - 1})
    lock.write_text(record)
    release_lock(tmp_path)
    assert lock.read_text() == record
    lock.unlink()
    assert acquire_lock(tmp_path) is None and json.loads(lock.read_text())["start"] == mine
    release_lock(tmp_path)  # our own is still released
    assert not lock.exists()


def test_bug_a_lost_takeover_names_the_worker_taking_it_over_not_the_dead_holder(tmp_path):
    """Bug: with a stale lock and another worker's young ``.lock.break`` (a takeover in flight), ``acquire_lock``
    said the run was held by the dead holder of the stale lock ("process <dead pid> on host"), and the runner logged
    that dead process as training it. ``.lock.break`` is a link to the taker's claim: its record names the worker
    that will train the run."""
    dead = _dead_pid()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": dead, "host": HOST}))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        start = store._start_time(sleeper.pid)
        (tmp_path / store._BREAK_NAME).write_text(json.dumps({"pid": sleeper.pid, "host": HOST,
                                                              **({} if start is None else {"start": start})}))
        assert acquire_lock(tmp_path) == f"process {sleeper.pid} on {HOST}"
        (tmp_path / store._BREAK_NAME).write_text("{}")  # a record that names nobody: the takeover, not the dead
        said = acquire_lock(tmp_path)
        assert said.startswith("a process taking over the stale lock") and said.endswith(f"process {dead} on {HOST}")
        assert read_lock(tmp_path) == (dead, HOST)  # nothing was taken
    finally:
        sleeper.kill()
        sleeper.wait()
