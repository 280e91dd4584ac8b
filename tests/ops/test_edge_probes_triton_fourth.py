"""Fourth edge-case probes of the Triton kernels (``diffusionformer.ops.triton``) under the interpreter on CPU: lengths
off every block (``N = 1, 2, 17, 65``), head sizes that are not powers of two (8, 24, 40, 80), causal ``N = 1``,
per-head and shared float64 coefficients with their gradients, a negative ``scale``, every key of a sequence padded
under ``is_causal``, a float mask with a ``-inf`` row, half precision with ``K = 2``, and the fake implementation of
the backward custom operator against the real one.

Found and fixed (tests marked "Bug:"): the backward operator ``diffusionformer::triton_polynomial_bwd`` returned the
coefficient gradient as a transposed view (strides ``(1, H)``) while its fake implementation, which a compiled graph
plans with, promised a contiguous ``(H, K + 1)`` tensor (``torch.library.opcheck`` failed with "Stride mismatch").
"""

from __future__ import annotations

import math

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def ops(triton_kernels):
    """``diffusionformer.ops.triton`` with the kernels of this folder's ``triton_kernels`` fixture."""
    import diffusionformer.ops.triton as triton_ops

    return triton_ops


def _reference(q, k, v, c, is_causal=False, pad=None, mask=None, scale=None):
    """``sum_j c[h, j] P^j v`` in float64, ``P = softmax(q k^T scale + mask)`` over the admissible keys (bool mask,
    finite float entries, not padded, causal); a row with no admissible key is a zero row."""
    q, k, v, c = (t.double() for t in (q, k, v, c))
    B, H, N, C = q.shape
    c = c.expand(H, -1) if c.dim() == 1 else c
    s = q @ k.transpose(-2, -1) * (C**-0.5 if scale is None else scale)
    keep = torch.ones(B, H, N, N, dtype=torch.bool, device=q.device)
    if is_causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    if pad is not None:
        keep = keep & ~pad[:, None, None, :]
    if mask is not None:
        b = mask.double().expand(B, H, N, N)
        keep = keep & (b > -math.inf)
        s = s + b.masked_fill(~keep, 0.0)
    s = s.masked_fill(~keep, -math.inf)
    ok = keep.any(-1, keepdim=True)
    P = torch.softmax(s.masked_fill(~ok, 0.0), -1) * ok
    out, y = c[:, 0].view(1, H, 1, 1) * v, v
    for j in range(1, c.shape[1]):
        y = P @ y
        out = out + c[:, j].view(1, H, 1, 1) * y
    return out


def _check(ops, B, H, N, C, K, *, is_causal=False, dtype=torch.float32, pad=None, mask=None, scale=None,
           shared=False, tol=1e-5):
    g = torch.Generator().manual_seed(7 * N + C)
    qkv = [torch.randn(B, H, N, C, generator=g).to(DEVICE, dtype).requires_grad_() for _ in range(3)]
    c = torch.randn(K + 1 if shared else (H, K + 1), generator=g, dtype=torch.float64).to(DEVICE).requires_grad_()
    pad = None if pad is None else pad.to(DEVICE)
    mask = None if mask is None else mask.to(DEVICE)
    out = ops.polynomial_attention(*qkv, c, is_causal=is_causal, key_padding_mask=pad, attn_mask=mask, scale=scale)
    ref = _reference(*qkv, c, is_causal, pad, mask, scale)
    assert out.dtype == dtype and out.shape == (B, H, N, C)
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    go = torch.randn(out.shape, generator=g).to(DEVICE)
    got = torch.autograd.grad(out, qkv + [c], go.to(dtype))
    want = torch.autograd.grad(ref, qkv + [c], go.double())
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol * (1 + b.abs().max().item()),
                                   msg=lambda m, i=i: f"input {i}: {m}")


@pytest.mark.parametrize("N, C, causal", [(1, 8, True), (1, 8, False), (2, 24, True), (17, 40, False),
                                          (17, 80, True), (65, 8, True)])
def test_lengths_and_head_sizes_off_the_blocks_with_per_head_coefficients(ops, N, C, causal):
    _check(ops, 1, 2, N, C, 3, is_causal=causal)


def test_shared_float64_coefficients_negative_scale_and_single_step(ops):
    _check(ops, 1, 3, 9, 8, 2, shared=True)
    _check(ops, 1, 2, 9, 8, 2, scale=-0.3)
    _check(ops, 2, 2, 17, 8, 1, is_causal=True)


def test_a_fully_padded_sequence_under_causal_and_a_float_mask_with_a_minus_inf_row(ops):
    pad = torch.tensor([[False] * 5 + [True] * 4, [True] * 9])
    _check(ops, 2, 2, 9, 8, 2, is_causal=True, pad=pad)
    m = torch.zeros(9, 9)
    m[3] = -math.inf
    m[:, 2] = -1e4
    _check(ops, 1, 2, 9, 8, 3, is_causal=True, mask=m)


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 3e-2), (torch.bfloat16, 1e-1)])
def test_half_precision_with_two_steps(ops, dtype, tol):
    _check(ops, 1, 2, 17, 24, 2, dtype=dtype, tol=tol)


def test_bug_backward_operator_returns_the_strides_of_its_fake(ops):
    """Bug: ``triton_polynomial_bwd`` gave the coefficient gradient as a transposed view, strides ``(1, H)``, while
    its fake implementation (what ``torch.compile`` plans with) says contiguous ``(K + 1, 1)``: opcheck failed with
    "Stride mismatch! Strides are (1, 3) and (3, 1)"."""
    from diffusionformer.ops.triton import _library

    g = torch.Generator().manual_seed(3)
    q, k, v, go = (torch.randn(1, 3, 6, 4, generator=g).to(DEVICE) for _ in range(4))
    c = torch.randn(3, 3, generator=g).to(DEVICE)
    out, lse, ys = _library._fwd(q, k, v, c, None, False, 0.5, True, 0.0, None, None)
    args = (q, k, v, c, None, lse, ys, go, False, 0.5, 0.0, None, None)
    dc = _library._bwd(*args)[3]
    assert dc.shape == (3, 3) and dc.is_contiguous()
    torch.library.opcheck(_library._bwd, args, test_utils=("test_faketensor",))
