"""Metrics shared by the task adapters (a leaf module: it imports nothing of the runner)."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffusionformer.data.base import NodeData


def _wide(t: Tensor) -> Tensor:
    """``t`` in float32 at least: half-precision logits or features upcast for a stable loss, float64 kept (``.float()``
    rounded a float64 model's loss and metrics to float32)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def accuracy(logits: Tensor, y: Tensor, over: float | None = None) -> Tensor:
    """The fraction of rows whose arg-max is the label (a 0-d float tensor), or their number over ``over`` (a
    loss's fixed count, so that micro-batches add up); NaN when a logit is NaN (a NaN row has no prediction:
    ``argmax`` would pick the NaN's class), as the loss of such logits."""
    hits = (logits.argmax(-1) == y).float()
    acc = hits.mean() if over is None else hits.sum() / over
    return acc.masked_fill(logits.isnan().any(), math.nan)


def _zero_sum(device: torch.device) -> Tensor:
    """A 0-d float64 zero on ``device``: an evaluation loop's running sum, read once at the end."""
    return torch.zeros((), dtype=torch.float64, device=device)


def _num_correct(logits: Tensor, y: Tensor) -> Tensor:
    """How many rows' arg-max is the label, a 0-d float64 tensor on the logits' device; NaN when a logit is NaN
    (see :func:`accuracy`). A tensor, not a float: an evaluation loop adds them up on the device and reads the sum
    once (a host sync per batch kept a GPU's queue empty between batches)."""
    hits = (logits.argmax(-1) == y).sum().to(torch.float64)
    return hits.masked_fill(logits.isnan().any(), math.nan)


@torch.no_grad()
def full_graph_metrics(model: nn.Module, data: NodeData) -> dict[str, float]:
    """``val_loss``, ``val_acc``, ``test_loss``, ``test_acc`` and ``loss = val_loss`` of one full-graph forward."""
    device = next(model.parameters()).device
    d = copy.copy(data.data).to(device)  # Data.to moves in place: the dataset (and the sampler's graph) stays put
    logits = _wide(model(d.x, d.edge_index))
    out: dict[str, float] = {}
    for split in ("val", "test"):
        m = getattr(d, f"{split}_mask")
        rows, y = logits[m], d.y[m]
        out[f"{split}_loss"] = F.cross_entropy(rows, y).item()
        # hits / count in float64, as the sampled evaluation (float32's mean read 350/500 as 0.699999988: short of
        # a reach threshold of 0.7, and not the sampled evaluation's 0.7 for the same predictions). The count is the
        # selected rows' shape: the dataset's mask is on the device once the Trainer has moved the batch (Data.to
        # moves in place), where int(mask.sum()) was one more host sync per split
        count = y.shape[0]
        out[f"{split}_acc"] = _num_correct(rows, y).item() / count if count else math.nan
    out["loss"] = out["val_loss"]
    return out
