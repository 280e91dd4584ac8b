"""Task adapters are looked up in a registry keyed by (model config class, data container class).

The reference is the isinstance chain the registry replaced, written out here: for every model
family and every kind of data, the registry gives the same overrides, the same error, the same
task class and the same held-out data.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from diffusionformer.data.base import ClassificationData, GraphSetData, NodeData, SequenceTaskData, TextData
from diffusionformer.experiments import tasks as T
from diffusionformer.models import DINOConfig, GCNConfig, GINConfig, GPTConfig, GraphTransformerConfig, ViTConfig

FAMILIES = [DINOConfig, ViTConfig, GPTConfig, GraphTransformerConfig, GCNConfig, GINConfig]


def _container(cls: type, **fields: Any) -> Any:
    obj = cls.__new__(cls)
    obj.__dict__.update(fields)
    return obj


DATA = {
    "image": _container(ClassificationData, name="img", kind="image", input_shape=(3, 8, 8), num_classes=10),
    "signal": _container(ClassificationData, name="sig", kind="sequence", input_shape=(16, 4), num_classes=3),
    "text": _container(TextData, name="txt", kind="text", vocab_size=65),
    "recall": _container(SequenceTaskData, name="rec", kind="sequence_lm", vocab_size=20),
    "node": _container(NodeData, name="cora", kind="node", num_features=7, num_classes=5),
    "graph": _container(GraphSetData, name="mutag", kind="graph", num_features=7, num_classes=2),
}


def _old_overrides(data: Any, family: type) -> dict[str, Any]:
    """The isinstance chain of ``model_overrides_for_data`` before the registry (the reference)."""
    if family is DINOConfig:
        if isinstance(data, ClassificationData) and data.kind == "image":
            return {"in_channels": data.input_shape[0], "input_size": tuple(data.input_shape[1:])}
        raise ValueError(f"dataset {data.name!r} of kind {data.kind!r} does not fit a DINO model: self-supervised DINO "
                         "needs image data (e.g. digits, mnist, mnist-mini, cifar10)")
    if family is ViTConfig and isinstance(data, ClassificationData):
        shape = tuple(data.input_shape)
        if data.kind == "image":
            return {"in_channels": shape[0], "input_size": shape[1:], "num_classes": data.num_classes}
        return {"in_channels": shape[1], "input_size": shape[:1], "num_classes": data.num_classes}
    if family is GPTConfig and isinstance(data, (TextData, SequenceTaskData)):
        return {"vocab_size": data.vocab_size}
    if family in (GraphTransformerConfig, GCNConfig, GINConfig) and isinstance(data, NodeData):
        return {"in_channels": data.num_features, "num_classes": data.num_classes, "task": "node"}
    if family in (GraphTransformerConfig, GCNConfig, GINConfig) and isinstance(data, GraphSetData):
        return {"in_channels": data.num_features, "num_classes": data.num_classes, "task": "graph"}
    raise ValueError(f"dataset {data.name!r} of kind {data.kind!r} does not fit a "
                     f"{family.__name__.replace('Config', '')} model; pick a preset of the matching family")


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except (ValueError, TypeError) as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("kind", list(DATA))
def test_overrides_are_those_of_the_isinstance_chain(family, kind):
    data = DATA[kind]
    assert _outcome(T.model_overrides_for_data, data, family) == _outcome(_old_overrides, data, family)


class _Model(torch.nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config


def _old_task_class(data: Any, model: Any) -> Any:
    """The isinstance chain of ``build_task`` before the registry: which class, or which error."""
    if isinstance(model.config, DINOConfig):
        return T.DINOTask
    if isinstance(data, ClassificationData):
        return T.ClassificationTask
    if isinstance(data, TextData):
        if getattr(model.config, "block_size", None) is None:
            return ValueError, "a text task needs a GPT model (with config.block_size)"
        return T.TextLMTask
    return {SequenceTaskData: T.SequenceLMTask, NodeData: T.NodeTask, GraphSetData: T.GraphClassificationTask}[type(data)]


@pytest.mark.parametrize("family", [ViTConfig, GPTConfig, GCNConfig], ids=lambda f: f.__name__)
@pytest.mark.parametrize("kind", [k for k in DATA if k != "graph"])  # graph sets: built from real graphs below
def test_build_task_picks_the_class_of_the_isinstance_chain(family, kind, monkeypatch):
    data = DATA[kind]
    config = family.__new__(family)
    if family is GPTConfig:
        config.__dict__["block_size"] = 8
    model = _Model(config)
    expected = _old_task_class(data, model)
    got = _outcome(T.build_task, data, model)
    assert (type(got) if not isinstance(got, tuple) else got) == expected


def test_a_dino_model_gets_the_dino_task_and_refuses_data_that_are_not_images():
    model = _Model(DINOConfig.__new__(DINOConfig))
    assert T.find_adapter(DINOConfig, DATA["image"], "task") is T.find_adapter(DINOConfig, DATA["text"], "task")
    with pytest.raises(ValueError, match="DINOTask needs image data"):
        T.build_task(DATA["text"], model)
    assert T.find_adapter(DINOConfig, DATA["image"], "predictions").predictions is False
    assert T.find_adapter(ViTConfig, DATA["image"], "predictions").predictions is True
    assert T.find_adapter(ViTConfig, DATA["image"], "analysed") is None


def test_heldout_batches_of_a_graph_set_follow_the_data():
    from torch_geometric.data import Data

    graphs = [Data(x=torch.randn(3, 2), edge_index=torch.tensor([[0, 1], [1, 2]]), y=torch.tensor([i % 2])) for i in range(5)]
    data = GraphSetData("g", graphs, torch.arange(3), torch.arange(3, 4), torch.arange(4, 5), 2, 2)
    batches, info = T.heldout_batches(data, _Model(GCNConfig.__new__(GCNConfig)), "train", max_examples=3, batch_size=2)
    assert [b[1].tolist() for b in batches] == [[0, 1], [0]] and info == {"split": "train", "labels": "class per graph"}
    assert isinstance(T.build_task(data, _Model(GCNConfig.__new__(GCNConfig)), eval_batch_size=999), T.GraphClassificationTask)


def test_a_new_family_registers_one_adapter_and_inherits_the_task_of_its_data(task_adapters):
    class MambaConfig:
        block_size = 16

    @T.task_adapter(MambaConfig, TextData)
    def sizes(data: Any) -> dict[str, Any]:
        return {"vocab_size": data.vocab_size}

    assert T.model_overrides_for_data(DATA["text"], MambaConfig) == {"vocab_size": 65}
    with pytest.raises(ValueError, match="does not fit a Mamba model"):
        T.model_overrides_for_data(DATA["image"], MambaConfig)
    task = T.build_task(_container(TextData, name="t", vocab_size=65), _Model(MambaConfig()))
    assert isinstance(task, T.TextLMTask) and task.block_size == 16
    with pytest.raises(ValueError, match=r"already registered"):
        T.register_task_adapter(MambaConfig, TextData, T.TaskAdapter(overrides=sizes))
    with pytest.raises(TypeError, match="TaskAdapter"):
        T.register_task_adapter(MambaConfig, NodeData, sizes)
    with pytest.raises(ValueError, match="unknown adapter hook"):
        T.find_adapter(MambaConfig, TextData, "overide")


def test_a_family_specific_task_wins_over_the_task_of_any_model(task_adapters):
    class Special(T.ClassificationTask):
        pass

    class ProbeConfig:
        pass

    T.register_task_adapter(ProbeConfig, ClassificationData, T.TaskAdapter(task=lambda d, m, b: Special(d, b)))
    assert type(T.build_task(DATA["image"], _Model(ProbeConfig()))) is Special
    assert type(T.build_task(DATA["image"], _Model(ViTConfig.__new__(ViTConfig)))) is T.ClassificationTask
    with pytest.raises(TypeError, match="no task adapter for int"):
        T.build_task(3, _Model(ProbeConfig()))
