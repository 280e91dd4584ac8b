"""Edge-case probes of the comparisons, third round (``experiments.compare``, ``publish.summary_table``,
``experiments.results``).

Found and fixed (tests named ``test_bug_...``):

- ``results.select_evaluation``: promised the earliest evaluation among ties of ``select_by`` but took the first in
  the log's order, so a log whose evaluations are not in step order (``first_reach`` sorts them) selected a later step.
"""

from __future__ import annotations

import json

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.config import TaskConfig
from diffusionformer.experiments.results import RunResult, first_reach, run_dir, select_evaluation


def _ev(step, **metrics):
    return {"split": "eval", "step": step, "metrics": metrics}


def test_bug_select_evaluation_breaks_ties_by_the_earliest_step_in_any_log_order():
    """Bug: ``select_evaluation`` walked the records in the log's order, so with evaluations out of step order a tie
    of ``select_by`` chose the later step (and its metric), not the earliest as documented."""
    t = TaskConfig("t", "digits", "vit-digits", select_by="val_acc")
    recs = [_ev(20, val_acc=0.8, test_acc=0.65), _ev(10, val_acc=0.8, test_acc=0.60), _ev(5, val_acc=0.7, test_acc=0.9)]
    assert select_evaluation(recs, t) == (0.60, 10)
    assert select_evaluation(list(reversed(recs)), t) == (0.60, 10)
    lt = TaskConfig("t", "digits", "vit-digits", select_by="val_loss")
    recs = [_ev(30, val_loss=0.4, test_acc=0.7), _ev(20, val_loss=0.4, test_acc=0.6), _ev(10, val_loss=0.5, test_acc=0.5)]
    assert select_evaluation(recs, lt) == (0.6, 20)


def test_first_reach_at_step_zero_and_on_a_non_monotone_curve():
    t = TaskConfig("t", "digits", "vit-digits", reach={"val_loss": 0.5})
    recs = [_ev(20, val_loss=0.45), _ev(0, val_loss=0.5), _ev(10, val_loss=0.9)]
    assert first_reach(recs, t) == 0  # 0 is a step, not "never"
    recs = [_ev(10, val_loss=0.4), _ev(20, val_loss=0.9), _ev(30, val_loss=float("nan"))]
    assert first_reach(recs, t) == 10


def _study(out, name, ops, values, metric):
    src = out / name
    rows = []
    for op in ops:
        for s, v in values[op].items():
            rdir = run_dir(src, "t", op, s)
            rdir.mkdir(parents=True)
            rec = {"step": 2, "split": "eval", "metrics": {metric: v}}
            (rdir / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
            (rdir / "summary.json").write_text(json.dumps({"status": "completed", "eval": rec}))
            rows.append(RunResult("t", op, s, "completed", metric, v, dict(rec["metrics"]), 10, 1.0))
    (src / "results.json").write_text(json.dumps({"runs": [r.__dict__ for r in rows], "summary": []}))
    return load_experiment_config({
        "name": name, "seeds": [0, 1, 2], "operators": [{"name": o, "laplacian_heads": i} for i, o in enumerate(ops)],
        "tasks": [{"name": "t", "dataset": "digits", "model": "vit-digits", "metric": metric, "train": {"max_steps": 4}}]})


def test_summary_pairs_by_seed_signs_losses_and_holm_over_cells_as_scipy(tmp_path):
    """A loss comparison whose baseline is not ``attention`` (seeds stored out of order) against scipy's ttest_rel."""
    sps = pytest.importorskip("scipy.stats")
    from diffusionformer.experiments.publish import summary_table

    a = _study(tmp_path, "A", ["attention", "lap"], {"attention": {0: 0.5, 1: 0.6, 2: 0.7},
                                                     "lap": {2: 0.78, 0: 0.55, 1: 0.62}}, "test_acc")
    b = _study(tmp_path, "B", ["lap", "attention"], {"lap": {0: 1.5, 1: 1.6, 2: 1.7},
                                                     "attention": {2: 1.62, 0: 1.4, 1: 1.55}}, "test_loss")
    pa = sps.ttest_rel([0.55, 0.62, 0.78], [0.5, 0.6, 0.7]).pvalue
    pb = sps.ttest_rel([1.4, 1.55, 1.62], [1.5, 1.6, 1.7]).pvalue
    holm = sorted([pa, pb])
    holm = {holm[0]: min(1, 2 * holm[0]), holm[1]: max(min(1, 2 * holm[0]), holm[1])}
    lines = summary_table([a, b], tmp_path).splitlines()
    assert f"+0.0500 (p {pa:.3f}; Holm {holm[pa]:.3f})" in lines[2]
    assert f"+0.0767 (p {pb:.3f}; Holm {holm[pb]:.3f})" in lines[3]  # attention's loss is lower: positive
