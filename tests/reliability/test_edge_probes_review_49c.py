"""Review probes of the extension-point changes of commit 1db0971 (a user's model class in a run's identity, metric
values checked by ``layer_reports``)."""

from __future__ import annotations

import json

import pytest
import torch

from diffusionformer.analysis import LayerCapture, layer_reports, neural_collapse, next_token_nc1
from diffusionformer.models import DiffusionViT, ViTConfig, register_model
from diffusionformer.models import registry as MR

from experiments_tiny_configs import TINY_TRAIN as _TRAIN, TINY_VIT as _TINY_VIT


class _FirstViT(DiffusionViT):
    """A user's ViT."""


class _SecondViT(DiffusionViT):
    """Another user's ViT under the same preset name and config."""


def test_bug_status_and_publish_tell_a_preset_registered_again_with_another_class(tmp_path, preset_name):
    """Bug: ``run`` refused a finished run whose preset was registered again with another model class (its identity's
    ``model_class``), but ``status`` called it completed and unchanged and ``publish`` published the first class's
    results under the second's name; both now name the change, as for another train or model config. A run recorded
    without ``model_class`` (made before the class joined the identity) is told from its checkpoint's model record
    (test_edge_probes_class_advice_50.py)."""
    from diffusionformer.experiments import load_experiment_config, publish_experiment, run_experiment, run_status

    register_model(preset_name, _FirstViT, ViTConfig, **_TINY_VIT)
    config = load_experiment_config({"name": "swap", "seeds": [0, 1], "operators": [{"name": "attention"}],
                                     "tasks": [{"name": "t", "dataset": "digits", "model": preset_name,
                                                "train": _TRAIN}]})
    run_experiment(config, tmp_path, progress=False, log=lambda s: None)
    assert [r["changed"] for r in run_status(config, tmp_path)] == [None, None]
    legacy = tmp_path / "swap" / "runs" / "t" / "attention" / "seed1" / "run_config.json"
    stored = json.loads(legacy.read_text())
    del stored["model_class"]
    legacy.write_text(json.dumps(stored))
    MR._PRESETS.pop(preset_name)
    register_model(preset_name, _SecondViT, ViTConfig, **_TINY_VIT)
    rows = run_status(config, tmp_path)
    assert rows[0]["state"] == "completed"
    assert rows[0]["changed"] is not None
    assert rows[0]["changed"].startswith("model_class (") and rows[0]["changed"].endswith("._SecondViT)")
    assert "._FirstViT then " in rows[0]["changed"]
    assert rows[1]["changed"] == rows[0]["changed"]  # recorded without its class: read from its checkpoint
    with pytest.raises(ValueError, match=r"model_class \(\S+\._FirstViT then \S+\._SecondViT\)"):
        publish_experiment(config, tmp_path, tmp_path / "docs")


def _tokens() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(12, 6, 5, generator=g, dtype=torch.float64)
    return X, torch.arange(12) % 3, torch.randint(0, 3, (12, 6), generator=g)


@pytest.mark.parametrize("scale", [1e300, 1e-200])
def test_bug_label_metrics_of_float64_tokens_far_from_one_are_not_nan(scale):
    """Bug: NC1, NC2 equinorm, the ANOVA fractions and the token NC1 of float64 tokens of |x| > 1e154 (squares inf:
    inf / inf) or |x| < 1e-162 (squares 0: 0 / 0) were NaN, and ``layer_reports``, which now refuses a metric's NaN,
    failed on the library's own metrics ("metric 'nc1' (layer 0) returned NaN"). These ratios are scale-free: they are
    computed on the tokens scaled by a power of two (exact), as ``variance_ratio`` already was."""
    X, seq_labels, tok_labels = _tokens()
    for labels in (seq_labels, tok_labels):
        want = layer_reports(LayerCapture({0: X}, labels=labels))[0].metrics
        got = layer_reports(LayerCapture({0: X * scale}, labels=labels))[0].metrics
        for key in ("nc1", "nc2_equinorm", "nc2_equiangularity", "nc2_etf_distance", "anova_within_fraction",
                    "anova_between_class_fraction", "token_nc1"):
            if key in want:
                assert want[key] is not None
                assert got[key] == pytest.approx(want[key], rel=1e-9), key
    nc, nc_scaled = neural_collapse(X.mean(dim=1), seq_labels), neural_collapse(X.mean(dim=1) * scale, seq_labels)
    assert nc_scaled.nc1 == pytest.approx(nc.nc1, rel=1e-9)
    assert nc_scaled.equinorm == pytest.approx(nc.equinorm, rel=1e-9)
    assert next_token_nc1(X * scale, tok_labels) == pytest.approx(next_token_nc1(X, tok_labels), rel=1e-9)


def test_bug_a_preset_registered_again_with_the_librarys_class_does_not_read_back_a_users_run(tmp_path, preset_name):
    """Bug: a run's identity leaves ``model_class`` out for the library's classes, and a recorded run compared with
    one side lacking it was compared without it (meant for runs recorded before the class joined the identity): a
    preset registered again with the library's ``DiffusionViT`` in place of the user's subclass (a config alike)
    found the subclass's run "completed" and reported its results as the library model's. Only a recorded run
    without ``model_class`` is compared without it now; the rerun is refused naming the class."""
    from diffusionformer.experiments import load_experiment_config, run_experiment

    register_model(preset_name, _FirstViT, ViTConfig, **_TINY_VIT)
    config = load_experiment_config({"name": "back", "seeds": [0], "operators": [{"name": "attention"}],
                                     "tasks": [{"name": "t", "dataset": "digits", "model": preset_name,
                                                "train": _TRAIN}]})
    run_experiment(config, tmp_path, progress=False, log=lambda s: None)
    MR._PRESETS.pop(preset_name)
    register_model(preset_name, DiffusionViT, ViTConfig, **_TINY_VIT)
    with pytest.raises(ValueError, match=r"different model_class \(\S+\._FirstViT then unset\)"):
        run_experiment(config, tmp_path, progress=False, log=lambda s: None)
