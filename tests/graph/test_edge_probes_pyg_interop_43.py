"""Edge probes (43): the graph-facing API with the modern PyG inputs a PyG 2.5-2.8 user passes in.

``torch_geometric.EdgeIndex`` (sparse size and sort order), ``torch_geometric.Index``, int32 edges,
torch sparse adjacencies, ``HeteroData`` and neighbour-sampled batches, each against the same call
with a plain int64 ``edge_index`` (the independent reference) or PyG's own layers.
"""

from __future__ import annotations

import pytest
import torch

torch_geometric = pytest.importorskip("torch_geometric")
EdgeIndex = getattr(torch_geometric, "EdgeIndex", None)
Index = getattr(torch_geometric, "Index", None)
needs_edge_index = pytest.mark.skipif(EdgeIndex is None, reason="torch_geometric.EdgeIndex needs PyG >= 2.5")

from diffusionformer.graph import AttentionGraph, from_edge_index, from_pyg, to_networkx  # noqa: E402
from diffusionformer.models import (  # noqa: E402
    GCN,
    GIN,
    DiffusionGraphTransformer,
    GCNConfig,
    GINConfig,
    GraphTransformerConfig,
)
from diffusionformer.nn import DiffusionAttention  # noqa: E402
from diffusionformer.nn.edge_features import edge_feature_attention  # noqa: E402

N = 6
EDGES = torch.tensor([[0, 1, 1, 2, 3, 0, 4, 4], [1, 0, 2, 1, 0, 3, 0, 2]])  # node 5 isolated, none sourced by 5


def _plain(e: torch.Tensor) -> torch.Tensor:
    """The int64 edges of ``e`` as a plain tensor (an ``EdgeIndex`` is a wrapper subclass: ``as_tensor``)."""
    return (e.as_tensor() if EdgeIndex is not None and isinstance(e, EdgeIndex) else e).long()


def _edge_index_variants() -> list[tuple[str, torch.Tensor]]:
    out = [("int32", EDGES.int())]
    if EdgeIndex is not None:
        out += [
            ("sized", EdgeIndex(EDGES, sparse_size=(N, N))),
            ("unsized", EdgeIndex(EDGES)),
            ("int32-sized", EdgeIndex(EDGES.int(), sparse_size=(N, N))),
            ("by-row", EdgeIndex(EDGES).sort_by("row")[0]),  # PyG infers sparse_size (5, None) when sorting
            ("by-col", EdgeIndex(EDGES).sort_by("col")[0]),
            ("sized-by-col", EdgeIndex(EDGES, sparse_size=(N, N)).sort_by("col")[0]),
            ("smaller", EdgeIndex(EDGES, sparse_size=(5, 5))),
        ]
    return out


VARIANTS = _edge_index_variants()


