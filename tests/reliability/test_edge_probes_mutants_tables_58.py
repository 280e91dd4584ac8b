"""Mutation audit of the tables users read after ``run``, ``status`` and ``publish`` (``experiments.tables``:
``aggregate``, ``format_table``, ``format_status``; ``experiments.publish``: the results page, ``summary_table``).

Each test kills mutants that the covering tests let survive, checked against a reference computed here by hand
(seconds per step, steps left) or by numpy/scipy, not by the library's own helpers.
"""

from __future__ import annotations

import json
import re

import numpy as np
from scipy import stats

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.publish import summary_table
from diffusionformer.experiments.results import RunResult
from diffusionformer.experiments.tables import aggregate, format_status, format_table


def _status_row(seed, state, step, elapsed, *, task="t", max_steps=100, **extra):
    return {"task": task, "operator": "a", "seed": seed, "state": state, "step": step, "max_steps": max_steps,
            "elapsed": elapsed, "holder": None, "resumes_from": None, **extra}


def _minutes_left(text):
    return re.search(r"; (.*) of training left on one worker", text.splitlines()[0]).group(1)


def test_status_time_left_is_the_mean_pace_times_the_steps_each_unfinished_run_still_has():
    # finished runs: 200 s / 100 steps and 100 s / 100 steps -> 1.5 s per step (by hand)
    rows = [_status_row(0, "completed", 100, 200.0), _status_row(1, "completed", 100, 100.0),
            # resumes from its checkpoint at step 20, not from the logged 40: 80 steps left -> 120 s
            _status_row(2, "interrupted", 40, 60.0, resumes_from=20),
            _status_row(3, "missing", 0, None),  # 100 steps -> 150 s
            # made with another config: trained again from scratch, 100 steps -> 150 s; not counted as completed
            _status_row(4, "completed", 100, 150.0, changed="train (lr: 0.1 then 0.2)"),
            # a longer run's checkpoint (step 130 > 100): failed by `run`, no negative steps left
            _status_row(5, "interrupted", 130, 195.0, resumes_from=130)]
    text = format_status(rows)
    # 120 + 150 + 150 + 0 = 420 s = 7 min
    assert text.splitlines()[0].startswith("2 of 6 runs completed;"), text
    assert _minutes_left(text) == "about 7 min", text


def test_status_30_seconds_left_reads_less_than_a_minute_and_a_running_pace_is_per_logged_step():
    rows = [_status_row(0, "completed", 10, 10.0, max_steps=10), _status_row(1, "missing", 0, None, max_steps=30)]
    rows[1]["max_steps"] = 30  # 30 steps at 1 s per step: exactly 30 s
    assert _minutes_left(format_status(rows)) == "less than a minute"
    # no finished run: 20 s over the 10 steps logged -> 2 s per step, 90 steps left -> 180 s = 3 min
    paced = format_status([_status_row(0, "running", 10, 20.0, holder="pid 1")])
    assert _minutes_left(paced).startswith("about 3 min"), paced


def test_status_names_at_most_five_foreign_locks_and_says_when_there_are_more():
    def foreign(n):
        return [_status_row(s, "running", 1, 1.0, holder=f"pid {s} on b", other_host=True) for s in range(n)]

    five, six = format_status(foreign(5)), format_status(foreign(6))
    assert five.count(".lock") == 5 and "seed4/.lock)" in five and " ...)" not in five, five
    assert six.count(".lock") == 5 and "seed5/.lock" not in six, six
    assert "seed4/.lock ...)" in six, six


def test_status_pace_of_a_finished_run_is_per_step_it_trained_not_per_step_of_the_new_budget():
    # made with max_steps 100, the config now asks 200: it trained 100 steps in 100 s (1 s per step), and is
    # trained again for 200 steps -> 200 s, "about 3 min" (per step of the new budget, 0.5 s: 100 s, "about 2 min")
    rows = [_status_row(0, "completed", 100, 100.0, max_steps=200, changed="train (max_steps: 100 then 200)")]
    assert _minutes_left(format_status(rows)) == "about 3 min"


