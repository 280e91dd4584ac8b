"""Mutation audit (sitting 50, commits 0b0f80b, 44bf403) of a finished run's whole identity as ``status`` reads it:
experiments/results.py ``_task_identity``, ``_TASK_KEYS``, ``run_status``'s block comparing the task entries,
``_runs_of_another_train``'s dtype advice and ``_DTYPE_CHANGE``, ``_identity_changes``' ``dtype`` branch; runner.py
``_run_identity`` (built from ``_task_identity``); validate.py ``validate_experiment``'s meta default device check;
train/trainer.py ``_refuse_meta_default_device``. Tests that kill mutants the commits' tests left alive (each
docstring names the mutant). No GPU is used; the runs here are written as the runner writes them
(``_run_identity``'s ``run_config.json`` and a completed ``summary.json``: ``status`` reads nothing else), so
nothing trains.

46 hand mutants of the changed lines, one at a time, each restored from a cp backup (results.py 36, runner.py 3,
validate.py 3, trainer.py 4): 21 killed by the commits' tests (tests/reliability/test_edge_probes_status_entries_50.py,
test_edge_probes_review_50b.py, test_edge_probes_global_state_50.py), 3 by older ones (``_task_identity`` ``if
task.augment:`` / ``if task.label_smoothing:`` -> ``is not None``: every run's identity changed, by
tests/reliability/test_edge_probes_upgrade_resume.py; ``minibatch_config().to_dict()`` -> the raw table, by
tests/experiments/test_experiments_minibatch.py), 16 survivors killed here, 6 equivalent. No library bug was found:
each survivor was a gap in the tests, not a wrong answer of the code. Notable gaps: ``_TASK_KEYS`` without
``augment``, ``minibatch``, ``model``, ``dataset`` or the folds, and ``run_status`` comparing every seed with the
first seed's entries (cross-validation runs past the first read "fold" changed), all passed the commits' tests
(they changed only ``data_seed``, ``dataset_options``, label smoothing and the float64 default); so did dropping
``_task_identity``'s folds (the runner then recorded no ``folds``/``fold``: a cross-validation run and the run of
the config without ``folds`` were one run) and dropping the
``if stored is not None`` guard (``status`` of a comparison with a missing run raised TypeError).

Equivalent mutants:

* results.py ``_task_identity`` ``return json.loads(json.dumps(entries, default=str))`` -> ``return entries``: every
  entry is already a JSON value (``_data_identity`` round-trips the data, ``MiniBatchConfig.to_dict`` gives lists,
  the config checks ``augment`` to ints and bools and ``label_smoothing`` to a float; ``dtype`` and ``model`` are
  strings), and the runner round-trips its whole identity again.
* results.py ``run_status`` ``and stored.get(k) != now.get(k)`` dropped from ``keys``: ``_identity_changes`` skips the
  keys whose values are equal and returns ``""`` when all are, which the join of ``changes`` drops.
* results.py ``run_status`` ``{k: stored[k] for k in keys if k in stored}`` -> ``{k: stored.get(k) for k in keys}``:
  ``_identity_changes`` reads both sides with ``.get``, so a key absent and a key holding ``None`` read alike (the
  ``dtype`` branch names ``None`` as float32 either way).
* results.py ``run_status`` ``if keys:`` -> ``if True:``: ``_identity_changes({}, {})`` is ``""``, dropped by the
  join.
* runner.py ``_run_identity`` ``if k not in identity`` dropped from the final ``update``: the keys already in
  ``identity`` (``dataset``, ``dataset_options``, ``data_seed``, ``model``) were taken from the same ``entries``, so
  the update writes equal values, and updating a key keeps its place in a dict.
* validate.py ``validate_experiment`` the meta default device refused after ``_check_task_names`` instead of before:
  only ``tasks=`` naming an unknown task at the meta default device tells apart, and then both orders raise a true
  error (the unknown task, or the meta device); no answer is wrong.

Found, not changed (by design, the runner's identity before these commits): ``augment = {flip = false}`` (or
``{crop_padding = 0}``) trains as no augmentation but is recorded (``if task.augment:`` reads a non-empty table), so
such a run and a run without ``augment`` are two runs for ``run`` and now ``status``; conservative, not a wrong
answer.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from diffusionformer.experiments import load_experiment_config, run_status
from diffusionformer.experiments.config import train_config
from diffusionformer.experiments.results import run_dir
from diffusionformer.experiments.runner import _run_identity
from diffusionformer.models import create_model

from experiments_tiny_configs import TINY_TRAIN as _TRAIN, TINY_VIT as _TINY_VIT

_OVERRIDES = {k: v for k, v in _TINY_VIT.items() if k != "input_size"}


def _config(seeds=(0,), **task):
    task = {"name": "t", "dataset": "digits", "model": "vit-digits", "model_overrides": dict(_OVERRIDES),
            "train": dict(_TRAIN), **task}
    return load_experiment_config({"name": "whole", "seeds": list(seeds), "operators": [{"name": "attention"}],
                                   "tasks": [task]})


def _node_config(**task):
    """A tiny node-classification task (mini-batching is for graphs)."""
    task = {"name": "nodes", "dataset": "csbm", "model": "graph-node-small",
            "dataset_options": {"num_nodes": 120, "avg_degree": 4.0},
            "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2}, "train": dict(_TRAIN), **task}
    return load_experiment_config({"name": "whole", "seeds": [0], "operators": [{"name": "attention"}],
                                   "tasks": [task]})


def _write_runs(config, root):
    """Every run of ``config`` as finished, as the runner records it (its identity from ``_run_identity``)."""
    for task in config.tasks:
        model = create_model(task.model, **task.model_overrides)
        for setting in config.operators:
            for seed in config.seeds:
                rdir = run_dir(root / config.name, task.name, setting.name, seed)
                rdir.mkdir(parents=True)
                identity = _run_identity(task, model, train_config(task, seed))
                (rdir / "run_config.json").write_text(json.dumps(identity))
                (rdir / "summary.json").write_text(json.dumps({"status": "completed", "step": 2}))
    return root


def _changed(config, root):
    rows = run_status(config, root)
    assert {r["state"] for r in rows} == {"completed"}
    return [r["changed"] for r in rows]


# ----------------------------------------------------------------------------- results.run_status
def test_kills_run_status_compares_task_entries_of_recorded_runs_only(tmp_path):
    """kills: experiments/results.py ``run_status`` ``if stored is not None:`` dropped before the task entries'
    comparison (``status`` of a comparison with a run not started yet, or one whose ``run_config.json`` is
    unreadable, failed with "TypeError: argument of type 'NoneType' is not iterable")."""
    _write_runs(_config(), tmp_path)
    (run_dir(tmp_path / "whole", "t", "attention", 0) / "run_config.json").write_text("{not json")
    rows = run_status(_config(seeds=(0, 1)), tmp_path)
    assert [(r["state"], r["changed"]) for r in rows] == [("completed", None), ("missing", None)]


# ----------------------------------------------------------------------------- results._TASK_KEYS
def test_kills_task_keys_without_augment(tmp_path):
    """kills: experiments/results.py ``_TASK_KEYS`` without ``"augment"`` (a run trained with flips, read by a
    config without them, or the reverse, was "completed" and unchanged; ``publish`` put it under the config while
    ``run`` refused it: "made with a different augment")."""
    _write_runs(_config(), tmp_path)
    assert _changed(_config(augment={"flip": True}), tmp_path) == ["augment"]
    assert _changed(_config(), tmp_path) == [None]


def test_kills_task_keys_without_minibatch(tmp_path):
    """kills: experiments/results.py ``_TASK_KEYS`` without ``"minibatch"`` (a mini-batch run of batch size 4, read
    by a config of batch size 8 or by the full-batch config, was the config's run for ``status``/``publish``)."""
    _write_runs(_node_config(minibatch={"batch_size": 4, "num_neighbors": [2]}), tmp_path)
    assert _changed(_node_config(minibatch={"batch_size": 4, "num_neighbors": [2]}), tmp_path) == [None]
    assert _changed(_node_config(minibatch={"batch_size": 8, "num_neighbors": [2]}), tmp_path) == [
        "minibatch (batch_size: 4 then 8)"]
    assert _changed(_node_config(), tmp_path) == ["minibatch"]


def test_kills_task_keys_without_the_folds(tmp_path):
    """kills: experiments/results.py ``_TASK_KEYS`` without ``"folds"``/``"fold"`` (``*_DATA_KEYS`` -> the first
    three: cross-validation runs, each trained on all folds but one, read by the config without ``folds`` (trained
    and tested on the dataset's own split) were its runs)."""
    _write_runs(_config(seeds=(0, 1), folds=2), tmp_path)
    assert _changed(_config(seeds=(0, 1)), tmp_path) == ["fold, folds", "fold, folds"]


def test_kills_run_status_compares_each_seed_with_its_own_fold(tmp_path):
    """kills: experiments/results.py ``run_status`` ``task_entries[seed]`` -> ``task_entries[config.seeds[0]]`` (and
    ``_task_identity(task, seed)`` -> ``(task, 0)`` where ``task_entries`` is built): with ``folds = 2`` seed 1 tests
    on fold 1; compared with seed 0's entries every run past the first read "fold" changed, so ``publish`` refused a
    cross-validation comparison run exactly as configured."""
    _write_runs(_config(seeds=(0, 1), folds=2), tmp_path)
    assert _changed(_config(seeds=(0, 1), folds=2), tmp_path) == [None, None]


def test_kills_task_keys_without_model(tmp_path, preset_name):
    """kills: experiments/results.py ``_TASK_KEYS`` without ``"model"`` (a run of another preset name that builds the
    same class and config, read by this config, was its run for ``status``; ``run`` refuses it: "made with a
    different model")."""
    from diffusionformer.models import get_preset, model_config, register_model

    preset = get_preset("vit-digits")
    register_model(preset_name, preset.model_cls, preset.config_cls,
                   **dataclasses.asdict(model_config("vit-digits")))
    _write_runs(_config(model=preset_name), tmp_path)
    assert _changed(_config(), tmp_path) == ["model"]


def test_kills_task_keys_without_the_data_keys(tmp_path):
    """kills: experiments/results.py ``_TASK_KEYS`` without ``"dataset"`` (a run of another dataset whose model sizes
    match, read by the config, was unchanged: its numbers published as the config's dataset's)."""
    _write_runs(_config(dataset="mnist"), tmp_path)
    assert _changed(_config(), tmp_path) == ["dataset"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kills_task_identity_records_every_default_dtype_but_float32(tmp_path, dtype):
    """kills: experiments/results.py ``_task_identity`` ``default_dtype != torch.float32`` -> ``== torch.float64``
    (a run built at a notebook's ``torch.set_default_dtype(torch.bfloat16)`` recorded a float32 run's identity, read
    back as the config's float32 run by ``run`` and ``status``)."""
    from diffusionformer.experiments.results import _task_identity

    _write_runs(_config(), tmp_path)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        name = str(dtype).removeprefix("torch.")
        assert _task_identity(_config().tasks[0], 0)["dtype"] == name
        assert _changed(_config(), tmp_path) == [
            f"dtype (float32 then {name}: torch.get_default_dtype() when the models were built)"]
    finally:
        torch.set_default_dtype(previous)


# ----------------------------------------------------------------------------- results._runs_of_another_train
_DTYPE = ("dtype", "float64", None)  # "dtype (float64 then float32: torch.get_default_dtype() when the models ...)"


def _rows(changes_by_seed):
    """``_status_rows``' rows made by hand, one finished run per seed, each with its changes (``(part, old, new)``) as
    records and as the ``changed`` text made of them."""
    from diffusionformer.experiments.results import _Change, _changes_text

    rows = []
    for seed, changes in enumerate(changes_by_seed):
        records = [_Change(*c) for c in changes]
        rows.append(({"task": "t", "operator": "attention", "seed": seed, "state": "completed",
                      "changed": _changes_text(records)}, records))
    return rows


def _advice(monkeypatch, changes, verb="publish"):
    """``_runs_of_another_train``'s text for one finished run differing in ``changes`` (a ``_status_rows`` row made
    by hand: what the run differs in is the input here)."""
    from diffusionformer.experiments import results

    rows = _rows([changes])
    monkeypatch.setattr(results, "_status_rows", lambda c, root: rows)
    return results._runs_of_another_train(_config(), "unused", verb=verb)


def test_kills_runs_of_another_train_no_set_advice_for_a_class_and_dtype_change(monkeypatch):
    """kills: experiments/results.py ``_runs_of_another_train`` ``.strip(", ")`` dropped after both subs (a run of
    another class made at another default dtype: what was left, ``", "``, read as a change --set fixes, and the
    advice named --set overrides that do not exist)."""
    text = _advice(monkeypatch, [("model_class", "user.A", "user.B"), _DTYPE])
    assert "with the --set overrides" not in text
    assert "publish after torch.set_default_dtype(torch.float64), the default they were made at, or register the " \
           "class they were made with (user.A)" in text


def test_kills_runs_of_another_train_set_advice_beside_the_dtype_advice(monkeypatch):
    """kills: experiments/results.py ``_runs_of_another_train`` the dtype advice replacing the --set one (a run of
    another budget made at another default dtype needs both: the --set overrides and the default dtype)."""
    text = _advice(monkeypatch, [("train", {"max_steps": 2}, {"max_steps": 3}), _DTYPE])
    assert text.endswith("; publish with the --set overrides they were run with, or publish after "
                         "torch.set_default_dtype(torch.float64), the default they were made at, or redo them with "
                         "`run --restart`")


def test_kills_runs_of_another_train_dtype_advice_found_past_the_first_run(monkeypatch):
    """kills: experiments/results.py ``_runs_of_another_train`` the dtype looked for in the first changed run only
    (``changed[:1]``): the first run differs in its budget, the second in its default dtype; the dtype advice was
    lost and --set alone advised, which cannot bring the second back."""
    from diffusionformer.experiments import results

    rows = _rows([[("train", {"max_steps": 2}, {"max_steps": 3})], [_DTYPE]])
    monkeypatch.setattr(results, "_status_rows", lambda c, root: rows)
    text = results._runs_of_another_train(_config(seeds=(0, 1)), "unused", verb="analyse")
    assert "or analyse after torch.set_default_dtype(torch.float64), the default they were made at" in text


# ----------------------------------------------------------------------------- the meta default device
def test_kills_validate_experiment_names_what_meta_would_have_emptied():
    """kills: train/trainer.py ``_refuse_meta_default_device`` ``{made}`` -> the trainer's fixed "made while training"
    (``validate_experiment``, which trains nothing, said the tensors made while training would have no values)."""
    from diffusionformer.experiments import validate_experiment

    with torch.device("meta"), pytest.raises(RuntimeError, match=r"the tensors made loading the data and building "
                                                                 r"the models would have no values; call it at the "
                                                                 r"default device 'cpu' \(or a CUDA device\)"):
        validate_experiment(_config())


def test_kills_training_names_what_meta_would_have_emptied():
    """kills: train/trainer.py ``_refuse_untrainable_state`` ``"made while training"`` -> another text (the trainer's
    refusal at the meta default device lost what its tensors are)."""
    from diffusionformer.train.trainer import _refuse_untrainable_state

    with torch.device("meta"), pytest.raises(RuntimeError, match=r"fit: expected a default device that holds data, "
                                                                 r"got 'meta' .*: the tensors made while training "
                                                                 r"would have no values"):
        _refuse_untrainable_state("fit")


def test_kills_refuse_meta_default_device_refuses_meta_only(monkeypatch):
    """kills: train/trainer.py ``_refuse_meta_default_device`` ``.type == "meta"`` -> ``.type != "cpu"`` (a
    notebook's ``torch.set_default_device('cuda')`` was refused as if it held no data). No GPU here: the default
    device is reported as CUDA (the check reads only its type)."""
    from diffusionformer.train import trainer

    monkeypatch.setattr(torch, "get_default_device", lambda: torch.device("cuda", 0))
    trainer._refuse_meta_default_device("validate_experiment", "made loading the data")  # no error
    monkeypatch.setattr(torch, "get_default_device", lambda: torch.device("meta"))
    with pytest.raises(RuntimeError, match="got 'meta'"):
        trainer._refuse_meta_default_device("validate_experiment", "made loading the data")
