"""Tests written to kill mutants that survived a mutation audit of the statistics and analysis code.

Each test names the mutant it kills. References are scipy.stats or hand-computed values; everything
is deterministic, float64 and CPU-only.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

scipy_stats = pytest.importorskip("scipy.stats")

from diffusionformer.experiments import gaps  # noqa: E402
from diffusionformer.experiments.compare import contrasts, format_p  # noqa: E402
from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig  # noqa: E402
from diffusionformer.experiments.results import RunResult, first_reach, select_evaluation  # noqa: E402
from diffusionformer.experiments.stats import holm, paired_difference, wilcoxon_p  # noqa: E402
from diffusionformer.experiments.tables import aggregate, format_table  # noqa: E402

OPS = [OperatorSetting("attention"), OperatorSetting("lap", laplacian_heads=1)]


def _run(task, op, seed, value, **kw):
    return RunResult(task, op, seed, kw.pop("status", "completed"), kw.pop("metric", "test_acc"), value, **kw)


def _row(text, op):
    return next(line for line in text.splitlines() if line.startswith(f"| {op} |")).split(" | ")


# ----------------------------------------------------------------------------- stats.py
def test_pairing_is_by_seed_key_not_by_insertion_order():
    """Kills: stats._pairs pairing ``zip(a.values(), b.values())`` (by position) instead of by seed."""
    a = {2: 0.91, 0: 0.80, 1: 0.86, 3: 0.70}
    b = {0: 0.78, 1: 0.85, 2: 0.86, 3: 0.69}
    seeds = sorted(a)
    x, y = [a[s] for s in seeds], [b[s] for s in seeds]
    ref = scipy_stats.ttest_rel(x, y)
    r = paired_difference(a, b)
    assert r.mean == pytest.approx(np.mean(np.subtract(x, y)), rel=1e-12)
    assert r.t == pytest.approx(ref.statistic, rel=1e-10) and r.p == pytest.approx(ref.pvalue, rel=1e-9)


def test_wilcoxon_normal_approximation_with_ties_matches_scipy_tie_correction():
    """Kills: stats.wilcoxon_p tie correction ``/ 48`` -> ``/ 24`` (only reached beyond 50 differences with ties)."""
    rng = np.random.default_rng(11)
    d = np.round(rng.normal(0.15, 1.0, 70), 1)  # one decimal: many tied |d|
    d = d[d != 0.0]
    assert len(d) > 50 and len(np.unique(np.abs(d))) < len(d) / 2
    ref = scipy_stats.wilcoxon(d, method="approx", correction=False)
    assert wilcoxon_p(d) == pytest.approx(ref.pvalue, rel=1e-9)


# ----------------------------------------------------------------------------- compare.py
def test_format_p_threshold_and_three_decimals():
    """Kills: compare.format_p ``p < 0.001`` moved (e.g. to 0.0001) and the three-decimal rounding changed."""
    assert format_p(None) == "n/a"
    assert format_p(0.0005) == "<0.001" and format_p(0.00099) == "<0.001"
    assert format_p(0.001) == "0.001" and format_p(0.01234) == "0.012" and format_p(0.0456) == "0.046"
    assert format_p(1.0) == "1.000"


def test_contrasts_carry_the_direction_of_better():
    """Kills: compare.contrasts ``minimize = task.minimize`` negated and ``minimize = True`` for steps dropped."""
    acc = TaskConfig("acc", "digits", "vit-digits", reach={"val_acc": 0.9})
    loss = TaskConfig("lm", "digits", "vit-digits", metric="val_loss")
    assert loss.minimize and not acc.minimize
    cfg = ExperimentConfig("d", [acc, loss], OPS, seeds=[0, 1, 2])
    runs = []
    for s in range(3):
        for op, k in (("attention", 0.0), ("lap", 1.0)):
            runs.append(_run("acc", op, s, 0.8 + 0.01 * s + 0.02 * k, reach_step=500 + 100 * s - 50 * k + 10 * s * k))
            runs.append(_run("lm", op, s, 2.0 + 0.1 * s - 0.05 * k - 0.01 * s * k, metric="val_loss"))
    found = {(c.task, c.kind): c for c in contrasts(aggregate(runs), cfg)}
    assert found[("acc", "final")].minimize is False
    assert found[("acc", "reach")].minimize is True  # fewer steps to the threshold is better
    assert found[("lm", "final")].minimize is True
    # setting minus baseline, whatever is better: lap is faster (fewer steps) and has lower loss
    assert found[("acc", "reach")].diff.mean < 0 and found[("lm", "final")].diff.mean < 0


# ----------------------------------------------------------------------------- tables.py
def test_by_seed_pairs_by_seed_when_a_run_is_non_finite():
    """Kills: tables.aggregate ``by_seed`` keyed by position among the finite values instead of by seed."""
    task = TaskConfig("a", "digits", "vit-digits")
    cfg = ExperimentConfig("p", [task], OPS, seeds=[0, 1, 2, 3])
    att = [0.80, 0.82, 0.84, 0.79]
    lap = [float("nan"), 0.85, 0.88, 0.80]  # seed 0's run diverged
    runs = [_run("a", "attention", s, v) for s, v in enumerate(att)] + [_run("a", "lap", s, v) for s, v in enumerate(lap)]
    table = aggregate(runs)
    assert next(r for r in table if r["operator"] == "lap")["by_seed"] == {1: 0.85, 2: 0.88, 3: 0.80}
    (c,) = contrasts(table, cfg)
    ref = scipy_stats.ttest_rel(lap[1:], att[1:])
    assert c.diff.n == 3 and c.diff.p == pytest.approx(ref.pvalue, rel=1e-9)


def test_aggregate_std_is_the_sample_std_over_seeds():
    """Kills: tables.aggregate ``statistics.stdev`` -> ``pstdev`` for the final metric's spread."""
    task = TaskConfig("a", "digits", "vit-digits")
    cfg = ExperimentConfig("m", [task], OPS, seeds=[0, 1, 2])
    vals = {"attention": [0.80, 0.82, 0.86], "lap": [0.85, 0.86, 0.90]}
    table = aggregate([_run("a", op, s, v) for op, vs in vals.items() for s, v in enumerate(vs)])
    for row in table:
        x = np.array(vals[row["operator"]])
        assert row["std"] == pytest.approx(x.std(ddof=1), rel=1e-12) and row["mean"] == pytest.approx(x.mean(), rel=1e-12)
    text = format_table(table, cfg)
    assert _row(text, "attention")[1] == f"{np.mean(vals['attention']):.4f} ± {np.std(vals['attention'], ddof=1):.4f}"
    assert f"{np.std(vals['attention'], ddof=1):.4f}" != f"{np.std(vals['attention']):.4f}"


