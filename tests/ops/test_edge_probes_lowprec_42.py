"""Edge-case probes: real (not autocast) float16 / bfloat16 inputs and extreme values, against float64.

Probed: ``functional.diffuse`` on half ``q``, ``k``, ``v`` for attention, Laplacian, ``K``-step and mixed static or
tensor coefficients on ``auto`` / ``sdpa`` / ``matrix``, ``N`` from 1 to 1024, bool masks (with rows without
keys), float masks (``N(0, 1)``, ``1e4`` biases, ``-inf`` entries and rows), causal, logits scaled by 100 and scales
``1e-8`` .. ``1e4``; every registered operator in half :class:`~diffusionformer.DiffusionAttention` layers (with
long-``t`` heat, small-``alpha`` PPR, ``K = 12`` polynomials) at ``N = 1, 64, 200, 1024``, outputs and parameter
gradients against the same (rounded) layer in float64. Outputs keep the input dtype and stay within the dtype's
error of float64 wherever the float64 problem is well conditioned (logits of ``1e4`` amplify the rounding of
``q`` and ``k`` themselves, in any implementation).

One bug (``test_bug_*``): the gradient of a float16 layer with an exact-PPR head was NaN.
"""

from __future__ import annotations

import copy

import pytest
import torch

import diffusionformer.functional as F
from diffusionformer import DiffusionAttention

F64 = torch.float64


def _layer_and_reference(spec: str, dt: torch.dtype, N: int, backend: str, causal: bool):
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, heads=f"{spec}:2", causal=causal, backend=backend).to(dt)
    x = torch.randn(2, N, 16).to(dt)
    ref = copy.deepcopy(layer).double()  # the same rounded weights
    want = ref(x.double())
    want.square().sum().backward()
    got = layer(x)
    got.float().square().sum().backward()
    return layer, ref, got, want


@pytest.mark.parametrize("backend", ["auto", "matrix"])
def test_bug_fp16_exact_ppr_layer_gradient_is_finite(backend):
    """Bug: a float16 layer with a causal ``ppr-exact(alpha=0.001)`` head gave NaN gradients to ``qkv`` (float64:
    at most ~650). ``P`` was handed to the operator in float16; its solve runs in float32, and the gradient of
    ``P`` (``~1 / alpha`` times the output's, 7e5 here, cancelled again by the softmax's backward) overflowed
    float16 on the way back. The layer now hands the exact operators ``P`` in float32 (their working dtype)."""
    layer, ref, got, want = _layer_and_reference("ppr-exact(alpha=0.001)", torch.float16, 128, backend, True)
    assert got.dtype == torch.float16
    assert ((got.double() - want).abs().max() / want.abs().max()).item() <= 1e-2
    for (name, p), (_, p64) in zip(layer.named_parameters(), ref.named_parameters()):
        assert p.grad.dtype == torch.float16 and torch.isfinite(p.grad).all(), name
        err = ((p.grad.double() - p64.grad).abs().max() / p64.grad.abs().max()).item()
        assert err <= 1e-2, (name, err)


def _dense_reference(q, k, v, coeffs, mask, causal, scale):
    """``sum_j c_j P^j v`` with an explicit float64 softmax (rows without keys: zero rows of ``P``)."""
    q, k, v = q.double(), k.double(), v.double()
    N = q.shape[2]
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    if causal:
        s = s.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
    P = torch.softmax(s, -1).nan_to_num(0.0)
    c = torch.as_tensor(coeffs, dtype=F64).expand(q.shape[1], -1)
    out, x = torch.zeros_like(v), v
    for j in range(c.shape[1]):
        out, x = out + c[:, j].view(1, -1, 1, 1) * x, P @ x
    return out


