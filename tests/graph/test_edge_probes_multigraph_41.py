"""Edge probes (41): multigraph semantics on the sparse path (duplicate edges, self loops, isolated nodes,
nodes without in-edges, unsorted edges, batched graphs) against float64 references built by hand and PyG."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.graph import AttentionGraph, from_edge_index, from_pyg
from diffusionformer.nn import DiffusionAttention
from diffusionformer.ops.sparse import diffuse_sparse_with_weights, edge_attention, propagate_sparse

pyg_utils = pytest.importorskip("torch_geometric.utils")

# a multigraph over 7 nodes, unsorted: 1 -> 0 three times, 0 -> 2 twice, 3 -> 3 (a self loop) twice, a single self
# loop 0 -> 0, node 4 without in-edges (but with out-edges), node 5 isolated, 6 -> 5 and 5 -> 6 twice each
_EDGES = torch.tensor([[1, 1, 0, 2, 3, 0, 0, 4, 2, 1, 3, 3, 4, 6, 6, 5, 5],
                       [0, 0, 0, 1, 1, 2, 2, 3, 3, 0, 3, 3, 1, 5, 5, 6, 6]])
_N = 7


def _dense_P(edges: torch.Tensor, weights: torch.Tensor, n: int) -> torch.Tensor:
    """``(H, N, N)`` float64: every edge ``j -> i`` adds its weight to ``P[:, i, j]`` (duplicates add up)."""
    P = torch.zeros(weights.shape[1], n, n, dtype=torch.float64)
    for e, (j, i) in enumerate(edges.t().tolist()):
        P[:, i, j] += weights[e].double()
    return P


def _pyg_weights(q: torch.Tensor, k: torch.Tensor, edges: torch.Tensor, n: int) -> torch.Tensor:
    scores = (q[edges[1]] * k[edges[0]]).sum(-1) / q.shape[-1] ** 0.5
    return pyg_utils.softmax(scores, edges[1], num_nodes=n)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["csr", "native", "auto"])
def test_pins_multigraph_powers_equal_dense_matrix_powers_of_the_pyg_softmax(backend: str, causal: bool) -> None:
    """K-step heads on a multigraph are ``sum_k c_k P^k v`` with ``P`` the float64 matrix in which duplicate edges
    add up (each one weighted as PyG's softmax weights it), on both back-ends and in any edge order."""
    g = torch.Generator().manual_seed(0)
    H, C = 3, 4
    q, k, v = (torch.randn(_N, H, C, generator=g, dtype=torch.float64) for _ in range(3))
    coeffs = torch.tensor([[0.3, -1.0, 0.5, 0.25], [1.0, 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    keep = (_EDGES[0] <= _EDGES[1]) if causal else torch.ones(_EDGES.shape[1], dtype=torch.bool)
    ref_w = _pyg_weights(q, k, _EDGES[:, keep], _N)
    P = _dense_P(_EDGES[:, keep], ref_w, _N)
    ref = torch.stack([sum(coeffs[h, p] * torch.linalg.matrix_power(P[h], p) @ v[:, h] for p in range(4))
                       for h in range(H)], dim=1)
    perm = torch.randperm(_EDGES.shape[1], generator=g)
    for order in (torch.arange(_EDGES.shape[1]), perm):
        out, w = diffuse_sparse_with_weights(q, k, v, _EDGES[:, order], coeffs, backend=backend, is_causal=causal)
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
        full = torch.zeros(_EDGES.shape[1], H, dtype=torch.float64)
        full[keep] = ref_w
        torch.testing.assert_close(w, full[order], rtol=1e-12, atol=1e-12)
    # rows of P: 1 for a node with in-edges, 0 for node 4 (out-edges only) and node 5 in the causal graph...
    has_in = torch.zeros(_N, dtype=torch.bool)
    has_in[_EDGES[1, keep]] = True
    torch.testing.assert_close(P.sum(-1), has_in.double().expand(H, _N))
    assert not has_in[4]


def test_pins_edge_attention_and_propagate_agree_across_backends_on_a_multigraph() -> None:
    """``edge_attention`` and ``propagate_sparse`` give the same per-edge weights and ``P x`` on the CSR and
    gather-scatter back-ends for an unsorted multigraph with repeated self loops, duplicates beyond ``N * N``
    entries (the SDDMM fallback) included."""
    g = torch.Generator().manual_seed(1)
    H, C = 2, 3
    dense_dups = torch.cat([_EDGES, torch.tensor([[1] * 50, [0] * 50])], dim=1)  # 67 > 7 * 7 entries
    small = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 1, 1, 0, 0, 1]])  # 6 entries > 2 * 2 cells
    for edges, n in ((_EDGES, _N), (dense_dups, _N), (small, 2)):
        q, k, x = (torch.randn(n, H, C, generator=g, dtype=torch.float64) for _ in range(3))
        w_ref = _pyg_weights(q, k, edges, n)
        for backend in ("csr", "native"):
            w = edge_attention(q, k, edges, backend=backend)
            torch.testing.assert_close(w, w_ref, rtol=1e-12, atol=1e-12)
            y = propagate_sparse(w, x, edges, backend=backend)
            ref = torch.einsum("hij,jhc->ihc", _dense_P(edges, w_ref, n), x)
            torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)


