"""Edge-case probes of the benchmark harness, third sitting (the others: ``test_edge_probes_benchmarks.py`` and
``test_edge_probes_benchmarks_second.py``).

Probed for measurement correctness on CUDA without a GPU (by reading, small CPU runs and stand-ins for the
``torch.cuda`` calls and the profiler): synchronisation around every timed block and peak-memory window,
interleaved rounds and paired ratios, no_grad in forward timings, the direction of every ratio against its
caption, seeds and shared inputs of both sides, ``torch.compile`` kept out of the timed rounds, the profile's
counts.

Found and fixed (tests named ``test_bug_*``):

* ``bench_issue15.profile_call`` counted a host synchronisation twice on CUDA: an ``.item()`` is an
  ``aten::_local_scalar_dense`` event with the ``cudaStreamSynchronize`` it waits in inside it, and both names
  were summed, so the "host syncs" column of the H200 profile read 2 per ``.item()`` (1 on CPU).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _common as C  # noqa: E402
import bench_issue15 as B  # noqa: E402

CPU_EVENT = torch.autograd.DeviceType.CPU
CUDA_EVENT = torch.autograd.DeviceType.CUDA


class _FakeProfile:
    """Stand-in for ``torch.profiler.profile`` on a CUDA run: the events one call of ``.item()`` records there."""

    def __init__(self, events: list[tuple[str, object]]) -> None:
        self._events = [SimpleNamespace(name=n, device_type=d) for n, d in events]

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204 - profile(activities=...)
        return self

    def __enter__(self):  # noqa: ANN204
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        return None

    def events(self) -> list[SimpleNamespace]:
        return self._events


# what kineto records for one layer call on CUDA that reads one scalar back: aten::item > aten::_local_scalar_dense
# > (cudaMemcpyAsync, cudaStreamSynchronize) (c10::cuda::memcpy_and_sync), one kernel, and the script's own
# synchronisation plus the profiler's exit (cudaDeviceSynchronize twice)
ONE_ITEM_ON_CUDA = [("aten::mm", CPU_EVENT), ("cudaLaunchKernel", CPU_EVENT), ("gemm_kernel", CUDA_EVENT),
                    ("aten::item", CPU_EVENT), ("aten::_local_scalar_dense", CPU_EVENT),
                    ("cudaMemcpyAsync", CPU_EVENT), ("Memcpy DtoH (Device -> Pinned)", CUDA_EVENT),
                    ("cudaStreamSynchronize", CPU_EVENT), ("cudaDeviceSynchronize", CPU_EVENT),
                    ("cudaDeviceSynchronize", CPU_EVENT)]


def test_bug_one_item_on_cuda_is_one_host_sync(monkeypatch):
    """Bug: ``profile_call`` summed ``aten::_local_scalar_dense`` and ``cudaStreamSynchronize``; on CUDA the first
    holds the second (``.item()`` copies the scalar and waits for the stream), so each ``.item()`` of a layer call
    showed as 2 host syncs in the H200 profile (1 in the CPU profile of the same layer)."""
    import torch.profiler

    monkeypatch.setattr(torch.profiler, "profile", _FakeProfile(ONE_ITEM_ON_CUDA))
    synced: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: synced.append("sync"))
    calls: list[int] = []
    p = B.profile_call(lambda: calls.append(1), "cuda")
    assert p["syncs"] == 1
    assert p["launches"] == 2  # the two device events: the kernel and the copy
    assert len(calls) == 3 and synced  # two untimed calls, then the profiled one
    # a blocking device-to-host copy (``.cpu()``) is a stream sync without _local_scalar_dense: counted, once
    copy = [("aten::copy_", CPU_EVENT), ("cudaMemcpyAsync", CPU_EVENT), ("cudaStreamSynchronize", CPU_EVENT)]
    assert B.host_syncs(Counter(n for n, _ in copy), "cuda") == 1
    assert B.host_syncs(Counter(n for n, _ in ONE_ITEM_ON_CUDA), "cuda") == 1


def test_one_item_on_cpu_is_one_host_sync_in_the_real_profile():
    """The CPU profile (a real ``torch.profiler`` run) counts the ``.item()`` a GPU would wait for, once."""
    w = torch.ones(3, requires_grad=True)

    def call() -> None:
        y = (w * 2).sum()
        float(y.detach().item())
        y.backward()

    p = B.profile_call(call, "cpu")
    assert p["syncs"] == 1
    assert B.host_syncs(Counter({"aten::_local_scalar_dense": 2, "cudaStreamSynchronize": 0}), "cpu") == 2


# ---------------------------------------------------------------------------- CUDA call order (no GPU: stand-ins)
def test_timed_block_and_peak_window_synchronise_in_order_on_cuda(monkeypatch):
    """Every timed block reads the clock after a synchronisation and again after the next one, and the peak-memory
    window resets the peak after a synchronisation and reads it after the call has synchronised (stand-in
    ``torch.cuda`` calls record the order)."""
    log: list[str] = []
    now = [0.0]

    def clock() -> float:
        log.append("clock")
        return now[0]

    monkeypatch.setattr(C, "_CLOCK", clock)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: log.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: log.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: log.append("allocated") or 100)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: log.append("max") or 350)

    def fn() -> None:
        log.append("call")
        now[0] += 0.5

    assert C._time_block(fn, 2, "cuda") == pytest.approx(0.5)
    assert log == ["sync", "clock", "call", "call", "sync", "clock"]
    log.clear()
    assert C.peak_memory(fn, "cuda") == 250
    assert log == ["sync", "reset", "allocated", "call", "sync", "max"]


def test_bug_issue15_on_cpu_one_part_with_sizes_does_not_run_the_others_full_grid(monkeypatch, tmp_path):
    """Bug: ``--device cpu --layer-sizes 2`` passed the CPU guard, and the ``gpt`` part then ran all of its full
    sizes (a 12-layer GPT at T=1024: hours on a CPU); the guard wanted only one of the two size lists. Each part that
    runs needs its sizes chosen now."""
    monkeypatch.setattr(B, "triton_ready", lambda dev: (_ for _ in ()).throw(RuntimeError("past the check")))
    with pytest.raises(SystemExit, match=r"--gpt-sizes \(or leave their parts out"):
        B.main(["--device", "cpu", "--out", str(tmp_path), "--layer-sizes", "2"])
    with pytest.raises(SystemExit, match=r"choose sizes with --layer-sizes \("):
        B.main(["--device", "cpu", "--out", str(tmp_path), "--gpt-sizes", B.GPT_SIZES[0][0]])
    assert not any(tmp_path.iterdir())
    with pytest.raises(RuntimeError, match="past the check"):
        B.main(["--device", "cpu", "--out", str(tmp_path), "--layer-sizes", "2", "--gpt-sizes",
                B.GPT_SIZES[0][0]])
