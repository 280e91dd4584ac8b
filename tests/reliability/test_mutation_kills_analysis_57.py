"""Tests written in a mutation audit (round 57) of the paired statistics (``experiments/stats.py``), the contrasts
of a results page (``experiments/compare.py``) and the geometry analysis of finished runs
(``experiments/analyze.py``).

Each test kills a mutant that the rest of the suite let through; its docstring names the mutation. The references
are independent of the code under test: ``scipy.stats`` (``ttest_rel``, ``wilcoxon``), values worked out by hand.
CPU only, deterministic, no network; files only under pytest's tmp_path.
"""

from __future__ import annotations

import pytest

scipy_stats = pytest.importorskip("scipy.stats")

from diffusionformer.experiments.stats import compare_rows, paired_difference, welch_t  # noqa: E402


# ----------------------------------------------------------------------------- stats.py
def test_compare_rows_gives_a_95_percent_interval_by_default_as_scipy():
    """Kills: stats.compare_rows ``level: float = 0.95`` -> ``0.9`` (every table's CI silently narrower than the
    "95% CI" its legend names)."""
    a = {0: 0.81, 1: 0.62, 2: 0.70, 3: 0.77}
    b = {0: 0.70, 1: 0.58, 2: 0.61, 3: 0.74}
    r = compare_rows({"by_seed": a}, {"by_seed": b})
    ref = scipy_stats.ttest_rel(list(a.values()), list(b.values()))
    ci = ref.confidence_interval(0.95)
    assert r.level == 0.95
    assert r.low == pytest.approx(ci.low, rel=1e-9) and r.high == pytest.approx(ci.high, rel=1e-9)
    assert r.p == pytest.approx(ref.pvalue, rel=1e-9)


@pytest.mark.parametrize("signs", [(1, -1, 1, -1, 1), (1, 1, -1, 1, -1), (-1, -1, 1, 1, 1)])
def test_a_large_pairs_resolution_does_not_tie_two_later_sizes_with_each_other(signs):
    """Kills: stats._resolved's ``else: group_tol = 0.0`` dropped. A pair of values near 1e6 (float32 resolution
    about 1) differing by 2 is a tie group of its own; the sizes 5 and 5.5 of pairs of small values above it are
    plainly different and must get distinct ranks (the large pair's resolution must not carry over to them): the
    Wilcoxon p is scipy's exact one of the plain differences."""
    sizes = [2.0, 5.0, 5.5, 7.0, 8.0]
    base = [1e6, 0.0, 0.0, 0.0, 0.0]
    d = [s * z for s, z in zip(sizes, signs)]
    a = {k: base[k] + d[k] for k in range(5)}
    b = dict(enumerate(base))
    r = paired_difference(a, b)
    assert r.p_wilcoxon == pytest.approx(scipy_stats.wilcoxon(d, method="exact").pvalue, rel=1e-12)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_welch_t_names_a_non_finite_value_as_such(bad):
    """Kills: stats.welch_t's ``_check_finite([*a, *b], "a and b")`` dropped: a NaN or infinite value then reads as
    "the difference of the means is past the float range", a wrong diagnosis of the input."""
    with pytest.raises(ValueError, match="non-finite"):
        welch_t([bad, 1.0, 2.0], [0.0, 1.0, 2.0])


def test_finite_values_whose_difference_overflows_are_named_as_such():
    """Kills: stats._pairs ``if past:`` branch dropped: values near the float maximum of opposite signs are finite,
    and the error must say that their difference is past the float range, not call the values non-finite."""
    with pytest.raises(ValueError, match="past the float range"):
        paired_difference({0: 1e308, 1: 1.0}, {0: -1e308, 1: 0.0})


def test_two_seeds_without_scipy_are_refused_up_front(monkeypatch):
    """Kills: stats._require_scipy ``seeds > 1`` -> ``seeds > 2``: two seeds already give a t interval and p, which
    need scipy, so a comparison of two seeds must be refused before anything trains; one seed needs no scipy."""
    import sys

    from diffusionformer.experiments.stats import _require_scipy

    monkeypatch.setitem(sys.modules, "scipy.special", None)  # import scipy.special: ImportError
    _require_scipy(1, "nothing was trained")
    with pytest.raises(ModuleNotFoundError, match="nothing was trained"):
        _require_scipy(2, "nothing was trained")


