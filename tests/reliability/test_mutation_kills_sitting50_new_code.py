"""Mutation audit (sitting 50, commits 203f9ca, e9b1d76, 8d61ef7) of the library code added that day: a run's model
class read from its checkpoint (experiments/results.py ``_runs_of_another_train``'s advice and ``_CLASS_CHANGE``,
``_checkpoint_entry``, ``_with_recorded_class``, ``_model_class_change``; runner.py ``_check_identity`` and
``_check_sibling_identity``), the registries' way out (models/registry.py ``unregister_model`` and its clash message,
data/registry.py ``unregister_dataset`` and its clash message, experiments/tasks.py ``_adapter_keys``,
``_unregister_call``, ``register_task_adapter``, ``unregister_task_adapter``) and torch's factory arguments
(nn/_factory.py; the ``device=``/``dtype=`` lines of nn/attention.py, nn/block.py, nn/rotary.py): tests that kill
mutants the day's tests left alive (each docstring names the mutant), and one library bug. No GPU is used.

94 hand mutants of the changed lines, one at a time, each restored from a cp backup (results.py 18, runner.py 5,
models/registry.py 3, data/registry.py 5, tasks.py 23, nn/_factory.py 12, nn/attention.py 12, nn/block.py 14,
nn/rotary.py 2): 60 killed by the day's tests (tests/reliability/test_edge_probes_class_advice_50.py,
tests/reliability/test_edge_probes_unregister_50.py, tests/core/test_factory_kwargs_50.py), 1 by an older one
(``_checkpoint_entry``'s ``for mmap in (True, False)`` -> ``(True,)``: a legacy-format checkpoint, by
tests/experiments/test_edge_probes_status_resume.py), 26 survivors killed here, 6 equivalent, and 1 survivor that
showed a bug: results.py ``_with_recorded_class`` without ``or recorded.startswith("diffusionformer.")`` is the fix (a
run whose checkpoint names a library class, checked against a user's class registered now under its preset, is a run
of another class: the Bug: test below). After the fix, ``or now is None`` dropped from the same function (a survivor
before: it only read legacy runs of a user's class when the preset builds a library class now) is killed here: every
finished run of a library model read as "changed" (another seed's refused as a sibling).

Equivalent mutants:

* results.py ``_runs_of_another_train`` ``_CLASS_CHANGE.sub("", r["changed"]).strip(", ")`` without ``.strip(", ")``:
  ``run_status`` joins a run's changes with ``", "``, the ``model_class (...)`` part last and only when not empty, so
  what is left after removing it is either empty or starts with another change's name (never only commas/spaces).
* results.py ``_CLASS_CHANGE``'s group ``([^()]*)`` -> ``(.*)``: the class part is the last
  part of a ``changed`` text (``run_status`` appends it after the train and model changes) and class names hold no
  parentheses, so the greedy group ends at the same closing parenthesis.
* runner.py ``_check_identity`` ``_with_recorded_class`` before ``_normalized_identity`` instead of after: the first
  only adds ``model_class``, the second only rewrites ``model_config`` and ``train``; they commute.
* data/registry.py ``unregister_dataset`` ``_REGISTRY.pop(_key(spec.name))`` -> ``pop(_key(name))``: ``dataset_spec``
  found the spec under ``_key(name)``, and a spec is registered under ``_key`` of its own name: the same key.
* nn/_factory.py ``_cast_part`` ``if device is None and dtype is None: return module`` dropped:
  ``module.to(device=None, dtype=None)`` is a no-op that returns ``module``.
* nn/attention.py ``DiffusionAttention`` ``and not isinstance(heads, (str, bytes, bytearray))`` dropped: a spec string
  is then iterated for instances given, and its characters are no ``DiffusionOperator``: the same empty set.

Found, not changed (documented): a run recorded before ``model_class`` joined the identity, of a user's class, is not
read when the preset builds a library class now (``_with_recorded_class``'s docstring: "their runs are not read"),
so that swap of a legacy run is still the same run; runs recorded since name their user class and are told.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from diffusionformer.models import DiffusionViT

from experiments_tiny_configs import TINY_TRAIN as _TRAIN, TINY_VIT as _TINY_VIT


class _SecondViT(DiffusionViT):
    """A user's ViT registered under a preset name that first built the library's DiffusionViT."""


def _config(model: str, seeds=(0, 1), tasks=None):
    from diffusionformer.experiments import load_experiment_config

    tasks = tasks or [{"name": "t", "dataset": "digits", "model": model, "train": dict(_TRAIN)}]
    return load_experiment_config({"name": "swap", "seeds": list(seeds), "operators": [{"name": "attention"}],
                                   "tasks": tasks})


def test_bug_a_preset_first_registered_with_a_library_class_then_a_users_is_another_run(tmp_path, preset_name):
    """Bug: a preset registered with a library class (``DiffusionViT``: its runs record no ``model_class``), run,
    then registered again with a user's subclass of the same config was the same run: ``run`` skipped the finished
    runs and reported DiffusionViT's results as the user class's, ``status`` said unchanged and ``publish`` published
    them. The runs' checkpoints name DiffusionViT (their model record); ``_with_recorded_class`` read it and threw it
    away (``recorded.startswith("diffusionformer.")``), though the class registered now is a user's, so another."""
    from diffusionformer.experiments import publish_experiment, run_experiment, run_status
    from diffusionformer.models import ViTConfig, register_model, unregister_model

    library, user = DiffusionViT, _SecondViT
    register_model(preset_name, library, ViTConfig, **_TINY_VIT)
    run_experiment(_config(preset_name), tmp_path, progress=False, log=lambda s: None)
    unregister_model(preset_name)
    register_model(preset_name, user, ViTConfig, **_TINY_VIT)
    rows = run_status(_config(preset_name), tmp_path)
    assert [r["state"] for r in rows] == ["completed", "completed"]
    for r in rows:
        assert r["changed"] == f"model_class (diffusionformer.models.vit.DiffusionViT then {user.__module__}." \
                               f"{user.__qualname__})"
    with pytest.raises(ValueError, match=r"register the class they were made with \(diffusionformer\.models\.vit\."
                                         r"DiffusionViT\) as model preset"):
        publish_experiment(_config(preset_name), tmp_path, tmp_path / "docs")
    with pytest.raises(ValueError, match=r"seed0 holds a run .* different model_class \(diffusionformer\.models\.vit"
                                         r"\.DiffusionViT then "):
        run_experiment(_config(preset_name, seeds=(0,)), tmp_path, progress=False, log=lambda s: None)



