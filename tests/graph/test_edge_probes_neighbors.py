"""Edge probes of neighbour-sampled mini-batches: TorchNeighborSampler against brute force, neighbor_loader's
coverage of the targets, DataLoader workers' random streams."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.utils.data._utils.worker as worker_state
from scipy.stats import chisquare
from torch.utils.data._utils.worker import WorkerInfo
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_loader


def _star(num_sources: int = 30, num_targets: int = 1) -> Data:
    """Targets 0 .. num_targets-1, each with an incoming edge from every one of num_sources other nodes."""
    src = torch.arange(num_targets, num_targets + num_sources).repeat(num_targets)
    dst = torch.arange(num_targets).repeat_interleave(num_sources)
    N = num_targets + num_sources
    return Data(x=torch.arange(float(N)).view(N, 1), y=torch.arange(N), edge_index=torch.stack([src, dst]),
                num_nodes=N)


def _draw(sampler: TorchNeighborSampler, seeds: list[int]) -> list[int]:
    return sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor(seeds))).node.tolist()


def test_bug_worker_copies_of_the_generator_draw_afresh(monkeypatch) -> None:
    """Bug: with a generator= and num_workers > 0, every DataLoader worker drew from its copy of the sampler's
    generator, all in the same state and (workers not persisting) copied afresh each epoch, so the workers sampled
    the same neighbourhoods as each other and every epoch repeated the first one's."""
    sampler = TorchNeighborSampler(_star(), [3], generator=torch.Generator().manual_seed(0))

    def in_worker(worker_id: int, seed: int) -> list[int]:  # a fresh copy, as a worker (or an epoch's) gets
        copy = pickle.loads(pickle.dumps(sampler))
        monkeypatch.setattr(worker_state, "_worker_info", WorkerInfo(id=worker_id, num_workers=2, seed=seed, dataset=None))
        try:
            return _draw(copy, [0])
        finally:
            monkeypatch.setattr(worker_state, "_worker_info", None)

    base = 987654321
    worker0, worker1 = in_worker(0, base), in_worker(1, base + 1)
    next_epoch = in_worker(0, 123456789)
    assert worker0 != worker1 and worker0 != next_epoch
    assert in_worker(0, base) == worker0  # deterministic given the worker seed and the generator
    for nodes in (worker0, worker1, next_epoch):  # still 3 distinct true in-neighbours
        assert nodes[0] == 0 and len(set(nodes[1:])) == 3 and all(1 <= v <= 30 for v in nodes[1:])
    assert torch.utils.data.get_worker_info() is None
    # the main process draws from the generator itself, as before
    g_state = torch.Generator().manual_seed(5)
    a = TorchNeighborSampler(_star(), [3], generator=g_state)
    b = TorchNeighborSampler(_star(), [3], generator=torch.Generator().manual_seed(5))
    assert _draw(a, [0]) == _draw(b, [0]) and a._worker_generator is None


def test_neighbours_are_drawn_uniformly_without_replacement() -> None:
    sampler = TorchNeighborSampler(_star(7), [3], generator=torch.Generator().manual_seed(0))
    counts = [0] * 8
    for _ in range(2000):
        nodes = _draw(sampler, [0])
        assert len(nodes) == 4 and len(set(nodes)) == 4 and nodes[0] == 0
        for v in nodes[1:]:
            counts[v] += 1
    assert counts[0] == 0 and sum(counts) == 6000
    assert chisquare(counts[1:]).pvalue > 1e-3  # each neighbour 3/7 of the draws


def test_each_hop_samples_min_fanout_degree_true_in_edges_against_brute_force() -> None:
    g = torch.Generator().manual_seed(1)
    for trial in range(30):
        N = int(torch.randint(1, 15, (1,), generator=g))
        ei = torch.randint(0, N, (2, int(torch.randint(0, 40, (1,), generator=g))), generator=g)  # loops, repeats
        fan = [int(k) or 1 for k in torch.randint(-1, 4, (3,), generator=g)]
        sampler = TorchNeighborSampler(Data(edge_index=ei, num_nodes=N), fan, generator=torch.Generator().manual_seed(trial))
        seeds = torch.randperm(N, generator=g)[: int(torch.randint(0, N + 1, (1,), generator=g))]
        out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds))
        nodes, eids = out.node.tolist(), out.edge.tolist()
        assert nodes[: seeds.numel()] == seeds.tolist() and len(set(nodes)) == len(nodes) == sum(out.num_sampled_nodes)
        assert len(set(eids)) == len(eids) == sum(out.num_sampled_edges)
        for r, c, e in zip(out.row.tolist(), out.col.tolist(), eids):  # local ids map back to the edge's ends
            assert (nodes[r], nodes[c]) == (int(ei[0, e]), int(ei[1, e]))
        first, eoff, frontier = 0, 0, range(seeds.numel())
        for hop, k in enumerate(fan):
            cols = out.col[eoff: eoff + out.num_sampled_edges[hop]].tolist()
            for f in frontier:
                deg = int((ei[1] == nodes[f]).sum())
                assert cols.count(f) == (deg if k == -1 else min(k, deg)), (trial, hop, f)
            eoff += out.num_sampled_edges[hop]
            first += out.num_sampled_nodes[hop]
            frontier = range(first, first + out.num_sampled_nodes[hop + 1])


def test_loader_covers_every_target_once_with_its_label_and_a_last_partial_batch() -> None:
    data = _star(5, num_targets=3)
    data.edge_index = torch.cat([data.edge_index, torch.tensor([[7], [7]])], 1)  # node 7: a self-loop only
    targets = torch.tensor([7, 0, 2, 1, 6])
    for shuffle in (False, True):
        loader = neighbor_loader(data, [2, -1], batch_size=2, input_nodes=targets, shuffle=shuffle, force_torch=True,
                                 generator=torch.Generator().manual_seed(0))
        sizes, ids = [], []
        for batch in loader:
            B = batch.batch_size
            assert torch.equal(batch.y[:B], batch.n_id[:B]) and torch.equal(batch.x[:B, 0].long(), batch.n_id[:B])
            assert torch.equal(batch.n_id[batch.edge_index], data.edge_index[:, batch.e_id])
            sizes.append(B)
            ids.extend(batch.n_id[:B].tolist())
        assert sizes == [2, 2, 1] and sorted(ids) == sorted(targets.tolist())  # each target once; a last partial batch
        if not shuffle:
            assert ids == targets.tolist()
    with pytest.raises(ValueError, match="num_neighbors"):
        TorchNeighborSampler(data, [0])
