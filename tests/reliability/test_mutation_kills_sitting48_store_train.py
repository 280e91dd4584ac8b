"""Mutation audit (sitting 48) of the run store's locks (experiments/store.py), experiments/threads.py,
experiments/gpu.py, train/task.py, train/errors.py and testing/harness.py: tests that kill mutants the earlier tests
left alive (each docstring names the mutant). Nothing forks: a second worker is a second lock attempt in this process,
a dead holder a pid above the kernel's ``pid_max`` (no process has it), and no GPU is used (every gpu.py mutant,
the CUDA checks' included, was killed before).

80 mutants (store.py 29, threads.py 13, gpu.py 14, train/task.py 6, train/errors.py 6, testing/harness.py 12): 67
killed by earlier tests (and the modules' doctests), 8 survivors killed here (store.py 6, threads.py 1, harness.py 1),
5 equivalent:

* threads.py ``_positive_int`` ``int(value.strip())`` -> ``int(value)``: ``int()`` skips the same leading and trailing
  whitespace as ``str.strip()`` (spaces, tabs, newlines, Unicode spaces) but for the ASCII separators ``\\x1c``-
  ``\\x1f``, which no shell or env file puts around a count.
* threads.py ``ThreadPlan.describe`` ``self.workers != 1`` -> ``self.workers > 1``: a plan from ``plan_threads`` has
  ``workers >= 1`` (``_positive_int``), so the two differ only for a hand-built ``ThreadPlan(workers=0)``.
* harness.py ``_seed`` ``% 2**64`` -> ``% 2**63``: both give a valid ``manual_seed`` for every seed; the mutant draws
  other random inputs for seeds of ``2**63 - 3`` and above, and any draw is as good a test problem.
* harness.py shift law ``tol_a * 10`` -> ``tol_a * 1e6``: a polynomial's output is computed by the engine from
  ``coefficients()`` alone, linear in ``v`` with ``P 1 = 1``, and step 1 already checks it against the float64
  reference at ``tol_a``; a deterministic ``coefficients()`` cannot break the law by more than rounding.
* harness.py ``raise AssertionError(... declares supports_sparse=False but the sparse back-end did not refuse it)``
  made unreachable: it is already unreachable, since ``apply_operator_sparse`` itself raises ``ValueError`` for an
  operator with ``supports_sparse = False`` (the check is vacuous; reported, not changed).

No bug found: every survivor was a test gap, the code right.
"""

from __future__ import annotations

import json
import os
import platform
import time

import pytest
import torch

from diffusionformer.experiments import store
from diffusionformer.operators import DiffusionOperator
from experiments_tiny_configs import write_lock


def test_kills_store_a_lock_of_exactly_max_bytes_is_read(tmp_path):
    """kills: experiments/store.py ``_state`` ``len(text) > _MAX_LOCK_BYTES`` -> ``>=`` (a lock record of exactly
    4096 bytes, the most a lock may hold, was junk: its live holder's run counted as held by "a process that is still
    writing" it, and once older than the grace period as stale, so a second worker took over a live worker's run).
    One byte more is junk, as documented."""
    node = platform.node()
    record = json.dumps({"pid": 1, "host": node})  # pid 1 always runs
    rdir = tmp_path / "run"
    write_lock(rdir, record + " " * (store._MAX_LOCK_BYTES - len(record)), age=2 * store.UNREADABLE_GRACE_S)
    assert (rdir / store.LOCK_NAME).stat().st_size == store._MAX_LOCK_BYTES
    assert store.live_holder(rdir) == (1, node) and store.read_lock(rdir) == (1, node)
    assert store.acquire_lock(rdir) == f"process 1 on {node}"
    write_lock(rdir, record + " " * (store._MAX_LOCK_BYTES + 1 - len(record)), age=2 * store.UNREADABLE_GRACE_S)
    assert store.read_lock(rdir) is None and store.live_holder(rdir) is None  # longer than any lock: old junk


