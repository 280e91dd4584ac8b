"""Edge-case probes of configs and stored results: ``diffusionformer.config`` (typed dataclass configs),
``experiments.config`` (TOML files, ``--set`` overrides), ``experiments.store`` (run locks) and
``experiments.results`` (summary.json / metrics.jsonl read back).

Probed: numpy numbers, NaN, huge ints, Optional/Union/Literal/tuple fields, nested dataclasses, JSON round trips;
duplicate, path-like and unicode names, seeds with duplicates/negatives/bools; overrides that are not a list of
strings; TOML nested thousands deep; locks of dead, impossible or junk holders and two processes racing for one;
summaries and logs holding NaN, strings, bools or ints of hundreds of digits where numbers belong.

Found and fixed (tests whose docstring starts with "Bug:"):

- ``config.check_value``: an int too large for a float raised a bare ``OverflowError`` naming no key; an
  ``Optional[int]`` field said "expected Optional"; ``config_from_dict`` given an instance raised AttributeError.
- ``experiments.config``: TOML nested thousands deep raised RecursionError; overrides given as one string were
  read character by character ("override 's' must look like ..."), a non-string one raised "not iterable".
- ``experiments.store``: a lock whose pid is beyond pid_t or ``Infinity`` raised OverflowError (in ``run``,
  ``status``); a pid ``true``/``12.7`` or a ``null`` host was read as process 1 / 12 / a host named "None",
  so the run counted as held for ever.
- ``experiments.results``: a summary.json with ``elapsed``/``num_parameters`` that are not numbers crashed the
  results table and ``status``; a logged metric that is an int of 400 digits crashed ``select_by``/``reach``.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from typing import Literal, Optional

import numpy as np
import pytest

from diffusionformer.config import ConfigErrors, config_from_dict, config_to_dict
from diffusionformer.experiments import store
from diffusionformer.experiments.config import load_experiment_config
from diffusionformer.experiments.results import (_NEW_MODEL_FIELDS, _NEW_TRAIN_FIELDS, _without_new_defaults,
                                                 finished_runs, first_reach, run_dir, run_status, select_evaluation)
from diffusionformer.experiments.tables import aggregate, format_status, format_table
from experiments_tiny_configs import write_lock


@dataclass
class _Inner:
    a: int = 1
    scale: float = 1.0


@dataclass
class _Cfg:
    x: float = 0.0
    n: int = 0
    mode: Literal["a", "b"] = "a"
    opt: Optional[int] = None
    pair: tuple[int, float] = (1, 2.0)
    many: tuple[int, ...] = ()
    inner: _Inner = field(default_factory=_Inner)
    table: dict[str, int] = field(default_factory=dict)


def _experiment(**kw):
    return {"name": "x", "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits"}],
            "operators": [{"name": "attention"}], "seeds": [0], **kw}


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid




# --- diffusionformer.config ------------------------------------------------------------------------------------


def test_huge_int_for_a_float_field_is_named():
    """Bug: ``label_smoothing = 1000...0`` (400 digits; TOML ints have no size limit) raised a bare
    ``OverflowError: int too large to convert to float`` naming neither the key nor the file, and
    escaped the collection of a config's problems."""
    with pytest.raises(ValueError, match=r"_Cfg\.x: expected a float, got an int of \d+ bits"):
        config_from_dict(_Cfg, {"x": 10**400})
    with pytest.raises(ConfigErrors, match=r"(?s)_Cfg\.x: .*too large.*_Cfg\.n: expected an int"):
        config_from_dict(_Cfg, {"x": 10**400, "n": "3"})  # collected with the others
    with pytest.raises(ValueError, match=r"tasks\[0\]\.label_smoothing: expected a float, got an int of"):
        load_experiment_config(_experiment(tasks=[{"name": "d", "dataset": "digits", "model": "vit-digits",
                                                   "label_smoothing": 10**400}]))


def test_optional_field_error_names_its_types():
    """Bug: a bool for an ``Optional[int]`` field said "expected Optional, got bool True" (which types?)."""
    with pytest.raises(TypeError, match=r"_Cfg\.opt: expected int \| None, got bool True"):
        config_from_dict(_Cfg, {"opt": True})


def test_config_from_dict_refuses_an_instance():
    """Bug: ``config_from_dict(cfg_instance, {...})`` (an instance is a dataclass to ``is_dataclass``)
    raised ``AttributeError: '_Cfg' object has no attribute '__name__'``."""
    with pytest.raises(TypeError, match="cls must be a dataclass type"):
        config_from_dict(_Cfg(), {})


