"""Edge probes: the public way out of the model, dataset and task-adapter registries (``unregister_model``,
``unregister_dataset``, ``unregister_task_adapter``), as ``unregister_operator`` and ``unregister_metric`` are for
theirs: a notebook cell run twice got "already registered" and had no public way to replace what it registered."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

_DATA = "probe50u-recall"


@dataclasses.dataclass
class _Cfg:
    """A user's model family: its config class (the key of its task adapters)."""

    vocab_size: int = 8
    dim: int = 4


class _ModelA(nn.Module):
    def __init__(self, config: _Cfg) -> None:
        super().__init__()
        self.config = config
        self.emb = nn.Embedding(config.vocab_size, config.dim)

    def forward(self, x):
        return self.emb(x)


class _ModelB(_ModelA):
    """The same class "defined again" (a notebook cell run twice), changed."""


def _recall(num_examples: int, seed: int):
    from diffusionformer.data import load_dataset

    return load_dataset("assoc-recall", num_examples=num_examples, num_pairs=2, vocab_size=8, seed=seed)


@pytest.fixture
def dataset_name():
    """A throwaway dataset name, removed from the registry afterwards."""
    from diffusionformer.data import list_datasets, unregister_dataset

    yield _DATA
    if _DATA in list_datasets():
        unregister_dataset(_DATA)


@pytest.fixture
def cfg_adapters():
    """``_Cfg``'s task adapters, removed afterwards."""
    from diffusionformer.experiments import tasks as T

    yield
    for key in [k for k in T._ADAPTERS if k[0] is _Cfg]:
        T.unregister_task_adapter(*key)


# ----------------------------------------------------------------------------- models
def test_bug_register_model_clash_names_unregister_model_which_frees_the_name(preset_name):
    """Bug: a preset name registered again (a notebook cell run twice) raised "already registered" with no public
    way out (tests popped ``registry._PRESETS``). The message names ``unregister_model(<name>)``, which removes the
    preset and returns it; registered again, the name builds the NEW class."""
    from diffusionformer.models import create_model, get_preset, list_models, register_model, unregister_model

    first = register_model(preset_name, _ModelA, _Cfg, "first", dim=2)
    with pytest.raises(ValueError, match=rf"model preset '{preset_name}' is already registered \(by <class '.*_ModelA'>"
                                         rf"\); to replace it \(a class defined again\), call "
                                         rf"unregister_model\('{preset_name}'\) first"):
        register_model(preset_name, _ModelB, _Cfg, dim=3)
    assert get_preset(preset_name) is first  # the refused registration changed nothing
    assert unregister_model(preset_name) is first
    assert preset_name not in list_models()
    with pytest.raises(ValueError, match=rf"unknown model '{preset_name}'"):
        create_model(preset_name)
    register_model(preset_name, _ModelB, _Cfg, "second", dim=3)
    model = create_model(preset_name, vocab_size=5)
    assert type(model) is _ModelB and model.config == _Cfg(vocab_size=5, dim=3)


def test_bug_unregister_model_refuses_unknown_and_non_str_names_removing_nothing():
    """Bug: (no unregister_model) an unknown name must give get_preset's "unknown model ... (did you mean ...)"
    error and a non-str a TypeError, removing nothing."""
    from diffusionformer.models import list_models, unregister_model

    before = list_models()
    with pytest.raises(ValueError, match=r"unknown model 'VIT_DIGITS' \(did you mean 'vit-digits'\?\); available: "):
        unregister_model("VIT_DIGITS")
    with pytest.raises(ValueError, match=r"unknown model 'nothing-like-it'; available"):
        unregister_model("nothing-like-it")
    for bad in (3, None, ["vit-digits"]):
        with pytest.raises(TypeError, match="model name must be a string"):
            unregister_model(bad)
    assert list_models() == before


def test_bug_a_builtin_preset_can_be_unregistered_and_registered_again():
    """Bug: (no unregister_model) a built-in preset could not be replaced. Unregistered, its name is unknown (a
    config naming it fails as for a misspelt one); registered again from the returned preset, it builds as before."""
    from diffusionformer.models import create_model, list_models, register_model, unregister_model

    preset = unregister_model("vit-digits")
    try:
        assert "vit-digits" not in list_models()
        with pytest.raises(ValueError, match=r"unknown model 'vit-digits' \(did you mean '"):
            create_model("vit-digits")
        again = register_model(preset.name, preset.model_cls, preset.config_cls, preset.description,
                               task_config_cls=preset.task_config_cls, task_defaults=preset.task_defaults,
                               **preset.defaults)
        assert again == preset
        model = create_model("vit-digits", dim=8, depth=1, num_heads=2)
        assert model.config.input_size == (8, 8) and model.config.dim == 8
    finally:
        if "vit-digits" not in list_models():
            register_model(preset.name, preset.model_cls, preset.config_cls, preset.description, **preset.defaults)