def test_bold_marks_holm_adjusted_not_raw_p_below_005():
    """Kills: tables._contrast_cells bolding on the unadjusted p instead of the Holm-adjusted p."""
    task = TaskConfig("a", "digits", "vit-digits")
    ops = OPS + [OperatorSetting("lap2", laplacian_heads=2), OperatorSetting("lap3", laplacian_heads=3)]
    cfg = ExperimentConfig("b", [task], ops, seeds=[0, 1, 2, 3])
    vals = {"attention": [0.80, 0.82, 0.84, 0.81], "lap": [0.82, 0.86, 0.85, 0.84],
            "lap2": [0.81, 0.85, 0.86, 0.82], "lap3": [0.83, 0.85, 0.88, 0.83]}
    runs = [_run("a", op, s, v) for op, vs in vals.items() for s, v in enumerate(vs)]
    p = {op: scipy_stats.ttest_rel(vals[op], vals["attention"]).pvalue for op in ("lap", "lap2", "lap3")}
    order = sorted(p, key=p.get)  # hand Holm, m = 3
    adj, running = {}, 0.0
    for k, op in enumerate(order):
        running = max(running, min(1.0, (3 - k) * p[op]))
        adj[op] = running
    assert p["lap"] < 0.05 <= adj["lap"] and p["lap2"] < 0.05 <= adj["lap2"] and adj["lap3"] < 0.05  # the test has power
    text = format_table(aggregate(runs), cfg)
    for op in ("lap", "lap2", "lap3"):
        cell = _row(text, op)[7]
        assert cell == (f"**{adj[op]:.3f}**" if adj[op] < 0.05 else f"{adj[op]:.3f}"), (op, cell)


