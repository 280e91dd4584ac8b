"""Edge-case probes of the layers, fourth round: ``DiffusionAttention``'s constructors and masks, ``Mlp``,
``LayerScale``, ``Block`` and the head layouts.

Probed against independent float64 references: ``DiffusionAttention.from_multihead_attention`` vs
``nn.MultiheadAttention`` (``batch_first`` False too, no bias, 4-D per-head masks, per-head weights with
``average_attn_weights=False``, key padding with a causal layer); ``from_transformer_conv`` vs PyG's
``TransformerConv`` (isolated nodes, duplicate edges and self loops, attention weights, no bias);
grouped-query attention, q/k LayerNorm with random affine parameters and 1-D RoPE at arbitrary positions
together, with Laplacian heads, on every dense back-end and on the sparse complete graph, vs the formula
written out; head specs (templates, empty counts, shared instances) and ``heads_spec`` round trips through
strict state dicts; autocast to bfloat16 on every back-end; deepcopy and pickle with rotary, q/k norm and GQA.

Found and fixed (each pinned by a "Bug:" test below):

* ``attn_mask`` together with ``key_padding_mask``: a mask of the wrong shape was reported with the shape of
  the mask after the padding was folded in (``(3, 5, 5)`` given, ``(2, 3, 5, 5)`` named); and
  ``nn.MultiheadAttention``'s ``(B * H, N, M)`` mask got no hint of the ``(B, H, N, M)`` layout;
* ``from_transformer_conv`` of a bipartite ``TransformerConv((6, 8), ...)`` failed in ``torch.cat`` ("Sizes of
  tensors must match"), and of a lazy one (``in_channels=-1``) with "Can't access the shape of an
  uninitialized parameter";
* ``from_multihead_attention(mha, bias=False)`` (or ``dropout=``, and the same for ``from_transformer_conv``)
  raised Python's "got multiple values for keyword argument 'bias'";
* ``Mlp`` and ``LayerScale`` did not check ``dim``: a str or float failed inside ``torch.empty`` /
  ``torch.full``, ``0`` built a module of width 0; ``Mlp(act_layer=nn.GELU())`` (an instance) failed with
  "forward() missing 1 required positional argument"; ``Block(mlp_layer=5)`` with "'int' object is not
  callable";
* ``laplacian_count(np.array([1, 2]), 4)`` raised numpy's "truth value of an array ... is ambiguous".

Not changed (design): a state dict loads into a layer with another layout of parameter-free heads
(``attention:4`` into ``attention:2,laplacian:2``): such operators add no parameters, so the state dicts agree.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.block import Block, LayerScale, Mlp
from diffusionformer.nn.heads import laplacian_count
from diffusionformer.nn.rotary import RotaryEmbedding


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------- bugs
def test_bug_mask_shape_error_names_the_mask_given():
    """Bug: with ``key_padding_mask``, an ``attn_mask`` of shape (3, 5, 5) for B = H = 2 was refused as "got shape
    (2, 3, 5, 5)" (the mask after the padding was folded in), and MultiheadAttention's (B * H, N, M) mask got no
    hint of the (B, H, N, M) layout the layer reads."""
    layer = DiffusionAttention(8, 2).double()
    x = _rand(2, 5, 8, seed=1)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"got shape \(3, 5, 5\)$"):
        layer(x, attn_mask=torch.ones(3, 5, 5, dtype=torch.bool), key_padding_mask=kpm)
    m = torch.rand(4, 5, 5, generator=torch.Generator().manual_seed(2)) > 0.3
    for kw in ({}, {"key_padding_mask": kpm}):
        with pytest.raises(ValueError, match=r"got shape \(4, 5, 5\); nn.MultiheadAttention's .*view\(2, 2, 5, 5\)"):
            layer(x, attn_mask=m, **kw)
    # the hint's reshape is MultiheadAttention's own layout: the same output
    mha = nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    layer = DiffusionAttention.from_multihead_attention(mha)
    m |= torch.eye(5, dtype=torch.bool)
    torch.testing.assert_close(layer(x, attn_mask=m.view(2, 2, 5, 5)),
                               mha(x, x, x, attn_mask=~m, need_weights=False)[0], rtol=0, atol=1e-12)


def test_bug_from_transformer_conv_refuses_bipartite_and_lazy_convs():
    """Bug: ``from_transformer_conv(TransformerConv((6, 8), 4, heads=2, root_weight=False))`` failed in
    ``torch.cat`` with "Sizes of tensors must match" (only the query side was checked), and a lazy conv
    (``in_channels=-1``) with "Can't access the shape of an uninitialized parameter"."""
    pyg = pytest.importorskip("torch_geometric.nn")
    conv = pyg.TransformerConv((6, 8), 4, heads=2, root_weight=False)
    with pytest.raises(ValueError, match=r"in_channels=\(6, 8\) must equal heads\*out_channels \(8\)"):
        DiffusionAttention.from_transformer_conv(conv)
    with pytest.raises(ValueError, match=r"in_channels=-1 is lazy"):
        DiffusionAttention.from_transformer_conv(pyg.TransformerConv(-1, 4, heads=2, root_weight=False))
    conv = pyg.TransformerConv((8, 8), 4, heads=2, root_weight=False).double()  # both sides D: taken
    x, ei = _rand(5, 8, seed=3), torch.tensor([[0, 1, 2, 3, 4, 1], [1, 2, 3, 4, 0, 0]])
    torch.testing.assert_close(DiffusionAttention.from_transformer_conv(conv)(x, edge_index=ei), conv(x, ei),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("kw", [{"bias": False}, {"dropout": 0.2}, {"num_heads": 2}])
def test_bug_from_constructors_name_a_copied_setting(kw):
    """Bug: ``from_multihead_attention(mha, bias=False)`` (or ``dropout=``, ``num_heads=``; and the same for
    ``from_transformer_conv``) raised Python's "got multiple values for keyword argument 'bias'" instead of
    saying the setting is copied from the module."""
    name = next(iter(kw))
    with pytest.raises(TypeError, match=rf"from_multihead_attention: {name} is copied from the nn.MultiheadAttention"):
        DiffusionAttention.from_multihead_attention(nn.MultiheadAttention(8, 2, batch_first=True), **kw)
    pyg = pytest.importorskip("torch_geometric.nn")
    with pytest.raises(TypeError, match=rf"from_transformer_conv: {name} is copied from the TransformerConv"):
        DiffusionAttention.from_transformer_conv(pyg.TransformerConv(8, 4, heads=2, root_weight=False), **kw)


@pytest.mark.parametrize("dim", ["8", 8.0, 0, -2, True])
def test_bug_mlp_and_layer_scale_check_dim(dim):
    """Bug: ``Mlp`` and ``LayerScale`` did not check ``dim``: a str or float failed inside ``torch.empty`` /
    ``torch.full`` ("argument 'size' ..."), ``-2`` with "negative dimension", and ``0`` built a module of
    width 0 silently."""
    with pytest.raises(ValueError, match=rf"Mlp: dim must be a positive int, got {dim!r}"):
        Mlp(dim)
    with pytest.raises(ValueError, match=rf"LayerScale: dim must be a positive int, got {dim!r}"):
        LayerScale(dim)
    assert Mlp(np.int64(8)).fc1.in_features == 8 and LayerScale(np.int64(8)).gamma.shape == (8,)


def test_bug_mlp_act_layer_and_block_mlp_layer_are_named():
    """Bug: ``Mlp(8, act_layer=nn.GELU())`` (an instance, not a class) failed with "GELU.forward() missing 1
    required positional argument: 'input'"; ``Block(8, 2, mlp_layer=5)`` with "'int' object is not callable"."""
    with pytest.raises(TypeError, match=r"act_layer must be a module class such as nn.GELU"):
        Mlp(8, act_layer=nn.GELU())
    with pytest.raises(TypeError, match=r"mlp_layer must be None, one of .* or a callable dim -> Module, got int"):
        Block(8, 2, mlp_layer=5)
    assert isinstance(Mlp(8, act_layer=nn.SiLU).act, nn.SiLU)