def test_kills_with_recorded_class_library_runs_not_read_when_the_preset_builds_a_library_class(tmp_path,
                                                                                               preset_name):
    """kills (on the fixed code): experiments/results.py ``_with_recorded_class`` ``or now is None`` dropped (the
    checkpoints of a library class's runs were read when the preset builds a library class: their record's
    ``diffusionformer.models.vit.DiffusionViT`` against the identity's none made every finished run of the library's
    models "changed" (``model_class (diffusionformer.models.vit.DiffusionViT then unset)``), refused on resume)."""
    from diffusionformer.experiments import run_experiment, run_status
    from diffusionformer.models import ViTConfig, register_model

    library = DiffusionViT
    register_model(preset_name, library, ViTConfig, **_TINY_VIT)
    first = run_experiment(_config(preset_name), tmp_path, progress=False, log=lambda s: None)
    assert [r["changed"] for r in run_status(_config(preset_name), tmp_path)] == [None, None]
    again = run_experiment(_config(preset_name), tmp_path, progress=False, log=lambda s: None)
    assert [r.value for r in again] == [r.value for r in first]

# ----------------------------------------------------------------------------- results._runs_of_another_train
_A, _B = "user.ViTA", "user.ViTB"  # two classes of one preset, as a ``changed`` text names them
_CLASS = ("model_class", _A, _B)  # "model_class (user.ViTA then user.ViTB)"
_STEPS = ("train", {"max_steps": 2}, {"max_steps": 3})  # "train (max_steps: 2 then 3)"


def _advice(monkeypatch, rows, verb, tasks=None):
    """``_runs_of_another_train``'s text for finished runs of ``rows`` (``(task, (part, old, new))``: ``_status_rows``'
    rows made by hand, with the records and the ``changed`` text of that one change: what each run differs in is the
    input here, not the runs)."""
    from diffusionformer.experiments import results

    config = _config("vit-digits", tasks=tasks)
    full = [({"task": task, "operator": "attention", "seed": seed, "state": "completed",
              "changed": results._changes_text([results._Change(*change)])}, [results._Change(*change)])
            for seed, (task, change) in enumerate(rows)]
    monkeypatch.setattr(results, "_status_rows", lambda c, root: full)
    return results._runs_of_another_train(config, "unused", **({} if verb is None else {"verb": verb}))