def test_steps_and_selected_cells_use_the_sample_std_and_whole_steps():
    """Kills: tables ``statistics.stdev`` -> ``pstdev`` in the reach and selected cells, reach digits 0 -> 4,
    and failed runs counted in ``reach_by_seed``."""
    task = TaskConfig("a", "digits", "vit-digits", select_by="val_acc", reach={"val_acc": 0.9})
    cfg = ExperimentConfig("s", [task], OPS, seeds=[0, 1, 2])
    steps = {"attention": [1000, 1300, 1100], "lap": [900, 1000, 1150]}
    sel = {"attention": [0.70, 0.74, 0.75], "lap": [0.76, 0.77, 0.81]}
    runs = [_run("a", op, s, 0.8, reach_step=steps[op][s], selected_value=sel[op][s], selected_step=100)
            for op in steps for s in range(3)]
    runs.append(_run("a", "lap", 3, None, status="failed: nan loss"))  # a failed run: not a censored pair
    table = aggregate(runs)
    lap = next(r for r in table if r["operator"] == "lap")
    assert lap["reach_by_seed"] == {0: 900, 1: 1000, 2: 1150}
    text = format_table(table, cfg)
    sd = statistics.stdev(steps["lap"])  # sample std, 125.83
    assert abs(sd - statistics.pstdev(steps["lap"])) > 10
    reach_sec = text.split("steps to val_acc")[1]
    assert f"| lap | {statistics.fmean(steps['lap']):.0f} ± {sd:.0f} (3 of 3) |" in reach_sec  # the failed run is not counted
    d = np.subtract(steps["lap"], steps["attention"])
    ref = scipy_stats.ttest_rel(steps["lap"], steps["attention"])
    row = _row(reach_sec, "lap")
    ci = ref.confidence_interval(0.95)
    assert row[2:5] == [f"{d.mean():+.0f}", f"[{ci.low:+.0f}, {ci.high:+.0f}]", "2"]
    sel_sec = text.split("at best val_acc")[1].split("steps to")[0]
    want = f"{statistics.fmean(sel['lap']):.4f} ± {statistics.stdev(sel['lap']):.4f}"
    assert _row(sel_sec, "lap")[1] == want


# ----------------------------------------------------------------------------- gaps.py
def test_best_validation_loss_takes_the_earliest_of_tied_evaluations():
    """Kills: gaps.run_gaps picking the latest instead of the earliest evaluation among tied best val losses."""
    evals = [{"split": "eval", "step": s, "metrics": {"train_loss": t, "val_loss": v}}
             for s, t, v in [(100, 2.0, 2.5), (200, 1.5, 2.25), (300, 1.2, 2.25), (400, 1.0, 2.75)]]
    g = gaps.run_gaps(evals)
    assert g["best_step"] == 200.0 and g["best_gap"] == pytest.approx(0.75)


def _gap_config():
    task = TaskConfig("t", "pydoc-chars", "gpt-char-tiny", metric="val_loss")
    return ExperimentConfig("g", [task], OPS, seeds=[0, 1, 2, 3], primary=["lap"])


def test_primary_table_pairs_by_seed_when_seeds_differ():
    """Kills: gaps.primary_table pairing the baseline by position instead of by seed."""
    base = {0: 2.0, 1: 2.3, 2: 2.1, 3: 2.6}
    lap = {1: 2.2, 2: 2.05, 3: 2.4}  # seed 0 did not finish
    q = lambda v: {"final_val": v, "final_gap": 0.0, "final_train": 1.0, "best_val": v, "best_gap": 0.0, "best_step": 1.0}  # noqa: E731
    rows = {"t": {"attention": {s: q(v) for s, v in base.items()}, "lap": {s: q(v) for s, v in lap.items()}}}
    text = gaps.primary_table(_gap_config(), "unused", rows=rows)
    ref = scipy_stats.ttest_rel([lap[s] for s in (1, 2, 3)], [base[s] for s in (1, 2, 3)])
    row = next(line for line in text.splitlines() if line.startswith("| t, lap, final val loss"))
    cells = row.split(" | ")
    assert cells[1] == f"{np.mean([lap[s] - base[s] for s in (1, 2, 3)]):+.4f}"
    assert cells[3:6] == [f"{ref.statistic:.2f}", "2", f"{ref.pvalue:.2g}"]


