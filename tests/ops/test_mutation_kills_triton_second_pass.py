"""Tests written in a second mutation-testing audit of the Triton back-end's host side
(``diffusionformer/ops/triton/_launch.py``, ``backend.py``, ``attention.py``, the dispatch rule of
``diffusionformer/ops/dense.py`` and a few masking and bounds lines of ``_kernels.py``).

Each test kills a mutant that the rest of the suite (the first pass,
``test_mutation_kills_triton.py``, included) let through; its docstring names it (file and mutation):
the argument checks of the public functions and of :func:`dropout_scales` (a bad argument gets a
``TypeError``/``ValueError`` naming it, not an error from deep inside), the rule that decides when
``diffuse`` takes the kernels and when it falls back to the PyTorch back-ends, the per-head key mask
that must not take the kernels' key-padding path, the generic engine loop on the back-end (padding,
scale and dropout forwarded), and the backward pass when only some inputs require grad. References
are independent: explicit float64 softmax matrices built by hand, torch autograd on those for the
gradients, and the documented contract. On CPU the kernels run under the Triton interpreter
(``conftest.py``), so sizes are tiny (``N <= 16``, ``C <= 16`` except the head-size rule, which needs
``C = 128`` and ``C = 136`` at ``N = 2``); deterministic (seeded generators). Mutants judged
equivalent are listed, with the reason, at the end of the file.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import Tensor

from diffusionformer.functional import diffuse
from diffusionformer.ops.triton import affine_attention, dropout_scales, polynomial_attention
from diffusionformer.ops.triton import backend as triton_backend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install 'triton>=3.6'; Linux wheels only)",
)

pytestmark = [requires_triton, pytest.mark.usefixtures("triton_kernels")]


def _softmax(q: Tensor, k: Tensor, keep: Tensor | None = None, scale: float | None = None) -> Tensor:
    """Explicit float64 softmax matrix ``(B, H, N, N)`` of the scores; ``keep`` (bool, True = attend) broadcast
    to it; a row with no admissible key is a zero row. Differentiable (for autograd references)."""
    q, k = q.double(), k.double()
    s = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if keep is None:
        keep = torch.ones_like(s, dtype=torch.bool)
    keep = keep.expand(s.shape)
    s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True).detach().clamp_min(-1e300).nan_to_num(0.0)
    e = torch.exp(s - m) * keep
    return e / e.sum(-1, keepdim=True).clamp_min(1e-300)


def _heads(P: Tensor, v: Tensor, rows) -> Tensor:
    """``sum_j rows[h][j] P_h^j v_h`` in float64, the powers written out one product at a time."""
    v = v.double()
    outs = []
    for h, row in enumerate(rows):
        y, o = v[:, h], row[0] * v[:, h]
        for c in row[1:]:
            y = P[:, h] @ y
            o = o + c * y
        outs.append(o)
    return torch.stack(outs, 1)


def _qkv(B=1, H=2, N=8, C=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, C, generator=g).to(DEVICE) for _ in range(3)]


def _seed(n: int) -> Tensor:
    return torch.tensor([n], dtype=torch.int64, device=DEVICE)


# ---------------------------------------------------------------------------- _launch.py / attention.py: arguments
def test_inputs_that_are_not_4d_tensors_of_one_shape_are_named():
    """kills: _launch.py _check_inputs without its ``isinstance(t, Tensor)`` check (an AttributeError),
    with ``t.dim() != 4`` -> ``t.dim() < 4`` (a 5-D input reaches the launch geometry), comparing the shapes
    of ``q`` and ``k`` only (``== v.shape`` dropped: values of another size reach the kernels), and
    attention.py affine_attention without its own ``_check_inputs`` call (``q.shape[1]`` of a list)"""
    q, k, v = _qkv(N=4)
    c = torch.tensor([0.0, 1.0], device=DEVICE)
    with pytest.raises(TypeError, match="q must be a torch.Tensor of shape"):
        polynomial_attention(q.tolist(), k, v, c)
    with pytest.raises(TypeError, match="v must be a torch.Tensor of shape .*got list"):
        polynomial_attention(q, k, v.tolist(), c)
    with pytest.raises(TypeError, match="q must be a torch.Tensor of shape .*got list"):
        affine_attention(q.tolist(), k, v, 0.0, 1.0)
    five = q.unsqueeze(0)
    with pytest.raises(ValueError, match=r"q must have shape \(B, H, N, C\) \(4 dims\), got shape \(1, 1, 2, 4, 4\)"):
        polynomial_attention(five, five, five, c)
    with pytest.raises(ValueError, match="q, k and v must have the same shape"):
        polynomial_attention(q, k, v[..., :3], c)
    with pytest.raises(ValueError, match="q, k and v must have the same shape"):
        affine_attention(q, k, v[:, :, :3], 0.0, 1.0)


def test_key_padding_mask_of_the_wrong_kind_or_batch_is_named():
    """kills: _launch.py _check_inputs reading ``.dtype`` of a key padding mask that is not a tensor (an
    AttributeError instead of the TypeError), and checking only its last dimension (a ``(2, N)`` mask for a
    batch of 1 was accepted: the kernels read row 0 only)"""
    q, k, v = _qkv(B=1, N=5)
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor .*got list"):
        affine_attention(q, k, v, 0.0, 1.0, key_padding_mask=[[False] * 5])
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, N\) = \(1, 5\), got \(2, 5\)"):
        affine_attention(q, k, v, 0.0, 1.0, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool, device=DEVICE))


def test_scale_is_checked():
    """kills: attention.py polynomial_attention without ``check_scale`` (a NaN scale gives a NaN output, a
    string a TypeError from deep inside)"""
    q, k, v = _qkv(N=4)
    c = torch.tensor([0.0, 1.0], device=DEVICE)
    with pytest.raises(ValueError, match="scale must be finite, got nan"):
        polynomial_attention(q, k, v, c, scale=float("nan"))
    with pytest.raises(TypeError, match="scale must be a float or None, got str"):
        affine_attention(q, k, v, 0.0, 1.0, scale="0.5")


def test_integer_coefficients_are_numbers():
    """kills: attention.py affine_attention taking only ``float`` coefficients as numbers
    (``isinstance(c, (int, float))`` -> ``isinstance(c, float)``): ``affine_attention(q, k, v, 1, -1)``, the
    Laplacian head, was a TypeError"""
    q, k, v = _qkv(B=1, H=2, N=7, C=4, seed=1)
    with torch.no_grad():
        out = affine_attention(q, k, v, 1, -1)
    want = _heads(_softmax(q, k), v, [[1.0, -1.0], [1.0, -1.0]])
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_dropout_scales_checks_its_arguments():
    """kills: attention.py dropout_scales accepting ``True`` as a size (``isinstance(n, bool) or`` dropped),
    without ``check_dropout`` (``dropout_p = 1`` silently drew at the capped rate ``1 - 2^-16``), and without
    ``_check_seed`` (a ``(2,)`` or int32 seed was read as if it were one int64)"""
    with pytest.raises(ValueError, match="batch_size must be a positive int, got True"):
        dropout_scales(_seed(1), True, 1, 4, 1, 0.1)
    with pytest.raises(ValueError, match=r"dropout_p must lie in \[0, 1\), got 1.0"):
        dropout_scales(_seed(1), 1, 1, 4, 1, 1.0)
    with pytest.raises(ValueError, match=r"seed must be a \(1,\) int64 tensor, got a torch.int64 tensor of shape \(2,\)"):
        dropout_scales(torch.tensor([1, 2], device=DEVICE), 1, 1, 4, 1, 0.1)
    with pytest.raises(ValueError, match=r"seed must be a \(1,\) int64 tensor, got a torch.int32"):
        dropout_scales(torch.tensor([1], dtype=torch.int32, device=DEVICE), 1, 1, 4, 1, 0.1)


# ---------------------------------------------------------------------------- _launch.py: backward saved tensors
def test_gradient_of_one_input_alone():
    """kills: _launch.py _PolynomialAttention.forward deciding whether to save its powers from
    ``needs_input_grad[1:4]`` (``q`` left out): a call where only ``q`` requires grad saved nothing and its
    backward failed, and _PolynomialAttention.backward rebuilding its launch with the default scale
    ``1 / sqrt(C)`` instead of the call's (``ctx.scale`` dropped: every gradient is wrong for ``scale != None``);
    each gradient alone against torch autograd on the float64 reference"""
    q, k, v = _qkv(B=1, H=2, N=9, C=4, seed=2)
    c = torch.tensor([[0.3, 0.5, -0.2], [1.0, -0.7, 0.25]], device=DEVICE)
    keep = torch.ones(9, 9, dtype=torch.bool, device=DEVICE).tril()
    w = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    for i in range(3):
        ins = [q.clone(), k.clone(), v.clone()]
        ins[i].requires_grad_()
        out = polynomial_attention(*ins, c, is_causal=True, scale=0.3)
        (got,) = torch.autograd.grad((out * w).sum(), ins[i])
        ref_in = [t.detach().double().requires_grad_(j == i) for j, t in enumerate(ins)]
        ref = _heads(_softmax(ref_in[0], ref_in[1], keep, scale=0.3), ref_in[2], c.tolist())
        (want,) = torch.autograd.grad((ref * w.double()).sum(), ref_in[i])
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------- backend.py: when the kernels apply
def test_kernels_run_on_cuda_only_with_triton(monkeypatch):
    """kills: backend.py _runs_here without its ``HAS_TRITON`` check (without triton a CPU tensor under a
    stale interpreted module counted as runnable) and without ``device.type == "cuda"`` returning True
    (CUDA tensors would be refused); and triton_unsupported without its ``is_available()`` check (the
    reason names the missing package)"""
    from diffusionformer.ops import triton as triton_pkg
    from diffusionformer.ops.triton import _kernels

    assert triton_backend._runs_here(torch.device("cuda")) is True
    q = torch.zeros(1, 1, 2, 4, device=DEVICE)
    monkeypatch.setattr(_kernels, "HAS_TRITON", False)
    assert triton_backend._runs_here(torch.device(DEVICE)) is False
    assert triton_backend._runs_here(torch.device("cuda")) is False
    monkeypatch.setattr(_kernels, "HAS_TRITON", True)
    monkeypatch.setattr(triton_pkg, "is_available", lambda: False)
    reason = triton_backend.triton_unsupported(q, q, q, None, False)
    assert reason is not None and reason.startswith("running without the 'triton' package")


def test_per_head_bool_key_mask_is_not_a_padding_mask():
    """kills: backend.py split_mask sending a bool ``(B, H, 1, N)`` mask down the key-padding path
    (``attn_mask.shape[1] == 1 and`` dropped): the padding path keeps head 0's keys for every head"""
    q, k, v = _qkv(B=2, H=2, N=8, C=4, seed=4)
    keep = torch.ones(2, 2, 1, 8, dtype=torch.bool, device=DEVICE)
    keep[:, 0, :, 5:] = False  # head 0: the last 3 keys are masked
    keep[:, 1, :, :2] = False  # head 1: the first 2
    keep[1, 1, :, 7] = False
    assert triton_backend.split_mask(keep, 2)[0] is None
    rows = [[0.0, 1.0, 0.5], [1.0, -1.0, 0.0]]
    out = diffuse(q, k, v, rows, attn_mask=keep, degrees=(2, 1), backend="triton")
    want = _heads(_softmax(q, k, keep), v, [[0.0, 1.0, 0.5], [1.0, -1.0]])
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_engine_loop_forwards_padding_scale_and_dropout():
    """kills: backend.py TritonBackend._kw dropping the key padding mask (``key_padding_mask=None``), the
    scale (``scale=None``: the default ``1 / sqrt(C)``) and the dropout rate (``dropout_p=0.0``), so that
    ``propagate`` and ``affine`` of the generic engine loop ignored them"""
    B, H, N, C = 2, 2, 10, 4
    q, k, v = _qkv(B=B, H=H, N=N, C=C, seed=5)
    pad = torch.zeros(B, N, dtype=torch.bool, device=DEVICE)
    pad[0, 7:] = True
    pad[1, :2] = True
    be = triton_backend.TritonBackend(q, k, True, pad, 0.3)
    keep = (~pad)[:, None, None, :] & torch.ones(N, N, dtype=torch.bool, device=DEVICE).tril()
    P = _softmax(q, k, keep, scale=0.3)
    got = be.propagate(v[:, 1:2], (1,))
    torch.testing.assert_close(got.double(), P[:, 1:2] @ v[:, 1:2].double(), atol=1e-5, rtol=1e-5)
    aff = be.affine(v, (0.5, 1.0), (-1.0, 0.25))
    torch.testing.assert_close(aff.double(), _heads(P, v, [[0.5, -1.0], [1.0, 0.25]]), atol=1e-5, rtol=1e-5)
    # half the entries of P dropped, the kept ones doubled: far from P v (each power draws a fresh mask)
    dropped = triton_backend.TritonBackend(q, k, False, None, 0.5, dropout_p=0.5)
    torch.manual_seed(0)
    out = dropped.propagate(v, (0, 1))
    plain = _softmax(q, k, scale=0.5) @ v.double()
    assert (out.double() - plain).abs().max().item() > 0.1


