"""Reliability walk 60j: exact resume of killed runs, over the task kinds and interruption points that
``test_edge_probes_resume_matrix.py`` and ``test_edge_probes_reproducibility_54.py`` leave out.

Found and fixed (``test_bug_...``): ``loggers`` may change on a resume (``RESUMABLE_FIELDS``), but a ``metrics.csv``
switched on at a resume held only the rows written since (steps 2 to 4 lost), and one switched off for a segment a
gap; a resume now writes the table again from ``metrics.jsonl`` cut back to the checkpoint
(``loggers.LogGroup.truncate``), so it is the uninterrupted run's, row for row.

Probed and found sound (pinned below where cheap):

- through ``run_experiment``: k-fold cross-validation (MUTAG, ``folds = 2``, ``select_by`` and ``reach``) killed in
  seed 1's run (fold 1) in an update off the checkpoints and right after its checkpoint write, with the data cache
  emptied before the resume (the TU dataset copied and processed again); DINO with multi-crop views (local crops,
  noise, flips, k-NN settings); character GPT, neighbour-sampled node mini-batches with sampled evaluation, CSBM
  nodes, associative recall with gradient accumulation: the ``RunResult`` (selected and reach values), ``results.json``
  and ``results.md`` (but their wall times), the plots, every ``metrics.jsonl`` record but its wall-clock fields, the
  weights and every generator state equal the uninterrupted comparison's;
- through the ``Trainer``: a kill at every update and in every evaluation of runs whose checkpoint, log and
  evaluation steps do not line up (checkpoints every 3 or 1 or only the final one, logs every 2 or past ``max_steps``,
  no evaluation or only at 5), for all ten task kinds of the matrix; a run killed three times (resumed, killed before
  its first new checkpoint, resumed, killed after one, resumed); a kill right after the final checkpoint resumed under
  another torch thread count (it trains nothing and records none); the fields a resume may change
  (``RESUMABLE_FIELDS``: evaluation, log and checkpoint intervals, ``eval_steps``, loggers) leave the updates as
  they were (evaluations draw from no training stream);
- a checkpoint written before the ``torch_threads`` / ``world_sizes`` / ``torch_versions`` lists, ``rank_rng``,
  ``amp``, ``model_record`` (warned) or ``elapsed``: resumed to the same weights and log; ``resume=<folder>`` is
  refused naming the folder; a resume under another torch thread count ends with other weights on the CPU, as the
  docs say, and records both counts (``torch_threads``) and notes them.

A ``metrics.csv`` that a resume no longer writes (``"csv"`` dropped from ``loggers``) is cut back to the checkpoint
and gets nothing after (test_review_60t.py; a later resume with it on writes it again from the log). Not changed: a
checkpoint written before the log window was saved (no ``window`` entry) resumes with the window the
checkpoint cut dropped from the next train record (a mean over fewer updates), without a word; no such checkpoint is
known to exist outside this project's history, and every checkpoint the trainer writes holds the entry.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from diffusionformer.data import load_dataset
from diffusionformer.data.paths import DATA_ENV
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.testing import interrupt_on_call
from diffusionformer.train import load_checkpoint, read_metrics
from diffusionformer.train.trainer import Trainer

_spec = importlib.util.spec_from_file_location("_resume_matrix_60j",
                                               Path(__file__).with_name("test_edge_probes_resume_matrix.py"))
_matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_matrix)  # its kinds, killing task and bitwise comparison (imported, not collected)


@pytest.fixture(scope="module")
def data():
    return {"digits": load_dataset("digits", seed=0), "karate": load_dataset("karate", seed=0),
            "text": load_dataset("pydoc-chars", seed=0)}


def _quiet(_):
    return None


def _timeless(value):
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k not in ("elapsed", "elapsed_mean", "time")}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def _untimed(path):
    lines = path.read_text().splitlines()
    timed = {i for i, line in enumerate(lines) if line.startswith("|") and line.rstrip().endswith("time/run (s) |")}
    out, cut = [], False
    for i, line in enumerate(lines):
        cut = i in timed or (cut and line.startswith("|"))
        out.append(line.rsplit("|", 2)[0] if cut else line)
    return out


def _assert_same_comparison(cfg, clean, resumed, out_clean, out_resumed):
    assert [_timeless(dataclasses.asdict(r)) for r in clean] == [_timeless(dataclasses.asdict(r)) for r in resumed]
    a, b = out_clean / cfg.name, out_resumed / cfg.name
    assert _timeless(json.loads((a / "results.json").read_text())) == \
        _timeless(json.loads((b / "results.json").read_text()))
    # results.md but its wall-clock column (time/run, the last cell of a row that has one)
    assert _untimed(a / "results.md") == _untimed(b / "results.md")
    for task in cfg.tasks:
        for setting in cfg.operators:
            for seed in cfg.seeds:
                ra, rb = (run_dir(o / cfg.name, task.name, setting.name, seed) for o in (out_clean, out_resumed))
                assert _timeless(read_metrics(ra)) == _timeless(read_metrics(rb)), (task.name, seed)
                ca, cb = load_checkpoint(ra / "checkpoint.pt"), load_checkpoint(rb / "checkpoint.pt")
                _matrix._same(ca["model"], cb["model"], "model")
                _matrix._same(ca["optimizer"], cb["optimizer"], "optimizer")
                _matrix._same(ca["rng"], cb["rng"], "rng")


_TRAIN = {"max_steps": 7, "batch_size": 8, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2, "eval_interval": 2,
          "log_interval": 3, "checkpoint_interval": 4}


def _comparison(task):
    return load_experiment_config({"name": "walk", "seeds": [0, 1], "operators": [{"name": "attention"}],
                                   "tasks": [task]})


def _killed_then_resumed(cfg, out, method, call, after=False, before_resume=None):
    with pytest.raises(KeyboardInterrupt), interrupt_on_call(Trainer, method, call, after=after):
        run_experiment(cfg, out, progress=False, log=_quiet)
    if before_resume is not None:
        before_resume()
    return run_experiment(cfg, out, progress=False, log=_quiet)


@pytest.mark.parametrize(("method", "call", "after", "start"), [("_update", 13, False, 4), ("_save", 3, True, 4)],
                         ids=["seed1-update6", "seed1-after-checkpoint4"])
def test_pins_a_k_fold_run_killed_and_resumed_after_its_data_cache_was_rebuilt_equals_the_clean_one(
        tmp_path, cache, monkeypatch, method, call, after, start):
    """MUTAG in 2 folds (seed 1 tests on fold 1) with select_by and reach: seed 1's run killed in update 6 (its
    checkpoint at 4) or right after its checkpoint of step 4, the data cache (the copied and processed TU dataset)
    emptied, resumed: the comparison equals the uninterrupted one (results, tables, logs, weights, generators)."""
    import os

    repo = Path(__file__).resolve().parents[2]  # $DIFFUSIONFORMER_DATA, else the staged <repo>/../shared/data
    root = next((p for p in (Path(os.environ.get(DATA_ENV) or repo / "nowhere"), repo.parent / "shared" / "data")
                 if (p / "tudataset" / "MUTAG.zip").is_file()), None)
    if root is None:
        pytest.skip(f"needs the TU benchmark data (${DATA_ENV}/tudataset/MUTAG.zip or <repo>/../shared/data)")
    monkeypatch.setenv(DATA_ENV, str(root))
    cfg = _comparison({"name": "g", "dataset": "mutag", "model": "graph-graph-small", "folds": 2,
                       "select_by": "val_acc", "reach": {"val_acc": 0.5},
                       "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2}, "train": _TRAIN})
    clean = run_experiment(cfg, tmp_path / "clean", progress=False, log=_quiet)
    resumed = _killed_then_resumed(cfg, tmp_path / "killed", method, call, after,
                                   before_resume=lambda: shutil.rmtree(cache))
    assert cache.is_dir()  # built again by the resume
    summary = json.loads((run_dir(tmp_path / "killed" / "walk", "g", "attention", 1) / "summary.json").read_text())
    assert summary["resumed_from"] == start
    _assert_same_comparison(cfg, clean, resumed, tmp_path / "clean", tmp_path / "killed")


def test_pins_dino_with_multi_crop_views_killed_in_an_evaluation_off_the_checkpoints_equals_the_clean_run(tmp_path):
    """DINO with two local crops, noise, flips and its own k-NN settings: seed 1's run killed in its evaluation of
    step 6 (after the checkpoint of step 4), resumed through the runner: the comparison equals the clean one."""
    cfg = _comparison({"name": "d", "dataset": "digits", "model": "dino-digits", "metric": "knn_val_acc",
                       "eval_batch_size": 32, "ssl": {"local_crops": 2, "noise_std": 0.1, "flip_prob": 0.5,
                                                      "knn_k": 5},
                       "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2, "out_dim": 16, "head_hidden": 16,
                                           "head_bottleneck": 8, "schedule_steps": 7},
                       "train": _TRAIN})
    clean = run_experiment(cfg, tmp_path / "clean", progress=False, log=_quiet)
    resumed = _killed_then_resumed(cfg, tmp_path / "killed", "_evaluate", 7)  # seed 0: 2, 4, 6, 7; seed 1: 2, 4, 6
    summary = json.loads((run_dir(tmp_path / "killed" / "walk", "d", "attention", 1) / "summary.json").read_text())
    assert summary["resumed_from"] == 4
    _assert_same_comparison(cfg, clean, resumed, tmp_path / "clean", tmp_path / "killed")


@pytest.mark.parametrize("kind", ["gpt-text", "minibatch", "dino"])
def test_pins_a_kill_at_every_update_and_evaluation_of_unaligned_intervals_resumes_bit_exactly(tmp_path, data, kind):
    """Checkpoints every 3 updates, logs every 2, evaluations at 5 and 7 (the final one), JSON lines and CSV logs:
    killed at each of the 7 updates and in each evaluation, every resumed run equals the uninterrupted one."""
    config = _matrix._config(max_steps=7, lr_decay_steps=7, checkpoint_interval=3, log_interval=2, eval_interval=5,
                             loggers=("jsonl", "csv"))
    ref = _matrix._fit(kind, data, tmp_path / "ref", config)
    kills = [dict(at_step=s) for s in range(7)] + [dict(at_eval=1), dict(at_eval=2)]
    for kill in kills:
        name = "-".join(f"{k}{v}" for k, v in kill.items())
        res = _matrix._killed_and_resumed(kind, data, tmp_path, config, name, **kill)
        _matrix._assert_same_run(ref, res)


@pytest.mark.parametrize("kind", ["dino", "minibatch"])
def test_pins_a_run_killed_three_times_resumes_bit_exactly(tmp_path, data, kind):
    """Killed in update 5 (checkpoint at 3), resumed and killed in update 6 (before its next checkpoint), resumed and
    killed in the evaluation of step 8 (after the checkpoint at 6), resumed: the uninterrupted run's bits."""
    config = _matrix._config(max_steps=9, lr_decay_steps=9, checkpoint_interval=3, log_interval=2, eval_interval=4)
    ref = _matrix._fit(kind, data, tmp_path / "ref", config)
    out = tmp_path / "killed"
    _matrix._fit(kind, data, out, config, at_step=4)
    _matrix._fit(kind, data, out, config, resume=True, model_seed=99, at_step=5)
    _matrix._fit(kind, data, out, config, resume=True, model_seed=98, at_eval=2)  # evaluations at 4, then 8
    res = _matrix._fit(kind, data, out, config, resume=True, model_seed=97)
    assert res.summary["resumed_from"] == 6
    _matrix._assert_same_run(ref, res)


