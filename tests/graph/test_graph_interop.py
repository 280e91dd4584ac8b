"""PyG and networkx in, networkx out: block structure, self loops, node order, round trips, filters."""

from __future__ import annotations

import sys

import networkx as nx
import pytest
import torch
from torch_geometric.data import Batch, Data

from diffusionformer import DiffusionAttention
from diffusionformer.graph import (
    causal,
    draw_attention_graph,
    from_networkx,
    from_pyg,
    grid,
    grid_layout,
    to_networkx,
)


def two_graphs() -> Batch:
    a = Data(edge_index=torch.tensor([[0, 1, 1], [1, 0, 1]]), num_nodes=3)  # node 2 isolated, one self loop
    b = Data(edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), num_nodes=4)
    return Batch.from_data_list([a, b])


@pytest.mark.parametrize("layout", ["sparse", "dense"])
@pytest.mark.parametrize("self_loops", [None, True, False])
def test_from_pyg_never_connects_graphs_of_a_batch(layout: str, self_loops: bool | None) -> None:
    data = two_graphs()
    g = from_pyg(data, self_loops=self_loops, layout=layout)
    A = g.dense_allowed()  # (2, 4, 4)
    assert A.shape == (2, 4, 4)
    s = g.to_sparse()
    graph_of = s.batch
    assert (graph_of[s.edge_index[0]] == graph_of[s.edge_index[1]]).all()
    if layout == "dense":
        assert g.key_padding_mask[0].tolist() == [False, False, False, True]  # graph 0 has 3 nodes
        assert not A[0, 3].any() and not A[0, :, 3].any()


def test_from_pyg_self_loops() -> None:
    data = two_graphs()
    diag = lambda g: torch.diagonal(g.dense_allowed(), dim1=1, dim2=2)  # noqa: E731
    assert diag(from_pyg(data, self_loops=True))[0, :3].all() and diag(from_pyg(data, self_loops=True))[1].all()
    assert not diag(from_pyg(data, self_loops=False)).any()
    kept = from_pyg(data)
    assert diag(kept)[0].tolist() == [False, True, False, False]  # the one self loop of graph 0
    ei = from_pyg(data, self_loops=True).edge_index
    assert int((ei[0] == ei[1]).sum()) == 7  # exactly one per node, the existing one not doubled


def test_from_pyg_single_data_and_layer() -> None:
    data = Data(x=torch.randn(4, 8), edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]))
    g = from_pyg(data, self_loops=True)
    assert g.batch is None and g.num_nodes == 4
    assert DiffusionAttention(8, 2)(data.x, graph=g).shape == (4, 8)


def test_from_networkx_node_order_and_directions() -> None:
    G = nx.Graph()
    G.add_nodes_from(["c", "a", "b"])
    G.add_edge("c", "b")
    g = from_networkx(G)
    assert g.num_nodes == 3
    # insertion order: c=0, a=1, b=2; the undirected edge gives both directions
    assert sorted(map(tuple, g.edge_index.T.tolist())) == [(0, 2), (2, 0)]
    g2 = from_networkx(G, nodelist=["a", "b", "c"])
    assert sorted(map(tuple, g2.edge_index.T.tolist())) == [(1, 2), (2, 1)]
    D = nx.DiGraph([("x", "y")])
    assert from_networkx(D).edge_index.tolist() == [[0], [1]]  # y attends to x


@pytest.mark.parametrize("directed", [False, True])
def test_from_networkx_round_trip(directed: bool) -> None:
    G = nx.gnp_random_graph(8, 0.35, seed=1, directed=directed)
    G.add_edge(3, 3)
    back = to_networkx(from_networkx(G))
    assert list(back.nodes) == list(range(8))
    if directed:
        assert set(back.edges) == set(G.edges)
    else:
        assert set(map(frozenset, back.to_undirected().edges)) == set(map(frozenset, G.edges))
        assert all(back.has_edge(v, u) for u, v in back.edges)
    assert set(to_networkx(from_networkx(G, layout="dense")).edges) == set(back.edges)
    assert not any(u == v for u, v in to_networkx(from_networkx(G, self_loops=False)).edges)


def test_from_networkx_multigraph_collapses_parallel_edges() -> None:
    M = nx.MultiDiGraph([(0, 1), (0, 1), (1, 0)])
    assert from_networkx(M).edge_index.shape == (2, 2)


