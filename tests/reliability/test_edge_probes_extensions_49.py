"""Edge probes of the extension points a user is invited to use: ``register_model``, ``register_dataset``,
``register_task_adapter`` / ``TaskAdapter``, ``register_metric`` / ``unregister_metric`` and a custom
``MetricsWriter`` behind ``LogGroup`` (the same probe of ``register_operator`` is in commits 475e7c6, addafd4,
b313850)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

from diffusionformer.analysis import LayerCapture, layer_reports
from diffusionformer.analysis import report as R
from diffusionformer.data import ClassificationData, load_dataset, register_dataset
from diffusionformer.data import registry as DR
from diffusionformer.data.base import NodeData
from diffusionformer.models import DiffusionViT, ViTConfig, register_model
from diffusionformer.models import registry as MR
from diffusionformer.experiments import tasks as T
from diffusionformer.train.loggers import LogGroup

from experiments_tiny_configs import TINY_TRAIN as _TRAIN, TINY_VIT as _TINY_VIT


def _config(name: str, model: str, seeds=(0,)):
    from diffusionformer.experiments import load_experiment_config

    return load_experiment_config({"name": name, "seeds": list(seeds), "operators": [{"name": "attention"}],
                                   "tasks": [{"name": "t", "dataset": "digits", "model": model, "train": _TRAIN}]})


class _MyViTA(DiffusionViT):
    """A user's ViT (as the library's)."""


class _MyViTB(DiffusionViT):
    """Another user's ViT: its logits are all zero (test accuracy of a constant guess)."""

    def forward(self, x, *args, **kwargs):
        return super().forward(x, *args, **kwargs) * 0


# ----------------------------------------------------------------------------- register_model + run identity
def test_bug_two_custom_classes_under_one_preset_name_are_not_one_run(tmp_path, preset_name):
    """Bug: a run's identity held the preset's name and its config, not the model's class: a preset name registered
    again with another class (a notebook re-run with a changed model, a config alike) found the first class's run
    "completed" and skipped it, reporting the first model's accuracy as the second's. A user's class is now part of
    the identity (``model_class``), and the rerun is refused naming both classes."""
    from diffusionformer.experiments import run_experiment

    register_model(preset_name, _MyViTA, ViTConfig, **_TINY_VIT)
    config = _config("ident", preset_name)
    first = run_experiment(config, tmp_path, progress=False, log=lambda s: None)
    assert first[0].status == "completed"
    stored = json.loads((tmp_path / "ident" / "runs" / "t" / "attention" / "seed0" / "run_config.json").read_text())
    assert stored["model_class"].endswith("._MyViTA")
    MR._PRESETS.pop(preset_name)
    register_model(preset_name, _MyViTB, ViTConfig, **_TINY_VIT)
    with pytest.raises(ValueError, match=r"different model_class \(\S+\._MyViTA then \S+\._MyViTB\)"):
        run_experiment(config, tmp_path, progress=False, log=lambda s: None)


def test_a_custom_run_recorded_without_its_class_still_resumes_and_library_runs_keep_their_identity(tmp_path,
                                                                                                   preset_name):
    """A run of a user's model recorded before ``model_class`` joined the identity is the same run (its finished
    result is read back beside a sibling seed that records it, neither refused nor left out of the results); runs of
    the library's own model classes hold no ``model_class``."""
    import warnings

    from diffusionformer.experiments import run_experiment
    from diffusionformer.experiments.runner import _run_identity
    from diffusionformer.experiments.config import train_config

    register_model(preset_name, _MyViTA, ViTConfig, **_TINY_VIT)
    config = _config("legacy", preset_name, seeds=(0, 1))
    first = run_experiment(config, tmp_path, progress=False, log=lambda s: None)
    path = tmp_path / "legacy" / "runs" / "t" / "attention" / "seed0" / "run_config.json"
    stored = json.loads(path.read_text())
    del stored["model_class"]
    path.write_text(json.dumps(stored))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = run_experiment(config, tmp_path, progress=False, log=lambda s: None)
    assert [r.value for r in again] == [r.value for r in first] and len(again) == 2
    builtin = _config("b", "vit-digits").tasks[0]
    model = MR.create_model("vit-digits", **{k: v for k, v in _TINY_VIT.items() if k != "input_size"})
    assert "model_class" not in _run_identity(builtin, model, train_config(builtin, 0))


@dataclasses.dataclass
class _MLPConfig:
    input_size: tuple = (8, 8)
    num_classes: int = 10
    hidden: int = 16


