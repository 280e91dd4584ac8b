"""Performance audit 60r of the commits after 2aaa48f: host reads on the evaluation path of a node task.

The timings of the audit (DINO's EMA shape check, the node loader's seed conversion, the CSV refill at resume, run
identities, LayerRecorder hooks) are in its report, not asserted here: these tests pin behaviour only."""

from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch_geometric.data import Data

from diffusionformer.data.base import NodeData
from diffusionformer.experiments._metrics import full_graph_metrics
from diffusionformer.train.batch import to_device

# the tensor methods that copy a value to the host (a device sync on an accelerator)
_HOST_READS = {"item", "__int__", "__float__", "__bool__", "__index__", "tolist", "numpy"}


class _HostReads(TorchFunctionMode):
    """The host reads of tensor values made under it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in _HOST_READS:
            self.names.append(name)
        return func(*args, **(kwargs or {}))


class _FirstColumns(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.anchor = nn.Parameter(torch.zeros(()))  # full_graph_metrics reads the model's device from it

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return x[:, : self.num_classes]


def _nodes() -> NodeData:
    """12 nodes: 2 train, 5 val (3 right), 5 test (4 right)."""
    N, C = 12, 2
    y = torch.zeros(N, dtype=torch.long)
    wrong = torch.zeros(N, dtype=torch.bool)
    wrong[[2, 3, 7]] = True
    x = torch.stack([torch.where(wrong, 0.0, 1.0), torch.where(wrong, 1.0, 0.0)], dim=1)
    masks = {name: torch.zeros(N, dtype=torch.bool) for name in ("train_mask", "val_mask", "test_mask")}
    masks["train_mask"][:2] = True
    masks["val_mask"][2:7] = True
    masks["test_mask"][7:] = True
    edge_index = torch.stack([torch.arange(1, N), torch.arange(N - 1)])
    data = Data(x=x, edge_index=edge_index, y=y, num_nodes=N, **masks)
    return NodeData(name="twelve", data=data, num_classes=C, num_features=C)


def test_perf_full_graph_metrics_reads_only_the_values_it_reports():
    """Perf bug: ``full_graph_metrics`` counted each split's nodes as ``int(dataset mask.sum())``, commented "the
    dataset's mask: no device sync"; after a training step on CUDA that mask is on the device, so every evaluation made
    two host syncs more than the four values it reports (NodeTask.train_batch hands the Trainer the dataset's
    ``Data``, which its ``to_device`` moves in place). The count is now the selected rows' shape; the values are
    unchanged (exact float64 fractions)."""
    nodes = _nodes()
    # NodeTask.train_batch returns the dataset's Data, which the Trainer's to_device moves in place
    assert to_device(nodes.data, torch.device("cpu")) is nodes.data
    with _HostReads() as reads:
        out = full_graph_metrics(_FirstColumns(2), nodes)
    assert sorted(reads.names) == ["item"] * 4, reads.names  # val/test loss and val/test hits
    assert (out["val_acc"], out["test_acc"]) == (3 / 5, 4 / 5)
    assert out["loss"] == out["val_loss"]
