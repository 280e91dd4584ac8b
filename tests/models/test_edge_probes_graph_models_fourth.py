"""Edge probes of the graph models (fourth pass): GCN / GIN on a batch whose edges cross its graphs."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.models import GCN, GIN, DiffusionGraphTransformer, GCNConfig, GINConfig, GraphTransformerConfig

_X = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
_BATCH = torch.tensor([0, 0, 0, 1, 1])
_CROSSING = torch.tensor([[0, 1, 2, 3], [1, 0, 3, 4]])  # 2 -> 3 joins graph 0 to graph 1


def _models(task: str) -> list[torch.nn.Module]:
    return [GCN(GCNConfig(in_channels=3, task=task, hidden=5)).eval(),
            GIN(GINConfig(in_channels=3, task=task, hidden=5, num_layers=2)).eval()]


@pytest.mark.parametrize("layout", ["edge_index", "sparse_coo", "sparse_csr"])
@pytest.mark.parametrize("task", ["graph", "node"])
def test_bug_gcn_gin_refuse_edges_across_the_graphs_of_batch(task, layout) -> None:
    """Bug: GCN and GIN took an edge between two graphs of ``batch`` without a word: the convolution mixed the
    graphs' features and each graph's readout read the other's nodes (DiffusionGraphTransformer refuses it)."""
    edges = _CROSSING
    if layout != "edge_index":  # adj_t: row = target
        adj = torch.sparse_coo_tensor(edges.flip(0), torch.ones(edges.shape[1]), (5, 5)).coalesce()
        edges = adj if layout == "sparse_coo" else adj.to_sparse_csr()
    gt = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, dim=4, num_heads=1, task=task)).eval()
    for model in [gt] + _models(task):
        if model is gt and layout != "edge_index":
            continue
        with pytest.raises(ValueError, match="different graphs"):
            model(_X, edges, _BATCH)
    for model in _models(task):  # the same edges within the graphs: accepted, and no graph reads the other
        inside = torch.tensor([[0, 1, 1, 3], [1, 0, 2, 4]])
        out = model(_X, inside, _BATCH)
        alone = model(_X[3:], inside[:, 3:] - 3, torch.zeros(2, dtype=torch.long))
        torch.testing.assert_close(out[1:] if task == "graph" else out[3:], alone)
        model(_X, _CROSSING)  # without batch: one graph, any edge
