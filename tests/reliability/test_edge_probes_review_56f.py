"""Review of the sitting-56 commits e4ad4a4, 96ab9f5, b8267c5 and 3f5df1a (helper 56s): an ``eval()`` module with
dropout converted to exact-PPR heads, and the Euler heat coefficients of a negative time near the K limit."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import heat_coefficients


def test_bug_eval_multihead_attention_with_dropout_converts_to_exact_ppr_heads():
    """Bug: ``from_multihead_attention(mha.eval(), heads="ppr-exact(alpha=0.2)")`` of a module with ``dropout=0.5``
    was refused at construction (dropout >= alpha), though the layer comes in eval mode and drops nothing, and the
    refusal's remedy (lower the layer's dropout) cannot be given to the converter (``dropout=`` is copied). The
    layer converts, keeps the module's dropout, and refuses it once it trains."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True, dropout=0.5).eval()
    layer = DiffusionAttention.from_multihead_attention(mha, heads="ppr-exact(alpha=0.2)")
    assert not layer.training and layer.dropout == 0.5
    x = torch.randn(2, 5, 8)
    assert torch.isfinite(layer(x)).all()
    with pytest.raises(ValueError, match=r"ppr-exact\(alpha=0.2\) with attention dropout 0.5"):
        layer.train()(x)
    with pytest.raises(ValueError, match=r"attention dropout 0.5"):  # a training module: refused as before
        DiffusionAttention.from_multihead_attention(mha.train(), heads="ppr-exact(alpha=0.2)")


@pytest.mark.parametrize(("t", "steps"), [(-1.0, 1029), (-10.0, 1025), (-100.0, 960)])
def test_bug_euler_heat_coefficients_of_a_negative_time_near_the_limit_are_finite(t, steps):
    """Bug: ``heat_coefficients(t, K, "euler")`` with ``t < 0`` and ``K`` at or below the new 1029 limit returned NaN
    coefficients without a word: ``C(K, k) (1 - t/K)^(K-k)`` overflowed to inf (``1 - t/K > 1``) where
    ``(t/K)^k`` underflowed to 0. The coefficients are finite and match a log-space reference (to 1e-15 absolute:
    the powers' product may underflow where a coefficient is that small)."""
    c = heat_coefficients(torch.tensor(t, dtype=torch.float64), steps, "euler")
    assert torch.isfinite(c).all()
    a, b = 1.0 - t / steps, t / steps
    for k in (0, 1, steps // 4, steps // 2, steps - 1, steps):  # log-space reference, signs apart
        log_ref = (math.lgamma(steps + 1) - math.lgamma(k + 1) - math.lgamma(steps - k + 1)
                   + (steps - k) * math.log(a) + k * math.log(-b))
        ref = (-1) ** k * math.exp(log_ref) if log_ref > -740 else 0.0
        assert c[k].item() == pytest.approx(ref, rel=1e-9, abs=1e-15)