# ----------------------------------------------------------------------------- analyze.py
def test_the_summary_over_seeds_lists_layers_by_depth_when_the_first_seed_lacks_one():
    """Kills: analyze._summary ``for layer in sorted(by_layer)`` -> ``for layer in by_layer`` (first-seen order).
    The plots read the summary by position as depth: a first seed without layer 1 must not move layer 1 after
    layer 2. Mean, sample std and count per layer written out by hand."""
    from diffusionformer.experiments.analyze import _summary

    seeds = [[{"layer": 0, "x": 1.0}, {"layer": 2, "x": 5.0}],
             [{"layer": 0, "x": 3.0}, {"layer": 1, "x": 2.0}, {"layer": 2, "x": 7.0}]]
    rows = _summary(seeds)
    assert [r["layer"] for r in rows] == [0, 1, 2]
    assert rows[0]["x"] == {"mean": 2.0, "std": pytest.approx(2.0 ** 0.5), "n": 2}
    assert rows[1]["x"] == {"mean": 2.0, "std": 0.0, "n": 1}
    assert rows[2]["x"] == {"mean": 6.0, "std": pytest.approx(2.0 ** 0.5), "n": 2}


@pytest.mark.parametrize("status", ["non_finite", "running", None])
def test_a_run_whose_summary_is_not_completed_is_not_analysed_even_with_a_checkpoint(tmp_path, status):
    """Kills: analyze._run_state ``record.get("status") == "completed"`` dropped. A diverged run (the trainer writes
    ``"status": "non_finite"``) keeps its last checkpoint: it is unfinished, to be skipped with a warning, not
    measured as if it had completed."""
    import json

    from diffusionformer.experiments.analyze import _run_state
    from diffusionformer.train.checkpoint import CHECKPOINT_NAME

    (tmp_path / "summary.json").write_text(json.dumps({} if status is None else {"status": status}))
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"")
    assert _run_state(tmp_path) == "unfinished"
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed"}))
    assert _run_state(tmp_path) == "completed"


def test_a_weightless_run_is_not_read_from_a_cache_made_at_another_step(tmp_path):
    """Kills: analyze._weightless_cache ``key.get("step") != final`` dropped. A completed run without its checkpoint
    (a results archive) may be read from its cache only when that was measured at the run's final step: a cache of
    an earlier checkpoint (same settings) holds another model's measurements."""
    import json

    from diffusionformer.experiments.analyze import _CACHE_NAME, _store, _weightless_cache

    settings = {"version": 4, "split": "test", "max_examples": 8, "max_attention_examples": 2, "metrics": ["x"]}
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "step": 100}))
    _store(tmp_path / _CACHE_NAME, {**settings, "step": 50, "size": 1, "mtime_ns": 1}, {"layers": []}, {})
    assert _weightless_cache(tmp_path, settings) is None
    _store(tmp_path / _CACHE_NAME, {**settings, "step": 100, "size": 1, "mtime_ns": 1}, {"layers": []}, {})
    blob = _weightless_cache(tmp_path, settings)
    assert blob is not None and blob["key"]["step"] == 100


def test_a_cache_without_the_learned_parameters_gets_them_added_when_read(tmp_path):
    """Kills: analyze._cached's ``if learned is not None and not isinstance(blob.get("learned"), dict)`` branch
    dropped. A cache written without the run's learned operator parameters (an earlier version) is returned and
    stored again with them, so that once the checkpoint is gone the run can still be read from its cache."""
    from diffusionformer.experiments.analyze import _CACHE_NAME, _cached, _load_cache, _store

    key = {"version": 4, "split": "test", "step": 10, "size": 1, "mtime_ns": 1}
    path = tmp_path / _CACHE_NAME
    _store(path, key, {"layers": [{"layer": 0}]})
    learned = {"blocks.0.attn.operators.0.t": [0.5, 1.5]}
    assert _cached(path, key, learned) == {"layers": [{"layer": 0}]}
    assert _load_cache(path)["learned"] == learned
    assert _cached(path, {**key, "step": 11}, learned) is None


