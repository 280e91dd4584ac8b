"""Review of commit 6820361 (the runner's rank-0 writes agreed across ranks; a checkpoint one rank alone cannot read or
restore fails that run on every rank through ``_raise_on_every_rank(..., same_kind=CheckpointError)``).

- Every rank took the way of the lowest failing rank's kind, but a failing rank re-raised its own error: with one
  rank's CheckpointError (that run fails, the comparison goes on) and another's OSError (the job stops), the ranks
  went apart (the one at its next collective until the process-group timeout).
- The same_kind mark was read from the store after the last meeting: a rank that failed otherwise had left (rank 0
  may host the store) while another still read it ("Connection reset by peer" in place of the named cause).
- A rank that takes the same_kind way said it "stops too rather than wait for it at the next collective", in the
  failed run's row and log, where that run alone fails and the comparison goes on.

The ranks are threads here (no process group): a shared ``HashStore``, a ``threading.Barrier`` as ``ctx.barrier``.
"""

from __future__ import annotations

import itertools
import threading

import pytest
import torch
import torch.distributed as dist

from diffusionformer.train import CheckpointError
from diffusionformer.train import distributed as distributed_mod
from diffusionformer.train.distributed import DistContext, _raise_on_every_rank


class _StoreAfterLastMeeting(AssertionError):
    pass


def _agree(monkeypatch, errors: list[Exception | None], strict: bool = False) -> list[BaseException | None]:
    """What each rank (a thread, ``errors[rank]`` its own error) raises from one ``_raise_on_every_rank`` with
    ``same_kind=CheckpointError``; ``strict``: a rank that reads the store after the last meeting raises
    _StoreAfterLastMeeting."""
    world = len(errors)
    store = dist.HashStore()
    meeting = threading.Barrier(world, timeout=20)
    met = threading.local()

    class Ctx(DistContext):
        def barrier(self) -> None:
            met.count = getattr(met, "count", 0) + 1
            meeting.wait()

    class Store:  # the shared store, refused to a rank past its last meeting (its host may be gone)
        def __getattr__(self, name):
            if strict and getattr(met, "count", 0) >= 2 and name in ("check", "get"):
                raise _StoreAfterLastMeeting(f"store.{name} after the last barrier")
            return getattr(store, name)

    monkeypatch.setattr(distributed_mod, "_agreements", itertools.repeat(0))  # one call: the same count on each
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", Store)
    raised: list[BaseException | None] = [None] * world

    def rank(r: int) -> None:
        try:
            _raise_on_every_rank(Ctx(r, world, r, torch.device("cpu")), errors[r], "reading the checkpoint c.pt",
                                 CheckpointError)
        except BaseException as err:  # noqa: BLE001 - recorded for the test
            raised[r] = err

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return raised


def _fails_the_run_alone(err: BaseException | None) -> bool:
    """The runner's way for ``err``: a CheckpointError fails that run and the comparison goes on; another stops."""
    return isinstance(err, CheckpointError)


@pytest.mark.parametrize("errors", [
    [CheckpointError("rank 0's damaged state"), OSError(5, "Input/output error")],
    [None, CheckpointError("rank 1's damaged state"), OSError(5, "Input/output error")],
    [None, OSError(5, "Input/output error"), CheckpointError("rank 2's damaged state")],
])
def test_bug_a_one_ranks_checkpoint_error_and_anothers_other_error_take_every_rank_one_way(monkeypatch, errors):
    """Bug: rank 0 (or a rank that went well, the lowest failing rank's kind a CheckpointError) failed that run and
    went on, while the rank of the OSError stopped the job: the ranks apart. Every rank now stops, naming the rank of
    the other error (its own CheckpointError kept as the cause)."""
    raised = _agree(monkeypatch, errors)
    ways = {_fails_the_run_alone(err) for err in raised}
    assert ways == {False}, raised
    apart = next(r for r, e in enumerate(errors) if isinstance(e, OSError))
    for r, err in enumerate(raised):
        if isinstance(errors[r], OSError):
            assert err is errors[r]
        else:
            assert isinstance(err, RuntimeError) and f"failed on rank {apart}" in str(err), err
            assert "Input/output error" in str(err)
            if errors[r] is not None:
                assert err.__cause__ is errors[r]


def test_bug_a_same_kind_is_read_before_the_last_meeting(monkeypatch):
    """Bug: a rank that went well read the failing rank's same_kind mark after the last barrier, when the failing
    rank (rank 0, the store's host) may have left with its error: its Gloo "Connection reset by peer" in place of
    the cause."""
    raised = _agree(monkeypatch, [OSError(28, "No space left on device"), None], strict=True)
    assert isinstance(raised[0], OSError)
    assert type(raised[1]) is RuntimeError and "failed on rank 0" in str(raised[1]), raised[1]
    assert "No space left on device" in str(raised[1])


def test_bug_a_ranks_of_one_checkpoint_error_say_the_run_fails_not_that_they_stop(monkeypatch):
    """Bug: rank 0's CheckpointError for rank 1's checkpoint, the failed run's row and log, said "rank 0 stops too
    rather than wait for it at the next collective" where that run alone fails and the comparison goes on."""
    cause = CheckpointError("a damaged random-generator state")
    raised = _agree(monkeypatch, [None, cause, CheckpointError("rank 2's own")])
    assert raised[1] is cause and isinstance(raised[2], CheckpointError)
    assert type(raised[0]) is CheckpointError, raised[0]
    message = str(raised[0])
    assert "failed on rank 1 (CheckpointError: a damaged random-generator state)" in message
    assert "stops" not in message and "next collective" not in message, message
    assert "rank 0 fails it too" in message


def test_without_same_kind_the_agreement_is_as_before(monkeypatch):
    """No same_kind (every write agreed on): the others' RuntimeError names the lowest failing rank, as before."""
    store = dist.HashStore()
    monkeypatch.setattr(distributed_mod, "_agreements", itertools.repeat(0))
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: store)
    store.set("diffusionformer/failed/0/1", "OSError: full")  # rank 1 failed (posted before the meeting)

    class Ctx(DistContext):
        def barrier(self) -> None:
            pass

    with pytest.raises(RuntimeError, match=r"^w failed on rank 1 \(OSError: full\); rank 0 stops too rather than "
                                           r"wait for it at the next collective$"):
        _raise_on_every_rank(Ctx(0, 2, 0, torch.device("cpu")), None, "w")


def test_a_rank_failing_a_run_for_anothers_checkpoint_is_not_advised_to_delete_it(monkeypatch):
    """Bug (sitting 57): rank 0, which read the checkpoint, failed the run for rank 1's cause (a permission error,
    say) and logged the advice to delete checkpoint.pt, a good file. It now names the rank and its access."""
    from diffusionformer.experiments.runner import _not_resumed_advice

    raised = _agree(monkeypatch, [None, CheckpointError("rank 1 cannot read it")])
    advice = _not_resumed_advice(raised[0], "r/checkpoint.pt", "this")
    assert advice.startswith("Rank 1 could not resume from r/checkpoint.pt, which this rank read")
    assert "Delete" not in advice
    own = _not_resumed_advice(raised[1], "r/checkpoint.pt", "this")  # the failing rank's own advice is unchanged
    assert own.startswith("Delete r/checkpoint.pt to train this run again")
