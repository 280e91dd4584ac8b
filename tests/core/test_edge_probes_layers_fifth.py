"""Edge probes of the dense layer API, fifth pass: ``DiffusionAttention``, ``Block`` and the functional ``diffuse``.

Bugs found (each test named ``test_bug_*``):

* a call with no sequences or no tokens (``B = 0`` or ``N = 0``) and a mask shorthand on another device than ``x``
  was refused ("attn_mask must be on the device of q", also for a ``key_padding_mask``), while every other call
  gets its masks moved to ``x``'s device by the graph (``AttentionGraph.attention_kwargs``);
* ``diffuse`` with a coefficient tensor on the meta device (CPU inputs) failed with torch's NotImplementedError
  "Cannot copy out of meta tensor; no data!";
* ``Block(x, return_intermediates=True)`` failed inside ``nn.Dropout`` ("dropout(): argument 'input' must be
  Tensor, not tuple").

Checked without finding a bug: every combination of bool/float ``attn_mask`` of shapes ``(N, N)``, ``(B, 1, N, N)``,
``(1, H, N, N)``, ``(B, H, N, N)``, ``(N, 1)``, ``(1, N)``, ``(B, 1, 1, N)`` with ``key_padding_mask`` and
``is_causal`` against an explicit float64 softmax (outputs, returned ``P`` and the gradient of a float mask) on the
three dense back-ends, fully masked rows (zero row of ``P``: the output is ``c_0 v`` on every path), grouped-query
attention with per-head masks, half/bfloat16 layers against float64, a layer on the meta device for shape
inference, ``heads_spec`` + strict ``state_dict`` round trips for every registered operator, and ``diffuse``'s
refusal of non-square ``P`` (``N != M``; ``attention_matrix`` and ``propagate_dense`` take cross-attention).
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer import functional as DF
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.block import Block

_DEFAULT_DTYPE = torch.float64


def _rand(*shape, seed=0, dtype=_DEFAULT_DTYPE):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def _reference(layer, x, allowed, add, coefficients):
    """The layer written out in float64: ``P = softmax(q k^T / sqrt(C) + add)`` over the ``allowed`` keys (a zero row
    where none is), head ``h`` outputs ``c0 v + c1 P v``; returns the output and ``P``."""
    B, N, D = x.shape
    H = layer.num_heads
    C = D // H
    q, k, v = (t.reshape(B, N, H, C).transpose(1, 2) for t in layer.qkv(x).split(D, -1))
    s = q @ k.transpose(-1, -2) * C**-0.5 + add
    s = s.masked_fill(~allowed, float("-inf"))
    ok = allowed.any(-1, keepdim=True)
    P = torch.softmax(s.masked_fill(~ok, 0.0), -1).masked_fill(~ok, 0.0)
    out = torch.stack([c0 * v[:, h] + c1 * P[:, h] @ v[:, h] for h, (c0, c1) in enumerate(coefficients)], 1)
    return layer.out_proj(out.transpose(1, 2).reshape(B, N, D)), P


@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
def test_mask_shapes_padding_and_causal_match_an_explicit_softmax(backend):
    B, N, H = 2, 5, 2
    layer = DiffusionAttention(8, H, heads="attention:1,laplacian:1", backend=backend).double()
    x = _rand(B, N, 8, seed=1)
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[0, 3:] = True
    kpm[1, 0] = True
    g = torch.Generator().manual_seed(2)
    for shape in [(N, N), (B, 1, N, N), (1, H, N, N), (B, H, N, N), (N, 1), (1, N), (B, 1, 1, N)]:
        keep = torch.rand(shape, generator=g) > 0.4
        bias = torch.randn(shape, generator=g, dtype=torch.float64)
        for float_mask in (False, True):
            mask = torch.where(keep, bias, float("-inf")) if float_mask else keep
            add = torch.where(keep, bias, 0.0) if float_mask else torch.zeros(())
            for padded in (False, True):
                for causal in (False, True):
                    allowed = keep.expand(B, H, N, N)
                    if padded:
                        allowed = allowed & ~kpm[:, None, None, :]
                    if causal:
                        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
                    want, P = _reference(layer, x, allowed, add, [(0.0, 1.0), (1.0, -1.0)])
                    kw = dict(attn_mask=mask, key_padding_mask=kpm if padded else None, is_causal=causal)
                    got, inter = layer(x, **kw, return_intermediates=True)
                    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
                    torch.testing.assert_close(inter.attn_weights, P, rtol=0, atol=1e-12)
                    torch.testing.assert_close(layer(x, **kw), want, rtol=0, atol=1e-12)


def test_meta_layer_infers_shapes_for_every_head_kind():
    x = torch.empty(2, 3, 8, device="meta")
    for heads in ("attention:1,laplacian:1", "heat(learnable=True):2", "heat-exact:1,attention:1", "ppr-exact:2"):
        layer = DiffusionAttention(8, 2, heads=heads).to("meta")
        assert layer(x).shape == (2, 3, 8)
        y, inter = layer(x, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool, device="meta"),
                         return_intermediates=True)
        assert y.is_meta and inter.attn_weights.shape == (2, 2, 3, 3)


def test_bug_empty_batch_moves_masks_to_the_device_of_x():
    """Bug: with ``B = 0`` or ``N = 0`` the layer skipped the graph and handed the mask shorthands to ``diffuse`` as
    given, which refused a mask on another device than ``x`` ("attn_mask must be on the device of q (meta), got cpu",
    for a ``key_padding_mask`` too), while the same masks with ``B, N >= 1`` are moved to ``x``'s device by
    ``AttentionGraph.attention_kwargs``: a model on an accelerator with masks built on the CPU failed on an empty
    batch only. (The meta device stands in for the accelerator.)"""
    layer = DiffusionAttention(8, 2, heads="attention:1,laplacian:1").to("meta")
    for B, N in ((2, 3), (0, 3), (2, 0)):
        x = torch.empty(B, N, 8, device="meta")
        for kw in (dict(key_padding_mask=torch.zeros(B, N, dtype=torch.bool)),
                   dict(attn_mask=torch.ones(N, N, dtype=torch.bool)),
                   dict(attn_mask=torch.zeros(N, N), key_padding_mask=torch.zeros(B, N, dtype=torch.bool)),
                   dict(attn_mask=torch.zeros(N, N), is_causal=True)):
            y = layer(x, **kw)
            assert y.is_meta and y.shape == (B, N, 8), (B, N, kw)
    # a mask on the meta device has no values to move
    cpu = DiffusionAttention(8, 2)
    with pytest.raises(ValueError, match=r"key_padding_mask is on the meta device, which has no values to copy to "
                                         r"the device of x \(cpu\)"):
        cpu(torch.zeros(0, 3, 8), key_padding_mask=torch.zeros(0, 3, dtype=torch.bool, device="meta"))
    # the checks still name a bad mask
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor"):
        cpu(torch.zeros(0, 3, 8), key_padding_mask=torch.zeros(0, 3))
    with pytest.raises(ValueError, match=r"attn_mask must be broadcastable to \(B, H, N, M\)"):
        cpu(torch.zeros(0, 3, 8), attn_mask=torch.ones(4, 4, dtype=torch.bool))


def test_bug_diffuse_names_coefficients_on_the_meta_device():
    """Bug: ``diffuse(q, k, v, coeffs_on_meta)`` with CPU inputs failed with torch's NotImplementedError "Cannot copy
    out of meta tensor; no data!" from the copy of the coefficients to the inputs' device. Now a ValueError names
    ``coeffs``; coefficients on the CPU for meta inputs are still copied there (shape inference)."""
    q, k, v = (_rand(1, 2, 3, 4, seed=s, dtype=torch.float32) for s in (3, 4, 5))
    for call in (DF.diffuse, DF.diffuse_with_weights):
        with pytest.raises(ValueError, match=r"coeffs is on the meta device, which has no values to copy to the "
                                             r"device of the inputs \(cpu\)"):
            call(q, k, v, torch.tensor([0.0, 1.0], device="meta"))
    qm, km, vm = (t.to("meta") for t in (q, k, v))
    assert DF.diffuse(qm, km, vm, torch.tensor([0.5, -1.0, 0.25])).is_meta
    assert DF.diffuse(qm, km, vm, torch.tensor([0.5, -1.0, 0.25], device="meta")).shape == (1, 2, 3, 4)
    want = DF.diffuse(q, k, v, [0.5, -1.0, 0.25])
    torch.testing.assert_close(DF.diffuse(q, k, v, torch.tensor([0.5, -1.0, 0.25], dtype=torch.float64)), want)


def test_bug_block_refuses_return_intermediates():
    """Bug: ``Block(...)(x, return_intermediates=True)`` passed the flag to its attention and then handed the
    ``(output, intermediates)`` tuple to ``nn.Dropout``: "dropout(): argument 'input' (position 1) must be Tensor,
    not tuple". Now a ValueError says that a block returns its output only and how to get the intermediates."""
    blk = Block(8, 2, heads="attention:1,laplacian:1")
    x = _rand(2, 3, 8, seed=6, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"Block: return_intermediates=True is an argument of DiffusionAttention"):
        blk(x, return_intermediates=True)
    torch.testing.assert_close(blk(x, return_intermediates=False), blk(x))
    _, inter = blk.attn(blk.norm1(x), return_intermediates=True)  # the way the message names
    assert inter.attn_weights.shape == (2, 2, 3, 3)
