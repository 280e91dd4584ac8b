from __future__ import annotations

import dataclasses

import pytest
import torch

from diffusionformer.train import TrainConfig, resolve_amp, resolve_device


def test_defaults_and_round_trip():
    cfg = TrainConfig()
    assert cfg.decay_steps == cfg.max_steps
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    cfg = TrainConfig.from_dict({"max_steps": 50, "lr_decay_steps": 40, "betas": [0.8, 0.9], "lr": 1})
    assert cfg.betas == (0.8, 0.9) and cfg.decay_steps == 40
    assert isinstance(cfg.lr, float) and cfg.lr == 1.0
    assert cfg.to_dict()["betas"] == [0.8, 0.9]


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrainConfig().lr = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "error", "fragments"),
    [
        ({"learning_rate": 1e-3}, ValueError, ["unknown TrainConfig key 'learning_rate'", "valid keys"]),
        ({"max_step": 10}, ValueError, ["'max_step'", "did you mean 'max_steps'"]),
        ({"max_steps": "10"}, TypeError, ["max_steps", "expected int", "got str"]),
        ({"max_steps": 10.0}, TypeError, ["max_steps", "expected int", "got float"]),
        ({"batch_size": True}, TypeError, ["batch_size", "expected int", "got bool"]),
        ({"max_steps": 0}, ValueError, ["max_steps", ">= 1", "got 0"]),
        ({"lr": -1e-3}, ValueError, ["lr", "> 0.0", "got -0.001"]),
        ({"lr": float("nan")}, ValueError, ["lr", "finite", "nan"]),
        ({"lr": 1e-3, "min_lr": 1e-2}, ValueError, ["min_lr", "<= lr", "got 0.01"]),
        ({"weight_decay": "0.1"}, TypeError, ["weight_decay", "expected float", "got str"]),
        ({"betas": [0.9]}, TypeError, ["betas", "pair", "[0.9]"]),
        ({"betas": (0.9, 1.0)}, ValueError, ["betas[1]", "[0, 1)", "got 1.0"]),
        ({"warmup_steps": 20, "max_steps": 10}, ValueError, ["lr_decay_steps", ">= warmup_steps (20)", "got 10"]),
        ({"grad_clip": -1}, ValueError, ["grad_clip", ">= 0.0", "got -1.0"]),
        ({"log_interval": 0}, ValueError, ["log_interval", ">= 1", "got 0"]),
        ({"eval_steps": 0}, ValueError, ["eval_steps", ">= 1"]),
        ({"seed": -1}, ValueError, ["seed", ">= 0"]),
        ({"seed": 2**32}, ValueError, ["seed", "<= 4294967295"]),
        ({"amp": "fp8"}, ValueError, ["amp", "('auto', 'bf16', 'fp16', 'off')", "'fp8'"]),
        ({"device": "gpu0"}, ValueError, ["device", "'gpu0'"]),
        ({"device": 0}, TypeError, ["device", "expected str", "got int"]),
        ({"compile": "yes"}, TypeError, ["compile", "expected bool", "got str"]),
    ],
)
def test_invalid(data, error, fragments):
    with pytest.raises(error) as info:
        TrainConfig.from_dict(data)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_from_dict_needs_mapping():
    with pytest.raises(TypeError, match="expected a mapping, got list"):
        TrainConfig.from_dict([("lr", 1.0)])  # type: ignore[arg-type]


def test_direct_construction_is_validated():
    with pytest.raises(TypeError, match="TrainConfig.max_steps: expected int, got str"):
        TrainConfig(max_steps="5")  # type: ignore[arg-type]


def test_numpy_numbers_from_a_sweep_grid_are_read_as_python_numbers():
    """Bug: a numpy int from ``np.arange``/``np.linspace`` grids (``max_steps=np.int64(10)``) was
    refused as "expected int, got int64"; it is now read as the int it equals, and a config
    built from numpy numbers equals, hashes and serialises like one built from Python numbers."""
    import json

    import numpy as np

    plain = TrainConfig(max_steps=10, batch_size=8, grad_accum_steps=2, warmup_steps=3,
                        lr_decay_steps=9, eval_interval=5, eval_steps=2, log_interval=4,
                        checkpoint_interval=6, seed=7, lr=1e-3, min_lr=2.5e-4)
    grid = TrainConfig(max_steps=np.int64(10), batch_size=np.int32(8), grad_accum_steps=np.uint8(2),
                       warmup_steps=np.int16(3), lr_decay_steps=np.int64(9), eval_interval=np.int64(5),
                       eval_steps=np.int64(2), log_interval=np.int64(4),
                       checkpoint_interval=np.int64(6), seed=np.uint32(7), lr=np.float32(1e-3),
                       min_lr=np.float16(2.5e-4))
    for name in ("max_steps", "batch_size", "grad_accum_steps", "warmup_steps", "lr_decay_steps",
                 "eval_interval", "eval_steps", "log_interval", "checkpoint_interval", "seed"):
        assert type(getattr(grid, name)) is int and getattr(grid, name) == getattr(plain, name)
    assert type(grid.lr) is float and grid.lr == float(np.float32(1e-3))
    json.dumps(grid.to_dict())  # numpy ints would raise "Object of type int64 is not JSON serializable"
    assert TrainConfig(max_steps=np.int64(10)) == TrainConfig(max_steps=10)
    assert hash(TrainConfig(seed=np.int64(3))) == hash(TrainConfig(seed=3))
    with pytest.raises(ValueError, match=r"TrainConfig.max_steps: expected an int >= 1, got 0"):
        TrainConfig(max_steps=np.int64(0))
    with pytest.raises(TypeError, match=r"TrainConfig.max_steps: expected int, got numpy.bool "):
        TrainConfig(max_steps=np.bool_(True))
    with pytest.raises(TypeError, match=r"TrainConfig.max_steps: expected int, got numpy.float64 "):
        TrainConfig(max_steps=np.float64(10.0))  # a float is not a count, even a whole one


def test_resolve_device_and_amp():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_amp("auto", torch.device("cpu")) is None
    assert resolve_amp("auto", torch.device("cuda", 0)) is torch.bfloat16
    assert resolve_amp("off", torch.device("cuda", 0)) is None
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch.cuda.is_available"):
            resolve_device("cuda")
