"""Token spectra, PCA token maps, frequency responses and eigenvalues."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.analysis import (
    effective_rank,
    eigenvalues_of,
    energy_top_k,
    frequency_response,
    pca_token_rgb,
    power_law_exponent,
    stable_rank,
    token_singular_values,
    within_sequence_variance,
)

DTYPES = [torch.float32, torch.float64]


def tol(dtype: torch.dtype) -> dict[str, float]:
    if dtype == torch.float32:
        return {"rtol": 1e-4, "atol": 1e-5}
    return {"rtol": 1e-10, "atol": 1e-12}


# ----------------------------------------------------------------------------------------
# Token singular values and spectrum summaries
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_token_singular_values_centring_and_pooling(dtype: torch.dtype) -> None:
    B, T, D = 3, 5, 4
    X = torch.randn(B, T, D, generator=torch.Generator().manual_seed(0), dtype=dtype) + 3.0
    pooled = token_singular_values(X)
    assert pooled.shape == (min(B * T, D),) and pooled.dtype == dtype
    # energy of the sequence-centred spectrum = sum of ||C X_b||_F^2
    close = lambda a, b: torch.testing.assert_close(a, b, **tol(dtype))  # noqa: E731
    close(pooled.pow(2).sum(), T * within_sequence_variance(X).sum())
    per_seq = token_singular_values(X, pool=False)
    assert per_seq.shape == (B, min(T, D))
    close(per_seq.pow(2).sum(-1), T * within_sequence_variance(X))
    flat = X.reshape(B * T, D)
    close(token_singular_values(X, center="global"), torch.linalg.svdvals(flat - flat.mean(0)))
    close(token_singular_values(X, center="none"), torch.linalg.svdvals(flat))
    with pytest.raises(ValueError, match="center must be one of"):
        token_singular_values(X, center="median")


@pytest.mark.parametrize("dtype", DTYPES)
def test_diagonal_spectrum_known_summaries(dtype: torch.dtype) -> None:
    s = torch.tensor([3.0, 1.0], dtype=dtype)
    A = torch.diag(s).unsqueeze(0)  # (1, 2, 2): its singular values are s
    torch.testing.assert_close(token_singular_values(A, center="none"), s, **tol(dtype))
    p = torch.tensor([0.75, 0.25], dtype=torch.float64)
    expected_erank = math.exp(float(-(p * p.log()).sum()))
    assert effective_rank(s).item() == pytest.approx(expected_erank, rel=1e-6)
    assert stable_rank(s).item() == pytest.approx(10.0 / 9.0, rel=1e-6)
    assert energy_top_k(s, 1).item() == pytest.approx(0.9, rel=1e-6)
    assert energy_top_k(s, 2).item() == pytest.approx(1.0, rel=1e-6)
    # flat spectrum of an R-dim identity: every rank is R, energy k/R
    flat = torch.ones(5, dtype=dtype)
    assert effective_rank(flat).item() == pytest.approx(5.0, rel=1e-6)
    assert stable_rank(flat).item() == pytest.approx(5.0, rel=1e-6)
    assert energy_top_k(flat, 2).item() == pytest.approx(0.4, rel=1e-6)
    # rank one with zeros (0 log 0 = 0), all zeros -> 0, batched and order-free
    batch = torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 2.0]], dtype=dtype)
    torch.testing.assert_close(effective_rank(batch)[:2], torch.tensor([1.0, 0.0], dtype=dtype))
    torch.testing.assert_close(stable_rank(batch), torch.tensor([1.0, 0.0, 1.5], dtype=dtype))
    torch.testing.assert_close(energy_top_k(batch, 1), torch.tensor([1.0, 0.0, 4 / 6], dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.3])
def test_power_law_recovers_exponent(dtype: torch.dtype, alpha: float) -> None:
    i = torch.arange(1, 65, dtype=torch.float64)
    s = (i ** (-alpha / 2)).to(dtype)  # s_i^2 = i^-alpha
    assert power_law_exponent(s).item() == pytest.approx(alpha, rel=1e-5)
    shuffled = s[torch.randperm(64, generator=torch.Generator().manual_seed(1))]
    assert power_law_exponent(shuffled).item() == pytest.approx(alpha, rel=1e-5)
    # a distorted head and a noise floor are excluded by the index range
    distorted = s.clone()
    distorted[:3] *= 10.0
    distorted[50:] = 1e-3 * s[50]
    assert power_law_exponent(distorted, start=4, stop=50).item() == pytest.approx(alpha, rel=1e-5)
    assert abs(power_law_exponent(distorted).item() - alpha) > 0.1  # the full fit is wrong
    batched = torch.stack([s, s.pow(2)])  # exponents alpha and 2 alpha
    torch.testing.assert_close(
        power_law_exponent(batched),
        torch.tensor([alpha, 2 * alpha], dtype=dtype),
        rtol=1e-5,
        atol=1e-5,
    )


def test_spectrum_bad_inputs() -> None:
    s = torch.tensor([3.0, 2.0, 0.0])
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 3\].*got 4"):
        energy_top_k(s, 4)
    with pytest.raises(ValueError, match="positive singular values at ranks 1..3"):
        power_law_exponent(s)
    assert power_law_exponent(s, stop=2).item() > 0
    with pytest.raises(ValueError, match=r"1 <= start < stop <= R = 3.*start=2, stop=2"):
        power_law_exponent(s, start=2, stop=2)
    with pytest.raises(ValueError, match="non-negative"):
        effective_rank(torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match=r"\(\.\.\., R\).*got shape \(\)"):
        stable_rank(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"\(B, T, D\)"):
        token_singular_values(torch.randn(4, 3))


# ----------------------------------------------------------------------------------------
# PCA token maps
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_pca_map_shape_range_and_leading_direction(dtype: torch.dtype) -> None:
    B, h, w, D = 2, 3, 4, 6
    T = h * w
    g = torch.Generator().manual_seed(2)
    t = torch.randn(B * T, generator=g)
    t = t - t.mean()
    u = torch.randn(B * T, generator=g)
    u = u - u.mean()
    u = u - (u @ t) / (t @ t) * t  # uncorrelated with t over the batch
    t, u = t.reshape(B, T), u.reshape(B, T)  # strongest and second direction
    basis, _ = torch.linalg.qr(torch.randn(D, D, generator=g))
    noise = 0.01 * torch.randn(B, T, D, generator=g)
    X = 5.0 * t[..., None] * basis[0] + 2.0 * u[..., None] * basis[1] + noise
    X = (X + 4.0).to(dtype)
    rgb = pca_token_rgb(X, (h, w))
    assert rgb.shape == (B, 3, h, w) and rgb.dtype == dtype
    assert float(rgb.min()) >= 0.0 and float(rgb.max()) <= 1.0
    for c in range(3):  # min-max over the whole batch, per channel
        assert rgb[:, c].min().item() == pytest.approx(0.0, abs=1e-6)
        assert rgb[:, c].max().item() == pytest.approx(1.0, abs=1e-6)

    def corr(a: torch.Tensor, b: torch.Tensor) -> float:
        pair = torch.stack([a.flatten().double(), b.flatten().double()])
        return float(torch.corrcoef(pair)[0, 1])

    # tokens are laid out row-major on the grid: pixel (r, c) is token r * w + c
    assert abs(corr(rgb[:, 0].reshape(B, T), t)) > 0.999
    assert abs(corr(rgb[:, 1].reshape(B, T), u)) > 0.999
    # deterministic sign convention: negating the tokens mirrors every channel
    torch.testing.assert_close(pca_token_rgb(-X, (h, w)), 1.0 - rgb, rtol=0, atol=1e-4)


def test_pca_map_small_feature_dim_and_errors() -> None:
    X = torch.arange(6.0).reshape(1, 6, 1) * torch.tensor([1.0, 0.0])  # D = 2: one live component
    rgb = pca_token_rgb(X, (2, 3))
    torch.testing.assert_close(rgb[0, 0], torch.tensor([[0.0, 0.2, 0.4], [0.6, 0.8, 1.0]]))
    assert rgb[:, 1:].abs().max().item() == 0.0  # constant second component and padded third
    with pytest.raises(ValueError, match=r"h \* w == T = 6.*got h \* w = 4"):
        pca_token_rgb(X, (2, 2))
    with pytest.raises(ValueError, match=r"grid_hw must be a pair of positive ints"):
        pca_token_rgb(X, 6)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"patch_tokens must have shape \(B, T, D\)"):
        pca_token_rgb(X[0], (2, 3))


# ----------------------------------------------------------------------------------------
# Frequency response and eigenvalues
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_frequency_response_of_named_operators(dtype: torch.dtype) -> None:
    lam = torch.linspace(-1, 1, 11, dtype=dtype)
    lam64 = lam.double()
    attention = frequency_response(torch.tensor([0.0, 1.0], dtype=dtype), lam)
    laplacian = frequency_response(torch.tensor([1.0, -1.0], dtype=dtype), lam)
    assert attention.dtype == torch.float64
    torch.testing.assert_close(attention, lam64)
    torch.testing.assert_close(laplacian, 1.0 - lam64)
    t, K = 1.5, 25
    taylor = [math.exp(-t) * t**k / math.factorial(k) for k in range(K + 1)]
    heat = torch.tensor(taylor, dtype=dtype)
    expected_heat = torch.exp(-t * (1.0 - lam64))
    torch.testing.assert_close(frequency_response(heat, lam), expected_heat, rtol=1e-5, atol=1e-6)
    coeffs = torch.tensor([[0.0, 1.0, 0.0], [1.0, -1.0, 0.0]])  # padded with a zero P^2 term
    stacked = frequency_response(coeffs, lam)
    assert stacked.shape == (2, 11)
    torch.testing.assert_close(stacked, torch.stack([lam64, 1.0 - lam64]))


def test_frequency_response_matches_matrix_polynomial() -> None:
    g = torch.Generator().manual_seed(3)
    A = torch.randn(5, 5, generator=g, dtype=torch.float64)
    S = (A + A.T) / 4  # symmetric: real eigenvalues, f(S) has eigenvalues f(lambda)
    c = torch.tensor([0.3, -1.0, 0.5, 2.0], dtype=torch.float64)
    f_S = sum(c[k] * torch.linalg.matrix_power(S, k) for k in range(4))
    lam = torch.linalg.eigvalsh(S)
    expected = torch.linalg.eigvalsh(f_S)
    torch.testing.assert_close(frequency_response(c, lam).sort().values, expected)
    # complex eigenvalues: the 3-cycle has the cube roots of unity; (I - P) maps 1 -> 0
    cycle = torch.tensor([[0.0, 1, 0], [0, 0, 1], [1, 0, 0]])
    roots = eigenvalues_of(cycle)
    response = frequency_response(torch.tensor([1.0, -1.0]), roots)
    assert response.dtype == torch.complex128
    torch.testing.assert_close(response, 1.0 - roots)
    assert abs(response[0]) < 1e-12


def test_eigenvalues_of_stochastic_matrices() -> None:
    P = torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(4)).softmax(-1)
    lam = eigenvalues_of(P)
    assert lam.shape == (2, 4, 6) and lam.dtype == torch.complex128
    # the Perron root 1 comes first
    torch.testing.assert_close(lam[..., 0], torch.ones(2, 4, dtype=torch.complex128))
    assert bool((lam.abs() <= 1 + 1e-6).all())  # P is float32: rows sum to 1 up to rounding
    assert bool((lam.real[..., :-1] >= lam.real[..., 1:]).all())  # sorted by real part
    cube_roots = eigenvalues_of(torch.tensor([[0.0, 1, 0], [0, 0, 1], [1, 0, 0]]))
    expected = torch.tensor([1, complex(-0.5, math.sqrt(3) / 2), complex(-0.5, -math.sqrt(3) / 2)])
    torch.testing.assert_close(cube_roots, expected.to(torch.complex128))


def test_frequency_and_eigen_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"\(K\+1,\) or \(G, K\+1\), got \(1, 2, 3\)"):
        frequency_response(torch.zeros(1, 2, 3), torch.zeros(4))
    with pytest.raises(ValueError, match=r"lambdas must be a tensor of shape \(L,\), got \(2, 2\)"):
        frequency_response(torch.zeros(2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"P must be square.*got shape \(3, 4\)"):
        eigenvalues_of(torch.zeros(3, 4))
