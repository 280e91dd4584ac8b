"""Fast paths added for performance, each checked against a reference in float64.

* the CSR sparse kernels (sorted edge layout, chunked SDDMM, CSR SpMM, custom autograd
  functions) against the gather/scatter reference and explicit matrices, incl. gradcheck;
* the dense ``"auto"`` hybrid (fused kernel for ``K <= 1`` heads, materialised ``P`` for
  ``K``-step heads) and the mask fast paths of the materialised ``P``;
* the in-place inference path of mixed attention/Laplacian layers;
* half-precision handling (coefficients and sums in float32).
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.functional import (
    attention_matrix,
    choose_dense_backend,
    dense_attention_reference,
    diffuse,
    diffuse_sparse,
    edge_attention,
    polynomial_reference,
    propagate_sparse,
)
from diffusionformer.ops.csr import EdgeLayout, csr_edge_scores, csr_edge_softmax, csr_propagate, sddmm_heads, spmm_heads
from diffusionformer.ops.dense import diffuse_with_weights
from diffusionformer.ops.sparse import _diffuse_sparse, diffuse_sparse_with_weights
from diffusionformer.testing import dense_allowed_from_edges, random_qkv


def _graph(N: int = 9, E: int = 40, seed: int = 0) -> torch.Tensor:
    """Random edges with duplicates, self-loops and (node N-1) a node without incoming edges."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N - 1, (2, E), generator=g)
    ei = torch.cat([ei, ei[:, :3], torch.tensor([[N - 1, 2], [0, 2]])], dim=1)  # duplicates, self-loop
    return ei


def _nodes(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t[0].transpose(0, 1).contiguous() for t in ts)  # (1, H, N, C) -> (N, H, C)


def test_edge_layout_sorts_by_target_and_roundtrips_edge_order():
    ei = _graph()
    layout = EdgeLayout(ei, 9)
    key = layout.dst * 9 + layout.src
    assert (key[1:] >= key[:-1]).all()
    assert torch.equal(layout.crow, torch.searchsorted(layout.dst, torch.arange(10)))
    w = torch.randn(ei.shape[1], 3, dtype=torch.float64)
    assert torch.equal(layout.to_input_order(layout.from_input_order(w)), w)
    assert torch.equal(layout.from_input_order(ei.t()), torch.stack([layout.src, layout.dst], 1))
    order, col, crow = layout.transposed()
    src_t = layout.src[order]
    assert (src_t[1:] >= src_t[:-1]).all() and torch.equal(col, layout.dst[order])
    assert torch.equal(crow, torch.searchsorted(src_t, torch.arange(10)))
    # an input already sorted by (target, source) is used as is
    sorted_layout = EdgeLayout(torch.stack([layout.src, layout.dst]), 9)
    assert sorted_layout.order is None and torch.equal(sorted_layout.src, layout.src)


def test_sddmm_and_spmm_heads_match_dense_products():
    g = torch.Generator().manual_seed(1)
    ei = _graph(N=12, E=60, seed=1)
    layout = EdgeLayout(ei, 12)
    a, b = torch.randn(3, 12, 4, generator=g, dtype=torch.float64), torch.randn(3, 12, 4, generator=g, dtype=torch.float64)
    dst, src = layout.dst.long(), layout.src.long()
    ref = (a[:, dst] * b[:, src]).sum(-1)  # (H, E), duplicates included
    assert torch.allclose(sddmm_heads(layout.crow, layout.src, a, b), ref, atol=1e-12)
    w = torch.rand(3, dst.shape[0], generator=g, dtype=torch.float64)
    dense = torch.zeros(3, 12, 12, dtype=torch.float64).index_put_((torch.arange(3)[:, None], dst, src), w, accumulate=True)
    assert torch.allclose(spmm_heads(layout.crow, layout.src, w, b, 12), dense @ b, atol=1e-12)
    empty = EdgeLayout(torch.zeros(2, 0, dtype=torch.long), 12)
    assert sddmm_heads(empty.crow, empty.src, a, b).shape == (3, 0)
    assert (spmm_heads(empty.crow, empty.src, w[:, :0], b, 12) == 0).all()


