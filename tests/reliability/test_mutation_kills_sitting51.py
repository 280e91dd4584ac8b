"""Mutation audit of sitting 51's new code: the change records of experiments/results.py (``_Change``,
``_identity_diff``, ``_runs_of_another_train``'s advice, ``_set_of`` / ``_toml_value``), the operator binding of
nn/attention.py when a layer's modules or state are listed, and publish's ``imports`` check. Each ``Pin:`` test kills a
mutant the earlier tests let live; each ``Bug:`` test failed before its fix."""

from __future__ import annotations

import math
import shlex
import tomllib

import pytest
import torch
from torch import nn

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import _Change, _set_of, _toml_value
from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import build_operator

from experiments_tiny_configs import TINY_TRAIN as _TRAIN, TINY_VIT as _TINY_VIT


def _config(name="t", overrides=None, **task):
    model = {k: v for k, v in _TINY_VIT.items() if k != "input_size"}
    return load_experiment_config({"name": "m51", "seeds": [0], "operators": [{"name": "attention"}],
                                   "tasks": [{"name": name, "dataset": "digits", "model": "vit-digits",
                                              "model_overrides": model, "train": dict(_TRAIN), **task}]}, overrides)


def _given(set_text: str) -> str:
    """The override a ``--set ...`` advice passes, as the shell splits it."""
    words = shlex.split(set_text)
    assert len(words) == 2 and words[0] == "--set"
    return words[1]


# ----------------------------------------------------------------------------- results: the change records
def test_pin_change_text_names_the_differing_keys_sorted_and_unset_on_either_side():
    """Pin: a dict part's text lists only the entries that differ, in key order whatever the dicts' order, an entry
    missing on either side as ``'unset'``; ``keys()`` is empty unless both sides are dicts."""
    change = _Change("train", {"lr": 0.1, "b": 1, "a": 1, "same": 0}, {"same": 0, "b": 2, "a": 3, "new": 5})
    assert change.keys() == ["a", "b", "lr", "new"]
    assert change.text() == "train (a: 1 then 3, b: 1 then 2, lr: 0.1 then 'unset', new: 'unset' then 5)"
    assert _Change("train", {"a": 1}, None).keys() == [] and _Change("train", None, {"a": 1}).keys() == []
    assert _Change("train", {"a": 1}, None).text() == "train"


def test_pin_change_text_of_a_class_or_dtype_recorded_on_one_side():
    """Pin: a model class recorded on one side only reads ``unset`` on the other; a dtype recorded on one side only
    (float32 is not recorded) reads ``float32`` there."""
    assert _Change("model_class", "a.A", None).text() == "model_class (a.A then unset)"
    assert _Change("model_class", None, "b.B").text() == "model_class (unset then b.B)"
    tail = ": torch.get_default_dtype() when the models were built)"
    assert _Change("dtype", "float64", None).text() == "dtype (float64 then float32" + tail
    assert _Change("dtype", None, "float16").text() == "dtype (float32 then float16" + tail
    assert _Change("data_seed", 1, 0).text() == "data_seed"


# ----------------------------------------------------------------------------- results: --set values as TOML
_VALUES = ['a"b', "back\\slash", "üñí€😀", "ctl\x01\x1f\t\n", "", 1e-5, 1e300, 5e-324, -0.0, 0.1, float("inf"),
           float("-inf"), True, False, 0, -3, 2**64 - 1, [1, [2.5, "x"], {"a": True}], [],
           {"a b": {"c": [1, 2]}, "ü": 1, "": 2, "x.y": 3, '"q"': 4, "plain_key-1": "v"}, {}]


@pytest.mark.parametrize("value", _VALUES, ids=repr)
def test_pin_toml_value_reads_back_as_the_value(value):
    """Pin: ``_toml_value`` writes valid TOML that ``tomllib`` reads back to the same value and type (strings with
    quotes, backslashes, unicode and control characters; floats at the edges, signed zero, infinities; bools before
    ints; nested lists and tables with keys TOML must quote)."""
    text = _toml_value(value)
    back = tomllib.loads(f"v = {text}")["v"]
    assert back == value and type(back) is type(value)
    if isinstance(value, float) and value == 0:
        assert math.copysign(1, back) == math.copysign(1, value)
    if isinstance(value, bool):
        assert text == ("true" if value else "false")


def test_pin_toml_value_nan_and_what_toml_cannot_hold():
    """Pin: NaN is TOML's ``nan``; None, and a list or table holding one, has no TOML value."""
    assert _toml_value(float("nan")) == "nan" and math.isnan(tomllib.loads("v = nan")["v"])
    assert _toml_value(None) is None and _toml_value([1, None]) is None and _toml_value({"a": None}) is None
    assert _toml_value(object()) is None


