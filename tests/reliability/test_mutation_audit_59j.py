"""Mutation audit (59j) of the run store's locks (experiments/store.py) and of train/distributed.py (``dist_env``,
``_rank_zero``, the agreements across ranks, ``shard_batch``, ``init_distributed``): tests that kill the mutants the
earlier tests left alive, each checked against expectations worked out by hand (each docstring names its mutant).
Nothing forks and no process group is made: a dead holder is a pid above the kernel's ``pid_max``, two ranks are two
threads meeting at a barrier over one ``HashStore``.

112 mutants (store.py 64, distributed.py 48), each run against the fast tests that name the two modules' functions:
99 killed by earlier tests (and the doctests), 13 survived: 9 killed here, 4 not:

* store.py ``_state`` without ``O_NONBLOCK``: killed by the subprocess test of a FIFO in a run file's place
  (``test_edge_probes_runner_second``), outside the fast subset;
* store.py ``_sweep_claims`` without ``stat.S_ISDIR(st.st_mode)``: equivalent (``_state`` of a folder, or of a link
  to one, is ``(None, None)``: ``open`` raises IsADirectoryError);
* distributed.py ``_raise_on_every_rank`` without ``rank != ctx.rank`` in ``causes``: equivalent (a rank's own key is
  posted only with its own error, which it re-raises unless that error is a ``same_kind`` while another rank's is
  not; its own key then stays out of ``apart``, and ``causes`` is read only through ``apart`` there);
* distributed.py ``dist_env`` ``None if world_size == 1`` -> ``None if rank == 0 and world_size == 1``: equivalent
  (``0 <= rank < 1`` was checked above).

No bug found: every survivor was a test gap, the code right.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import threading
import time
from collections import UserDict
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest
import torch
import torch.distributed as dist

from diffusionformer.experiments import store
from diffusionformer.train import distributed as distributed_mod
from diffusionformer.train.distributed import DistContext, _rank_zero, shard_batch
from experiments_tiny_configs import write_lock


@pytest.mark.parametrize(("rank", "expected"), [(None, True), ("", True), ("  ", True), ("0", True), ("1", False),
                                                ("3", False)])
def test_kills_rank_zero_an_unset_or_blank_rank_of_a_multi_process_run_is_rank_zero(rank, expected, monkeypatch):
    """kills: train/distributed.py ``_rank_zero`` ``int(... or 0) == 0`` -> ``int(... or 1) == 0`` (documented: "an
    unset or blank ``RANK`` is rank 0"; the mutant read it as rank 1 in a run of 4 processes, so no process of a
    launch that lost its ``RANK`` was the one to print ``dist_env``'s error about it)."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    assert _rank_zero() is expected


def _field_22(pid: int) -> int:
    """Reference: field 22 (``starttime``) of ``/proc/<pid>/stat`` (proc(5)), counted by hand from field 3, the first
    after the command name in parentheses."""
    text = Path(f"/proc/{pid}/stat").read_text()
    after_name = text[text.rindex(")") + 2:].split(" ")  # field 3 (state) on
    return int(after_name[22 - 3])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="start times come from /proc")
def test_kills_store_the_start_time_of_a_lock_is_the_holders_own(tmp_path):
    """kills: experiments/store.py ``_start_time`` ``int(fields[19])`` -> ``int(fields[18])`` (field 21,
    ``itrealvalue``, 0 for every process since Linux 2.6.17: every lock recorded start 0, so a lock of a dead worker
    whose pid this process got, recorded at start 0, was read as this process's own: ``acquire_lock`` said it held the
    run without writing its own record, and ``live_holder`` named it held). pid 1 started first, so its start time is
    the smallest."""
    me, node = os.getpid(), platform.node()
    assert store._start_time(me) == _field_22(me) and store._start_time(1) == _field_22(1)
    assert store._start_time(1) < store._start_time(me)
    rdir = tmp_path / "run"
    write_lock(rdir, json.dumps({"pid": me, "host": node, "start": 0}))  # a dead worker that had this pid, at boot
    assert store.live_holder(rdir) is None  # this process did not start at tick 0: stale
    assert store.acquire_lock(rdir) is None
    try:
        record = json.loads((rdir / store.LOCK_NAME).read_text())
        assert (record["pid"], record["host"], record["start"]) == (me, node, _field_22(me))
        assert store.live_holder(rdir) == (me, node)
    finally:
        store.release_lock(rdir)
    assert not (rdir / store.LOCK_NAME).exists()


