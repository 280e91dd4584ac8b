"""Tests written in a mutation-testing audit of the heat-kernel operators (``operators/heat.py``), personalised
PageRank (``operators/ppr.py``), learned polynomial filters (``operators/polynomial.py``), the operator base class
and its argument checks (``operators/base.py``) and the operator registry (``operators/registry.py``).

Each test kills a mutant of the library code that the rest of the suite let through (its docstring
names it: file and mutation) and checks the code against an independent reference: heat kernels from
``torch.linalg.matrix_exp`` on explicit float64 matrices, binomial and Poisson weights from ``math.comb``,
``math.factorial`` and ``scipy.stats.poisson``, PageRank from ``numpy.linalg.solve`` on ``I - (1 - alpha) P``,
polynomials as explicit float64 sums of matrix powers, and registry names and error messages written out
by hand. Mutants judged equivalent are listed, with the reason, at the end of the file.
No library defect was found, so no test pins a fix. CPU only, deterministic, no network, no files.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats as sps

from diffusionformer.operators import (DiffusionOperator, ExactHeatOperator, HeatOperator, PolynomialOperator,
                                       PPROperator, build_operator, list_operators, operator_class,
                                       parse_operator_spec, register_operator, unregister_operator)
from diffusionformer.operators.heat import heat_coefficients, heat_steps_for_tolerance, heat_truncation_error
from diffusionformer.operators.polynomial import chebyshev_matrix
from diffusionformer.operators.ppr import ppr_coefficients, ppr_steps_for_tolerance


def _stochastic(rng, B, G, N):
    """A random row-stochastic ``P`` ``(B, G, N, N)``, float64 numpy."""
    P = rng.uniform(0.1, 1.0, size=(B, G, N, N))
    return P / P.sum(-1, keepdims=True)


def _poisson_steps(t, tol):
    """The smallest ``K`` whose Poisson(t) tail beyond ``K`` is at most ``tol`` (scipy)."""
    return next(K for K in range(1000) if sps.poisson.sf(K, t) <= tol)


# ---------------------------------------------------------------------------- heat.py


def test_euler_coefficients_need_one_step_and_are_exact_binomials():
    """kills: heat.py ``heat_coefficients`` the Euler ``steps == 0`` refusal -> ``steps < 0`` (a NaN row instead of
    an error), and the ``.round()`` of the binomial coefficients dropped (``exp(lgamma)`` is off by ulps): at
    ``t = K / 2`` the Euler weights are ``comb(K, k) / 2^K``, exact in float64"""
    with pytest.raises(ValueError, match=r"the Euler heat kernel needs steps >= 1"):
        heat_coefficients(torch.tensor(0.5), 0, "euler")
    for K in (20, 30, 40):
        got = heat_coefficients(torch.tensor(K / 2.0), K, "euler").tolist()
        assert got == [math.comb(K, k) / 2.0**K for k in range(K + 1)]


def test_steps_for_tolerance_refuses_zero_and_nan_tolerances():
    """kills: heat.py ``heat_steps_for_tolerance`` ``not tol > 0`` -> ``tol < 0`` (a zero tol ran into the step limit,
    a NaN tol returned ``K = 0``)"""
    for bad in (0.0, -1e-3, float("nan")):
        with pytest.raises(ValueError, match="tol must be positive"):
            heat_steps_for_tolerance(1.0, bad)
        with pytest.raises(ValueError, match="tol must be positive"):
            heat_steps_for_tolerance(1.0, bad, "euler")


def test_euler_steps_for_tolerance_edges():
    """kills: heat.py Euler ``max(1, ceil(...))`` -> ``max(0, ...)`` (``t = 0`` gave ``K = 0``) and ``K > MAX_STEPS``
    -> ``K >= MAX_STEPS`` (a ``K`` of exactly 256 refused): ``K = ceil(2 t^2 e^(2|t|) / tol)``"""
    assert heat_steps_for_tolerance(0.0, 1e-3, "euler") == 1
    tol = 2 * math.e**2 / 255.5  # 2 t^2 e^(2t) / tol = 255.5 at t = 1
    assert heat_steps_for_tolerance(1.0, tol, "euler") == 256
    with pytest.raises(ValueError, match=r"needs K=257 > 256 steps"):
        heat_steps_for_tolerance(1.0, 2 * math.e**2 / 256.5, "euler")


def test_taylor_steps_for_tolerance_edges():
    """kills: heat.py the Taylor loop ``tail > tol`` -> ``tail >= tol`` (a tail exactly at ``tol`` meets it) and
    ``K > MAX_STEPS`` -> ``K >= MAX_STEPS`` (an answer of exactly 256 refused); references: the Poisson tail
    ``1 - 2/e`` beyond ``K = 1`` at ``t = 1``, and ``scipy.stats.poisson`` at ``t = 200``"""
    assert heat_steps_for_tolerance(1.0, 1.0 - 2 * math.exp(-1.0)) == 1
    assert sps.poisson.sf(255, 200.0) > 7e-5 >= sps.poisson.sf(256, 200.0)
    assert heat_steps_for_tolerance(200.0, 7e-5) == 256
    with pytest.raises(ValueError, match="more than 256 steps"):
        heat_steps_for_tolerance(200.0, 5e-5)


def test_truncation_error_hand_values():
    """kills: heat.py ``heat_truncation_error`` Euler ``/ steps`` -> ``/ (steps + 1)`` and the Taylor
    ``clamp_min(0)`` dropped (a sum of weights rounded above 1 gave a negative bound)"""
    for t, K in ((0.5, 4), (-1.0, 8), (2.0, 3)):
        got = heat_truncation_error(torch.tensor(t), K, "euler").item()
        assert got == pytest.approx(2 * t * t * math.exp(2 * abs(t)) / K, rel=1e-12)
    for t in (2.0, -2.0):  # the 31 weights of t = 2 sum to 1 + 2^-52 in float64: the tail is read from its own
        # terms (3.8e-26), not as 1 - sum (which was 0 after the clamp, negative without it)
        factor = math.exp(2 * abs(t)) if t < 0 else 1.0
        assert heat_truncation_error(torch.tensor(t), 30).item() == pytest.approx(
            factor * sps.poisson.sf(30, 2.0), rel=1e-12)
    assert heat_truncation_error(torch.tensor(-1.0), 2).item() == pytest.approx(
        math.exp(2.0) * sps.poisson.sf(2, 1.0), rel=1e-12)


def test_explicit_steps_meeting_tol_exactly_are_accepted_and_messages():
    """kills: heat.py ``_check_truncation`` ``err <= limit`` -> ``err < limit`` (an error equal to ``tol`` meets it)
    and the message's ``kept < 0.05`` -> ``kept < 0.5`` ("almost nothing" for a head keeping 20 % of its weight)"""
    tol = 1.0 - 2 * math.exp(-1.0)  # the Poisson(1) tail beyond K = 1
    assert HeatOperator(t=1.0, steps=1, tol=tol).steps == 1
    with pytest.raises(ValueError, match=r"keeps 0\.199 of the kernel's weight, so the head outputs a damped signal"):
        HeatOperator(t=3.0, steps=1)  # kept: e^-3 (1 + 3)
    with pytest.raises(ValueError, match="keeps 0.000499 of the kernel's weight, so the head outputs almost nothing"):
        HeatOperator(t=10.0, steps=1)  # e^-10 * 11 = 4.99e-4


