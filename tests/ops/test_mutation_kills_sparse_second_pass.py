"""Tests written in a second mutation-testing audit of the sparse (edge-list / CSR) back-end
(``ops/sparse.py``, ``ops/csr.py``, ``ops/scatter.py``, ``ops/uniform_map.py``).

A first audit (``tests/core/test_mutation_kills_engine_sparse.py``, ``tests/core/test_mutation_kills_ops.py``,
``tests/ops/test_mutation_kills_engine_second_pass.py``) covered these modules already; this pass looked again
at the edge cases of a graph given as an edge list: edges in no particular order (a permutation that is not its
own inverse), int32 indices, nodes without in-edges, duplicate edges and self loops, an empty edge list, a batch
of disjoint graphs, very large scores, the dtype of every result (float16, bfloat16, float64 under autocast) and
the refusal of bad arguments (backend names, a list for ``edge_index``, ``num_nodes=True``).

Each test kills a mutant of the library code that the rest of the suite let through (its docstring names it:
file and mutation) and checks the code against an independent reference: edge-softmax matrices built entry by
entry in float64 from the edge list (duplicates counted with multiplicity, a zero row for a node without
in-edges), their explicit powers, ``torch.linalg.matrix_exp`` for the heat kernel and ``torch.linalg.solve`` for
personalised PageRank on that dense equivalent, PyG's ``softmax``, ``torch.autograd.gradcheck`` in float64,
hand-written values and the documented contract (bad input gets a clear ``ValueError``/``TypeError`` naming the
argument). Mutants judged equivalent are listed, with the reason, at the end of the file. No library defect was
found. CPU only, deterministic (seeded generators), tiny sizes.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from torch_geometric.utils import softmax as pyg_softmax

from diffusionformer.functional import diffuse_sparse, edge_attention, propagate_sparse
from diffusionformer.operators import heat_coefficients
from diffusionformer.operators.ppr import ppr_coefficients
from diffusionformer.ops.csr import EdgeLayout, csr_edge_softmax
from diffusionformer.ops.scatter import scatter_max, scatter_sum, segment_softmax
from diffusionformer.ops.sparse import diffuse_sparse_with_weights
from diffusionformer.ops.uniform_map import uniform_mean

f64 = torch.float64
BACKENDS = ("csr", "native")


# ---------------------------------------------------------------------------- independent references
def _nodes(N: int = 6, H: int = 2, C: int = 3, seed: int = 0, dtype: torch.dtype = f64) -> tuple[Tensor, Tensor, Tensor]:
    """Node-major ``(N, H, C)`` queries, keys and values."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(N, H, C, generator=g, dtype=f64).to(dtype) for _ in range(3))  # type: ignore[return-value]


def _graph() -> Tensor:
    """Six nodes, edges in no order whose sorting permutation has a 3-cycle (not an involution): a self loop
    (2 -> 2), a duplicate edge (0 -> 1 twice) and node 5 without in-edges."""
    return torch.tensor([[3, 0, 2, 4, 0, 1, 5, 2, 0],
                         [4, 1, 2, 0, 1, 3, 3, 0, 2]])


def _explicit_P(q: Tensor, k: Tensor, ei: Tensor, N: int) -> Tensor:
    """The edge softmax as an explicit float64 ``(H, N, N)`` matrix, built entry by entry from the edge list: row ``i``
    is the softmax of ``q_i . k_j / sqrt(C)`` over ``i``'s in-edges (a duplicate edge counted twice), 0 without any."""
    H, C = q.shape[1], q.shape[2]
    P = torch.zeros(H, N, N, dtype=f64)
    pairs = [(int(j), int(i)) for j, i in zip(ei[0], ei[1])]
    for h in range(H):
        for i in range(N):
            srcs = [j for j, t in pairs if t == i]
            if not srcs:
                continue
            s = [float(q[i, h].double() @ k[j, h].double()) / math.sqrt(C) for j in srcs]
            top = max(s)
            e = [math.exp(x - top) for x in s]
            for j, w in zip(srcs, e):
                P[h, i, j] += w / sum(e)
    return P


def _edge_weights(P: Tensor, ei: Tensor) -> Tensor:
    """``(E, H)`` weight of every edge of the list (a duplicate edge shares its entry's mass equally)."""
    counts: dict[tuple[int, int], int] = {}
    for j, i in zip(ei[0].tolist(), ei[1].tolist()):
        counts[(j, i)] = counts.get((j, i), 0) + 1
    return torch.stack([P[:, i, j] / counts[(j, i)] for j, i in zip(ei[0].tolist(), ei[1].tolist())])


