"""Edge-case probes of the Triton kernels (``diffusionformer.ops.triton``) on legal-but-unusual input, under the
interpreter on CPU: N = 1, H = 1, B = 0, N = 0, head sizes 1, 3 and 20 against the interpreter's 16-wide blocks,
non-contiguous and stride-0 inputs, causal + padding + bool mask with fully masked rows, float masks with ``-inf``
rows, bf16 / fp16 with fully masked rows, numpy numbers, meta tensors; each against the explicit float64 softmax
matrix and matrix powers of ``diffusionformer.ops.reference`` (forward and gradients).

Found and fixed (tests marked "Bug:"): ``affine_attention`` refused a numpy float32 coefficient ("got float32");
``dropout_scales`` refused numpy ints ("must be a positive int, got np.int64(2)"); meta tensors under the interpreter
failed with a NotImplementedError from a copy instead of the kernels' own device error. (Moved here from the
benchmark probes of the same sitting, to share the ``triton_kernels`` fixture of this folder.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusionformer.ops.reference import dense_attention_reference, polynomial_reference


@pytest.fixture
def triton_attention(triton_kernels):
    """``diffusionformer.ops.triton`` with the kernels of this folder's ``triton_kernels`` fixture (interpreted on
    CPU; skipped without triton or with an interpreter that cannot run here)."""
    if torch.cuda.is_available():
        pytest.skip("the interpreter probes are for CPU machines")
    import diffusionformer.ops.triton as ops

    return ops


def _reference(q, k, v, coeffs, is_causal=False, pad=None, mask=None):
    """sum_j c[h, j] P^j v with the explicit float64 softmax matrix of ``diffusionformer.ops.reference`` (a row with
    no admissible key is a zero row)."""
    B, H, N, _ = q.shape
    keep = torch.ones(B, 1, N, N, dtype=torch.bool)
    if is_causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool).tril()
    if pad is not None:
        keep = keep & ~pad[:, None, None, :]
    if mask is not None:
        keep = keep & mask
    return polynomial_reference(dense_attention_reference(q, k, allowed=keep), v, coeffs)


def _leaves(*shape, n=3, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(dtype).requires_grad_() for _ in range(n)]


def _check_grads(ops, q, k, v, c, tol, is_causal=False, pad=None, mask=None):
    """Output and the gradients of q, k, v and c against the float64 reference."""
    out = ops.polynomial_attention(q, k, v, c, is_causal=is_causal, key_padding_mask=pad, attn_mask=mask)
    torch.testing.assert_close(out.double(), _reference(q, k, v, c, is_causal, pad, mask), rtol=tol, atol=tol)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(out.dtype)
    got = torch.autograd.grad(out, (q, k, v, c), go)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, c)]
    want = torch.autograd.grad(_reference(*leaves, is_causal, pad, mask), leaves, go.double())
    for name, a, b in zip("qkvc", got, want):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("B,H,N,Cd,causal", [
    (1, 1, 1, 4, False),  # one token: P = [[1]]
    (2, 1, 1, 4, True),
    (1, 2, 5, 3, True),  # head size 3, padded to the 16-wide block
    (1, 1, 5, 1, False),  # head size 1
    (1, 1, 7, 20, True),  # head size above one block, not a power of two
], ids=["N1", "N1-causal", "C3", "C1", "C20"])
def test_odd_sizes_match_float64_forward_and_backward(triton_attention, B, H, N, Cd, causal):
    q, k, v = _leaves(B, H, N, Cd)
    c = torch.randn(H, 3, generator=torch.Generator().manual_seed(1)).requires_grad_()
    _check_grads(triton_attention, q, k, v, c, 1e-5, is_causal=causal)


def test_empty_batch_and_empty_sequence_give_empty_outputs_and_gradients(triton_attention):
    c = torch.randn(2, 3).requires_grad_()
    for shape in [(0, 2, 5, 4), (1, 2, 0, 4)]:
        q, k, v = _leaves(*shape)
        out = triton_attention.polynomial_attention(q, k, v, c)
        assert out.shape == shape
        gq, gk, gv, gc = torch.autograd.grad(out.sum(), (q, k, v, c))
        assert gq.shape == gk.shape == gv.shape == shape
        assert torch.equal(gc, torch.zeros_like(c))


def test_masks_with_fully_masked_rows_match_float64(triton_attention):
    """causal + key padding + a bool attn_mask with rows left without any key: zero rows of P, finite gradients."""
    q, k, v = _leaves(2, 2, 6, 4, seed=3)
    c = torch.tensor([[0.2, 1.0, -0.5], [1.0, -1.0, 0.3]], requires_grad=True)
    mask = torch.rand(2, 2, 6, 6, generator=torch.Generator().manual_seed(4)) > 0.5
    mask[0, 0, 2] = False
    mask[1, 1] = False  # a whole head without keys
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, :2] = True
    _check_grads(triton_attention, q, k, v, c, 1e-5, is_causal=True, pad=pad, mask=mask)


def test_float_mask_with_minus_inf_rows_and_non_contiguous_stride0_inputs(triton_attention):
    g = torch.Generator().manual_seed(5)
    base = torch.randn(1, 5, 2, 8, generator=g)
    q, k = base[..., :4].transpose(1, 2), base[..., 4:].transpose(1, 2)  # (B, N, H, C) storage, sliced
    v = torch.randn(1, 1, 5, 4, generator=g).expand(1, 2, 5, 4)  # stride 0 over heads
    c = torch.randn(2, 3, generator=g)
    fm = torch.zeros(1, 2, 5, 5)
    fm[0, 0, 3] = -float("inf")
    fm[..., 0] = -float("inf")
    out = triton_attention.polynomial_attention(q, k, v, c, attn_mask=fm)
    torch.testing.assert_close(out.double(), _reference(q, k, v, c, mask=torch.isfinite(fm)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 3e-2), (torch.float16, 4e-3)], ids=["bf16", "fp16"])
def test_half_precision_with_fully_masked_rows(triton_attention, dtype, tol):
    """Leading padding with ``is_causal``: rows 0..1 of batch 1 have no key; outputs and gradients stay finite and
    in the input dtype, close to float64 of the rounded inputs."""
    q, k, v = _leaves(2, 1, 5, 6, dtype=dtype, seed=6)
    c = torch.tensor([[0.5, 1.0, -0.3]])
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, :2] = True
    out = triton_attention.polynomial_attention(q, k, v, c, is_causal=True, key_padding_mask=pad)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), _reference(q, k, v, c, True, pad), rtol=tol, atol=tol)
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(g.dtype == dtype and torch.isfinite(g).all() for g in grads)


def test_numpy_numbers_are_numbers(triton_attention):
    """Bug: ``affine_attention(q, k, v, np.float32(0), np.float32(1))`` was a TypeError "c0 must be a float ...,
    got float32", and ``dropout_scales(seed, np.int64(2), ...)`` a ValueError "batch_size must be a positive int,
    got np.int64(2)" (numpy numbers from a sweep)."""
    q, k, v = _leaves(1, 2, 5, 4, seed=7)
    out = triton_attention.affine_attention(q, k, v, np.float32(1.0), np.float32(-1.0))  # the Laplacian head
    c = torch.tensor([[1.0, -1.0]] * 2)
    torch.testing.assert_close(out.double(), _reference(q, k, v, c), rtol=1e-5, atol=1e-5)
    seed = torch.tensor([3])
    numpy_scales = triton_attention.dropout_scales(seed, np.int64(2), np.int32(1), np.int64(3), np.int8(2), 0.25)
    assert torch.equal(numpy_scales, triton_attention.dropout_scales(seed, 2, 1, 3, 2, 0.25))
    with pytest.raises(TypeError, match="c0 must be a float"):
        triton_attention.affine_attention(q, k, v, True, 1.0)  # a bool is still not a coefficient


