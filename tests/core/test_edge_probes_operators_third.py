"""Edge-case probes of the operators' learnable parameterisation (third pass)."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.operators.polynomial import PolynomialOperator


@pytest.fixture
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("kwargs", [
    {"init": [0.1, 0.6, 0.2, 0.1]},
    {"init": [0.1, 0.6, 0.2, 0.1], "basis": "chebyshev"},
    {"init": "ppr(alpha=0.1, steps=3)"},
])
def test_bug_polynomial_theta_follows_a_float64_default_dtype(float64_default, kwargs):
    """Bug: under torch.set_default_dtype(torch.float64) a polynomial's init was read through float32, so theta
    held 0.10000000149011612 for 0.1, and with basis='chebyshev' theta (and its coefficients) stayed a float32
    parameter in a float64 model, unlike every other learned operator parameter (heat's t, ppr's logit)."""
    op = PolynomialOperator(steps=3, **kwargs)
    assert op.theta.dtype == torch.float64
    c = op.coefficients()
    assert c.dtype == torch.float64
    want = [0.1, 0.6, 0.2, 0.1] if isinstance(kwargs["init"], list) else [0.1, 0.1 * 0.9, 0.1 * 0.81, 0.729]
    assert torch.allclose(c, torch.tensor([want], dtype=torch.float64), rtol=0, atol=1e-15)


def test_polynomial_theta_stays_float32_by_default_and_refuses_overflowing_init():
    assert PolynomialOperator(steps=1, init=[0.1, 0.9], basis="chebyshev").theta.dtype == torch.float32
    with pytest.raises(ValueError, match="init coefficients must be finite"):
        PolynomialOperator(steps=1, init=[1e39, 0.0])  # finite in float64, not in a float32 theta