def test_heat_min_t_is_inclusive_and_default_steps():
    """kills: heat.py ``t < min_t`` -> ``t <= min_t``, the learnable bound ``max(2|t|, 1)`` -> ``max(|t|, 1)`` and
    the default ``tol=1e-4`` -> ``1e-3`` (steps checked against the Poisson tail from scipy)"""
    assert HeatOperator(t=-2.0).t.item() == -2.0
    assert HeatOperator(t=-1.0, min_t=-1.0, learnable=True).min_t == -1.0
    with pytest.raises(ValueError, match=r"t=-2.001 is below min_t=-2.0"):
        HeatOperator(t=-2.001)
    assert HeatOperator(t=1.0).steps == _poisson_steps(1.0, 1e-4) == 6
    assert HeatOperator(t=2.0, learnable=True).steps == _poisson_steps(4.0, 1e-4) == 13
    assert HeatOperator(t=0.25, learnable=True).steps == _poisson_steps(1.0, 1e-4)


def test_heat_step_limits():
    """kills: heat.py the ``isinstance(steps, bool)`` refusal dropped, ``steps <= MAX_STEPS`` -> ``steps < MAX_STEPS``
    (``steps=256`` skipped the truncation check) and ``steps > MAX_STEPS`` -> ``steps > MAX_STEPS + 1``"""
    for bad in (True, False):
        with pytest.raises(ValueError, match="steps must be a positive int"):
            HeatOperator(t=0.1, steps=bad)
    with pytest.raises(ValueError, match=r"heat\(t=400, steps=256\): truncation error 1 exceeds tol=0\.5"):
        HeatOperator(t=400.0, steps=256)
    assert HeatOperator(t=200.0, steps=256).steps == 256
    with pytest.raises(ValueError, match="steps=257 exceeds the maximum of 256"):
        HeatOperator(t=0.5, steps=257)