def test_meta_tensors_get_the_kernels_device_error(triton_attention):
    """Bug: meta tensors under the interpreter failed with "NotImplementedError: Cannot copy out of meta tensor"
    from inside a launch; now the kernels' RuntimeError naming the device."""
    q = torch.zeros(1, 1, 2, 4, device="meta")
    with pytest.raises(RuntimeError, match="got a meta tensor"):
        triton_attention.affine_attention(q, q, q, 0.0, 1.0)


def test_reference_softmax_has_zero_gradients_on_a_fully_masked_row():
    """Bug: ``dense_attention_reference`` (the float64 reference the kernels and the exact operators are checked
    against) gave NaN gradients to the queries of a row with no allowed key: it exponentiated ``s + 1e300`` there
    (inf, then masked), and ``inf * 0`` is NaN in the backward pass. The row is zero with zero gradients now; the
    other rows keep the softmax written out by hand, and ``gradcheck`` passes."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 3, 4, generator=g, dtype=torch.float64)
    allowed = torch.tensor([[1, 0, 0], [0, 0, 0], [1, 1, 0]], dtype=torch.bool)
    P = dense_attention_reference(q, k, allowed=allowed)
    s = (q @ k.transpose(-2, -1))[0, 0, 2, :2].detach() / 2.0  # scale 1/sqrt(4)
    by_hand = torch.exp(s) / torch.exp(s).sum()
    torch.testing.assert_close(P[0, 0, 2, :2].detach(), by_hand, rtol=0, atol=1e-15)
    assert torch.equal(P[0, 0, 1].detach(), torch.zeros(3, dtype=torch.float64))
    (grad,) = torch.autograd.grad(P.sum() + (P * torch.arange(9.0, dtype=torch.float64).view(3, 3)).sum(), q)
    assert torch.isfinite(grad).all() and torch.equal(grad[0, 0, 1], torch.zeros(4, dtype=torch.float64))
    assert torch.autograd.gradcheck(lambda t: dense_attention_reference(t, k, allowed=allowed), (q,))
