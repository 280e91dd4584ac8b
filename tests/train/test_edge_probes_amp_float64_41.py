"""``TrainConfig.amp`` on a float64 model, which autocast leaves alone: the run records the precision it ran in."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from diffusionformer.train import Trainer, seed_everything
from diffusionformer.train.trainer import _model_amp
from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config  # noqa: E402


def test_bug_explicit_amp_on_a_float64_model_is_refused_and_auto_is_off():
    """Bug: ``amp="bf16"`` on a float64 model trained in float64 (autocast leaves float64 alone) while the summary
    and checkpoints recorded "bf16", a precision the run never had; on CUDA ``"auto"`` did the same. The explicit
    request is refused by name, ``"auto"`` resolves to off; float32 and mixed models keep their autocast."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    f64 = nn.Linear(3, 2).double()
    with pytest.raises(ValueError, match="amp='bf16' has no effect on a float64 model"):
        _model_amp("bf16", cpu, f64)
    with pytest.raises(ValueError, match="amp='fp16'"):
        _model_amp("fp16", cpu, f64)
    assert _model_amp("auto", cuda, f64) is None and _model_amp("off", cpu, f64) is None
    assert _model_amp("auto", cuda, nn.Linear(3, 2)) is torch.bfloat16
    mixed = nn.Sequential(nn.Linear(3, 2).double(), nn.Linear(2, 2))
    assert _model_amp("bf16", cpu, mixed) is torch.bfloat16


def test_pins_a_float64_run_is_refused_under_bf16_and_records_off_without(tmp_path):
    """Pins: ``fit`` refuses ``amp="bf16"`` for a float64 model before training, and the run the message points
    at (``amp="off"``) trains and records "off" in its summary."""
    seed_everything(0)
    with pytest.raises(ValueError, match="no effect on a float64 model"):
        Trainer(TinyMLP(dropout=0.0).double(), _Double(), tiny_config(max_steps=2, amp="bf16"), tmp_path / "a").fit()
    assert not (tmp_path / "a" / "metrics.jsonl").exists()
    summary = Trainer(TinyMLP(dropout=0.0).double(), _Double(), tiny_config(max_steps=2, amp="off"), tmp_path / "b").fit()
    assert summary["amp"] == "off"
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["amp"] == "off"


class _Double(RegressionTask):
    """The regression task on a float64 model (inputs and targets cast to float64)."""

    def __init__(self) -> None:
        super().__init__(global_rng=False)

    def loss(self, model, batch):
        return torch.nn.functional.mse_loss(model(batch["x"].double()), batch["y"].double()), {}

    def evaluate(self, model, max_batches):
        return {}
