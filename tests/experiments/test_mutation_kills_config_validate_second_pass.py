"""Tests written in a second mutation-testing audit of the strict configs and of checking a comparison
before it trains: :mod:`diffusionformer.config` (``config_from_dict``: unknown keys and their "did
you mean", nested tables and lists of tables, the type rules that refuse a bool for an int, a float
for an int, a string for a number), ``experiments/config.py`` (``TaskConfig``, ``OperatorSetting``,
``ExperimentConfig``, ``parse_override`` and ``apply_overrides`` with dotted paths, TOML files that
do not parse, the defaults a fresh config gets), ``experiments/validate.py`` (every problem found
before anything trains), ``experiments/build.py`` (the data and model of one run),
``experiments/reload.py`` (``load_run``) and ``experiments/outputs.py`` (the manifest, the commit
list and the rows kept from an earlier ``results.json``).

It does not repeat the first audit (``test_mutation_kills_config_cli.py``). Each test kills a mutant
of the library code that the rest of the suite let through (its docstring names it: file and
mutation) and checks the code against an independent reference: error messages, key paths and
defaults written out by hand, TOML files and run folders written by hand, and a git repository made
in ``tmp_path``. Mutants judged equivalent are listed, with the reason, at the end of the file. A
test whose docstring starts with "Bug:" pins a defect fixed in this audit. CPU only, deterministic,
no network; files only under ``tmp_path``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal

import pytest

from diffusionformer.config import ConfigErrors, config_from_dict
from diffusionformer.experiments import load_experiment_config, parse_override
from diffusionformer.experiments.config import (ExperimentConfig, OperatorSetting, TaskConfig, apply_overrides,
                                                train_config)


def _raw(**extra):
    """A small valid comparison as a plain dict (what a TOML file parses to): one task, two settings."""
    cfg = {
        "name": "second",
        "seeds": [0],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 2, "batch_size": 8}}],
        "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}],
    }
    cfg.update(extra)
    return cfg


def _with_task(**fields):
    raw = _raw()
    raw["tasks"][0].update(fields)
    return raw


@dataclass
class _Inner:
    k: int = 1
    nm: str = "a"


@dataclass
class _Outer:
    zeta: int = 0
    alpha: float = 0.5
    flag: bool = False
    inner: _Inner = field(default_factory=_Inner)
    inners: list[_Inner] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    names: tuple[str, ...] = ()
    table: dict = field(default_factory=dict)
    mode: str | None = None
    kind: str = "x"
    level: Literal["low", "high"] = "low"
    num: int | float = 0
    derived: int = field(default=0, init=False)


# ---------------------------------------------------------------------------- diffusionformer/config.py
def test_unknown_keys_list_the_valid_keys_sorted_with_the_closest_as_a_hint():
    """kills: config.py config_from_dict ``valid keys: {sorted(fields)}`` -> ``{list(fields)}`` (the valid keys in
    declaration order, not sorted); also ``cutoff`` of the hint (a one-letter slip must still be suggested)"""
    with pytest.raises(ValueError) as info:
        config_from_dict(_Outer, {"alhpa": 1.0})
    assert str(info.value) == ("_Outer: unknown key 'alhpa'; valid keys: ['alpha', 'flag', 'inner', 'inners', 'kind', "
                               "'level', 'mode', 'names', 'num', 'sizes', 'table', 'zeta'] (did you mean 'alpha'?)")


@pytest.mark.parametrize("value, text", [(True, "bool True"), (False, "bool False"), (2.0, "float 2.0"), ("3", "str '3'")])
def test_an_int_field_refuses_a_bool_a_float_and_a_string(value, text):
    """kills: config.py check_value for ``int`` dropping ``isinstance(value, bool) or`` (TOML ``true`` read as 1), and
    ``isinstance(value, int)`` -> ``isinstance(value, (int, float))`` (``2.0`` taken for an int)"""
    with pytest.raises(TypeError) as info:
        config_from_dict(_Outer, {"zeta": value})
    assert str(info.value) == f"_Outer.zeta: expected an int, got {text}"
    assert config_from_dict(_Outer, {"zeta": 3}).zeta == 3


@pytest.mark.parametrize("value, text", [(1, "int 1"), (0, "int 0"), ("true", "str 'true'")])
def test_a_bool_field_refuses_an_int_and_a_string(value, text):
    """kills: config.py check_value for ``bool``: ``isinstance(value, bool)`` -> ``isinstance(value, (bool, int))``
    (``flag = 1`` taken for a bool)"""
    with pytest.raises(TypeError) as info:
        config_from_dict(_Outer, {"flag": value})
    assert str(info.value) == f"_Outer.flag: expected a bool, got {text}"


@pytest.mark.parametrize("value, text", [(3, "int 3"), (["a"], "list ['a']"), (True, "bool True")])
def test_a_string_field_refuses_other_types(value, text):
    """kills: config.py check_value for ``str`` with its check dropped"""
    with pytest.raises(TypeError) as info:
        config_from_dict(_Outer, {"kind": value})
    assert str(info.value) == f"_Outer.kind: expected a string, got {text}"


def test_an_optional_field_takes_none_or_its_type_and_names_both_when_refused():
    """kills: config.py check_value for ``None`` with its check dropped (``mode = 3`` for ``str | None``
    taken), and the arms tried in reverse order"""
    assert config_from_dict(_Outer, {"mode": None}).mode is None
    assert config_from_dict(_Outer, {"mode": "fast"}).mode == "fast"
    with pytest.raises(TypeError) as info:
        config_from_dict(_Outer, {"mode": 3})
    assert str(info.value) == "_Outer.mode: expected str | None, got int 3"


def test_a_literal_field_takes_only_its_values():
    """kills: config.py check_value for ``Literal`` with its membership check dropped"""
    assert config_from_dict(_Outer, {"level": "high"}).level == "high"
    with pytest.raises(ValueError) as info:
        config_from_dict(_Outer, {"level": "medium"})
    assert str(info.value) == "_Outer.level: expected one of ['low', 'high'], got 'medium'"


def test_a_union_tries_its_arms_in_order():
    """kills: config.py check_value trying a union's arms in reverse order (``int | float`` turning ``2`` into
    ``2.0``: the int arm, named first, must take an int)"""
    got = config_from_dict(_Outer, {"num": 2}).num
    assert got == 2 and type(got) is int
    got = config_from_dict(_Outer, {"num": 2.5}).num
    assert got == 2.5 and type(got) is float


def test_a_list_field_refuses_a_string_and_checks_every_item_with_its_index():
    """kills: config.py check_value for lists: the ``isinstance(value, (list, tuple))`` check dropped (``"abc"`` read
    as ``['a', 'b', 'c']``), ``arg = args[0] if args else Any`` -> ``Any`` (items unchecked), the item problems not
    raised, and the index dropped from the item's key path"""
    with pytest.raises(TypeError) as info:
        config_from_dict(_Outer, {"names": "abc"})
    assert str(info.value) == "_Outer.names: expected a list, got str 'abc'"
    with pytest.raises(TypeError) as info:
        config_from_dict(_Outer, {"sizes": [1, "2", 3]})
    assert str(info.value) == "_Outer.sizes[1]: expected an int, got str '2'"
    with pytest.raises(ConfigErrors) as info:
        config_from_dict(_Outer, {"sizes": [1.5, 2, True]})
    assert info.value.problems == ["_Outer.sizes[0]: expected an int, got float 1.5",
                                   "_Outer.sizes[2]: expected an int, got bool True"]