def test_kills_runs_of_another_train_advice_without_verb_is_the_text_alone(monkeypatch):
    """kills: experiments/results.py ``_runs_of_another_train`` ``if verb is None: return text`` dropped (``summary``,
    which passes no verb, warned "...; None with the --set overrides they were run with, or redo them ...")."""
    text = _advice(monkeypatch, [("t", ("train", {"lr": 0.1}, {"lr": 0.2}))], None)
    assert text == ("1 finished run(s) of 'swap' were made with another train or model config than this config's, "
                    "e.g. 't' / 'attention' seed 0 (train (lr: 0.1 then 0.2))")


def test_kills_runs_of_another_train_set_advice_when_any_run_differs_in_more_than_its_class(monkeypatch):
    """kills: experiments/results.py ``_runs_of_another_train`` ``any(_CLASS_CHANGE.sub(...))`` -> ``all(...)`` (one
    run of another class, another of another budget: the --set advice, which fixes the second, was dropped)."""
    text = _advice(monkeypatch, [("t", _CLASS), ("t", _STEPS)],
                   "publish")
    assert text.endswith(f"; publish with the --set overrides they were run with, or register the class they were "
                         f"made with ({_A}) as model preset 'vit-digits' again (no --set value changes a preset's "
                         f"class), or redo them with `run --restart`")


def test_kills_runs_of_another_train_class_advice_found_past_the_first_run(monkeypatch):
    """kills: experiments/results.py ``_runs_of_another_train`` the class change looked for in the first changed run
    only (``changed[:1]``): the first differs in its budget, the second in its class; the class advice was lost and
    only --set advised, which cannot bring the class back."""
    text = _advice(monkeypatch, [("t", _STEPS), ("t", _CLASS)],
                   "analyse")
    assert f"or register the class they were made with ({_A}) as model preset 'vit-digits' again" in text


def test_kills_runs_of_another_train_names_the_preset_of_the_changed_runs_task(monkeypatch):
    """kills: experiments/results.py ``_runs_of_another_train`` the preset taken from ``config.tasks[0]`` rather than
    the task of the run whose class changed (two tasks: the advice named the other task's preset)."""
    tasks = [{"name": "a", "dataset": "digits", "model": "vit-digits", "train": dict(_TRAIN)},
             {"name": "b", "dataset": "mnist", "model": "vit-mnist", "train": dict(_TRAIN)}]
    text = _advice(monkeypatch, [("b", _CLASS)], "publish", tasks=tasks)
    assert f"register the class they were made with ({_A}) as model preset 'vit-mnist' again" in text
    assert "--set overrides" not in text


# ----------------------------------------------------------------------------- experiments/tasks.py adapters
@dataclasses.dataclass
class _CfgA:
    """A user's model family (its config class keys its task adapters)."""

    dim: int = 4


@dataclasses.dataclass
class _CfgB:
    """A second user's model family."""

    dim: int = 4


class _FieldsMeta(type):
    """A metaclass that makes its classes iterable (over their field names), as some config frameworks do."""

    def __iter__(cls):
        return iter(getattr(cls, "__dataclass_fields__", {}))


@dataclasses.dataclass
class _IterableCfg(metaclass=_FieldsMeta):
    """A config class that is itself iterable: one key, not the sequence of its fields."""

    dim: int = 4


@pytest.fixture
def user_adapters():
    """Remove the adapters of the user's families these tests register."""
    from diffusionformer.experiments import tasks as T

    yield T
    for key in [k for k in T._ADAPTERS if k[0] in (_CfgA, _CfgB, _IterableCfg)]:
        T._ADAPTERS.pop(key)


def test_kills_adapter_keys_bytes_named_whole(user_adapters):
    """kills: experiments/tasks.py ``_adapter_keys`` ``bytes`` dropped from the not-a-sequence kinds
    (``register_task_adapter(b"ViTConfig", ...)`` was read as the sequence of its byte values: the error named
    ``(86, ...)``, not the value given)."""
    from diffusionformer.data.base import ClassificationData

    T = user_adapters
    with pytest.raises(TypeError, match=r"keyed by classes \(model config, data container\), got \(b'ViTConfig', "):
        T.register_task_adapter(b"ViTConfig", ClassificationData, T.TaskAdapter())


