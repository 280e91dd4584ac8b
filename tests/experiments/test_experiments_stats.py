"""The comparison statistics against scipy.stats and brute-force references (float64)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

scipy_stats = pytest.importorskip("scipy.stats")

from diffusionformer.experiments.stats import (benjamini_hochberg, holm, nadeau_bengio, paired_difference,  # noqa: E402
                                               paired_t, welch_difference, welch_t, wilcoxon_p)


def _pairs(rng, n, shift=0.3, noise=1.0, common=3.0):
    seed_effect = rng.normal(0.0, common, n)  # what a seed adds to both settings
    b = seed_effect + rng.normal(0.0, noise, n)
    a = seed_effect + shift + rng.normal(0.0, noise, n)
    return a, b


@pytest.mark.parametrize("n,seed", [(2, 0), (3, 1), (5, 2), (10, 3), (30, 4)])
def test_paired_difference_matches_scipy_ttest_rel_and_t_ppf(n, seed):
    a, b = _pairs(np.random.default_rng(seed), n)
    r = paired_difference(dict(enumerate(a)), dict(enumerate(b)))
    ref = scipy_stats.ttest_rel(a, b)
    d = a - b
    se = d.std(ddof=1) / math.sqrt(n)  # sample (ddof=1), not population, std
    half = scipy_stats.t.ppf(0.975, n - 1) * se
    assert r.method == "paired t" and r.n == n and r.df == n - 1
    assert r.mean == pytest.approx(d.mean(), rel=1e-12)
    assert r.t == pytest.approx(ref.statistic, rel=1e-10) and r.p == pytest.approx(ref.pvalue, rel=1e-9)
    assert (r.low, r.high) == (pytest.approx(d.mean() - half, rel=1e-10), pytest.approx(d.mean() + half, rel=1e-10))
    ci = ref.confidence_interval(0.95)
    assert (r.low, r.high) == (pytest.approx(ci.low, rel=1e-10), pytest.approx(ci.high, rel=1e-10))
    r90 = paired_difference(dict(enumerate(a)), dict(enumerate(b)), level=0.9)
    assert r90.high - r90.low < r.high - r.low


def test_paired_difference_uses_sample_not_population_std():
    a, b = [1.0, 2.0, 4.0], [0.5, 1.0, 2.0]  # d = 0.5, 1, 2
    d = np.array(a) - np.array(b)
    r = paired_difference(dict(enumerate(a)), dict(enumerate(b)))
    sample = d.mean() / (d.std(ddof=1) / math.sqrt(3))
    population = d.mean() / (d.std(ddof=0) / math.sqrt(3))
    assert r.t == pytest.approx(sample, rel=1e-12) and abs(r.t - population) > 0.3


def test_pairing_uses_shared_seeds_only_and_cancels_the_seed_effect():
    a, b = _pairs(np.random.default_rng(7), 6, shift=0.5, noise=0.05, common=5.0)
    paired = paired_difference(dict(enumerate(a)), {**dict(enumerate(b)), 99: 123.0})
    assert paired.n == 6 and paired.p < 1e-4
    assert welch_difference(a, b).p > 0.5  # the seed effect swamps an unpaired test


@pytest.mark.parametrize("na,nb,seed", [(3, 3, 0), (3, 5, 1), (6, 4, 2), (20, 7, 3)])
def test_welch_difference_matches_scipy_and_differs_from_pooled_t(na, nb, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(1.0, 0.3, na), rng.normal(0.2, 3.0, nb)  # very unequal spreads
    r = welch_difference(a, b)
    ref = scipy_stats.ttest_ind(a, b, equal_var=False)
    pooled = scipy_stats.ttest_ind(a, b, equal_var=True)
    va, vb = a.var(ddof=1) / na, b.var(ddof=1) / nb
    df = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
    assert r.t == pytest.approx(ref.statistic, rel=1e-10) and r.p == pytest.approx(ref.pvalue, rel=1e-9)
    assert r.df == pytest.approx(df, rel=1e-12) and r.df != pytest.approx(na + nb - 2)
    half = scipy_stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    assert r.low == pytest.approx(a.mean() - b.mean() - half, rel=1e-10)
    assert r.p != pytest.approx(pooled.pvalue, rel=1e-3)  # the pooled test is a different test here
    if na != nb:
        assert r.t != pytest.approx(pooled.statistic, rel=1e-3)


@pytest.mark.parametrize("n,seed", [(2, 0), (3, 1), (5, 2), (8, 3), (12, 4), (20, 5)])
def test_wilcoxon_p_matches_scipy_exact(n, seed):
    d = np.random.default_rng(seed).normal(0.4, 1.0, n)
    assert wilcoxon_p(d) == pytest.approx(scipy_stats.wilcoxon(d, method="exact").pvalue, rel=1e-12)


def test_wilcoxon_p_with_ties_and_zeros_matches_scipy_and_brute_force():
    d = [0.1, 0.2, -0.1, 0.3, 0.2, 0.0, -0.4, 0.2]
    ref = scipy_stats.wilcoxon(d, method=scipy_stats.PermutationMethod())  # exact over all sign flips
    assert wilcoxon_p(d) == pytest.approx(ref.pvalue, rel=1e-12)
    nz = [x for x in d if x != 0]  # brute force: every sign pattern, mid-ranks of |d|
    ranks = scipy_stats.rankdata(np.abs(nz))
    w = sum(r for r, x in zip(ranks, nz) if x > 0)
    sums = [sum(r for r, s in zip(ranks, signs) if s) for signs in itertools.product([0, 1], repeat=len(nz))]
    brute = min(1.0, 2 * min(np.mean([s <= w + 1e-9 for s in sums]), np.mean([s >= w - 1e-9 for s in sums])))
    assert wilcoxon_p(d) == pytest.approx(brute, rel=1e-12)


def test_wilcoxon_p_normal_approximation_beyond_50():
    d = np.random.default_rng(3).normal(0.2, 1.0, 80)
    ref = scipy_stats.wilcoxon(d, method="approx", correction=False)
    assert wilcoxon_p(d) == pytest.approx(ref.pvalue, rel=1e-9)


def test_nadeau_bengio_by_hand():
    a = {k: v for k, v in enumerate([0.71, 0.74, 0.69, 0.80, 0.77])}
    b = {k: v for k, v in enumerate([0.70, 0.70, 0.70, 0.75, 0.74])}
    d = np.array([a[k] - b[k] for k in range(5)])
    K = 5
    var = (1 / K + 1 / (K - 1)) * d.var(ddof=1)  # n2/n1 = (N/K) / (N (K-1)/K)
    t = d.mean() / math.sqrt(var)
    p = 2 * scipy_stats.t.sf(abs(t), K - 1)
    r = nadeau_bengio(a, b, K)
    assert r.method == "Nadeau-Bengio" and r.df == K - 1
    assert r.t == pytest.approx(t, rel=1e-12) and r.p == pytest.approx(p, rel=1e-9)
    half = scipy_stats.t.ppf(0.975, K - 1) * math.sqrt(var)
    assert (r.low, r.high) == (pytest.approx(d.mean() - half), pytest.approx(d.mean() + half))
    plain = paired_difference(a, b)
    assert r.p > plain.p and r.t == pytest.approx(plain.t / math.sqrt(1 + K / (K - 1)), rel=1e-12)
    assert nadeau_bengio(a, b, K, test_train_ratio=0.5).t == pytest.approx(d.mean() / math.sqrt((0.2 + 0.5) * d.var(ddof=1)))
    with pytest.raises(ValueError, match="folds must be an int >= 2"):
        nadeau_bengio(a, b, 1)


def test_edge_cases_are_defined_not_nan():
    one = paired_difference({0: 1.0}, {0: 0.5})
    assert (one.n, one.mean, one.t, one.p, one.low) == (1, 0.5, None, None, None) and "at least 2" in one.note
    none = paired_difference({0: 1.0}, {1: 0.5})
    assert (none.n, none.mean, none.p) == (0, None, None)
    same = paired_difference({0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.0, 1: 2.0, 2: 3.0})
    assert (same.mean, same.t, same.p, same.low, same.high, same.p_wilcoxon) == (0.0, 0.0, 1.0, 0.0, 0.0, 1.0)
    shift = paired_difference({0: 1.5, 1: 2.5, 2: 3.5}, {0: 1.0, 1: 2.0, 2: 3.0})  # every seed +0.5 exactly
    assert (shift.mean, shift.t, shift.p, shift.low, shift.high) == (0.5, None, None, 0.5, 0.5)
    assert shift.p_wilcoxon == 0.25 and "no spread" in shift.note
    # float32 metrics: 3 more nodes of 200 right on every seed, differences equal but for rounding
    base = np.array([0.9649999737739563, 0.9750000238418579, 0.9700000286102295])  # study-graph, csbm-h0.9
    better = np.array([0.9800000190734863, 0.9900000095367432, 0.9850000143051147])
    exact = paired_difference(dict(enumerate(better.tolist())), dict(enumerate(base.tolist())))
    assert np.std(better.astype(np.float64) - base.astype(np.float64)) > 0  # the rounding is there
    assert exact.t is None and exact.p is None and exact.mean == pytest.approx(0.015, abs=1e-6)
    assert exact.p_wilcoxon == 0.25
    w = welch_difference([1.0], [0.0, 1.0])
    assert (w.mean, w.t, w.p) == (0.5, None, None)
    flat = welch_difference([1.0, 1.0], [1.0, 1.0])
    assert (flat.t, flat.p) == (0.0, 1.0)
    assert wilcoxon_p([0.3]) is None and wilcoxon_p([0.0, 0.0]) == 1.0
    for r in (one, none, same, shift, w, flat):
        assert not any(isinstance(x, float) and math.isnan(x) for x in vars(r).values())
    with pytest.raises(ValueError, match="non-finite"):
        paired_difference({0: float("nan"), 1: 1.0}, {0: 0.0, 1: 0.0})
    with pytest.raises(ValueError, match="level"):
        paired_difference({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.0}, level=95)
    with pytest.raises(TypeError, match="mappings"):
        paired_difference([1.0, 2.0], [0.0, 1.0])


def test_bare_t_statistics_share_the_no_spread_resolution_of_the_differences():
    """Bug: ``paired_t`` and ``welch_t`` compared the spread with exactly 0.0, so float32
    metrics whose differences are equal but for rounding got a t in the millions (a rounding
    artefact), while ``paired_difference``/``welch_difference`` report no spread for the same
    values. The t itself is checked against scipy where there is a spread."""
    base = [0.9649999737739563, 0.9750000238418579, 0.9700000286102295]  # float32 accuracies
    better = [0.9800000190734863, 0.9900000095367432, 0.9850000143051147]  # +3 nodes of 200 each
    a, b = dict(enumerate(better)), dict(enumerate(base))
    assert _sample_std([x - y for x, y in zip(better, base)]) > 0  # the rounding is there
    assert paired_difference(a, b).t is None and paired_t(a, b) is None
    flat_a, flat_b = [0.5 + 1e-9, 0.5, 0.5 - 1e-9], [0.25 + 1e-9, 0.25, 0.25]
    assert welch_difference(flat_a, flat_b).t is None and welch_t(flat_a, flat_b) is None
    rng = np.random.default_rng(0)
    x, y = rng.normal(1.0, 0.1, 6), rng.normal(0.9, 0.1, 6)
    assert paired_t(dict(enumerate(x)), dict(enumerate(y))) == pytest.approx(scipy_stats.ttest_rel(x, y).statistic)
    assert welch_t(list(x), list(y)) == pytest.approx(scipy_stats.ttest_ind(x, y, equal_var=False).statistic)


def _sample_std(values):
    return float(np.std(np.asarray(values, dtype=np.float64), ddof=1))


def _holm_rejects(p, alpha):
    """Holm's procedure at level alpha, as a sequence of decisions."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    rejected = set()
    for k, i in enumerate(order):
        if p[i] > alpha / (len(p) - k):
            break
        rejected.add(i)
    return rejected