def test_a_variable_length_tuple_takes_any_number_of_items_as_a_tuple():
    """kills: config.py ``origin is tuple and args and args[-1] is not Ellipsis`` losing the Ellipsis test
    (``tuple[str, ...]`` read as a one-item tuple), and ``tuple(items) if origin is tuple else items`` -> ``items``"""
    assert config_from_dict(_Outer, {"names": ["a", "b", "c"]}).names == ("a", "b", "c")
    assert config_from_dict(_Outer, {"names": []}).names == ()
    with pytest.raises(TypeError, match=r"^_Outer.names\[2\]: expected a string, got int 3$"):
        config_from_dict(_Outer, {"names": ["a", "b", 3]})


def test_an_untyped_table_field_refuses_a_list_and_is_a_copy():
    """kills: config.py check_value for ``dict`` with the Mapping check dropped, and ``return dict(value)`` ->
    ``return value`` (the config shares the caller's dict: a later change to the caller's data changes the config)"""
    with pytest.raises(TypeError) as info:
        config_from_dict(_Outer, {"table": [1, 2]})
    assert str(info.value) == "_Outer.table: expected a table/dict, got list"
    source = {"a": 1}
    cfg = config_from_dict(_Outer, {"table": source})
    source["b"] = 2
    assert cfg.table == {"a": 1}


def test_a_nested_table_is_checked_with_its_full_key_path():
    """kills: config.py ``where = where or cls.__name__`` -> ``cls.__name__`` (a nested problem named ``_Inner``
    instead of ``_Outer.inner``), the ``not isinstance(value, Mapping)`` check of a nested dataclass dropped, and the
    index dropped from a list of tables' key path"""
    with pytest.raises(ValueError) as info:
        config_from_dict(_Outer, {"inner": {"kk": 1}})
    assert str(info.value) == "_Outer.inner: unknown key 'kk'; valid keys: ['k', 'nm'] (did you mean 'k'?)"
    with pytest.raises(TypeError) as info:
        config_from_dict(_Outer, {"inner": [1]})
    assert str(info.value) == "_Outer.inner: expected a table for _Inner, got list"
    with pytest.raises(ConfigErrors) as info:
        config_from_dict(_Outer, {"inners": [{"k": 1.5}, {"nm": 3}], "zeta": "x"})
    assert info.value.problems == ["_Outer.inners[0].k: expected an int, got float 1.5",
                                   "_Outer.inners[1].nm: expected a string, got int 3",
                                   "_Outer.zeta: expected an int, got str 'x'"]
    assert str(info.value).startswith("_Outer: 3 problems:\n  - _Outer.inners[0].k")


def test_a_nested_dataclass_instance_is_kept_as_it_is():
    """kills: config.py check_value dropping ``if isinstance(value, tp): return value`` (an already-built nested
    config is refused as not a table)"""
    inner = _Inner(k=5)
    assert config_from_dict(_Outer, {"inner": inner}).inner is inner


def test_a_field_outside_init_is_an_unknown_key():
    """kills: config.py ``fields = {... if f.init}`` losing ``if f.init`` (a key for an ``init=False`` field passes the
    key check and the dataclass then fails with its own ``__init__`` TypeError)"""
    with pytest.raises(ValueError, match=r"^_Outer: unknown key 'derived'; valid keys: \['alpha', .*'zeta'\]"):
        config_from_dict(_Outer, {"derived": 1})


def test_a_required_key_with_a_bad_value_is_not_also_called_missing():
    """kills: config.py ``if name not in data and ...`` -> ``if name not in kwargs`` (a required key present with a
    mistyped value reported twice: mistyped and missing)"""
    with pytest.raises(TypeError) as info:
        load_experiment_config({**_raw(), "name": 3})
    assert type(info.value) is TypeError  # one problem: its own error, not ConfigErrors
    assert str(info.value) == "config.name: expected a string, got int 3"


def test_data_that_is_not_a_table_is_refused_naming_the_class():
    """kills: config.py config_from_dict with its ``isinstance(data, Mapping)`` check dropped"""
    with pytest.raises(TypeError) as info:
        config_from_dict(_Outer, [("zeta", 1)])
    assert str(info.value) == "_Outer: expected a table/dict, got list"


def test_typed_table_values_are_named_by_their_key():
    """kills: config.py ``f"{where}[{k!r}]"`` -> ``f"{where}"`` (a bad value of a typed table not named by its key)"""
    @dataclass
    class _W:
        w: dict[str, float] = field(default_factory=dict)

    with pytest.raises(TypeError) as info:
        config_from_dict(_W, {"w": {"a": 1.0, "b": "x"}})
    assert str(info.value) == "_W.w['b']: expected a float, got str 'x'"


def test_a_fixed_tuple_item_is_named_by_its_index():
    """kills: config.py fixed-length tuple items checked with ``f"{where}"`` instead of ``f"{where}[{i}]"``"""
    @dataclass
    class _P:
        pair: tuple[int, str] = (1, "a")

    with pytest.raises(TypeError) as info:
        config_from_dict(_P, {"pair": [1, 2]})
    assert str(info.value) == "_P.pair[1]: expected a string, got int 2"


def test_a_field_of_another_class_takes_only_an_instance_of_it():
    """kills: config.py check_value's last check (``isinstance(value, tp)`` for any other class) dropped"""
    @dataclass
    class _F:
        where: PurePosixPath = PurePosixPath("a")

    assert config_from_dict(_F, {"where": PurePosixPath("b")}).where == PurePosixPath("b")
    with pytest.raises(TypeError) as info:
        config_from_dict(_F, {"where": "b"})
    assert str(info.value) == "_F.where: expected PurePosixPath, got str 'b'"


# ---------------------------------------------------------------------------- experiments/config.py
_NAME_RULE = ("must be a non-empty string without whitespace, '/', '\\', ':', '$' or NUL and not '.' or '..' "
              "(it names a results folder)")


def _refused_name(where: str, name: str) -> None:
    """The config of ``_raw`` with ``name`` as the experiment's, the first task's or the second setting's name
    is refused with the names' rule when it loads."""
    raw = _raw()
    if where == "experiment":
        raw["name"] = name
    elif where == "task":
        raw["tasks"][0]["name"] = name
    else:
        raw["operators"][1]["name"] = name
    with pytest.raises(ValueError, match=re.escape(f"{_NAME_RULE}, got {name!r}")):
        load_experiment_config(raw)


@pytest.mark.parametrize("where, name", [("experiment", "my study"), ("task", "dig its"), ("operator", "lap\t2")])
def test_bug_a_name_with_whitespace_is_refused_when_the_config_loads(where, name):
    """Bug: experiments/config.py ``_check_path_name`` took names with spaces; they name results folders and the
    published page links its figures by them, and MyST renders ``![x](my study/a.png)`` as plain text (and
    ``<my study/a.png>`` as a ``my%20study`` path Sphinx cannot find), so the page lost its figures."""
    _refused_name(where, name)


@pytest.mark.parametrize("where, name", [("task", "dig:its"), ("operator", "heat:t1"), ("operator", "lap\0"),
                                         ("experiment", "a:b")])
def test_bug_a_name_with_a_colon_or_nul_is_refused_when_the_config_loads(where, name):
    """Bug: a setting named ``"heat:t1"`` was accepted, yet could never be named in ``primary`` (which splits
    ``'task:setting'`` at the last ``:``, reading task ``heat`` and setting ``t1``), and ``:`` is no file-name
    character on Windows; a NUL passed validation and failed later as "embedded null byte". Both are refused
    when the config loads, with the other names' rule."""
    _refused_name(where, name)


