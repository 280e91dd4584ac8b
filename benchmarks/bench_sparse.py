"""Sparse attention: ``DiffusionAttention(edge_index=...)`` vs PyG ``TransformerConv`` (same math).

``TransformerConv(D, D // H, heads=H, root_weight=False)`` and
``DiffusionAttention.from_transformer_conv(conv)`` (all heads attention; its ``out_proj`` is
the identity, one extra ``N x D x D`` product that the convolution does not do) on a random
graph and a 2-D grid (king + knight moves), 10k and 100k nodes, average degree 16,
``D = 64``, ``H = 4``. Forward in eval mode under ``torch.no_grad()``; forward+backward in
train mode with gradients for the input and the parameters.

Peak memory: see ``_common.peak_memory`` (CUDA: ``max_memory_allocated``; CPU: the profiler's
allocation counter, i.e. memory allocated through PyTorch). On Linux CPU runs the numbers are
cross-checked in a subprocess by the process' resident-set high-water mark (``VmHWM`` reset
through ``/proc/self/clear_refs`` before each call, glibc's mmap threshold fixed at 128 KiB and
MKL's buffer cache disabled so that freed memory is returned), which also sees memory that
libraries such as MKL allocate outside PyTorch.

Targets (issue 7, at 1.6M edges): forward >= 2x faster than ``TransformerConv`` with peak
memory <= 0.75x; forward+backward >= 1.0x; memory linear in edges; ``K`` steps reuse one edge
softmax.

Run: ``python benchmarks/bench_sparse.py [--quick] [--device cpu|cuda]``.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from typing import Any, Callable

import torch
from torch import nn

import _common as C
import graphs
from diffusionformer import DiffusionAttention
from diffusionformer.ops.scatter import HAS_TORCH_SCATTER

D, H, DEGREE = 64, 4, 16


def build_graph(kind: str, n: int, device: str) -> tuple[torch.Tensor, int]:
    if kind == "random":
        return graphs.random_graph(n, DEGREE, device=device), n
    return graphs.grid_graph(n, device)


def make_models(device: str, heads: str | None = None) -> tuple[nn.Module, nn.Module]:
    from torch_geometric.nn import TransformerConv

    torch.manual_seed(0)
    conv = TransformerConv(D, D // H, heads=H, root_weight=False).to(device)
    ours = DiffusionAttention.from_transformer_conv(conv, heads=heads)
    return conv, ours


def runners(conv: nn.Module, ours: nn.Module, x: torch.Tensor, ei: torch.Tensor, backward: bool) -> dict[str, Callable[[], None]]:
    fns = {"TransformerConv": lambda inp: conv(inp, ei), "ours": lambda inp: ours(inp, edge_index=ei)}
    for m in (conv, ours):
        m.train(backward)
    grad = torch.randn(x.shape[0], D, device=x.device) if backward else None
    return C.step_callables(fns, x, backward, grad)


def set_pyg_scatter(enabled: bool) -> None:
    import torch_geometric.typing

    torch_geometric.typing.WITH_TORCH_SCATTER = enabled and HAS_TORCH_SCATTER


# ---------------------------------------------------------------------------- RSS cross-check
def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def rss_worker(spec: dict[str, Any]) -> dict[str, float]:
    """In a fresh process: resident-set high-water mark above the pre-call RSS, per case (MiB)."""
    torch.set_num_threads(spec["threads"])
    ei, N = build_graph(spec["graph"], spec["n"], "cpu")
    conv, ours = make_models("cpu")
    x = torch.randn(N, D)
    out: dict[str, float] = {}
    for backward in (False, True):
        fns = runners(conv, ours, x, ei, backward)
        for name, fn in fns.items():
            fn()  # warm-up (lazy initialisation, MKL handles)
            for p in list(conv.parameters()) + list(ours.parameters()):
                p.grad = None
            gc.collect()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            before = _rss_kib("VmRSS")
            fn()
            out[f"{name}/{'fwd+bwd' if backward else 'fwd'}"] = (_rss_kib("VmHWM") - before) / 1024
    return out


def rss_crosscheck(graph: str, n: int, threads: int) -> dict[str, float] | None:
    if not sys.platform.startswith("linux") or not os.access("/proc/self/clear_refs", os.W_OK):
        return None
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072", MKL_DISABLE_FAST_MM="1")
    spec = json.dumps({"graph": graph, "n": n, "threads": threads})
    proc = subprocess.run([sys.executable, __file__, "--rss-worker", spec], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> C.Report:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--rss-worker":
        print(json.dumps(rss_worker(json.loads(argv[1]))))
        sys.exit(0)
    args = C.parse_args(__doc__.splitlines()[0], argv)
    dev = args.device
    rep = C.Report("bench_sparse", "Sparse attention vs PyG TransformerConv", args)
    sizes = [10_000] if args.quick else [10_000, 100_000]
    scatter_modes = [False, True] if HAS_TORCH_SCATTER else [False]
    rep.note(f"Scatter back-end: torch-scatter {'installed' if HAS_TORCH_SCATTER else 'not installed'}; "
             "PyG's TransformerConv uses " + ("torch-scatter in the '+ts' columns and native PyTorch otherwise"
                                              if HAS_TORCH_SCATTER else "native PyTorch scatter (torch.Tensor.scatter_reduce_)")
             + f"; ours uses the CSR kernels ({'MKL sparse' if dev == 'cpu' else 'cuSPARSE'}) on both, no scatter.")
    time_rows, mem_rows, rss_rows, k_rows = [], [], [], []
    for graph in ("random", "grid"):
        for n in sizes:
            ei, N = build_graph(graph, n, dev)
            E = ei.shape[1]
            conv, ours = make_models(dev)
            x = torch.randn(N, D, device=dev)
            rounds = args.rounds or (3 if N >= 50_000 or args.quick else 5)
            for ts in scatter_modes:
                set_pyg_scatter(ts)
                tag = "+ts" if ts else ""
                res: dict[str, Any] = {}
                for backward in (False, True):
                    mode = "fwd+bwd" if backward else "fwd"
                    fns = runners(conv, ours, x, ei, backward)
                    t = C.measure(fns, device=dev, rounds=rounds, block_s=0.0, warmup=1)
                    speed = C.ratio(t, "TransformerConv", "ours")
                    mem = {}
                    for name, fn in fns.items():
                        for p in list(conv.parameters()) + list(ours.parameters()):
                            p.grad = None
                        mem[name] = C.peak_memory(fn, dev)
                    res[mode] = (t, speed, mem)
                    target = 2.0 if not backward else 1.0
                    time_rows.append([graph, N, E, mode, "conv" + tag, C.ms(t["TransformerConv"].median), C.ms(t["ours"].median),
                                      C.rfmt(speed), f">= {target:g}", C.check(speed[0] >= target)])
                    mem_ratio = mem["ours"] / max(1, mem["TransformerConv"])
                    mem_rows.append([graph, N, E, mode, "conv" + tag, C.mib(mem["TransformerConv"]), C.mib(mem["ours"]),
                                     f"{mem_ratio:.3f}", C.check(mem_ratio <= 0.75),
                                     f"{mem['ours'] / E:.1f}"])
                    rep.rows.append({"graph": graph, "N": N, "E": E, "mode": mode, "torch_scatter": ts,
                                     "conv_s": t["TransformerConv"].median, "ours_s": t["ours"].median, "speedup": speed,
                                     "conv_peak_bytes": mem["TransformerConv"], "ours_peak_bytes": mem["ours"]})
            set_pyg_scatter(True)
            if dev == "cpu" and not args.quick and graph == "random" and n == sizes[-1]:
                rss = rss_crosscheck(graph, n, args.threads)
                if rss is not None:
                    for mode in ("fwd", "fwd+bwd"):
                        a, b = rss[f"TransformerConv/{mode}"], rss[f"ours/{mode}"]
                        rss_rows.append([graph, N, E, mode, f"{a:.1f}", f"{b:.1f}", f"{b / max(a, 1e-9):.3f}"])
            # K steps on the same graph: one edge softmax, K sparse products
            if n == sizes[-1] and graph == "random":
                base = None
                for K in (1, 2, 4, 8):
                    heads = None if K == 1 else f"heat(t=1.0, steps={K})"
                    _, layer = make_models(dev, heads)
                    layer.eval()

                    def call(layer: nn.Module = layer) -> None:
                        with torch.no_grad():
                            layer(x, edge_index=ei)
                    t = C.measure({"k": call}, device=dev, rounds=2 if N >= 50_000 else 3, block_s=0.0, warmup=1)["k"].median
                    m = C.peak_memory(call, dev)
                    base = base or t
                    k_rows.append([K, C.ms(t), f"{t / base:.2f}", C.mib(m)])
    rep.table(f"Time, D={D}, H={H}, average degree {DEGREE} (ms, median of interleaved rounds; speed-up = "
              "TransformerConv time / ours, median of paired rounds [IQR])",
              ["graph", "N", "E", "mode", "baseline", "TransformerConv ms", "ours ms", "speed-up", "target", "met"], time_rows)
    rep.table("Peak memory allocated by PyTorch during the call (MiB; ratio = ours / TransformerConv; bytes/edge = ours)",
              ["graph", "N", "E", "mode", "baseline", "TransformerConv MiB", "ours MiB", "ratio", "<= 0.75", "ours bytes/edge"], mem_rows)
    if rss_rows:
        rep.table("Cross-check: process resident-set high-water mark above the pre-call RSS (MiB; includes MKL's own buffers)",
                  ["graph", "N", "E", "mode", "TransformerConv MiB", "ours MiB", "ratio"], rss_rows)
    if k_rows:
        rep.table(f"K diffusion steps (heat, random graph, N={sizes[-1]}, forward): one edge softmax, K sparse products",
                  ["K", "ms", "x K=1 (attention)", "peak MiB"], k_rows)
    rep.write()
    return rep


if __name__ == "__main__":
    main()