def _apply(P: Tensor, v: Tensor) -> Tensor:
    """``P_h v_h`` for node-major ``v`` ``(N, H, C)``."""
    return (P @ v.transpose(0, 1)).transpose(0, 1)


# ---------------------------------------------------------------------------- sparse: arguments
def test_unknown_sparse_backend_names_are_refused():
    """kills: sparse._use_csr returning True for a name it does not know (the ``raise ValueError`` replaced by
    ``return True``: a misspelt backend silently ran the CSR path)"""
    q, k, v = _nodes(N=3, seed=1)
    ei = torch.tensor([[0, 1], [1, 2]])
    match = r"sparse backend must be one of \('auto', 'csr', 'native', 'torch_scatter'\), got 'cuda'"
    with pytest.raises(ValueError, match=match):
        edge_attention(q, k, ei, backend="cuda")
    with pytest.raises(ValueError, match=match):
        propagate_sparse(torch.ones(2, 2, dtype=f64), v, ei, backend="cuda")
    with pytest.raises(ValueError, match=match):
        diffuse_sparse(q, k, v, ei, [0.5, 0.5], backend="cuda")


def test_edge_index_given_as_a_list_is_refused_with_a_type_error():
    """kills: sparse.check_edge_index without its ``isinstance(edge_index, Tensor)`` test (a nested list then fails
    with an AttributeError on ``.dim()`` that names no argument)"""
    q, k, v = _nodes(N=3, seed=2)
    with pytest.raises(TypeError, match=r"edge_index must be a LongTensor of shape \(2, E\), got list"):
        edge_attention(q, k, [[0, 1], [1, 2]])
    with pytest.raises(TypeError, match=r"edge_index must be a LongTensor of shape \(2, E\), got list"):
        diffuse_sparse(q, k, v, [[0, 1], [1, 2]], [0.5, 0.5])


def test_num_nodes_bool_and_mismatch_errors():
    """kills: sparse._check_num_nodes accepting a bool (``or isinstance(num_nodes, bool)`` dropped: ``True`` passes as
    N = 1) and raising a TypeError instead of the ValueError for a count that disagrees with the tensors"""
    q, k, v = _nodes(N=1, seed=3)
    ei = torch.tensor([[0], [0]])
    with pytest.raises(TypeError, match="num_nodes must be an int or None, got bool"):
        edge_attention(q, k, ei, num_nodes=True)
    with pytest.raises(TypeError, match="num_nodes must be an int or None, got bool"):
        propagate_sparse(torch.ones(1, 2, dtype=f64), v, ei, num_nodes=True)
    with pytest.raises(ValueError, match="num_nodes=2 disagrees with q, which has N=1 rows"):
        diffuse_sparse(q, k, v, ei, [0.5, 0.5], num_nodes=2)
    with pytest.raises(ValueError, match="num_nodes=2 disagrees with x, which has N=1 rows"):
        propagate_sparse(torch.ones(1, 2, dtype=f64), v, ei, num_nodes=2)



@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_edge_index_is_refused_by_edge_attention_and_propagate_sparse(backend, index_dtype):
    """kills: sparse.edge_attention and sparse.propagate_sparse not validating ``edge_index`` (``check_edge_index``
    replaced by ``.long()``): an index equal to N, or a negative one, then fails inside the gather ("index out of
    range in self") or wraps around, naming neither ``edge_index`` nor ``num_nodes``"""
    q, k, v = _nodes(N=3, seed=12)
    w = torch.ones(2, 2, dtype=f64)
    for bad, lo, hi in (([[0, 3], [1, 1]], 0, 3), ([[0, 1], [-1, 2]], -1, 2)):
        ei = torch.tensor(bad, dtype=index_dtype)
        match = rf"edge_index values must lie in \[0, num_nodes=3\), got range \[{lo}, {hi}\]"
        with pytest.raises(ValueError, match=match):
            edge_attention(q, k, ei, backend=backend)
        with pytest.raises(ValueError, match=match):
            propagate_sparse(w, v, ei, backend=backend)

