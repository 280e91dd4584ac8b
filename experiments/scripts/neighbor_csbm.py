"""Mini-batch (NeighborLoader) vs full-batch node classification on a large CSBM graph, on CPU.

Each run trains a 2-layer DiffusionGraphTransformer (attention + Laplacian heads, one
propagation step per layer, so a 2-hop neighbourhood decides a seed's output) for a fixed
number of updates and reports the seconds per update, the test accuracy and the peak
resident memory *while training* (sampled every 5 ms, minus the memory held after the graph
was generated), each run in its own process.

    OMP_NUM_THREADS=1 python experiments/scripts/neighbor_csbm.py --nodes 1000000 --modes minibatch
    OMP_NUM_THREADS=1 python experiments/scripts/neighbor_csbm.py --nodes 100000 --modes minibatch fullbatch

Prints one JSON line per run (and a markdown table at the end).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import threading
import time
from typing import Any

import torch
import torch.nn.functional as F


def rss() -> int:
    """Resident set size of this process in bytes (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Peak resident set size of this process, sampled in a background thread."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self.peak = rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def run(args: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(1)
    from torch_geometric.data import Data

    from diffusionformer.data.csbm import csbm_graph
    from diffusionformer.data.neighbors import neighbor_loader
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    N, mode = args["nodes"], args["mode"]
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    x, edge_index, y = csbm_graph(N, 2, args["degree"], args["homophily"], args["features"], args["mu"], g)
    gen_s = time.perf_counter() - t0
    perm = torch.randperm(N, generator=g)
    train_idx, test_idx = perm[: N // 2], perm[N // 2 : N // 2 + args["test_nodes"]]
    data = Data(x=x, edge_index=edge_index, y=y, num_nodes=N)
    torch.manual_seed(0)
    cfg = GraphTransformerConfig(in_channels=args["features"], num_classes=2, dim=args["dim"], depth=2,
                                 num_heads=4, heads="attention:2,laplacian:2")
    model = DiffusionGraphTransformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rss_before = rss()
    steps = args["steps"]
    with PeakRSS() as peak:
        t0 = time.perf_counter()
        if mode == "fullbatch":
            for _ in range(steps):
                opt.zero_grad()
                loss = F.cross_entropy(model(x, edge_index)[train_idx], y[train_idx])
                loss.backward()
                opt.step()
        else:
            loader = neighbor_loader(data, args["fanout"], batch_size=args["batch_size"], input_nodes=train_idx,
                                     shuffle=True, generator=torch.Generator().manual_seed(1))
            done = 0
            while done < steps:
                for batch in loader:
                    opt.zero_grad()
                    out = model(batch.x, batch.edge_index)[: batch.batch_size]
                    loss = F.cross_entropy(out, batch.y[: batch.batch_size])
                    loss.backward()
                    opt.step()
                    done += 1
                    if done == steps:
                        break
        train_s = time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            if mode == "fullbatch":
                pred = model(x, edge_index)[test_idx].argmax(-1)
                truth = y[test_idx]
            else:
                preds, truths = [], []
                for batch in neighbor_loader(data, args["fanout"], batch_size=args["batch_size"],
                                             input_nodes=test_idx, generator=torch.Generator().manual_seed(2)):
                    preds.append(model(batch.x, batch.edge_index)[: batch.batch_size].argmax(-1))
                    truths.append(batch.y[: batch.batch_size])
                pred, truth = torch.cat(preds), torch.cat(truths)
    return {
        "mode": mode, "nodes": N, "edges": int(edge_index.shape[1]), "steps": steps,
        "batch_size": args["batch_size"] if mode == "minibatch" else N // 2,
        "fanout": args["fanout"] if mode == "minibatch" else None,
        "generate_s": round(gen_s, 1), "s_per_step": round(train_s / steps, 3),
        "test_acc": round(float((pred == truth).float().mean()), 4),
        "graph_rss_gb": round(rss_before / 2**30, 2), "train_peak_extra_gb": round((peak.peak - rss_before) / 2**30, 2),
    }


def _child(args: dict[str, Any], queue: Any) -> None:
    queue.put(run(args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--modes", nargs="+", default=["minibatch"], choices=["minibatch", "fullbatch"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fanout", type=int, nargs="+", default=[10, 10])
    parser.add_argument("--degree", type=float, default=10.0)
    parser.add_argument("--homophily", type=float, default=0.8)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--mu", type=float, default=0.5)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--test-nodes", type=int, default=4096)
    a = parser.parse_args()
    rows = []
    ctx = mp.get_context("spawn")
    for mode in a.modes:
        args = {"nodes": a.nodes, "mode": mode, "steps": a.steps, "batch_size": a.batch_size, "fanout": a.fanout,
                "degree": a.degree, "homophily": a.homophily, "features": a.features, "mu": a.mu, "dim": a.dim,
                "test_nodes": a.test_nodes}
        queue = ctx.Queue()
        proc = ctx.Process(target=_child, args=(args, queue))
        proc.start()
        result = queue.get()
        proc.join()
        print(json.dumps(result), flush=True)
        rows.append(result)
    print("\n| mode | nodes | edges | s / update | test acc | graph in memory (GB) | training peak above it (GB) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['nodes']:,} | {r['edges']:,} | {r['s_per_step']} | {r['test_acc']} | "
              f"{r['graph_rss_gb']} | {r['train_peak_extra_gb']} |")


if __name__ == "__main__":
    main()
