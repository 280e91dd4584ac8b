"""Layers with non-polynomial heads (heat-exact, ppr-exact) materialise ``P`` only for those heads.

The polynomial heads of such a layer take the engine's path (fused SDPA, or what ``"auto"``
picks); the matrix heads get one softmax over their own queries and keys. Checked here:

* forward and gradients against explicit float64 references (``P`` by an explicit softmax,
  powers by matrix products, ``torch.linalg.matrix_exp`` and an explicit inverse for the exact
  operators), and against the layer's full-``P`` path (``return_intermediates=True``, which keeps
  building ``P`` for every head), for mixed layouts, causal or not, key padding with a fully
  padded sequence, grouped-query attention, RoPE and the three CPU back-ends;
* that the full ``(B, H, N, N)`` matrix is not built (the materialising function sees only the
  matrix heads);
* dropout: drawn per operator group on its ``(B, c, N, N)`` slice, as before.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diffusionformer import DiffusionAttention
from diffusionformer.nn.rotary import RotaryEmbedding
from diffusionformer.ops import dense as dense_mod
from diffusionformer.ops.reference import dense_attention_reference, heat_kernel_reference, polynomial_reference
from diffusionformer.ops.reference_rivals import ppr_exact_reference

f64 = torch.float64
B, N, D, H = 3, 6, 24, 6
C = D // H

MIXED = ("attention:1,laplacian:1,heat(t=0.7, steps=4):1,heat(t=0.5, steps=3, learnable=True):1,"
         "heat-exact(t=0.4):1,ppr-exact(alpha=0.3):1")
INTERLEAVED = "ppr-exact(alpha=0.25):1,attention:2,heat-exact(t=0.6, learnable=True):2,laplacian:1"
HALF = "attention:3,ppr-exact(alpha=0.2):3"


def _pad() -> torch.Tensor:
    """Key padding ``(B, N)``, True = padded: none, a padded head (causal rows 0, 1 see no key), all padded."""
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[1, :2] = True
    pad[2] = True
    return pad


def _allowed(causal: bool, pad: torch.Tensor | None, extra: torch.Tensor | None = None) -> torch.Tensor:
    allowed = torch.ones(B, 1, N, N, dtype=torch.bool)
    if extra is not None:
        allowed = allowed & extra
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    if pad is not None:
        allowed = allowed & ~pad[:, None, None, :]
    return allowed


def _softmax_reference(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """``P = exp(s) / sum exp(s)`` over the allowed keys, by hand in float64; zero rows without keys.

    No max is subtracted (the scores of these tests are small), so the gradient is finite on rows
    without keys too (:func:`dense_attention_reference` masks with ``-1e300``, whose gradient is NaN there).
    """
    s = q @ k.transpose(-2, -1) * C**-0.5 + (0.0 if bias is None else bias)
    e = torch.where(allowed, s.exp(), torch.zeros((), dtype=f64))
    z = e.sum(-1, keepdim=True)
    return e / torch.where(z > 0, z, torch.ones((), dtype=f64))


def _reference(layer: DiffusionAttention, x: torch.Tensor, causal: bool, pad: torch.Tensor | None,
               extra: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The layer's output from explicit float64 matrices: P per head, then f(P) v per operator group."""
    G = layer.num_kv_heads
    q, k, v = layer.qkv(x).split([H * C, G * C, G * C], dim=-1)
    q, k, v = q.view(B, N, H, C), k.view(B, N, G, C), v.view(B, N, G, C)
    if layer.rotary is not None:
        q, k = layer.rotary(q), layer.rotary(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)  # query head h reads h // (H/G)
    P = _softmax_reference(q, k, _allowed(causal, pad, extra), bias)
    outs = []
    for op, (s, c) in zip(layer.operators, layer._groups):
        Pg, vg = P[:, s : s + c], v[:, s : s + c]
        if op.name == "heat-exact":
            outs.append(heat_kernel_reference(Pg, vg, op.t.expand(c)))
        elif op.name == "ppr-exact":
            outs.append(ppr_exact_reference(Pg, vg, op.alpha))
        else:
            outs.append(polynomial_reference(Pg, vg, op.head_coefficients(c)))
    return layer.out_proj(torch.cat(outs, dim=1).transpose(1, 2).reshape(B, N, D))


