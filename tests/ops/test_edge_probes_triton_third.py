"""Third edge-case probes of the Triton kernels (``diffusionformer.ops.triton``) under the interpreter on CPU: every
broadcast shape of a bool and a float ``attn_mask`` (2-D, 3-D, query-only, key-only per head, one value per
sequence) off the interpreter's blocks, a stride-0 or transposed output gradient and transposed inputs, ``H = 0``,
``B = 0`` with a mask and dropout, ``q``, ``k``, ``v`` one tensor or slices of one packed projection, dropout with a
float mask and ``is_causal`` (forward and gradients against the written-out masks; negative and extreme seeds), and
layers of mixed operators with grouped-query heads on ``backend="triton"`` against float64 ``"matrix"``.

Found and fixed (tests marked "Bug:"): ``dropout_scales`` launched on any device its seed was on (a CPU seed without
the interpreter failed inside triton with "0 active drivers ([]). There should only be one.", a meta seed with
"Cannot copy out of meta tensor"); a float ``attn_mask`` that requires grad was refused under ``torch.no_grad`` (by
``polynomial_attention`` and by ``backend="triton"``), where no gradient is asked for, and only for a mask of the
dtype of ``q`` (one cast to ``q``'s dtype there lost ``requires_grad`` and was accepted).
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def ops(triton_kernels):
    """``diffusionformer.ops.triton`` with the kernels of this folder's ``triton_kernels`` fixture."""
    import diffusionformer.ops.triton as triton_ops

    return triton_ops


def _reference(q, k, v, c, is_causal=False, mask=None, drops=None):
    """``sum_j c[h, j] (P * D_j) ... (P * D_1) v`` in float64 with ``P = softmax(q k^T / sqrt(C) + bias)`` over the
    admissible keys (a bool mask, or a float mask's finite entries; a float mask shifted by its row maximum over
    them, as the kernels do); a row with no admissible key is a zero row."""
    q, k, v, c = (t.double() for t in (q, k, v, c))
    B, H, N, C = q.shape
    c = c.expand(H, -1) if c.dim() == 1 else c
    s = q @ k.transpose(-2, -1) / C**0.5
    keep = torch.ones(B, H, N, N, dtype=torch.bool, device=q.device)
    if is_causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
        if mask.dtype == torch.bool:
            keep = keep & mask
        else:
            b = mask.double().expand(B, H, N, N)
            keep = keep & (b > -math.inf)
            top = b.masked_fill(~keep, -math.inf).amax(-1, keepdim=True)
            s = s + b.masked_fill(~keep, 0.0) - torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    s = s.masked_fill(~keep, -math.inf)
    ok = keep.any(-1, keepdim=True)
    P = torch.softmax(s.masked_fill(~ok, 0.0), -1) * ok
    out, y = c[:, 0].view(1, H, 1, 1) * v, v
    for j in range(1, c.shape[1]):
        y = (P if drops is None else P * drops[j - 1].double()) @ y
        out = out + c[:, j].view(1, H, 1, 1) * y
    return out


def _leaves(*shape, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(DEVICE).requires_grad_() for _ in range(n)]


def _assert_grads(out, ref, inputs, go=None, tol=1e-5):
    """``out`` against ``ref`` and the gradients of ``inputs`` under the output gradient ``go`` (default random)."""
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    if go is None:
        go = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(out)
    got = torch.autograd.grad(out, inputs, go)
    want = torch.autograd.grad(ref, inputs, go.double())
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol * (1 + b.abs().max().item()),
                                   msg=lambda m, i=i: f"input {i}: {m}")


# ------------------------------------------------------------------------------------------ masks
_SHAPES = {"2d": (17, 17), "3d-heads": (3, 17, 17), "key-per-head": (1, 3, 1, 17), "query-only": (2, 3, 17, 1),
           "per-sequence": (2, 1, 1, 1)}


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("shape", list(_SHAPES.values()), ids=list(_SHAPES))
def test_every_broadcast_shape_of_a_mask_matches_float64(ops, shape, kind):
    """Masks read with stride 0 along every broadcast dimension (and 2-D / 3-D masks made 4-D), with ``is_causal``,
    N = 17 (off the 32/16-wide blocks), head size 12, K = 2: forward and the gradients of q, k, v and c."""
    q, k, v = _leaves(2, 3, 17, 12)
    c = torch.randn(3, 3, generator=torch.Generator().manual_seed(1)).to(DEVICE).requires_grad_()
    g = torch.Generator().manual_seed(2)
    if kind == "bool":
        mask = torch.rand(*shape, generator=g) > 0.3
    else:
        mask = (torch.randn(*shape, generator=g) * 2).masked_fill(torch.rand(*shape, generator=g) > 0.8, -math.inf)
    mask = mask.to(DEVICE)
    out = ops.polynomial_attention(q, k, v, c, is_causal=True, attn_mask=mask)
    _assert_grads(out, _reference(q, k, v, c, True, mask), (q, k, v, c))


