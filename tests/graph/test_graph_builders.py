"""Builders against hand-built adjacency matrices and their structural properties."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from diffusionformer.graph import causal, complete, grid, knn, sliding_window


def mat(rows: list[str]) -> Tensor:
    """Hand-written (N, N) bool matrix, row i = query, column j = key ('1' = i attends to j)."""
    return torch.tensor([[c == "1" for c in r] for r in rows])


def both_layouts(builder, *args, **kwargs) -> list[Tensor]:
    return [builder(*args, layout=layout, **kwargs).dense_allowed() for layout in ("dense", "sparse")]


def test_complete_without_self_loops() -> None:
    for A in both_layouts(complete, 3, self_loops=False):
        assert torch.equal(A, mat(["011", "101", "110"])[None])


def test_complete_with_padding_has_no_edges_at_padding() -> None:
    kpm = torch.tensor([[False, False, True]])
    for A in both_layouts(complete, 3, key_padding_mask=kpm):
        assert torch.equal(A, mat(["110", "110", "000"])[None])


def test_causal_matrix() -> None:
    for A in both_layouts(causal, 4):
        assert torch.equal(A, mat(["1000", "1100", "1110", "1111"])[None])


@pytest.mark.parametrize("N", [1, 2, 5, 9])
def test_causal_graphs_never_have_an_edge_from_the_future(N: int) -> None:
    for g in (causal(N, 3, layout="sparse"), sliding_window(N, 2, causal=True, batch_size=3, layout="sparse"),
              causal(N, 3).to_sparse()):
        src, dst = g.edge_index
        assert (src <= dst).all()
        assert len(g.edge_index.T.tolist()) == len({tuple(e) for e in g.edge_index.T.tolist()})  # no duplicates
    assert int(causal(N, layout="sparse").edge_index.shape[1]) == N * (N + 1) // 2


def test_sliding_window_matrices() -> None:
    for A in both_layouts(sliding_window, 5, 2):
        assert torch.equal(A, mat(["11100", "11110", "11111", "01111", "00111"])[None])
    for A in both_layouts(sliding_window, 5, 2, causal=True):
        assert torch.equal(A, mat(["10000", "11000", "11100", "01110", "00111"])[None])
    for A in both_layouts(sliding_window, 3, 0):
        assert torch.equal(A, torch.eye(3, dtype=torch.bool)[None])


@pytest.mark.parametrize("window", [0, 1, 3])
def test_window_sizes(window: int) -> None:
    N = 12
    g = sliding_window(N, window, layout="sparse")
    in_deg = torch.bincount(g.edge_index[1], minlength=N)
    interior = slice(window, N - window)
    assert (in_deg[interior] == 2 * window + 1).all()
    assert in_deg[0] == window + 1
    gc = sliding_window(N, window, causal=True, layout="sparse")
    in_deg_c = torch.bincount(gc.edge_index[1], minlength=N)
    assert (in_deg_c[window:] == window + 1).all() and in_deg_c[0] == 1
    assert ((gc.edge_index[1] - gc.edge_index[0]) <= window).all()


def test_grid_3x3_chebyshev_centre_has_nine_neighbours() -> None:
    for A in both_layouts(grid, 3, 3):
        A = A[0]
        assert A[4].sum() == 9  # centre sees all 9 tokens incl. itself
        assert A[0].tolist() == [True, True, False, True, True, False, False, False, False]  # corner: 4
        assert A[1].sum() == 6  # edge token


def test_grid_manhattan_hand_built() -> None:
    # 2 x 3 grid, tokens 0 1 2 / 3 4 5, 4-neighbourhood plus self
    expected = mat(["110100", "111010", "011001", "100110", "010111", "001011"])
    for A in both_layouts(grid, 2, 3, metric="manhattan"):
        assert torch.equal(A[0], expected)


def test_grid_euclidean_radius() -> None:
    for A in both_layouts(grid, 3, 3, radius=1, metric="euclidean"):
        assert A[0, 4].sum() == 5  # the 4-neighbourhood
    for A in both_layouts(grid, 3, 3, radius=1.5, metric="euclidean"):
        assert A[0, 4].sum() == 9  # diagonals at distance sqrt(2)
    for A in both_layouts(grid, 5, 5, radius=2, metric="euclidean"):
        assert A[0, 12].sum() == 13
    for A in both_layouts(grid, 2, 2, radius=0):
        assert torch.equal(A[0], torch.eye(4, dtype=torch.bool))


def test_grid_cls_token_connects_to_all() -> None:
    for A in both_layouts(grid, 2, 2, radius=0, cls_token=True):
        A = A[0]
        assert A[0].all() and A[:, 0].all()  # the class token sees and is seen by every token
        assert torch.equal(A[1:, 1:], torch.eye(4, dtype=torch.bool))  # patches: radius 0
    for A in both_layouts(grid, 2, 2, radius=0, cls_token=True, self_loops=False):
        assert torch.equal(A[0], mat(["01111", "10000", "10000", "10000", "10000"]))


def test_grid_batch_is_block_diagonal() -> None:
    g = grid(2, 2, batch_size=3, layout="sparse")
    assert g.num_nodes == 12 and g.batch_size == 3
    assert (g.edge_index[0] // 4 == g.edge_index[1] // 4).all()


def test_knn_on_a_line_hand_built() -> None:
    x = torch.tensor([[0.0], [1.0], [3.0], [7.0], [8.0]])
    # nearest two (not itself): 0 <- {1, 2}; 1 <- {0, 2}; 2 <- {1, 0}; 3 <- {4, 2}; 4 <- {3, 2}
    expected = mat(["01100", "10100", "11000", "00101", "00110"])
    for layout in ("dense", "sparse"):
        assert torch.equal(knn(x, 2, layout=layout).dense_allowed()[0], expected)
    with_loops = knn(x, 2, self_loops=True).dense_allowed()[0]
    assert torch.equal(with_loops, expected | torch.eye(5, dtype=torch.bool))


def test_knn_cosine_uses_angles_not_lengths() -> None:
    x = torch.tensor([[1.0, 0.0], [10.0, 1.0], [0.0, 1.0], [0.5, 5.0]])
    A = knn(x, 1, metric="cosine").dense_allowed()[0]
    assert torch.equal(A, mat(["0100", "1000", "0001", "0010"]))
    A_euclid = knn(x, 1).dense_allowed()[0]
    assert A_euclid[0].tolist() == [False, False, True, False]  # (0, 1) is closer to (1, 0) than (10, 1)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_knn_has_exactly_k_in_edges_per_node(k: int) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(13, 4, generator=g)
    batch = torch.tensor([2, 0, 1, 0, 2, 1, 1, 0, 2, 0, 1, 2, 0])  # unsorted, three graphs of 4-5 nodes
    for graph in (knn(x, k, batch=batch), knn(x.view(1, 13, 4), k), knn(torch.randn(3, 6, 4, generator=g), k)):
        in_deg = torch.bincount(graph.edge_index[1], minlength=graph.num_nodes)
        assert (in_deg == k).all()
        assert (graph.edge_index[0] != graph.edge_index[1]).all()
    sparse = knn(x, k, batch=batch)
    assert (batch[sparse.edge_index[0]] == batch[sparse.edge_index[1]]).all()
    assert (torch.bincount(knn(x, k, self_loops=True).edge_index[1]) == k + 1).all()


def test_knn_matches_brute_force() -> None:
    x = torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    A = knn(x, 3, layout="dense").dense_allowed()
    d = torch.cdist(x, x) + torch.eye(7, dtype=torch.float64) * 1e9
    expected = torch.zeros(3, 7, 7, dtype=torch.bool)
    expected.scatter_(2, d.topk(3, largest=False).indices, True)
    assert torch.equal(A, expected)


def test_numpy_sizes_build_the_graph_python_ints_build():
    """Bug: every builder refused a sweep grid's numpy ints (``causal(np.int64(6))``: "N must be an
    int, got int64"), as did ``knn``'s ``k``, ``grid``'s ``h``/``w``/``radius`` and
    ``from_edge_index``'s ``num_nodes``. They now build the graph Python ints build, and the
    graph stores Python ints (its sizes compare, print and serialise as such)."""
    import numpy as np

    from diffusionformer.graph import AttentionGraph, from_edge_index, grid_layout, knn

    i = np.int64
    x = torch.tensor([[0.0], [1.0], [3.0], [7.0], [15.0]])  # no distance ties
    pairs = [
        (causal(i(6), i(2)), causal(6, 2)),
        (complete(np.int32(4), layout="sparse"), complete(4, layout="sparse")),
        (sliding_window(i(6), np.uint8(1)), sliding_window(6, 1)),
        (grid(i(2), i(3), np.float32(1.0)), grid(2, 3, 1.0)),
        (grid(i(2), i(3), layout="sparse"), grid(2, 3, layout="sparse")),
        (knn(x, i(2)), knn(x, 2)),
        (from_edge_index(torch.tensor([[0, 1], [1, 0]]), i(3)), from_edge_index(torch.tensor([[0, 1], [1, 0]]), 3)),
        (AttentionGraph.dense(i(5), window=i(1)), AttentionGraph.dense(5, window=1)),
    ]
    for got, want in pairs:
        for name in ("seq_len", "window", "num_nodes", "batch_size"):
            value = getattr(got, name)
            assert value == getattr(want, name) and (value is None or type(value) is int), (name, value)
        if got.is_dense:
            assert torch.equal(got.dense_allowed(), want.dense_allowed())
        else:
            assert torch.equal(got.edge_index, want.edge_index)
    # knn by hand: the 2 nearest other points of each point on a line, as edges source -> target
    nearest = {0: {1, 2}, 1: {0, 2}, 2: {1, 0}, 3: {2, 1}, 4: {3, 2}}
    got = knn(x, i(2)).edge_index
    assert {(int(s), int(t)) for s, t in got.T} == {(s, t) for t, ss in nearest.items() for s in ss}
    assert grid_layout(i(1), i(2)) == {0: (0.0, 0.0), 1: (1.0, 0.0)}
    with pytest.raises(TypeError, match=r"N must be an int, got bool"):
        causal(np.bool_(True))
