"""Fixed affine heads beside loop heads: the split path of the dense engine (``ops.dense._split_paths``).

``diffuse`` with Python-number coefficients and per-head degrees runs the heads of degree <= 1 on
the affine path (one fused call, combined in the input dtype) and only the K-step heads through
the engine's float32 loop, then merges them in head order; a ``DiffusionAttention`` with learned
coefficients does the same for the fixed affine heads its plan names. Every layout of the two
groups (one run each, either first, or interleaved), every back-end choice and mask kind is
checked against explicit float64 matrices, forward and backward (learned heat times included).
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.functional import dense_attention_reference, diffuse, polynomial_reference
from diffusionformer.ops import dense as _dense
from diffusionformer.testing import random_qkv, reference_qkv

ATT, LAP = [0.0, 1.0, 0.0, 0.0], [1.0, -1.0, 0.0, 0.0]
HEAT2, POLY3 = [0.5, 0.3, 0.2, 0.0], [0.2, 0.3, -0.4, 0.9]
LAYOUTS = {
    "low-then-high": ([ATT, LAP, ATT, HEAT2, POLY3], [1, 1, 1, 2, 3]),
    "high-then-low": ([POLY3, HEAT2, LAP, ATT], [3, 2, 1, 1]),
    "interleaved": ([HEAT2, ATT, POLY3, LAP, ATT, HEAT2], [2, 1, 3, 1, 1, 2]),
    "affine-degree-0": ([[0.7, 0.0, 0.0, 0.0], POLY3, ATT], [0, 3, 1]),
}


def _allowed(kind: str, B: int, H: int, N: int) -> tuple[torch.Tensor | None, torch.Tensor | None, bool]:
    """``(attn_mask, allowed, is_causal)``: the call's mask and the reference's allowed entries."""
    g = torch.Generator().manual_seed(5)
    if kind == "none":
        return None, None, False
    if kind == "causal":
        return None, torch.ones(N, N, dtype=torch.bool).tril(), True
    if kind == "key-padding":
        keep = torch.ones(B, 1, 1, N, dtype=torch.bool)
        keep[1, ..., -2:] = False
        return keep, keep.expand(B, H, N, N), False
    per_head = torch.rand(B, H, N, N, generator=g) < 0.6  # a mask per head, with a fully masked row
    per_head[0, 1, 2] = False
    return per_head, per_head, False


def _reference_P(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Explicit float64 ``P``; a query row without keys is a constant zero row (with a finite gradient)."""
    if allowed is None:
        return dense_attention_reference(q, k)
    allowed = allowed.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    empty = ~allowed.any(-1, keepdim=True)
    P = dense_attention_reference(q, k, allowed=allowed | empty)  # softmax of a whole row where it has no key...
    return P.masked_fill(empty, 0.0)  # ...then the documented zero row


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend", ["sdpa", "auto"])
@pytest.mark.parametrize("mask", ["none", "causal", "key-padding", "per-head"])
def test_split_path_matches_float64_matrices_with_gradients(layout, backend, mask, monkeypatch):
    rows, degrees = LAYOUTS[layout]
    H, N = len(rows), 7
    calls = []
    split = _dense._split_paths
    monkeypatch.setattr(_dense, "_split_paths", lambda *a: calls.append(1) or split(*a))
    q, k, v = (t.requires_grad_() for t in random_qkv(2, H, N, 4, seed=3))
    attn_mask, allowed, is_causal = _allowed(mask, 2, H, N)
    out = diffuse(q, k, v, rows, degrees=degrees, attn_mask=attn_mask, is_causal=is_causal, backend=backend)
    assert calls, "the call did not take the split path"
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    truncated = torch.tensor([[c if j <= d else 0.0 for j, c in enumerate(r)] for r, d in zip(rows, degrees)],
                             dtype=torch.float64)
    ref = polynomial_reference(_reference_P(qr, kr, allowed), vr, truncated)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    for a, b in ((q, qr), (k, kr), (v, vr)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_split_path_equals_the_general_loop_in_bfloat16(layout):
    rows, degrees = LAYOUTS[layout]
    q, k, v = (t.to(torch.bfloat16) for t in random_qkv(2, len(rows), 9, 8, seed=4))
    static = diffuse(q, k, v, rows, degrees=degrees, is_causal=True, backend="sdpa")
    general = diffuse(q, k, v, torch.tensor(rows), degrees=degrees, is_causal=True, backend="sdpa")  # tensor: the loop
    assert static.dtype == torch.bfloat16
    ref = polynomial_reference(dense_attention_reference(q.double(), k.double(),
                                                         allowed=torch.ones(9, 9, dtype=torch.bool).tril()),
                               v.double(), torch.tensor([[c if j <= d else 0.0 for j, c in enumerate(r)]
                                                         for r, d in zip(rows, degrees)], dtype=torch.float64))
    # both round to bfloat16 once at the end of a float32 sum for K-step heads; affine heads round once too
    torch.testing.assert_close(static.double(), ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(static.double(), general.double(), rtol=2e-2, atol=2e-2)


def test_split_output_is_token_major_so_merging_heads_is_a_view():
    rows, degrees = LAYOUTS["low-then-high"]
    q, k, v = random_qkv(2, len(rows), 6, 4, seed=6)
    out = diffuse(q, k, v, rows, degrees=degrees, backend="sdpa")  # (B, H, N, C)
    merged = out.transpose(1, 2)
    assert merged.is_contiguous()  # (B, N, H, C) in memory: the layer's reshape to (B, N, D) copies nothing


@pytest.mark.parametrize("heads", ["attention:4,heat(t=1.0, steps=4):2", "heat(t=1.0, steps=4):2,laplacian:4",
                                   "attention:3,heat(t=0.5, learnable=True):3"])
def test_split_gradients_reach_the_projection_without_copies(heads):
    # the layer's q, k, v are token-major views of its projection: split there, the gradient's concatenation is
    # token-major and the projection's view takes it as it is (split head-major: one clone each of q, k and v)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    layer = DiffusionAttention(48, 6, heads, causal=True, bias=False, backend="sdpa")
    x = torch.randn(2, 5, 48, requires_grad=True)
    y = layer(x)
    with Count() as c:
        y.sum().backward()
    assert "aten.clone" not in c.ops and "aten.copy_" not in c.ops


def _heat_reference_weights(op, K: int) -> torch.Tensor:
    """``e^{-t} t^k / k!`` for ``k = 0 .. K`` from the operator's raw time, by an explicit loop (float64)."""
    t = op.t.double().clamp(min=op.min_t).reshape(-1)
    return torch.stack([torch.exp(-t) * t**k / math.factorial(k) for k in range(K + 1)], dim=-1)


def _layer_reference(layer, x: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """The layer in float64 from its weights: explicit softmax, ``sum_k c_k P^k v`` per head group."""
    B, N, D = x.shape
    q, k, v = (t.transpose(1, 2) for t in reference_qkv(layer, x))  # (B, H, N, C)
    P = _reference_P(q, k, allowed)
    K = layer.max_degree
    rows = []
    for group in layer.head_groups:
        op = group.operator
        if op.name == "heat":
            c = _heat_reference_weights(op, op.steps).expand(group.count, -1)
        else:
            c = op.head_coefficients(group.count).double()
        rows.append(torch.nn.functional.pad(c, (0, K + 1 - c.shape[1])))
    out = polynomial_reference(P, v, torch.cat(rows))
    return out.transpose(1, 2).reshape(B, N, D) @ layer.out_proj.weight.t() + layer.out_proj.bias


LEARNED_LAYOUTS = ["attention:2,heat(t=0.5, learnable=True, steps=3):2",
                   "heat(t=0.7, learnable=True, steps=2):1,laplacian:2,heat(t=0.3, learnable=True, steps=3):1",
                   "laplacian:1,attention:1,heat(t=0.5, learnable=True, steps=4):2"]


@pytest.mark.parametrize("heads", LEARNED_LAYOUTS)
@pytest.mark.parametrize("mask", ["none", "causal", "key-padding"])
@pytest.mark.parametrize("backend", ["sdpa", "auto"])
def test_learned_layers_keep_fixed_affine_heads_off_the_float32_loop(heads, mask, backend, monkeypatch):
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, heads, backend=backend).double()
    assert layer._affine_heads is not None and layer._static_coefficients is None
    calls = []
    split = _dense._split_paths
    monkeypatch.setattr(_dense, "_split_paths", lambda *a: calls.append(1) or split(*a))
    x = torch.randn(2, 7, 16, dtype=torch.float64, requires_grad=True)
    kwargs, allowed = {}, None
    if mask == "causal":
        kwargs, allowed = {"is_causal": True}, torch.ones(7, 7, dtype=torch.bool).tril()
    elif mask == "key-padding":
        keep = torch.ones(2, 7, dtype=torch.bool)
        keep[1, -3:] = False
        kwargs, allowed = {"key_padding_mask": ~keep}, keep.view(2, 1, 1, 7).expand(2, 4, 7, 7)
    y = layer(x, **kwargs)
    assert calls, "the layer did not split its fixed affine heads from the loop"
    ref = _layer_reference(layer, x, allowed)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(ref)
    params = [x, layer.qkv.weight] + [op.t for op in layer.operators if op.name == "heat"]
    ours = torch.autograd.grad(y, params, g)
    theirs = torch.autograd.grad(ref, params, g)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_non_polynomial_heads_beside_learned_heads_match_the_general_loop():
    torch.manual_seed(1)
    layer = DiffusionAttention(16, 4, "attention:1,heat-exact(t=0.7):1,heat(t=0.5, learnable=True, steps=2):2",
                               causal=True).double()
    assert layer._affine_heads == ((0, 1), (0.0, 0.0), (1.0, 0.0))  # heat-exact receives 0 from the engine
    x = torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    layer._affine_heads = None  # every head through the float32 loop, as before the split
    y_loop = layer(x)
    torch.testing.assert_close(y, y_loop, rtol=1e-12, atol=1e-13)