def _config(ops, seeds=(0, 1, 2), name="probe", **task):
    return load_experiment_config({"name": name, "seeds": list(seeds), "operators": [{"name": o} for o in ops],
                                   "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits",
                                              "train": {"max_steps": 2}, **task}]})


def _cells(text, setting):
    line = next(x for x in text.splitlines() if x.startswith(f"| {setting} |"))
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_steps_to_reach_cells_are_mean_and_sample_std_of_the_runs_that_reached_it_out_of_all_runs():
    steps = {"attention": [10, 20, None], "lap": [10, 30, 50]}
    runs = [RunResult("d", op, s, "completed", "test_acc", 0.5, reach_step=st)
            for op, sts in steps.items() for s, st in enumerate(sts)]
    text = format_table(aggregate(runs), _config(("attention", "lap"), reach={"test_acc": 0.9}))
    reach = text.split("steps to test_acc")[1]
    for op, sts in steps.items():
        hit = [x for x in sts if x is not None]  # numpy reference: mean and ddof=1 std over the runs that reached it
        want = f"{np.mean(hit):.0f} ± {np.std(hit, ddof=1):.0f} ({len(hit)} of {len(sts)})"
        assert _cells(reach, op)[1] == want, reach


def test_table_rows_keep_the_order_of_the_settings_not_their_names():
    runs = [RunResult("d", op, s, "completed", "test_acc", v) for op, v in (("lap", 0.6), ("attention", 0.5))
            for s in range(3)]
    text = format_table(aggregate(runs), _config(("lap", "attention")))
    rows = [x.split("|")[1].strip() for x in text.splitlines() if x.startswith("| ") and "mean ± std" not in x]
    assert rows == ["lap", "attention"], text


def test_summary_counts_and_holm_cells_match_scipy_with_holm_and_benjamini_hochberg_by_hand(tmp_path):
    base = np.array([0.50, 0.52, 0.48, 0.51, 0.49])
    noise = np.array([0.01, -0.012, 0.004, 0.009, -0.006])
    values = {"attention": base, "lap": base + 0.009 + noise, "mix": base + 0.010 - noise}
    cfg = _config(tuple(values), seeds=range(5))
    runs = [RunResult("d", op, s, "completed", "test_acc", float(v)) for op, vs in values.items()
            for s, v in enumerate(vs)]
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "results.json").write_text(json.dumps({"runs": [r.__dict__ for r in runs]}))
    alpha = 0.15
    p = [stats.ttest_rel(values[op], base).pvalue for op in ("lap", "mix")]  # 0.081, 0.105
    order = np.argsort(p)
    holm = np.empty(2)
    holm[order] = np.maximum.accumulate([min(1.0, (2 - i) * p[j]) for i, j in enumerate(order)])
    bh = np.empty(2)
    bh[order] = np.minimum.accumulate([min(1.0, 2 * p[j] / (i + 1)) for i, j in enumerate(order)][::-1])[::-1]
    assert (sum(x < alpha for x in p), sum(holm < alpha), sum(bh < alpha)) == (2, 0, 2)  # the three counts differ
    text = summary_table([cfg], tmp_path, alpha=alpha)
    assert text.splitlines()[-1] == "2 comparisons; p < 0.15 unadjusted: 2; after Holm: 0; after Benjamini-Hochberg: 2."
    row = next(x for x in text.splitlines() if x.startswith("| probe / d |"))
    assert f"test_acc ({np.mean(base):.4f})" in row, row
    for op, ph in zip(("lap", "mix"), holm):
        delta = np.mean(values[op] - base)
        assert f"{delta:+.4f} (p {p[('lap', 'mix').index(op)]:.3f}; Holm {ph:.3f})" in row, row
    assert "**" not in row, row  # no Holm p below alpha: nothing bold, though both raw p are


