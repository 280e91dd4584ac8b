"""Probes written in an audit of the performance claims (docs/performance.md, benchmarks/NOTES.md) against
the benchmark scripts that produce their tables. CPU only, no timing asserts."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import bench_host  # noqa: E402
from diffusionformer.ops import engine  # noqa: E402


def _counts(backward: bool) -> dict[str, int]:
    L, H, D, T, B, V = bench_host.SIZE
    names = ("DiffusionGPT attention", "DiffusionGPT half Laplacian")
    ms = {n: m for n, m in bench_host.models("cpu").items() if n in names}
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    fns = bench_host.callables(ms, idx, targets, backward)
    with bench_host.no_id_check(True):
        return {n: bench_host.count_calls(f)[1] for n, f in fns.items()}


def test_host_op_counts_are_those_of_a_plain_call_not_of_the_cache_bypass():
    """Bug: bench_host.py counted aten operators under a TorchDispatchMode, and the library bypasses its tensor
    caches under any dispatch mode (ops.engine._tensors_traced, since c064178), so the "aten ops" column counted
    the rebuilding of the cached (H, 1) coefficient columns at every call (lift_fresh, _to_copy, unsqueeze and two
    selects per mixed layer): the half-Laplacian model read 241 / 618 operators (forward / forward + backward)
    where a call runs 211 / 588, 2 and 6 per layer above all-attention (docs/performance.md: "two stock
    operations each way")."""
    L = bench_host.SIZE[0]
    fwd = _counts(backward=False)
    assert fwd["DiffusionGPT half Laplacian"] - fwd["DiffusionGPT attention"] == 2 * L
    fb = _counts(backward=True)
    assert fb["DiffusionGPT half Laplacian"] - fb["DiffusionGPT attention"] == 6 * L
    # the switch is undone after counting: a dispatch mode still bypasses the caches outside count_calls
    assert engine.is_in_torch_dispatch_mode is not None
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
            return func(*args, **(kwargs or {}))

    with _Probe():
        assert engine._tensors_traced()
    assert not engine._tensors_traced()
