"""Edge-case probes of the Triton kernels (``diffusionformer.ops.triton``) with the tensor layouts a PyTorch user
passes, under the interpreter on CPU: outputs modified in place (residual ``+=``, through the token-major view), a
fused qkv projection split by ``view``/``unbind`` or ``chunk``, head sizes that are not powers of two at lengths
1, 2 and 65, output gradients with stride 0 or a permuted layout, masks of other float dtypes and sliced
storage, and inputs of a non-strided layout (sparse, nested).

Found and fixed (tests marked "Bug:"):

* ``_launch._forward`` returned its output as a transposed *view* (``empty(B, N, H, C).transpose(1, 2)``) made inside
  the autograd Function: autograd refuses to modify such a view in place, so ``out += residual`` (or any in-place op
  on ``out`` or on its ``transpose(1, 2).view(B, N, H * C)``) raised "Output 0 of _PolynomialAttention is a view and
  is being modified inplace" on ``polynomial_attention``, ``affine_attention`` and ``diffuse(backend="triton")``,
  where SDPA's output and every other back-end's take it.
* ``polynomial_attention``/``affine_attention`` took sparse and nested ``q``, ``k``, ``v``, ``key_padding_mask``,
  ``c0``/``c1`` unchecked ("Cannot access storage of SparseTensorImpl", "Internal error: NestedTensorImpl doesn't
  support sizes. Please file an issue.", "Concatenating sparse tensors"), and ``check_attn_mask`` (every dense entry
  point) a sparse ``attn_mask`` ("reshape is not implemented for sparse tensors"): now a TypeError naming the argument.
* ``polynomial_attention`` with one coefficient (K = 0) returned ``c0 v`` in ``v``'s layout, not token-major as
  every K > 0 output (``out.transpose(1, 2).view(B, N, H * C)`` raised for K = 0 only).
* The gradients under ``create_graph=True`` were views made inside a custom Function: ``g.mul_(2)`` raised.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.ops.reference import polynomial_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def ops(triton_kernels):
    """``diffusionformer.ops.triton`` with the kernels of this folder's ``triton_kernels`` fixture."""
    import diffusionformer.ops.triton as triton_ops

    return triton_ops


def _reference(q, k, v, c, is_causal=False, mask=None):
    """``sum_j c[h, j] P^j v`` in float64, ``P`` the masked softmax built by hand (bool mask True = attend, float mask
    added, ``-inf`` = not admissible; a row without admissible key is zero), powers by ``polynomial_reference``."""
    B, H, N, C = q.shape
    keep = torch.ones(B, H, N, N, dtype=torch.bool, device=q.device)
    bias = torch.zeros(B, H, N, N, dtype=torch.float64, device=q.device)
    if is_causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).expand(B, H, N, N)
        if m.dtype == torch.bool:
            keep = keep & m
        else:
            keep = keep & (m > -math.inf)
            bias = torch.where(keep, m.double(), bias)
    s = q.double() @ k.double().transpose(-2, -1) * C**-0.5 + bias
    top = torch.where(keep, s, -math.inf).amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.where(keep, (s - top).exp(), torch.zeros_like(s))
    z = e.sum(-1, keepdim=True)
    P = torch.where(z != 0, e / torch.where(z != 0, z, torch.ones_like(z)), torch.zeros_like(e))
    c = c.double()
    return polynomial_reference(P, v.double(), c.expand(H, -1) if c.dim() == 1 else c)


def _grads_match(loss, ref_loss, leaves, tol=1e-4):
    got = torch.autograd.grad(loss, leaves)
    want = torch.autograd.grad(ref_loss, leaves)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol)


def _randn(*shape, seed=0, grad=True, dtype=torch.float32):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device=DEVICE, dtype=dtype)
    return t.requires_grad_(grad)