# ---------------------------------------------------------------------------- sparse: dtypes of the results
def test_propagate_sparse_returns_the_dtype_of_x():
    """kills: sparse.propagate_sparse returning the float32 working dtype for bfloat16 ``x`` on the CSR path
    (``.to(x.dtype)`` dropped), and sparse._native_propagate not casting the weights to ``x``'s dtype (float64
    weights then promote a float32 signal to float64)"""
    ei = _graph()
    g = torch.Generator().manual_seed(4)
    w = torch.rand(ei.shape[1], 2, generator=g, dtype=f64)
    x = torch.randn(6, 2, 3, generator=g, dtype=f64)
    P = torch.zeros(2, 6, 6, dtype=f64)
    for e, (j, i) in enumerate(zip(ei[0].tolist(), ei[1].tolist())):
        P[:, i, j] += w[e]
    want = _apply(P, x)
    for backend in BACKENDS:
        torch.testing.assert_close(propagate_sparse(w, x, ei, backend=backend), want, atol=1e-12, rtol=0)
        out32 = propagate_sparse(w, x.float(), ei, backend=backend)
        assert out32.dtype == torch.float32, backend
        torch.testing.assert_close(out32.double(), want, atol=1e-5, rtol=0)
        out16 = propagate_sparse(w.float(), x.bfloat16(), ei, backend=backend)
        assert out16.dtype == torch.bfloat16, backend
        assert (out16.double() - want).abs().max() < 0.05


def test_edge_weights_are_none_without_need_weights_and_in_the_input_dtype():
    """kills: sparse._diffuse_sparse computing the weights whatever ``need_weights`` (``if need_weights else None``
    dropped: ``need_weights=False`` then returns them) and returning the CSR path's float32 weights for bfloat16
    inputs (``.to(dtype)`` dropped)"""
    q, k, v = _nodes(seed=5)
    ei = _graph()
    for backend in BACKENDS:
        out, w = diffuse_sparse_with_weights(q, k, v, ei, [0.0, 1.0], backend=backend, need_weights=False)
        assert w is None
        torch.testing.assert_close(out, _apply(_explicit_P(q, k, ei, 6), v), atol=1e-12, rtol=0)
        qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
        _, wb = diffuse_sparse_with_weights(qb, kb, vb, ei, [0.0, 1.0], backend=backend)
        assert wb.dtype == torch.bfloat16, backend
        assert (wb.double() - _edge_weights(_explicit_P(qb, kb, ei, 6), ei)).abs().max() < 2**-7