@pytest.mark.parametrize("fields, message", [
    ({"name": "a\\b"}, f"task name {_NAME_RULE}, got 'a\\\\b'"),
    ({"name": "."}, f"task name {_NAME_RULE}, got '.'"),
    ({"name": ""}, f"task name {_NAME_RULE}, got ''"),
    ({"folds": 1}, "task 'digits': folds must be an int >= 2, got 1"),
    ({"folds": 3, "dataset_options": {"fold": 0}},
     "task 'digits': with folds = 3, the run's seed sets fold; remove it from dataset_options"),
    ({"train": {"seed": 1}}, "task 'digits': set seeds with the top-level `seeds`, not train.seed"),
    ({"eval_batch_size": 0}, f"task 'digits': eval_batch_size must be positive, an int at most {sys.maxsize} (a tensor "
                             "size), got 0"),
    ({"select_by": ""}, "task 'digits': select_by must be an evaluation key such as 'val_acc', got ''"),
    ({"augment": {"flip": True, "crop": 2}}, "task 'digits': unknown augment key(s) ['crop']; expected crop_padding, flip"),
    ({"augment": {"crop_padding": -1}}, "task 'digits': augment.crop_padding must be an int >= 0, got -1"),
    ({"augment": {"flip": 1}}, "task 'digits': augment.flip must be true or false, got int (1)"),
    ({"label_smoothing": -0.1}, "task 'digits': label_smoothing must be a float in [0, 1), got -0.1"),
    ({"reach": {"val_acc": 0.5, "loss": 1.0}}, "task 'digits': reach must be one evaluation key with a finite threshold, "
                                                "e.g. reach = { val_acc = 0.9 }; got {'val_acc': 0.5, 'loss': 1.0}"),
    ({"reach": {"val_acc": float("inf")}}, "task 'digits': reach must be one evaluation key with a finite threshold, "
                                            "e.g. reach = { val_acc = 0.9 }; got {'val_acc': inf}"),
])
def test_a_task_is_refused_when_the_config_loads(fields, message):
    """kills, in experiments/config.py: ``_check_path_name`` losing ``"\\\\" in name``, ``"."`` or ``not name``;
    ``folds < 2`` -> ``< 1``; the fold/num_folds clash check dropped; the ``train.seed`` check dropped;
    ``eval_batch_size < 1`` -> ``< 0``; ``select_by`` accepting ``""``; the unknown augment keys check dropped;
    ``crop_padding < 0`` -> ``< -1``; the ``flip`` bool check dropped; ``0.0 <= label_smoothing`` dropped;
    ``len(reach) == 1`` -> ``>= 1``; ``math.isfinite`` dropped from the reach check. Each of these lets a config load
    whose runs then fail (or silently do something else) after the first runs have trained."""
    with pytest.raises(ValueError) as info:
        load_experiment_config(_with_task(**fields))
    assert str(info.value) == message


def test_a_reach_threshold_given_as_an_int_is_stored_as_a_float():
    """kills: experiments/config.py ``self.reach = {key: float(value)}`` -> ``{key: value}`` (``reach = { val_acc = 1 }``
    keeps an int in a
    directly built task, so its stored config (manifest, identity) differs from ``{ val_acc = 1.0 }``)"""
    task = TaskConfig("digits", "digits", "vit-digits", reach={"val_acc": 1})  # built in Python: no TOML type check
    assert task.reach == {"val_acc": 1.0} and type(task.reach["val_acc"]) is float


def test_an_ssl_setting_in_both_model_overrides_and_ssl_is_refused():
    """kills: experiments/config.py TaskConfig._check_ssl with its clash check dropped (the ``ssl`` value silently wins)"""
    with pytest.raises(ValueError) as info:
        load_experiment_config(_with_task(model="dino-digits", model_overrides={"local_crops": 2}, ssl={"local_crops": 4}))
    assert str(info.value) == "task 'digits': ['local_crops'] set in both model_overrides and ssl; keep them in ssl only"


def test_a_minibatch_task_refuses_gradient_accumulation():
    """kills: experiments/config.py TaskConfig._check_minibatch with the ``grad_accum_steps != 1`` check dropped"""
    with pytest.raises(ValueError, match=r"^task 'cora': minibatch trains on one sampled subgraph per update, which "
                                         r"grad_accum_steps cannot split; got grad_accum_steps = 2: raise "):
        TaskConfig("cora", "cora", "gcn-cora", minibatch={"batch_size": 8, "num_neighbors": [5, 5]},
                   train={"grad_accum_steps": 2})


@pytest.mark.parametrize("fields, message", [
    ({"heads": "attention:2", "laplacian_heads": 1}, "operator setting 'h': give heads or laplacian_heads, not both"),
    ({"laplacian_heads": "all"}, "operator setting 'h': laplacian_heads must be an int, a list or 'half', got 'all'"),
])
def test_an_operator_setting_is_refused_when_built(fields, message):
    """kills: experiments/config.py OperatorSetting.__post_init__ with the heads-and-laplacian_heads check, or the
    ``laplacian_heads`` string check, dropped"""
    with pytest.raises(ValueError) as info:
        OperatorSetting("h", **fields)
    assert str(info.value) == message


def test_an_operator_settings_overrides_leave_its_model_overrides_unchanged():
    """kills: experiments/config.py ``out = dict(self.model_overrides)`` -> ``out = self.model_overrides`` (resolving the
    setting for one model writes its head count into the setting, and the next model of another width gets it)"""
    setting = OperatorSetting("lap", laplacian_heads="half", model_overrides={"dropout": 0.1})
    assert setting.overrides(4) == {"dropout": 0.1, "laplacian_heads": 2}
    assert setting.model_overrides == {"dropout": 0.1}
    assert setting.overrides(6) == {"dropout": 0.1, "laplacian_heads": 3}


def test_an_experiment_with_no_seeds_is_refused():
    """kills: experiments/config.py ExperimentConfig dropping ``or not self.seeds`` (``seeds = []`` loads and runs nothing)"""
    with pytest.raises(ValueError) as info:
        load_experiment_config(_raw(seeds=[]))
    assert str(info.value) == "an experiment needs at least one task, one operator setting and one seed"


def test_precision_leaves_a_tasks_own_amp():
    """kills: experiments/config.py ``if "amp" not in task.train`` -> ``if True`` (the config's ``precision`` overwrites a
    task that chose its own ``train.amp``)"""
    raw = _raw(precision="bf16")
    raw["tasks"].append({**raw["tasks"][0], "name": "own", "train": {"max_steps": 2, "amp": "off"}})
    cfg = load_experiment_config(raw)
    assert cfg.tasks[0].train["amp"] == "bf16" and cfg.tasks[1].train["amp"] == "off"


def test_a_name_used_twice_is_refused():
    """kills: experiments/config.py ``names.count(n) > 1`` -> ``> 2`` (two settings with one name share one results folder)"""
    raw = _raw()
    raw["operators"].append({"name": "lap", "laplacian_heads": 2})
    with pytest.raises(ValueError) as info:
        load_experiment_config(raw)
    assert str(info.value) == "duplicate operator setting names: ['lap']"


@pytest.mark.parametrize("primary, error, message", [
    (["digts:lap"], ValueError, "primary contrast 'digts:lap': unknown task 'digts' (did you mean 'digits'?); "
                                "the tasks are ['digits']"),
    (["attention"], ValueError, "primary contrast 'attention': 'attention' is the baseline every contrast is taken "
                                "against; name one of ['lap']"),
    (["lap", "lap"], ValueError, "duplicate primary contrasts: ['lap', 'lap']"),
])
def test_primary_contrasts_are_checked_when_the_config_loads(primary, error, message):
    """kills: experiments/config.py ``_check_primary`` losing its all-strings check, its unknown-task check, its baseline
    check or its duplicate check"""
    with pytest.raises(error) as info:
        load_experiment_config(_raw(primary=primary))
    assert str(info.value) == message