def test_kills_adapter_keys_an_iterable_class_is_one_key(user_adapters):
    """kills: experiments/tasks.py ``_adapter_keys`` ``type`` dropped from the not-a-sequence kinds (a config class
    whose metaclass makes it iterable was read as the sequence of what it yields: its field names, "keyed by
    classes" refused; one that yields nothing, "names no class")."""
    from diffusionformer.data.base import SequenceTaskData

    T = user_adapters
    adapter = T.register_task_adapter(_IterableCfg, SequenceTaskData, T.TaskAdapter())
    assert T._ADAPTERS[(_IterableCfg, SequenceTaskData)] is adapter
    assert T.unregister_task_adapter(_IterableCfg, SequenceTaskData) == {(_IterableCfg, SequenceTaskData): adapter}


def test_kills_adapter_keys_a_pair_named_twice_is_one_pair(user_adapters):
    """kills: experiments/tasks.py ``_adapter_keys`` ``list(dict.fromkeys(keys))`` -> ``keys`` (``(A, (D, D))`` named
    one pair twice: ``unregister_task_adapter`` popped it twice, a bare ``KeyError`` after removing it, and the clash
    message listed it twice)."""
    from diffusionformer.data.base import SequenceTaskData

    T = user_adapters
    adapter = T.register_task_adapter(_CfgA, (SequenceTaskData, SequenceTaskData), T.TaskAdapter())
    with pytest.raises(ValueError, match=r"^a task adapter for \(_CfgA, SequenceTaskData\) is already registered; .* "
                                         r"call unregister_task_adapter\(_CfgA, SequenceTaskData\) first$"):
        T.register_task_adapter([_CfgA, _CfgA], SequenceTaskData, T.TaskAdapter())
    assert T.unregister_task_adapter(_CfgA, [SequenceTaskData, SequenceTaskData]) == {
        (_CfgA, SequenceTaskData): adapter}


def test_kills_unregister_call_pairs_that_are_no_product_get_one_call_each(user_adapters):
    """kills: experiments/tasks.py ``_unregister_call`` ``len(keys) == len(families) * len(datas)`` -> ``<=`` and
    ``" and ".join`` -> ``", ".join`` (taken pairs ``(A, D1)`` and ``(B, D2)``, not all pairs of {A, B} x {D1, D2}:
    the message named ``unregister_task_adapter((A, B), (D1, D2))``, which refuses the two free pairs; followed as
    written, the calls named free exactly the taken pairs)."""
    from diffusionformer.data.base import NodeData, SequenceTaskData

    T = user_adapters
    T.register_task_adapter(_CfgA, SequenceTaskData, T.TaskAdapter())
    T.register_task_adapter(_CfgB, NodeData, T.TaskAdapter())
    with pytest.raises(ValueError) as err:
        T.register_task_adapter((_CfgA, _CfgB), (SequenceTaskData, NodeData), T.TaskAdapter())
    calls = str(err.value).split("call ")[-1].removesuffix(" first")
    assert calls == ("unregister_task_adapter(_CfgA, SequenceTaskData) and "
                     "unregister_task_adapter(_CfgB, NodeData)")
    names = {"unregister_task_adapter": T.unregister_task_adapter, "_CfgA": _CfgA, "_CfgB": _CfgB,
             "SequenceTaskData": SequenceTaskData, "NodeData": NodeData}
    for call in calls.split(" and "):
        eval(call, names)
    assert not [k for k in T._ADAPTERS if k[0] in (_CfgA, _CfgB)]
    T.register_task_adapter((_CfgA, _CfgB), (SequenceTaskData, NodeData), T.TaskAdapter())


