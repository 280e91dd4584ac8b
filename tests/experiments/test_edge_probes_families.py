"""Edge probes of the Holm families and the primary/exploratory labels (compare, gaps, publish.summary_table).

The published pages were recomputed from ``docs/results/*/results.json`` with an independent Holm (statsmodels is
not installed; written out below): every ``p Holm`` and ``role`` cell of every page matched.
"""

from __future__ import annotations

import json

import pytest
from scipy import stats as sps

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.compare import contrasts
from diffusionformer.experiments.publish import summary_table
from diffusionformer.experiments.results import RunResult
from diffusionformer.experiments.tables import aggregate
from experiments_references import holm_reference  # noqa: E402

SEEDS = (0, 1, 2)


def _config(**extra):
    raw = {"name": "fam", "seeds": list(SEEDS),
           "tasks": [{"name": "a", "dataset": "digits", "model": "vit-digits", "select_by": "val_acc"}],
           "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}],
           "primary": ["lap"], "primary_quantities": ["final"]}
    raw.update(extra)
    return load_experiment_config(raw)


def _runs():
    runs = []
    for s in SEEDS:
        runs.append(RunResult("a", "attention", s, "completed", "test_acc", 0.5 + s / 100,
                              selected_value=0.6 + s / 100, selected_step=1))
        runs.append(RunResult("a", "lap", s, "completed", "test_acc", 0.52 + s / 100 + 0.003 * s,
                              selected_value=0.61 + s / 100 + 0.002 * s, selected_step=1))
    return runs


def _write(tmp_path, cfg, runs):
    src = tmp_path / "res" / cfg.name
    src.mkdir(parents=True)
    (src / "results.json").write_text(json.dumps({"runs": [r.__dict__ for r in runs], "summary": []}))
    return tmp_path / "res"


@pytest.mark.parametrize("selected, quantities, marked", [
    (True, ["final"], False), (False, ["final"], True),
    (True, ["selected"], True), (False, ["selected"], False), (True, ["final", "selected", "reach"], True)])
def test_bug_summary_primary_mark_follows_primary_quantities(tmp_path, selected, quantities, marked):
    """Bug: ``summary_table`` marked a named setting ``[primary]`` on whichever quantity it showed, so with
    ``primary_quantities = ["final"]`` (the over-fitting studies) the ``--selected`` table called the best-validation
    contrast primary while the study's own page (``contrasts``) labels it exploratory."""
    cfg = _config(primary_quantities=quantities)
    text = summary_table([cfg], _write(tmp_path, cfg, _runs()), selected=selected)
    assert ("[primary]" in text) is marked
    kind = "selected" if selected else "final"
    role = {c.kind: c.role for c in contrasts(aggregate(_runs()), cfg)}[kind]
    assert (role == "primary") is marked  # the same label as the page


def test_primary_and_exploratory_families_on_a_two_task_page_match_an_independent_holm():
    """Primary contrasts of one quantity are adjusted among themselves, every other contrast over the whole quantity
    (tasks x settings, primary included); a setting whose runs all failed stays in the family as p = 1."""
    raw_ops = [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}, {"name": "half", "laplacian_heads": "half"}]
    tasks = [{"name": n, "dataset": "digits", "model": "vit-digits"} for n in ("a", "b")]
    cfg = _config(tasks=tasks, operators=raw_ops, primary=["a:lap", "b:half"], primary_quantities=["final"])
    values = {("a", "attention"): [0.50, 0.52, 0.51], ("a", "lap"): [0.53, 0.56, 0.54], ("a", "half"): [0.51, 0.52, 0.53],
              ("b", "attention"): [0.70, 0.71, 0.69], ("b", "lap"): [0.72, 0.71, 0.74]}
    runs = [RunResult(t, o, s, "completed", "test_acc", v) for (t, o), vs in values.items() for s, v in zip(SEEDS, vs)]
    runs += [RunResult("b", "half", s, "failed", "test_acc", None) for s in SEEDS]  # every run failed
    out = {(c.task, c.setting): c for c in contrasts(aggregate(runs), cfg)}
    assert len(out) == 4 and out[("b", "half")].diff.p is None and out[("b", "half")].p_holm is None
    p = {k: (None if k == ("b", "half") else sps.ttest_rel(values[k], values[(k[0], "attention")]).pvalue) for k in out}
    keys = sorted(out)
    every = dict(zip(keys, holm_reference([p[k] for k in keys])))
    prim = [k for k in keys if k in {("a", "lap"), ("b", "half")}]
    named = dict(zip(prim, holm_reference([p[k] for k in prim])))
    for k, c in out.items():
        want = named[k] if k in named else every[k]
        assert c.role == ("primary" if k in named else "exploratory")
        assert (c.p_holm is None) == (want is None)
        if want is not None:
            assert c.p_holm == pytest.approx(want, rel=1e-9)
    # the failed primary counts in the primary family: a:lap adjusted as one of two (p = 1 for the other)
    assert out[("a", "lap")].p_holm == pytest.approx(min(1.0, 2 * p[("a", "lap")]), rel=1e-9)


def test_the_published_primary_page_study_overfit_matches_an_independent_holm():
    """study-overfit (primary: laplacian-half, heat-learned on the final metric): recomputed from its results.json,
    the final contrasts are Holm over the two primary ones and the best-validation ones exploratory over the page."""
    from pathlib import Path

    from diffusionformer.experiments.publish import _load_runs

    root = Path(__file__).resolve().parents[2]
    src = root / "docs" / "results" / "study-overfit"
    if not (src / "results.json").is_file():
        pytest.skip("published results not in this checkout")
    cfg = load_experiment_config(str(root / "experiments" / "configs" / "study_overfit.toml"))
    cs = contrasts(aggregate(_load_runs(cfg, src)), cfg)
    for kind, role in (("final", "primary"), ("selected", "exploratory")):
        fam = [c for c in cs if c.kind == kind]
        assert len(fam) == 2 and {c.role for c in fam} == {role}
        for c, want in zip(fam, holm_reference([c.diff.p for c in fam])):
            assert c.p_holm == pytest.approx(want, rel=1e-12)