# ------------------------------------------------------------------------------------------ bugs
@pytest.mark.parametrize("call", ["polynomial", "affine", "diffuse"])
def test_bug_output_modified_in_place_like_sdpa_output(ops, call):
    """Bug: the kernels' output was a transposed view made inside the autograd Function, and autograd refuses to
    modify such a view in place: ``out += residual`` (and in-place ops on ``out.transpose(1, 2).view(B, N, H * C)``)
    raised "Output 0 of _PolynomialAttention is a view and is being modified inplace", where SDPA's output takes
    it. Now the output is allocated token-major (the same strides) and the in-place ops give the reference's
    values and gradients."""
    from diffusionformer.functional import diffuse

    B, H, N, C = 2, 2, 9, 4
    q, k, v = (_randn(B, H, N, C, seed=s) for s in range(3))
    c = _randn(H, 3, seed=3)
    res = _randn(B, N, H * C, seed=4, grad=False)
    if call == "polynomial":
        out, coeffs = ops.polynomial_attention(q, k, v, c, is_causal=True), c
    elif call == "affine":
        out, coeffs = ops.affine_attention(q, k, v, c[:, 0], 0.5, is_causal=True), c[:, :2].clone()
        coeffs[:, 1] = 0.5
    else:
        out, coeffs = diffuse(q, k, v, c, is_causal=True, backend="triton"), c
    assert out.transpose(1, 2).is_contiguous()  # still token-major: the reshape below is a view
    flat = out.transpose(1, 2).view(B, N, H * C)
    out.mul_(2.0)
    flat += res
    ref = (_reference(q, k, v, coeffs, is_causal=True) * 2).transpose(1, 2).reshape(B, N, H * C) + res.double()
    torch.testing.assert_close(flat.double(), ref, rtol=2e-5, atol=2e-5)
    w = _randn(B, N, H * C, seed=5, grad=False)
    _grads_match((flat * w).sum(), (ref * w.double()).sum(), (q, k, v, c))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.parametrize("arg", ["q", "v", "key_padding_mask", "attn_mask", "c0"])
@pytest.mark.parametrize("layout", ["sparse", "nested"])
def test_bug_sparse_and_nested_arguments_are_named(ops, arg, layout):
    """Bug: sparse or nested ``q``/``v``, ``key_padding_mask``, ``attn_mask`` and ``c0`` reached torch internals
    ("Cannot access storage of SparseTensorImpl", "Internal error: NestedTensorImpl doesn't support sizes. Please
    file an issue.", "reshape is not implemented for sparse tensors", "Concatenating sparse tensors ..."). Now a
    TypeError names the argument, as the dense entry point does for ``q``."""
    from diffusionformer.functional import diffuse

    B, H, N, C = 2, 2, 3, 4
    q, k, v = (_randn(B, H, N, C, seed=s, grad=False) for s in range(3))
    kw = dict(q=q, k=k, v=v, c0=0.0, c1=1.0)
    dense = {"q": q, "v": v, "key_padding_mask": torch.zeros(B, N, dtype=torch.bool, device=DEVICE),
             "attn_mask": torch.randn(B, H, N, N, device=DEVICE), "c0": torch.ones(H, device=DEVICE)}[arg]
    if layout == "sparse":
        bad = dense.to_sparse()
    else:
        bad = torch.nested.nested_tensor(list(dense.unbind(0)))
    kw[arg] = bad
    with pytest.raises(TypeError, match=rf"{arg} must be a dense \(strided\) tensor"):
        ops.affine_attention(**kw)
    if arg == "attn_mask":
        with pytest.raises(TypeError, match=r"attn_mask must be a dense \(strided\) tensor"):
            diffuse(q, k, v, [0.0, 1.0, 0.5], attn_mask=bad, backend="triton")
        with pytest.raises(TypeError, match=r"attn_mask must be a dense \(strided\) tensor"):
            diffuse(q, k, v, [0.0, 1.0, 0.5], attn_mask=bad, backend="matrix")