def test_a_directly_built_experiment_refuses_a_primary_entry_that_is_not_a_string():
    """kills: experiments/config.py ``_check_primary`` losing its all-strings check (``primary=["lap", 3]`` built in
    Python, where no TOML type check runs, fails later with an AttributeError on ``rpartition``)"""
    task = TaskConfig("digits", "digits", "vit-digits")
    with pytest.raises(TypeError) as info:
        ExperimentConfig("x", [task], [OperatorSetting("attention"), OperatorSetting("lap", laplacian_heads=1)],
                         primary=["lap", 3])
    assert str(info.value) == "primary must be a list of strings such as 'task:setting' or 'setting', got ['lap', 3]"


def test_a_primary_contrast_without_a_task_names_that_setting_on_every_task():
    """kills: experiments/config.py primary_contrasts ``not task or t.name == task`` -> ``t.name == task``"""
    raw = _raw(primary=["lap"])
    raw["tasks"].append({**raw["tasks"][0], "name": "other"})
    assert load_experiment_config(raw).primary_contrasts() == {("digits", "lap"), ("other", "lap")}


def test_a_task_may_ask_for_a_progress_bar():
    """kills: experiments/config.py train_config ``{"progress": False, **task.train, ...}`` with ``progress`` placed after
    ``task.train`` (the default of False must not overwrite a task's ``train.progress = true``)"""
    task = load_experiment_config(_with_task(train={"max_steps": 2, "progress": True})).tasks[0]
    assert train_config(task, 0).progress is True
    assert train_config(load_experiment_config(_raw()).tasks[0], 0).progress is False


def test_a_bad_training_key_is_named_with_its_task():
    """kills: experiments/config.py train_config re-raising the TrainConfig error without the ``task 'digits' train:``
    prefix (with several tasks the user cannot tell which one is wrong)"""
    with pytest.raises(ValueError) as info:
        load_experiment_config(_with_task(train={"max_stesp": 2}))
    assert str(info.value).startswith("task 'digits' train: unknown TrainConfig key 'max_stesp' "
                                      "(did you mean 'max_steps'?); valid keys: max_steps, ")


def test_a_bad_ssl_setting_is_named_with_its_task():
    """kills: experiments/config.py _check_ssl re-raising the SSLConfig error without the ``task 'digits':`` prefix"""
    with pytest.raises(ValueError) as info:
        load_experiment_config(_with_task(model="dino-digits", ssl={"local_crop": 2}))
    assert str(info.value).startswith("task 'digits': ")
    assert "unknown key 'local_crop'" in str(info.value)


# ------------------------------------------------------------------ parse_override / apply_overrides
def test_an_override_key_path_skips_empty_segments_and_a_bare_word_is_stripped():
    """kills: experiments/config.py parse_override keeping empty segments of ``a..b`` (``['a', '', 'b']``), and the bare
    word fallback ``raw.strip()`` -> ``raw`` (``x= hello world `` keeping its spaces)"""
    assert parse_override(" tasks..digits.train.lr = 1e-3") == (["tasks", "digits", "train", "lr"], 0.001)
    assert parse_override("a.b= hello world ") == (["a", "b"], "hello world")
    assert parse_override("a=[1, 2]") == (["a"], [1, 2])
    assert parse_override("a={ x = 1 }") == (["a"], {"x": 1})


def test_a_name_filter_takes_a_toml_list_and_a_comma_list_with_spaces():
    """kills: experiments/config.py apply_overrides splitting ``str(value)`` also for a TOML list (``tasks=["a", "b"]``
    then names ``["['a'", ...]``), and ``v.strip()`` -> ``v`` (``operators=attention, lap`` not finding ``' lap'``)"""
    raw = _raw()
    raw["operators"].append({"name": "lap2", "laplacian_heads": 2})
    assert [o["name"] for o in apply_overrides(raw, ["operators=attention, lap2"])["operators"]] == ["attention", "lap2"]
    assert [o["name"] for o in apply_overrides(raw, ['operators=["attention", "lap"]'])["operators"]] == ["attention", "lap"]


def test_a_name_filter_ignores_a_trailing_comma_and_refuses_to_keep_nothing():
    """Bug: experiments/config.py apply_overrides read ``tasks=digits,`` as the names ``['digits', '']`` and refused
    it as "no tasks named ['']"; an empty filter (``operators=``, ``tasks=[]``) got the same puzzle or no error at
    all. Empty names are now dropped, and a filter that names nothing is refused with a message saying so."""
    raw = _raw()
    assert [t["name"] for t in apply_overrides(raw, ["tasks=digits,"])["tasks"]] == ["digits"]
    for bad in ("operators=", "operators= , ", "tasks=[]"):
        with pytest.raises(ValueError, match=r"name at least one of the (operators|tasks) to keep"):
            apply_overrides(raw, [bad])


def test_a_name_filter_keeps_a_primary_contrast_named_by_setting_alone():
    """kills: experiments/config.py apply_overrides ``p.rpartition(":")[0] in ("", *tasks_kept)`` ->
    ``in tasks_kept`` (a ``primary = ["lap"]`` contrast dropped by ``--set tasks=digits``)"""
    raw = _raw(primary=["lap", "digits:lap"])
    raw["tasks"].append({**raw["tasks"][0], "name": "other"})
    assert apply_overrides(raw, ["tasks=digits"])["primary"] == ["lap", "digits:lap"]


def test_an_override_creates_a_missing_table():
    """kills: experiments/config.py apply_overrides ``node.setdefault(part, {})`` -> ``node.get(part, {})`` (an override
    into a table the file does not have, e.g. ``tasks.digits.augment.flip=true``, silently lost)"""
    out = apply_overrides(_raw(), ["tasks.digits.augment.flip=true", "tasks.digits.reach.val_acc=0.5"])
    assert out["tasks"][0]["augment"] == {"flip": True} and out["tasks"][0]["reach"] == {"val_acc": 0.5}
    assert load_experiment_config(_raw(), ["tasks.digits.augment.flip=true"]).tasks[0].augment == {"flip": True}


def test_an_override_naming_no_entry_lists_the_entries():
    """kills: experiments/config.py apply_overrides with the ``if not match`` check dropped (an IndexError instead)"""
    with pytest.raises(ValueError) as info:
        apply_overrides(_raw(), ["operators.lapp.laplacian_heads=2"])
    assert str(info.value) == ("override 'operators.lapp.laplacian_heads=2': no entry named 'lapp' in operators; "
                               "available: ['attention', 'lap'] (did you mean 'lap'?)")


def test_an_override_into_a_list_is_refused():
    """kills: experiments/config.py apply_overrides with the ``cannot set a key inside a list`` check dropped
    (``seeds.a=1`` a TypeError of list indices)"""
    with pytest.raises(ValueError) as info:
        apply_overrides(_raw(), ["seeds.a=1"])
    assert str(info.value) == "override 'seeds.a=1': cannot set a key inside a list"


# ------------------------------------------------------------------ TOML files: errors name the file and the key
_TOML = """\
name = "second"
seeds = [0]

[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
{task}

[[operators]]
name = "attention"
"""