# ---------------------------------------------------------------------------- sparse: graph edge cases
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_unsorted_graph_with_loops_duplicates_and_isolated_node_matches_explicit_matrix(backend, index_dtype):
    """Edge list in no order (3-cycle permutation), self loop, duplicate edge, node without in-edges, int64 and int32
    indices: weights, one step and the heat / PPR series against matrix_exp / solve of the explicit dense P.
    kills (also killed elsewhere; here by a non-involutive sorting permutation and int32 indices): csr.EdgeLayout's
    to_input_order / from_input_order applying the inverse permutation, the sort key without its source term,
    sparse.propagate_sparse not reordering the weights, CsrBackend.weights not restoring the input order,
    _native_edge_attention normalising over sources, and check_edge_index refusing int32"""
    q, k, v = _nodes(seed=6)
    ei = _graph().to(index_dtype)
    P = _explicit_P(q, k, ei, 6)
    assert torch.equal(P[:, 5].sum(-1), torch.zeros(2, dtype=f64))  # node 5 has no in-edges
    torch.testing.assert_close(edge_attention(q, k, ei, backend=backend), _edge_weights(P, ei), atol=1e-12, rtol=0)
    w = _edge_weights(P, ei)
    torch.testing.assert_close(propagate_sparse(w, v, ei, backend=backend), _apply(P, v), atol=1e-12, rtol=0)
    t, alpha, K = 0.8, 0.3, 60
    coeffs = torch.stack([heat_coefficients(torch.tensor(t, dtype=f64), K), ppr_coefficients(torch.tensor(alpha, dtype=f64), K)])
    eye = torch.eye(6, dtype=f64)
    want = torch.stack([torch.linalg.matrix_exp(-t * (eye - P[0])) @ v[:, 0],
                        alpha * torch.linalg.solve(eye - (1 - alpha) * P[1], v[:, 1])], dim=1)
    out, weights = diffuse_sparse_with_weights(q, k, v, ei, coeffs, backend=backend)
    torch.testing.assert_close(out, want, atol=1e-9, rtol=0)
    torch.testing.assert_close(out[5], coeffs[:, 0, None] * v[5], atol=1e-12, rtol=0)  # heat: e^{-t} v, PPR: alpha v
    torch.testing.assert_close(weights, w, atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_edge_list_and_batch_of_disjoint_graphs(backend):
    """An empty edge list gives zero weights of shape (0, H) and ``c_0 v``; a batch of two disjoint graphs (the second
    shifted by its node offset, edges interleaved) gives each graph's own result. kills (also killed elsewhere):
    csr._row_pointers with ``right=True`` (every row takes its successor's edges), _native_edge_attention scoring
    ``q_j . k_i`` instead of ``q_i . k_j``, scatter_sum starting from ``new_empty``"""
    q, k, v = _nodes(N=7, seed=7)
    empty = torch.zeros(2, 0, dtype=torch.long)
    assert edge_attention(q, k, empty, backend=backend).shape == (0, 2)
    out, w = diffuse_sparse_with_weights(q, k, v, empty, torch.tensor([0.5, 1.0, 2.0], dtype=f64), backend=backend)
    assert w.shape == (0, 2)
    torch.testing.assert_close(out, 0.5 * v, atol=0, rtol=0)
    a = torch.tensor([[1, 2, 0, 2], [0, 0, 1, 2]])  # nodes 0..2
    b = torch.tensor([[1, 3, 0, 0], [0, 1, 3, 2]])  # nodes 0..3, the second graph
    batch = torch.cat([a[:, :2], b[:, :2] + 3, a[:, 2:], b[:, 2:] + 3], dim=1)
    coeffs = torch.tensor([0.2, 0.5, 0.3], dtype=f64)
    got = diffuse_sparse(q, k, v, batch, coeffs, backend=backend)
    for ei, sl in ((a, slice(0, 3)), (b, slice(3, 7))):
        P = _explicit_P(q[sl], k[sl], ei, sl.stop - sl.start)
        want = 0.2 * v[sl] + 0.5 * _apply(P, v[sl]) + 0.3 * _apply(P @ P, v[sl])
        torch.testing.assert_close(got[sl], want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_on_an_unsorted_int32_graph_with_duplicates(backend):
    """gradcheck in float64 of the sparse diffusion (q, k, v and coefficients) on the unsorted int32 graph with a
    self loop, a duplicate edge and a node without in-edges. kills (also killed elsewhere): csr._EdgeScores.backward
    taking ``q`` for ``k`` in ``dq`` or not reordering ``g`` for ``dk``, and _Propagate.backward not reordering ``w``
    for ``dx`` (the sorting permutation here is not an involution)"""
    q, k, v = (t.requires_grad_() for t in _nodes(seed=8))
    ei = _graph().to(torch.int32)
    c = torch.tensor([[0.3, -0.4, 0.2], [0.1, 0.6, 0.3]], dtype=f64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, x, d: diffuse_sparse(a, b, x, ei, d, backend=backend), (q, k, v, c))


# ---------------------------------------------------------------------------- csr kernels
def test_csr_edge_softmax_of_large_scores_subtracts_the_row_maximum():
    """kills: csr._EdgeSoftmax.forward exponentiating the raw scores (``scores - m`` dropped): scores of 1000
    overflow ``exp`` to inf and the weights become NaN. Reference: PyG's softmax and hand-computed values."""
    layout = EdgeLayout(torch.tensor([[0, 1, 2, 0], [1, 1, 1, 2]]), 3)  # sorted; node 0 has no in-edges
    scores = torch.tensor([[1000.0, 999.0, 998.0, 800.0], [-800.0, -801.0, -800.0, 3.0]], dtype=f64)
    got = csr_edge_softmax(scores, layout)
    want = pyg_softmax(scores.t(), layout.dst.long(), num_nodes=3).t()
    torch.testing.assert_close(got, want, atol=1e-15, rtol=0)
    z = 1 + math.exp(-1) + math.exp(-2)
    torch.testing.assert_close(got[0], torch.tensor([1 / z, math.exp(-1) / z, math.exp(-2) / z, 1.0], dtype=f64))


def test_edge_layout_uses_32_bit_indices_when_they_fit():
    """kills: csr.EdgeLayout always using int64 indices (the documented ``index_dtype``: int32 when ``N`` and ``E``
    fit, also for ``src``, ``dst`` and ``crow``); and checks the sorted layout of an unsorted int32 edge list"""
    layout = EdgeLayout(_graph().to(torch.int32), 6)
    assert layout.index_dtype == torch.int32
    assert layout.src.dtype == layout.dst.dtype == layout.crow.dtype == torch.int32
    assert layout.dst.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4]
    assert layout.src.tolist() == [2, 4, 0, 0, 0, 2, 1, 5, 3]
    assert layout.crow.tolist() == [0, 2, 4, 6, 8, 9, 9]
    assert layout.order.tolist() == [7, 3, 1, 4, 8, 2, 5, 6, 0]


# ---------------------------------------------------------------------------- scatter
def test_scatter_backend_names_are_refused():
    """kills: scatter._use_torch_scatter returning False for a name it does not know (the ``raise ValueError``
    replaced by ``return False``: a misspelt backend silently ran the native kernels)"""
    src, index = torch.ones(2), torch.tensor([0, 1])
    for fn in (scatter_sum, scatter_max, segment_softmax):
        with pytest.raises(ValueError, match="scatter backend must be 'auto', 'native' or 'torch_scatter', got 'cuda'"):
            fn(src, index, 2, backend="cuda")


@pytest.mark.parametrize("fn", [scatter_sum, scatter_max, segment_softmax], ids=lambda f: f.__name__)
def test_scatter_primitives_take_int32_indices(fn):
    """kills: scatter._check_index refusing int32 indices (only int64 accepted), and scatter.scatter_max not
    widening the index to int64 (``scatter_reduce_`` refuses an int32 index). Reference: hand-computed values."""
    src = torch.tensor([[1.0, -2.0], [3.0, -5.0], [0.5, 4.0]], dtype=f64)
    index = torch.tensor([2, 0, 2], dtype=torch.int32)
    want = {
        scatter_sum: torch.tensor([[3.0, -5.0], [0.0, 0.0], [1.5, 2.0]], dtype=f64),
        scatter_max: torch.tensor([[3.0, -5.0], [0.0, 0.0], [1.0, 4.0]], dtype=f64),
        segment_softmax: torch.tensor([[1 / (1 + math.exp(-0.5)), 1 / (1 + math.exp(6))], [1.0, 1.0],
                                       [1 / (1 + math.exp(0.5)), 1 / (1 + math.exp(-6))]], dtype=f64),
    }[fn]
    torch.testing.assert_close(fn(src, index, 3), want, atol=1e-15, rtol=0)


def test_segment_softmax_of_float16_scores_is_computed_in_float32():
    """kills: scatter.segment_softmax computing float16 scores in float16 (only bfloat16 widened to float32)"""
    g = torch.Generator().manual_seed(9)
    index = torch.arange(8).repeat_interleave(16)
    src = (torch.randn(128, 2, generator=g) * 3).half()
    got = segment_softmax(src, index, 8)
    assert got.dtype == torch.float16
    want = pyg_softmax(src.double(), index, num_nodes=8)
    ulp = torch.finfo(torch.float16).eps * want.abs().clamp_min(2**-14)
    assert ((got.double() - want).abs() <= 0.5 * ulp * (1 + 1e-3) + 2**-25).all()


# ---------------------------------------------------------------------------- uniform map
def test_uniform_mean_refuses_a_key_mask_of_the_wrong_length():
    """kills: uniform_map.uniform_mean without its ``key_mask.shape[-1] != M`` test (a mask of length 1 then
    broadcasts silently over the M = 4 keys)"""
    x = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match=r"key_mask must have shape \(B, G, 1, M\) with M = 4, got \(1, 1, 1, 1\)"):
        uniform_mean(x, torch.ones(1, 1, 1, 1, dtype=torch.bool))


