"""Tests written in a mutation audit of the Triton kernels (``diffusionformer/ops/triton/_kernels.py`` and the
launches of ``_launch.py``) that the rest of the suite let through.

Each ``Pin:`` test names the mutants it kills. References are independent of the kernels: explicit float64
softmax matrices built from ``q``, ``k``, the masks and (for dropout) the masks the kernels report through
:func:`~diffusionformer.ops.triton.dropout_scales`, differentiated by autograd in float64. Shapes are chosen to
cross the interpreter's blocks (``INTERPRETER_BLOCKS``: 32 x 16 forward, 16 x 32 backward): ``N`` not a multiple
of a block, several heads, causal with padding, rows with no admissible key. On CPU the kernels run under the
Triton interpreter (``conftest.py`` sets ``TRITON_INTERPRET=1`` and the ``triton_kernels`` fixture makes sure
the kernels are interpreted), so sizes are tiny; everything is seeded.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import Tensor

from diffusionformer.ops.triton import polynomial_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install 'triton>=3.6'; Linux wheels only)",
)

pytestmark = [requires_triton, pytest.mark.usefixtures("triton_kernels")]


def _qkv(B: int, H: int, N: int, C: int, seed: int = 0) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, C, generator=g).to(DEVICE).requires_grad_() for _ in range(3)]


def _reference(q, k, v, coeffs, *, keep: Tensor | None = None, bias: Tensor | None = None,
               drops: Tensor | None = None, scale: float | None = None) -> Tensor:
    """``sum_j c_{h,j} (P * D_j) ... (P * D_1) v`` in float64 with the explicit softmax matrix ``P``.

    ``keep``: bool ``(B|1, H|1, N, N)`` (True = attend; every other rule, causal or padding, goes in it);
    ``bias``: float added to the scores; ``drops[j - 1]``: the dropout scales of power ``j``. A row with no
    admissible key is a zero row of ``P``.
    """
    q, k, v, coeffs = (t.double() for t in (q, k, v, coeffs))
    H, C = q.shape[1], q.shape[-1]
    s = q @ k.transpose(-2, -1) * (C ** -0.5 if scale is None else scale)
    ok = torch.ones_like(s, dtype=torch.bool)
    if keep is not None:
        ok = ok & keep.to(DEVICE)
    if bias is not None:
        s = s + bias.to(DEVICE).double()
    s = s.masked_fill(~ok, float("-inf"))
    m = s.amax(-1, keepdim=True).detach().nan_to_num(0.0, neginf=0.0)
    e = torch.exp(s - m) * ok
    P = e / e.sum(-1, keepdim=True).clamp_min(1e-300)
    out, y = coeffs[:, 0].view(1, H, 1, 1) * v, v
    for j in range(1, coeffs.shape[1]):
        y = (P if drops is None else P * drops[j - 1].double()) @ y
        out = out + coeffs[:, j].view(1, H, 1, 1) * y
    return out


def _assert_matches(out: Tensor, ref: Tensor, inputs, atol: float = 1e-4) -> None:
    """Output and the gradients of every input match the float64 reference (and are finite)."""
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=atol)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out)
    got = torch.autograd.grad(out, inputs, g)
    want = torch.autograd.grad(ref, inputs, g.double())
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.isfinite(a).all(), f"gradient {i} is not finite"
        b = b.double()
        torch.testing.assert_close(a.double(), b, atol=atol * (1 + b.abs().max().item()), rtol=atol,
                                   msg=lambda msg, i=i: f"gradient {i}: {msg}")


def _causal(N: int) -> Tensor:
    return torch.ones(N, N, dtype=torch.bool).tril()


# exp2 of a score that the mask then drops (a huge bias on a key that is not admissible) overflows to inf
# before tl.where replaces it by 0; numpy, behind the interpreter, warns
@pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")
def test_float_mask_rows_far_below_zero_and_large_biases_keep_an_exact_softmax():
    """Pin: kills _kernels._bias without ``- shift`` (a row whose every key carries -1e9 lost its scores next to
    the bias: a uniform row instead of the softmax), ``+ shift``, _bias_max skipping its first key block or
    taking the maximum over keys that are not admissible (a huge bias on a padded or causally hidden key made
    every admissible key underflow: a zero row), and _row_shift reading zeros (later powers then used the
    first power's shifted log-sum-exp with unshifted scores)."""
    B, H, N, C = 2, 2, 37, 8
    q, k, v = _qkv(B, H, N, C, seed=1)
    coeffs = torch.tensor([[0.2, 0.7, 0.3], [0.5, -0.4, 0.6]], device=DEVICE, requires_grad=True)
    g = torch.Generator().manual_seed(2)
    bias = torch.randn(B, H, N, N, generator=g)
    bias[0, 0, 5:30] = -1e9  # rows whose every key carries a far negative bias (a graph given as a float mask)
    bias[1, 1, :, :] = -1e9
    bias[:, :, 20:, 2] = 300.0  # admissible for rows >= 20, in the first key block: exp2 overflows unless shifted
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[0, 33:] = True
    pad[1, 30] = True
    bias[:, :, :, 30] = 3e4  # padded in sequence 1 only
    bias[:, :, :10, 33] = 3e4  # above the diagonal for rows < 10 (causal), padded in sequence 0
    keep = _causal(N) & ~pad[:, None, None, :]
    out = polynomial_attention(q, k, v, coeffs, is_causal=True, key_padding_mask=pad.to(DEVICE), attn_mask=bias.to(DEVICE))
    ref = _reference(q, k, v, coeffs, keep=keep, bias=bias)
    _assert_matches(out, ref, (q, k, v, coeffs))


def test_head_dimension_that_is_not_a_power_of_two_above_sixteen():
    """Pin: kills _Launch.block_c = max(16, C) (a head block of 20 channels: tl.arange needs a power of two) and
    ``c_ok = offs_c <= C`` (a column past the head read into the scores)."""
    B, H, N, C = 1, 3, 19, 20
    q, k, v = _qkv(B, H, N, C, seed=3)
    coeffs = torch.tensor([[0.1, 0.9, 0.2], [1.0, -1.0, 0.0], [0.0, 0.5, 0.5]], device=DEVICE, requires_grad=True)
    out = polynomial_attention(q, k, v, coeffs)
    _assert_matches(out, _reference(q, k, v, coeffs), (q, k, v, coeffs))


def _philox4x32(seed: int, c0, c1, c2, c3, rounds: int = 10):
    """Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"), vectorised over numpy uint32
    counters, key ``(seed & 0xFFFFFFFF, seed >> 32)``: the generator behind ``tl.philox``, written out here."""
    import numpy as np

    M32 = np.uint64(0xFFFFFFFF)
    c = [np.asarray(x, dtype=np.uint64) & M32 for x in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)
    A, Bm = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(rounds):
        pa, pb = A * c[0], Bm * c[2]  # < 2**64: exact in uint64
        c = [(pb >> np.uint64(32)) ^ c[1] ^ k0, pb & M32, (pa >> np.uint64(32)) ^ c[3] ^ k1, pa & M32]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & M32, (k1 + np.uint64(0xBB67AE85)) & M32
    return c


def _documented_masks(seed: int, B: int, H: int, N: int, steps: int, threshold: int):
    """The dropout masks by the documented rule (module docstring of ops.triton.attention): entry ``(i, j)`` of
    power ``t`` of head ``bh`` is kept when 16-bit piece ``j % 8`` of the Philox draw with counter
    ``(i * ceil(N / 8) + j // 8, bh, t, 0)`` is ``>= threshold``; pieces are the low, then the high half of each
    32-bit word in order. Returns a bool ``(steps, B, H, N, N)``."""
    import numpy as np

    i, j = np.meshgrid(np.arange(N), np.arange(N), indexing="ij")
    ctr = i * ((N + 7) // 8) + j // 8
    keep = np.zeros((steps, B * H, N, N), dtype=bool)
    for t in range(1, steps + 1):
        for bh in range(B * H):
            words = _philox4x32(seed, ctr, np.full_like(ctr, bh), np.full_like(ctr, t), np.zeros_like(ctr))
            piece = (np.stack(words)[(j % 8) // 2, i, j] >> (16 * (j % 2)).astype(np.uint64)) & np.uint64(0xFFFF)
            keep[t - 1, bh] = piece >= threshold
    return torch.from_numpy(keep).view(steps, B, H, N, N), piece


def test_dropout_masks_follow_the_documented_philox_rule_at_the_threshold():
    """Bug: key ``8 g + l`` of a row did not take 16-bit piece ``l`` of its Philox draw, as _kernels._dropout_scale
    and docs/performance.md say (low half of word 0, high half of word 0, low half of word 1, ...): tl.join stacks
    along a new last axis, so nesting the pieces in their own order gave key 1 piece 4, key 4 piece 1, key 3 piece 6,
    ... (the masks were consistent between the kernels, but not the documented ones).

    Pin: also kills the draw's ``>= thr`` turned into ``> thr`` (an entry whose 16 bits equal the threshold is
    then dropped: the rate is no longer p rounded to 16 bits), row counters with ``N // 8`` key groups, the head
    or the step left out of the counter, _dropout_scales off by one step, and _launch.dropout_rate truncating
    the rate instead of rounding it. The reference is an independent Philox4x32-10 with the documented
    counters; the rate puts one entry's piece exactly at the threshold.
    """
    from diffusionformer.ops.triton import dropout_scales

    seed, B, H, N, steps = 2**33 + 977, 1, 2, 13, 2
    _, piece = _documented_masks(seed, 1, 1, N, 1, 0)
    edge = int(piece[3, 8])  # the last (t = 1, bh = 0) plane: entry (3, 8), piece 0 of its draw, sits at the threshold
    p = (edge - 0.3) / 65536.0  # rounds to edge / 65536 (truncating gives edge - 1)
    keep, _ = _documented_masks(seed, B, H, N, steps, edge)
    assert keep[0, 0, 0, 3, 8]
    got = dropout_scales(torch.tensor([seed], dtype=torch.int64, device=DEVICE), B, H, N, steps, p).cpu()
    inv_keep = torch.tensor(1.0 / (1.0 - edge / 65536.0), dtype=torch.float32)
    torch.testing.assert_close(got, torch.where(keep, inv_keep, torch.zeros(())), atol=0, rtol=0)


def _reserve(numel: int, dtype: torch.dtype) -> Tensor:
    """A tensor of ``numel`` elements, allocated but not written (on CPU the pages a test never touches are never
    committed), or a skip where the machine refuses to reserve the address space."""
    try:
        return torch.empty(numel, dtype=dtype, device=DEVICE)
    except (RuntimeError, MemoryError) as e:
        pytest.skip(f"cannot reserve {numel * torch.empty((), dtype=dtype).element_size() / 2**30:.1f} GiB: {e}")


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("layout", ["query-major", "key-major"])
def test_tensors_whose_offsets_within_a_head_pass_two_to_the_31(kind, layout):
    """Bug: the kernels multiplied int32 row (and column) indices by int32 strides, so an offset within one
    head past 2**31 elements wrapped to a negative one and the kernels read outside the tensors (a segfault
    under the interpreter, an illegal address or silently wrong rows on a GPU). Only the batch and head offsets
    and the mask rows were int64; a (B, N, H, C) layout (the kernels' own output, dq, dk and dv; a packed qkv
    projection) has row stride H C, which passes 2**31 from N H C >= 2**31 on (a long context of a wide model),
    and a key-major (transposed) attn_mask has key stride N, from N = 46,341 on. Here q, k, v and the output
    gradient have rows 2**27 elements apart, and the mask's rows (query-major; pins the int64 row offsets that
    were there) or keys (key-major) 2**27 entries apart, so row / key 16 sits at 2**31."""
    N, C = 17, 8
    rows = _reserve((N - 1) * 2**27 + 4 * C, torch.float16).as_strided((N, 4 * C), (2**27, 1))
    g = torch.Generator().manual_seed(5)
    rows.copy_(torch.randn(N, 4 * C, generator=g).to(DEVICE, torch.float16))
    q, k, v, grad = (rows[:, i * C:(i + 1) * C].view(1, 1, N, C) for i in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    dense = torch.rand(N, N, generator=g) < 0.7
    dense[:, 0] = True
    bias = torch.randn(N, N, generator=g).masked_fill(~dense, float("-inf"))
    value = dense if kind == "bool" else bias.half()
    far = (2**27, 1) if layout == "query-major" else (1, 2**27)
    mask = _reserve((N - 1) * 2**27 + N, value.dtype).as_strided((1, 1, N, N), (0, 0, *far))
    mask.copy_(value.view(1, 1, N, N).to(DEVICE))
    coeffs = torch.tensor([[0.5, 1.0, -0.5]], device=DEVICE, requires_grad=True)
    out = polynomial_attention(q, k, v, coeffs, is_causal=True, attn_mask=mask)
    if kind == "bool":
        ref = _reference(q, k, v, coeffs, keep=_causal(N) & dense)
    else:
        ref = _reference(q, k, v, coeffs, keep=_causal(N) & dense, bias=bias.half().masked_fill(~dense, 0.0))
    torch.testing.assert_close(out.double(), ref, atol=3e-3, rtol=3e-3)
    got = torch.autograd.grad(out, (q, k, v, coeffs), grad)
    want = torch.autograd.grad(ref, (q, k, v, coeffs), grad.double())
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a.double(), b.double(), atol=3e-3 * (1 + b.abs().max().item()), rtol=3e-3,
                                   msg=lambda msg, i=i: f"gradient {i}: {msg}")


def test_causal_backward_with_query_blocks_wider_than_key_blocks_past_the_first_query_block(monkeypatch):
    """Pin: kills _query_ranges starting the masked query blocks at ``start_n`` instead of the query block that
    holds it: with backward query blocks wider than key blocks (64 x 16) the masked range then overlapped the
    unmasked one and ``P^T a`` and ``dk`` counted queries 64.. twice; the suite's geometries of this shape ran
    N = 37, inside one query block."""
    from diffusionformer.ops.triton import _launch

    table = _launch.INTERPRETER_BLOCKS if DEVICE == "cpu" else _launch.BLOCKS
    monkeypatch.setitem(table, "bwd_m", 64)
    monkeypatch.setitem(table, "bwd_n", 16)
    B, H, N, C = 1, 2, 70, 8
    q, k, v = _qkv(B, H, N, C, seed=11)
    coeffs = torch.tensor([[0.0, 1.0, 0.5], [0.3, -0.6, 0.9]], device=DEVICE, requires_grad=True)
    out = polynomial_attention(q, k, v, coeffs, is_causal=True)
    _assert_matches(out, _reference(q, k, v, coeffs, keep=_causal(N)), (q, k, v, coeffs))
