"""Review probes of the day's changes: ``--import``'s undo of a module that failed halfway (operator classes' names),
the ``run`` hint of the ``status`` command with its ``--import`` modules, and the advice's ``--set`` for a task name
holding a quote or a character past U+FFFF, read back by ``load_experiment_config``."""

from __future__ import annotations

import shlex

import pytest

from diffusionformer.experiments.cli import main
from diffusionformer.experiments.config import load_experiment_config, parse_override
from diffusionformer.experiments.results import _Change, _set_of
from diffusionformer.operators import build_operator, operator_class
from diffusionformer.operators import registry as operator_registry
from diffusionformer.operators.heat import HeatOperator


def _config(task: str) -> dict:
    return {"name": "c", "tasks": [{"name": task, "dataset": "digits", "model": "vit-digits"}],
            "operators": [{"name": "attention"}]}


def test_import_failing_after_renaming_a_library_operator_gives_it_its_name_back(tmp_path, capsys):
    """Bug: a ``--import`` module that unregistered ``heat`` and registered its class again as ``heat2`` (alias
    ``hx``), then failed, had the registries put back (``heat`` resolved again) but not the class's ``name`` and
    ``aliases``, which registering had written: ``HeatOperator.name`` stayed ``"heat2"``, so every heat operator's
    spec named an operator that no longer exists, and unregistering ``heat`` later left its aliases behind."""
    mod = tmp_path / "p51r_renames_heat.py"
    mod.write_text("from diffusionformer.operators import register_operator, unregister_operator\n"
                   "from diffusionformer.operators.heat import HeatOperator\n"
                   "unregister_operator('heat')\n"
                   "register_operator(HeatOperator, name='heat2', aliases=('hx',))\n"
                   "raise RuntimeError('halfway')\n")
    names = operator_registry._own_names(HeatOperator)
    saved = [(d, dict(d)) for d in (operator_registry._REGISTRY, operator_registry._ALIASES,
                                    operator_registry._DECLARED)]
    try:
        assert main(["list", "--import", str(mod)]) != 0
        assert "halfway" in capsys.readouterr().err
        assert (HeatOperator.name, HeatOperator.aliases) == (names["name"], names["aliases"])
        assert build_operator("heat").spec().startswith("heat(")
        assert operator_class("heat-kernel") is HeatOperator
        with pytest.raises(ValueError, match="unknown operator"):
            operator_class("hx")
    finally:  # whatever the outcome, the next tests meet the library's heat operator
        for d, before in saved:
            d.clear()
            d.update(before)
        operator_registry._put_names(HeatOperator, names)


def test_run_hint_of_status_names_the_import_modules(tmp_path, capsys, monkeypatch):
    """Bug: ``run CONFIG --import mod.py`` printed "from another shell: ... status CONFIG" without the ``--import``
    modules (its ``--set`` overrides and ``--out`` were there): the command it gave could not read a config naming a
    dataset or model preset that the module registers."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p51r_hint_mod.py").write_text("X = 1\n")
    (tmp_path / "c.toml").write_text('name = "c"\n[[tasks]]\nname = "digits"\ndataset = "digits"\n'
                                     'model = "vit-digits"\n[[operators]]\nname = "attention"\n')
    # an unknown --device: refused after the hint is printed, before any data is loaded
    code = main(["run", "c.toml", "--import", "p51r_hint_mod.py", "--set", "seeds=[3]", "--out", "res",
                 "--device", "tpu", "--threads", "1"])
    err = capsys.readouterr().err
    assert code != 0
    assert "status c.toml --import p51r_hint_mod.py --set 'seeds=[3]' --out res" in err


@pytest.mark.parametrize("task", ['q"x', "it's", "x\U0001F600", "csbm-h0.1", "caf\u00e9"])
def test_advice_set_of_a_task_name_reads_back(task):
    """Bug: the advice's ``--set`` for a task name holding a ``"`` (``tasks."q\\"x".data_seed=0``) was refused by
    ``--set`` ("a quote in its key is not closed": the key's scan ended its quoted part at the escaped quote), and
    for a name with a character past U+FFFF (an emoji) it was written with two ``\\u`` surrogate escapes, which TOML
    refuses ("not a key path"): the command the advice gave failed to read the config."""
    for part, old in (("data_seed", 0), ("dataset_options", {"k.e y": "v\"'", "n": [1, 2.5]})):
        argv = shlex.split(_set_of(task, _Change(part, old, 1)))
        assert argv[0] == "--set"
        assert parse_override(argv[1]) == (["tasks", task, part], old)
        config = load_experiment_config(_config(task), [argv[1]])
        assert getattr(config.tasks[0], part) == old


def test_set_with_an_escaped_quote_in_a_key_part():
    """Bug: ``--set 'tasks."a\\"b".lr=0.1'``, a valid TOML dotted key whose quoted part holds an escaped quote, was
    refused ("a quote in its key is not closed"); a backslash of a literal ('...') part escapes nothing."""
    assert parse_override('tasks."a\\"b".train.lr=0.1') == (["tasks", 'a"b', "train", "lr"], 0.1)
    assert parse_override("tasks.'a\\b'.train.lr=0.1") == (["tasks", "a\\b", "train", "lr"], 0.1)
    assert parse_override('tasks."a=\\\\".x=1') == (["tasks", "a=\\", "x"], 1)