def test_uniform_mean_keeps_float64_under_autocast():
    """kills: uniform_map.uniform_mean taking the autocast dtype for float64 inputs (``x.dtype != torch.float64 and``
    dropped): float64 is not autocast, so the attention call it stands for returns float64"""
    g = torch.Generator().manual_seed(10)
    x = torch.randn(1, 2, 5, 3, generator=g, dtype=f64)
    keys = torch.tensor([True, False, True, True, False]).view(1, 1, 1, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = uniform_mean(x)
        causal = uniform_mean(x, keys, is_causal=True)
    assert plain.dtype == causal.dtype == f64
    torch.testing.assert_close(plain, x.mean(-2, keepdim=True).expand_as(x), atol=1e-15, rtol=0)
    want = torch.stack([x[..., [0], :].sum(-2)] * 2 + [x[..., [0, 2], :].sum(-2) / 2] + [x[..., [0, 2, 3], :].sum(-2) / 3] * 2, dim=-2)
    want[..., 0, :] = x[..., 0, :]
    torch.testing.assert_close(causal, want, atol=1e-15, rtol=0)


def test_uniform_mean_of_bfloat16_sums_in_float32():
    """kills: uniform_map.uniform_mean summing in the input dtype (``work = x.dtype``) instead of float32 for
    bfloat16: the mean of 256 values drifts by many bfloat16 ulps. Reference: the float64 mean, rounded once."""
    g = torch.Generator().manual_seed(11)
    x = (torch.rand(1, 1, 256, 4, generator=g) + 1).bfloat16()
    keys = torch.ones(1, 1, 1, 256, dtype=torch.bool)
    want = x.double().mean(-2, keepdim=True).expand_as(x)
    for got in (uniform_mean(x), uniform_mean(x, keys)):
        assert got.dtype == torch.bfloat16
        ulp = torch.finfo(torch.bfloat16).eps * want.abs()
        assert ((got.double() - want).abs() <= 0.5 * ulp * (1 + 1e-3)).all()
    cum = x.double().cumsum(-2) / torch.arange(1, 257, dtype=f64).view(256, 1)
    got = uniform_mean(x, is_causal=True)
    assert ((got.double() - cum).abs() <= 0.5 * torch.finfo(torch.bfloat16).eps * cum.abs() * (1 + 1e-3)).all()


# ---------------------------------------------------------------------------- equivalent mutants
# 98 mutants were applied (39 in sparse.py, 29 in csr.py, 15 in scatter.py, 15 in uniform_map.py, counting the
# no-op C06 below); every one is killed by the suite with this file except these, left alive because no input
# on this machine tells them from the code:
#
# - sparse._use_csr sending ``"auto"`` to the native path: the two back-ends compute the
#   same values (the suite compares them); only speed and memory differ.
# - sparse.check_edge_index returning ``edge_index`` without ``.long()``: every consumer accepts int32 indices
#   (``index_select``, ``EdgeLayout``'s own ``.long()``, the scatter primitives' ``.long()``).
# - sparse.NativeBackend.propagate dropping out with ``dropout_p >= 0`` instead of ``> 0``: ``F.dropout`` with p = 0
#   is the identity.
# - sparse.diffuse_sparse_with_weights without its early ``_use_csr(backend)``: a bad name is still refused, with
#   the same ValueError, by ``_diffuse_sparse`` (only the order of two errors on a doubly bad call changes).
# - sparse._diffuse_sparse without ``coeffs.to(work)``: ``check_coefficients`` already returns the working dtype.
# - sparse.diffuse_sparse_with_weights always masking (the CUDA / compile path) instead of filtering on CPU: the
#   masked edges get weight 0 and the rest the same softmax (test_perf_paths compares the two).
# - csr.EdgeLayout sorting with ``stable=False``, and a no-op rewrite of the sort (C06): CPU sorts equal keys
#   stably anyway, and duplicate edges carry identical weights in every position.
# - csr.EdgeLayout.transposed sorting by source only (stable): the target-sorted input keeps targets ascending
#   within each source; and recomputing the transposed layout on every call (the cache only saves time).
# - csr.sddmm_heads without its ``E == 0`` early return: ``sampled_addmm`` on an empty pattern returns nothing;
#   and ``E >= R * M`` instead of ``E > R * M``: the dense-gather branch gives the same products.
# - csr.spmm_heads without ``x.contiguous()``: ``addmm`` handles strided right-hand sides; and ``new_empty`` on
#   every device: the zero start only differs off CPU (there ``beta=0`` is trusted by design).
# - csr._EdgeScores.backward computing ``dq`` when it is not needed: autograd discards it.
# - csr._EdgeSoftmax.forward replacing a non-finite row maximum by 50 instead of 0: such a row is all ``-inf``
#   (weights 0 either way) or holds ``+inf`` (NaN either way).
# - scatter._use_torch_scatter using torch-scatter for ``"native"`` when installed, or for CPU tensors under
#   ``"auto"``; segment_softmax passing ``"native"`` to its max / sum: torch-scatter is not installed here, and its
#   kernels compute the same sums and maxima.
# - scatter.scatter_sum / scatter_max / segment_softmax without ``index.long()``: ``index_add_``,
#   ``scatter_reduce_`` and ``index_select`` of this torch take int32 indices.
# - uniform_map.uniform_mean counting the causal prefix in float32 for float64 inputs: counts below 2^24 are exact
#   in float32 and the division promotes to float64.
