"""Edge-case probes (second round) of the task adapters, the model builder and the operator settings.

Probed: every adapter's evaluation against float64 loops for several ``eval_batch_size`` (graph batches of unequal
sizes, a smaller last batch), ``train_batch`` reproducible from ``(step, generator)`` whatever the global RNG,
``build_model`` against a model built by hand from the preset and the overrides, operator settings whose model
overrides change the head count or repeat the head layout, ``laplacian_heads`` lists with ``"half"``, held-out
batches of misspelt splits, the adapter registry given no class, a config instance or ``None``, and sequence data
with an ``ignore_index`` other than ``-100``.

Found and fixed (tests named ``test_bug_...``):

- ``build.add_setting_overrides``: ``{H}``, ``{half}`` and ``laplacian_heads = "half"`` were resolved with the
  task's head count even when the setting's own ``model_overrides`` set ``num_heads``/``n_head``: ``"half"`` gave
  1 Laplacian head of 4 (silently; validation passed) and ``"attention:{H}"`` was refused.
- ``config.OperatorSetting``: ``laplacian_heads = [0, "half"]`` was refused at load ("expected int | str | list |
  None"), though the model configs and ``resolve_layer_heads`` take ``"half"`` entries; a setting giving its head
  layout both as ``heads``/``laplacian_heads`` and in ``model_overrides`` kept one of them without a word.
- ``tasks.heldout_batches``: a misspelt split raised ``AttributeError: 'GlobalStorage' object has no attribute
  'tset_mask'`` for node data and gave validation windows for text (``"train"`` too).
- ``tasks.register_task_adapter``/``find_adapter``: an empty ``family`` or ``data`` sequence registered nothing and
  returned the adapter as if registered; ``find_adapter`` with a config instance said "unhashable type", with a
  class name (a str) or ``data=None`` found nothing, silently.
- ``tasks.SequenceLMTask``: a ``SequenceTaskData`` with its own ``ignore_index`` trained on the model's loss, which
  ignores only ``-100``: ``ignore_index=0`` scored the ignored positions as targets of token 0, ``-1`` failed the
  first step; the held-out labels kept the data's value where the analysis reads ``-100`` as "no target".
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data

from diffusionformer.data.base import ClassificationData, GraphSetData, NodeData, SequenceTaskData, TextData
from diffusionformer.data.text import char_text_data
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.build import build_model
from diffusionformer.experiments.config import OperatorSetting, TaskConfig
from diffusionformer.experiments.tasks import (ClassificationTask, GraphClassificationTask, SequenceLMTask, TaskAdapter,
                                               build_task, find_adapter, heldout_batches, register_task_adapter)
from diffusionformer.experiments.validate import validate_experiment
from diffusionformer.models import DiffusionGPT, GPTConfig, ViTConfig, create_model
from diffusionformer.nn.heads import resolve_layer_heads


def _images(n=(6, 4, 3)):
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(k, 1, 8, 8, generator=g) for k in n]
    ys = [torch.randint(0, 3, (k,), generator=g) for k in n]
    return ClassificationData("img", "image", xs[0], ys[0], xs[1], ys[1], xs[2], ys[2], 3, (1, 8, 8))


def _task(**overrides):
    return TaskConfig("d", "digits", "vit-digits", train={"max_steps": 1},
                      model_overrides={"dim": 16, "depth": 2, "num_heads": 2, **overrides})


def _same_model(a, b):
    """Same config and same parameter shapes (the layout decides the operators' parameters)."""
    assert a.config == b.config
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}


