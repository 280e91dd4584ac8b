"""``status`` (``run_status``'s ``changed``), and so ``publish``, ``summary`` and ``analyze``, compared a finished run's
recorded train and model config and model class with the config's, but not the rest of its identity: a run made with
other ``dataset_options``, another ``data_seed``, label smoothing or at another default dtype was "completed" and
unchanged, and ``publish`` put it under the config's description, while ``run`` refused it."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.experiments import load_experiment_config, publish_experiment, run_experiment, run_status
from diffusionformer.experiments.results import _task_identity

from experiments_tiny_configs import TINY_TRAIN as _TRAIN, TINY_VIT as _TINY_VIT


def _config(**task):
    return load_experiment_config({"name": "entries", "seeds": [0], "operators": [{"name": "attention"}],
                                   "tasks": [{"name": "t", "dataset": "digits", "model": "vit-digits",
                                              "model_overrides": {k: v for k, v in _TINY_VIT.items()
                                                                  if k != "input_size"},
                                              "train": _TRAIN, **task}]})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("entries")
    run_experiment(_config(), root, progress=False, log=lambda s: None)
    return root


@pytest.mark.parametrize("task, told", [
    ({"data_seed": 1}, "data_seed"),
    ({"dataset_options": {"val_fraction": 0.2}}, "dataset_options (val_fraction: 'unset' then 0.2)"),
    ({"label_smoothing": 0.1}, "label_smoothing"),
])
def test_bug_status_tells_a_run_of_other_data_or_task_settings(finished, task, told):
    """Bug: such a run was ``changed: None`` (``run`` refused it: "made with a different data_seed"), so ``publish``
    published it as a run of the config. Now ``status`` names the entry and ``publish`` refuses it."""
    config = _config(**task)
    row = run_status(config, finished)[0]
    assert row["state"] == "completed" and row["changed"] is not None and told in row["changed"]
    with pytest.raises(ValueError, match="publish with the --set overrides they were run with"):
        publish_experiment(config, finished, finished / "docs")
    with pytest.raises(ValueError, match="made with a different"):
        run_experiment(config, finished, progress=False, log=lambda s: None)
    assert run_status(_config(), finished)[0]["changed"] is None  # the config it was made with


def test_bug_status_tells_a_run_made_at_another_default_dtype_and_publish_names_the_dtype(finished):
    """Bug: a run made at the float32 default, read at a float64 default (or the reverse), was unchanged for
    ``status`` and ``publish``; the advice for it is the default dtype, which no ``--set`` value sets."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        row = run_status(_config(), finished)[0]
        assert row["changed"].startswith("dtype (float32 then float64: ")
        with pytest.raises(ValueError) as err:
            publish_experiment(_config(), finished, finished / "docs")
    finally:
        torch.set_default_dtype(previous)
    message = str(err.value)
    assert "publish after torch.set_default_dtype(torch.float32), the default they were made at" in message
    assert "--set" not in message


def test_the_runner_writes_the_task_entries_status_compares():
    """``_task_identity`` is the runner's record of a run's task entries (same keys, same order), so ``status`` and
    ``run`` cannot disagree on them."""
    import json

    from diffusionformer.experiments.config import train_config
    from diffusionformer.experiments.runner import _run_identity
    from diffusionformer.models import create_model

    config = _config(label_smoothing=0.1, augment={"flip": True})
    task = config.tasks[0]
    model = create_model("vit-digits", **task.model_overrides)
    identity = _run_identity(task, model, train_config(task, 0))
    entries = _task_identity(task, 0)
    assert {k: identity[k] for k in entries} == entries
    assert [k for k in identity if k in entries] == list(entries)
    assert list(identity)[:6] == ["dataset", "dataset_options", "data_seed", "model", "model_config", "train"]
    assert json.loads(json.dumps(identity)) == identity
