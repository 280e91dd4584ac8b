"""Edge-case probes of the training loop (sixth pass): accumulation with active clipping against a float64 hand
loop, a float64 loss beyond float32's range, a resume at the checkpoint's own step, and classes as batch leaves."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from train_tiny_tasks import RegressionTask, SimulatedKill, TinyMLP, tiny_config

from diffusionformer.train import (
    Trainer,
    cosine_lr,
    load_checkpoint,
    param_groups,
    read_metrics,
    seed_everything,
    to_device,
)


class _Float64(RegressionTask):
    """The regression task in float64, without the global-RNG jitter, metrics or evaluation."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__(global_rng=False)
        self.scale = scale

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> dict[str, Any]:
        return {k: v.double() for k, v in super().train_batch(step, generator, batch_size).items()}

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        return self.scale * F.mse_loss(model(batch["x"]), batch["y"]), {}

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        return {}


def test_accumulated_clipped_updates_equal_a_float64_hand_loop_on_the_whole_batch(tmp_path):
    """grad_accum_steps=3 with clipping active at every update (norms ~2-4 against grad_clip=0.05), warm-up, cosine
    and both decay groups: the same weights as torch's AdamW + clip_grad_norm_ on the whole batch, and the logged
    gradient norm is the pre-clipping norm clip_grad_norm_ returns."""
    cfg = tiny_config(max_steps=6, batch_size=12, grad_accum_steps=3, grad_clip=0.05, weight_decay=0.3,
                      eval_interval=0, checkpoint_interval=0, log_interval=1)
    seed_everything(0)
    model = TinyMLP(dropout=0.0).double()
    reference = copy.deepcopy(model)
    Trainer(model, _Float64(), cfg, tmp_path).fit()

    generator = torch.Generator().manual_seed(cfg.seed)
    groups = param_groups(reference, cfg.weight_decay)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    params = [p for g in groups for p in g["params"]]
    norms = []
    for step in range(cfg.max_steps):
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps,
                                decay_steps=cfg.decay_steps)
        batch = _Float64().train_batch(step, generator, cfg.batch_size)
        opt.zero_grad()
        F.mse_loss(reference(batch["x"]), batch["y"]).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)))
        opt.step()
    assert min(norms) > 20 * cfg.grad_clip  # clipping acted at every update
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12, msg=name)
    logged = [r["metrics"]["grad_norm"] for r in read_metrics(tmp_path) if r["split"] == "train"]
    assert logged == pytest.approx(norms, rel=1e-6)  # logged in float32


def test_bug_a_finite_float64_loss_beyond_float32_range_is_not_called_non_finite(tmp_path):
    """Bug: the non-finite flag was taken from the loss after its cast to float32 (for the log window), so a float64
    run whose loss exceeded 3.4e38 (finite, with finite gradients, clipped as usual) stopped at its first update with
    NonFiniteLossError "non-finite training loss or gradient norm at step 0"."""
    seed_everything(0)
    model = TinyMLP(dropout=0.0).double()
    cfg = tiny_config(max_steps=2, grad_clip=1.0, eval_interval=0)
    summary = Trainer(model, _Float64(scale=1e39), cfg, tmp_path).fit()
    assert summary["status"] == "completed"
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 2


def test_bug_a_run_resumed_to_its_checkpoints_step_logs_and_evaluates_its_last_update(tmp_path):
    """Bug: a checkpoint of a longer run resumed with max_steps equal to its step (max_steps is a resumable field)
    ran no update, so the last update's train record (the window the checkpoint cut) and its evaluation were never
    made: the log held only the step-3 record, summary["eval"] was None and summary["train"] the step-3 record, where
    the uninterrupted max_steps=5 run logs and evaluates at step 5."""
    fields = dict(lr_decay_steps=10, checkpoint_interval=5, eval_interval=0, log_interval=3)
    seed_everything(0)
    with pytest.raises(SimulatedKill):
        Trainer(TinyMLP(), RegressionTask(fail_at=7), tiny_config(max_steps=10, **fields), tmp_path / "cut").fit()
    seed_everything(0)
    resumed = Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=5, **fields), tmp_path / "cut",
                      resume=True).fit()
    seed_everything(0)
    whole = Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=5, **fields), tmp_path / "whole").fit()

    def records(folder):
        return [(r["step"], r["split"], r["loss"], r["lr"]) for r in read_metrics(folder)]

    assert records(tmp_path / "cut") == records(tmp_path / "whole")
    assert [(r["step"], r["split"]) for r in read_metrics(tmp_path / "cut")] == [(3, "train"), (5, "train"),
                                                                                 (5, "eval")]
    for split in ("train", "eval"):
        assert resumed[split]["step"] == whole[split]["step"] == 5
        assert resumed[split]["loss"] == whole[split]["loss"]
    saved = load_checkpoint(tmp_path / "cut" / "checkpoint.pt")
    assert saved["window"] == {} and saved["last_eval"]["step"] == 5
    # resumed once more: nothing is due, nothing is logged twice
    seed_everything(0)
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=5, **fields), tmp_path / "cut", resume=True).fit()
    assert records(tmp_path / "cut") == records(tmp_path / "whole")


def test_a_finished_run_resumed_at_its_end_logs_nothing_again(tmp_path):
    """The checkpoint of a run that ended at max_steps already holds the last update's log and evaluation."""
    cfg = tiny_config(max_steps=4, checkpoint_interval=0, log_interval=3, eval_interval=0)
    Trainer(TinyMLP(), RegressionTask(), cfg, tmp_path).fit()
    before = read_metrics(tmp_path)
    stamp = (tmp_path / "checkpoint.pt").stat().st_mtime_ns
    Trainer(TinyMLP(), RegressionTask(), cfg, tmp_path, resume=True).fit()
    assert read_metrics(tmp_path) == before
    assert (tmp_path / "checkpoint.pt").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("leaf", [nn.Linear, torch.Tensor, nn.Module])
def test_bug_to_device_returns_a_class_leaf_as_it_is(leaf):
    """Bug: a class in a batch (e.g. a model class as metadata) had a callable ``to`` attribute (its unbound
    method), so to_device called ``cls.to(device)`` and crashed (AttributeError: 'torch.device' object has no
    attribute '_apply'; TypeError for torch.Tensor) instead of returning the plain value as documented."""
    batch = {"x": torch.ones(2), "meta": [leaf, 3, None]}
    moved = to_device(batch, torch.device("cpu"))
    assert moved["meta"] == [leaf, 3, None] and torch.equal(moved["x"], batch["x"])