# ------------------------------------------------------------------------------------------ layouts
def test_stride0_and_transposed_output_gradients_and_transposed_inputs(ops):
    """``out.sum()`` hands the backward kernels an all-stride-0 gradient, a transposed view one whose channel
    stride is not 1; inputs stored ``(B, H, C, N)`` and read transposed."""
    base = _leaves(2, 2, 5, 9, seed=4)  # (B, H, C, N)
    q, k, v = (t.transpose(-1, -2) for t in base)
    c = torch.randn(2, 4, generator=torch.Generator().manual_seed(5)).to(DEVICE).requires_grad_()
    stride0 = torch.ones(1, device=DEVICE).expand(2, 2, 9, 5)
    transposed = torch.randn(2, 2, 5, 9, generator=torch.Generator().manual_seed(6)).to(DEVICE).transpose(-1, -2)
    for go in (stride0, transposed):
        out = ops.polynomial_attention(q, k, v, c, is_causal=True)
        _assert_grads(out, _reference(q, k, v, c, is_causal=True), (*base, c), go=go)


def test_one_tensor_as_q_k_v_and_slices_of_a_packed_projection(ops):
    """The gradients of ``q``, ``k`` and ``v`` add up where they are one tensor, or slices of one ``(B, N, H, 3C)``
    projection (the layer's layout)."""
    (x,) = _leaves(2, 2, 11, 5, n=1, seed=7)
    c = torch.randn(2, 3, generator=torch.Generator().manual_seed(8)).to(DEVICE).requires_grad_()
    _assert_grads(ops.polynomial_attention(x, x, x, c, is_causal=True), _reference(x, x, x, c, True), (x, c))
    (packed,) = _leaves(2, 11, 2, 15, n=1, seed=9)
    q, k, v = (t.transpose(1, 2) for t in packed.split(5, dim=-1))
    _assert_grads(ops.polynomial_attention(q, k, v, c), _reference(q, k, v, c), (packed, c))


def test_no_heads_and_an_empty_batch_with_mask_and_dropout(ops):
    """``H = 0`` (grid without sequence-heads) and ``B = 0`` with a float mask, ``is_causal``, dropout and K = 3:
    empty outputs and gradients of the right shapes, zero coefficient gradients."""
    q, k, v = _leaves(1, 0, 5, 4)
    out = ops.polynomial_attention(q, k, v, torch.zeros(0, 3))
    assert out.shape == (1, 0, 5, 4)
    assert ops.affine_attention(q, k, v, 0.0, 1.0).shape == (1, 0, 5, 4)
    assert [g.shape for g in torch.autograd.grad(out.sum(), (q, k, v))] == [(1, 0, 5, 4)] * 3
    q, k, v = _leaves(0, 2, 5, 4)
    c = torch.randn(2, 4, device=DEVICE, requires_grad=True)
    out = ops.polynomial_attention(q, k, v, c, attn_mask=torch.zeros(0, 2, 5, 5, device=DEVICE), is_causal=True,
                                   dropout_p=0.3)
    grads = torch.autograd.grad(out.sum(), (q, k, v, c))
    assert out.shape == (0, 2, 5, 4) and [g.shape for g in grads[:3]] == [(0, 2, 5, 4)] * 3
    assert torch.equal(grads[3], torch.zeros_like(c))


