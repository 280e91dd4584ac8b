"""Edge probes of the token-geometry metrics (eighth pass): float32 cancellation and overflow."""

from __future__ import annotations

import torch

from diffusionformer.analysis.metrics import dirichlet_energy
from diffusionformer.analysis.spectral import token_singular_values


def _brute_energy(X: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """``1/2 sum_ij P_ij ||x_i - x_j||^2`` in float64, from the pairwise differences."""
    X, P = X.double(), P.double()
    d2 = (X[:, :, None, :] - X[:, None, :, :]).pow(2).sum(dim=-1)
    return 0.5 * (P * d2).sum(dim=(-1, -2))


def test_bug_dense_dirichlet_energy_of_float32_tokens_far_from_their_mean():
    """Bug: the dense-P Dirichlet energy ``1/2 sum (r+c)||x||^2 - tr(X^T P X)`` was accumulated in float32, and its two
    terms cancel: two tokens at distance 1 but 1e4 from the sequence mean, joined by P, had energy 0, not 1."""
    X = torch.tensor([[[0.0, 0.0], [1e4, 0.0], [1e4 + 1.0, 0.0]]])
    P = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    raw = dirichlet_energy(X, P, normalized=False)
    assert raw.dtype == torch.float32
    torch.testing.assert_close(raw.double(), _brute_energy(X, P), rtol=1e-6, atol=0)
    scaled = dirichlet_energy(X, P)
    torch.testing.assert_close(scaled.double(), _brute_energy(X, P) / X.double().pow(2).sum(), rtol=1e-5, atol=0)


def test_dense_dirichlet_energy_of_causal_and_full_graphs_matches_pairwise_differences():
    """A causal (lower-triangular, row-stochastic) and a full random graph, batched and shared, in float32 and float64,
    against the float64 sum over pairwise differences; the energy is never negative."""
    g = torch.Generator().manual_seed(0)
    B, T, D = 3, 9, 5
    X = torch.randn(B, T, D, generator=g) + 50.0 * torch.randn(B, T, 1, generator=g)
    causal = torch.tril(torch.rand(T, T, generator=g))
    causal = causal / causal.sum(dim=-1, keepdim=True)
    full = torch.rand(B, T, T, generator=g)
    for P in (causal, full):
        for dtype in (torch.float32, torch.float64):
            got = dirichlet_energy(X.to(dtype), P.to(dtype), normalized=False)
            assert got.dtype == dtype and bool((got >= 0).all())
            torch.testing.assert_close(got.double(), _brute_energy(X, P), rtol=1e-5, atol=1e-6)
    # causal: the upper triangle is not an edge, so moving a token changes only its own and later rows' terms
    sym = 0.5 * (causal + causal.T)
    torch.testing.assert_close(dirichlet_energy(X.double(), causal.double(), normalized=False),
                               dirichlet_energy(X.double(), sym.double(), normalized=False))


def test_dense_dirichlet_energy_keeps_its_gradient_and_dtype():
    X = torch.randn(2, 4, 3, dtype=torch.float32, requires_grad=True)
    P = torch.softmax(torch.randn(4, 4), dim=-1)
    E = dirichlet_energy(X, P).sum()
    E.backward()
    assert X.grad is not None and X.grad.dtype == torch.float32 and bool(torch.isfinite(X.grad).all())
    assert float(X.grad.abs().sum()) > 0


def test_bug_token_singular_values_of_float32_tokens_near_the_largest_float():
    """Bug: the sequence (or batch) mean of finite float32 tokens of |x| > 1e38 overflowed (3e38 + 1e38 = inf), and
    the singular values of the centred tokens were NaN, not those of the float64 computation."""
    X = torch.tensor([[[3e38, 0.0], [1e38, 0.0]], [[1e38, 0.5e38], [3e38, 0.5e38]]])
    for center in ("sequence", "global"):  # singular values of about 2e38: representable in float32
        for pool in (True, False):
            got = token_singular_values(X, center=center, pool=pool)
            ref = token_singular_values(X.double(), center=center, pool=pool)
            assert float(ref.max()) < torch.finfo(torch.float32).max
            assert got.dtype == torch.float32 and bool(torch.isfinite(got).all()), (center, pool, got)
            torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6 * float(ref.max()))


def test_token_singular_values_at_ordinary_and_tiny_scales_are_unchanged():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(3, 5, 4, generator=g)
    ref = torch.linalg.svdvals((X - X.mean(dim=1, keepdim=True)).reshape(15, 4))
    torch.testing.assert_close(token_singular_values(X), ref)
    tiny = X * 1e-30  # squares of 1e-30 underflow in float32; the exact scaling keeps them
    torch.testing.assert_close(token_singular_values(tiny).double(), token_singular_values(tiny.double()),
                               rtol=1e-5, atol=0)
    assert torch.equal(token_singular_values(torch.zeros(2, 3, 2)), torch.zeros(2))
    Xg = X.clone().requires_grad_(True)
    token_singular_values(Xg).sum().backward()
    assert Xg.grad is not None and float(Xg.grad.abs().sum()) > 0