def test_pins_layer_on_a_pyg_batch_of_multigraphs_equals_each_graph_alone() -> None:
    """A ``DiffusionAttention`` with K-step heads over a PyG ``Batch`` of multigraphs (one without edges, one
    of a single node) equals the layer on each graph alone, and its output is the float64 reference
    ``out_proj(sum_k c_k P^k v)`` with duplicate edges adding up in ``P``."""
    from torch_geometric.data import Batch, Data

    torch.manual_seed(0)
    D, H = 8, 4
    layer = DiffusionAttention(D, H, heads="attention:1,laplacian:1,heat(t=0.5):1,ppr:1").double()
    g = torch.Generator().manual_seed(2)
    datas = [Data(x=torch.randn(n, D, generator=g, dtype=torch.float64),
                  edge_index=torch.randint(0, n, (2, E), generator=g), num_nodes=n)
             for n, E in ((3, 7), (1, 0), (5, 12), (2, 4), (1, 2))]
    batch = Batch.from_data_list(datas)
    y, inter = layer(batch.x, from_pyg(batch), return_intermediates=True)
    alone = torch.cat([layer(d.x, edge_index=d.edge_index) for d in datas])
    torch.testing.assert_close(y, alone, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        q, k, v = layer._project(batch.x)
        w = _pyg_weights(q, k, batch.edge_index, batch.num_nodes)
        P = _dense_P(batch.edge_index, w, batch.num_nodes)
        co = layer.coefficients().double()
        out = torch.stack([sum(co[h, p] * torch.linalg.matrix_power(P[h], p) @ v[:, h] for p in range(co.shape[1]))
                           for h in range(H)], dim=1)
        ref = layer.out_proj(out.reshape(batch.num_nodes, D))
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(inter.attn_weights, w, rtol=1e-12, atol=1e-12)


def test_pins_to_dense_counts_a_duplicate_once_and_matches_pyg_to_dense_adj() -> None:
    """``to_dense`` of a batched multigraph (as documented: duplicates once) is PyG's ``to_dense_adj`` made
    boolean, transposed to ``[target, source]``, with the padding of ``to_dense_batch``."""
    edges = torch.tensor([[1, 1, 0, 1, 2, 4, 4], [0, 0, 0, 2, 2, 3, 3]])  # not symmetric: 1 -> 2, 4 -> 3 only
    batch = torch.tensor([0, 0, 0, 1, 1])
    d = AttentionGraph.sparse(edges, batch=batch).to_dense()
    adj = pyg_utils.to_dense_adj(edges, batch) > 0  # [b, source, target], counts summed
    torch.testing.assert_close(d.dense_allowed(), adj.transpose(1, 2))
    _, real = pyg_utils.to_dense_batch(torch.zeros(5, 1), batch)
    assert torch.equal(d.key_padding_mask, ~real)


def test_bug_unchecked_batched_graph_refuses_edges_across_graphs_in_the_layer() -> None:
    """Bug: an unchecked sparse graph (``checked=False``, the form a bare ``edge_index`` and
    ``GraphBlock(x, edge_index, batch)`` take) is documented to defer its checks, "bounds, block-diagonal
    batches", to the kernel, but the kernel only checked the bounds: an edge between two graphs of ``batch`` was
    attended over without a word in eager mode on CPU, mixing the graphs (the checked graph refuses it)."""
    x = torch.randn(4, 8)
    crossing = torch.tensor([[0, 2], [1, 1]])  # 2 -> 1 joins graph 1 to graph 0
    batch = torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match="different graphs"):
        from_edge_index(crossing, 4, batch=batch)
    layer = DiffusionAttention(8, 2)
    g = from_edge_index(crossing, 4, batch=batch, checked=False)
    with pytest.raises(ValueError, match="different graphs"):
        layer(x, g)
    # out-of-range edges still get the bounds error (not an IndexError from the batch lookup)
    with pytest.raises(ValueError, match=r"edge_index values must lie in \[0, num_nodes=4\)"):
        layer(x, AttentionGraph.sparse(torch.tensor([[0], [7]]), 4, batch=batch, checked=False))
    # a block-diagonal unchecked graph runs as the checked one
    ok = torch.tensor([[0, 3], [1, 2]])
    torch.testing.assert_close(layer(x, from_edge_index(ok, 4, batch=batch, checked=False)),
                               layer(x, from_edge_index(ok, 4, batch=batch)))


def test_bug_graph_block_refuses_a_bare_edge_index_across_the_graphs_of_batch() -> None:
    """Bug: ``GraphBlock(x, edge_index, batch)`` wraps the edges in an unchecked graph, so an edge between two
    graphs of ``batch`` was attended over without a word (the nodes of one graph read the other's features); a
    bad ``batch`` (ids out of range) with the global attention is still named as such, not as crossing edges."""
    from diffusionformer.models.graph_transformer import GraphBlock

    torch.manual_seed(0)
    x = torch.randn(4, 8)
    batch = torch.tensor([0, 0, 1, 1])
    block = GraphBlock(8, 2).eval()
    with pytest.raises(ValueError, match="different graphs"):
        block(x, torch.tensor([[0, 2], [1, 1]]), batch)
    ok = torch.tensor([[0, 3], [1, 2]])
    torch.testing.assert_close(block(x, ok, batch), block(x, from_edge_index(ok, 4, batch=batch)))
    gps = GraphBlock(8, 2, global_attention=True).eval()
    with pytest.raises(ValueError, match=r"batch: expected graph ids in \[0, num_graphs=2\), got ids in \[0, 2\]"):
        gps(x, torch.tensor([[3], [2]]), torch.tensor([0, 0, 1, 2]), num_graphs=2)
