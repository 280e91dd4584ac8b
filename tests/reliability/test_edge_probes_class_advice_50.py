"""Finished runs made with another model class than the preset's now (a preset registered again in a notebook): what
``publish`` and ``analyze`` advise (no ``--set`` value changes a class, so "publish with the --set overrides they were
run with" named a fix that does not exist), and runs recorded before the class joined their identity, told from their
checkpoint's model record."""

from __future__ import annotations

import json
import shutil

import pytest

from diffusionformer.experiments import load_experiment_config, publish_experiment, run_experiment
from diffusionformer.experiments.analyze import _warn_other_train
from diffusionformer.models import DiffusionViT, ViTConfig, register_model
from diffusionformer.models import registry as MR

from experiments_tiny_configs import TINY_TRAIN as _TRAIN, TINY_VIT as _TINY_VIT


class _FirstViT(DiffusionViT):
    """A user's ViT."""


class _SecondViT(DiffusionViT):
    """Another user's ViT under the same preset name and config."""


def _config(model: str, max_steps: int | None = None, seeds=(0, 1)):
    train = dict(_TRAIN) if max_steps is None else {**_TRAIN, "max_steps": max_steps}
    return load_experiment_config({"name": "swap", "seeds": list(seeds), "operators": [{"name": "attention"}],
                                   "tasks": [{"name": "t", "dataset": "digits", "model": model, "train": train}]})


@pytest.fixture()
def swapped(tmp_path, preset_name):
    """A finished comparison of ``_FirstViT`` runs, the preset then registered again with ``_SecondViT``."""
    register_model(preset_name, _FirstViT, ViTConfig, **_TINY_VIT)
    run_experiment(_config(preset_name), tmp_path, progress=False, log=lambda s: None)
    MR._PRESETS.pop(preset_name)
    register_model(preset_name, _SecondViT, ViTConfig, **_TINY_VIT)
    return tmp_path


def test_bug_publish_advises_registering_the_class_not_set_overrides(swapped, preset_name):
    """Bug: ``publish`` refused runs of another model class (right) advising "publish with the --set overrides they
    were run with": no override changes a preset's class. It names the class to register under the preset again."""
    with pytest.raises(ValueError) as err:
        publish_experiment(_config(preset_name), swapped, swapped / "docs")
    message = str(err.value)
    assert "--set" not in message.split("; ", 1)[1].replace("no --set value", "")
    assert f"register the class they were made with ({_FirstViT.__module__}._FirstViT) as model preset " \
           f"{preset_name!r} again" in message
    assert message.endswith("or redo them with `run --restart`")


def test_another_budget_and_another_class_name_both_fixes(swapped, preset_name):
    """Runs that differ in their training config as well as their class: both fixes are named (and ``analyze`` warns
    with the same advice, worded for itself); runs that differ in their budget alone keep the ``--set`` advice."""
    config = _config(preset_name, max_steps=_TRAIN["max_steps"] + 1)
    with pytest.warns(RuntimeWarning) as caught:
        _warn_other_train(config, swapped)
    message = str(caught[0].message)
    assert "analyse with the --set overrides they were run with, or register the class they were made with" in message
    path = swapped / "swap" / "runs" / "t" / "attention"
    for seed in (0, 1):  # the class recorded is the one registered now: only the budget differs
        stored = json.loads((path / f"seed{seed}" / "run_config.json").read_text())
        stored["model_class"] = f"{_SecondViT.__module__}._SecondViT"
        (path / f"seed{seed}" / "run_config.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError) as err:
        publish_experiment(config, swapped, swapped / "docs")
    assert "train (max_steps" in str(err.value)
    assert str(err.value).endswith("; publish with the --set overrides they were run with, or redo them with "
                                   "`run --restart`")


def _forget_classes(root, seeds=(0, 1)):
    """Rewrite the runs' identities as a release before ``model_class`` joined them wrote them."""
    path = root / "swap" / "runs" / "t" / "attention"
    for seed in seeds:
        stored = json.loads((path / f"seed{seed}" / "run_config.json").read_text())
        del stored["model_class"]
        (path / f"seed{seed}" / "run_config.json").write_text(json.dumps(stored))
    return path


def test_bug_runs_recorded_before_model_class_are_told_from_their_checkpoint(swapped, preset_name):
    """Bug: when every seed of a comparison was recorded before ``model_class`` joined the identity, a preset
    registered again with another class was the same run everywhere: ``run`` skipped the finished runs and reported
    the first class's results as the second's, ``status`` said unchanged and ``publish`` published them. The class is
    in each run's checkpoint (its model record): a run recorded without ``model_class`` is compared with that."""
    from diffusionformer.experiments import run_status

    config = _config(preset_name)
    path = _forget_classes(swapped)
    rows = run_status(config, swapped)
    assert [r["state"] for r in rows] == ["completed", "completed"]
    assert all(r["changed"] is not None and "._FirstViT then " in r["changed"] for r in rows)
    with pytest.raises(ValueError, match=r"register the class they were made with \(\S+\._FirstViT\)"):
        publish_experiment(config, swapped, swapped / "docs")
    shutil.rmtree(path / "seed0")
    with pytest.raises(ValueError, match=r"different model_class \(\S+\._FirstViT then \S+\._SecondViT\)"):
        run_experiment(_config(preset_name, seeds=(1,)), swapped, progress=False, log=lambda s: None)  # its own record
    with pytest.raises(ValueError, match=r"seed1 holds a finished run .* different model_class \(\S+\._FirstViT"):
        run_experiment(_config(preset_name, seeds=(0,)), swapped, progress=False, log=lambda s: None)  # a sibling's
    (path / "seed1" / "checkpoint.pt").unlink()  # no record left: the same run, as before (nothing to tell it by)
    assert run_status(config, swapped)[1]["changed"] is None


def test_runs_recorded_before_model_class_of_the_same_class_still_resume(tmp_path, preset_name):
    """The same class registered again: runs recorded without ``model_class`` are read back, not refused (their
    checkpoint names the class registered now), beside a sibling recorded with it."""
    register_model(preset_name, _FirstViT, ViTConfig, **_TINY_VIT)
    config = _config(preset_name)
    first = run_experiment(config, tmp_path, progress=False, log=lambda s: None)
    _forget_classes(tmp_path, seeds=(1,))
    from diffusionformer.experiments import run_status

    assert [r["changed"] for r in run_status(config, tmp_path)] == [None, None]
    again = run_experiment(config, tmp_path, progress=False, log=lambda s: None)
    assert [r.value for r in again] == [r.value for r in first]
