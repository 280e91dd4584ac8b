"""Edge-case probes of the layers: ``DiffusionAttention``, ``Block``, the head layouts and rotary embeddings.

Probed against independent float64 references: ``DiffusionAttention`` vs ``nn.MultiheadAttention``
(padding, bool / float / per-head masks, causal); Laplacian heads vs ``(I - P) v``; grouped-query
attention vs key/value heads repeated by hand; RoPE (1-D and 2-D, offset and float positions,
non-default base, C = 2 and C = 6) vs the RoFormer rotation written out, and its relative-position
property; the block (pre-norm residual, LayerScale, RMSNorm) vs a hand formula; fully masked rows
(``c0 v`` on every back-end); B = 0, N = 0, N = 1; wrong mask dtypes and shapes; strict state-dict
round trips, pickle, deepcopy, half / bfloat16, non-contiguous inputs and masks;
``torch.compile(fullgraph=True)``.

Found and fixed (each pinned by a "Bug:" test below):

* ``DiffusionAttention`` on an empty batch (or no tokens) worked without masks but failed with any
  shorthand (``key_padding_mask=``, ``attn_mask=``, ``is_causal=True``): "batch_size must be >= 1,
  got 0" (or "seq_len must be >= 1") from the graph it built;
* ``Block`` did not check ``dim``: ``Block(0, 4)`` blamed ``mlp_ratio``, ``Block("16", 4)`` raised
  "can't multiply sequence by non-int", ``Block(16.0, 4)`` "'float' object is not iterable";
* ``DiffusionAttention.from_multihead_attention(mha, num_kv_heads=2)`` raised a bare size-mismatch
  ``RuntimeError`` from ``copy_``;
* a bad ``dropout`` attribute on a sparse call was reported as ``dropout_p`` (the dense path names
  ``dropout``).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.block import Block
from diffusionformer.nn.rotary import RotaryEmbedding, RotaryEmbedding2D


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _heads_ref(layer, x, laplacian, mask=None, kv_groups=None):
    """``out_proj([f_h(P_h) v_h])`` with ``P = softmax(q k^T / sqrt(C) masked)``, ``f = P`` or ``I - P``."""
    B, N, D = x.shape
    H, C = layer.num_heads, layer.head_dim
    G = layer.num_kv_heads
    q, k, v = layer.qkv(x).split([H * C, G * C, G * C], -1)
    q = q.view(B, N, H, C).transpose(1, 2)
    k, v = (t.view(B, N, G, C).transpose(1, 2) for t in (k, v))
    idx = [h * G // H for h in range(H)]  # query head h reads key/value head h // (H / G)
    k, v = k[:, idx], v[:, idx]
    s = q @ k.transpose(-1, -2) / math.sqrt(C)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    o = s.softmax(-1) @ v
    for h in laplacian:
        o[:, h] = v[:, h] - o[:, h]
    return layer.out_proj(o.transpose(1, 2).reshape(B, N, D))


# ---------------------------------------------------------------------------------------------- bugs
@pytest.mark.parametrize("B, N", [(0, 5), (2, 0)])
def test_bug_empty_batch_with_mask_shorthands(B, N):
    """Bug: an empty batch (or no tokens) ran without masks but failed with every shorthand: "batch_size must
    be >= 1, got 0" from the AttentionGraph the layer built. Now the shapes come back (with a backward), and a
    mask of the wrong shape or dtype is still refused, naming it."""
    layer = DiffusionAttention(16, 4, heads="heat-exact:2,laplacian:2").double()
    x = _rand(B, N, 16).requires_grad_()
    for kw in (dict(key_padding_mask=torch.zeros(B, N, dtype=torch.bool)), dict(is_causal=True),
               dict(attn_mask=torch.ones(N, N, dtype=torch.bool)), dict(attn_mask=torch.zeros(N, N))):
        y = layer(x, **kw)
        assert y.shape == (B, N, 16)
        y.sum().backward()
    assert layer(x, is_causal=True, return_intermediates=True)[1].attn_weights.shape == (B, 4, N, N)
    with pytest.raises(ValueError, match="key_padding_mask must have shape"):
        layer(x, key_padding_mask=torch.zeros(B, N + 1, dtype=torch.bool))
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor.*int32"):
        layer(x, key_padding_mask=torch.zeros(B, N, dtype=torch.int32))
    with pytest.raises(ValueError, match="attn_mask must be broadcastable"):
        layer(x, attn_mask=torch.ones(N + 1, N + 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        layer(x, is_causal=1)


@pytest.mark.parametrize("dim", [0, -4, "16", 16.0, True])
def test_bug_block_names_a_bad_dim(dim):
    """Bug: ``Block`` did not check ``dim``: 0 blamed ``mlp_ratio``, a string raised "can't multiply sequence by
    non-int", a float "'float' object is not iterable" (from LayerNorm), True a torch ``empty()`` error."""
    with pytest.raises(ValueError, match=r"dim must be a positive int, got " + repr(dim).replace(".", r"\.")):
        Block(dim, 4)