# ----------------------------------------------------------------------------- build: the setting's head count
@pytest.mark.parametrize("setting, by_hand", [
    (OperatorSetting("lap", laplacian_heads="half", model_overrides={"num_heads": 4}),
     {"num_heads": 4, "laplacian_heads": 2}),
    (OperatorSetting("heat", heads="attention:{half},heat:{half}", model_overrides={"num_heads": 4}),
     {"num_heads": 4, "heads": "attention:2,heat:2"}),
    (OperatorSetting("all", heads="laplacian:{H}", model_overrides={"num_heads": 4}),
     {"num_heads": 4, "heads": "laplacian:4"}),
], ids=["laplacian-half", "half", "H"])
def test_bug_a_settings_own_head_count_fills_its_templates(setting, by_hand):
    """Bug: a setting's templates were filled with the task's head count (2) although its model_overrides give the
    model 4 heads: ``laplacian_heads = "half"`` built 1 Laplacian head of 4 (silently, and validation passed), and
    ``{half}``/``{H}`` specs were refused ("assigns 2 heads but the layer has num_heads=4")."""
    data = _images()
    model = build_model(_task(), setting, data)
    sizes = {"in_channels": 1, "input_size": (8, 8), "num_classes": 3, "dim": 16, "depth": 2}
    torch.manual_seed(0)
    _same_model(model, create_model("vit-digits", **sizes, **by_hand))
    config = load_experiment_config({"name": "p", "seeds": [0], "tasks": [
        {"name": "d", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 1},
         "model_overrides": {"dim": 16, "depth": 2, "num_heads": 2}}],
        "operators": [{"name": "attention"}, {"name": setting.name, "heads": setting.heads,
                                              "laplacian_heads": setting.laplacian_heads,
                                              "model_overrides": setting.model_overrides}]})
    assert validate_experiment(config, load_data=False) == []
    # without the setting's head count the task's is used, as before
    assert build_model(_task(), OperatorSetting("lap", laplacian_heads="half"), data).config.laplacian_heads == 1


def test_bug_a_settings_n_head_fills_a_gpt_template():
    """Bug: as above for a GPT (``n_head``): ``laplacian_heads = "half"`` with ``model_overrides = {n_head = 4}``
    on a task of 2 heads gave 1 Laplacian head of 4."""
    data = char_text_data("toy", "abcdefgh" * 40)
    task = TaskConfig("t", "pydoc-chars", "gpt-char-tiny", metric="val_loss", train={"max_steps": 1},
                      model_overrides={"n_embd": 16, "n_layer": 1, "n_head": 2, "block_size": 8})
    model = build_model(task, OperatorSetting("lap", laplacian_heads="half", model_overrides={"n_head": 4}), data)
    assert (model.config.n_head, model.config.laplacian_heads) == (4, 2)
    ref = create_model("gpt-char-tiny", vocab_size=data.vocab_size, n_embd=16, n_layer=1, n_head=4, block_size=8,
                       laplacian_heads=2)
    _same_model(model, ref)


# ----------------------------------------------------------------------------- config: OperatorSetting
def test_bug_laplacian_heads_list_may_hold_half():
    """Bug: ``laplacian_heads = [0, "half"]`` in an operator setting was refused at load ("expected int | str |
    list | None, got list [0, 'half']"), though the model configs and ``resolve_layer_heads`` accept ``"half"``
    entries (per-layer: none in layer 0, H // 2 in layer 1)."""
    config = load_experiment_config({"name": "p", "seeds": [0], "tasks": [
        {"name": "d", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 1},
         "model_overrides": {"dim": 16, "depth": 2, "num_heads": 4}}],
        "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": [0, "half"]}]})
    setting = config.operators[1]
    assert setting.laplacian_heads == [0, "half"]
    model = build_model(config.tasks[0], setting, _images())
    assert model.config.laplacian_heads == [0, 2]
    assert resolve_layer_heads(2, 4, laplacian_heads=[0, "half"]) == [None, "attention:2,laplacian:2"]
    torch.manual_seed(0)
    _same_model(model, create_model("vit-digits", in_channels=1, input_size=(8, 8), num_classes=3, dim=16, depth=2,
                                    num_heads=4, laplacian_heads=[0, 2]))
    assert validate_experiment(config, load_data=False) == []


@pytest.mark.parametrize("fields", [
    {"heads": "attention:{H}", "model_overrides": {"heads": "heat:2"}},
    {"laplacian_heads": 1, "model_overrides": {"laplacian_heads": 2}},
    {"laplacian_heads": 1, "model_overrides": {"heads": "heat:2"}},
])
def test_bug_a_head_layout_given_twice_is_refused(fields):
    """Bug: a setting with ``heads`` (or ``laplacian_heads``) and the same key in its ``model_overrides`` built
    the model with the setting's own value, dropping the other without a word (``laplacian_heads`` with
    ``model_overrides.heads`` failed only when the model was built: "give either heads= or laplacian_heads=")."""
    with pytest.raises(ValueError, match=r"operator setting 'x': (heads|laplacian_heads) is set and model_overrides "
                                         r"sets (heads|laplacian_heads) too"):
        OperatorSetting("x", **fields)
    with pytest.raises(ValueError, match="operator setting 'x'"):
        load_experiment_config({"name": "p", "seeds": [0], "tasks": [
            {"name": "d", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 1}}],
            "operators": [{"name": "x", **fields}]})
    # one layout in either place is fine
    OperatorSetting("x", model_overrides={"heads": "heat:2"})
    OperatorSetting("x", heads="heat:{H}", model_overrides={"dim": 8})


