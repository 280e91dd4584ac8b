"""Tests written in a mutation-testing audit of the Triton back-end (``diffusionformer/ops/triton``).

Each test kills a mutant of ``backend.py``, ``_launch.py``, ``attention.py``, ``_library.py`` or the
Python-level logic of ``_kernels.py`` that the rest of the suite let through (the docstring of each test
names it): the dispatch of a layer's heads onto the affine and polynomial launches, the key-padding path
of a bool mask, the launch geometry and flags, the argument checks, the float32 accumulator of the
forward pass, the coefficient-only backward pass and the dropout counters. References are independent:
explicit float64 softmax matrices built by hand, hand-computed values and the documented contract (a
bad argument gets a ``TypeError``/``ValueError`` naming it). On CPU the kernels run under the Triton
interpreter (``conftest.py``), so sizes are tiny (``N <= 32``, ``C <= 16``); deterministic (seeded
generators).
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


def _P(q: Tensor, k: Tensor, *, keep: Tensor | None = None, bias: Tensor | None = None, scale: float | None = None
       ) -> Tensor:
    """Explicit float64 softmax matrix ``(B, H, N, N)``, a zero row where no key is admissible.

    ``keep``: bool (True = attend), ``bias``: float added to the scores (``-inf`` = do not attend),
    both broadcast to ``(B, H, N, N)``.
    """
    q, k = q.double(), k.double()
    s = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    ok = torch.ones_like(s, dtype=torch.bool)
    if keep is not None:
        ok = ok & keep
    if bias is not None:
        s = s + bias.double()
        ok = ok & (bias > float("-inf"))
    s = s.masked_fill(~ok, float("-inf"))
    m = s.amax(-1, keepdim=True).clamp_min(-1e300).nan_to_num(0.0)
    e = torch.exp(s - m) * ok
    return e / e.sum(-1, keepdim=True).clamp_min(1e-300)


def _poly(P: Tensor, v: Tensor, rows, degrees) -> Tensor:
    """``sum_{j <= d_h} c_{h,j} P_h^j v_h`` in float64, head by head, from Python rows."""
    v = v.double()
    outs = []
    for h, d in enumerate(degrees):
        y, o = v[:, h], rows[h][0] * v[:, h]
        for j in range(1, d + 1):
            y = P[:, h] @ y
            o = o + rows[h][j] * y
        outs.append(o)
    return torch.stack(outs, 1)


def _qkv(B=2, H=2, N=11, C=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, C, generator=g).to(device=DEVICE, dtype=dtype) for _ in range(3)]


# ---------------------------------------------------------------------------- backend.py: dispatch
def test_tensors_the_kernels_cannot_run_on_are_named():
    """kills: backend.py _runs_here accepting any non-CUDA device (``device.type == "cpu" and`` dropped), and
    triton_unsupported skipping the ``_runs_here`` check: a meta tensor would be sent to the kernels"""
    q = torch.empty(1, 2, 4, 8, device="meta")
    assert triton_backend._runs_here(torch.device("meta")) is False
    assert triton_backend._runs_here(torch.device(DEVICE)) is True
    reason = triton_backend.triton_unsupported(q, q, q, None, False)
    assert reason is not None and reason.startswith("meta tensors")


def test_more_sequence_heads_than_a_cuda_grid_axis_holds_are_named_and_fall_back():
    """Bug: every launch puts ``B * H`` on the grid's second axis, which CUDA caps at 65535, so
    ``B * H = 65536`` failed to launch on a GPU; it is now named as unsupported (``"auto"`` falls back,
    ``backend="triton"`` raises). Expanded views: nothing of that size is allocated."""
    q = torch.zeros(1, 1, 4, 8, device=DEVICE)
    at_cap = q.expand(65535, 1, 4, 8)
    over = q.expand(32768, 2, 4, 8)
    assert triton_backend.triton_unsupported(at_cap, at_cap, at_cap, None, False) is None
    reason = triton_backend.triton_unsupported(over, over, over, None, False)
    assert reason is not None and reason.startswith("B * H = 65536")
    with pytest.raises(ValueError, match="65535"):
        diffuse(over, over, over, [1.0, -1.0], backend="triton")


def test_float_key_only_mask_takes_the_general_path():
    """kills: backend.py split_mask sending a float ``(B, 1, 1, N)`` mask down the key-padding path (the bool
    dtype test dropped): a float key mask is a bias added to the scores, not a padding mask"""
    q, k, v = _qkv(B=2, H=2, N=9, C=4, seed=1)
    bias = torch.randn(2, 1, 1, 9, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    bias[1, 0, 0, :3] = float("-inf")
    rows = [[0.0, 1.0], [1.0, -1.0]]
    out = diffuse(q, k, v, rows, attn_mask=bias, backend="triton")
    want = _poly(_P(q, k, bias=bias), v, rows, (1, 1))
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_key_mask_shared_by_the_batch_pads_every_sequence():
    """kills: backend.py key_padding_from_mask without ``.expand(batch_size, N)``: a ``(1, 1, 1, N)`` bool key
    mask gives a ``(1, N)`` padding mask, and the kernels read row ``b N`` of it for batch ``b > 0``"""
    q, k, v = _qkv(B=3, H=2, N=10, C=4, seed=3)
    keep = torch.tensor([True] * 7 + [False] * 3, device=DEVICE).view(1, 1, 1, 10)
    rows = [[0.0, 1.0, 0.5], [1.0, -1.0, 0.0]]
    out = diffuse(q, k, v, rows, attn_mask=keep, degrees=(2, 1), backend="triton")
    want = _poly(_P(q, k, keep=keep), v, rows, (2, 1))
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    assert triton_backend.split_mask(keep, 3)[0].shape == (3, 10)


def test_auto_rule_takes_triton_for_a_float_mask_and_falls_back_for_a_learned_one():
    """kills: backend.py triton_unsupported naming every float ``attn_mask`` unsupported (the rule before float
    masks reached the kernels, which the CUDA-only ``test_auto_on_cuda_takes_triton_only_when_enabled`` still
    asserted), and dropping its check of a float mask that requires grad (``"auto"`` would then silently
    give the mask no gradient): the ``"auto"`` rule run on the interpreter, as ``_try_triton`` sees it on CUDA"""
    from diffusionformer.ops.dense import _try_triton

    q, k, v = _qkv(B=1, H=2, N=8, C=4, seed=16)
    bias = torch.randn(8, 8, generator=torch.Generator().manual_seed(17)).to(DEVICE)
    rows = ((0.0, 1.0), (1.0, -1.0))
    out = _try_triton(q, k, v, rows, bias, True, 0.5, "auto", (1, 1), 0.0, False)
    assert out is not None
    causal = torch.ones(8, 8, dtype=torch.bool, device=DEVICE).tril()
    want = _poly(_P(q, k, keep=causal, bias=bias, scale=0.5), v, rows, (1, 1))
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    assert _try_triton(q, k, v, rows, bias.clone().requires_grad_(), True, 0.5, "auto", (1, 1), 0.0, False) is None


def test_a_layer_takes_one_affine_call_and_one_polynomial_call_of_the_needed_degree(monkeypatch):
    """kills: backend.py _split putting degree-1 heads in the K-step group (``d <= 1`` -> ``d < 1``), diffuse
    handing the affine group all the columns (``[:, :2]`` dropped) and the K-step group all ``K + 1`` columns
    instead of its largest degree (``[:, : K + 1]`` dropped): the same values, but extra launches per power"""
    from diffusionformer.ops.triton import _library

    calls = []
    real = _library.polynomial

    def spy(q, k, v, coeffs, *args):
        calls.append((q.shape[1], tuple(coeffs.shape)))
        return real(q, k, v, coeffs, *args)

    monkeypatch.setattr(_library, "polynomial", spy)
    q, k, v = _qkv(B=1, H=5, N=9, C=4, seed=4)
    rows = [[0.0, 1.0, 0.0, 0.0, 0.0], [0.2, 0.3, 0.5, 0.0, 0.0], [1.0, -1.0, 0.0, 0.0, 0.0],
            [0.1, 0.2, 0.3, 0.4, 0.0], [2.0, 0.0, 0.0, 0.0, 0.0]]
    degrees = (1, 2, 1, 3, 0)  # K = 4 columns allowed, the K-step heads need powers up to 3 only
    be = triton_backend.TritonBackend(q, k, False, None, 4**-0.5)
    out = be.diffuse(v, tuple(map(tuple, rows)), degrees)
    # affine heads 0, 2, 4: one launch with (c0, c1); K-step heads 1, 3: powers up to 3, i.e. 4 columns
    assert calls == [(3, (3, 2)), (2, (2, 4))]
    torch.testing.assert_close(out.double(), _poly(_P(q, k), v, rows, degrees), atol=1e-5, rtol=1e-5)


def test_zero_degree_layer_keeps_the_value_dtype():
    """kills: backend.py TritonBackend.diffuse returning ``c0 v`` in float32 for half-precision values when
    ``K = 0`` (``.to(v.dtype)`` dropped) and attention.py polynomial_attention doing the same"""
    q, k, v = _qkv(B=1, H=2, N=5, C=4, seed=5, dtype=torch.float16)
    be = triton_backend.TritonBackend(q, k, False, None, 0.5)
    out = be.diffuse(v, ((2.0,), (-0.5,)), (0, 0))
    assert out.dtype == torch.float16
    want = v.double() * torch.tensor([2.0, -0.5], dtype=torch.float64, device=DEVICE).view(1, 2, 1, 1)
    torch.testing.assert_close(out.double(), want, atol=1e-3, rtol=1e-3)
    got = polynomial_attention(q, k, v, torch.tensor([[2.0], [-0.5]], device=DEVICE))
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.double(), want, atol=1e-3, rtol=1e-3)


def test_engine_loop_on_the_backend_applies_per_head_and_shared_masks():
    """kills: backend.py TritonBackend._kw dropping ``attn_mask`` (propagate and affine of the generic engine
    ignore the mask), and _mask selecting heads of a mask shared by all heads (``m.shape[1] == 1`` dropped)"""
    B, H, N, C = 1, 3, 12, 4
    q, k, v = _qkv(B=B, H=H, N=N, C=C, seed=6)
    g = torch.Generator().manual_seed(7)
    per_head = torch.rand(B, H, N, N, generator=g).to(DEVICE) < 0.6
    per_head[..., torch.arange(N), torch.arange(N)] = True
    shared = torch.randn(1, 1, N, N, generator=g).to(DEVICE)
    for mask, kw in ((per_head, dict(keep=per_head)), (shared, dict(bias=shared))):
        be = triton_backend.TritonBackend(q, k, False, None, C**-0.5, attn_mask=mask)
        P = _P(q, k, **kw)
        got = be.propagate(v[:, 1:3], (1, 2))
        torch.testing.assert_close(got.double(), P[:, 1:3] @ v[:, 1:3].double(), atol=1e-5, rtol=1e-5)
        aff = be.affine(v, (0.0, 1.0, 0.5), (1.0, -1.0, 0.25))
        want = _poly(P, v, [[0.0, 1.0], [1.0, -1.0], [0.5, 0.25]], (1, 1, 1))
        torch.testing.assert_close(aff.double(), want, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------- _launch.py: checks and geometry
def test_mixed_dtypes_and_devices_are_clear_errors():
    """kills: _launch.py _check_inputs without its one-dtype check and without its one-device check"""
    q, k, v = _qkv(B=1, H=1, N=4, C=4, seed=8)
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        affine_attention(q, k.half(), v, 0.0, 1.0)
    with pytest.raises(ValueError, match="q, k and v must be on one device"):
        affine_attention(q, torch.empty(k.shape, device="meta"), v, 0.0, 1.0)


def test_launch_geometry_and_flags():
    """kills: _launch.py _Launch with head blocks below 16 channels (``max(16, ..)`` -> ``max(8, ..)``), padding
    a power-of-two head size to twice its size (``(C - 1).bit_length()`` -> ``C.bit_length()``), TF32 dot
    products for float32 (``IEEE`` always False), the dropout specialisation without dropout
    (``dropout_p > 0`` -> ``>= 0``), no bf16 upcast under the interpreter, no error for dropout without a seed,
    and a grid of ``N // block + 1`` programs (an idle extra program whenever ``block`` divides ``N``)"""
    from diffusionformer.ops.triton import _launch

    kernels = _launch._kernels_module()
    for C, block_c in ((1, 16), (4, 16), (12, 16), (16, 16), (17, 32), (64, 64), (65, 128)):
        assert _launch._Launch(kernels, torch.zeros(1, 1, 2, C, device=DEVICE), False, None, 1.0).block_c == block_c, C
    x = torch.zeros(1, 1, 2, 4, device=DEVICE)
    flags = _launch._Launch(kernels, x, False, None, 1.0).flags
    assert flags["IEEE"] is True and flags["DROPOUT"] is False and flags["MASK_KIND"] == 0
    assert _launch._Launch(kernels, x.half(), False, None, 1.0).flags["IEEE"] is False
    bf16 = _launch._Launch(kernels, x.bfloat16(), False, None, 1.0).flags
    assert bf16["UPCAST"] is (DEVICE == "cpu") and bf16["IEEE"] is False
    seed = torch.tensor([1], dtype=torch.int64, device=DEVICE)
    assert _launch._Launch(kernels, x, False, None, 1.0, 0.25, seed).flags["DROPOUT"] is True
    with pytest.raises(ValueError, match="dropout_p > 0 needs the call's seed"):
        _launch._Launch(kernels, x, False, None, 1.0, 0.25, None)
    for N, block, programs in ((32, 16, 2), (33, 16, 3), (32, 32, 1), (5, 64, 1)):
        L = _launch._Launch(kernels, torch.zeros(2, 3, N, 4, device=DEVICE), False, None, 1.0)
        assert L.grid(block) == (programs, 6), (N, block)


