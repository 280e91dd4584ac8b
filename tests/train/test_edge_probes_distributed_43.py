"""The ranks' agreement after a step only rank 0 takes (edge probes, 43): no rank leaves while another reads."""

from __future__ import annotations

import torch.distributed as dist

from diffusionformer.train import distributed


class _Ctx:
    """A two-rank context that records its barriers (no process group)."""

    is_distributed = True
    world_size = 2

    def __init__(self, rank, events):
        self.rank, self.events = rank, events

    def barrier(self):
        self.events.append("barrier")


class _Store:
    """The group's store as rank ``rank`` sees it: records every read; no rank posted a failure."""

    def __init__(self, events):
        self.events = events

    def set(self, key, value):
        self.events.append("set")

    def check(self, keys):
        self.events.append("check")
        return False

    def get(self, key):  # pragma: no cover - nothing was posted
        raise AssertionError(key)


def test_bug_a_rank_reads_the_store_before_the_host_may_leave(monkeypatch):
    """Bug: with no failure, every rank returned right after reading the store, so rank 0 (the store's host) could
    leave, and end its script after a run's last agreement (the summary), while rank 1 still checked its keys: rank 1
    died in "DistNetworkError: Connection reset by peer" (seen once in CI, in test_bug_ddp_resume_window_of_every_rank)
    and a run that went well failed. Every store read now comes before a last barrier, on every rank."""
    for rank in (0, 1):
        events: list[str] = []
        monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: _Store(events))
        distributed._raise_on_every_rank(_Ctx(rank, events), None, "writing the summary")
        reads = [i for i, e in enumerate(events) if e == "check"]
        assert reads, events
        assert events[-1] == "barrier" and events.index("barrier", reads[-1]) > reads[-1], events