def test_kills_store_a_holder_whose_start_time_cannot_be_read_holds_its_run(tmp_path, monkeypatch):
    """kills: experiments/store.py ``_is_stale`` ``now is not None and now != start`` -> ``now != start`` (where a
    live holder's ``/proc/<pid>/stat`` cannot be read, e.g. ``/proc`` mounted ``hidepid=2`` and the holder another
    user's worker, its lock was taken for a dead holder's whose pid was reused: a second worker took the live run
    over and both trained it)."""
    node = platform.node()
    rdir = tmp_path / "run"
    write_lock(rdir, json.dumps({"pid": 1, "host": node, "start": 12345}))  # pid 1 runs; its start is not read
    real = store._start_time
    monkeypatch.setattr(store, "_start_time", lambda pid: None if pid == 1 else real(pid))
    assert store.live_holder(rdir) == (1, node)
    assert store.acquire_lock(rdir) == f"process 1 on {node}"
    assert store.read_lock(rdir) == (1, node)


def test_kills_store_the_claim_sweep_removes_only_claim_temporaries(tmp_path):
    """kills: experiments/store.py ``_sweep_claims`` ``if not _CLAIM.fullmatch(tmp.name): continue`` dropped (every
    old ``.lock.*.tmp`` of the run's folder, such as a user's ``.lock.notes.tmp`` or another tool's file, was read as a
    junk claim and deleted by the next claim of the run). A claim temporary left by a killed claimant (the name
    ``.lock.<pid>.<12 hex>.tmp``, unreadable, old) is still removed."""
    rdir = tmp_path / "run"
    rdir.mkdir()
    old = time.time() - 2 * store.UNREADABLE_GRACE_S
    others = [rdir / ".lock.notes.tmp", rdir / ".lock.123.tmp", rdir / ".lock.7.ABCDEF012345.tmp"]
    claim = rdir / ".lock.7.abcdef012345.tmp"
    for path in (*others, claim):
        path.write_text("{")  # unreadable: junk once old, were it a claim
        os.utime(path, (old, old))
    assert store.acquire_lock(rdir) is None
    assert not claim.exists()
    assert all(path.exists() for path in others)
    store.release_lock(rdir)
    assert sorted(p.name for p in rdir.iterdir()) == sorted(p.name for p in others)