def test_half_precision_powers_accumulate_in_float32():
    """kills: _launch.py _forward accumulating ``sum_k c_k P^k v`` in the output dtype for ``K >= 2``
    (``acc = out if K == 1`` -> ``K >= 1``): the partial sum ``c0 v`` is then rounded to float16.

    With ``q = 0`` every score is 0 and ``P`` is exactly ``1/8`` everywhere (N = 8), and ``v`` is constant,
    so ``P v = P^2 v = v``: ``1000 v - 1000 P^2 v = 0`` exactly in float32, but ``1000 v = 1000.9765625``
    rounds to 1001 in float16."""
    B, H, N, C = 1, 1, 8, 4
    q = torch.zeros(B, H, N, C, device=DEVICE, dtype=torch.float16)
    v = torch.full((B, H, N, C), 1.0 + 2.0**-10, device=DEVICE, dtype=torch.float16)
    coeffs = torch.tensor([[1000.0, 0.0, -1000.0]], device=DEVICE)
    with torch.no_grad():
        out = polynomial_attention(q, q, v, coeffs)
    assert out.dtype == torch.float16
    assert out.abs().max().item() < 1e-3


def test_gradient_of_the_coefficients_alone():
    """kills: _launch.py _PolynomialAttention.forward saving its powers only when ``q``, ``k`` or ``v`` need a
    gradient (``needs_input_grad[:4]`` -> ``[:3]``): learned coefficients on frozen inputs need them too"""
    q, k, v = _qkv(B=1, H=2, N=13, C=8, seed=9)
    c = torch.tensor([[0.3, 0.5, -0.2], [1.0, -0.7, 0.25]], device=DEVICE, requires_grad=True)
    out = polynomial_attention(q, k, v, c, is_causal=True)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(10)).to(DEVICE)
    (dc,) = torch.autograd.grad((out * w).sum(), c)
    P = _P(q, k, keep=torch.ones(13, 13, dtype=torch.bool, device=DEVICE).tril())
    y1 = P @ v.double()
    powers = [v.double(), y1, P @ y1]  # dc[h, j] = <w_h, (P^j v)_h>
    want = torch.stack([(w.double() * y).sum(dim=(0, 2, 3)) for y in powers], 1)
    torch.testing.assert_close(dc.double(), want, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------- attention.py: arguments
def test_argument_errors_name_the_argument():
    """kills: attention.py without the bool check of ``is_causal``, accepting ``True`` as a coefficient
    (``not isinstance(c, bool)`` dropped), without the floating-point check of ``c0``/``c1``, without the
    device and shape checks of ``seed``, and dropout_scales accepting ``seed=None``"""
    q, k, v = _qkv(B=1, H=2, N=4, C=4, seed=11)
    c = torch.tensor([[0.0, 1.0], [1.0, -1.0]], device=DEVICE)
    with pytest.raises(TypeError, match="is_causal must be a bool, got int"):
        polynomial_attention(q, k, v, c, is_causal=1)
    with pytest.raises(TypeError, match="c0 must be a float or a tensor"):
        affine_attention(q, k, v, True, 1.0)
    with pytest.raises(TypeError, match="c1 must be floating point, got torch.int64"):
        affine_attention(q, k, v, 0.0, torch.tensor([1, 1], device=DEVICE))
    with pytest.raises(ValueError, match=r"seed must be a \(1,\) int64 tensor, got a torch.int64 tensor of shape \(2,\)"):
        polynomial_attention(q, k, v, c, dropout_p=0.1, seed=torch.tensor([1, 2], device=DEVICE))
    with pytest.raises(ValueError, match="seed must be on the device of q"):
        polynomial_attention(q, k, v, c, dropout_p=0.1, seed=torch.tensor([1], device="meta"))
    with pytest.raises(ValueError, match=r"seed must be a \(1,\) int64 tensor, got None"):
        dropout_scales(None, 1, 1, 4, 1, 0.1)


def test_zero_dim_coefficients_are_shared_by_the_heads():
    """kills: attention.py affine_attention without the expansion of a 0-dim ``c0``/``c1`` tensor to ``(H,)``"""
    q, k, v = _qkv(B=1, H=2, N=6, C=4, seed=12)
    with torch.no_grad():
        out = affine_attention(q, k, v, torch.tensor(0.5, device=DEVICE), torch.tensor(-1.0, device=DEVICE))
    want = _poly(_P(q, k), v, [[0.5, -1.0]] * 2, (1, 1))
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_strided_key_padding_mask():
    """kills: attention.py polynomial_attention and backend.py TritonBackend handing the kernels a
    non-contiguous key padding mask (``.contiguous()`` dropped): they read it as a ``(B, N)`` row-major
    byte array"""
    q, k, v = _qkv(B=2, H=1, N=9, C=4, seed=13)
    pad_t = torch.zeros(9, 2, dtype=torch.bool, device=DEVICE)
    pad_t[6:, 0] = True
    pad_t[:2, 1] = True
    pad = pad_t.t()  # (B, N), column-major
    assert not pad.is_contiguous()
    with torch.no_grad():
        out = polynomial_attention(q, k, v, torch.tensor([0.5, 0.3, 0.2], device=DEVICE), key_padding_mask=pad)
    want = _poly(_P(q, k, keep=~pad[:, None, None, :]), v, [[0.5, 0.3, 0.2]], (2,))
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    be = triton_backend.TritonBackend(q, k, False, pad, 4**-0.5)
    torch.testing.assert_close(be.diffuse(v, ((0.5, 0.3, 0.2),), (2,)).double(), want, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------- _library.py and dropout seeds
def test_no_dropout_draws_no_seed():
    """kills: _library.py polynomial drawing a fresh seed from PyTorch's generator when ``dropout_p = 0``
    (``dropout_p > 0.0 and`` dropped): a call without dropout must leave the global random stream as it was"""
    q, k, v = _qkv(B=1, H=1, N=6, C=4, seed=14)
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    with torch.no_grad():
        polynomial_attention(q, k, v, torch.tensor([0.0, 1.0, 0.5], device=DEVICE))
    torch.testing.assert_close(torch.rand(3), want, rtol=0, atol=0)


def test_dropout_draws_of_neighbouring_rows_are_independent_when_n_is_not_a_multiple_of_8():
    """kills: _kernels.py _dropout_scale keying row ``i`` by ``i * (N // 8)`` instead of ``i * ceil(N / 8)``:
    for N = 12 the last 4 keys of row ``i`` then reuse the Philox draw of the first 4 keys of row ``i + 1``"""
    N, p = 12, 0.5
    d = dropout_scales(torch.tensor([2024], dtype=torch.int64, device=DEVICE), 4, 4, N, 2, p) > 0
    a, b = d[..., :-1, 8:12], d[..., 1:, 0:4]  # row i keys 8..11 against row i + 1 keys 0..3
    agree = (a == b).float().mean().item()
    # independent draws agree on half of the 1,408 pairs (5 standard errors: 0.067); a shared draw on all
    assert abs(agree - 0.5) < 0.07, agree


def test_fake_implementation_matches_the_forward_operator():
    """kills: _library.py _fwd_fake giving the powers buffer ``K`` slots without ``save`` (``_slots`` returning
    ``K``; the launches keep the last two) and a contiguous ``(B, H, N, C)`` output instead of the
    ``(B, N, H, C)`` storage of the real operator: a compiled graph would plan wrong shapes and strides"""
    from diffusionformer.ops.triton import _library

    q, k, v = _qkv(B=1, H=2, N=6, C=4, seed=15)
    c = torch.tensor([[0.5, 0.3, 0.2, 0.1], [1.0, -1.0, 0.5, 0.0]], device=DEVICE)
    args = (q, k, v, c, None, False, 0.5, False, 0.0, None, None)
    torch.library.opcheck(_library._fwd, args, test_utils=("test_faketensor",))
    out, lse, ys = _library._fwd(*args)
    assert ys.shape == (2, 1, 2, 6, 4) and out.transpose(1, 2).is_contiguous() and lse.shape == (2, 1, 2, 6)


def test_dropout_rate_is_rounded_to_sixteen_bits_and_capped_below_one():
    """kills: _launch.py dropout_rate capping at ``65534 / 65536`` instead of ``1 - 2^-16``, rounding down
    instead of to the nearest multiple of ``2^-16``, or scaling kept entries by ``1 / (1 - dropout_p)``
    instead of ``1 / (1 - rate)`` (hand-computed values)"""
    from diffusionformer.ops.triton._launch import dropout_rate

    assert dropout_rate(0.0) == (0.0, 1.0)
    rate, scale = dropout_rate(0.1)  # 0.1 * 65536 = 6553.6 -> 6554
    assert rate == 6554 / 65536 and scale == 1.0 / (1.0 - 6554 / 65536)
    assert dropout_rate(1.0 - 2.0 ** -18) == (65535 / 65536, 65536.0)  # rounds to 65536: capped at 65535
