"""A PyG user's node-classification walk (Planetoid-style masks, ``neighbor_loader``, the runner's node tasks): what
it found. Each test failed before its fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch_geometric.data import Data

from diffusionformer.data.base import NodeData
from diffusionformer.data.neighbors import neighbor_loader
from diffusionformer.experiments.config import TaskConfig
from diffusionformer.experiments.minibatch import NodeMiniBatchTask
from diffusionformer.experiments.results import first_reach
from diffusionformer.experiments.tasks import NodeTask


def _chain(n: int = 6) -> Data:
    """``0 <- 1 <- ... <- n-1`` plus node features."""
    edge_index = torch.stack([torch.arange(1, n), torch.arange(n - 1)])
    return Data(x=torch.randn(n, 3), edge_index=edge_index, num_nodes=n)


@pytest.mark.parametrize("seeds, error, match", [
    (np.array([True, False, True]), ValueError, "one entry per node"),  # PyG read its nonzero entries as ids 0, 2
    (np.array([0.7, 2.2]), TypeError, "integer node ids or a bool mask"),  # truncated to ids 0, 2
    (np.array([0, 9]), ValueError, r"must lie in \[0, num_nodes=6\)"),  # refused only at the batch holding 9
])
def test_bug_numpy_input_nodes_are_checked_when_the_loader_is_built(seeds, error, match):
    """Bug: ``input_nodes`` as a NumPy array (``np.where(mask)[0]``, a NumPy mask) skipped the checks that a tensor or
    a list gets: a bool mask of the wrong length was read as the ids of its nonzero entries, float ids were truncated,
    and an id outside the graph surfaced at the batch that held it. A NumPy array is now checked as a list is."""
    with pytest.raises(error, match=match):
        neighbor_loader(_chain(), [-1], batch_size=2, input_nodes=seeds)


@pytest.mark.parametrize("as_given", [list, tuple, np.array, torch.tensor])
def test_bug_a_bool_mask_not_given_as_a_tensor_selects_its_nodes(as_given):
    """Bug: a bool mask as a list, tuple or NumPy array (``data.train_mask.numpy()``) passed the mask check, then
    PyG read it as the node ids 1 and 0 (``torch.tensor(mask, dtype=torch.long)``): the loader iterated over nodes 0
    and 1 only, each several times. It is now handed to PyG as the bool tensor it holds."""
    mask = [True, False, False, True, False, True]
    loader = neighbor_loader(_chain(), [-1], batch_size=2, input_nodes=as_given(mask))
    assert [b.n_id[: b.batch_size].tolist() for b in loader] == [[0, 3], [5]]


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@pytest.mark.parametrize("seeds, expected", [(np.array([5, 0]), [[5, 0]]), (_read_only(np.array([5, 0])), [[5, 0]]),
                                             ([], []), (range(2, 5), [[2, 3], [4]])])
@pytest.mark.filterwarnings("error::UserWarning")
def test_seed_ids_not_given_as_a_tensor_load_as_given(seeds, expected):
    """Ids as a NumPy array (a read-only one without torch's warning that it cannot share it) or a range load as
    given; an empty list (refused before as float32 ids, from ``torch.as_tensor([])``) gives an empty loader, as an
    empty tensor does."""
    loader = neighbor_loader(_chain(), [-1], batch_size=2, input_nodes=seeds)
    assert [b.n_id[: b.batch_size].tolist() for b in loader] == expected


def test_bug_a_numpy_int_batch_size_builds_the_loader():
    """Bug: ``batch_size=np.int64(2)`` (a sweep grid's value) passed ``neighbor_loader``'s own check, then the
    ``DataLoader`` refused it with "batch_size should be a positive integer value, but got batch_size=2"."""
    loader = neighbor_loader(_chain(), [-1], batch_size=np.int64(2))
    assert [int(b.batch_size) for b in loader] == [2, 2, 2]


class _NodeLogits(nn.Module):
    """Logits = the first ``C`` feature columns of each node (its id's row, in the whole graph or a sampled batch)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.unused = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return x[:, : self.num_classes]


def _seven_of_ten_correct() -> NodeData:
    """10 val and 10 test nodes (and 2 train), 7 of each split's predictions right: accuracy 0.7."""
    N, C = 22, 2
    y = torch.zeros(N, dtype=torch.long)
    wrong = torch.zeros(N, dtype=torch.bool)
    wrong[[2, 3, 4, 12, 13, 14]] = True  # 3 of val (2..11) and 3 of test (12..21)
    x = torch.zeros(N, C)
    x[:, 0] = torch.where(wrong, 0.0, 1.0)  # class 0 predicted where not wrong
    x[:, 1] = torch.where(wrong, 1.0, 0.0)
    masks = {name: torch.zeros(N, dtype=torch.bool) for name in ("train_mask", "val_mask", "test_mask")}
    masks["train_mask"][:2] = True
    masks["val_mask"][2:12] = True
    masks["test_mask"][12:] = True
    edge_index = torch.stack([torch.arange(1, N), torch.arange(N - 1)])
    data = Data(x=x, edge_index=edge_index, y=y, num_nodes=N, **masks)
    return NodeData(name="seven", data=data, num_classes=C, num_features=C)


def test_bug_full_graph_accuracy_is_the_exact_fraction():
    """Bug: the full-graph evaluation of a node task took the accuracy as a float32 mean: 7 of 10 right read
    0.699999988, so ``reach = { val_acc = 0.7 }`` was not met by predictions that meet it, and the same model's
    ``eval = "sampled"`` evaluation (a float64 count) said 0.7. Now both count in float64."""
    nodes = _seven_of_ten_correct()
    model = _NodeLogits(2)
    full = NodeTask(nodes).evaluate(model, None)
    assert (full["val_acc"], full["test_acc"]) == (0.7, 0.7)
    sampled = NodeMiniBatchTask(nodes, [-1], 2, eval="sampled", eval_batch_size=4).evaluate(model, None)
    assert (sampled["val_acc"], sampled["test_acc"]) == (full["val_acc"], full["test_acc"])
    task = TaskConfig("t", "cora", "graph-node-small", reach={"val_acc": 0.7})
    assert first_reach([{"split": "eval", "step": 10, "metrics": full}], task) == 10


@pytest.mark.parametrize("heads, R", [("attention:2", 2), ("laplacian:2", 2), ("heat(steps=2):2", 4),
                                      ("ppr(steps=3):1,laplacian:1", 6)])
def test_loader_batches_with_all_neighbours_over_R_hops_give_the_full_batch_outputs(heads, R):
    """Mini-batch inference as a PyG user writes it (``num_neighbors=[-1] * R``, seeds from a bool mask, model in
    eval mode with dropout set) is the full-batch forward on the seeds, in float64, on a directed graph with
    isolated nodes; one hop fewer is not."""
    from diffusionformer.experiments.minibatch import propagation_hops
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    N = 200
    edge_index = torch.randint(0, N - 2, (2, 300))  # nodes N-2, N-1 isolated; sparse, so R hops reach beyond R - 1
    data = Data(x=torch.randn(N, 5, dtype=torch.float64), edge_index=edge_index, num_nodes=N)
    cfg = GraphTransformerConfig(in_channels=5, num_classes=3, dim=8, depth=2, num_heads=2, heads=heads, dropout=0.5,
                                 attn_dropout=0.5)
    model = DiffusionGraphTransformer(cfg).double().eval()
    assert propagation_hops(model) == R
    mask = torch.rand(N) < 0.2
    mask[-1] = True
    with torch.no_grad():
        full = model(data.x, edge_index)
        for hops, exact in ((R, True), (R - 1, False)):
            out = [(model(b.x, b.edge_index)[: b.batch_size], b.n_id[: b.batch_size])
                   for b in neighbor_loader(data, [-1] * hops, batch_size=16, input_nodes=mask)]
            seeds = torch.cat([n for _, n in out])
            assert torch.equal(seeds, mask.nonzero().view(-1))
            close = torch.allclose(torch.cat([o for o, _ in out]), full[seeds], rtol=1e-12, atol=1e-12)
            assert close == exact, hops
