"""Review 60n of 41b9968 (``rope_base`` at each model class's own default in a run's identity): the summary table's
column key still read both defaults as "unset" for every model, and a config class whose ``rope_base`` default is a
``default_factory`` had no default known (kept in every identity). No GPU."""

from __future__ import annotations

import dataclasses

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.publish import _setting_definition, summary_table
from diffusionformer.experiments.results import _new_model_fields, _normalized_identity, _without_new_defaults
from diffusionformer.models import GPTConfig
from experiments_tiny_configs import write_finished_study

BASE = {0: 0.5, 1: 0.6, 2: 0.7}


def _header(tmp_path, a_setting, b_setting):
    a = write_finished_study(tmp_path, "A", [{"name": "attention", "model_overrides": {}},
                                             {"name": "x", "model_overrides": a_setting}],
                             {"attention": BASE, "x": {0: 0.6, 1: 0.7, 2: 0.8}})
    b = write_finished_study(tmp_path, "B", [{"name": "attention", "model_overrides": {}},
                                             {"name": "x", "model_overrides": b_setting}],
                             {"attention": BASE, "x": {0: 0.3, 1: 0.4, 2: 0.5}})
    lines = summary_table([a, b], tmp_path).splitlines()
    return [c.strip() for c in lines[0].strip("|").split("|")]


def test_bug_summary_one_column_for_a_vit_at_rope_base_10000_and_at_its_default(tmp_path):
    """Bug: ``_setting_definition`` dropped ``rope_base`` at 100 or 10000 for every model, so a ViT setting at base
    10000 (another model than the ViT's own base 100, and another run identity since 41b9968) and one at the default
    shared one column of ``summary``, headed as one setting."""
    header = _header(tmp_path, {"rope": True, "rope_base": 10000.0}, {"rope": True})
    assert header == ["task", "metric (baseline mean)", "x (A)", "x (B)"]


def test_summary_one_column_for_a_vit_at_its_own_rope_base_and_unset(tmp_path):
    header = _header(tmp_path, {"rope": True, "rope_base": 100.0}, {"rope": True})
    assert header == ["task", "metric (baseline mean)", "x"]


def _gpt(rope_base=None, task_overrides=None):
    setting = {"rope": True} if rope_base is None else {"rope": True, "rope_base": rope_base}
    config = load_experiment_config({
        "name": "g", "seeds": [0],
        "tasks": [{"name": "t", "dataset": "tinyshakespeare", "model": "gpt-char-tiny",
                   "model_overrides": task_overrides or {}, "train": {"max_steps": 2}}],
        "operators": [{"name": "attention"}, {"name": "rope", "model_overrides": setting}]})
    return _setting_definition(config, config.operators[1])


def test_bug_setting_definition_tells_gpt_rope_bases_100_and_10000_apart():
    """Bug: two GPT settings at base 100 and 10000 (two models, two run identities) had one definition."""
    assert _gpt(100.0) != _gpt(10000.0)
    assert _gpt(10000.0) == _gpt()  # the GPT's own base is the unset one
    # a task at base 100: a setting back at 10000 changes its model, one at 100 does not
    assert _gpt(10000.0, {"rope_base": 100.0}) != _gpt(None, {"rope_base": 100.0})


@dataclasses.dataclass
class _FactoryBaseConfig(GPTConfig):
    rope_base: float = dataclasses.field(default_factory=lambda: 10000.0)


def test_bug_rope_base_default_factory_is_the_class_default():
    """Bug: a config class whose ``rope_base`` default is a ``default_factory`` had ``dataclasses.MISSING`` as its
    default, so ``rope_base`` at that default joined every new run's identity: a run recorded before 41b9968 (base
    10000 left out) read as made with another model, "model_config (rope_base: 'unset' then 10000.0)"."""
    assert _new_model_fields(_FactoryBaseConfig)["rope_base"] == 10000.0
    assert _without_new_defaults({"rope_base": 10000.0, "n_embd": 8}, _new_model_fields(_FactoryBaseConfig)) == {
        "n_embd": 8}
    assert _without_new_defaults({"rope_base": 100.0}, _new_model_fields(_FactoryBaseConfig)) == {"rope_base": 100.0}


def test_normalized_identity_keeps_a_gpt_at_base_100_and_drops_its_own_base():
    old = {"model": "gpt-char-tiny", "model_config": {"n_embd": 8}}
    assert _normalized_identity({**old, "model_config": {"n_embd": 8, "rope_base": 10000.0}}) == old
    assert _normalized_identity({**old, "model_config": {"n_embd": 8, "rope_base": 100.0}})["model_config"] == {
        "n_embd": 8, "rope_base": 100.0}


def test_setting_definition_keeps_rope_base_where_the_tasks_models_default_differ():
    """A comparison of a GPT task and a ViT task: base 100 is the ViT's default but changes the GPT, so a setting at
    100 (or at 10000) is not the setting left unset; ``mlp = "gelu"`` is every model's default."""
    def definition(setting):
        config = load_experiment_config({
            "name": "m", "seeds": [0],
            "tasks": [{"name": "g", "dataset": "tinyshakespeare", "model": "gpt-char-tiny", "metric": "val_loss",
                       "train": {"max_steps": 2}},
                      {"name": "v", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 2}}],
            "operators": [{"name": "attention"}, {"name": "x", "model_overrides": setting}]})
        return _setting_definition(config, config.operators[1])

    unset = definition({"rope": True})
    assert definition({"rope": True, "rope_base": 100.0}) != unset
    assert definition({"rope": True, "rope_base": 10000.0}) != unset
    assert definition({"rope": True, "mlp": "gelu"}) == unset