class _MLP(nn.Module):
    def __init__(self, config: _MLPConfig) -> None:
        super().__init__()
        self.config = config
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(config.input_size), config.hidden), nn.ReLU(),
                                 nn.Linear(config.hidden, config.num_classes))

    def forward(self, x):
        return self.net(x)


def test_a_custom_family_runs_end_to_end_and_resumes(tmp_path, preset_name):
    """A model of the user's own config class and adapter trains from an experiment config and its finished run is
    read back on a rerun (not trained again)."""
    from diffusionformer.experiments import run_experiment

    register_model(preset_name, _MLP, _MLPConfig)
    T.register_task_adapter(_MLPConfig, ClassificationData, T.TaskAdapter(
        overrides=lambda data: {"input_size": tuple(data.input_shape[1:]), "num_classes": data.num_classes}))
    try:
        config = _config("mlp", preset_name)
        first = run_experiment(config, tmp_path, progress=False, log=lambda s: None)
        logged = []
        again = run_experiment(config, tmp_path, progress=False, log=logged.append)
        assert first[0].status == again[0].status == "completed" and again[0].value == first[0].value
        from diffusionformer.experiments.reload import load_run

        loaded = load_run(tmp_path / "mlp" / "runs" / "t" / "attention" / "seed0")  # what analyze reads back
        assert type(loaded.model) is _MLP and loaded.config.input_size == (8, 8)
    finally:
        T._ADAPTERS.pop((_MLPConfig, ClassificationData), None)


def test_bug_a_bare_tuple_field_of_a_users_config_reads_a_list(preset_name):
    """Bug: a user's config field annotated bare ``tuple`` (``input_size: tuple = (8, 8)``) refused every list: a
    TOML ``model_overrides`` could not set it, and a run that trained could not be read back from its
    ``run_config.json`` (JSON has no tuples), so ``analyze``/``load_run`` failed with "expected tuple, got list".
    A bare ``tuple``/``list`` is now read as ``tuple[Any, ...]``/``list[Any]``."""
    from diffusionformer.config import config_from_dict

    assert config_from_dict(_MLPConfig, {"input_size": [4, 4]}).input_size == (4, 4)
    register_model(preset_name, _MLP, _MLPConfig)
    assert MR.model_config(preset_name, input_size=[2, 8]).input_size == (2, 8)
    with pytest.raises(TypeError, match=r"input_size: expected a list, got str 'ab'"):
        config_from_dict(_MLPConfig, {"input_size": "ab"})


def test_bug_a_config_subclass_without_an_adapter_is_told_to_register_one(preset_name):
    """Bug: a preset whose config class has no task adapter (a user's own, or a subclass of ``ViTConfig``: adapters
    are keyed by the exact class) was told its data "does not fit a MyCfg model; pick a preset of the matching
    family", sending the user to the library's presets; the error now says to register an adapter for it."""

    @dataclasses.dataclass
    class MyCfg(ViTConfig):
        scale: float = 1.0

    data = load_dataset("digits")
    with pytest.raises(ValueError, match=r"no task adapter is registered for model config class .*MyCfg.*"
                                         r"@task_adapter\(MyCfg, ClassificationData\)"):
        T.model_overrides_for_data(data, MyCfg)
    with pytest.raises(ValueError, match="does not fit a GPT model; pick a preset"):  # a library family: as before
        T.model_overrides_for_data(data, T.GPTConfig)


def test_bug_register_model_names_a_config_class_that_is_not_a_dataclass():
    """Bug: a ``config_cls`` that is not a dataclass (or a config instance) failed with "config_from_dict: cls must be
    a dataclass type", an argument the user never passed; the error now names the preset and ``config_cls``."""

    class NotADataclass:
        pass

    with pytest.raises(TypeError, match=r"preset 'probe49-nd': config_cls must be a dataclass .*NotADataclass"):
        register_model("probe49-nd", nn.Linear, NotADataclass)
    with pytest.raises(TypeError, match=r"preset 'probe49-nd': config_cls must be a dataclass .*got ViTConfig"):
        register_model("probe49-nd", DiffusionViT, ViTConfig())
    assert "probe49-nd" not in MR.list_models()