# ------------------------------------------------------------------------------------------------ bugs
@needs_edge_index
@pytest.mark.parametrize("model_cls", ["gcn", "gin"])
@pytest.mark.parametrize("name,edges", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_bug_conv_models_take_an_edge_index_of_any_sparse_size(model_cls, name, edges):
    """Bug: ``GCN`` / ``GIN`` handed an ``EdgeIndex`` to PyG's convolutions as is, whose message passing checks
    ``x`` against the EdgeIndex's sparse size: an EdgeIndex sorted with ``sort_by`` (PyG then infers
    ``sparse_size=(max + 1, None)``), or one sized for fewer nodes than ``x`` has (an isolated last node), failed
    in GIN with PyG's bare "Encountered tensor with size 6 in dimension -2, but expected size 5" (naming no
    argument), where the same edges as a plain tensor run. Reference: the model on the plain int64 edges."""
    torch.manual_seed(0)
    cls, cfg = (GCN, GCNConfig) if model_cls == "gcn" else (GIN, GINConfig)
    model = cls(cfg(in_channels=3, num_classes=2, task="node")).double().eval()
    x = torch.randn(N, 3, dtype=torch.float64)
    ref = model(x, _plain(edges))
    out = model(x, edges)
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


@needs_edge_index
@pytest.mark.parametrize("model_cls", ["gcn", "gin"])
def test_bug_conv_models_name_an_edge_index_sized_past_x(model_cls):
    """Bug: an ``EdgeIndex`` whose sparse size claims more nodes than ``x`` has rows (``sparse_size=(8, 8)``, six
    rows of ``x``) failed inside PyG's message passing with "Encountered tensor with size 6 in dimension -2, but
    expected size 8", naming no argument; now a ValueError naming ``edge_index``, its sparse size and ``N``."""
    cls, cfg = (GCN, GCNConfig) if model_cls == "gcn" else (GIN, GINConfig)
    model = cls(cfg(in_channels=3, num_classes=2, task="node")).eval()
    with pytest.raises(ValueError, match=r"edge_index.*sparse_size.*\(8, 8\).*N=6"):
        model(torch.randn(N, 3), EdgeIndex(EDGES, sparse_size=(8, 8)))


# ------------------------------------------------------------------------------------------------ pins
@needs_edge_index
@pytest.mark.parametrize("name,edges", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_pins_attention_entry_points_equal_the_plain_edges(name, edges):
    """The layer (``edge_index=``, an ``AttentionGraph``, ``from_edge_index`` with and without self loops),
    ``edge_feature_attention`` and the graph transformer give on an ``EdgeIndex`` / int32 edges what they give on
    the plain int64 edges, as plain tensors (no subclass leaks out)."""
    torch.manual_seed(0)
    x = torch.randn(N, 8, dtype=torch.float64)
    layer = DiffusionAttention(8, 2, "attention:1,laplacian:1").double()
    keys = torch.randn(EDGES.shape[1], 8, dtype=torch.float64)
    dgt = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=8, num_classes=3, dim=8, num_heads=2,
                                                           edge_dim=2)).double().eval()
    attr = torch.randn(EDGES.shape[1], 2, dtype=torch.float64)
    calls = [
        lambda e: layer(x, edge_index=e),
        lambda e: layer(x, AttentionGraph.sparse(e, N)),
        lambda e: layer(x, from_edge_index(e, N, self_loops=True)),
        lambda e: layer(x, from_edge_index(e, N, self_loops=False)),
        lambda e: edge_feature_attention(layer, x, e, keys),
        lambda e: dgt(x, e, edge_attr=attr),
        lambda e: AttentionGraph.sparse(e, N).dense_allowed(),
    ]
    for call in calls:
        out, ref = call(edges), call(_plain(edges))
        assert type(out) is torch.Tensor
        torch.testing.assert_close(out, ref, rtol=0, atol=0)


@needs_edge_index
def test_pins_causal_intermediates_keep_valid_edge_index_metadata():
    """The causal filter of the sparse intermediates on an undirected ``EdgeIndex`` keeps the edges ``j <= i``, as
    plain ids (no stale ``is_undirected`` carried over); the weights are a plain tensor."""
    und = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    e = EdgeIndex(und, sparse_size=(4, 4), sort_order="row", is_undirected=True)
    layer = DiffusionAttention(8, 2, causal=True).double()
    x = torch.randn(4, 8, dtype=torch.float64)
    _, inter = layer(x, edge_index=e, return_intermediates=True)
    _, ref = layer(x, edge_index=und, return_intermediates=True)
    assert inter.edge_index.tolist() == ref.edge_index.tolist() == [[0, 1, 2], [1, 2, 3]]
    assert type(inter.edge_index) is torch.Tensor
    assert type(inter.attn_weights) is torch.Tensor
    torch.testing.assert_close(inter.attn_weights, ref.attn_weights, rtol=0, atol=0)


@needs_edge_index
def test_pins_from_pyg_batch_of_edge_index_graphs_equals_plain():
    """A ``Batch`` of ``Data`` whose edges are ``EdgeIndex`` gives the graph of the plain batch (edges, batch
    vector, dense layout) and to_networkx the same edges."""
    from torch_geometric.data import Batch, Data

    d = [Data(x=torch.randn(N, 2), edge_index=EdgeIndex(EDGES, sparse_size=(N, N))), Data(x=torch.randn(3, 2),
         edge_index=EdgeIndex(torch.tensor([[0, 2], [1, 1]]), sparse_size=(3, 3)))]
    plain = [Data(x=g.x, edge_index=_plain(g.edge_index)) for g in d]
    g, r = from_pyg(Batch.from_data_list(d), self_loops=True), from_pyg(Batch.from_data_list(plain), self_loops=True)
    assert torch.equal(_plain(g.edge_index), r.edge_index) and torch.equal(g.batch, r.batch)
    assert torch.equal(g.dense_allowed(), r.dense_allowed())
    w = torch.rand(g.edge_index.shape[1])
    assert sorted(to_networkx(g, w).edges(data=True)) == sorted(to_networkx(r, w).edges(data=True))


