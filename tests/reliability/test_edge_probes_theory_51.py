"""The theory pages' mathematical claims (docs/theory/*.rst, operator docstrings) checked in float64.

Every reference here is built from explicit matrices (``torch.linalg.matrix_exp``, ``torch.linalg.solve``,
eigen-decompositions, hand-written recursions) or from ``scipy.special``, never from the library's own paths.

Bugs found and fixed:

* ``heat_truncation_error`` and ``heat_steps_for_tolerance`` computed the Poisson tail as ``1 - sum of weights``,
  which cancels to 0 once the tail is below float64's eps: the "bound" read 0 for ``t = 1e-9, K = 1`` (tail
  5e-19) and, times ``e^(2|t|)`` for a sharpening head, 0 for ``t = -30, K = 100`` where the stated bound is 248;
  ``heat_steps_for_tolerance(-20, 1e-4)`` returned ``K = 66`` whose bound is 27.7.
* ``ppr_steps_for_tolerance(0.95, 0.1)`` returned ``K = 1`` although ``2 (1 - 0.95) = 0.1000000000000001 > 0.1``,
  so ``PPROperator(alpha=0.95, steps=None, tol=0.1)`` refused its own choice ("steps=1 would do").
* ``HeatOperator(t<0, learnable=True, steps=None)`` chose ``K`` at the positive ``max(2|t|, 1)`` only, missing the
  ``e^(2|t|)`` of a sharpening bound: ``t = -15`` got ``K = 52``, truncation error 0.23 against ``tol = 1e-4``.

Docs corrected: docs/theory/heat.rst's Euler argument ("both steps have norm at most one", so the error is at most
``K 2 h^2 e^{2h}``) holds for ``0 <= t <= K`` only; for ``t < 0`` the step norms reach ``e^{2|h|}`` and only the
final ``2 t^2 e^{2|t|} / K`` is a bound (pinned below).
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.functional import diffuse
from diffusionformer.operators import (DifferentialOperator, ExactHeatOperator, ExactPPROperator, HeatOperator,
                                       PolynomialOperator, PPROperator, build_operator, chebyshev_matrix,
                                       heat_coefficients, heat_steps_for_tolerance, heat_truncation_error,
                                       lambda_init_schedule, ppr_coefficients, ppr_steps_for_tolerance)
from diffusionformer.ops.rivals import RivalContext

sps = pytest.importorskip("scipy.special")

F64 = torch.float64


def _P(N: int, seed: int, sharp: float = 1.0, causal: bool = False) -> torch.Tensor:
    s = sharp * torch.randn(N, N, generator=torch.Generator().manual_seed(seed), dtype=F64)
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1)


SWAP = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=F64)  # eigenvalue -1: where the heat bounds are attained
PS = {"random": _P(7, 0), "peaked": _P(7, 1, sharp=12.0), "uniform": torch.full((5, 5), 0.2, dtype=F64),
      "causal": _P(6, 2, causal=True), "one-token": torch.ones(1, 1, dtype=F64), "swap": SWAP}


def _series(P: torch.Tensor, c) -> torch.Tensor:
    out, Pk = torch.zeros_like(P), torch.eye(P.shape[-1], dtype=F64)
    for ck in c:
        out, Pk = out + float(ck) * Pk, Pk @ P
    return out


def _inf(A: torch.Tensor) -> float:
    return A.abs().sum(-1).max().item()


def _tail(t: float, K: int) -> float:
    """Pr[Poisson(|t|) > K] from scipy, times e^(2|t|) for t < 0: the bound docs/theory/heat.rst states."""
    return float(sps.gammainc(K + 1, abs(t))) * (math.exp(2 * abs(t)) if t < 0 else 1.0)


# ----------------------------------------------------------------------------------------------------- bugs


def test_heat_truncation_bound_is_the_poisson_tail_below_eps():
    """Bug: ``heat_truncation_error`` read the Poisson tail as ``1 - sum(weights)``, which cancels to 0 below
    float64's eps: 0 at ``t = 1e-9, K = 1`` (tail 5e-19), 0 at ``t = -30, K = 100`` (stated bound 248, since the
    tail 2.2e-24 is multiplied by e^60), so a sharpening head with a far too short series reported no error."""
    for t in (1e-12, 1e-9, 1e-6, 1e-3, 0.5, 1.0, 2.0, 5.0, 30.0, -1e-9, -0.5, -2.0, -5.0, -20.0, -30.0):
        for K in (0, 1, 2, 5, 14, 20, 21, 40, 100, 256):
            got = heat_truncation_error(torch.tensor(t, dtype=F64), K).item()
            assert got == pytest.approx(_tail(t, K), rel=1e-9, abs=0.0), (t, K)
    # per head, and exact at the ends: t = 0 (the identity) and a series that lost everything (t = 50, K = 4)
    got = heat_truncation_error(torch.tensor([0.0, 50.0, -1.0], dtype=F64), 4)
    assert got[0].item() == 0.0 and got[1].item() == pytest.approx(1.0, abs=1e-15)
    assert got[2].item() == pytest.approx(_tail(-1.0, 4), rel=1e-12)
    op = HeatOperator(t=-30.0, steps=100, min_t=-40.0, tol=1e3)
    assert op.truncation_error().item() == pytest.approx(_tail(-30.0, 100), rel=1e-9)  # 248, was 0
    with pytest.raises(ValueError, match="exceeds tol"):
        HeatOperator(t=-30.0, steps=100, min_t=-40.0, tol=1e-3)  # was accepted


def test_heat_steps_for_tolerance_meets_the_stated_bound():
    """Bug: ``heat_steps_for_tolerance`` stopped when ``1 - cdf`` rounded to 0: ``(-20, 1e-4)`` gave ``K = 66``
    whose stated bound ``e^40 Pr[Poisson(20) > 66]`` is 27.7, ``(1e-9, 1e-20)`` gave ``K = 1`` (bound 5e-19), so
    ``HeatOperator(steps=None, tol=...)`` built heads far outside their tolerance."""
    for t in (1e-9, 1e-6, 1e-3, 0.5, 2.0, 10.0, -1e-6, -0.5, -2.0, -10.0, -20.0):
        for tol in (1e-20, 1e-16, 1e-12, 1e-8, 1e-4, 0.3):
            try:
                K = heat_steps_for_tolerance(t, tol)
            except ValueError:  # more than 256 steps: then even K = 256 misses tol
                assert _tail(t, 256) > tol, (t, tol)
                continue
            assert _tail(t, K) <= tol * (1 + 1e-9), (t, tol, K)
            assert K == 0 or _tail(t, K - 1) > tol * (1 - 1e-9), (t, tol, K)  # the smallest
            # what it picks, an explicit steps=K with the same tol accepts (the same bound, bit for bit)
            assert heat_truncation_error(torch.tensor(t, dtype=F64), K).item() <= tol
    op = HeatOperator(t=-20.0, steps=None, min_t=-40.0)
    assert _tail(-20.0, op.steps) <= 1e-4 < _tail(-20.0, op.steps - 1)  # was K = 66: bound 27.7


def test_ppr_steps_for_tolerance_on_the_bound_the_operator_checks():
    """Bug: ``ppr_steps_for_tolerance(0.95, 0.1)`` returned ``K = 1`` from rounded logarithms although
    ``2 (1 - 0.95) = 0.1000000000000001 > 0.1``, so ``PPROperator(alpha=0.95, steps=None, tol=0.1)`` refused its
    own choice ("truncation error 0.1 exceeds tol=0.1; steps=1 would do"); other inputs got one step too many."""
    assert ppr_steps_for_tolerance(0.95, 0.1) == 2
    assert PPROperator(alpha=0.95, steps=None, tol=0.1).steps == 2
    assert PPROperator(alpha=0.99, steps=None, tol=2e-6).steps == ppr_steps_for_tolerance(0.99, 2e-6)
    for i in range(1, 1000, 7):
        alpha = i / 1000
        for tol in (1e-1, 2e-2, 5e-3, 1e-4, 2e-6, 1e-8, 1e-12, 5e-20):
            K = ppr_steps_for_tolerance(alpha, tol)
            assert 2 * (1 - alpha) ** K <= tol and (K == 1 or 2 * (1 - alpha) ** (K - 1) > tol), (alpha, tol, K)


# ------------------------------------------------------------------------------------------ corrected docs


def test_euler_bound_needs_the_step_norms_for_negative_t():
    """docs/theory/heat.rst (corrected): the per-step sum ``K 2 h^2 e^{2|h|}`` bounds the Euler error only for
    ``0 <= t <= K`` (both steps have norm one); for ``t < 0`` the steps have norm up to ``e^{2|h|}`` and only
    ``2 t^2 e^{2|t|} / K``, what ``heat_truncation_error`` returns, is a bound (here on the swap matrix)."""
    for name, P in PS.items():
        I = torch.eye(P.shape[0], dtype=F64)
        for t in (-3.0, -1.0, -0.1, 0.0, 0.1, 0.5, 1.0, 2.0, 5.0):
            exact = torch.linalg.matrix_exp(-t * (I - P))
            for K in (1, 2, 3, 5, 10, 40):
                err = _inf(_series(P, heat_coefficients(torch.tensor(t, dtype=F64), K, "euler")) - exact)
                assert err <= 2 * t * t * math.exp(2 * abs(t)) / K * (1 + 1e-9) + 1e-13, (name, t, K)
                assert heat_truncation_error(torch.tensor(t, dtype=F64), K, "euler").item() == pytest.approx(
                    2 * t * t * math.exp(2 * abs(t)) / K, rel=1e-12)
                h = t / K
                if 0 <= t <= K:
                    assert err <= K * 2 * h * h * math.exp(2 * h) * (1 + 1e-9) + 1e-13, (name, t, K)
    t, K = -1.0, 10
    err = _inf(_series(SWAP, heat_coefficients(torch.tensor(t, dtype=F64), K, "euler")) - torch.linalg.matrix_exp(-t * (torch.eye(2, dtype=F64) - SWAP)))
    assert err > 4 * K * 2 * (t / K) ** 2 * math.exp(2 * abs(t / K))  # 1.197 against the per-step sum 0.244


# ---------------------------------------------------------------------------------------------- heat claims


def test_taylor_bound_and_kernel_laws_on_explicit_matrices():
    """The Taylor bound over every P kind (peaked, uniform, causal, N = 1, eigenvalue -1), t near 0 and K = 0/1;
    K_t row-stochastic and positive for t >= 0, semigroup, frequency response e^{-t(1-lambda)}, and the Euler
    weights non-negative summing to one for 0 <= t <= K."""
    for name, P in PS.items():
        N = P.shape[0]
        I = torch.eye(N, dtype=F64)
        for t in (-2.0, -0.5, 0.0, 1e-8, 1e-3, 0.3, 1.0, 4.0):
            exact = torch.linalg.matrix_exp(-t * (I - P))
            for K in (0, 1, 2, 5, 12):
                err = _inf(_series(P, heat_coefficients(torch.tensor(t, dtype=F64), K)) - exact)
                assert err <= heat_truncation_error(torch.tensor(t, dtype=F64), K).item() * (1 + 1e-9) + 1e-14, (name, t, K)
            if t >= 0:
                assert torch.allclose(exact.sum(-1), torch.ones(N, dtype=F64), atol=1e-13)
                assert (exact >= -1e-15).all()
        lam, U = torch.linalg.eig(P)
        for t in (-1.0, 0.7):
            K_t = torch.linalg.matrix_exp(-t * (I - P)).to(torch.complex128)
            assert torch.allclose(K_t @ U, U * torch.exp(-t * (1 - lam)), atol=1e-10), name
        Ka, Kb = (torch.linalg.matrix_exp(-s * (I - P)) for s in (0.4, 0.9))
        assert torch.allclose(Ka @ Kb, torch.linalg.matrix_exp(-1.3 * (I - P)), atol=1e-12)
    for K in (1, 2, 5, 16):
        for t in (0.0, 0.5 * K, float(K)):
            c = heat_coefficients(torch.tensor(t, dtype=F64), K, "euler")
            assert (c >= 0).all() and c.sum().item() == pytest.approx(1.0, abs=1e-13)
            ref = [math.comb(K, k) * (1 - t / K) ** (K - k) * (t / K) ** k for k in range(K + 1)]
            assert c.tolist() == pytest.approx(ref, rel=1e-12, abs=1e-300)
        c = heat_coefficients(torch.tensor(1.0, dtype=F64), K)  # Taylor: the Poisson pmf, summing to 1 - tail
        assert c.tolist() == pytest.approx([math.exp(-1) / math.factorial(k) for k in range(K + 1)], rel=1e-13)
        assert 1 - c.sum().item() == pytest.approx(_tail(1.0, K), rel=1e-6, abs=1e-16)
    # the exact operator agrees with matrix_exp, also on a padded (all-zero) row: e^{-t} v_i there
    P = _P(5, 3)
    P[2] = 0.0
    v = torch.randn(1, 1, 5, 3, generator=torch.Generator().manual_seed(4), dtype=F64)
    out = ExactHeatOperator(t=0.8).apply_matrix(P[None, None], v)[0, 0]
    assert torch.allclose(out, torch.linalg.matrix_exp(-0.8 * (torch.eye(5, dtype=F64) - P)) @ v[0, 0], atol=1e-13)
    assert torch.allclose(out[2], math.exp(-0.8) * v[0, 0, 2], atol=1e-14)


# ----------------------------------------------------------------------------------------------- PPR claims


def test_ppr_series_exact_solve_and_bound():
    """APPNP unrolled by hand equals ``ppr_coefficients``; weights sum to 1; distance to
    ``alpha (I - (1-alpha) P)^{-1}`` at most ``2 (1-alpha)^K``; the exact operator is row-stochastic,
    non-negative, lower triangular under a causal mask, ``alpha v_i`` on a padded row, identity at alpha = 1."""
    for name, P in PS.items():
        N = P.shape[0]
        I = torch.eye(N, dtype=F64)
        for alpha in (1e-9, 1e-3, 0.1, 0.5, 0.95, 1.0):
            exact = alpha * torch.linalg.solve(I - (1 - alpha) * P, I)
            for K in (1, 2, 5, 20):
                c = ppr_coefficients(torch.tensor(alpha, dtype=F64), K)
                Z = I.clone()
                for _ in range(K):  # Z_{k+1} = (1 - alpha) P Z_k + alpha I, Z_0 = I
                    Z = (1 - alpha) * P @ Z + alpha * I
                assert torch.allclose(_series(P, c), Z, atol=1e-13), (name, alpha, K)
                assert c.sum().item() == pytest.approx(1.0, abs=1e-14) and (c >= 0).all()
                assert _inf(Z - exact) <= 2 * (1 - alpha) ** K + 1e-12 / alpha, (name, alpha, K)
            if alpha >= 1e-3:
                assert torch.allclose(exact.sum(-1), torch.ones(N, dtype=F64), atol=1e-12) and (exact >= -1e-13).all()
                got = ExactPPROperator(alpha=alpha).apply_matrix(P[None, None], I[None, None])[0, 0]
                assert torch.allclose(got, exact, atol=1e-10), (name, alpha)
                if name == "causal":  # forward substitution: exactly lower triangular (LU: to rounding)
                    got = ExactPPROperator(alpha=alpha).apply_causal_matrix(P[None, None], I[None, None])[0, 0]
                    assert (got.triu(1) == 0).all() and torch.allclose(got, exact, atol=1e-10)
    assert torch.equal(ppr_coefficients(torch.tensor(1.0, dtype=F64), 3), torch.tensor([1.0, 0, 0, 0], dtype=F64))
    P = _P(4, 5)
    P[1] = 0.0
    v = torch.randn(1, 1, 4, 2, generator=torch.Generator().manual_seed(6), dtype=F64)
    assert torch.allclose(ExactPPROperator(alpha=0.3).apply_matrix(P[None, None], v)[0, 0, 1], 0.3 * v[0, 0, 1])
    # eigen-response alpha / (1 - (1 - alpha) lambda)
    P = _P(6, 7)
    lam, U = torch.linalg.eig(P)
    M = (0.2 * torch.linalg.solve(torch.eye(6, dtype=F64) - 0.8 * P, torch.eye(6, dtype=F64))).to(torch.complex128)
    assert torch.allclose(M @ U, U * (0.2 / (1 - 0.8 * lam)), atol=1e-10)


# ---------------------------------------------------------------------------------- Laplacian, padded rows


def test_laplacian_spectrum_row_sums_and_padded_rows_through_diffuse():
    """``(I - P) 1 = 0``; eigenvalues of ``I - P`` are ``1 - lambda(P)`` in the disc |z - 1| <= 1 (so
    Re >= 0); shift invariance; through :func:`diffuse` with a fully masked query row, attention gives 0, the
    Laplacian ``v_i`` and heat ``c_0 v_i`` (the docs: an all-zero row of P, never NaN); causal keeps i <= j."""
    for name, P in PS.items():
        N = P.shape[0]
        L = torch.eye(N, dtype=F64) - P
        assert torch.allclose(L.sum(-1), torch.zeros(N, dtype=F64), atol=1e-14)
        mu = torch.linalg.eigvals(L)
        assert ((mu - 1).abs() <= 1 + 1e-12).all() and (mu.real >= -1e-12).all(), name
        assert torch.allclose(torch.sort(mu.real).values, torch.sort(1 - torch.linalg.eigvals(P).real).values, atol=1e-10)
    g = torch.Generator().manual_seed(8)
    q, k, v = torch.randn(3, 1, 1, 6, 4, generator=g, dtype=F64)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    mask[3] = False  # a query that may attend nowhere
    P = torch.softmax((q[0, 0] @ k[0, 0].T / 2.0).masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
    shift = torch.full((1, 1, 1, 4), 5.0, dtype=F64)
    for coeffs in ([0.0, 1.0], [1.0, -1.0], heat_coefficients(torch.tensor(0.7, dtype=F64), 6).tolist()):
        out = diffuse(q, k, v, torch.tensor(coeffs, dtype=F64), attn_mask=mask)[0, 0]
        assert torch.isfinite(out).all()
        assert torch.allclose(out, _series(P, coeffs) @ v[0, 0], atol=1e-12), coeffs
        assert torch.allclose(out[3], coeffs[0] * v[0, 0, 3], atol=1e-14)
    lap = diffuse(q, k, v, torch.tensor([1.0, -1.0], dtype=F64), is_causal=True)
    assert torch.allclose(diffuse(q, k, v + shift, torch.tensor([1.0, -1.0], dtype=F64), is_causal=True), lap, atol=1e-12)
    assert torch.allclose(lap[0, 0, 0], torch.zeros(4, dtype=F64), atol=1e-14)  # the first causal token sees itself


# ------------------------------------------------------------------------------------ Chebyshev, polynomial


def test_chebyshev_matrix_claims():
    """Row k holds T_k (= cos(k arccos x) on [-1, 1]), lower triangular with M_kk = 2^{k-1}; T_10 =
    512 x^10 - 1280 x^8 + ...; monomial weights grow like (1 + sqrt 2)^k ~ 2.4^k; float64 overflows from K = 810
    exactly; the Chebyshev polynomial operator equals sum theta_k T_k(P) by the matrix recursion."""
    M = chebyshev_matrix(24)
    x = torch.linspace(-1, 1, 41, dtype=F64)
    powers = x[:, None] ** torch.arange(25, dtype=F64)
    for k in range(25):
        assert torch.allclose(powers @ M[k], torch.cos(k * torch.arccos(x)), atol=1e-9), k
        assert k == 0 or M[k, k].item() == 2.0 ** (k - 1)
    assert torch.equal(M, M.tril())
    assert M[10, 10].item() == 512 and M[10, 8].item() == -1280
    growth = M[24].abs().max().item() ** (1 / 24)
    assert 2.2 < growth < 1 + math.sqrt(2)
    assert torch.isfinite(chebyshev_matrix(809)).all() and not torch.isfinite(chebyshev_matrix(810)).all()
    with pytest.raises(ValueError, match="810"):
        PolynomialOperator(steps=810, basis="chebyshev")
    torch.manual_seed(0)
    op = PolynomialOperator(steps=5, init=[0.3, -0.2, 0.5, 0.1, -0.4, 0.2], basis="chebyshev").double()
    P = _P(5, 9)
    T = [torch.eye(5, dtype=F64), P]
    for _ in range(4):
        T.append(2 * P @ T[-1] - T[-2])
    f_cheb = sum(th * Tk for th, Tk in zip(op.theta[0].tolist(), T))
    assert torch.allclose(_series(P, op.coefficients()[0].tolist()), f_cheb, atol=1e-12)
    assert torch.allclose(f_cheb, _series(P, [0.3, -0.2, 0.5, 0.1, -0.4, 0.2]), atol=1e-12)  # init: monomial


# ------------------------------------------------------------------------------------------------- rivals


def test_rival_formulas_against_their_equations():
    """attnscale ``DC v + (1+omega)(P v - DC v)`` with DC the admissible-key mean (causal: cumulative mean);
    neutreno ``P v + lam (v0 - v)``; value residual ``P (v + lam v1)``; differential
    ``(1 - lambda_init) RMSNorm((P1 - lambda P2) v)`` with half-width maps at scale (C/2)^-1/2; the schedule
    ``0.8 - 0.6 e^{-0.3 l}`` and the 3C parameters."""
    g = torch.Generator().manual_seed(10)
    B, G, N, C = 1, 2, 5, 8
    q, k, v, v0 = torch.randn(4, B, G, N, C, generator=g, dtype=F64)
    causal = torch.ones(N, N, dtype=torch.bool).tril()

    def P_of(qq, kk, scale):
        return torch.softmax((qq @ kk.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf")), -1)

    P = P_of(q, k, C**-0.5)
    DC = causal.to(F64) / causal.sum(-1, keepdim=True)
    ctx = RivalContext.dense(q, k, v, is_causal=True, v0=v0)
    op = build_operator("attnscale", omega=0.7, num_heads=G).double()
    assert torch.allclose(op.apply_context(ctx), DC @ v + 1.7 * (P @ v - DC @ v), atol=1e-12)
    assert torch.allclose(build_operator("neutreno", lam=0.6).apply_context(ctx), P @ v + 0.6 * (v0 - v), atol=1e-12)
    assert torch.allclose(build_operator("value-residual", lam=0.5).apply_context(ctx), P @ (v + 0.5 * v0), atol=1e-12)
    assert torch.allclose(build_operator("neutreno", lam=0.6).apply_context(RivalContext.dense(q, k, v, is_causal=True)),
                          P @ v, atol=1e-12)  # no state: plain attention
    for depth in range(6):
        assert lambda_init_schedule(depth) == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * depth), rel=1e-15)
    torch.manual_seed(1)
    d = DifferentialOperator(depth=3, head_dim=C).double()
    assert sum(p.numel() for p in d.parameters()) == 3 * C
    with torch.no_grad():
        d.subln.weight.uniform_(0.5, 1.5)
    lam = (torch.exp((d.lambda_q1 * d.lambda_k1).sum()) - torch.exp((d.lambda_q2 * d.lambda_k2).sum())
           + 0.8 - 0.6 * math.exp(-0.9)).item()
    h = C // 2
    y = P_of(q[..., :h], k[..., :h], h**-0.5) @ v - lam * P_of(q[..., h:], k[..., h:], h**-0.5) @ v
    ref = y / torch.sqrt((y * y).mean(-1, keepdim=True) + 1e-5) * d.subln.weight.detach() * (1 - lambda_init_schedule(3))
    assert torch.allclose(d.apply_context(ctx), ref, atol=1e-12)
    # rows of P1 - lambda P2 sum to 1 - lambda
    D = P_of(q[..., :h], k[..., :h], h**-0.5) - lam * P_of(q[..., h:], k[..., h:], h**-0.5)
    assert torch.allclose(D.sum(-1), torch.full_like(D.sum(-1), 1 - lam), atol=1e-13)


# ------------------------------------------------------------------------------------- parameter domains


@pytest.mark.parametrize("build", [
    lambda: PPROperator(alpha=0.0), lambda: PPROperator(alpha=1.0 + 1e-12), lambda: PPROperator(alpha=-0.1),
    lambda: PPROperator(alpha=1.0, learnable=True), lambda: ExactPPROperator(alpha=0.0),
    lambda: ExactPPROperator(alpha=1.5), lambda: HeatOperator(t=-2.5), lambda: HeatOperator(t=float("nan")),
    lambda: HeatOperator(t=1.0, min_t=float("nan")), lambda: HeatOperator(t=3.0, steps=2, method="euler"),
    lambda: ExactHeatOperator(t=-40.5), lambda: DifferentialOperator(lambda_init=1.0),
    lambda: DifferentialOperator(depth=-1), lambda: chebyshev_matrix(-1), lambda: ppr_steps_for_tolerance(0.0, 1e-3),
    lambda: heat_steps_for_tolerance(1.0, 0.0), lambda: heat_truncation_error(torch.tensor(1.0), -1),
])
def test_documented_domains_are_refused_outside(build):
    """alpha in (0, 1] (learnable: below 1), t >= min_t (default -2), heat-exact t >= -40, Euler K >= t,
    lambda_init != 1, depth >= 0, steps >= 0, tol > 0: each constructor refuses what its docs exclude."""
    with pytest.raises(ValueError):
        build()


def test_documented_domains_accepted_at_their_edges():
    """The edges the docs include: alpha = 1 (identity), tiny alpha, t = min_t, t = K for Euler, t = -40 exact."""
    assert PPROperator(alpha=1.0, steps=3).coefficients().tolist() == [1.0, 0.0, 0.0, 0.0]
    assert PPROperator(alpha=1e-6, steps=4).coefficients()[-1].item() == pytest.approx(1 - 4e-6, rel=1e-6)
    assert HeatOperator(t=-2.0, steps=12).coefficients().tolist() == pytest.approx(
        [math.exp(2.0) * (-2.0) ** j / math.factorial(j) for j in range(13)], rel=1e-6)
    c = HeatOperator(t=4.0, steps=4, method="euler").coefficients()
    assert c.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]  # t = K: P^K, still stochastic
    ExactHeatOperator(t=-40.0)
    assert HeatOperator(t=0.0, steps=0).coefficients().tolist() == [1.0]


def test_learnable_sharpening_heat_meets_tol_at_its_initial_time():
    """Bug: ``HeatOperator(t, learnable=True, steps=None)`` chose ``K`` from the bound at the positive
    ``max(2|t|, 1)`` alone, but a sharpening ``t < 0`` has the bound ``e^{2|t|} Pr[Poisson(|t|) > K]``: ``t = -15``
    (``min_t=-20``) got ``K = 52`` whose bound at ``t = -15`` is 0.23, against the default ``tol = 1e-4``."""
    for t in (-15.0, -10.0, -5.0, -2.0, -0.5, 0.5, 3.0):
        op = HeatOperator(t=t, learnable=True, min_t=-20.0)
        assert _tail(t, op.steps) <= 1e-4 and _tail(max(2 * abs(t), 1.0), op.steps) <= 1e-4, (t, op.steps)
        assert op.truncation_error().item() <= 1e-4
        fixed = HeatOperator(t=t, min_t=-20.0)
        assert op.steps >= fixed.steps and _tail(t, fixed.steps - 1) > 1e-4  # the fixed one: smallest at t


def test_grand_nl_sparse_isolated_nodes_and_attnscale_key_padding():
    """GRAND-nl Euler/RK4 against a hand-written integration of ``q, k, v' = (P(q, k) - I)(q, k, v)`` (Euler
    t = 1, K = 1 is one attention step); on the sparse back-end a node with no incoming edge gets an all-zero
    row (output ``c_0 v_i``, never NaN); AttnScale's DC under key padding averages the admissible keys only."""
    from diffusionformer.functional import diffuse_sparse

    g = torch.Generator().manual_seed(11)
    q, k, v = torch.randn(3, 1, 2, 5, 4, generator=g, dtype=F64)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()

    def rhs(s):
        P = torch.softmax((s[0] @ s[1].transpose(-1, -2) / 2.0).masked_fill(~causal, float("-inf")), -1)
        return tuple(P @ z - z for z in s)

    for method, K, t in (("euler", 1, 1.0), ("euler", 3, 2.0), ("rk4", 2, 1.5)):
        out = build_operator("grand-nl", t=t, steps=K, method=method).apply_context(
            RivalContext.dense(q, k, v, is_causal=True))
        x, h = (q, k, v), t / K
        for _ in range(K):
            if method == "euler":
                x = tuple(a + h * b for a, b in zip(x, rhs(x)))
            else:
                k1 = rhs(x)
                k2 = rhs(tuple(a + h / 2 * b for a, b in zip(x, k1)))
                k3 = rhs(tuple(a + h / 2 * b for a, b in zip(x, k2)))
                k4 = rhs(tuple(a + h * b for a, b in zip(x, k3)))
                x = tuple(a + h / 6 * (b + 2 * c + 2 * d + e) for a, b, c, d, e in zip(x, k1, k2, k3, k4))
        assert torch.allclose(out, x[2], atol=1e-12), (method, K, t)
    edges = torch.tensor([[0, 1, 2, 0], [1, 2, 0, 2]])  # node 3 has no incoming edge
    qs, ks, vs = torch.randn(3, 4, 1, 3, generator=g, dtype=F64)
    for c in ([0.0, 1.0], [1.0, -1.0], [0.3, 0.5, 0.2]):
        out = diffuse_sparse(qs, ks, vs, edges, torch.tensor(c, dtype=F64), num_nodes=4)
        assert torch.isfinite(out).all() and torch.allclose(out[3, 0], c[0] * vs[3, 0], atol=1e-15)
    keep = torch.tensor([True, True, False, True, False])
    pad = keep.view(1, 1, 1, 5)
    op = build_operator("attnscale", omega=-0.4).double()
    P = torch.softmax((q @ k.transpose(-1, -2) / 2.0).masked_fill(~pad, float("-inf")), -1)
    DC = keep.to(F64).expand(5, 5) / keep.sum()
    assert torch.allclose(op.apply_context(RivalContext.dense(q, k, v, attn_mask=pad)),
                          DC @ v + 0.6 * (P @ v - DC @ v), atol=1e-12)


def test_heat_weights_differentiable_at_zero_time():
    """heat_coefficients: 'the gradient in t is finite everywhere, t = 0 included' (both forms, K <= 20 and the
    running product beyond): d/dt sum_k k c_k = d/dt E[Poisson(t)] = 1 (Euler: d/dt K (t/K) = 1)."""
    for K in (1, 5, 25):
        for method in ("taylor", "euler"):
            t = torch.zeros(2, dtype=F64, requires_grad=True)
            c = heat_coefficients(t, K, method)
            (grad,) = torch.autograd.grad((c * torch.arange(K + 1, dtype=F64)).sum(), t)
            assert torch.allclose(grad, torch.ones(2, dtype=F64), atol=1e-14), (K, method)