def test_the_depth_plot_band_spans_mean_minus_to_mean_plus_one_std():
    """Kills: analyze._by_depth ``lo = [m - s ...]`` -> ``lo = [m ...]`` (the ±std band drawn as +std only). The
    band's vertices at each layer are the mean ∓ the sample std of the summary, written out by hand."""
    pytest.importorskip("matplotlib")
    from diffusionformer.experiments.analyze import _by_depth, _figure

    summary = [{"layer": 0, "x": {"mean": 1.0, "std": 0.5, "n": 2}},
               {"layer": 1, "x": {"mean": 2.0, "std": 0.25, "n": 2}}]
    ax = _figure().subplots()
    assert _by_depth(ax, {"operators": {"a": {"summary": summary}}}, "x", "x")
    (band,) = ax.collections
    vertices = band.get_paths()[0].vertices
    for layer, low, high in ((0, 0.5, 1.5), (1, 1.75, 2.25)):
        ys = vertices[vertices[:, 0] == layer][:, 1]
        assert min(ys) == pytest.approx(low) and max(ys) == pytest.approx(high)


def test_a_stale_plot_left_as_a_dangling_link_is_removed_too(tmp_path):
    """Kills: analyze._remove_stale_plots ``path.is_symlink() or path.is_file()`` -> ``path.is_file()``. A figure
    name of an earlier analysis that is now a link to a file that is gone must go as well; a figure this analysis
    drew, and a file of another name, stay."""
    from diffusionformer.experiments.analyze import _remove_stale_plots

    pdir = tmp_path / "plots"
    pdir.mkdir()
    (pdir / "t_spectra.png").symlink_to(tmp_path / "gone.png")
    (pdir / "t_smoothing.png").write_bytes(b"new")
    (pdir / "notes.png").write_bytes(b"mine")
    _remove_stale_plots(pdir, ["t"], [pdir / "t_smoothing.png"])
    assert sorted(p.name for p in pdir.iterdir()) == ["notes.png", "t_smoothing.png"]


def test_a_weightless_run_is_not_read_from_a_cache_without_its_learned_parameters(tmp_path):
    """Kills: analyze._weightless_cache's ``not isinstance(blob.get("learned"), dict)`` check dropped. A cache of an
    earlier version holds no learned operator parameters; with the checkpoint gone they cannot be had, so the run is
    not analysed from that cache (its ``learned_operators`` would be None, which the README and plots iterate)."""
    import json

    from diffusionformer.experiments.analyze import _CACHE_NAME, _store, _weightless_cache

    settings = {"version": 4, "split": "test"}
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "step": 7}))
    _store(tmp_path / _CACHE_NAME, {**settings, "step": 7}, {"layers": []})
    assert _weightless_cache(tmp_path, settings) is None
    _store(tmp_path / _CACHE_NAME, {**settings, "step": 7}, {"layers": []}, {})
    assert _weightless_cache(tmp_path, settings) is not None


# Mutants judged equivalent (not killed, with the reason):
# - stats._t_sf2 ``min(1.0, 2.0 * stdtr(df, -|t|))`` -> without ``min``: ``stdtr(df, -|t|) <= 0.5``, never above 1.
# - stats.wilcoxon_p ``W+`` (``x > 0``) -> ``W-`` (``x < 0``): the null distribution is symmetric, the two-sided p
#   (the smaller tail, doubled; ``|z|`` beyond 50) is the same.
# - stats._pairs returning ``b``'s values before ``a``'s: _resolved reads each pair through ``max(|a|, |b|)``.
# - analyze._write_plots ``isnan(c).any(dim=-1)`` -> ``.all``: a head with no polynomial gets a whole row of NaN
#   (DiffusionAttention.coefficients), so the two agree on every row it gives.
# - analyze._pca_rgb without ``len(grid) == 2``: an image ClassificationData gives a 2-d patch grid.
# - analyze._learned_series without the regex's ``$``: learned parameters end in their operator's name.