@pytest.mark.parametrize("sorted_input", [False, True])
def test_csr_kernels_match_the_gather_scatter_reference(sorted_input):
    q, k, v = _nodes(*random_qkv(1, 3, 9, 4, seed=2))
    ei = _graph(seed=3)
    if sorted_input:
        layout = EdgeLayout(ei, 9)
        ei = torch.stack([layout.src, layout.dst])
    w_csr = edge_attention(q, k, ei, backend="csr")
    w_ref = edge_attention(q, k, ei, backend="native")
    assert torch.allclose(w_csr, w_ref, atol=1e-12)
    assert torch.allclose(propagate_sparse(w_ref, v, ei, backend="csr"), propagate_sparse(w_ref, v, ei, backend="native"), atol=1e-12)
    coeffs = torch.tensor([[0.2, 0.5, 0.3], [1.0, -1.0, 0.0], [0.1, 0.2, 0.7]], dtype=torch.float64)
    for degrees in (None, [2, 1, 2], [0, 2, 1], [2, 0, 2]):
        a = diffuse_sparse(q, k, v, ei, coeffs, degrees=degrees, backend="csr")
        b = diffuse_sparse(q, k, v, ei, coeffs, degrees=degrees, backend="native")
        assert torch.allclose(a, b, atol=1e-12), degrees


def test_csr_diffusion_matches_explicit_matrices():
    q, k, v = _nodes(*random_qkv(1, 2, 9, 4, seed=4))
    ei = torch.unique(_graph(seed=5), dim=1)  # a simple graph, so P is an ordinary matrix
    allowed = dense_allowed_from_edges(ei, 9)
    P = dense_attention_reference(q.transpose(0, 1), k.transpose(0, 1), allowed=allowed)  # (H, N, N)
    coeffs = torch.tensor([0.3, 0.3, 0.2, 0.2], dtype=torch.float64)
    ref = polynomial_reference(P, v.transpose(0, 1), coeffs).transpose(0, 1)
    assert torch.allclose(diffuse_sparse(q, k, v, ei, coeffs), ref, atol=1e-12)
    assert torch.allclose(diffuse_sparse(q, k, v, ei, coeffs)[8], 0.3 * v[8])  # no in-edge: zero row of P


def test_csr_autograd_functions_gradcheck():
    q, k, v = (t[0].requires_grad_() for t in random_qkv(1, 2, 6, 3, seed=6))  # head-major (H, N, C)
    ei = _graph(N=6, E=14, seed=7)
    layout = EdgeLayout(ei, 6)
    assert torch.autograd.gradcheck(lambda a, b: csr_edge_scores(a, b, layout, 0.7), (q, k))
    s = torch.randn(2, ei.shape[1], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: csr_edge_softmax(x, layout), (s,))
    w = torch.rand(2, ei.shape[1], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: csr_propagate(a, b, layout), (w, v))


