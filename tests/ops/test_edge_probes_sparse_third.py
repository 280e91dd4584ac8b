"""Edge-case probes, third pass: the sparse (edge-list / CSR) attention path against independent references.

Found and fixed (each pinned by a "Bug:" test below):

* ``DiffusionGraphTransformer.forward`` with ``edge_dim`` read ``E`` from ``edge_index.shape[1]`` before checking
  ``edge_index``: a list was an ``AttributeError``, a 1-D tensor an ``IndexError``, a ``(E, 2)`` list of pairs a
  ``ValueError`` about ``edge_attr``'s shape (with ``E`` read from the wrong axis);
* ``GraphBlock.forward`` dropped ``edge_attr`` without a word when the block had no ``edge_dim``, and a wrong-width,
  wrong-length, 1-D or list ``edge_attr`` failed inside ``Linear`` or named ``edge_keys``, an argument the caller
  never passed.

The working edge cases check every registered operator's sparse path against the dense path on the same graph
(isolated targets, partial self loops, unsorted edges; forward and gradients in float64), the PPR and heat series
against ``torch.linalg.solve`` / ``torch.linalg.matrix_exp``, the CSR layout against ``torch.sparse_csr``, the
softmax against PyG's with huge and ``-inf`` logits, second-order gradients, empty edge lists, and batched graph
transformers against their graphs one at a time.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck
from torch_geometric.data import Batch, Data
from torch_geometric.utils import softmax as pyg_softmax

import diffusionformer.operators as operators
from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphBlock, GraphTransformerConfig
from diffusionformer.nn import DiffusionAttention, edge_feature_attention
from diffusionformer.ops import segment_softmax
from diffusionformer.ops.csr import EdgeLayout, csr_edge_softmax, spmm_heads
from diffusionformer.ops.sparse import _diffuse_sparse, diffuse_sparse, diffuse_sparse_with_weights, edge_attention
from diffusionformer.ops.sparse import propagate_sparse

f64 = torch.float64
#: unsorted; self loops on 4 only (4 -> 4); nodes 3 and 6 have no incoming edge
EDGES = torch.tensor([[1, 0, 2, 5, 4, 0, 1, 2, 6, 3],
                      [0, 1, 1, 2, 4, 5, 5, 5, 2, 4]])
N_NODES = 7
SPARSE_OPERATORS = [n for n in operators.list_operators() if operators.build_operator(n).supports_sparse]


def _rand(*shape, seed, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=f64).requires_grad_(requires_grad)


def _dense_mask(ei, n):
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[ei[1], ei[0]] = True  # row = target i, column = source j
    return mask


def _dense_p(w, ei, n):
    """``P`` per head ``(H, n, n)`` from per-edge weights ``(E, H)``; duplicate edges add up."""
    P = torch.zeros(w.shape[1], n, n, dtype=f64)
    for h in range(w.shape[1]):
        P[h].index_put_((ei[1], ei[0]), w[:, h].double(), accumulate=True)
    return P


# ---------------------------------------------------------------------------- bugs: graph transformer
@pytest.mark.parametrize("bad, error, match", [
    ([[0, 1, 3], [1, 2, 4]], TypeError, r"edge_index must be an integer tensor of shape \(2, E\), got list"),
    (torch.tensor([[0, 1, 3], [1, 2, 4]]).t(), ValueError, r"got \(3, 2\): a list of \(source, target\) pairs"),
    (torch.tensor([0, 1, 3]), ValueError, r"edge_index must have shape \(2, E\), got \(3,\)"),
])
def test_bug_graph_transformer_with_edge_dim_names_a_bad_edge_index(bad, error, match):
    """Bug: with ``edge_dim`` the model read ``E`` from ``edge_index.shape[1]`` before checking ``edge_index``: a list
    raised ``AttributeError``, a 1-D tensor ``IndexError`` and an ``(E, 2)`` list of pairs a ``ValueError`` about
    ``edge_attr`` (``expected (2, 2), got (3, 2)``); the model without ``edge_dim`` named ``edge_index`` already."""
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, dim=8, num_heads=2, edge_dim=2)).eval()
    with pytest.raises(error, match=match):
        model(torch.randn(5, 3), bad, edge_attr=torch.randn(3, 2))
    # the right edges run, a wrong edge_attr is still named
    assert model(torch.randn(5, 3), torch.tensor([[0, 1, 3], [1, 2, 4]]), edge_attr=torch.randn(3, 2)).shape == (5, 2)
    with pytest.raises(ValueError, match=r"edge_attr: expected shape \(E, edge_dim\) = \(3, 2\), got \(2, 2\)"):
        model(torch.randn(5, 3), torch.tensor([[0, 1, 3], [1, 2, 4]]), edge_attr=torch.randn(2, 2))


def test_bug_graph_block_refuses_edge_attr_without_edge_dim():
    """Bug: a ``GraphBlock`` built without ``edge_dim`` ignored ``edge_attr`` silently (the output was the one without
    edge features), so a block built with a forgotten ``edge_dim`` trained without them."""
    torch.manual_seed(0)
    block = GraphBlock(8, 2).eval()
    x, ei = torch.randn(4, 8), torch.tensor([[0, 1, 2], [1, 2, 3]])
    with pytest.raises(ValueError, match=r"GraphBlock: got edge_attr, but the block was built without edge_dim"):
        block(x, ei, edge_attr=torch.randn(3, 5))
    assert block(x, ei).shape == (4, 8)


@pytest.mark.parametrize("bad, error, match", [
    (torch.randn(3, 4), ValueError, r"edge_attr: expected shape \(E, edge_dim\) = \(3, 5\), got \(3, 4\)"),
    (torch.randn(2, 5), ValueError, r"edge_attr: expected shape \(E, edge_dim\) = \(3, 5\), got \(2, 5\)"),
    (torch.randn(3), ValueError, r"edge_attr: expected shape \(E, edge_dim\) = \(3, 5\), got \(3,\)"),
    ([[0.0] * 5] * 3, TypeError, r"edge_attr: expected a Tensor of shape \(E, edge_dim\), got list"),
])
def test_bug_graph_block_names_a_bad_edge_attr(bad, error, match):
    """Bug: ``GraphBlock`` passed ``edge_attr`` to its ``Linear`` unchecked: a wrong width or a 1-D tensor failed with
    ``mat1 and mat2 shapes cannot be multiplied``, a list with ``AttributeError``, and a wrong edge count with a
    message about ``edge_keys``, an argument the caller never passed."""
    block = GraphBlock(8, 2, edge_dim=5).eval()
    x, ei = torch.randn(4, 8), torch.tensor([[0, 1, 2], [1, 2, 3]])
    with pytest.raises(error, match=match):
        block(x, ei, edge_attr=bad)
    assert block(x, ei, edge_attr=torch.randn(3, 5)).shape == (4, 8)


# ---------------------------------------------------------------------------- working: sparse = dense
@pytest.mark.parametrize("name, causal", list(itertools.product(SPARSE_OPERATORS, [False, True])))
def test_every_sparse_operator_equals_the_dense_path_on_a_hostile_graph(name, causal):
    """Every operator with a sparse back-end gives on ``edge_index`` what the dense path gives with the bool mask of the
    same edges (isolated targets: a zero row of ``P`` on both), forward and input gradient, in float64."""
    torch.manual_seed(1)
    layer = DiffusionAttention(8, 2, name, causal=causal).double().eval()
    x = _rand(N_NODES, 8, seed=2, requires_grad=True)
    ys = layer(x, edge_index=EDGES)
    yd = layer(x[None], attn_mask=_dense_mask(EDGES, N_NODES)[None, None])[0]
    torch.testing.assert_close(ys, yd, rtol=0, atol=1e-12)
    gs, = torch.autograd.grad(ys.square().sum(), x)
    gd, = torch.autograd.grad(yd.square().sum(), x)
    torch.testing.assert_close(gs, gd, rtol=0, atol=1e-12)
    if operators.build_operator(name).is_polynomial and not causal:  # zero edge keys: the layer's own output
        ye = edge_feature_attention(layer, x, EDGES.int(), torch.zeros(EDGES.shape[1], 8, dtype=f64))
        torch.testing.assert_close(ye, ys, rtol=0, atol=1e-12)


@pytest.mark.parametrize("spec", ["ppr(alpha=0.3, steps=80)", "heat(t=1.5, steps=40)"])
def test_sparse_ppr_and_heat_equal_solve_and_matrix_exp(spec):
    """PPR and heat on a graph with a duplicate edge and isolated targets equal ``alpha (I - (1-alpha) P)^-1 v`` and
    ``exp(-t (I - P)) v`` with ``P`` built densely from the edge weights (duplicates added)."""
    ei = torch.cat([EDGES, torch.tensor([[2], [1]])], dim=1)  # 2 -> 1 twice
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, spec).double().eval()
    x = _rand(N_NODES, 8, seed=3)
    q, k, v = layer._project(x)
    P = _dense_p(edge_attention(q, k, ei), ei, N_NODES)
    eye = torch.eye(N_NODES, dtype=f64)
    vb = v.transpose(0, 1)
    z = 0.3 * torch.linalg.solve(eye - 0.7 * P, vb) if spec.startswith("ppr") else \
        torch.linalg.matrix_exp(-1.5 * (eye - P)) @ vb
    want = layer.out_proj(z.transpose(0, 1).reshape(N_NODES, 8))
    torch.testing.assert_close(layer(x, edge_index=ei), want, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- working: CSR layout and softmax
def test_edge_layout_equals_torch_sparse_csr():
    """``EdgeLayout``'s row pointers, columns, order and transposed layout equal ``torch.sparse_csr`` of the same
    edges (empty rows, an empty and a full edge list), and ``spmm_heads`` equals the dense product."""
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 5, 9):
        for E in (0, 1, n * n // 2, n * n):
            cells = torch.randperm(n * n, generator=g)[:E]
            ei = torch.stack([cells % n, cells // n])
            layout = EdgeLayout(ei, n)
            ids = torch.arange(E, dtype=f64)
            ref = torch.sparse_coo_tensor(ei.flip(0), ids, (n, n), check_invariants=True).coalesce().to_sparse_csr()
            assert torch.equal(layout.crow.long(), ref.crow_indices())
            assert torch.equal(layout.src.long(), ref.col_indices())
            assert torch.equal(layout.from_input_order(ids), ref.values())
            order, col, crow = layout.transposed()
            ref_t = torch.sparse_coo_tensor(ei, ids, (n, n), check_invariants=True).coalesce().to_sparse_csr()
            assert torch.equal(crow.long(), ref_t.crow_indices()) and torch.equal(col.long(), ref_t.col_indices())
            assert torch.equal(layout.from_input_order(ids)[order], ref_t.values())
            w, x = torch.rand(2, E, dtype=f64, generator=g), torch.randn(2, n, 3, dtype=f64, generator=g)
            dense = torch.stack([torch.sparse_csr_tensor(ref.crow_indices(), ref.col_indices(), w[h], (n, n), check_invariants=True).to_dense()
                                 for h in range(2)])
            torch.testing.assert_close(spmm_heads(layout.crow, layout.src, w, x, n), dense @ x, rtol=0, atol=1e-14)


def test_softmax_with_huge_and_minus_inf_logits_matches_pyg():
    """Scores of ``±1e4`` and ``-inf``: the CSR softmax, ``segment_softmax`` and PyG's ``softmax`` agree (no overflow, no
    NaN); ``edge_attention`` with logits ~1e4 in every dtype equals the float64 PyG softmax."""
    layout = EdgeLayout(EDGES, N_NODES)
    inf = float("inf")
    s = torch.tensor([[1e4, -inf, 1e4 - 1, -inf, 0.0, 3.0, 5.0, -1e4, 2.0, -1e4]], dtype=f64)
    want = pyg_softmax(s.t(), EDGES[1], num_nodes=N_NODES).t()
    got = layout.to_input_order(csr_edge_softmax(layout.from_input_order(s.t()).t(), layout).t()).t()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-15)
    torch.testing.assert_close(segment_softmax(s.t(), EDGES[1], N_NODES).t(), want, rtol=0, atol=1e-15)
    q, k = _rand(N_NODES, 2, 4, seed=4) * 60, _rand(N_NODES, 2, 4, seed=5) * 60
    for dtype in (f64, torch.float32, torch.float16, torch.bfloat16):
        qd, kd = q.to(dtype), k.to(dtype)
        ref = pyg_softmax((qd.double()[EDGES[1]] * kd.double()[EDGES[0]]).sum(-1) * 0.5, EDGES[1], num_nodes=N_NODES)
        for backend in ("csr", "native"):
            w = edge_attention(qd, kd, EDGES, backend=backend)
            assert w.dtype == dtype
            torch.testing.assert_close(w.double(), ref, rtol=0, atol=1e-3 if dtype in (torch.float16, torch.bfloat16)
                                       else 1e-6)


# ---------------------------------------------------------------------------- working: gradients, empty graphs
@pytest.mark.parametrize("backend", ["csr", "native"])
def test_second_order_gradients_and_the_masked_causal_path(backend):
    """``gradgradcheck`` of ``diffuse_sparse``, ``edge_attention`` and ``propagate_sparse`` (the CSR kernels' ``create_graph``
    branch), and the compile/accelerator causal path (masking instead of filtering) equals the filtered one."""
    ei, n = EDGES[:, :8], 6
    q, k, v = (_rand(n, 2, 3, seed=s, requires_grad=True) for s in (6, 7, 8))
    c = _rand(2, 3, seed=9, requires_grad=True)
    assert gradgradcheck(lambda q, k, v, c: diffuse_sparse(q, k, v, ei, c, backend=backend), (q, k, v, c))
    w = torch.rand(ei.shape[1], 2, dtype=f64).requires_grad_()
    assert gradgradcheck(lambda w, v: propagate_sparse(w, v, ei, backend=backend), (w, v))
    keep = ei[0] <= ei[1]
    masked = _diffuse_sparse(q, k, v, ei, c, n, 3 ** -0.5, (2, 2), 0.0, backend, False, keep)[0]
    torch.testing.assert_close(masked, diffuse_sparse(q, k, v, ei, c, backend=backend, is_causal=True),
                               rtol=0, atol=1e-14)
    assert gradcheck(lambda q, k: _diffuse_sparse(q, k, v, ei, c, n, 0.5, (2, 2), 0.0, backend, False, keep)[0], (q, k))


@pytest.mark.parametrize("n", [0, 1, 3])
def test_empty_edge_lists_give_c0_v(n):
    """No edges: every target is isolated, the output is ``c_0 v`` on both back-ends (static and tensor coefficients,
    causal or not) with finite gradients; the layer with no edges equals the dense layer with an all-False mask."""
    none = torch.zeros(2, 0, dtype=torch.long)
    for backend, causal in itertools.product(("csr", "native"), (False, True)):
        q, k, v = (_rand(n, 2, 3, seed=s, requires_grad=True) for s in (10, 11, 12))
        c = torch.tensor([0.3, 0.5, 0.2], dtype=f64, requires_grad=True)
        out, w = diffuse_sparse_with_weights(q, k, v, none.int(), c, backend=backend, is_causal=causal)
        assert w.shape == (0, 2)
        torch.testing.assert_close(out, 0.3 * v, rtol=0, atol=0)
        out.sum().backward()
        assert torch.isfinite(c.grad).all() and torch.isfinite(v.grad).all()
        for static in ([1.0, 0.0], [0.5, 0.5], [0.1, 0.2, 0.3]):
            torch.testing.assert_close(diffuse_sparse(q, k, v, none, static, backend=backend, is_causal=causal),
                                       static[0] * v, rtol=0, atol=0)
    if n:
        torch.manual_seed(0)
        layer = DiffusionAttention(6, 2, "laplacian,attnscale").double().eval()
        x = _rand(n, 6, seed=13)
        torch.testing.assert_close(layer(x, edge_index=none),
                                   layer(x[None], attn_mask=torch.zeros(1, 1, n, n, dtype=torch.bool))[0],
                                   rtol=0, atol=1e-14)


# ---------------------------------------------------------------------------- working: batched graph transformer
@pytest.mark.parametrize("task, global_attention, edge_dim", list(itertools.product(("node", "graph"), (False, True),
                                                                                     (None, 2))))
def test_graph_transformer_batch_equals_its_graphs_one_at_a_time(task, global_attention, edge_dim):
    """A PyG ``Batch`` of graphs of 4, 1 (no edge) and 3 nodes (a duplicate edge, a self loop, isolated targets) gives
    the logits of its graphs run one at a time; int32 ``edge_index``/``batch`` and given sizes change nothing."""
    g = torch.Generator().manual_seed(0)
    graphs = [Data(x=torch.randn(4, 3, generator=g, dtype=f64), edge_index=torch.tensor([[0, 1, 1, 2], [1, 0, 0, 2]]),
                   edge_attr=torch.randn(4, 2, generator=g, dtype=f64)),
              Data(x=torch.randn(1, 3, generator=g, dtype=f64), edge_index=torch.zeros(2, 0, dtype=torch.long),
                   edge_attr=torch.zeros(0, 2, dtype=f64)),
              Data(x=torch.randn(3, 3, generator=g, dtype=f64), edge_index=torch.tensor([[2, 0], [1, 1]]),
                   edge_attr=torch.randn(2, 2, generator=g, dtype=f64))]
    batch = Batch.from_data_list(graphs)
    torch.manual_seed(1)
    cfg = GraphTransformerConfig(in_channels=3, num_classes=3, dim=8, num_heads=2, task=task,
                                 global_attention=global_attention, edge_dim=edge_dim, heads="attention,laplacian")
    model = DiffusionGraphTransformer(cfg).double().eval()

    def kw(d):
        return {"edge_attr": d.edge_attr} if edge_dim else {}

    out = model(batch.x, batch.edge_index, batch.batch, **kw(batch))
    one_by_one = torch.cat([model(d.x, d.edge_index, None if task == "node" else
                                  torch.zeros(d.num_nodes, dtype=torch.long), **kw(d)) for d in graphs])
    torch.testing.assert_close(out, one_by_one, rtol=0, atol=1e-12)
    torch.testing.assert_close(model(batch.x, batch.edge_index.int(), batch.batch.int(), **kw(batch)), out,
                               rtol=0, atol=0)
    torch.testing.assert_close(model(batch.x, batch.edge_index, batch.batch, max_num_nodes=5, num_graphs=3,
                                     **kw(batch)), out, rtol=0, atol=1e-12)