def test_config_round_trip_through_json_pins():
    """Pins: numpy numbers read as the Python numbers they equal; a nested dataclass and tuples survive
    ``config_to_dict`` -> JSON -> ``config_from_dict``; NaN stays NaN; a typo gets a did-you-mean."""
    cfg = config_from_dict(_Cfg, {"x": np.float32(0.5), "n": np.int64(3), "pair": [np.int64(2), 7],
                                  "inner": {"a": 4}, "table": {"k": 1}})
    assert cfg == _Cfg(x=0.5, n=3, pair=(2, 7.0), inner=_Inner(a=4), table={"k": 1})
    assert type(cfg.x) is float and type(cfg.n) is int and type(cfg.pair[1]) is float
    expected = {"x": 0.5, "n": 3, "mode": "a", "opt": None, "pair": [2, 7.0], "many": [],
                "inner": {"a": 4, "scale": 1.0}, "table": {"k": 1}}
    assert json.loads(json.dumps(config_to_dict(cfg))) == expected
    assert config_from_dict(_Cfg, json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    assert math.isnan(config_from_dict(_Cfg, {"x": float("nan")}).x)
    with pytest.raises(ValueError, match=r"_Cfg\.inner: unknown key 'scal'; .*did you mean 'scale'"):
        config_from_dict(_Cfg, {"inner": {"scal": 2.0}})


# --- experiments.config ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["x = " + "[" * 5000 + "]" * 5000, "x = " + "{a=" * 3000 + "1" + "}" * 3000,
                                  "[" + ".".join(["a"] * 3000) + "]\n"])
def test_toml_nested_thousands_deep_is_a_value_error(tmp_path, text):
    """Bug: a TOML file nested thousands deep (arrays, inline tables or a dotted header) ended in
    ``RecursionError: maximum recursion depth exceeded``, not the ValueError of any other bad config."""
    path = tmp_path / "deep.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match="nested too deeply"):
        load_experiment_config(path)


def test_overrides_must_be_a_list_of_strings():
    """Bug: ``load_experiment_config(cfg, "seeds=[1]")`` read the string a character at a time and said
    "override 's' must look like key.path=value"; ``[3]`` raised "argument of type 'int' is not iterable"."""
    for bad in ("seeds=[1]", [3], ["seeds=[1]", None]):
        with pytest.raises(TypeError, match="overrides must be a list of 'key.path=value' strings"):
            load_experiment_config(_experiment(), bad)
    assert load_experiment_config(_experiment(), ["seeds=[4, 5]"]).seeds == [4, 5]


def test_experiment_names_and_seeds_pins():
    """Pins: path-like, empty and whitespace names, duplicate names and seeds, and bool seeds are refused;
    a unicode name is kept as it is."""
    for name in ("../x", "a/b", "", "..", "a\u00a0b"):
        with pytest.raises(ValueError, match="names a results folder"):
            load_experiment_config({**_experiment(), "name": name})
    assert load_experiment_config({**_experiment(), "name": "études"}).name == "études"
    with pytest.raises(ValueError, match=r"duplicate operator setting names: \['a'\]"):
        load_experiment_config(_experiment(operators=[{"name": "a"}, {"name": "a"}]))
    with pytest.raises(ValueError, match=r"duplicate seeds: \[0, 0\]"):
        load_experiment_config(_experiment(seeds=[0, 0]))
    with pytest.raises(TypeError, match=r"seeds\[0\]: expected an int, got bool True"):
        load_experiment_config(_experiment(seeds=[True]))


def test_run_identity_drops_new_fields_at_their_defaults_pins():
    """Pins: a run identity leaves out fields added later only when they hold their (hand-listed) defaults."""
    model = {"rope": False, "rope_base": 10000.0, "pe_dim": 8, "n_kv_head": 2, "depth": 4, "pe": "lap"}
    assert _without_new_defaults(model, _NEW_MODEL_FIELDS) == {"n_kv_head": 2, "depth": 4, "pe": "lap"}
    assert _without_new_defaults({"rope_base": 500.0}, _NEW_MODEL_FIELDS) == {"rope_base": 500.0}
    train = {"lr": 0.1, "grad_accum_steps": 1, "loggers": ["jsonl"], "weight_decay_rule": "default"}
    assert _without_new_defaults(train, _NEW_TRAIN_FIELDS) == {"lr": 0.1}
    assert _without_new_defaults({"loggers": ["jsonl", "csv"]}, _NEW_TRAIN_FIELDS) == {"loggers": ["jsonl", "csv"]}