def _masks(B, N):
    g = torch.Generator().manual_seed(3)
    dead = torch.rand(B, 1, N, N, generator=g) > 0.3
    dead[..., 0] = True
    dead[:, :, 3] = False  # a query without keys
    inf = torch.zeros(B, 1, N, N)
    inf[torch.rand(B, 1, N, N, generator=g) > 0.5] = float("-inf")
    inf[..., 0] = 0.0
    inf[:, :, 2] = float("-inf")  # a row of -inf biases: no keys
    return {"bool-dead-row": dead, "float-inf-row": inf, "float-1e4": torch.randn(B, 1, N, N, generator=g) * 1e4}


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("mask_kind", ["bool-dead-row", "float-inf-row", "float-1e4"])
@pytest.mark.parametrize("scale", [None, 1e-8, 1e3])
def test_pins_half_diffuse_with_extreme_masks_and_scales_matches_float64(dt, mask_kind, scale):
    """Real half ``q``, ``k``, ``v`` (no autocast): every dense back-end, static and tensor coefficients (affine,
    ``K``-step, affine beside ``K``-step heads), causal or not, logits scaled by 100, against float64 on the same
    rounded inputs: the input dtype, finite, within the dtype's error."""
    torch.manual_seed(0)
    B, H, N, C = 2, 2, 9, 8
    q, k, v = (torch.randn(B, H, N, C) * m for m in (100.0, 1.0, 1.0))
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    mask = _masks(B, N)[mask_kind]
    mask = mask if mask.dtype == torch.bool else mask.to(dt)
    tol = 3e-2 if dt == torch.bfloat16 else 5e-3
    for coeffs in ([1.0, -1.0], [0.2, 0.3, 0.3, 0.2], [[0.0, 1.0, 0.0], [0.5, 0.3, 0.2]]):
        for causal in (False, True):
            want = _dense_reference(q, k, v, coeffs, mask, causal, scale)
            for c in (coeffs, torch.tensor(coeffs)):
                for backend in ("auto", "sdpa", "matrix"):
                    got = F.diffuse(q, k, v, c, attn_mask=mask, is_causal=causal, scale=scale, backend=backend)
                    where = (coeffs, causal, type(c).__name__, backend)
                    assert got.dtype == dt and torch.isfinite(got).all(), where
                    assert ((got.double() - want).norm() / want.norm()).item() <= tol, where


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_pins_half_diffuse_long_sequence_matches_float64(dt):
    """``N = 1024``, ``K = 3`` in real half precision on ``sdpa`` and ``matrix``, values offset by 3 (1024-term
    sums of same-signed terms): the output has the input dtype and stays within the dtype's error of float64; the
    gradients of ``q``, ``k``, ``v`` keep the input dtype and are finite."""
    torch.manual_seed(0)
    B, H, N, C = 1, 2, 1024, 8
    q, k, v = (torch.randn(B, H, N, C).to(dt).requires_grad_() for _ in range(3))
    coeffs = [0.2, 0.3, 0.3, 0.2]
    want = _dense_reference(q.detach(), k.detach(), v.detach() + 3.0, coeffs, None, True, None)
    for backend in ("sdpa", "matrix"):
        got = F.diffuse(q, k, v + 3.0, torch.tensor(coeffs), is_causal=True, backend=backend)
        assert got.dtype == dt
        assert ((got.double() - want).norm() / want.norm()).item() <= (1e-2 if dt == torch.bfloat16 else 2e-3)
        q.grad = k.grad = v.grad = None
        got.float().square().mean().backward()
        for t in (q, k, v):
            assert t.grad.dtype == dt and torch.isfinite(t.grad).all(), backend


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("backend", ["csr", "native"])
def test_pins_half_diffuse_sparse_with_isolated_nodes_and_large_logits(dt, backend):
    """Sparse back-ends on real half inputs: logits scaled by 100, duplicate edges, nodes without incoming edges
    (zero rows of ``P``), the input dtype back; against an explicit float64 ``P`` built from the edges."""
    torch.manual_seed(0)
    N, H, C, E = 40, 2, 8, 200
    q, k, v = (torch.randn(N, H, C) * m for m in (100.0, 1.0, 1.0))
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    ei = torch.randint(0, N, (2, E))
    ei[1] = ei[1].clamp(max=N - 3)  # the last two nodes receive nothing
    src, dst = ei
    s = (q.double()[dst] * k.double()[src]).sum(-1) * C**-0.5  # (E, H)
    P = torch.zeros(H, N, N, dtype=F64)
    for h in range(H):
        m = torch.full((N,), float("-inf"), dtype=F64).scatter_reduce(0, dst, s[:, h], "amax")
        e = torch.exp(s[:, h] - m[dst])
        P[h].index_put_((dst, src), e / torch.zeros(N, dtype=F64).index_add(0, dst, e)[dst], accumulate=True)
    c = [0.2, 0.3, 0.3, 0.2]
    want, x = torch.zeros(H, N, C, dtype=F64), v.double().transpose(0, 1)
    for cj in c:
        want, x = want + cj * x, P @ x
    for coeffs in (c, torch.tensor(c)):
        got = F.diffuse_sparse(q, k, v, ei, coeffs, backend=backend)
        assert got.dtype == dt and torch.isfinite(got).all()
        err = ((got.double().transpose(0, 1) - want).norm() / want.norm()).item()
        assert err <= (3e-2 if dt == torch.bfloat16 else 5e-3), err
