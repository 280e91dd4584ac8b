from __future__ import annotations

import json

import pytest
import torch
from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config

from diffusionformer.train import NonFiniteLossError, Trainer, load_checkpoint, read_metrics, seed_everything


@pytest.mark.parametrize("log_interval", [1, 3])
def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, log_interval):
    # NaN enters at update 5 (0-based). Checkpoints every 2 updates: the one after update 4
    # (step 4) is the last good one. With log_interval=3 the NaN is only seen at step 6, where
    # a checkpoint is also due: it must not be written.
    cfg = tiny_config(checkpoint_interval=2, log_interval=log_interval, eval_interval=0)
    seed_everything(0)
    model = TinyMLP()
    trainer = Trainer(model, RegressionTask(nan_at=5), cfg, tmp_path)
    with pytest.raises(NonFiniteLossError) as info:
        trainer.fit()
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.step == 5 and err.last_checkpoint_step == 4
    assert "non-finite training loss or gradient norm at step 5" in str(err)
    assert "(step 4) was kept" in str(err)

    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    assert ckpt["step"] == 4
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert not all(torch.isfinite(p).all() for p in model.parameters())  # the live model did blow up

    steps = [r["step"] for r in read_metrics(tmp_path) if r["split"] == "train"]
    assert steps == ([1, 2, 3, 4, 5] if log_interval == 1 else [3])  # nothing logged from step 6 on
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "non_finite" and summary["bad_step"] == 5


def test_nan_before_any_checkpoint(tmp_path):
    seed_everything(0)
    trainer = Trainer(TinyMLP(), RegressionTask(nan_at=0), tiny_config(checkpoint_interval=0), tmp_path)
    with pytest.raises(NonFiniteLossError, match="at step 0.*no checkpoint had been written"):
        trainer.fit()
    assert not (tmp_path / "checkpoint.pt").exists()