@pytest.mark.parametrize("value", ["del\x7f", {"k\x7f": "v"}, ["\x7f"]], ids=repr)
def test_bug_toml_value_escapes_del(value):
    """Bug: a string holding DEL (U+007F) was written raw (JSON leaves it unescaped), which TOML forbids in a basic
    string: the advised ``--set`` was refused as invalid TOML, or (a bare word) read as a plain string. It is now
    written ``\\u007f`` and reads back to the value."""
    assert tomllib.loads(f"v = {_toml_value(value)}")["v"] == value


@pytest.mark.parametrize("value", ["x\ud800", {"\udc00": 1}, ["\ud800"]], ids=repr)
def test_bug_toml_value_has_none_for_a_lone_surrogate(value):
    """Bug: a lone surrogate (a JSON ``"\\ud800"`` in a stored run's identity) was written as it is: no TOML file or
    UTF-8 command line can hold it (TOML's ``\\u`` escapes exclude surrogates too), so the advised ``--set`` could not
    be given. Now there is no TOML value (no ``--set`` advised for it), as for null."""
    assert _toml_value(value) is None


@pytest.mark.parametrize("part, old", [
    ("data_seed", 3), ("data_seed", 2**64 - 1), ("label_smoothing", 0.1), ("label_smoothing", None),
    ("augment", None), ("minibatch", None), ("augment", {"flip": True}), ("model", "vit-digits"),
    ("dataset_options", {"val_fraction": 0.25}),
])
def test_pin_set_of_gives_the_stored_value_back(part, old):
    """Pin: the ``--set`` of a task entry, passed to ``load_experiment_config``, gives the entry the stored run's
    value (or, where the run recorded none, the task default ``_task_identity`` leaves out: ``label_smoothing``
    0.0, ``augment`` and ``minibatch`` {})."""
    given = _given(_set_of("t", _Change(part, old, "other")))
    want = old if old is not None else {"label_smoothing": 0.0, "augment": {}, "minibatch": {}}[part]
    got = getattr(_config(overrides=[given]).tasks[0], part)
    assert got == want and type(got) is type(want)


def test_pin_set_of_has_none_for_fold_and_a_null():
    """Pin: no ``--set`` gives ``fold`` (it follows ``folds`` and the seed) or a value recorded as null."""
    assert _set_of("t", _Change("fold", 1, 0)) is None
    assert _set_of("t", _Change("folds", None, 3)) is None


@pytest.mark.parametrize("name, key", [("t", "t"), ("csbm-h0.1", '"csbm-h0.1"'), ("a'b", '"a\'b"'), ("x=y", '"x=y"'),
                                       ("ü", '"ü"')])
def test_pin_set_of_quotes_a_task_name_where_toml_must(name, key):
    """Pin: the task's name is a bare key where TOML allows one, else a quoted one, and the ``--set`` gives the value
    back for each."""
    given = _given(_set_of(name, _Change("data_seed", 3, 0)))
    assert given == f"tasks.{key}.data_seed=3"
    assert _config(name, overrides=[given]).tasks[0].data_seed == 3


def test_bug_set_of_a_task_name_holding_a_double_quote():
    """Bug: the advised ``--set`` of a task named ``q"t`` (a name ``load_experiment_config`` accepts) was
    ``tasks."q\\"t".data_seed=3``, valid TOML that the override parser refused ("a quote in its key is not closed":
    it ended the quoted key at the escaped quote). The parser now skips escaped characters in a basic-string key, and
    the advice gives the value back."""
    given = _given(_set_of('q"t', _Change("data_seed", 3, 0)))
    assert given == 'tasks."q\\"t".data_seed=3'
    assert _config('q"t', overrides=[given]).tasks[0].data_seed == 3


# ----------------------------------------------------------------------------- nn: binding when listed
def _swapped_layer():
    torch.manual_seed(0)
    ref = DiffusionAttention(16, 4, "differential:2,laplacian:2").double()
    layer = DiffusionAttention(16, 4, "attention:2,laplacian:2").double()
    layer.load_state_dict({k: v for k, v in ref.state_dict().items() if not k.startswith("operators.")}, strict=False)
    layer.operators[0] = build_operator("differential", num_heads=2).double()
    return ref, layer


def test_pin_state_dict_first_binds_the_replaced_operator():
    """Pin: ``state_dict()`` as the first listing after the replacement (no ``parameters()`` before it) holds the
    operator's bound parameters."""
    ref, layer = _swapped_layer()
    assert list(layer.state_dict()) == list(ref.state_dict())


