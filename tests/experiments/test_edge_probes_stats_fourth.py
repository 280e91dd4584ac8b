"""Edge-case probes of the comparison statistics (fourth round): ``experiments.stats`` and its callers.

Probed against scipy (``ttest_rel``, ``ttest_ind``, ``wilcoxon``, ``t.ppf``) and float64 formulas: the paired
and Welch t where one pair (or one side) is far larger in magnitude than the rest (a diverged seed), the
Nadeau-Bengio correction over K folds x repeats, and the types of the two sides.

Found and fixed (tests named ``test_bug_...``):

- ``stats.paired_difference`` / ``paired_t``: "no spread" was judged against 1e-6 of the *largest* value of all
  pairs, so one diverged seed (a loss of 5000 in both settings) made every other pair's difference (~1e-3) a
  zero: ``t = 0, p = 1, p_wilcoxon = 1``, "all differences are zero", where scipy's paired t has p 0.001. Each
  difference is now resolved against its own pair's values (as the Wilcoxon ranks already were).
- ``stats.welch_difference`` / ``welch_t``: the same with the two sides' values pooled: a setting at 5000
  blurred the other side's spread of 1e-3 into "no spread" (t and p None where scipy's p is 1e-14). Each
  side's spread is now judged against its own values.
- ``stats._resolved`` (the Wilcoxon ranks): a difference joined the tie below it when within the two neighbours'
  resolutions of the tie's size, which a large pair had set with its own, larger resolution: of two differences
  equal to 2e-16, one joined the large pair's tie and the other did not (p 6/64 instead of 0.125). The tie now
  takes in what is within the largest resolution of its members.
- ``stats.welch_difference`` / ``welch_t``: a mapping seed -> value was read as its keys (the seeds), a str as
  its characters: a silently wrong comparison; ``paired_t`` of two lists paired their values as seeds. Both
  now raise a TypeError, as ``paired_difference`` does.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

scipy_stats = pytest.importorskip("scipy.stats")

from diffusionformer.experiments.stats import (nadeau_bengio, paired_difference, paired_t, welch_difference,  # noqa: E402
                                               welch_t)


def _seeds(values):
    return dict(enumerate(values))


def test_bug_one_large_pair_does_not_erase_the_paired_t_of_the_others():
    """Bug: the spread of the paired differences was compared with 1e-6 of the largest value of *all* pairs, so one
    diverged seed (5000 in both settings) made the other six differences (~1e-3, a thousand times their own
    rounding) "all zero": t 0, p 1 and Wilcoxon p 1, where scipy's paired t gives p 0.0012 and the exact
    signed-rank p is 2/128."""
    a = [0.50, 0.51, 0.52, 0.49, 0.47, 0.53, 5000.0]
    b = [0.499, 0.5085, 0.5182, 0.4875, 0.4691, 0.5291, 4999.99]
    ref = scipy_stats.ttest_rel(a, b)
    r = paired_difference(_seeds(a), _seeds(b))
    assert r.note == "" and r.t == pytest.approx(ref.statistic, rel=1e-9) and r.p == pytest.approx(ref.pvalue, rel=1e-9)
    ci = ref.confidence_interval(0.95)
    assert (r.low, r.high) == (pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9))
    assert r.p_wilcoxon == pytest.approx(scipy_stats.wilcoxon(a, b, method="exact").pvalue, rel=1e-12) == 2 / 2**7
    assert paired_t(_seeds(a), _seeds(b)) == pytest.approx(ref.statistic, rel=1e-9)
    nb = nadeau_bengio(_seeds(a), _seeds(b), 7)
    assert nb.t == pytest.approx(ref.statistic / math.sqrt(1 + 7 / 6), rel=1e-9)
    # the diverged pair's own rounding still counts: equal differences up to each pair's resolution have no spread
    flat = paired_difference(_seeds([1.015, 2.015, 5000.015]), _seeds([1.0, 2.0, 5000.0 + 1e-4]))
    assert flat.t is None and flat.p is None and "no spread" in flat.note


@pytest.mark.filterwarnings("ignore:Precision loss occurred:RuntimeWarning")  # scipy, of the constant side
def test_bug_one_large_side_does_not_erase_the_welch_spread_of_the_other():
    """Bug: Welch's "no spread" compared the standard error with 1e-6 of the largest value of *both* sides, so a
    setting at 5000 turned the other side's spread of 1e-3 (a thousand times its rounding) into none: t and p
    None ("the differences are all equal") where scipy's Welch t is -8.7e6, p 1.3e-14."""
    a, b = [0.001, 0.002, 0.003], [5000.0, 5000.0, 5000.0]
    ref = scipy_stats.ttest_ind(a, b, equal_var=False)
    r = welch_difference(a, b)
    assert r.t == pytest.approx(ref.statistic, rel=1e-9) and r.p == pytest.approx(ref.pvalue, rel=1e-6)
    assert r.df == pytest.approx(ref.df, rel=1e-12) == 2.0
    assert welch_t(a, b) == pytest.approx(ref.statistic, rel=1e-9)
    # both sides within their own rounding: still no spread
    assert welch_t([1.0, 1.0 + 1e-9], [5000.0, 5000.0 + 1e-4]) is None
    assert welch_difference([1.0, 1.0 + 1e-9], [5000.0, 5000.0 + 1e-4]).p is None


