"""Sitting 58: a learnable sharpening heat head's default ``steps`` cover the bound ``min_t`` its time learns towards."""
from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.operators import HeatOperator


@pytest.mark.parametrize("t,min_t", [(-1.0, -2.0), (-0.25, -1.0), (-2.0, -2.5)])
def test_bug_learnable_negative_time_meets_the_tolerance_at_min_t(t, min_t):
    """Bug: ``HeatOperator(t=-1, learnable=True)`` chose ``K`` for ``t`` and ``max(2|t|, 1)`` only; trained to its
    clamp at ``min_t = -2`` its weights summed to 0.998 (the exact kernel's row sums are 1), a truncation error past
    the 1e-4 default tolerance. Checked against ``matrix_exp`` on a float64 row-stochastic ``P``."""
    op = HeatOperator(t=t, learnable=True, min_t=min_t).double()
    with torch.no_grad():
        op.t.fill_(min_t - 1.0)  # training pushed it past the bound: clamped at min_t
    assert float(op.effective_time()) == min_t
    assert float(op.truncation_error().max()) <= 1e-4
    P = torch.softmax(torch.randn(6, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64), -1)
    c = op.coefficients().detach().reshape(-1)
    series = sum(ck * torch.linalg.matrix_power(P, k) for k, ck in enumerate(c.tolist()))
    exact = torch.linalg.matrix_exp(-min_t * (torch.eye(6, dtype=torch.float64) - P))
    assert float((series - exact).abs().sum(-1).max()) <= 1e-4
    assert math.isclose(float(c.sum()), 1.0, abs_tol=1e-4)


def test_positive_learnable_times_keep_their_steps_and_a_far_bound_costs_nothing():
    """The rule is for negative starting times only: a positive learnable t keeps the K it had (run identities); and
    room below is -max(2|t|, 1), not a far min_t (-50 would take K=184, -inf none)."""
    assert HeatOperator(t=1.0, learnable=True).steps == HeatOperator(t=1.0, learnable=True, min_t=-50.0).steps
    near = HeatOperator(t=-1.0, learnable=True, min_t=-2.0).steps
    assert HeatOperator(t=-1.0, learnable=True, min_t=-50.0).steps == near
    assert HeatOperator(t=-1.0, learnable=True, min_t=float("-inf")).steps == near
