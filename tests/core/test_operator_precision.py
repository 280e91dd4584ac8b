"""Fixed operator parameters keep their float64 value: a float64 layer is exact to rounding, not to float32."""

from __future__ import annotations

import math

import torch

from diffusionformer.operators import build_operator


def _p(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(1, 1, n, n, generator=g, dtype=torch.float64), -1)


def test_heat_exact_applies_t_as_given_in_float64():
    P, v = _p(), torch.randn(1, 1, 5, 3, dtype=torch.float64)
    op = build_operator("heat-exact(t=0.7)").double()
    want = torch.linalg.matrix_exp(-0.7 * (torch.eye(5, dtype=torch.float64) - P)) @ v
    assert (op.apply_matrix(P, v) - want).abs().max().item() < 1e-14  # a float32 t is 1e-8 off


def test_fixed_attnscale_omega_is_exact_in_float64():
    assert build_operator("attnscale(omega=0.4, learnable=False)").double().omega.tolist() == [0.4]


def test_fixed_coefficients_follow_a_float64_default_dtype():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        heat, ppr = build_operator("heat(t=0.7, steps=4)"), build_operator("ppr(alpha=0.3, steps=3)")
    finally:
        torch.set_default_dtype(old)
    taylor = [math.exp(-0.7) * 0.7 ** k / math.factorial(k) for k in range(5)]
    assert heat.coefficients().dtype == torch.float64
    assert max(abs(a - b) for a, b in zip(heat.coefficients().tolist(), taylor)) < 1e-16
    assert ppr.coefficients().tolist() == [0.3, 0.3 * 0.7, 0.3 * 0.7 ** 2, 0.7 ** 3]
    assert build_operator("heat(t=0.7, steps=4)").coefficients().dtype == torch.float32  # default float32
