"""General ``attn_mask`` in the Triton kernels (bool or float, any broadcast) against explicit float64 matrices.

Every mask kind the dense engine accepts: a bool band (a sliding window, shared by batch and
heads), a per-head bool mask with an empty row, a float mask with ``-inf`` blocks and an all
``-inf`` row, a key-only float mask; together with ``is_causal``, key padding and dropout on ``P``
(the reference then uses the kernels' written-out dropout masks), forward and the gradients of
``q``, ``k``, ``v`` and the coefficients. Then the same through the layer (a sliding-window graph
on ``backend="triton"`` against ``backend="matrix"``) and the functional entry point, and the
errors. On CPU the kernels run under the Triton interpreter (``conftest.py``), so sizes are tiny.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import Tensor

from diffusionformer import DiffusionAttention
from diffusionformer.functional import diffuse
from diffusionformer.graph import sliding_window
from diffusionformer.ops.triton import affine_attention, dropout_scales, polynomial_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install 'triton>=3.6'; Linux wheels only)",
)

pytestmark = [requires_triton, pytest.mark.usefixtures("triton_kernels")]

B, H, N, C = 2, 3, 37, 8


def reference(q, k, v, coeffs, *, is_causal=False, pad=None, mask=None, drop=None) -> Tensor:
    """``sum_k c_k (P * D_k) ... (P * D_1) v`` in float64 with explicit ``P`` (zero rows where no key is admissible)."""
    q, k, v, coeffs = (t.double() for t in (q, k, v, coeffs))
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    keep = torch.ones(q.shape[0], 1, N, N, dtype=torch.bool, device=q.device)
    if is_causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    if pad is not None:
        keep = keep & ~pad[:, None, None, :]
    if mask is not None:
        if mask.dtype == torch.bool:
            keep = keep & mask
        else:
            s = s + mask.double()
            keep = keep & (mask > float("-inf"))
    s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True).clamp_min(-1e300).nan_to_num(0.0)
    e = torch.exp(s - m) * keep
    P = e / e.sum(-1, keepdim=True).clamp_min(1e-300)
    Hh = v.shape[1]
    out, y = coeffs[:, 0].view(1, Hh, 1, 1) * v, v
    for t in range(1, coeffs.shape[1]):
        Pt = P if drop is None else P * drop[t - 1].double()
        y = Pt @ y
        out = out + coeffs[:, t].view(1, Hh, 1, 1) * y
    return out


def masks() -> dict[str, Tensor]:
    i = torch.arange(N)
    g = torch.Generator().manual_seed(3)
    per_head = torch.rand(B, H, N, N, generator=g) < 0.6
    per_head[0, 1, 4, :] = False  # a query with no admissible key
    fl = torch.randn(1, H, N, N, generator=g)
    fl[0, 1, :, 10:20] = float("-inf")
    fl[0, 2, 5, :] = float("-inf")  # a row with no admissible key
    key_float = torch.randn(B, 1, 1, N, generator=g)
    key_float[1, 0, 0, :6] = float("-inf")
    return {
        "window": ((i[:, None] - i[None, :]).abs() <= 5).view(N, N),  # 2-D, broadcast over batch and heads
        "per-head": per_head,
        "float": fl,
        "key-float": key_float,
    }


def qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, C, generator=g).to(DEVICE).requires_grad_() for _ in range(3)]


def assert_grads_match(out, ref, inputs):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    got = torch.autograd.grad(out, inputs, g)
    want = torch.autograd.grad(ref, inputs, g.double())
    for name, a, b in zip(("dq", "dk", "dv", "dcoeffs"), got, want):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b.double(), atol=1e-4 * (1 + b.abs().max().item()), rtol=1e-4,
                                   msg=lambda m, n=name: f"{n}: {m}")


# A covering set of the 4 x 2 x 2 product of mask layout, causality and padding: each kernel specialisation
# (bool or float mask x causal x padded) runs once, and each layout (bool: window, per-head; float: float,
# key-float) runs causal and full. The whole product ran the same 8 compiled variants twice, at twice the time.
@pytest.mark.parametrize("kind, is_causal, padded", [
    pytest.param(kind, causal, padded, id=f"{kind}-{'causal' if causal else 'full'}-{'padded' if padded else 'unpadded'}")
    for kind, causal, padded in [("window", False, False), ("window", True, True), ("per-head", False, True),
                                 ("per-head", True, False), ("float", False, False), ("float", True, True),
                                 ("key-float", False, True), ("key-float", True, False)]
])
def test_polynomial_attention_with_attn_mask_matches_float64(kind, is_causal, padded):
    # unpadded: the kernels' unmasked stages (blocks below the causal diagonal) must not skip the attn_mask
    q, k, v = qkv()
    coeffs = torch.tensor([[0.3, 0.5, -0.2, 0.4], [1.0, -0.7, 0.25, 0.1], [0.0, 1.0, 0.0, 0.0]], device=DEVICE,
                          requires_grad=True)
    mask = masks()[kind].to(DEVICE)
    pad = None
    if padded:
        pad = torch.zeros(B, N, dtype=torch.bool, device=DEVICE)
        pad[1, -4:] = True
    out = polynomial_attention(q, k, v, coeffs, is_causal=is_causal, key_padding_mask=pad, attn_mask=mask)
    ref = reference(q, k, v, coeffs, is_causal=is_causal, pad=pad, mask=mask)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    assert_grads_match(out, ref, (q, k, v, coeffs))
    # the mask acts: without it the output differs
    assert (out.double() - reference(q, k, v, coeffs, is_causal=is_causal, pad=pad)).abs().max() > 1e-2


def test_attn_mask_with_dropout_and_affine_heads():
    q, k, v = qkv(seed=2)
    mask = masks()["float"].to(DEVICE)
    seed = torch.tensor([77], dtype=torch.int64, device=DEVICE)
    c0 = torch.tensor([0.0, 1.0, 0.5], device=DEVICE, requires_grad=True)
    c1 = torch.tensor([1.0, -1.0, 0.5], device=DEVICE, requires_grad=True)
    out = affine_attention(q, k, v, c0, c1, attn_mask=mask, is_causal=True, dropout_p=0.3, seed=seed)
    ref = reference(q, k, v, torch.stack([c0, c1], 1), is_causal=True, mask=mask,
                    drop=dropout_scales(seed, B, H, N, 1, 0.3))
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    got = torch.autograd.grad(out.sum(), (q, k, v, c0, c1))
    want = torch.autograd.grad(ref.sum(), (q, k, v, c0, c1))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-4, rtol=1e-4)


def test_layer_on_a_sliding_window_graph_matches_the_matrix_backend():
    torch.manual_seed(0)
    spec = "attention:1,laplacian:1,heat(t=1.0, steps=3):1,heat(t=0.5, learnable=True):1"
    fast = DiffusionAttention(32, 4, spec, backend="triton").to(DEVICE)
    slow = DiffusionAttention(32, 4, spec, backend="matrix").to(DEVICE).double()
    slow.load_state_dict(fast.state_dict())
    pad = torch.zeros(2, 23, dtype=torch.bool, device=DEVICE)
    pad[0, -3:] = True
    graph = sliding_window(23, 4, causal=True, key_padding_mask=pad, device=DEVICE)
    x = torch.randn(2, 23, 32, device=DEVICE, requires_grad=True)
    x64 = x.detach().double().requires_grad_()
    out, want = fast(x, graph), slow(x64, graph)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    (dx,) = torch.autograd.grad(out.square().sum(), x)
    (dx64,) = torch.autograd.grad(want.square().sum(), x64)
    torch.testing.assert_close(dx.double(), dx64, atol=1e-4, rtol=1e-4)


def test_functional_float_mask_on_triton_matches_matrix_for_interleaved_heads():
    q, k, v = (t.detach() for t in qkv(seed=4))
    mask = masks()["float"].to(DEVICE)
    coeffs = [[0.0, 1.0, 0.0], [0.2, 0.5, 0.3], [1.0, -1.0, 0.0]]
    kw = dict(attn_mask=mask, is_causal=True, degrees=(1, 2, 1))
    torch.testing.assert_close(diffuse(q, k, v, coeffs, backend="triton", **kw),
                               diffuse(q, k, v, coeffs, backend="matrix", **kw), atol=1e-5, rtol=1e-5)


def test_unsupported_masks_are_clear_errors():
    q, k, v = (t.detach() for t in qkv())
    c = torch.tensor([[0.0, 1.0]] * H, device=DEVICE)
    learned = torch.zeros(N, N, device=DEVICE, requires_grad=True)
    with pytest.raises(ValueError, match="attn_mask requires grad"):
        polynomial_attention(q, k, v, c, attn_mask=learned)
    with pytest.raises(ValueError, match="backend='triton' does not support a float attn_mask that requires grad"):
        diffuse(q, k, v, [0.0, 1.0], attn_mask=learned, backend="triton")
    with pytest.raises(ValueError, match=r"attn_mask must be broadcastable to \(B, H, N, M\)"):
        polynomial_attention(q, k, v, c, attn_mask=torch.ones(N, N + 1, dtype=torch.bool, device=DEVICE))