def test_pins_hetero_data_and_sparse_adjacency_are_refused_by_name():
    """``HeteroData`` (``from_pyg``) and a torch sparse adjacency (graph, layer, transformer) are clear errors."""
    from torch_geometric.data import HeteroData

    h = HeteroData()
    h["a"].x = torch.randn(2, 1)
    h["a", "to", "a"].edge_index = torch.tensor([[0], [1]])
    with pytest.raises(TypeError, match="HeteroData"):
        from_pyg(h)
    adj = torch.sparse_coo_tensor(EDGES, torch.ones(EDGES.shape[1]), (N, N), check_invariants=True).coalesce()
    dgt = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=8, num_classes=3, dim=8, num_heads=2))
    for call in (lambda: AttentionGraph.sparse(adj, N), lambda: DiffusionAttention(8, 2)(torch.randn(N, 8), edge_index=adj),
                 lambda: dgt(torch.randn(N, 8), adj.to_sparse_csr())):
        with pytest.raises(TypeError, match="edge_index must be a dense .*layout torch.sparse"):
            call()


@needs_edge_index
@pytest.mark.filterwarnings("ignore:Sparse invariant checks")  # PyG's CSR matrix, plain edges too
@pytest.mark.parametrize("kind,n", [("laplacian", 7), ("random_walk", 7), ("random_walk", 2001)])
def test_bug_positional_encoding_transform_takes_an_edge_index(kind, n):
    """Bug: ``positional_encoding_transform`` on a ``Data`` whose edges are an ``EdgeIndex`` failed with
    ``AttributeError: 'Tensor' object has no attribute 'dim_size'`` (the Laplacian PE's undirectedness check and the
    random-walk PE's CSR matrix above 2000 nodes go through PyG's ``sort_edge_index`` / ``coalesce``, which add an
    ``Index`` row in place into a plain tensor), where PyG's own ``AddLaplacianEigenvectorPE`` / ``AddRandomWalkPE``
    take it. Reference: the transform on the plain int64 edges (a ring, both directions; weights (E,) too)."""
    from torch_geometric.data import Data

    from diffusionformer.models.graph_transformer import positional_encoding_transform

    t = positional_encoding_transform(GraphTransformerConfig(in_channels=1, pe=kind, pe_dim=3))
    ring = torch.stack([torch.arange(n), torch.arange(n).roll(1)])
    ring = torch.cat([ring, ring.flip(0)], 1)
    weight = torch.arange(1.0, n + 1).repeat(2)  # symmetric: edge i -> i+1 and its reverse share a weight
    sized = EdgeIndex(ring, sparse_size=(n, n))
    # (a copy sorted by column lists its edges in another order: unweighted there, whose PE ignores the order)
    for e, w in ((sized, None), (sized, weight), (sized.sort_by("col")[0], None)):
        ref = t(Data(edge_index=ring, edge_weight=w, num_nodes=n)).pe
        out = t(Data(edge_index=e, edge_weight=w, num_nodes=n)).pe
        assert type(out) is torch.Tensor
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_bug_graphs_hold_plain_ids_not_a_callers_edge_index():
    """Bug: ``AttentionGraph.sparse`` kept a caller's PyG ``EdgeIndex`` (and ``Index`` batch) as its own
    ``edge_index``/``batch``, stale metadata included: an EdgeIndex sized (3, 3) on a 6-node graph reached PyG's
    ``GINConv`` through ``graph.edge_index`` and failed ("expected size 3"). The graph now holds plain int64 ids,
    equal to the caller's (the reference: ``as_tensor()``), and the layer's output is unchanged."""
    from torch_geometric import EdgeIndex, Index
    from torch_geometric.nn import GINConv

    plain = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 0, 4, 5, 3]])
    stale = EdgeIndex(plain.clone(), sparse_size=(3, 3))
    batch = Index(torch.tensor([0, 0, 0, 1, 1, 1]))
    g = AttentionGraph.sparse(stale, 6, batch=batch)
    assert type(g.edge_index) is torch.Tensor and type(g.batch) is torch.Tensor
    assert torch.equal(g.edge_index, plain) and torch.equal(g.batch, batch.as_tensor())
    torch.manual_seed(0)
    conv = GINConv(torch.nn.Linear(4, 4)).double()
    x = torch.randn(6, 4, dtype=torch.float64)
    torch.testing.assert_close(conv(x, g.edge_index), conv(x, plain), rtol=0, atol=0)
