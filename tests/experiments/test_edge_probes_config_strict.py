"""Edge probes of the strict experiment configs: a config is validated completely before anything trains.

Bugs found and fixed:

* ``validate_experiment(load_data=False)`` (what ``run`` checks before anything trains) did not check the types of a
  task's ``dataset_options`` (``normalize = "no"``, ``val_fraction = "0.1"``), known from the config alone: ``run``
  trained every run of the tasks before that task, then refused it when its data were loaded.
* ``data_seed`` had no range: ``2**64`` loaded, ``show`` without data passed, and ``run`` failed (after the earlier
  tasks trained) with torch's "Overflow when unpacking long long", not naming ``data_seed``.
* ``[tasks.train] device = "gpu"`` was answered "did you mean 'cpu'?" (``"CUDA:1"``: ``'cuda'``, ``"tpu"``: ``'cpu'``);
  ``TrainConfig`` now gives the package's device hint, as ``run --device`` and a config's ``device`` do.
* A config path that is a symbolic link loop, a dangling link or a FIFO was reported "not found"; it is now named
  for what it is (the FIFO is still not read: reading one could wait for ever).

Pins (no bug): every shipped config loads and validates; unknown keys at every nesting level get a "did you mean";
mistyped values are named with their key; a bad ``--set`` is refused before any data load or training; a setting
the models cannot build fails the whole config before anything trains.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments import runner as runner_mod
from diffusionformer.experiments.cli import main
from diffusionformer.experiments.validate import validate_experiment

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "experiments" / "configs").glob("*.toml"))

TWO_TASKS = """
name = "strict"
seeds = [0]

[[tasks]]
name = "first"
dataset = "digits"
model = "vit-digits"
model_overrides = { dim = 16, depth = 1, num_heads = 2, mlp_ratio = 1.0 }
[tasks.train]
max_steps = 2
batch_size = 8

[[tasks]]
name = "second"
dataset = "digits"
model = "vit-digits"
model_overrides = { dim = 16, depth = 1, num_heads = 2, mlp_ratio = 1.0 }
{second}
[tasks.train]
max_steps = 2
batch_size = 8

[[operators]]
name = "attention"

[[operators]]
name = "laplacian-half"
laplacian_heads = "half"
"""


def _write(tmp_path, second=""):
    path = tmp_path / "strict.toml"
    path.write_text(TWO_TASKS.replace("{second}", second), encoding="utf-8")
    return path


@pytest.fixture
def nothing_trains(monkeypatch):
    """The runs started (a run that starts fails the test)."""
    calls = []

    def no_run(*args, **kwargs):
        calls.append("run")
        raise AssertionError("a run started")

    monkeypatch.setattr(runner_mod, "_one_run", no_run)
    return calls


def _no_data_loads(monkeypatch):
    import diffusionformer.experiments.build as build

    def no_load(*args, **kwargs):
        raise AssertionError("a dataset was loaded")

    monkeypatch.setattr(build, "load_dataset", no_load)


# ---------------------------------------------------------------------------------------------------------- bugs
@pytest.mark.parametrize("option, message", [
    ('normalize = "no"', r"option 'normalize' must be a bool \(default True\), got str 'no'"),
    ('val_fraction = "0.1"', r"option 'val_fraction' must be a number \(default 0.1\), got str '0.1'"),
    ("val_fraction = true", r"option 'val_fraction' must be a number .*got bool True"),
])
def test_bug_a_mistyped_dataset_option_of_a_later_task_stops_run_before_anything_trains(
        tmp_path, capsys, monkeypatch, nothing_trains, option, message):
    """Bug: the check ``run`` makes before anything trains (no data loaded) passed a mistyped dataset option of the
    second task; the first task's runs all trained, then the second was refused when its data loaded."""
    path = _write(tmp_path, f"dataset_options = {{ {option} }}")
    code = main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and nothing_trains == [], err
    assert "nothing was trained" in err and "task 'second'" in err
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()
    # the check without data names it without loading anything
    _no_data_loads(monkeypatch)
    problems = validate_experiment(load_experiment_config(path), load_data=False)
    assert len(problems) == 1 and problems[0].startswith("task 'second': load_dataset('digits'): option"), problems


@pytest.mark.parametrize("seed", [2**64, 2**70, -1, 1.0, "0", True])
def test_bug_a_data_seed_out_of_range_is_refused_when_the_config_loads(tmp_path, seed):
    """Bug: ``data_seed = 18446744073709551616`` loaded and passed ``show`` without data; ``run`` then failed when that
    task's data loaded, after the tasks before it trained, with "Overflow when unpacking long long" (no key named).
    (A negative seed is refused too: torch reads -1 as 2**64 - 1, the same split.)"""
    data = load_experiment_config(_write(tmp_path)).to_dict()
    data["tasks"][1]["data_seed"] = seed
    with pytest.raises((ValueError, TypeError), match=r"data_seed"):
        load_experiment_config(data)


