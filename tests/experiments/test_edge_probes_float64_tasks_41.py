"""The task adapters' losses and evaluations on a float64 model: computed in float64, compared with float64
``F.cross_entropy`` on the same logits (half-precision logits are still upcast to float32)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from diffusionformer.experiments._metrics import _wide
from diffusionformer.experiments.tasks import ClassificationTask


class _Double(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(6, 3).double()

    def forward(self, x):
        return self.lin(x.double().flatten(1)) * 30.0  # confident logits: float32 rounds the small loss visibly


def _data(n=8):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)
    return SimpleNamespace(x_train=x, y_train=y, x_val=x, y_val=y, x_test=x, y_test=y, num_classes=3)


def test_bug_classification_loss_of_a_float64_model_stays_float64():
    """Bug: the task adapters took ``logits.float()`` for the loss (meant to upcast half-precision logits), which
    rounded a float64 model's loss to float32 (and its evaluation losses): the loss now has the logits' dtype when it
    is float32 or wider, equal to float64 cross-entropy to 1e-15."""
    data, model = _data(), _Double()
    task = ClassificationTask(data)
    x, y = data.x_train, data.y_train
    loss, _ = task.loss(model, (x, y))
    want = F.cross_entropy(model(x), y)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, want, rtol=1e-15, atol=0)


@pytest.mark.parametrize("dtype, want", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                         (torch.float32, torch.float32), (torch.float64, torch.float64)])
def test_pins_wide_upcasts_half_precision_only(dtype, want):
    """Pins: half-precision logits are upcast to float32 for a stable loss; float32 and float64 are kept."""
    assert _wide(torch.zeros(2, dtype=dtype)).dtype == want
