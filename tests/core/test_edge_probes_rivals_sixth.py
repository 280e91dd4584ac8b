"""Sixth edge probe of the rival operators: pins of behaviour checked against the papers (no bug found)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.func as tf
from torch.autograd import gradcheck

from diffusionformer import operators as ops
from diffusionformer.operators.differential import lambda_init_schedule
from diffusionformer.ops.reference_rivals import rival_reference
from diffusionformer.ops.rivals import RivalContext

B, G, N, C = 2, 2, 5, 4


def _inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v, v0 = (torch.randn(B, G, N, C, dtype=torch.float64, generator=g) for _ in range(4))
    keep = torch.ones(B, N, dtype=torch.bool)
    keep[0, -2:] = False
    keep[1, :] = False  # a batch element with no admissible key at all
    return q, k, v, v0, keep.view(B, 1, 1, N)


def _ops():
    return [ops.DifferentialOperator(head_dim=C, num_heads=G).double(), ops.AttnScaleOperator(omega=0.3, num_heads=G),
            ops.NeuTRENOOperator(), ops.NonlinearDiffusionOperator(t=1.3, steps=3, method="rk4"),
            ops.NonlinearDiffusionOperator(t=1.3, steps=3)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("float_mask", [False, True])
def test_rivals_with_a_fully_padded_batch_element_match_the_papers(causal, float_mask):
    """A batch element whose keys are all padded (bool or 0/-inf float padding, with and without the causal
    mask) gives finite outputs equal to the float64 transcriptions; padding stays out of AttnScale's DC."""
    q, k, v, v0, km = _inputs()
    allowed = km.expand(B, G, N, N).clone()
    if causal:
        allowed &= torch.ones(N, N, dtype=torch.bool).tril()
    mask = torch.where(km, 0.0, float("-inf")).double() if float_mask else km
    for op in _ops():
        out = op.apply_context(RivalContext.dense(q, k, v, attn_mask=mask, is_causal=causal, v0=v0, depth=3))
        ref = rival_reference(op, q, k, v, allowed=allowed, v0=v0, depth=3)
        assert torch.isfinite(out).all(), op.name
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12, msg=op.name)


def test_learned_rival_parameters_pass_gradcheck_under_causal_padding():
    """The differential lambdas and RMSNorm gain, and AttnScale's omega, have exact gradients (float64)."""
    q, k, v, _, km = _inputs()
    diff = ops.DifferentialOperator(head_dim=C, num_heads=G).double()
    names = ["lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "subln.weight"]
    params = dict(diff.named_parameters())

    def f(*xs):
        ctx = RivalContext.dense(q, k, v, attn_mask=km, is_causal=True, depth=2)
        return tf.functional_call(diff, dict(zip(names, xs)), (ctx,), strict=False)

    diff.forward = diff.apply_context
    assert gradcheck(f, tuple(params[n].detach().clone().requires_grad_() for n in names))
    scale = ops.AttnScaleOperator(omega=0.2, num_heads=G).double()
    scale.forward = scale.apply_context
    ctx = RivalContext.dense(q, k, v, attn_mask=km, is_causal=True)
    assert gradcheck(lambda w: tf.functional_call(scale, {"omega": w}, (ctx,)),
                     (scale.omega.detach().clone().requires_grad_(),))


def test_lambda_init_schedule_is_the_papers_with_layer_one_at_depth_zero():
    """Paper: 0.8 - 0.6 exp(-0.3 (l - 1)) for l = 1..L; the reference code passes the 0-based index."""
    for layer in range(1, 13):
        assert lambda_init_schedule(layer - 1) == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * (layer - 1)), abs=0)