def test_a_contrast_over_fewer_seeds_than_the_setting_has_says_how_many_it_pairs():
    runs = [RunResult("d", "attention", s, "completed", "test_acc", 0.5 + s / 10) for s in (0, 1)]
    runs += [RunResult("d", "lap", s, "completed", "test_acc", 0.6 + s / 7) for s in (0, 1, 2)]
    text = format_table(aggregate(runs), _config(("attention", "lap")))
    assert _cells(text, "lap")[-3] == "3 (2 paired with attention)", text  # lap has 3 seeds, 2 of them paired


def _summary(tmp_path, cfg, runs, **kw):
    (tmp_path / cfg.name).mkdir()
    (tmp_path / cfg.name / "results.json").write_text(json.dumps({"runs": [r.__dict__ for r in runs]}))
    return summary_table([cfg], tmp_path, **kw)


def test_summary_cells_of_a_loss_are_signed_positive_is_better_and_a_short_setting_names_its_seed_counts(tmp_path):
    cfg = _config(("attention", "lap"), metric="test_loss")
    runs = [RunResult("d", "attention", s, "completed", "test_loss", 1.0 + s / 10) for s in (0, 1, 2)]
    runs += [RunResult("d", "lap", s, "completed", "test_loss", 0.8 + s / 10 + s * s / 100) for s in (0, 1)]
    row = _summary(tmp_path, cfg, runs).splitlines()[2]
    # lap's loss is lower by 0.2 and 0.19 on the seeds both have: +0.1950 (better); 2 of lap's seeds, 3 of the base's
    # (both of lap's paired: no "paired" note)
    assert "+0.1950 (p " in row and row.endswith("[2 vs 3 seeds] |"), row


def test_summary_p_equal_to_alpha_is_not_below_it_and_an_all_failed_setting_keeps_its_cell(tmp_path):
    cfg = _config(("attention", "lap", "mix"))
    runs = [RunResult("d", "attention", s, "completed", "test_acc", 0.5 + s / 10) for s in (0, 1, 2)]
    # differences +0.01, -0.01, 0: mean 0, t = 0, p = 1 exactly (scipy agrees)
    lap = [0.51, 0.59, 0.7]
    assert stats.ttest_rel(lap, [0.5, 0.6, 0.7]).pvalue == 1.0
    runs += [RunResult("d", "lap", s, "completed", "test_acc", v) for s, v in enumerate(lap)]
    runs += [RunResult("d", "mix", s, "failed: boom", "test_acc", None) for s in (0, 1, 2)]
    lines = _summary(tmp_path, cfg, runs, alpha=1.0).splitlines()
    assert lines[-1] == "2 comparisons; p < 1 unadjusted: 0; after Holm: 0; after Benjamini-Hochberg: 0.", lines
    assert lines[0].endswith("| lap | mix |") and lines[2].endswith("| n/a (p n/a; Holm n/a) [0 vs 3 seeds] |"), lines


def test_page_counts_finished_runs_of_all_expected_and_splits_wall_minutes_by_device(tmp_path):
    from diffusionformer.experiments.publish import _page_text

    cfg = _config(("attention",))
    runs = [RunResult("d", "attention", 0, "completed", "test_acc", 0.5, elapsed=60.0, device="cpu"),
            RunResult("d", "attention", 1, "completed", "test_acc", 0.6, elapsed=120.0, device="cuda:0"),
            RunResult("d", "attention", 2, "failed: boom", "test_acc", None, elapsed=30.0, device="cpu")]
    page = _page_text(cfg, runs, {}, tmp_path, tmp_path, "probe.toml")
    assert "- **Runs:** 2 of 3 finished" in page, page
    # 210 s = 3.5 min in all; cpu 60 + 30 s = 1.5 min, cuda 120 s = 2.0 min (by hand)
    assert "- **Training wall time:** 3.5 min in all, of which 1.5 min on cpu, 2.0 min on cuda " in page, page
