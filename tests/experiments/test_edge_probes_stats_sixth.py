"""Edge probes of experiments.stats (sixth pass): inputs that were read the wrong way, and references for
what earlier passes did not pin (Welch intervals of unequal sizes at levels other than 0.95, a large sample)."""

from __future__ import annotations

import numpy as np
import pytest

from diffusionformer.experiments.stats import benjamini_hochberg, holm, paired_difference, welch_difference, wilcoxon_p

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("adjust", [holm, benjamini_hochberg])
def test_bug_an_iterator_of_p_values_is_adjusted_not_emptied(adjust):
    """Bug: ``holm`` and ``benjamini_hochberg`` read ``p`` twice (once for the values, once to put the ``None`` back),
    so a generator, e.g. ``holm(c.diff.p for c in family)``, was used up by the first pass and the result was ``[]``."""
    p = [0.01, None, 0.04, 0.03]
    assert adjust(iter(p)) == adjust(p)
    assert adjust(x for x in p) == adjust(p)
    assert len(adjust(x for x in p)) == 4


@pytest.mark.parametrize("adjust", [holm, benjamini_hochberg])
@pytest.mark.parametrize("bad", [{0.01: 0.5, 0.02: 0.9}, "0.1", [True, False], ["0.01", 0.5]])
def test_bug_p_values_that_are_not_numbers_are_refused(adjust, bad):
    """Bug: ``holm`` of a mapping name -> p adjusted its keys (``holm({0.01: 0.5, 0.02: 0.9})`` gave
    ``[0.02, 0.02]``), a str its characters, bools were taken as p-values 1 and 0 and strs such as "0.01" were
    parsed: all without an error."""
    with pytest.raises(TypeError, match="p"):
        adjust(bad)


@pytest.mark.parametrize("bad", [{0: 0.1, 1: 0.2, 2: -0.3}, {3: 0.1, 4: 0.2, 5: -0.3}, "12"])
def test_bug_wilcoxon_p_refuses_a_mapping_and_a_str(bad):
    """Bug: ``wilcoxon_p`` of a mapping seed -> difference ranked its keys, the seeds (``{3: .1, 4: .2, 5: -.3}`` gave
    p = 0.25, that of three positive differences, not 0.75 of its values), and a str ranked its characters."""
    with pytest.raises(TypeError, match="d must be a sequence"):
        wilcoxon_p(bad)
    assert wilcoxon_p([0.1, 0.2, -0.3]) == pytest.approx(scipy_stats.wilcoxon([0.1, 0.2, -0.3], method="exact").pvalue)


@pytest.mark.parametrize("level", [0.5, 0.9, 0.999])
def test_welch_of_unequal_sizes_at_any_level_matches_scipy(level):
    rng = np.random.default_rng(3)
    a, b = rng.normal(0.0, 1.0, 4), rng.normal(0.5, 3.0, 9)
    r = welch_difference(list(a), list(b), level=level)
    s = scipy_stats.ttest_ind(a, b, equal_var=False)
    ci = s.confidence_interval(level)
    assert (r.t, r.p, r.df, r.low, r.high) == pytest.approx((s.statistic, s.pvalue, s.df, ci.low, ci.high), rel=1e-12)


def test_a_large_paired_sample_of_integers_matches_scipy():
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 1000, 20000), rng.integers(0, 1000, 20000) + 3
    r = paired_difference(dict(enumerate(a)), dict(enumerate(b)), level=0.9)
    s = scipy_stats.ttest_rel(a, b)
    ci = s.confidence_interval(0.9)
    assert (r.t, r.p, r.low, r.high) == pytest.approx((s.statistic, s.pvalue, ci.low, ci.high), rel=1e-10)
    assert r.p_wilcoxon == pytest.approx(scipy_stats.wilcoxon(a - b, method="approx").pvalue, rel=1e-10)
