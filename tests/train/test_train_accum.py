"""Gradient accumulation and the fp16 GradScaler of the trainer."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from train_tiny_tasks import RegressionTask, TinyMLP, fp16_supported, tiny_config

from diffusionformer.train import Trainer, TrainConfig, load_checkpoint, read_metrics, seed_everything


class Float64Regression(RegressionTask):
    """The regression task in float64 without the global-RNG jitter (exact comparisons)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(global_rng=False, **kwargs)
        self.batch_sizes: list[int] = []

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> dict[str, Any]:
        batch = super().train_batch(step, generator, batch_size)
        return {k: v.double() for k, v in batch.items()}

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        self.batch_sizes.append(batch["x"].shape[0])
        pred = model(batch["x"])
        return F.mse_loss(pred, batch["y"]), {"mae": (pred - batch["y"]).abs().mean()}

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        pred = model(self.x_eval.double())
        return {"loss": F.mse_loss(pred, self.y_eval.double()).item()}


def _model64() -> TinyMLP:
    seed_everything(0)
    return TinyMLP(dropout=0.0).double()


def test_accumulating_four_micro_batches_equals_one_batch_of_four_times_the_size(tmp_path):
    b = 4
    ref_task, acc_task = Float64Regression(), Float64Regression()
    ref, acc = _model64(), _model64()
    Trainer(ref, ref_task, tiny_config(batch_size=4 * b), tmp_path / "ref").fit()
    Trainer(acc, acc_task, tiny_config(batch_size=4 * b, grad_accum_steps=4), tmp_path / "acc").fit()
    assert set(ref_task.batch_sizes) == {4 * b} and set(acc_task.batch_sizes) == {b}
    assert len(acc_task.batch_sizes) == 4 * len(ref_task.batch_sizes)
    for (name, p), q in zip(ref.named_parameters(), acc.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-10), name
    moved = sum((p - q).abs().sum() for p, q in zip(ref.parameters(), _model64().parameters()))
    assert moved > 1e-3  # the runs trained
    # the logged loss and metrics are the means over the micro-batches
    for r, a in zip(read_metrics(tmp_path / "ref"), read_metrics(tmp_path / "acc")):
        assert r["step"] == a["step"] and r["split"] == a["split"]
        assert a["loss"] == pytest.approx(r["loss"], rel=1e-6)  # logged in float32
        if r["split"] == "train":
            assert a["metrics"]["mae"] == pytest.approx(r["metrics"]["mae"], rel=1e-6)
            assert a["metrics"]["grad_norm"] == pytest.approx(r["metrics"]["grad_norm"], rel=1e-6)


def test_accumulation_uses_the_task_shard_hook(tmp_path):
    calls: list[tuple[int, int]] = []

    class Hooked(Float64Regression):
        def shard_batch(self, batch: Any, index: int, count: int) -> Any:
            calls.append((index, count))
            return {k: v.chunk(count)[index] for k, v in batch.items()}

    Trainer(_model64(), Hooked(), tiny_config(max_steps=2, batch_size=6, grad_accum_steps=3), tmp_path).fit()
    assert calls == [(0, 3), (1, 3), (2, 3)] * 2


def test_grad_accum_steps_is_validated_and_not_resumable():
    with pytest.raises(ValueError, match="grad_accum_steps: expected an int >= 1, got 0"):
        TrainConfig(grad_accum_steps=0)
    with pytest.raises(TypeError, match="grad_accum_steps: expected int"):
        TrainConfig(grad_accum_steps=2.0)
    from diffusionformer.train import RESUMABLE_FIELDS

    assert "grad_accum_steps" not in RESUMABLE_FIELDS


needs_fp16 = pytest.mark.skipif(not fp16_supported(), reason="this torch build has no fp16 CPU autocast")


@needs_fp16
def test_fp16_scaler_skips_overflowing_updates_and_checkpoints_its_state(tmp_path):
    # Targets 3x larger than usual: the scaled fp16 gradients overflow at the initial scale
    # 2**16, so the scaler skips those updates and halves its scale instead of failing.
    task = RegressionTask(target_scale=3.0, global_rng=False)
    cfg = tiny_config(amp="fp16", checkpoint_interval=0)
    summary = Trainer(TinyMLP(dropout=0.0), task, cfg, tmp_path).fit()
    assert summary["amp"] == "fp16" and summary["status"] == "completed"
    scaler = load_checkpoint(tmp_path / "checkpoint.pt")["scaler"]
    assert 0 < scaler["scale"] < 2.0**16
    norms = [r["metrics"]["grad_norm"] for r in read_metrics(tmp_path) if r["split"] == "train"]
    assert any(n is None for n in norms)  # an overflow (logged as null) did not stop the run


@needs_fp16
def test_fp16_resume_restores_the_scaler_bit_exactly(tmp_path):
    def run(out, max_steps, resume=False):
        seed_everything(0)
        model = TinyMLP(dropout=0.0)
        cfg = tiny_config(amp="fp16", checkpoint_interval=3, max_steps=max_steps, lr_decay_steps=10)
        Trainer(model, RegressionTask(target_scale=3.0, global_rng=False), cfg, out, resume=resume).fit()
        return model

    full = run(tmp_path / "full", 10)
    run(tmp_path / "cut", 3)
    assert load_checkpoint(tmp_path / "cut" / "checkpoint.pt")["scaler"]["scale"] < 2.0**16
    resumed = run(tmp_path / "cut", 10, resume=True)
    for p, q in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_no_scaler_state_without_fp16(tmp_path):
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=2), tmp_path).fit()
    assert load_checkpoint(tmp_path / "checkpoint.pt")["scaler"] == {}
