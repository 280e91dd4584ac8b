"""Edge probes 51g: a PyG user's walk through the graph API (docs/tutorials/graph_transformer.rst, then their own
data), each checked against an independent reference: PyG's own layers (TransformerConv, GCNConv), a dense float64
computation on the same graph, a brute-force neighbour search."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("torch_geometric")

from torch_geometric import EdgeIndex  # noqa: E402
from torch_geometric.data import Batch, Data, HeteroData  # noqa: E402
from torch_geometric.loader import DataLoader  # noqa: E402
from torch_geometric.nn import Sequential, TransformerConv  # noqa: E402

from diffusionformer.data import neighbor_loader  # noqa: E402
from diffusionformer.graph import knn  # noqa: E402
from diffusionformer.models import (GCN, GIN, DiffusionGraphTransformer, GCNConfig, GINConfig,  # noqa: E402
                                    GraphBlock, GraphTransformerConfig, create_model)
from diffusionformer.nn import Block, DiffusionAttention  # noqa: E402


# ----------------------------------------------------------------------------------------------------------- bugs

def test_knn_never_holds_the_whole_distance_matrix(monkeypatch):
    """Bug: knn computed the (G, M, M) distances of every graph at once (plus masks of the same size): 7.7 GB of
    peak memory for 30k points on CPU, out of memory for 100k, where the graph itself has N k edges. The distances
    now come a block of query rows at a time, with the same neighbours."""
    calls = []
    cdist = torch.cdist

    def recording(a, b, *args, **kwargs):
        out = cdist(a, b, *args, **kwargs)
        calls.append(out.numel())
        return out

    monkeypatch.setattr(torch, "cdist", recording)
    N, k = 3000, 3
    x = torch.randn(N, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = knn(x, k).edge_index
    assert calls and max(calls) < N * N // 2, f"a distance block of {max(calls)} entries for N={N}"
    d = torch.cdist(x, x)  # the brute-force reference (the library's own cdist call is recorded, not this one)
    d.fill_diagonal_(float("inf"))
    ref = d.topk(k, dim=1, largest=False).indices  # (N, k)
    assert torch.equal(got[1], torch.arange(N).repeat_interleave(k))
    assert torch.equal(got[0].view(N, k).sort(1).values, ref.sort(1).values)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_knn_blocks_give_the_neighbours_of_one_block(monkeypatch, metric):
    """The blocked search equals the search in one block, for batched graphs of unequal sizes with ties."""
    knn_module = sys.modules["diffusionformer.graph.knn"]  # the package's knn is the function

    g = torch.Generator().manual_seed(1)
    sizes = torch.tensor([7, 3, 12])
    x = torch.randint(0, 3, (int(sizes.sum()), 2), generator=g).double()  # many ties
    batch = torch.repeat_interleave(torch.arange(3), sizes)[torch.randperm(int(sizes.sum()), generator=g)]
    whole = knn(x, 2, batch=batch, metric=metric, self_loops=True).edge_index
    whole_3d = knn(x.view(2, 11, 2), 2, metric=metric).edge_index
    monkeypatch.setattr(knn_module, "_KNN_BLOCK", 5)  # one query row per block
    assert torch.equal(knn(x, 2, batch=batch, metric=metric, self_loops=True).edge_index, whole)
    assert torch.equal(knn(x.view(2, 11, 2), 2, metric=metric).edge_index, whole_3d)


def test_sparse_adjacency_given_to_a_layer_is_named_as_such():
    """Bug: DiffusionAttention(x, adj) with a torch.sparse float adjacency (as PyG's GCNConv accepts) was refused as
    "got dtype torch.float32; a mask goes by attn_mask= or key_padding_mask=", sending the user to the dense masks;
    it now names the sparse layout and the conversion to an edge_index, as the models and from_pyg do."""
    attn = DiffusionAttention(8, 2)
    ei = torch.tensor([[0, 1], [1, 2]])
    adj = torch.sparse_coo_tensor(ei, torch.ones(2), (3, 3))
    for a in (adj, adj.to_sparse_csr()):
        with pytest.raises(TypeError, match="sparse.*to_edge_index") as info:
            attn(torch.randn(3, 8), a)
        assert "attn_mask" not in str(info.value)


@pytest.mark.parametrize("build", [
    lambda: DiffusionGraphTransformer(GraphTransformerConfig(in_channels=4, dim=8, num_heads=2, depth=1)),
    lambda: GCN(GCNConfig(in_channels=4)),
    lambda: GIN(GINConfig(in_channels=4)),
], ids=["graph_transformer", "gcn", "gin"])
def test_hetero_inputs_are_refused_with_the_way_to_a_homogeneous_graph(build):
    """Bug: model(data.x_dict, data.edge_index_dict) of a HeteroData said "x must have shape (N, in_channels=4),
    got ()": neither the dict nor what to do with several node types; it now names the node types and
    to_homogeneous()."""
    h = HeteroData()
    h["paper"].x = torch.randn(3, 4)
    h["author"].x = torch.randn(2, 4)
    h["author", "writes", "paper"].edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match=r"dict of node types \('paper', 'author'\).*to_homogeneous") as info:
        build()(h.x_dict, h.edge_index_dict)
    assert "got ()" not in str(info.value)
    with pytest.raises(ValueError, match=r"got list"):
        build()([torch.randn(3, 4)], torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"got \(3, 5\)"):
        build()(torch.randn(3, 5), torch.zeros(2, 0, dtype=torch.long))


# ----------------------------------------------------------------------------------- checks against references

def _transformer_conv_pair(D=8, H=2):
    torch.manual_seed(0)
    conv = TransformerConv(D, D // H, heads=H, root_weight=False).double()
    return conv, DiffusionAttention.from_transformer_conv(conv)


@pytest.mark.parametrize("case", ["self_loop", "isolated", "duplicates", "unsorted_int32", "edge_index_sorted",
                                  "edge_index_undirected", "no_edges"])
def test_layer_equals_transformer_conv_on_awkward_edge_indices(case):
    """Sparse attention equals TransformerConv (same weights, root_weight=False) on the graphs PyG users pass:
    self loops given, isolated nodes (zero output in both), duplicate edges (twice in both softmaxes), int32,
    unsorted, PyG EdgeIndex sorted by target or flagged undirected, no edges."""
    ei = torch.tensor([[0, 1, 2, 3, 4, 1], [1, 2, 3, 4, 0, 1]])
    N = 5
    if case == "isolated":
        N = 7
    elif case == "duplicates":
        ei = torch.cat([ei, ei[:, :2]], 1)
    elif case == "unsorted_int32":
        ei = ei[:, torch.tensor([3, 0, 5, 1, 4, 2])].int()
    elif case == "edge_index_sorted":
        ei = EdgeIndex(ei, sparse_size=(N, N)).sort_by("col")[0]
    elif case == "edge_index_undirected":
        ei = EdgeIndex(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), sparse_size=(N, N), is_undirected=True)
    elif case == "no_edges":
        ei = torch.zeros(2, 0, dtype=torch.long)
    conv, layer = _transformer_conv_pair()
    x = torch.randn(N, 8, dtype=torch.float64)
    torch.testing.assert_close(layer(x, ei), conv(x, ei.long() if case == "unsorted_int32" else ei))


def test_layer_on_100k_edges_stays_sparse():
    """100k edges over 50k nodes on CPU: a dense (N, N) float32 step would take 10 GB; the layer runs in the
    sparse kernel and matches TransformerConv."""
    g = torch.Generator().manual_seed(0)
    N, E = 50_000, 100_000
    ei = torch.randint(0, N, (2, E), generator=g)
    torch.manual_seed(0)
    conv = TransformerConv(8, 4, heads=2, root_weight=False)
    layer = DiffusionAttention.from_transformer_conv(conv)
    x = torch.randn(N, 8, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(layer(x, ei), conv(x, ei), atol=1e-5, rtol=1e-4)


def test_layers_in_pyg_sequential_and_edge_weight_is_not_taken_silently():
    """The tutorial's Sequential works; a PyG-style third argument (edge_weight) is a TypeError for a layer and,
    for the models (whose third argument is batch), refused by the batch checks rather than read as graph ids."""
    x, ei = torch.randn(5, 16), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    net = Sequential("x, edge_index", [(DiffusionAttention(16, 4), "x, edge_index -> x"), torch.nn.ReLU()])
    assert net(x, ei).shape == (5, 16)
    with pytest.raises(TypeError):
        DiffusionAttention(16, 4)(x, ei, torch.rand(4))
    model = create_model("graph-node-small", in_channels=16, num_classes=2)
    with pytest.raises((TypeError, ValueError), match="batch"):
        model(x, ei, torch.rand(4))
    ei5 = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])
    with pytest.raises(TypeError, match="batch must hold integer graph ids"):
        model(x, ei5, torch.rand(5))


def test_edge_weight_as_one_edge_feature():
    """The tutorial's way to a weighted graph: edge_dim=1, edge_attr=edge_weight[:, None]; the weights change P."""
    torch.manual_seed(0)
    cfg = GraphTransformerConfig(in_channels=4, num_classes=2, dim=8, num_heads=2, depth=1, edge_dim=1, dropout=0.0)
    model = DiffusionGraphTransformer(cfg).eval()
    x, ei = torch.randn(4, 4), torch.tensor([[0, 1, 2, 0], [1, 2, 3, 2]])
    w = torch.tensor([1.0, 2.0, 0.5, 3.0])
    a = model(x, ei, edge_attr=w[:, None])
    b = model(x, ei, edge_attr=(2 * w)[:, None])
    assert a.shape == (4, 2) and not torch.allclose(a, b)


def test_neighbor_loader_seeds_equal_the_full_graph():
    """Mini-batches from neighbor_loader (input nodes first, batch_size seeds, n_id) with all neighbours over as
    many hops as layers give the seeds the outputs of the full-graph call."""
    g = torch.Generator().manual_seed(0)
    N = 120
    data = Data(x=torch.randn(N, 16, generator=g), edge_index=torch.randint(0, N, (2, 500), generator=g))
    torch.manual_seed(0)
    model = create_model("graph-node-small", in_channels=16, num_classes=2, laplacian_heads=2).eval()
    full = model(data.x, data.edge_index)
    loader = neighbor_loader(data, [-1] * model.config.depth, batch_size=16, input_nodes=torch.arange(48))
    seen = 0
    for b in loader:
        out = model(b.x, b.edge_index)[:b.batch_size]
        torch.testing.assert_close(out, full[b.n_id[:b.batch_size]], atol=1e-5, rtol=1e-5)
        seen += b.batch_size
    assert seen == 48


def test_dataloader_batch_with_empty_and_one_node_graphs_equals_graphs_alone():
    """A PyG DataLoader batch holding an empty graph and one-node graphs: each graph's logits equal its own call
    (the empty graph gets the logits of no nodes, as a call with num_graphs)."""
    g = torch.Generator().manual_seed(0)
    graphs = [Data(x=torch.randn(n, 6, generator=g), edge_index=torch.randint(0, max(n, 1), (2, 2 * n), generator=g))
              for n in (3, 1, 0, 5, 1)]
    torch.manual_seed(0)
    model = create_model("graph-graph-small", in_channels=6, num_classes=3).eval()
    b = next(iter(DataLoader(graphs, batch_size=len(graphs))))
    out = model(b.x, b.edge_index, b.batch, num_graphs=b.num_graphs)
    assert out.shape == (5, 3)
    for i, d in enumerate(graphs):
        alone = model(d.x, d.edge_index, num_graphs=1)
        torch.testing.assert_close(out[i:i + 1], alone, atol=1e-5, rtol=1e-5)
    one = Batch.from_data_list([Data(x=torch.randn(1, 6), edge_index=torch.zeros(2, 0, dtype=torch.long))])
    assert model(one.x, one.edge_index, one.batch).shape == (1, 3)


def test_gcn_and_gin_equal_dense_float64_references():
    """GCN: D^-1/2 (A + I) D^-1/2 X W + b with duplicate edges adding up and a given self loop kept at 1 (the
    docstring's claim); GIN (eval): its MLPs on (1 + eps) x_i + sum_j x_j, read out per layer."""
    torch.manual_seed(0)
    ei = torch.tensor([[0, 1, 2, 2, 0, 3], [1, 2, 3, 3, 0, 1]])  # a duplicate 2 -> 3, a self loop on 0
    N = 5
    x = torch.randn(N, 4, dtype=torch.float64)
    A = torch.zeros(N, N, dtype=torch.float64)
    for s, t in ei.t().tolist():
        A[t, s] += 1
    A_hat = A.clone()
    A_hat.fill_diagonal_(1.0)
    dis = A_hat.sum(1).rsqrt()
    gcn = GCN(GCNConfig(in_channels=4, num_classes=3, num_layers=1)).double().eval()
    conv = gcn.convs[0]
    ref = (dis[:, None] * A_hat * dis[None, :]) @ (x @ conv.lin.weight.t()) + conv.bias
    torch.testing.assert_close(gcn(x, ei), ref)

    gin = GIN(GINConfig(in_channels=4, num_classes=3, task="node")).double().eval()
    hs = [x]
    for c in gin.convs:
        hs.append(c.nn((1 + c.eps) * hs[-1] + A @ hs[-1]))
    ref = sum(head(h) for head, h in zip(gin.heads, hs))
    torch.testing.assert_close(gin(x, ei), ref)


def test_dense_float64_reference_of_a_graph_model_layer():
    """DiffusionAttention on edge_index equals a dense float64 softmax over each node's in-edges (P_ij over
    j -> i), with an isolated node giving zero."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2).double()
    ei = torch.tensor([[0, 1, 2, 3, 0], [1, 2, 3, 1, 0]])
    N = 5  # node 4 isolated
    x = torch.randn(N, 8, dtype=torch.float64)
    q, k, v = layer._project(x)  # (N, H, C)
    allowed = torch.zeros(N, N, dtype=torch.bool)
    allowed[ei[1], ei[0]] = True
    s = torch.einsum("ihc,jhc->hij", q, k) / q.shape[-1] ** 0.5
    P = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    ref = layer.out_proj(torch.einsum("hij,jhc->ihc", P, v).reshape(N, 8))
    torch.testing.assert_close(layer(x, ei), ref)
    torch.testing.assert_close(layer(x, ei)[4], layer.out_proj.bias)
    assert F.relu(ref).shape == (N, 8)


def test_tutorial_claims_on_sparse_adjacency_and_trailing_empty_graphs():
    """graph_transformer.rst: the graph transformer refuses a torch sparse adjacency, naming to_edge_index; a batch
    ending in an empty graph gives one row fewer than batch.y without num_graphs, and all rows with it."""
    torch.manual_seed(0)
    model = create_model("graph-graph-small", in_channels=4, num_classes=2).eval()
    x, ei = torch.randn(3, 4), torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(TypeError, match="to_edge_index"):
        model(x, torch.sparse_coo_tensor(ei, torch.ones(2), (3, 3)))
    b = Batch.from_data_list([Data(x=x, edge_index=ei, y=torch.tensor([1])),
                              Data(x=torch.zeros(0, 4), edge_index=torch.zeros(2, 0, dtype=torch.long),
                                   y=torch.tensor([0]))])
    assert model(b.x, b.edge_index, b.batch).shape[0] == b.y.shape[0] - 1
    assert model(b.x, b.edge_index, b.batch, num_graphs=b.num_graphs).shape[0] == b.y.shape[0]


def test_gcn_and_gin_weight_the_edges_of_a_sparse_adjacency():
    """The docstrings' claims on a weighted torch sparse adj_t: GCN normalises A + I with the weights; GIN sums the
    neighbours with the weights (a weighted GIN), against dense float64 references."""
    torch.manual_seed(0)
    N = 5
    x = torch.randn(N, 4, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 1]])
    w = torch.tensor([0.5, 2.0, 1.5, 3.0], dtype=torch.float64)
    A = torch.zeros(N, N, dtype=torch.float64)
    A[ei[1], ei[0]] = w
    adj_t = torch.sparse_coo_tensor(ei.flip(0), w, (N, N)).coalesce()
    gcn = GCN(GCNConfig(in_channels=4, num_classes=3, num_layers=1)).double().eval()
    A_hat = A + torch.eye(N, dtype=torch.float64)
    dis = A_hat.sum(1).rsqrt()
    conv = gcn.convs[0]
    ref = (dis[:, None] * A_hat * dis[None]) @ (x @ conv.lin.weight.t()) + conv.bias
    torch.testing.assert_close(gcn(x, adj_t), ref)
    gin = GIN(GINConfig(in_channels=4, num_classes=3, task="node")).double().eval()
    hs = [x]
    for c in gin.convs:
        hs.append(c.nn((1 + c.eps) * hs[-1] + A @ hs[-1]))
    torch.testing.assert_close(gin(x, adj_t), sum(head(h) for head, h in zip(gin.heads, hs)))


def test_bipartite_pair_from_to_hetero_is_refused_with_the_reason():
    """Bug: PyG's to_hetero calls a layer as layer((x_src, x_dst), edge_index) for an edge type between two node
    types, and DiffusionAttention answered "x must be a tensor, got tuple": it now names the bipartite pair, why
    the layer cannot take it (one node set, P square) and to_homogeneous()."""
    from torch_geometric.nn import to_hetero

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = DiffusionAttention(8, 2)

        def forward(self, x, edge_index):
            return self.attn(x, edge_index)

    h = HeteroData()
    h["a"].x, h["b"].x = torch.randn(3, 8), torch.randn(2, 8)
    h["a", "to", "b"].edge_index = torch.tensor([[0, 1], [1, 0]])
    h["b", "rev", "a"].edge_index = torch.tensor([[0, 1], [1, 2]])
    net = to_hetero(Net(), h.metadata())
    with pytest.raises(TypeError, match=r"pair of tensors.*bipartite.*to_homogeneous"):
        net(h.x_dict, h.edge_index_dict)
    with pytest.raises(TypeError, match=r"pair of tensors"):
        DiffusionAttention(8, 2)((torch.randn(3, 8), torch.randn(2, 8)), torch.tensor([[0], [1]]))


@pytest.mark.parametrize("build", [lambda: DiffusionAttention(8, 2), lambda: Block(8, 2), lambda: GraphBlock(8, 2)],
                         ids=["DiffusionAttention", "Block", "GraphBlock"])
def test_bipartite_pair_refused_by_every_layer_called_as_a_conv(build):
    """Bug: Block and GraphBlock (called as PyG convolutions, per graph_transformer.rst) answered a bipartite pair
    with torch's "layer_norm(): argument 'input' must be Tensor, not tuple" and "'tuple' object has no attribute
    'dim'"; they now name the pair as the layer does, and any other non-tensor x by its type."""
    ei = torch.tensor([[0], [1]])
    with pytest.raises(TypeError, match=r"x must be a tensor, got a pair of tensors.*to_homogeneous"):
        build()((torch.randn(3, 8), torch.randn(2, 8)), ei)
    with pytest.raises(TypeError, match=r"x must be a tensor, got list"):
        build()([torch.randn(3, 8)], ei)
