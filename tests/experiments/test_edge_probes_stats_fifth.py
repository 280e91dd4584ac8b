"""Edge-case probes of the comparison statistics (fifth round): ``experiments.stats``, ``gaps``, ``compare``, ``tables``.

Probed against scipy (``ttest_rel``, ``ttest_ind(equal_var=False)``, ``wilcoxon``) and float64 formulas without
finding a fault: two pairs, Holm with tied p-values (one adjusted value, monotone), Wilcoxon with all differences
tied in size and opposite signs, one non-zero difference among zeros.

Found and fixed (tests named ``test_bug_...``):

- ``gaps.primary_table``: p, p Wilcoxon and p Holm were printed with two significant digits, so a p in
  [0.0495, 0.05) of the confirmatory table read "0.05": a value below the 5% level reading as 5% (the reading
  ``compare.format_p`` was fixed to prevent). Digits are now added until the printed value keeps its side of 0.05.
- ``stats.welch_difference`` / ``welch_t``: the variances were squared (``statistics.variance``, then ``va**2`` for
  the Welch-Satterthwaite df), so values beyond ~1e154 (a diverged float64 loss) raised ``OverflowError`` and values
  below ~1e-154 raised ``ZeroDivisionError``; t, df and p are scale-free and now computed so.
"""

from __future__ import annotations

import numpy as np
import pytest

scipy_stats = pytest.importorskip("scipy.stats")

from diffusionformer.experiments import gaps, load_experiment_config  # noqa: E402
from diffusionformer.experiments.stats import holm, paired_difference, welch_difference, welch_t, wilcoxon_p  # noqa: E402


def _seeds(values):
    return dict(enumerate(values))


def test_two_pairs_holm_ties_and_wilcoxon_corner_cases_against_scipy():
    r = paired_difference({0: 1.0, 1: 2.0}, {0: 0.5, 1: 1.0})
    ref = scipy_stats.ttest_rel([1.0, 2.0], [0.5, 1.0])
    assert (r.df, r.t, r.p) == (1, pytest.approx(ref.statistic, rel=1e-12), pytest.approx(ref.pvalue, rel=1e-12))
    assert holm([0.01, 0.01, 0.01]) == pytest.approx([0.03, 0.03, 0.03])
    adjusted = holm([0.04, 0.01, 0.03, 0.02])
    assert [adjusted[i] for i in np.argsort([0.04, 0.01, 0.03, 0.02])] == sorted(adjusted)
    assert wilcoxon_p([1.0, 1.0, -1.0, -1.0]) == pytest.approx(scipy_stats.wilcoxon([1, 1, -1, -1]).pvalue) == 1.0
    assert wilcoxon_p([0.0, 0.0, 1.0]) == 1.0


def _gap_config():
    return load_experiment_config({
        "name": "probe", "seeds": [0, 1, 2, 3, 4, 5], "operators": [{"name": "attention"}, {"name": "lap"}],
        "primary": ["t:lap"],
        "tasks": [{"name": "t", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 2}}]})


def _q(val, train):
    return {"final_val": val, "final_train": train, "final_gap": val - train, "best_val": val, "best_step": 2.0,
            "best_gap": val - train}


def test_bug_a_primary_p_just_below_005_never_prints_as_005():
    """Bug: ``gaps.primary_table`` printed p, p Wilcoxon and p Holm with two significant digits: a paired-t p of
    0.0497 (below the 5% level) read "0.05" in the confirmatory table."""
    base = [2.0, 2.1, 1.9, 2.05, 1.95, 2.02]
    d = [0.2, 0.1, -0.05, 0.31, 0.02, 0.0]
    # shift the differences so that the paired t's p is just below 0.05
    p_of = lambda c: scipy_stats.ttest_rel(np.add(base, np.add(d, c)), base).pvalue  # noqa: E731
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p_of(mid) > 0.0498 else (lo, mid)
    lap = [b + x + lo for b, x in zip(base, d)]
    p = scipy_stats.ttest_rel(lap, base).pvalue
    assert 0.0495 <= p < 0.05
    rows = {"t": {"attention": {s: _q(v, 1.0) for s, v in enumerate(base)},
                  "lap": {s: _q(v, 1.0) for s, v in enumerate(lap)}}}
    text = gaps.primary_table(_gap_config(), "unused", ("final_val",), rows=rows)
    (line,) = [x for x in text.splitlines() if x.startswith("| t, lap, final val loss")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    shown_p, shown_holm = cells[5], cells[7]
    assert float(shown_p) < 0.05 and float(shown_holm) < 0.05, cells
    assert float(shown_p) == pytest.approx(p, abs=5e-4)
    assert gaps._p(0.012) == "0.012" and gaps._p(0.051) == "0.051" and gaps._p(None) == "n/a"
    for q in np.linspace(0.0494, 0.0506, 1201):
        assert (float(gaps._p(float(q))) < 0.05) == (q < 0.05), q


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # scipy's own moments at 1e-160
@pytest.mark.parametrize("scale", [1e-160, 1e200])
def test_bug_welch_of_values_far_from_one_is_scale_free(scale):
    """Bug: ``welch_difference`` squared the variances: values of 1e200 (a diverged float64 loss) raised
    "OverflowError: integer division result too large for a float", values of 1e-160 "ZeroDivisionError" from the
    Welch-Satterthwaite df; ``welch_t`` of 1e200 overflowed the same way. t, df and p do not depend on the scale."""
    a, b = [1.0, 3.0, 2.0], [5.0, 9.0, 7.0, 8.0]
    ref = scipy_stats.ttest_ind(a, b, equal_var=False)
    r = welch_difference([x * scale for x in a], [x * scale for x in b])
    assert r.t == pytest.approx(ref.statistic, rel=1e-12) and r.df == pytest.approx(ref.df, rel=1e-12)
    assert r.p == pytest.approx(ref.pvalue, rel=1e-9)
    assert r.mean / scale == pytest.approx(np.mean(a) - np.mean(b), rel=1e-12)
    assert r.high / scale == pytest.approx(r.mean / scale + scipy_stats.t.ppf(0.975, ref.df) * r.se / scale, rel=1e-9)
    assert welch_t([x * scale for x in a], [x * scale for x in b]) == pytest.approx(ref.statistic, rel=1e-12)
    # one side without spread: df of the other side alone, as scipy
    one = welch_difference([x * scale for x in a], [4.0 * scale] * 3)
    assert one.df == pytest.approx(2.0, rel=1e-12)