def test_kills_unregister_task_adapter_lists_the_pairs_of_every_missing_family_sorted(user_adapters):
    """kills: experiments/tasks.py ``unregister_task_adapter`` ``any(k[0] is f ...)`` -> ``all(...)``,
    ``' or '.join`` -> ``', '.join`` of the families, and ``sorted`` dropped from the pairs registered (two families
    missing a pair: the pairs they have were not listed, the families read as one list, and the pairs came in
    registration order)."""
    from diffusionformer.data.base import ClassificationData, NodeData, SequenceTaskData

    T = user_adapters
    T.register_task_adapter(_CfgB, SequenceTaskData, T.TaskAdapter())
    T.register_task_adapter(_CfgA, SequenceTaskData, T.TaskAdapter())
    T.register_task_adapter(_CfgA, NodeData, T.TaskAdapter())
    with pytest.raises(KeyError) as err:
        T.unregister_task_adapter((_CfgA, _CfgB), ClassificationData)
    assert err.value.args[0] == (
        "no task adapter is registered for (_CfgA, ClassificationData), (_CfgB, ClassificationData); the pairs "
        "registered for _CfgA or _CfgB: (_CfgA, NodeData), (_CfgA, SequenceTaskData), (_CfgB, SequenceTaskData); "
        "nothing was removed")
    assert len([k for k in T._ADAPTERS if k[0] in (_CfgA, _CfgB)]) == 3


# ----------------------------------------------------------------------------- nn factory arguments
class _Probe(nn.Module):
    """A part that records where a tensor made without a device goes while it is built (the ``torch.device``
    context the docstrings promise callables' modules are built under); no tensors of its own."""

    def __init__(self, *args) -> None:
        super().__init__()
        self.made_on = torch.empty(()).device

    def forward(self, x):
        return x


def test_kills_callables_built_under_the_device_context():
    """kills: nn/_factory.py ``_on_device`` -> always ``nullcontext()``, and ``with _on_device(device)`` -> ``None``
    around block.py ``_make_norm``'s callable, ``Mlp``'s and ``GatedMlp``'s ``act_layer()`` and ``Block``'s
    ``mlp_layer`` (a ``norm_layer``/``mlp_layer``/``act_layer`` module was built on the CPU: a tensor it makes
    without a device, which ``.to`` does not move, was allocated there, not on the device asked for, as the
    docstrings say: "built under ``with torch.device(device)``")."""
    from diffusionformer.nn import Block, GatedMlp, Mlp

    blk = Block(16, 4, norm_layer=_Probe, mlp_layer=_Probe, device="meta")
    assert blk.norm1.made_on.type == "meta" and blk.norm2.made_on.type == "meta" and blk.mlp.made_on.type == "meta"
    assert Mlp(8, act_layer=_Probe, device="meta").act.made_on.type == "meta"
    assert GatedMlp(8, act_layer=_Probe, device="meta").act.made_on.type == "meta"
    assert Mlp(8, act_layer=_Probe).act.made_on.type == "cpu"  # no device: no context


def test_kills_gated_mlp_activation_cast_to_dtype():
    """kills: nn/block.py ``GatedMlp`` ``_cast_part(act_layer(), ...)`` -> ``act_layer()`` (a gate activation with a
    parameter, ``nn.PReLU``, stayed float32 in a float64 layer: its forward failed on the dtype mix)."""
    from diffusionformer.nn import GatedMlp

    m = GatedMlp(8, act_layer=nn.PReLU, dtype=torch.float64)
    assert {n: p.dtype for n, p in m.named_parameters()} == {n: torch.float64 for n, _ in m.named_parameters()}
    torch.manual_seed(0)
    layer32 = GatedMlp(8, act_layer=nn.PReLU)
    with torch.no_grad():
        layer32.act.weight.fill_(0.3)  # another slope than the init's: the loaded value is the one used
    m.load_state_dict(layer32.state_dict())
    ref = layer32.double()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(m(x), ref(x), rtol=0, atol=0)


def test_kills_cast_part_compares_with_the_default_dtype_not_float32():
    """kills: nn/_factory.py ``_cast_part`` ``dtype == torch.get_default_dtype()`` -> ``dtype == torch.float32``
    (with float64 the default dtype, ``dtype=torch.float32`` left the head operators' learned ``t`` in float64
    beside float32 projections, as ``nn.Linear(..., dtype=torch.float32)`` is not)."""
    from diffusionformer.nn import DiffusionAttention

    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        attn = DiffusionAttention(16, 4, "heat(t=0.5, learnable=True):2,attention:2", dtype=torch.float32)
        assert nn.Linear(2, 2, dtype=torch.float32).weight.dtype == torch.float32
        assert {n: p.dtype for n, p in attn.named_parameters()} == {n: torch.float32
                                                                    for n, _ in attn.named_parameters()}
    finally:
        torch.set_default_dtype(before)


