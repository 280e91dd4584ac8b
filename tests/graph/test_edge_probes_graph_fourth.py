"""Edge-case probes of the token and node graphs, fourth round: the dense-weights export of a bare edge_index and the
neighbour loader's PyG options with the pure-PyTorch sampler. (Builders, kNN, conversions, interop, CSBM, neighbour
sampling and splits were also compared with brute-force references in this round and agreed.)"""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.sampler.base import SubgraphType

from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_loader
from diffusionformer.graph import to_networkx


def test_bug_to_networkx_refuses_edges_between_sequences_of_dense_weights() -> None:
    """Bug: with dense weights ``(B, H, N, N)`` and a bare edge_index, an edge from node ``b N + j`` to node
    ``b' N + i`` of another sequence was exported with the weight of ``j -> i`` in sequence ``b'``
    (``weights[dst // N, :, dst % N, src % N]``), an edge that no attention of the layer has."""
    w = torch.arange(8.0, dtype=torch.float64).view(2, 1, 2, 2)  # B=2, H=1, N=2: nodes 0, 1 | 2, 3
    with pytest.raises(ValueError, match=r"1 edge\(s\) between different sequences .*\(2, 1, 2, 2\)"):
        to_networkx(torch.tensor([[3], [0]]), w)  # node 3 (sequence 1) -> node 0 (sequence 0)
    G = to_networkx(torch.tensor([[1, 3], [0, 2]]), w)  # within the sequences: P[b, i, j]
    assert sorted(G.edges(data="weight")) == [(1, 0, float(w[0, 0, 0, 1])), (3, 2, float(w[1, 0, 0, 1]))]


def _star() -> Data:
    """Node 0 has the in-edges 1, 2, 3 -> 0; node 1 has 0, 2 -> 1."""
    return Data(x=torch.arange(4.0).view(4, 1), edge_index=torch.tensor([[1, 2, 3, 0, 2], [0, 0, 0, 1, 1]]),
                num_nodes=4)


@pytest.mark.parametrize("option", [
    {"subgraph_type": "induced"},
    {"subgraph_type": SubgraphType.bidirectional},
    {"replace": True},
    {"disjoint": True},
    {"weight_attr": "w"},
    {"time_attr": "t"},
    {"temporal_strategy": "last"},
    {"directed": False},
])
def test_bug_neighbor_loader_refuses_options_the_torch_sampler_ignores(option: dict) -> None:
    """Bug: with TorchNeighborSampler (no pyg-lib / torch-sparse, or force_torch=True), the NeighborLoader options
    that only PyG's own sampler reads (subgraph_type='induced', replace, disjoint, weight_attr, time_attr, ...) were
    dropped without a word: the batches were plain directional samples, and a weight_attr or time_attr naming no
    attribute at all was accepted. A caller's own neighbor_sampler= was also replaced by a TorchNeighborSampler."""
    data = _star()
    (name, value), = option.items()
    with pytest.raises(ValueError, match=rf"neighbor_loader: {name}=.* needs PyG's compiled sampler"):
        neighbor_loader(data, [1], batch_size=1, force_torch=True, **option)


def test_bug_neighbor_loader_keeps_default_options_and_the_callers_sampler() -> None:
    """Bug (see the test above): the defaults, spelled out, still load; a caller's neighbor_sampler= was replaced
    by a TorchNeighborSampler of num_neighbors when no compiled sampler was installed."""
    data = _star()
    defaults = dict(replace=False, subgraph_type=SubgraphType.directional, disjoint=False, temporal_strategy="uniform",
                    time_attr=None, weight_attr=None, input_time=None, directed=True)
    batch = next(iter(neighbor_loader(data, [-1], batch_size=1, force_torch=True, **defaults)))
    assert batch.n_id.tolist() == [0, 1, 2, 3] and batch.edge_index.tolist() == [[1, 2, 3], [0, 0, 0]]
    own = TorchNeighborSampler(data, [-1, -1])  # two hops, whatever num_neighbors says
    batch = next(iter(neighbor_loader(data, [1], batch_size=1, neighbor_sampler=own)))
    assert sorted(batch.e_id.tolist()) == [0, 1, 2, 3, 4]  # the second hop's edges 0, 2 -> 1 too
    with pytest.raises(ValueError, match="force_torch=True and neighbor_sampler= both choose the sampler"):
        neighbor_loader(data, [1], batch_size=1, force_torch=True, neighbor_sampler=own)
