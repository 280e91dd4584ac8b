"""Tests written in a second-pass mutation audit of the statistics the study's conclusions rest on
(``experiments/stats.py``: paired and Welch differences, the Wilcoxon signed-rank p, Holm and
Benjamini-Hochberg; ``experiments/compare.py``: the contrasts of a page; ``experiments/tables.py``:
the aggregated rows and the markdown tables).

Each test kills a mutant of the library code that the rest of the suite (the earlier audits
included) let through; its docstring names it (file and mutation). The references are independent
of the code: ``scipy.stats`` (``ttest_rel``, ``ttest_ind``, ``wilcoxon``, the t distribution's
quantiles), Holm's and the Wilcoxon null distribution's values worked out by hand, and table lines
written out by hand. The edge cases are the ones a reviewer probes: one or two pairs, differences
without spread (exactly or up to float32 rounding, of either sign), seeds that do not pair, NaN,
p = 0 and p = 1, exactly 50 differences (the last exact Wilcoxon), confidence levels at the edges
of (0, 1). Mutants judged equivalent are listed, with the reason, at the end of the file.
CPU only, deterministic, no network, no files.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

scipy_stats = pytest.importorskip("scipy.stats")

from diffusionformer.experiments.stats import (benjamini_hochberg, compare_rows, difference_t, holm,  # noqa: E402
                                               nadeau_bengio, paired_difference, paired_t, welch_difference,
                                               welch_t, wilcoxon_p)


def _seeds(values):
    return dict(enumerate(values))


# ----------------------------------------------------------------------------- stats.py: arguments
@pytest.mark.parametrize("level", [0.0, 1.0, -0.5, 95, "0.95", None])
def test_a_confidence_level_outside_the_open_unit_interval_is_refused(level):
    """Kills: stats._check_level ``0.0 < level < 1.0`` -> ``0.0 <= level <= 1.0`` or ``0.0 < level <= 1.0``
    (a 0% interval of width 0, or a 100% one of infinite width, reported as a result), and the
    ``isinstance(level, (int, float))`` check dropped (a string or None: a bare TypeError from ``<``)."""
    a, b = _seeds([0.8, 0.6, 0.7]), _seeds([0.7, 0.55, 0.62])
    with pytest.raises(ValueError, match="level must be a probability in"):
        paired_difference(a, b, level=level)
    with pytest.raises(ValueError, match="level must be a probability in"):
        welch_difference([0.8, 0.6, 0.7], [0.7, 0.55, 0.62], level=level)


@pytest.mark.parametrize("a,b", [([0.8, 0.6], {0: 0.7, 1: 0.5}), ({0: 0.8, 1: 0.6}, [0.7, 0.5])])
def test_either_side_given_as_a_list_is_refused(a, b):
    """Kills: stats._pairs ``not isinstance(a, Mapping) or not isinstance(b, Mapping)`` -> ``and`` or only ``a``
    checked (a list on one side was paired by its *values* as seeds: a silently wrong pairing)."""
    with pytest.raises(TypeError, match="paired values must be mappings seed -> value"):
        paired_difference(a, b)


@pytest.mark.parametrize("ratio", [0, 0.0, -0.25, "0.25", float("nan")])
def test_nadeau_bengio_refuses_a_ratio_that_is_not_a_positive_number(ratio):
    """Kills: stats.paired_difference ``test_train_ratio > 0`` -> ``>= 0`` (a zero ratio: the plain paired t
    labelled Nadeau-Bengio), the ``isinstance`` check dropped, and the whole check dropped (a negative ratio:
    a math domain error, or an interval narrower than the paired t's)."""
    a, b = _seeds([0.71, 0.74, 0.69, 0.80, 0.77]), _seeds([0.70, 0.70, 0.70, 0.75, 0.74])
    with pytest.raises(ValueError, match="test_train_ratio must be a positive number"):
        paired_difference(a, b, test_train_ratio=ratio)
    with pytest.raises(ValueError, match="test_train_ratio must be a positive number"):
        nadeau_bengio(a, b, 5, test_train_ratio=ratio)


@pytest.mark.parametrize("folds", [2.5, 5.0, "5"])
def test_nadeau_bengio_refuses_folds_that_are_not_an_int(folds):
    """Kills: stats.nadeau_bengio ``not isinstance(folds, int) or`` dropped (2.5 folds: a ratio 1/1.5 accepted;
    ``"5"``: a bare TypeError instead of the named error)."""
    a, b = _seeds([0.71, 0.74, 0.69, 0.80, 0.77]), _seeds([0.70, 0.70, 0.70, 0.75, 0.74])
    with pytest.raises(ValueError, match="folds must be an int >= 2"):
        nadeau_bengio(a, b, folds)


# ----------------------------------------------------------------------------- stats.py: no spread
def test_a_constant_negative_shift_keeps_its_mean_df_and_level():
    """Kills: stats.paired_difference ``_no_spread(abs(mean), values)`` -> ``_no_spread(mean, values)`` (every
    negative constant shift read as "all differences are zero"), and stats._finish's no-spread ``Difference``
    losing ``df`` (-> None) or ``level`` (-> 0.95)."""
    a, b = _seeds([1.0, 2.0, 3.0]), _seeds([1.5, 2.5, 3.5])  # every seed exactly 0.5 worse
    r = paired_difference(a, b, level=0.9)
    assert (r.n, r.mean, r.se, r.low, r.high, r.df, r.t, r.p) == (3, -0.5, 0.0, -0.5, -0.5, 2, None, None)
    assert r.level == 0.9 and "no spread" in r.note
    assert r.p_wilcoxon == 0.25  # three negative differences: 2 * 1/8
    w = welch_difference([2.0, 2.0, 2.0], [2.5, 2.5], level=0.9)  # no spread on either side, a real difference
    assert (w.mean, w.t, w.p, w.low, w.high, w.df, w.n, w.level) == (-0.5, None, None, -0.5, -0.5, 3.0, 2, 0.9)


def test_all_zero_differences_keep_df_and_level():
    """Kills: stats._finish's all-zero ``Difference`` with ``df`` -> None or ``level`` -> 0.95."""
    r = paired_difference(_seeds([0.7, 0.8, 0.9, 0.6]), _seeds([0.7, 0.8, 0.9, 0.6]), level=0.8)
    assert (r.mean, r.t, r.p, r.df, r.level, r.p_wilcoxon) == (0.0, 0.0, 1.0, 3, 0.8, 1.0)
    assert r.note == "all differences are zero"


def test_no_spread_is_judged_on_the_magnitude_of_negative_values_too():
    """Kills: stats._no_spread ``max([1e-300, *map(abs, values)])`` -> ``max([1e-300, *values])`` (negative
    metrics, e.g. a log-likelihood, had a threshold of 1e-306 and float32 rounding gave a t of ~1e6)."""
    base = np.array([0.9649999737739563, 0.9750000238418579, 0.9700000286102295])  # float32 accuracies
    better = np.array([0.9800000190734863, 0.9900000095367432, 0.9850000143051147])
    assert np.std(better - base) > 0  # the rounding is there
    r = paired_difference(_seeds((-better).tolist()), _seeds((-base).tolist()))
    assert r.t is None and r.p is None and r.mean == pytest.approx(-0.015, abs=1e-6) and "no spread" in r.note


def test_no_spread_is_judged_against_both_settings_values():
    """Kills: stats._pairs returning only ``a``'s values for the resolution (a setting near 0 against a baseline
    near 1000: a spread of 1e-4, 1e-7 of the values, read as a real one with a t of ~1e7)."""
    a, b = _seeds([0.0, 1e-4, 2e-4]), _seeds([1000.0, 1000.0, 1000.0])
    r = paired_difference(a, b)
    assert r.t is None and r.p is None and "no spread" in r.note
    assert r.mean == pytest.approx(-999.9999, rel=1e-12)


def test_a_spread_well_above_the_resolution_is_a_real_spread():
    """Kills: stats ``RELATIVE_RESOLUTION = 1e-6`` -> ``1e-4`` (differences of a few 1e-5 on values near 1, 30
    times the float32 rounding, lost their t test)."""
    b = [1.0, 1.0, 1.0, 1.0]
    d = [1e-5, 3e-5, 2e-5, 5e-5]
    a = [x + y for x, y in zip(b, d)]
    ref = scipy_stats.ttest_rel(a, b)
    r = paired_difference(_seeds(a), _seeds(b))
    assert r.t == pytest.approx(ref.statistic, rel=1e-6) and r.p == pytest.approx(ref.pvalue, rel=1e-6)


def test_differences_below_the_resolution_are_all_zero_for_wilcoxon_too():
    """Kills: stats.paired_difference ``mean, d = 0.0, [0.0] * n`` -> ``mean = 0.0`` (t = 0 and p = 1, but the
    Wilcoxon p computed on the sub-resolution differences: 0.125 instead of 1)."""
    d = [8e-7, 8e-7, 8e-7, 8e-7, -4e-7]  # mean 5.6e-7 and std 5.4e-7: below 1e-6 of values near 1
    r = paired_difference(_seeds([1.0 + x for x in d]), _seeds([1.0] * 5))
    assert (r.mean, r.t, r.p, r.p_wilcoxon) == (0.0, 0.0, 1.0, 1.0) and r.note == "all differences are zero"


def test_all_values_zero():
    """Kills: stats.paired_difference ``if q > 0 else x`` dropped (every value 0, e.g. an error count of 0 on
    every seed: ZeroDivisionError)."""
    r = paired_difference(_seeds([0.0, 0.0, 0.0]), _seeds([0.0, 0.0, 0.0]))
    assert (r.mean, r.t, r.p, r.p_wilcoxon, r.df) == (0.0, 0.0, 1.0, 1.0, 2)


def test_wilcoxon_ranks_differences_equal_up_to_rounding_as_ties():
    """Kills: stats.paired_difference passing the raw differences to ``wilcoxon_p`` (no rounding) and rounding on
    the scale of the differences (``max(map(abs, d))``) instead of the values': on values near 100 (a
    perplexity), |0.1 + 1e-5| and |-0.1 + 2e-5| are one rank tie, as scipy's exact test of the rounded
    differences has it (p 0.125; 0.0625 with the ties broken)."""
    b = [100.0 + k for k in range(6)]
    d = [0.1, 0.1 + 1e-5, -0.1 + 2e-5, 0.2, 0.3, 0.4]
    r = paired_difference(_seeds([x + y for x, y in zip(b, d)]), _seeds(b))
    ref = scipy_stats.wilcoxon([0.1, 0.1, -0.1, 0.2, 0.3, 0.4], method=scipy_stats.PermutationMethod()).pvalue
    assert ref == pytest.approx(0.125) and r.p_wilcoxon == pytest.approx(ref, rel=1e-12)
    # by hand: ranks 2, 2, 2 (the tie), 4, 5, 6; W- = 2; P(W- <= 2) = (1 + 3) / 64, two-sided 8 / 64
    assert r.p_wilcoxon == 8 / 64


# ----------------------------------------------------------------------------- stats.py: Welch
def test_welch_refuses_nan_and_keeps_n_mean_and_level_of_small_samples():
    """Kills: stats.welch_difference's non-finite check dropped (NaN through to the t and p), ``na and nb`` ->
    ``na or nb`` (an empty side: StatisticsError), ``min(na, nb)`` -> ``max`` in the too-small ``Difference``
    and ``level=level`` dropped there."""
    with pytest.raises(ValueError, match="non-finite values"):
        welch_difference([0.8, float("nan"), 0.7], [0.6, 0.5])
    with pytest.raises(ValueError, match="non-finite values"):
        welch_difference([0.8, 0.7], [0.6, float("inf")])
    empty = welch_difference([], [0.6, 0.5, 0.4], level=0.9)
    assert (empty.n, empty.mean, empty.t, empty.level) == (0, None, None, 0.9) and "0 and 3 value(s)" in empty.note
    one = welch_difference([0.9], [0.6, 0.5, 0.4], level=0.9)
    assert (one.n, one.mean, one.t, one.p, one.level) == (1, pytest.approx(0.4), None, None, 0.9)


def test_welch_of_unequal_sizes_reports_the_smaller_n_and_the_level():
    """Kills: stats.welch_difference ``_finish("Welch", min(na, nb), ...)`` -> ``na`` and its ``level`` -> 0.95
    (a 90% interval computed and labelled 95%)."""
    a, b = [1.0, 1.4, 0.9, 1.2, 1.1], [0.2, 0.9, 0.5]
    r = welch_difference(a, b, level=0.9)
    ref = scipy_stats.ttest_ind(a, b, equal_var=False)
    ci = ref.confidence_interval(0.9)
    assert r.n == 3 and r.level == 0.9
    assert (r.low, r.high) == (pytest.approx(ci.low, rel=1e-10), pytest.approx(ci.high, rel=1e-10))
    assert welch_difference(b, a).n == 3


def test_welch_without_spread_has_the_pooled_df_and_a_negative_shift_survives():
    """Kills: stats.welch_difference's no-spread ``df`` ``float(na + nb - 2)`` -> ``na + nb - 1`` or None, and
    ``_no_spread(abs(mean), a + b)`` -> ``_no_spread(mean, a + b)`` (a negative shift zeroed)."""
    flat = welch_difference([1.0, 1.0, 1.0], [1.0, 1.0])
    assert (flat.mean, flat.t, flat.p, flat.df) == (0.0, 0.0, 1.0, 3.0)
    down = welch_difference([1.0, 1.0], [1.5, 1.5])
    assert (down.mean, down.t, down.p, down.df, down.low, down.high) == (-0.5, None, None, 2.0, -0.5, -0.5)


def test_welch_differences_at_the_rounding_level_have_no_spread():
    """Kills: stats.welch_difference ``_no_spread(se, a + b)`` -> ``se == 0.0`` (values equal up to 1e-9, a
    thousandth of the resolution: a t and p from rounding noise, instead of no difference: t 0, p 1)."""
    a, b = [1.0 + 1e-9, 1.0 - 1e-9, 1.0 + 2e-9], [1.0, 1.0, 1.0 + 1e-9]
    assert scipy_stats.ttest_ind(a, b, equal_var=False).pvalue < 0.9  # what the noise alone would say
    r = welch_difference(a, b)
    assert (r.mean, r.t, r.p, r.se) == (0.0, 0.0, 1.0, 0.0) and r.note == "all differences are zero"


# ----------------------------------------------------------------------------- stats.py: Wilcoxon
@pytest.mark.parametrize("n", [50, 51])
def test_wilcoxon_is_exact_up_to_50_differences_and_normal_beyond(n):
    """Kills: stats.wilcoxon_p ``n <= 50`` -> ``n < 50`` (50 differences by the normal approximation) or
    ``n <= 51`` (51 exactly): the documented switch, checked against scipy's exact and approximate tests."""
    d = np.random.default_rng(0).normal(0.3, 1.0, n)
    exact = scipy_stats.wilcoxon(d, method="exact").pvalue
    approx = scipy_stats.wilcoxon(d, method="approx", correction=False).pvalue
    assert abs(exact - approx) > 1e-4  # the two differ here
    assert wilcoxon_p(d) == pytest.approx(exact if n <= 50 else approx, rel=1e-9)


def test_wilcoxon_p_is_capped_at_one():
    """Kills: stats.wilcoxon_p ``min(1.0, 2.0 * min(le, ge))`` -> ``2.0 * min(le, ge)`` (tied |d| of both signs
    put W+ at the centre: both tails hold 3/4 of the sign patterns, p 1.5)."""
    assert wilcoxon_p([1.0, -1.0]) == 1.0
    assert wilcoxon_p([0.5, -0.5, 0.0, 2.0, -2.0]) == 1.0
    assert scipy_stats.wilcoxon([0.5, -0.5, 2.0, -2.0], method=scipy_stats.PermutationMethod()).pvalue == pytest.approx(1.0)


# ----------------------------------------------------------------------------- stats.py: Holm and BH
def test_p_of_zero_is_a_valid_p_and_nan_is_not():
    """Kills: stats._check_p ``0.0 <= x`` -> ``0.0 < x`` (a p that underflowed to 0 refused) and
    ``not (0.0 <= x <= 1.0)`` -> ``x < 0.0 or x > 1.0`` (NaN let through: a NaN Holm p, never significant,
    and it breaks the sort of the whole family)."""
    assert holm([0.0, 0.02, 0.5]) == pytest.approx([0.0, 0.04, 0.5])  # by hand: 3*0, 2*0.02, max(0.04, 0.5)
    assert benjamini_hochberg([0.0, 0.02, 0.5]) == pytest.approx([0.0, 0.03, 0.5])  # 3*0/1, 3*0.02/2, 3*0.5/3
    for adjust in (holm, benjamini_hochberg):
        with pytest.raises(ValueError, match=r"p-values must lie in \[0, 1\]"):
            adjust([0.01, float("nan")])
        with pytest.raises(ValueError, match=r"p-values must lie in \[0, 1\]"):
            adjust([1.0000001])


def test_holm_with_tied_p_values():
    """Kills: stats.holm sorting the p values in descending order; ties (here two contrasts with p 0.01) get the
    same adjusted p, whatever their order, as Holm's step-down worked out by hand."""
    # sorted: 0.01, 0.01, 0.02, 0.04 -> 4*0.01, max(., 3*0.01), max(., 2*0.02), max(., 1*0.04)
    assert holm([0.02, 0.01, 0.04, 0.01]) == pytest.approx([0.04, 0.04, 0.04, 0.04])
    assert holm([0.3, 0.001, 0.001]) == pytest.approx([0.3, 0.003, 0.003])


def test_benjamini_hochberg_keeps_none_and_steps_up():
    """Kills: stats.benjamini_hochberg returning its internal list (a missing p came back as 1.0 instead of None)
    and dropping the running minimum (step-up): values by hand."""
    assert benjamini_hochberg([0.01, None, 0.04]) == [pytest.approx(0.03), None, pytest.approx(0.06)]
    # sorted 0.01, 0.011, 0.5 (m = 3): 0.03, 0.0165, 0.5 -> running minimum from the top: 0.0165, 0.0165, 0.5
    assert benjamini_hochberg([0.01, 0.011, 0.5]) == pytest.approx([0.0165, 0.0165, 0.5])


# ----------------------------------------------------------------------------- stats.py: the bare statistics
def test_bare_t_statistics_at_their_edges():
    """Kills: stats.welch_t ``len(a) < 2 or len(b) < 2`` -> ``and`` (StatisticsError for one value) and
    ``se == 0.0`` -> ``se < 0.0`` (ZeroDivisionError without spread); stats.paired_t ``len(keys) < 2`` -> ``< 1``
    and ``sd == 0.0`` -> ``sd < 0.0``."""
    assert welch_t([1.0], [0.0, 1.0, 2.0]) is None and welch_t([0.0, 1.0, 2.0], [1.0]) is None
    assert welch_t([1.0, 1.0], [2.0, 2.0]) is None
    assert paired_t({0: 1.0, 5: 2.0}, {0: 0.0, 6: 1.0}) is None  # one shared seed
    assert paired_t({0: 1.0, 1: 2.0}, {0: 0.5, 1: 1.5}) is None  # equal differences


def test_difference_t_reads_the_right_key_and_direction():
    """Kills: stats.difference_t ``paired`` negated, the ``selected_values`` -> ``selected_by_seed`` key mapping
    dropped (always the final metric), and ``paired_t(row, base)`` -> ``(base, row)`` (the sign of t)."""
    row = {"values": [0.80, 0.84, 0.86], "by_seed": {0: 0.80, 1: 0.84, 2: 0.86},
           "selected_values": [0.90, 0.91, 0.95], "selected_by_seed": {0: 0.90, 1: 0.91, 2: 0.95}}
    base = {"values": [0.70, 0.81, 0.80], "by_seed": {0: 0.70, 1: 0.81, 2: 0.80},
            "selected_values": [0.80, 0.85, 0.86], "selected_by_seed": {0: 0.80, 1: 0.85, 2: 0.86}}
    assert difference_t(row, base, "values", True) == pytest.approx(
        scipy_stats.ttest_rel(row["values"], base["values"]).statistic, rel=1e-10)
    assert difference_t(row, base, "selected_values", True) == pytest.approx(
        scipy_stats.ttest_rel(row["selected_values"], base["selected_values"]).statistic, rel=1e-10)
    assert difference_t(row, base, "values", False) == pytest.approx(
        scipy_stats.ttest_ind(row["values"], base["values"], equal_var=False).statistic, rel=1e-10)


def test_compare_rows_selected_values_k_fold_level_and_zero_folds():
    """Kills: stats.compare_rows's ``values`` -> key mapping dropped (always ``by_seed``), ``level`` not passed to
    ``nadeau_bengio``, and ``folds is not None`` -> ``folds`` (``folds=0`` silently the plain paired t instead
    of the named error)."""
    row = {"by_seed": {0: 0.80, 1: 0.84, 2: 0.86}, "selected_by_seed": {0: 0.90, 1: 0.91, 2: 0.95}}
    base = {"by_seed": {0: 0.70, 1: 0.81, 2: 0.80}, "selected_by_seed": {0: 0.80, 1: 0.85, 2: 0.86}}
    sel = compare_rows(row, base, "selected_values")
    assert sel.p == pytest.approx(scipy_stats.ttest_rel([0.90, 0.91, 0.95], [0.80, 0.85, 0.86]).pvalue, rel=1e-9)
    d = np.array([0.10, 0.03, 0.06])
    se = d.std(ddof=1) * math.sqrt(1 / 3 + 1 / 2)  # 3 folds: n2/n1 = 1/2
    half = scipy_stats.t.ppf(0.95, 2) * se
    cv = compare_rows(row, base, folds=3, level=0.9)
    assert cv.method == "Nadeau-Bengio" and cv.level == 0.9
    assert (cv.low, cv.high) == (pytest.approx(d.mean() - half, rel=1e-9), pytest.approx(d.mean() + half, rel=1e-9))
    with pytest.raises(ValueError, match="folds must be an int >= 2"):
        compare_rows(row, base, folds=0)


# ----------------------------------------------------------------------------- tables.py: a whole page by hand
def _page():
    from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
    from diffusionformer.experiments.results import RunResult

    ops = [OperatorSetting("attention"), OperatorSetting("lap", laplacian_heads=1)]
    tasks = [TaskConfig("gone", "digits", "vit-digits"),  # no run at all: skipped, the tasks after it are not
             TaskConfig("a", "digits", "vit-digits", select_by="val_acc", reach={"val_loss": 0.5}),
             TaskConfig("cv", "digits", "vit-digits", folds=3)]
    cfg = ExperimentConfig("x", tasks, ops, seeds=[0, 1, 2], primary=["a:lap"])

    def run(task, op, seed, value, **kw):
        return RunResult(task, op, seed, kw.pop("status", "completed"), "test_acc", value, **kw)

    runs = []
    for s in range(3):
        runs.append(run("a", "attention", s, [0.70, 0.72, 0.71][s], num_parameters=1000, elapsed=[10.0, 12.0, 0.0][s],
                        reach_step=[100, 120, None][s]))
        runs.append(run("a", "lap", s, [0.75, 0.74, 0.78][s], selected_value=[0.76, 0.75, 0.80][s], selected_step=10,
                        reach_step=[80, 90, 100][s]))
    runs.append(run("a", "lap", 3, None, status="failed: CUDA out of memory"))
    for s in range(3):
        runs.append(run("cv", "attention", s, [0.60, 0.65, 0.62][s], num_parameters=5, elapsed=1.0))
        runs.append(run("cv", "lap", s, [0.66, 0.66, 0.70][s], num_parameters=5, elapsed=1.0))
    return cfg, runs


def _stat_cells(a, b, folds=None, compact=False, role="primary", p_holm=None):
    """The comparison cells of a row, from numpy and scipy (paired t, or Nadeau-Bengio for ``folds``)."""
    d = np.subtract(a, b)
    n = len(d)
    se = d.std(ddof=1) * math.sqrt(1 / n + (1 / (folds - 1) if folds else 0.0))
    t = d.mean() / se
    p = 2 * scipy_stats.t.sf(abs(t), n - 1)
    if not folds:
        assert p == pytest.approx(scipy_stats.ttest_rel(a, b).pvalue, rel=1e-9)
    half = scipy_stats.t.ppf(0.975, n - 1) * se
    w = scipy_stats.wilcoxon(d, method="exact").pvalue
    holm_p = p if p_holm is None else p_holm
    cells = [f"{d.mean():+.4f}", f"[{d.mean() - half:+.4f}, {d.mean() + half:+.4f}]"]
    cells += [] if compact else [f"{n - 1}"]
    cells += [f"{p:.3f}"] + ([] if compact else [f"{w:.3f}"]) + [f"{holm_p:.3f}", role]
    return cells


def test_a_page_written_out_by_hand():
    """Kills: tables.format_table ``continue`` -> ``break`` for a task without rows (every later task lost), the
    k-fold line shown for the wrong tasks, ``≤`` for a loss threshold, the role column, the ``(k failed)`` cell,
    ``num_parameters or "n/a"``, the time per run with one decimal, ``header``'s ``---|`` count; tables.aggregate
    ``elapsed_mean`` over ``if r.elapsed`` (a 0.0 s run left out) or over no runs at all; the reach cell ``k of n``
    over completed runs; and stats/compare: the censored and no-pair cells ``n/a``."""
    from diffusionformer.experiments.tables import aggregate, format_table

    cfg, runs = _page()
    text = format_table(aggregate(runs), cfg)
    fin = _stat_cells([0.75, 0.74, 0.78], [0.70, 0.72, 0.71])
    p_fin = float(fin[5])
    cv = _stat_cells([0.66, 0.66, 0.70], [0.60, 0.65, 0.62], folds=3, role="exploratory")
    assert float(cv[5]) > p_fin  # Holm over {a, cv}: max(2 p_a, p_cv) = p_cv (checked below)
    assert 2 * p_fin < float(cv[5])
    na = " | ".join(["n/a"] * 6)  # Δ, CI, df, p, p Wilcoxon, p Holm
    empty = " | ".join([""] * 7)  # the same and the role
    heads = "| operator | test_acc mean ± std | Δ vs attention | 95% CI | df | p | p Wilcoxon | p Holm | role |"
    want = [
        "### a (digits, vit-digits): test_acc, higher is better",
        "",
        heads + " seeds | params | time/run (s) |",
        "|" + "---|" * 12,
        f"| attention | 0.7100 ± 0.0100 | {empty} | 3 | 1000 | 7.3 |",  # (10 + 12 + 0) / 3
        f"| lap | 0.7567 ± 0.0208 | {' | '.join(fin)} | 3 (1 failed) | n/a | n/a |",
        "",
        "#### a: test_acc at best val_acc",
        "",
        heads,
        "|" + "---|" * 9,
        f"| attention | n/a | {empty} |",
        f"| lap | 0.7700 ± 0.0265 | {na} | primary |",  # the baseline has no selected values: no pairs
        "",
        "#### a: steps to val_loss ≤ 0.5",
        "",
        "| operator | steps mean ± std (runs that reached it) | Δ vs attention | 95% CI | df | p | p Wilcoxon | p Holm | role |",
        "|" + "---|" * 9,
        f"| attention | 110 ± 14 (2 of 3) | {empty} |",
        f"| lap | 90 ± 10 (3 of 3) | {na} | primary |",  # censored: attention's seed 2 never reached it
        "",
        "### cv (digits, vit-digits): test_acc, higher is better",
        "",
        "3-fold cross-validation: seed s tests on fold s % 3; the spread is over folds and the comparison is paired "
        "over folds with the Nadeau-Bengio correction.",
        "",
        heads + " seeds | params | time/run (s) |",
        "|" + "---|" * 12,
        f"| attention | 0.6233 ± 0.0252 | {empty} | 3 | 5 | 1.0 |",
        f"| lap | 0.6733 ± 0.0231 | {' | '.join(cv)} | 3 | 5 | 1.0 |",
        "",
    ]
    lines = text.split("\n")
    assert lines[:len(want)] == want
    assert lines[len(want)].startswith("mean ± std: over seeds (sample std).") and lines[len(want) + 1:] == [""]
    assert "df: its degrees of freedom" in lines[len(want)] and text.endswith("all others are exploratory.\n")


def test_the_compact_page_written_out_by_hand():
    """Kills: tables.format_table's compact form: the legend called without ``compact`` (the df and Wilcoxon
    columns explained though they are not shown), df or p Wilcoxon cells kept."""
    from diffusionformer.experiments.tables import aggregate, format_table

    cfg, runs = _page()
    text = format_table(aggregate(runs), cfg, compact=True)
    fin = _stat_cells([0.75, 0.74, 0.78], [0.70, 0.72, 0.71], compact=True)
    lines = text.split("\n")
    assert lines[:6] == [
        "### a (digits, vit-digits): test_acc, higher is better",
        "",
        "| operator | test_acc mean ± std | Δ vs attention | 95% CI | p | p Holm | role | seeds | params | time/run (s) |",
        "|" + "---|" * 10,
        f"| attention | 0.7100 ± 0.0100 | {' | '.join([''] * 5)} | 3 | 1000 | 7.3 |",
        f"| lap | 0.7567 ± 0.0208 | {' | '.join(fin)} | 3 (1 failed) | n/a | n/a |"]
    assert "at best val_acc" not in text and "steps to" not in text
    legend = lines[-2]
    assert legend.startswith("mean ± std: over seeds (sample std).")
    assert "df:" not in legend and "p Wilcoxon" not in legend and "Steps to a threshold" not in legend


# ----------------------------------------------------------------------------- compare.py
def test_a_censored_step_contrast_says_why_it_has_no_test():
    """Kills: compare.contrasts's censored ``Difference`` losing its note (a reader sees n/a with no reason)."""
    from diffusionformer.experiments.compare import contrasts
    from diffusionformer.experiments.tables import aggregate

    cfg, runs = _page()
    reach = next(c for c in contrasts(aggregate(runs), cfg) if c.kind == "reach")
    assert (reach.diff.n, reach.diff.p, reach.p_holm) == (0, None, None)
    assert reach.diff.note == "censored: some run never reached the threshold"


# ----------------------------------------------------------------------------- tables.py: aggregate
def test_aggregate_counts_non_finite_stops_as_failed_and_keeps_nan_selections_out():
    """Kills: tables.aggregate ``r.status != "completed"`` -> ``r.status.startswith("failed")`` (a run the Trainer
    stopped on a non-finite loss, status ``"non_finite"``, not counted as failed), the ``math.isfinite`` filter
    of the selected values dropped (a NaN selected value in the mean and the pairing), and ``metric`` not taken
    from the runs."""
    from diffusionformer.experiments.results import RunResult
    from diffusionformer.experiments.tables import aggregate

    runs = [RunResult("t", "lap", 0, "completed", "val_loss", 2.0, selected_value=1.9, selected_step=10),
            RunResult("t", "lap", 1, "completed", "val_loss", 2.2, selected_value=float("nan"), selected_step=20),
            RunResult("t", "lap", 2, "completed", "val_loss", 2.6, selected_value=2.1, selected_step=30),
            RunResult("t", "lap", 3, "non_finite", "val_loss", None)]
    (row,) = aggregate(runs)
    assert row["metric"] == "val_loss" and row["failed"] == 1 and row["n"] == 3
    assert row["selected_values"] == [1.9, 2.1] and row["selected_by_seed"] == {0: 1.9, 2: 2.1}
    assert row["selected_steps"] == [10, 30]
    assert row["selected_mean"] == pytest.approx(2.0) and row["selected_std"] == pytest.approx(np.std([1.9, 2.1], ddof=1))
    assert row["reach_steps"] == [None, None, None]  # the non_finite run is not a completed one


def test_bug_a_failed_first_run_does_not_hide_the_parameter_count():
    """Bug: tables.aggregate took ``num_parameters`` from the setting's first run, so when seed 0 failed before its
    model was built (``RunResult(..., "failed: ...", ..., None)`` carries no count) the table said ``params n/a``
    although the setting's other runs report it. It now takes the first run that has a count. (Also kills
    ``rs[0]`` -> ``rs[-1]``.)"""
    from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
    from diffusionformer.experiments.results import RunResult
    from diffusionformer.experiments.tables import aggregate, format_table

    runs = [RunResult("t", "lap", 0, "failed: CUDA out of memory", "test_acc", None),
            RunResult("t", "lap", 1, "completed", "test_acc", 0.8, num_parameters=1234),
            RunResult("t", "lap", 2, "completed", "test_acc", 0.9, num_parameters=1234),
            RunResult("t", "lap", 3, "failed: killed", "test_acc", None)]
    (row,) = aggregate(runs)
    assert row["num_parameters"] == 1234
    cfg = ExperimentConfig("p", [TaskConfig("t", "digits", "vit-digits")], [OperatorSetting("lap", laplacian_heads=1)],
                           seeds=[0, 1, 2, 3])
    assert "| lap | 0.8500 ± 0.0707 | 2 (2 failed) | 1234 | n/a |" in format_table([row], cfg)


def test_bug_runs_that_took_zero_seconds_have_a_mean_time_of_zero():
    """Bug: tables.aggregate tested ``any(r.elapsed for r in rs)``, so a setting whose runs all recorded
    ``elapsed = 0.0`` (a resumed run that had nothing left to train, a coarse clock) showed ``n/a`` for its time
    per run instead of 0.0; only runs without a time (``None``) are n/a."""
    from diffusionformer.experiments.results import RunResult
    from diffusionformer.experiments.tables import aggregate

    zero = [RunResult("t", "lap", s, "completed", "test_acc", 0.8, elapsed=0.0) for s in (0, 1)]
    assert aggregate(zero)[0]["elapsed_mean"] == 0.0
    mixed = zero[:1] + [RunResult("t", "lap", 1, "completed", "test_acc", 0.8, elapsed=3.0)]
    assert aggregate(mixed)[0]["elapsed_mean"] == 1.5
    assert aggregate([RunResult("t", "lap", 0, "completed", "test_acc", 0.8)])[0]["elapsed_mean"] is None


@pytest.mark.parametrize("steps,cell", [([], "never"), ([None, None, None], "never (0 of 3)"), ([None, 120, None], "120 (1 of 3)"),
                                        ([100, None, 131], "116 ± 22 (2 of 3)")])
def test_reach_cells_by_hand(steps, cell):
    """Kills: tables._reach_steps_cell ``... if steps else "never"`` dropped either way (``never (0 of 0)`` for a
    setting whose runs all failed, or ``never`` without the count), the spread shown only from three runs
    (``len(hit) > 2``), and ``k of n`` counting the runs that reached it twice (``of len(hit)``)."""
    from diffusionformer.experiments.tables import _reach_steps_cell

    assert _reach_steps_cell({"reach_steps": steps}) == cell  # 2 of 3: mean 115.5, sample std 21.92


def test_a_loss_task_without_selected_values_and_an_empty_page():
    """Kills: tables.format_table ``arrow`` always "higher is better", the ``selected`` table written when no row
    has a selected value (``any("selected_mean" in r ...)`` dropped: a table of ``n/a``), and the legend written
    under a page with no task rows (``if lines and stat_heads`` -> ``if stat_heads``)."""
    from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
    from diffusionformer.experiments.results import RunResult
    from diffusionformer.experiments.tables import aggregate, format_table

    task = TaskConfig("lm", "digits", "vit-digits", metric="val_loss", select_by="val_loss")
    cfg = ExperimentConfig("l", [task], [OperatorSetting("attention"), OperatorSetting("lap", laplacian_heads=1)],
                           seeds=[0, 1])
    runs = [RunResult("lm", op, s, "completed", "val_loss", v) for op, vs in (("attention", [2.0, 2.2]), ("lap", [1.9, 2.0]))
            for s, v in enumerate(vs)]
    text = format_table(aggregate(runs), cfg)
    assert text.startswith("### lm (digits, vit-digits): val_loss, lower is better\n")
    assert "at best" not in text
    assert format_table([], cfg) == ""


def test_format_status_written_out_by_hand():
    """Kills: tables.format_status ``max(r["step"], 1)`` -> ``r["step"]`` (a completed run logged at step 0:
    ZeroDivisionError), ``max(max_steps - step, 0)`` dropped (a run past a lowered ``max_steps``: negative time
    left), ``or not r["max_steps"]`` dropped (TypeError on a run without ``max_steps``), ``and r["elapsed"]``
    dropped (a completed run without a time: TypeError), the holder and the ``step / max_steps`` cells."""
    from diffusionformer.experiments.tables import format_status

    def row(task, seed, state, step, max_steps, elapsed=None, holder=None):
        return dict(task=task, operator="att", seed=seed, state=state, step=step, max_steps=max_steps, elapsed=elapsed,
                    holder=holder)

    rows = [row("z", 0, "completed", 0, None, elapsed=30.0), row("z", 1, "running", 5, 3, holder="pid 9 on h"),
            row("z", 2, "interrupted", 2, None), row("a", 0, "completed", 10, 10), row("a", 1, "missing", 0, 10)]
    head = "| operator | seed | state | step | training time (s) |\n|---|---|---|---|---|\n"
    assert format_status(rows) == (
        "2 of 5 runs completed; about 0 min of training left on one worker "
        "(plus 2 run(s) of tasks with no finished run to time).\n\n### z\n\n" + head +
        "| att | 0 | completed | 0 | 30 |\n| att | 1 | running (pid 9 on h) | 5 / 3 | n/a |\n"
        "| att | 2 | interrupted | 2 | n/a |\n\n### a\n\n" + head +
        "| att | 0 | completed | 10 / 10 | n/a |\n| att | 1 | missing | 0 / 10 | n/a |\n")


# ----------------------------------------------------------------------------- equivalent mutants
# stats._no_spread ``spread <= RELATIVE_RESOLUTION * m`` -> ``<``: differs only when the spread equals the float
#   product fl(1e-6) * m exactly; with sd = 0 and every value 0 both read 0 <= / < 1e-306. A difference of exactly
#   fl(1e-6) * max|values| needs 20 more mantissa bits than a double near the values has: not reachable.
# stats.nadeau_bengio ``isinstance(folds, bool)`` dropped: True is 1 < 2 and False is 0 < 2, refused either way.
# stats.welch_difference ``va = vb = se = 0.0`` -> ``se = 0.0``: va and vb are read after it only in the df,
#   which takes the ``se > 0`` branch's else (na + nb - 2) when se is 0.
# stats.wilcoxon_p W+ -> W- (``x > 0`` -> ``x < 0``): the null distribution is symmetric (every sign pattern has
#   its mirror), so min(P(W <= w), P(W >= w)) and |z| are the same for W- as for W+.
# stats.wilcoxon_p ``min(1.0, 2 * ndtr(-|z|))`` -> ``2 * ndtr(-|z|)``: ndtr(-|z|) <= 0.5, the cap never binds.
# compare._reach_by_seed ``{k: float(v)}`` -> ``dict(by_seed)``: paired_difference converts with float() itself.
# compare.contrasts ``task.folds is not None`` -> ``task.folds`` (reach): TaskConfig refuses folds < 2, so a
#   set ``folds`` is always truthy.
# tables._contrast_cells ``f"{d.df:g}"`` -> ``f"{d.df:.0f}"``: the tables hold only paired and Nadeau-Bengio
#   contrasts, whose df is the int n - 1 (Welch's fractional df never reaches a table).
# compare.contrasts censored ``note="censored..."`` -> ``note="" or "censored..."``: a mis-built mutant, the same
#   string (``test_a_censored_step_contrast_says_why_it_has_no_test`` kills ``note=""``).


def test_a_censored_step_contrast_of_a_k_fold_task_names_nadeau_bengio():
    """Bug (sitting 57): a censored steps-to-threshold contrast of a k-fold task was labelled ``paired t``, though its
    uncensored form (and the page's legend) is Nadeau-Bengio corrected."""
    from diffusionformer.experiments.compare import contrasts
    from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
    from diffusionformer.experiments.results import RunResult
    from diffusionformer.experiments.tables import aggregate

    ops = [OperatorSetting("attention"), OperatorSetting("lap", laplacian_heads=1)]
    for folds, method in ((3, "Nadeau-Bengio"), (None, "paired t")):
        cfg = ExperimentConfig("x", [TaskConfig("cv", "digits", "vit-digits", folds=folds, reach={"val_loss": 0.5})],
                               ops, seeds=[0, 1, 2])
        runs = [RunResult("cv", op, s, "completed", "test_acc", 0.6 + 0.01 * s, num_parameters=5, elapsed=1.0,
                          reach_step=None if (op, s) == ("lap", 2) else 100 + s)
                for op in ("attention", "lap") for s in range(3)]
        reach = next(c for c in contrasts(aggregate(runs), cfg) if c.kind == "reach")
        assert (reach.diff.method, reach.diff.n, reach.diff.p) == (method, 0, None)
        assert reach.diff.note == "censored: some run never reached the threshold"