def test_csr_diffusion_gradcheck_with_degrees_and_dropout_free_path():
    q, k, v = (t.requires_grad_() for t in _nodes(*random_qkv(1, 3, 6, 2, seed=8)))
    ei = _graph(N=6, E=12, seed=9)
    coeffs = torch.tensor([[0.3, -0.4, 0.2], [0.1, 0.6, 0.3], [1.0, -1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c, d: diffuse_sparse(a, b, c, ei, d, degrees=[2, 2, 1], backend="csr"), (q, k, v, coeffs), fast_mode=True
    )


def test_edge_mask_equals_filtering_the_edges():
    q, k, v = (t.requires_grad_() for t in _nodes(*random_qkv(1, 2, 8, 3, seed=10)))
    ei = _graph(N=8, E=30, seed=11)
    keep = ei[0] <= ei[1]
    coeffs = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    for backend in ("csr", "native"):
        # the unchecked internal with an edge mask (the CUDA path of is_causal) against filtering the edges
        masked, w = _diffuse_sparse(q, k, v, ei, coeffs.expand(2, -1), 8, 3 ** -0.5, (2, 2), 0.0, backend, True, edge_mask=keep)
        filtered, w_f = diffuse_sparse_with_weights(q, k, v, ei[:, keep], coeffs, backend=backend)
        assert torch.allclose(masked, filtered, atol=1e-12)
        assert torch.allclose(w[keep], w_f, atol=1e-12) and (w[~keep] == 0).all()
        # the public is_causal (filtering on CPU) gives the same output and weights 0 on the dropped edges
        causal, w_c = diffuse_sparse_with_weights(q, k, v, ei, coeffs, backend=backend, is_causal=True)
        assert torch.allclose(causal, filtered, atol=1e-12) and torch.allclose(w_c, w, atol=1e-12)
        g1 = torch.autograd.grad(masked.sum(), (q, k, v))
        g2 = torch.autograd.grad(filtered.sum(), (q, k, v))
        assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(g1, g2))


def test_sparse_half_precision_is_computed_in_float32():
    q, k, v = _nodes(*random_qkv(1, 2, 16, 8, dtype=torch.float32, seed=12))
    ei = _graph(N=16, E=60, seed=13)
    coeffs = torch.tensor([0.3, 0.3, 0.4])
    ref = diffuse_sparse(q, k, v, ei, coeffs)
    out = diffuse_sparse(q.bfloat16(), k.bfloat16(), v.bfloat16(), ei, coeffs)
    assert out.dtype == torch.bfloat16 and (out.float() - ref).abs().max() < 0.05


def test_sparse_layer_memory_light_backward_matches_native():
    torch.manual_seed(0)
    layer = DiffusionAttention(12, 3, "attention:1,heat(t=0.7, steps=3):1,laplacian:1").double()
    x = torch.randn(10, 12, dtype=torch.float64, requires_grad=True)
    ei = _graph(N=10, E=35, seed=14)
    y = layer(x, edge_index=ei)
    (gx,) = torch.autograd.grad(y.square().sum(), x)
    q, k, v = layer._project(x.detach().requires_grad_())
    ref = diffuse_sparse(q, k, v, ei, layer._coefficients(), degrees=layer._degrees, backend="native")
    assert torch.allclose(y, layer.out_proj(ref.reshape(10, 12)), atol=1e-12)
    xr = x.detach().clone().requires_grad_()
    q, k, v = layer._project(xr)
    yr = layer.out_proj(diffuse_sparse(q, k, v, ei, layer._coefficients(), degrees=layer._degrees, backend="native").reshape(10, 12))
    (gr,) = torch.autograd.grad(yr.square().sum(), xr)
    assert torch.allclose(gx, gr, atol=1e-10)


# ---------------------------------------------------------------------------- dense
def test_materialised_matrix_masks_match_reference():
    q, k, _ = random_qkv(2, 2, 6, 4, seed=15)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.allclose(attention_matrix(q, k, is_causal=True), dense_attention_reference(q, k, allowed=causal), atol=1e-12)
    allowed = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(0)) < 0.5
    allowed[:, :, 3] = False
    ref = dense_attention_reference(q, k, allowed=allowed & causal)
    assert torch.allclose(attention_matrix(q, k, attn_mask=allowed, is_causal=True), ref, atol=1e-12)
    additive = torch.zeros(6, 6, dtype=torch.float64).masked_fill(~causal, float("-inf"))
    assert torch.allclose(attention_matrix(q, k, attn_mask=additive), attention_matrix(q, k, is_causal=True), atol=1e-12)


@pytest.mark.parametrize("is_causal", [False, True])
def test_auto_hybrid_keeps_fused_heads_and_matches_reference(is_causal):
    q, k, v = random_qkv(2, 5, 7, 3, seed=16)
    coeffs = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.2, 0.3, 0.3, 0.2], [1.0, -1.0, 0.0, 0.0],
                           [0.1, 0.2, 0.7, 0.0], [0.5, 0.0, 0.0, 0.0]], dtype=torch.float64)
    degrees = [1, 3, 1, 2, 0]  # fused heads 0 and 2, K-step heads 1 and 3 (not consecutive), identity head 4
    assert choose_dense_backend(7, 7, 3, is_causal=is_causal) == "matrix"
    causal = torch.ones(7, 7, dtype=torch.bool).tril() if is_causal else None
    ref = polynomial_reference(dense_attention_reference(q, k, allowed=causal), v, coeffs)
    for backend in ("auto", "sdpa", "matrix"):
        assert torch.allclose(diffuse(q, k, v, coeffs, is_causal=is_causal, backend=backend, degrees=degrees), ref, atol=1e-12)
    qg, kg, vg, cg = (t.clone().requires_grad_() for t in (q[:1, :, :4], k[:1, :, :4], v[:1, :, :4], coeffs))
    assert torch.autograd.gradcheck(
        lambda a, b, c, d: diffuse(a, b, c, d, is_causal=is_causal, degrees=degrees), (qg, kg, vg, cg), fast_mode=True
    )


