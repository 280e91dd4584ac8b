"""Edge probes of the graph builders, knn and AttentionGraph against independent references (round six)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from diffusionformer.graph import AttentionGraph, complete, grid, knn, sliding_window


def _grid_reference(h: int, w: int, r: float, metric: str, self_loops: bool, cls: bool) -> torch.Tensor:
    """``(N, N)`` allowed matrix of :func:`grid` from nested loops over the patch pairs (float64 distances)."""
    P, off = h * w, int(cls)
    A = np.zeros((P + off, P + off), dtype=bool)
    for a in range(P):
        for b in range(P):
            dy, dx = abs(a // w - b // w), abs(a % w - b % w)
            d = {"chebyshev": max(dy, dx), "manhattan": dy + dx, "euclidean": math.hypot(dy, dx)}[metric]
            A[a + off, b + off] = d <= r and (self_loops or a != b)
    if cls:
        A[0, :] = A[:, 0] = True
        A[0, 0] = self_loops
    return torch.from_numpy(A)


@pytest.mark.parametrize("metric", ["chebyshev", "manhattan", "euclidean"])
@pytest.mark.parametrize(("h", "w"), [(1, 4), (3, 1), (2, 3), (4, 3)])
def test_grid_matches_nested_loops_in_both_layouts(metric, h, w):
    for r in (0, 1, 1.5, 2.3):
        for self_loops in (True, False):
            for cls in (False, True):
                ref = _grid_reference(h, w, r, metric, self_loops, cls).expand(2, -1, -1)
                kw = dict(metric=metric, self_loops=self_loops, cls_token=cls, batch_size=2)
                dense, sparse = grid(h, w, r, **kw), grid(h, w, r, layout="sparse", **kw)
                assert torch.equal(dense.dense_allowed(), ref)
                assert torch.equal(sparse.dense_allowed(), ref)
                assert torch.equal(dense.to_sparse().dense_allowed(), ref)
                key = sparse.edge_index[0] * 10**4 + sparse.edge_index[1]
                assert key.unique().numel() == key.numel()  # no duplicate edges


def test_sliding_window_matches_nested_loops_and_its_edges_are_sorted():
    for N in range(1, 6):
        for window in (0, 1, 2, 7):
            for causal in (False, True):
                ref = torch.tensor([[abs(i - j) <= window and (not causal or j <= i) for j in range(N)]
                                    for i in range(N)])
                sparse = sliding_window(N, window, causal=causal, batch_size=2, layout="sparse")
                assert torch.equal(sliding_window(N, window, causal=causal).dense_allowed()[0], ref)
                assert torch.equal(sparse.dense_allowed(), ref.expand(2, N, N))
                key = sparse.edge_index[1] * 10**4 + sparse.edge_index[0]  # grouped by target, sorted by source
                assert torch.equal(key, key.sort().values) and key.unique().numel() == key.numel()


def test_knn_matches_a_float64_brute_force_and_gives_k_incoming_edges_nearest_first():
    gen = torch.Generator().manual_seed(0)
    for metric in ("euclidean", "cosine"):
        for _ in range(20):
            x = torch.randn(9, 3, generator=gen)
            X = x.double()
            if metric == "euclidean":
                D = torch.cdist(X, X)
            else:
                u = X / X.norm(dim=-1, keepdim=True)
                D = 1 - u @ u.T
            D.fill_diagonal_(float("inf"))
            e = knn(x, 3, metric=metric).edge_index
            assert torch.equal(e[1], torch.arange(9).repeat_interleave(3))  # k in-edges per target
            for i in range(9):
                src = e[0, e[1] == i]
                assert i not in src.tolist()
                d = D[i, src]
                assert bool((d[1:] >= d[:-1] - 1e-9).all())  # nearest first
                assert bool((d <= D[i].sort().values[2] + 1e-9).all())


def test_knn_batched_rows_are_the_per_sample_graphs():
    x = torch.randn(3, 6, 2, generator=torch.Generator().manual_seed(1))
    g = knn(x, 2)
    for b in range(3):
        assert torch.equal(g.edge_index[:, 12 * b:12 * (b + 1)], knn(x[b], 2).edge_index + 6 * b)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [2**63, 2**64 + 1, 10**30])
def test_bug_window_past_int64_is_the_whole_band(window, causal):
    """Bug: a window of 2**63 or more wrapped around in the dense mask (an empty band: no token attended to any
    other, while the sparse layout had every edge), and 10**30 raised an OverflowError from dense_allowed,
    attention_kwargs and to_sparse."""
    N = 4
    ref = torch.tensor([[not causal or j <= i for j in range(N)] for i in range(N)])
    sparse = sliding_window(N, window, causal=causal, layout="sparse")
    dense = sliding_window(N, window, causal=causal)
    assert torch.equal(sparse.dense_allowed()[0], ref)
    assert torch.equal(dense.dense_allowed()[0], ref)
    assert torch.equal(dense.attention_kwargs(torch.zeros(1, N, 2))["attn_mask"], ref)
    assert torch.equal(dense.to_sparse().edge_index, sparse.edge_index)
    explicit = AttentionGraph.dense(N, causal=causal, window=window, allowed=torch.ones(N, N, dtype=torch.bool))
    assert torch.equal(explicit.to_sparse().edge_index, sparse.edge_index)


def test_bug_sparse_dense_allowed_checks_batch_size():
    """Bug: dense_allowed(batch_size) of a sparse graph ignored its argument: a batch size that disagreed with the
    graph's number of graphs (or a string) was accepted silently, while a dense graph refuses it."""
    s = complete(3, batch_size=2, layout="sparse")
    assert s.dense_allowed(2).shape == (2, 3, 3)
    with pytest.raises(ValueError, match="batch_size=5 disagrees"):
        s.dense_allowed(5)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        s.dense_allowed("2")
    with pytest.raises(ValueError, match="batch_size=2 disagrees"):
        AttentionGraph.sparse(torch.tensor([[0], [1]]), 2).dense_allowed(2)
