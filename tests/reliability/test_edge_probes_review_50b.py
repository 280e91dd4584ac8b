"""Edge probes, second review of the day's changes across features: the run identity's ``dtype`` (the default dtype
a run was built at) as ``status``, ``analyze``, ``summary`` and ``publish`` read it, beside ``run``, which refuses a
run made at another default."""

from __future__ import annotations

import json
import tomllib

import pytest
import torch

from diffusionformer.experiments import (check_experiment, load_experiment_config, publish_experiment, run_experiment,
                                         run_status, summary_table, validate_experiment)
from experiments_tiny_configs import TINY_DIGITS_TOML  # tests/reliability/conftest.py's path


def _config():
    raw = tomllib.loads(TINY_DIGITS_TOML)
    raw["seeds"] = [0]
    raw["operators"] = raw["operators"][:1]
    return load_experiment_config(raw)


def _run_at(dtype, out):
    torch.set_default_dtype(dtype)
    try:
        return run_experiment(_config(), out, progress=False, log=lambda m: None)
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.filterwarnings("ignore:.*toctree:RuntimeWarning")
def test_bug_status_and_publish_tell_a_run_built_at_another_default_dtype(tmp_path):
    """Bug: a run made at ``torch.set_default_dtype(torch.float64)`` records ``"dtype": "float64"`` and ``run`` in a
    float32 process refuses it ("different dtype"), but ``status`` called it a completed run of the config
    (``changed`` None) and ``publish`` put its float64 numbers on the config's page without a word (the manifest and
    tables name no dtype), as ``summary`` and ``analyze`` filed them silently. ``status`` now names the change, so
    ``publish`` refuses it with the fix that exists (the default dtype it was made at; no ``--set`` value changes
    it), and publishing at that default goes through."""
    config = _config()
    _run_at(torch.float64, tmp_path)
    (row,) = run_status(config, tmp_path)
    assert row["state"] == "completed"
    assert row["changed"] == "dtype (float64 then float32: torch.get_default_dtype() when the models were built)"
    with pytest.raises(ValueError, match=r"publish: 1 finished run.*dtype \(float64 then float32.*publish after "
                       r"torch\.set_default_dtype\(torch\.float64\), the default they were made at") as err:
        publish_experiment(config, tmp_path, tmp_path / "docs")
    assert "--set" not in str(err.value)  # no --set override brings a run's default dtype back
    with pytest.warns(UserWarning, match=r"summary: 1 finished run.*dtype \(float64 then float32"):
        summary_table([config], tmp_path)
    assert not (tmp_path / "docs").exists()
    torch.set_default_dtype(torch.float64)  # at the dtype it was made at: the config's run, published
    try:
        assert run_status(config, tmp_path)[0]["changed"] is None
        publish_experiment(config, tmp_path, tmp_path / "docs")
    finally:
        torch.set_default_dtype(torch.float32)
    assert (tmp_path / "docs" / config.name).is_dir()


def test_pins_float32_runs_stay_unchanged_in_status_and_are_told_at_the_float64_default(tmp_path):
    """Pin: a float32 run (which records no ``dtype``) is unchanged in ``status`` at the float32 default, and told as
    built at another default in a float64 process, where ``run`` refuses it too."""
    config = _config()
    _run_at(torch.float32, tmp_path)
    assert "dtype" not in json.loads(next(tmp_path.rglob("run_config.json")).read_text())
    assert run_status(config, tmp_path)[0]["changed"] is None
    torch.set_default_dtype(torch.float64)
    try:
        assert run_status(config, tmp_path)[0]["changed"] == (
            "dtype (float32 then float64: torch.get_default_dtype() when the models were built)")
    finally:
        torch.set_default_dtype(torch.float32)


def test_bug_validate_experiment_at_the_meta_default_device_names_it_not_the_data():
    """Bug: at a notebook's ``torch.set_default_device('meta')`` (or in a ``with torch.device('meta'):`` block),
    ``run_experiment`` refuses to start naming the default device, but ``validate_experiment`` (and
    ``check_experiment``) answered that the dataset "does not load: IndexError: index 65536 is out of bounds for
    dimension 0 with size 1797" (its split drawn on meta: another index at each call), blaming data that loads.
    They now refuse the meta default device by name, as the runner does; in inference mode they still check."""
    config = _config()
    for check in (validate_experiment, check_experiment):
        with torch.device("meta"), pytest.raises(RuntimeError, match=r"validate_experiment: expected a default "
                                                 r"device that holds data, got 'meta'"):
            check(config)
    with torch.inference_mode():  # no training: nothing to refuse
        assert validate_experiment(config) == []
