"""An integer tensor in the graph's place is the ``edge_index`` shorthand: ``attn(x, edge_index)``, PyG's
``conv(x, edge_index)``, so the layers run inside :class:`torch_geometric.nn.Sequential` and in the loops users
write over PyG convolutions."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.nn import Block, DiffusionAttention

EDGES = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2]])


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_positional_edge_index_is_the_shorthand(dtype):
    """Bug: ``attn(x, edge_index)`` raised "graph must be an AttentionGraph, got Tensor"."""
    torch.manual_seed(0)
    attn = DiffusionAttention(16, 4, "attention:2,heat(t=0.5, steps=2):2")
    x = _x(5, 16)
    assert torch.equal(attn(x, EDGES.to(dtype)), attn(x, edge_index=EDGES.to(dtype)))
    blk = Block(16, 4, "laplacian:1,attention:3")
    assert torch.equal(blk(x, EDGES), blk(x, edge_index=EDGES))


def test_in_pyg_sequential():
    """Bug: ``torch_geometric.nn.Sequential('x, edge_index', [(attn, 'x, edge_index -> x'), ...])`` raised."""
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    attn, blk = DiffusionAttention(16, 4, "laplacian:2,attention:2"), Block(16, 4)
    model = pyg_nn.Sequential("x, edge_index", [(attn, "x, edge_index -> x"), torch.nn.ReLU(),
                                                (blk, "x, edge_index -> x")])
    x = _x(5, 16)
    assert torch.equal(model(x, EDGES), blk(torch.relu(attn(x, edge_index=EDGES)), edge_index=EDGES))


@pytest.mark.parametrize("bad", [torch.ones(5, 5, dtype=torch.bool), torch.zeros(5, 5)], ids=["bool", "float"])
def test_a_mask_in_the_graph_place_is_refused_with_the_right_keyword(bad):
    attn = DiffusionAttention(16, 4)
    with pytest.raises(TypeError, match=r"read as edge_index.*attn_mask= or key_padding_mask="):
        attn(_x(1, 5, 16), bad)


def test_tensor_graph_with_a_shorthand_is_refused():
    attn = DiffusionAttention(16, 4)
    with pytest.raises(ValueError, match="read as edge_index: pass it, or the shorthands .*, not both"):
        attn(_x(5, 16), EDGES, edge_index=EDGES)
    with pytest.raises(ValueError, match="cache= runs causal decoding"):
        DiffusionAttention(16, 4, causal=True)(_x(1, 1, 16), EDGES, cache=object())


def test_positional_edge_index_is_checked_as_the_keyword():
    attn = DiffusionAttention(16, 4)
    with pytest.raises(Exception) as positional:
        attn(_x(5, 16), torch.tensor([[0, 9], [1, 2]]))
    with pytest.raises(Exception) as keyword:
        attn(_x(5, 16), edge_index=torch.tensor([[0, 9], [1, 2]]))
    assert type(positional.value) is type(keyword.value) and str(positional.value) == str(keyword.value)
