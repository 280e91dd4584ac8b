"""Edge probes of the graph data area (fourteenth pass): splits, CSBM statistics, neighbour sampling.

References are independent: plain Python / NumPy float64 re-derivations from the definitions.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

from diffusionformer.data.csbm import csbm_graph
from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_batch
from diffusionformer.data.splits import carve_val


@pytest.mark.parametrize("n", [10.0, 10.5, True])
def test_bug_carve_val_non_int_n_gets_torch_error(n):
    """Bug: carve_val(10.0 / 10.5 / True, ...) failed with torch.randperm's "invalid combination of arguments"."""
    with pytest.raises(TypeError, match=r"^n must be an int"):
        carve_val(n, 3 if n is not True else None, seed=0)


def test_bug_carve_val_negative_n_blamed_val_size():
    """Bug: carve_val(-1, None, 0) said "val_size must be in [0, -1)", blaming val_size for a negative n."""
    with pytest.raises(ValueError, match=r"^n must be >= 0, got -1"):
        carve_val(-1, None, seed=0)


def test_pins_carve_val_numpy_n_partitions():
    n = np.int64(37)
    tr, va = carve_val(n, None, seed=3)  # 37 // 10 = 3 held out
    assert len(va) == 3 and sorted(torch.cat([tr, va]).tolist()) == list(range(37))


@pytest.mark.parametrize("N,C,d,h", [(3000, 2, 10.0, 0.5), (3000, 5, 6.0, 0.9), (2400, 3, 20.0, 0.1)])
def test_pins_csbm_edge_homophily_degree_and_simple_graph_vs_numpy(N, C, d, h):
    x, ei, y = csbm_graph(N, C, d, h, 8, 2.0, torch.Generator().manual_seed(1))
    e, yy = ei.numpy().astype(np.int64), y.numpy()
    M = e.shape[1] // 2
    assert M == math.floor(N * d / 2 + 0.5)  # exact edge count
    assert np.all(e[0] != e[1])
    keys = e[0] * N + e[1]
    assert np.unique(keys).size == keys.size  # no duplicates
    assert np.array_equal(np.sort(keys), np.sort(e[1] * N + e[0]))  # symmetric
    hom = float(np.mean(yy[e[0]] == yy[e[1]]))
    assert abs(hom - h) < 5 * math.sqrt(h * (1 - h) / M) + 1e-12  # binomial(M, h) / M
    assert np.bincount(yy, minlength=C).tolist() == [N // C] * C
    means = np.stack([x.numpy().astype(np.float64)[yy == c].mean(0) for c in range(C)])
    for i in range(C):
        for j in range(i + 1, C):  # class means mu = 2 apart, noise se about sqrt(2 * 8 * C / N)
            assert abs(np.linalg.norm(means[i] - means[j]) - 2.0) < 0.4


def test_pins_csbm_mean_homophily_over_seeds_is_unbiased():
    hs = []
    for s in range(200):
        _, ei, y = csbm_graph(200, 2, 5.0, 0.3, 2, 1.0, torch.Generator().manual_seed(s))
        hs.append(float((y[ei[0]] == y[ei[1]]).double().mean()))
    # each graph: Binomial(500, 0.3) / 500, sd 0.0205; the mean of 200: sd 0.00145
    assert abs(np.mean(hs) - 0.3) < 0.006


def test_pins_neighbor_sampling_uniform_without_replacement_chi_square():
    from scipy import stats

    src = list(range(2, 32)) + list(range(40, 47))
    dst = [0] * 30 + [1] * 7
    data = Data(edge_index=torch.tensor([src, dst]), num_nodes=50)
    sampler = TorchNeighborSampler(data, [3])
    g = torch.Generator().manual_seed(0)
    counts = np.zeros(len(src))
    T = 1200
    for _ in range(T):
        out = sampler._sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor([1, 0])), g)
        e = out.edge.numpy()
        assert np.unique(e).size == e.size == 6  # 3 each, without replacement
        np.add.at(counts, e, 1)
    assert stats.chisquare(counts[:30]).pvalue > 1e-4
    assert stats.chisquare(counts[30:]).pvalue > 1e-4


def test_pins_neighbor_batch_fanout_per_hop_and_edges_are_real_vs_numpy():
    rng = np.random.default_rng(0)
    N, E = 60, 300
    src, dst = rng.integers(0, N, E), rng.integers(0, N, E)
    dst[dst >= 50] = 0  # nodes 50..59 have no incoming edges (isolated as targets)
    data = Data(x=torch.arange(N, dtype=torch.float32).view(N, 1), edge_index=torch.tensor(np.stack([src, dst])),
                num_nodes=N)
    data.edge_attr = torch.arange(E, dtype=torch.float32)
    fan = [3, 2, -1]
    sampler = TorchNeighborSampler(data, fan)
    indeg = np.bincount(dst, minlength=N)
    for seeds in ([0, 55, 7], [59], list(range(0, N, 7))):
        out = sampler._sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor(seeds)),
                                         torch.Generator().manual_seed(3))
        node, col = out.node.numpy(), out.col.numpy()
        off = 0
        for hop, k in enumerate(fan):
            cnt = np.bincount(col[off:off + out.num_sampled_edges[hop]], minlength=len(node))
            off += out.num_sampled_edges[hop]
            lo = sum(out.num_sampled_nodes[:hop])
            for i in range(lo, lo + out.num_sampled_nodes[hop]):
                assert cnt[i] == (indeg[node[i]] if k == -1 else min(k, indeg[node[i]]))
        b = neighbor_batch(data, sampler, torch.tensor(seeds), torch.Generator().manual_seed(3))
        n, e, le = b.n_id.numpy(), b.e_id.numpy(), b.edge_index.numpy()
        assert n[:len(seeds)].tolist() == seeds and np.unique(n).size == n.size
        assert np.array_equal(n[le[0]], src[e]) and np.array_equal(n[le[1]], dst[e])
        assert torch.equal(b.edge_attr, data.edge_attr[b.e_id]) and torch.equal(b.x.view(-1).long(), b.n_id)


def test_bug_csbm_large_classes_draw_the_other_end_in_float64(monkeypatch):
    """Bug: csbm_graph drew an edge's other end as float32 rand * (class size - 1): 2**24 values spread over a class
    of millions of nodes (at 3 * 2**20 + 1 nodes a third of them drawn 6/5 as often), and past 2**24 rounding into
    the next class; above 2**16 nodes the draw is float64 now, below it the seeded graphs of earlier versions stay."""
    import diffusionformer.data.csbm as csbm_module

    seen: list[torch.dtype] = []
    real_rand = torch.rand

    def spy(*args, **kwargs):
        out = real_rand(*args, **kwargs)
        seen.append(out.dtype)
        return out

    monkeypatch.setattr(csbm_module.torch, "rand", spy)
    N = 2**16 + 2
    out = csbm_graph(N, 2, 0.02, 0.5, 2, 1.0, torch.Generator().manual_seed(0))
    ei = next(t for t in out if t.dim() == 2 and t.shape[0] == 2 and not t.is_floating_point())
    assert seen and set(seen) == {torch.float64}
    assert ei.numel() and int(ei.min()) >= 0 and int(ei.max()) < N and bool((ei[0] != ei[1]).all())
    seen.clear()
    csbm_graph(1000, 2, 4.0, 0.5, 2, 1.0, torch.Generator().manual_seed(0))
    assert seen and set(seen) == {torch.float32}
