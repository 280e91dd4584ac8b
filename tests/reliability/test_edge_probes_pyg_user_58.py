"""Edge probes of a PyTorch Geometric user adopting the graph side of diffusionformer (sitting 58):
``DiffusionAttention.from_transformer_conv``, :class:`~diffusionformer.models.GraphBlock` and the graph interop."""

import pytest
import torch

from diffusionformer import DiffusionAttention

pytest.importorskip("torch_geometric")


@pytest.mark.parametrize("num_kv_heads", [1, 4])
def test_from_transformer_conv_refuses_num_kv_heads_other_than_its_heads(num_kv_heads):
    """Bug: ``from_transformer_conv(conv, num_kv_heads=1)`` built a grouped-query layer and then failed copying the
    convolution's key and value weights into its smaller ``qkv`` with torch's bare "The size of tensor a (16) must
    match the size of tensor b (24)" (``from_multihead_attention`` names the argument); ``num_kv_heads`` equal to the
    convolution's heads still converts."""
    from torch_geometric.nn import TransformerConv

    conv = TransformerConv(8, 4, heads=2, root_weight=False)
    with pytest.raises(ValueError, match=r"num_kv_heads=.*TransformerConv has a key and a value per head.*"
                                         r"num_heads=2"):
        DiffusionAttention.from_transformer_conv(conv, num_kv_heads=num_kv_heads)
    layer = DiffusionAttention.from_transformer_conv(conv.eval(), num_kv_heads=2)
    x, edge_index = torch.randn(5, 8), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    torch.testing.assert_close(layer(x, edge_index), conv(x, edge_index))


@pytest.mark.parametrize("kwargs, came", [
    ({"concat": False}, "concat=False"),
    ({"root_weight": True}, "root_weight=True"),
    ({"beta": True, "root_weight": True}, "root_weight=True, beta=True"),
    ({"edge_dim": 3}, "edge_dim=3"),
])
def test_from_transformer_conv_names_the_settings_that_do_not_convert(kwargs, came):
    """Bug: every convolution that does not convert got the same "only TransformerConv(concat=True,
    root_weight=False, beta=False, edge_dim=None) maps to DiffusionAttention", naming none of its own settings
    (PyG's default is root_weight=True, so most users met it without knowing which of the four it was)."""
    from torch_geometric.nn import TransformerConv

    kwargs = {"root_weight": False, **kwargs}
    with pytest.raises(ValueError, match=f"got {came}$"):
        DiffusionAttention.from_transformer_conv(TransformerConv(8, 4, heads=2, **kwargs))


def test_a_transposed_adj_t_passed_as_graph_gets_the_conversion_that_keeps_its_edges():
    """Bug: ``layer(data.x, data.adj_t)`` (PyG's ``conv(x, adj_t)`` idiom, ``adj_t`` from ``ToSparseTensor``:
    ``adj_t[target, source]``) was refused with the one hint ``to_edge_index(adj)[0]``, which on ``adj_t`` gives
    every edge reversed: a directed graph then ran, without a word, on its transpose."""
    import torch_geometric.transforms as T
    from torch_geometric.data import Data
    from torch_geometric.utils import to_edge_index

    torch.manual_seed(0)
    edge_index = torch.tensor([[0, 1, 2, 0], [1, 2, 3, 3]])  # directed: the transpose is another graph
    data = T.ToSparseTensor()(Data(x=torch.randn(4, 8), edge_index=edge_index))
    layer = DiffusionAttention(8, 2).eval()
    with pytest.raises(TypeError, match=r"adj_t\[target, source\].*to_edge_index\(adj_t\)\[0\]\.flip\(0\)"):
        layer(data.x, data.adj_t)
    converted = to_edge_index(data.adj_t)[0].flip(0)  # the hinted conversion gives back the graph's edges
    torch.testing.assert_close(layer(data.x, converted), layer(data.x, edge_index))


def test_graph_block_with_global_attention_refuses_a_dense_graph_by_name():
    """Bug: a ``GraphBlock(global_attention=True)`` called on a dense graph (a ViT's ``grid``, which the block's
    edge attention takes) failed inside its global layer with "dense input x must have shape (B, N, D), got
    (1, 1, 16, 8)": ``to_dense_batch`` had padded the ``(B, N, D)`` tokens as if they were nodes; the error named
    neither the block nor the graph."""
    from diffusionformer.graph import grid
    from diffusionformer.models import GraphBlock

    torch.manual_seed(0)
    x = torch.randn(1, 16, 8)
    assert GraphBlock(8, 2).eval()(x, grid(4, 4)).shape == (1, 16, 8)  # the edge attention alone takes it
    with pytest.raises(ValueError, match=r"GraphBlock: global attention .* got a dense AttentionGraph"):
        GraphBlock(8, 2, global_attention=True)(x, grid(4, 4))
    nodes, edges = torch.randn(16, 8), grid(4, 4, layout="sparse")  # as the block documents it: nodes (N, D)
    assert GraphBlock(8, 2, global_attention=True)(nodes, edges).shape == (16, 8)


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.int32])
@pytest.mark.parametrize("sized", [False, True])
def test_graph_block_global_attention_takes_the_batch_dtypes_its_graph_takes(dtype, sized):
    """Bug: ``GraphBlock(global_attention=True)(x, edge_index, batch)`` with an int16 or uint8 ``batch`` (which the
    block's graph, ``AttentionGraph.sparse``, takes as graph ids) failed in the global attention with torch's bare
    "scatter(): Expected dtype int32/int64 for index", with or without ``max_num_nodes``/``num_graphs``."""
    from diffusionformer.models import GraphBlock

    torch.manual_seed(0)
    x, batch = torch.randn(6, 8), torch.tensor([0, 0, 0, 1, 1, 1])
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 1], [1, 2, 0, 4, 5, 3, 1]])
    block = GraphBlock(8, 2, global_attention=True).eval()
    sizes = {"max_num_nodes": 3, "num_graphs": 2} if sized else {}
    torch.testing.assert_close(block(x, edge_index, batch.to(dtype), **sizes), block(x, edge_index, batch))


def test_graph_transformer_with_edge_features_refuses_self_loops_on_meta_edges_by_name():
    """Bug: on the meta device (shape inference of a model built under ``with torch.device("meta")``) a
    ``DiffusionGraphTransformer`` with ``self_loops=True`` refuses the edges with "self_loops=True needs the values
    of edge_index, which is on the meta device", but the same model with ``edge_dim`` failed inside PyG's
    ``remove_self_loops`` with torch's "The register_meta function for torch.nonzero() raises unimplemented",
    naming neither the self loops nor the device; with ``self_loops=False`` both run."""
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    for edge_dim in (None, 2):
        with torch.device("meta"):
            x, edge_index, edge_attr = torch.randn(6, 8), torch.randint(0, 6, (2, 7)), torch.randn(7, 2)
            model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=8, dim=8, num_heads=2,
                                                                     edge_dim=edge_dim))
            no_loops = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=8, dim=8, num_heads=2,
                                                                        edge_dim=edge_dim, self_loops=False))
        features = {} if edge_dim is None else {"edge_attr": edge_attr}
        with pytest.raises(ValueError, match=r"self_loops=True needs the values of edge_index, which is on the meta"):
            model(x, edge_index, **features)
        out = no_loops(x, edge_index, **features)
        assert out.shape == (6, 2) and out.is_meta
