"""Task adapters: a dataset + model family as a :class:`diffusionformer.train.Task`.

Every adapter draws its training batches from the trainer's seeded generator (so a resumed
run is bit-identical) and evaluates deterministically on fixed held-out data.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffusionformer.data.base import ClassificationData, GraphSetData, NodeData, SequenceTaskData, TextData

__all__ = ["build_task", "model_overrides_for_data"]

_EVAL_SEED = 1234  # fixed windows for text evaluation: every run is scored on the same text


def _accuracy(logits: Tensor, y: Tensor) -> Tensor:
    return (logits.argmax(-1) == y).float().mean()


class ClassificationTask:
    """Images ``(N, C, H, W)`` or signals ``(N, T, F)`` with one label each."""

    def __init__(self, data: ClassificationData, eval_batch_size: int = 512) -> None:
        self.data = data
        self.eval_batch_size = eval_batch_size

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> tuple[Tensor, Tensor]:
        n = self.data.x_train.shape[0]
        idx = torch.randint(0, n, (batch_size,), generator=generator)
        return self.data.x_train[idx], self.data.y_train[idx]

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, Any]]:
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits.float(), y), {"acc": _accuracy(logits.detach(), y)}

    @torch.no_grad()
    def _score(self, model: nn.Module, x: Tensor, y: Tensor) -> tuple[float, float]:
        device = next(model.parameters()).device
        loss_sum, correct = 0.0, 0.0
        for i in range(0, x.shape[0], self.eval_batch_size):
            xb, yb = x[i : i + self.eval_batch_size].to(device), y[i : i + self.eval_batch_size].to(device)
            logits = model(xb).float()
            loss_sum += F.cross_entropy(logits, yb, reduction="sum").item()
            correct += (logits.argmax(-1) == yb).sum().item()
        return loss_sum / x.shape[0], correct / x.shape[0]

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        val_loss, val_acc = self._score(model, self.data.x_val, self.data.y_val)
        test_loss, test_acc = self._score(model, self.data.x_test, self.data.y_test)
        return {"loss": val_loss, "val_acc": val_acc, "test_loss": test_loss, "test_acc": test_acc}


class TextLMTask:
    """Character-level language modelling on random windows (nanoGPT style)."""

    def __init__(self, data: TextData, block_size: int, eval_batch_size: int = 64, eval_batches: int = 20) -> None:
        self.data = data
        self.block_size = block_size
        self.eval_batch_size = eval_batch_size
        self.eval_batches = eval_batches

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> tuple[Tensor, Tensor]:
        return self.data.get_batch("train", batch_size, self.block_size, generator)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, Any]]:
        x, y = batch
        _, loss = model(x, y)
        return loss, {}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        device = next(model.parameters()).device
        out: dict[str, float] = {}
        batches = max_batches or self.eval_batches
        for split in ("train", "val"):
            g = torch.Generator().manual_seed(_EVAL_SEED)
            total = 0.0
            for _ in range(batches):
                x, y = self.data.get_batch(split, self.eval_batch_size, self.block_size, g)
                total += model(x.to(device), y.to(device))[1].item()
            out[f"{split}_loss"] = total / batches
        out["loss"] = out["val_loss"]
        return out


class SequenceLMTask:
    """Causal LM with sparse targets (``-100`` elsewhere), e.g. associative recall."""

    def __init__(self, data: SequenceTaskData, eval_batch_size: int = 512) -> None:
        self.data = data
        self.eval_batch_size = eval_batch_size

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> tuple[Tensor, Tensor]:
        idx = torch.randint(0, self.data.x_train.shape[0], (batch_size,), generator=generator)
        return self.data.x_train[idx], self.data.y_train[idx]

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, Any]]:
        x, y = batch
        logits, loss = model(x, y)
        mask = y != self.data.ignore_index
        acc = (logits.detach().argmax(-1)[mask] == y[mask]).float().mean()
        return loss, {"acc": acc}

    @torch.no_grad()
    def _score(self, model: nn.Module, x: Tensor, y: Tensor) -> tuple[float, float]:
        device = next(model.parameters()).device
        loss_sum, correct, count = 0.0, 0.0, 0
        for i in range(0, x.shape[0], self.eval_batch_size):
            xb, yb = x[i : i + self.eval_batch_size].to(device), y[i : i + self.eval_batch_size].to(device)
            logits = model(xb)[0].float()
            mask = yb != self.data.ignore_index
            loss_sum += F.cross_entropy(logits[mask], yb[mask], reduction="sum").item()
            correct += (logits[mask].argmax(-1) == yb[mask]).sum().item()
            count += int(mask.sum())
        return loss_sum / max(count, 1), correct / max(count, 1)

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        val_loss, val_acc = self._score(model, self.data.x_val, self.data.y_val)
        test_loss, test_acc = self._score(model, self.data.x_test, self.data.y_test)
        return {"loss": val_loss, "val_acc": val_acc, "test_loss": test_loss, "test_acc": test_acc}


class NodeTask:
    """Full-batch node classification on one graph (the same batch on every rank under DDP)."""

    def __init__(self, data: NodeData) -> None:
        self.data = data

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> Any:
        return self.data.data

    def shard_batch(self, batch: Any, rank: int, world_size: int) -> Any:
        return batch

    def loss(self, model: nn.Module, batch: Any) -> tuple[Tensor, dict[str, Any]]:
        logits = model(batch.x, batch.edge_index)
        m = batch.train_mask
        return F.cross_entropy(logits[m].float(), batch.y[m]), {"acc": _accuracy(logits.detach()[m], batch.y[m])}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        device = next(model.parameters()).device
        d = self.data.data.to(device)
        logits = model(d.x, d.edge_index).float()
        out = {}
        for split in ("val", "test"):
            m = getattr(d, f"{split}_mask")
            out[f"{split}_loss"] = F.cross_entropy(logits[m], d.y[m]).item()
            out[f"{split}_acc"] = _accuracy(logits[m], d.y[m]).item()
        out["loss"] = out["val_loss"]
        return out


class GraphClassificationTask:
    """Graph classification over mini-batches of PyG graphs."""

    def __init__(self, data: GraphSetData, eval_batch_size: int = 256) -> None:
        self.data = data
        self.eval_batch_size = eval_batch_size
        self.graphs = {s: list(data.split(s)) for s in ("train", "val", "test")}

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> Any:
        from torch_geometric.data import Batch

        graphs = self.graphs["train"]
        idx = torch.randint(0, len(graphs), (batch_size,), generator=generator).tolist()
        return Batch.from_data_list([graphs[i] for i in idx])

    def shard_batch(self, batch: Any, rank: int, world_size: int) -> Any:
        from torch_geometric.data import Batch

        graphs = batch.to_data_list()
        per = len(graphs) // world_size
        return Batch.from_data_list(graphs[rank * per : (rank + 1) * per])

    def loss(self, model: nn.Module, batch: Any) -> tuple[Tensor, dict[str, Any]]:
        logits = model(batch.x, batch.edge_index, batch.batch)
        y = batch.y.view(-1)
        return F.cross_entropy(logits.float(), y), {"acc": _accuracy(logits.detach(), y)}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        from torch_geometric.data import Batch

        device = next(model.parameters()).device
        out = {}
        for split in ("val", "test"):
            graphs = self.graphs[split]
            loss_sum, correct = 0.0, 0.0
            for i in range(0, len(graphs), self.eval_batch_size):
                b = Batch.from_data_list(graphs[i : i + self.eval_batch_size]).to(device)
                logits = model(b.x, b.edge_index, b.batch).float()
                y = b.y.view(-1)
                loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
                correct += (logits.argmax(-1) == y).sum().item()
            out[f"{split}_loss"] = loss_sum / max(len(graphs), 1)
            out[f"{split}_acc"] = correct / max(len(graphs), 1)
        out["loss"] = out["val_loss"]
        return out


def model_overrides_for_data(data: Any, family: type) -> dict[str, Any]:
    """Config values a model must take from the data (input shape, classes, vocabulary)."""
    from diffusionformer.models import GCNConfig, GPTConfig, GraphTransformerConfig, ViTConfig

    if family is ViTConfig and isinstance(data, ClassificationData):
        shape = tuple(data.input_shape)
        if data.kind == "image":
            return {"in_channels": shape[0], "input_size": shape[1:], "num_classes": data.num_classes}
        return {"in_channels": shape[1], "input_size": shape[:1], "num_classes": data.num_classes}
    if family is GPTConfig and isinstance(data, TextData):
        return {"vocab_size": data.vocab_size}
    if family is GPTConfig and isinstance(data, SequenceTaskData):
        return {"vocab_size": data.vocab_size}
    if family in (GraphTransformerConfig, GCNConfig) and isinstance(data, NodeData):
        return {"in_channels": data.num_features, "num_classes": data.num_classes, "task": "node"}
    if family in (GraphTransformerConfig, GCNConfig) and isinstance(data, GraphSetData):
        return {"in_channels": data.num_features, "num_classes": data.num_classes, "task": "graph"}
    raise ValueError(
        f"dataset {getattr(data, 'name', '?')!r} of kind {getattr(data, 'kind', '?')!r} does not fit a "
        f"{family.__name__.replace('Config', '')} model; pick a preset of the matching family"
    )


def build_task(data: Any, model: nn.Module, *, eval_batch_size: int = 512) -> Any:
    """The :class:`~diffusionformer.train.Task` adapter for ``data`` and ``model``."""
    if isinstance(data, ClassificationData):
        return ClassificationTask(data, eval_batch_size)
    if isinstance(data, TextData):
        block = getattr(getattr(model, "config", None), "block_size", None)
        if block is None:
            raise ValueError("a text task needs a GPT model (with config.block_size)")
        return TextLMTask(data, block)
    if isinstance(data, SequenceTaskData):
        return SequenceLMTask(data, eval_batch_size)
    if isinstance(data, NodeData):
        return NodeTask(data)
    if isinstance(data, GraphSetData):
        return GraphClassificationTask(data, min(eval_batch_size, 256))
    raise TypeError(f"no task adapter for {type(data).__name__}")


def as_metrics(record: Mapping[str, Any] | None) -> dict[str, float]:
    """Flatten an eval record of ``metrics.jsonl`` into ``{name: value}``."""
    if not record:
        return {}
    out = {k: v for k, v in record.get("metrics", {}).items() if isinstance(v, (int, float))}
    if isinstance(record.get("loss"), (int, float)):
        out.setdefault("loss", record["loss"])
    return out