# --- experiments.store -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("pid", [str(2**80), "Infinity"])
def test_lock_of_an_impossible_pid_is_stale(tmp_path, pid):
    """Bug: a lock naming a pid beyond pid_t (or ``Infinity``) raised ``OverflowError`` from
    ``live_holder``/``read_lock``/``acquire_lock``, so ``run`` and ``status`` crashed on that run."""
    rdir = tmp_path / "run"
    write_lock(rdir, '{"pid": %s, "host": "%s"}' % (pid, platform.node()), age=2 * store.UNREADABLE_GRACE_S)
    assert store.live_holder(rdir) is None
    assert store.acquire_lock(rdir) is None
    assert store.read_lock(rdir) == (os.getpid(), platform.node())


@pytest.mark.parametrize("payload", ['{"pid": true, "host": "%s"}', '{"pid": 1.5, "host": "%s"}',
                                     '{"pid": "1", "host": "%s"}', '{"pid": 1, "host": null}'])
def test_lock_with_a_mistyped_holder_is_junk_not_held_for_ever(tmp_path, payload):
    """Bug: a lock ``{"pid": true}`` (or ``1.5``, ``"1"``) was read as process 1, which always runs, and one with
    a ``null`` host as a process on a host named "None": the run counted as held for ever. Such a lock is now junk,
    held only for the grace period like an empty one."""
    rdir = tmp_path / "run"
    text = payload % platform.node() if "%s" in payload else payload
    write_lock(rdir, text)
    assert store.read_lock(rdir) is None
    assert store.live_holder(rdir) == (-1, "")  # young: perhaps still being written
    write_lock(rdir, text, age=2 * store.UNREADABLE_GRACE_S)
    assert store.live_holder(rdir) is None
    assert store.acquire_lock(rdir) is None


def test_locks_of_dead_live_and_remote_holders_pins(tmp_path):
    """Pins: a dead pid's lock is taken over, a remote host's and a live process's are held, acquire and
    release are idempotent and leave no temporary files."""
    dead = tmp_path / "dead"
    write_lock(dead, json.dumps({"pid": _dead_pid(), "host": platform.node()}))
    assert store.live_holder(dead) is None and store.acquire_lock(dead) is None
    remote = tmp_path / "remote"
    write_lock(remote, json.dumps({"pid": _dead_pid(), "host": "elsewhere"}))
    assert store.acquire_lock(remote).endswith("on elsewhere")
    live = tmp_path / "live"
    write_lock(live, json.dumps({"pid": 1, "host": platform.node()}))
    assert store.acquire_lock(live) == f"process 1 on {platform.node()}"
    mine = tmp_path / "mine"
    assert [store.acquire_lock(mine) for _ in range(3)] == [None] * 3
    store.release_lock(mine)
    store.release_lock(mine)
    assert sorted(os.listdir(mine)) == [] and sorted(os.listdir(dead)) == [store.LOCK_NAME]


def _race(rdir, barrier, queue):
    barrier.wait()
    queue.put((os.getpid(), store.acquire_lock(rdir)))
    barrier.wait()  # the winner stays alive until every claimant has tried


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_processes_racing_for_a_stale_lock_pins(tmp_path):
    """Pins: of four processes that claim one run with a dead holder's lock at once, exactly one wins."""
    rdir = tmp_path / "run"
    write_lock(rdir, json.dumps({"pid": _dead_pid(), "host": platform.node()}))
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(rdir, barrier, queue)) for _ in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a process with threads (torch)
        for p in procs:
            p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    winners = [pid for pid, held in results if held is None]
    assert len(winners) == 1
    # a loser names a holder: the winner, or the dead one when it lost while the winner was taking over
    assert all(isinstance(held, str) and held.startswith("process ") for _, held in results if held is not None)
    assert store.read_lock(rdir) == (winners[0], platform.node())


# --- experiments.results ---------------------------------------------------------------------------------------


def _run_files(root, **files):
    rdir = run_dir(root / "x", "d", "attention", 0)
    rdir.mkdir(parents=True)
    for name, text in files.items():
        (rdir / name).write_text(text)
    return rdir


