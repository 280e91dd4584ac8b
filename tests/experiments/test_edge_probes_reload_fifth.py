"""Edge probes of ``load_run`` against the train config a run folder records: a checkpoint is the folder's own only
if it was trained under the non-resumable fields of ``run_config.json``'s ``train`` table."""

from __future__ import annotations

import json

import pytest
import torch

from diffusionformer import load_run
from diffusionformer.train import CheckpointError, TrainConfig
from diffusionformer.train.checkpoint import load_checkpoint, save_checkpoint


def _with_train(rdir, **train):
    ident = json.loads((rdir / "run_config.json").read_text())
    ident["train"] = json.loads(json.dumps(TrainConfig(**train).to_dict()))
    (rdir / "run_config.json").write_text(json.dumps(ident))


def _checkpoint_config(rdir, **train):
    path = rdir / "checkpoint.pt"
    payload = load_checkpoint(path)
    payload["config"] = TrainConfig(**train).to_dict()
    save_checkpoint(path, payload)


def test_bug_another_seeds_checkpoint_copied_into_a_run_folder_is_refused(tmp_path, run_folder):
    """Bug: load_run compared the checkpoint's model record with run_config.json but not its train config, so the
    checkpoint of seed 1 copied into seed 0's folder (the same model, so the same record) loaded as seed 0's weights
    (the trainer refuses it on resume, the analysis took it)."""
    rdir, _ = run_folder(tmp_path / "seed0", dim=8)
    _with_train(rdir, seed=0)
    _checkpoint_config(rdir, seed=0)
    assert load_run(rdir).train_config.seed == 0
    _checkpoint_config(rdir, seed=1)
    with pytest.raises(CheckpointError, match=r"another train config \(seed: checkpoint 1, run_config.json 0\)"):
        load_run(rdir)


def test_resumable_fields_and_older_folders_still_load_pins(tmp_path, run_folder):
    """Pins: fields a resume may change (max_steps, intervals, device) and ``amp`` (recorded as asked) do not refuse
    a checkpoint; a run_config.json without a train table (older runs) is not compared; another lr is refused."""
    rdir, model = run_folder(tmp_path / "run", dim=8)
    _checkpoint_config(rdir, seed=0, max_steps=50, eval_interval=7, amp="off", betas=(0.8, 0.9))
    assert load_run(rdir).step == 3  # no train table
    _with_train(rdir, seed=0, max_steps=10, eval_interval=2, amp="auto", betas=(0.8, 0.9))
    run = load_run(rdir)
    with torch.no_grad():
        x = torch.randn(2, 1, 8, 8)
        assert torch.equal(run.model(x), model(x))
    _with_train(rdir, seed=0, lr=1e-2, betas=(0.8, 0.9))
    with pytest.raises(CheckpointError, match="lr: checkpoint 0.0003, run_config.json 0.01"):
        load_run(rdir)