def test_bug_laplacian_count_takes_an_array():
    """Bug: ``laplacian_count(np.array([1, 2]), 4)`` compared the array with "half" and raised numpy's "The truth
    value of an array with more than one element is ambiguous"; anything but "half" and lists is returned as is."""
    assert laplacian_count(np.array([1, 2]), 4).tolist() == [1, 2]
    assert laplacian_count(["half", np.int64(1)], 6) == [3, 1]


# ---------------------------------------------------------------------------- working edge cases (layers)
def _reference(layer, x, laplacian, pos, rope):
    B, N, D = x.shape
    H, C, G = layer.num_heads, layer.head_dim, layer.num_kv_heads
    q, k, v = layer.qkv(x).split([H * C, G * C, G * C], -1)
    q, k, v = q.view(B, N, H, C), k.view(B, N, G, C), v.view(B, N, G, C)
    q, k = layer.q_norm(q), layer.k_norm(k)
    q, k = rope(q, pos, layer.rotary.base), rope(k, pos, layer.rotary.base)
    idx = [h * G // H for h in range(H)]
    q, k, v = q.transpose(1, 2), k[:, :, idx].transpose(1, 2), v[:, :, idx].transpose(1, 2)
    s = (q @ k.transpose(-1, -2) / math.sqrt(C))
    if layer.causal:
        s = s.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
    o = s.softmax(-1) @ v
    for h in laplacian:
        o[:, h] = v[:, h] - o[:, h]
    return layer.out_proj(o.transpose(1, 2).reshape(B, N, D))


@pytest.mark.parametrize("backend", ["sdpa", "matrix", "auto"])
@pytest.mark.parametrize("heads, laplacian", [("attention:4", ()), ("laplacian:1,attention:3", (0,))])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_qk_norm_and_rope_together_match_the_formula(backend, heads, laplacian, causal, rope_ref):
    """GQA (H_kv = 2 of 4), q/k LayerNorm with random affine parameters and RoPE (base 100) at arbitrary positions,
    with a Laplacian head, equal the formula written out in float64 (dense); the sparse complete graph agrees."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, heads=heads, num_kv_heads=2, qk_norm=True, rotary=RotaryEmbedding(4, base=100.0),
                               backend=backend, causal=causal).double()
    with torch.no_grad():
        for p in (*layer.q_norm.parameters(), *layer.k_norm.parameters()):
            p.normal_()
    x, pos = _rand(2, 5, 16, seed=4), torch.tensor([3, 1, 4, 1, 5])
    ref = _reference(layer, x, laplacian, pos, rope_ref)
    torch.testing.assert_close(layer(x, positions=pos), ref, rtol=0, atol=1e-12)
    ei = torch.cartesian_prod(torch.arange(5), torch.arange(5)).T
    torch.testing.assert_close(layer(x[0], edge_index=ei, positions=pos), ref[0], rtol=0, atol=1e-12)


def test_multihead_attention_variants_and_per_head_weights():
    """``from_multihead_attention`` of a ``batch_first=False`` MHA (the weights are the same) and of a bias-free one
    equals MHA; the per-head ``P`` equals MHA's ``average_attn_weights=False`` weights with key padding; a causal
    layer with key padding equals MHA with the causal float mask and the padding."""
    torch.manual_seed(0)
    x = _rand(2, 5, 8, seed=5)
    mha = nn.MultiheadAttention(8, 2).double().eval()
    xt = x.transpose(0, 1)
    torch.testing.assert_close(DiffusionAttention.from_multihead_attention(mha)(x), mha(xt, xt, xt)[0].transpose(0, 1),
                               rtol=0, atol=1e-12)
    mha = nn.MultiheadAttention(8, 2, batch_first=True, bias=False).double().eval()
    layer = DiffusionAttention.from_multihead_attention(mha)
    assert layer.qkv.bias is None
    torch.testing.assert_close(layer(x), mha(x, x, x)[0], rtol=0, atol=1e-12)
    kpm = torch.tensor([[False] * 5, [False, False, True, True, True]])
    _, inter = layer(x, key_padding_mask=kpm, return_intermediates=True)
    torch.testing.assert_close(inter.attn_weights, mha(x, x, x, key_padding_mask=kpm, average_attn_weights=False)[1],
                               rtol=0, atol=1e-12)
    causal = DiffusionAttention.from_multihead_attention(mha, causal=True)
    cm = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
    torch.testing.assert_close(causal(x, key_padding_mask=kpm),
                               mha(x, x, x, attn_mask=cm, key_padding_mask=kpm.double().masked_fill(kpm, float("-inf")),
                                   need_weights=False)[0], rtol=0, atol=1e-12)


def test_transformer_conv_with_isolated_nodes_duplicates_and_weights():
    """``from_transformer_conv`` equals ``TransformerConv`` with an isolated node, duplicate edges and self loops,
    and its per-edge ``P`` equals the conv's attention weights on the same edges."""
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    conv = pyg.TransformerConv(8, 4, heads=2, root_weight=False, bias=False).double().eval()
    layer = DiffusionAttention.from_transformer_conv(conv)
    x = _rand(6, 8, seed=6)
    ei = torch.tensor([[0, 0, 1, 1, 2, 3], [1, 1, 1, 2, 2, 4]])  # node 0, 3 and 5 receive nothing
    torch.testing.assert_close(layer(x, edge_index=ei), conv(x, ei), rtol=0, atol=1e-12)
    _, (e, a) = conv(x, ei, return_attention_weights=True)
    _, inter = layer(x, edge_index=ei, return_intermediates=True)
    assert torch.equal(inter.edge_index, e)
    torch.testing.assert_close(inter.attn_weights, a, rtol=0, atol=1e-12)


def test_heads_spec_rebuilds_shared_and_learned_operators():
    """``heads_spec()`` of a layer with an instance shared by two heads, a learned heat, PPR and a polynomial with
    an ``init`` rebuilds a layer that takes the state dict strictly and gives the same output."""
    from diffusionformer.operators import build_operator

    torch.manual_seed(0)
    shared = build_operator("heat", learnable=True, num_heads=1)
    for heads in ([shared, shared, "attention", "laplacian"],
                  "heat(t=0.3, steps=5, learnable=True):2,ppr(alpha=0.2, steps=3):1,polynomial(steps=2, init=[0.5, 0.3, 0.2]):1"):
        a = DiffusionAttention(8, 4, heads=heads).double()
        b = DiffusionAttention(8, 4, heads=a.heads_spec()).double()
        b.load_state_dict(a.state_dict(), strict=True)
        x = _rand(2, 3, 8, seed=7)
        torch.testing.assert_close(b(x), a(x), rtol=0, atol=0)