@pytest.mark.parametrize("start", ["true", "false", "1.0", '"1"'])
def test_kills_store_a_start_time_that_is_no_int_is_left_out(tmp_path, start):
    """kills: experiments/store.py ``_parse`` ``start if type(start) is int`` -> ``isinstance(start, int)`` (documented:
    a ``start`` that is not an int cannot be compared and the lock is judged by its pid alone; the mutant read
    ``true``/``false`` as start times 1 and 0, so the lock of this live process was stale, not held, and its own
    ``release_lock`` left it behind)."""
    me, node = os.getpid(), platform.node()
    rdir = tmp_path / "run"
    write_lock(rdir, f'{{"pid": {me}, "host": "{node}", "start": {start}}}')
    assert store.live_holder(rdir) == (me, node)  # this process runs: held, by its pid alone
    store.release_lock(rdir)  # this process's lock (no start time to tell another process of its pid)
    assert not (rdir / store.LOCK_NAME).exists()


_DEAD = 2**31 - 1  # above any kernel's pid_max (at most 2**22): no process has it


def test_kills_store_a_lost_takeover_names_the_live_lock_before_the_taker(tmp_path, monkeypatch):
    """kills: experiments/store.py ``_taker`` ``(rdir / LOCK_NAME, rdir / _BREAK_NAME)`` -> ``(.lock.break, .lock)``
    (documented: after a lost takeover the run is held by "the live holder of the lock that replaced it, else the
    worker taking it over now"; the mutant named the taker, a worker of another host still in its takeover, though
    the process in ``.lock`` holds the run)."""
    node = platform.node()
    rdir = tmp_path / "run"
    write_lock(rdir, json.dumps({"pid": _DEAD, "host": node}))  # stale: its holder is dead
    (rdir / store._BREAK_NAME).write_text(json.dumps({"pid": 7, "host": node + "-other"}))  # a takeover in flight

    def replaced_meanwhile(rdir, tmp, stale):  # another worker took the run over first: pid 1 (it always runs)
        (rdir / store.LOCK_NAME).unlink()
        (rdir / store.LOCK_NAME).write_text(json.dumps({"pid": 1, "host": node}))
        return False

    monkeypatch.setattr(store, "_take_over", replaced_meanwhile)
    assert store.acquire_lock(rdir) == f"process 1 on {node}"
    monkeypatch.undo()  # and with no live lock, the worker whose takeover is in flight holds it
    (rdir / store.LOCK_NAME).write_text(json.dumps({"pid": _DEAD, "host": node}))
    assert store.acquire_lock(rdir) == f"process 7 on {node}-other"


def test_kills_store_only_the_library_s_own_claim_temporaries_are_swept(tmp_path):
    """kills: experiments/store.py ``_CLAIM`` ``[0-9a-f]{12}`` -> ``[0-9a-f]+`` (a claim temporary is
    ``.lock.<pid>.<12 hex digits>.tmp``, ``secrets.token_hex(6)``; the mutant's sweep also removed another tool's
    old ``.lock.<pid>.<other>.tmp`` files, which this library never wrote)."""
    node = platform.node()
    rdir = tmp_path / "run"
    rdir.mkdir()
    record = json.dumps({"pid": _DEAD, "host": node})  # a dead writer's
    names = {"ours": f".lock.{_DEAD}.0123456789ab.tmp", "short": f".lock.{_DEAD}.abcdef.tmp",
             "long": f".lock.{_DEAD}.0123456789abcd.tmp"}
    old = time.time() - 2 * store.UNREADABLE_GRACE_S
    for name in names.values():
        (rdir / name).write_text(record)
        os.utime(rdir / name, (old, old))
    assert store.acquire_lock(rdir) is None
    try:
        assert sorted(p.name for p in rdir.iterdir()) == sorted([store.LOCK_NAME, names["short"], names["long"]])
    finally:
        store.release_lock(rdir)


