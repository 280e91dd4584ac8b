"""A run's identity: fields added to the configs after runs were published stay out of it at their defaults."""

import pytest

from diffusionformer.experiments.config import TaskConfig
from diffusionformer.experiments.runner import _run_identity
from diffusionformer.models import create_model
from diffusionformer.train import TrainConfig

NEW_MODEL = {"rope", "rope_base", "n_kv_head", "zero_init_proj", "edge_dim", "pe", "pe_dim", "pe_sign_flip"}
NEW_TRAIN = {"grad_accum_steps", "weight_decay_rule", "loggers"}


@pytest.mark.parametrize("preset", ["gpt-char-tiny", "vit-digits"])
def test_new_fields_at_their_defaults_leave_the_identity_as_it_was(preset):
    task = TaskConfig("t", "digits", preset)
    identity = _run_identity(task, create_model(preset), TrainConfig(max_steps=5))
    assert not NEW_MODEL & set(identity["model_config"])
    assert not NEW_TRAIN & set(identity["train"])
    # the fields every run had are all there
    assert {"n_layer", "n_head"} <= set(identity["model_config"]) or {"depth", "num_heads"} <= set(identity["model_config"])
    assert {"max_steps", "lr", "seed", "amp"} <= set(identity["train"])


def test_new_fields_set_away_from_their_defaults_are_part_of_the_identity():
    task = TaskConfig("t", "pydoc-chars", "gpt-char-tiny")
    identity = _run_identity(task, create_model("gpt-char-tiny", rope=True, zero_init_proj=True),
                             TrainConfig(max_steps=5, grad_accum_steps=2, loggers=["jsonl", "csv"],
                                         weight_decay_rule="nanogpt"))
    assert identity["model_config"]["rope"] is True and identity["model_config"]["zero_init_proj"] is True
    assert "rope_base" not in identity["model_config"]  # at its default: implied by the class
    assert identity["train"]["grad_accum_steps"] == 2
    assert identity["train"]["loggers"] == ["jsonl", "csv"]
    assert identity["train"]["weight_decay_rule"] == "nanogpt"
