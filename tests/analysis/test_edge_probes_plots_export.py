"""Edge probes of the figures and the graph export: what is drawn is read back from the artists and compared with
the numbers computed by hand (legend entries of names with a leading underscore, empty log-log spectra, PCA maps
as given, no pyplot figure left open by a refused argument)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from diffusionformer.analysis import (  # noqa: E402
    pca_token_rgb,
    plot_frequency_response,
    plot_pca_token_maps,
    plot_spectra,
)
from diffusionformer.experiments import load_experiment_config  # noqa: E402
from diffusionformer.experiments import plots as exp_plots  # noqa: E402
from diffusionformer.experiments.results import RunResult, run_dir  # noqa: E402
from diffusionformer.graph import AttentionGraph  # noqa: E402
from diffusionformer.graph.export import draw_attention_graph, to_networkx  # noqa: E402


def _legend_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def _saved_figures(monkeypatch: pytest.MonkeyPatch) -> list:
    """The figures ``experiments.plots._save_figure`` writes, in order (still written to disk)."""
    figs: list = []
    real = exp_plots._save_figure

    def save(fig, path):
        figs.append(fig)
        real(fig, path)

    monkeypatch.setattr(exp_plots, "_save_figure", save)
    return figs


def _config(name: str, ops: tuple[str, ...], **task):
    return load_experiment_config({
        "name": name, "seeds": [0, 1],
        "tasks": [{"name": "t", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 2}, **task}],
        "operators": [{"name": op} for op in ops],
    })


# ------------------------------------------------------------------ legends of names with a leading underscore
def test_bug_plot_experiment_lists_a_setting_named_with_a_leading_underscore(tmp_path: Path, monkeypatch) -> None:
    """Bug: the loss panel's legend was ``ax.legend()`` over the line labels, and matplotlib leaves out a label that
    starts with ``_`` (its mark of an unlabelled artist): a setting ``"_base"`` (a name the config accepts) had its
    curve and no legend entry. The drawn means and the final panel's error bars match a hand computation."""
    cfg = _config("probe", ("_base", "a"))
    results = []
    for k, op in enumerate(("_base", "a")):
        for seed in (0, 1):
            rdir = run_dir(tmp_path, "t", op, seed)
            rdir.mkdir(parents=True)
            records = [{"step": s, "split": "train", "loss": 1.0 + k + seed + s, "metrics": {}} for s in (1, 2)]
            records.append({"step": 2, "split": "eval", "loss": 1.0, "metrics": {"test_acc": 0.5 + 0.1 * seed}})
            (rdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
            results.append(RunResult("t", op, seed, "completed", "test_acc", 0.5 + 0.1 * seed))
    figs = _saved_figures(monkeypatch)
    exp_plots.plot_experiment(tmp_path, cfg, results)
    ax_loss = figs[0].axes[0]
    assert _legend_texts(ax_loss) == ["_base (n=2)", "a (n=2)"]
    # the mean curves: seeds 0 and 1 of loss 1 + k + seed + step
    for k, line in enumerate(ax_loss.lines):
        assert line.get_xdata().tolist() == [1, 2]
        np.testing.assert_allclose(line.get_ydata(), [2.5 + k, 3.5 + k])
    # final panel: mean and sample std of [0.5, 0.6] per setting
    (ax_final,) = figs[1].axes
    for i, bars in enumerate(ax_final.containers):
        np.testing.assert_allclose(bars.lines[0].get_xydata(), [[i, 0.55]])
        (segment,) = bars.lines[2][0].get_segments()
        sd = float(np.std([0.5, 0.6], ddof=1))
        np.testing.assert_allclose(segment, [[i, 0.55 - sd], [i, 0.55 + sd]])
    figs[0].savefig(io.BytesIO(), format="png")


def test_plot_experiment_draws_no_legend_when_no_run_logged_a_step(tmp_path: Path) -> None:
    """Every run failed before logging: the figures are written (no legend entries to list)."""
    cfg = _config("probe", ("_base",))
    for seed in (0, 1):
        run_dir(tmp_path, "t", "_base", seed).mkdir(parents=True)
    results = [RunResult("t", "_base", s, "failed: boom", "test_acc", None) for s in (0, 1)]
    written = exp_plots.plot_experiment(tmp_path, cfg, results)
    assert [p.name for p in written] == ["t_curves.png", "t_final.png"] and all(p.is_file() for p in written)


def test_bug_plot_gaps_lists_a_setting_named_with_a_leading_underscore(tmp_path: Path, monkeypatch) -> None:
    """Bug: ``plot_gaps`` built its legend with ``ax.legend(fontsize=7)``, which left out ``"_base (n=2), val"``
    and ``"_base (n=2), train"``: the setting's two curves had no entry."""
    from diffusionformer.experiments import gaps

    cfg = _config("g", ("_base", "b"), metric="val_loss")
    band = (np.array([1, 2]), np.array([1.0, 0.5]), np.array([0.1, 0.1]))
    curves = {"t": {"_base": {"n": 2, "val": band, "train": band, "gap": band},
                    "b": {"n": 1, "val": band, "train": band, "gap": band}}}
    monkeypatch.setattr(gaps, "gap_curves", lambda config, out: curves)
    figs = _saved_figures(monkeypatch)
    (png,) = gaps.plot_gaps(cfg, tmp_path, tmp_path / "plots")
    assert png.is_file()
    assert _legend_texts(figs[0].axes[0]) == ["_base (n=2), val", "_base (n=2), train", "b (n=1), val", "b (n=1), train"]


def test_bug_analysis_figures_keep_a_leading_underscore_setting_in_their_restyled_legend() -> None:
    """Bug: ``_by_depth`` (smoothing, spectra and collapse figures of ``analyze``) and the frequency-response figure
    redrew the legend of ``plot_metric_by_depth`` / ``plot_frequency_response`` with ``ax.legend(fontsize=...)``,
    which rebuilt it from the labels and dropped the settings named ``"_..."`` those functions had listed."""
    from matplotlib.figure import Figure

    from diffusionformer.analysis.plots import _relegend
    from diffusionformer.experiments.analyze import _by_depth

    def row(layer, mean, std):
        return {"layer": layer, "m": {"mean": mean, "std": std, "n": 2}}

    task = {"operators": {"_base": {"summary": [row(0, 1.0, 0.1), row(1, 0.5, 0.2)]},
                          "b": {"summary": [row(0, 2.0, 0.0), row(1, 1.5, 0.3)]}}}
    ax = Figure().add_subplot()
    assert _by_depth(ax, task, "m", "metric")
    assert _legend_texts(ax) == ["_base", "b"]
    assert ax.get_legend().get_texts()[0].get_fontsize() == 7
    for line, mean in zip(ax.lines, ([1.0, 0.5], [2.0, 1.5]), strict=True):
        np.testing.assert_allclose(line.get_ydata(), mean)
    band = ax.collections[0].get_paths()[0].vertices[:, 1]  # the ±std band of "_base": lower and upper edges
    assert {round(v, 12) for v in band} == {0.9, 0.3, 1.1, 0.7}
    ax = plot_frequency_response({"_a": torch.tensor([1.0, -1.0]), "b": torch.tensor([[0.0, 1.0], [1.0, 0.0]])})
    _relegend(ax, fontsize=6, ncol=2)
    assert _legend_texts(ax) == ["_a", "b[0]", "b[1]"]
    ax.figure.savefig(io.BytesIO(), format="png")


# ------------------------------------------------------------------ log-log spectra with nothing to draw
@pytest.mark.parametrize("values", [[0.0, 0.0, 0.0], [], [float("nan"), float("inf")]])
def test_bug_plot_spectra_of_only_zero_or_non_finite_values_saves(values: list[float]) -> None:
    """Bug: zero and non-finite values are dropped (no log), so a fully collapsed spectrum (all zeros) or a diverged
    one (NaN) left an empty line on log-log axes, and ``savefig`` failed with "Data cannot be log-scaled because all
    values are <= 0" (``analyze`` draws the last layer's spectra: one collapsed comparison lost its figures). The
    axes now stay linear when nothing is left to draw."""
    ax = plot_spectra({"_a": torch.tensor(values, dtype=torch.float64)}, normalize=False)
    ax.figure.savefig(io.BytesIO(), format="png")
    assert ax.get_xscale() == ax.get_yscale() == "linear"
    assert _legend_texts(ax) == ["_a"] and ax.lines[0].get_ydata().size == 0
    # one spectrum with values keeps the log-log axes, the empty one still listed
    ax = plot_spectra({"a": torch.tensor(values, dtype=torch.float64), "b": torch.tensor([1.0, 4.0, 0.0, 2.0])})
    ax.figure.savefig(io.BytesIO(), format="png")
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.lines[1].get_xdata().tolist() == [1, 2, 3] and ax.lines[1].get_ydata().tolist() == [1.0, 0.5, 0.25]


# ------------------------------------------------------------------ PCA maps drawn as given
def test_bug_pca_token_maps_draw_the_maps_as_given_not_scaled_per_image() -> None:
    """Bug: every map panel was min-max scaled on its own, so ``pca_token_rgb``'s scale over the whole batch (which
    makes colours comparable across images) was undone: an image whose tokens were nearly smoothed out (a narrow
    range of colours) was stretched to full contrast like the others, and a constant map of 0.3 was drawn black.
    Maps are now drawn as they are; values outside [0, 1] (not an RGB map) and complex maps are refused by name."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randn(2, 4, 6, generator=g, dtype=torch.float64)
    tokens[1] *= 0.01  # the second image's tokens are nearly constant: a low-contrast map
    rgb = pca_token_rgb(tokens, (2, 2))
    fig = plot_pca_token_maps(torch.rand(2, 3, 4, 4, generator=g), {"m": rgb, "c": torch.full((2, 3, 2, 2), 0.3)})
    for r in range(2):
        np.testing.assert_array_equal(np.asarray(fig.axes[3 * r + 1].images[0].get_array()),
                                      rgb[r].permute(1, 2, 0).numpy())
        np.testing.assert_array_equal(np.asarray(fig.axes[3 * r + 2].images[0].get_array()), np.full((2, 2, 3), np.float32(0.3)))
    low = np.asarray(fig.axes[4].images[0].get_array())
    assert np.ptp(low, axis=(0, 1)).max() < 0.1  # the smoothed image keeps its low contrast in every channel
    fig.savefig(io.BytesIO(), format="png")
    raw = torch.zeros(1, 3, 2, 2)
    raw[0, 0] = torch.tensor([[0.0, 0.5], [1.0, 2.0]])  # a projection, not an RGB map
    with pytest.raises(ValueError, match=r"maps\['m'\] must hold RGB values in \[0, 1\].*1 values outside, e\.g\. 2\.0"):
        plot_pca_token_maps(torch.rand(1, 3, 4, 4), {"m": raw})
    with pytest.raises(TypeError, match=r"maps\['m'\] must be real.*complex64"):
        plot_pca_token_maps(torch.rand(1, 3, 4, 4), {"m": torch.rand(1, 3, 2, 2, dtype=torch.complex64)})
    with pytest.raises(TypeError, match=r"images must be real, got dtype torch.complex64"):
        plot_pca_token_maps(torch.rand(1, 3, 4, 4, dtype=torch.complex64), {"m": torch.rand(1, 3, 2, 2)})


# ------------------------------------------------------------------ draw_attention_graph leaves no figure behind
@pytest.mark.parametrize("kwargs, error", [
    ({"pos": np.zeros((2, 2))}, TypeError),
    ({"pos": {0: (0.0, 0.0)}}, ValueError),
    ({"pos": torch.zeros(3, 2)}, ValueError),
    ({"pos": {0: (0.0, 0.0), 1: (1.0, 0.0)}, "cmap": "viridus"}, KeyError),
    ({"pos": {0: (0.0, 0.0), 1: (1.0, 0.0)}, "node_size": "x"}, ValueError),  # fails inside the drawing
])
def test_bug_draw_attention_graph_leaves_no_pyplot_figure_open_on_an_error(kwargs, error) -> None:
    """Bug: with ``ax=None`` the pyplot figure (``plt.gca()``) was made before ``pos`` was checked, so a refused
    ``pos`` (or an unknown cmap, or a failing drawing) left an empty figure open in pyplot's global state (one more
    per call in a notebook loop). The checks come first now, and a figure made here is closed when drawing fails."""
    G = to_networkx(torch.tensor([[0, 1], [1, 0]]), torch.tensor([0.2, 0.8], dtype=torch.float64))
    plt.close("all")
    try:
        with pytest.raises(error):
            draw_attention_graph(G, **kwargs)
        assert plt.get_fignums() == []
        # a figure the caller already has stays open, and the drawing goes onto it
        fig = plt.figure()
        with pytest.raises(error):
            draw_attention_graph(G, **kwargs)
        assert plt.get_fignums() == [fig.number]
    finally:
        plt.close("all")


def test_draw_attention_graph_widths_follow_the_weights_read_back() -> None:
    """Edge ``j -> i`` of ``P`` drawn with width ``0.5 + 2.5 |w| / max |w|``; with ``ax=None`` one pyplot figure."""
    P = torch.tensor([[[[0.25, 0.75], [1.0, 0.0]]]], dtype=torch.float64)  # row-stochastic, one head
    G = to_networkx(AttentionGraph.dense(2), P)
    assert sorted(G.edges(data="weight")) == [(0, 0, 0.25), (0, 1, 1.0), (1, 0, 0.75), (1, 1, 0.0)]
    plt.close("all")
    try:
        ax = draw_attention_graph(G, pos={0: (0.0, 0.0), 1: (1.0, 0.0)})
        assert plt.get_fignums() == [ax.figure.number]
        widths = sorted(p.get_linewidth() for p in ax.patches)
        np.testing.assert_allclose(widths, sorted(0.5 + 2.5 * w for w in (0.25, 1.0, 0.75, 0.0)))
    finally:
        plt.close("all")
