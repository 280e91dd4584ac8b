"""Edge probes (tenth pass) of the runner's threads, GPU-worker planning, mini-batch task and plots."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffusionformer.experiments.minibatch import MiniBatchConfig, NodeMiniBatchTask, propagation_hops
from diffusionformer.models import GCN, GCNConfig, DiffusionGraphTransformer, GraphTransformerConfig


class _DDPLike(nn.Module):
    """What DistributedDataParallel exposes of the model it wraps (its ``.module``), without a process group."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


def _transformer() -> DiffusionGraphTransformer:
    torch.manual_seed(0)
    return DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, depth=2, num_heads=2,
                                                            heads="attention:1,heat(t=0.5, steps=3):1"))


@pytest.mark.parametrize("wrap", [
    lambda m: _DDPLike(torch.compile(m)),  # a compiled model given to the trainer, then DDP around it
    lambda m: torch.compile(_DDPLike(m)),  # the trainer's own order: DDP, then torch.compile
    lambda m: torch.compile(m),
    lambda m: _DDPLike(_DDPLike(m)),
], ids=["ddp(compile)", "compile(ddp)", "compile", "ddp(ddp)"])
def test_bug_propagation_hops_unwraps_a_compiled_model_inside_ddp(wrap):
    """Bug: propagation_hops unwrapped by truthiness (``model.module or model._orig_mod or model``), and bool() of a
    torch.compile wrapper calls its model's len(): DDP around a compiled graph transformer raised "TypeError:
    DiffusionGraphTransformer does not support len()" (and so did NodeMiniBatchTask.for_model) instead of giving R."""
    model = _transformer()
    assert propagation_hops(model) == 6  # 2 blocks, each max(1 for attention, 3 heat steps)
    wrapped = wrap(model)
    assert propagation_hops(wrapped) == propagation_hops(model)


def test_propagation_hops_of_other_modules_is_unknown_and_gcn_unwraps():
    gcn = GCN(GCNConfig(in_channels=3, num_classes=2, hidden=4, num_layers=2))
    assert propagation_hops(_DDPLike(torch.compile(gcn))) == 3
    assert propagation_hops(nn.Sequential(gcn)) is None  # not a wrapper the runner makes: R unknown
    assert propagation_hops(nn.Linear(2, 2)) is None


def test_bug_for_model_resolves_an_int_num_neighbors_through_ddp_and_compile():
    """Bug: NodeMiniBatchTask.for_model of a compiled model inside DDP raised TypeError from propagation_hops
    before it could resolve one int num_neighbors to one count per propagation hop."""
    from torch_geometric.data import Data

    from diffusionformer.data.base import NodeData

    g = torch.Generator().manual_seed(0)
    N = 12
    i = torch.arange(N)
    data = Data(x=torch.randn(N, 3, generator=g), edge_index=torch.stack([i, (i + 1) % N]),
                y=torch.randint(0, 2, (N,), generator=g), train_mask=i < 4, val_mask=(i >= 4) & (i < 8), test_mask=i >= 8)
    task = NodeMiniBatchTask.for_model(NodeData("ring", data, num_classes=2, num_features=3),
                                       _DDPLike(torch.compile(_transformer())), MiniBatchConfig(4, 2))
    assert task.num_neighbors == [2] * 6