# ----------------------------------------------------------------------------- datasets
def test_bug_register_dataset_clash_names_unregister_dataset_which_frees_the_name(dataset_name):
    """Bug: a dataset registered again (a notebook cell run twice) raised "dataset ... is already registered" with no
    public way out (tests deleted ``registry._REGISTRY[_key(...)]``). The message names
    ``unregister_dataset(<registered name>)``; it looks the name up as load_dataset does (case, ``-``/``_``), returns
    the DatasetSpec, and the name registered again loads with the NEW loader."""
    from diffusionformer.data import (dataset_spec, list_datasets, load_dataset, register_dataset,
                                      unregister_dataset)

    @register_dataset(dataset_name, kind="sequence_lm")
    def _first(*, seed: int = 0, n: int = 10):
        return _recall(n, seed)

    def _second(*, seed: int = 0, n: int = 20):
        return _recall(n, seed)

    with pytest.raises(ValueError, match=rf"dataset '{dataset_name}' is already registered; to replace it \(a loader "
                                         rf"defined again\), call unregister_dataset\('{dataset_name}'\) first"):
        register_dataset(dataset_name, kind="sequence_lm")(_second)
    spelt = dataset_name.upper().replace("-", "_")  # another spelling of the name: the call names the registered one
    with pytest.raises(ValueError, match=rf"dataset '{spelt}' is already registered \(as '{dataset_name}'\); .* call "
                                         rf"unregister_dataset\('{dataset_name}'\) first"):
        register_dataset(spelt, kind="sequence_lm")(_second)
    assert dataset_spec(dataset_name).loader is _first
    spec = unregister_dataset(spelt)
    assert spec.name == dataset_name and spec.loader is _first and spec.options == {"n": 10}
    assert dataset_name not in list_datasets()
    with pytest.raises(ValueError, match=rf"unknown dataset '{dataset_name}'"):
        load_dataset(dataset_name)
    register_dataset(dataset_name, kind="sequence_lm")(_second)
    data = load_dataset(dataset_name)
    assert dataset_spec(dataset_name).options == {"n": 20} and len(data.x_train) + len(data.x_val) + len(
        data.x_test) == 20


def test_bug_unregister_dataset_refuses_unknown_and_non_str_names_removing_nothing():
    """Bug: (no unregister_dataset) an unknown name must give dataset_spec's "unknown dataset ... (did you mean ...)"
    error and a non-str a TypeError, removing nothing."""
    from diffusionformer.data import list_datasets, unregister_dataset

    before = list_datasets()
    with pytest.raises(ValueError, match=r"unknown dataset 'digit' \(did you mean 'digits'"):
        unregister_dataset("digit")
    for bad in (3, None, ("digits",)):
        with pytest.raises(TypeError, match="dataset name must be a str"):
            unregister_dataset(bad)
    assert list_datasets() == before


def test_bug_a_builtin_dataset_can_be_unregistered_and_registered_again():
    """Bug: (no unregister_dataset) a built-in dataset could not be replaced. ``ptc_mr`` is found as ``PTC-MR`` (the
    look-up's normalisation), and its spec registers again as it was."""
    from diffusionformer.data import dataset_spec, list_datasets, register_dataset, unregister_dataset

    spec = unregister_dataset("PTC-MR")
    try:
        assert spec.name == "ptc_mr" and "ptc_mr" not in list_datasets()
        register_dataset(spec.name, kind=spec.kind, needs_root=spec.needs_root)(spec.loader)
        assert dataset_spec("ptc-mr") == spec
    finally:
        if "ptc_mr" not in list_datasets():
            register_dataset(spec.name, kind=spec.kind, needs_root=spec.needs_root)(spec.loader)


