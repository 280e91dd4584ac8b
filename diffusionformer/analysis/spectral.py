r"""Spectral views of tokens and of diffusion operators.

- Singular spectrum of centred tokens and its summaries (effective rank, stable rank,
  energy in the top ``k`` directions, power-law decay exponent): Zhang & Papyan (arXiv
  2602.09297) report that Laplacian heads give faster-decaying token spectra.
- PCA token maps: the top three principal components of patch tokens shown as RGB.
- Frequency response ``f(lambda) = sum_k c_k lambda^k`` of a polynomial operator
  ``f(P) = sum_k c_k P^k`` (coefficient ``k`` multiplies ``P^k``: attention ``(0, 1)``,
  Laplacian ``(1, -1)``, heat ``c_k = e^{-t} t^k / k!``), and the eigenvalues of ``P``
  at which to read it: ``f(P) v = f(lambda) v`` for an eigenvector ``P v = lambda v``.

Spectrum summaries take singular values ``s`` of shape ``(..., R)`` (any order; they are
sorted in descending order where the order matters) and reduce the last dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffusionformer.analysis.metrics import (
    _centre,
    _check_choice,
    _check_dense,
    _check_flag,
    _check_float,
    _check_tokens,
    _is_int,
    _safe_div,
    _times_pow2,
    _unit_scale,
)
from diffusionformer.ops._checks import checks_values

__all__ = [
    "token_singular_values",
    "effective_rank",
    "stable_rank",
    "energy_top_k",
    "power_law_exponent",
    "pca_token_rgb",
    "frequency_response",
    "eigenvalues_of",
]

_CENTRES = ("sequence", "global", "none")


def token_singular_values(X: Tensor, *, center: str = "sequence", pool: bool = True) -> Tensor:
    r"""Singular values of centred tokens, in descending order.

    ``center="sequence"`` uses ``C X_b`` (each sequence minus its own mean: the
    within-sequence variation that a Laplacian head acts on), ``"global"`` subtracts the
    mean token of the whole batch, ``"none"`` keeps ``X``. With ``pool=True`` the centred
    tokens of all sequences are stacked into one ``(B T, D)`` matrix; otherwise each
    sequence's ``(T, D)`` matrix is decomposed separately. The squared singular values
    divided by the number of rows are the eigenvalues of the token covariance.

    Args:
        X: tokens.
        center: ``"sequence"``, ``"global"`` or ``"none"``.
        pool: one spectrum for the batch, or one per sequence.

    Shapes:
        X: ``(B, T, D)`` -> ``(min(B T, D),)`` if ``pool`` else ``(B, min(T, D))``.

    Examples:
        >>> X = torch.tensor([[[2.0, 0.0], [-2.0, 0.0]], [[0.0, 1.0], [0.0, -1.0]]])
        >>> token_singular_values(X)
        tensor([2.8284, 1.4142])
        >>> token_singular_values(X, pool=False)
        tensor([[2.8284, 0.0000],
                [1.4142, 0.0000]])
    """
    _check_tokens(X)
    _check_choice(center, "center", _CENTRES)
    _check_flag(pool, "pool")  # pool="no" is truthy: one pooled spectrum where per-sequence ones were asked for
    B, T, D = X.shape
    # an exact power-of-two scaling, undone on the singular values: the mean of float32 tokens of |x| > 1e38 overflowed
    # (inf - inf: NaN singular values of finite tokens)
    # per sequence where each spectrum is its own (pool=False, no batch mean subtracted): one scale for the batch took
    # a sequence of tokens ~1e-30 beside one of ~1e30 (float32) to 0, and its spectrum to all zeros
    own = not pool and center != "global"
    _, exponent = torch.frexp(X.detach().abs().amax(dim=(1, 2), keepdim=True) if own else X.detach().abs().amax())
    X = _times_pow2(X, -exponent)
    if center != "none":  # exactly 0 for equal tokens (a collapsed batch): no spectrum of rounding noise
        X = _centre(X, 1 if center == "sequence" else (0, 1))
    if pool:
        X = X.reshape(B * T, D)
    return _times_pow2(torch.linalg.svdvals(X), exponent.reshape(B, 1) if own else exponent)


def _check_spectrum(s: object, name: str = "s") -> Tensor:
    s = _check_float(s, name, tuple(range(1, 9)), "(..., R)")
    if bool((s < 0).any()):
        raise ValueError(f"{name} must hold non-negative singular values, got min {float(s.min())}")
    return s


def effective_rank(s: Tensor) -> Tensor:
    r"""Effective rank ``exp(H(p))``, ``p_i = s_i / sum_j s_j``, ``H(p) = -sum_i p_i log p_i``.

    Roy & Vetterli, "The effective rank: a measure of effective dimensionality" (EUSIPCO
    2007). It lies in ``[1, R]``: ``R`` for a flat spectrum, 1 for a rank-1 matrix
    (``0 log 0 = 0``). An all-zero spectrum gives 0.

    Args:
        s: singular values (non-negative).

    Shapes:
        s: ``(..., R)`` -> ``(...)``.

    Examples:
        >>> effective_rank(torch.tensor([[1.0, 1.0, 1.0, 1.0], [5.0, 0.0, 0.0, 0.0]]))
        tensor([4., 1.])
    """
    _check_spectrum(s)
    s = _unit_scale(s, -1)  # exact power-of-two scaling: sum_j s_j of float32 s > 1e37 overflowed (inf: rank 1)
    total = s.sum(dim=-1, keepdim=True)
    p = _safe_div(s, total)
    entropy = -torch.special.xlogy(p, p).sum(dim=-1)
    # in [1, R]: a flat spectrum of R = 6 gave 6.0000014 (float32) by rounding; a NaN stays NaN
    rank = entropy.exp().clamp(max=float(s.shape[-1]))  # >= 1 already: each -p log p >= 0
    return torch.where(total.squeeze(-1) == 0, 0.0, rank)


def stable_rank(s: Tensor) -> Tensor:
    r"""Stable rank ``||A||_F^2 / ||A||_2^2 = sum_i s_i^2 / max_i s_i^2``.

    A continuous lower bound on the rank, insensitive to tiny singular values (Rudelson
    & Vershynin 2007). An all-zero spectrum gives 0.

    Args:
        s: singular values (non-negative).

    Shapes:
        s: ``(..., R)`` -> ``(...)``.

    Examples:
        >>> stable_rank(torch.tensor([2.0, 1.0, 1.0]))
        tensor(1.5000)
    """
    _check_spectrum(s)
    # s_i / s_max first: s^2 over/underflows in float32 (s > 1e19, s < 1e-23)
    r = _safe_div(s, s.amax(dim=-1, keepdim=True))
    return r.pow(2).sum(dim=-1)


def energy_top_k(s: Tensor, k: int) -> Tensor:
    r"""Energy share of the top ``k`` directions, ``sum_{i<=k} s_i^2 / sum_i s_i^2``.

    ``s`` is sorted in descending order first. An all-zero spectrum gives 0.

    Args:
        s: singular values (non-negative).
        k: number of leading directions, ``1 <= k <= R``.

    Shapes:
        s: ``(..., R)`` -> ``(...)``.

    Examples:
        >>> energy_top_k(torch.tensor([1.0, 3.0]), k=1)
        tensor(0.9000)
    """
    _check_spectrum(s)
    R = s.shape[-1]
    if not _is_int(k) or not 1 <= k <= R:
        raise ValueError(f"k must be an integer in [1, {R}] (R = s.shape[-1]), got {k!r}")
    k = int(k)
    s = s.sort(dim=-1, descending=True).values
    s2 = _safe_div(s, s[..., :1]).pow(2)  # scaled by s_1 first: s^2 over/underflows in float32
    return _safe_div(s2[..., :k].sum(dim=-1), s2.sum(dim=-1))


def power_law_exponent(s: Tensor, start: int = 1, stop: int | None = None) -> Tensor:
    r"""Decay exponent ``alpha`` of the fit ``log s_i^2 ~ beta - alpha log i``, by least squares.

    ``s`` is sorted in descending order and ranked ``i = 1, ..., R``; the fit uses the
    ranks ``start <= i <= stop`` (1-based and inclusive; ``stop`` defaults to ``R``), so
    ``alpha = -cov(log i, log s_i^2) / var(log i)`` over that range. A pure power law
    ``s_i^2 = i^{-a}`` gives ``alpha = a``; larger ``alpha`` means a faster-decaying
    spectrum (energy concentrated in fewer directions). Trimming the head
    (``start > 1``) or the noise floor (``stop < R``) is common; all singular values in
    the range must be positive (a zero has ``log 0 = -inf``; lower ``stop``).

    Args:
        s: singular values (non-negative).
        start: first rank used (``>= 1``).
        stop: last rank used (``<= R``), at least ``start + 1``.

    Shapes:
        s: ``(..., R)`` -> ``(...)``.

    Examples:
        >>> i = torch.arange(1, 9, dtype=torch.float64)
        >>> round(power_law_exponent(i ** -1.5).item(), 6)  # s_i^2 = i^-3
        3.0
    """
    _check_spectrum(s)
    R = s.shape[-1]
    stop = R if stop is None else stop
    if not (all(_is_int(v) for v in (start, stop)) and 1 <= start < stop <= R):
        raise ValueError(
            f"need integers 1 <= start < stop <= R = {R} (at least 2 points), "
            f"got start={start!r}, stop={stop!r}"
        )
    start, stop = int(start), int(stop)
    s = s.sort(dim=-1, descending=True).values[..., start - 1 : stop]
    if bool((s <= 0).any()):
        raise ValueError(
            f"power_law_exponent needs positive singular values at ranks {start}..{stop}; "
            "got zeros: lower `stop` below the numerical rank"
        )
    log_i = torch.arange(start, stop + 1, dtype=s.dtype, device=s.device).log()
    log_i = log_i - log_i.mean()
    log_s2 = 2 * s.log()  # not log(s^2): s^2 over/underflows in float32 (s > 1e19, s < 1e-23)
    log_s2 = log_s2 - log_s2.mean(dim=-1, keepdim=True)
    return -(log_i * log_s2).sum(dim=-1) / log_i.pow(2).sum()


def pca_token_rgb(patch_tokens: Tensor, grid_hw: tuple[int, int]) -> Tensor:
    r"""Top three principal components of patch tokens as an RGB image per input, in ``[0, 1]``.

    With all ``N = B T`` tokens of the batch stacked and centred (``Z = X - 1 mu^T``), the
    components are the top-3 eigenvectors ``v_1, v_2, v_3`` of ``Z^T Z`` (fitted jointly
    over the batch so that colours are comparable across images); a component beyond the
    numerical rank of ``Z`` (rounding noise) is a channel of 0. Channel ``c`` is the
    projection ``Z v_c`` min-max scaled over the whole batch,
    ``(p - min p) / (max p - min p)`` (a constant projection maps to 0), reshaped to the
    ``h x w`` patch grid in row-major order. Eigenvector signs are fixed so that the
    largest-magnitude entry of each ``v_c`` is positive (deterministic colours). If
    ``D < 3`` (or ``B T < 3``) the missing channels are 0. This is the visualisation popularised by DINO
    (Caron et al. 2021) and used by Zhang & Papyan (arXiv 2602.09297) to show that
    smoothed patch tokens follow object segments.

    Args:
        patch_tokens: patch tokens without class/register tokens (drop them first).
        grid_hw: patch grid ``(h, w)`` with ``h * w == T``.

    Shapes:
        patch_tokens: ``(B, T, D)`` -> ``(B, 3, h, w)``.

    Examples:
        >>> t = torch.arange(4.0).reshape(1, 4, 1) * torch.tensor([1.0, 0.0, 0.0])
        >>> pca_token_rgb(t, (2, 2))[0, 0]
        tensor([[0.0000, 0.3333],
                [0.6667, 1.0000]])
    """
    _check_tokens(patch_tokens, "patch_tokens")
    B, T, D = patch_tokens.shape
    if (
        not isinstance(grid_hw, (tuple, list))
        or len(grid_hw) != 2
        or not all(_is_int(v) and v > 0 for v in grid_hw)
    ):
        raise ValueError(f"grid_hw must be a pair of positive ints (h, w), got {grid_hw!r}")
    h, w = (int(v) for v in grid_hw)
    if h * w != T:
        raise ValueError(
            f"grid_hw {(h, w)} must satisfy h * w == T = {T} (drop class/register tokens first), "
            f"got h * w = {h * w}"
        )
    Z = _unit_scale(patch_tokens.reshape(B * T, D), (0, 1))  # Z^T Z of float32 tokens of |x| > 1e19 overflows
    Z = Z - Z.mean(dim=0)
    q = min(3, D, B * T)  # Vh has min(B T, D) rows: fewer than 3 tokens give fewer components too
    _, S, Vh = torch.linalg.svd(Z, full_matrices=False)  # descending singular values
    V = Vh[:q].T  # (D, q), leading component first
    # a direction of the numerical null space (rank < 3) carries only rounding noise: left as 0, not min-max scaled
    # into a full-range channel (the rank tolerance of torch.linalg.matrix_rank)
    V = V * (S[:q] > max(B * T, D) * torch.finfo(Z.dtype).eps * S[:1]).to(Z.dtype)
    pivot = V.abs().argmax(dim=0)  # (q,)
    V = V * torch.sign(V.gather(0, pivot.unsqueeze(0)))
    proj = Z @ V  # (N, q)
    lo, hi = proj.amin(dim=0), proj.amax(dim=0)
    rgb = _safe_div(proj - lo, (hi - lo).expand_as(proj))
    if q < 3:
        rgb = torch.cat([rgb, rgb.new_zeros(B * T, 3 - q)], dim=-1)
    return rgb.reshape(B, h, w, 3).permute(0, 3, 1, 2).contiguous()  # (B, 3, h, w)


def frequency_response(coeffs: Tensor, lambdas: Tensor) -> Tensor:
    r"""Frequency response ``f(lambda) = sum_{k=0}^K c_k lambda^k`` of ``f(P) = sum_k c_k P^k``.

    Evaluated by Horner's rule, ``f = (...(c_K lambda + c_{K-1}) lambda + ...) + c_0``, in
    float64 (complex128 if ``coeffs`` or ``lambdas`` are complex). For an eigenpair
    ``P v = lambda v`` the operator acts as ``f(P) v = f(lambda) v``, so ``f`` tells how each
    graph frequency is amplified: attention ``(0, 1)`` gives ``lambda``, the Laplacian head
    ``(1, -1)`` gives ``1 - lambda`` (it removes the constant mode ``lambda = 1``), heat
    ``c_k = e^{-t} t^k / k!`` gives ``~ e^{-t (1 - lambda)}``. Row-stochastic ``P`` has
    ``|lambda| <= 1``; its eigenvalues are real when ``P`` is similar to a symmetric
    matrix (e.g. a reversible random walk) and complex in general (see ``eigenvalues_of``).

    Args:
        coeffs: coefficients ``c_0..c_K`` (index ``k`` multiplies ``P^k``), one row per
            operator/head.
        lambdas: points at which to evaluate (moved to ``coeffs.device``).

    Shapes:
        coeffs: ``(K+1,)`` or ``(G, K+1)``; lambdas: ``(L,)`` -> ``(L,)`` or ``(G, L)``.

    Examples:
        >>> lam = torch.tensor([-1.0, 0.0, 0.5, 1.0])
        >>> frequency_response(torch.tensor([1.0, -1.0]), lam)
        tensor([2.0000, 1.0000, 0.5000, 0.0000], dtype=torch.float64)
        >>> frequency_response(torch.tensor([[0.0, 1.0], [0.0, 0.0]]), lam)
        tensor([[-1.0000,  0.0000,  0.5000,  1.0000],
                [ 0.0000,  0.0000,  0.0000,  0.0000]], dtype=torch.float64)
    """
    if not isinstance(coeffs, Tensor) or coeffs.ndim not in (1, 2) or coeffs.shape[-1] == 0:
        got = tuple(coeffs.shape) if isinstance(coeffs, Tensor) else type(coeffs).__name__
        raise ValueError(f"coeffs must be a tensor of shape (K+1,) or (G, K+1), got {got}")
    if not isinstance(lambdas, Tensor) or lambdas.ndim != 1:
        got = tuple(lambdas.shape) if isinstance(lambdas, Tensor) else type(lambdas).__name__
        raise ValueError(f"lambdas must be a tensor of shape (L,), got {got}")
    for name, t in (("coeffs", coeffs), ("lambdas", lambdas)):
        _check_dense(t, name)
        if t.is_floating_point() or t.is_complex():  # else f(lambda) is a silent NaN, as nowhere else here
            if checks_values(t) and not bool(torch.isfinite(t).all()):
                raise ValueError(f"{name} holds NaN or inf values: the frequency response is undefined for them")
    dtype = torch.complex128 if (coeffs.is_complex() or lambdas.is_complex()) else torch.float64
    c = coeffs.to(dtype).unsqueeze(-1)  # (..., K+1, 1)
    lam = lambdas.to(device=coeffs.device, dtype=dtype)  # (L,)
    K = c.shape[-2] - 1
    # a copy: for K = 0 the expanded c_0 was returned as is, a stride-0 view (of coeffs itself for float64
    # coeffs) that in-place ops refuse or write through to the caller's coefficients
    f = c[..., K, :].expand(*c.shape[:-2], lam.shape[0]).clone()
    for k in range(K - 1, -1, -1):
        f = f * lam + c[..., k, :]
    return f


def eigenvalues_of(P: Tensor) -> Tensor:
    r"""Eigenvalues ``lambda`` of ``P`` (``det(P - lambda I) = 0``), complex, computed in float64.

    Sorted by decreasing real part, ties by decreasing imaginary part. Attention matrices
    are row-stochastic but not symmetric, so their eigenvalues are complex in general
    (inside the unit disc, with ``lambda = 1`` for the constant vector); read an operator's
    effect at them with ``frequency_response(coeffs, eigenvalues_of(P))``.

    Args:
        P: square matrices (e.g. one attention map per head).

    Shapes:
        P: ``(..., T, T)`` -> ``(..., T)`` complex128.

    Examples:
        >>> eigenvalues_of(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
        tensor([ 1.+0.j, -1.+0.j], dtype=torch.complex128)
    """
    _check_float(P, "P", tuple(range(2, 9)), "(..., T, T)")
    if P.shape[-1] != P.shape[-2]:
        raise ValueError(f"P must be square (..., T, T), got shape {tuple(P.shape)}")
    lam = torch.linalg.eigvals(P.to(torch.float64))
    lam = lam.gather(-1, lam.imag.argsort(dim=-1, descending=True, stable=True))
    return lam.gather(-1, lam.real.argsort(dim=-1, descending=True, stable=True))
