"""Second edge-case probes of the Triton kernels (``diffusionformer.ops.triton``), under the interpreter on CPU:
float masks whose rows carry only large negative biases, sequence lengths and head sizes off the interpreter's
blocks (N = 2, 17, 33; C = 12, 24), large logits, dropout at ``p = 0`` and at a rate that rounds to 0, and the
checks of the launch geometry (:data:`~diffusionformer.ops.triton._launch.BLOCKS`).

Found and fixed (tests marked "Bug:"): a row of a float ``attn_mask`` whose admissible keys all carry a large
negative bias (``-1e9`` for left padding with ``is_causal``, ``finfo.min``) lost its softmax: the kernels stored
``m + log2(l)`` with ``m`` near ``-1.4e9``, so ``log2(l)`` vanished and every power after the first (and every
gradient) used ``P`` entries near 1 instead of ``1 / l``; ``BLOCKS`` refused numpy ints with "must be a power of
two >= 16, got np.int64(64)" and accepted ``num_warps=3``, which triton's compiler rejects later.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def triton_attention(triton_kernels):
    """``diffusionformer.ops.triton`` with the kernels of this folder's ``triton_kernels`` fixture (interpreted on
    CPU; skipped without triton or with an interpreter that cannot run here)."""
    import diffusionformer.ops.triton as ops

    return ops


def _reference(q, k, v, coeffs, is_causal=False, bias=None):
    """``sum_j c[h, j] P^j v`` in float64 with ``P = softmax(q k^T / sqrt(C) + bias)``; the bias of every row is
    first shifted by its maximum over the admissible keys (the same softmax, without float64 absorbing the scores
    into ``finfo(float32).min``); a row with no admissible key is a zero row."""
    q, k, v, coeffs = (t.double() for t in (q, k, v, coeffs))
    B, H, N, C = q.shape
    keep = torch.ones(N, N, dtype=torch.bool, device=q.device)
    if is_causal:
        keep = keep.tril()
    s = q @ k.transpose(-2, -1) / C**0.5
    if bias is not None:
        b = bias.double().expand(B, H, N, N)
        top = b.masked_fill(~keep, -math.inf).amax(-1, keepdim=True)
        s = s + (b - torch.where(torch.isfinite(top), top, torch.zeros_like(top)))
    s = s.masked_fill(~keep, -math.inf)
    ok = (s > -math.inf).any(-1, keepdim=True)
    P = torch.softmax(s.masked_fill(~ok, 0.0), -1) * ok
    out, y = coeffs[:, 0].view(1, H, 1, 1) * v, v
    for j in range(1, coeffs.shape[1]):
        y = P @ y
        out = out + coeffs[:, j].view(1, H, 1, 1) * y
    return out


def _leaves(*shape, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g) * scale).to(DEVICE).requires_grad_() for _ in range(3)]


def _check(ops, q, k, v, c, tol, is_causal=False, bias=None, grad_tol=None):
    """Output and gradients of q, k, v and c against :func:`_reference` (gradients within ``grad_tol``, default
    ``tol``)."""
    out = ops.polynomial_attention(q, k, v, c, is_causal=is_causal, attn_mask=bias)
    ref = _reference(q, k, v, c, is_causal, bias)
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(out)
    got = torch.autograd.grad(out, (q, k, v, c), go)
    want = torch.autograd.grad(ref, (q, k, v, c), go.double())
    tol = tol if grad_tol is None else grad_tol
    for name, a, b in zip("qkvc", got, want):
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol * (1 + b.abs().max().item()), msg=lambda m, n=name: f"d{n}: {m}")


def test_bug_float_mask_rows_of_large_negative_bias_keep_their_softmax(triton_attention):
    """Bug: with a float ``attn_mask`` whose admissible keys of a row all carry a large negative bias (left padding
    as a ``-1e9`` key mask under ``is_causal``, a row of ``finfo.min``), the kernels' stored log-sum-exp
    ``m + log2(l)`` lost ``log2(l)`` next to ``m ~ -1.4e9``: the powers after the first and every gradient used
    ``P`` entries near 1 (outputs off by 0.8, gradients by 6, growing with N). The mask now enters the scores less
    its row maximum over the admissible keys (the same softmax), and the kernels match float64."""
    B, H, N, C = 2, 2, 9, 8
    q, k, v = _leaves(B, H, N, C, seed=1)
    c = torch.tensor([[0.2, 1.0, -0.5], [0.3, 0.6, 0.4]], device=DEVICE, requires_grad=True)
    bias = torch.zeros(B, H, N, N)
    bias[1, :, :, :3] = -1e9  # left padding of sequence 1: causal rows 0..2 see only these keys
    bias[0, 1, 5] = torch.finfo(torch.float32).min  # a whole row at finfo.min
    bias[0, 0, 6, :4] = -1e30  # a partly masked row: those keys drop out
    bias[0, 0, 7] = -2e5  # a whole row at a moderate bias
    _check(triton_attention, q, k, v, c, 1e-5, is_causal=True, bias=bias.to(DEVICE))


@pytest.mark.parametrize("N,C,causal", [(2, 24, True), (17, 12, False), (33, 24, True)],
                         ids=["N2-C24", "N17-C12", "N33-C24-causal"])
def test_lengths_and_head_sizes_off_the_blocks_match_float64(triton_attention, N, C, causal):
    """Sequence lengths that are not multiples of the 32/16-wide interpreter blocks, head sizes padded to 16 and
    32, one K = 3 polynomial per head."""
    q, k, v = _leaves(1, 2, N, C, seed=N)
    c = torch.randn(2, 4, generator=torch.Generator().manual_seed(C)).to(DEVICE).requires_grad_()
    _check(triton_attention, q, k, v, c, 1e-5, is_causal=causal)


def test_large_logits_match_float64(triton_attention):
    """Scores of order 1e4 (q and k scaled by 100): the online softmax neither overflows nor loses the gradients."""
    q, k, v = _leaves(1, 2, 9, 8, scale=1.0, seed=2)
    with torch.no_grad():
        q.mul_(100.0)
        k.mul_(100.0)
    c = torch.tensor([[0.1, 0.5, 0.4], [1.0, -1.0, 0.2]], device=DEVICE, requires_grad=True)
    # the backward recomputes P from the float32 log-sum-exp L (|L| ~ 4.8e4 here: rounded by up to 2^-24 |L| ~ 3e-3),
    # as flash attention does: its gradients carry that relative error (the output's first power does not); how the
    # rounding falls depends on the CPU (1e-4 held on a Xeon, 2.3e-3 in dv on an AVX-512 EPYC)
    L = (q.detach().double() @ k.detach().double().transpose(-2, -1)).abs().max().item() / 8**0.5 * math.log2(math.e)
    _check(triton_attention, q, k, v, c, 1e-4, grad_tol=2 * L * 2.0**-24)


def test_dropout_at_zero_and_at_a_rate_rounding_to_zero_is_no_dropout(triton_attention):
    q, k, v = (t.detach() for t in _leaves(1, 2, 9, 8, seed=3))
    c = torch.tensor([[0.1, 0.5, 0.4], [1.0, -1.0, 0.2]], device=DEVICE)
    plain = triton_attention.polynomial_attention(q, k, v, c)
    seed = torch.tensor([11], device=DEVICE)
    assert torch.equal(triton_attention.polynomial_attention(q, k, v, c, dropout_p=0.0, seed=seed), plain)
    # 1e-7 rounds to 0 / 65536: every entry is kept, scaled by 1
    assert torch.equal(triton_attention.polynomial_attention(q, k, v, c, dropout_p=1e-7, seed=seed), plain)


def test_bug_launch_geometry_takes_numpy_ints_and_refuses_warps_triton_cannot_compile(monkeypatch):
    """Bug: ``BLOCKS`` entries that are numpy ints (a sweep's values) were refused with the false "must be a power
    of two >= 16, got np.int64(64)", and ``num_warps=3`` passed the check, to fail later in triton's compiler
    ("num_warps must be a power of 2") on the GPU."""
    from diffusionformer.ops.triton import _launch

    base = dict(fwd_m=np.int64(64), fwd_n=np.int32(32), bwd_m=32, bwd_n=np.int64(16), num_warps=np.int64(2),
                num_stages=np.int8(3), bwd_num_warps=None, bwd_num_stages=None)
    monkeypatch.setattr(_launch, "BLOCKS", base)
    sizes, opts = _launch.cuda_geometry(64)
    assert sizes == (64, 32, 32, 16) and opts == {"num_warps": 2, "num_stages": 3}
    assert all(type(x) is int for x in (*sizes, *opts.values()))
    for key, bad in (("num_warps", 3), ("bwd_num_warps", 6)):
        monkeypatch.setattr(_launch, "BLOCKS", dict(base, **{key: bad}))
        with pytest.raises(ValueError, match=rf"BLOCKS\['{key}'\] must be a power of two \(warps per program\) "
                                             rf"or None, got {bad}"):
            _launch.cuda_geometry(64, backward=True)
