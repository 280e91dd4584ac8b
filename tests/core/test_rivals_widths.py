"""``RivalContext.attend`` with score and signal widths that differ (the fused-kernel padding).

Differential attention scores with half-width queries, AttnScale's uniform map with width-1
zero queries and GRAND-nl propagates a state three times wider than its queries. The dense
context zero-pads the narrower side so that SDPA keeps its fused kernel; these tests check
that the padding changes nothing: values and gradients against an explicit float64 softmax,
causal, padded (with a row without admissible keys) and both ways round.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.ops.rivals import RivalContext

f64 = torch.float64


def explicit_attend(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, scale: float, allowed: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T scale)`` over the allowed keys, times ``x``; rows without keys give 0 (float64)."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return p @ x.double()


@pytest.mark.parametrize("cq, cx, N", [(4, 8, 7), (1, 8, 7), (8, 24, 7), (8, 24, 520), (8, 3, 7)])
@pytest.mark.parametrize("causal, padded", [(True, False), (False, True), (True, True)])
def test_attend_with_unequal_widths_matches_explicit_softmax(cq, cx, N, causal, padded):
    """Padded (2 cq >= cx, cq > cx, or >= 512 keys) and unpadded (math path) cases."""
    torch.manual_seed(0)
    B, G = 2, 3
    q = torch.randn(B, G, N, cq, requires_grad=True)
    k = torch.randn(B, G, N, cq, requires_grad=True)
    x = torch.randn(B, G, N, cx, requires_grad=True)
    v = torch.randn(B, G, N, 8)
    allowed = torch.ones(B, 1, N, N, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    mask = None
    if padded:
        keep = torch.ones(B, N, dtype=torch.bool)
        keep[0, :3] = False  # with the causal mask, rows 0-2 of sequence 0 have no admissible key
        keep[1, -2:] = False
        allowed = allowed & keep[:, None, None, :]
        mask = allowed if not causal else keep[:, None, None, :]
    ctx = RivalContext.dense(q, k, v, attn_mask=mask, is_causal=causal)
    scale = 0.7
    out = ctx.attend(q, k, x, scale=scale)
    assert out.shape == (B, G, N, cx)
    ref = explicit_attend(q, k, x, scale, allowed)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(ref)
    grads = torch.autograd.grad((out.double() * g).sum(), (q, k, x))
    grads_ref = torch.autograd.grad((ref * g).sum(), (q, k, x))
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_uniform_is_the_mean_over_admissible_keys(causal):
    torch.manual_seed(1)
    B, G, N, C = 2, 2, 9, 5
    q, k, v = (torch.randn(B, G, N, C) for _ in range(3))
    keep = torch.ones(B, N, dtype=torch.bool)
    keep[1, :4] = False
    allowed = keep[:, None, None, :].expand(B, 1, N, N)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    ctx = RivalContext.dense(q, k, v, attn_mask=keep[:, None, None, :], is_causal=causal)
    count = allowed.double().sum(-1, keepdim=True)
    ref = torch.where(count > 0, (allowed.double() @ v.double()) / count.clamp_min(1), 0.0)
    torch.testing.assert_close(ctx.uniform(v).double(), ref, atol=1e-6, rtol=1e-6)