# ----------------------------------------------------------------------------- task adapters
def test_bug_task_adapter_hooks_are_checked_when_made():
    """Bug: ``TaskAdapter(overrides=3)`` or ``predictions="no"`` (truthy: outputs scored) were stored and failed, or
    misled, deep inside a run or the analysis; each hook is now checked when the adapter is made."""
    with pytest.raises(TypeError, match=r"TaskAdapter: overrides must be a function or None, got int \(3\)"):
        T.TaskAdapter(overrides=3)
    with pytest.raises(TypeError, match=r"TaskAdapter: task must be a function or None, got str"):
        T.TaskAdapter(task="ClassificationTask")
    with pytest.raises(TypeError, match=r"TaskAdapter: predictions must be a bool, got str \('no'\)"):
        T.TaskAdapter(predictions="no")
    with pytest.raises(TypeError, match=r"TaskAdapter: note must be a str or None, got int"):
        T.TaskAdapter(note=3)


def test_bug_a_task_adapter_keyed_by_the_model_class_is_refused():
    """Bug: ``register_task_adapter(DiffusionViT, ...)`` (the model class, not its config class) was registered and
    never found (runs look up ``type(model.config)``); it is refused, saying what the key is."""
    with pytest.raises(TypeError,
                       match=r"keyed by the model's config class .* not by the model class; got DiffusionViT"):
        T.register_task_adapter(DiffusionViT, NodeData, T.TaskAdapter(overrides=lambda data: {}))
    assert (DiffusionViT, NodeData) not in T._ADAPTERS


def test_bug_an_adapter_whose_overrides_return_no_mapping_is_named():
    """Bug: an ``overrides`` hook returning ``None`` (a forgotten ``return``) failed with a bare "'NoneType' object is
    not a mapping" while the model was built; the error names the hook and what it returned."""

    @dataclasses.dataclass
    class Cfg:
        hidden: int = 1

    T.register_task_adapter(Cfg, NodeData, T.TaskAdapter(overrides=lambda data: None))
    try:
        with pytest.raises(TypeError, match=r"overrides for Cfg on NodeData .* must return a dict of config values, "
                                            r"got None"):
            T.model_overrides_for_data(load_dataset("karate"), Cfg)
    finally:
        T._ADAPTERS.pop((Cfg, NodeData))


# ----------------------------------------------------------------------------- register_dataset
def test_bug_register_dataset_checks_its_name_flag_and_loader():
    """Bug: ``register_dataset(3, ...)`` raised "'int' object has no attribute 'strip'" when applied; ``""`` was
    registered (listed as a blank name) and ``" my data "`` listed with its spaces; ``needs_root="no"`` was truthy (a
    root passed); a loader ``3`` got "3 is not a callable object"; a ``**options`` loader was told it "must take
    keyword-only arguments, got ['options']"."""
    with pytest.raises(TypeError, match=r"dataset name must be a str, got int \(3\)"):
        register_dataset(3, kind="image")
    with pytest.raises(ValueError, match=r"dataset name must be a non-empty string, got ' '"):
        register_dataset(" ", kind="image")
    with pytest.raises(TypeError, match=r"register_dataset\('probe49-x'\): needs_root must be a bool, got str"):
        register_dataset("probe49-x", kind="image", needs_root="no")
    with pytest.raises(TypeError, match=r"loader for 'probe49-x' must be a function, got int \(3\)"):
        register_dataset("probe49-x", kind="image")(3)
    with pytest.raises(TypeError, match=r"not take \*args or \*\*kwargs; got \['options'\]"):
        register_dataset("probe49-x", kind="image")(lambda *, seed=0, **options: None)
    register_dataset("  probe49 spaced ", kind="image")(lambda *, seed=0: None)
    try:
        assert "probe49 spaced" in DR.list_datasets() and DR.dataset_spec("probe49 spaced").name == "probe49 spaced"
    finally:
        del DR._REGISTRY[DR._key("probe49 spaced")]
    assert "probe49-x" not in DR.list_datasets()


def test_bug_load_dataset_checks_what_a_registered_loader_returns():
    """Bug: a loader's result was handed on unchecked: a dict reached the task and failed deep inside it, and a
    container of another kind than registered (``kind="image"`` returning a graph) was validated by the registered
    kind (model family, evaluation keys) and trained as the other; both are refused naming the dataset."""
    register_dataset("probe49-dict", kind="image")(lambda *, seed=0: {"x": 1})
    register_dataset("probe49-kind", kind="image")(lambda *, seed=0: load_dataset("karate", seed=seed))
    try:
        with pytest.raises(TypeError, match=r"loader of dataset 'probe49-dict' .* must return a data container "
                                            r"\(ClassificationData, .*\), got dict"):
            load_dataset("probe49-dict")
        with pytest.raises(ValueError, match=r"loader of dataset 'probe49-kind' returned a container of kind 'node', "
                                             r"but the dataset is registered with kind 'image'"):
            load_dataset("probe49-kind")
    finally:
        del DR._REGISTRY[DR._key("probe49-dict")], DR._REGISTRY[DR._key("probe49-kind")]


