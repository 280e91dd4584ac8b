"""Checkpoints record the model's class, config and head layout; resuming into another model is refused."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data import load_dataset
from diffusionformer.experiments.tasks import build_task
from diffusionformer.models import create_model
from diffusionformer.train import CheckpointError, TrainConfig, Trainer, load_checkpoint, save_checkpoint
from diffusionformer.train.checkpoint import model_record

SMALL = dict(dim=16, depth=2, num_heads=2)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def _cfg(max_steps):
    return TrainConfig(max_steps=max_steps, batch_size=16, lr=1e-3, warmup_steps=0, eval_interval=0, log_interval=1,
                       checkpoint_interval=2, progress=False, seed=0, lr_decay_steps=4)


def _trainer(digits, out, max_steps, resume=False, **model_kw):
    torch.manual_seed(0)
    model = create_model("vit-digits", **{**SMALL, **model_kw})
    return Trainer(model, build_task(digits, model), _cfg(max_steps), out, resume=resume)


def test_the_record_names_class_config_and_heads():
    model = create_model("vit-digits", **SMALL, laplacian_heads=1)
    rec = model_record(model)
    assert rec["class"] == "diffusionformer.models.vit.DiffusionViT" == f"{type(model).__module__}.{type(model).__name__}"
    assert rec["config"]["laplacian_heads"] == 1 and rec["config"]["dim"] == 16
    assert set(rec["heads"].values()) == {"attention:1,laplacian:1"} and len(rec["heads"]) == 2


def test_resuming_into_a_model_with_other_heads_is_refused(tmp_path, digits):
    _trainer(digits, tmp_path, 2).fit()
    assert load_checkpoint(tmp_path / "checkpoint.pt")["model_record"]["config"]["laplacian_heads"] is None
    wrong = _trainer(digits, tmp_path, 4, resume=True, laplacian_heads=1)  # same shapes, other operators
    with pytest.raises(ValueError, match=r"written by a different model \(config laplacian_heads: checkpoint None, "
                                         r"now 1; heads of blocks\.0\.attn: checkpoint 'attention:2', now 'attention:1,laplacian:1'"):
        wrong.fit()
    with pytest.raises(ValueError, match="config dim: checkpoint 16, now 32"):
        _trainer(digits, tmp_path, 4, resume=True, dim=32).fit()
    summary = _trainer(digits, tmp_path, 4, resume=True).fit()  # the same model resumes
    assert summary["step"] == 4 and summary["resumed_from"] == 2


def test_an_old_checkpoint_without_a_record_still_resumes_with_a_warning(tmp_path, digits):
    _trainer(digits, tmp_path, 2).fit()
    payload = load_checkpoint(tmp_path / "checkpoint.pt")
    del payload["model_record"]
    save_checkpoint(tmp_path / "checkpoint.pt", payload)
    with pytest.warns(UserWarning, match="predates model records"):
        summary = _trainer(digits, tmp_path, 4, resume=True).fit()
    assert summary["step"] == 4


def test_a_checkpoint_that_does_not_fit_is_still_a_checkpoint_error(tmp_path, digits):
    _trainer(digits, tmp_path, 2).fit()
    payload = load_checkpoint(tmp_path / "checkpoint.pt")
    del payload["model_record"]
    save_checkpoint(tmp_path / "checkpoint.pt", payload)
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="does not fit"):
        _trainer(digits, tmp_path, 4, resume=True, dim=32).fit()
