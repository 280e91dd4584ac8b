"""Edge probes of the graph-set container (``GraphSetData``): its split indices, sizes and graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")
from torch_geometric.data import Data  # noqa: E402

from diffusionformer.data.base import GraphSetData  # noqa: E402


def _graphs(n: int = 5, features: int = 2) -> list[Data]:
    return [Data(x=torch.full((3, features), float(i)), edge_index=torch.tensor([[0, 1], [1, 0]]),
                 y=torch.tensor([i % 2])) for i in range(n)]


def _data(graphs=None, **kw) -> GraphSetData:
    args = dict(name="g", dataset=_graphs() if graphs is None else graphs, train_idx=torch.tensor([0, 1]),
                val_idx=torch.tensor([2]), test_idx=torch.tensor([3, 4]), num_classes=2, num_features=2)
    args.update(kw)
    return GraphSetData(**args)


def test_bug_graph_set_refuses_split_indices_outside_the_dataset():
    """Bug: a negative index silently picked a graph from the end of the list (a graph of another split could be
    trained on), and one past the end failed at ``split()`` with a bare "list index out of range". Now a
    ``ValueError`` naming the split and the range."""
    with pytest.raises(ValueError, match=r"train_idx: graph ids must lie in \[0, 5\) \(len\(dataset\)\), got range "
                                         r"\[-1, 0\]"):
        _data(train_idx=torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"test_idx: graph ids must lie in \[0, 5\).*\[3, 5\]"):
        _data(test_idx=torch.tensor([3, 5]))


@pytest.mark.parametrize("idx", [torch.tensor([0.0, 1.0]), torch.tensor([[0, 1]]), [0, 1],
                                 torch.tensor([0, 1], dtype=torch.int32)])
def test_bug_graph_set_refuses_split_indices_that_are_not_a_1d_int64_tensor(idx):
    """Bug: float indices were accepted and failed at ``split()`` ("list indices must be integers"), a list failed
    in ``repr`` ("no attribute numel"), a 2-D tensor split into a list of lists. Now refused, the dtype named."""
    with pytest.raises(ValueError, match="train_idx must be a 1-D int64 tensor, got"):
        _data(train_idx=idx)


def test_bug_graph_set_refuses_a_graph_listed_twice_in_a_split():
    """Bug: a repeated index scored (and trained on) that graph twice: the evaluation mean over graphs counted it
    twice. Now a ``ValueError``; the same graph in two splits stays allowed (as NodeData's masks)."""
    with pytest.raises(ValueError, match=r"val_idx lists a graph more than once: \[2, 2\]"):
        _data(val_idx=torch.tensor([2, 2]))
    assert len(_data(test_idx=torch.tensor([1, 3])).split("test")) == 2


@pytest.mark.parametrize("name, value", [("num_classes", 2.0), ("num_classes", True), ("num_features", 2.5),
                                         ("num_features", "2")])
def test_bug_graph_set_sizes_must_be_ints(name, value):
    """Bug: a float or a bool ``num_classes``/``num_features`` was kept and reached the model's head and input
    sizes (``nn.Linear(2.0, ...)`` fails far from the cause). Now a ``TypeError`` naming the argument."""
    with pytest.raises(TypeError, match=f"{name} must be an int, got {value!r}"):
        _data(**{name: value})


def test_graph_set_sizes_of_numpy_and_tensor_ints_become_python_ints():
    data = _data(num_classes=np.int64(2), num_features=torch.tensor(2))
    assert type(data.num_classes) is int and type(data.num_features) is int


def test_bug_graph_set_refuses_a_graph_whose_features_do_not_fit_num_features():
    """Bug: a graph with 5 features in a set of ``num_features=2`` was accepted: the model's first layer failed
    mid-training on the first batch that drew it. Now refused at construction, the graph named."""
    graphs = _graphs()
    graphs[3] = Data(x=torch.zeros(3, 5), edge_index=torch.zeros(2, 0, dtype=torch.long), y=torch.tensor([1]))
    with pytest.raises(ValueError, match=r"graph 3: expected x of shape \(num_nodes, 2\) \(num_features\), got "
                                         r"shape \(3, 5\)"):
        _data(graphs)
    graphs[3] = Data(edge_index=torch.zeros(2, 0, dtype=torch.long), y=torch.tensor([1]), num_nodes=3)
    with pytest.raises(ValueError, match="graph 3: expected x of shape .* got None"):
        _data(graphs)


@pytest.mark.parametrize("y, match", [(torch.tensor([2]), r"graph 4: label must lie in \[0, 2\) \(num_classes\)"),
                                      (torch.tensor([-1]), r"graph 4: label must lie in \[0, 2\)"),
                                      (torch.tensor([1.0]), "graph 4: expected y to be one int64 class label, got "
                                                            r"torch.float32 of shape \(1,\)"),
                                      (torch.tensor([0, 1]), "graph 4: expected y to be one int64 class label")])
def test_bug_graph_set_refuses_labels_that_are_not_one_class_each(y, match):
    """Bug: a label 2 of a 2-class set (or -1) passed and failed at the loss (a device-side assert on a GPU); a
    float label was read by ``cross_entropy`` as class probabilities, two labels on one graph shifted every later
    graph's label in a batch. Now refused at construction, the graph named."""
    graphs = _graphs()
    graphs[4] = Data(x=torch.zeros(2, 2), edge_index=torch.zeros(2, 0, dtype=torch.long), y=y)
    with pytest.raises(ValueError, match=match):
        _data(graphs)


def test_graph_set_accepts_empty_graphs_and_graphs_outside_the_splits_are_not_read():
    """Pins: a graph without nodes (x of shape (0, D)) and an empty split are valid; a graph that no split lists is
    not checked (a loader may keep unused graphs)."""
    graphs = _graphs(6)
    graphs[2] = Data(x=torch.zeros(0, 2), edge_index=torch.zeros(2, 0, dtype=torch.long), y=torch.tensor([0]))
    graphs[5] = Data(x=torch.zeros(1, 9), edge_index=torch.zeros(2, 0, dtype=torch.long), y=torch.tensor([7]))
    data = _data(graphs, test_idx=torch.zeros(0, dtype=torch.long))
    assert [g.num_nodes for g in data.split("val")] == [0] and data.split("test") == []
