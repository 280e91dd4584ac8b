"""Mutation audit (sitting 48) of the statistics of a comparison: experiments/stats.py (paired t intervals, df and
p-values, Wilcoxon signed-rank, Nadeau-Bengio corrected resampled t, Welch, Holm and Benjamini-Hochberg), then
experiments/compare.py (the page's contrasts, their Holm families and the p formatting) and experiments/gaps.py (the
over-fitting tables and their primary contrasts): tests that kill mutants the earlier tests (and the modules' doctests)
left alive. Each docstring names the mutant. No GPU and no data are used, and scipy is not the reference (the one test
whose interval needs the library's t distribution skips without it): the expected values are exact
floats chosen by hand (a difference of exactly ``RELATIVE_RESOLUTION`` of its values: ``M = 1e6 / 2**20`` and
``M - 2**-20``, where ``1e-6 * M == 2**-20`` exactly) or strings the docstrings promise.

76 mutants (stats.py 35, compare.py 20, gaps.py 21): 65 killed by earlier tests, 10 survivors killed here
(stats.py 3, compare.py 4, gaps.py 3), 1 equivalent (stats.py); no wrong statistic found.

Equivalent: stats.py ``_t_sf2`` ``min(1.0, 2.0 * stdtr(df, -abs(t)))`` -> ``2.0 * stdtr(df, -abs(t))``: Student's t
CDF at a point <= 0 is at most 1/2 (``stdtr(df, -0.0) == 0.5`` for every df, the distribution being symmetric), so
the doubled tail never exceeds 1 and the cap is only defensive.

- stats.py: the two-sided p (factor 2), the (1+level)/2 quantile, df = n - 1, s_d with n - 1 (stdev, not pstdev),
  the Nadeau-Bengio variance (1/n + n2/n1) with n2/n1 = 1/(K - 1) and K >= 2, Wilcoxon's mid-ranks of ties, dropped
  zeros, both tails, the factor 2, the exact/normal switch at 50 and the tie correction /48, Holm's multiplier
  m - rank + 1, its running max (step-down monotonicity) and cap at 1, None counted as p = 1, Benjamini-Hochberg's
  m p / rank, p = 0 valid, Welch-Satterthwaite's n_b - 1, the level and ratio bounds, the sign of t and paired_t's
  sqrt(n) were all killed before. Survivors: the inclusive bound of "no spread" (``_no_spread``'s ``<=``) and of a
  zero difference (``_resolved``'s ``abs(x) <= tol``): a difference of exactly RELATIVE_RESOLUTION of its values is
  "equal up to" that resolution, as the module docstring says; and ``_resolved``'s "a zero starts no tie" (a pair of
  large equal values, e.g. two diverged runs, zeroed the small real differences ranked after it).
- compare.py: survivors were all in ``_format_p`` at an ``alpha`` other than 0.05 (the publish summary's), which no
  test passed at these edges: the four-decimal band's lower edge 0.0495, ``"<0.001"`` at ``alpha = 0.001``, the
  band keeping its side of 0.05 at any alpha, and two significant digits below 0.001.
- gaps.py: survivors were ``_p``'s side of 0.05 (the docstring's "0.0496: not 0.05") and the runs that a published
  folder's results.json lists as unfinished (non-finite, failed), whose published logs the tables must leave out.
"""

from __future__ import annotations

import json

import pytest

M = 1e6 / 2**20  # 0.95367431640625: 1e-6 * M is exactly 2**-20
Y = M - 2**-20  # M - Y == 2**-20 == RELATIVE_RESOLUTION * max(|M|, |Y|), exactly


def test_exact_resolution_values_are_exact():
    """The premise of the two tests below: the difference is exactly RELATIVE_RESOLUTION of the larger value."""
    from diffusionformer.experiments.stats import RELATIVE_RESOLUTION

    assert M - Y == 2**-20 == RELATIVE_RESOLUTION * M and Y < M


