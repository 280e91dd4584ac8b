"""Fifth edge-case probes of the Triton kernels (``diffusionformer.ops.triton``) and of the dense dispatch to them,
under the interpreter on CPU: inputs whose head dimension is strided (``stride(-1) != 1``), views of a packed qkv
buffer with a storage offset, inputs expanded with stride 0 along batch, heads and tokens, head sizes 1 and 3,
gradients for a subset of the inputs, learned affine coefficients of mixed dtypes, and bool masks broadcast along the
keys on ``backend="triton"``.

Found and fixed (tests marked "Bug:"):

* ``triton.backend.split_mask`` turned a bool ``attn_mask`` broadcast along the keys as well (``(1, 1)``,
  ``(B, 1, 1, 1)``: every key of a sequence kept, or none) into a key padding mask of ONE column, which the kernels
  read ``N`` entries of per sequence: out-of-bounds bytes decided which keys were padding (outputs off by O(1)).
* ``dense._try_triton`` normalised the mask with ``is_causal=False`` and so never validated ``is_causal``: on
  ``backend="triton"`` ``is_causal="no"``, ``1`` or ``None`` were taken as flags (``"no"`` meant causal) where every
  other back-end raises a TypeError.
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


def _reference(q, k, v, c, is_causal=False, mask=None):
    """``sum_j c[h, j] P^j v`` in float64 with ``P`` built by hand: ``softmax(q k^T / sqrt(C) + mask)`` over the
    admissible keys (causal, bool mask True = attend, float mask finite); a row with no admissible key is zero."""
    q, k, v, c = (t.double() for t in (q, k, v, c))
    B, H, N, C = q.shape
    c = c.expand(H, -1) if c.dim() == 1 else c
    s = q @ k.transpose(-2, -1) * C**-0.5
    keep = torch.ones(B, H, N, N, dtype=torch.bool, device=q.device)
    if is_causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).expand(B, H, N, N)
        if mask.dtype == torch.bool:
            keep = keep & mask
        else:
            keep = keep & (mask > -math.inf)
            s = s + mask.double().masked_fill(~keep, 0.0)
    s = s.masked_fill(~keep, -math.inf)
    top = s.amax(-1, keepdim=True)
    e = torch.exp(s - torch.where(top > -math.inf, top, torch.zeros_like(top)))  # exp(-inf) = 0 off the graph
    total = e.sum(-1, keepdim=True)
    P = e / torch.where(total > 0, total, torch.ones_like(total))
    out, y = c[:, 0].view(1, H, 1, 1) * v, v
    for j in range(1, c.shape[1]):
        y = P @ y
        out = out + c[:, j].view(1, H, 1, 1) * y
    return out


def _assert_matches(out, ref, inputs, tol=2e-5):
    """Forward and the gradients of ``inputs`` (those that require grad) against the float64 reference."""
    assert torch.allclose(out.double(), ref, atol=tol, rtol=tol), (out.double() - ref).abs().max()
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(11), dtype=torch.float64).to(ref.device)
    leaves = [t for t in inputs if t.requires_grad]
    got = torch.autograd.grad(out, leaves, g.to(out.dtype), retain_graph=True)
    want = torch.autograd.grad(ref, leaves, g)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        a, b = a.double(), b.double()
        assert torch.allclose(a, b, atol=20 * tol, rtol=20 * tol), (a - b).abs().max()


def _randn(*shape, seed=0, grad=True):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    return t.requires_grad_(grad)


# ------------------------------------------------------------------------------------------ bugs
@pytest.mark.parametrize("shape", [(1, 1), (2, 1, 1, 1), (1, 1, 1, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_bug_bool_mask_broadcast_along_the_keys_is_not_a_one_column_key_padding_mask(ops, shape, causal):
    """Bug: a bool ``attn_mask`` broadcast along the keys too (``(1, 1)``, ``(B, 1, 1, 1)``) went down the kernels'
    key-padding path as a ``(B, 1)`` padding mask, of which the kernels read ``N`` bytes per sequence: whatever lay
    past it in memory padded keys, and ``backend="triton"`` was off from the float64 reference by O(1)."""
    from diffusionformer.functional import diffuse
    from diffusionformer.ops.triton.backend import split_mask

    B, H, N, C = 2, 2, 6, 4
    q, k, v = (_randn(B, H, N, C, seed=s) for s in range(3))
    c = _randn(H, 3, seed=3)
    mask = torch.tensor([True, False][: shape[0]]).view(shape).to(DEVICE)
    out = diffuse(q, k, v, c, attn_mask=mask, is_causal=causal, backend="triton")
    _assert_matches(out, _reference(q, k, v, c, is_causal=causal, mask=mask), (q, k, v, c))
    pad, general = split_mask(mask.reshape((1,) * (4 - mask.dim()) + shape), B)
    assert pad is None and general is not None


@pytest.mark.parametrize("flag", ["no", 1, 0, None])
def test_bug_triton_dispatch_validates_is_causal(ops, flag):
    """Bug: ``diffuse(..., backend="triton")`` never validated ``is_causal`` (the mask was normalised with ``False``
    in its place): ``"no"`` and ``1`` ran causal, ``0`` and ``None`` non-causal, where the other back-ends raise."""
    from diffusionformer.functional import diffuse

    q = _randn(1, 2, 5, 4, grad=False)
    with pytest.raises(TypeError, match=r"is_causal must be a bool"):
        diffuse(q, q, q, [0.0, 1.0, 0.5], is_causal=flag, backend="triton")
    with pytest.raises(TypeError, match=r"is_causal must be a bool"):
        diffuse(q, q, q, torch.tensor([0.0, 1.0]), is_causal=flag, backend="triton")


# ------------------------------------------------------------------------------------------ layouts (no bug found)
def test_head_dimension_strided_and_one_tensor_as_q_k_v(ops):
    """``q = k = v`` a transposed view whose head dimension has stride ``N`` (not 1), K = 2, causal."""
    x = _randn(1, 2, 8, 5, seed=1)
    t = x.transpose(-1, -2)
    assert t.stride(-1) != 1
    c = _randn(2, 3, seed=2)
    out = ops.polynomial_attention(t, t, t, c, is_causal=True)
    _assert_matches(out, _reference(t, t, t, c, is_causal=True), (x, c))


def test_views_of_a_packed_qkv_buffer_with_a_storage_offset(ops):
    """q, k, v sliced out of a ``(B, N + 2, 3, H, C)`` buffer (tokens 1..N, so every view has a storage offset),
    heads second: gradients land in the buffer's slots and nowhere else."""
    buf = _randn(2, 9, 3, 2, 8, seed=4)
    q, k, v = (buf[:, 1:8, i].transpose(1, 2) for i in range(3))
    assert q.storage_offset() > 0
    c = _randn(2, 4, seed=5)
    out = ops.polynomial_attention(q, k, v, c)
    _assert_matches(out, _reference(q, k, v, c), (buf, c))
    (gbuf,) = torch.autograd.grad(out.sum(), buf)
    assert not gbuf[:, 0].any() and not gbuf[:, 8].any()