def test_heat_spec_kwargs_hand_written():
    """kills: heat.py ``tol > MAX_TRUNCATION_ERROR`` -> ``>=`` (the default tol 0.5 travelled with the spec) and
    ``min_t != -2.0`` -> ``==`` (the default ``min_t`` in the spec, a changed one left out)"""
    assert HeatOperator(t=1.0, steps=3, tol=0.5).spec_kwargs() == {
        "t": 1.0, "steps": 3, "method": "taylor", "learnable": False}
    assert HeatOperator(t=1.0, steps=3, tol=0.6).spec_kwargs() == {
        "t": 1.0, "steps": 3, "method": "taylor", "learnable": False, "tol": 0.6}
    assert HeatOperator(t=1.0, steps=6, min_t=-1.0).spec_kwargs() == {
        "t": 1.0, "steps": 6, "method": "taylor", "learnable": False, "min_t": -1.0}


def _expm_reference(P, v, t):
    """``exp(-t (I - P)) v`` per head from ``torch.linalg.matrix_exp`` on explicit float64 matrices (numpy out)."""
    P = torch.as_tensor(P, dtype=torch.float64)
    N = P.shape[-1]
    out = np.empty(P.shape[:-1] + (np.shape(v)[-1],))
    for b in range(P.shape[0]):
        for g in range(P.shape[1]):
            K = torch.linalg.matrix_exp(-float(t[g]) * (torch.eye(N, dtype=torch.float64) - P[b, g]))
            out[b, g] = (K @ torch.as_tensor(v[b, g], dtype=torch.float64)).numpy()
    return out


def test_exact_heat_head_count_and_dtypes():
    """kills: heat.py ``ExactHeatOperator.apply_matrix`` the ``G != num_heads`` refusal dropped (a RuntimeError from
    ``view`` instead), the working dtype ``float32`` for low-precision ``P`` -> ``P.dtype`` and the result cast to
    ``v.dtype`` -> ``P.dtype``"""
    rng = np.random.default_rng(3)
    P = _stochastic(rng, 1, 3, 5)
    v = rng.normal(size=(1, 3, 5, 2))
    with pytest.raises(ValueError, match="heat-exact serves 2 heads, got P with 3"):
        ExactHeatOperator(t=1.0, num_heads=2).apply_matrix(torch.from_numpy(P), torch.from_numpy(v))
    op = ExactHeatOperator(t=0.8, num_heads=3)
    ref = _expm_reference(P, v, [0.8] * 3)
    out = op.apply_matrix(torch.from_numpy(P), torch.from_numpy(v).float())
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-5)
    out = op.apply_matrix(torch.from_numpy(P).float(), torch.from_numpy(v))
    assert out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), _expm_reference(torch.from_numpy(P).float(), v, [0.8] * 3),
                               rtol=0, atol=1e-5)
    for dt in (torch.bfloat16, torch.float16):
        Pl = torch.from_numpy(P).to(dt)
        out = op.apply_matrix(Pl, torch.from_numpy(v).to(dt))
        assert out.dtype == dt
        np.testing.assert_allclose(out.double().numpy(), _expm_reference(Pl.double(), torch.from_numpy(v).to(dt).double(),
                                                                         [0.8] * 3), rtol=0, atol=2e-2)


def test_heat_argument_checks():
    """kills: heat.py ``ExactHeatOperator.apply_matrix`` the finite-``t`` check dropped (a NaN output instead of an
    error), ``HeatOperator`` the ``learnable`` bool check dropped (``learnable=1`` taken as ``True``) and its
    ``method`` check dropped (an unknown method accepted when ``t`` is learned with explicit steps)"""
    op = ExactHeatOperator(t=0.5, learnable=True, num_heads=1)
    with torch.no_grad():
        op.t.fill_(float("nan"))
    P = torch.full((1, 1, 2, 2), 0.5)
    with pytest.raises(ValueError, match=r"ExactHeatOperator\.t is not finite"):
        op.apply_matrix(P, torch.ones(1, 1, 2, 1))
    for bad in (1, 0, "yes", None):
        with pytest.raises(TypeError, match="learnable must be a bool"):
            HeatOperator(t=1.0, steps=6, learnable=bad)
    for kwargs in ({"steps": 6, "learnable": True}, {"steps": 6}, {}):
        with pytest.raises(ValueError, match="method must be 'taylor' or 'euler', got 'rk4'"):
            HeatOperator(t=1.0, method="rk4", **kwargs)


# ---------------------------------------------------------------------------- ppr.py


