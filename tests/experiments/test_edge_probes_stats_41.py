"""Edge-case probes of the comparison statistics (round 41): ``experiments.stats`` at the top of the float range.

Probed against scipy (``ttest_rel``, ``ttest_ind(equal_var=False)``) on the same values scaled down (t, df and p are
scale-free).

Found and fixed (tests named ``test_bug_...``):

- ``stats.paired_difference`` / ``paired_t`` / ``welch_difference`` / ``welch_t``: the means were
  ``statistics.fmean``, whose ``math.fsum`` raises ``OverflowError: intermediate overflow in fsum`` when the sum of
  finite values passes the float maximum (three values of ~1e308), although their mean is representable. The fifth
  round made the spreads and the Welch df scale-free up to 1e200; the means still overflowed near 1.8e308. They are
  now averaged relative to the largest value when the sum overflows.
- ``stats.welch_difference`` / ``welch_t``: a difference of means past the float range (means of opposite signs near
  the float maximum) gave ``mean=inf, t=inf, p=0.0`` (a false "certain" difference; scipy's t is about 11.6), where
  ``paired_difference`` refuses the same with a ValueError; it is now refused alike.

Probed without finding a fault (already pinned by earlier rounds, so not repeated): zero-spread differences (t, p None,
CI collapsed to the mean, no warning), all-zero differences (t 0, p 1), n = 1 / 2, Wilcoxon zeros dropped (scipy's
``zero_method="wilcox"``, documented) and exact with ties, Holm with p 0 / 1 / None and an empty family (NaN refused).
"""

from __future__ import annotations

import warnings

import pytest

scipy_stats = pytest.importorskip("scipy.stats")

from diffusionformer.experiments.stats import paired_difference, paired_t, welch_difference, welch_t  # noqa: E402

_A = [1.0, 1.5, 1.2]
_B = [0.0, 0.0, 0.5]
_SCALE = 1e308  # the sums of _A * _SCALE (3.7e308) pass the float maximum (1.8e308); every value and mean does not


def test_bug_paired_and_welch_of_values_near_the_float_maximum_do_not_overflow():
    """Bug: ``statistics.fmean`` of [1e308, 1.5e308, 1.2e308] raised ``OverflowError: intermediate overflow in fsum``
    in ``paired_difference``, ``paired_t``, ``welch_difference`` and ``welch_t`` (finite values, representable mean);
    t, df and p are scale-free, so they must equal scipy's on the values scaled down."""
    a = {i: x * _SCALE for i, x in enumerate(_A)}
    b = {i: x * _SCALE for i, x in enumerate(_B)}
    rel = scipy_stats.ttest_rel(_A, _B)
    ind = scipy_stats.ttest_ind(_A, _B, equal_var=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = paired_difference(a, b)
        w = welch_difference(list(a.values()), list(b.values()))
        t_paired = paired_t(a, b)
        t_welch = welch_t(list(a.values()), list(b.values()))
    assert r.mean / _SCALE == pytest.approx(sum(x - y for x, y in zip(_A, _B)) / 3, rel=1e-12)
    assert (r.t, r.p, r.df) == (pytest.approx(rel.statistic, rel=1e-9), pytest.approx(rel.pvalue, rel=1e-9), 2)
    assert t_paired == pytest.approx(rel.statistic, rel=1e-9)
    assert w.mean / _SCALE == pytest.approx(sum(_A) / 3 - sum(_B) / 3, rel=1e-12)
    assert (w.t, w.p, w.df) == (pytest.approx(ind.statistic, rel=1e-9), pytest.approx(ind.pvalue, rel=1e-9),
                                pytest.approx(ind.df, rel=1e-9))
    assert t_welch == pytest.approx(ind.statistic, rel=1e-9)
    # the interval's bounds: the lower one finite and right; the upper one past the float range is inf, not NaN
    half = scipy_stats.t.ppf(0.975, 2) * r.se
    assert r.low == pytest.approx(r.mean - half, rel=1e-9)
    assert w.low / _SCALE == pytest.approx((w.mean - scipy_stats.t.ppf(0.975, ind.df) * w.se) / _SCALE, rel=1e-9)


def test_bug_welch_of_a_difference_past_the_float_range_is_refused_not_p_zero():
    """Bug: ``welch_difference`` of means of opposite signs near the float maximum (1.23e308 and -1.2e308) returned
    ``mean=inf, t=inf, p=0.0`` (the true t, scipy's on the values scaled down, is about 11.6) and ``welch_t`` inf,
    while ``paired_difference`` refuses such a difference with a ValueError. Both now refuse it the same way."""
    a = [x * _SCALE for x in _A]
    b = [-x * _SCALE for x in _A]
    assert scipy_stats.ttest_ind(_A, [-x for x in _A], equal_var=False).statistic < 20  # a finite, moderate t
    with pytest.raises(ValueError, match="float range"):
        welch_difference(a, b)
    with pytest.raises(ValueError, match="float range"):
        welch_t(a, b)
    with pytest.raises(ValueError, match="non-finite"):
        paired_difference(dict(enumerate(a)), dict(enumerate(b)))