def test_inputs_expanded_with_stride_zero_along_batch_heads_and_tokens(ops):
    """``q`` and ``k`` expanded along batch and heads, ``v`` along the tokens (every value the same row): gradients
    summed over the broadcast, as the reference's."""
    e = _randn(1, 1, 6, 8, seed=6)
    row = _randn(3, 2, 1, 8, seed=7)
    q, k, v = e.expand(3, 2, 6, 8), e.expand(3, 2, 6, 8), row.expand(3, 2, 6, 8)
    c = _randn(2, 3, seed=8)
    out = ops.polynomial_attention(q, k, v, c, is_causal=True)
    _assert_matches(out, _reference(q, k, v, c, is_causal=True), (e, row, c))


@pytest.mark.parametrize("C", [1, 3])
def test_head_sizes_one_and_three_across_block_edges(ops, C):
    """Head sizes far below the padded head block (16) with ``N = 17`` (past every interpreter block)."""
    q, k, v = (_randn(1, 2, 17, C, seed=10 + s) for s in range(3))
    c = _randn(2, 3, seed=13)
    out = ops.polynomial_attention(q, k, v, c)
    _assert_matches(out, _reference(q, k, v, c), (q, k, v, c))


@pytest.mark.parametrize("which", [(2,), (3,), (1, 3)])
def test_gradients_for_a_subset_of_the_inputs(ops, which):
    """Only some of q, k, v, coeffs require grad: the gradients that are asked for match the reference."""
    tensors = [_randn(1, 2, 7, 8, seed=20 + s, grad=s in which) for s in range(3)]
    c = _randn(2, 3, seed=23, grad=3 in which)
    out = ops.polynomial_attention(*tensors, c, is_causal=True)
    _assert_matches(out, _reference(*tensors, c, is_causal=True), (*tensors, c))


def test_learned_affine_coefficients_of_mixed_dtypes_get_their_gradients(ops):
    """``c0`` a float64 ``(H,)`` tensor and ``c1`` a 0-dim float32 tensor, both learned: their gradients (in their
    own dtypes) and those of q, k, v match the reference of ``c0 v + c1 P v``; two calls agree bit for bit."""
    H = 3
    q, k, v = (_randn(2, H, 7, 5, seed=30 + s) for s in range(3))
    c0 = torch.randn(H, dtype=torch.float64, generator=torch.Generator().manual_seed(33)).to(DEVICE).requires_grad_()
    c1 = torch.tensor(0.7, device=DEVICE, requires_grad=True)
    out = ops.affine_attention(q, k, v, c0, c1, is_causal=True)
    assert torch.equal(out, ops.affine_attention(q, k, v, c0, c1, is_causal=True))
    ref = _reference(q, k, v, torch.stack([c0, c1.double().expand(H)], 1), is_causal=True)
    _assert_matches(out, ref, (q, k, v, c0, c1))
    grads = torch.autograd.grad(out.sum(), (c0, c1))
    assert grads[0].dtype == torch.float64 and grads[1].shape == () and grads[1].dtype == torch.float32