def test_ppr_coefficients_and_steps_for_tolerance_refusals():
    """kills: ppr.py ``ppr_coefficients`` ``steps < 1`` -> ``steps < 0`` (``K = 0`` gave the identity) and
    ``ppr_steps_for_tolerance`` ``not tol > 0`` -> ``tol < 0`` (a zero or NaN tol)"""
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match="steps must be a positive int"):
            ppr_coefficients(torch.tensor(0.5), bad)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="tol must be positive"):
            ppr_steps_for_tolerance(0.5, bad)
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"alpha must lie in \(0, 1\]"):
            ppr_steps_for_tolerance(bad, 1e-3)


def test_ppr_steps_for_tolerance_edges():
    """kills: ppr.py ``ppr_steps_for_tolerance`` the ``- 1e-12`` slack dropped (a tol met exactly by ``K`` asked for
    ``K + 1``) and ``max(1, ...)`` -> ``max(0, ...)`` (a tol just below 2 gave ``K = 0``): the smallest ``K`` with
    ``2 (1 - alpha)^K <= tol``, by hand"""
    assert 2 * 0.75**3 == 0.84375
    assert ppr_steps_for_tolerance(0.25, 0.84375) == 3
    assert ppr_steps_for_tolerance(0.5, 2 * 0.5**29) == 29
    assert ppr_steps_for_tolerance(0.5, 2.0 - 1e-13) == 1
    assert ppr_steps_for_tolerance(0.5, 2.0) == ppr_steps_for_tolerance(0.5, 5.0) == 1
    assert ppr_steps_for_tolerance(0.5, 1e-3) == 11  # 2 / 2^11 = 9.8e-4 <= 1e-3 < 2 / 2^10


def test_ppr_operator_defaults_and_limits():
    """kills: ppr.py ``PPROperator`` ``alpha <= 1`` -> ``alpha < 1`` (``alpha = 1``, no propagation, refused), the
    defaults ``alpha=0.1`` / ``steps=10`` / ``tol=1e-4`` changed, the ``steps > MAX_DEGREE`` message dropped (the
    generic "steps must be an int" instead) and ``truncation > tol`` -> ``>=`` (a tol met exactly refused)"""
    one = PPROperator(alpha=1.0, steps=3)
    assert one.coefficients().tolist() == [1.0, 0.0, 0.0, 0.0]
    default = PPROperator()
    assert default.alpha.item() == 0.1 and default.steps == 10
    assert PPROperator(alpha=0.5, steps=None).steps == 15  # 2 / 2^15 = 6.1e-5 <= 1e-4 < 2 / 2^14
    assert PPROperator(alpha=0.5, steps=None, tol=1e-3).steps == 11
    with pytest.raises(ValueError, match=r"ppr\(alpha=0\.001\) needs more than 1024 steps to meet tol=0\.0001"):
        PPROperator(alpha=1e-3, steps=None)
    assert PPROperator(alpha=0.5, steps=3, tol=0.25).steps == 3  # 2 (1/2)^3 = 0.25 exactly
    with pytest.raises(ValueError, match=r"truncation error 0\.25 exceeds tol=0\.2; steps=4 would do"):
        PPROperator(alpha=0.5, steps=3, tol=0.2)
    with pytest.raises(ValueError, match="a learnable alpha must start strictly below 1"):
        PPROperator(alpha=1.0, steps=3, learnable=True)


def test_ppr_learned_and_fixed_coefficients_dtypes():
    """kills: ppr.py the learned ``coefficients`` cast ``c.float()`` for a float32 ``alpha`` dropped (float64 weights
    out of a float32 layer), ``_static`` -> ``None`` (a cast module kept float32-rounded weights), the ``_alpha``
    buffer float64 -> float32 and the finite check on ``alpha_logit`` dropped; hand values
    ``alpha (1 - alpha)^k`` and ``(1 - alpha)^K``"""
    learned = PPROperator(alpha=0.2, steps=4, learnable=True, num_heads=2)
    c = learned.coefficients()
    assert c.dtype == torch.float32 and c.shape == (2, 5)
    np.testing.assert_allclose(c.detach().numpy(), [[0.2, 0.16, 0.128, 0.1024, 0.4096]] * 2, rtol=1e-6)
    assert learned.double().coefficients().dtype == torch.float64
    fixed = PPROperator(alpha=0.1, steps=3)
    assert fixed.alpha.dtype == torch.float64 and fixed.alpha.item() == 0.1
    want = (0.1, 0.1 * 0.9, 0.1 * 0.9**2, 0.9**3)
    assert fixed.static_coefficients() == pytest.approx(want, rel=1e-15, abs=0)
    np.testing.assert_allclose(fixed.double().coefficients().numpy(), want, rtol=1e-15, atol=0)
    assert fixed.truncation_error().item() == pytest.approx(2 * 0.9**3, rel=1e-15)
    with torch.no_grad():
        learned.alpha_logit[1] = float("nan")
    with pytest.raises(ValueError, match=r"PPROperator\.alpha_logit is not finite"):
        learned.coefficients()


