"""Where the remaining time goes: torch.profiler tables for the comparisons with the smallest margins.

* the mixed attention/Laplacian layer against the all-attention layer (``N = 64``, ``B = 32``,
  the size where the combination step weighs most), forward and forward+backward;
* a DiffusionGPT training step with ``laplacian_heads=2`` against the plain nanoGPT-style GPT.

For each pair: the operators by self CPU time (10 calls after warm-up, per call) on both
sides, and the operators the diffusion side calls more often, which are the price of the
Laplacian heads (the fused kernel and the projections are shared).

Run: ``python benchmarks/profile_gaps.py [--device cpu|cuda]``.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

import _common as C
from bench_gpt import PlainConfig, PlainGPT
from diffusionformer import DiffusionAttention
from diffusionformer.models import DiffusionGPT, GPTConfig


def profile_ops(fn: Callable[[], None], device: str) -> dict[str, tuple[float, int]]:
    """``{op: (self CPU ms per call, calls per call)}`` over 10 calls after warm-up."""
    for _ in range(3):
        fn()
    C.sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(10):
            fn()
        C.sync(device)
    return {e.key: (e.self_cpu_time_total / 1e3 / 10, e.count // 10) for e in prof.key_averages()}


def top_rows(ops: dict[str, tuple[float, int]], rows: int = 10) -> list[list[str]]:
    total = sum(t for t, _ in ops.values())
    items = sorted(ops.items(), key=lambda kv: kv[1][0], reverse=True)[:rows]
    return [[k[:60], f"{t:.3f}", f"{100 * t / total:.1f}", str(n)] for k, (t, n) in items]


def diff_rows(base: dict[str, tuple[float, int]], other: dict[str, tuple[float, int]], rows: int = 10) -> list[list[str]]:
    """Operators that ``other`` calls more often than ``base`` (the price of the extra work)."""
    keys = [k for k in other if other[k][1] > base.get(k, (0.0, 0))[1]]
    keys.sort(key=lambda k: other[k][0] - base.get(k, (0.0, 0))[0], reverse=True)
    return [[k[:60], str(base.get(k, (0.0, 0))[1]), str(other[k][1]), f"{base.get(k, (0.0, 0))[0]:.3f}", f"{other[k][0]:.3f}"]
            for k in keys[:rows]]


def compare(rep: C.Report, title: str, fns: dict[str, Callable[[], None]], device: str) -> None:
    (bname, bfn), (oname, ofn) = fns.items()
    base, other = profile_ops(bfn, device), profile_ops(ofn, device)
    tb, to = sum(t for t, _ in base.values()), sum(t for t, _ in other.values())
    header = ["operator", "self ms / call", "%", "calls / call"]
    rep.table(f"{title}: {bname}, {tb:.2f} ms of self CPU time per call", header, top_rows(base))
    rep.table(f"{title}: {oname}, {to:.2f} ms of self CPU time per call", header, top_rows(other))
    rep.table(f"{title}: operators {oname} calls more often than {bname}",
              ["operator", f"calls ({bname})", f"calls ({oname})", f"self ms ({bname})", f"self ms ({oname})"],
              diff_rows(base, other))


def main(argv: list[str] | None = None) -> C.Report:
    args = C.parse_args(__doc__.splitlines()[0], argv)
    dev = args.device
    rep = C.Report("profile_gaps", "Profiles of the smallest margins", args)
    torch.manual_seed(0)
    N, B, D, H = 64, 32, 256, 8
    x = torch.randn(B, N, D, device=dev)
    att = DiffusionAttention(D, H, causal=True).to(dev)
    mix = DiffusionAttention(D, H, "attention:6,laplacian:2", causal=True).to(dev)
    mix.load_state_dict(att.state_dict(), strict=False)
    xg = x.clone().requires_grad_()
    g = torch.randn_like(x)

    def fwd(m: torch.nn.Module) -> Callable[[], None]:
        def call() -> None:
            with torch.no_grad():
                m(x)
        return call

    def fb(m: torch.nn.Module) -> Callable[[], None]:
        def call() -> None:
            torch.autograd.backward(m(xg), g)
        return call
    where = f"causal, N={N}, B={B}, D={D}, H={H}"
    compare(rep, f"Layer forward (no grad), {where}", {"all-attention": fwd(att), "attention:6,laplacian:2": fwd(mix)}, dev)
    compare(rep, f"Layer forward+backward, {where}", {"all-attention": fb(att), "attention:6,laplacian:2": fb(mix)}, dev)
    pc = PlainConfig()
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, pc.vocab_size, (12, pc.block_size), generator=gen).to(dev)
    tgt = torch.randint(0, pc.vocab_size, (12, pc.block_size), generator=gen).to(dev)
    steps = {}
    for name, model in (("plain GPT", PlainGPT(pc)), ("DiffusionGPT laplacian_heads=2", DiffusionGPT(GPTConfig(laplacian_heads=2)))):
        model.to(dev)
        steps[name] = C.train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-4), idx, tgt)
    compare(rep, "GPT training step (batch 12 x 64 tokens)", steps, dev)
    rep.write()
    return rep


if __name__ == "__main__":
    main()
