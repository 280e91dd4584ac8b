"""Edge probes of neighbour-sampled mini-batches, second round: seed dtypes on the loader path, a sampler of
another graph, a seed passed as the generator; pins against PyG's k_hop_subgraph and the sampled evaluation's
coverage of the splits."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput
from torch_geometric.utils import k_hop_subgraph

from diffusionformer.data.base import NodeData
from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_batch, neighbor_loader
from diffusionformer.experiments.minibatch import NodeMiniBatchTask


def _graph(N: int = 5) -> Data:
    return Data(x=torch.arange(float(N)).view(N, 1), edge_index=torch.tensor([[1, 2, 3, 4], [0, 0, 1, 2]]),
                num_nodes=N)


def test_bug_the_sampler_refuses_float_and_bool_seed_ids():
    """Bug: TorchNeighborSampler.sample_from_nodes (what neighbor_loader iterates) read seeds with ``.long()``, so
    ``neighbor_loader(..., input_nodes=torch.tensor([0.0, 2.7]))`` silently sampled nodes 0 and 2 (PyG's compiled
    samplers refuse float seeds), and a bool mask given to it directly was refused as "repeated node ids [1]"."""
    data = _graph()
    with pytest.raises(TypeError, match=r"neighbor_loader: expected input_nodes integer node ids or a bool mask, "
                                        r"got dtype torch.float32"):  # refused when the loader is built (44b)
        neighbor_loader(data, [-1], batch_size=2, input_nodes=torch.tensor([0.0, 2.7]), force_torch=True)
    sampler = TorchNeighborSampler(data, [-1])
    for seeds in (torch.tensor([True, False, True]), torch.tensor([1.0], dtype=torch.float64)):
        with pytest.raises(TypeError, match=rf"expected integer seed node ids, got dtype {seeds.dtype}"):
            sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds))
    out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor([0], dtype=torch.int32)))
    assert out.node.tolist() == [0, 1, 2] and out.node.dtype == torch.long  # integer ids of any width still work


def test_bug_neighbor_batch_refuses_a_sampler_of_another_graph():
    """Bug: neighbor_batch(data, sampler, seeds) with a sampler built on another graph (before a transform added
    self-loops, or on a subgraph) silently took that graph's edges and gathered data's node and edge attributes by
    its ids: edge attributes of the wrong edges, or nodes of the other graph."""
    data = _graph()
    data.edge_attr = torch.arange(4.0)
    looped = Data(x=data.x, edge_index=torch.cat([data.edge_index, torch.tensor([[0], [0]])], 1), num_nodes=5)
    with pytest.raises(ValueError, match=r"neighbor_batch: sampler was built on a graph of 5 nodes and 5 edges, "
                                         r"data has 5 nodes and 4 edges; build the sampler on data"):
        neighbor_batch(data, TorchNeighborSampler(looped, [-1]), torch.tensor([0]))
    small = Data(x=torch.zeros(3, 1), edge_index=torch.tensor([[1, 2, 0, 1], [0, 0, 1, 2]]), num_nodes=3)
    with pytest.raises(ValueError, match=r"graph of 5 nodes and 4 edges, data has 3 nodes and 4 edges"):
        neighbor_batch(small, TorchNeighborSampler(data, [-1]), torch.tensor([0]))
    batch = neighbor_batch(data, TorchNeighborSampler(data, [-1]), torch.tensor([0]))  # its own graph: as before
    assert batch.n_id.tolist() == [0, 1, 2] and torch.equal(batch.edge_attr, data.edge_attr[batch.e_id])


def test_bug_a_seed_passed_as_the_sampler_generator_is_named():
    """Bug: ``TorchNeighborSampler(data, [2], generator=0)`` and ``neighbor_batch(..., generator=0)`` were accepted
    and failed at the first draw in torch with "rand() received an invalid combination of arguments - got (...,
    generator=int)" (with ``-1`` neighbours, which draw nothing, the int was kept silently)."""
    data = _graph()
    with pytest.raises(TypeError, match=r"TorchNeighborSampler: generator must be a torch.Generator, got int "
                                        r"\(for a seed, pass torch.Generator\(\).manual_seed\(seed\)\)"):
        TorchNeighborSampler(data, [-1], generator=0)
    with pytest.raises(TypeError, match=r"neighbor_batch: generator must be a torch.Generator, got int \(for a seed"):
        neighbor_batch(data, TorchNeighborSampler(data, [1]), torch.tensor([0]), 7)
    with pytest.raises(TypeError, match=r"TorchNeighborSampler: generator must be a torch.Generator, got int"):
        neighbor_loader(data, [1], batch_size=1, force_torch=True, generator=3)
    g = torch.Generator().manual_seed(0)
    assert neighbor_batch(data, TorchNeighborSampler(data, [1], generator=g), torch.tensor([0]), g).batch_size == 1


