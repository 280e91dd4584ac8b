"""Edge probes of the over-fitting tables (``experiments/gaps.py``) and the comparison figures
(``experiments/plots.py``): run logs with duplicate, unsorted, truncated and non-finite records, names that
markdown reads as syntax, one seed or one setting. References are float64 numbers recomputed by hand or with
numpy from the same records; figures are checked for the data they plot (their lines), not pixels.
"""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments import gaps
from diffusionformer.experiments.results import RunResult, run_dir


def _config(operators=("attention", "lap"), seeds=(0, 1), tasks=("t",), primary=(), metric="val_loss"):
    return load_experiment_config({
        "name": "g", "seeds": list(seeds), "primary": list(primary),
        "tasks": [{"name": t, "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": metric} for t in tasks],
        "operators": [{"name": o} if i == 0 else {"name": o, "laplacian_heads": 1} for i, o in enumerate(operators)]})


def _write(root, task, op, seed, records, tail="", status="completed"):
    rdir = run_dir(root / "g", task, op, seed)
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "summary.json").write_text(json.dumps({"status": status}))
    (rdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return rdir


def _ev(step, **metrics):
    return {"split": "eval", "step": step, "metrics": metrics}


# ----------------------------------------------------------------------------- gaps.py
def test_bug_an_evaluation_logged_twice_at_the_last_step_is_the_later_record():
    """Bug: ``_eval_losses`` sorted the ``(step, train, val)`` tuples, so of two evaluations of the same step the
    one with the larger train loss came last, whatever the log order: ``run_gaps``' final losses (and the gap curves)
    depended on the values, not on which record was written last (as ``summary.json``'s ``eval`` is)."""
    records = [_ev(100, train_loss=2.0, val_loss=2.5), _ev(200, train_loss=1.5, val_loss=2.2),
               _ev(200, train_loss=1.0, val_loss=2.0)]  # step 200 re-logged, later record lower
    g = gaps.run_gaps(records)
    assert (g["final_val"], g["final_train"]) == (2.0, 1.0)
    assert g["final_gap"] == pytest.approx(1.0, abs=0)
    assert (g["best_val"], g["best_step"], g["best_gap"]) == (2.0, 200.0, 1.0)
    # the other log order: the later record is still the final one
    g = gaps.run_gaps([records[0], records[2], records[1]])
    assert (g["final_val"], g["final_train"]) == (2.2, 1.5)
    # steps out of order, otherwise: by step
    assert gaps.run_gaps([records[1], records[0]])["final_val"] == 2.2


def test_bug_the_gap_curves_take_the_later_record_of_a_step_logged_twice(tmp_path):
    """Bug: the gap curves read the same value-sorted rows as ``run_gaps``: the curve's point at a step logged twice
    was the record with the larger train loss, not the later one."""
    config = _config(operators=("attention",), seeds=(0,))
    _write(tmp_path, "t", "attention", 0, [_ev(100, train_loss=2.0, val_loss=2.5), _ev(100, train_loss=1.0, val_loss=3.0)])
    entry = gaps.gap_curves(config, tmp_path)["t"]["attention"]
    steps, mean, std = entry["val"]
    assert steps.tolist() == [100] and mean.tolist() == [3.0] and std.tolist() == [0.0]
    assert entry["train"][1].tolist() == [1.0] and entry["gap"][1].tolist() == [2.0]


def test_gap_table_numbers_equal_a_float64_recomputation_with_corrupt_logs(tmp_path):
    """Pins: a truncated last line, a NaN validation loss, an evaluation without train loss, an unsorted log and a
    metric only some evaluations have: every number of the table is recomputed here from the kept evaluations."""
    config = _config()
    _write(tmp_path, "t", "attention", 0, [_ev(200, train_loss=1.5, val_loss=2.25), _ev(100, train_loss=2.0, val_loss=2.5),
                                            _ev(300, train_loss=1.0, val_loss=2.75, extra=1.0)])
    _write(tmp_path, "t", "attention", 1, [_ev(100, train_loss=2.125, val_loss=2.375), _ev(200, train_loss=1.25, val_loss=2.5)],
           tail='{"step": 300, "split": "eval", "metr')  # a killed run's torn last line
    _write(tmp_path, "t", "lap", 0, [_ev(100, train_loss=2.0, val_loss=2.0), _ev(200, train_loss=1.5, val_loss=math.nan),
                                      _ev(300, val_loss=1.0)])
    _write(tmp_path, "t", "lap", 1, [_ev(100, train_loss=1.75, val_loss=2.125), _ev(200, train_loss=1.125, val_loss=2.0)])
    # (final val, final train, best val, best step, gap at best) per seed, by hand
    want = {"attention": {0: (2.75, 1.0, 2.25, 200, 0.75), 1: (2.5, 1.25, 2.375, 100, 0.25)},
            "lap": {0: (2.0, 2.0, 2.0, 100, 0.0), 1: (2.0, 1.125, 2.0, 200, 0.875)}}
    rows = gaps.gap_rows(config, tmp_path)
    for op, by_seed in want.items():
        for seed, (fv, ft, bv, bs, bg) in by_seed.items():
            assert rows["t"][op][seed] == pytest.approx({"final_val": fv, "final_train": ft, "final_gap": fv - ft,
                                                         "best_val": bv, "best_step": float(bs), "best_gap": bg}, abs=1e-12)

    def ms(xs, d=4):
        return f"{statistics.fmean(xs):.{d}f} ± {statistics.stdev(xs):.{d}f}"

    def delta(key):
        d = np.array([rows["t"]["lap"][s][key] - rows["t"]["attention"][s][key] for s in (0, 1)], dtype=np.float64)
        t = d.mean() / (d.std(ddof=1) / math.sqrt(2))
        return f"{d.mean():+.4f} (t {t:+.1f}, 1 df)"

    col = {op: {k: [rows["t"][op][s][k] for s in (0, 1)] for k in rows["t"][op][0]} for op in want}
    table = gaps.gap_table(config, tmp_path, rows)
    lap = next(line for line in table.splitlines() if line.startswith("| lap |"))
    cells = [c.strip() for c in lap.strip("|").split("|")]
    assert cells == ["lap", "2", ms(col["lap"]["final_val"]), ms(col["lap"]["final_train"]), ms(col["lap"]["final_gap"]),
                     delta("final_val"), delta("final_gap"), ms(col["lap"]["best_val"]), ms(col["lap"]["best_step"], 0),
                     ms(col["lap"]["best_gap"]), delta("best_val")]


def test_one_seed_and_one_setting_give_n_a_spreads_and_no_deltas(tmp_path):
    """Pins: a comparison of one setting and one seed: the std is n/a (no sample std of one value), no Δ cells."""
    config = _config(operators=("attention",), seeds=(0,))
    _write(tmp_path, "t", "attention", 0, [_ev(10, train_loss=1.0, val_loss=1.5)])
    line = next(x for x in gaps.gap_table(config, tmp_path).splitlines() if x.startswith("| attention"))
    assert [c.strip() for c in line.strip("|").split("|")] == [
        "attention", "1", "1.5000 ± n/a", "1.0000 ± n/a", "0.5000 ± n/a", "", "", "1.5000 ± n/a", "10 ± n/a",
        "0.5000 ± n/a", ""]
    assert gaps.gap_table(_config(), tmp_path / "none") == ""  # empty results: no table
    assert gaps.primary_table(_config(primary=["lap"]), tmp_path / "none") == ""


def test_bug_names_markdown_reads_as_syntax_are_escaped_in_the_gap_tables(tmp_path):
    """Bug: the gap tables wrote task and setting names as they are (only a ``|`` escaped), where the comparison's
    other tables escape markdown (``tables._text``): a setting ``__lap__`` showed as a bold "lap", a task
    ``dig<b>its`` as HTML, in the heading, the rows and the primary contrasts."""
    config = _config(operators=("att*n", "__lap__"), tasks=("dig<b>its",), primary=["__lap__"])
    for op in ("att*n", "__lap__"):
        for seed, (t, v) in enumerate(((1.0, 1.5), (1.25, 2.0))):
            _write(tmp_path, "dig<b>its", op, seed, [_ev(10, train_loss=t, val_loss=v + (op == "att*n") * 0.1 * seed)])
    table = gaps.gap_table(config, tmp_path)
    assert "### dig\\<b\\>its: train/validation gap" in table
    assert "differences to att\\*n with" in table and "contrasts (named before the runs): \\_\\_lap\\_\\_;" in table
    assert "| \\_\\_lap\\_\\_ (primary) | 2 |" in table and "| att\\*n | 2 |" in table
    assert "<b>" not in table.replace("\\<b\\>", "") and "| __lap__" not in table
    primary = gaps.primary_table(config, tmp_path)
    assert "| dig\\<b\\>its, \\_\\_lap\\_\\_, final val loss |" in primary
    assert "against att\\*n, on the" in primary and "(setting - att\\*n)" in primary
    assert "| dig<b>its" not in primary


def test_unicode_names_keep_their_letters_in_the_tables(tmp_path):
    """Pins: a unicode task and setting name (no markdown in them) is written as it is."""
    config = _config(operators=("größe", "λ-half"), tasks=("τext",), seeds=(0,))
    for op in ("größe", "λ-half"):
        _write(tmp_path, "τext", op, 0, [_ev(10, train_loss=1.0, val_loss=1.5)])
    table = gaps.gap_table(config, tmp_path)
    assert "### τext: train/validation gap" in table and "| größe | 1 |" in table and "| λ-half | 1 |" in table


# ----------------------------------------------------------------------------- plots.py
@pytest.fixture
def saved(monkeypatch):
    pytest.importorskip("matplotlib")
    from diffusionformer.experiments import plots

    figures = []
    monkeypatch.setattr(plots, "_save_figure", lambda fig, path: figures.append((path.name, fig)))
    return figures


def _lines(figures, name, panel):
    fig = dict(figures)[name]
    return {ln.get_label(): (np.asarray(ln.get_xdata()).tolist(), np.asarray(ln.get_ydata(), dtype=float).tolist())
            for ln in fig.axes[panel].lines}


def test_bug_curves_leave_out_a_hand_edited_true_and_non_finite_values(tmp_path, saved):
    """Bug: ``plots._series`` took any int or float: a hand-edited ``true`` was an accuracy of 1.0 in the band's mean
    (the tables leave it out), and one seed's NaN made the mean NaN at that step and counted in the setting's n."""
    from diffusionformer.experiments import plots

    config = load_experiment_config({"name": "g", "seeds": [0, 1],
                                     "tasks": [{"name": "t", "dataset": "digits", "model": "vit-digits", "metric": "val_acc"}],
                                     "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}]})
    out = tmp_path / "g"

    def write(op, seed, loss, acc):
        rdir = run_dir(out, "t", op, seed)
        rdir.mkdir(parents=True)
        recs = [{"split": "train", "step": s, "loss": lo, "metrics": {}} for s, lo in zip((1, 2), loss)]
        recs += [{"split": "eval", "step": s, "metrics": {"val_acc": a}} for s, a in zip((1, 2), acc)]
        (rdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))

    write("attention", 0, (2.0, 1.0), (0.5, 0.75))
    write("attention", 1, (3.0, 2.0), (0.25, math.nan))
    write("lap", 0, (2.0, 1.5), (True, 0.5))
    write("lap", 1, (2.5, 1.0), (math.nan, math.nan))  # all NaN: no curve of this seed
    results = [RunResult(task="t", operator=op, seed=s, status="completed", metric="val_acc", value=0.5)
               for op in ("attention", "lap") for s in (0, 1)]
    plots.plot_experiment(out, config, results)
    metric = _lines(saved, "t_curves.png", 1)
    assert metric == {"attention (n=2)": ([1], [np.mean([0.5, 0.25])]), "lap (n=1)": ([2], [0.5])}
    loss = _lines(saved, "t_curves.png", 0)
    assert loss == {"attention (n=2)": ([1, 2], [2.5, 1.5]), "lap (n=2)": ([1, 2], [2.25, 1.25])}


def test_a_single_point_setting_is_drawn_with_a_zero_band(tmp_path, saved):
    """Pins: a seed with one evaluation: a one-point curve (mean = the value, std 0), and the gap figure's lines are
    the numpy means of the gap over the seeds."""
    config = _config(seeds=(0, 1))
    _write(tmp_path, "t", "attention", 0, [_ev(5, train_loss=1.0, val_loss=1.5), _ev(10, train_loss=0.5, val_loss=1.25)])
    _write(tmp_path, "t", "attention", 1, [_ev(10, train_loss=0.75, val_loss=2.0)])
    _write(tmp_path, "t", "lap", 0, [_ev(10, train_loss=math.inf, val_loss=1.0)])  # no finite evaluation: no curve
    assert [p.name for p in gaps.plot_gaps(config, tmp_path, tmp_path / "plots")] == ["t_gap.png"]
    gap = _lines(saved, "t_gap.png", 1)
    assert gap == {"attention (n=2)": ([10], [float(np.mean([1.25 - 0.5, 2.0 - 0.75]))])}
    loss = _lines(saved, "t_gap.png", 0)
    assert loss == {"attention (n=2), val": ([10], [1.625]), "attention (n=2), train": ([10], [0.625])}