# ----------------------------------------------------------------------------------------- experiments/stats.py
def test_kills_a_paired_difference_of_exactly_the_resolution_is_zero():
    """kills: experiments/stats.py ``_resolved`` ``0.0 if abs(x) <= t`` -> ``abs(x) < t`` (pairs differing by exactly
    RELATIVE_RESOLUTION of their own values, "equal up to" it as the module docstring says, read as a real constant
    difference: t and p None, "no spread", and a Wilcoxon p of 0.5, where they are all zero: t 0, p 1)."""
    from diffusionformer.experiments.stats import paired_difference, paired_t

    a, b = {0: M, 1: M}, {0: Y, 1: Y}
    r = paired_difference(a, b)
    assert (r.mean, r.se, r.low, r.high, r.t, r.p, r.p_wilcoxon, r.df) == (0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1)
    assert r.note == "all differences are zero"
    assert paired_t(a, b) == 0.0


def test_kills_welch_means_apart_by_exactly_the_resolution_agree():
    """kills: experiments/stats.py ``_no_spread`` ``spread <= RELATIVE_RESOLUTION * ...`` -> ``spread < ...`` (two
    constant sides whose means differ by exactly the resolution of their values, "equal up to" it, read as a real
    difference with no spread: t and p None, where it is zero: t 0, p 1, as welch_t)."""
    from diffusionformer.experiments.stats import welch_difference, welch_t

    r = welch_difference([M, M], [Y, Y])
    assert (r.mean, r.se, r.t, r.p, r.df) == (0.0, 0.0, 0.0, 1.0, 2.0)
    assert welch_t([M, M], [Y, Y]) == 0.0


def test_kills_a_large_zero_difference_ties_no_real_difference_to_zero():
    """kills: experiments/stats.py ``_resolved`` ``if out[prev] != 0.0 and abs(out[i]) - ...`` -> ``if abs(out[i]) -
    ...`` (a seed on which both settings give the same large value, e.g. both diverged to a loss of 1000, has a zero
    difference whose resolution, 1e-3, swallowed the next differences by size into its "tie": 1e-4, 2e-4 and 3e-4 on
    values near 0.5, each far beyond its own pair's resolution 5e-7, all read as zero, so t = 0 and p = 1 where the
    docstring promises "a diverged seed blurs no other pair")."""
    import statistics

    from diffusionformer.experiments.stats import paired_difference, paired_t

    pytest.importorskip("scipy.special")  # the interval's t quantile (the experiments extra)
    a, b = {0: 1000.0, 1: 0.5001, 2: 0.5002, 3: 0.5003}, {0: 1000.0, 1: 0.5, 2: 0.5, 3: 0.5}
    d = [a[k] - b[k] for k in range(4)]
    t = statistics.fmean(d) / (statistics.stdev(d) / 2.0)  # by hand: mean / (s_d / sqrt(4)), about 2.32
    r = paired_difference(a, b)
    assert r.t == pytest.approx(t, rel=1e-12) and r.df == 3 and r.note == ""
    assert r.p_wilcoxon == 0.25  # three non-zero differences, all positive: 2 / 2**3
    assert paired_t(a, b) == pytest.approx(t, rel=1e-12)


# --------------------------------------------------------------------------------------- experiments/compare.py
def test_kills_format_p_four_decimal_band_starts_at_0_0495_at_any_alpha():
    """kills: experiments/compare.py ``_format_p`` ``0.0495 <= p`` -> ``0.0495 < p`` (at the publish summary's alpha
    0.01, p = 0.0495 read "0.050", three decimals, where format_p's band of four decimals starts at 0.0495; at alpha
    0.05 both read "0.0495", so no earlier test told them apart)."""
    from diffusionformer.experiments.compare import _format_p

    assert _format_p(0.0495, 0.01) == "0.0495"
    assert _format_p(0.04949, 0.01) == "0.049" and _format_p(0.0505, 0.01) == "0.051"