def _bh_rejects(p, q):
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    k = max([j + 1 for j, i in enumerate(order) if p[i] <= (j + 1) * q / m], default=0)
    return set(order[:k])


@pytest.mark.parametrize("seed", range(5))
def test_holm_and_bh_adjusted_p_are_the_smallest_level_that_rejects(seed):
    rng = np.random.default_rng(seed)
    p = list(np.concatenate([rng.uniform(0, 0.02, 4), rng.uniform(0, 1, 8)]))
    for adjust, rejects in ((holm, _holm_rejects), (benjamini_hochberg, _bh_rejects)):
        adj = adjust(p)
        assert all(a >= x * (1 - 1e-12) for a, x in zip(adj, p)) and max(adj) <= 1.0
        for alpha in sorted(set(adj)) + [0.05, 0.1]:
            if alpha <= 0 or alpha >= 1:
                continue
            brute = rejects(p, alpha * (1 + 1e-12))
            assert {i for i, a in enumerate(adj) if a <= alpha * (1 + 1e-12)} == brute
            below = rejects(p, alpha * (1 - 1e-9))
            assert {i for i, a in enumerate(adj) if a <= alpha * (1 - 1e-9)} == below


def test_holm_values_by_hand_and_none_counts_in_the_family():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.01, None]) == [pytest.approx(0.02), None]  # m = 2
    assert benjamini_hochberg([0.01, 0.02, 0.03, 0.04]) == pytest.approx([0.04] * 4)
    assert holm([]) == []
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm([1.5])