# ------------------------------------------------------------------------------------------ dropout
def test_dropout_with_a_float_mask_and_causal_uses_the_same_masks_forward_and_backward(ops):
    """Against ``sum_k c_k (P * D_k) ... (P * D_1) v`` with the masks :func:`dropout_scales` writes out (K = 3, a float
    mask with a ``-inf`` row and a ``-1e9`` column, N = 17): the output and every gradient, so the backward kernels
    drew the forward's masks; the same seed gives the same output bit for bit."""
    q, k, v = _leaves(2, 2, 17, 6, seed=3)
    c = torch.randn(2, 4, generator=torch.Generator().manual_seed(1)).to(DEVICE).requires_grad_()
    fm = torch.randn(2, 1, 17, 17, generator=torch.Generator().manual_seed(2))
    fm[0, 0, 4] = -math.inf
    fm[1, 0, :, 3] = -1e9
    fm = fm.to(DEVICE)
    seed = torch.tensor([12345], device=DEVICE)
    D = ops.dropout_scales(seed, 2, 2, 17, 3, 0.3)
    out = ops.polynomial_attention(q, k, v, c, is_causal=True, attn_mask=fm, dropout_p=0.3, seed=seed)
    again = ops.polynomial_attention(q, k, v, c, is_causal=True, attn_mask=fm, dropout_p=0.3, seed=seed.clone())
    assert torch.equal(out, again)
    _assert_grads(out, _reference(q, k, v, c, True, fm, drops=D), (q, k, v, c))