def test_bug_a_builtin_file_dataset_replaced_by_a_users_loader_reads_its_files_through_the_new_one(tmp_path,
                                                                                                  data_writers):
    """Bug: (no unregister_dataset) a built-in benchmark could not be wrapped by a user's loader of the same name.
    Replaced, ``load_dataset("MUTAG", root=...)`` runs the user's loader with the resolved root; the built-in one
    registered again loads the files as before."""
    from diffusionformer.data import dataset_spec, list_datasets, load_dataset, register_dataset, unregister_dataset

    data_writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG", node_labels=True)
    builtin = unregister_dataset("mutag")
    try:
        @register_dataset("mutag", kind="graph", needs_root=True)
        def _mutag(*, seed: int = 0, root):
            data = builtin.loader(seed=seed, root=root, verify=False)
            return dataclasses.replace(data, meta={**data.meta, "wrapped": True})

        assert load_dataset("MUTAG", root=tmp_path).meta["wrapped"] is True
        assert unregister_dataset("Mutag").loader is _mutag
    finally:
        if "mutag" in list_datasets() and dataset_spec("mutag") != builtin:
            unregister_dataset("mutag")
        if "mutag" not in list_datasets():
            register_dataset(builtin.name, kind=builtin.kind, needs_root=builtin.needs_root)(builtin.loader)
    data = load_dataset("mutag", root=tmp_path, verify=False)
    assert "wrapped" not in data.meta and len(data.dataset) == 20


# ----------------------------------------------------------------------------- task adapters
def test_bug_register_task_adapter_clash_names_the_unregister_call_with_the_same_arguments(cfg_adapters):
    """Bug: an adapter registered again (a notebook cell run twice) raised "a task adapter for (...) is already
    registered" with no public way out (tests popped ``tasks._ADAPTERS``). The message names the
    ``unregister_task_adapter`` call with the pairs' classes, as given (a sequence as a tuple), for the decorator too,
    and lists only the pairs that are taken (a partly free registration registers nothing)."""
    from diffusionformer.data.base import ClassificationData, NodeData, SequenceTaskData
    from diffusionformer.experiments import tasks as T

    @T.task_adapter(_Cfg, (SequenceTaskData, NodeData))
    def _sizes(data):
        return {}

    with pytest.raises(ValueError, match=r"task adapters for \(_Cfg, SequenceTaskData\), \(_Cfg, NodeData\) are "
                                         r"already registered; to replace them \(an adapter defined again\), call "
                                         r"unregister_task_adapter\(_Cfg, \(SequenceTaskData, NodeData\)\) first"):
        T.task_adapter(_Cfg, (SequenceTaskData, NodeData))(_sizes)
    with pytest.raises(ValueError, match=r"^a task adapter for \(_Cfg, NodeData\) is already registered; to replace "
                                         r"it .* call unregister_task_adapter\(_Cfg, NodeData\) first$"):
        T.register_task_adapter(_Cfg, (ClassificationData, NodeData), T.TaskAdapter())
    assert (_Cfg, ClassificationData) not in T._ADAPTERS  # all or nothing
    with pytest.raises(ValueError, match=r"a task adapter for \(None, NodeData\) is already registered; .* call "
                                         r"unregister_task_adapter\(None, NodeData\) first"):
        T.register_task_adapter(None, NodeData, T.TaskAdapter())


def test_bug_unregister_task_adapter_round_trip_and_build_task_uses_the_new_adapter(cfg_adapters):
    """Bug: (no unregister_task_adapter) an adapter could not be replaced. It removes the pairs its ``family`` and
    ``data`` name (register_task_adapter's forms) and returns each pair's adapter; the pairs registered again with another
    adapter, find_adapter and build_task use the NEW one."""
    from diffusionformer.data.base import NodeData, SequenceTaskData
    from diffusionformer.experiments import tasks as T

    first = T.register_task_adapter([_Cfg], [SequenceTaskData, NodeData], T.TaskAdapter(
        overrides=lambda data: {"vocab_size": 3}, task=lambda data, model, ebs: ("first", ebs)))
    assert T.unregister_task_adapter(_Cfg, (SequenceTaskData, NodeData)) == {(_Cfg, SequenceTaskData): first,
                                                                             (_Cfg, NodeData): first}
    assert T.find_adapter(_Cfg, SequenceTaskData, "overrides", any_model=False) is None
    data = _recall(10, 0)
    model = _ModelA(_Cfg())
    assert type(T.build_task(data, model)).__name__ == "SequenceLMTask"  # back to any model's adapter
    second = T.TaskAdapter(overrides=lambda data: {"vocab_size": data.vocab_size},
                           task=lambda data, model, ebs: ("second", ebs))
    T.register_task_adapter(_Cfg, (SequenceTaskData, NodeData), second)
    assert T.build_task(data, model, eval_batch_size=7) == ("second", 7)
    assert T.model_overrides_for_data(data, _Cfg) == {"vocab_size": 8}