def test_a_data_seed_at_the_top_of_its_range_or_a_numpy_int_loads(tmp_path):
    data = load_experiment_config(_write(tmp_path)).to_dict()
    data["tasks"][1]["data_seed"] = 2**64 - 1
    assert load_experiment_config(data).tasks[1].data_seed == 2**64 - 1
    cfg = load_experiment_config(_write(tmp_path))
    task = type(cfg.tasks[0])(name="t", dataset="digits", model="vit-digits", data_seed=np.int64(3))
    assert type(task.data_seed) is int and task.data_seed == 3


@pytest.mark.parametrize("device, meant", [("gpu", "'cuda'"), ("GPU", "'cuda'"), ("CUDA:1", "'cuda:1'"),
                                           ("gpu:1", "'cuda:1'"), ("Cpu", "'cpu'"), ("cdua", "'cuda'")])
def test_bug_a_misspelt_train_device_gets_the_device_meant(tmp_path, device, meant):
    """Bug: ``[tasks.train] device = "gpu"`` was answered "(did you mean 'cpu'?)" and ``"CUDA:1"`` "(did you mean
    'cuda'?)" (the index dropped), where a config's ``device`` and ``run --device`` say 'cuda' and 'cuda:1'."""
    with pytest.raises(ValueError, match=rf"TrainConfig\.device: .*got {device!r} \(did you mean {meant}\?\)$"):
        load_experiment_config(_write(tmp_path), [f"tasks.first.train.device={device}"])


@pytest.mark.parametrize("device", ["tpu", "xyzzy"])
def test_a_train_device_close_to_none_gets_no_hint(tmp_path, device):
    """``tpu`` is not a misspelt ``cpu`` (was: "did you mean 'cpu'?")."""
    with pytest.raises(ValueError, match=rf"got {device!r}$"):
        load_experiment_config(_write(tmp_path), [f"tasks.first.train.device={device}"])


@pytest.mark.parametrize("kind", ["loop", "pair", "dangling", "fifo"])
def test_bug_a_config_path_that_is_a_link_loop_or_a_fifo_is_named_for_what_it_is(tmp_path, capsys, kind):
    """Bug: ``show loop.toml`` (a symbolic link to itself), a link to a missing file and a FIFO were all "not found",
    though ``ls`` lists them; now the link and its target, or "not a regular file", are named (exit 2, one line)."""
    path = tmp_path / "c.toml"
    if kind == "loop":
        path.symlink_to("c.toml")
    elif kind == "pair":
        path.symlink_to("d.toml")
        (tmp_path / "d.toml").symlink_to("c.toml")
    elif kind == "dangling":
        path.symlink_to(tmp_path / "missing.toml")
    else:
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs here")
        os.mkfifo(path)
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not found" not in err, err
    assert ("not a regular file" if kind == "fifo" else "symbolic link that leads to no file") in err
    if kind == "dangling":
        assert str(tmp_path / "missing.toml") in err
    with pytest.raises(FileNotFoundError):
        load_experiment_config(path)


# ---------------------------------------------------------------------------------------------------------- pins
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_loads_and_validates_without_data(path):
    """Pins: every config of experiments/configs/ loads, and every run resolves from the presets' sizes (``show``
    with the data root was run by hand too: no problems). Long setting lists are cut to four settings to stay fast."""
    cfg = load_experiment_config(path)
    if len(cfg.operators) > 4:
        cfg = load_experiment_config(path, ["operators=" + ",".join(o.name for o in cfg.operators[:4])])
    assert validate_experiment(cfg, load_data=False, missing_data_ok=True) == []


@pytest.mark.parametrize("override, hint", [
    ("seed=[0]", "'seeds'"),
    ("tasks.first.metrc=test_acc", "'metric'"),
    ("operators.laplacian-half.laplacian_head=1", "'laplacian_heads'"),
    ("tasks.first.train.max_step=3", "'max_steps'"),
    ("tasks.first.minibatch.batchsize=3", "'batch_size'"),
    ("tasks.first.augment.flp=true", "'flip'"),
])
def test_an_unknown_key_at_every_level_gets_did_you_mean_before_anything_loads(tmp_path, monkeypatch, override, hint):
    _no_data_loads(monkeypatch)
    with pytest.raises(ValueError, match=rf"unknown .*{override.split('=')[0].split('.')[-1]}.*did you mean {hint}"):
        load_experiment_config(_write(tmp_path), [override])


