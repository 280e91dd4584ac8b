"""Edge probes of experiment config loading and ``--set`` overrides (third pass).

Bugs found and fixed:

* ``--set tasks=NAME`` / ``operators=NAME`` kept entries by ``str()`` of the TOML value: a name that reads as a TOML
  number, bool or date (``"0.50"``, ``"true"``, ``"1_000"``, ``"2e3"``) was looked up as ``"0.5"``, ``"True"``,
  ``"1000"``, ``"2000.0"`` and refused as unknown.
* ``--set operators=...`` that dropped the baseline (the first setting, as the tutorial's second GPU call does) kept
  the primary contrasts of the remaining settings: they were then tested, and published as "named in the config
  before the runs", against the new first setting, a contrast nobody named.
* Task (or setting) names that differ only in Unicode normalization (composed ``"é"`` and ``"e"`` + combining
  accent) passed the case check, yet are one run folder on macOS, whose file systems ignore normalization.

Pins (no bug): quoted TOML keys address names holding dots or ``=``; values parse as :mod:`tomllib` parses them;
the last of two overrides of a key wins; floats, dates and bools are refused where an int is required.
"""

from __future__ import annotations

import sys

import pytest

from diffusionformer.experiments.config import load_experiment_config, parse_override

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _config(tasks=("a", "b"), operators=("attention", "lap", "lap-2"), primary=()):
    return {
        "name": "third", "seeds": [0],
        "tasks": [{"name": n, "dataset": "digits", "model": "vit-digits"} for n in tasks],
        "operators": [{"name": o} if i == 0 else {"name": o, "laplacian_heads": 1} for i, o in enumerate(operators)],
        "primary": list(primary),
    }


@pytest.mark.parametrize("name", ["0.50", "true", "1_000", "2e3", "+1", "1979-05-27"])
def test_bug_keeping_a_task_or_setting_whose_name_reads_as_a_toml_value(name):
    """Bug: ``tasks=0.50`` looked for a task named ``'0.5'`` (``str`` of the TOML float), ``tasks=true`` for
    ``'True'``: a name that reads as a TOML number or bool could not be kept by ``--set tasks=``/``operators=``."""
    cfg = load_experiment_config(_config(tasks=(name, "b")), [f"tasks={name}"])
    assert [t.name for t in cfg.tasks] == [name]
    cfg = load_experiment_config(_config(operators=("attention", name)), [f"operators=attention,{name}"])
    assert [o.name for o in cfg.operators] == ["attention", name]
    cfg = load_experiment_config(_config(tasks=(name, "b")), [f'tasks=["{name}"]'])  # a TOML list as it is
    assert [t.name for t in cfg.tasks] == [name]


def test_bug_primary_contrasts_are_dropped_with_the_baseline():
    """Bug: ``operators=lap,lap-2`` (the baseline ``attention`` dropped) kept ``primary = ["lap-2"]``: the contrast
    named was lap-2 against attention, and it became lap-2 against lap, reported as named before the runs."""
    data = _config(primary=["lap-2", "a:lap-2"])
    cfg = load_experiment_config(data, ["operators=lap,lap-2"])
    assert [o.name for o in cfg.operators] == ["lap", "lap-2"] and cfg.primary == []
    assert cfg.primary_contrasts() == set()
    # the baseline kept: the contrasts of the settings kept stay primary, in any order of the names given
    cfg = load_experiment_config(_config(primary=["lap", "a:lap-2"]), ["operators=lap-2,attention"])
    assert cfg.primary == ["a:lap-2"]
    cfg = load_experiment_config(_config(primary=["lap", "a:lap-2"]), ["tasks=b"])
    assert cfg.primary == ["lap"]
    # primary set again after the filter: what the command line names is taken (the user's own contrast)
    cfg = load_experiment_config(data, ["operators=lap,lap-2", 'primary=["lap-2"]'])
    assert cfg.primary == ["lap-2"]


@pytest.mark.parametrize("which", ["tasks", "operators"])
def test_bug_names_differing_only_in_unicode_normalization_are_refused(which):
    """Bug: ``"caf\\u00e9"`` and ``"cafe\\u0301"`` (the same name, composed and decomposed) passed as two tasks (or
    settings); on macOS they are one run folder, so the second's runs would resume or overwrite the first's."""
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    data = _config(tasks=(composed, decomposed)) if which == "tasks" else \
        _config(operators=("attention", composed, decomposed))
    with pytest.raises(ValueError, match="Unicode normalization") as err:
        load_experiment_config(data)
    assert repr(composed) in str(err.value) and repr(decomposed) in str(err.value)
    ok = _config(tasks=(composed, "cafe")) if which == "tasks" else _config(operators=("attention", composed, "cafe"))
    load_experiment_config(ok)  # an accent of its own is another name


@pytest.mark.parametrize("raw", ["1e3", "1000.0", "0x10", "-0.0", "+inf", "nan", "1e400", "2024-01-01",
                                 "2024-01-01T00:00:00", "true", "[1, 2]", "{}", "[]", "'lit\\'", '"a" # c',
                                 "99999999999999999999999"])
def test_override_values_parse_as_tomllib_parses_them(raw):
    """Pin: the value of ``--set`` is what tomllib reads from ``v = <value>`` (same type and value)."""
    path, value = parse_override(f"tasks.a.train.x={raw}")
    want = tomllib.loads(f"v = {raw}")["v"]
    assert path == ["tasks", "a", "train", "x"] and type(value) is type(want)
    assert value == want or (value != value and want != want)  # nan


def test_quoted_keys_address_names_with_dots_and_equals_and_the_last_override_wins():
    """Pin: ``tasks."a.b"`` and ``tasks.'a=b'`` address those tasks; a key set twice takes the second value."""
    data = _config(tasks=("a.b", "a=b"))
    cfg = load_experiment_config(data, ['tasks."a.b".train.max_steps=7', "tasks.'a=b'.train.max_steps=8",
                                        'tasks."a.b".train.max_steps=9'])
    assert [t.train for t in cfg.tasks] == [{"max_steps": 9}, {"max_steps": 8}]


@pytest.mark.parametrize("raw, kind", [("1e3", TypeError), ("1000.0", TypeError), ("2024-01-01", TypeError),
                                       ("true", TypeError), ("0", ValueError)])
def test_an_int_field_refuses_floats_dates_and_bools(raw, kind):
    """Pin: ``max_steps=1e3`` is a float to TOML and refused, naming the task and the key."""
    with pytest.raises(kind, match=r"task 'a' train: .*max_steps"):
        load_experiment_config(_config(), [f"tasks.a.train.max_steps={raw}"])
