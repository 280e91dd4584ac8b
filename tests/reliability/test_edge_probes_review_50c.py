"""Fresh-eyes review of the status/identity commits (0b0f80b, 44bf403) and the own-model tutorial (63b6520).

``status`` (``run_status``'s ``changed``), and so ``publish``, ``summary`` and ``analyze``, now compare a finished run's
whole identity with the config's, but a DINO run's task settings (the task's ``ssl`` table, recorded in its
``model_config``) were still left out: ``run`` refused such a run, ``status`` called it unchanged.
"""

from __future__ import annotations

import warnings

import pytest

from diffusionformer.experiments import load_experiment_config, publish_experiment, run_experiment, run_status

_TRAIN = {"max_steps": 2, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
          "checkpoint_interval": 2}
_DINO = {"dim": 16, "depth": 1, "num_heads": 2, "out_dim": 16, "head_hidden": 16, "head_bottleneck": 8,
         "schedule_steps": 2}


def _config(ssl=None, setting_overrides=None):
    task = {"name": "t", "dataset": "digits", "model": "dino-digits", "metric": "knn_test_acc",
            "model_overrides": dict(_DINO), "train": dict(_TRAIN)}
    if ssl is not None:
        task["ssl"] = ssl
    setting = {"name": "attention"}
    if setting_overrides is not None:
        setting["model_overrides"] = setting_overrides
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # ssl settings among a setting's model_overrides
        return load_experiment_config({"name": "dino", "seeds": [0], "operators": [setting], "tasks": [task]})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("dino")
    run_experiment(_config(ssl={"knn_k": 5}), root, progress=False, log=lambda s: None)
    return root


@pytest.mark.parametrize("ssl, told", [
    ({}, "model_config (knn_k: 5 then 20)"),
    ({"knn_k": 7}, "model_config (knn_k: 5 then 7)"),
    ({"knn_k": 5, "noise_std": 0.1}, "model_config (noise_std: 0.0 then 0.1)"),
])
def test_bug_status_tells_a_dino_run_of_other_ssl_settings(finished, ssl, told):
    """Bug: a DINO run made with other ``ssl`` settings (k-NN neighbours, views) than the config's was ``changed:
    None`` for ``status``, and ``publish`` put it under the config's description, while ``run`` refused it ("made
    with a different model_config (knn_k: 5 then 20)"): ``_model_changes`` left the task settings out."""
    config = _config(ssl=ssl)
    row = run_status(config, finished)[0]
    assert row["state"] == "completed" and row["changed"] == told
    with pytest.raises(ValueError, match="publish with the --set overrides they were run with"):
        publish_experiment(config, finished, finished / "docs")
    with pytest.raises(ValueError, match=r"made with a different model_config \(" + told.split("(")[1].split(" ")[0]):
        run_experiment(config, finished, progress=False, log=lambda s: None)


def test_status_keeps_a_dino_run_of_the_same_ssl_settings_unchanged(finished):
    """The run's own settings, in the ``ssl`` table or (deprecated) among the setting's model overrides, where the
    runner moves them: unchanged for ``status``, as ``run`` reads the run back."""
    for config in (_config(ssl={"knn_k": 5}), _config(setting_overrides={"knn_k": 5})):
        assert run_status(config, finished)[0]["changed"] is None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            (result,) = run_experiment(config, finished, progress=False, log=lambda s: None)
        assert result.status == "completed"


def test_bug_validate_experiment_without_data_checks_a_config_at_the_meta_default_device():
    """Bug: since ``validate_experiment`` refused the meta default device (its data loaded there blamed the dataset
    with an IndexError), it refused it also with ``load_data=False``, which loads no data: a large model's config,
    checked inside ``with torch.device('meta'):`` so that its models are built without memory, answered before with
    the problems it has at 'cpu', then raised. Now only loading the data there is refused."""
    import torch

    from diffusionformer.experiments import check_experiment, validate_experiment

    config = _config(ssl={"knn_k": 5})
    at_cpu = validate_experiment(config, load_data=False)
    with torch.device("meta"):
        assert validate_experiment(config, load_data=False) == at_cpu == []
        check_experiment(config, load_data=False)  # no RuntimeError
        with pytest.raises(RuntimeError, match="validate_experiment: expected a default device that holds data"):
            validate_experiment(config)  # loading the data there: still refused