def test_kills_format_p_less_than_shorthand_at_alpha_0_001():
    """kills: experiments/compare.py ``_format_p`` ``alpha >= 0.001`` -> ``alpha > 0.001`` (at alpha = 0.001, which
    ``summary_table`` accepts, "<0.001" still says which side of alpha p is, as the docstring says, but p = 0.0004 read
    "0.0004")."""
    from diffusionformer.experiments.compare import _format_p

    assert _format_p(0.0004, 0.001) == "<0.001"
    assert _format_p(0.0004, 0.0009) == "0.0004"  # below the shorthand's bound: digits


def test_kills_format_p_band_keeps_its_side_of_0_05_at_any_alpha():
    """kills: experiments/compare.py ``_format_p`` ``kept(4, "f", 0.05)`` -> ``kept(4, "f", alpha)`` (at alpha 0.01,
    p = 0.049996, just below the conventional 5% level, read "0.0500": the band next to 0.05 keeps each value on its
    side of 0.05 whatever the bold level, as format_p promises)."""
    from diffusionformer.experiments.compare import _format_p

    assert _format_p(0.049996, 0.01) == "0.049996"
    assert _format_p(0.0500004, 0.01) == "0.0500"


def test_kills_format_p_two_significant_digits_below_0_001():
    """kills: experiments/compare.py ``_format_p`` ``kept(2, "g", alpha)`` -> ``kept(3, "g", alpha)`` (below 0.001 at
    an alpha under it, p = 0.000423 read "0.000423": two significant digits, as the other p columns, unless more are
    needed to keep p's side of alpha)."""
    from diffusionformer.experiments.compare import _format_p

    assert _format_p(0.000423, 0.0001) == "0.00042"
    assert _format_p(0.000996, 0.000999) == "0.000996"  # "0.001" would cross alpha: more digits


# ------------------------------------------------------------------------------------------ experiments/gaps.py
def test_kills_gaps_p_keeps_its_side_of_0_05():
    """kills: experiments/gaps.py ``_p`` ``float(...) < 0.05`` -> ``float(...) <= 0.05`` (p = 0.0496 read "0.05", the
    docstring's own counter-example, and p = 0.05 itself "0.050000000000000003")."""
    from diffusionformer.experiments.gaps import _p

    assert [_p(p) for p in (0.0496, 0.05, 0.0504, 0.012, None)] == ["0.0496", "0.05", "0.05", "0.012", "n/a"]


def test_kills_gap_tables_leave_out_published_logs_of_unfinished_runs(tmp_path):
    """kills: experiments/gaps.py ``_unfinished`` ``r.get("status") != "completed"`` -> ``== "failed"`` and
    ``_run_records`` ``and (task, setting, seed) not in unfinished`` dropped (in a published folder, the logs that
    ``publish`` also writes for runs stopped by a non-finite loss or failed were read as finished runs: their losses in
    the gap tables, curves and primary contrasts)."""
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.gaps import gap_curves, gap_rows
    from diffusionformer.experiments.publish import _run_log_path, write_run_log

    config = load_experiment_config({
        "name": "g", "seeds": [0, 1, 2],
        "tasks": [{"name": "t", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss"}],
        "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}]})
    out = tmp_path / "g"
    status = {("attention", 1): "failed: out of memory", ("lap", 2): "non_finite"}
    runs = []
    for op in ("attention", "lap"):
        for seed in range(3):
            runs.append({"task": "t", "operator": op, "seed": seed, "status": status.get((op, seed), "completed")})
            records = [{"split": "eval", "step": 10 * (k + 1), "metrics": {"train_loss": 2.0 - k - seed / 10,
                                                                          "val_loss": 2.5 - k / 2}} for k in range(2)]
            write_run_log(records, _run_log_path(out, "t", op, seed))
    (out / "results.json").write_text(json.dumps({"runs": runs}))
    rows = gap_rows(config, tmp_path)["t"]
    assert sorted(rows["attention"]) == [0, 2] and sorted(rows["lap"]) == [0, 1]
    assert rows["lap"][1]["final_train"] == pytest.approx(0.9) and rows["lap"][1]["final_gap"] == pytest.approx(1.1)
    curves = gap_curves(config, tmp_path)["t"]
    assert curves["attention"]["n"] == 2 and curves["lap"]["n"] == 2
