"""Dense vs sparse back-end on local graphs: where does message passing beat masked SDPA?

The same ``DiffusionAttention(64, 4)`` layer (all heads attention) runs on one sequence of
``N`` tokens either dense (``x`` of shape ``(1, N, D)`` with a bool ``attn_mask`` of the graph,
self-loops included, through the fused SDPA kernel: ``O(N^2)`` work whatever the mask) or
sparse (``x`` of shape ``(N, D)`` with the graph's ``edge_index``: ``O(E)`` work). Graphs: a 1-D
sliding window (``|i - j| <= 8``, 17 neighbours) and a 2-D grid (king + knight moves plus a
self-loop, 17 neighbours). Forward under ``torch.no_grad()`` and forward+backward.

Run: ``python benchmarks/bench_crossover.py [--quick] [--device cpu|cuda]``.
"""

from __future__ import annotations

import math

import torch

import _common as C
import graphs
from diffusionformer import DiffusionAttention

D, H, RADIUS = 64, 4, 8


def graph(kind: str, N: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(edge_index, dense bool mask)`` of the same graph (self-loops included)."""
    if kind == "window":
        return graphs.window_graph(N, RADIUS, device), graphs.window_mask(N, RADIUS, device)
    side = int(round(math.sqrt(N)))
    ei, n = graphs.grid_graph(N, device)
    loops = torch.arange(n, device=device)
    return torch.cat([ei, torch.stack([loops, loops])], dim=1), graphs.grid_mask(side, device)


def main(argv: list[str] | None = None) -> C.Report:
    args = C.parse_args(__doc__.splitlines()[0], argv)
    dev = args.device
    rep = C.Report("bench_crossover", "Dense (masked SDPA) vs sparse on local graphs", args)
    sizes = [256, 1024] if args.quick else [256, 512, 1024, 4096, 16384]
    max_dense = 4096 if dev == "cpu" else 16384
    rounds = args.rounds or (3 if args.quick else 5)
    torch.manual_seed(0)
    layer = DiffusionAttention(D, H).to(dev)
    rows = []
    for kind in ("window", "grid"):
        for N in sizes:
            ei, mask = graph(kind, N, dev)
            N = mask.shape[0]
            x = torch.randn(N, D, device=dev)
            for backward in (False, True):
                layer.train(backward)
                xs = x.detach().clone().requires_grad_(backward)
                xd = x.detach().clone()[None].requires_grad_(backward)
                gs, gd = torch.randn_like(xs), torch.randn_like(xd)

                def sparse() -> None:
                    with torch.set_grad_enabled(backward):
                        y = layer(xs, edge_index=ei)
                        if backward:
                            torch.autograd.backward(y, gs)

                def dense() -> None:
                    with torch.set_grad_enabled(backward):
                        y = layer(xd, attn_mask=mask)
                        if backward:
                            torch.autograd.backward(y, gd)
                fns = {"sparse": sparse}
                if N <= max_dense:
                    fns["dense"] = dense
                t = C.measure(fns, device=dev, rounds=rounds, block_s=0.02)
                r = C.ratio(t, "sparse", "dense") if "dense" in t else None
                rows.append([kind, N, ei.shape[1], "fwd+bwd" if backward else "fwd",
                             C.ms(t["dense"].median) if "dense" in t else "(skipped)", C.ms(t["sparse"].median),
                             C.rfmt(r) if r else "", ("sparse" if r[0] < 1 else "dense") if r else "sparse"])
                rep.rows.append({"graph": kind, "N": N, "E": ei.shape[1], "mode": "fwd+bwd" if backward else "fwd",
                                 **{f"{k}_s": v.median for k, v in t.items()}, "sparse/dense": r})
    rep.table(f"D={D}, H={H}, one sequence; ms (median of {rounds} interleaved rounds); ratio = sparse / dense "
              f"(median of paired rounds [IQR]); dense is skipped above N={max_dense}",
              ["graph", "N", "E", "mode", "dense ms", "sparse ms", "sparse / dense", "faster"], rows)
    rep.write()
    return rep


if __name__ == "__main__":
    main()