def test_all_neighbours_equal_pyg_k_hop_subgraph_with_attributes_in_edge_order():
    """Pins: with ``[-1] * L`` the batch's nodes are PyG's ``k_hop_subgraph(seeds, L, flow="source_to_target")``
    (seeds first, in order), its edges exactly the edges into the ``L - 1``-hop subset (directional sampling), each
    local edge maps back to its original edge, and node / edge attributes are gathered by ``n_id`` / ``e_id``; on
    random directed graphs with self-loops and repeated edges."""
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        N = int(torch.randint(1, 20, (1,), generator=g))
        E = int(torch.randint(0, 60, (1,), generator=g))
        ei = torch.randint(0, N, (2, E), generator=g)
        L = int(torch.randint(1, 4, (1,), generator=g))
        seeds = torch.randperm(N, generator=g)[: int(torch.randint(1, N + 1, (1,), generator=g))]
        data = Data(x=torch.randn(N, 2, generator=g), y=torch.arange(N), edge_index=ei,
                    edge_attr=torch.randn(E, 3, generator=g), edge_weight=torch.randn(E, generator=g), num_nodes=N)
        b = neighbor_batch(data, TorchNeighborSampler(data, [-1] * L), seeds)
        subset = k_hop_subgraph(seeds, L, ei, num_nodes=N, flow="source_to_target")[0]
        inner = k_hop_subgraph(seeds, L - 1, ei, num_nodes=N, flow="source_to_target")[0] if L > 1 else seeds
        assert b.n_id[: seeds.numel()].tolist() == seeds.tolist() and b.batch_size == seeds.numel()
        assert sorted(b.n_id.tolist()) == subset.tolist()
        assert sorted(b.e_id.tolist()) == torch.isin(ei[1], inner).nonzero().view(-1).tolist()
        assert torch.equal(b.n_id[b.edge_index], ei[:, b.e_id])  # source -> target kept
        assert torch.equal(b.edge_attr, data.edge_attr[b.e_id]) and torch.equal(b.edge_weight, data.edge_weight[b.e_id])
        assert torch.equal(b.x, data.x[b.n_id]) and torch.equal(b.y, b.n_id)


class _Recorder(nn.Module):
    """Logits from each node's own feature; records the seeds (the nodes of each batch's first rows) it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 2)
        self.seen: list[list[int]] = []

    def forward(self, x, edge_index):
        self.seen.append(x[:, 0].long().tolist())
        return self.lin(x)


def test_sampled_evaluation_scores_every_node_of_each_split_once_in_order():
    """Pins: ``eval="sampled"`` scores the val then the test nodes, each exactly once, in batches of
    ``eval_batch_size`` (the last one partial), as seeds first in each batch."""
    N = 23
    x = torch.arange(float(N)).view(N, 1)
    i = torch.arange(N)
    edge_index = torch.stack([torch.cat([i, (i + 1) % N]), torch.cat([(i + 1) % N, i])])
    masks = [torch.zeros(N, dtype=torch.bool) for _ in range(3)]
    for m, idx in zip(masks, ([0, 1, 2], [3, 5, 7, 9, 11, 13, 15], [4, 6, 8, 10, 12, 14, 16, 17, 18, 19, 20, 21, 22])):
        m[idx] = True
    data = NodeData("ring", Data(x=x, edge_index=edge_index, y=torch.zeros(N, dtype=torch.long), train_mask=masks[0],
                                 val_mask=masks[1], test_mask=masks[2]), num_classes=2, num_features=1)
    model = _Recorder()
    NodeMiniBatchTask(data, [2, 1], 2, eval="sampled", eval_batch_size=3).evaluate(model, None)
    assert len(model.seen) == 8  # 7 val nodes in 3 batches, 13 test nodes in 5
    seeds = [rows[: min(3, len(rows))] for rows in model.seen]
    sizes = [3, 3, 1, 3, 3, 3, 3, 1]
    assert [s[:k] for s, k in zip(seeds, sizes)] == [[3, 5, 7], [9, 11, 13], [15], [4, 6, 8], [10, 12, 14],
                                                     [16, 17, 18], [19, 20, 21], [22]]
