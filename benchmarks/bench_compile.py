"""``torch.compile`` against eager mode: one ``DiffusionGPT`` forward + backward (issue 15, item 4).

Config of nanoGPT's Shakespeare-char CPU run (4 layers, 4 heads, width 128, block 64, batch 12,
vocabulary 65, no dropout), with four head layouts: all attention, the seed paper's two trailing
Laplacian heads per layer, a learned heat head (``K = 4``) beside two attention heads and a
Laplacian head, and two PPR heads (``K = 4``). Each model runs eagerly and compiled with
``torch.compile(model, fullgraph=True)`` (default back-end: inductor; ``fullgraph`` makes any graph
break an error, so the compiled step is one graph forward and one backward). A step is the forward
pass with the cross-entropy loss and the backward pass; the gradients are cleared between steps.

The compiled and eager steps of one layout alternate in interleaved rounds (``_common.measure``);
the ratio compiled / eager is the median of the per-round ratios with its inter-quartile range
(below 1: compiled is faster; the last column judges issue 15's "compiled beats eager"). Compilation
happens in the warm-up and is reported separately; a layout that does not compile is a row saying
so (and fails the target), and the other layouts still run.

On CUDA the model is issue 15's small GPT instead (nanoGPT's Shakespeare-char GPU config: 6 layers,
6 heads, width 384, block 256, batch 64, ``bias=False``) under bf16 autocast, with 3 of the 6 heads
Laplacian, 2 heat heads (``K = 4``) and 2 PPR heads (``K = 4``) per layer as the other layouts.

Run: ``python benchmarks/bench_compile.py [--quick] [--device cpu|cuda] [--threads 1 --clock cpu]``
(``benchmarks/gpu_suite.sh`` runs it on CUDA).
"""

from __future__ import annotations

import contextlib
import time

import torch

import _common as C
from diffusionformer.models import DiffusionGPT, GPTConfig

LAYOUTS: dict[str, dict] = {
    "attention": {},
    "laplacian_heads=2": {"laplacian_heads": 2},
    "attention:2,laplacian:1,learned heat(K=4):1": {"heads": "attention:2,laplacian:1,heat(t=1.0, steps=4, learnable=True):1"},
    "attention:2,ppr(K=4):2": {"heads": "attention:2,ppr(alpha=0.2, steps=4):2"},
}


CUDA_LAYOUTS: dict[str, dict] = {
    "attention": {},
    "laplacian_heads=3": {"laplacian_heads": 3},
    "attention:4,heat(K=4):2": {"heads": "attention:4,heat(t=1.0, steps=4):2"},
    "attention:4,ppr(K=4):2": {"heads": "attention:4,ppr(alpha=0.2, steps=4):2"},
}


def step(model: torch.nn.Module, idx: torch.Tensor, targets: torch.Tensor, bf16: bool = False):
    def call() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            _, loss = model(idx, targets)
        loss.backward()
        for p in model.parameters():
            p.grad = None
    return call


def main(argv: list[str] | None = None) -> C.Report:
    args = C.parse_args(__doc__.splitlines()[0], argv)
    rep = C.Report("bench_compile", "torch.compile(fullgraph=True) vs eager: DiffusionGPT forward + backward", args)
    dev = args.device
    cuda = dev.startswith("cuda") and not args.quick
    if cuda:  # issue 15's small GPT, bf16 autocast
        batch, block, n_layer, n_head, n_embd, extra_cfg = 64, 256, 6, 6, 384, {"bias": False}
    else:  # nanoGPT's Shakespeare-char CPU config (--quick: a smaller batch and block)
        batch, block = (4, 32) if args.quick else (12, 64)
        n_layer, n_head, n_embd, extra_cfg = 4, 4, 128, {}
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 65, (batch, block), generator=g).to(dev)
    targets = torch.randint(0, 65, (batch, block), generator=g).to(dev)
    rounds = args.rounds or (3 if args.quick else 11)
    layouts = dict(list(LAYOUTS.items())[:2]) if args.quick else CUDA_LAYOUTS if cuda else LAYOUTS
    rows = []
    for name, extra in layouts.items():
        torch.manual_seed(0)
        model = DiffusionGPT(GPTConfig(vocab_size=65, block_size=block, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                                       **extra_cfg, **extra))
        model.to(dev).train()
        try:
            compiled = torch.compile(model, fullgraph=True)
            t0 = time.perf_counter()
            step(compiled, idx, targets, cuda)()  # compiles the forward and the backward graph
            C.sync(dev)
            compile_s = time.perf_counter() - t0
            t = C.measure({"eager": step(model, idx, targets, cuda), "compiled": step(compiled, idx, targets, cuda)},
                          device=dev, rounds=rounds, block_s=0.0 if args.quick else 0.3, warmup=2)
        except Exception as e:  # noqa: BLE001 - a layout that does not compile is a result (issue 15: every operator)
            rows.append([name, "", "", f"does not compile: {type(e).__name__}: {str(e)[:120]}", "", C.check(False)])
            rep.rows.append({"layout": name, "error": f"{type(e).__name__}: {e}"})
            rep.write()
            continue
        r = C.ratio(t, "compiled", "eager")
        rows.append([name, C.ms(t["eager"].median), C.ms(t["compiled"].median), C.rfmt(r), f"{compile_s:.0f}",
                     C.check(r[0] < 1.0)])
        rep.rows.append({"layout": name, "eager_s": t["eager"].median, "compiled_s": t["compiled"].median,
                         "compiled_vs_eager": r, "compile_s": compile_s, "compiled_faster": r[0] < 1.0})
        rep.write()  # each layout's row as it finishes (the table comes at the end): a call cut short keeps them
    rep.table(f"DiffusionGPT forward + backward, batch {batch} x block {block}, {n_layer} layers, {n_head} heads, width "
              f"{n_embd}{', bf16 autocast' if cuda else ''}; median of "
              f"{rounds} interleaved rounds; ratio = compiled / eager [IQR] (below 1: compiled is faster); issue 15's "
              "target: compiled beats eager",
              ["heads", "eager ms", "compiled ms", "compiled / eager", "compile s (wall)", "compiled faster"], rows)
    rep.write()
    return rep


if __name__ == "__main__":
    main()
