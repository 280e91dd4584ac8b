"""Where the remaining time goes: torch.profiler tables for the comparisons with the smallest margins.

* the mixed attention/Laplacian layer against the all-attention layer (``N = 64``, ``B = 32``,
  the size where the combination step weighs most), forward and forward+backward;
* a DiffusionGPT training step with ``laplacian_heads=2`` against the plain nanoGPT-style GPT.

Each table lists the operators by self CPU time over 10 calls (after warm-up); the rows
that only one side has are the price of the diffusion heads.

Run: ``python benchmarks/profile_gaps.py [--device cpu|cuda]``.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

import _common as C
from bench_gpt import PlainConfig, PlainGPT, train_step
from diffusionformer import DiffusionAttention
from diffusionformer.models import DiffusionGPT, GPTConfig


def table(fn: Callable[[], None], device: str, rows: int = 12) -> tuple[list[list[str]], float]:
    for _ in range(3):
        fn()
    C.sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(10):
            fn()
        C.sync(device)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    out = [[e.key[:60], f"{e.self_cpu_time_total / 1e3 / 10:.3f}", f"{100 * e.self_cpu_time_total / total:.1f}",
            str(e.count // 10)] for e in events[:rows]]
    return out, total / 1e3 / 10


def main(argv: list[str] | None = None) -> C.Report:
    args = C.parse_args(__doc__.splitlines()[0], argv)
    dev = args.device
    rep = C.Report("profile_gaps", "Profiles of the smallest margins", args)
    header = ["operator", "self ms / call", "%", "calls / call"]
    torch.manual_seed(0)
    N, B, D, H = 64, 32, 256, 8
    x = torch.randn(B, N, D, device=dev)
    att = DiffusionAttention(D, H, causal=True).to(dev)
    mix = DiffusionAttention(D, H, "attention:6,laplacian:2", causal=True).to(dev)
    mix.load_state_dict(att.state_dict(), strict=False)
    xg = x.clone().requires_grad_()
    g = torch.randn_like(x)
    for name, m in (("all-attention", att), ("attention:6,laplacian:2", mix)):
        def fwd(m: torch.nn.Module = m) -> None:
            with torch.no_grad():
                m(x)

        def fb(m: torch.nn.Module = m) -> None:
            torch.autograd.backward(m(xg), g)
        for mode, fn in (("forward (no grad)", fwd), ("forward+backward", fb)):
            rows, total = table(fn, dev)
            rep.table(f"{name}, causal, N={N}, B={B}, D={D}, H={H}, {mode}: {total:.2f} ms of self CPU time per call", header, rows)
    pc = PlainConfig()
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, pc.vocab_size, (12, pc.block_size), generator=gen).to(dev)
    tgt = torch.randint(0, pc.vocab_size, (12, pc.block_size), generator=gen).to(dev)
    for name, model in (("plain GPT", PlainGPT(pc)), ("DiffusionGPT laplacian_heads=2", DiffusionGPT(GPTConfig(laplacian_heads=2)))):
        model.to(dev)
        step = train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-4), idx, tgt)
        rows, total = table(step, dev, rows=16)
        rep.table(f"{name}: one training step, {total:.2f} ms of self CPU time per step", header, rows)
    rep.write()
    return rep


if __name__ == "__main__":
    main()
