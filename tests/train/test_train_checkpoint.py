from __future__ import annotations

import pytest
import torch
from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config

from diffusionformer.train import (
    CheckpointError,
    Trainer,
    load_checkpoint,
    save_checkpoint,
    seed_everything,
)


def _trained_run(out, **overrides) -> Trainer:
    seed_everything(0)
    trainer = Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=3, **overrides), out)
    trainer.fit()
    return trainer


def test_checkpoint_loads_with_weights_only_and_holds_everything(tmp_path):
    trainer = _trained_run(tmp_path)
    raw = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert raw["step"] == 3 and raw["config"] == trainer.config.to_dict()
    assert set(raw["rng"]) == {"python", "numpy", "torch", "cuda", "generator"}
    assert isinstance(raw["rng"]["numpy"]["keys"], torch.Tensor) and raw["rng"]["numpy"]["keys"].numel() == 624
    assert isinstance(raw["rng"]["generator"], torch.Tensor)
    assert raw["optimizer"]["state"][0]["exp_avg"].shape == trainer.model.fc1.weight.shape


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"w": torch.ones(3)})
    good = path.read_bytes()

    def crash(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(path, {"w": torch.zeros(3)})
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temporary file left


@pytest.mark.parametrize("damage", ["truncate", "empty", "garbage"])
def test_corrupt_checkpoint_gives_clear_error_and_is_kept(tmp_path, damage):
    _trained_run(tmp_path)
    path = tmp_path / "checkpoint.pt"
    data = path.read_bytes()
    damaged = {"truncate": data[: len(data) // 2], "empty": b"", "garbage": b"\x00not a checkpoint" * 50}[damage]
    path.write_bytes(damaged)
    seed_everything(0)
    trainer = Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=6, lr_decay_steps=3), tmp_path,
                      resume=True)
    with pytest.raises(CheckpointError) as info:
        trainer.fit()
    message = str(info.value)
    assert str(path) in message and "unreadable" in message and "left untouched" in message
    assert path.read_bytes() == damaged


def test_not_a_training_checkpoint(tmp_path):
    path = tmp_path / "x.pt"
    torch.save({"model": {}}, path)
    with pytest.raises(CheckpointError, match=r"missing \['format', 'step', 'optimizer', 'rng', 'config'\]"):
        load_checkpoint(path)
    torch.save([1, 2], path)
    with pytest.raises(CheckpointError, match="expected a dict"):
        load_checkpoint(path)


class _Opaque:
    pass


def test_checkpoint_with_pickled_objects_is_refused(tmp_path):
    path = tmp_path / "x.pt"
    torch.save({"format": "diffusionformer.train/1", "step": 0, "obj": _Opaque()}, path)
    with pytest.raises(CheckpointError, match="weights_only"):
        load_checkpoint(path)


def test_checkpoint_of_another_model_is_refused(tmp_path):
    _trained_run(tmp_path)
    seed_everything(0)
    trainer = Trainer(TinyMLP(hidden=8), RegressionTask(), tiny_config(max_steps=6, lr_decay_steps=3), tmp_path,
                      resume=True)
    with pytest.raises(CheckpointError, match="does not fit"):
        trainer.fit()
