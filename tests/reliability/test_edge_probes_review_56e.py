"""Review of the sitting-56 commits e112eff, 4ba76d1, 0fa752e, 0835de2 and b8267c5 (helper 56q): the Euler heat
coefficients past the binomials' float range."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from diffusionformer.operators import heat_coefficients

#: the largest Euler K whose binomials fit a float64
_EULER_MAX_STEPS = 1029


def test_bug_euler_heat_coefficients_past_the_binomials_float_range_are_refused_not_nan():
    """Bug: ``heat_coefficients(t, K, "euler")`` for ``K >= 1030`` (a non-negative int, which it takes) returned NaN
    coefficients without a word: the binomials ``C(K, k)`` are ``inf`` past a float's range and the powers
    ``(1 - t/K)^(K-k) (t/K)^k`` underflow to 0 there. Such a ``K`` is refused, naming the limit."""
    assert math.comb(_EULER_MAX_STEPS, _EULER_MAX_STEPS // 2) < int(sys.float_info.max) < math.comb(
        _EULER_MAX_STEPS + 1, (_EULER_MAX_STEPS + 1) // 2)
    t = torch.tensor(0.5, dtype=torch.float64)
    last = heat_coefficients(t, _EULER_MAX_STEPS, "euler")
    assert torch.isfinite(last).all() and abs(last.sum().item() - 1.0) < 1e-12
    with pytest.raises(ValueError, match=rf"K = {_EULER_MAX_STEPS}, got steps={_EULER_MAX_STEPS + 1}; .*taylor"):
        heat_coefficients(t, _EULER_MAX_STEPS + 1, "euler")
