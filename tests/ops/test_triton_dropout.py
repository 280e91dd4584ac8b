"""Dropout on ``P`` in the Triton kernels: exact against float64 with the kernels' masks, and right in law.

The kernels never store a mask: they draw entry ``(i, j)`` of power ``t`` of head ``bh`` from a
Philox seed and draw it again in the backward pass. Two independent checks:

* exactness: :func:`~diffusionformer.ops.triton.dropout_scales` writes the masks of a seed out,
  and the kernels' output and gradients (q, k, v, coefficients) equal the float64 polynomial
  ``sum_k c_k (P * D_k) ... (P * D_1) v`` built with those masks, causal and key-padded;
* law: the masks keep a fraction ``1 - p`` of the entries, independently across powers, heads
  and seeds, and the average output over many independent masks tends to the output without
  dropout (``E[D_t] = 1`` and the masks of different powers are independent), which does not use
  :func:`dropout_scales` at all.

On CPU the kernels run under the Triton interpreter (``conftest.py``), so sizes are tiny.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from torch import Tensor

from diffusionformer import DiffusionAttention
from diffusionformer.ops.dense import attention_matrix
from diffusionformer.ops.triton import affine_attention, dropout_scales, polynomial_attention
from diffusionformer.ops.triton._launch import dropout_rate

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install 'triton>=3.6'; Linux wheels only)",
)

pytestmark = [requires_triton, pytest.mark.usefixtures("triton_kernels")]


def seed_tensor(value: int) -> Tensor:
    return torch.tensor([value], dtype=torch.int64, device=DEVICE)


def softmax_matrix(q: Tensor, k: Tensor, is_causal: bool, pad: Tensor | None) -> Tensor:
    """float64 ``P`` with zero rows where no key is admissible, ``(B, H, N, N)``, by the library's matrix path
    (itself checked against explicit float64 softmax matrices in tests/core; independent of the kernels)."""
    mask = None if pad is None else ~pad[:, None, None, :]
    return attention_matrix(q.double(), k.double(), attn_mask=mask, is_causal=is_causal)


def dropped_reference(q, k, v, coeffs, is_causal, pad, masks: Tensor) -> Tensor:
    """``sum_k c_k (P * D_k) ... (P * D_1) v`` in float64 (``masks[t - 1] = D_t``)."""
    P = softmax_matrix(q, k, is_causal, pad)
    v, coeffs = v.double(), coeffs.double()
    H = v.shape[1]
    out, y = coeffs[:, 0].view(1, H, 1, 1) * v, v
    for t in range(1, coeffs.shape[1]):
        y = (P * masks[t - 1].double()) @ y
        out = out + coeffs[:, t].view(1, H, 1, 1) * y
    return out


def padding(B: int, N: int) -> Tensor:
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[0, N - 5:] = True
    pad[-1, :2] = True  # with is_causal rows 0..1 have no admissible key
    return pad.to(DEVICE)


def qkv(B, H, N, C, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, C, generator=g).to(device=DEVICE, dtype=dtype).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
def test_polynomial_dropout_matches_float64_with_the_kernels_masks(is_causal, padded):
    # N = 37 crosses the interpreter's 16/32-wide blocks in both orientations (forward: 32 x 16,
    # backward: 16 x 32 and 32 x 16), so every kernel regenerates the masks on ragged blocks
    B, H, N, C, p = 2, 2, 37, 8, 0.3
    q, k, v = qkv(B, H, N, C)
    coeffs = torch.tensor([[0.3, 0.5, -0.2, 0.4], [1.0, -0.7, 0.25, 0.1]], device=DEVICE, requires_grad=True)
    pad = padding(B, N) if padded else None
    seed = seed_tensor(2**40 + 12345)
    out = polynomial_attention(q, k, v, coeffs, is_causal=is_causal, key_padding_mask=pad, dropout_p=p, seed=seed)
    masks = dropout_scales(seed, B, H, N, 3, p)
    assert set(masks.unique().tolist()) == {0.0, torch.tensor(dropout_rate(p)[1], dtype=torch.float32).item()}
    ref = dropped_reference(q, k, v, coeffs, is_causal, pad, masks)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    got = torch.autograd.grad(out, (q, k, v, coeffs), g)
    want = torch.autograd.grad(ref, (q, k, v, coeffs), g.double())
    for name, a, b in zip(("dq", "dk", "dv", "dcoeffs"), got, want):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-4 * (1 + b.abs().max().item()), rtol=1e-4,
                                   msg=lambda m, n=name: f"{n}: {m}")
    # the output really is dropped: without the masks the reference differs
    plain = dropped_reference(q, k, v, coeffs, is_causal, pad, torch.ones_like(masks))
    assert (out.double() - plain).abs().max() > 1e-2


def test_affine_dropout_matches_float64_and_bf16_stays_close():
    B, H, N, C, p = 1, 3, 21, 16, 0.5
    q, k, v = qkv(B, H, N, C, seed=3)
    c0 = torch.tensor([0.0, 1.0, 0.4], device=DEVICE, requires_grad=True)
    c1 = torch.tensor([1.0, -1.0, 0.6], device=DEVICE, requires_grad=True)
    seed = seed_tensor(7)
    out = affine_attention(q, k, v, c0, c1, is_causal=True, dropout_p=p, seed=seed)
    ref = dropped_reference(q, k, v, torch.stack([c0, c1], 1), True, None, dropout_scales(seed, B, H, N, 1, p))
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    got = torch.autograd.grad(out.sum(), (q, k, v, c0, c1))
    want = torch.autograd.grad(ref.sum(), (q, k, v, c0, c1))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-4, rtol=1e-4)
    # bfloat16 draws the same masks (the draw does not depend on the dtype)
    qb, kb, vb = (t.detach().bfloat16() for t in (q, k, v))
    outb = affine_attention(qb, kb, vb, c0.detach(), c1.detach(), is_causal=True, dropout_p=p, seed=seed)
    refb = dropped_reference(qb, kb, vb, torch.stack([c0, c1], 1).detach(), True, None,
                             dropout_scales(seed, B, H, N, 1, p))
    torch.testing.assert_close(outb.double(), refb, atol=3e-2, rtol=3e-2)


def test_masks_keep_the_right_fraction_independently_across_powers_heads_and_seeds():
    B, H, N, steps, p = 2, 3, 40, 3, 0.3
    a = dropout_scales(seed_tensor(11), B, H, N, steps, p)
    assert a.shape == (steps, B, H, N, N) and a.dtype == torch.float32
    kept = a > 0
    n = kept.numel()
    # keep rate within 5 binomial standard errors of 1 - p (28,800 draws)
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    torch.testing.assert_close(a, dropout_scales(seed_tensor(11), B, H, N, steps, p))  # a seed fixes the masks
    # two masks that are independent agree on p^2 + (1 - p)^2 = 0.58 of the entries; equal masks on all
    agree = 2 * p * p - 2 * p + 1
    off_diagonal = ~torch.eye(N, dtype=torch.bool, device=DEVICE)
    pairs = {
        "powers": (kept[0], kept[1]),
        "heads": (kept[:, :, 0], kept[:, :, 1]),
        "batch": (kept[:, 0], kept[:, 1]),
        "seeds": (kept, dropout_scales(seed_tensor(12), B, H, N, steps, p) > 0),
        # the draw of (i, j) is not that of (j, i) (the diagonal, where both are one entry, left out)
        "transpose": (kept[..., off_diagonal], kept.transpose(-1, -2)[..., off_diagonal]),
        # one Philox draw decides 8 neighbouring keys of a row, 16 bits each: neighbours within a draw, the
        # same 16-bit piece of the next draw (8 keys on) and the next row must all be independent
        "neighbouring keys": (kept[..., :-1], kept[..., 1:]),
        "keys 8 apart": (kept[..., :-8], kept[..., 8:]),
        "neighbouring queries": (kept[..., :-1, :], kept[..., 1:, :]),
    }
    for name, (x, y) in pairs.items():
        rate = (x == y).float().mean().item()
        assert abs(rate - agree) < 5 * math.sqrt(agree * (1 - agree) / x.numel()), (name, rate)
    # a different probability keeps its own fraction with the same seed
    assert abs((dropout_scales(seed_tensor(11), B, H, N, 1, 0.7) > 0).float().mean().item() - 0.3) < 0.02


def test_the_kernels_drop_at_p_rounded_to_16_bits_and_stay_unbiased():
    # the kernels decide an entry with 16 random bits: the rate is p rounded to a multiple of 2^-16 (within
    # 2^-17 of p, at most 1 - 2^-16) and kept entries are scaled by 1 / (1 - rate), so that E[D] = 1 exactly
    for p in (0.0, 1e-6, 0.1, 0.2, 0.3, 0.5, 0.9, 0.999999, 1.0 - 1e-12):
        rate, scale = dropout_rate(p)
        assert (rate * 65536).is_integer() and 0.0 <= rate <= 1.0 - 2.0**-16
        assert abs(rate - p) <= 2.0**-17 or p > 1.0 - 2.0**-16
        assert math.isfinite(scale) and abs((1.0 - rate) * scale - 1.0) < 1e-12
    # the masks agree: the kept value is that scale, and a rate that rounds to 0 keeps everything
    assert set(dropout_scales(seed_tensor(3), 1, 1, 24, 1, 1e-6).unique().tolist()) == {1.0}
    masks = dropout_scales(seed_tensor(3), 1, 1, 24, 1, 0.999999)
    assert set(masks.unique().tolist()) <= {0.0, torch.tensor(65536.0).item()}


def test_average_over_many_masks_tends_to_the_output_without_dropout():
    # independent of dropout_scales: E[(P * D_2)(P * D_1) v] = P P v for independent masks with mean 1;
    # 128 copies of one head along the batch draw 128 independent mask sequences in one call
    R, N, C, p = 128, 9, 4, 0.4
    q1, k1, v1 = (t.detach()[:1] for t in qkv(1, 1, N, C, seed=5))
    q, k, v = (t.expand(R, 1, N, C) for t in (q1, k1, v1))
    coeffs = torch.tensor([[0.5, 1.0, -0.8]], device=DEVICE)
    out = polynomial_attention(q, k, v, coeffs, dropout_p=p, seed=seed_tensor(99)).double()
    want = polynomial_attention(q1, k1, v1, coeffs).double()[0]
    spread = out.std(0) / math.sqrt(R)  # standard error of the mean, per entry
    err = (out.mean(0) - want).abs()
    assert (spread > 0).all()  # the copies really differ
    # every entry within 5 standard errors (for normal means, a false alarm among the 36 in about 2 of 10^5 seeds); a
    # scale off by sqrt(1 / (1 - p)) or half the drop rate puts 6-15 entries 8-13 standard errors away
    assert (err < 5 * spread + 1e-6).all()


def test_fresh_seed_from_torch_generator_and_validation():
    q, k, v = (t.detach() for t in qkv(1, 2, 12, 8))
    coeffs = torch.tensor([[0.0, 1.0, 0.5], [1.0, -1.0, 0.0]], device=DEVICE)
    torch.manual_seed(3)
    a = polynomial_attention(q, k, v, coeffs, dropout_p=0.5)
    b = polynomial_attention(q, k, v, coeffs, dropout_p=0.5)
    torch.manual_seed(3)
    a2 = polynomial_attention(q, k, v, coeffs, dropout_p=0.5)
    torch.testing.assert_close(a, a2)  # torch.manual_seed reproduces the masks
    assert not torch.equal(a, b)  # each call draws a fresh seed
    torch.testing.assert_close(polynomial_attention(q, k, v, coeffs, dropout_p=0.0, seed=seed_tensor(1)),
                               polynomial_attention(q, k, v, coeffs))
    with pytest.raises(ValueError, match=r"dropout_p must lie in \[0, 1\)"):
        polynomial_attention(q, k, v, coeffs, dropout_p=1.0)
    with pytest.raises(ValueError, match="seed must be a \\(1,\\) int64 tensor, got a torch.int32"):
        polynomial_attention(q, k, v, coeffs, dropout_p=0.1, seed=torch.tensor([1], dtype=torch.int32))
    with pytest.raises(ValueError, match="seed must be a \\(1,\\) int64 tensor, got a int"):
        polynomial_attention(q, k, v, coeffs, dropout_p=0.1, seed=5)
    with pytest.raises(ValueError, match="steps must be a positive int"):
        dropout_scales(seed_tensor(1), 1, 1, 4, 0, 0.1)


def test_layer_dropout_on_the_triton_backend_trains_and_is_off_in_eval():
    torch.manual_seed(0)
    spec = "attention:1,laplacian:1,heat(t=1.0, steps=3):1,heat(t=0.5, learnable=True):1"
    layer = DiffusionAttention(32, 4, spec, backend="triton", causal=True, dropout=0.3).to(DEVICE)
    x = torch.randn(2, 11, 32, device=DEVICE, requires_grad=True)
    layer.train()
    torch.manual_seed(1)
    a = layer(x)
    torch.manual_seed(1)
    a2 = layer(x)
    torch.testing.assert_close(a, a2)
    a.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters() if p.requires_grad)
    layer.eval()
    with torch.no_grad():
        e = layer(x)
        ref = DiffusionAttention(32, 4, spec, backend="matrix", causal=True, dropout=0.3).to(DEVICE)
        ref.load_state_dict(layer.state_dict())
        ref.eval()
        torch.testing.assert_close(e, ref(x), atol=1e-5, rtol=1e-5)  # no dropout in eval mode
    assert (a.detach() - e).abs().max() > 1e-2  # and dropout really acted in training


def test_compiled_dropout_equals_eager_for_one_seed():
    B, H, N, C = 1, 2, 10, 8
    q, k, v = qkv(B, H, N, C, seed=8)
    coeffs = torch.tensor([[0.2, 0.5, 0.3], [1.0, -1.0, 0.0]], device=DEVICE, requires_grad=True)
    seed = seed_tensor(4242)
    fn = lambda q, k, v, c, s: polynomial_attention(q, k, v, c, is_causal=True, dropout_p=0.25, seed=s)  # noqa: E731
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, coeffs, seed)
    got = torch.autograd.grad(out.sum(), (q, k, v, coeffs))
    want_out = fn(q, k, v, coeffs, seed)
    want = torch.autograd.grad(want_out.sum(), (q, k, v, coeffs))
    torch.testing.assert_close(out, want_out)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_activation_checkpointing_replays_the_same_masks():
    # torch.utils.checkpoint runs the forward pass again in the backward pass; the seed is drawn from
    # PyTorch's generator, whose state checkpoint restores, so the replay draws the same masks and the
    # gradients equal those of the plain call with the same seed
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    layer = DiffusionAttention(32, 4, "laplacian:2,heat(t=1.0, steps=3):2", backend="triton", causal=True,
                               dropout=0.4).to(DEVICE)
    x = torch.randn(2, 10, 32, device=DEVICE, requires_grad=True)
    torch.manual_seed(5)
    plain = layer(x)
    (g_plain,) = torch.autograd.grad(plain.square().sum(), x)
    torch.manual_seed(5)
    ckpt = checkpoint(layer, x, use_reentrant=False)
    (g_ckpt,) = torch.autograd.grad(ckpt.square().sum(), x)
    torch.testing.assert_close(ckpt, plain)
    torch.testing.assert_close(g_ckpt, g_plain)
