"""Edge probes (fourth pass) of the operators' learned parametrisations and their numerics.

No bug found in this pass: these tests pin what was checked against float64 references written
from the formulas (matrix_exp, linalg.solve, the papers' equations).
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.operators import build_operator
from diffusionformer.operators.differential import DifferentialOperator
from diffusionformer.operators.heat import HeatOperator, heat_coefficients, heat_truncation_error
from diffusionformer.operators.ppr import PPROperator, ppr_coefficients

F64 = torch.float64


def _P(N: int = 6, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, N, dtype=F64, generator=g).softmax(-1)


def _series(c: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    return sum(c[k] * torch.linalg.matrix_power(P, k) for k in range(c.shape[-1]))


@pytest.mark.parametrize("t", [1.0, 3.0, -1.0, -1.8])
@pytest.mark.parametrize("K", [2, 4, 8, 24])
def test_heat_truncation_error_bounds_the_distance_to_matrix_exp(t, K):
    """The Taylor bound holds against ``matrix_exp`` (the ``e^{2|t|}`` factor for ``t < 0``, both branches of the
    weights: ``K <= 20`` and the running product), and for ``t >= 0`` it is attained (the tail is non-negative)."""
    P = _P()
    exact = torch.linalg.matrix_exp(-t * (torch.eye(6, dtype=F64) - P))
    err = (_series(heat_coefficients(torch.tensor(t, dtype=F64), K), P) - exact).abs().sum(-1).max().item()
    bound = heat_truncation_error(torch.tensor(t, dtype=F64), K).item()
    assert err <= bound + 1e-12
    if t >= 0:
        assert err == pytest.approx(bound, rel=1e-9, abs=1e-13)


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("K", [1, 3, 10])
def test_ppr_truncation_error_bounds_the_distance_to_the_solve(alpha, K):
    """``K``-step APPNP is within ``2 (1 - alpha)^K`` of ``alpha (I - (1 - alpha) P)^{-1}`` (``linalg.solve``)."""
    P = _P(seed=1)
    exact = alpha * torch.linalg.solve(torch.eye(6, dtype=F64) - (1 - alpha) * P, torch.eye(6, dtype=F64))
    err = (_series(ppr_coefficients(torch.tensor(alpha, dtype=F64), K), P) - exact).abs().sum(-1).max().item()
    op = PPROperator(alpha=alpha, steps=K)
    assert err <= op.truncation_error().item() + 1e-12


def test_learned_parameters_at_extreme_raw_values_stay_finite():
    """A learned PPR logit of +-200 gives the one-hot limits (``alpha = 1``: ``I``; ``alpha = 0``: ``P^K``) and a heat
    time of ``1e4`` the vanishing kernel; their gradients are zero, never NaN."""
    ppr = PPROperator(alpha=0.2, steps=4, learnable=True, num_heads=2)
    with torch.no_grad():
        ppr.alpha_logit.copy_(torch.tensor([200.0, -200.0]))
    c = ppr.coefficients()
    torch.testing.assert_close(c, torch.tensor([[1.0, 0, 0, 0, 0], [0, 0, 0, 0, 1.0]]))
    (c * torch.arange(5.0)).sum().backward()
    assert torch.equal(ppr.alpha_logit.grad, torch.zeros(2))
    heat = HeatOperator(t=0.5, steps=6, learnable=True, num_heads=2, min_t=-5.0)
    with torch.no_grad():
        heat.t.copy_(torch.tensor([1e4, -5.0]))
    c = heat.coefficients()
    assert torch.isfinite(c).all() and c[0].abs().max() == 0
    c.sum().backward()
    assert torch.isfinite(heat.t.grad).all()


@pytest.mark.parametrize("t, K, method", [(-1.0, 4, "taylor"), (-1.0, 25, "taylor"), (0.0, 25, "taylor"),
                                          (4.0, 4, "euler"), (-0.5, 3, "euler")])
def test_heat_weights_gradcheck_at_negative_times_and_the_euler_edge(t, K, method):
    """The weights' gradient in ``t`` passes float64 gradcheck for sharpening times in both Taylor branches and for
    the Euler product at ``t = K`` (its weight on ``I`` is ``0^K``)."""
    x = torch.tensor([t, 0.3], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: heat_coefficients(x, K, method), (x,))


def test_ppr_weights_gradcheck_at_alpha_one():
    """At ``alpha = 1`` (``(1 - alpha)^0 = 0^0``) the PPR weights' gradient is finite and passes gradcheck."""
    x = torch.tensor([1.0, 1e-300, 0.5], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: ppr_coefficients(x, 3), (x,))


