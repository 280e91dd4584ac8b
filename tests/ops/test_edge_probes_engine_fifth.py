"""Edge probes of the dense engine (fifth pass): per-head ``degrees`` given as tensors or sets, the ``auto`` rule as
:func:`~diffusionformer.ops.dense.diffuse` actually routes it (not only :func:`choose_dense_backend`), half precision
against a float64 ``sum_k c_k P^k v`` within an ulp budget, and the recompute replay of the fused-kernel paths."""

from __future__ import annotations

import pytest
import torch

import diffusionformer.ops.dense as dense
from diffusionformer.ops._checks import check_layout
from diffusionformer.ops.dense import _diffuse_checked, diffuse


def _reference(q, k, v, coeffs, mask=None, causal=False, degrees=None):
    """float64 ``sum_k c_{h,k} P_h^k v_h`` with ``P`` built by hand (zero rows for queries without a key)."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, N, C = q.shape
    S = q @ k.transpose(-1, -2) * C ** -0.5
    allow = torch.ones(B, H, N, N, dtype=torch.bool)
    if mask is not None:
        allow = allow & mask
    if causal:
        allow = allow & torch.ones(N, N, dtype=torch.bool).tril()
    S = S.masked_fill(~allow, float("-inf"))
    ok = allow.any(-1, keepdim=True)
    P = torch.softmax(S.masked_fill(~ok, 0.0), -1).masked_fill(~ok, 0.0)
    c = torch.as_tensor(coeffs, dtype=torch.float64)
    c = c.expand(H, -1) if c.dim() == 1 else c
    deg = degrees if degrees is not None else [c.shape[1] - 1] * H
    out = torch.zeros_like(v)
    for h in range(H):
        for p in range(deg[h] + 1):
            out[:, h] += c[h, p] * (torch.linalg.matrix_power(P[:, h], p) @ v[:, h])
    return out


def _qkv(B=1, H=2, N=3, C=4, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, C, generator=g).to(dtype) for _ in range(3))


# ---------------------------------------------------------------------------- bugs
def test_bug_bool_tensor_degrees_are_refused():
    """Bug: degrees=torch.tensor([True, False]) was taken as (1, 0) (operator.index of a bool 0-d tensor), while
    [True, False] is refused ("1.5 or True is an error, not truncated")."""
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="degrees must be a sequence of ints"):
        diffuse(q, k, v, [0.0, 1.0], degrees=torch.tensor([True, True]))
    # integer tensors stay accepted, and agree with the float64 reference
    out = diffuse(q, k, v, [0.5, 0.5], degrees=torch.tensor([1, 0]))
    torch.testing.assert_close(out.double(), _reference(q, k, v, [0.5, 0.5], degrees=[1, 0]))


def test_bug_set_of_degrees_is_refused():
    """Bug: degrees={2, 0} (a set: no head order) was accepted and given to the heads in hash order (head 0 got
    degree 0, head 1 degree 2), silently not what a caller listing {2, 0} meant; a dict gave its keys."""
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="degrees must be a sequence of ints, one per head"):
        diffuse(q, k, v, [0.2, 0.3, 0.5], degrees={2, 0})
    with pytest.raises(TypeError, match="degrees must be a sequence of ints, one per head"):
        diffuse(q, k, v, [0.2, 0.3, 0.5], degrees=frozenset({1, 2}))
    with pytest.raises(TypeError, match="degrees must be a sequence of ints, one per head"):
        diffuse(q, k, v, [0.2, 0.3, 0.5], degrees={0: 2, 1: 0})  # its keys were taken as the degrees


def test_bug_zero_dim_tensor_degrees_named_in_the_error():
    """Bug: degrees=torch.tensor(1) failed with torch's bare 'iteration over a 0-d tensor', naming no argument."""
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="degrees must be a sequence of ints, one per head, or None"):
        diffuse(q, k, v, [0.0, 1.0], degrees=torch.tensor(1))


# ---------------------------------------------------------------------------- pins
def _route(monkeypatch, N, K, *, causal=False, static=True, degrees=None, mask=None):
    """Which heads ``diffuse(backend="auto")`` materialised ``P`` for (``()``: the fused kernel only)."""
    calls = []
    real = dense._attention_matrix
    monkeypatch.setattr(dense, "_attention_matrix", lambda q, *a: calls.append(q.shape[1]) or real(q, *a))
    q = torch.zeros(1, 2, N, 2)
    c = [0.0] * K + [1.0]
    dense.diffuse(q, q, q, c if static else torch.tensor(c), is_causal=causal, attn_mask=mask, degrees=degrees)
    return tuple(calls)


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("causal,K,n", [(False, 2, 128), (False, 5, 384), (False, 9, 512),
                                        (True, 2, 64), (True, 7, 256), (True, 8, 384)])