def test_a_toml_error_names_the_file_and_the_key_path(tmp_path):
    """kills: experiments/config.py load_experiment_config ``where = p.name`` -> ``str(p)`` (the key path of every
    problem prefixed with the whole folder path) and ``where = "config"`` for a dict dropped (the class name instead)"""
    path = tmp_path / "exp.toml"
    path.write_text(_TOML.format(task='metrc = "val_acc"'))
    with pytest.raises(ValueError) as info:
        load_experiment_config(path)
    assert str(info.value).startswith("exp.toml.tasks[0]: unknown key 'metrc'; valid keys: ['augment', ")
    assert str(info.value).endswith("(did you mean 'metric'?)")
    path.write_text(_TOML.format(task="eval_batch_size = true"))
    with pytest.raises(TypeError) as info:
        load_experiment_config(path)
    assert str(info.value) == "exp.toml.tasks[0].eval_batch_size: expected int | None, got bool True"
    with pytest.raises(TypeError) as info:
        load_experiment_config({**_raw(), "seeds": [0, "1"]})
    assert str(info.value) == "config.seeds[1]: expected an int, got str '1'"


def test_a_toml_file_that_does_not_parse_names_the_file(tmp_path):
    """kills: experiments/config.py load_experiment_config dropping the file from its "invalid TOML" message"""
    path = tmp_path / "exp.toml"
    path.write_text('name = "a"\nname = "b"\n')
    with pytest.raises(ValueError) as info:
        load_experiment_config(path)
    assert str(info.value) == f"{path}: invalid TOML: Cannot overwrite a value (at line 2, column 11)"


# ---------------------------------------------------------------------------- experiments/validate.py
def _node(**fields):
    """A karate (node, built in: no data root) comparison of the graph-node-small preset, two seeds, two settings."""
    task = {"name": "kar", "dataset": "karate", "model": "graph-node-small", "train": {"max_steps": 2}, **fields}
    return load_experiment_config(_raw(seeds=[0, 1], tasks=[task]))


_IMAGE_KEYS = "its keys: ['loss', 'val_acc', 'test_loss', 'test_acc']"


def test_the_reach_and_select_by_keys_must_be_evaluation_keys_of_the_task():
    """kills: experiments/validate.py with the ``reach`` key left out of the checked keys, and the check narrowed to
    ``metric`` alone (a ``reach = { val_ac = 0.5 }`` typo then never reached: every run reports "not reached")"""
    from diffusionformer.experiments.validate import validate_experiment

    cfg = load_experiment_config(_with_task(reach={"val_ac": 0.5}, select_by="val_los"))
    assert validate_experiment(cfg, load_data=False) == [
        f"task 'digits': select_by 'val_los' is not an evaluation key of image tasks with 'vit-digits'; {_IMAGE_KEYS}",
        f"task 'digits': reach 'val_ac' is not an evaluation key of image tasks with 'vit-digits' (did you mean "
        f"'val_acc'?); {_IMAGE_KEYS}",
    ]


def test_only_the_named_tasks_are_checked():
    """kills: experiments/validate.py ``task.name not in tasks`` -> ``task.name in tasks`` (``tasks=[...]`` checks the
    other tasks instead)"""
    from diffusionformer.experiments.validate import validate_experiment

    raw = _with_task(select_by="val_los")
    raw["tasks"].append({**raw["tasks"][0], "name": "good", "select_by": None})
    cfg = load_experiment_config(raw)
    assert validate_experiment(cfg, load_data=False, tasks=["good"]) == []
    assert len(validate_experiment(cfg, load_data=False, tasks=["digits"])) == 1


def test_tensorboard_logging_without_tensorboard_is_a_problem_before_training(monkeypatch):
    """kills: experiments/validate.py with the tensorboard check dropped (the run would fail at its start)"""
    from diffusionformer.experiments import validate

    monkeypatch.setattr(validate, "_tensorboard_available", lambda: False)
    cfg = load_experiment_config(_with_task(train={"max_steps": 2, "loggers": ["jsonl", "tensorboard"]}))
    assert validate.validate_experiment(cfg, load_data=False) == [
        "task 'digits': train.loggers names 'tensorboard', but the tensorboard package is not installed "
        "(pip install tensorboard, or drop it from loggers)"]
    monkeypatch.setattr(validate, "_tensorboard_available", lambda: True)
    assert validate.validate_experiment(cfg, load_data=False) == []


def test_an_unknown_dataset_option_is_one_problem_and_the_data_is_not_loaded(monkeypatch):
    """kills: experiments/validate.py ``spec_ok = False`` -> ``True`` after an unknown option, and ``spec_ok`` dropped from
    the load condition (the loader is then called with the unknown option and a second problem is added)"""
    from diffusionformer.experiments import build, validate

    calls = []
    monkeypatch.setattr(build, "load_dataset", lambda *a, **k: calls.append(k))
    cfg = load_experiment_config(_with_task(dataset_options={"bogus": 1}))
    assert validate.validate_experiment(cfg) == [
        "task 'digits': dataset 'digits' has no option(s) ['bogus']; its options: ['normalize', 'test_fraction', "
        "'val_fraction']"]
    assert calls == []


def test_minibatch_on_a_task_that_is_not_a_node_task_is_a_problem():
    """kills: experiments/validate.py with the ``spec.kind != "node"`` minibatch check dropped"""
    from diffusionformer.experiments.validate import validate_experiment

    cfg = load_experiment_config(_with_task(minibatch={"batch_size": 8, "num_neighbors": [5, 5]}))
    with pytest.warns(UserWarning, match="propagation hops R are unknown or unbounded"):
        problems = validate_experiment(cfg, load_data=False)
    assert problems[0] == ("task 'digits': minibatch (neighbour-sampled training) applies to node tasks, and dataset "
                           "'digits' is of kind 'image'")


def test_gradient_accumulation_of_a_full_batch_node_task_is_a_problem():
    """kills: experiments/validate.py with the full-batch node ``grad_accum_steps`` check dropped"""
    from diffusionformer.experiments.validate import validate_experiment

    cfg = _node(train={"max_steps": 2, "grad_accum_steps": 2})
    assert validate_experiment(cfg, load_data=False) == [
        "task 'kar': grad_accum_steps = 2, but a full-batch node task trains on the whole graph at every update and "
        "cannot split it; drop grad_accum_steps"]


def test_gradient_accumulation_of_a_dino_task_is_a_problem():
    """kills: experiments/validate.py with the DINO ``grad_accum_steps`` check dropped"""
    from diffusionformer.experiments.validate import validate_experiment

    cfg = load_experiment_config(_with_task(model="dino-digits", model_overrides={}, metric="knn_test_acc",
                                            train={"max_steps": 2, "grad_accum_steps": 2}))
    assert validate_experiment(cfg, load_data=False) == [
        "task 'digits': grad_accum_steps = 2, but DINO updates its teacher and centre at every loss call, so "
        "micro-batches would not add up to the full batch's update; drop grad_accum_steps"]


def test_an_unknown_model_is_one_problem_not_a_crash():
    """kills: experiments/validate.py dropping ``if preset is None: continue`` (the settings are then resolved with no
    preset and the check crashes instead of listing the problem)"""
    from diffusionformer.experiments.validate import validate_experiment

    cfg = load_experiment_config(_with_task(model="vit-digts"))
    problems = validate_experiment(cfg, load_data=False)
    assert len(problems) == 1 and problems[0].startswith("task 'digits': unknown model 'vit-digts'")


