"""Edge-case probes of the comparison statistics (third round): ``experiments.stats``, ``compare``, ``tables``.

Probed against scipy (``ttest_rel``, ``ttest_ind``, ``wilcoxon``, ``t.ppf``, ``false_discovery_control``) and
float64 formulas: the paired t and its interval at several levels with 2 to 20 seeds, the Welch t, the exact
and normal Wilcoxon p with ties and zeros, Nadeau-Bengio, Holm and Benjamini-Hochberg with tied p-values and
``None``; seeds missing on one side; one diverged (huge but finite) seed; float32 rounding at a rank boundary;
NumPy ints and float32s; p-values at the 5% boundary as the tables print them; the selected-metric and
steps-to-threshold tables with a seed missing on one side; an unknown ``values`` key.

Found and fixed (tests named ``test_bug_...``):

- ``stats.paired_difference``: the Wilcoxon p rounded every difference to a grid of 1e-6 of the *largest* value,
  so one diverged seed (a finite loss of 5000) turned every other pair's difference into a zero: p 0.5 where
  scipy's exact signed-rank p is 0.016; and two differences equal up to 4e-9 on either side of a grid line
  did not tie. Each difference is now resolved against its own pair's values, and sizes within that
  resolution tie.
- ``stats.paired_t``: NumPy int values raised ``AttributeError: 'numpy.int64' object has no attribute
  'bit_length'`` from inside ``statistics``; ``welch_t`` of float32 arrays computed in float32 and disagreed
  with ``welch_difference`` on the same values in the 8th digit.
- ``compare.format_p``: a p in [0.04995, 0.05) printed as "0.0500", in bold as a Holm p: the very reading
  (a value below 5% that reads as 5%) its four decimals near 0.05 were meant to prevent.
- ``tables.format_table``: the selected-metric and steps tables compared over the seeds both settings have
  without saying so (no seeds column): a row of 4 seeds against a baseline of 3 showed means whose difference
  is not the Δ beside them. They now say "(3 paired with base)", as the final table does.
- ``stats.compare_rows`` / ``difference_t``: ``values="selected"`` raised ``KeyError: 'selected'``; the unpaired
  ``difference_t`` of a row without selected values raised ``KeyError`` where the paired one gives ``None``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

scipy_stats = pytest.importorskip("scipy.stats")

from diffusionformer.experiments import load_experiment_config  # noqa: E402
from diffusionformer.experiments.compare import format_p  # noqa: E402
from diffusionformer.experiments.results import RunResult  # noqa: E402
from diffusionformer.experiments.stats import (benjamini_hochberg, compare_rows, difference_t, holm,  # noqa: E402
                                               nadeau_bengio, paired_difference, paired_t, welch_difference,
                                               welch_t, wilcoxon_p)
from diffusionformer.experiments.tables import aggregate, format_table  # noqa: E402


def _seeds(values):
    return dict(enumerate(values))


# ----------------------------------------------------------------------------- against scipy
@pytest.mark.parametrize("n", [2, 3, 4, 20])
@pytest.mark.parametrize("level", [0.5, 0.9, 0.99])
def test_paired_t_and_its_interval_at_any_level_match_scipy(n, level):
    rng = np.random.default_rng(n)
    a = rng.normal(size=n)
    b = a + rng.normal(0.2, 0.5, size=n)
    r = paired_difference(_seeds(a), _seeds(b), level=level)
    ref = scipy_stats.ttest_rel(a, b)
    ci = ref.confidence_interval(level)
    assert (r.t, r.p, r.low, r.high, r.df) == (pytest.approx(ref.statistic, rel=1e-10), pytest.approx(ref.pvalue, rel=1e-9),
                                               pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9), n - 1)
    nb = nadeau_bengio(_seeds(a), _seeds(b), 5, level=level)
    se = np.std(a - b, ddof=1) * math.sqrt(1 / n + 1 / 4)
    t = np.mean(a - b) / se
    assert nb.t == pytest.approx(t, rel=1e-10) and nb.p == pytest.approx(2 * scipy_stats.t.sf(abs(t), n - 1), rel=1e-9)
    assert nb.high - nb.mean == pytest.approx(scipy_stats.t.ppf(0.5 + level / 2, n - 1) * se, rel=1e-9)


def test_wilcoxon_normal_approximation_with_ties_and_zeros_by_hand():
    d = np.round(np.random.default_rng(3).normal(size=80), 1)  # ties and zeros
    nz = d[d != 0]
    m = len(nz)
    assert m > 50
    ranks = scipy_stats.rankdata(abs(nz))
    _, ties = np.unique(ranks, return_counts=True)
    var = m * (m + 1) * (2 * m + 1) / 24 - (ties**3 - ties).sum() / 48
    z = (ranks[nz > 0].sum() - m * (m + 1) / 4) / math.sqrt(var)
    assert wilcoxon_p(d) == pytest.approx(2 * scipy_stats.norm.sf(abs(z)), rel=1e-12)
    assert wilcoxon_p(d) == pytest.approx(scipy_stats.wilcoxon(d, method="approx").pvalue, rel=1e-12)


def test_holm_and_bh_with_ties_and_none_by_brute_force():
    p = [0.02, 0.02, 0.001, None, 0.04, 0.02]
    vals = [1.0 if x is None else x for x in p]
    m = len(vals)
    order = sorted(range(m), key=lambda i: vals[i])
    want, running = [0.0] * m, 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * vals[i]))
        want[i] = running
    got = holm(p)
    assert got[3] is None and [g for g in got if g is not None] == pytest.approx([w for w, x in zip(want, p) if x is not None])
    assert got[0] == got[1] == got[5]  # tied p-values: one adjusted value
    bh = benjamini_hochberg(p)
    ref = scipy_stats.false_discovery_control(vals)
    assert bh[3] is None and [x for x in bh if x is not None] == pytest.approx([r for r, x in zip(ref, p) if x is not None])


def test_pairs_use_only_the_shared_seeds_whatever_their_order():
    a = {3: 0.71, 0: 0.80, 1: 0.62, 7: 0.9}
    b = {1: 0.55, 0: 0.70, 3: 0.69, 5: 0.1}
    x, y = [0.80, 0.62, 0.71], [0.70, 0.55, 0.69]
    r = paired_difference(a, b)
    assert r.n == 3 and r.p == pytest.approx(scipy_stats.ttest_rel(x, y).pvalue, rel=1e-10)
    assert r.p_wilcoxon == pytest.approx(scipy_stats.wilcoxon(x, y).pvalue)


# ----------------------------------------------------------------------------- bugs
def test_bug_one_diverged_seed_does_not_erase_the_other_differences_from_the_wilcoxon_ranks():
    """Bug: the Wilcoxon p rounded every difference to a grid of 1e-6 of the largest value, so one diverged seed
    (a finite loss of 5000) made every other difference (~1e-3) a zero: p 0.5 where every seed favours one side
    (scipy's exact p 0.016); and differences equal up to 4e-9 on either side of a grid line did not tie."""
    a = {0: 0.50, 1: 0.51, 2: 0.52, 3: 0.49, 4: 0.47, 5: 0.53, 6: 5000.0}
    b = {0: 0.499, 1: 0.5085, 2: 0.5182, 3: 0.4875, 4: 0.4691, 5: 0.5291, 6: 4.0}
    ref = scipy_stats.wilcoxon(list(a.values()), list(b.values()), method="exact").pvalue
    assert ref == pytest.approx(2 / 2**7)
    assert paired_difference(a, b).p_wilcoxon == pytest.approx(ref, rel=1e-12)
    # float32 rounding of values near 1: -0.1 and +0.1 (4e-9 apart) are one tie, as scipy has the rounded values
    base = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    q = 1e-6 * (base[4] + 0.4)  # the old grid: 1e-6 of the largest value
    k = round(0.1 / q)
    d = [-(k + 0.5 - 1e-3) * q, (k + 0.5 + 1e-3) * q, 0.2, 0.3, 0.4, 0.25]
    r = paired_difference(_seeds([x + y for x, y in zip(base, d)]), _seeds(base))
    ref = scipy_stats.wilcoxon([-0.1, 0.1, 0.2, 0.3, 0.4, 0.25], method=scipy_stats.PermutationMethod()).pvalue
    assert ref == pytest.approx(6 / 64) and r.p_wilcoxon == pytest.approx(ref, rel=1e-12)


def test_bug_the_bare_t_statistics_take_numpy_numbers():
    """Bug: ``paired_t`` of NumPy ints raised "AttributeError: 'numpy.int64' object has no attribute 'bit_length'"
    from inside ``statistics``; ``welch_t`` of float32 arrays computed in float32 (off in the 8th digit from
    ``welch_difference`` of the same values)."""
    a, b = np.array([1, 2, 3, 7]), np.array([0, 0, 5, 1])
    ref = scipy_stats.ttest_rel(a, b).statistic
    assert paired_t(_seeds(a), _seeds(b)) == pytest.approx(ref, rel=1e-12) == paired_t(_seeds(a.tolist()), _seeds(b.tolist()))
    x, y = np.array([0.8, 0.6, 0.7], dtype=np.float32), np.array([0.7, 0.55, 0.62], dtype=np.float32)
    assert welch_t(x, y) == welch_difference(x, y).t
    assert welch_t(x, y) == pytest.approx(scipy_stats.ttest_ind(x.astype(np.float64), y.astype(np.float64),
                                                                 equal_var=False).statistic, rel=1e-13)


def test_bug_a_p_below_005_never_prints_as_00500():
    """Bug: ``format_p`` printed a p in [0.04995, 0.05) as "0.0500" (in bold as a Holm p): a value below the 5%
    level reading as 5%, which its four decimals next to 0.05 were meant to prevent."""
    assert format_p(0.049996) == "0.049996" and format_p(0.0499) == "0.0499" and format_p(0.05) == "0.0500"
    for p in np.linspace(0.0494, 0.0506, 2401):
        shown = format_p(float(p))
        assert (float(shown) < 0.05) == (p < 0.05), (p, shown)
        assert abs(float(shown) - p) <= 5e-4


def _config(ops, seeds):
    return load_experiment_config({
        "name": "probe", "seeds": list(seeds), "operators": [{"name": o} for o in ops],
        "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 2},
                   "select_by": "val_acc", "reach": {"val_acc": 0.5}}]})