def test_pins_diffuse_auto_routes_by_the_documented_table(monkeypatch, static, causal, K, n):
    """``diffuse(backend="auto")`` materialises ``P`` up to the table's ``N`` for the largest listed ``K' <= K``
    (causal or not) and keeps the fused kernel one token beyond, for static and tensor coefficients."""
    assert _route(monkeypatch, n, K, causal=causal, static=static) == (2,)
    assert _route(monkeypatch, n + 1, K, causal=causal, static=static) == ()


@pytest.mark.parametrize("static", [True, False])
def test_pins_auto_materialises_only_the_k_step_heads(monkeypatch, static):
    """Under ``auto`` heads of degree <= 1 stay on the fused kernel: only the one K-step head gets ``P``, and a layout
    whose degrees are all <= 1 (whatever the coefficients' width) materialises nothing."""
    assert _route(monkeypatch, 16, 2, static=static, degrees=[1, 2]) == (1,)
    assert _route(monkeypatch, 16, 2, static=static, degrees=[0, 2]) == (1,)
    assert _route(monkeypatch, 16, 2, static=static, degrees=[1, 1]) == ()


@pytest.mark.parametrize("dtype,budget", [(torch.float16, 8), (torch.bfloat16, 8)])
@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
@pytest.mark.parametrize("static", [True, False])
def test_pins_half_precision_within_ulps_of_float64(dtype, budget, backend, static):
    """Half inputs return the input dtype, within ``budget`` ulps (relative to ``|ref| + 1``) of the float64 sum over
    the same rounded inputs, for affine, K-step and degree-0 heads side by side, causal with a padded key."""
    q, k, v = _qkv(B=2, H=4, N=16, C=8, dtype=dtype, seed=1)
    rows = [[0.0, 1.0, 0.0], [1.0, -1.0, 0.0], [0.5, 0.25, 0.25], [0.3, 0.3, 0.4]]
    degrees = [1, 1, 2, 0]
    mask = torch.ones(2, 1, 1, 16, dtype=torch.bool)
    mask[1, ..., -3:] = False
    out = diffuse(q, k, v, torch.tensor(rows) if static is False else rows, attn_mask=mask, is_causal=True,
                  backend=backend, degrees=degrees)
    ref = _reference(q, k, v, rows, mask, True, degrees)
    assert out.dtype == dtype
    ulps = ((out.double() - ref).abs() / (ref.abs() + 1)).max().item() / torch.finfo(dtype).eps
    assert ulps < budget


@pytest.mark.parametrize("degrees", [(1, 1, 2, 2), (0, 1, 2, 2), (1, 0, 0, 2), (0, 0, 0, 0), (2, 1, 2, 1)])
@pytest.mark.parametrize("static", [True, False])
def test_pins_sdpa_replay_rebuilds_the_forward_bits(degrees, static):
    """The recompute replay of the fused-kernel paths (``rebuild``) gives the forward's output bit for bit, with its
    strides and dtype, with degree-0 heads and dropout on ``P`` (the replay reuses the recorded kernel outputs)."""
    B, H, N, C = 2, 4, 6, 4
    q, k, v = (t.requires_grad_() for t in _qkv(B, H, N, C, seed=2))
    rows = [[0.0, 1.0, 0.0], [1.0, -1.0, 0.0], [0.5, 0.25, 0.25], [0.2, 0.3, 0.5]]
    coeffs, degs = check_layout(rows if static else torch.tensor(rows), degrees, H, v)
    rebuild: list = []
    out, _ = _diffuse_checked(q, k, v, coeffs, None, True, C ** -0.5, "sdpa", degs, 0.3, False, None, rebuild)
    assert len(rebuild) == 1
    with torch.no_grad():
        again = rebuild[0]()
    assert torch.equal(again, out.detach()) and again.stride() == out.stride() and again.dtype == out.dtype


@pytest.mark.parametrize("backend", ["auto", "sdpa"])
@pytest.mark.parametrize("coeffs", [[1.0, -1.0], [0.5, 0.5], [0.1, 0.7]])
def test_pins_affine_combination_leaves_inputs_and_equals_inference(backend, coeffs):
    """The affine path combines out of place while training (``v``'s version unchanged, its gradient exact against
    float64) and in place without history, with the same bits."""
    q, k, v = (t.double().requires_grad_() for t in _qkv(B=2, H=3, N=5, C=4, seed=3))
    version = v._version
    out = diffuse(q, k, v, coeffs, backend=backend, is_causal=True)
    assert v._version == version
    with torch.no_grad():
        again = diffuse(q, k, v, coeffs, backend=backend, is_causal=True)
    assert torch.equal(again, out.detach())
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = _reference(qr, kr, vr, coeffs, causal=True)
    g = torch.randn_like(ref)
    for got, want in zip(torch.autograd.grad((out * g).sum(), (q, k, v)), torch.autograd.grad((ref * g).sum(), (qr, kr, vr))):
        torch.testing.assert_close(got, want)