def test_bug_unregister_task_adapter_is_all_or_nothing_and_names_the_missing_pair(cfg_adapters):
    """Bug: (no unregister_task_adapter) removing pairs one of which has no adapter must raise a KeyError naming that
    pair (and the pairs that family has) and remove none of them."""
    from diffusionformer.data.base import ClassificationData, NodeData, SequenceTaskData
    from diffusionformer.experiments import tasks as T

    adapter = T.register_task_adapter(_Cfg, SequenceTaskData, T.TaskAdapter(overrides=lambda data: {}))
    with pytest.raises(KeyError, match=r"no task adapter is registered for \(_Cfg, NodeData\), \(_Cfg, "
                                       r"ClassificationData\); the pairs registered for _Cfg: \(_Cfg, SequenceTaskData"
                                       r"\); nothing was removed"):
        T.unregister_task_adapter(_Cfg, (SequenceTaskData, NodeData, ClassificationData))
    assert T._ADAPTERS[(_Cfg, SequenceTaskData)] is adapter
    with pytest.raises(KeyError, match=r"no task adapter is registered for \(_ModelCfgless, SequenceTaskData\); "
                                       r"nothing was removed"):
        T.unregister_task_adapter(type("_ModelCfgless", (), {}), SequenceTaskData)
    assert T.unregister_task_adapter(_Cfg, SequenceTaskData) == {(_Cfg, SequenceTaskData): adapter}
    assert (_Cfg, SequenceTaskData) not in T._ADAPTERS


def test_bug_unregister_task_adapter_returns_each_pairs_adapter_when_several_served(cfg_adapters):
    """Bug: (no unregister_task_adapter) pairs served by different adapters come back as ``{(family, data):
    adapter}``, so each can be registered again."""
    from diffusionformer.data.base import NodeData, SequenceTaskData
    from diffusionformer.experiments import tasks as T

    a = T.register_task_adapter(_Cfg, SequenceTaskData, T.TaskAdapter(overrides=lambda data: {}))
    b = T.register_task_adapter(_Cfg, NodeData, T.TaskAdapter(overrides=lambda data: {}))
    removed = T.unregister_task_adapter(_Cfg, [SequenceTaskData, NodeData])
    assert removed == {(_Cfg, SequenceTaskData): a, (_Cfg, NodeData): b}
    for (family, data), adapter in removed.items():
        T.register_task_adapter(family, data, adapter)
    assert T.find_adapter(_Cfg, NodeData, "overrides", any_model=False) is b


def test_bug_unregister_task_adapter_refuses_the_forms_register_refuses():
    """Bug: (no unregister_task_adapter) its ``family``/``data`` are checked as register_task_adapter's: an empty
    sequence (which would remove nothing, silently), a model class for its config class, a non-class."""
    from diffusionformer.data.base import ClassificationData
    from diffusionformer.experiments import tasks as T
    from diffusionformer.models import DiffusionViT, ViTConfig

    before = dict(T._ADAPTERS)
    with pytest.raises(ValueError, match=r"unregister_task_adapter: family names no class \(an empty sequence\)"):
        T.unregister_task_adapter([], ClassificationData)
    with pytest.raises(ValueError, match=r"unregister_task_adapter: data names no class"):
        T.unregister_task_adapter(ViTConfig, ())
    with pytest.raises(TypeError, match=r"not by the model class; got DiffusionViT"):
        T.unregister_task_adapter(DiffusionViT, ClassificationData)
    for bad in ("ViTConfig", 3):
        with pytest.raises(TypeError, match=rf"keyed by classes .* got \({bad!r}, "):
            T.unregister_task_adapter(bad, ClassificationData)
    assert T._ADAPTERS == before