# ----------------------------------------------------------------------------- tasks: held-out batches
def _nodes():
    masks = [torch.tensor(m, dtype=torch.bool) for m in ([1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1])]
    data = Data(x=torch.randn(4, 2, generator=torch.Generator().manual_seed(3)),
                edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]), y=torch.tensor([0, 1, 0, 1]),
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
    return NodeData("n", data, 2, 2)


def _gpt(vocab, block=8):
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=vocab, block_size=block, n_layer=1, n_head=1, n_embd=8))


def test_bug_heldout_batches_refuse_an_unknown_split():
    """Bug: ``heldout_batches(node_data, ..., "tset", ...)`` raised ``AttributeError: 'GlobalStorage' object has
    no attribute 'tset_mask'``, and text data gave validation windows for any split, "tset" and "train" too."""
    text = char_text_data("toy", "".join(chr(97 + (i * i) % 7) for i in range(600)))
    gpt = _gpt(text.vocab_size)
    for data, model in ((_nodes(), nn.Linear(1, 1)), (text, gpt), (_images(), nn.Linear(1, 1))):
        with pytest.raises(ValueError, match=r"split must be one of \['train', 'val', 'test'\], got 'tset' "
                                             r"\(did you mean 'test'\?\)"):
            heldout_batches(data, model, "tset", 3, 2)
    batches, info = heldout_batches(text, gpt, "train", 3, 2)
    g = torch.Generator().manual_seed(1234)
    ref = [text.get_batch("train", 2, 8, g), text.get_batch("train", 1, 8, g)]
    assert info["split"] == "train"
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches, ref))
    assert heldout_batches(text, gpt, "test", 3, 2)[1]["split"] == "val"  # text has no test split: val, as said


# ----------------------------------------------------------------------------- tasks: the adapter registry
def test_bug_the_adapter_registry_refuses_no_class(task_adapters):
    """Bug: ``register_task_adapter([], TextData, adapter)`` (and ``data=[]``) registered nothing and returned the
    adapter as if registered; ``find_adapter(ViTConfig(), ...)`` said "unhashable type: 'ViTConfig'",
    ``find_adapter("ViTConfig", ...)`` and ``find_adapter(ViTConfig, None, ...)`` returned None, silently."""
    before = dict(task_adapters)
    for family, data in (([], TextData), (ViTConfig, [])):
        with pytest.raises(ValueError, match="register_task_adapter: (family|data) names no class"):
            register_task_adapter(family, data, TaskAdapter())
    assert task_adapters == before
    for family in (ViTConfig(), "ViTConfig"):
        with pytest.raises(TypeError, match="family must be a model config class"):
            find_adapter(family, ClassificationData, "overrides")
    with pytest.raises(TypeError, match="data must be a data container or its class, got None"):
        find_adapter(ViTConfig, None, "overrides")
    # the nearest registered data class of a subclass: its own, else its base's
    class Sub(ClassificationData):
        pass

    assert find_adapter(ViTConfig, Sub, "overrides") is find_adapter(ViTConfig, ClassificationData, "overrides")
    own = register_task_adapter(None, Sub, TaskAdapter(heldout=lambda *a: ([], {})))
    assert find_adapter(ViTConfig, Sub, "heldout") is own
    assert find_adapter(ViTConfig, Sub, "task") is find_adapter(None, ClassificationData, "task")


# ----------------------------------------------------------------------------- tasks: ignore_index of sequences
def _sequences(ignore):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 7, (4, 6), generator=g)
    y = torch.full((4, 6), ignore)
    for row, cols in enumerate([[5], [1, 3, 5], [2], [2, 5]]):
        y[row, cols] = torch.randint(1, 7, (len(cols),), generator=g)
    return SequenceTaskData("seq", x, y, x[:2], y[:2], x[2:], y[2:], 7, ignore_index=ignore)


