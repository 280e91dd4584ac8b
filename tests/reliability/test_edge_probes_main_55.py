"""Edge probes of sitting 55 found outside the helpers' rounds (each test failed before its fix)."""

import pytest
import torch

from diffusionformer.analysis import LayerCapture, layer_reports


def test_bug_layer_reports_of_a_capture_with_no_real_token_says_so():
    """Bug: a capture whose mask marks no real token (every token padding) failed inside a spectrum with "s must be
    non-empty, got shape (0,)", naming an argument the user never passed; one real token still measures."""
    states = {0: torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0)),
              1: torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1))}
    mask = torch.zeros(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"capture.mask marks no real token \(all 8 are padding\)"):
        layer_reports(LayerCapture(states=states, mask=mask, labels=torch.tensor([0, 1])))
    mask[1, 0] = True
    reports = layer_reports(LayerCapture(states=states, mask=mask, labels=torch.tensor([0, 1])))
    assert [r.metrics["within_variance"] for r in reports] == [0.0, 0.0]


def test_a_table_value_of_set_replaces_the_table_as_the_tutorial_says():
    """docs/tutorials/experiments.rst: ``--set tasks.digits.train={lr=0.01}`` replaces the task's train table (its
    other keys fall back to their defaults); the dotted path ``tasks.digits.train.lr=0.01`` sets the one key."""
    from pathlib import Path

    from diffusionformer.experiments.config import load_experiment_config

    path = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "default.toml"
    text = (Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "experiments.rst").read_text()
    assert "``tasks.digits.train={lr=0.01}`` leaves every other training key" in " ".join(text.split())
    base = {t.name: t.train for t in load_experiment_config(path).tasks}["digits"]
    table = {t.name: t.train for t in load_experiment_config(path, ["tasks.digits.train={lr=0.01}"]).tasks}["digits"]
    dotted = {t.name: t.train for t in load_experiment_config(path, ["tasks.digits.train.lr=0.01"]).tasks}["digits"]
    assert base["max_steps"] == 400 and table == {"lr": 0.01}
    assert dotted == {**base, "lr": 0.01}