def test_block_takes_a_numpy_dim():
    np = pytest.importorskip("numpy")
    assert Block(np.int64(8), 2)(torch.randn(1, 3, 8)).shape == (1, 3, 8)


def test_bug_from_multihead_attention_refuses_num_kv_heads():
    """Bug: ``from_multihead_attention(mha, num_kv_heads=2)`` failed in ``copy_`` with "The size of tensor a (32)
    must match the size of tensor b (48)": MultiheadAttention has one key and value per head."""
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    with pytest.raises(ValueError, match=r"num_kv_heads=2.*num_kv_heads=None or num_heads=4"):
        DiffusionAttention.from_multihead_attention(mha, num_kv_heads=2)
    assert DiffusionAttention.from_multihead_attention(mha, num_kv_heads=4).num_kv_heads == 4


def test_bug_sparse_call_names_the_dropout_attribute():
    """Bug: a bad ``dropout`` attribute on a sparse call was reported as "dropout_p must lie in [0, 1)" (the
    functional argument); the dense call names the layer's attribute, ``dropout``."""
    layer = DiffusionAttention(8, 2, heads="attention:1,laplacian:1").train()
    layer.dropout = 1.5
    with pytest.raises(ValueError, match=r"^dropout must lie in \[0, 1\), got 1.5"):
        layer(torch.randn(3, 8), edge_index=torch.tensor([[0, 1, 2], [1, 2, 0]]))


# ---------------------------------------------------------------------------------------------- references
def test_gqa_laplacian_heads_match_keys_and_values_repeated_by_hand():
    """``num_kv_heads=2`` of 4 heads, two Laplacian, with padding and on every dense back-end."""
    kpm = torch.zeros(3, 5, dtype=torch.bool)
    kpm[0, 3:] = True
    x = _rand(3, 5, 16, seed=1)
    for backend in ("sdpa", "matrix", "auto"):
        torch.manual_seed(2)
        layer = DiffusionAttention(16, 4, heads="attention:2,laplacian:2", num_kv_heads=2, backend=backend).double()
        torch.testing.assert_close(layer(x), _heads_ref(layer, x, [2, 3]), rtol=0, atol=1e-12)
        torch.testing.assert_close(layer(x, key_padding_mask=kpm), _heads_ref(layer, x, [2, 3], ~kpm[:, None, None]),
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["sdpa", "matrix", "auto"])
@pytest.mark.parametrize("heads", ["attention:1,laplacian:1", "heat(t=0.5, steps=3):1,ppr(alpha=0.2, steps=3):1"])
def test_fully_masked_row_outputs_c0_v(backend, heads):
    """A query row with every key masked (bool or -inf float) gives ``c0 v`` per head, never NaN."""
    torch.manual_seed(3)
    layer = DiffusionAttention(8, 2, heads=heads, backend=backend).double()
    x = _rand(2, 4, 8, seed=4)
    v = layer.qkv(x)[..., 16:].view(2, 4, 2, 4)
    c0 = layer.coefficients()[:, 0]
    m = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    m[0, 0, 1] = False
    for mask in (m, torch.zeros(m.shape, dtype=torch.float64).masked_fill(~m, float("-inf"))):
        y = layer(x, attn_mask=mask)
        assert not y.isnan().any()
        expected = layer.out_proj((c0[:, None] * v[0, 1]).reshape(8))
        torch.testing.assert_close(y[0, 1], expected, rtol=0, atol=1e-12)