@pytest.mark.parametrize("kind", ["gpt-text", "minibatch", "dino", "vit-augment"])
def test_pins_the_fields_a_resume_may_change_leave_the_updates_as_they_were(tmp_path, data, kind):
    """RESUMABLE_FIELDS says evaluation, log and checkpoint intervals, eval_steps and loggers "do not change the
    sequence of updates": a run under each other value ends with the same weights (evaluations, sampled ones and
    text windows included, draw from no training stream)."""
    base = _matrix._config()
    ref = _matrix._fit(kind, data, tmp_path / "ref", base)
    for i, change in enumerate([dict(eval_interval=1), dict(eval_interval=0), dict(eval_steps=1),
                                dict(log_interval=1), dict(checkpoint_interval=1), dict(loggers=("jsonl", "csv"))]):
        res = _matrix._fit(kind, data, tmp_path / f"v{i}", dataclasses.replace(base, **change))
        _matrix._same(ref.model.state_dict(), res.model.state_dict(), f"model under {change}")
        assert torch.equal(load_checkpoint(ref.checkpoint_path)["rng"]["generator"],
                           load_checkpoint(res.checkpoint_path)["rng"]["generator"]), change


# --- bugs found -------------------------------------------------------------------------------------------------

def test_bug_a_csv_log_switched_on_at_a_resume_holds_every_record_of_the_run(tmp_path, data):
    """Bug: ``loggers`` may change on a resume (``RESUMABLE_FIELDS``) and the loggers module promises that every
    writer gets the JSON-lines log's records, but ``metrics.csv`` held only the records written since it was
    switched on: a run resumed from step 4 with ``"csv"`` added lacked steps 2 to 4, and one whose CSV was off for a
    segment lacked that segment's steps (a gap in the curve). Now a resume refills the CSV from ``metrics.jsonl``
    (cut back to the checkpoint), so it equals the log of the run, and the uninterrupted run's CSV, row for row."""
    from diffusionformer.train import read_metrics_csv

    both = _matrix._config(checkpoint_interval=2, loggers=("jsonl", "csv"))
    jsonl = _matrix._config(checkpoint_interval=2)
    ref = _matrix._fit("gcn-node", data, tmp_path / "ref", both)
    expected = _matrix._csv_rows(ref.out_dir / "metrics.csv")
    assert [r["step"] for r in expected] == ["2", "3", "4", "6", "6"]

    added = tmp_path / "added"  # jsonl alone, killed in update 5 (checkpoint 4); resumed with the CSV on
    _matrix._fit("gcn-node", data, added, jsonl, at_step=5)
    _matrix._fit("gcn-node", data, added, both, resume=True)
    assert _matrix._csv_rows(added / "metrics.csv") == expected
    assert _timeless_records(read_metrics_csv(added)) == _timeless_records(read_metrics(added))

    gap = tmp_path / "gap"  # CSV on, killed in update 3; off, killed in update 5; on again to the end
    _matrix._fit("gcn-node", data, gap, both, at_step=3)
    _matrix._fit("gcn-node", data, gap, jsonl, resume=True, at_step=5)
    _matrix._fit("gcn-node", data, gap, both, resume=True)
    assert _matrix._csv_rows(gap / "metrics.csv") == expected


def _timeless_records(records):
    return [{k: v for k, v in r.items() if k not in ("elapsed", "time")} for r in records]
