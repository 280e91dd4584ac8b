"""Edge probes of the modern layer parts: DiffusionAttention against nn.MultiheadAttention, Block, rotary, KV cache."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffusionformer.nn import Block, DiffusionAttention, Mlp, make_norm
from diffusionformer.nn.kv_cache import LayerKVCache
from diffusionformer.nn.rotary import RotaryEmbedding


def test_bug_block_norm_or_mlp_callable_returning_a_non_module_is_named():
    """Bug: ``Block(norm_layer=...)`` / ``Block(mlp_layer=...)`` / ``make_norm`` accepted a callable that returns a
    plain function (or ``None``) and stored it as an attribute; the block reads its parts through ``_modules``, so
    the first call failed far from the cause with a bare ``KeyError('norm1')`` (``KeyError('mlp')``)."""
    with pytest.raises(TypeError, match=r"norm must be a callable dim -> Module, and it returned function"):
        Block(8, 2, norm_layer=lambda d: (lambda t: t))
    with pytest.raises(TypeError, match=r"norm must be a callable dim -> Module, and it returned NoneType"):
        make_norm(lambda d: None, 8)
    with pytest.raises(TypeError, match=r"mlp_layer must be a callable dim -> Module, and it returned function"):
        Block(8, 2, mlp_layer=lambda d: (lambda t: t))
    # module classes and factories keep working
    blk = Block(8, 2, norm_layer=nn.RMSNorm, mlp_layer=lambda d: nn.Linear(d, d))
    assert blk(torch.randn(2, 3, 8)).shape == (2, 3, 8)


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("backend", ["sdpa", "matrix"])
def test_layer_matches_multihead_attention_for_3d_masks_both_layouts(batch_first, bias, backend):
    """MultiheadAttention's (B * H, N, N) masks (bool and float) viewed as (B, H, N, N), with key padding, in
    float64, per-head weights included; the weights do not depend on MHA's batch_first."""
    torch.manual_seed(0)
    B, N, D, H = 3, 5, 8, 2
    mha = nn.MultiheadAttention(D, H, bias=bias, batch_first=batch_first, dropout=0.3).double().eval()
    att = DiffusionAttention.from_multihead_attention(mha, backend=backend).eval()
    x = torch.randn(B, N, D, dtype=torch.float64)
    xin = x if batch_first else x.transpose(0, 1)
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[0, -2:] = True
    am_float = torch.randn(B * H, N, N, dtype=torch.float64)
    am_bool = torch.rand(B * H, N, N) < 0.3
    am_bool[:, torch.arange(N), torch.arange(N)] = False  # no fully masked row (MHA gives NaN there)
    for am, layer_mask in ((am_float, am_float.view(B, H, N, N)), (am_bool, ~am_bool.view(B, H, N, N))):
        ref, w = mha(xin, xin, xin, key_padding_mask=kpm, attn_mask=am.to(kpm.dtype) if am.dtype == torch.bool else am,
                     need_weights=True, average_attn_weights=False)
        ref = ref if batch_first else ref.transpose(0, 1)
        out, inter = att(x, key_padding_mask=kpm, attn_mask=layer_mask, return_intermediates=True)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(att(x, key_padding_mask=kpm, attn_mask=layer_mask), ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(inter.attn_weights, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("heads", ["heat(t=1.0, steps=3):2,attention:2", "heat-exact:1,laplacian:1,ppr:2"])
def test_cache_with_empty_chunks_and_gqa_rotary_equals_full_forward(heads):
    """Decoding in chunks of 3, 0, 1, 2, 0, 1 tokens (an empty chunk in between) equals the full causal forward."""
    torch.manual_seed(0)
    att = DiffusionAttention(16, 4, heads, causal=True, num_kv_heads=2, rotary=RotaryEmbedding(4),
                             qk_norm=True).double().eval()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    cache, outs, at = LayerKVCache(), [], 0
    for n in (3, 0, 1, 2, 0, 1):
        outs.append(att(x[:, at : at + n], cache=cache))
        at += n
    assert cache.length == 7
    torch.testing.assert_close(torch.cat(outs, 1), att(x), rtol=0, atol=1e-12)


def test_bug_norm_and_mlp_layer_module_instances_are_named():
    """Bug: a module instance where a class or factory is expected (``make_norm(nn.LayerNorm(8), 8)``,
    ``Block(norm_layer=nn.RMSNorm(8))``, ``Block(mlp_layer=Mlp(8))``) was called with the width and failed in its
    forward with "layer_norm(): argument 'input' (position 1) must be Tensor, not int", naming no argument."""
    with pytest.raises(TypeError, match=r"norm must be 'layernorm', 'rmsnorm' or a callable dim -> Module .*instance"):
        make_norm(nn.LayerNorm(8), 8)
    with pytest.raises(TypeError, match=r"norm must be .* got the instance RMSNorm"):
        Block(8, 2, norm_layer=nn.RMSNorm(8))
    with pytest.raises(TypeError, match=r"mlp_layer must be None, one of .* or a callable dim -> Module .* got the instance Mlp"):
        Block(8, 2, mlp_layer=Mlp(8))