def test_primary_table_cells_and_exploratory_rows():
    """Kills: gaps.primary_table with the exploratory best-val row labelled primary / inside the Holm family,
    the p column showing Wilcoxon's, or the CI rounded to three decimals."""
    base = {0: 2.0, 1: 2.3, 2: 2.1, 3: 2.6}
    lap = {0: 1.93, 1: 2.2, 2: 2.05, 3: 2.4}
    best = {0: 1.8, 1: 2.25, 2: 2.0, 3: 2.5}
    q = lambda v, b: {"final_val": v, "final_gap": v - 1.0, "final_train": 1.0, "best_val": b, "best_gap": 0.0,  # noqa: E731
                      "best_step": 1.0}
    rows = {"t": {"attention": {s: q(v, v) for s, v in base.items()}, "lap": {s: q(v, best[s]) for s, v in lap.items()}}}
    text = gaps.primary_table(_gap_config(), "unused", rows=rows)
    lines = [line for line in text.splitlines() if line.startswith("| t, lap") or line.startswith("| *exploratory")]
    assert len(lines) == 2 and lines[1].startswith("| *exploratory:* t, lap, best val loss")
    x, y = [lap[s] for s in range(4)], [base[s] for s in range(4)]
    ref = scipy_stats.ttest_rel(x, y)
    ci = ref.confidence_interval(0.95)
    w = scipy_stats.wilcoxon(np.subtract(x, y), method="exact").pvalue
    assert abs(w - ref.pvalue) > 0.01  # the two p columns differ here
    cells = lines[0].split(" | ")
    assert cells[2:8] == [f"[{ci.low:+.4f}, {ci.high:+.4f}]", f"{ref.statistic:.2f}", "3", f"{ref.pvalue:.2g}",
                          f"{w:.2g}", f"{ref.pvalue:.2g} |"]  # a family of one: Holm p = p
    assert lines[1].rstrip().endswith("|  |")  # exploratory: not adjusted
    assert "adjusted over the 1 primary cells" in text


# ----------------------------------------------------------------------------- results.py
def test_select_by_a_loss_takes_the_lowest_and_reach_meets_the_threshold_inclusively():
    """Kills: results.select_evaluation maximising a loss, first_reach with ``>`` instead of ``>=``, and
    first_reach treating a loss as higher-is-better."""
    t = TaskConfig("t", "digits", "vit-digits", select_by="val_loss")
    evals = [{"split": "eval", "step": s, "metrics": {"val_loss": vl, "test_acc": a}}
             for s, vl, a in [(10, 1.0, 0.60), (20, 0.5, 0.65), (30, 0.7, 0.70)]]
    assert select_evaluation(evals, t) == (0.65, 20)
    acc = TaskConfig("t", "digits", "vit-digits", reach={"val_acc": 0.9})
    hit = [{"split": "eval", "step": s, "metrics": {"val_acc": a}} for s, a in [(10, 0.5), (20, 0.9), (30, 0.95)]]
    assert first_reach(hit, acc) == 20  # exactly at the threshold counts
    loss = TaskConfig("t", "digits", "vit-digits", reach={"val_loss": 1.0})
    down = [{"split": "eval", "step": s, "metrics": {"val_loss": v}} for s, v in [(10, 2.0), (20, 1.0), (30, 0.5)]]
    assert first_reach(down, loss) == 20
    assert first_reach(list(reversed(down)), loss) == 20  # in step order, not log order


