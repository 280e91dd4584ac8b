"""Tests written in a second-pass mutation audit of the results pages (``experiments/publish.py``: the
page, the copied files, the run logs, the toctree, the summary table; ``experiments/gaps.py``: the
over-fitting tables; ``experiments/outputs.py``: the manifest, ``results.json`` and ``results.md``).

The first audits (``test_mutation_kills_publish_threads.py``, ``test_mutation_kills_gaps_results_store.py``,
``test_mutation_kills_stats_compare_second_pass.py``, and the publish tests of ``test_mutation_kills_config_cli.py``)
pinned the page's lines, the copies, the log format, the toctree and the gap table of one study. This pass
aims at what they left open: publishing again (in place through a path that is not resolved, a publish
that fails half-way, the gap section rewritten and a reading marker kept), odd names (a study named like a
toctree option, a title with text after its target, four-backtick fences), unfinished and partial runs
(how they are counted, a setting that shares no seed with the baseline: ``n/a``, not 0), rounding and
significant digits of the primary-contrast cells against scipy, the sign of a loss difference, a p equal
to alpha, the order of figures and of the splits of a log, and the manifest, ``results.json`` and
``results.md`` of ``outputs.py`` (corrupt earlier files, commits, a git repository made by hand).

Each test kills a mutant of the library code that the rest of the suite let through (its docstring
names it: file and mutation) and checks the code against an independent reference: page lines and
files written by hand, p values from scipy, a git repository made in ``tmp_path``. Mutants judged
equivalent are listed, with the reason, at the end of the file. CPU only, deterministic, no network;
files only under ``tmp_path``. One test, whose docstring starts with "Bug:", pins a defect fixed here:
a publish that failed half-way had already removed the earlier published files of the page.
"""

from __future__ import annotations

import json
import math
import platform
import re
import shutil
import subprocess
import sys

import pytest

from diffusionformer.experiments import gaps, load_experiment_config, outputs
from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
from diffusionformer.experiments.gaps import GAP_MARKER, write_gap_section
from diffusionformer.experiments.publish import (READING_MARKER, add_to_toctree, publish_experiment, summary_table,
                                                 write_run_log)
from diffusionformer.experiments.results import RunResult

sps = pytest.importorskip("scipy.stats")

INDEX = "# Results\n\n```{toctree}\n:maxdepth: 1\n\nother\n```\n"