# ------------------------------------------------------------------------------------------ pins (no bug found)
def test_pins_fused_qkv_projection_views_with_head_sizes_off_powers_of_two(ops):
    """q, k, v from one ``x @ W`` projection: ``view(B, N, 3, H, D).unbind(2)`` then ``transpose(1, 2)`` (causal,
    D = 24) and ``view(B, N, H, 3 D).transpose(1, 2).chunk(3, -1)`` (D = 40): forward and the gradients of ``x`` and
    the coefficients against float64; the gradient of ``x`` flows through the views."""
    B, N, H = 2, 17, 2
    for D, split, causal in ((24, "unbind", True), (40, "chunk", False)):
        x = _randn(B, N, 8, seed=D)
        W = _randn(8, 3 * H * D, seed=D + 1, grad=False) * 0.3
        c = _randn(H, 3, seed=D + 2)

        def qkv(x):
            y = x @ W.to(x.dtype)
            if split == "unbind":
                return [t.transpose(1, 2) for t in y.view(B, N, 3, H, D).unbind(2)]
            return y.view(B, N, H, 3 * D).transpose(1, 2).chunk(3, -1)

        out = ops.polynomial_attention(*qkv(x), c, is_causal=causal)
        ref = _reference(*qkv(x), c, is_causal=causal)
        torch.testing.assert_close(out.double(), ref, rtol=2e-5, atol=2e-5)
        w = _randn(*out.shape, seed=7, grad=False)
        _grads_match((out * w).sum(), (ref * w.double()).sum(), (x, c))


@pytest.mark.parametrize("N", [1, 2, 65])
def test_pins_head_size_72_at_lengths_one_two_and_past_the_blocks(ops, N):
    """Head size 72 (padded to a 128-channel block) at N = 1, 2 and 65 (past every interpreter block), causal."""
    q, k, v = (_randn(1, 2, N, 72, seed=40 + s) for s in range(3))
    c = _randn(2, 3, seed=43)
    out = ops.polynomial_attention(q, k, v, c, is_causal=True)
    ref = _reference(q, k, v, c, is_causal=True)
    torch.testing.assert_close(out.double(), ref, rtol=2e-5, atol=2e-5)
    w = _randn(*out.shape, seed=44, grad=False)
    _grads_match((out * w).sum(), (ref * w.double()).sum(), (q, k, v, c))


def test_pins_output_gradients_with_stride_zero_and_permuted_layouts(ops):
    """Losses whose output gradient has stride 0 along the head dimension (``out.sum(-1)``), along batch and heads
    (``out.sum((0, 1))``), or is permuted (``out.permute(3, 2, 0, 1).contiguous()``) or sliced."""
    B, H, N, C = 2, 2, 17, 8
    q, k, v = (_randn(B, H, N, C, seed=50 + s) for s in range(3))
    c = _randn(H, 3, seed=53)
    w = _randn(N, C, seed=54, grad=False).double()
    losses = [lambda o: (o.sum(-1) ** 2).sum(), lambda o: (o.sum((0, 1)).double() * w).sum(),
              lambda o: (o.permute(3, 2, 0, 1).contiguous() ** 2).sum(), lambda o: (o[:, :, 3:10, 2:5] ** 2).sum()]
    for loss in losses:
        out = ops.polynomial_attention(q, k, v, c)
        _grads_match(loss(out), loss(_reference(q, k, v, c)), (q, k, v, c), tol=2e-4)


