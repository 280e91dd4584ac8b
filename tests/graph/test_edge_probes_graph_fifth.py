"""Edge-case probes of graph construction (fifth round): grid radii at the boundaries, k-NN on empty or
misplaced batches, k-NN with ties and duplicates against a float64 brute force, dense <-> sparse round trips."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from diffusionformer.graph import AttentionGraph, grid, knn


def _grid_reference(h: int, w: int, radius: float, metric: str, self_loops: bool) -> torch.Tensor:
    """``(h w, h w)`` bool from float64 numpy distances."""
    n = np.arange(h * w)
    dy = np.abs((n // w)[:, None] - (n // w)[None, :]).astype(np.float64)
    dx = np.abs((n % w)[:, None] - (n % w)[None, :]).astype(np.float64)
    if metric == "chebyshev":
        A = np.maximum(dy, dx) <= radius
    elif metric == "manhattan":
        A = dy + dx <= radius
    else:
        A = dy * dy + dx * dx <= float(radius) ** 2
    if not self_loops:
        A &= ~np.eye(h * w, dtype=bool)
    return torch.from_numpy(A)


@pytest.mark.parametrize("metric", ["chebyshev", "manhattan", "euclidean"])
def test_bug_grid_radius_just_below_a_distance_matches_float64(metric):
    """Bug: the distances were compared with ``radius`` in float32 (a long tensor against a Python float), so a
    radius just below a distance (0.99999999, sqrt(2) - 1e-9) took that distance in; the dense layout then had
    edges the sparse one (offsets up to floor(radius)) did not."""
    for radius in (0.99999999, 1.0, math.sqrt(2) - 1e-9, math.sqrt(2), 2 - 1e-9, 2.0, math.sqrt(5) - 1e-9, 2.5):
        ref = _grid_reference(3, 4, radius, metric, self_loops=False)
        for layout in ("dense", "sparse"):
            got = grid(3, 4, radius, metric=metric, self_loops=False, layout=layout).dense_allowed()[0]
            assert torch.equal(got, ref), (radius, layout)


@pytest.mark.parametrize("radius", [np.int64(2**32), 10**20, 10**400, np.float32(1e30)],
                         ids=["int64-2e32", "int-1e20", "int-1e400", "float32-1e30"])
def test_bug_grid_huge_radius_joins_every_pair(radius):
    """Bug: a huge integer radius overflowed: an int64 ``radius * radius`` wrapped around (only the self loops were
    left for the Euclidean metric), a Python int past int64 or float range raised an OverflowError."""
    for metric in ("chebyshev", "manhattan", "euclidean"):
        for layout in ("dense", "sparse"):
            A = grid(2, 3, radius, metric=metric, layout=layout).dense_allowed()[0]
            assert bool(A.all()), (metric, layout)


def test_grid_radius_checks_still_refuse_bad_values():
    for bad in (-1, -0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="radius must be finite and >= 0"):
            grid(2, 2, bad)
    with pytest.raises(TypeError, match="radius must be a number"):
        grid(2, 2, True)


def test_bug_knn_with_an_empty_batch_is_the_k_error():
    """Bug: ``knn`` of no points with an (empty) batch vector raised a bare RuntimeError from inside
    to_dense_batch (a max of an empty tensor), while the same call without batch gave the clear k error."""
    with pytest.raises(ValueError, match="smallest graph has N=0 nodes"):
        knn(torch.zeros(0, 2), 1, batch=torch.zeros(0, dtype=torch.long))


def test_bug_knn_batch_on_another_device_is_named():
    """Bug: a batch vector on another device than x was used as is (a meta batch raised 'Tensor.item() cannot be
    called on meta tensors'; a CPU batch for a CUDA x a device mismatch from inside to_dense_batch)."""
    with pytest.raises(ValueError, match=r"batch must be on x's device \(cpu\), got meta"):
        knn(torch.randn(4, 2), 1, batch=torch.zeros(4, dtype=torch.long, device="meta"))


def _brute_force_distances(x: np.ndarray, metric: str) -> np.ndarray:
    if metric == "euclidean":
        return np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    norm = np.linalg.norm(x, axis=1)
    zero = norm == 0
    with np.errstate(invalid="ignore", divide="ignore"):
        d = 1 - (x @ x.T) / np.outer(norm, norm)
    d[zero[:, None] | zero[None, :]] = 1.0  # a zero vector is orthogonal to every point (documented in knn)
    return d


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_knn_with_ties_duplicates_and_zero_vectors_matches_brute_force(dtype, metric):
    rng = np.random.default_rng(5)
    for _ in range(20):
        N = int(rng.integers(3, 10))
        x = rng.integers(-1, 2, size=(N, 2)).astype(np.float64)  # many ties, duplicates and zero vectors
        batch = rng.permutation(np.arange(N) % 2)  # unsorted, two graphs of >= 1 node each
        k = int(min(np.bincount(batch))) - 1
        if k < 1:
            continue
        for self_loops in (False, True):
            g = knn(torch.tensor(x, dtype=dtype), k, batch=torch.from_numpy(batch), metric=metric,
                    self_loops=self_loops)
            d = _brute_force_distances(x, metric)
            src, dst = g.edge_index.numpy()
            assert bool((np.diff(dst) >= 0).all())  # grouped by target
            for i in range(N):
                nb = src[dst == i]
                if self_loops:
                    assert nb[0] == i
                    nb = nb[1:]
                cand = [j for j in range(N) if j != i and batch[j] == batch[i]]
                assert i not in nb and len(nb) == k and bool((batch[nb] == batch[i]).all())
                np.testing.assert_allclose(d[i, nb], np.sort(d[i, cand])[:k], atol=1e-12)  # nearest first


def test_knn_dense_layout_is_the_sparse_layout_for_batched_points():
    x = torch.randint(-2, 3, (3, 6, 2)).double()
    for metric in ("euclidean", "cosine"):
        s, d = knn(x, 3, metric=metric), knn(x, 3, metric=metric, layout="dense")
        assert torch.equal(s.dense_allowed(), d.dense_allowed())
        flat = knn(x.reshape(18, 2), 3, metric=metric, batch=torch.arange(3).repeat_interleave(6))
        assert torch.equal(flat.edge_index, s.edge_index)  # same ties broken the same way


def test_dense_to_sparse_to_dense_round_trip_with_padding():
    torch.manual_seed(3)
    B, N = 3, 5
    kpm = torch.rand(B, N) < 0.4
    allowed = torch.rand(B, N, N) < 0.6
    g = AttentionGraph.dense(N, key_padding_mask=kpm, causal=True, window=2, allowed=allowed)
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    ref = allowed & (j <= i) & (i - j <= 2) & ~kpm[:, None, :] & ~kpm[:, :, None]
    assert torch.equal(g.dense_allowed(), ref)
    s = g.to_sparse()
    A = torch.zeros(B * N, B * N, dtype=torch.bool)
    A[s.edge_index[1], s.edge_index[0]] = True
    assert torch.equal(torch.stack([A[b * N:(b + 1) * N, b * N:(b + 1) * N] for b in range(B)]), ref)
    assert int(A.sum()) == int(ref.sum())  # no edge across sequences
    assert torch.equal(s.to_dense().dense_allowed(), ref)
