"""Mutation audit (sitting 49) of the operator core: operators/base.py, heat.py, ppr.py, ppr_exact.py, polynomial.py
and differential.py: tests that kill mutants the earlier tests left alive (each docstring names the mutant). The
references are written out by hand in float64 (Poisson weights term by term, APPNP weights, ``torch.linalg.solve`` of
``I - (1-alpha) P``, ``torch.linalg.matrix_exp``, the Chebyshev recursion). No GPU is used.

79 mutants (base.py 13, heat.py 23, ppr.py 12, ppr_exact.py 9, polynomial.py 12, differential.py 10): 70 killed by
earlier tests, 7 survivors killed here (heat.py 4, ppr.py 1, ppr_exact.py 1, polynomial.py 1), 2 equivalent:

* ppr.py ``ppr_steps_for_tolerance`` ``tol >= 2.0`` -> ``tol > 2.0``: at ``tol = 2`` the general formula gives
  ``log(tol / 2) / log1p(-alpha) = 0``, ``ceil(0 - 1e-12) = 0`` and ``max(1, 0) = 1``, the early return's value.
* polynomial.py ``_materialise_caches`` ``(M.is_meta or M.dtype != work)`` -> ``M.is_meta`` (a float32 Chebyshev
  basis kept beside float64 weights assigned by ``load_state_dict(..., assign=True)``): the basis holds the integer
  monomial weights of ``T_k``, exact in float32 for every ``K`` up to 32 (checked; the docstring advises ``K <= 24``),
  and :meth:`coefficients` casts it to the float64 working dtype, so the coefficients are the same bits.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.operators.heat import ExactHeatOperator, HeatOperator, heat_coefficients


@pytest.mark.parametrize("steps", [21, 24])
def test_kills_heat_taylor_huge_learned_time_gives_zero_weights_not_nan(steps):
    """kills: operators/heat.py ``heat_coefficients`` ``if steps > _VECTOR_STEPS:`` -> ``if steps >= _VECTOR_STEPS +
    5:`` (K = 21..24 took the vector of powers: ``t^K`` overflowed to inf for a time that diverged to 1e14 (a learned
    ``t`` has no upper bound), and ``e^-t * inf`` made NaN weights instead of the kernel's vanishing ones). The
    running product keeps every weight finite: 0 here, as ``e^-t t^k / k!`` is in float64."""
    c = heat_coefficients(torch.tensor(1e14, dtype=torch.float64), steps)
    assert c.shape == (steps + 1,)
    assert torch.equal(c, torch.zeros(steps + 1, dtype=torch.float64))
    # and below the overflow the running product is the Poisson weights, term by term
    t = 3.0
    want = torch.tensor([math.exp(-t) * t**k / math.factorial(k) for k in range(steps + 1)], dtype=torch.float64)
    torch.testing.assert_close(heat_coefficients(torch.tensor(t, dtype=torch.float64), steps), want, rtol=1e-13,
                               atol=0)


def test_kills_heat_euler_refuses_a_time_just_above_its_steps():
    """kills: operators/heat.py ``_check_truncation`` ``if t > steps:`` -> ``if t > steps + 1:`` (``heat(t=2.5,
    steps=2, method='euler')`` was built: its step weight on ``I`` is 1 - t/K = -0.25, the sign-alternating product
    the docstring refuses). ``t = K`` is still taken, and its weights are the binomial ones (all non-negative)."""
    with pytest.raises(ValueError, match=r"the Euler product needs steps >= t .*1 - t/K = -0\.25.*steps=3 would do"):
        HeatOperator(t=2.5, steps=2, method="euler")
    c = HeatOperator(t=2.0, steps=2, method="euler").coefficients().double()
    torch.testing.assert_close(c, torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), rtol=0, atol=1e-7)


def test_kills_heat_euler_explicit_steps_bound_by_a_given_tol():
    """kills: operators/heat.py ``_check_truncation`` (Euler) ``if err > tol:`` -> ``if err > 2 * tol:`` (an
    explicit ``steps`` whose error bound 2 t^2 e^(2|t|) / K exceeded the given ``tol`` by less than twice was built,
    against the docstring's "an explicit ``steps`` must meet it"). t = 0.5, K = 8: bound e / 16 = 0.170."""
    bound = 2 * 0.25 * math.e / 8
    with pytest.raises(ValueError, match=r"truncation error bound 0\.17 exceeds tol=0\.1"):
        HeatOperator(t=0.5, steps=8, method="euler", tol=0.1)
    op = HeatOperator(t=0.5, steps=8, method="euler", tol=bound * 1.001)  # just met: taken
    assert float(op.truncation_error()) == pytest.approx(bound, rel=1e-12)


def test_kills_heat_exact_lowest_time_is_minus_40():
    """kills: operators/heat.py ``ExactHeatOperator.__init__`` ``if t < EXACT_MIN_T:`` -> ``t < EXACT_MIN_T - 10``
    (``heat-exact(t=-45)`` was built: its kernel grows like e^(2|t|) = 8e38, past float32's range, so a float32
    layer outputs inf). ``t = -40`` is taken, and its kernel is torch's ``matrix_exp`` of the hand-built matrix."""
    for t in (-40.5, -45.0):
        with pytest.raises(ValueError, match=r"t must be >= -40"):
            ExactHeatOperator(t=t)
    op = ExactHeatOperator(t=-40.0).double()
    P = torch.tensor([[0.5, 0.5], [0.25, 0.75]], dtype=torch.float64)
    v = torch.tensor([[1.0], [-2.0]], dtype=torch.float64)
    want = torch.linalg.matrix_exp(40.0 * (torch.eye(2, dtype=torch.float64) - P)) @ v
    got = op.apply_matrix(P[None, None], v[None, None])[0, 0]
    torch.testing.assert_close(got, want, rtol=1e-9, atol=0)


def test_kills_ppr_reset_parameters_restores_alpha_not_its_logit():
    """kills: operators/ppr.py ``PPROperator.reset_parameters`` ``fill_(math.log(alpha0 / (1 - alpha0)))`` ->
    ``fill_(alpha0)`` (a reset learnable head had alpha = sigmoid(0.2) = 0.55 instead of 0.2). Checked against the
    APPNP weights written out: alpha (1-alpha)^k for k < K and (1-alpha)^K on P^K."""
    from diffusionformer.operators.ppr import PPROperator

    op = PPROperator(alpha=0.2, steps=4, learnable=True, num_heads=2)
    with torch.no_grad():
        op.alpha_logit.copy_(torch.tensor([3.0, -1.0]))
    op.reset_parameters()
    torch.testing.assert_close(op.alpha.detach().double(), torch.full((2,), 0.2, dtype=torch.float64), rtol=1e-6, atol=0)
    want = torch.tensor([0.2, 0.2 * 0.8, 0.2 * 0.8**2, 0.2 * 0.8**3, 0.8**4], dtype=torch.float64)
    torch.testing.assert_close(op.coefficients().double(), want.expand(2, -1), rtol=1e-6, atol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_kills_ppr_exact_tiny_alpha_float32_diagonal(causal):
    """kills: operators/ppr_exact.py ``_solve`` diagonal ``(1 - P_ii) (1 - alpha) + alpha`` -> ``1 - (1 - alpha)
    P_ii`` (in float32, 1 - alpha rounds to 1 for alpha = 1e-8: a causal row 0, P_00 = 1, got the diagonal 0 and
    the head output inf/NaN instead of ``v_0``). Checked against ``alpha (I - (1-alpha) P)^-1 v`` solved in float64."""
    from diffusionformer.operators.ppr_exact import ExactPPROperator

    alpha = 1e-8
    P64 = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    v64 = torch.tensor([[1.0, -2.0], [0.5, 3.0], [-1.0, 0.25]], dtype=torch.float64)
    want = alpha * torch.linalg.solve(torch.eye(3, dtype=torch.float64) - (1 - alpha) * P64, v64)
    op = ExactPPROperator(alpha=alpha)
    P, v = P64.float()[None, None], v64.float()[None, None]
    got = (op.apply_causal_matrix(P, v) if causal else op.apply_matrix(P, v))[0, 0]
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[0].double(), v64[0], rtol=1e-6, atol=0)  # row 0 keeps its own value


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_kills_polynomial_chebyshev_half_module_sums_in_float32(half):
    """kills: operators/polynomial.py ``PolynomialOperator.coefficients`` ``work = torch.float64 if theta is float64
    else torch.float32`` -> ``work = self.theta.dtype`` (a half module summed ``theta_k`` times the monomial weights
    of ``T_k``, up to 2^(K-1) and cancelling, in half precision: off by percents). Checked against ``theta`` (its
    half values, exact in float64) times the Chebyshev matrix built by the recursion T_{k+1} = 2 x T_k - T_{k-1}."""
    from diffusionformer.operators.polynomial import PolynomialOperator

    K = 10
    op = PolynomialOperator(steps=K, init=[0.1, 0.6, 0.2, 0.1, -0.05, 0.03], basis="chebyshev").to(half)
    with torch.no_grad():  # a trained theta: every Chebyshev weight non-zero
        op.theta.copy_(torch.linspace(-1.0, 1.0, K + 1).to(half)[None])
    T = [torch.zeros(K + 1, dtype=torch.float64) for _ in range(K + 1)]
    T[0][0] = 1.0
    T[1][1] = 1.0
    for k in range(1, K):
        T[k + 1][1:] = 2.0 * T[k][:-1]
        T[k + 1] -= T[k - 1]
    want = op.theta.detach().double() @ torch.stack(T)
    got = op.coefficients()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-4)
