"""Edge probes (third pass) of DiffusionAttention: mask dtypes, gradients through a float mask, CPU autocast, dropout.

No bug was found in this pass: these pin promises that hold, each against a reference that does not share the
layer's code (an explicit float64 softmax and per-head polynomial, autograd's gradcheck, the float32 layer).
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.nn import DiffusionAttention

B, N, D, H = 2, 6, 16, 4


def _reference(layer: DiffusionAttention, x: torch.Tensor, additive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer in float64 for polynomial heads: sum_k c_hk P_h^k v_h with P_h = softmax(q k^T / sqrt(C) + mask)."""
    C = D // H
    qkv = x.double() @ layer.qkv.weight.double().T + layer.qkv.bias.double()
    q, k, v = (t.view(B, N, H, C).transpose(1, 2) for t in qkv.split(D, -1))
    P = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(C) + additive, -1)
    coeffs = layer.coefficients().double()
    heads = []
    for h in range(H):
        acc, Pk = torch.zeros_like(v[:, h]), v[:, h]
        for c in coeffs[h]:
            acc, Pk = acc + c * Pk, P[:, h] @ Pk
        heads.append(acc)
    out = torch.stack(heads, 1).transpose(1, 2).reshape(B, N, D)
    return out @ layer.out_proj.weight.double().T + layer.out_proj.bias.double(), P


@pytest.mark.parametrize("heads", [None, "attention:2,laplacian:2", "heat(t=0.5):2,attention:2", "ppr(alpha=0.2):2,laplacian:2"])
@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
def test_float_masks_of_every_dtype_with_padding_match_float64(heads, backend):
    torch.manual_seed(0)
    layer = DiffusionAttention(D, H, heads, backend=backend)
    x = torch.randn(B, N, D)
    mask = torch.randn(N, N)
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[1, 4:] = True
    for dtype, tol in ((torch.float64, 1e-6), (torch.float32, 1e-6), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)):
        m = mask.to(dtype)  # the reference adds the mask as rounded to dtype
        additive = m.double().expand(B, H, N, N).masked_fill(kpm[:, None, None, :], float("-inf"))
        ref, P = _reference(layer, x, additive)
        y = layer(x, attn_mask=m, key_padding_mask=kpm)
        y2, inter = layer(x, attn_mask=m, key_padding_mask=kpm, return_intermediates=True)
        assert y.dtype == torch.float32
        torch.testing.assert_close(y.double(), ref, atol=tol, rtol=0)
        torch.testing.assert_close(y2.double(), ref, atol=tol, rtol=0)
        torch.testing.assert_close(inter.attn_weights.double(), P, atol=tol, rtol=0)


@pytest.mark.parametrize("heads", ["attention:1,laplacian:1", "heat-exact:1,attention:1",
                                   "ppr-exact:1,heat(t=0.3, learnable=True):1"])
@pytest.mark.parametrize("shape", [(N, N), (B, 2, N, N), (B, 1, 1, N)])
def test_gradcheck_through_a_learned_float_mask_with_padding(heads, shape):
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads).double()
    x = torch.randn(B, N, 8, dtype=torch.float64)
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[1, 3:] = True
    m = (0.3 * torch.randn(*shape, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda m: layer(x, attn_mask=m, key_padding_mask=kpm), (m,), eps=1e-6, atol=1e-5,
                                    fast_mode=True)


@pytest.mark.parametrize("heads", ["attention:2,laplacian:2", "heat(t=1.0):2,attention:2", "heat-exact:2,attention:2"])
def test_cpu_bf16_autocast_is_close_to_float32(heads):
    torch.manual_seed(0)
    layer = DiffusionAttention(D, H, heads).eval()
    x = torch.randn(B, N, D)
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[1, 4:] = True
    for kwargs in ({}, {"key_padding_mask": kpm}, {"attn_mask": torch.zeros(N, N)}):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x, **kwargs)
        assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
        torch.testing.assert_close(y.float(), layer(x, **kwargs), atol=3e-2, rtol=3e-2)


def test_dropout_is_off_in_eval_and_seeded_in_training():
    torch.manual_seed(0)
    layer = DiffusionAttention(D, H, "attention:2,heat(t=1.0):2", dropout=0.5)
    x = torch.randn(B, N, D)
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[0, -1] = True
    layer.eval()
    y_eval = layer(x, key_padding_mask=kpm)
    assert torch.equal(y_eval, layer(x, key_padding_mask=kpm))
    layer.train()
    torch.manual_seed(1)
    y1 = layer(x, key_padding_mask=kpm)
    torch.manual_seed(1)
    assert torch.equal(y1, layer(x, key_padding_mask=kpm))
    assert not torch.allclose(y1, y_eval)


def test_three_dim_mask_is_broadcast_as_sdpa_and_refused_when_it_cannot():
    """A (B, N, N) mask broadcasts as (1, B, N, N) against (B, H, N, N) (SDPA's rule, documented); with B != H it is
    refused with the shape named, never reinterpreted per sequence."""
    layer = DiffusionAttention(D, H)
    x = torch.randn(B, N, D)
    with pytest.raises(ValueError, match=r"\(2, 6, 6\)"):
        layer(x, attn_mask=torch.ones(B, N, N, dtype=torch.bool))
