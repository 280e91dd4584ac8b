"""Edge-case probes of how results become published numbers (``experiments.tables``, ``publish``, ``stats``).

Every number of a results table (mean, sample std, paired Δ, its t interval, df, paired-t p, Wilcoxon p, Holm
over the page, Nadeau-Bengio for k-fold tasks) is recomputed here from the per-seed values with scipy
(``ttest_rel``, ``wilcoxon``, ``t.ppf``) and compared with the markdown and JSON that ``format_table`` and
``publish`` write: a seed missing in one setting, a NaN run, one seed, equal differences, a lower-is-better
metric, k-fold tasks, primary and exploratory contrasts; and the published files (run logs, manifest line).

Found and fixed (tests named ``test_bug_...``):

- ``tables``: a contrast paired over fewer seeds than a setting has (a seed missing or non-finite on one side)
  showed "4" in the seeds column with Δ, df and p over the 3 common seeds, unsaid; the cell now says
  "4 (3 paired with base)".
- ``publish``: ``write_run_log`` wrote a diverged run's NaN/inf loss as the ``NaN``/``Infinity`` literals, which
  strict JSON readers refuse (every other run file writes ``null``); and it wrote in place, not atomically.
- ``publish``: a study whose ``run`` ran outside a git checkout (``git_commit: null`` in its manifest) was
  published as "not recorded (this study's manifest predates the `git_commit` field)", which is false.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.compare import contrasts
from diffusionformer.experiments.results import RunResult
from diffusionformer.experiments.tables import aggregate, format_table


def _config(ops, seeds, primary=None, **task):
    raw = {"name": "probe", "seeds": list(seeds), "operators": [{"name": o} for o in ops],
           "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 2}, **task}]}
    if primary:
        raw["primary"] = primary
    return load_experiment_config(raw)


def _runs(op, values, metric="test_acc"):
    return [RunResult("d", op, s, "completed", metric, v, {metric: v}, 10, 1.0) for s, v in values.items()]


def _row(text, op):
    (line,) = [line for line in text.splitlines() if line.startswith(f"| {op} |")]
    return [c.strip() for c in line.strip("|").split("|")]


def _reference(a, b, folds=None):
    """Δ, CI, df, p, Wilcoxon p of a - b over the common seeds, from scipy."""
    keys = sorted(set(a) & set(b))
    x, y = np.array([a[k] for k in keys]), np.array([b[k] for k in keys])
    d, n = x - y, len(keys)
    if folds is None:
        t, p = stats.ttest_rel(x, y)
        se = d.std(ddof=1) / math.sqrt(n)
    else:  # Nadeau-Bengio: variance (1/n + 1/(K-1)) s^2
        se = d.std(ddof=1) * math.sqrt(1 / n + 1 / (folds - 1))
        t = d.mean() / se
        p = 2 * stats.t.sf(abs(t), n - 1)
    half = stats.t.ppf(0.975, n - 1) * se
    return {"mean": d.mean(), "low": d.mean() - half, "high": d.mean() + half, "df": n - 1, "p": float(p),
            "p_w": float(stats.wilcoxon(x, y).pvalue), "n": n}


def _cells(ref, digits=4):
    f = lambda v: f"{round(v, digits) + 0.0:+.{digits}f}"  # noqa: E731
    p = lambda v: "<0.001" if v < 0.001 else (f"{v:.4f}" if 0.0495 <= v < 0.0505 else f"{v:.3f}")  # noqa: E731
    return [f(ref["mean"]), f"[{f(ref['low'])}, {f(ref['high'])}]", str(ref["df"]), p(ref["p"]), p(ref["p_w"])]


# ----------------------------------------------------------------------------- the table against scipy
@pytest.mark.parametrize("folds,metric", [(None, "test_acc"), (None, "test_loss"), (5, "test_acc")])
def test_every_number_of_the_table_matches_scipy(folds, metric):
    seeds = range(5)
    base = {k: 0.69 + 0.012 * k + 0.003 * (k % 2) for k in seeds}
    x = {k: 0.7 + 0.01 * k for k in seeds}
    y = {k: 0.6 + 0.03 * k * (k % 3) for k in seeds}
    cfg = _config(["base", "x", "y"], seeds, primary=["y"], metric=metric, **({"folds": folds} if folds else {}))
    table = aggregate(_runs("base", base, metric) + _runs("x", x, metric) + _runs("y", y, metric))
    text = format_table(table, cfg)
    assert ("lower is better" if metric.endswith("loss") else "higher is better") in text
    refs = {op: _reference(v, base, folds) for op, v in (("x", x), ("y", y))}
    # Holm: y is primary (adjusted alone), x exploratory (over both contrasts)
    holm_x = max(min(1, 2 * min(refs["x"]["p"], refs["y"]["p"])), refs["x"]["p"]) \
        if refs["x"]["p"] > refs["y"]["p"] else min(1, 2 * refs["x"]["p"])
    for op, values in (("base", base), ("x", x), ("y", y)):
        cells = _row(text, op)
        assert cells[1] == f"{np.mean(list(values.values())):.4f} ± {np.std(list(values.values()), ddof=1):.4f}"
        if op == "base":
            continue
        assert cells[2:7] == _cells(refs[op])
        assert cells[8] == ("primary" if op == "y" else "exploratory")
    assert _row(text, "y")[7] == f"{refs['y']['p']:.3f}"
    assert _row(text, "x")[7] == f"{holm_x:.3f}"
    by = {c.setting: c for c in contrasts(table, cfg)}
    for op in ("x", "y"):
        d = by[op].diff
        assert (d.mean, d.low, d.high, d.p, d.p_wilcoxon) == pytest.approx(
            (refs[op]["mean"], refs[op]["low"], refs[op]["high"], refs[op]["p"], refs[op]["p_w"]), rel=1e-9)
    assert by["x"].p_holm == pytest.approx(holm_x, rel=1e-12)


def test_one_seed_and_equal_differences_have_no_test():
    one = format_table(aggregate(_runs("base", {0: 0.5}) + _runs("x", {0: 0.6})), _config(["base", "x"], [0]))
    assert _row(one, "x")[1:8] == ["0.6000 ± n/a", "+0.1000", "n/a", "n/a", "n/a", "n/a", "n/a"]
    equal = format_table(aggregate(_runs("base", {0: 0.5, 1: 0.6, 2: 0.7}) + _runs("x", {0: 0.6, 1: 0.7, 2: 0.8})),
                         _config(["base", "x"], [0, 1, 2]))
    # scipy's ttest_rel gives inf/nan here; the table says n/a, Wilcoxon stays defined (0.25 = 2^(1-3))
    assert _row(equal, "x")[2:8] == ["+0.1000", "[+0.1000, +0.1000]", "2", "n/a", "0.250", "n/a"]


@pytest.mark.parametrize("missing", ["absent", "nan"])
def test_bug_the_table_says_how_many_seeds_a_contrast_pairs(missing):
    """Bug: with a seed missing (or non-finite) in the baseline, the setting's row said "4" seeds while its Δ, df
    and p were over the 3 seeds both settings have: the table did not say the pairing left a seed out."""
    x = {0: 0.81, 1: 0.62, 2: 0.73, 3: 0.70}
    base = {0: 0.70, 1: 0.55, 2: 0.66, **({3: float("nan")} if missing == "nan" else {})}
    text = format_table(aggregate(_runs("base", base) + _runs("x", x)), _config(["base", "x"], [0, 1, 2, 3]))
    ref = _reference(x, {k: v for k, v in base.items() if math.isfinite(v)})
    cells = _row(text, "x")
    assert ref["n"] == 3 and cells[2:7] == _cells(ref)
    assert cells[8] == "4 (3 paired with base)"
    base_cells = _row(text, "base")
    assert base_cells[-3] == ("3 (1 non-finite)" if missing == "nan" else "3")


# ----------------------------------------------------------------------------- published files
def test_bug_run_logs_are_strict_json(tmp_path):
    """Bug: write_run_log wrote a diverged run's NaN loss and an infinite metric as the literals NaN and Infinity,
    which strict JSON readers (JavaScript, jq, json.loads(parse_constant=...)) refuse; they are null now."""
    from diffusionformer.experiments.publish import read_run_log, write_run_log

    recs = [{"split": "train", "step": 1, "loss": float("nan"), "lr": 0.1, "metrics": {}},
            {"split": "eval", "step": 1, "loss": 0.5, "metrics": {"acc": float("inf"), "f1": 0.25}}]
    path = write_run_log(recs, tmp_path / "seed0.json")

    def refuse(const):
        raise ValueError(f"non-standard JSON constant {const}")

    data = json.loads(path.read_text(), parse_constant=refuse)
    assert data["train"]["loss"] == [None] and data["eval"]["acc"] == [None] and data["eval"]["f1"] == [0.25]
    assert read_run_log(path) == [{"split": "train", "step": 1, "lr": 0.1, "metrics": {}},
                                  {"split": "eval", "step": 1, "loss": 0.5, "metrics": {"f1": 0.25}}]
    assert [p.name for p in tmp_path.iterdir()] == ["seed0.json"]  # no temporary left beside it


@pytest.mark.parametrize("manifest,words", [
    ({"git_commit": None, "torch": "2"}, "ran outside a git checkout"),
    ({"torch": "2"}, "predates the `git_commit` field"),
    ({}, "no `manifest.json`"),
    ({"git_commit": "abc123", "git_commits": ["abc123"]}, "`abc123`"),
])
def test_bug_a_manifest_written_outside_git_says_so(manifest, words):
    """Bug: a study run outside a git checkout records ``git_commit: null``, and its page said the commit was "not
    recorded (this study's manifest predates the `git_commit` field)": false, and it hid why no commit is known."""
    from diffusionformer.experiments.publish import _commit_line

    assert words in _commit_line(manifest)


def test_publish_recomputes_the_page_and_keeps_the_users_tail(tmp_path):
    """publish into an existing folder: the hand-written reading survives, the JSON summary holds the table's numbers."""
    from diffusionformer.experiments.outputs import write_outputs
    from diffusionformer.experiments.publish import READING_MARKER, publish_experiment

    cfg = _config(["base", "x"], [0, 1, 2, 3])
    x, base = {0: 0.81, 1: 0.62, 2: 0.73, 3: 0.70}, {0: 0.70, 1: 0.55, 2: 0.66, 3: 0.61}
    out, docs = tmp_path / "res", tmp_path / "docs"
    (out / "probe").mkdir(parents=True)
    write_outputs(out / "probe", cfg, _runs("base", base) + _runs("x", x))
    docs.mkdir()
    (docs / "index.md").write_text("# R\n\n```{toctree}\n\n```\n")
    (docs / "probe.md").write_text("old page\n" + READING_MARKER + "\nmy reading\n")
    page = publish_experiment(cfg, out, docs).read_text()
    assert page.endswith(READING_MARKER + "\nmy reading\n") and "old page" not in page
    assert _row(page, "x")[2:7] == _cells(_reference(x, base))
    summary = {r["operator"]: r for r in json.loads((docs / "probe" / "results.json").read_text())["summary"]}
    assert summary["x"]["mean"] == pytest.approx(np.mean(list(x.values())))
    assert summary["x"]["std"] == pytest.approx(np.std(list(x.values()), ddof=1))
    assert not list(docs.glob(".*publishing*"))
