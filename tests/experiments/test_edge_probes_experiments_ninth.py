"""Edge probes of the runner's threads, mini-batch hops and metrics (ninth round): behaviour checked against
brute force that no other test pins. No bug was found in this round; these hold what was verified."""

from __future__ import annotations

import math

import pytest
import torch
from torch_geometric.data import Data

from diffusionformer.data.base import NodeData
from diffusionformer.experiments._metrics import _num_correct, accuracy
from diffusionformer.experiments.minibatch import NodeMiniBatchTask, propagation_hops
from diffusionformer.experiments.threads import plan_threads
from diffusionformer.models import GIN, DiffusionGraphTransformer, GINConfig, GraphTransformerConfig


def _ring(N: int = 200, F: int = 6, C: int = 3) -> NodeData:
    g = torch.Generator().manual_seed(0)
    i = torch.arange(N)
    src = torch.cat([i, i, (i + 3) % N, (i + 1) % N])
    dst = torch.cat([(i + 1) % N, (i + 3) % N, i, i])
    train = torch.zeros(N, dtype=torch.bool)
    train[torch.randperm(N, generator=g)[:12]] = True
    data = Data(x=torch.randn(N, F, generator=g, dtype=torch.float64), edge_index=torch.stack([src, dst]),
                y=torch.randint(0, C, (N,), generator=g), train_mask=train, val_mask=~train, test_mask=~train)
    return NodeData("ring", data, num_classes=C, num_features=F)


def _gt(heads: str) -> DiffusionGraphTransformer:
    torch.manual_seed(0)
    cfg = GraphTransformerConfig(in_channels=6, num_classes=3, dim=8, depth=2, num_heads=2, heads=heads)
    return DiffusionGraphTransformer(cfg).double().eval()


MODELS = {
    "attnscale": lambda: _gt("attnscale:2"),
    "neutreno": lambda: _gt("neutreno:2"),
    "value-residual": lambda: _gt("value-residual:2"),
    "ppr": lambda: _gt("ppr(steps=3):2"),
    "laplacian": lambda: _gt("laplacian:1,attention:1"),
    "gin-node": lambda: GIN(GINConfig(in_channels=6, num_classes=3, hidden=8, num_layers=3, task="node")).double().eval(),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_all_neighbours_for_R_hops_give_the_full_graph_outputs_and_fewer_do_not(name):
    """propagation_hops is the exact receptive field: R hops of all neighbours reproduce every seed's full-graph
    output, R - 1 hops do not (so R is neither too small, refusing exact configs, nor silently truncating)."""
    data, model = _ring(), MODELS[name]()
    R = propagation_hops(model)
    n_train = int(data.data.train_mask.sum())
    with torch.no_grad():
        full = model(data.data.x, data.data.edge_index)
        gaps = []
        for hops in (R, R - 1):
            task = NodeMiniBatchTask(data, [-1] * hops, batch_size=n_train)
            b = task.train_batch(0, torch.Generator().manual_seed(1), n_train)
            gaps.append(float((model(b.x, b.edge_index)[:n_train] - full[b.n_id[:n_train]]).abs().max()))
    assert gaps[0] < 1e-12 and gaps[1] > 1e-9, (R, gaps)


def test_accuracy_matches_a_float64_count_with_ties_empty_and_nan():
    logits = torch.tensor([[1.0, 1.0, 0.0], [0.0, 2.0, 2.0], [3.0, -1.0, 3.0], [float("-inf"), 0.0, float("inf")]])
    y = torch.tensor([0, 2, 0, 2])
    # ties go to the first maximum (torch.argmax, numpy.argmax): rows 0, 2, 3 right, row 1 wrong
    assert accuracy(logits, y).item() == pytest.approx(3 / 4) and _num_correct(logits, y) == 3.0
    assert math.isnan(accuracy(torch.empty(0, 3), torch.empty(0, dtype=torch.long)).item())
    assert _num_correct(torch.empty(0, 3), torch.empty(0, dtype=torch.long)) == 0.0
    bad = logits.clone()
    bad[1, 0] = math.nan
    assert math.isnan(accuracy(bad, y).item()) and math.isnan(_num_correct(bad, y))


@pytest.mark.parametrize("env, threads", [({"OMP_NUM_THREADS": "4, 2"}, 4), ({"OMP_NUM_THREADS": "3,"}, 3),
                                          ({"OMP_NUM_THREADS": "  "}, 2), ({"LOCAL_WORLD_SIZE": " 4 "}, 2)])
def test_thread_counts_from_padded_environment_values(env, threads):
    assert plan_threads(cores=8, workers=None if "LOCAL_WORLD_SIZE" in env else 4, environ=env).threads == threads


def test_a_blank_first_omp_count_is_refused_by_name():
    with pytest.raises(ValueError, match=r"OMP_NUM_THREADS=' ,2' \(its first, outer-level count\)"):
        plan_threads(cores=2, environ={"OMP_NUM_THREADS": " ,2"})