def test_pin_load_state_dict_first_binds_the_replaced_operator():
    """Pin: ``load_state_dict`` as the first listing after the replacement loads the operator's parameters (it
    raised "Unexpected key(s)" before they were made)."""
    ref, layer = _swapped_layer()
    assert layer.load_state_dict(ref.state_dict()).missing_keys == []
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    assert torch.equal(layer(x), ref(x))


def test_pin_named_modules_keeps_remove_duplicate_false():
    """Pin: the layer's ``named_modules`` passes ``remove_duplicate=False`` on: a module held under two names is
    listed twice, as ``nn.Module.named_modules`` lists it."""
    layer = DiffusionAttention(16, 2, "attention")
    layer.k_norm = layer.q_norm
    names = [n for n, _ in layer.named_modules(remove_duplicate=False)]
    assert names == [n for n, _ in nn.Module.named_modules(layer, remove_duplicate=False)]
    assert len(names) > len(list(layer.named_modules()))


def test_pin_a_plan_made_when_listed_runs_once():
    """Pin: binding a replaced operator in a layer with a parameter-free ``qkv`` reads the device from the layer's own
    tensors while planning: that listing does not plan again (each nested listing planned anew until the recursion
    limit, whose error the listing swallowed)."""
    class _Triple(nn.Module):
        def forward(self, x):
            return torch.cat([x, x, x], dim=-1)

    layer = DiffusionAttention(16, 2, "attention")
    layer.qkv = _Triple()
    layer.operators[0] = build_operator("differential")
    calls = []
    make = layer._make_plan
    layer._make_plan = lambda: (calls.append(1), make())[1]
    assert len([n for n, _ in layer.named_parameters() if n.startswith("operators.0.")]) == 5
    assert len(calls) == 1


def test_pin_a_failed_bind_leaves_the_next_listing_free_to_bind():
    """Pin: a listing whose bind fails (no tensor in the layer to read the device from: a parameter-free ``qkv`` and
    ``out_proj``, an operator with none before its bind) leaves the layer able to bind at the next listing, once a
    ``qkv`` with a weight is back."""
    class _Triple(nn.Module):
        def forward(self, x):
            return torch.cat([x, x, x], dim=-1)

    layer = DiffusionAttention(16, 2, "attention")
    layer.qkv, layer.out_proj = _Triple(), nn.Identity()
    layer.operators[0] = build_operator("differential")
    assert list(layer.named_parameters()) == []
    layer.qkv = nn.Linear(16, 48)
    assert [n for n, _ in layer.named_parameters() if n.startswith("operators.0.")] == [
        "operators.0.lambda_q1", "operators.0.lambda_k1", "operators.0.lambda_q2", "operators.0.lambda_k2",
        "operators.0.subln.weight"]


def test_pin_listing_a_layer_without_operators_does_not_raise():
    """Pin: a layer whose ``operators`` were deleted is listed (``parameters()``, ``state_dict()``) without a
    KeyError."""
    layer = DiffusionAttention(16, 2, "attention")
    del layer.operators
    assert len(list(layer.parameters())) == 4 and len(layer.state_dict()) == 4


# ----------------------------------------------------------------------------- publish: the imports
@pytest.mark.parametrize("flag", ["overrides", "imports"])
def test_pin_publish_names_the_option_given_a_str(tmp_path, flag):
    """Pin: the refusal of a str names the option it was given for, and the value."""
    from diffusionformer.experiments import publish_experiment

    with pytest.raises(TypeError) as err:
        publish_experiment(_config(), tmp_path / "res", tmp_path / "docs", **{flag: "seeds=[0]"})
    assert str(err.value) == f"publish_experiment: {flag} must be a list of str, got 'seeds=[0]'"


@pytest.mark.filterwarnings("ignore:.*index.md not found:RuntimeWarning")
def test_pin_the_page_command_quotes_each_import(tmp_path):
    """Pin: each ``--import`` of the page's command is shell-quoted (a path with a space is one word), in the order
    given, before the ``--set`` overrides."""
    from diffusionformer.experiments import publish_experiment, run_experiment

    config = _config()
    run_experiment(config, tmp_path / "res", progress=False, log=lambda s: None)
    page = publish_experiment(config, tmp_path / "res", tmp_path / "docs", config_path="c.toml",
                              imports=["my regs.py", "b"], overrides=[]).read_text()
    assert "- **Command:** `python -m diffusionformer.experiments run c.toml --import 'my regs.py' --import b` " \
           "(add `--data-root <root>` for standard benchmarks), then `publish` with the same config and `--import` " \
           "modules\n" in page


