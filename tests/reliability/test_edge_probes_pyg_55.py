"""Edge probes 55: a PyG power user's sparse heads in PyG pipelines (edge_index forms, self loops, loaders), each
bug checked against what PyG's own layers do or what the docs promise."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torch_geometric")

from torch_geometric.data import Data  # noqa: E402

from diffusionformer.graph import from_edge_index, from_pyg  # noqa: E402
from diffusionformer.models import DiffusionGraphTransformer, GraphBlock, GraphTransformerConfig  # noqa: E402


# ----------------------------------------------------------------------------------------------------------- bugs

# a self loop past the last node (1-based ids), one at -1, and a good edge
_BAD_SELF_LOOPS = torch.tensor([[0, 5, -1], [1, 5, -1]])


@pytest.mark.parametrize("build", [
    lambda ei: from_edge_index(ei, 5, self_loops=True),
    lambda ei: from_edge_index(ei, 5, self_loops=False),
    lambda ei: from_edge_index(ei, 5, self_loops=True, checked=False),
    lambda ei: from_pyg(Data(edge_index=ei, num_nodes=5), self_loops=True),
    lambda ei: DiffusionGraphTransformer(GraphTransformerConfig(in_channels=4, dim=8, num_heads=2))(
        torch.randn(5, 4), ei),
    lambda ei: DiffusionGraphTransformer(GraphTransformerConfig(in_channels=4, dim=8, num_heads=2, edge_dim=2))(
        torch.randn(5, 4), ei, edge_attr=torch.randn(3, 2)),
], ids=["from_edge_index_add", "from_edge_index_remove", "unchecked", "from_pyg", "model", "model_edge_attr"])
def test_self_loops_out_of_range_are_refused_not_dropped(build):
    """Bug: with self_loops=True/False (the graph transformer's default) a self loop out of range, (N, N) or
    (-1, -1), was removed by PyG's remove_self_loops before the bounds check, so a wrongly indexed edge_index was
    accepted silently (the same edges with self_loops=None are refused); and for other bad edges the error showed
    the range of the edges after the loops were added ([-1, 4] for edges in [-1, 1]). The bounds are now checked on
    the edges as given."""
    with pytest.raises(ValueError, match=r"must lie in \[0, num_nodes=5\), got range \[-1, 5\]"):
        build(_BAD_SELF_LOOPS)
    with pytest.raises(ValueError, match=r"got range \[-1, 1\]"):  # the caller's range, not [-1, 4]
        build(torch.tensor([[0, -1, 1], [1, 0, 0]]))


@pytest.mark.parametrize("graph", [[[0, 1], [1, 2]], None, (torch.tensor([0, 1]), torch.tensor([1, 2]))],
                         ids=["list", "none", "tuple"])
def test_graph_block_names_a_graph_of_the_wrong_type(graph):
    """Bug: GraphBlock(x, [[0, 1], [1, 2]]) (or None) failed with "'list' object has no attribute 'batch'"; it now
    says it takes an AttentionGraph or an edge_index tensor, as DiffusionAttention and Block do."""
    with pytest.raises(TypeError, match=r"GraphBlock: graph must be an AttentionGraph or an edge_index tensor.*got "):
        GraphBlock(8, 2)(torch.randn(3, 8), graph)


def test_self_loop_edge_features_are_documented_as_what_gatconv_does():
    """Docs bug: the forward said the self loops get zero features "as GATConv fills them", but GATConv's default
    fill_value is "mean" (a loop gets the mean of the node's incoming edge features); the docstring now names
    GATConv's fill_value=0.0, which is what the model does: its output equals the model without self loops run on
    the edges PyG's add_self_loops(fill_value=0.0) makes."""
    import inspect

    from torch_geometric.nn import GATConv
    from torch_geometric.utils import add_self_loops, remove_self_loops

    doc = inspect.getdoc(DiffusionGraphTransformer.forward)
    fill = inspect.signature(GATConv).parameters["fill_value"].default
    claim = doc[doc.index("edge_attr:"):doc.index("pe:")]
    assert "GATConv" not in claim or "fill_value=0.0" in claim or fill == 0.0, claim
    torch.manual_seed(0)
    cfg = dict(in_channels=4, dim=8, num_heads=2, edge_dim=2)
    with_loops = DiffusionGraphTransformer(GraphTransformerConfig(**cfg)).double()
    without = DiffusionGraphTransformer(GraphTransformerConfig(**cfg, self_loops=False)).double()
    without.load_state_dict(with_loops.state_dict())
    x, ei = torch.randn(4, 4, dtype=torch.float64), torch.tensor([[0, 1, 2, 2], [1, 2, 2, 3]])
    ea = torch.randn(4, 2, dtype=torch.float64)
    loops, loop_attr = add_self_loops(*remove_self_loops(ei, ea), fill_value=0.0, num_nodes=4)
    torch.testing.assert_close(with_loops(x, ei, edge_attr=ea), without(x, loops, edge_attr=loop_attr))


@pytest.mark.filterwarnings("ignore:Converting sparse tensor to CSR:UserWarning",
                            "ignore:Sparse invariant checks:UserWarning")
def test_gcn_takes_a_csc_adjacency_as_it_takes_coo_and_csr():
    """Bug: GCN documents (and checks for) a torch sparse adjacency in the COO, CSR or CSC layout, but a CSC one
    failed inside PyG's gcn_norm ("NotImplementedError: Sparse CSC matrices are not yet supported"); it is now
    handed to PyG as the same matrix in CSR, and the logits equal the COO adjacency's and the weighted edge_index
    run of PyG's own GCNConv stack."""
    from diffusionformer.models import GCN, GIN, GCNConfig, GINConfig

    torch.manual_seed(0)
    N = 5
    ei = torch.tensor([[0, 1, 2, 3, 4, 4], [1, 2, 3, 4, 0, 2]])
    w = torch.rand(ei.shape[1], dtype=torch.float64) + 0.5
    adj_t = torch.sparse_coo_tensor(ei.flip(0), w, (N, N)).coalesce()  # adj_t[target, source]
    x = torch.randn(N, 3, dtype=torch.float64)
    gcn = GCN(GCNConfig(in_channels=3)).double().eval()
    ref = gcn(x, adj_t)
    torch.testing.assert_close(gcn(x, adj_t.to_sparse_csc()), ref)
    torch.testing.assert_close(gcn(x, adj_t.to_sparse_csr()), ref)
    h = x  # PyG's convolutions on the weighted edge_index: the independent reference
    for i, conv in enumerate(gcn.convs):
        h = conv(h, ei, w)
        h = h.relu() if i < len(gcn.convs) - 1 else h
    torch.testing.assert_close(ref, gcn.head(h))
    gin = GIN(GINConfig(in_channels=3, task="node")).double().eval()
    torch.testing.assert_close(gin(x, adj_t.to_sparse_csc()), gin(x, adj_t))