class _ScaledRotary(nn.Module):
    """A user's rotary embedding with a buffer (``DiffusionAttention`` takes any module with ``head_dim``)."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.register_buffer("scale", torch.ones(head_dim))

    def forward(self, x, positions=None):
        return x * self.scale.to(x.dtype)


def test_kills_given_rotary_moved_and_cast():
    """kills: nn/attention.py ``DiffusionAttention`` ``_cast_part(rotary, ...)`` dropped, and its ``given=True`` ->
    ``False`` (a rotary module given with a buffer stayed on the CPU of a meta layer, and a float64 one stayed
    float64 in a layer asked for float32, the default: ``device``/``dtype``'s docstring says given instances are moved
    and cast as ``layer.to(device, dtype)`` would)."""
    from diffusionformer.nn import DiffusionAttention

    rope = _ScaledRotary(4)
    DiffusionAttention(16, 4, rotary=rope, device="meta")
    assert rope.scale.is_meta
    rope = _ScaledRotary(4).double()
    DiffusionAttention(16, 4, rotary=rope, dtype=torch.float32)
    assert rope.scale.dtype == torch.float32


def test_kills_a_single_given_operator_instance_is_cast():
    """kills: nn/attention.py ``DiffusionAttention`` ``entries = (heads,) if isinstance(heads, DiffusionOperator)``
    -> ``()`` (one operator instance given as ``heads``, in float64, was not cast in a layer asked for float32, the
    default, unlike the same instance given in a list)."""
    from diffusionformer.nn import DiffusionAttention
    from diffusionformer.operators import build_operator

    op = build_operator("heat(t=0.5, learnable=True)", num_heads=4).double()
    attn = DiffusionAttention(16, 4, op, dtype=torch.float32)
    assert op.t.dtype == torch.float32 and attn.operators[0] is op


def test_kills_from_multihead_attention_dtype_alone_names_to():
    """kills: nn/attention.py ``_check_copied_kwargs`` ``"device" in taken or "dtype" in taken`` -> ``and`` (``dtype=``
    alone: the message lost "call .to() on the result", the way to get the dtype asked for)."""
    from diffusionformer.nn import DiffusionAttention

    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    for kwargs in ({"dtype": torch.float64}, {"device": "cpu"}):
        with pytest.raises(TypeError, match=r"copied from the nn\.MultiheadAttention .*call \.to\(\) on the result"):
            DiffusionAttention.from_multihead_attention(mha, **kwargs)


@pytest.mark.parametrize("name", ["DiffusionAttention", "Block", "Mlp", "GatedMlp", "LayerScale", "RotaryEmbedding",
                                  "RotaryEmbedding2D"])
def test_kills_factory_errors_name_the_layer(name):
    """kills: nn/block.py ``Block`` ``_check_factory(..., "Block")`` -> ``"Mlp"`` (a bad ``dtype``/``device`` is refused
    naming the layer it was given to, ``_check_factory``'s ``where``; a Block's error named an Mlp)."""
    import diffusionformer.nn as N

    cls = getattr(N, name)
    args = {"DiffusionAttention": (16, 4), "Block": (16, 4), "RotaryEmbedding2D": (8,)}.get(name, (8,))
    with pytest.raises(TypeError, match=rf"^{name}: dtype must be a torch\.dtype"):
        cls(*args, dtype="float32")
    with pytest.raises(TypeError, match=rf"^{name}: device="):
        cls(*args, device=2.5)


def test_kills_head_operators_built_under_the_device_context():
    """kills: nn/attention.py ``DiffusionAttention`` ``with _on_device(device)`` -> ``_on_device(None)`` around the
    operators' construction (built on the CPU, then moved: a tensor an operator makes without a device, which ``.to``
    does not move, was allocated on the CPU, not under ``with torch.device(device)`` as ``device``'s docstring
    says)."""
    from diffusionformer.nn import DiffusionAttention
    from diffusionformer.operators import LaplacianOperator, register_operator, unregister_operator

    class _ProbeOperator(LaplacianOperator):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.made_on = torch.empty(()).device

    register_operator(_ProbeOperator, name="probe50m-where", aliases=())
    try:
        attn = DiffusionAttention(16, 4, "probe50m-where:2,attention:2", device="meta")
        assert attn.operators[0].made_on.type == "meta"
        assert DiffusionAttention(16, 4, "probe50m-where:4").operators[0].made_on.type == "cpu"
    finally:
        unregister_operator("probe50m-where")