# ----------------------------------------------------------------------------- results: the advice from the records
def _advise(monkeypatch, *rows, verb="publish", config=None):
    """``_runs_of_another_train``'s text for status rows given as (changes, state, task, seed)."""
    from diffusionformer.experiments import results

    made = [({"task": task, "operator": "attention", "seed": seed, "state": state,
              "changed": results._changes_text(changes) or None}, changes) for changes, state, task, seed in rows]
    monkeypatch.setattr(results, "_status_rows", lambda config, out_root: made)
    return results._runs_of_another_train(config or _config(), "unused", verb=verb)


def test_pin_only_finished_runs_are_advised_about(monkeypatch):
    """Pin: a changed run that is not finished (interrupted, failed, running) is ``run``'s to refuse: no advice."""
    changes = [_Change("data_seed", 1, 0)]
    assert _advise(monkeypatch, *[(changes, s, "t", 0) for s in ("interrupted", "failed", "running")]) is None
    assert _advise(monkeypatch, ([], "completed", "t", 0)) is None


def test_pin_every_kind_is_named_in_order_with_its_remedy(monkeypatch):
    """Pin: runs differing in every part name each kind once, in the order config, data, preset, task, class, dtype,
    the data and task keys sorted, joined by ", " and a last " and "; the remedies are the ``--set`` of each task
    entry (each once, in the order met, the preset's ``model`` among them), the dtype the runs were made at, and the
    class to register as the preset of the task whose run it was."""
    config = load_experiment_config({"name": "m51", "seeds": [0, 1], "operators": [{"name": "attention"}],
                                     "tasks": [{"name": n, "dataset": "digits", "model": m, "train": dict(_TRAIN)}
                                               for n, m in (("t", "vit-digits"), ("u", "vit-tiny"))]})
    first = [_Change("train", {"lr": 0.1}, {"lr": 0.2}), _Change("label_smoothing", 0.1, None),
             _Change("dataset_options", {"n": 1}, {}), _Change("augment", None, {"flip": True})]
    second = [_Change("data_seed", 1, 0), _Change("model", "vit-digits", "vit-tiny"),
              _Change("model_class", "a.A", "b.B"), _Change("dtype", "float64", None)]
    text = _advise(monkeypatch, (first, "completed", "t", 0), (first, "completed", "t", 1),
                   (second, "completed", "u", 0), config=config)
    assert ("3 finished run(s) of 'm51' were made with another train or model config, other data (data_seed, "
            "dataset_options), another model preset, other task settings (augment, label_smoothing), another model "
            "class and another default dtype than this config's, e.g. 't' / 'attention' seed 0 (train (lr: 0.1 then "
            "0.2), label_smoothing, dataset_options (n: 1 then 'unset'), augment)") in text
    assert text.endswith(
        "; publish with the --set overrides they were run with (--set tasks.t.label_smoothing=0.1, --set "
        "'tasks.t.dataset_options={n = 1}', --set 'tasks.t.augment={}', --set tasks.u.data_seed=1, --set "
        "'tasks.u.model=\"vit-digits\"'), or publish after torch.set_default_dtype(torch.float64), the default they "
        "were made at, or register the class they were made with (a.A) as model preset 'vit-tiny' again (no --set "
        "value changes a preset's class), or redo them with `run --restart`")


@pytest.mark.parametrize("changes, what, remedies", [
    ([_Change("model_config", {"a": 1}, {"a": 2})], "another train or model config",
     "analyse with the --set overrides they were run with, or "),
    ([_Change("dataset", "x", "y"), _Change("folds", 3, None)], "other data (dataset, folds)",
     "analyse with the --set overrides they were run with (--set 'tasks.t.dataset=\"x\"', --set "
     "tasks.t.folds=3), or "),
    ([_Change("model", "p", "q")], "another model preset",
     "analyse with the --set overrides they were run with (--set 'tasks.t.model=\"p\"'), or "),
    ([_Change("minibatch", {"a": 1}, None)], "other task settings (minibatch)",
     "analyse with the --set overrides they were run with (--set 'tasks.t.minibatch={a = 1}'), or "),
    ([_Change("model_class", "a.A", None)], "another model class",
     "register the class they were made with (a.A) as model preset 'vit-digits' again (no --set value changes a "
     "preset's class), or "),
    ([_Change("dtype", None, "float64")], "another default dtype",
     "analyse after torch.set_default_dtype(torch.float32), the default they were made at, or "),
])
def test_pin_one_kind_alone(monkeypatch, changes, what, remedies):
    """Pin: each kind alone is named by its own words and gets its own remedy only (a class or a dtype no ``--set``)."""
    text = _advise(monkeypatch, (changes, "completed", "t", 0), verb="analyse")
    assert f"were made with {what} than this config's" in text
    assert text.split("; ", 1)[1] == remedies + "redo them with `run --restart`"
    assert _advise(monkeypatch, (changes, "completed", "t", 0), verb=None) == text.split("; ", 1)[0]
