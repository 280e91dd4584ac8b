"""Peak memory of a GPT training step: ``DiffusionGPT`` vs nanoGPT's GPT, with and without recomputed head outputs.

Issue 15 asks that ``DiffusionGPT`` train with at most nanoGPT's peak memory + 5%, with
attention heads, half the heads Laplacian, and 2 heat heads of ``K = 4`` per layer. Memory,
unlike time, carries from CPU to GPU nearly unchanged: it is the set of tensors autograd keeps,
the same on both devices apart from the attention kernel's own workspace. This script measures
one steady-state training step (after a warm-up step, so AdamW's state exists before the
measurement; bf16 autocast, forward with loss, backward, ``AdamW.step``, gradients set to
``None``) of nanoGPT's GPT (``benchmarks/nanogpt_model.py``) and ``DiffusionGPT`` of equal size
(``bias=False``, no dropout), each variant as it comes (its layers keep their combined head output
for the output projection's backward pass, as autograd does) and with ``recompute`` set on its
attention layers (:func:`diffusionformer.nn.set_recompute`: that output is formed again in the
backward pass; see ``docs/performance.md``, "Memory").

Peak: CUDA ``max_memory_allocated`` above what was allocated before the step; CPU the
PyTorch profiler's allocation counter (``benchmarks/_common.py``). Sizes: issue 15's small GPT
(6 layers, 6 heads, width 384, ``T = 256``, vocabulary 65) at batch 64 on CUDA and batch 4 on
CPU (``--batch`` overrides; activations scale with the batch, so the ratios hardly depend on it).
The heat heads run on the fused-kernel back-end (``backend="sdpa"``), the path a GPU takes at
this length; ``"auto"`` on CPU materialises ``P`` there, which is listed too.

Run: ``python benchmarks/bench_memory.py`` (CPU, about 1 minute) or ``--device cuda``.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

import _common as C
from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.nn import set_recompute
from nanogpt_model import GPT, NanoGPTConfig

SIZE = (6, 6, 384, 256, 65)  # (n_layer, n_head, n_embd, T, vocab): issue 15's small GPT


def models(device: str) -> dict[str, tuple[nn.Module, bool]]:
    """``name -> (model, uses the recomputation)``: nanoGPT and the DiffusionGPT variants."""
    L, H, D, T, V = SIZE
    torch.manual_seed(0)
    common = dict(vocab_size=V, block_size=T, n_layer=L, n_head=H, n_embd=D, bias=False, dropout=0.0)
    heat = f"attention:{H - 2},heat(t=1.0, steps=4):2"
    variants = {
        "attention": GPTConfig(**common),
        "half Laplacian": GPTConfig(**common, laplacian_heads=H // 2),
        "2 heat(K=4), fused kernel": GPTConfig(**common, heads=heat, backend="sdpa"),
        "2 heat(K=4), auto": GPTConfig(**common, heads=heat),
        "half learned heat(t=0.5), fused kernel": GPTConfig(**common, heads=f"attention:{H // 2},heat(t=0.5, learnable=True):{H // 2}",
                                                            backend="sdpa"),
    }
    out: dict[str, tuple[nn.Module, bool]] = {
        "nanoGPT": (GPT(NanoGPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H, n_embd=D, bias=False, dropout=0.0)), False)}
    for name, cfg in variants.items():
        out[f"DiffusionGPT {name}"] = (DiffusionGPT(dataclasses.replace(cfg)), name != "attention")
    return {k: (m.to(device), r) for k, (m, r) in out.items()}


def main(argv: list[str] | None = None) -> C.Report:
    def extra(p):  # noqa: ANN001, ANN202
        p.add_argument("--batch", type=int, default=None, help="batch size (default 64 on CUDA, 4 on CPU)")

    args = C.parse_args(__doc__.splitlines()[0], argv, extra)
    if args.batch is not None and args.batch < 1:
        raise SystemExit(f"bench_memory: --batch must be >= 1, got {args.batch}")
    rep = C.Report("bench_memory", "Peak memory of a GPT training step vs nanoGPT's, recomputed head outputs on and off", args)
    dev = args.device
    L, H, D, T, V = SIZE
    B = args.batch or (2 if args.quick else 64 if dev == "cuda" else 4)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, V, (B, T), generator=g).to(dev)
    targets = torch.randint(0, V, (B, T), generator=g).to(dev)
    peaks: dict[str, dict[bool, int]] = {}
    for name, (m, recomputes) in models(dev).items():
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, **({"fused": True} if dev == "cuda" else {}))
        step = C.train_step(m, opt, idx, targets, autocast=torch.device(dev).type)
        step()  # warm-up: AdamW's state and the layers' caches exist before the measurement
        peaks[name] = {}
        for on in ((False, True) if recomputes else (False,)):
            set_recompute(m, on)
            step()  # warm-up of this path
            peaks[name][on] = C.peak_memory(step, dev)
        set_recompute(m, False)
        del m, opt, step
        if dev == "cuda":
            torch.cuda.empty_cache()
    base = peaks["nanoGPT"][False]
    rows = []
    for name, p in peaks.items():
        off, on = p[False], p.get(True)
        best = off if on is None else min(on, off)
        rows.append([name, C.mib(off), f"{off / base:.3f}", "" if on is None else C.mib(on),
                     "" if on is None else f"{on / base:.3f}", "" if name == "nanoGPT" else C.check(best <= 1.05 * base)])
        rep.rows.append({"model": name, "peak_bytes": off, "peak_bytes_recompute": on, "vs_nanogpt": off / base,
                         "vs_nanogpt_recompute": None if on is None else on / base})
    rep.table(f"Training step, {L} layers, {H} heads, width {D}, T = {T}, batch {B}, vocabulary {V}; bf16 autocast, "
              f"AdamW{' fused' if dev == 'cuda' else ''}; peak memory above what the model and optimiser hold",
              ["model", "peak MiB", "/ nanoGPT", "peak MiB, recompute", "/ nanoGPT, recompute",
               "<= 1.05 nanoGPT (either)"], rows)
    rep.note("recompute: diffusionformer.nn.set_recompute(model) (each attention layer forms its combined head output "
             "again in the backward pass instead of keeping it; off by default). The all-attention model has nothing "
             "to recompute.")
    rep.write()
    return rep


if __name__ == "__main__":
    main()