def _runs(op, final, selected, reach):
    out = []
    for s, v in final.items():
        r = RunResult("d", op, s, "completed", "test_acc", v, {"test_acc": v}, 10, 1.0)
        r.selected_value, r.selected_step, r.reach_step = selected.get(s), 5, reach.get(s)
        out.append(r)
    return out


def _row(text, heading, op):
    block = text.split(heading, 1)[1]
    (line,) = [line for line in block.splitlines() if line.startswith(f"| {op} |")][:1]
    return [c.strip() for c in line.strip("|").split("|")]


def test_bug_the_selected_and_steps_tables_say_how_many_seeds_a_contrast_pairs():
    """Bug: the tables of the metric at the best evaluation and of the steps to a threshold compared over the
    seeds both settings have without saying so (they have no seeds column): with the baseline's seed 3 missing,
    x showed 0.6925 against 0.6000 beside a Δ of +0.0867 over 3 seeds, unexplained."""
    base_sel, x_sel = {0: 0.70, 1: 0.50, 2: 0.60}, {0: 0.80, 1: 0.56, 2: 0.70, 3: 0.71}
    base_reach, x_reach = {0: 100, 1: 200, 2: 300}, {0: 50, 1: 160, 2: 250, 3: 90}
    runs = (_runs("base", {0: 0.7, 1: 0.55, 2: 0.66}, base_sel, base_reach)
            + _runs("x", {0: 0.81, 1: 0.62, 2: 0.73, 3: 0.7}, x_sel, x_reach))
    text = format_table(aggregate(runs), _config(["base", "x"], range(4)))
    sel = _row(text, "at best val_acc", "x")
    ref = scipy_stats.ttest_rel([x_sel[s] for s in range(3)], [base_sel[s] for s in range(3)])
    assert sel[1] == f"{np.mean(list(x_sel.values())):.4f} ± {np.std(list(x_sel.values()), ddof=1):.4f} (3 paired with base)"
    assert sel[2] == f"{np.mean([x_sel[s] - base_sel[s] for s in range(3)]):+.4f}" and sel[4:6] == ["2", f"{ref.pvalue:.3f}"]
    steps = _row(text, "steps to", "x")
    hit = list(x_reach.values())
    assert steps[1] == f"{np.mean(hit):.0f} ± {np.std(hit, ddof=1):.0f} (4 of 4) (3 paired with base)"
    assert steps[2] == f"{np.mean([x_reach[s] - base_reach[s] for s in range(3)]):+.0f}" == "-47"
    assert _row(text, "at best val_acc", "base")[1] == "0.6000 ± 0.1000"
    # every seed paired: no note
    full = format_table(aggregate(runs[:3] + _runs("x", {0: 0.81, 1: 0.62, 2: 0.73}, x_sel, x_reach)),
                        _config(["base", "x"], range(3)))
    assert "paired with" not in full


