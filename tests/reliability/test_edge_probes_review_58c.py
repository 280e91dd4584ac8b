"""Review of sitting 58's PyG user walk (``GraphBlock``'s global attention and its ``batch``)."""

import pytest
import torch

pytest.importorskip("torch_geometric")


@pytest.mark.parametrize("batch", [torch.zeros(4, dtype=torch.long), torch.zeros(6, dtype=torch.int16),
                                   torch.zeros(5, 1, dtype=torch.long)])
@pytest.mark.parametrize("sized", [False, True])
def test_graph_block_global_attention_names_a_batch_of_the_wrong_shape_beside_a_graph(batch, sized):
    """Bug: ``GraphBlock(global_attention=True)(x, graph, batch)`` with an ``AttentionGraph`` (which checked its own
    ids, not the call's) and a ``batch`` not of shape ``(N,)`` failed in the global attention's padding with torch's
    bare "The expanded size of the tensor (5) must match the existing size (4)", "shape mismatch: value tensor of
    shape [5, 8] cannot be broadcast to indexing result of shape [4, 8]" or PyG's "The `index` argument must be
    one-dimensional", naming neither batch nor the node count; with an ``edge_index`` the graph built of it named
    them. A ``batch`` of the right shape still runs."""
    from diffusionformer.graph import AttentionGraph
    from diffusionformer.models import GraphBlock

    torch.manual_seed(0)
    x, edge_index = torch.randn(5, 8), torch.tensor([[0, 1, 3], [1, 2, 4]])
    block = GraphBlock(8, 2, global_attention=True).eval()
    sizes = {"max_num_nodes": 6, "num_graphs": 1} if sized else {}
    with pytest.raises(ValueError, match=r"batch must have shape \(N,\) = \(5,\), got \(" + str(batch.shape[0])):
        block(x, AttentionGraph.sparse(edge_index, 5), batch, **sizes)
    ids = torch.tensor([0, 0, 0, 1, 1])
    sizes = {"max_num_nodes": 3, "num_graphs": 2} if sized else {}
    torch.testing.assert_close(block(x, AttentionGraph.sparse(edge_index, 5), ids, **sizes),
                               block(x, edge_index, ids))