def test_bug_a_str_or_int_family_or_data_is_named_whole():
    """Bug: register_task_adapter("ViTConfig", ...) (a class's name for the class) was read as the sequence of its
    characters: the error named ('V', ClassificationData); a family or data of 3 failed with a bare "'int' object is
    not iterable". Both are named whole now, in the keyed-by-classes TypeError."""
    from diffusionformer.data.base import ClassificationData
    from diffusionformer.experiments import tasks as T
    from diffusionformer.models import ViTConfig

    before = dict(T._ADAPTERS)
    for family, data, shown in (("ViTConfig", ClassificationData, r"\('ViTConfig', <class"),
                                (3, ClassificationData, r"\(3, <class"),
                                (ViTConfig, "ClassificationData", r"\(<class .*ViTConfig'>, 'ClassificationData'\)"),
                                (ViTConfig, 3, r"\(<class .*ViTConfig'>, 3\)")):
        with pytest.raises(TypeError, match=rf"task adapters are keyed by classes \(model config, data container\), "
                                            rf"got {shown}"):
            T.register_task_adapter(family, data, T.TaskAdapter())
    assert T._ADAPTERS == before


def test_bug_a_builtin_any_model_adapter_can_be_unregistered_and_registered_again():
    """Bug: (no unregister_task_adapter) a built-in adapter (``None``: any model) could not be replaced; removed,
    build_task has no task for the data; registered again, it serves as before."""
    from diffusionformer.data.base import SequenceTaskData
    from diffusionformer.experiments import tasks as T

    adapter = T.unregister_task_adapter(None, SequenceTaskData)[None, SequenceTaskData]
    try:
        with pytest.raises(TypeError, match="no task adapter for SequenceTaskData"):
            T.build_task(_recall(10, 0), _ModelA(_Cfg()))
    finally:
        T.register_task_adapter(None, SequenceTaskData, adapter)
    assert type(T.build_task(_recall(10, 0), _ModelA(_Cfg()))).__name__ == "SequenceLMTask"


# ----------------------------------------------------------------------------- end to end
def test_bug_a_notebook_cell_run_twice_replaces_preset_dataset_and_adapter_end_to_end(preset_name, dataset_name,
                                                                                        cfg_adapters):
    """Bug: a cell registering a preset, a dataset and an adapter, run again with changes, got "already registered"
    three times with no public way out. Following each message's unregister call, the runner's own build
    (task_data, build_model, build_task) uses the NEW loader, class and adapter."""
    from diffusionformer.data import register_dataset, unregister_dataset
    from diffusionformer.data.base import SequenceTaskData
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments import tasks as T
    from diffusionformer.experiments.build import build_model, task_data
    from diffusionformer.models import register_model, unregister_model

    def cell(model_cls, n, tag):
        """The cell's three registrations, each a step the user may have to run again."""
        def loader():
            @register_dataset(dataset_name, kind="sequence_lm")
            def _load(*, seed: int = 0):
                return _recall(n, seed)

        def adapter():
            @T.task_adapter(_Cfg, SequenceTaskData, task=lambda data, model, ebs: (tag, len(data.x_train)))
            def _sizes(data):
                return {"vocab_size": data.vocab_size, "dim": 2 if tag == "first" else 6}

        return [lambda: register_model(preset_name, model_cls, _Cfg), loader, adapter]

    for step in cell(_ModelA, 10, "first"):
        step()
    messages = []
    names = {"unregister_model": unregister_model, "unregister_dataset": unregister_dataset,
             "unregister_task_adapter": T.unregister_task_adapter, "_Cfg": _Cfg, "SequenceTaskData": SequenceTaskData}
    for step in cell(_ModelB, 20, "second"):
        try:
            step()
        except ValueError as exc:  # what the user reads, and does
            messages.append(str(exc))
            eval(str(exc).split("call ")[-1].removesuffix(" first"), names)
            step()
    assert len(messages) == 3, messages
    config = load_experiment_config({"name": "e", "seeds": [0], "operators": [{"name": "attention"}],
                                     "tasks": [{"name": "t", "dataset": dataset_name, "model": preset_name}]})
    task = config.tasks[0]
    data = task_data(task, 0, None, {})
    model = build_model(task, config.operators[0], data)
    assert type(model) is _ModelB and model.config == _Cfg(vocab_size=8, dim=6)
    assert T.build_task(data, model) == ("second", len(data.x_train)) and len(data.x_train) == 16
    assert torch.equal(data.x_train, _recall(20, task.data_seed).x_train)


def test_the_new_names_are_exported_where_their_register_functions_are():
    from diffusionformer import data, models
    from diffusionformer.experiments import tasks

    assert "unregister_model" in models.__all__ and "unregister_dataset" in data.__all__
    assert "unregister_task_adapter" in tasks.__all__
    assert models.unregister_model is models.registry.unregister_model
    assert data.unregister_dataset is data.registry.unregister_dataset
