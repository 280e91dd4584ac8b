"""Edge probes of a demanding PyTorch Geometric user: sparse layers over ``edge_index``, the graph transformer, the
TU and Planetoid loaders (sitting 57).

Bugs found (each test named ``test_bug_*``):

* a layer (``DiffusionAttention``, ``Block``, ``GraphBlock``) given an ``edge_index``, or a graph's mask, on the meta
  device while ``x`` holds values failed with torch's bare "Cannot copy out of meta tensor; no data!" naming no
  argument (``AttentionGraph.attention_kwargs`` copied them to ``x``'s device), where the model and the layer's
  ``B = 0`` path name it;
* a ``GraphBlock`` built with ``edge_dim`` and called as a PyG convolution, ``block(x, edge_index, batch, edge_attr)``,
  attended over edges between two graphs of ``batch`` without a word (the edge-feature path read the unchecked
  graph's edges directly, skipping the block-diagonal check the graph defers to the call), where the same block
  without ``edge_dim``, and the graph transformer, refuse them.

Checked without finding a bug: every registered operator on sparse input against the same graph as a dense mask
(float64, self loops present or absent, isolated nodes, unsorted and int32 edges, causal, GQA, q/k norm, RoPE, layer
state over two calls), gradcheck and gradgradcheck of the sparse kernels on both back-ends (empty graphs, one node,
duplicate edges), the CSR and native edge weights against a hand-written softmax on 200 random graphs, batches of
graphs of 0 to 500 nodes against each graph alone (every pool, global attention, PE, edge features, int32 ids),
``neighbor_loader`` with all neighbours against full-batch outputs, ``torch.compile`` of the layer and the model, state
dict round trips, autocast and bfloat16 layers, ``to_dense``/``to_sparse`` and the graph builders in both layouts,
``knn`` against brute force, the Planetoid loaders against PyG's ``Planetoid`` and the TU loaders with a tiny model.
"""

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.graph import AttentionGraph
from diffusionformer.models import GraphBlock
from diffusionformer.nn import Block


def _meta_edges() -> torch.Tensor:
    return torch.tensor([[0, 1, 2], [1, 2, 3]], device="meta")


@pytest.mark.parametrize("call", ["layer", "layer-keyword", "graph", "block"])
def test_bug_meta_edge_index_beside_real_x_is_named(call):
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    layer = DiffusionAttention(8, 2, heads="attention:1,laplacian:1")
    run = {
        "layer": lambda: layer(x, _meta_edges()),
        "layer-keyword": lambda: layer(x, edge_index=_meta_edges()),
        "graph": lambda: layer(x, AttentionGraph.sparse(_meta_edges(), 4, checked=False)),
        "block": lambda: Block(8, 2)(x, _meta_edges()),
    }[call]
    with pytest.raises(ValueError, match=r"edge_index is on the meta device.*device of x \(cpu\)"):
        run()


@pytest.mark.parametrize("name", ["key_padding_mask", "allowed", "attn_mask"])
def test_bug_meta_dense_graph_mask_beside_real_x_is_named(name):
    x = torch.randn(2, 4, 8)
    mask = (torch.zeros(2, 4, dtype=torch.bool) if name == "key_padding_mask"
            else torch.ones(4, 4, dtype=torch.bool)).to("meta")
    layer = DiffusionAttention(8, 2)
    with pytest.raises(ValueError, match=f"{name} is on the meta device"):
        layer(x, AttentionGraph.dense(4, **{name: mask}))
    if name != "allowed":  # the shorthand builds the same graph
        with pytest.raises(ValueError, match=f"{name} is on the meta device"):
            layer(x, **{name: mask})


def test_meta_graph_on_a_meta_layer_still_infers_shapes():
    layer = DiffusionAttention(8, 2, device="meta")
    assert layer(torch.empty(4, 8, device="meta"), _meta_edges()).shape == (4, 8)
    kpm = torch.zeros(2, 4, dtype=torch.bool, device="meta")
    assert layer(torch.empty(2, 4, 8, device="meta"), key_padding_mask=kpm).is_meta


@pytest.mark.parametrize("global_attention", [False, True])
@pytest.mark.parametrize("edges, batch", [
    ([[0, 1, 2, 3], [1, 2, 3, 4]], [0, 0, 1, 1, 1]),  # 1 -> 2 joins graph 0 to graph 1
    ([[0], [1]], [0, 1, 1, 1, 1]),
])
def test_bug_graph_block_with_edge_features_refuses_edges_across_graphs(global_attention, edges, batch):
    torch.manual_seed(0)
    x, edge_index, batch = torch.randn(5, 8), torch.tensor(edges), torch.tensor(batch)
    edge_attr = torch.randn(edge_index.shape[1], 3)
    plain = GraphBlock(8, 2, global_attention=global_attention)
    with pytest.raises(ValueError, match="connects nodes of different graphs"):
        plain(x, edge_index, batch)
    block = GraphBlock(8, 2, edge_dim=3, global_attention=global_attention)
    with pytest.raises(ValueError, match="connects nodes of different graphs"):
        block(x, edge_index, batch, edge_attr)
    with pytest.raises(ValueError, match="connects nodes of different graphs"):
        block(x, AttentionGraph.sparse(edge_index, 5, batch=batch, checked=False), batch, edge_attr)


def test_graph_block_with_edge_features_as_a_conv_equals_the_model_graph():
    """Pin: block-diagonal edges still run, and the bare edge_index gives the output of the checked graph."""
    torch.manual_seed(0)
    x, batch = torch.randn(5, 8, dtype=torch.float64), torch.tensor([0, 0, 1, 1, 1])
    edge_index = torch.tensor([[0, 1, 2, 3, 4], [1, 0, 3, 4, 2]])
    edge_attr = torch.randn(5, 3, dtype=torch.float64)
    block = GraphBlock(8, 2, edge_dim=3, global_attention=True).double()
    torch.testing.assert_close(block(x, edge_index, batch, edge_attr),
                               block(x, AttentionGraph.sparse(edge_index, 5, batch=batch), batch, edge_attr),
                               rtol=0, atol=0)