@pytest.mark.parametrize("value", [-1, 2**63 - 1], ids=["negative", "int64-max"])
def test_extreme_seeds_draw_masks_the_kernels_apply(ops, value):
    """A negative and the largest int64 seed: the kernels' masks are the ones :func:`dropout_scales` writes out,
    and keep about ``1 - p`` of the entries."""
    q, k, v = _leaves(1, 2, 9, 4, seed=5)
    c = torch.randn(2, 3, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    seed = torch.tensor([value], device=DEVICE)
    D = ops.dropout_scales(seed, 1, 2, 9, 2, 0.25)
    assert 0.6 < (D > 0).float().mean().item() < 0.9
    out = ops.polynomial_attention(q, k, v, c, dropout_p=0.25, seed=seed)
    torch.testing.assert_close(out.double(), _reference(q, k, v, c, drops=D), rtol=1e-5, atol=1e-5)


def test_bug_dropout_scales_checks_the_device_of_its_seed(ops):
    """Bug: ``dropout_scales`` launched its kernel on whatever device the seed was on: a meta seed under the
    interpreter failed with "NotImplementedError: Cannot copy out of meta tensor; no data!" (a CPU seed without the
    interpreter with triton's "0 active drivers"); now the kernels' RuntimeError naming the device and the seed."""
    with pytest.raises(RuntimeError, match=r"got a meta tensor \(seed\)"):
        ops.dropout_scales(torch.tensor([3], device="meta"), 1, 1, 4, 1, 0.5)


@pytest.mark.skipif(DEVICE == "cuda", reason="checks the error for a CPU seed without the interpreter")
def test_bug_dropout_scales_on_cpu_without_the_interpreter_is_named(ops):
    """Bug: ``dropout_scales(torch.tensor([3]), ...)`` without ``TRITON_INTERPRET=1`` failed inside triton with
    "RuntimeError: 0 active drivers ([]). There should only be one."; now it says to set ``TRITON_INTERPRET=1``."""
    code = (
        "import os; os.environ['TRITON_INTERPRET'] = '0'\n"
        "import torch, diffusionformer.ops.triton as t\n"
        "try:\n    t.dropout_scales(torch.tensor([3]), 1, 1, 4, 1, 0.5)\n"
        "except RuntimeError as e:\n    print('RuntimeError:', e)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "got a cpu tensor (seed)" in res.stdout and "TRITON_INTERPRET=1" in res.stdout


# ------------------------------------------------------------------------------------------ dispatch
def test_bug_a_learned_float_mask_is_supported_under_no_grad(ops):
    """Bug: a float ``attn_mask`` that requires grad (a learned bias) was refused under ``torch.no_grad`` by
    ``polynomial_attention`` ("attn_mask requires grad") and by ``backend="triton"`` ("does not support a float
    attn_mask that requires grad"), though no gradient is asked for there, and only when the mask had the dtype
    of ``q`` (cast to bf16 it lost ``requires_grad`` and was accepted). With grad mode on it is still refused."""
    from diffusionformer.functional import diffuse

    q, k, v = (t.detach() for t in _leaves(1, 2, 6, 4, seed=10))
    bias = torch.nn.Parameter(torch.randn(6, 6, generator=torch.Generator().manual_seed(11)).to(DEVICE))
    c = torch.tensor([[0.0, 1.0, 0.5], [1.0, -1.0, 0.2]], device=DEVICE)
    want = _reference(q, k, v, c, mask=bias.detach())
    with torch.no_grad():
        torch.testing.assert_close(ops.polynomial_attention(q, k, v, c, attn_mask=bias).double(), want,
                                   rtol=1e-5, atol=1e-5)
        got = diffuse(q, k, v, c.tolist(), attn_mask=bias, backend="triton")
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="attn_mask requires grad"):
        ops.polynomial_attention(q, k, v, c, attn_mask=bias)
    with pytest.raises(ValueError, match="backend='triton' does not support a float attn_mask that requires grad"):
        diffuse(q, k, v, c.tolist(), attn_mask=bias, backend="triton")


@pytest.mark.parametrize("kv, causal, masked", [(2, False, "pad+float"), (1, True, "bool")], ids=["gqa", "mqa"])
def test_mixed_layer_with_grouped_kv_heads_matches_float64_matrix(ops, kv, causal, masked):
    """A layer of a Laplacian, a learned heat, an attention and a fixed heat head with 2 or 1 key/value heads
    (repeated over the query groups before the kernels), key padding folded into a per-head float mask or a
    per-head bool mask: output and every parameter gradient against the float64 ``"matrix"`` back-end."""
    from diffusionformer.nn import DiffusionAttention

    torch.manual_seed(0)
    heads = "laplacian:1,heat(t=0.7, learnable=True):1,attention:1,heat:1"
    ref_layer = DiffusionAttention(24, 4, heads=heads, backend="matrix", num_kv_heads=kv, causal=causal).double()
    layer = copy.deepcopy(ref_layer).float().to(DEVICE)
    layer.backend = "triton"
    x = torch.randn(2, 13, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pad = torch.zeros(2, 13, dtype=torch.bool)
    pad[1, -4:] = True
    pad[0, :2] = True
    g = torch.Generator().manual_seed(2)
    if masked == "bool":
        pad, mask = None, torch.rand(2, 4, 13, 13, generator=g) > 0.4
    else:
        mask = torch.randn(1, 4, 13, 13, generator=g)
        mask[0, 1, 3] = -math.inf
    want = ref_layer(x, key_padding_mask=pad, attn_mask=mask if mask.dtype == torch.bool else mask.double())
    got = layer(x.float().to(DEVICE), key_padding_mask=None if pad is None else pad.to(DEVICE),
                attn_mask=mask.to(DEVICE))
    torch.testing.assert_close(got.double().cpu(), want, rtol=1e-5, atol=1e-5)
    go = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    want.backward(go)
    got.backward(go.float().to(DEVICE))
    for (name, a), b in zip(layer.named_parameters(), ref_layer.parameters()):
        assert (a.grad is None) == (b.grad is None), name
        if b.grad is not None:
            torch.testing.assert_close(a.grad.double().cpu(), b.grad, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("call", ["polynomial", "dropout_scales_heads", "dropout_scales_steps"])
def test_bug_a_grid_past_cudas_cap_is_named_by_the_public_kernels(ops, call: str) -> None:
    """Bug: only the back-end's dispatch checked CUDA's 65535 cap on the grid axes the kernels use (``B * H`` on
    the second, the dropout steps on the third); the public ``polynomial_attention``, ``affine_attention`` and
    ``dropout_scales`` launched past it (on a GPU a launch error naming neither). Refused before any launch now."""
    dropout_scales, polynomial_attention = ops.dropout_scales, ops.polynomial_attention
    if call == "polynomial":
        q = torch.zeros(65536, 1, 1, 1, device=DEVICE)
        with pytest.raises(ValueError, match=r"per sequence-head .* at most 65535; got B \* H = 65536"):
            polynomial_attention(q, q, q, torch.tensor([0.0, 1.0]))
    else:
        heads, steps = (65536, 1) if call == "dropout_scales_heads" else (1, 65536)
        with pytest.raises(ValueError, match=r"at most 65535; got " + (r"B \* H" if steps == 1 else "steps")):
            dropout_scales(torch.zeros(1, dtype=torch.int64, device=DEVICE), 1, heads, 1, steps, 0.5)