def test_ppr_spec_round_trip_hand_written():
    """kills: ppr.py ``spec_kwargs`` without ``steps`` (a rebuilt operator took the default 10 steps)"""
    op = PPROperator(alpha=0.2, steps=4)
    assert op.spec_kwargs() == {"alpha": 0.2, "steps": 4, "learnable": False}
    assert op.spec() == "ppr(alpha=0.2, steps=4, learnable=False)"
    assert build_operator(op.spec()).coefficients().tolist() == op.coefficients().tolist()


def test_ppr_matches_numpy_solve_within_its_bound():
    """kills: ppr.py ``keep = 1 - alpha`` -> ``alpha`` and the tail weight on ``P^K`` swapped with ``alpha`` (both also
    killed elsewhere), checked against ``alpha (I - (1 - alpha) P)^-1 v`` from ``numpy.linalg.solve``: the error is
    within the documented ``2 (1 - alpha)^K ||v||_inf`` and the row sums of ``f(P)`` are one"""
    rng = np.random.default_rng(5)
    P = _stochastic(rng, 1, 2, 6)
    v = rng.normal(size=(1, 2, 6, 3))
    for alpha, K in ((0.3, 12), (0.6, 5)):
        op = PPROperator(alpha=alpha, steps=K, num_heads=2)
        got = op.double().apply_matrix(torch.from_numpy(P), torch.from_numpy(v)).numpy()
        want = alpha * np.linalg.solve(np.eye(6) - (1 - alpha) * P, v)
        bound = 2 * (1 - alpha) ** K * np.abs(v).max()
        assert np.abs(got - want).max() <= bound
        ones = op.double().apply_matrix(torch.from_numpy(P), torch.ones(1, 2, 6, 1, dtype=torch.float64))
        np.testing.assert_allclose(ones.numpy(), 1.0, rtol=0, atol=1e-13)


# ---------------------------------------------------------------------------- polynomial.py


def test_chebyshev_matrix_degree_zero_and_refusals():
    """kills: polynomial.py ``chebyshev_matrix`` ``steps < 0`` -> ``steps < 1`` (``T_0 = 1`` alone refused) and the
    ``isinstance(steps, bool)`` refusal dropped"""
    assert chebyshev_matrix(0).tolist() == [[1.0]]
    assert chebyshev_matrix(1).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    for bad in (True, False, -1, 2.0):
        with pytest.raises(ValueError, match="steps must be a non-negative int"):
            chebyshev_matrix(bad)