# ----------------------------------------------------------------------------- register_metric
@pytest.fixture
def capture():
    torch.manual_seed(0)
    return LayerCapture({0: torch.randn(4, 3, 2), 1: torch.randn(4, 3, 2)})


@pytest.mark.parametrize("value, error, match", [
    (float("nan"), ValueError, r"metric 'probe49_m' \(layer 0\) returned NaN; return None where it is undefined"),
    ("0.5", TypeError, r"metric 'probe49_m' \(layer 0\) must return a float or None, got str \('0.5'\)"),
    (torch.tensor(0.5), TypeError, r"must return a float or None, got Tensor .*use float"),
    (True, TypeError, r"must return a float or None, got bool \(True\)"),
])
def test_bug_a_registered_metric_returning_no_number_is_named(capture, value, error, match):
    """Bug: a registered metric's value went into the report as returned: NaN (read as collapse, where the design
    says metrics never give NaN), a string, a tensor or a bool reached ``metrics.json`` and the tables; each is now
    refused naming the metric and the layer."""
    R.register_metric("probe49_m", group="smoothing")(lambda view: value)
    try:
        with pytest.raises(error, match=match):
            layer_reports(capture)
    finally:
        R.unregister_metric("probe49_m")


def test_a_registered_metric_may_return_numpy_numbers_inf_and_none(capture):
    import numpy as np

    for key, value in (("probe49_np", np.float64(2.5)), ("probe49_inf", math.inf), ("probe49_none", None)):
        R.register_metric(key, group="spectral")(lambda view, value=value: value)
    try:
        metrics = layer_reports(capture)[1].metrics
        assert (metrics["probe49_np"], metrics["probe49_inf"], metrics["probe49_none"]) == (2.5, math.inf, None)
        assert type(metrics["probe49_np"]) is float
    finally:
        for key in ("probe49_np", "probe49_inf", "probe49_none"):
            R.unregister_metric(key)


def test_bug_register_metric_checks_its_function_and_settings_and_says_how_to_replace():
    """Bug: ``register_metric(...)(3)`` was stored and every later report failed with "'int' object is not
    callable"; a ``panel="2"``, ``label=3`` or ``column=3`` failed in the analysis's figures and tables;
    ``unregister_metric(["a"])`` said "unhashable type"; a notebook cell run twice was told only "already
    registered", with no way out (``unregister_metric`` first, as ``register_operator`` now says)."""
    with pytest.raises(TypeError, match=r"metric 'probe49_x': register_metric decorates a function of a LayerView, "
                                        r"got int \(3\)"):
        R.register_metric("probe49_x", group="smoothing")(3)
    with pytest.raises(TypeError, match=r"metric 'probe49_x': panel must be an int or None, got str \('2'\)"):
        R.register_metric("probe49_x", group="smoothing", panel="2")
    with pytest.raises(TypeError, match=r"metric 'probe49_x': label must be a str or None, got int"):
        R.register_metric("probe49_x", group="smoothing", label=3)
    with pytest.raises(TypeError, match=r"metric 'probe49_x': column must be a str or None, got int"):
        R.register_metric("probe49_x", group="smoothing", column=3)
    with pytest.raises(TypeError, match=r"metric key must be a string, got list"):
        R.unregister_metric(["a"])
    assert "probe49_x" not in [m.key for m in R.list_metrics()]

    def cell(view):
        return 1.0

    R.register_metric("probe49_x", group="smoothing")(cell)
    try:
        with pytest.raises(ValueError, match=r"already registered; to replace it .* call "
                                             r"unregister_metric\('probe49_x'\) first"):
            R.register_metric("probe49_x", group="smoothing")(cell)
    finally:
        R.unregister_metric("probe49_x")


# ----------------------------------------------------------------------------- a custom MetricsWriter
def test_bug_log_group_checks_its_writers():
    """Bug: ``LogGroup`` took a writer lacking ``truncate``/``close`` (or one writer not in a list, or a name) and
    failed at the first record or the resume, deep in training; each writer is checked when the group is made."""

    class AppendOnly:
        def append(self, record):
            pass

    with pytest.raises(TypeError, match=r"AppendOnly .* lacks truncate, close"):
        LogGroup([AppendOnly()])
    with pytest.raises(TypeError, match=r"expected a sequence of metrics writers, got AppendOnly"):
        LogGroup(AppendOnly())
    with pytest.raises(TypeError, match=r"expected a sequence of metrics writers, got str \('csv'\)"):
        LogGroup("csv")
