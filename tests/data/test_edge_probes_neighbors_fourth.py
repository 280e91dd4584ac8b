"""Edge probes of neighbour-sampled mini-batches, fourth round: a sampler of a same-sized graph with other edges,
seed tensors of the wrong rank, the full-graph evaluation moving the shared dataset; pins of the per-edge uniform
draw with repeated edges, empty and isolated seeds, and fan-outs above the degree."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

from diffusionformer.data.base import NodeData
from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_batch
from diffusionformer.experiments._metrics import full_graph_metrics


def _star() -> Data:
    """Node 0 has six incoming edges, three of them the repeated edge 1 -> 0; node 4 is isolated as a target."""
    return Data(x=torch.arange(5.0).view(5, 1), edge_index=torch.tensor([[1, 1, 1, 2, 3, 4], [0, 0, 0, 0, 0, 0]]),
                num_nodes=5)


def test_bug_neighbor_batch_refuses_a_sampler_of_other_edges_of_the_same_size():
    """Bug: neighbor_batch only compared node and edge counts with the sampler's graph, so a sampler built on the
    reversed graph, on the edges in another order, or before data.edge_index was changed in place, silently gave
    the other graph's edges (edge_index, e_id) with data's node and edge attributes."""
    data = _star()
    sampler = TorchNeighborSampler(data, [-1])
    seeds = torch.tensor([0])
    match = r"neighbor_batch: sampler was built on a graph with other edges than data.edge_index \(same 5 nodes and 6"
    for other in (data.edge_index.flip(0), data.edge_index[:, [5, 4, 3, 2, 1, 0]]):
        with pytest.raises(ValueError, match=match):
            neighbor_batch(Data(x=data.x, edge_index=other, num_nodes=5), sampler, seeds)
    data.edge_index[0, 3] = 4  # in place, after the sampler was built
    with pytest.raises(ValueError, match=match):
        neighbor_batch(data, sampler, seeds)
    data.edge_index[0, 3] = 2  # back: the same edges again
    assert neighbor_batch(data, sampler, seeds).e_id.tolist() == [0, 1, 2, 3, 4, 5]
    same = Data(x=data.x, edge_index=data.edge_index.clone().int(), num_nodes=5)  # an equal copy is fine
    assert neighbor_batch(same, sampler, seeds).n_id.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("node", [torch.tensor(0), torch.tensor([[0], [1]])])
def test_bug_sampler_names_seed_tensors_that_are_not_one_dimensional(node):
    """Bug: TorchNeighborSampler.sample_from_nodes with a 0-d seed tensor failed with torch's "too many indices for
    tensor of dimension 0", and with a 2-d one with "shape mismatch: value tensor of shape [2] cannot be broadcast",
    neither naming the seeds."""
    sampler = TorchNeighborSampler(_star(), [-1])
    with pytest.raises(ValueError, match=re.escape(f"TorchNeighborSampler: expected seed node ids of shape (B,), "
                                                   f"got {tuple(node.shape)}")):
        sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=node))


class _MetaModel(nn.Module):
    """A model whose parameters live on the ``meta`` device (a stand-in for a GPU on a CPU-only machine)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 2, device="meta")

    def forward(self, x, edge_index):
        return self.lin(x)


def test_bug_full_graph_evaluation_leaves_the_dataset_on_its_device():
    """Bug: full_graph_metrics moved the graph with ``data.data.to(device)``, which PyG's Data does in place: after
    the first full evaluation of a GPU model, the shared dataset (and the graph NodeMiniBatchTask samples its
    training batches from, and every other task of the run loaded from it) lived on the GPU."""
    N = 5
    data = _star()
    data.y = torch.zeros(N, dtype=torch.long)
    for name in ("train_mask", "val_mask", "test_mask"):
        setattr(data, name, torch.ones(N, dtype=torch.bool))
    node_data = NodeData("star", data, num_classes=2, num_features=1)
    edge_index = data.edge_index
    with pytest.raises(Exception):  # .item() of a meta tensor: only where the data ended up matters
        full_graph_metrics(_MetaModel(), node_data)
    assert node_data.data.x.device.type == "cpu" and node_data.data.edge_index is edge_index
    assert all(getattr(node_data.data, k).device.type == "cpu" for k in ("y", "train_mask", "val_mask", "test_mask"))


def test_repeated_edges_are_drawn_per_edge_uniformly():
    """Pins: with fan-out 1 each of the six incoming edges of node 0 (three of them the same edge 1 -> 0) is drawn
    with probability 1/6 (per edge, not per distinct neighbour): chi-square over 2400 draws of a fixed generator;
    with fan-out 2 all 15 pairs of edges occur."""
    data = _star()
    g = torch.Generator().manual_seed(0)
    one = TorchNeighborSampler(data, [1])
    counts = torch.zeros(6)
    for _ in range(2400):
        counts[neighbor_batch(data, one, torch.tensor([0]), g).e_id] += 1
    chi2 = float(((counts - 400) ** 2 / 400).sum())
    assert chi2 < 20.5  # 5 degrees of freedom, p = 0.001
    two = TorchNeighborSampler(data, [2])
    pairs = {tuple(sorted(neighbor_batch(data, two, torch.tensor([0]), g).e_id.tolist())) for _ in range(300)}
    assert len(pairs) == 15


def test_empty_isolated_and_fanout_above_degree_seeds():
    """Pins: no seeds give an empty batch; an isolated seed keeps no edges; a fan-out above the degree takes every
    incoming edge (the repeated ones included) and the new nodes in order of first appearance, seeds first."""
    data = _star()
    empty = neighbor_batch(data, TorchNeighborSampler(data, [3]), torch.tensor([], dtype=torch.long))
    assert empty.batch_size == 0 and empty.n_id.numel() == 0 and empty.edge_index.shape == (2, 0)
    b = neighbor_batch(data, TorchNeighborSampler(data, [10, 10]), torch.tensor([4, 0]),
                       torch.Generator().manual_seed(1))
    assert b.n_id.tolist() == [4, 0, 1, 2, 3] and b.batch_size == 2
    assert sorted(b.e_id.tolist()) == [0, 1, 2, 3, 4, 5]
    assert torch.equal(b.n_id[b.edge_index], data.edge_index[:, b.e_id])
