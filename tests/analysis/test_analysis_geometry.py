"""Within-sequence geometry and Dirichlet energy against closed forms and brute force."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.analysis import (
    dirichlet_energy,
    high_frequency_ratio,
    mean_pairwise_cosine,
    rank_collapse_residual,
    variance_ratio,
    within_sequence_variance,
)

DTYPES = [torch.float32, torch.float64]


def tol(dtype: torch.dtype) -> dict[str, float]:
    if dtype == torch.float32:
        return {"rtol": 1e-4, "atol": 1e-5}
    return {"rtol": 1e-10, "atol": 1e-12}


def brute_energy(X: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """1/2 sum_ij P_ij ||x_i - x_j||^2 by forming all pairwise differences."""
    diff2 = (X.unsqueeze(2) - X.unsqueeze(1)).pow(2).sum(-1)  # (B, T, T): ||x_i - x_j||^2
    return 0.5 * (P * diff2).sum(dim=(1, 2))


def random_stochastic(B: int, T: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, T, generator=g, dtype=dtype).mul(2).softmax(dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_identical_tokens_are_fully_collapsed(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(3, 1, 5, generator=g, dtype=dtype)
    X = rows.expand(3, 7, 5).clone()  # every sequence: 7 copies of one token
    zeros = torch.zeros(3, dtype=dtype)
    torch.testing.assert_close(within_sequence_variance(X), zeros, **tol(dtype))
    torch.testing.assert_close(mean_pairwise_cosine(X), torch.ones(3, dtype=dtype), **tol(dtype))
    torch.testing.assert_close(high_frequency_ratio(X), zeros, **tol(dtype))
    torch.testing.assert_close(rank_collapse_residual(X, "mean"), zeros, **tol(dtype))
    torch.testing.assert_close(rank_collapse_residual(X, "svd"), zeros, atol=1e-3, rtol=0)
    torch.testing.assert_close(variance_ratio(X), zeros, **tol(dtype))
    torch.testing.assert_close(dirichlet_energy(X), zeros, **tol(dtype))
    P = random_stochastic(3, 7, dtype)
    torch.testing.assert_close(dirichlet_energy(X, P), zeros, **tol(dtype))
    torch.testing.assert_close(dirichlet_energy(X, P, normalized=False), zeros, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_orthonormal_tokens_known_values(dtype: torch.dtype) -> None:
    T = 4
    g = torch.Generator().manual_seed(2)
    Q, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    X = torch.stack([torch.eye(T, 6, dtype=torch.float64), Q[:T]]).to(dtype)  # 2 orthonormal sets
    expected = lambda v: torch.full((2,), v, dtype=dtype)  # noqa: E731
    close = lambda a, b: torch.testing.assert_close(a, b, **tol(dtype))  # noqa: E731
    close(within_sequence_variance(X), expected((T - 1) / T))
    close(mean_pairwise_cosine(X), expected(0.0))
    close(high_frequency_ratio(X), expected(math.sqrt((T - 1) / T)))
    # all singular values are 1: the best rank-1 residual is sqrt((T-1)/T) as well
    close(rank_collapse_residual(X, "svd"), expected(math.sqrt((T - 1) / T)))
    close(dirichlet_energy(X, normalized=False), expected(T - 1.0))
    close(dirichlet_energy(X), expected((T - 1) / T))


@pytest.mark.parametrize("dtype", DTYPES)
def test_uniform_energy_closed_form(dtype: torch.dtype) -> None:
    """On the complete graph with P = 1/T: E = ||C X||_F^2 = T * within-variance."""
    B, T, D = 3, 6, 4
    X = torch.randn(B, T, D, generator=torch.Generator().manual_seed(3), dtype=dtype) + 2.0
    uniform = torch.full((B, T, T), 1.0 / T, dtype=dtype)
    expected = T * within_sequence_variance(X)
    close = lambda a, b: torch.testing.assert_close(a, b, **tol(dtype))  # noqa: E731
    close(dirichlet_energy(X, normalized=False), expected)
    close(dirichlet_energy(X, uniform, normalized=False), expected)
    close(brute_energy(X, uniform), expected)
    # normalised uniform energy is the squared high-frequency ratio
    torch.testing.assert_close(dirichlet_energy(X), high_frequency_ratio(X) ** 2, **tol(dtype))
    # sparse complete graph with self loops and weights 1/T, nodes b*T + t
    ii, jj = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    src, dst = jj.flatten(), ii.flatten()
    edges = torch.cat([torch.stack([src + b * T, dst + b * T]) for b in range(B)], dim=1)
    w = torch.full((edges.shape[1],), 1.0 / T, dtype=dtype)
    sparse = dirichlet_energy(X, edge_index=edges, edge_weight=w, normalized=False)
    torch.testing.assert_close(sparse, expected, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_sparse_and_brute_force_agree(dtype: torch.dtype) -> None:
    B, T, D = 2, 5, 3
    X = torch.randn(B, T, D, generator=torch.Generator().manual_seed(4), dtype=dtype)
    P = random_stochastic(B, T, dtype, seed=5)
    expected = brute_energy(X, P)
    torch.testing.assert_close(dirichlet_energy(X, P, normalized=False), expected, **tol(dtype))
    b, i, j = torch.meshgrid(torch.arange(B), torch.arange(T), torch.arange(T), indexing="ij")
    edges = torch.stack([(b * T + j).flatten(), (b * T + i).flatten()])  # source j, target i
    w = P.flatten()
    perm = torch.randperm(w.numel(), generator=torch.Generator().manual_seed(6))  # edge order
    sparse = dirichlet_energy(X, edge_index=edges[:, perm], edge_weight=w[perm], normalized=False)
    torch.testing.assert_close(sparse, expected, **tol(dtype))
    # (N, D) nodes with an explicit batch vector give the same per-graph values
    batch = torch.arange(B).repeat_interleave(T)
    nodes = dirichlet_energy(X.reshape(B * T, D), edge_index=edges, edge_weight=w, batch=batch)
    torch.testing.assert_close(nodes, expected / X.pow(2).sum(dim=(1, 2)), **tol(dtype))
    # a (T, T) matrix is shared by all sequences
    shared = dirichlet_energy(X, P[0], normalized=False)
    torch.testing.assert_close(shared, brute_energy(X, P[0].expand(B, T, T)), **tol(dtype))


def test_sparse_graphs_of_different_sizes() -> None:
    """Two graphs (3 and 2 nodes) in one batch vector, unit weights."""
    X = torch.tensor([[0.0], [1.0], [3.0], [10.0], [10.0]], dtype=torch.float64)
    batch = torch.tensor([0, 0, 0, 1, 1])
    edges = torch.tensor([[0, 1, 1, 3], [1, 0, 2, 4]])  # 0->1, 1->0, 1->2, 3->4
    energy = dirichlet_energy(X, edge_index=edges, batch=batch, normalized=False)
    # graph 0: 1/2 (1 + 1 + 4) = 3; graph 1: identical nodes = 0
    torch.testing.assert_close(energy, torch.tensor([3.0, 0.0], dtype=torch.float64))
    normalized = dirichlet_energy(X, edge_index=edges, batch=batch, num_graphs=2)
    torch.testing.assert_close(normalized, torch.tensor([3.0 / 10.0, 0.0], dtype=torch.float64))
    # an isolated trailing graph id is kept when num_graphs says so
    three = dirichlet_energy(X, edge_index=edges, batch=batch, num_graphs=3, normalized=False)
    assert three.shape == (3,) and three[2] == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_energy_normalisation_is_scale_free(dtype: torch.dtype) -> None:
    X = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(7), dtype=dtype)
    P = random_stochastic(2, 5, dtype, seed=8)
    close = lambda a, b: torch.testing.assert_close(a, b, **tol(dtype))  # noqa: E731
    raw = dirichlet_energy(X, P, normalized=False)
    close(dirichlet_energy(7.0 * X, P), dirichlet_energy(X, P))
    close(dirichlet_energy(7.0 * X, P, normalized=False), 49.0 * raw)
    # E depends on differences only: a constant shift leaves the unnormalised energy unchanged
    close(dirichlet_energy(X + 3.0, P, normalized=False), raw)


@pytest.mark.parametrize("dtype", DTYPES)
def test_variance_ratio_law_of_total_variance(dtype: torch.dtype) -> None:
    B, T, D = 4, 6, 3
    X = torch.randn(B, T, D, generator=torch.Generator().manual_seed(9), dtype=dtype)
    X = X + torch.arange(B, dtype=dtype).view(B, 1, 1)  # separate the sequence means
    within = within_sequence_variance(X)
    between = (X.mean(1) - X.mean((0, 1))).pow(2).sum(-1)  # ||x_bar_b - mu||^2
    torch.testing.assert_close(variance_ratio(X), within / (within + between), **tol(dtype))
    pooled = variance_ratio(X, reduction="pooled")
    torch.testing.assert_close(pooled, within.sum() / (within + between).sum(), **tol(dtype))
    # pooled = within-sequence share of the variance of all B*T tokens
    all_tokens = X.reshape(B * T, D)
    total = (all_tokens - all_tokens.mean(0)).pow(2).sum() / (B * T)
    torch.testing.assert_close(pooled, within.mean() / total, **tol(dtype))
    assert bool(((variance_ratio(X) >= 0) & (variance_ratio(X) <= 1)).all())
    # a batch of zeros has no variance: ratios are 0, never NaN
    assert variance_ratio(torch.zeros(2, 3, 2, dtype=dtype)).tolist() == [0.0, 0.0]
    assert variance_ratio(torch.zeros(2, 3, 2, dtype=dtype), reduction="pooled").item() == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_mean_pairwise_cosine_matches_gram_matrix(dtype: torch.dtype) -> None:
    B, T, D = 3, 5, 4
    X = torch.randn(B, T, D, generator=torch.Generator().manual_seed(10), dtype=dtype)
    X[1, 2] = 0.0  # a zero token has cosine 0 with all others
    U = torch.nn.functional.normalize(X, dim=-1)
    gram = U @ U.transpose(1, 2)
    off = gram.sum((1, 2)) - gram.diagonal(dim1=1, dim2=2).sum(-1)
    torch.testing.assert_close(mean_pairwise_cosine(X), off / (T * (T - 1)), **tol(dtype))
    # scale invariance per token
    scales = torch.rand(B, T, 1, generator=torch.Generator().manual_seed(11), dtype=dtype) + 0.5
    rescaled = mean_pairwise_cosine(X * scales)
    torch.testing.assert_close(rescaled, mean_pairwise_cosine(X), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rank_collapse_variants(dtype: torch.dtype) -> None:
    X = torch.randn(4, 6, 5, generator=torch.Generator().manual_seed(12), dtype=dtype)
    mean_res = rank_collapse_residual(X, "mean")
    svd_res = rank_collapse_residual(X, "svd")
    torch.testing.assert_close(mean_res, high_frequency_ratio(X), **tol(dtype))
    assert bool((svd_res <= mean_res + 1e-6).all())  # best rank-1 beats "all rows equal"
    # tokens that are multiples of one vector: rank 1 but not all equal
    v = torch.randn(1, 1, 5, dtype=dtype, generator=torch.Generator().manual_seed(13))
    multiples = torch.arange(1.0, 7.0, dtype=dtype).view(1, 6, 1) * v
    assert rank_collapse_residual(multiples, "svd").item() == pytest.approx(0.0, abs=1e-3)
    assert rank_collapse_residual(multiples, "mean").item() > 0.3


@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions_and_dtype(dtype: torch.dtype) -> None:
    X = torch.randn(3, 4, 2, generator=torch.Generator().manual_seed(14), dtype=dtype)
    for fn in (within_sequence_variance, mean_pairwise_cosine, high_frequency_ratio,
               rank_collapse_residual, dirichlet_energy, variance_ratio):
        per_seq = fn(X)
        assert per_seq.shape == (3,) and per_seq.dtype == dtype, fn.__name__
        torch.testing.assert_close(fn(X, reduction="mean"), per_seq.mean(), **tol(dtype))
        torch.testing.assert_close(fn(X, reduction="sum"), per_seq.sum(), **tol(dtype))
        with pytest.raises(ValueError, match="reduction must be one of"):
            fn(X, reduction="max")


def test_bad_inputs_name_expected_and_got() -> None:
    X = torch.randn(2, 3, 4)
    for fn in (within_sequence_variance, variance_ratio, mean_pairwise_cosine,
               high_frequency_ratio, rank_collapse_residual, dirichlet_energy):
        with pytest.raises(ValueError, match=r"\(B, T, D\).*got shape \(3, 4\)"):
            fn(X[0])
        with pytest.raises(TypeError, match="floating"):
            fn(torch.ones(2, 3, 4, dtype=torch.long))
        with pytest.raises(TypeError, match="torch.Tensor"):
            fn([[[1.0]]])
    with pytest.raises(ValueError, match="T >= 2.*T=1"):
        mean_pairwise_cosine(torch.randn(2, 1, 4))
    with pytest.raises(ValueError, match="method must be"):
        rank_collapse_residual(X, "qr")
    with pytest.raises(ValueError, match=r"P must have shape \(3, 3\) or \(2, 3, 3\).*\(3, 4\)"):
        dirichlet_energy(X, torch.rand(3, 4))
    with pytest.raises(ValueError, match=r"got \(5, 3, 3\)"):
        dirichlet_energy(X, torch.rand(5, 3, 3))
    edges = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="not both"):
        dirichlet_energy(X, torch.rand(3, 3), edge_index=edges)
    with pytest.raises(ValueError, match=r"edge_weight must have shape \(2,\), got \(3,\)"):
        dirichlet_energy(X, edge_index=edges, edge_weight=torch.ones(3))
    with pytest.raises(ValueError, match=r"edge_index must have shape \(2, E\), got \(3, 2\)"):
        dirichlet_energy(X, edge_index=torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"batch must have shape \(6,\).*got shape \(5,\)"):
        dirichlet_energy(X.reshape(6, 4), edge_index=edges, batch=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="only used with edge_index"):
        dirichlet_energy(X, edge_weight=torch.ones(2))
