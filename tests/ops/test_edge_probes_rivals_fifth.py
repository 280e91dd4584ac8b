"""Edge-case probes, fifth pass: the context dispatch (``ops.rivals.apply_context_groups``, ``LayerState``) with
MIXED head layouts (attention + differential + neutreno; attnscale beside heat; laplacian beside grand-nl) on the
dense back-ends (matrix, sdpa, auto) and the sparse path. Reference: an explicit float64 per-head computation
written here (masked softmax, ``(I - P) v``, ``P v + lam (v0 - v)``, ``DC v + (1 + omega)(P - DC) v``, the
differential formula of Ye et al. 2024, heat as explicit powers of ``P``), heads concatenated in order, then
``out_proj``. Probed: causal, key padding (left padding, a fully padded sequence), per-head 4-D / 3-D / key-only /
additive masks with empty rows, a LayerState over three layers (``v0`` of layer 0, depth for differential's schedule,
a fresh state per call), the sparse path against the complete graph, gradcheck on ``x`` and ``v0``, ``recompute``,
operators replaced after a call. No bug found in this area; the checks are pinned below.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.ops.rivals import LayerState

F64 = torch.float64
B, N, D, H = 2, 5, 16, 4
C = D // H


def _qkv(layer, x):
    z = x.double() @ layer.qkv.weight.double().T + layer.qkv.bias.double()
    Bx, Nx = x.shape[:2]
    q, k, v = (z[..., i * D:(i + 1) * D].view(Bx, Nx, H, C).transpose(1, 2) for i in range(3))
    return q, k, v


def _soft(q, k, allowed, scale):
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, -math.inf)
    return torch.nan_to_num(torch.softmax(s, -1), nan=0.0)


def _ref(layer, x, allowed, v0=None, depth=0):
    """Float64 head-by-head output of ``layer`` and its ``v`` (B, H, N, C); ``allowed`` (B, N, N) or per head
    (B, H, N, N)."""
    per_head = allowed.dim() == 4
    q, k, v = _qkv(layer, x)
    heads = []
    for op, (s, c) in zip(layer.operators, layer._groups):
        for h in range(s, s + c):
            qh, kh, vh = q[:, h], k[:, h], v[:, h]
            allowed_all, allowed = allowed, (allowed[:, h] if per_head else allowed)
            P = _soft(qh, kh, allowed, C**-0.5)
            name = op.name
            if name == "attention":
                y = P @ vh
            elif name == "laplacian":
                y = vh - P @ vh
            elif name == "neutreno":
                y = P @ vh + (0 if v0 is None else op.lam * (v0[:, h] - vh))
            elif name == "attnscale":
                A = allowed.double().expand_as(P)
                DC = A / A.sum(-1, keepdim=True).clamp_min(1)
                om = op.omega.detach().double().flatten()[h - s if op.omega.numel() > 1 else 0]
                y = DC @ vh + (1 + om) * (P - DC) @ vh
            elif name == "differential":
                hf = C // 2
                P1 = _soft(qh[..., :hf], kh[..., :hf], allowed, hf**-0.5)
                P2 = _soft(qh[..., hf:], kh[..., hf:], allowed, hf**-0.5)
                li = 0.8 - 0.6 * math.exp(-0.3 * depth)
                lam = (math.exp(float((op.lambda_q1.detach().double() * op.lambda_k1.detach().double()).sum()))
                       - math.exp(float((op.lambda_q2.detach().double() * op.lambda_k2.detach().double()).sum())) + li)
                yy = (P1 - lam * P2) @ vh
                y = (1 - li) * op.subln.weight.detach().double() * yy / torch.sqrt((yy * yy).mean(-1, keepdim=True) + 1e-5)
            elif op.is_polynomial:  # heat, learnable or not: sum_k c_k P^k v with explicit powers
                cf = op.coefficients().detach().double()
                cf = cf[h - s] if cf.dim() == 2 and cf.shape[0] > 1 else cf.reshape(-1)
                y, Pk = torch.zeros_like(vh), vh
                for ck in cf:
                    y, Pk = y + ck * Pk, P @ Pk
            else:
                raise AssertionError(name)
            heads.append(y)
            allowed = allowed_all
    o = torch.stack(heads, 1).transpose(1, 2).reshape(x.shape[0], x.shape[1], D)
    return o @ layer.out_proj.weight.double().T + layer.out_proj.bias.double(), v


def _layer(spec, backend="auto", causal=False, seed=0):
    torch.manual_seed(seed)
    layer = DiffusionAttention(D, H, spec, backend=backend, causal=causal)
    with torch.no_grad():
        for op in layer.operators:
            if op.name == "attnscale":
                op.omega.copy_(torch.randn_like(op.omega))
    return layer


MIXED = ["attention:2,differential:1,neutreno:1", "neutreno:1,attention:1,differential:1,laplacian:1",
         "heat(learnable=True):2,attnscale:2", "attnscale:1,heat:1,attention:1,laplacian:1"]


def _allowed(causal, pad):
    a = torch.ones(B, 1, N, N, dtype=torch.bool)  # (B, 1, N, N) -> per head slice (B, N, N)
    if causal:
        a = a & torch.ones(N, N, dtype=torch.bool).tril()
    if pad is not None:
        a = a & ~pad[:, None, None, :]
    return a[:, 0]


@pytest.mark.parametrize("backend", ["matrix", "sdpa", "auto"])
@pytest.mark.parametrize("spec", MIXED)
@pytest.mark.parametrize("causal,padded", [(False, False), (True, False), (False, True), (True, True)])
def test_pins_mixed_heads_match_float64(spec, backend, causal, padded):
    layer = _layer(spec, backend).double()
    x = torch.randn(B, N, D, dtype=F64)
    pad = None
    if padded:
        pad = torch.zeros(B, N, dtype=torch.bool)
        pad[0, :2] = True  # left padding: causal rows 0, 1 fully masked
        pad[1, :] = True   # a fully padded sequence
    allowed = _allowed(causal, pad)
    y = layer(x, key_padding_mask=pad, is_causal=causal)
    ref, _ = _ref(layer, x, allowed)
    assert torch.allclose(y, ref, atol=1e-9), (y - ref).abs().max()


@pytest.mark.parametrize("backend", ["matrix", "sdpa", "auto"])
def test_pins_layer_state_across_three_layers(backend):
    spec = "attention:1,differential:1,neutreno:2"
    layers = [_layer(spec, backend, seed=i).double() for i in range(3)]
    x = torch.randn(B, N, D, dtype=F64)
    allowed = _allowed(True, None)
    for _ in range(2):  # a fresh state per forward call
        st = LayerState()
        h = x
        v0 = None
        for depth, layer in enumerate(layers):
            ref, v = _ref(layer, h, allowed, v0=v0, depth=depth)
            y = layer(h, is_causal=True, state=st)
            assert torch.allclose(y, ref, atol=1e-9), (depth, (y - ref).abs().max())
            if v0 is None:
                v0 = v
            h = y
        assert st.depth == 3 and torch.allclose(st.first_values.double(), v0)


def test_pins_sparse_mixed_heads_match_dense_complete_graph():
    spec = "attention:2,differential:1,neutreno:1"
    layer = _layer(spec).double()
    x = torch.randn(N, D, dtype=F64)
    ii, jj = torch.meshgrid(torch.arange(N), torch.arange(N), indexing="ij")
    ei = torch.stack([jj.flatten(), ii.flatten()])
    for causal in (False, True):
        layer.causal = causal
        y = layer(x, edge_index=ei)
        ref, _ = _ref(layer, x[None], _allowed(causal, None)[:1])
        assert torch.allclose(y, ref[0], atol=1e-9)
    layer.causal = False
    st = LayerState(); st.enter(torch.randn(1, H, N, C, dtype=F64))
    v0 = st.first_values
    y = layer(x, edge_index=ei, state=st)
    ref, _ = _ref(layer, x[None], _allowed(False, None)[:1], v0=v0, depth=1)
    assert torch.allclose(y, ref[0], atol=1e-9)


def test_pins_gradcheck_and_recompute():
    layer = DiffusionAttention(8, 2, "differential:1,neutreno:1", backend="sdpa").double()
    x = torch.randn(1, 3, 8, dtype=F64, requires_grad=True)
    v0 = torch.randn(1, 2, 3, 4, dtype=F64)
    assert torch.autograd.gradcheck(lambda x: layer(x, is_causal=True, state=LayerState(first_values=v0, depth=1)), (x,))
    layer2 = DiffusionAttention(D, H, "attention:2,attnscale:1,neutreno:1", recompute=True).double().train()
    layer2.load_state_dict(layer2.state_dict())
    xx = torch.randn(B, N, D, dtype=F64, requires_grad=True)
    y1 = layer2(xx); g1 = torch.autograd.grad(y1.sum(), xx)[0]
    layer2.recompute = False
    y2 = layer2(xx); g2 = torch.autograd.grad(y2.sum(), xx)[0]
    assert torch.equal(y1, y2) and torch.allclose(g1, g2)


@pytest.mark.parametrize("backend", ["matrix", "sdpa", "auto"])
@pytest.mark.parametrize("kind", ["bool4", "bool3", "keys_per_head", "additive"])
def test_pins_per_head_masks_with_empty_rows_reach_every_group(backend, kind):
    """Per-head masks (4-D, 3-D, per-head key masks, additive -inf) with empty rows and an all-masked head, sliced
    per group, causal on top: every head against its own float64 row softmax."""
    layer = _layer("attnscale:1,attention:1,differential:1,neutreno:1", backend).double()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, N, D, dtype=F64, generator=g)
    if kind == "bool3":
        m = torch.rand(H, N, N, generator=g) > 0.4
        m[2, 1] = False
        allowed = m[None].expand(B, H, N, N)
    elif kind == "keys_per_head":
        m = torch.rand(B, H, 1, N, generator=g) > 0.3
        m[0, 2] = False
        allowed = m.expand(B, H, N, N)
    else:
        allowed = torch.rand(B, H, N, N, generator=g) > 0.4
        allowed[0, 1, 2] = False
        allowed[1, 3] = False
        m = allowed if kind == "bool4" else torch.zeros(B, H, N, N, dtype=F64).masked_fill(~allowed, -math.inf)
    for causal in (False, True):
        al = allowed & torch.ones(N, N, dtype=torch.bool).tril() if causal else allowed
        y = layer(x, attn_mask=m, is_causal=causal)
        ref, _ = _ref(layer, x, al)
        assert torch.allclose(y, ref, atol=1e-9), (causal, (y - ref).abs().max())


def test_pins_replaced_operators_take_the_context_path():
    """An attention layer whose heads are replaced by rivals after a call (plan refreshed, differential bound in the
    layer's dtype) matches the float64 reference, with a state."""
    layer = _layer("attention:1,attention:1,laplacian:2", "sdpa").double()
    x = torch.randn(B, N, D, dtype=F64)
    layer(x)
    from diffusionformer.operators import AttnScaleOperator, DifferentialOperator, NeuTRENOOperator

    layer.operators[0] = AttnScaleOperator(omega=0.3)
    layer.operators[1] = DifferentialOperator()
    y = layer(x, is_causal=True)
    ref, _ = _ref(layer, x, _allowed(True, None))
    assert torch.allclose(y, ref, atol=1e-9)
    layer.operators[1] = NeuTRENOOperator(lam=0.5)
    v0 = torch.randn(B, H, N, C, dtype=F64)
    y = layer(x, state=LayerState(first_values=v0, depth=1))
    ref, _ = _ref(layer, x, _allowed(False, None), v0=v0, depth=1)
    assert torch.allclose(y, ref, atol=1e-9)