def test_auto_rule_is_monotone():
    for causal in (False, True):
        for K in range(2, 12):
            picks = [choose_dense_backend(N, N, K, is_causal=causal) for N in (16, 64, 256, 1024, 4096)]
            assert picks == sorted(picks), picks  # "matrix" for small N, then "sdpa"
            assert picks[-1] == "sdpa"
            for N in (64, 256, 512):  # more steps never switch matrix -> sdpa; causal never favours matrix more
                assert choose_dense_backend(N, N, K + 1, is_causal=causal) <= choose_dense_backend(N, N, K, is_causal=causal)
                assert choose_dense_backend(N, N, K, is_causal=True) >= choose_dense_backend(N, N, K)
    assert all(choose_dense_backend(16, 16, 1, is_causal=c) == "sdpa" for c in (False, True))


def test_cuda_rule_materialises_only_long_sequences_with_many_steps():
    """On CUDA short sequences are launch-bound (fused wins); long ones favour one softmax + K matmuls."""
    from diffusionformer.ops.dense import CUDA_MATERIALISE_ELEMENTS

    low, high = CUDA_MATERIALISE_ELEMENTS
    for causal in (False, True):
        for N in (16, 64, 256, 512):
            assert choose_dense_backend(N, N, 8, is_causal=causal, device_type="cuda") == "sdpa"
        for N in (1024, 1536, 2048):
            assert choose_dense_backend(N, N, 1, is_causal=causal, device_type="cuda") == "sdpa"
            assert choose_dense_backend(N, N, 3, is_causal=causal, device_type="cuda") == "sdpa"
            assert choose_dense_backend(N, N, 4, is_causal=causal, device_type="cuda") == "matrix"
        assert choose_dense_backend(4096, 4096, 8, is_causal=causal, device_type="cuda") == "sdpa"  # beyond: O(N) memory
    assert (low, high) == (1024 * 1024, 2048 * 2048)
    assert choose_dense_backend(1024, 1024, 4) == "sdpa"  # the CPU rule is unchanged


def test_dense_half_precision_sums_in_float32():
    q, k, v = random_qkv(1, 2, 16, 8, dtype=torch.float32, seed=17)
    coeffs = torch.tensor([0.3, 0.3, 0.4])
    ref = diffuse(q, k, v, coeffs)
    for backend in ("sdpa", "matrix"):
        out, P = diffuse_with_weights(q.half(), k.half(), v.half(), coeffs, backend=backend, need_weights=backend == "matrix")
        assert out.dtype == torch.float16 and (out.float() - ref).abs().max() < 0.02
        if P is not None:
            assert P.dtype == torch.float16


# ---------------------------------------------------------------------------- layer
@pytest.mark.parametrize("heads", ["attention:2,laplacian:2", "laplacian:1,attention:2,laplacian:1", "ppr(alpha=0.3, steps=1):2,attention:2"])
def test_inplace_inference_path_equals_training_path(heads):
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, heads, causal=True).double()
    assert layer._static_coefficients is not None and layer.max_degree == 1
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    with torch.no_grad():
        inference = layer(x)
    training = layer(x.requires_grad_())
    assert training.requires_grad
    assert torch.allclose(inference, training, atol=1e-12)
    q, k, v = (t.transpose(1, 2) for t in layer._project(x.detach()))
    ref = diffuse(q, k, v, layer._coefficients(), is_causal=True, backend="matrix")
    assert torch.allclose(inference, layer.out_proj(ref.transpose(1, 2).reshape(3, 6, 16)), atol=1e-12)


