"""Review of the day's changes (a user's model class read from a run's checkpoint, the unregister_* functions, the nn
layers' factory arguments, a notebook's global torch state): the bugs found, each with its test."""

from __future__ import annotations

import json

import torch
from torch import nn

from diffusionformer.experiments import load_experiment_config, run_experiment
from diffusionformer.models import DiffusionViT, ViTConfig, register_model

from experiments_tiny_configs import TINY_TRAIN as _TRAIN, TINY_VIT as _TINY_VIT


class _ConstViT(DiffusionViT):
    """A user's ViT that keeps a fixed float64 constant as a (frozen) parameter, at any default dtype."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__(config)
        self.scale64 = nn.Parameter(torch.ones((), dtype=torch.float64), requires_grad=False)


def _config(model: str):
    return load_experiment_config({"name": "const", "seeds": [0], "operators": [{"name": "attention"}],
                                   "tasks": [{"name": "t", "dataset": "digits", "model": model, "train": _TRAIN}]})


def test_bug_a_float64_parameter_at_the_float32_default_is_not_recorded_as_another_dtype(tmp_path, preset_name):
    """Bug: a run's identity recorded ``"dtype"`` from its model's parameters, not from the default dtype it was
    built at: a user's model holding a float64 parameter (a frozen constant) in a float32 process recorded
    ``"dtype": ["float32", "float64"]``, a field its runs made before the dtype joined the identity lack, so they no
    longer resumed ("different dtype (float32 then ['float32', 'float64']: torch.get_default_dtype() when the models
    were built)", though the default dtype was float32 both times) and ``status``/``publish`` called them changed.
    The identity now records the default dtype, and only when it is not float32."""
    register_model(preset_name, _ConstViT, ViTConfig, **_TINY_VIT)
    config = _config(preset_name)
    first = run_experiment(config, tmp_path, progress=False, log=lambda m: None)
    rdir = tmp_path / "const" / "runs" / "t" / "attention" / "seed0"
    assert "dtype" not in json.loads((rdir / "run_config.json").read_text())
    again = run_experiment(config, tmp_path, progress=False, log=lambda m: None)  # read back as the same run
    assert [r.final for r in again] == [r.final for r in first]
