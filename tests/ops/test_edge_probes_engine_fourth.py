"""Fourth edge-case probes of the engine's back-ends (``ops.engine``, ``ops.dense``, ``ops.sparse``, ``ops.uniform_map``)
against an explicit float64 matrix reference ``sum_k c_k P^k v``: ``is_causal`` with a key-padding mask and a per-head
bool mask (a fully masked row included) at once, per-head degrees with a degree-0 head, an all-zero coefficient row,
static and tensor coefficients, ``N = 1`` and many sequence-heads of length 2; the documented ``auto`` table at its
boundaries; mixed dtypes, strided and expanded inputs, and gradients for the coefficients alone.

No bug was found: these pin behaviour that held when probed (the Triton back-end under the interpreter gave the same
values and gradients, but is too slow on CPU to pin here as well).
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.ops.dense import choose_dense_backend, diffuse
from diffusionformer.ops.sparse import diffuse_sparse
from diffusionformer.ops.uniform_map import uniform_mean


def _reference(q, k, v, coeffs, mask, is_causal, degrees):
    """``sum_k c[h, k] P_h^k v_h`` in float64 (terms beyond a head's degree dropped), ``P`` the masked softmax with
    zero rows for queries without an admissible key."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, N, C = q.shape
    s = q @ k.transpose(-1, -2) * C**-0.5
    keep = torch.ones(B, H, N, N, dtype=torch.bool)
    if is_causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool).tril()
    if mask is not None:
        keep = keep & mask
    s = s.masked_fill(~keep, -math.inf)
    ok = keep.any(-1, keepdim=True)
    P = torch.softmax(s.masked_fill(~ok, 0.0), -1).masked_fill(~ok, 0.0)
    c = torch.as_tensor(coeffs).double()
    c = c.expand(H, -1) if c.dim() == 1 else c
    K = c.shape[1] - 1
    deg = [K] * H if degrees is None else list(degrees)
    out, x = torch.zeros_like(v), v
    for step in range(K + 1):
        on = torch.tensor([1.0 if step <= d else 0.0 for d in deg], dtype=torch.float64)
        out = out + (c[:, step] * on).view(1, H, 1, 1) * x
        x = P @ x
    return out


def _inputs(B, H, N, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, 4, generator=g, dtype=torch.float64) for _ in range(3))
    pad = torch.rand(B, 1, 1, N, generator=g) > 0.3
    general = torch.rand(B, H, N, N, generator=g) > 0.4
    if N > 1:
        pad[0, ..., 0] = False  # with is_causal, query 0 of batch 0 has no key
        general[0, 0, 1, :] = False  # a fully masked row
    return q, k, v, pad & general


_LAYOUTS = [
    ([0.2, 0.3, 0.1, 0.4], None),
    ([[0.2, 0.3, 0.1, 0.4]] * 3, (0, 2, 3)),  # a degree-0 head beside K-step heads
    ([[0.0, 0.0, 0.0], [0.1, 0.5, 0.4], [0.1, 0.5, 0.4]], None),  # a head with zero coefficients
    ([[0.0, 1.0, 0.0], [1.0, -1.0, 0.0], [0.1, 0.5, 0.4]], (1, 1, 2)),  # affine heads beside a K-step head
]


@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("layout", range(len(_LAYOUTS)))
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 3, 1), (40, 3, 2)])
def test_dense_causal_padding_and_mask_match_float64_reference(backend, static, layout, shape):
    coeffs, degrees = _LAYOUTS[layout]
    q0, k0, v0, mask = _inputs(*shape)
    ins = [t.float().requires_grad_() for t in (q0, k0, v0)]
    c = torch.tensor(coeffs, requires_grad=True)
    if not static:
        ins.append(c)
    out = diffuse(*ins[:3], coeffs if static else c, attn_mask=mask, is_causal=True, backend=backend, degrees=degrees)
    ref_ins = [t.clone().requires_grad_() for t in (q0, k0, v0)] + [torch.tensor(coeffs, dtype=torch.float64,
                                                                                requires_grad=True)]
    expected = _reference(*ref_ins[:3], ref_ins[3], mask, True, degrees)
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-4)
    got = torch.autograd.grad((out * g.float()).sum(), ins)
    want = torch.autograd.grad((expected * g).sum(), ref_ins[:len(ins)])
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["auto", "csr", "native"])
@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("layout", range(len(_LAYOUTS)))
def test_sparse_causal_graph_with_isolated_node_matches_float64_reference(backend, static, layout):
    coeffs, degrees = _LAYOUTS[layout]
    q0, k0, v0, _ = _inputs(1, 3, 5, seed=2)
    adj = torch.rand(5, 5, generator=torch.Generator().manual_seed(3)) > 0.4
    adj[1, :] = False  # node 1 has no incoming edge
    dst, src = adj.nonzero(as_tuple=True)
    node = [t[0].transpose(0, 1).contiguous().requires_grad_() for t in (q0, k0, v0)]  # (N, H, C)
    c = torch.tensor(coeffs, dtype=torch.float64, requires_grad=True)
    out = diffuse_sparse(*node, torch.stack([src, dst]), coeffs if static else c, backend=backend, degrees=degrees,
                         is_causal=True)
    ref_ins = [t.clone().requires_grad_() for t in (q0, k0, v0)]
    expected = _reference(*ref_ins, torch.tensor(coeffs, dtype=torch.float64), adj.view(1, 1, 5, 5), True,
                          degrees)[0].transpose(0, 1)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
    got = torch.autograd.grad(out.sum(), node)
    want = torch.autograd.grad(expected.sum(), ref_ins)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b[0].transpose(0, 1), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("is_causal", [False, True])