def _layer(heads: str, causal: bool, kv: int | None, backend: str, rotary: bool = False, seed: int = 0,
           dropout: float = 0.0) -> DiffusionAttention:
    torch.manual_seed(seed)
    layer = DiffusionAttention(D, H, heads=heads, causal=causal, num_kv_heads=kv, backend=backend, dropout=dropout,
                               rotary=RotaryEmbedding(C) if rotary else None).double()
    return layer


def _grads(layer: DiffusionAttention, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    w = torch.linspace(-1.0, 1.0, y.numel(), dtype=f64).view_as(y)
    params = [x] + [p for p in layer.parameters() if p.requires_grad]
    return list(torch.autograd.grad((y * w).sum(), params))


@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
@pytest.mark.parametrize("kv", [None, 2])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [MIXED, INTERLEAVED, HALF])
def test_layer_matches_the_float64_reference_and_the_full_P_path(heads, causal, padded, kv, backend):
    layer = _layer(heads, causal, kv, backend).eval()
    x = torch.randn(B, N, D, dtype=f64, requires_grad=True)
    pad = _pad() if padded else None
    y = layer(x, key_padding_mask=pad)
    want = _reference(layer, x, causal, pad)
    torch.testing.assert_close(y, want, rtol=0, atol=1e-12)
    y_full, inter = layer(x, key_padding_mask=pad, return_intermediates=True)  # P of every head, as before
    assert inter.attn_weights.shape == (B, H, N, N)
    torch.testing.assert_close(y, y_full, rtol=0, atol=1e-12)
    got = _grads(layer, x, y)
    for g, g_full, g_ref in zip(got, _grads(layer, x, y_full), _grads(layer, x, want)):
        torch.testing.assert_close(g, g_full, rtol=0, atol=1e-12)
        torch.testing.assert_close(g, g_ref, rtol=0, atol=1e-10)
    if padded:  # the fully padded sequence: no admissible key anywhere, finite output
        assert torch.isfinite(y[2]).all()