def test_bug_a_tie_set_by_a_large_pair_takes_in_differences_equal_to_its_members():
    """Bug: the Wilcoxon ranks joined a difference to the tie below it on the two neighbours' own resolutions, but
    compared it with the tie's size, which a large pair (5000, resolution 5e-3) had set: -0.015 joined that pair's
    0.0149, and +0.015 (equal to -0.015 up to 2e-16) did not, so they ranked 1.5 and 3: p 6/64 where the three
    tie (scipy's exact p of the rounded differences, 0.125)."""
    a = [5000.0149, 1.0, 2.015, 1.2, 1.3, 1.4]
    b = [5000.0, 1.015, 2.0, 1.0, 1.0, 1.0]
    ref = scipy_stats.wilcoxon([0.015, -0.015, 0.015, 0.2, 0.3, 0.4], method=scipy_stats.PermutationMethod()).pvalue
    assert ref == pytest.approx(0.125)
    assert paired_difference(_seeds(a), _seeds(b)).p_wilcoxon == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("a,b", [({0: 0.8, 1: 0.6, 2: 0.7}, [0.7, 0.55, 0.62]),
                                 ([0.8, 0.6, 0.7], {0: 0.7, 1: 0.55, 2: 0.62}), ("0.8", "0.7")])
def test_bug_unpaired_statistics_refuse_mappings(a, b):
    """Bug: ``welch_difference`` and ``welch_t`` of a mapping seed -> value compared its keys, the seeds (a
    ``by_seed`` dict of an aggregate row against another: mean 0, p 1 whatever the values), and of a str its
    characters; no error."""
    with pytest.raises(TypeError, match="unpaired values must be sequences of values"):
        welch_difference(a, b)
    with pytest.raises(TypeError, match="unpaired values must be sequences of values"):
        welch_t(a, b)


def test_bug_paired_t_refuses_lists():
    """Bug: ``paired_t`` of two lists paired their *values* as seeds: ``None`` for lists that share no value,
    a TypeError from list indexing for float values they share, never the message ``paired_difference`` gives."""
    with pytest.raises(TypeError, match="paired values must be mappings seed -> value"):
        paired_t([0.8, 0.6, 0.7], [0.7, 0.55, 0.62])
    with pytest.raises(TypeError, match="paired values must be mappings seed -> value"):
        paired_t([1.0, 2.0, 3.0], {0: 1.0, 1: 2.0, 2: 3.0})


def test_nadeau_bengio_over_folds_times_repeats_by_hand():
    """K = 5 folds repeated 3 times (seed s tests on fold s % 5): n = 15 differences, variance
    (1/15 + 1/4) s_d^2, df 14, interval with t_{0.975, 14}; seeds missing on one side are not paired."""
    rng = np.random.default_rng(4)
    a, b = rng.normal(0.8, 0.02, 15), rng.normal(0.79, 0.02, 15)
    d = a - b
    se = d.std(ddof=1) * math.sqrt(1 / 15 + 1 / 4)
    r = nadeau_bengio({**_seeds(a), 99: 0.1}, {**_seeds(b), 98: 0.9}, 5, level=0.9)
    assert (r.n, r.df, r.method) == (15, 14, "Nadeau-Bengio")
    assert r.se == pytest.approx(se, rel=1e-12) and r.t == pytest.approx(d.mean() / se, rel=1e-12)
    assert r.p == pytest.approx(2 * scipy_stats.t.sf(abs(d.mean() / se), 14), rel=1e-9)
    assert r.high - r.mean == pytest.approx(scipy_stats.t.ppf(0.95, 14) * se, rel=1e-9)
    # the sign is setting minus baseline: a minimised loss that fell has a negative difference
    down = paired_difference(_seeds([1.0, 1.1, 0.9]), _seeds([1.2, 1.25, 1.15]))
    assert down.mean < 0 and down.high < 0 and down.t < 0
