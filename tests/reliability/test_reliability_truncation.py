"""Heat and PPR heads whose truncated series misses the tolerance are refused, naming a K that does."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import poisson

from diffusionformer.operators import build_operator
from diffusionformer.operators.heat import MAX_TRUNCATION_ERROR, HeatOperator, heat_truncation_error
from diffusionformer.operators.ppr import PPROperator, ppr_steps_for_tolerance


@pytest.mark.parametrize("spec", ["heat(t=1e3, steps=8)", "heat(t=50, steps=4)", "heat(t=5.0, steps=2)"])
def test_heat_heads_that_would_output_almost_nothing_are_refused(spec):
    with pytest.raises(ValueError, match=r"truncation error .* exceeds tol=0\.5 .*(steps=\d+ would do|no steps up to 256)"):
        build_operator(spec)


@pytest.mark.parametrize("t,tol", [(50.0, None), (5.0, None), (1.0, 1e-3), (3.0, 1e-6), (-1.0, 1e-2)])
def test_the_named_steps_do_and_are_the_fewest(t, tol):
    too_few = 1
    with pytest.raises(ValueError) as info:
        HeatOperator(t=t, steps=too_few, tol=tol)
    K = int(info.value.args[0].split("; steps=")[1].split()[0])
    limit = MAX_TRUNCATION_ERROR if tol is None else tol
    op = HeatOperator(t=t, steps=K, tol=tol)  # accepted
    # float64 reference: the Poisson tail (scipy), amplified by e^{2|t|} for sharpening
    bound = lambda k: poisson.sf(k, abs(t)) * (math.exp(2 * abs(t)) if t < 0 else 1.0)  # noqa: E731
    assert bound(K) <= limit < bound(K - 1)
    assert op.truncation_error().item() == pytest.approx(bound(K), rel=1e-9, abs=1e-15)
    with pytest.raises(ValueError, match=f"heat\\(t={t:g}, steps={K - 1}\\)"):
        HeatOperator(t=t, steps=K - 1, tol=tol)


def test_truncation_error_matches_the_poisson_tail():
    t = torch.tensor([0.0, 0.3, 1.0, 7.5, 40.0], dtype=torch.float64)
    for K in (0, 1, 3, 10):
        ref = torch.tensor([poisson.sf(K, x) for x in t.tolist()], dtype=torch.float64)
        assert torch.allclose(heat_truncation_error(t, K), ref, atol=1e-12)


def test_accepted_heads_keep_existing_specs_and_a_loose_tol_travels_with_the_spec():
    for spec in ["heat(t=1.0, steps=4)", "heat(t=2.0, steps=6)", "heat(t=0.5, learnable=True, steps=2)", "heat(t=5.0, steps=6)"]:
        build_operator(spec)
    loose = HeatOperator(t=5.0, steps=2, tol=0.9)
    assert loose.spec_kwargs()["tol"] == 0.9
    again = build_operator("heat", **loose.spec_kwargs())
    assert torch.equal(again.coefficients(), loose.coefficients())
    assert "tol" not in HeatOperator(t=0.5, tol=1e-6).spec_kwargs()  # steps chosen for it: nothing to carry


def test_unstable_euler_products_are_refused():
    with pytest.raises(ValueError, match=r"heat\(t=4, steps=2, method='euler'\): the Euler product needs steps >= t.*steps=4 would do"):
        HeatOperator(t=4.0, steps=2, method="euler")
    c = HeatOperator(t=4.0, steps=4, method="euler").coefficients()
    assert (c >= 0).all() and c.sum().item() == pytest.approx(1.0)


def test_bad_tol_is_named():
    for bad in (0.0, -1.0, True, "1e-3"):
        with pytest.raises(ValueError, match="tol must be a positive float"):
            HeatOperator(t=1.0, steps=4, tol=bad)
        with pytest.raises(ValueError, match="tol must be a positive float"):
            PPROperator(alpha=0.2, steps=4, tol=bad)


@pytest.mark.parametrize("alpha,tol", [(0.1, 1e-2), (0.5, 1e-3), (0.9, 1e-6), (0.2, 1.0)])
def test_ppr_with_a_tolerance_refuses_short_series_and_names_the_fewest_steps(alpha, tol):
    K = ppr_steps_for_tolerance(alpha, tol)
    assert 2 * (1 - alpha) ** K <= tol and (K == 1 or 2 * (1 - alpha) ** (K - 1) > tol)
    assert PPROperator(alpha=alpha, steps=None, tol=tol).steps == K
    if K > 1:
        with pytest.raises(ValueError, match=rf"ppr\(alpha={alpha:g}, steps={K - 1}\): truncation error .* steps={K} would do"):
            PPROperator(alpha=alpha, steps=K - 1, tol=tol)
    op = PPROperator(alpha=alpha, steps=K, tol=tol).double()
    # float64 reference on a random row-stochastic P: distance to the full series alpha (I - (1-alpha) P)^-1
    g = torch.Generator().manual_seed(0)
    P = torch.rand(12, 12, generator=g, dtype=torch.float64)
    P = P / P.sum(1, keepdim=True)
    exact = alpha * torch.linalg.inv(torch.eye(12, dtype=torch.float64) - (1 - alpha) * P)
    series = sum(c * torch.linalg.matrix_power(P, k) for k, c in enumerate(op.coefficients()))
    assert (series - exact).abs().sum(1).max().item() <= op.truncation_error().item() + 1e-12


def test_ppr_without_tol_keeps_accepting_short_k_step_appnp():
    op = PPROperator(alpha=0.3, steps=1)
    assert op.truncation_error().item() == pytest.approx(1.4)
    assert op.coefficients().sum().item() == pytest.approx(1.0)