@pytest.mark.parametrize("causal", [False, True])
def test_rotary_and_gqa_layer_matches_the_reference(causal):
    layer = _layer(INTERLEAVED, causal, 3, "auto", rotary=True, seed=4).eval()
    x = torch.randn(B, N, D, dtype=f64, requires_grad=True)
    pad = _pad()
    y = layer(x, key_padding_mask=pad)
    want = _reference(layer, x, causal, pad)
    torch.testing.assert_close(y, want, rtol=0, atol=1e-12)
    for g, g_ref in zip(_grads(layer, x, y), _grads(layer, x, want)):
        torch.testing.assert_close(g, g_ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_per_head_float_masks_and_2d_bool_masks_reach_the_right_heads(causal):
    """INTERLEAVED's matrix heads (0, 3, 4) are not a run: their slice of a per-head mask is a concatenation."""
    layer = _layer(INTERLEAVED, causal, None, "auto", seed=7).eval()
    x = torch.randn(B, N, D, dtype=f64, requires_grad=True)
    bias = torch.randn(B, H, N, N, dtype=f64)  # additive float mask, one per head
    band = torch.ones(N, N, dtype=torch.bool).triu(-2).tril(2)  # bool (N, N): |i - j| <= 2
    for kwargs, want in (
        (dict(attn_mask=bias, key_padding_mask=_pad()), _reference(layer, x, causal, _pad(), bias=bias)),
        (dict(attn_mask=band), _reference(layer, x, causal, None, extra=band)),
    ):
        y = layer(x, **kwargs)
        torch.testing.assert_close(y, want, rtol=0, atol=1e-12)
        torch.testing.assert_close(y, layer(x, return_intermediates=True, **kwargs)[0], rtol=0, atol=1e-12)
        for g, g_ref in zip(_grads(layer, x, y), _grads(layer, x, want)):
            torch.testing.assert_close(g, g_ref, rtol=0, atol=1e-10)


def _count_materialised(monkeypatch) -> list[int]:
    """Record the head count of every ``P`` the dense back-end materialises."""
    seen: list[int] = []
    real = dense_mod._attention_matrix

    def spy(q, k, *args, **kwargs):
        seen.append(q.shape[1])
        return real(q, k, *args, **kwargs)

    monkeypatch.setattr(dense_mod, "_attention_matrix", spy)
    return seen


@pytest.mark.parametrize("backend", ["auto", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_half_ppr_exact_layer_materialises_P_for_its_ppr_heads_only(monkeypatch, causal, backend):
    torch.manual_seed(1)
    layer = DiffusionAttention(32, 8, heads="attention:4,ppr-exact(alpha=0.2):4", causal=causal,
                               backend=backend).eval()
    x = torch.randn(2, 16, 32)
    pad = torch.zeros(2, 16, dtype=torch.bool)
    pad[1, -3:] = True
    seen = _count_materialised(monkeypatch)
    layer(x)
    layer(x, key_padding_mask=pad)
    assert seen == [4, 4]  # one (B, 4, N, N) softmax per call, never (B, 8, N, N)
    seen.clear()
    layer(x, return_intermediates=True)  # the intermediates hold P of every head
    assert seen == [8]


def test_matrix_backend_and_k_step_heads_keep_their_own_materialisation(monkeypatch):
    seen = _count_materialised(monkeypatch)
    x = torch.randn(B, N, D, dtype=f64)
    _layer(HALF, False, None, "matrix").eval()(x)
    assert seen == [H]  # backend="matrix" materialises every head anyway: one P serves the ppr-exact heads too
    seen.clear()
    _layer(MIXED, True, None, "auto").eval()(x)
    # "auto" at N = 6: the two K-step heat heads take a materialised P, the two exact heads their own
    assert seen == [2, 2]


def test_matrix_heads_draw_dropout_per_group_as_before():
    """All heads exact: the only draws are the groups' ``F.dropout`` of ``(B, c, N, N)``, in head order."""
    p = 0.2
    layer = _layer("ppr-exact(alpha=0.5):2,heat-exact(t=0.4):4", False, None, "auto", dropout=p).train()
    x = torch.randn(B, N, D, dtype=f64)
    torch.manual_seed(11)
    y = layer(x)
    torch.manual_seed(11)
    keep = [F.dropout(torch.ones(B, c, N, N, dtype=f64), p=p) for c in (2, 4)]  # the same draws, as masks
    q, k, v = layer.qkv(x).view(B, N, 3, H, C).unbind(2)
    P = dense_attention_reference(q.transpose(1, 2), k.transpose(1, 2))
    v = v.transpose(1, 2)
    heads = torch.cat([ppr_exact_reference(P[:, :2] * keep[0], v[:, :2], 0.5),
                       heat_kernel_reference(P[:, 2:] * keep[1], v[:, 2:], layer.operators[1].t)], dim=1)
    want = layer.out_proj(heads.transpose(1, 2).reshape(B, N, D))
    torch.testing.assert_close(y, want, rtol=0, atol=1e-12)
    torch.manual_seed(12)
    assert not torch.allclose(layer(x), y)  # dropout is on


def test_half_ppr_exact_dropout_draws_are_unchanged_on_cpu():
    """The attention heads' SDPA call (CPU math path) draws its dropout mask like ``F.dropout`` of the same
    ``(B, 3, N, N)`` slice did on the full ``P``, so the RNG is consumed in the same order as the full-P path."""
    layer = _layer(HALF, True, None, "auto", dropout=0.1).train()
    x = torch.randn(B, N, D, dtype=f64)
    torch.manual_seed(5)
    y = layer(x)
    torch.manual_seed(5)
    y_full, _ = layer(x, return_intermediates=True)
    torch.testing.assert_close(y, y_full, rtol=0, atol=1e-12)


def test_attention_dropout_is_still_checked_by_the_operator():
    layer = _layer(HALF, False, None, "auto", dropout=0.1).train()
    layer(torch.randn(B, N, D, dtype=f64))
    layer.dropout = 0.3  # settable: ppr-exact(alpha=0.2) needs dropout < alpha
    with pytest.raises(ValueError, match=r"ppr-exact\(alpha=0.2\) with attention dropout 0.3"):
        layer(torch.randn(B, N, D, dtype=f64))