# ----------------------------------------------------------------------------- analyze.py
def test_analysis_summary_and_cells_use_the_sample_std_and_welch_t_of_setting_minus_first():
    """Kills: analyze._summary / _cell ``stdev`` -> ``pstdev`` and Welch's t of ``base - values``."""
    from diffusionformer.experiments.analyze import _cell, _summary

    per_seed = [[{"layer": 0, "m": 1.0}], [{"layer": 0, "m": 2.0}], [{"layer": 0, "m": 4.0}],
                [{"layer": 0, "m": float("nan")}]]
    (row,) = _summary(per_seed)
    assert row["m"]["n"] == 3 and row["m"]["mean"] == pytest.approx(7 / 3)
    assert row["m"]["std"] == pytest.approx(np.std([1.0, 2.0, 4.0], ddof=1), rel=1e-12)
    assert _summary([[{"layer": 0, "m": 5.0}]])[0]["m"]["std"] == 0.0
    values, base = [1.0, 2.0, 4.0], [0.5, 0.6, 0.7]
    t = scipy_stats.ttest_ind(values, base, equal_var=False).statistic
    assert t > 0
    assert _cell(values, base) == f"2.333 ± {np.std(values, ddof=1):.2g} ({t:+.1f})"
    assert _cell(values, None) == f"2.333 ± {np.std(values, ddof=1):.2g}"


def test_holm_none_counts_as_one():
    """Kills: stats.holm counting a missing p as 0 (it must count as p = 1 in the family and stay None)."""
    out = holm([0.02, None, 0.01])
    assert out[1] is None and out[2] == pytest.approx(0.03) and out[0] == pytest.approx(0.04)
    assert math.isclose(holm([None, 0.3])[1], 0.6)


# ----------------------------------------------------------------------------- analysis/metrics.py
def test_cosine_normalises_tokens_just_above_eps_exactly():
    """Kills: metrics.mean_pairwise_cosine dividing by ``norm + eps`` instead of ``max(norm, eps)`` (tokens of
    norm 1e-11 > eps = 1e-12 must be unit vectors, so parallel tokens have cosine 1)."""
    import torch

    from diffusionformer.analysis.metrics import mean_pairwise_cosine

    X = torch.tensor([[[1e-11, 0.0], [2e-11, 0.0], [1.0, 0.0]]], dtype=torch.float64)
    assert mean_pairwise_cosine(X).item() == pytest.approx(1.0, abs=1e-12)
    Y = torch.tensor([[[1e-11, 0.0], [0.0, 3e-11], [-1.0, 0.0]]], dtype=torch.float64)  # cosines 0, -1, 0
    assert mean_pairwise_cosine(Y).item() == pytest.approx(-1.0 / 3.0, abs=1e-12)


def test_analysis_readme_compares_last_layers_against_the_first_setting_only():
    """Kills: analyze._markdown giving the first setting a t against itself, and reading layer 0 instead of the
    last layer for the last-layer columns."""
    from diffusionformer.experiments.analyze import _markdown

    def seed(first, last):
        layers = [{"layer": 0, "within_variance": first, "effective_rank": 2.0},
                  {"layer": 1, "within_variance": last, "effective_rank": 3.0 + last}]
        return {"layers": layers, "learned_operators": {}}

    att_last, lap_last = [1.0, 1.2, 1.1], [0.5, 0.7, 0.4]
    result = {"experiment": "x", "split": "test", "max_examples": 8, "tasks": {"t": {"dataset": "digits", "model": "m", "operators": {
        "attention": {"seeds": {s: seed(9.0, v) for s, v in enumerate(att_last)}},
        "lap": {"seeds": {s: seed(9.0 + s, v) for s, v in enumerate(lap_last)}}}}}}
    text = _markdown(result)
    att = next(line for line in text.splitlines() if line.startswith("| attention |")).split(" | ")
    lap = next(line for line in text.splitlines() if line.startswith("| lap |")).split(" | ")
    assert "(" not in " ".join(att)  # the first setting is the reference: no t
    t = scipy_stats.ttest_ind(lap_last, att_last, equal_var=False).statistic
    assert lap[2] == f"{np.mean(lap_last):.4g} ± {np.std(lap_last, ddof=1):.2g} ({t:+.1f})"  # within-var at layer L
    assert lap[1] == f"{10.0:.4g} ± {1.0:.2g}"  # within-var at layer 0, no t


def test_gap_cells_use_the_sample_std():
    """Kills: gaps._ms ``statistics.stdev`` -> ``pstdev``."""
    assert gaps._ms([1.0, 2.0, 4.0]) == f"{7 / 3:.4f} ± {np.std([1.0, 2.0, 4.0], ddof=1):.4f}" == "2.3333 ± 1.5275"
