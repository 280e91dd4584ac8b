"""Edge probes of experiment configs and their checks before anything trains (fourth pass)."""

from __future__ import annotations

import tomllib

import pytest
import torch

from diffusionformer.experiments.config import load_experiment_config
from diffusionformer.experiments.runner import run_experiment

from experiments_tiny_configs import TINY_DIGITS_TOML


def _two_tasks(second_train: dict) -> dict:
    data = tomllib.loads(TINY_DIGITS_TOML)
    second = {**data["tasks"][0], "name": "digits2", "train": {**data["tasks"][0]["train"], **second_train}}
    data["tasks"].append(second)
    data["operators"] = data["operators"][:1]
    return data


def test_bug_a_later_tasks_cuda_train_device_stops_run_before_anything_trains(tmp_path, monkeypatch):
    """Bug: a task's own ``train.device = "cuda"`` on a machine without CUDA was refused only at that task's first
    run (by the trainer, without the task's name), after every run of the tasks before it had trained; the
    config-level ``device`` was checked up front, a task's own device was not."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = load_experiment_config(_two_tasks({"device": "cuda"}))
    with pytest.raises(ValueError, match=r"task 'digits2' train\.device: device 'cuda' asked for.*nothing was trained"):
        run_experiment(config, tmp_path, progress=False, log=lambda _: None)
    assert not (tmp_path / "tiny").exists()  # not one run of 'digits' trained


def test_a_run_device_override_or_a_cpu_task_device_is_not_refused(tmp_path, monkeypatch):
    """A task device that ``--device`` replaces, or one that is not CUDA, is no reason to refuse the run."""
    from diffusionformer.experiments.runner import _check_task_devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cpu", "auto"):
        _check_task_devices(load_experiment_config(_two_tasks({"device": device})).tasks)
    from diffusionformer.experiments import runner

    class Reached(Exception):
        pass

    def reached(*args, **kwargs):  # the first data load: every check before training passed
        raise Reached

    monkeypatch.setattr(runner, "_checked_task_data", reached)
    config = load_experiment_config(_two_tasks({"device": "cuda"}))
    with pytest.raises(Reached):
        run_experiment(config, tmp_path, progress=False, device="cpu", log=lambda _: None)