@pytest.mark.parametrize("ignore", [0, -1, -100])
def test_bug_sequence_task_trains_on_the_datas_ignore_index(ignore):
    """Bug: ``SequenceLMTask.loss`` took the model's loss, which ignores -100 only: with ``ignore_index=0`` every
    ignored position was a target of token 0 (the loss was that of 24 targets, not 7), with ``-1`` the first step
    failed ("targets ... outside [0, 7)"). Float64 reference: the targets' cross-entropy sum over rows x 7/4."""
    data = _sequences(ignore)
    model = _gpt(7, 6).double()
    task = SequenceLMTask(data)
    loss, metrics = task.loss(model, (data.x_train, data.y_train))
    logits = model(data.x_train)[0].double()
    keep = data.y_train != ignore
    lp = logits.log_softmax(-1)[keep]
    ref = -lp[torch.arange(int(keep.sum())), data.y_train[keep]].sum() / (4 * 7 / 4)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    acc = (logits[keep].argmax(-1) == data.y_train[keep]).double().mean().item()
    assert metrics["acc"].item() == pytest.approx(acc)
    val = task.evaluate(model, None)  # evaluation scored only the targets already
    v_keep = data.y_val != ignore
    v_lp = model(data.x_val)[0].double().log_softmax(-1)[v_keep]
    assert val["loss"] == pytest.approx(-v_lp[torch.arange(int(v_keep.sum())), data.y_val[v_keep]].mean().item())
    batches, info = heldout_batches(data, model, "val", 2, 2)
    labels = batches[0][1]
    assert "-100 = none" in info["labels"]
    assert int((labels != -100).sum()) == int(v_keep.sum())  # the analysis reads -100 as "no target"


# ----------------------------------------------------------------------------- pins
class _Pool(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 3)

    def forward(self, x, edge_index, batch=None):
        from torch_geometric.utils import scatter

        return scatter(self.lin(x), batch, 0, reduce="mean")


def test_graph_evaluation_is_a_mean_over_graphs_for_any_batch_size():
    """Pins: graphs of 2-4 nodes in batches of 1, 2, 3 (a smaller last batch) and 256: loss and accuracy are the
    float64 means over graphs (not over batches or nodes); an empty split is NaN."""
    g = torch.Generator().manual_seed(2)
    graphs = [Data(x=torch.randn(2 + i % 3, 2, generator=g), edge_index=torch.tensor([[0, 1], [1, 0]]),
                   y=torch.tensor([i % 3])) for i in range(11)]
    data = GraphSetData("g", graphs, torch.arange(3), torch.arange(3, 8), torch.arange(8, 11), 3, 2)
    torch.manual_seed(0)
    model = _Pool()
    for split, idx in (("val", range(3, 8)), ("test", range(8, 11))):
        lg = torch.stack([model.lin(graphs[i].x).double().mean(0) for i in idx])
        y = torch.cat([graphs[i].y for i in idx])
        ref_loss = F.cross_entropy(lg, y).item()
        ref_acc = (lg.argmax(-1) == y).double().mean().item()
        for size in (1, 2, 3, 256):
            out = GraphClassificationTask(data, size).evaluate(model, None)
            assert out[f"{split}_loss"] == pytest.approx(ref_loss, rel=1e-6)
            assert out[f"{split}_acc"] == ref_acc
    empty = GraphSetData("g", graphs, torch.arange(3), torch.arange(3, 11), torch.zeros(0, dtype=torch.long), 3, 2)
    out = GraphClassificationTask(empty).evaluate(model, None)
    assert math.isnan(out["test_loss"]) and math.isnan(out["test_acc"])


def test_train_batches_follow_the_generator_not_the_global_rng():
    """Pins: every adapter's batch is a function of (step, generator): equal under another global seed."""
    g0 = torch.Generator().manual_seed(2)
    graphs = [Data(x=torch.randn(3, 2, generator=g0), edge_index=torch.tensor([[0, 1], [1, 2]]), y=torch.tensor([i % 2]))
              for i in range(6)]
    tasks = [ClassificationTask(_images(), augment={"crop_padding": 1, "flip": True}),
             GraphClassificationTask(GraphSetData("g", graphs, torch.tensor([0, 1, 2]), torch.tensor([3]),
                                                  torch.tensor([4, 5]), 2, 2)),
             SequenceLMTask(_sequences(-100)),
             build_task(char_text_data("toy", "abcdefg" * 60), _gpt(7))]
    for task in tasks:
        batches = []
        for global_seed in (0, 1):
            torch.manual_seed(global_seed)
            b = task.train_batch(3, torch.Generator().manual_seed(7), 4)
            batches.append([b.x, b.y] if hasattr(b, "x") else list(b))
        assert all(torch.equal(a, b) for a, b in zip(*batches)), type(task).__name__