def test_a_loaded_dataset_is_stored_and_reused(monkeypatch):
    """kills: experiments/validate.py dropping ``loaded[task.name] = data`` (the runner loads each dataset a second time),
    and ignoring a dataset already in ``loaded``"""
    from diffusionformer.experiments import build, validate

    real, calls = build.load_dataset, []

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "load_dataset", counting)
    cfg = load_experiment_config(_raw(seeds=[0, 1]))
    loaded = {}
    assert validate.validate_experiment(cfg, loaded=loaded) == []
    assert list(loaded) == ["digits"] and len(calls) == 1
    assert validate.validate_experiment(cfg, loaded=loaded) == [] and len(calls) == 1


def test_a_missing_data_root_is_a_problem_unless_missing_data_is_ok(tmp_path, monkeypatch):
    """kills: experiments/validate.py ``if not missing_data_ok`` -> ``if True`` for a DataRootError of the load; the
    data-root check without ``load_data`` dropped; and ``root is None or not root.is_dir()`` -> ``root is None`` (a
    data root that is not a directory passes)"""
    from diffusionformer.experiments.validate import validate_experiment

    monkeypatch.delenv("DIFFUSIONFORMER_DATA", raising=False)
    cfg = _node(dataset="cora", model="graph-node-small")
    missing = str(tmp_path / "nowhere")
    assert validate_experiment(cfg, data_root=missing, missing_data_ok=True) == []
    problems = validate_experiment(cfg, data_root=missing)
    assert len(problems) == 1 and problems[0].startswith("task 'kar': DataRootError: dataset 'cora': missing file(s)")
    assert validate_experiment(cfg, data_root=missing, load_data=False) == [
        f"task 'kar': dataset 'cora' reads files from a data root, and {missing!r} is not a directory"]
    assert validate_experiment(cfg, load_data=False) == [
        "task 'kar': dataset 'cora' reads files from a data root, and none is set (pass --data-root or set "
        "$DIFFUSIONFORMER_DATA)"]


def test_a_setting_the_model_cannot_build_is_a_problem_of_that_setting(monkeypatch):
    """kills: experiments/validate.py ``except (TypeError, ValueError, NotImplementedError)`` losing
    ``NotImplementedError`` (an operator the model does not implement crashes the check)"""
    from diffusionformer.experiments import validate

    def refuse(task, setting, data, preset, model_config):
        if setting.name == "lap":
            raise NotImplementedError("no Laplacian heads on this backend")
        return None

    monkeypatch.setattr(validate, "_resolve_model", refuse)
    cfg = load_experiment_config(_raw())
    assert validate.validate_experiment(cfg, load_data=False) == [
        "task 'digits' / setting 'lap': NotImplementedError: no Laplacian heads on this backend"]


def test_check_experiment_counts_every_run_and_says_nothing_trained():
    """kills: experiments/validate.py ``runs = tasks * operators * seeds`` losing the seeds, and ``_first_line`` prefixing
    the type of a ValueError/TypeError (``not isinstance`` -> ``isinstance``)"""
    from diffusionformer.experiments.validate import check_experiment

    cfg = load_experiment_config(_raw(seeds=[0, 1, 2], tasks=[{**_raw()["tasks"][0], "model": "vit-digts"}]))
    with pytest.raises(ValueError) as info:
        check_experiment(cfg, load_data=False)
    text = str(info.value)
    assert text.startswith("config 'second' (6 runs) has 1 problem(s); nothing was trained:\n"
                           "  - task 'digits': unknown model 'vit-digts'")


# ---------------------------------------------------------------------------- experiments/build.py
def test_task_data_loads_once_per_fold_with_the_tasks_data_seed(monkeypatch):
    """kills: experiments/build.py task_data ``if fold not in cache`` -> ``if True`` (the dataset reloaded for every seed)
    and ``seed=task.data_seed`` -> ``seed=seed`` (each run's split drawn from its own seed, so runs compare on different
    data)"""
    from diffusionformer.experiments import build

    calls = []
    monkeypatch.setattr(build, "load_dataset", lambda name, **kw: calls.append((name, kw)) or len(calls))
    task = TaskConfig("d", "digits", "vit-digits", data_seed=7)
    cache = {}
    assert [build.task_data(task, s, None, cache) for s in (0, 1, 2)] == [1, 1, 1]
    assert calls == [("digits", {"root": None, "seed": 7})]
    folded, calls[:] = TaskConfig("d", "digits", "vit-digits", data_seed=7, folds=2), []
    cache = {}
    assert [build.task_data(folded, s, "/r", cache) for s in (0, 1, 2, 3)] == [1, 2, 1, 2]
    assert calls == [("digits", {"root": "/r", "seed": 7, "fold": 0, "num_folds": 2}),
                     ("digits", {"root": "/r", "seed": 7, "fold": 1, "num_folds": 2})]


@pytest.fixture(scope="module")
def digits_data():
    from diffusionformer.experiments.build import task_data

    return task_data(TaskConfig("d", "digits", "vit-digits"), 0, None, {})


_TINY_VIT = {"dim": 8, "depth": 1, "num_heads": 2}


def test_a_data_size_override_of_another_length_is_refused(digits_data):
    """kills: experiments/build.py ``_same`` losing ``len(a) == len(b)`` (``input_size = [8, 8, 1]`` compared item by
    item with the data's ``(8, 8)`` and taken as equal)"""
    from diffusionformer.experiments.build import build_model

    task = TaskConfig("d", "digits", "vit-digits", model_overrides={**_TINY_VIT, "input_size": [8, 8, 1]})
    with pytest.raises(ValueError) as info:
        build_model(task, OperatorSetting("attention"), digits_data)
    assert str(info.value) == ("task 'd': model_overrides sets input_size = [8, 8, 1], but dataset 'digits' gives "
                               "input_size = (8, 8); the model takes input_size from the data, so drop the override")
    ok = TaskConfig("d", "digits", "vit-digits", model_overrides={**_TINY_VIT, "input_size": [8, 8]})
    assert tuple(build_model(ok, OperatorSetting("attention"), digits_data).config.input_size) == (8, 8)


def test_an_operator_setting_may_not_change_a_data_size(digits_data):
    """kills: experiments/build.py build_model without the check of the setting's model_overrides"""
    from diffusionformer.experiments.build import build_model

    with pytest.raises(ValueError) as info:
        build_model(TaskConfig("d", "digits", "vit-digits", model_overrides=_TINY_VIT),
                    OperatorSetting("x", model_overrides={"num_classes": 3}), digits_data)
    assert str(info.value) == ("task 'd': operator setting 'x' sets num_classes = 3, but dataset 'digits' gives "
                               "num_classes = 10; the model takes num_classes from the data, so drop the override")


