"""Node and graph-set data refuse features no model can read (sitting 48): ``x`` must be floating point (float32 for
the library's float32 models; a float64 model reads float64 data)."""

from __future__ import annotations

import pytest
import torch

torch_geometric = pytest.importorskip("torch_geometric")
from torch_geometric.data import Data  # noqa: E402

from diffusionformer.data import GraphSetData, NodeData  # noqa: E402


def _node_data(x):
    masks = {f"{s}_mask": torch.tensor([i == j for j in range(4)]) for s, i in (("train", 0), ("val", 1), ("test", 2))}
    data = Data(x=x, edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]), y=torch.tensor([0, 1, 0, 1]), **masks)
    return NodeData("toy", data, num_classes=2, num_features=x.shape[1])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_node_data_refuses_features_that_are_not_floating_point(dtype):
    """Bug: NodeData took int or bool (one-hot) ``x`` although its docstring promises float features; the run failed
    at its first step inside the model's first layer ("mat1 and mat2 must have the same dtype")."""
    with pytest.raises(ValueError, match=rf"expected x to be a floating-point tensor .*got {dtype}"):
        _node_data(torch.ones(4, 3, dtype=dtype))
    for ok in (torch.float32, torch.float64):  # float32 as before; float64 for a float64 model
        assert _node_data(torch.ones(4, 3, dtype=ok)).num_features == 3


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_graph_set_data_refuses_a_listed_graph_with_features_that_are_not_floating_point(dtype):
    """Bug: GraphSetData took a graph with int or bool ``x`` (TU node labels one-hot as int64); the run failed at its
    first batch inside the model. The graph is named."""
    graphs = [Data(x=torch.ones(3, 2), edge_index=torch.tensor([[0, 1], [1, 2]]), y=torch.tensor([i % 2]))
              for i in range(3)]
    graphs[2].x = graphs[2].x.to(dtype)
    split = {"train_idx": torch.tensor([0]), "val_idx": torch.tensor([1]), "test_idx": torch.tensor([2])}
    with pytest.raises(ValueError, match=rf"graph 2: expected x to be a floating-point tensor .*got {dtype}"):
        GraphSetData("toy", graphs, num_classes=2, num_features=2, **split)
    graphs[2].x = graphs[2].x.float()
    assert GraphSetData("toy", graphs, num_classes=2, num_features=2, **split).num_features == 2