def test_half_precision_fused_layer_combines_accurately():
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, "ppr(alpha=0.1, steps=1):2,attention:2")
    x = torch.randn(2, 5, 16)
    ref = layer(x)
    half = layer.to(torch.bfloat16)
    out = half(x.bfloat16().requires_grad_())
    assert out.dtype == torch.bfloat16 and (out.float() - ref).abs().max() < 0.1
    with torch.no_grad():
        assert (half(x.bfloat16()).float() - ref).abs().max() < 0.1


def test_affine_heads_function_gradcheck_and_layer_gradients():
    from diffusionformer.ops.engine import AffineHeads

    g = torch.Generator().manual_seed(3)
    y = torch.randn(2, 3, 5, 2, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, 5, 2, generator=g, dtype=torch.float64, requires_grad=True)
    runs = ((1, 2, 1.0, -1.0), (3, 5, 0.3, 0.7))
    assert torch.autograd.gradcheck(lambda a, b: AffineHeads.apply(a, b, runs), (y, v))
    torch.manual_seed(0)
    layer = DiffusionAttention(12, 3, "laplacian:1,attention:1,ppr(alpha=0.3, steps=1):1", causal=True).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(layer(x).square().sum(), x)
    layer.backend = "matrix"  # the general (non-fused) path as the reference
    (gr,) = torch.autograd.grad(layer(x).square().sum(), x)
    assert torch.allclose(gx, gr, atol=1e-10)


@pytest.mark.parametrize("heads", [None, "attention:1,laplacian:2", "ppr(alpha=0.3, steps=1):1,attention:2"])
def test_sparse_fused_layer_path_matches_reference(heads):
    torch.manual_seed(0)
    layer = DiffusionAttention(12, 3, heads).double()
    assert layer._static_coefficients is not None and layer.max_degree == 1
    x = torch.randn(10, 12, dtype=torch.float64)
    ei = _graph(N=10, E=35, seed=15)
    with torch.no_grad():
        inference = layer(x, edge_index=ei)
    training = layer(x.requires_grad_(), edge_index=ei)
    q, k, v = layer._project(x.detach())
    ref = diffuse_sparse(q, k, v, ei, layer._coefficients(), backend="native")
    ref = layer.out_proj(ref.reshape(10, 12))
    assert torch.allclose(inference, ref, atol=1e-12) and torch.allclose(training, ref, atol=1e-12)
    # static coefficients (the affine pass) against the general loop, on both sparse back-ends
    for backend in ("csr", "native"):
        for c in ([0.0, 1.0], [[0.0, 1.0], [1.0, -1.0], [0.3, 0.7]]):
            static = diffuse_sparse(q, k, v, ei, c, backend=backend)
            loop = diffuse_sparse(q, k, v, ei, torch.tensor(c, dtype=torch.float64), backend=backend)
            assert torch.allclose(static, loop, atol=1e-12)


def test_csr_softmax_all_masked_target_is_zero_not_nan():
    layout = EdgeLayout(torch.tensor([[0, 1, 2, 0], [1, 1, 0, 2]]), 3)  # sorted: (2->0), (0->1), (1->1), (0->2)
    scores = torch.tensor([[float("-inf"), 0.0, 0.0, 1.0]], requires_grad=True)
    alpha = csr_edge_softmax(scores, layout)
    assert torch.equal(alpha.detach(), torch.tensor([[0.0, 0.5, 0.5, 1.0]]))
    alpha.sum().backward()
    assert torch.isfinite(scores.grad).all()


def test_addmm_with_csr_ignores_the_output_when_beta_is_zero():
    # spmm_heads relies on it (it writes into uninitialised memory on CPU)
    layout = EdgeLayout(_graph(N=6, E=12, seed=16), 6)
    w = torch.rand(layout.num_edges, dtype=torch.float64)
    A = torch.sparse_csr_tensor(layout.crow, layout.src, w, (6, 6), check_invariants=False)
    x = torch.randn(6, 3, dtype=torch.float64)
    out = torch.full((6, 3), float("nan"), dtype=torch.float64)
    torch.addmm(out, A, x, beta=0.0, out=out)
    assert torch.allclose(out, A.to_dense() @ x, atol=1e-12)