def _raw(**extra):
    """A small comparison as a plain dict: two seeds, two settings, one digits task."""
    cfg = {"name": "mk", "seeds": [0, 1],
           "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                      "train": {"max_steps": 2, "batch_size": 8, "warmup_steps": 0}}],
           "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}]}
    cfg.update(extra)
    return cfg


def _results(src, rows):
    src.mkdir(parents=True, exist_ok=True)
    (src / "results.json").write_text(json.dumps({"runs": [r.__dict__ for r in rows], "summary": []}))


def _docs(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(INDEX)
    return docs


def _finished(tmp_path, raw=None, values=None, **fields):
    """results.json of a finished comparison: value 0.5 + s/100 + i/50 for setting i, seed s."""
    cfg = load_experiment_config(raw or _raw())
    values = values or {(op.name, s): 0.5 + s / 100 + i / 50 for i, op in enumerate(cfg.operators) for s in cfg.seeds}
    rows = [RunResult(cfg.tasks[0].name, op, s, "completed", cfg.tasks[0].metric, v, elapsed=60.0, **fields)
            for (op, s), v in values.items()]
    _results(tmp_path / "results" / cfg.name, rows)
    return cfg, tmp_path / "results"


# ---------------------------------------------------------------------------- publish.py: publishing again
def test_publishing_in_place_through_an_unresolved_path_rewrites_the_page_and_keeps_the_files(write_run, tmp_path):
    """kills: publish.py ``in_place = dst.resolve() == src.resolve()`` -> ``dst == src`` (the published folder,
    named through ``docs/sub/..``, taken for a raw results folder: its run logs, which only raw run folders
    can give again, are lost)"""
    cfg, out = _finished(tmp_path)
    write_run(out / "mk", "digits", "lap", 1, [{"split": "train", "step": 1, "loss": 2.0}])
    docs = _docs(tmp_path)
    publish_experiment(cfg, out, docs)
    shutil.rmtree(out)  # the raw results are gone: only the published files are left
    (docs / "sub").mkdir()
    before = sorted(str(p.relative_to(docs)) for p in (docs / "mk").rglob("*.json"))
    assert before == ["mk/logs/digits/lap/seed1.json", "mk/results.json"]
    page = publish_experiment(cfg, docs / "sub" / "..", docs)
    assert sorted(str(p.relative_to(docs)) for p in (docs / "mk").rglob("*.json")) == before
    assert "- **Per-run metric logs:** 1 files, `mk/logs/<task>/<operator>/seed<k>.json` (training and evaluation " \
           "records by step)" in page.read_text().splitlines()


def test_bug_a_publish_that_fails_half_way_keeps_the_earlier_published_files(tmp_path):
    """Bug: ``publish`` removed ``docs/<name>/`` before copying the new files into it, so a copy that failed
    half-way (here: a figure truncated by a run killed while saving it) left the earlier page pointing at
    files that were gone. The files are now copied into a folder beside it that replaces it once whole;
    the failed attempt leaves the earlier page and files as they were, and no temporary folder."""
    cfg, out = _finished(tmp_path)
    docs = _docs(tmp_path)
    (out / "mk" / "plots").mkdir(parents=True)
    shutil.copyfile(_tiny_png(tmp_path), out / "mk" / "plots" / "a.png")
    page = publish_experiment(cfg, out, docs)
    before = {p.relative_to(docs): p.read_bytes() for p in docs.rglob("*") if p.is_file()}
    assert sorted(str(p) for p in before) == ["index.md", "mk.md", "mk/plots/a.png", "mk/results.json"]
    (out / "mk" / "plots" / "b.png").write_bytes(_tiny_png(tmp_path).read_bytes()[:20])  # truncated
    (out / "mk" / "manifest.json").write_text('{"cuda": "new"}')
    with pytest.raises(OSError):  # PIL.UnidentifiedImageError
        publish_experiment(cfg, out, docs)
    assert {p.relative_to(docs): p.read_bytes() for p in docs.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in docs.iterdir()) == ["index.md", "mk", "mk.md"]
    (out / "mk" / "plots" / "b.png").unlink()
    publish_experiment(cfg, out, docs)
    assert (docs / "mk" / "manifest.json").read_text() == '{"cuda": "new"}' and "CUDA: new" in page.read_text()
    assert sorted(p.name for p in docs.iterdir()) == ["index.md", "mk", "mk.md"]


def test_a_completed_run_without_a_value_counts_as_finished_and_a_failed_one_does_not(tmp_path):
    """kills: publish.py ``done`` counting the runs with a value (``r.value is not None``) instead of the
    completed ones: a run that completed without an evaluation of the metric is finished, a failed run is not"""
    cfg = load_experiment_config(_raw(seeds=[0, 1, 2]))
    rows = [RunResult("digits", "attention", 0, "completed", "test_acc", None, elapsed=30.0),
            RunResult("digits", "attention", 1, "completed", "test_acc", 0.5, elapsed=30.0),
            RunResult("digits", "lap", 0, "failed: out of memory", "test_acc", None, elapsed=30.0)]
    _results(tmp_path / "results" / "mk", rows)
    text = publish_experiment(cfg, tmp_path / "results", _docs(tmp_path)).read_text()
    assert "- **Runs:** 2 of 6 finished (tasks x operator settings x seeds [0, 1, 2])" in text.splitlines()
    assert "- **Training wall time:** 1.5 min in all (per-run times in the tables)" in text.splitlines()


def test_a_rewritten_results_json_carries_the_summary_of_the_pages_runs(tmp_path):
    """kills: publish.py the ``results.json`` rewritten for a config that names part of the stored runs with
    ``"summary": []`` instead of the aggregate of the page's runs"""
    cfg = load_experiment_config(_raw(operators=[{"name": "attention"}]))
    rows = [RunResult("digits", "attention", 0, "completed", "test_acc", 0.5),
            RunResult("digits", "attention", 1, "completed", "test_acc", 0.75),
            RunResult("digits", "lap", 0, "completed", "test_acc", 0.9)]  # outside the config
    _results(tmp_path / "results" / "mk", rows)
    docs = _docs(tmp_path)
    publish_experiment(cfg, tmp_path / "results", docs)
    data = json.loads((docs / "mk" / "results.json").read_text())
    assert [(r["operator"], r["seed"]) for r in data["runs"]] == [("attention", 0), ("attention", 1)]
    (row,) = data["summary"]
    assert (row["task"], row["operator"], row["n"], row["mean"]) == ("digits", "attention", 2, 0.625)
    assert row["std"] == pytest.approx(math.sqrt(0.03125))  # sample std of 0.5 and 0.75


def test_the_cross_validation_line_names_the_folded_tasks_when_only_some_are(tmp_path):
    """kills: publish.py ``if any(t.folds ...)`` -> ``if all(t.folds ...)`` (a study with one cross-validated task
    of two says nothing about cross-validation)"""
    raw = _raw()
    raw["tasks"].append({**raw["tasks"][0], "name": "cv", "folds": 2})
    cfg, out = _finished(tmp_path, raw=raw)
    text = publish_experiment(cfg, out, _docs(tmp_path)).read_text()
    assert "- **Cross-validation:** cv: seed s tests on fold s % folds of a stratified partition" in text


def test_the_figures_are_linked_curves_first_then_final_and_every_analysis_figure(tmp_path):
    """kills: publish.py the per-task figures linked in the other order (final before curves) and only the first
    analysis figure linked"""
    cfg, out = _finished(tmp_path)
    for rel in ("plots/digits_curves.png", "plots/digits_final.png", "analysis/plots/a.png", "analysis/plots/b.png"):
        (out / "mk" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_tiny_png(tmp_path), out / "mk" / rel)
    lines = publish_experiment(cfg, out, _docs(tmp_path)).read_text().splitlines()
    figures = [line for line in lines if line.startswith("![")]
    assert figures == ["![digits: training loss and headline metric (mean ± std over seeds)](mk/plots/digits_curves.png)",
                       "![digits: final metric per setting (dots: seeds)](mk/plots/digits_final.png)",
                       "![a](mk/analysis/a.png)", "![b](mk/analysis/b.png)"]


def _tiny_png(tmp_path):
    image = pytest.importorskip("PIL.Image")
    path = tmp_path / "tiny.png"
    if not path.is_file():
        image.new("RGB", (2, 2), (10, 20, 30)).save(path)
    return path


def test_a_study_trained_over_two_commits_lists_both():
    """kills: publish.py ``_commit_line`` ``len(commits) > 1`` -> ``> 2`` (a study resumed once at a new commit
    shows only the last one)"""
    from diffusionformer.experiments.publish import _commit_line

    assert _commit_line({"git_commit": "b2", "git_commits": ["a1", "b2"]}) == (
        "- **Git commits:** `a1`, `b2` (the invocations of `run` that trained this comparison and recorded their "
        "commit ran at these 2 commits, in this order; the last at `b2`)")


# ---------------------------------------------------------------------------- publish.py: add_to_toctree
def test_a_four_backtick_toctree_gets_the_entry_inside_it(tmp_path):
    """kills: publish.py ``add_to_toctree`` fences matched as exactly three backticks or colons (``{3}``): an
    index whose toctree opens with four backticks (MyST's nesting form) got a second, hidden toctree"""
    index = tmp_path / "index.md"
    index.write_text("# R\n\n````{toctree}\n:maxdepth: 2\n\nother\n````\n\nAfter.\n")
    assert add_to_toctree(index, "mk") is True
    assert index.read_text() == "# R\n\n````{toctree}\n:maxdepth: 2\n\nother\nmk\n````\n\nAfter.\n"
    assert add_to_toctree(index, "mk") is False


def test_option_lines_of_a_toctree_are_not_entries_and_a_title_must_end_the_line(tmp_path):
    """kills: publish.py ``add_to_toctree`` counting the option lines (``:hidden:``) as listed documents (a study
    named ``:hidden:``, which a config accepts, never added) and ``re.fullmatch`` -> ``re.match`` in
    ``_toctree_target`` (a line with text after its ``<target>`` read as that target)"""
    text = "```{toctree}\n:hidden:\n\nnotes <mk> draft\n```\n"
    index = tmp_path / "index.md"
    index.write_text(text)
    assert add_to_toctree(index, ":hidden:") is True
    assert add_to_toctree(index, "mk") is True
    assert index.read_text() == "```{toctree}\n:hidden:\n\nnotes <mk> draft\n:hidden:\nmk\n```\n"


# ---------------------------------------------------------------------------- publish.py: run logs
def test_a_run_log_lists_the_train_split_before_the_eval_split(tmp_path):
    """kills: publish.py ``write_run_log`` writing the splits eval first (the published file's layout,
    ``{"train": ..., "eval": ...}``, as its docstring gives it)"""
    recs = [{"split": "eval", "step": 2, "loss": 1.0, "metrics": {}}, {"split": "train", "step": 1, "loss": 2.0}]
    text = write_run_log(recs, tmp_path / "seed0.json").read_text()
    assert text == ('{"train":{"step":[1],"loss":[2.0],"lr":[null],"elapsed":[null]},'
                    '"eval":{"step":[2],"loss":[1.0],"lr":[null],"elapsed":[null]}}')


# ---------------------------------------------------------------------------- publish.py: summary_table
def _summary(tmp_path, raw, values, task="digits", metric="test_acc"):
    rows = [RunResult(task, op, s, "completed", metric, v) for (op, s), v in values.items()]
    _results(tmp_path / "results" / raw["name"], rows)
    return summary_table([load_experiment_config(raw)], tmp_path / "results")


def test_summary_table_signs_a_loss_difference_so_that_lower_loss_reads_positive(tmp_path):
    """kills: publish.py ``summary_table`` ``sign = -1.0 if task.minimize else 1.0`` -> ``1.0`` (a lap that lowers
    the validation loss by 0.2 printed as -0.2000, "worse")"""
    raw = _raw(seeds=[0, 1, 2])
    raw["tasks"] = [{"name": "lm", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss"}]
    base, lap = [2.0, 2.5, 3.0], [1.75, 2.25, 2.875]
    values = {("attention", s): v for s, v in enumerate(base)} | {("lap", s): v for s, v in enumerate(lap)}
    text = _summary(tmp_path, raw, values, task="lm", metric="val_loss")
    p = sps.ttest_rel(lap, base).pvalue  # d = -0.25, -0.25, -0.125: mean -0.2083
    assert p < 0.05 and text.splitlines()[2] == f"| mk / lm | val_loss (2.5000) | **+0.2083 (p {p:.3f}; Holm {p:.3f})** |"


def test_summary_table_a_p_equal_to_alpha_is_not_below_it(tmp_path):
    """kills: publish.py ``summary_table`` ``c["holm"] < alpha`` -> ``<=`` (a cell bold at p = alpha) and
    ``c["p"] < alpha`` -> ``<=`` in the count: differences 0.25, -0.25, 0 have mean 0, t = 0, p = 1 exactly"""
    raw = _raw(seeds=[0, 1, 2])
    values = {("attention", s): 0.5 for s in range(3)} | {("lap", 0): 0.75, ("lap", 1): 0.25, ("lap", 2): 0.5}
    assert sps.ttest_rel([0.75, 0.25, 0.5], [0.5] * 3).pvalue == 1.0
    rows = _summary(tmp_path, raw, values)
    text = summary_table([load_experiment_config(raw)], tmp_path / "results", alpha=1.0)
    assert text == rows.replace("p < 0.05", "p < 1")
    assert text.splitlines()[2] == "| mk / digits | test_acc (0.5000) | +0.0000 (p 1.000; Holm 1.000) |"
    assert text.splitlines()[-1] == "1 comparison; p < 1 unadjusted: 0; after Holm: 0; after Benjamini-Hochberg: 0."


def test_summary_table_a_setting_sharing_no_seed_with_the_baseline_is_n_a_not_zero(tmp_path):
    """kills: publish.py ``summary_table`` ``"delta": None if diff.mean is None else ...`` -> ``sign * (diff.mean or
    0.0)`` (no paired difference printed as +0.0000)"""
    raw = _raw(seeds=[0, 1, 2])
    values = {("attention", 0): 0.5, ("attention", 1): 0.6, ("lap", 2): 0.9}
    row = _summary(tmp_path, raw, values).splitlines()[2]
    assert row == "| mk / digits | test_acc (0.5500) | n/a (p n/a; Holm n/a) [1 vs 2 seeds, 0 paired] |"


def test_bug_summary_table_says_how_many_seeds_a_contrast_pairs(tmp_path):
    """Bug: with seeds 0, 1, 2 for the baseline and 1, 2, 3 for a setting (each missing one seed of four), the cell
    said "[3 vs 3 seeds]" while its difference and p rest on the 2 seeds both have (scipy's ttest_rel on those)."""
    raw = _raw(seeds=[0, 1, 2, 3])
    base, lap = {0: 0.5, 1: 0.6, 2: 0.55}, {1: 0.7, 2: 0.8, 3: 0.9}
    values = {("attention", s): v for s, v in base.items()} | {("lap", s): v for s, v in lap.items()}
    row = _summary(tmp_path, raw, values).splitlines()[2]
    p = sps.ttest_rel([lap[1], lap[2]], [base[1], base[2]]).pvalue
    assert row == f"| mk / digits | test_acc (0.5500) | +0.1750 (p {p:.3f}; Holm {p:.3f}) [3 vs 3 seeds, 2 paired] |"


def test_summary_table_selected_gives_the_baseline_mean_of_the_selected_values(tmp_path):
    """kills: publish.py ``summary_table`` the baseline mean of a ``--selected`` row read from the final values
    (``row['mean']``) instead of the selected ones"""
    raw = _raw(seeds=[0, 1], tasks=[{**_raw()["tasks"][0], "select_by": "val_acc"}])
    rows = [RunResult("digits", op, s, "completed", "test_acc", 0.5, selected_value=0.8 + s / 10 + i / 20, selected_step=2)
            for i, op in enumerate(("attention", "lap")) for s in (0, 1)]
    _results(tmp_path / "results" / "mk", rows)
    text = summary_table([load_experiment_config(raw)], tmp_path / "results", selected=True)
    assert text.splitlines()[2].startswith("| mk / digits | test_acc at best val_acc (0.8500) | +0.0500 (p n/a")


# ---------------------------------------------------------------------------- gaps.py
def _eval(step, **metrics):
    return {"split": "eval", "step": step, "metrics": metrics}


def _text_config(seeds=(0, 1, 2), operators=("attention", "lap"), tasks=("t",), primary=()):
    return ExperimentConfig("g", [TaskConfig(t, "pydoc-chars", "gpt-char-tiny", metric="val_loss") for t in tasks],
                            [OperatorSetting(o) if i == 0 else OperatorSetting(o, laplacian_heads=1)
                             for i, o in enumerate(operators)], seeds=list(seeds), primary=list(primary))


def _q(fv, ft, bv=None, bs=100, bg=0.5):
    bv = fv if bv is None else bv
    return {"final_val": fv, "final_train": ft, "final_gap": fv - ft, "best_val": bv, "best_step": float(bs), "best_gap": bg}


def test_a_reading_marker_with_nothing_after_it_is_kept(tmp_path):
    """kills: gaps.py ``write_gap_section`` ``if sep`` -> ``if reading`` (a reading marker at the very end of the
    page, its text not written yet, dropped when the gap tables are written)"""
    page = tmp_path / "g.md"
    page.write_text("# g\n\n" + READING_MARKER)
    write_gap_section(page, "| a |\n")
    assert page.read_text() == ("# g\n\n" + GAP_MARKER + "\n\n## Over-fitting: train/validation gap\n\n| a |\n\n"
                                + READING_MARKER)


def test_primary_table_cells_by_hand_and_scipy():
    """kills: gaps.py ``primary_table`` p printed with three significant digits (``.3g``), the p and Wilcoxon p
    columns swapped, t with one decimal, Holm over the exploratory cells too (``if prim`` dropped), the sign of
    the CI bounds dropped; and ``_g`` writing ``""`` for a statistic that is undefined instead of ``n/a``"""
    config = _text_config(primary=["lap"])
    base = {0: _q(2.0, 1.0), 1: _q(2.3, 1.0), 2: _q(2.1, 1.0)}
    lap = {0: _q(1.9, 1.0, bv=1.9), 1: _q(2.25, 1.0, bv=2.2), 2: _q(2.05, 1.0, bv=2.0)}
    text = gaps.primary_table(config, "unused", ("final_val",), rows={"t": {"attention": base, "lap": lap}})
    body = [line for line in text.splitlines() if line.startswith("| t, lap") or line.startswith("| *exploratory")]
    a, b = [1.9, 2.25, 2.05], [2.0, 2.3, 2.1]  # final val: d = -0.1, -0.05, -0.05
    ref = sps.ttest_rel(a, b)
    ci = ref.confidence_interval(0.95)
    w = sps.wilcoxon([x - y for x, y in zip(a, b)]).pvalue  # exact: 2/8
    assert (round(ref.statistic, 2), f"{ref.pvalue:.2g}", w) == (-4.0, "0.057", 0.25)  # p 0.0572: .3g tells
    assert body[0] == (f"| t, lap, final val loss | -0.0667 | [{ci.low:+.4f}, {ci.high:+.4f}] | -4.00 | 2 | 0.057 | 0.25 | "
                       "0.057 |")
    # best val: d = -0.1, -0.1, -0.1, no spread: t and p undefined, the CI a point, Wilcoxon 0.25; not adjusted
    assert body[1] == "| *exploratory:* t, lap, best val loss | -0.1000 | [-0.1000, -0.1000] | n/a | 2 | n/a | 0.25 |  |"
    assert len(body) == 2


def test_a_primary_setting_without_finished_runs_is_left_out():
    """kills: gaps.py ``primary_table`` ``not row`` dropped (a primary setting without finished runs: a crash on
    ``None.items()`` instead of no table)"""
    config = _text_config(primary=["lap"])
    assert gaps.primary_table(config, "unused", rows={"t": {"attention": {0: _q(2.0, 1.0)}}}) == ""


def test_gap_tables_of_two_tasks_are_blocks_separated_by_a_blank_line_and_name_no_primary_unless_named():
    """kills: gaps.py ``gap_table`` the blank line after a task's table dropped (the next heading glued to the last
    row) and the "Primary contrasts (named before the runs)" sentence written for a config that names none"""
    config = _text_config(seeds=(0,), operators=("attention",), tasks=("t1", "t2"))
    rows = {"t1": {"attention": {0: _q(2.0, 1.5, bs=100, bg=0.25)}}, "t2": {"attention": {0: _q(3.0, 1.0, bs=200, bg=1.0)}}}
    text = gaps.gap_table(config, "unused", rows)
    intro = ("Losses from the same evaluation protocol on both splits; gap = val - train. Δ: mean of the per-seed "
             "differences to attention with the paired t (degrees of freedom = shared seeds - 1).")
    head = ("| operator | seeds | final val | final train | final gap | Δ final val | Δ final gap | best val | at step | "
            "gap at best val | Δ best val |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    assert text == (f"### t1: train/validation gap\n\n{intro}\n\n{head}"
                    "| attention | 1 | 2.0000 ± n/a | 1.5000 ± n/a | 0.5000 ± n/a |  |  | 2.0000 ± n/a | 100 ± n/a | "
                    "0.2500 ± n/a |  |\n\n"
                    f"### t2: train/validation gap\n\n{intro}\n\n{head}"
                    "| attention | 1 | 3.0000 ± n/a | 1.0000 ± n/a | 2.0000 ± n/a |  |  | 3.0000 ± n/a | 200 ± n/a | "
                    "1.0000 ± n/a |  |\n")


class _Ax:
    def __init__(self):
        self.lines = []

    def plot(self, x, y, style, color=None, label=None):
        self.lines.append((list(x), [float(v) for v in y], style, label))

    def fill_between(self, *args, **kwargs):
        pass

    def set(self, **kwargs):
        pass

    def legend(self, **kwargs):
        pass


def test_plot_gaps_draws_the_gap_on_the_right_and_the_losses_on_the_left(write_run, tmp_path, stand_in_figure):
    """kills: gaps.py ``plot_gaps`` the right panel drawn from the validation loss instead of the gap"""
    config = _text_config(seeds=(0, 1), operators=("attention",))
    for seed, (t, v) in enumerate(((1.0, 1.5), (1.5, 2.5))):
        write_run(tmp_path / "g", "t", "attention", seed, [_eval(10, train_loss=t + 1, val_loss=v + 1),
                                                           _eval(20, train_loss=t, val_loss=v)])
    figure = stand_in_figure(_Ax)
    assert gaps.plot_gaps(config, tmp_path, tmp_path / "plots") == [tmp_path / "plots" / "t_gap.png"]
    loss_ax, gap_ax = figure.made[-1].axes
    assert loss_ax.lines == [([10, 20], [3.0, 2.0], "-", "attention (n=2), val"),
                             ([10, 20], [2.25, 1.25], "--", "attention (n=2), train")]
    assert gap_ax.lines == [([10, 20], [0.75, 0.75], "-", "attention (n=2)")]


def test_the_gaps_cli_captions_the_figure_with_the_task_name(write_run, tmp_path):
    """kills: gaps.py ``main`` captioning the figure with the file's stem (``t_gap: ...``) instead of the task"""
    pytest.importorskip("matplotlib")
    cfg = tmp_path / "g.toml"
    cfg.write_text('name = "g"\nseeds = [0]\n[[tasks]]\nname = "t"\ndataset = "pydoc-chars"\n'
                   'model = "gpt-char-tiny"\nmetric = "val_loss"\n[[operators]]\nname = "attention"\n')
    write_run(tmp_path / "g", "t", "attention", 0, [_eval(10, train_loss=1.5, val_loss=2.0)])
    page = tmp_path / "docs" / "g.md"
    assert gaps.main([str(cfg), "--out", str(tmp_path), "--page", str(page)]) == 0
    assert ("![t: train and validation loss and their gap over steps (mean ± std over seeds)](g/plots/t_gap.png)"
            in page.read_text().splitlines())


# ---------------------------------------------------------------------------- outputs.py
def _no_plots(monkeypatch, error=None):
    from diffusionformer.experiments import plots

    def plot_experiment(*args, **kwargs):
        if error is not None:
            raise error

    monkeypatch.setattr(plots, "plot_experiment", plot_experiment)


@pytest.mark.parametrize("text", ['{"runs": [{"bogus": 1}]}', '{"summary": []}'])
def test_a_corrupt_results_json_is_rebuilt_from_the_runs(tmp_path, monkeypatch, text):
    """kills: outputs.py ``_other_finished_rows`` catching without ``TypeError`` (a row of unknown fields) or without
    ``KeyError`` (no ``runs``): a crash instead of the earlier file rebuilt"""
    _no_plots(monkeypatch)
    config = load_experiment_config(_raw(seeds=[0]))
    out = tmp_path / "mk"
    out.mkdir()
    (out / "results.json").write_text(text)
    run = RunResult("digits", "attention", 0, "completed", "test_acc", 0.5)
    outputs.write_outputs(out, config, [run])
    assert json.loads((out / "results.json").read_text())["runs"] == [run.__dict__]


def test_results_md_says_the_seeds_and_a_missing_matplotlib_skips_the_plots_only(tmp_path, monkeypatch):
    """kills: outputs.py ``results.md`` without its ``Seeds: [...]`` line and ``write_outputs`` catching something
    else than the ImportError of a missing matplotlib (the comparison's results then lost to a traceback)"""
    _no_plots(monkeypatch, ImportError("no matplotlib"))
    config = load_experiment_config(_raw(seeds=[0, 1], description="Small."))
    out = tmp_path / "mk"
    out.mkdir()
    run = RunResult("digits", "attention", 0, "completed", "test_acc", 0.5)
    outputs.write_outputs(out, config, [run])
    assert [r["task"] for r in json.loads((out / "results.json").read_text())["runs"]] == ["digits"]
    assert (out / "results.md").read_text().startswith("# mk\n\nSmall.\n\nSeeds: [0, 1]. Mean ± sample std over seeds.\n\n")


def test_an_earlier_failed_row_is_not_kept_even_when_its_folder_now_says_completed(write_run, tmp_path, monkeypatch):
    """kills: outputs.py ``_other_finished_rows`` without ``r.status == "completed"`` (a row that recorded a
    failure kept in results.json beside the run, read as completed from its folder, that replaced it)"""
    _no_plots(monkeypatch)
    config = load_experiment_config(_raw(seeds=[0, 1]))
    out = tmp_path / "mk"
    write_run(out, "digits", "attention", 1, [], eval={"step": 2, "split": "eval", "metrics": {"test_acc": 0.7}})
    failed = RunResult("digits", "attention", 1, "failed: out of memory", "test_acc", None).__dict__
    kept = RunResult("digits", "lap", 1, "completed", "test_acc", 0.6)
    write_run(out, "digits", "lap", 1, [])
    (out / "results.json").write_text(json.dumps({"runs": [failed, kept.__dict__], "summary": []}))
    run = RunResult("digits", "attention", 0, "completed", "test_acc", 0.5)
    outputs.write_outputs(out, config, [run])
    assert json.loads((out / "results.json").read_text())["runs"] == [run.__dict__, kept.__dict__]


def test_merged_manifest_lists_each_commit_once_oldest_first():
    """kills: outputs.py ``merged_manifest`` keeping repeated commits of the earlier list, ignoring the single
    ``git_commit`` of a manifest written before ``git_commits`` existed, and letting ``current``'s own
    ``git_commits`` override the merged list"""
    assert outputs.merged_manifest({"git_commit": "b", "git_commits": ["a", "b", "a"]}, {"git_commit": "c"}) == {
        "git_commit": "c", "git_commits": ["a", "b", "c"]}
    assert outputs.merged_manifest({"git_commit": "a"}, {"git_commit": "b"})["git_commits"] == ["a", "b"]
    assert outputs.merged_manifest({"git_commit": "a"}, {"git_commit": "b", "git_commits": ["x"]})["git_commits"] == ["a", "b"]
    assert outputs.merged_manifest(None, {"git_commit": None}) == {"git_commit": None, "git_commits": []}


def _git(where, *args):
    subprocess.run(["git", *args], cwd=where, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(where), "PATH": "/usr/bin:/bin"})


def test_git_commit_of_a_repository_by_hand(tmp_path):
    """kills: outputs.py ``git_commit`` reading untracked files as dirty (``--untracked-files=no`` dropped) and
    going on after ``git rev-parse`` failed (outside a checkout: ``""`` instead of None)"""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    (repo / "new.txt").write_text("untracked\n")
    assert outputs.git_commit(repo) == head
    (repo / "a.txt").write_text("two\n")
    assert outputs.git_commit(repo) == head + "+dirty"
    (tmp_path / "plain").mkdir()
    assert outputs.git_commit(tmp_path / "plain") is None


def test_git_commit_that_times_out_is_none(tmp_path, monkeypatch):
    """kills: outputs.py ``git_commit`` catching only ``OSError`` (a hung git: TimeoutExpired escapes ``run``)"""
    def hung(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs.get("timeout"))

    monkeypatch.setattr(subprocess, "run", hung)
    assert outputs.git_commit(tmp_path) is None


def test_manifest_records_the_command_the_machine_and_the_gpu(monkeypatch):
    """kills: outputs.py ``manifest`` without the program name in ``command``, ``processor`` without the
    ``platform.machine()`` fallback (Linux often reports ``""``), ``cuda`` always None, and ``started`` without
    the time of day"""
    import torch

    monkeypatch.setattr(sys, "argv", ["/usr/lib/x/__main__.py", "run", "a b.toml"])
    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")
    monkeypatch.setattr(outputs, "git_commit", lambda: "abc")
    m = outputs.manifest(load_experiment_config(_raw()))
    assert m["command"] == "__main__.py run 'a b.toml'"  # quoted for a shell
    assert m["processor"] == platform.machine() and m["cuda"] == "Fake GPU" and m["git_commit"] == "abc"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d .*", m["started"])


# ---------------------------------------------------------------------------- equivalent mutants
# Applied in this audit: 91 mutants (39 in publish.py, 30 in gaps.py, 22 in outputs.py); 47 were killed by the
# earlier tests, 38 by this file. The 6 left survive because no input tells them from the code:
# - publish.py ``_load_runs`` ``task is None or r.status != "completed"`` -> ``r.status != "completed"``:
#   ``finished_runs`` returns the runs of the config's tasks only, so ``tasks.get(r.task)`` is never None.
# - publish.py ``add_to_toctree`` closing fence ``lines[i].strip() == fence`` -> ``.startswith(fence)``: differs
#   only for a line inside the toctree that starts with the fence and is longer (```` or ```python); a toctree
#   lists document names, never such lines.
# - publish.py ``_toctree_target`` ``titled.group(1).strip()`` -> ``titled.group(1)``: differs only for a padded
#   target (``Title < mk >``), which Sphinx itself reads verbatim and cannot resolve; no valid index has one.
# - gaps.py ``run_gaps`` final evaluation ``evals[-1]`` -> the first with the largest step: the evaluations are
#   sorted by step, so they differ only for two evaluations logged at the same step, which a run does not write.
# - gaps.py ``_eval_losses`` ``int(r["step"])`` -> ``r["step"]``: steps are ints in both the run log and the
#   published log (read_run_log refuses others); ``best_step`` is converted with ``float`` either way.
# - outputs.py ``git_commit`` ``dirty.returncode == 0 and dirty.stdout.strip()`` -> ``dirty.stdout.strip()``: a
#   ``git status`` that fails (it just ran ``rev-parse`` in the same checkout) writes its error to stderr, and
#   its stdout is empty.
