"""Operator-specific math: heat against matrix_exp, semigroup, limits; PPR; polynomial; errors."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.functional import attention_matrix, diffuse, heat_kernel_reference
from diffusionformer.operators import (
    ExactHeatOperator,
    HeatOperator,
    PolynomialOperator,
    PPROperator,
    heat_coefficients,
    heat_steps_for_tolerance,
    ppr_coefficients,
)
from diffusionformer.testing import random_qkv


def _problem(seed=0, N=8, H=2):
    q, k, v = random_qkv(2, H, N, 4, seed=seed)
    return q, k, v, attention_matrix(q, k)


@pytest.mark.parametrize("t", [0.05, 0.5, 1.0, 3.0, 10.0])
def test_heat_matches_matrix_exp(t):
    q, k, v, P = _problem()
    op = HeatOperator(t=t, tol=1e-12).double()
    out = diffuse(q, k, v, op.coefficients())
    ref = heat_kernel_reference(P, v, t)
    assert torch.allclose(out, ref, atol=1e-10), (out - ref).abs().max()


def test_heat_truncation_error_bound_holds():
    q, k, v, P = _problem(1)
    for t, steps in [(1.0, 2), (2.0, 4), (5.0, 6)]:
        op = HeatOperator(t=t, steps=steps).double()
        err = (diffuse(q, k, v, op.coefficients()) - heat_kernel_reference(P, v, t)).abs().amax(dim=(-1, -2))
        bound = op.truncation_error().item() * v.abs().amax(dim=(-1, -2))
        assert (err <= bound + 1e-12).all()
        assert (err > 0).all()  # truncation is real


def test_heat_steps_from_tolerance_meet_it():
    for t in [0.1, 1.0, 4.0, 20.0]:
        for tol in [1e-3, 1e-6]:
            K = heat_steps_for_tolerance(t, tol)
            c = heat_coefficients(torch.tensor(t), K)
            assert 1 - c.sum().item() <= tol
            if K > 0:
                assert 1 - heat_coefficients(torch.tensor(t), K - 1).sum().item() > tol


def test_heat_semigroup():
    q, k, v, P = _problem(2)
    s, t = 0.4, 1.1
    cs = HeatOperator(t=s, tol=1e-13).double().coefficients()
    ct = HeatOperator(t=t, tol=1e-13).double().coefficients()
    cst = HeatOperator(t=s + t, tol=1e-13).double().coefficients()
    two_steps = diffuse(q, k, diffuse(q, k, v, cs), ct)
    assert torch.allclose(two_steps, diffuse(q, k, v, cst), atol=1e-10)


def test_heat_limits():
    q, k, v, P = _problem(3)
    near_zero = HeatOperator(t=1e-9, steps=3).double()
    assert torch.allclose(diffuse(q, k, v, near_zero.coefficients()), v, atol=1e-8)
    exact_zero = HeatOperator(t=0.0, steps=3).double()
    assert torch.equal(diffuse(q, k, v, exact_zero.coefficients()), v)
    # t -> infinity: every row converges to the stationary average pi^T v.
    big = HeatOperator(t=50.0, tol=1e-9).double()
    assert big.steps > 50
    out = diffuse(q, k, v, big.coefficients())
    assert torch.isfinite(out).all()
    ref = heat_kernel_reference(P, v, 50.0)
    assert torch.allclose(out, ref, atol=1e-6)
    assert (out - out.mean(dim=2, keepdim=True)).abs().max() < 1e-6


def test_heat_large_t_is_finite_in_float32_and_gradients_finite():
    op = HeatOperator(t=50.0, learnable=True, num_heads=2)
    c = op.coefficients()
    assert c.dtype == torch.float32 and torch.isfinite(c).all()
    assert torch.allclose(c.sum(-1), torch.ones(2), atol=1e-3)
    c.sum().backward()
    assert torch.isfinite(op.t.grad).all()
    op0 = HeatOperator(t=0.0, learnable=True, steps=4)
    op0.coefficients()[0, 2].backward()
    assert torch.isfinite(op0.t.grad).all()


def test_heat_euler_matches_explicit_product_and_converges():
    q, k, v, P = _problem(4)
    t = 0.9
    eye = torch.eye(P.shape[-1], dtype=torch.float64)
    errs = []
    for K in (2, 4, 8, 16):
        op = HeatOperator(t=t, steps=K, method="euler").double()
        out = diffuse(q, k, v, op.coefficients())
        explicit = torch.linalg.matrix_power((1 - t / K) * eye + (t / K) * P, K) @ v
        assert torch.allclose(out, explicit, atol=1e-10)
        errs.append((out - heat_kernel_reference(P, v, t)).abs().max().item())
    assert errs == sorted(errs, reverse=True) and errs[-1] < errs[0] / 4


def test_negative_time_sharpens():
    q, k, v, P = _problem(5)
    sharp = HeatOperator(t=-0.5, tol=1e-12).double()
    out = diffuse(q, k, v, sharp.coefficients())
    assert torch.allclose(out, heat_kernel_reference(P, v, -0.5), atol=1e-9)
    var = lambda x: (x - x.mean(2, keepdim=True)).pow(2).sum()  # noqa: E731
    smooth = diffuse(q, k, v, HeatOperator(t=0.5, tol=1e-12).double().coefficients())
    assert var(out) > var(v) > var(smooth)


def test_learned_time_clamped_and_checked():
    op = HeatOperator(t=0.5, learnable=True, min_t=-1.0, num_heads=2)
    with torch.no_grad():
        op.t[0] = -5.0
    assert op.effective_time()[0].item() == -1.0
    with torch.no_grad():
        op.t[1] = float("nan")
    with pytest.raises(ValueError, match="HeatOperator.t is not finite"):
        op.coefficients()


def test_ppr_coefficients_and_limit():
    c = PPROperator(alpha=0.2, steps=5).coefficients()
    assert c.shape == (6,)
    assert torch.allclose(c[:5], torch.tensor([0.2 * 0.8**k for k in range(5)]))
    assert abs(c.sum().item() - 1) < 1e-6
    # Many steps: equals alpha (I - (1-alpha) P)^{-1} v (the PageRank fixed point).
    q, k, v, P = _problem(6)
    alpha = 0.3
    op = PPROperator(alpha=alpha, steps=80).double()
    eye = torch.eye(P.shape[-1], dtype=torch.float64)
    ref = alpha * torch.linalg.solve(eye - (1 - alpha) * P, v)
    assert torch.allclose(diffuse(q, k, v, op.coefficients()), ref, atol=1e-10)


def test_ppr_learnable_alpha_in_range_and_trains():
    op = PPROperator(alpha=0.2, steps=3, learnable=True, num_heads=3)
    assert torch.allclose(op.alpha, torch.full((3,), 0.2))
    op.coefficients()[:, 0].sum().backward()
    assert op.alpha_logit.grad is not None and (op.alpha_logit.grad > 0).all()


def test_polynomial_init_from_other_operators():
    p = PolynomialOperator(steps=4, init="heat(t=1.0, steps=4)", num_heads=2)
    assert torch.allclose(p.coefficients()[1], HeatOperator(t=1.0, steps=4).coefficients())
    with pytest.raises(ValueError, match="more than steps"):
        PolynomialOperator(steps=1, init="heat(t=1.0, steps=4)")
    with pytest.raises(ValueError, match="not a polynomial"):
        PolynomialOperator(steps=3, init="heat-exact")
    with pytest.raises(ValueError, match="finite"):
        PolynomialOperator(steps=1, init=[0.0, float("inf")])
    assert sum(par.numel() for par in p.parameters()) == 2 * 5


def test_fixed_coefficients_survive_dtype_casts():
    op = HeatOperator(t=0.9, steps=3)
    exact = heat_coefficients(torch.tensor(0.9, dtype=torch.float64), 3)
    assert op.coefficients().dtype == torch.float32
    assert torch.equal(op.double().coefficients(), exact)
    assert op.to(torch.bfloat16).coefficients().dtype == torch.float32


def test_exact_heat_refuses_coefficients():
    with pytest.raises(NotImplementedError, match="not a polynomial"):
        ExactHeatOperator().coefficients()


@pytest.mark.parametrize(
    "cls,kwargs,err",
    [
        (HeatOperator, dict(t=float("nan")), ValueError),
        (HeatOperator, dict(t="1"), TypeError),
        (HeatOperator, dict(method="rk4"), ValueError),
        (HeatOperator, dict(steps=0, method="euler"), ValueError),
        (HeatOperator, dict(t=-3.0), ValueError),
        (PPROperator, dict(alpha=0.0), ValueError),
        (PPROperator, dict(alpha=1.5), ValueError),
        (PPROperator, dict(steps=0), ValueError),
        (PolynomialOperator, dict(steps=-1), ValueError),
        (HeatOperator, dict(num_heads=0), ValueError),
    ],
)
def test_bad_operator_arguments(cls, kwargs, err):
    with pytest.raises(err):
        cls(**kwargs)


def test_reprs():
    assert repr(HeatOperator(t=0.5, steps=3)) == "HeatOperator(t=0.5, steps=3, method='taylor', learnable=False, num_heads=1)"
    assert repr(PPROperator(alpha=0.25, steps=2)) == "PPROperator(alpha=0.25, steps=2, learnable=False, num_heads=1)"
    assert repr(PolynomialOperator(steps=2, num_heads=4)) == "PolynomialOperator(steps=2, num_heads=4)"


def test_heat_coefficients_euler_equal_taylor_in_the_limit():
    t = torch.tensor(1.3)
    e = heat_coefficients(t, 200, "euler")[:10]
    tay = heat_coefficients(t, 9)
    assert torch.allclose(e, tay, atol=5e-3)
    assert math.isclose(heat_coefficients(t, 200, "euler").sum().item(), 1.0, rel_tol=1e-12)


@pytest.mark.parametrize("steps", [1, 4, 8, 20, 21, 40])
@pytest.mark.parametrize("t", [0.0, 1e-8, 0.5, -0.7, 3.0, 300.0, 600.0])
def test_heat_and_ppr_weights_match_the_closed_forms_with_finite_gradients(t, steps):
    # heat: e^{-t} t^k / k! from Python's math (both the vector-of-powers and the running-product branches)
    tt = torch.tensor(t, dtype=torch.float64, requires_grad=True)
    c = heat_coefficients(tt, steps)
    ref = torch.tensor([math.exp(-t) * t**k / math.factorial(k) for k in range(steps + 1)], dtype=torch.float64)
    torch.testing.assert_close(c, ref, rtol=1e-12, atol=1e-300)
    (g,) = torch.autograd.grad((c * torch.arange(steps + 1)).sum(), tt)  # d/dt of sum_k k c_k
    expected = sum(k * (math.exp(-t) * (k * t ** (k - 1) if k else 0.0) / math.factorial(k) - ref[k].item())
                   for k in range(steps + 1))
    assert math.isfinite(g.item()) and g.item() == pytest.approx(expected, rel=1e-9, abs=1e-300)
    # PPR: alpha (1 - alpha)^k, and (1 - alpha)^K on P^K
    alpha = min(abs(t), 1.0)
    a = torch.tensor([alpha, 0.3])
    p = ppr_coefficients(a, steps)
    for row, al in zip(p, (alpha, 0.3)):
        expect = [al * (1 - al) ** k for k in range(steps)] + [(1 - al) ** steps]
        torch.testing.assert_close(row, torch.tensor(expect), rtol=1e-5, atol=1e-7)