def test_auto_rule_follows_the_documented_table(is_causal):
    """docs/design.md: materialise up to N = 128, 256, 384, 512 for K = 2, 3, 4, >= 8 (causal 64, 128, 256, 384);
    K <= 1 always the fused kernel; on CUDA ``matrix`` for K >= 4 with N from 1024 to 2048."""
    table = {2: 64, 3: 128, 4: 256, 7: 256, 8: 384, 30: 384} if is_causal else \
        {2: 128, 3: 256, 4: 384, 7: 384, 8: 512, 30: 512}
    for K, n in table.items():
        assert choose_dense_backend(n, n, K, is_causal=is_causal) == "matrix"
        assert choose_dense_backend(n + 1, n + 1, K, is_causal=is_causal) == "sdpa"
    assert {choose_dense_backend(1, 1, K, is_causal=is_causal) for K in (0, 1)} == {"sdpa"}
    cuda = [choose_dense_backend(n, n, K, is_causal=is_causal, device_type="cuda")
            for n, K in ((1023, 4), (1024, 4), (2048, 8), (2049, 4), (1024, 3))]
    assert cuda == ["sdpa", "matrix", "matrix", "sdpa", "sdpa"]


def test_mixed_dtypes_are_refused_naming_the_tensors():
    q, k, v, _ = _inputs(1, 2, 3)
    with pytest.raises(TypeError, match="v must have the dtype of q"):
        diffuse(q.half(), k.half(), v.float(), [0.0, 1.0])
    with pytest.raises(TypeError, match="q and k must have the same dtype"):
        diffuse(q.float(), k, v.float(), [0.5, 0.5, 0.0])
    with pytest.raises(TypeError, match="v must have the dtype of q"):
        diffuse_sparse(q[0].half(), k[0].half(), v[0].float(), torch.tensor([[0], [1]]), [0.0, 1.0])


@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
@pytest.mark.parametrize("coeffs", [[0.5, 0.3, 0.2], [1.0, -1.0]])
def test_strided_expanded_and_channels_last_inputs(backend, coeffs):
    q, k, v = (t.float() for t in _inputs(2, 3, 5)[:3])
    layouts = {
        "token-major": tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)),
        "expanded": (q[:, :1].expand_as(q), k[:, :1].expand_as(k), v[:, :, :1].expand_as(v)),
        "channels_last": tuple(t.contiguous(memory_format=torch.channels_last) for t in (q, k, v)),
        "every other channel": (torch.cat([q, q], -1)[..., ::2], k, torch.cat([v, v], -1)[..., ::2]),
    }
    for qq, kk, vv in layouts.values():
        before = vv.clone()
        for c in (coeffs, torch.tensor(coeffs)):
            out = diffuse(qq, kk, vv, c, is_causal=True, backend=backend)
            torch.testing.assert_close(out.double(), _reference(qq, kk, vv, coeffs, None, True, None),
                                       atol=1e-5, rtol=1e-4)
        assert torch.equal(vv, before)  # the in-place affine combination never writes into v


@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
def test_gradient_of_coefficients_alone(backend):
    """Only ``coeffs`` requires grad: its gradient is exact, zero beyond each head's degree."""
    q, k, v = (t.float() for t in _inputs(2, 3, 5)[:3])
    c = torch.tensor([[0.5, 0.3, 0.2]] * 3, requires_grad=True)
    (got,) = torch.autograd.grad(diffuse(q, k, v, c, backend=backend, degrees=(2, 1, 0)).sum(), c)
    cr = c.detach().double().requires_grad_()
    (want,) = torch.autograd.grad(_reference(q, k, v, cr, None, False, (2, 1, 0)).sum(), cr)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert got[1, 2] == 0 and (got[2, 1:] == 0).all()


def test_uniform_mean_key_mask_with_causal_matches_matrix_reference():
    x = torch.randn(3, 2, 4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    for key_mask in (torch.tensor([False, True, False, True]).view(1, 1, 1, 4), torch.zeros(3, 2, 1, 4, dtype=torch.bool)):
        admissible = torch.ones(4, 4, dtype=torch.bool).tril() & key_mask
        W = admissible.double() / admissible.sum(-1, keepdim=True).clamp_min(1)
        torch.testing.assert_close(uniform_mean(x, key_mask, is_causal=True), W @ x)