def test_pins_masks_of_other_dtypes_sliced_storage_and_a_transposed_padding_mask(ops):
    """A float16 mask for float32 inputs, a float64 ``(B, 1, N, 1)`` mask, a float mask sliced out of a larger
    buffer (storage offset, row stride past N) and a transposed key padding mask beside a ``(1, H, 1, N)`` float
    mask; gradients of ``k`` alone in one case (the others not requiring grad)."""
    B, H, N, C = 2, 2, 17, 8
    q, k, v = (_randn(B, H, N, C, seed=60 + s) for s in range(3))
    c = _randn(H, 3, seed=63)
    g = torch.Generator().manual_seed(64)
    big = torch.randn(B, H, N + 3, N + 5, generator=g).to(DEVICE)
    pad = torch.zeros(N, B, dtype=torch.bool, device=DEVICE)
    pad[3:6, 1] = True
    pad = pad.t()
    head = torch.randn(1, H, 1, N, generator=g).to(DEVICE)
    cases = [
        (dict(attn_mask=torch.randn(N, N, generator=g).half().to(DEVICE)), None),
        (dict(attn_mask=torch.randn(B, 1, N, 1, generator=g, dtype=torch.float64).to(DEVICE), is_causal=True), None),
        (dict(attn_mask=big[:, :, 2:2 + N, 1:1 + N]), None),
        (dict(attn_mask=head, key_padding_mask=pad), torch.where(~pad[:, None, None, :], head, -math.inf)),
    ]
    for i, (kw, mask) in enumerate(cases):
        mask = kw.get("attn_mask") if mask is None else mask
        leaves = (k,) if i == 1 else (q, k, v, c)
        out = ops.polynomial_attention(q, k, v, c, **kw)
        ref = _reference(q, k, v, c, is_causal=kw.get("is_causal", False), mask=mask.float())
        torch.testing.assert_close(out.double(), ref, rtol=2e-5, atol=2e-5)
        w = _randn(*out.shape, seed=65 + i, grad=False)
        _grads_match((out * w).sum(), (ref * w.double()).sum(), leaves)


def test_bug_degree_zero_output_has_the_kernels_token_major_layout(ops):
    """Bug: with one coefficient (K = 0) ``polynomial_attention`` returned ``c0 v`` in ``v``'s layout (contiguous
    ``(B, H, N, C)``), where every K > 0 output is stored token-major ``(B, N, H, C)`` as the module docstring says:
    ``out.transpose(1, 2).view(B, N, H * C)`` worked for K > 0 and raised for K = 0."""
    torch.manual_seed(0)
    B, H, N, C = 2, 3, 5, 4
    q, k = torch.randn(2, B, H, N, C, device=DEVICE)
    v = torch.randn(B, H, N, C, device=DEVICE, requires_grad=True)
    c = torch.tensor([[0.5], [-1.0], [2.0]], device=DEVICE)
    out = ops.polynomial_attention(q, k, v, c)
    one = ops.polynomial_attention(q, k, v.detach(), torch.tensor([[0.5, 0.0]] * H, device=DEVICE))
    assert out.stride() == one.stride() == (N * H * C, C, H * C, 1)
    flat = out.transpose(1, 2).view(B, N, H * C)
    torch.testing.assert_close(out, c.view(1, H, 1, 1) * v, rtol=0, atol=0)
    flat.sum().backward()
    torch.testing.assert_close(v.grad, c.view(1, H, 1, 1).expand(B, H, N, C), rtol=0, atol=0)


def test_bug_gradients_under_create_graph_may_be_modified_in_place(ops):
    """Bug: under ``create_graph=True`` the kernels' gradients were views made inside a custom Function
    (``_launch._NoDoubleBackward``), so an in-place op on them (``g.mul_(2)``, a clipping ``g.clamp_``) raised
    autograd's "is a view and is being modified inplace" instead of acting; a gradient of them still raises the
    kernels' own "no double backward"."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, device=DEVICE, requires_grad=True) for _ in range(3))
    c = torch.randn(2, 3, device=DEVICE, dtype=torch.float64)
    target = torch.randn(1, 2, 6, 8, device=DEVICE)
    loss = (ops.polynomial_attention(q, k, v, c.float(), is_causal=True) * target).sum()
    gq, gv = torch.autograd.grad(loss, (q, v), create_graph=True)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want_q, want_v = torch.autograd.grad((_reference(qd, kd, vd, c, True) * target.double()).sum(), (qd, vd))
    gq.mul_(2)
    gv.clamp_(-0.1, 0.1)
    torch.testing.assert_close(gq.double(), 2 * want_q, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gv.double(), want_v.clamp(-0.1, 0.1), rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="no double backward"):
        (gq.sum() + gv.sum()).backward()
