"""Tests that kill mutants which survived a manual mutation audit of the run loop, the run store,
the result files, and the data loaders' splits and hostile-file checks.

Each test's docstring names the mutant it kills (file and the mutation). Every test is CPU-only,
deterministic and fast: the runner tests swap the trainer for a stub that writes a finished
``summary.json`` at once, so the code under test (skip, lock, cache, restart) runs for real and
nothing trains.
"""

from __future__ import annotations

import json
import os
import pickle
import platform
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import pytest
import torch

from diffusionformer.data import CorruptDataError
from diffusionformer.data.cifar10 import read_cifar_batch
from diffusionformer.data.planetoid import _unpickle_planetoid
from diffusionformer.data.splits import split_sizes, stratified_kfold_split
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments import runner as runner_mod
from diffusionformer.experiments.outputs import write_outputs
from diffusionformer.experiments.results import RunResult
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.experiments.store import LOCK_NAME, read_lock

def _writers():
    """tests/data/data_writers.py (writers of small valid dataset files), loaded by path."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "df_mk_writers", Path(__file__).resolve().parents[1] / "data" / "data_writers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_EVAL = {"loss": 1.0, "val_acc": 0.5, "test_loss": 1.0, "test_acc": 0.25}


def _raw_config(**extra):
    """A one-seed, one-setting comparison on digits as a plain dict (what a TOML file parses to)."""
    cfg = {
        "name": "mk",
        "seeds": [0],
        "tasks": [{
            "name": "digits",
            "dataset": "digits",
            "model": "vit-digits",
            "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
            "train": {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
                      "log_interval": 1, "checkpoint_interval": 2},
        }],
        "operators": [{"name": "attention"}],
    }
    cfg.update(extra)
    return cfg


def _config(**extra):
    return load_experiment_config(_raw_config(**extra))


class _StubTrainer:
    """Stands in for :class:`~diffusionformer.train.Trainer`: records what the runner left on
    disk when training would start, then writes a completed summary at once."""

    calls: list = []

    def __init__(self, model, adapter, cfg, rdir, resume=True):
        self.rdir = rdir
        _StubTrainer.calls.append({"rdir": rdir, "lock": read_lock(rdir), "files": sorted(p.name for p in rdir.iterdir())})

    def fit(self):
        summary = {"status": "completed", "step": 2, "elapsed": 0.0, "num_parameters": 1,
                   "eval": {"split": "eval", "step": 2, "loss": 1.0, "metrics": dict(_EVAL)}}
        (self.rdir / "summary.json").write_text(json.dumps(summary))
        return summary


@pytest.fixture
def stub_trainer(monkeypatch):
    _StubTrainer.calls = []
    monkeypatch.setattr(runner_mod, "Trainer", _StubTrainer)
    monkeypatch.setattr(runner_mod, "_write_outputs", lambda *a, **k: None)  # no plots: fast
    return _StubTrainer


# ---------------------------------------------------------------------------------------- runner


def test_a_finished_run_is_read_back_and_never_handed_to_the_trainer(tmp_path, stub_trainer):
    """Kills runner.py:317 ``summary.get("status") == "completed"`` -> ``== "complete"`` (a
    finished run is not skipped on resume: it goes back to the trainer, which would re-evaluate
    and rewrite it, or retrain it from step 0 when its checkpoint was pruned)."""
    cfg = _config()
    first = run_experiment(cfg, tmp_path, progress=False)
    assert len(stub_trainer.calls) == 1 and first[0].status == "completed"
    again = run_experiment(cfg, tmp_path, progress=False)
    assert len(stub_trainer.calls) == 1, "a finished run was handed to the trainer again"
    assert again[0].value == first[0].value == _EVAL["test_acc"]


def test_a_failed_run_counts_as_unfinished_and_its_retraining_records_the_manifest(tmp_path, stub_trainer):
    """Kills results.py:95 ``_completed``: ``status == "completed"`` dropped (any readable summary,
    a failed one included, counts as finished: the invocation that retrains the failed run leaves
    no manifest, so the commit and machine that produced its result are never recorded)."""
    cfg = _config()
    out = tmp_path / "mk"
    rdir = run_dir(out, "digits", "attention", 0)
    rdir.mkdir(parents=True)
    (rdir / "summary.json").write_text(json.dumps({"status": "failed: non-finite loss", "step": 1}))
    results = run_experiment(cfg, tmp_path, progress=False)
    assert len(stub_trainer.calls) == 1 and results[0].status == "completed"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["name"] == "mk" and "git_commits" in manifest


def test_restart_keeps_this_workers_lock_while_it_trains(tmp_path, stub_trainer):
    """Kills runner.py:323 ``if not entry.name.startswith(LOCK_NAME)`` -> ``if True`` (``--restart``
    wipes the run folder including the lock this worker holds, so a second worker sees the run as
    free and trains it too)."""
    cfg = _config()
    run_experiment(cfg, tmp_path, progress=False)
    run_experiment(cfg, tmp_path, progress=False, resume=False)
    assert len(stub_trainer.calls) == 2
    restarted = stub_trainer.calls[1]
    assert restarted["lock"] == (os.getpid(), platform.node()), \
        f"the run trained without its lock; files then: {restarted['files']}"
    assert restarted["files"] == [LOCK_NAME, "preprocessing.json", "run_config.json"]  # old summary gone, lock kept
    assert not (restarted["rdir"] / LOCK_NAME).exists()  # released afterwards


def test_each_fold_is_loaded_once_and_the_checked_load_is_reused(tmp_path, stub_trainer, monkeypatch):
    """Kills runner.py:186 cache key ``task.fold_of(config.seeds[0])`` -> ``None`` (the data
    loaded for the check is filed under the wrong fold, so the first fold is loaded twice: the
    runner's documented "loaded once per fold" is broken)."""
    from diffusionformer.experiments import build

    writers = _writers()
    monkeypatch.setenv("DIFFUSIONFORMER_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "data"
    writers.write_tu_zip(root / "tudataset" / "MUTAG.zip", "MUTAG", node_labels=True)
    loads = []
    real = build.load_dataset

    def counting(name, **kw):
        loads.append(kw.get("fold"))
        return real(name, **kw)

    monkeypatch.setattr(build, "load_dataset", counting)
    cfg = load_experiment_config({
        "name": "cv", "seeds": [0, 1],
        "tasks": [{"name": "mutag-cv", "dataset": "mutag", "model": "graph-graph-small", "folds": 2,
                   "dataset_options": {"verify": False},
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 2, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2,
                             "log_interval": 1, "checkpoint_interval": 2}}],
        "operators": [{"name": "attention"}],
    })
    run_experiment(cfg, tmp_path / "out", data_root=root, progress=False)
    assert len(stub_trainer.calls) == 2
    assert loads == [0, 1], f"fold loads {loads}: each fold must be loaded exactly once"


def test_an_empty_tasks_filter_is_refused_before_anything_is_written(tmp_path, stub_trainer):
    """Kills runner.py:194 ``if unknown or not names`` -> ``if unknown`` (``tasks=[]``, e.g. a
    ``--tasks`` list emptied by a script, passes: nothing trains and the run reports success)."""
    with pytest.raises(ValueError, match=r"unknown task\(s\) \[\] for 'mk'; its tasks are \['digits'\]"):
        run_experiment(_config(), tmp_path, progress=False, tasks=[])
    assert stub_trainer.calls == [] and not (tmp_path / "mk").exists()


def test_the_split_is_seeded_by_data_seed_not_by_the_run_seed():
    """Kills build.py:22 ``seed=task.data_seed`` -> ``seed=seed`` (each run seed would draw its
    own train/val/test split, so the runs of a comparison are no longer on the same data)."""
    from diffusionformer.data import load_dataset
    from diffusionformer.experiments.build import task_data

    cfg = _config(seeds=[0, 1])
    task = cfg.tasks[0]
    a, b = task_data(task, 0, None, {}), task_data(task, 1, None, {})
    ref = load_dataset("digits", seed=task.data_seed)
    for d in (a, b):
        assert torch.equal(d.y_train, ref.y_train) and torch.equal(d.x_test, ref.x_test)


# ---------------------------------------------------------------------------------------- outputs


def test_a_failed_write_of_results_json_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    """Kills outputs.py:106 ``write_json_atomic(out / "results.json", ...)`` -> a direct
    ``open(..., "w")`` + ``json.dump`` (a crash or full disk mid-write leaves a truncated
    results.json: every finished row of the comparison is lost)."""
    cfg = _config()
    out = tmp_path / "mk"
    out.mkdir()
    before = json.dumps({"runs": [], "summary": {}, "marker": "previous"})
    (out / "results.json").write_text(before)

    def dump_then_fail(obj, fp, *args, **kwargs):
        fp.write('{"runs": [')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", dump_then_fail)
    row = RunResult("digits", "attention", 0, "completed", "test_acc", 0.5, dict(_EVAL))
    with pytest.raises(OSError, match="No space"):
        write_outputs(out, cfg, [row])
    assert (out / "results.json").read_text() == before
    assert [p.name for p in out.iterdir()] == ["results.json"]  # no temporary file left behind


# ---------------------------------------------------------------------------------------- reload


@pytest.mark.parametrize("stored_depth, ckpt_depth", [(2, 1), (1, 2)])
def test_load_run_refuses_weights_with_missing_or_extra_layers(tmp_path, stored_depth, ckpt_depth):
    """Kills reload.py:124 ``model.load_state_dict(payload["model"])`` -> ``strict=False`` (a
    checkpoint lacking a layer of the recorded model loads silently, leaving that layer at its
    random init; one with extra layers drops them). Same-shaped tensors throughout, so only the
    key check can catch it."""
    import dataclasses

    import diffusionformer
    from diffusionformer.models import get_preset, model_config
    from diffusionformer.train import CheckpointError, TrainConfig
    from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT, save_checkpoint

    stored = model_config("vit-digits", dim=8, depth=stored_depth, num_heads=2)
    weights = get_preset("vit-digits").model_cls(model_config("vit-digits", dim=8, depth=ckpt_depth, num_heads=2))
    (tmp_path / "run_config.json").write_text(
        json.dumps({"model": "vit-digits", "model_config": dataclasses.asdict(stored)}, default=str))
    save_checkpoint(tmp_path / "checkpoint.pt", {"format": CHECKPOINT_FORMAT, "step": 3, "model": weights.state_dict(),
                                                 "optimizer": {}, "rng": {}, "config": TrainConfig().to_dict()})
    with pytest.raises(CheckpointError, match="do not fit"):
        diffusionformer.load_run(tmp_path)


# ---------------------------------------------------------------------------------------- splits


@pytest.mark.parametrize("n, fv, ft", [(10, 0.25, 0.05), (10, 0.05, 0.25), (6, 0.25, 0.25), (20, 0.125, 0.025)])
def test_split_sizes_round_halves_up(n, fv, ft):
    """Kills splits.py:62 ``math.floor(f * n + 0.5)`` -> ``round(f * n)`` (banker's rounding:
    2.5 -> 2 and 0.5 -> 0, so a documented 1-example val/test part becomes empty)."""
    half_up = [int(Decimal(repr(f * n)).quantize(Decimal(1), rounding=ROUND_HALF_UP)) for f in (fv, ft)]
    assert split_sizes(n, fv, ft) == (n - sum(half_up), *half_up)


@pytest.mark.parametrize("fold", [3, -1])
def test_kfold_refuses_a_fold_outside_0_to_k(fold):
    """Kills splits.py:209 ``0 <= fold < num_folds`` -> ``<= num_folds`` (fold K matches no item:
    an empty test part, every example in train/val, and no error)."""
    y = torch.tensor([0, 1] * 6)
    with pytest.raises(ValueError, match=r"fold must be an int in \[0, 3\)"):
        stratified_kfold_split(y, 3, fold, 0.2, seed=0)
    tests = [stratified_kfold_split(y, 3, k, 0.2, seed=0)[2] for k in range(3)]
    assert sorted(torch.cat(tests).tolist()) == list(range(12))


def test_kfold_deals_items_across_classes_so_folds_differ_by_at_most_one():
    """Kills splits.py:222 ``offset += idx.numel()`` removed (each class restarts at fold 0:
    with many small classes the first folds get every leftover, fold sizes drift apart and a
    fold can be empty)."""
    y = torch.arange(7).repeat_interleave(3)  # 7 classes of 3 items, 4 folds: 21 items -> 6/5/5/5
    tests = [stratified_kfold_split(y, 4, k, 0.2, seed=3)[2] for k in range(4)]
    sizes = sorted(len(t) for t in tests)
    assert sizes == [5, 5, 5, 6], sizes
    assert sorted(torch.cat(tests).tolist()) == list(range(21))


# ---------------------------------------------------------------------------------------- hostile files


class _Marker:
    """Pickles as ``builtins.exec(<code that creates a file>)``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('ran')",))


class _Eval:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (eval, (f"open({self.path!r}, 'w').write('ran')",))


@pytest.mark.parametrize("payload", [_Marker, _Eval])
def test_planetoid_refuses_builtins_other_than_list_and_runs_nothing(tmp_path, payload):
    """Kills planetoid.py:128 ``(module, name) not in _ALLOWED`` -> ``module not in`` the allowed
    modules (``builtins`` is allowed for ``list``, so ``builtins.exec``/``eval`` would run the
    file's code)."""
    marker = tmp_path / "ran.txt"
    path = tmp_path / "ind.cora.x"
    path.write_bytes(pickle.dumps(payload(marker), protocol=2))
    with pytest.raises(CorruptDataError, match=r"global (__builtin__|builtins)\.(exec|eval) is not allowed"):
        _unpickle_planetoid(path)
    assert not marker.exists(), "unpickling a Planetoid file ran code"


class _NumpyCall:
    def __reduce__(self):
        return (np.ones, ((2, 3072),))


def test_cifar_refuses_numpy_functions_it_does_not_list(tmp_path):
    """Kills cifar10.py:137 ``(module, name) not in _ALLOWED`` -> ``module not in`` the allowed
    modules (any ``numpy.<function>`` would be called while unpickling a batch)."""
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({"data": _NumpyCall(), "labels": [0, 1]}, protocol=2))
    with pytest.raises(CorruptDataError, match=r"global numpy\.ones is not allowed"):
        read_cifar_batch(path)


def test_cifar_refuses_boolean_labels(tmp_path):
    """Kills cifar10.py:181 label dtype check ``"iu"`` -> ``"iub"`` (a batch whose labels are
    booleans would load as classes 0/1 instead of being named corrupt)."""
    path = tmp_path / "data_batch_1"
    data = np.zeros((2, 3072), dtype=np.uint8)
    path.write_bytes(pickle.dumps({b"data": data, b"labels": np.array([True, False])}, protocol=2))
    with pytest.raises(CorruptDataError, match="labels must be integers"):
        read_cifar_batch(path)


def test_planetoid_test_index_equal_to_the_node_count_is_a_named_corrupt_file(tmp_path):
    """Kills planetoid.py:218 ``int(test_index.max()) >= N`` -> ``> N`` (a test index one past
    the last node slips through and fails later as a bare IndexError instead of a
    CorruptDataError naming the folder)."""
    from diffusionformer.data.planetoid import read_planetoid

    raw = _writers().write_planetoid_layout(tmp_path)
    path = raw / "ind.cora.test.index"
    values = [int(v) for v in path.read_text().split()]
    n_nodes = 14 + 500 + 6 + len(values)  # allx rows + tx rows (no gap)
    values[values.index(max(values))] = n_nodes
    path.write_text("\n".join(map(str, values)) + "\n")
    with pytest.raises(CorruptDataError, match=rf"a node index is outside \[0, {n_nodes}\)"):
        read_planetoid(raw, "cora")


@pytest.mark.parametrize("split", ["train", "test"])
def test_mnist_refuses_label_10(tmp_path, split):
    """Kills mnist.py:113 ``int(labels.max()) > 9`` -> ``> 10`` (a label file holding class 10
    loads, and the 10-way head later fails on it, or silently learns nothing for it)."""
    from diffusionformer.data import load_dataset

    writers = _writers()
    arrays = writers.write_mnist_layout(tmp_path, n_train=20, n_test=10)
    labels = arrays[f"{split}_labels"].copy()
    labels[3] = 10
    stem = "train-labels-idx1-ubyte.gz" if split == "train" else "t10k-labels-idx1-ubyte.gz"
    writers.write_idx_gz(tmp_path / "mnist" / "MNIST" / "raw" / stem, labels)
    with pytest.raises(CorruptDataError, match=rf"mnist: {split} labels must be 0\.\.9, found 10"):
        load_dataset("mnist", root=tmp_path, verify=False, val_size=5)


def test_tu_folds_refuse_an_empty_val_part(tmp_path, monkeypatch):
    """Kills tu.py:172 ``require_heldout`` dropped from the ``fold`` branch (``val_fraction=0``
    with k-fold leaves the inner val split empty: model selection would fail at the first
    evaluation, after steps have trained, instead of at load time)."""
    from diffusionformer.data import load_dataset

    monkeypatch.setenv("DIFFUSIONFORMER_CACHE", str(tmp_path / "cache"))
    _writers().write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG", node_labels=True)
    ok = load_dataset("mutag", root=tmp_path, verify=False, fold=1, num_folds=3, val_fraction=0.2)
    assert len(ok.val_idx) > 0 and not set(ok.test_idx.tolist()) & set(ok.train_idx.tolist() + ok.val_idx.tolist())
    with pytest.raises(ValueError, match=r"mutag: val_fraction=0\.0 leaves the val split empty"):
        load_dataset("mutag", root=tmp_path, verify=False, fold=1, num_folds=3, val_fraction=0.0)


# ---------------------------------------------------------------------------------------- real bugs found by the audit


@pytest.mark.parametrize("garbage", [b'{"runs": [{"ta', b"\xff\xfe\x00 not utf-8", b'{"runs": [{"task": 5, "operator": [], "seed": 0, '
                                                                  b'"status": "completed", "metric": "m", "value": 1}]}'])
def test_an_unreadable_results_json_is_rebuilt_not_a_crash(tmp_path, monkeypatch, garbage):
    """Kills outputs.py:28 ``json.JSONDecodeError`` dropped from the except clause (a truncated
    results.json, case 0). Bug (outputs.py:28/31, cases 1 and 2): ``_other_finished_rows`` caught ``json.JSONDecodeError`` but not
    ``UnicodeDecodeError``, and joined a row's non-string task into a path outside its ``try``:
    a results.json that is not UTF-8 (or holds such a row) made every ``write_outputs`` raise, so
    ``run`` stopped after its first trained run with an error that names no file. Like every other
    run file (``read_json_dict``), an unreadable one is rebuilt from the runs on disk."""
    import diffusionformer.experiments.plots as plots

    monkeypatch.setattr(plots, "plot_experiment", lambda *a, **k: None)
    out = tmp_path / "mk"
    out.mkdir()
    (out / "results.json").write_bytes(garbage)
    row = RunResult("digits", "attention", 0, "completed", "test_acc", 0.5, dict(_EVAL))
    write_outputs(out, _config(), [row])
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [(r["task"], r["operator"], r["seed"]) for r in runs] == [("digits", "attention", 0)]


def test_planetoid_negative_node_in_the_graph_is_a_named_corrupt_file(tmp_path):
    """Kills planetoid.py:219 ``or min(graph, default=0) < 0`` dropped (a graph dict keyed by
    node -1 becomes an edge to the last node through negative indexing, or fails later, instead
    of a CorruptDataError naming the folder)."""
    import collections

    from diffusionformer.data.planetoid import read_planetoid

    raw = _writers().write_planetoid_layout(tmp_path)
    path = raw / "ind.cora.graph"
    graph = pickle.loads(path.read_bytes())  # written by this test: a plain load is safe
    fresh = collections.defaultdict(list, graph)
    fresh[-1].append(0)
    path.write_bytes(pickle.dumps(fresh, protocol=2))
    with pytest.raises(CorruptDataError, match=r"a node index is outside \[0, "):
        read_planetoid(raw, "cora")


def test_load_run_with_a_truncated_summary_still_returns_the_weights(tmp_path):
    """Bug (reload.py:130): ``load_run`` parsed ``summary.json`` with a bare ``json.loads``, so a
    truncated summary (a run killed while the non-atomic writer of an older version wrote it)
    raised ``JSONDecodeError: Expecting value: line 1 column 1 (char 0)``, naming no file, although
    the checkpoint and config were intact and the runner itself treats that summary as rebuildable.
    Now the model comes back, ``summary`` is None and a warning names the file."""
    import dataclasses

    import diffusionformer
    from diffusionformer.models import get_preset, model_config
    from diffusionformer.train import TrainConfig
    from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT, save_checkpoint

    cfg = model_config("vit-digits", dim=8, depth=1, num_heads=2)
    model = get_preset("vit-digits").model_cls(cfg)
    (tmp_path / "run_config.json").write_text(
        json.dumps({"model": "vit-digits", "model_config": dataclasses.asdict(cfg)}, default=str))
    save_checkpoint(tmp_path / "checkpoint.pt", {"format": CHECKPOINT_FORMAT, "step": 3, "model": model.state_dict(),
                                                 "optimizer": {}, "rng": {}, "config": TrainConfig().to_dict()})
    (tmp_path / "summary.json").write_text('{"status": "compl')
    with pytest.warns(UserWarning, match=r"summary\.json is unreadable"):
        run = diffusionformer.load_run(tmp_path)
    assert run.summary is None and run.step == 3
    for key, value in model.state_dict().items():
        assert torch.equal(run.model.state_dict()[key], value), key