def test_learned_parameters_are_per_head_and_start_at_the_documented_values():
    """Spec-built learnable operators hold one value per head at the given start (sigmoid(logit) = alpha), and the
    differential operator's lambda vectors (``N(0, 0.1^2)``, width ``C/2``) and gain (ones, width ``C``) are shared."""
    assert build_operator("heat(t=0.7, steps=6, learnable=True)", num_heads=3).t.tolist() == pytest.approx([0.7] * 3)
    ppr = build_operator("ppr(alpha=0.3, steps=4, learnable=True)", num_heads=3)
    assert ppr.alpha.tolist() == pytest.approx([0.3] * 3, rel=1e-6)
    assert build_operator("heat-exact(t=0.4, learnable=True)", num_heads=2).t.tolist() == pytest.approx([0.4] * 2)
    assert build_operator("attnscale", num_heads=4).omega.tolist() == [0.0] * 4
    torch.manual_seed(0)
    op = DifferentialOperator(head_dim=4000, num_heads=3)
    lam = torch.stack([op.lambda_q1, op.lambda_k1, op.lambda_q2, op.lambda_k2]).detach()
    assert lam.shape == (4, 2000) and abs(lam.std().item() - 0.1) < 0.005 and abs(lam.mean().item()) < 0.005
    assert torch.equal(op.subln.weight.detach(), torch.ones(4000))


@pytest.mark.parametrize("spec, name", [("heat(t=0.7, steps=6, learnable=True)", "t"),
                                        ("ppr(alpha=0.3, steps=4, learnable=True)", "alpha_logit"),
                                        ("heat-exact(t=0.4, learnable=True)", "t"),
                                        ("polynomial(steps=2)", "theta")])
def test_a_loaded_nan_parameter_is_named_at_use(spec, name):
    """A state dict with a NaN learned value loads (as torch loads any value) and the first use names it."""
    op = build_operator(spec, num_heads=2)
    state = op.state_dict()
    state[name] = torch.full_like(state[name], float("nan"))
    op.load_state_dict(state)
    P, v = _P(4).float().expand(1, 2, 4, 4), torch.ones(1, 2, 4, 1)
    with pytest.raises(ValueError, match=f"{name} is not finite"):
        op.apply_matrix(P, v)


def test_bug_grand_euler_refuses_a_step_longer_than_one():
    """Bug: grand-nl(t=10, steps=1, method='euler') was accepted and computed 10 P v - 9 v (a step tau = t/K > 1
    weighs v by 1 - tau < 0: unstable), where heat's Euler product refuses steps < t. It is refused as heat's is;
    K >= t and rk4 still build, and Euler at t = K is one step of P, as the docstring says."""
    with pytest.raises(ValueError, match=r"explicit Euler needs steps >= t .*steps=10 would do"):
        build_operator("grand-nl(t=10, steps=1, method='euler')")
    with pytest.raises(ValueError, match="explicit Euler needs steps >= t"):
        build_operator("grand-nl(t=2.5, steps=2, method='euler')")
    build_operator("grand-nl(t=10, steps=10, method='euler')")
    build_operator("grand-nl(t=10, steps=1, method='rk4')")
