"""Edge probes of neighbour-sampled mini-batches, third round: an explicit generator inside a DataLoader worker,
and a model of zero propagation hops."""

from __future__ import annotations

import types

import pytest
import torch
import torch.utils.data as tud
from torch_geometric.data import Data

from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_batch
from diffusionformer.experiments.minibatch import (MiniBatchConfig, NodeMiniBatchTask, check_num_neighbors,
                                                   propagation_hops)
from diffusionformer.models import create_model


def _graph(N: int = 40, E: int = 300) -> Data:
    g = torch.Generator().manual_seed(0)
    return Data(x=torch.randn(N, 2, generator=g), edge_index=torch.randint(0, N, (2, E), generator=g), num_nodes=N)


def test_bug_neighbor_batch_draws_from_its_generator_inside_a_dataloader_worker(monkeypatch):
    """Bug: inside a DataLoader worker, ``neighbor_batch(data, sampler, seeds, generator)`` drew from the worker's
    own generator (seeded once from ``generator``'s first draw and cached), not from ``generator``: the same
    generator state gave other neighbourhoods than in the main process, and two calls with equally seeded
    generators gave different batches."""
    data = _graph()
    sampler = TorchNeighborSampler(data, [2, 2], generator=torch.Generator().manual_seed(99))
    seeds = torch.tensor([0, 1, 2])
    ref = neighbor_batch(data, sampler, seeds, torch.Generator().manual_seed(5))
    monkeypatch.setattr(tud, "get_worker_info", lambda: types.SimpleNamespace(seed=123, id=0, num_workers=2))
    for _ in range(2):
        g = torch.Generator().manual_seed(5)
        got = neighbor_batch(data, sampler, seeds, g)
        for key in ("n_id", "e_id", "edge_index"):
            assert torch.equal(getattr(got, key), getattr(ref, key)), key
    # the worker still draws from a generator of its own when none is passed (and the sampler's is kept)
    assert sampler._worker_seed is None
    neighbor_batch(data, sampler, seeds)
    assert sampler._worker_seed == 123 and sampler._worker_generator is not None


def test_bug_a_model_of_zero_propagation_hops_is_a_problem_when_checked():
    """Bug: for a model whose heads all have degree 0 (``heat(steps=0)``, ``R = 0``), ``num_neighbors`` as one int
    passed ``check_num_neighbors`` (so validation), then resolved to no hops and the run crashed building its
    task with "num_neighbors: expected a non-empty list ..., got []"; a list was told to "give 0 entries"."""
    model = create_model("graph-node-small", depth=2, heads="heat(t=0.1, steps=0):4")
    assert propagation_hops(model) == 0
    for nn in (2, [2], [-1]):
        problem, warning = check_num_neighbors(MiniBatchConfig(4, nn), 0)
        assert warning is None and "R = 0" in problem and "full-batch" in problem, nn
        assert "give 0 entries" not in problem
    from diffusionformer.data.base import NodeData

    d = _graph()
    d.y = torch.zeros(d.num_nodes, dtype=torch.long)
    for name in ("train_mask", "val_mask", "test_mask"):
        setattr(d, name, torch.ones(d.num_nodes, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"R = 0 hops"):
        NodeMiniBatchTask.for_model(NodeData("g", d, num_classes=2, num_features=2), model,
                                    {"batch_size": 4, "num_neighbors": 2})
