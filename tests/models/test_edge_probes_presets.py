"""Edge probes of the presets (no bug found): the parameter counts the docs and configs state, rebuilt."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from diffusionformer.experiments.build import add_setting_overrides
from diffusionformer.experiments.config import load_experiment_config
from diffusionformer.models import create_model, list_models, model_config
from diffusionformer.nn.attention import DiffusionAttention

ROOT = Path(__file__).resolve().parents[2]
_BASE = {"pydoc-chars": 814_720, "shakespeare": 809_856}  # study_rivals.toml's header, vocab 103 and 65
_EXTRA = {"heat-learned": 8, "attnscale": 16, "polynomial-chebyshev": 32, "differential": 384,
          "differential-wide-heads": 768}
_VOCAB = {"pydoc-chars": 103, "shakespeare": 65}


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_study_rivals_header_counts_match_every_settings_model():
    """The header of study_rivals.toml lists each setting's parameters per task: rebuilt as build_model does
    (data sizes, then the task's overrides, then the setting's) on the meta device, every one matches."""
    cfg = load_experiment_config(ROOT / "experiments/configs/study_rivals.toml")
    for task in cfg.tasks:
        for setting in cfg.operators:
            overrides = {"vocab_size": _VOCAB[task.name], **task.model_overrides}
            add_setting_overrides(overrides, model_config(task.model, **overrides), task, setting)
            with torch.device("meta"):
                n = _count(create_model(task.model, **overrides))
            assert n == _BASE[task.name] + _EXTRA.get(setting.name, 0), (task.name, setting.name, n)


def test_performance_and_gpu_vision_counts():
    """docs/performance.md: the all-attention DiffusionAttention(256, 8) has 263,168 parameters;
    gpu_vision.toml: its ViT matches the source's 6.3M parameters."""
    assert _count(DiffusionAttention(256, 8)) == 263_168
    with torch.device("meta"):
        vit = create_model("vit-cifar", dim=384, depth=7, num_heads=12, mlp_ratio=1.0, patch_size=8, dropout=0.0)
    assert round(_count(vit) / 1e6, 1) == 6.3


@pytest.mark.parametrize("name", list_models())
def test_every_preset_builds_on_the_meta_device(name):
    """Every preset builds without allocating (meta), with its task settings where it has them."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.device("meta"):
            model = create_model(name)
    assert all(p.is_meta for p in model.parameters())
    assert hasattr(model, "task_config") == name.startswith("dino-")
