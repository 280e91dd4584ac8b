"""Theory-page probes: the smoothing and spectrum metrics of ``docs/theory/oversmoothing.rst`` on tokens that are
all equal within their sequence (complete collapse), against what the pages and docstrings state for them."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.analysis import (dirichlet_energy, effective_rank, high_frequency_ratio, rank_collapse_residual,
                                      stable_rank, token_singular_values, variance_ratio, within_sequence_variance)


def _collapsed(dtype: torch.dtype, T: int = 7) -> torch.Tensor:
    """20 sequences of T copies of one random token each: (B, T, D), complete within-sequence collapse. The mean of
    T equal floats is not always that float (7 copies of a float32 token: off by ~1 ulp)."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(20, 1, 8, generator=g, dtype=dtype).expand(20, T, 8).contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("T", [3, 7, 100])
def test_equal_tokens_have_exactly_zero_variation(dtype, T):
    """Bug: ``within_sequence_variance`` is documented "zero exactly when all tokens of the sequence are equal" and
    ``high_frequency_ratio`` "0 when all tokens are equal", but both centred with the rounded mean token: seven copies
    of a float32 token gave a variance of 1.7e-13 and a high-frequency ratio of 1.1e-7 (so did the "mean" rank-1
    residual, the Dirichlet energy and the within part of the variance ratio)."""
    X = _collapsed(dtype, T)
    zeros = torch.zeros(20, dtype=dtype)
    torch.testing.assert_close(within_sequence_variance(X), zeros, rtol=0, atol=0)
    torch.testing.assert_close(high_frequency_ratio(X), zeros, rtol=0, atol=0)
    torch.testing.assert_close(rank_collapse_residual(X, "mean"), zeros, rtol=0, atol=0)
    torch.testing.assert_close(dirichlet_energy(X), zeros, rtol=0, atol=0)
    torch.testing.assert_close(dirichlet_energy(X, normalized=False), zeros, rtol=0, atol=0)
    P = torch.softmax(torch.randn(T, T, generator=torch.Generator().manual_seed(1), dtype=dtype), dim=-1)
    torch.testing.assert_close(dirichlet_energy(X, P), zeros, rtol=0, atol=0)
    torch.testing.assert_close(variance_ratio(X), zeros, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_collapsed_tokens_have_an_all_zero_centred_spectrum(dtype):
    """Bug: the centred tokens of a completely collapsed batch were rounding noise, not zero, so their spectrum was
    noise: ``effective_rank(token_singular_values(X))`` of 20 sequences of 7 equal float32 tokens was 6.96 of 8, the
    flattest spectrum possible for the most collapsed tokens possible (documented: an all-zero spectrum gives 0)."""
    X = _collapsed(dtype)
    for centre in ("sequence", "global"):
        Y = X if centre == "sequence" else X[:1].expand(20, 7, 8)  # global centring: one token for the whole batch
        for pool in (True, False):
            s = token_singular_values(Y, center=centre, pool=pool)
            assert bool((s == 0).all()), (centre, pool, s)
            assert bool((effective_rank(s) == 0).all()) and bool((stable_rank(s) == 0).all())


def test_centring_first_token_keeps_values_and_gradients():
    """The exact centring changes nothing for ordinary tokens: the metrics and their gradients against float64
    references of the documented formulas."""
    g = torch.Generator().manual_seed(2)
    X = (torch.randn(3, 5, 4, generator=g, dtype=torch.float64) + 3.0).requires_grad_()
    T = X.shape[1]
    C = torch.eye(T, dtype=torch.float64) - 1.0 / T
    ref = (C @ X).pow(2).sum(dim=(1, 2)) / T
    got = within_sequence_variance(X)
    torch.testing.assert_close(got, ref)
    (g_got,) = torch.autograd.grad(got.sum(), X)
    (g_ref,) = torch.autograd.grad(ref.sum(), X)
    torch.testing.assert_close(g_got, g_ref)
    s_ref = torch.linalg.svdvals((C @ X).reshape(-1, 4))
    torch.testing.assert_close(token_singular_values(X), s_ref)
    s_glob = torch.linalg.svdvals((X - X.mean(dim=(0, 1))).reshape(-1, 4))
    torch.testing.assert_close(token_singular_values(X, center="global"), s_glob)


@pytest.mark.parametrize("padded", [False, True])
def test_layer_report_of_a_collapsed_float64_layer_has_no_noise_spectrum(padded):
    """Bug: ``layer_reports`` centred each sequence by its rounded mean token, so a float64 layer of 20 sequences of 7
    equal tokens reported ``effective_rank`` 7.26, ``stable_rank`` 3.43 and a power-law exponent, all of rounding
    noise, for tokens that have no centred spectrum at all (the metrics of an all-zero spectrum: 0, 0 and None)."""
    from diffusionformer.analysis import LayerCapture, layer_reports

    X = _collapsed(torch.float64)
    mask = None
    if padded:
        mask = torch.ones(20, 7, dtype=torch.bool)
        mask[::2, 5:] = False
        X = X.masked_fill(~mask.unsqueeze(-1), 123.0)  # padding that must not count
    labels = torch.arange(20) % 2
    metrics = layer_reports(LayerCapture({0: X}, mask=mask, labels=labels))[0].metrics
    assert metrics["within_variance"] == 0.0 and metrics["variance_ratio"] == 0.0
    assert metrics["effective_rank"] == 0.0 and metrics["stable_rank"] == 0.0 and metrics["energy_top3"] == 0.0
    assert metrics["power_law_alpha"] is None
    # the sequence means are still the means of the real tokens (what the Neural Collapse metrics read)
    reference = layer_reports(LayerCapture({0: X[:, :5].contiguous()}, labels=labels))[0].metrics
    assert metrics["nc1"] == pytest.approx(reference["nc1"], rel=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [3, 5, 7])
def test_coinciding_class_means_give_the_documented_infinite_nc1(dtype, n):
    """Bug: ``neural_collapse`` documents ``nc1 = inf`` "when the class means coincide while the features spread
    around them", and an equal-angle ETF distance of 1 for means without direction; float64 features (three classes
    holding the same points) gave NC1 3.4e30 and ETF distance 1.414: the class means minus the rounded ``H.mean``
    were noise of 1e-17, read as three directions. Float32 features (averaged exactly in float64) gave inf and 1."""
    from diffusionformer.analysis import neural_collapse, next_token_nc1

    A = torch.randn(n, 4, generator=torch.Generator().manual_seed(3), dtype=dtype)
    H, y = torch.cat([A, A, A]), torch.arange(3).repeat_interleave(n)
    nc = neural_collapse(H, y)
    assert nc.nc1 == float("inf")
    assert nc.equinorm == 0.0 and nc.etf_distance == pytest.approx(1.0)
    assert next_token_nc1(H, y) == float("inf")
    # distinct means: NC1 as the pseudo-inverse formula of the docs
    H2 = H + torch.tensor([0.0, 1.0, 3.0], dtype=dtype).repeat_interleave(n).unsqueeze(-1)
    H64 = H2.double()
    means = torch.stack([H64[y == c].mean(0) for c in range(3)])
    R, M = H64 - means[y], means - H64.mean(0)
    ref = torch.trace((R.T @ R / len(y)) @ torch.linalg.pinv(M.T @ M / 3, hermitian=True)) / 3
    assert neural_collapse(H2, y).nc1 == pytest.approx(ref.item(), rel=1e-6)
