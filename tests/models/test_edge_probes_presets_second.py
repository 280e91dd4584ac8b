"""Edge probes of the presets and the config layer, second round: Literal choices given numpy values, numpy keys of a
``heads`` table, and the preset checks that held (non-finite values, hints, round trips, unshared defaults)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from diffusionformer.config import config_from_dict, config_to_dict
from diffusionformer.models.registry import create_model, get_preset, model_config, task_config
from diffusionformer.train.checkpoint import model_record


@pytest.mark.parametrize("name, key, choice", [("vit-digits", "pool", "mean"), ("graph-node-small", "task", "graph"),
                                               ("gcn-2layer", "pool", "max"), ("dino-digits", "pool", "cls")])
def test_bug_literal_choice_refuses_a_numpy_array_and_reads_a_numpy_str_as_str(name, key, choice):
    """Bug: ``check_value`` tested a Literal with ``value in choices``, which compares a numpy array elementwise, so
    ``create_model("vit-digits", pool=np.array(["mean"]))`` was accepted and the array stored as ``config.pool``
    (the run identity and checkpoint record then held ``"['mean']"``, not ``"mean"``); a ``np.str_`` choice stayed one."""
    with pytest.raises(ValueError, match=rf"\.{key}: expected one of"):
        model_config(name, **{key: np.array([choice])})
    cfg = model_config(name, **{key: np.str_(choice)})
    assert type(getattr(cfg, key)) is str and getattr(cfg, key) == choice
    assert cfg == model_config(name, **{key: choice})


def test_bug_numpy_layer_keys_of_a_heads_table_are_python_ints():
    """Bug: ``create_model("gpt-char-tiny", heads={k: ... for k in np.arange(2)})`` built, but its config kept the
    ``np.int64`` keys, so ``model_record`` (every checkpoint save) and the runner's run identity failed in
    ``json.dumps`` with "keys must be str, int, float, bool or None, not numpy.int64"."""
    with torch.device("meta"):
        model = create_model("gpt-char-tiny", heads={k: "laplacian:4" for k in np.arange(2)})
    assert [type(k) for k in model.config.heads] == [int, int]
    assert model_record(model)["config"]["heads"] == {"0": "laplacian:4", "1": "laplacian:4"}
    vit = model_config("vit-digits", heads={np.int64(3): "attention:2,laplacian:2"})
    assert [type(k) for k in vit.heads] == [int]
    json.dumps(config_to_dict(vit))


def test_preset_values_that_must_hold():
    """Pins (no bug): non-finite floats, bools for ints, floats for ints and strings for floats are refused; a
    preset's defaults are not shared with a built config; every preset's config and task settings round trip."""
    for bad in ({"dropout": float("nan")}, {"mlp_ratio": float("inf")}, {"dim": True}, {"dim": 64.0},
                {"dropout": "0.1"}, {"rope": np.bool_(True)}, {"input_size": np.array([8, 8])}):
        with pytest.raises((TypeError, ValueError)):
            model_config("vit-digits", **bad)
    cfg = model_config("vit-digits", heads=["attention:4"] * 4)
    cfg.heads[0] = "laplacian:4"
    assert model_config("vit-digits").heads is None and get_preset("vit-digits").defaults.get("heads") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("gpt-char-small", "vit-mnist1d", "graph-graph-small", "gin-graph", "dino-digits"):
            cfg = model_config(name)
            back = config_from_dict(type(cfg), json.loads(json.dumps(config_to_dict(cfg))))
            assert back == cfg
    ssl = task_config("dino-digits")
    assert config_from_dict(type(ssl), json.loads(json.dumps(config_to_dict(ssl)))) == ssl
    with pytest.raises(ValueError, match="did you mean 'vit-digits'"):
        get_preset(" VIT_digits")
