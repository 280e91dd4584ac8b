"""The kernel layer: dense and sparse diffusion against independent references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.utils import softmax as pyg_softmax

from diffusionformer.functional import (
    attention_matrix,
    choose_dense_backend,
    dense_attention_reference,
    diffuse,
    diffuse_sparse,
    edge_attention,
    polynomial_reference,
    propagate_sparse,
    scatter_sum,
    segment_softmax,
)
from diffusionformer.testing import causal_edge_index, complete_edge_index, random_qkv


def test_segment_softmax_matches_pyg():
    g = torch.Generator().manual_seed(0)
    index = torch.randint(0, 10, (200,), generator=g)
    src = torch.randn(200, 3, generator=g, dtype=torch.float64)
    ours = segment_softmax(src, index, 12)
    assert torch.allclose(ours, pyg_softmax(src, index, num_nodes=12), atol=1e-12)
    sums = scatter_sum(ours, index, 12)
    present = torch.bincount(index, minlength=12) > 0
    assert torch.allclose(sums[present], torch.ones_like(sums[present]))
    assert (sums[~present] == 0).all()


def test_segment_softmax_all_minus_inf_segment_is_zero_not_nan():
    w = segment_softmax(torch.tensor([float("-inf"), float("-inf"), 1.0]), torch.tensor([0, 0, 1]), 2)
    assert torch.equal(w, torch.tensor([0.0, 0.0, 1.0]))


def test_attention_matrix_matches_reference_and_rows_sum_to_one():
    q, k, _ = random_qkv(2, 3, 5, 4)
    P = attention_matrix(q, k)
    assert torch.allclose(P, dense_attention_reference(q, k), atol=1e-12)
    assert torch.allclose(P.sum(-1), torch.ones(2, 3, 5, dtype=torch.float64))


@pytest.mark.parametrize("backend", ["sdpa", "matrix", "auto"])
def test_attention_and_laplacian_coefficients(backend):
    q, k, v = random_qkv(2, 3, 6, 4)
    sdpa = F.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(diffuse(q, k, v, torch.tensor([0.0, 1.0]), backend=backend), sdpa, atol=1e-12)
    lap = diffuse(q, k, v, torch.tensor([1.0, -1.0]), backend=backend)
    assert torch.allclose(lap, v - sdpa, atol=1e-12)
    # Laplacian ignores a constant shift of the values: (I - P) 1 = 0.
    assert torch.allclose(diffuse(q, k, v + 3.0, torch.tensor([1.0, -1.0]), backend=backend), lap, atol=1e-12)


@pytest.mark.parametrize("backend", ["sdpa", "matrix"])
def test_per_head_coefficients_and_degrees(backend):
    q, k, v = random_qkv(2, 4, 6, 3, seed=1)
    coeffs = torch.tensor([[0.2, 0.3, 0.5], [1.0, -1.0, 0.0], [0.0, 0.0, 0.0], [0.1, 0.0, 0.9]], dtype=torch.float64)
    P = dense_attention_reference(q, k)
    ref = polynomial_reference(P, v, coeffs)
    assert torch.allclose(diffuse(q, k, v, coeffs, backend=backend), ref, atol=1e-12)
    # degrees that skip propagation on heads that do not need it, incl. non-contiguous sets
    out = diffuse(q, k, v, coeffs, backend=backend, degrees=[2, 1, 0, 2])
    assert torch.allclose(out, ref, atol=1e-12)
    # a degree below the coefficients' support really truncates (it is not ignored)
    trunc = diffuse(q, k, v, coeffs, backend=backend, degrees=[1, 1, 0, 2])
    assert not torch.allclose(trunc[:, 0], ref[:, 0])
    assert torch.allclose(trunc[:, :1], polynomial_reference(P[:, :1], v[:, :1], coeffs[:1, :2]), atol=1e-12)


def test_masks_match_reference():
    q, k, v = random_qkv(2, 2, 6, 4, seed=2)
    g = torch.Generator().manual_seed(3)
    allowed = torch.rand(2, 1, 6, 6, generator=g) < 0.6
    allowed[:, :, 2] = False  # a fully masked row
    coeffs = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    ref = polynomial_reference(dense_attention_reference(q, k, allowed=allowed), v, coeffs)
    for backend in ("sdpa", "matrix"):
        out = diffuse(q, k, v, coeffs, attn_mask=allowed, backend=backend)
        assert torch.allclose(out, ref, atol=1e-12)
        assert torch.allclose(out[:, :, 2], 0.5 * v[:, :, 2])  # zero row of P: only c_0 v remains
    additive = torch.zeros(2, 1, 6, 6, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    assert torch.allclose(diffuse(q, k, v, coeffs, attn_mask=additive), ref, atol=1e-12)
    # causal combined with a mask
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    ref_c = polynomial_reference(dense_attention_reference(q, k, allowed=allowed & causal), v, coeffs)
    assert torch.allclose(diffuse(q, k, v, coeffs, attn_mask=allowed, is_causal=True), ref_c, atol=1e-12)


def test_fully_masked_rows_have_finite_gradients():
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 4, 3, seed=4))
    allowed = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    for backend in ("sdpa", "matrix"):
        out = diffuse(q, k, v, torch.tensor([1.0, -1.0, 0.5]), attn_mask=allowed, backend=backend)
        out.sum().backward()
        for t in (q, k, v):
            assert torch.isfinite(t.grad).all()
            t.grad = None


def test_gradcheck_dense_and_sparse():
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 4, 3, seed=5))
    coeffs = torch.tensor([[0.3, -0.4, 0.2], [0.1, 0.6, 0.3]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    for backend in ("sdpa", "matrix"):
        assert torch.autograd.gradcheck(
            lambda a, b, c, d: diffuse(a, b, c, d, attn_mask=mask, backend=backend), (q, k, v, coeffs)
        )
    qn, kn, vn = (t.detach()[0].transpose(0, 1).contiguous().requires_grad_() for t in (q, k, v))
    edges = torch.tensor([[0, 1, 2, 3, 1, 0], [1, 1, 2, 2, 3, 3]])
    assert torch.autograd.gradcheck(lambda a, b, c, d: diffuse_sparse(a, b, c, edges, d), (qn, kn, vn, coeffs))


def test_sparse_matches_dense_on_complete_and_causal_graphs():
    q, k, v = random_qkv(1, 3, 7, 4, seed=6)
    coeffs = torch.tensor([0.2, 0.5, 0.1, 0.2], dtype=torch.float64)
    qn, kn, vn = (t[0].transpose(0, 1) for t in (q, k, v))
    for edge_index, is_causal in ((complete_edge_index(7), False), (causal_edge_index(7), True)):
        dense = diffuse(q, k, v, coeffs, is_causal=is_causal)[0].transpose(0, 1)
        assert torch.allclose(diffuse_sparse(qn, kn, vn, edge_index, coeffs), dense, atol=1e-12)


def test_sparse_node_without_in_edges_gets_zero_row():
    q, k, v = (t[0].transpose(0, 1) for t in random_qkv(1, 1, 3, 2, seed=7))
    edges = torch.tensor([[0, 1], [1, 1]])  # nodes 0 and 2 have no incoming edge
    out = diffuse_sparse(q, k, v, edges, torch.tensor([1.0, -1.0]))
    assert torch.allclose(out[0], v[0]) and torch.allclose(out[2], v[2])
    assert torch.allclose(propagate_sparse(edge_attention(q, k, edges), v, edges)[2], torch.zeros_like(v[2]))


def test_sparse_weights_match_pyg_transformerconv_softmax():
    q, k, _ = (t[0].transpose(0, 1) for t in random_qkv(1, 2, 6, 4, seed=8))
    edges = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 2], [1, 1, 1, 4, 4, 0, 0, 5]])
    w = edge_attention(q, k, edges)
    scores = (q[edges[1]] * k[edges[0]]).sum(-1) / 2.0
    assert torch.allclose(w, pyg_softmax(scores, edges[1], num_nodes=6), atol=1e-12)


def test_half_precision_inputs():
    q, k, v = random_qkv(1, 2, 16, 8, dtype=torch.float32, seed=9)
    ref = diffuse(q, k, v, torch.tensor([0.3, 0.3, 0.4]))
    out = diffuse(q.bfloat16(), k.bfloat16(), v.bfloat16(), torch.tensor([0.3, 0.3, 0.4]))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert (out.float() - ref).abs().max() < 0.05


def test_auto_backend_rule():
    assert choose_dense_backend(4096, 4096, 1) == "sdpa"
    assert choose_dense_backend(32, 32, 3) == "matrix"
    assert choose_dense_backend(2048, 2048, 3) == "sdpa"


BAD_CALLS = [
    ("q must have shape", lambda q, k, v: diffuse(q[0], k, v, torch.tensor([0.0, 1.0]))),
    ("q and k must share", lambda q, k, v: diffuse(q, k[:, :1], v, torch.tensor([0.0, 1.0]))),
    ("coeffs has 3 rows", lambda q, k, v: diffuse(q, k, v, torch.ones(3, 2))),
    ("coeffs must be real numbers", lambda q, k, v: diffuse(q, k, v, torch.tensor([False, True]))),
    ("coeffs must be finite", lambda q, k, v: diffuse(q, k, v, torch.tensor([0.0, float("nan")]))),
    ("backend must be one of", lambda q, k, v: diffuse(q, k, v, torch.tensor([0.0, 1.0]), backend="flash")),
    ("attn_mask must be broadcastable", lambda q, k, v: diffuse(q, k, v, torch.tensor([0.0, 1.0]), attn_mask=torch.ones(3, 3, dtype=torch.bool))),
    ("attn_mask must be bool", lambda q, k, v: diffuse(q, k, v, torch.tensor([0.0, 1.0]), attn_mask=torch.ones(5, 5, dtype=torch.int64))),
    ("P must be square", lambda q, k, v: diffuse(q, k[:, :, :3], v[:, :, :3], torch.tensor([0.0, 1.0]))),
    ("dropout_p must lie", lambda q, k, v: diffuse(q, k, v, torch.tensor([0.0, 1.0]), dropout_p=1.0)),
    ("every degree must lie", lambda q, k, v: diffuse(q, k, v, torch.tensor([0.0, 1.0]), degrees=[2, 1])),
    ("floating-point", lambda q, k, v: diffuse(q.long(), k, v, torch.tensor([0.0, 1.0]))),
    ("edge_index must have shape", lambda q, k, v: diffuse_sparse(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), torch.zeros(3, 2, dtype=torch.long), torch.tensor([0.0, 1.0]))),
    ("values must lie in", lambda q, k, v: diffuse_sparse(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), torch.tensor([[0], [9]]), torch.tensor([0.0, 1.0]))),
    ("edge_index must be an integer", lambda q, k, v: diffuse_sparse(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), torch.zeros(2, 2), torch.tensor([0.0, 1.0]))),
    ("num_nodes=3 disagrees", lambda q, k, v: diffuse_sparse(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), torch.zeros(2, 2, dtype=torch.long), torch.tensor([0.0, 1.0]), num_nodes=3)),
]


@pytest.mark.parametrize("match,call", BAD_CALLS, ids=[m for m, _ in BAD_CALLS])
def test_bad_inputs_raise_clear_errors(match, call):
    q, k, v = random_qkv(1, 2, 5, 4, dtype=torch.float32)
    with pytest.raises((ValueError, TypeError), match=match):
        call(q, k, v)


def test_numpy_coefficients_and_scale_are_static_numbers():
    """Bug: ``diffuse(q, k, v, [np.float32(1), np.float32(-1)], scale=np.float32(0.5))`` was refused
    ("coeffs given as a sequence must hold numbers", "scale must be a float or None, got float32").
    numpy numbers now give what Python numbers give, checked against the float64 reference
    ``c_0 v + c_1 P v + c_2 P^2 v`` with ``P = softmax(scale q k^T)`` written out here."""
    import numpy as np

    q, k, v = random_qkv(1, 2, 5, 4, seed=11)
    P = torch.softmax(0.5 * q @ k.transpose(-1, -2), dim=-1)
    rows = [[0.5, -1.0, 0.25], [1.0, 0.0, -0.5]]
    want = torch.stack([rows[h][0] * v[0, h] + rows[h][1] * P[0, h] @ v[0, h]
                        + rows[h][2] * P[0, h] @ P[0, h] @ v[0, h] for h in range(2)])
    numpy_rows = [[np.float32(c) for c in r] for r in rows]
    got = diffuse(q, k, v, numpy_rows, scale=np.float32(0.5))
    assert torch.allclose(got[0], want, atol=1e-12, rtol=0)
    shared = diffuse(q, k, v, (np.float64(0.5), np.int64(-1), np.float32(0.25)), scale=np.float64(0.5))
    assert torch.equal(shared, diffuse(q, k, v, [0.5, -1.0, 0.25], scale=0.5))
    qn, kn, vn = (t[0].transpose(0, 1) for t in (q, k, v))
    sparse = diffuse_sparse(qn, kn, vn, complete_edge_index(5), numpy_rows, scale=np.float32(0.5))
    assert torch.allclose(sparse.transpose(0, 1), want, atol=1e-12, rtol=0)
    with pytest.raises(TypeError, match="must hold numbers"):
        diffuse(q, k, v, [np.bool_(True), 1.0])