# ---------------------------------------------------------------------------- dense.py: "auto" and "triton"
def test_auto_rule_bounds_and_plain_attention(monkeypatch):
    """kills: dense.py _try_triton keeping head size 128 off the kernels under ``"auto"``
    (``> TRITON_AUTO_MAX_HEAD_DIM`` -> ``>=``; 128 is the documented largest size ``"auto"`` takes), applying
    that bound to ``backend="triton"`` as well (``backend == "auto" and`` dropped: an explicit request silently
    fell back), and _plain_attention calling a layer all attention when one head is (``all(c == 1.0 ..)`` ->
    ``any``: a head ``(0, 2)`` is not attention, so the stock SDPA kernel does not apply)"""
    from diffusionformer.ops import dense

    calls = []
    real = triton_backend.TritonBackend.diffuse
    monkeypatch.setattr(triton_backend.TritonBackend, "diffuse", lambda self, *a: calls.append(1) or real(self, *a))
    args = (None, False, 0.25, "auto")
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 2, 128, generator=g).to(DEVICE) for _ in range(3))
    rows = ((0.0, 1.0), (1.0, -1.0))
    out = dense._try_triton(q, k, v, rows, *args, (1, 1), 0.0, False)
    assert out is not None and calls == [1]
    torch.testing.assert_close(out.double(), _heads(_softmax(q, k, scale=0.25), v, rows), atol=1e-5, rtol=1e-5)
    q, k, v = (torch.randn(1, 1, 2, 136, generator=g).to(DEVICE) for _ in range(3))
    assert dense._try_triton(q, k, v, ((1.0, -1.0),), *args, (1,), 0.0, False) is None
    out = dense._try_triton(q, k, v, ((1.0, -1.0),), None, False, 0.25, "triton", (1,), 0.0, False)
    assert out is not None and calls == [1, 1]
    torch.testing.assert_close(out.double(), _heads(_softmax(q, k, scale=0.25), v, [[1.0, -1.0]]), atol=1e-5,
                               rtol=1e-5)
    q, k, v = _qkv(B=1, H=2, N=6, C=4, seed=7)
    rows = ((0.0, 1.0), (0.0, 2.0))
    out = dense._try_triton(q, k, v, rows, *args, (1, 1), 0.0, False)
    assert out is not None and calls == [1, 1, 1]
    torch.testing.assert_close(out.double(), _heads(_softmax(q, k, scale=0.25), v, rows), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU rule")
def test_auto_never_takes_the_interpreter_even_when_triton_is_in_auto(monkeypatch):
    """kills: dense.py _diffuse_checked taking ``"auto"`` onto the kernels for any device once
    ``TRITON_IN_AUTO`` is set (``and q.device.type == "cuda"`` dropped): CPU tensors would run in the Triton
    interpreter, a test tool that is orders of magnitude slower than the PyTorch back-ends"""
    from diffusionformer.ops import dense

    def boom(self, *a):
        raise AssertionError("auto took the Triton back-end on CPU")

    monkeypatch.setattr(dense, "TRITON_IN_AUTO", True)
    monkeypatch.setattr(triton_backend.TritonBackend, "diffuse", boom)
    q, k, v = _qkv(B=1, H=2, N=6, C=4, seed=8)
    out = diffuse(q, k, v, [1.0, -1.0])
    torch.testing.assert_close(out.double(), _heads(_softmax(q, k), v, [[1.0, -1.0]] * 2), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------- equivalent mutants
# 98 mutants were applied (40 in _launch.py, 14 in attention.py, 24 in backend.py, 8 in dense.py's dispatch rule,
# 2 in _library.py's seed handling, 10 masking/bounds lines of _kernels.py): 54 were killed by the suite before this
# file, 24 by this file. The other 20 are equivalent: no input tells them from the code.
# - _launch.py _block_sizes ``isinstance(b, bool) or`` dropped: ``True``/``False`` are ints 1/0 < 16, so ``b < 16``
#   raises the same ValueError with the same message.
# - _launch.py cuda_geometry without ``entries["num_stages"] = BLOCKS.get("num_stages", 2)``: a missing entry
#   reads as ``None`` and ``stages or 2`` gives the same 2; a present entry is read and checked the same.
# - _launch.py _Launch ``seed if dropout_p > 0.0`` -> ``seed if seed is not None``: without dropout the kernels
#   never load the seed (``_seed`` returns 0 unless ``DROPOUT``), so any pointer does.
# - _launch.py _forward ``STORE_Y=save or j < K`` -> ``j <= K``: without ``save`` the last power is written into
#   the slot of ``y_{K-2}``, which no later launch reads, and ``ys`` is discarded.
# - _launch.py _backward ``dcoeffs.to(coeffs.dtype)`` -> ``dcoeffs``: the launches always get float32
#   coefficients (``polynomial_attention`` calls ``.float()``; the back-end builds float32 tensors).
# - attention.py polynomial_attention ``attn_mask.to(q.device)`` dropped: with one device (CPU here) the mask is
#   already there; a mask on another device than ``q`` needs a machine with a GPU to tell apart.
# - attention.py polynomial_attention and backend.py TritonBackend._run without ``.contiguous()`` of the
#   coefficients: the launches pass ``coeffs.stride(0)`` and a column view ``coeffs[:, j]``, so the kernels read
#   any row stride correctly (forward and backward).
# - attention.py affine_attention ``c.to(device, dtype=torch.float32)`` -> ``c.to(device)``: ``torch.stack``
#   promotes mixed dtypes and ``check_coefficients`` then casts to float32, with the same values.
# - backend.py _to_degrees ``d >= width - 1`` -> ``d > width - 1``: multiplying by an all-ones degree mask gives
#   the same values and gradients (only the no-copy shortcut is lost).
# - backend.py diffuse ``K = max(degrees[h] for h in high)`` -> ``max(degrees)``: the affine heads have degree
#   <= 1 < 2 <= every K-step head's, so the maximum is the same.
# - backend.py key_padding_from_mask with ``.contiguous()`` added: TritonBackend makes the mask contiguous anyway.
# - _library.py polynomial without ``elif dropout_p == 0.0: seed = None``: see the seed mutant of _Launch above.
# - _kernels.py _keep ``pad == 0`` -> ``pad != 1``: the padding bytes come from a bool mask (0 or 1 only).
# - _kernels.py _keep padding load ``other=1`` -> ``other=0``, and without ``offs_q < N``; _bias without
#   ``offs_k < N`` in the load mask; the bool mask load ``other=0`` -> ``other=1``: every such entry is already
#   excluded by ``offs_k < N`` (or ``keep``), and query rows past ``N`` are never stored and get a ``+inf``
#   log-sum-exp in the backward kernels (their ``P`` is 0).
# - _kernels.py _first_step log-sum-exp of a row without keys ``+inf`` -> ``0``: every later use recomputes ``P``
#   of that row under ``keep``, which is all False there, so its ``P`` stays 0.
# - _kernels.py _query_ranges causal ``lo`` -> 0: the extra query blocks lie above the diagonal and are fully
#   masked (only work is added).