def _dead_pid() -> int:
    """A pid no process has: above the kernel's ``pid_max`` (no fork needed to find one)."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read()) + 1
    except OSError:
        pytest.skip("no /proc/sys/kernel/pid_max")


def test_kills_store_an_old_break_that_links_to_a_folder_is_removed_not_refused(tmp_path):
    """kills: experiments/store.py ``_take_over_locked`` ``brk.is_dir() and not brk.is_symlink()`` -> ``brk.is_dir()``
    (an abandoned ``.lock.break`` that is a link to a folder, junk another tool left, made every takeover of the stale
    lock raise "is a folder, not a lock file", though the link, unlike a folder, is removed like any old junk: the run
    was blocked for good). The folder it links to is left alone."""
    rdir = tmp_path / "run"
    write_lock(rdir, json.dumps({"pid": _dead_pid(), "host": platform.node()}))
    target = tmp_path / "elsewhere"
    target.mkdir()
    old = time.time() - 2 * store.UNREADABLE_GRACE_S
    os.utime(target, (old, old))
    (rdir / ".lock.break").symlink_to(target, target_is_directory=True)
    assert store.live_holder(rdir) is None
    assert store.acquire_lock(rdir) is None
    assert store.read_lock(rdir) == (os.getpid(), platform.node())
    assert not (rdir / ".lock.break").is_symlink() and target.is_dir()
    store.release_lock(rdir)


def test_kills_store_a_command_name_with_a_parenthesis_keeps_the_start_time():
    """kills: experiments/store.py ``_stat_fields`` ``text.rindex(b")")`` -> ``text.index(b")")`` (a worker whose
    command name holds ``)`` and spaces, as ``setproctitle`` or a renamed launcher give, had its ``/proc`` fields read
    shifted: a wrong start time in its lock, so its own later claims and other workers saw a dead namesake and took
    the live run over). The process name is changed for the test and restored."""
    comm = f"/proc/{os.getpid()}/comm"
    if not os.path.exists(comm):
        pytest.skip("no /proc")
    with open(comm) as f:
        name = f.read().rstrip("\n")
    before = store._start_time(os.getpid())
    assert before is not None
    try:
        with open(comm, "w") as f:
            f.write(name)  # a sandbox that refuses renaming this process: nothing to test
    except OSError as exc:
        pytest.skip(f"cannot rename this process: {exc}")
    try:
        with open(comm, "w") as f:
            f.write("w) 1 2 3 4 5 6")
        assert store._start_time(os.getpid()) == before
        assert not store._zombie(os.getpid())
    finally:
        with open(comm, "w") as f:
            f.write(name)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_kills_store_a_fifo_in_place_of_a_lock_is_not_read(tmp_path):
    """kills: experiments/store.py ``_state`` ``f.read(...) if stat.S_ISREG(st.st_mode) else b""`` ->
    ``f.read(...)`` (a FIFO in place of ``.lock``, junk the module docstring promises is never read, was read: what a
    writer had put in the pipe was taken as a lock record, consumed, and its "holder" held the run for ever, past the
    grace period after which junk is stale)."""
    node = platform.node()
    rdir = tmp_path / "run"
    rdir.mkdir()
    lock = rdir / store.LOCK_NAME
    os.mkfifo(lock)
    fd = os.open(lock, os.O_RDWR | os.O_NONBLOCK)  # keeps the pipe open, with a record of pid 1 (always runs) in it
    try:
        os.write(fd, json.dumps({"pid": 1, "host": node}).encode())
        old = time.time() - 2 * store.UNREADABLE_GRACE_S
        os.utime(lock, (old, old))
        assert store.read_lock(rdir) is None
        assert store.live_holder(rdir) is None  # old junk: stale
        assert store.acquire_lock(rdir) is None
        assert store.read_lock(rdir) == (os.getpid(), node)
    finally:
        os.close(fd)
    store.release_lock(rdir)


def test_kills_threads_cores_are_the_affinity_mask_not_the_machine(monkeypatch):
    """kills: experiments/threads.py ``available_cores`` ``len(os.sched_getaffinity(0))`` -> ``os.cpu_count()`` (a
    worker pinned to 2 of 16 cores, by ``taskset`` or a batch scheduler's cgroup, ran 16 threads on its 2 cores)."""
    from diffusionformer.experiments.threads import available_cores, plan_threads

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no affinity masks on this OS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 7})
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert available_cores() == 2
    plan = plan_threads(environ={})
    assert (plan.threads, plan.cores, plan.source) == (2, 2, "cores // workers")


class _Cancels(DiffusionOperator):
    """A user operator, written as ``docs/tutorials/custom_operator.rst`` shows, that is wrong in float32:
    ``(P v + 1e5) - 1e5`` keeps two or three digits of ``P v`` (right in float64)."""

    is_polynomial = False
    supports_sparse = False
    degree = 0

    def coefficients(self) -> torch.Tensor:
        return torch.zeros(1)

    def apply_matrix(self, P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return (P @ v + 1e5) - 1e5

def test_kills_harness_a_float32_check_uses_a_float64_reference():
    """kills: testing/harness.py ``_reference`` ``copy.deepcopy(op).double().apply_matrix(P, v.double())`` ->
    ``op.apply_matrix(P.to(v.dtype), v).double()`` (in float32 a non-polynomial operator was compared with its own
    float32 output, not the "explicit float64 reference" the module docstring promises: an operator that keeps two
    or three digits in float32 passed ``assert_operator(..., dtype=torch.float32)``). In float64 it passes."""
    from diffusionformer.testing import assert_operator

    with pytest.raises(AssertionError, match=r"dense backend='matrix' causal=False vs float64 reference: max abs "
                                             r"difference"):
        assert_operator(_Cancels(), dtype=torch.float32)
    assert_operator(_Cancels())