def test_polynomial_default_init_and_basis_check():
    """kills: polynomial.py the default ``init="attention"`` -> ``"laplacian"`` and the ``basis`` check dropped (an
    unknown basis silently taken as monomial)"""
    assert PolynomialOperator(steps=3).coefficients().tolist() == [[0.0, 1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match=r"basis must be one of \('monomial', 'chebyshev'\), got 'legendre'"):
        PolynomialOperator(steps=3, basis="legendre")


def test_polynomial_init_shape_checks():
    """kills: polynomial.py the ``c.shape[0] != G`` refusal dropped (coefficients for 3 heads given to 2) and
    ``c.shape[1] > steps + 1`` -> ``> steps + 2`` (a RuntimeError instead of the message)"""
    with pytest.raises(ValueError, match=r"init coefficients must have shape \(K\+1,\) or \(2, K\+1\), got \(3, 4\)"):
        PolynomialOperator(steps=3, init=torch.zeros(3, 4), num_heads=2)
    with pytest.raises(ValueError, match="init has degree 4, more than steps=3; raise steps or truncate init"):
        PolynomialOperator(steps=3, init=[0.1, 0.2, 0.3, 0.2, 0.2])
    assert PolynomialOperator(steps=3, init=[[1.0, 2.0], [3.0, 4.0]], num_heads=2).coefficients().tolist() == [
        [1.0, 2.0, 0.0, 0.0], [3.0, 4.0, 0.0, 0.0]]


def test_polynomial_spec_keeps_operator_init_and_basis():
    """kills: polynomial.py ``_init = init.spec()`` -> the instance itself (a spec string holding a module repr) and
    the ``basis`` left out of ``spec_kwargs`` (a Chebyshev filter rebuilt as a monomial one)"""
    op = PolynomialOperator(steps=4, init=HeatOperator(t=0.5, steps=2))
    assert op.spec_kwargs() == {"steps": 4, "init": "heat(t=0.5, steps=2, method='taylor', learnable=False)"}
    assert op.spec() == "polynomial(steps=4, init=\"heat(t=0.5, steps=2, method='taylor', learnable=False)\")"
    cheb = PolynomialOperator(steps=2, init=[0.0, 0.0, 1.0], basis="chebyshev")
    assert cheb.spec_kwargs() == {"steps": 2, "init": [0.0, 0.0, 1.0], "basis": "chebyshev"}
    rebuilt = build_operator(cheb.spec())
    assert rebuilt.basis == "chebyshev" and rebuilt.theta.tolist() == [[0.5, 0.0, 0.5]]


def test_chebyshev_coefficients_against_numpy_and_matrix_powers():
    """kills: polynomial.py the Chebyshev ``coefficients`` ``theta @ basis`` -> ``theta`` and the rebuild of the
    exact basis in ``_apply`` dropped (a float64 module kept the float32-rounded ``T_40``): monomial weights from
    ``numpy.polynomial.chebyshev.cheb2poly`` and ``f(P) v`` as an explicit float64 sum of ``T_k(P)``"""
    op = PolynomialOperator(steps=2, init=[0.0, 0.0, 1.0], basis="chebyshev")
    assert op.coefficients().tolist() == [[0.0, 0.0, 1.0]]
    K = 40  # T_40 has entries that float32 rounds (up to 2e14)
    big = PolynomialOperator(steps=K, basis="chebyshev").double()
    theta = np.zeros(K + 1)
    theta[K] = 1.0
    with torch.no_grad():
        big.theta.copy_(torch.from_numpy(theta)[None])
    want = np.polynomial.chebyshev.cheb2poly(theta)
    assert big.coefficients().detach().numpy()[0].tolist() == want.tolist()
    rng = np.random.default_rng(8)
    P = _stochastic(rng, 1, 1, 5)[0, 0]
    v = rng.normal(size=(5, 2))
    small = PolynomialOperator(steps=4, basis="chebyshev").double()
    th = [0.3, -0.2, 0.5, 0.1, -0.4]
    with torch.no_grad():
        small.theta.copy_(torch.tensor([th], dtype=torch.float64))
    T = [np.eye(5), P]
    for _ in range(3):
        T.append(2 * P @ T[-1] - T[-2])
    want = sum(t * Tk for t, Tk in zip(th, T)) @ v
    got = small.apply_matrix(torch.from_numpy(P)[None, None], torch.from_numpy(v)[None, None]).detach().numpy()[0, 0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_polynomial_nonfinite_theta_raises():
    """kills: polynomial.py the finite check on ``theta`` in ``coefficients`` dropped (NaN weights propagated)"""
    for basis in ("monomial", "chebyshev"):
        op = PolynomialOperator(steps=2, basis=basis)
        with torch.no_grad():
            op.theta[0, 1] = float("inf")
        with pytest.raises(ValueError, match=r"PolynomialOperator\.theta is not finite"):
            op.coefficients()


def test_polynomial_state_dict_and_tensor_init_spec():
    """kills: polynomial.py the Chebyshev ``_basis`` buffer made persistent (a derived constant in every checkpoint,
    refused by ``load_state_dict`` of a fresh module's keys) and the tensor/tuple ``init`` stored as given (a spec
    holding ``tensor([...])``, which ``build_operator`` cannot parse)"""
    assert list(PolynomialOperator(steps=2, basis="chebyshev").state_dict()) == ["theta"]
    for init in (torch.tensor([0.0, 1.0]), (0.0, 1.0), [0.0, 1.0]):
        op = PolynomialOperator(steps=2, init=init)
        assert op.spec() == "polynomial(steps=2, init=[0.0, 1.0])"
        assert build_operator(op.spec()).coefficients().tolist() == [[0.0, 1.0, 0.0]]


# ---------------------------------------------------------------------------- base.py


def test_num_heads_refuses_bools():
    """kills: base.py ``DiffusionOperator.__init__`` the ``isinstance(num_heads, bool)`` refusal dropped"""
    for cls, kwargs in ((HeatOperator, {"steps": 6}), (PPROperator, {}), (PolynomialOperator, {})):
        for bad in (True, False, 0, 2.0):
            with pytest.raises(ValueError, match="num_heads must be a positive int, got"):
                cls(num_heads=bad, **kwargs)


def test_head_coefficients_expand_and_refuse():
    """kills: base.py ``head_coefficients`` the expansion of one row to ``G`` heads dropped, its head-count refusal
    dropped, and ``apply_matrix`` asking for ``num_heads`` rows instead of ``P.shape[1]`` (a one-head ``heat``
    applied to three heads' ``P``, checked against ``torch.linalg.matrix_exp`` within its truncation bound)"""
    one = PolynomialOperator(steps=2, init=[[0.5, 0.5, 0.0]])
    assert one.head_coefficients(3).tolist() == [[0.5, 0.5, 0.0]] * 3
    with pytest.raises(ValueError, match="PolynomialOperator has coefficients for 2 heads, asked for 3"):
        PolynomialOperator(steps=2, num_heads=2).head_coefficients(3)
    rng = np.random.default_rng(4)
    P = _stochastic(rng, 2, 3, 5)
    v = rng.normal(size=(2, 3, 5, 2))
    heat = HeatOperator(t=0.5, steps=10).double()
    bound = heat.truncation_error().item()
    assert 0 < bound < 1e-9
    got = heat.apply_matrix(torch.from_numpy(P), torch.from_numpy(v)).numpy()
    np.testing.assert_allclose(got, _expm_reference(P, v, [0.5] * 3), rtol=0, atol=bound * np.abs(v).max() + 1e-13)
    got = one.double().apply_matrix(torch.from_numpy(P), torch.from_numpy(v)).detach().numpy()
    np.testing.assert_allclose(got, 0.5 * v + 0.5 * P @ v, rtol=0, atol=1e-13)


def test_step_counts_refuse_bools():
    """kills: base.py ``check_count`` the ``isinstance(value, bool)`` refusal dropped (``steps=True`` taken as 1)"""
    for bad in (True, False):
        with pytest.raises(ValueError, match=r"steps must be an int in \[1, 1024\], got " + str(bad)):
            PPROperator(alpha=0.5, steps=bad)
        with pytest.raises(ValueError, match=r"steps must be an int in \[0, 1024\], got " + str(bad)):
            PolynomialOperator(steps=bad)


def test_spec_of_an_operator_without_arguments_is_its_name():
    """kills: base.py ``spec`` without arguments ``name`` -> ``name + '()'``"""
    assert build_operator("softmax").spec() == "attention"
    assert build_operator("I-P").spec() == "laplacian"


# ---------------------------------------------------------------------------- registry.py


def _unknown(name):
    """The head of the "unknown operator" message (before the list of valid names)."""
    with pytest.raises(ValueError) as info:
        operator_class(name)
    return str(info.value).split(";")[0]


def test_did_you_mean_hand_written():
    """kills: registry.py ``operator_class`` suggestions ``n=3`` -> ``n=1`` (the second operator dropped), the
    de-duplication of two aliases of one operator dropped ("'ppr' or 'ppr'"), and the ``" or "`` joiner changed; the
    non-str name TypeError -> ValueError"""
    assert _unknown("heat-ex") == "unknown operator 'heat-ex' (did you mean 'heat-exact' or 'heat'?)"
    assert _unknown("pagerank-exac") == "unknown operator 'pagerank-exac' (did you mean 'ppr-exact' or 'ppr'?)"
    assert _unknown("personalized-pagerang") == "unknown operator 'personalized-pagerang' (did you mean 'ppr'?)"
    assert _unknown("hea") == "unknown operator 'hea' (did you mean 'heat'?)"
    assert _unknown("zzz") == "unknown operator 'zzz'"
    msg = str(pytest.raises(ValueError, operator_class, "zzz").value)
    assert "valid names: ['attention', 'attnscale', " in msg and "'appnp'->'ppr'" in msg
    for bad in (3, None, HeatOperator):
        with pytest.raises(TypeError, match="operator name must be a str, got"):
            operator_class(bad)


def test_names_are_stripped_and_true_false_refused():
    """kills: registry.py ``_normalise`` the ``strip()`` dropped (``" heat "`` became ``"-heat-"``) and the
    ``true``/``false`` name check made case-sensitive"""
    assert operator_class("  Heat_Kernel ") is HeatOperator
    assert operator_class("\tPPR\n") is PPROperator
    for bad in ("True", "FALSE", " true ", "false(x=1)"):
        with pytest.raises(ValueError, match="invalid operator name"):
            parse_operator_spec(bad)


class _Scratch(DiffusionOperator):
    """A one-step operator for registering and unregistering in tests."""

    def __init__(self, w: float = 0.5, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.w = w

    @property
    def degree(self) -> int:
        return 1

    def coefficients(self):
        return torch.tensor([1.0 - self.w, self.w])


def test_register_refuses_empty_names_and_unregister_by_alias():
    """kills: registry.py the empty-name refusal dropped, ``unregister_operator`` not removing the aliases and not
    resolving an alias to its operator"""
    with pytest.raises(ValueError, match="_Scratch needs a non-empty registry name"):
        register_operator(_Scratch, name=" ")
    assert "" not in list_operators()
    cls = type("Scratch2", (_Scratch,), {})
    register_operator(cls, name="mk-scratch", aliases=("mk-alias-a", "mk-alias-b"))
    try:
        assert operator_class("MK alias b") is cls
        unregister_operator("mk_alias_a")
        assert "mk-scratch" not in list_operators()
        for name in ("mk-scratch", "mk-alias-a", "mk-alias-b"):
            assert _unknown(name).startswith(f"unknown operator {name!r}")
        register_operator(type("Scratch3", (_Scratch,), {}), name="mk-scratch", aliases=("mk-alias-b",))
        unregister_operator("mk-scratch")
    finally:
        for name in ("mk-scratch",):
            if name in list_operators():
                unregister_operator(name)


def test_build_operator_messages_and_kwargs_constructors():
    """kills: registry.py ``build_operator`` the wrapping of the constructor's TypeError dropped, the
    ``**kwargs`` constructor short-cut in ``_unknown_arguments`` dropped (every keyword refused), its suggestions
    ``n=2`` -> ``n=1``, and the ``return ""`` for a class without a signature -> ``raise``"""
    with pytest.raises(TypeError, match=r"^cannot build operator 'heat' with arguments \{'learnable': 'yes'\}: "
                                        r"learnable must be a bool, got str \('yes'\)$"):
        build_operator("heat", learnable="yes")
    with pytest.raises(TypeError, match=r"unknown argument 'to' \(did you mean 'tol' or 't'\?\); valid arguments: "
                                        r"\['t', 'steps', 'method', 'learnable', 'tol', 'min_t', 'num_heads'\]"):
        build_operator("heat", to=1e-3)

    class Open(_Scratch):
        def __init__(self, **kwargs) -> None:
            super().__init__(kwargs.pop("w", 0.5))
            self.extra = kwargs

    class Opaque(_Scratch):
        __signature__ = "not a signature"  # inspect.signature raises TypeError

    register_operator(Open, name="mk-open")
    register_operator(Opaque, name="mk-opaque")
    try:
        op = build_operator("mk-open(w=0.25, anything=3)")
        assert op.coefficients().tolist() == [0.75, 0.25] and op.extra == {"anything": 3}
        assert build_operator("mk-opaque", w=0.25).coefficients().tolist() == [0.75, 0.25]
        with pytest.raises(TypeError, match=r"cannot build operator 'mk-opaque' with arguments \{'v': 1\}"):
            build_operator("mk-opaque", v=1)
    finally:
        unregister_operator("mk-open")
        unregister_operator("mk-opaque")


def test_literal_error_has_no_chained_context():
    """kills: registry.py ``raise ... from None`` dropped for a non-literal value (the user's traceback then shows
    ``ast``'s internal "malformed node" error first)"""
    with pytest.raises(ValueError, match=r"operator spec 'heat\(t=x\)': the value of 't' must be a Python literal") as e:
        parse_operator_spec("heat(t=x)")
    assert e.value.__suppress_context__ and e.value.__cause__ is None


# ---------------------------------------------------------------------------- equivalent mutants
# 160 mutants were applied (54 in heat.py, 29 in ppr.py, 24 in polynomial.py, 21 in base.py, 32 in registry.py);
# 80 were killed by the suite before this file, 76 more by this file. The four survivors are equivalent:
# - heat.py ``_VECTOR_STEPS = 20`` -> ``2``: both branches compute the same Poisson weights ``e^-t t^k / k!`` (a
#   vector of powers or a running product); they differ by float64 rounding only, and both give 0 or inf
#   identically where ``e^-t`` under- or overflows, so no documented value or bound tells them apart.
# - ppr.py ``ppr_steps_for_tolerance`` ``tol >= 2.0`` -> ``tol > 2.0``: at ``tol = 2`` the formula gives
#   ``max(1, ceil(log(1) / log1p(-alpha) - 1e-12)) = max(1, 0) = 1``, the early return's value.
# - polynomial.py ``_apply`` the basis dtype ``float64 if theta is float64 else float32`` -> ``theta.dtype``:
#   ``coefficients`` casts the basis to ``theta.dtype`` anyway, and the integer entries of ``T_k`` that float32
#   holds exactly (all of them for ``K <= 36``) round to half precision the same from float32 as from float64;
#   casting back to float32/float64 rebuilds the basis from scratch either way.
# - registry.py ``parse_operator_spec`` the ``call.func.id == "f"`` test dropped: the parsed text starts with
#   ``f(``, so a top-level call whose callee is a bare ``Name`` can only be that ``f``.
