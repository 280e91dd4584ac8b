"""Issue 15: sweep the Triton kernels' launch geometry (``diffusionformer.ops.triton._launch.BLOCKS``).

The kernels launch with fixed block sizes (forward 64 x 64, backward 32 x 64, 4 warps below head
size 128, 2 stages), chosen without a GPU. This script times the two workloads of one layer at
the issue's sizes, bf16, causal:

* ``affine``: one ``polynomial_attention`` call with ``K = 1`` over all ``H`` heads (what the
  Triton back-end launches for attention, Laplacian and learned affine heads);
* ``K-step``: one call with ``K = 8`` over 2 heads (``heat(t=1.0, steps=8)`` heads);

forward alone (the forward block sizes, warps and stages) and forward+backward (the backward
block sizes, warps and stages: ``bwd_m``, ``bwd_n``, ``bwd_num_warps``, ``bwd_num_stages``, with the
forward geometry at its default). Every configuration is
timed in the same interleaved rounds as the default geometry (``_common.measure``), so the table
gives ratios to the default with their IQR, and every configuration's output (and, for
forward+backward, ``dq``, ``dk`` and ``dv``) is compared with the default's: a geometry the kernels get wrong shows
as a difference, not only as a time. A configuration that does not compile (shared memory, for
instance) is listed with its error. The fastest correct configuration per workload and mode ends
the report, ready to be written into ``BLOCKS``.

Compiling is most of the sweep's time on a fresh machine (every configuration compiles each of the
kernels it launches, two to three seconds apiece, one after the other in one process): with
``--warm-workers P`` (default 8 on CUDA) the script first runs every configuration once in ``P``
processes side by side (``--compile-only``), which fills triton's on-disk kernel cache, so the
timed sweep loads the kernels instead of compiling them.

``--smoke``: tiny sizes and two configurations per mode on CPU under ``TRITON_INTERPRET=1`` (tests
the script; the times mean nothing, and the interpreter uses ``INTERPRETER_BLOCKS``, so the
sweep there changes nothing but the bookkeeping).

Run: ``python benchmarks/bench_triton_blocks.py --device cuda --out benchmarks/results-cuda``.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

import torch

import _common as C
from diffusionformer.ops.triton import _launch, polynomial_attention

SIZES = [(8, 1024, 768, 12), (64, 256, 384, 6), (2, 4096, 768, 12)]
SMOKE_SIZES = [(1, 40, 64, 4)]
# (fwd_m, fwd_n, num_warps, num_stages) and (bwd_m, bwd_n, num_warps, num_stages); the first is the default
FWD_GRID = [(64, 64, 4, 2), (128, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 2), (128, 32, 4, 2), (128, 128, 8, 2),
            (64, 64, 4, 3), (128, 64, 8, 3)]
BWD_GRID = [(32, 64, 4, 2), (64, 64, 4, 2), (64, 64, 8, 2), (32, 32, 4, 2), (32, 128, 8, 2), (16, 64, 4, 2),
            (64, 128, 8, 2), (32, 64, 4, 3)]


def config_name(mode: str, cfg: tuple[int, int, int, int]) -> str:
    m, n, w, s = cfg
    return f"{mode} {m}x{n} w{w} s{s}"


def blocks_for(mode: str, cfg: tuple[int, int, int, int], default: dict[str, Any]) -> dict[str, Any]:
    m, n, w, s = cfg
    b = dict(default)
    if mode == "forward":
        b.update(fwd_m=m, fwd_n=n, num_warps=w, num_stages=s)
    else:  # the backward's own warps and stages: the forward kernels keep the default geometry
        b.update(bwd_m=m, bwd_n=n, bwd_num_warps=w, bwd_num_stages=s)
    return b


def workloads(B: int, N: int, D: int, H: int, device: str) -> dict[str, tuple[Any, ...]]:
    C_ = D // H
    g = torch.Generator().manual_seed(0)

    def qkv(heads: int) -> list[torch.Tensor]:
        return [torch.randn(B, heads, N, C_, generator=g).to(device=device, dtype=torch.bfloat16).requires_grad_()
                for _ in range(3)]

    half = H // 2
    affine = torch.tensor([[0.0, 1.0]] * (H - half) + [[1.0, -1.0]] * half, device=device)
    heat = torch.tensor([[math.exp(-1.0) / math.factorial(j) for j in range(9)]] * 2, device=device)  # e^{-(I-P)}
    return {"affine": (*qkv(H), affine), "K-step (2 heads, K=8)": (*qkv(2), heat)}


def runner(q, k, v, c, backward: bool, blocks: dict[str, Any], g: torch.Tensor | None) -> Callable[[], Any]:
    def run() -> Any:
        _launch.BLOCKS.clear()
        _launch.BLOCKS.update(blocks)
        if not backward:
            with torch.no_grad():
                return polynomial_attention(q, k, v, c, is_causal=True)
        out = polynomial_attention(q, k, v, c, is_causal=True)
        # dk and dv too: the backward geometry (bwd_m x bwd_n) tiles _bwd_dkdv as well as _bwd_dq, so a geometry
        # the dk/dv kernel gets wrong must show in the check (the backward computes all three either way)
        grads = torch.autograd.grad(out, (q, k, v), g, allow_unused=True)
        return (out, *grads)
    return run


def jobs(sizes: list[tuple[int, int, int, int]], grids: dict[str, list[tuple[int, int, int, int]]]) -> list[list[tuple[Any, ...]]]:
    """Every launch the sweep makes, as (size, workload index, mode, configuration or None = the default), in groups
    that share their kernels (one workload, mode and configuration at every size: the sizes specialise alike)."""
    return [[(size, w, mode, cfg) for size in sizes]
            for w in range(2) for mode, grid in grids.items() for cfg in [None, *grid]]


def run_job(dev: str, default: dict[str, Any]) -> Callable[[list[tuple[Any, ...]]], None]:
    """One group of launches of the sweep, untimed (for ``--compile-only``: it compiles the configuration's kernels)."""
    built: dict[str, Any] = {}

    def run(group: list[tuple[Any, ...]]) -> None:
        for size, w, mode, cfg in group:
            if built.get("size") != size:
                built.update(size=size, work=list(workloads(*size, dev).values()))
            q, k, v, c = built["work"][w]
            blocks = default if cfg is None else blocks_for(mode, cfg, default)
            runner(q, k, v, c, mode == "forward+backward", blocks, torch.ones_like(q))()
    return run


def max_diff(a: Any, b: Any) -> float:
    """Largest ``max |a - b| / max |b|`` over the tensors of ``a`` and the reference ``b`` (``None`` pairs skipped):
    relative to the reference's scale, so that bf16 gradients of magnitude 10 at N = 1024 (rounded in another order by
    another geometry) do not pass a fixed absolute bound of 5e-2, while a geometry that gets a tile wrong is off by
    O(1)."""
    if isinstance(a, tuple):
        return max(max_diff(x, y) for x, y in zip(a, b) if x is not None and y is not None)
    scale = b.float().abs().max().item()
    return (a.float() - b.float()).abs().max().item() / (scale if scale > 0 else 1.0)


def main(argv: list[str] | None = None) -> C.Report:
    def extra(p):  # noqa: ANN001, ANN202
        p.add_argument("--smoke", action="store_true", help="tiny sizes, two configurations (CPU, TRITON_INTERPRET=1)")
        p.add_argument("--sizes", nargs="*", type=int, default=None, metavar="I",
                       help=f"indices into {SIZES} (default: the first two)")
        C.add_warm_arguments(p)

    args = C.parse_args(__doc__.splitlines()[0], argv, extra)
    C.check_indices("bench_triton_blocks", "--sizes", args.sizes, SIZES, "the first two")
    smoke = args.smoke or os.environ.get("DF_BENCH_SMOKE", "0") not in ("", "0")
    dev = args.device
    if dev != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise SystemExit("bench_triton_blocks: the kernels run on CUDA, or on CPU with TRITON_INTERPRET=1 (--smoke)")
    sizes = SMOKE_SIZES if smoke else [SIZES[i] for i in (args.sizes if args.sizes is not None else [0, 1])]
    grids = {"forward": FWD_GRID[:2] if smoke else FWD_GRID, "forward+backward": BWD_GRID[:2] if smoke else BWD_GRID}
    rounds = args.rounds or (2 if smoke else 7)
    default = dict(_launch.BLOCKS)
    argv_on = ["--device", dev, "--threads", "1"] + (["--smoke"] if smoke else [])
    argv_on += [] if args.sizes is None else ["--sizes", *map(str, args.sizes)]
    warm_note = C.warm_kernels(__file__, argv_on, args, jobs(sizes, grids), run_job(dev, default))
    rep = C.Report("bench_triton_blocks", "Issue 15: the Triton kernels' launch geometry", args)
    rep.note(f"default BLOCKS = {default}" + ("; smoke run: the numbers mean nothing" if smoke else ""))
    if warm_note:
        rep.note(warm_note)
    best: dict[tuple[str, str], list[tuple[float, str]]] = {}
    try:
        for (B, N, D, H) in sizes:
            for wname, (q, k, v, c) in workloads(B, N, D, H, dev).items():
                g = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(dev, torch.bfloat16)
                for mode, grid in grids.items():
                    backward = mode == "forward+backward"
                    fns: dict[str, Callable[[], Any]] = {}
                    rows: list[list[Any]] = []
                    ref = runner(q, k, v, c, backward, default, g)()
                    for cfg in grid:
                        name = config_name(mode, cfg)
                        fn = runner(q, k, v, c, backward, blocks_for(mode, cfg, default), g)
                        try:
                            diff = max_diff(fn(), ref)  # compiles, and checks against the default geometry
                        except Exception as e:  # noqa: BLE001 - a configuration that cannot run is a result
                            rows.append([name, "", "", f"does not run: {type(e).__name__}: {str(e)[:80]}"])
                            continue
                        fns[name] = fn
                        rows.append([name, None, None, f"{diff:.2e}"])
                    t = C.measure(fns, device=dev, rounds=rounds, block_s=0.0 if smoke else 0.02,
                                  warmup=1 if smoke else 2)
                    base = config_name(mode, grid[0])
                    for row in rows:
                        if row[1] is None:
                            r = C.ratio(t, row[0], base)
                            row[1], row[2] = C.ms(t[row[0]].median), C.rfmt(r)
                            rep.rows.append({"size": (B, N, D, H), "workload": wname, "mode": mode, "config": row[0],
                                             "seconds": t[row[0]].median, "vs_default": r, "max_diff": row[3]})
                            if float(row[3]) < 5e-2:
                                best.setdefault((wname, mode), []).append((r[0], row[0]))
                    rep.table(f"{wname}, (B, N, D, H) = {(B, N, D, H)}, causal, {mode}, bf16; median of {rounds} "
                              "interleaved rounds; ratio [IQR] to the default geometry (first row); max |difference| "
                              "/ max |value| from the default's output" + (", dq, dk and dv" if backward else ""),
                              ["configuration", "ms", "/ default", "max rel. diff"], rows)
                del q, k, v, c
                if dev == "cuda":
                    torch.cuda.empty_cache()
    finally:
        _launch.BLOCKS.clear()
        _launch.BLOCKS.update(default)
    # geometric mean of the ratios over sizes, per workload and mode
    summary = []
    for (wname, mode), items in sorted(best.items()):
        by_cfg: dict[str, list[float]] = {}
        for r, name in items:
            by_cfg.setdefault(name, []).append(r)
        full = {n: rs for n, rs in by_cfg.items() if len(rs) == len(sizes)}
        if not full:
            continue
        gm = {n: float(torch.tensor(rs).log().mean().exp()) for n, rs in full.items()}
        top = min(gm, key=gm.get)
        summary.append([wname, mode, top, f"{gm[top]:.3f}"])
    rep.table("Fastest correct configuration per workload and mode (geometric mean of the ratios over sizes)",
              ["workload", "mode", "configuration", "/ default"], summary)
    rep.write()
    return rep


if __name__ == "__main__":
    main()