@pytest.mark.parametrize("where, bad, hint", [
    ("tasks.second.model_overrides.dimm=16", "unknown key 'dimm'", "'dim'"),
    ("operators.laplacian-half.model_overrides.dept=1", "unknown key 'dept'", "'depth'"),
    ("tasks.second.dataset_options.normalise=false", "no option(s) ['normalise']", "'normalize'"),
    ("operators.attention.heads=attention:1,lapacian:1", "unknown operator 'lapacian'", "'laplacian'"),
])
def test_an_unknown_model_key_option_or_operator_stops_the_whole_config_before_anything_trains(
        tmp_path, capsys, nothing_trains, where, bad, hint):
    """Pins: names checked only by building the models (overrides, dataset options, head specs) are checked for
    every task and setting before the first run, not when the second task comes up."""
    code = main(["run", str(_write(tmp_path)), "--set", where, "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and nothing_trains == [] and "nothing was trained" in err, err
    assert bad in err and f"did you mean {hint}" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("override, message", [
    ("tasks.first.train.max_steps=\"3\"", r"max_steps: expected int, got str \('3'\)"),
    ("tasks.first.train.max_steps=3.0", r"max_steps: expected int, got float \(3.0\)"),
    ("tasks.first.train.max_steps=true", r"max_steps: expected int, got bool \(True\)"),
    ("tasks.first.train.max_steps=[3]", r"max_steps: expected int, got list \(\[3\]\)"),
    ("tasks.first.train.max_steps=2020-01-01", r"max_steps: expected int, got datetime.date"),
    ("tasks.first.eval_batch_size=1979-05-27T07:32:00", r"eval_batch_size: expected int \\| None, got datetime.datetime"),
    ("seeds=3", r"seeds: expected a list, got int 3"),
    ("seeds=[0, 0]", r"duplicate seeds: \[0, 0\]"),
    ("seeds=[true]", r"seeds\[0\]: expected an int, got bool True"),
    ("primary=[\"laplacian-hlf\"]", r"unknown operator setting 'laplacian-hlf' \(did you mean 'laplacian-half'\?\)"),
    ("tasks.second.name=first", r"duplicate task names: \['first'\]"),
    ("operators.attention.name=laplacian-half", r"duplicate operator setting names"),
    ("operators.laplacian-half.laplacian_heads=Half", r"laplacian_heads must be an int, a list or 'half'"),
    ("tasks.0.train.lr=1e-3", r"no entry named '0' in tasks"),
    ("tasks.firts.train.lr=1e-3", r"no entry named 'firts'.*did you mean 'first'"),
    ("seeds.0=1", r"cannot set a key inside a list"),
    ("tasks=frist", r"no tasks named \['frist'\].*did you mean 'first'"),
])
def test_a_bad_set_is_refused_naming_the_key_before_data_loads_or_runs(tmp_path, capsys, monkeypatch, nothing_trains,
                                                                       override, message):
    _no_data_loads(monkeypatch)
    for command in ("run", "show", "status"):
        argv = [command, str(_write(tmp_path)), "--set", override]
        code = main(argv + (["--out", str(tmp_path / "out"), "--no-progress"] if command == "run" else []))
        err = capsys.readouterr().err
        assert code == 2 and re.search(message, err), (command, err)
    assert nothing_trains == [] and not (tmp_path / "out").exists()


def test_a_key_set_twice_takes_the_last_value_and_a_value_may_hold_equals_and_commas(tmp_path):
    """Pins: ``--set`` applies in order (the last of two wins, as a shell's last flag); a bare value keeps ``=`` and
    ``,`` (a head spec), a TOML value is read as TOML."""
    cfg = load_experiment_config(_write(tmp_path), [
        "tasks.first.train.lr=1e-3", "tasks.first.train.lr=2e-3", "description=a=b, c",
        "operators.attention.heads=attention:1,laplacian:1"])
    assert cfg.tasks[0].train["lr"] == 2e-3 and cfg.description == "a=b, c"
    assert cfg.operators[0].heads == "attention:1,laplacian:1"


def test_a_toml_datetime_in_a_config_file_names_its_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(TWO_TASKS.replace("{second}", "data_seed = 1979-05-27"), encoding="utf-8")
    with pytest.raises(TypeError, match=r"c.toml.tasks\[1\].data_seed: expected an int, got datetime.date"):
        load_experiment_config(path)