EDGES = torch.tensor([[0, 1, 2, 0, 2, 1], [2, 2, 2, 1, 1, 0]])
WEIGHTS = torch.tensor([[0.1, 0.6], [0.5, 0.3], [0.4, 0.1], [0.7, 0.2], [0.3, 0.8], [1.0, 1.0]], dtype=torch.float64)


def test_to_networkx_threshold_keeps_edges_strictly_above() -> None:
    G = to_networkx(EDGES, WEIGHTS, threshold=0.4, head=0)
    assert set(G.edges) == {(1, 2), (0, 1), (1, 0)}
    assert G.number_of_nodes() == 3
    assert G[1][2]["weight"] == pytest.approx(0.5)


def test_to_networkx_top_k_per_target() -> None:
    G = to_networkx(EDGES, WEIGHTS, top_k=1, head=1)
    assert set(G.edges) == {(0, 2), (2, 1), (1, 0)}
    G2 = to_networkx(EDGES, WEIGHTS, top_k=2)  # head mean: 0.35 0.4 0.25 | 0.45 0.55 | 1.0
    assert set(G2.edges) == {(1, 2), (0, 2), (2, 1), (0, 1), (1, 0)}
    assert G2[0][2]["weight"] == pytest.approx(0.35)
    both = to_networkx(EDGES, WEIGHTS, top_k=1, threshold=0.5, head="max")
    assert set(both.edges) == {(0, 2), (2, 1), (1, 0)}
    assert to_networkx(EDGES, WEIGHTS, head="max")[0][2]["weight"] == pytest.approx(0.6)


def test_to_networkx_unweighted_keeps_isolated_nodes() -> None:
    G = to_networkx(torch.tensor([[0], [1]]), num_nodes=4)
    assert list(G.nodes) == [0, 1, 2, 3] and list(G.edges(data=True)) == [(0, 1, {})]


def test_to_networkx_from_sparse_intermediates() -> None:
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads="laplacian:1,attention:1")
    g = grid(2, 3, layout="sparse")
    _, inter = layer(torch.randn(6, 8), graph=g, return_intermediates=True)
    G = to_networkx(inter, top_k=2)
    assert G.number_of_nodes() == 6
    assert all(G.in_degree(n) == 2 for n in G.nodes)
    # every kept edge is an edge of the grid, with its mean attention weight
    alpha = inter.attn_weights.detach().mean(1)
    lookup = {(int(j), int(i)): float(a) for (j, i), a in zip(inter.edge_index.T, alpha)}
    for u, v, w in G.edges(data="weight"):
        assert w == pytest.approx(lookup[(u, v)])
    total_in = {n: sum(d["weight"] for _, _, d in to_networkx(inter).in_edges(n, data=True)) for n in G.nodes}
    assert all(t == pytest.approx(1.0) for t in total_in.values())  # rows of P sum to 1


def test_to_networkx_from_dense_weights() -> None:
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2)
    g = causal(4)
    _, inter = layer(torch.randn(2, 4, 8), graph=g, return_intermediates=True)
    P = inter.attn_weights.detach()  # (B, H, N, N)
    G = to_networkx(g, P, head=1)
    assert G.number_of_nodes() == 8
    assert all(u <= v and u // 4 == v // 4 for u, v in G.edges)  # causal, block-diagonal
    assert G[4 + 1][4 + 3]["weight"] == pytest.approx(float(P[1, 1, 3, 1]))
    G_inter = to_networkx(inter, head=1)  # no graph: the nonzero entries of P
    assert set(G_inter.edges) == set(G.edges)


def test_draw_attention_graph(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    g = grid(2, 2, cls_token=True).to_sparse()
    G = to_networkx(g, torch.rand(g.edge_index.shape[1], dtype=torch.float64))
    fig = Figure()
    ax = draw_attention_graph(G, ax=fig.add_subplot(), pos=grid_layout(2, 2, cls_token=True))
    assert ax.figure is fig and len(ax.collections) >= 1
    fig.savefig(tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 0
    with pytest.raises(ValueError, match="no position"):
        draw_attention_graph(G, ax=Figure().add_subplot(), pos={0: (0, 0)})


def test_draw_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"diffusionformer\[plot\]"):
        draw_attention_graph(nx.DiGraph([(0, 1)]))
