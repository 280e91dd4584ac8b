"""Edge probes of the token graphs, tenth pass: export thresholds beyond float64, networkx/PyG interop pins."""

from __future__ import annotations

import math
from fractions import Fraction

import networkx as nx
import pytest
import torch
from torch_geometric.utils import from_networkx as pyg_from_networkx

from diffusionformer.graph import AttentionGraph, from_networkx
from diffusionformer.graph.export import to_networkx


def _edge_set(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, edge_index.t().tolist()))


@pytest.mark.parametrize("threshold", [Fraction(1, 4), Fraction(-1, 3), 10 ** 400, -10 ** 400, 2 ** 53 + 3, 2 ** 63],
                         ids=["frac", "neg-frac", "huge", "neg-huge", "2^53+3", "2^63"])
def test_bug_threshold_exact_for_fractions_and_huge_ints(threshold) -> None:
    """Bug: to_networkx accepted any numbers.Real threshold but a Fraction raised TypeError ('>' not supported) and an
    int past float64 raised OverflowError ('int too big to convert'); a threshold rounded up dropped w == round(t)."""
    w = torch.tensor([-math.inf, -1e308, -0.5, 0.25, 0.3, 2.0 ** 53 + 4, 1e308, math.inf], dtype=torch.float64)
    E = w.numel()
    ei = torch.stack([torch.arange(E), torch.full((E,), E)])  # E distinct edges into node E
    G = to_networkx(ei, w, threshold=threshold)
    # reference: exact rational comparison in Python (inf compared as a float, exactly)
    want = {(j, E) for j, x in enumerate(w.tolist()) if (x > threshold if math.isinf(x) else Fraction(x) > threshold)}
    assert set(G.edges()) == want


def test_pins_from_networkx_matches_pyg_edges_and_isolated_nodes() -> None:
    """Same edge set (and node numbering) as torch_geometric.utils.from_networkx, undirected and directed, with a
    self loop and an isolated node; the dense layout is the transposed PyG adjacency."""
    from torch_geometric.utils import to_dense_adj

    D = nx.DiGraph()
    D.add_nodes_from(["c", "a", "iso", "b"])
    D.add_edges_from([("a", "b"), ("b", "b"), ("c", "a"), ("b", "c")])
    for G in (nx.karate_club_graph(), D, nx.Graph(D)):
        ours, ref = from_networkx(G), pyg_from_networkx(G)
        assert ours.num_nodes == ref.num_nodes == G.number_of_nodes()
        assert _edge_set(ours.edge_index) == _edge_set(ref.edge_index)
        adj = to_dense_adj(ref.edge_index, max_num_nodes=ref.num_nodes)[0].bool()  # adj[j, i]: edge j -> i
        assert torch.equal(from_networkx(G, layout="dense").allowed.reshape(adj.shape), adj.t())


def test_pins_to_networkx_dense_weights_over_broadcast_graph() -> None:
    """A dense graph built for any batch size, exported with (B, H, N, N) weights: node b * N + i, edge b N + j ->
    b N + i weighted by the head mean of P[b, :, i, j] (float64), and the graph's mask applied per sequence."""
    P = torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    allowed = torch.ones(4, 4, dtype=torch.bool).tril()
    G = to_networkx(AttentionGraph.dense(4, allowed=allowed), P)
    want = {(b * 4 + j, b * 4 + i): P[b, :, i, j].double().mean().item()
            for b in range(2) for i in range(4) for j in range(i + 1)}
    assert G.number_of_nodes() == 8
    got = {(u, v): d for u, v, d in G.edges(data="weight")}
    assert got.keys() == want.keys()
    assert all(math.isclose(got[e], want[e], rel_tol=1e-15) for e in want)