def test_a_padded_vocabulary_is_kept():
    """kills: experiments/build.py ``{**sizes, **task.model_overrides}`` -> ``{**task.model_overrides, **sizes}`` (a
    padded ``vocab_size = 128`` replaced by the data's 103), and the padded-vocabulary exception dropped"""
    from diffusionformer.experiments.build import build_model, task_data

    task = TaskConfig("t", "pydoc-chars", "gpt-char-tiny",
                      model_overrides={"vocab_size": 128, "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16})
    data = task_data(task, 0, None, {})
    assert build_model(task, OperatorSetting("attention"), data).config.vocab_size == 128


def test_a_setting_of_a_model_without_heads_still_applies_its_other_overrides():
    """kills: experiments/build.py add_setting_overrides losing its ``else: overrides.update(setting.model_overrides)``
    (a setting's ``dropout`` silently ignored for a GCN), and the refusal of heads on such a model dropped"""
    from diffusionformer.experiments.build import build_model, task_data

    task = TaskConfig("k", "karate", "gcn-2layer")
    data = task_data(task, 0, None, {})
    assert build_model(task, OperatorSetting("x", model_overrides={"dropout": 0.3}), data).config.dropout == 0.3
    with pytest.raises(ValueError) as info:
        build_model(task, OperatorSetting("lap", laplacian_heads=1), data)
    assert str(info.value) == "operator setting 'lap' sets heads but model 'gcn-2layer' has no attention heads"


def test_an_ssl_setting_of_an_operator_setting_wins_over_the_tasks(digits_data):
    """kills: experiments/build.py ``task_config(model, **{**task.ssl, **moved})`` with the order swapped (a setting
    that varies a view setting, still given among its model overrides, would run with the task's value)"""
    from diffusionformer.experiments.build import build_model

    task = TaskConfig("d", "digits", "dino-digits", ssl={"local_crops": 2})
    with pytest.warns(DeprecationWarning):
        model = build_model(task, OperatorSetting("x", model_overrides={"local_crops": 4}), digits_data)
    assert model.task_config.local_crops == 4


# ---------------------------------------------------------------------------- experiments/reload.py
def _hand_run(rdir, **identity):
    """A run folder written by hand: a tiny GPT's run_config.json and checkpoint.pt (no training)."""
    import torch

    from diffusionformer.config import config_to_dict
    from diffusionformer.models import GPTConfig, get_preset
    from diffusionformer.train import TrainConfig
    from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT

    cfg = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)
    torch.manual_seed(0)
    model = get_preset("gpt-char-tiny").model_cls(cfg)
    rdir.mkdir(parents=True)
    (rdir / "run_config.json").write_text(json.dumps({"model": "gpt-char-tiny", "model_config": config_to_dict(cfg),
                                                      **identity}))
    torch.save({"format": CHECKPOINT_FORMAT, "step": 3, "model": model.state_dict(), "optimizer": {}, "rng": {},
                "config": config_to_dict(TrainConfig(max_steps=3))}, rdir / "checkpoint.pt")
    return model


def test_load_run_takes_a_file_of_the_run_and_gives_an_eval_mode_model_without_metrics(tmp_path):
    """kills: experiments/reload.py dropping ``if rdir.is_file(): rdir = rdir.parent`` (a path to the run's checkpoint
    refused), ``model.to(...).eval()`` -> ``model.to(...)`` (dropout left on), and reading ``metrics.jsonl`` of a run
    that has none"""
    import torch

    from diffusionformer.experiments.reload import load_run

    rdir = tmp_path / "runs" / "t" / "s" / "seed0"
    ref = _hand_run(rdir)
    run = load_run(rdir / "checkpoint.pt")
    assert run.path == rdir and run.step == 3 and run.preset == "gpt-char-tiny" and run.summary is None
    assert run.metrics == [] and run.model.training is False and run.config.vocab_size == 11
    assert run.train_config.max_steps == 3
    for name, tensor in ref.state_dict().items():
        assert torch.equal(run.model.state_dict()[name], tensor)


@pytest.mark.parametrize("identity, got", [({"model": 3}, "3 and dict"), ({"model_config": [1]}, "'gpt-char-tiny' and list")])
def test_load_run_refuses_a_run_config_without_a_preset_name_or_config_table(tmp_path, identity, got):
    """kills: experiments/reload.py with the check of run_config.json's ``model``/``model_config`` dropped"""
    from diffusionformer.experiments.reload import load_run

    rdir = tmp_path / "run"
    _hand_run(rdir, **identity)
    with pytest.raises(ValueError) as info:
        load_run(rdir)
    assert str(info.value) == (f"load_run: expected 'model' (a preset name) and 'model_config' (a table) in "
                               f"{rdir / 'run_config.json'}, got {got}")


def test_load_run_of_a_run_without_a_checkpoint_or_identity_or_folder_names_it(tmp_path):
    """kills: experiments/reload.py with the missing-checkpoint, missing-run_config.json or missing-folder check dropped
    (the user then gets load_checkpoint's or open's message without the hint)"""
    from diffusionformer.experiments.reload import load_run

    rdir = tmp_path / "run"
    _hand_run(rdir)
    (rdir / "checkpoint.pt").unlink()
    with pytest.raises(FileNotFoundError) as info:
        load_run(rdir)
    assert str(info.value) == (f"load_run: expected the checkpoint {rdir / 'checkpoint.pt'}, got none (the run has not "
                               "saved a step yet)")
    (rdir / "run_config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"^load_run: expected .*run_config\.json \(written by `python -m "):
        load_run(rdir)
    with pytest.raises(FileNotFoundError) as info:
        load_run(tmp_path / "nowhere")
    assert str(info.value) == ("load_run: expected a run directory (.../runs/<task>/<operator>/seed<k>), got missing "
                               f"{tmp_path / 'nowhere'}")


def test_load_run_of_weights_that_do_not_fit_is_a_checkpoint_error(tmp_path):
    """kills: experiments/reload.py ``except RuntimeError`` -> ``except KeyError`` around ``load_state_dict`` (the torch
    RuntimeError escapes instead of the CheckpointError that names both files)"""
    from diffusionformer.experiments.reload import load_run
    from diffusionformer.train import CheckpointError

    rdir = tmp_path / "run"
    _hand_run(rdir)
    ident = json.loads((rdir / "run_config.json").read_text())
    ident["model_config"]["n_embd"] = 16
    (rdir / "run_config.json").write_text(json.dumps(ident))
    with pytest.raises(CheckpointError, match=r"^checkpoint .*checkpoint\.pt: expected the weights of the "
                                              r"'gpt-char-tiny' model of .*run_config\.json, got ones that do not fit"):
        load_run(rdir)


def test_load_run_warns_of_an_unreadable_summary(tmp_path):
    """kills: experiments/reload.py with the warning of an unreadable summary.json dropped (``run.summary`` is None with
    no word of why)"""
    from diffusionformer.experiments.reload import load_run

    rdir = tmp_path / "run"
    _hand_run(rdir)
    (rdir / "summary.json").write_text('{"status": "compl')
    with pytest.warns(UserWarning, match=r"summary\.json is unreadable \(truncated or not a JSON object\); run\.summary "
                                         r"is None"):
        assert load_run(rdir).summary is None
    (rdir / "summary.json").write_text('{"status": "completed"}')
    assert load_run(rdir).summary == {"status": "completed"}


# ---------------------------------------------------------------------------- experiments/outputs.py
def _row(task, operator, seed, status="completed"):
    return {"task": task, "operator": operator, "seed": seed, "status": status, "metric": "test_acc", "value": 0.5}


def _finished(out, task, operator, seed, status="completed"):
    rdir = out / "runs" / task / operator / f"seed{seed}"
    rdir.mkdir(parents=True)
    (rdir / "summary.json").write_text(json.dumps({"status": status}))


def test_rows_of_an_earlier_results_json_are_kept_only_while_finished_and_not_rerun(tmp_path):
    """kills: experiments/outputs.py ``_other_finished_rows`` losing ``r.status == "completed"`` (a failed row kept), the
    ``not in have`` test (a row rerun now listed twice) or the ``_completed(run_dir(...))`` test (a row whose run was
    deleted or restarted kept)"""
    from diffusionformer.experiments.outputs import _other_finished_rows
    from diffusionformer.experiments.results import RunResult

    rows = [_row("d", "a", 0), _row("d", "a", 1, status="failed: nan loss"), _row("d", "b", 0), _row("d", "c", 0)]
    (tmp_path / "results.json").write_text(json.dumps({"runs": rows}))
    for task, op, seed in (("d", "a", 0), ("d", "a", 1), ("d", "b", 0)):
        _finished(tmp_path, task, op, seed)
    _finished(tmp_path, "d", "c", 0, status="running")
    now = [RunResult(**_row("d", "b", 0))]
    kept = _other_finished_rows(tmp_path, now)
    assert [(r.task, r.operator, r.seed) for r in kept] == [("d", "a", 0)]


@pytest.mark.parametrize("text", ['{"rows": []}', '{"runs": [{"task": "d", "bogus": 1}]}', "[1, 2]"])
def test_an_earlier_results_json_of_another_shape_is_rebuilt_not_a_crash(tmp_path, text):
    """kills: experiments/outputs.py ``except (FileNotFoundError, ValueError, KeyError, TypeError)`` losing ``KeyError``
    and ``TypeError`` (a results.json without ``runs``, or with a row of unknown keys, stops write_outputs)"""
    from diffusionformer.experiments.outputs import _other_finished_rows

    (tmp_path / "results.json").write_text(text)
    assert _other_finished_rows(tmp_path, []) == []


@pytest.mark.parametrize("previous, current, commits", [
    ({"git_commit": "a", "git_commits": ["a", "b"]}, "a", ["a", "b"]),
    ({"git_commit": "b", "git_commits": ["a", "a", "b"]}, "c", ["a", "b", "c"]),
    ({"git_commit": "a", "git_commits": "xy"}, "b", ["a", "b"]),
    ({"git_commit": "a", "git_commits": []}, "b", ["b"]),
    (None, "a", ["a"]),
])
def test_merged_manifest_lists_each_commit_once_oldest_first(previous, current, commits):
    """kills: experiments/outputs.py merged_manifest ``c not in seen`` dropped for the current commit (a resume on the
    same commit lists it twice) or for the earlier ones, and ``earlier if isinstance(earlier, list) else [...]`` ->
    ``earlier or [...]`` (a ``git_commits`` string read letter by letter; an empty list taken as absent)"""
    from diffusionformer.experiments.outputs import merged_manifest

    out = merged_manifest(previous, {"git_commit": current, "x": 1})
    assert out == {"git_commit": current, "x": 1, "git_commits": commits}


def test_git_commit_is_the_head_with_dirty_only_for_changed_tracked_files(tmp_path):
    """kills: experiments/outputs.py git_commit losing ``--untracked-files=no`` (an untracked file, e.g. a results
    folder, marks the commit dirty), the ``returncode != 0`` test of ``rev-parse`` (a folder outside git gives ``""``)"""
    from diffusionformer.experiments.outputs import git_commit

    repo = tmp_path / "repo"

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                              capture_output=True, text=True).stdout.strip()

    outside = tmp_path / "outside"
    outside.mkdir()
    assert git_commit(outside) is None
    repo.mkdir()
    git("init", "-q")
    (repo / "f.txt").write_text("one\n")
    git("add", "f.txt")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    (repo / "untracked.txt").write_text("x\n")
    assert git_commit(repo) == head
    (repo / "f.txt").write_text("two\n")
    assert git_commit(repo) == head + "+dirty"


def test_the_manifest_records_the_command_with_the_programs_name(monkeypatch):
    """kills: experiments/outputs.py manifest ``"command"`` without the program's name (``Path(sys.argv[0]).name``)"""
    import sys

    from diffusionformer.experiments.outputs import manifest

    monkeypatch.setattr(sys, "argv", ["/opt/bin/diffusionformer-experiments", "run", "c.toml", "--set", "seeds=[0]"])
    monkeypatch.setattr("diffusionformer.experiments.outputs.git_commit", lambda path=None: "abc")
    m = manifest(load_experiment_config(_raw()))
    assert m["command"] == "diffusionformer-experiments run c.toml --set 'seeds=[0]'"
    assert m["git_commit"] == "abc" and m["config"]["name"] == "second" and m["config"]["seeds"] == [0]


def test_results_md_opens_with_the_name_the_description_and_the_seeds(tmp_path):
    """kills: experiments/outputs.py write_outputs dropping ``{config.description}`` or ``Seeds: {config.seeds}.`` from
    the head of results.md"""
    from diffusionformer.experiments.outputs import write_outputs

    cfg = load_experiment_config(_raw(description="Hand text.", seeds=[0, 1]))
    write_outputs(tmp_path, cfg, [])
    assert (tmp_path / "results.md").read_text().startswith(
        "# second\n\nHand text.\n\nSeeds: [0, 1]. Mean \u00b1 sample std over seeds.\n\n")


def test_bug_a_write_of_results_md_that_fails_half_way_keeps_the_old_table(tmp_path, monkeypatch):
    """Bug: write_outputs wrote results.md in place (``write_text``), so a run killed or a disk filled
    during the write left a truncated table. It now goes through a temporary file and ``os.replace``:
    a failure before the replace (here: ``fsync`` raising) leaves the previous results.md whole and
    no temporary file behind."""
    import os

    from diffusionformer.experiments.outputs import write_outputs

    old = "# the previous table\n"
    (tmp_path / "results.md").write_text(old)
    cfg = load_experiment_config(_raw(description="Hand text.", seeds=[0, 1]))

    real_fsync, synced = os.fsync, []

    def disk_full_after_results_json(fd):
        synced.append(fd)
        if len(synced) > 1:  # results.json is written (and synced) first, then results.md
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", disk_full_after_results_json)
    with pytest.raises(OSError, match="No space left"):
        write_outputs(tmp_path, cfg, [])
    assert len(synced) == 2 and (tmp_path / "results.md").read_text() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]  # no temporary left
    monkeypatch.undo()
    write_outputs(tmp_path, cfg, [])
    assert (tmp_path / "results.md").read_text().startswith("# second\n\nHand text.")


def test_bug_an_override_into_a_value_that_is_not_a_table_names_that_value():
    """Bug: an override that sets a key inside a string or a number (``name.x=1``,
    ``tasks.digits.train.max_steps.x=1``) said "cannot set a key inside a list", and one that goes deeper named the
    wrong key (``tasks.digits.name.x is not a table`` for ``tasks.digits.name``). Fixed in experiments/config.py
    apply_overrides: the message names the key whose value is not a table, and lists stay "inside a list"."""
    cases = {
        "name.x=1": "override 'name.x=1': name is not a table, got 'second'",
        "tasks.digits.train.max_steps.x=1": "override 'tasks.digits.train.max_steps.x=1': "
                                            "tasks.digits.train.max_steps is not a table, got 2",
        "tasks.digits.name.x.y=1": "override 'tasks.digits.name.x.y=1': tasks.digits.name is not a table, got 'digits'",
    }
    for override, message in cases.items():
        with pytest.raises(ValueError) as info:
            apply_overrides(_raw(), [override])
        assert str(info.value) == message


# ---------------------------------------------------------------------------- mutants judged equivalent
# experiments/validate.py ``accum != 1 and ... and not task.minibatch`` losing ``and not task.minibatch``: a task with a
#     ``minibatch`` table and ``grad_accum_steps != 1`` is refused when the TaskConfig is built (config.py
#     ``_check_minibatch``), so validate_experiment never sees one; the two conditions agree on every task it gets.
# experiments/build.py ``_check_data_overrides`` ``value >= sizes[key]`` -> ``value > sizes[key]`` for ``vocab_size``:
#     an equal vocabulary then fails the padded test but passes the ``_same`` test right after it; same outcome.
# experiments/outputs.py git_commit ``"+dirty" if dirty.returncode == 0 and dirty.stdout.strip()`` losing the
#     ``returncode == 0`` test: a ``git status`` that fails writes its error to stderr, not stdout, so stdout is empty
#     and no "+dirty" is added either way.