def test_bug_compare_rows_names_an_unknown_values_key():
    """Bug: ``compare_rows(row, base, "selected")`` raised ``KeyError: 'selected'``; the unpaired ``difference_t``
    of a row without selected values raised ``KeyError: 'selected_values'`` where the paired one gives None."""
    row = {"values": [0.80, 0.84, 0.86], "by_seed": {0: 0.80, 1: 0.84, 2: 0.86}}
    with pytest.raises(ValueError, match=r"values must be 'values' .* got 'selected' \(did you mean 'selected_values'\?\)"):
        compare_rows(row, row, "selected")
    with pytest.raises(ValueError, match=r"got 'value' \(did you mean 'values'\?\)"):
        difference_t(row, row, "value", True)
    assert difference_t(row, row, "selected_values", False) is None is difference_t(row, row, "selected_values", True)


def test_wilcoxon_exact_p_of_small_samples_with_zeros_by_brute_force():
    d = [0.0, 0.3, -0.3, 0.1, 0.0, 0.2, 0.2]
    nz = [x for x in d if x != 0]
    ranks = scipy_stats.rankdata([abs(x) for x in nz])
    w = sum(r for r, x in zip(ranks, nz) if x > 0)
    all_w = [sum(r for r, s in zip(ranks, signs) if s) for signs in itertools.product([0, 1], repeat=len(nz))]
    p = min(1.0, 2 * min(sum(x <= w for x in all_w), sum(x >= w for x in all_w)) / len(all_w))
    assert wilcoxon_p(d) == pytest.approx(p, abs=1e-15)
