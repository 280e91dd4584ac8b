"""Edge probes of edge features in sparse diffusion attention (nn/edge_features.py, GraphBlock's edge_attr)."""

import pytest
import torch

from diffusionformer.graph import AttentionGraph
from diffusionformer.models.graph_transformer import GraphBlock


def test_bug_graph_block_names_a_dense_graph_given_with_edge_attr():
    """Bug: a GraphBlock built with edge_dim, called with edge_attr on a dense AttentionGraph, raised a
    TypeError about ``edge_index ... got NoneType`` (an argument the caller never passed) instead of
    saying that edge features need a sparse graph."""
    block = GraphBlock(8, 2, edge_dim=3)
    with pytest.raises(ValueError, match="edge_attr needs a sparse graph.*dense AttentionGraph"):
        block(torch.randn(3, 8), AttentionGraph.dense(3), edge_attr=torch.randn(2, 3))


def test_edge_feature_attention_matches_transformer_conv_with_multi_edges_self_loops_and_isolated_nodes():
    """P equals TransformerConv's attention (edge_dim, weights copied in), and the pre-projection output equals
    its output less the message edge term, on a multi-edge, a self-loop and a node with no incoming edge."""
    from torch_geometric.nn import TransformerConv

    from diffusionformer.nn import DiffusionAttention
    from diffusionformer.nn.edge_features import edge_feature_attention

    torch.manual_seed(0)
    N, D, H, C, Fe = 6, 16, 4, 4, 3
    ei = torch.tensor([[0, 1, 1, 2, 3, 3, 0, 4], [1, 0, 0, 2, 1, 2, 2, 1]])
    ea = torch.randn(ei.shape[1], Fe)
    layer = DiffusionAttention(D, H, "attention").eval()
    conv = TransformerConv(D, C, heads=H, concat=True, beta=False, edge_dim=Fe, root_weight=False).eval()
    lin_edge = torch.nn.Linear(Fe, D, bias=False)
    with torch.no_grad():
        for lin, w, b in zip((conv.lin_query, conv.lin_key, conv.lin_value), layer.qkv.weight.split(D),
                             layer.qkv.bias.split(D)):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        conv.lin_edge.weight.copy_(lin_edge.weight)
        layer.out_proj.weight.copy_(torch.eye(D))
        layer.out_proj.bias.zero_()
        x = torch.randn(N, D)
        ref, (_, alpha) = conv(x, ei, ea, return_attention_weights=True)
        y, P = edge_feature_attention(layer, x.clone(), ei, lin_edge(ea), return_weights=True)
        msg = torch.zeros(N, H, C).index_add_(0, ei[1], alpha.unsqueeze(-1) * lin_edge(ea).reshape(-1, H, C))
    torch.testing.assert_close(P, alpha)
    torch.testing.assert_close(y, ref - msg.reshape(N, D))
    assert y[5].abs().max() == 0  # node 5 has no incoming edge


@pytest.mark.parametrize("rival", ["grand-nl", "neutreno", "heat-exact"])
def test_bug_edge_dim_with_unserved_heads_is_refused_when_the_model_is_built(rival):
    """Bug: ``GraphTransformerConfig(edge_dim=..., heads=<a rival or a dense-only operator>)`` built a model (so an
    experiment's validation, which builds every setting's model, passed) that failed only at its first forward,
    mid-study; the block now refuses those heads when it is built, with the message of the forward."""
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    cfg = GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2, heads=f"{rival}:1,attention:1",
                                 edge_dim=4)
    with pytest.raises(ValueError, match=rf"GraphBlock\(edge_dim=\.\.\.\): operator {rival!r}"):
        DiffusionGraphTransformer(cfg)
    # polynomial heads build and run with edge features
    ok = GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2, heads="heat:1,attention:1", edge_dim=4)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    assert DiffusionGraphTransformer(ok)(torch.randn(4, 3), ei, edge_attr=torch.randn(4, 4)).shape == (4, 2)
