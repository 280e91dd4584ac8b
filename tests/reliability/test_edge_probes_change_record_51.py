"""What ``publish`` / ``analyze`` / ``summary`` say about finished runs made with another definition than the config's
(experiments/results.py ``_runs_of_another_train``): the advice is made from the comparison's records (which identity
parts differ, which keys of which part), not by reading ``run_status``'s ``changed`` text back with regexes, and it
names what differs and the remedy that fits. Before, every such run "was made with another train or model config"
even when it differed in its data (``data_seed``, ``dataset_options``), its task settings (``label_smoothing``,
``augment``), its model class or the default dtype, and the ``--set`` advice named no key. ``changed`` stays the same
text (a str or None)."""

from __future__ import annotations

import shlex

import pytest
import torch

from diffusionformer.experiments import load_experiment_config, publish_experiment, run_experiment, run_status
from diffusionformer.experiments.analyze import _warn_other_train
from diffusionformer.experiments.results import _runs_of_another_train
from diffusionformer.models import DiffusionViT, ViTConfig, register_model
from diffusionformer.models import registry as MR

from experiments_tiny_configs import TINY_TRAIN as _TRAIN, TINY_VIT as _TINY_VIT


def _config(model="vit-digits", overrides=None, **task):
    overrides_of_model = {} if model != "vit-digits" else {k: v for k, v in _TINY_VIT.items() if k != "input_size"}
    return load_experiment_config({"name": "record", "seeds": [0], "operators": [{"name": "attention"}],
                                   "tasks": [{"name": "t", "dataset": "digits", "model": model,
                                              "model_overrides": overrides_of_model, "train": dict(_TRAIN), **task}]},
                                  overrides)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("record")
    run_experiment(_config(), root, progress=False, log=lambda s: None)
    return root


def _publish_error(config, root) -> str:
    with pytest.raises(ValueError) as err:
        publish_experiment(config, root, root / "docs")
    return str(err.value)


def _sets(message: str) -> list[str]:
    """The ``--set`` overrides a message advises, as the shell would pass them."""
    words = shlex.split(message.split("; ", 1)[1].split("(", 1)[1].split(")", 1)[0])
    return [w.rstrip(",") for prev, w in zip(words, words[1:]) if prev == "--set"]


@pytest.mark.parametrize("task, what, advised", [
    ({"data_seed": 1}, "other data (data_seed)", ["tasks.t.data_seed=0"]),
    ({"dataset_options": {"val_fraction": 0.2}}, "other data (dataset_options)", ["tasks.t.dataset_options={}"]),
    ({"label_smoothing": 0.1}, "other task settings (label_smoothing)", ["tasks.t.label_smoothing=0.0"]),
    ({"augment": {"flip": True}}, "other task settings (augment)", ["tasks.t.augment={}"]),
])
def test_bug_advice_names_the_data_or_task_setting_and_its_set(finished, task, what, advised):
    """Bug: a run of another ``data_seed`` / ``dataset_options`` / ``label_smoothing`` / ``augment`` "was made with
    another train or model config than this config's" and the advice named no key to ``--set``. Now it names the
    entry and the ``--set`` that gives it the run's value; given, that ``--set`` makes them the config's runs."""
    config = _config(**task)
    message = _publish_error(config, finished)
    assert "another train or model config" not in message
    assert f"were made with {what} than this config's" in message
    assert "publish with the --set overrides they were run with (--set " in message
    assert _sets(message) == advised
    assert run_status(_config(overrides=advised, **task), finished)[0]["changed"] is None  # the advice works
    assert run_status(config, finished)[0]["changed"]  # the text is unchanged (test_edge_probes_status_entries_50)


def test_bug_advice_for_another_default_dtype_names_the_dtype_not_a_config(finished):
    """Bug: a run made at the float32 default, read at a float64 default, "was made with another train or model
    config": neither differs (the advice itself, ``torch.set_default_dtype``, was right). Now the text says so."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        message = _publish_error(_config(), finished)
        with pytest.warns(RuntimeWarning) as caught:
            _warn_other_train(_config(), finished)
    finally:
        torch.set_default_dtype(previous)
    assert "were made with another default dtype than this config's" in message
    assert "another train or model config" not in message and "--set" not in message
    assert message.endswith("; publish after torch.set_default_dtype(torch.float32), the default they were made at, "
                            "or redo them with `run --restart`")
    assert "were made with another default dtype" in str(caught[0].message)


class _FirstViT(DiffusionViT):
    """A user's ViT."""


class _SecondViT(DiffusionViT):
    """Another user's ViT under the same preset name and config."""


def test_bug_advice_for_another_model_class_names_the_class_not_a_config(tmp_path, preset_name):
    """Bug: runs of another model class (the preset registered again) "were made with another train or model
    config", which neither differs in. Now: "another model class", and the class to register again."""
    register_model(preset_name, _FirstViT, ViTConfig, **_TINY_VIT)
    run_experiment(_config(preset_name), tmp_path, progress=False, log=lambda s: None)
    MR._PRESETS.pop(preset_name)
    register_model(preset_name, _SecondViT, ViTConfig, **_TINY_VIT)
    message = _publish_error(_config(preset_name), tmp_path)
    assert "were made with another model class than this config's" in message
    assert "another train or model config" not in message
    assert f"register the class they were made with ({_FirstViT.__module__}._FirstViT) as model preset " \
           f"{preset_name!r} again" in message
    # with another budget as well: both are named, and both remedies
    message = _publish_error(_config(preset_name, overrides=["tasks.t.train.max_steps=3"]), tmp_path)
    assert "were made with another train or model config and another model class than" in message
    assert "; publish with the --set overrides they were run with, or register the class" in message


def test_the_budget_keeps_its_words_and_changed_stays_a_text(finished):
    """A run of another budget keeps the words it had (its ``--set`` names no key: a train key may be the task's or
    the config's); ``run_status``'s ``changed`` is the same str, and its rows carry nothing more."""
    config = _config(train={**_TRAIN, "max_steps": _TRAIN["max_steps"] + 1})
    row = run_status(config, finished)[0]
    assert type(row["changed"]) is str
    assert row["changed"] == f"train (max_steps: {_TRAIN['max_steps']} then {_TRAIN['max_steps'] + 1})"
    assert set(row) == {"task", "operator", "seed", "max_steps", "step", "resumes_from", "elapsed", "holder",
                        "other_host", "changed", "state"}
    text = _runs_of_another_train(config, finished)
    assert text == ("1 finished run(s) of 'record' were made with another train or model config than this config's, "
                    f"e.g. 't' / 'attention' seed 0 ({row['changed']})")
    message = _publish_error(config, finished)
    assert message.endswith("; publish with the --set overrides they were run with, or redo them with `run --restart`")


def test_data_and_budget_together_name_both(finished):
    """Runs differing in their budget and their data seed: both named, one ``--set`` remedy naming the data key."""
    config = _config(data_seed=1, train={**_TRAIN, "max_steps": _TRAIN["max_steps"] + 1})
    message = _publish_error(config, finished)
    assert "were made with another train or model config and other data (data_seed) than" in message
    assert "; publish with the --set overrides they were run with (--set tasks.t.data_seed=0), or redo them" in message