def test_rotary_matches_roformer_with_offsets_bases_and_widths(rope_ref):
    """1-D (C = 2, 6, 8; int, offset and float positions; base 37.5) and axial 2-D RoPE vs the formula, and the
    relative-position property: ``<R_m q, R_n k>`` depends on ``n - m`` only (on both offsets in 2-D)."""
    x = _rand(2, 6, 3, 8, seed=5)
    pos = torch.arange(6) + 17
    for C in (2, 6, 8):
        rope = RotaryEmbedding(C, base=37.5)
        for p in (pos, pos.int(), pos.double() * 0.5):
            torch.testing.assert_close(rope(x[..., :C], p), rope_ref(x[..., :C], p, 37.5), rtol=0, atol=1e-12)
    xs = _rand(2, 6, 3, 16, seed=6)[..., ::2]  # strided
    torch.testing.assert_close(RotaryEmbedding(8)(xs, pos), rope_ref(xs, pos, 10000.0), rtol=0, atol=1e-12)
    r2 = RotaryEmbedding2D(8, base=50.0)
    grid = torch.tensor([[0, 0], [1, 2], [3, 1], [2, 2], [5, 0], [4, 4]])
    ref2 = torch.cat([rope_ref(x[..., :4], grid[:, 0], 50.0), rope_ref(x[..., 4:], grid[:, 1], 50.0)], -1)
    torch.testing.assert_close(r2(x, grid), ref2, rtol=0, atol=1e-12)
    q, k = _rand(1, 1, 8, seed=7), _rand(1, 1, 8, seed=8)

    def score(rope, m, n):
        return (rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum()

    r1 = RotaryEmbedding(8, base=37.5)
    torch.testing.assert_close(score(r1, 3, 1), score(r1, 10, 8), rtol=0, atol=1e-12)
    torch.testing.assert_close(score(r1, 0, 5), score(r1, 100, 105), rtol=0, atol=1e-12)
    torch.testing.assert_close(score(r2, [1, 2], [3, 7]), score(r2, [11, -4], [13, 1]), rtol=0, atol=1e-12)


def test_rotary_layer_matches_rotated_scores_by_hand(rope_ref):
    """A layer with RoPE (base 100, positions offset by 3) and a Laplacian head vs rotating q, k by hand."""
    torch.manual_seed(9)
    layer = DiffusionAttention(16, 2, heads="attention:1,laplacian:1", rotary=RotaryEmbedding(8, base=100.0)).double()
    x = _rand(2, 5, 16, seed=10)
    P = torch.arange(5) + 3
    B, N = 2, 5
    q, k, v = (t.view(B, N, 2, 8) for t in layer.qkv(x).split(16, -1))
    q, k = rope_ref(q, P, 100.0), rope_ref(k, P, 100.0)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    o = (q @ k.transpose(-1, -2) / math.sqrt(8)).softmax(-1) @ v
    o[:, 1] = v[:, 1] - o[:, 1]
    torch.testing.assert_close(layer(x, positions=P), layer.out_proj(o.transpose(1, 2).reshape(B, N, 16)),
                               rtol=0, atol=1e-12)


def test_block_is_the_prenorm_residual_with_rmsnorm_and_layer_scale():
    """Eval block (dropout 0.5 and drop path 0.2 off) = ``x + g1 Attn(rms(x))``, then ``+ g2 Mlp(rms(.))``,
    RMSNorm with eps = the dtype's epsilon (``eps=None``)."""
    torch.manual_seed(11)
    blk = Block(16, 4, heads="attention:2,laplacian:2", norm_layer="rmsnorm", layer_scale=0.3, dropout=0.5,
                drop_path=0.2).double().eval()
    x = _rand(2, 5, 16, seed=12)
    eps = torch.finfo(torch.float64).eps

    def rms(t, w):
        return t / torch.sqrt((t * t).mean(-1, keepdim=True) + eps) * w

    g1, g2 = blk.ls1.gamma, blk.ls2.gamma
    y = x + g1 * blk.attn(rms(x, blk.norm1.weight))
    y = y + g2 * blk.mlp.fc2(nn.functional.gelu(blk.mlp.fc1(rms(y, blk.norm2.weight))))
    torch.testing.assert_close(blk(x), y, rtol=0, atol=1e-12)


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compile_fullgraph_matches_eager():
    """``torch.compile(fullgraph=True)`` (eager back-end: cheap) of a small mixed layer, with and without padding."""
    torch.manual_seed(13)
    layer = DiffusionAttention(8, 2, heads="attention:1,laplacian:1").eval()
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    x = torch.randn(1, 3, 8)
    kpm = torch.tensor([[False, False, True]])
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), layer(x), rtol=0, atol=0)
        torch.testing.assert_close(compiled(x, key_padding_mask=kpm), layer(x, key_padding_mask=kpm), rtol=0, atol=0)