def test_kills_store_a_live_lock_of_this_host_gets_no_foreign_lock_note(tmp_path):
    """kills: experiments/store.py ``_foreign_lock_note`` without ``not _other_host(holder)`` (the runner's skip
    message for a run that a live process of this host trains said "<this host> is another host (another machine of
    this host's name)" and advised removing its lock by hand, a run then trained twice)."""
    node = platform.node()
    rdir = tmp_path / "run"
    write_lock(rdir, json.dumps({"pid": 1, "host": node}))
    assert store.live_holder(rdir) == (1, node) and store._foreign_lock_note(rdir) is None
    write_lock(rdir, json.dumps({"pid": 1, "host": node + "-other"}))
    assert store._foreign_lock_note(rdir).startswith(f"{node}-other is another host; the run last showed a sign")


def test_kills_on_every_rank_a_step_failing_on_rank_zero_stops_the_other_ranks_at_once(monkeypatch):
    """kills: train/distributed.py ``_on_every_rank`` ``except Exception`` -> ``except ZeroDivisionError`` (an
    OSError of rank 0's write escaped before it was posted: rank 0 left the agreement and rank 1 waited for it, in a
    real group until the process-group timeout, instead of stopping with a RuntimeError naming rank 0 and its
    cause). Two ranks are two threads meeting at a barrier over one store."""
    world = 2
    hash_store = dist.HashStore()
    meeting = threading.Barrier(world, timeout=5)

    class Ctx(DistContext):
        def barrier(self) -> None:
            meeting.wait()

    monkeypatch.setattr(distributed_mod, "_agreements", itertools.repeat(0))  # one call: the same count on each
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: hash_store)
    raised: list[BaseException | None] = [None] * world

    def write() -> None:
        raise OSError(28, "No space left on device")

    def rank(r: int) -> None:
        try:
            distributed_mod._on_every_rank(Ctx(r, world, r, torch.device("cpu")), "writing the summary", write,
                                           here=r == 0)
        except BaseException as err:  # noqa: BLE001 - recorded for the test
            raised[r] = err

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert isinstance(raised[0], OSError) and raised[0].errno == 28  # its own error, as it was
    assert isinstance(raised[1], RuntimeError)
    assert str(raised[1]).startswith("writing the summary failed on rank 0 (OSError: [Errno 28] No space left on "
                                     "device); rank 1 stops too")


def test_kills_shard_batch_numpy_rank_and_world_size_of_a_small_type_are_read_as_ints():
    """kills: train/distributed.py ``shard_batch`` without ``rank, world_size = int(rank), int(world_size)``
    (documented: NumPy ints are read as ints; the mutant computed ``B % world_size`` and the row bounds in the NumPy
    type, so ``int8`` ranks of a 300-row batch over 100 processes failed with an OverflowError). By hand: rank 99 of
    100 gets rows 297, 298, 299; rank 0 rows 0, 1, 2."""
    batch = {"x": torch.arange(300), "y": torch.arange(600).reshape(300, 2)}
    last = shard_batch(batch, np.int8(99), np.int8(100))
    assert last["x"].tolist() == [297, 298, 299] and last["y"].tolist() == [[594, 595], [596, 597], [598, 599]]
    assert shard_batch(batch, np.uint8(0), np.int16(100))["x"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("container", [UserDict, MappingProxyType])
def test_kills_shard_batch_checks_first_sizes_inside_every_mapping(container):
    """kills: train/distributed.py ``_tensor_shapes`` ``isinstance(batch, Mapping)`` -> ``isinstance(batch, dict)``
    (a ``UserDict`` or other mapping batch was not looked into: an ``edge_index`` ``(2, E)`` beside ``(N, D)``
    features was cut into rows silently, rank 1 of 2 getting the features of nodes 2, 3 and only the targets row of
    ``edge_index``, instead of the documented refusal)."""
    batch = container({"x": torch.zeros(4, 3), "edge_index": torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])})
    with pytest.raises(ValueError, match=r"different first sizes: batch\['x'\] \(4, 3\), batch\['edge_index'\] "
                                         r"\(2, 4\)"):
        shard_batch(batch, 1, 2)
    same = container({"x": torch.arange(8).reshape(4, 2), "y": torch.arange(4)})  # one B: rank 1 gets rows 2, 3
    part = shard_batch(same, 1, 2)
    assert part["x"].tolist() == [[4, 5], [6, 7]] and part["y"].tolist() == [2, 3]