def test_summary_with_mistyped_elapsed_or_parameters_is_read(tmp_path):
    """Bug: a summary.json with ``"elapsed": "long"`` or ``"num_parameters": 1.5`` was passed on as it was: the
    results table raised ``TypeError: must be real number, not str`` and ``status`` divided a string. Such values
    are now left out (None) with a warning naming the file."""
    cfg = load_experiment_config(_experiment())
    summary = {"status": "completed", "step": "ten", "elapsed": "long", "num_parameters": 1.5,
               "eval": {"split": "eval", "step": 10, "metrics": {"test_acc": 0.5}}}
    _run_files(tmp_path, **{"summary.json": json.dumps(summary)})
    with pytest.warns(UserWarning) as caught:
        runs = finished_runs(tmp_path / "x", cfg)
    assert sorted(str(w.message).split(": ", 1)[1] for w in caught) == [
        "elapsed must be a finite number >= 0, got 'long'; it is left out of the tables",
        "num_parameters must be an int >= 0, got 1.5; it is left out of the tables"]
    assert (runs[0].value, runs[0].num_parameters, runs[0].elapsed) == (0.5, None, None)
    assert "| attention | 0.5000 ± n/a | 1 | n/a | n/a |" in format_table(aggregate(runs), cfg)
    with pytest.warns(UserWarning, match="elapsed must be a finite number"):
        rows = run_status(cfg, tmp_path)
    assert (rows[0]["state"], rows[0]["step"], rows[0]["elapsed"]) == ("completed", 1000, None)
    format_status(rows)


def test_huge_int_metric_in_the_log_is_not_finite(tmp_path):
    """Bug: a metrics.jsonl evaluation whose ``val_acc`` is an int of 400 digits raised ``OverflowError: int too
    large to convert to float`` from ``select_evaluation``/``first_reach`` (and so from the results table); it now
    counts as non-finite, like ``Infinity``: never selected, never reaching the threshold."""
    cfg = load_experiment_config(_experiment(tasks=[{"name": "d", "dataset": "digits", "model": "vit-digits",
                                                     "select_by": "val_acc", "reach": {"val_acc": 0.5}}]))
    records = [{"split": "eval", "step": 10, "metrics": {"val_acc": 10**400, "test_acc": 0.9}},
               {"split": "eval", "step": 20, "metrics": {"val_acc": 0.6, "test_acc": 0.4}}]
    assert select_evaluation(records, cfg.tasks[0]) == (0.4, 20)
    assert first_reach(records, cfg.tasks[0]) == 20
    log = '{"split": "eval", "step": 10, "metrics": {"val_acc": 1%s, "test_acc": 0.9}}\n' % ("0" * 400)
    summary = {"status": "completed", "eval": {"split": "eval", "step": 10, "metrics": {"test_acc": 0.9}}}
    _run_files(tmp_path, **{"summary.json": json.dumps(summary), "metrics.jsonl": log})
    (run,) = finished_runs(tmp_path / "x", cfg)
    assert (run.value, run.selected_value, run.reach_step) == (0.9, None, None)


def test_summary_with_nan_tokens_and_junk_pins(tmp_path):
    """Pins: NaN/Infinity/null metrics in a summary stay non-finite; a truncated or non-object summary is an
    unfinished run; a truncated last log line is skipped."""
    cfg = load_experiment_config(_experiment())
    for text, expected in [('{"status": "completed", "eval": {"metrics": {"test_acc": NaN}}}', math.nan),
                           ('{"status": "completed", "eval": {"metrics": {"test_acc": Infinity}}}', math.inf),
                           ('{"status": "completed", "eval": {"metrics": {"test_acc": null}}}', math.nan),
                           ('{"status": "comp', None), ("[1, 2]", None)]:
        root = tmp_path / str(len(os.listdir(tmp_path)))
        _run_files(root, **{"summary.json": text, "metrics.jsonl": '{"split": "eval", "step": 1, "metr'})
        runs = finished_runs(root / "x", cfg)
        if expected is None:
            assert runs == [] and run_status(cfg, root)[0]["state"] == "missing"
        else:
            assert len(runs) == 1 and (runs[0].value == expected or math.isnan(expected) and math.isnan(runs[0].value))


def test_a_toml_file_with_a_byte_order_mark_loads(tmp_path):
    """Bug: a config saved by an editor that writes a UTF-8 byte-order mark (Windows Notepad) was refused as
    "invalid TOML: Invalid statement (at line 1, column 1)", with no word of the invisible mark. It now loads as the
    same file without the mark."""
    text = 'name = "bom"\nseeds = [0]\n[[tasks]]\nname = "d"\ndataset = "digits"\nmodel = "vit-digits"\n' \
           '[[operators]]\nname = "attention"\n'
    (tmp_path / "plain.toml").write_text(text, encoding="utf-8")
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert load_experiment_config(tmp_path / "bom.toml") == load_experiment_config(tmp_path / "plain.toml")
