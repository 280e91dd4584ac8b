"""Tests written by a second mutation-testing audit of the figures and the metrics writers: the
token-geometry plots (``analysis/plots.py``), the comparison figures (``experiments/plots.py``) and
the CSV and TensorBoard writers (``train/loggers.py``). The first passes
(``tests/analysis/test_mutation_kills_analysis.py``, ``tests/experiments/test_mutation_kills_publish_threads.py``
and ``tests/train/test_mutation_kills_trainer_loggers.py``) pinned the numbers behind the curves with a
stand-in ``Figure``, and the CSV widening, truncation and TensorBoard purge; this pass reads back what
the real matplotlib objects hold (line data, labels, titles, legend entries, error bars and scatter
positions, log scales, image panels, the pixel size of the saved PNGs), empty and NaN inputs, and the
CSV cells written for ``None``, non-finite and missing values.

Each test kills a mutant of the library code that the rest of the suite let through (its docstring
names it: file and mutation) and checks the code against an independent reference: values, labels and
file lines written out by hand, pixel sizes computed from the figure size and dpi, and a stand-in
``SummaryWriter`` that records every call. Mutants judged equivalent are listed, with the reason, at
the end of the file. Figures are drawn with the Agg backend; CPU only, deterministic, no network;
files only under ``tmp_path``.
"""

from __future__ import annotations

import json
import math
import sys
import types
import warnings

import numpy as np
import pytest
import torch

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from diffusionformer.analysis import (  # noqa: E402
    plot_frequency_response,
    plot_metric_by_depth,
    plot_pca_token_maps,
    plot_spectra,
)
from diffusionformer.experiments import load_experiment_config  # noqa: E402
from diffusionformer.experiments import plots as exp_plots  # noqa: E402
from diffusionformer.experiments.results import RunResult  # noqa: E402
from diffusionformer.train import CSVLog, TensorBoardLog, read_metrics_csv  # noqa: E402
from diffusionformer.train.loggers import LogGroup  # noqa: E402

HEADER = "step,split,loss,lr,elapsed,time"


def _legend_texts(ax) -> list[str] | None:
    legend = ax.get_legend()
    return None if legend is None else [t.get_text() for t in legend.get_texts()]


def _data_lines(ax) -> list:
    """The labelled lines (``axhline`` and friends carry a ``_child`` label)."""
    return [line for line in ax.lines if not line.get_label().startswith("_")]


# ============================================================================ analysis/plots.py
def test_default_axes_are_five_by_three_and_a_half_inches():
    """kills: analysis/plots.py ``_new_axes`` default ``figsize=(5.0, 3.5)`` -> ``(6.4, 4.8)``."""
    ax = plot_metric_by_depth({"a": [1.0]}, "v")
    assert ax.figure.get_size_inches().tolist() == [5.0, 3.5]


def test_pca_token_maps_panels_titles_ticks_and_pixels():
    """kills: analysis/plots.py ``plot_pca_token_maps`` figsize ``(cell*cols, cell*rows)`` swapped, the title
    set on every row (``if r == 0`` dropped), the x ticks kept (``set_xticks([])`` dropped),
    ``interpolation="nearest"`` -> ``"bilinear"``, ``cmap="gray"`` dropped, ``panel[r]`` -> ``panel[0]`` (the
    first image in every row) and ``permute(1, 2, 0)`` -> ``permute(2, 1, 0)`` (a non-square RGB image transposed)."""
    # three RGB images of 2 x 4 pixels with value c*8 + h*4 + w (+ 100 for image 1): min-max scaled per panel
    base = torch.arange(24, dtype=torch.float32).reshape(3, 2, 4)
    images = torch.stack([base, base + 100.0, base])
    maps = {"a": torch.rand(3, 3, 2, 2, generator=torch.Generator().manual_seed(0)), "b": torch.ones(3, 3, 1, 1)}
    fig = plot_pca_token_maps(images, maps, max_images=2, cell_size=1.5)
    assert fig.get_size_inches().tolist() == [4.5, 3.0]  # 3 columns x 2 rows of 1.5 inches
    assert len(fig.axes) == 6
    assert [ax.get_title() for ax in fig.axes] == ["input", "a", "b", "", "", ""]
    for ax in fig.axes:
        assert list(ax.get_xticks()) == [] and list(ax.get_yticks()) == []
        (im,) = ax.images
        assert im.get_interpolation() == "nearest" and im.get_cmap().name == "gray"
    expected = np.zeros((2, 4, 3))
    for c in range(3):
        for h in range(2):
            for w in range(4):
                expected[h, w, c] = (c * 8 + h * 4 + w) / 23.0
    np.testing.assert_allclose(np.asarray(fig.axes[0].images[0].get_array()), expected, atol=1e-12)
    np.testing.assert_allclose(np.asarray(fig.axes[3].images[0].get_array()), expected, atol=1e-12)  # row 1
    # row 1 of model "a": its own map, not row 0's
    a1 = maps["a"][1].permute(1, 2, 0).double()  # drawn as it is, not scaled again per panel
    np.testing.assert_allclose(np.asarray(fig.axes[4].images[0].get_array()), a1.numpy(), atol=1e-12)
    grey = plot_pca_token_maps(torch.tensor([[[0.0, 2.0], [4.0, 8.0]]]), {"m": torch.rand(1, 3, 2, 2)})
    np.testing.assert_allclose(np.asarray(grey.axes[0].images[0].get_array()), [[0.0, 0.25], [0.5, 1.0]])


def test_pca_token_maps_refuse_zero_rows_and_bad_shapes_naming_them():
    """kills: analysis/plots.py ``rows < 1`` -> ``rows < 0`` (``max_images=0`` reaches matplotlib), the map check
    without ``m.shape[1] != 3`` (a one-channel map drawn) or without ``m.ndim != 4`` (a ``(B, 3, h)`` map drawn),
    and the messages' ``got`` reduced to the type name for a tensor map or images."""
    images, good = torch.rand(2, 3, 4, 4), {"m": torch.rand(2, 3, 2, 2)}
    with pytest.raises(ValueError, match=r"need at least one image and max_images >= 1, got 0 rows"):
        plot_pca_token_maps(images, good, max_images=0)
    with pytest.raises(ValueError, match=r"need at least one image and max_images >= 1, got 0 rows"):
        plot_pca_token_maps(torch.rand(0, 3, 4, 4), good)
    for bad, got in ((torch.rand(2, 1, 2, 2), r"\(2, 1, 2, 2\)"), (torch.rand(2, 3, 4), r"\(2, 3, 4\)"),
                     ([[1.0]], "list")):
        with pytest.raises(ValueError, match=rf"^maps\['m'\] must have shape \(B >= 2, 3, h, w\), got {got}$"):
            plot_pca_token_maps(images, {"m": bad})
    for bad, got in ((torch.rand(2, 8), r"\(2, 8\)"), ([1.0, 2.0], "list")):
        with pytest.raises(ValueError, match=rf"^images must have shape \(B, C, H, W\) or \(B, H, W\), got {got}$"):
            plot_pca_token_maps(bad, good)


def test_frequency_response_lines_zero_line_labels_and_legend():
    """kills: analysis/plots.py ``plot_frequency_response`` drawing on a new figure instead of the given axes
    (``_new_axes(None)``), the zero line (``axhline``) dropped, the x label changed, the y label or the legend
    dropped, and ``coeffs.detach()`` -> ``coeffs`` (coefficients that require grad fail in ``.numpy()``)."""
    fig = Figure()
    ax = fig.add_subplot()
    coeffs = {"p": torch.tensor([1.0, 0.0, 1.0], requires_grad=True),  # 1 + lambda^2
              "h": torch.tensor([[0.0, 1.0], [1.0, 0.0]])}           # lambda, and the constant 1
    out = plot_frequency_response(coeffs, ax, num_points=3)
    assert out is ax and fig.axes == [ax]
    lines = _data_lines(ax)
    assert [line.get_label() for line in lines] == ["p", "h[0]", "h[1]"]
    assert all(line.get_xdata().tolist() == [-1.0, 0.0, 1.0] for line in lines)
    assert [line.get_ydata().tolist() for line in lines] == [[2.0, 1.0, 2.0], [-1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    (zero,) = [line for line in ax.lines if line.get_label().startswith("_")]
    assert list(zero.get_ydata()) == [0.0, 0.0] and zero.get_color() == "0.7"
    assert ax.get_xlabel() == r"eigenvalue $\lambda$ of $P$" and ax.get_ylabel() == r"$f(\lambda)$"
    assert _legend_texts(ax) == ["p", "h[0]", "h[1]"]


def test_frequency_response_of_nothing_is_refused():
    """kills: analysis/plots.py ``plot_frequency_response`` ``if not named_coeffs: raise`` dropped (an empty
    figure with an empty legend)."""
    with pytest.raises(ValueError, match="named_coeffs must hold at least one operator, got none"):
        plot_frequency_response({})


def test_metric_by_depth_x_is_the_layer_index_and_the_scale_follows_logy():
    """kills: analysis/plots.py ``plot_metric_by_depth`` ``range(len(values))`` -> ``range(1, len + 1)`` (the
    documented ``x = l``), ``logy and positive`` -> ``positive`` (a log axis nobody asked for), the ``xlabel``
    argument ignored, the ``o`` markers dropped and the legend dropped."""
    ax = plot_metric_by_depth({"a": [3, 2, 1], "b": []}, "energy", xlabel="block")
    a, b = ax.lines
    assert a.get_xdata().tolist() == [0, 1, 2] and a.get_ydata().tolist() == [3.0, 2.0, 1.0]
    assert b.get_xdata().tolist() == [] and b.get_ydata().tolist() == []  # an empty list: an empty line
    assert a.get_marker() == "o"
    assert ax.get_yscale() == "linear" and ax.get_xlabel() == "block" and ax.get_ylabel() == "energy"
    assert _legend_texts(ax) == ["a", "b"]


@pytest.mark.parametrize("results", [{"a": [1.0, 2.0], "b": [0.0, 0.0]}, {"a": [0.5, 0.0]},
                                     {"a": [float("nan"), 1.0]}], ids=["later-zero", "some-zero", "nan"])
def test_metric_by_depth_uses_a_log_axis_when_any_value_of_any_setting_is_positive(results):
    """kills: analysis/plots.py ``positive = positive or any(...)`` -> ``positive = any(...)`` (only the last
    setting decides: a zero metric drawn last switched the log axis off) and ``any`` -> ``all``."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ax = plot_metric_by_depth(results, "energy", logy=True)
    assert ax.get_yscale() == "log"


def test_spectra_zero_nan_unnormalised_and_labels():
    """kills: analysis/plots.py ``plot_spectra`` ``normalize and s.numel() > 0`` -> ``normalize`` (an all-zero
    spectrum: IndexError), normalising when ``normalize=False``, the y label fixed to ``s_i / s_1``, rank
    ``arange(n)`` from 0 instead of 1, ``s[s > 0]`` -> ``s[s != 0]`` (a NaN kept: every value NaN after
    ``s / s[0]``), the non-tensor check dropped (AttributeError) and the legend dropped."""
    ax = plot_spectra({"a": torch.tensor([1.0, 4.0, 2.0]), "zero": torch.zeros(3)}, normalize=False)
    a, zero = ax.lines
    assert a.get_xdata().tolist() == [1, 2, 3] and a.get_ydata().tolist() == [4.0, 2.0, 1.0]
    assert zero.get_xdata().tolist() == [] and zero.get_ydata().tolist() == []
    assert ax.get_ylabel() == r"$s_i$" and ax.get_xlabel() == "rank $i$"
    assert _legend_texts(ax) == ["a", "zero"]
    ax = plot_spectra({"zero": torch.zeros(2), "n": torch.tensor([2.0, float("nan"), 1.0, 0.0])})
    zero, n = ax.lines
    assert zero.get_ydata().tolist() == [] and n.get_ydata().tolist() == [1.0, 0.5]
    assert n.get_xdata().tolist() == [1, 2] and ax.get_ylabel() == r"$s_i / s_1$"
    with pytest.raises(ValueError, match=r"^spectra\['x'\] must have shape \(R,\), got list$"):
        plot_spectra({"x": [1.0, 2.0]})


# ============================================================================ experiments/plots.py
def _write_log(out, op, seed, records):
    rdir = out / "runs" / "digits" / op / f"seed{seed}"
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _study(tmp_path, monkeypatch):
    """One task, three settings: attention's three runs all failed (two left a partial log, one none), lap's
    two completed, gcn has no run. Returns the out folder, the written paths and the real Figures drawn."""
    cfg = load_experiment_config({
        "name": "mk", "seeds": [0, 1, 2],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits", "metric": "test_acc"}],
        "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}, {"name": "gcn", "laplacian_heads": 1}],
    })
    out = tmp_path / "mk"
    _write_log(out, "attention", 0, [{"step": 1, "split": "train", "loss": 3.0, "metrics": {}}])
    _write_log(out, "attention", 1, [{"step": 1, "split": "train", "loss": 2.0, "metrics": {}},
                                     {"step": 2, "split": "train", "loss": 9.0, "metrics": {}}])
    for seed, (l1, l2, acc) in {0: (1.0, 0.5, 0.62), 1: (1.2, 0.7, 0.66)}.items():
        _write_log(out, "lap", seed, [{"step": 1, "split": "train", "loss": l1, "metrics": {}},
                                      {"step": 2, "split": "train", "loss": l2, "metrics": {}},
                                      {"step": 2, "split": "eval", "loss": 1.0, "metrics": {"test_acc": acc}}])
    results = [RunResult("digits", "attention", s, "failed: non-finite loss", "test_acc", None) for s in (0, 1, 2)]
    results += [RunResult("digits", "lap", 0, "completed", "test_acc", 0.62),
                RunResult("digits", "lap", 1, "completed", "test_acc", 0.66)]
    made = []

    def figure(*args, **kwargs):
        fig = Figure(*args, **kwargs)
        made.append(fig)
        return fig

    monkeypatch.setattr(exp_plots, "_figure", figure)
    written = exp_plots.plot_experiment(out, cfg, results)
    return out, written, made


def test_curves_figure_titles_legend_partial_runs_and_band_colour(tmp_path, monkeypatch):
    """kills: experiments/plots.py the loss and metric panels' titles and y labels changed (``training loss``,
    ``(mean ± std)``, ``train loss``, the task's metric), ``ax_loss.legend`` dropped or moved to the metric
    panel, every partial curve labelled (``if j == 0 else None`` dropped: one legend entry per failed run),
    ``linestyle=":"`` -> ``"--"``, a failed run without a log drawn as an empty partial curve (the ``if c[0]``
    filter dropped: ``n=3``), the ``(n=...)`` of the failed label dropped, and the band drawn without the
    setting's colour."""
    _, _, figs = _study(tmp_path, monkeypatch)
    ax_loss, ax_metric = figs[0].axes
    assert (ax_loss.get_title(), ax_loss.get_xlabel(), ax_loss.get_ylabel()) == ("digits: training loss", "step", "train loss")
    assert (ax_metric.get_title(), ax_metric.get_xlabel(), ax_metric.get_ylabel()) == (
        "digits: test_acc (mean ± std)", "step", "test_acc")
    assert _legend_texts(ax_loss) == ["attention failed (n=2)", "lap (n=2)"]
    assert ax_metric.get_legend() is None
    partial = [line for line in ax_loss.lines if line.get_color() == "C0"]
    assert [(line.get_xdata().tolist(), line.get_ydata().tolist()) for line in partial] == [([1], [3.0]), ([1, 2], [2.0, 9.0])]
    assert all(line.get_linestyle() == ":" for line in partial)
    (mean,) = [line for line in ax_loss.lines if line.get_color() == "C1"]
    assert mean.get_linestyle() == "-" and mean.get_ydata().tolist() == pytest.approx([1.1, 0.6])
    (band,) = ax_loss.collections
    np.testing.assert_allclose(band.get_facecolor()[0], to_rgba("C1", 0.2))


def test_final_figure_ticks_title_errorbars_and_jittered_points(tmp_path, monkeypatch):
    """kills: experiments/plots.py the final panel's title or y label changed, the points drawn without
    jitter or all at x = 0 (``np.full(len(vals), 0)``), and a setting without a final value drawn
    (``if not vals: continue`` dropped: a NaN error bar and a RuntimeWarning)."""
    _, _, figs = _study(tmp_path, monkeypatch)
    (ax,) = figs[1].axes
    assert ax.get_title() == "digits: final test_acc" and ax.get_ylabel() == "test_acc"
    assert list(ax.get_xticks()) == [0, 1, 2]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["attention", "lap", "gcn"]
    (container,) = ax.containers  # one error bar: lap's; attention has no value, gcn no run
    line = container.lines[0]
    assert line.get_xdata().tolist() == [1] and line.get_ydata().tolist() == pytest.approx([0.64])
    (points,) = ax.collections[-1:]
    np.testing.assert_allclose(points.get_offsets(), [[0.88, 0.62], [1.12, 0.66]])


def test_plots_are_written_at_their_pixel_size(tmp_path, monkeypatch):
    """kills: experiments/plots.py the curves figure saved at another dpi or size (10 x 3.6 in at 110 dpi:
    1100 x 396 px) and the final figure likewise ((1.4 + 1.1 * 3) x 3.4 in at 110 dpi: 517 x 374 px)."""
    from PIL import Image

    out, written, _ = _study(tmp_path, monkeypatch)
    assert written == [out / "plots" / "digits_curves.png", out / "plots" / "digits_final.png"]
    with Image.open(written[0]) as curves, Image.open(written[1]) as final:
        assert curves.size == (1100, 396) and final.size == (517, 374)


# ============================================================================ train/loggers.py
def _rec(step, split="train", loss=0.5, lr=0.1, metrics=None, elapsed=1.0, time=2.0):
    return {"step": step, "split": split, "loss": loss, "lr": lr, "metrics": metrics if metrics is not None else {},
            "elapsed": elapsed, "time": time}


def test_csv_cells_for_none_non_finite_and_missing_values_are_empty(tmp_path):
    """kills: loggers.py ``_cell`` ``if value is None: return ""`` dropped (``None`` written as the text
    ``None``, which ``read_metrics_csv`` cannot read back), ``record.get(name)`` -> ``record[name]`` (a record
    without ``elapsed``/``time`` raises KeyError) and ``dict(record.get("metrics") or {})`` -> ``dict(...)``
    (a record whose ``metrics`` is None raises TypeError)."""
    path = tmp_path / "metrics.csv"
    log = CSVLog(path)
    log.append(_rec(1, "eval", loss=None, lr=None, metrics={"acc": 0.25}))
    log.append({"step": 2, "split": "train", "loss": math.inf, "lr": 0.1, "metrics": None})
    assert path.read_text().splitlines() == [HEADER + ",metrics.acc", "1,eval,,,1.0,2.0,0.25", "2,train,,0.1,,,"]
    assert read_metrics_csv(path) == [
        {"step": 1, "split": "eval", "loss": None, "lr": None, "metrics": {"acc": 0.25}, "elapsed": 1.0, "time": 2.0},
        {"step": 2, "split": "train", "loss": None, "lr": 0.1, "metrics": {}, "elapsed": None, "time": None}]


def test_csv_metric_cells_hold_numbers_only_so_the_table_reads_back(tmp_path):
    """Bug: ``CSVLog`` wrote a bool metric as the text ``True`` and a string one as itself, and
    ``read_metrics_csv`` then refused the whole table ("not a metrics row"). Such values now leave
    the cell empty, as the TensorBoard log skips them; numpy numbers are written as floats."""
    path = tmp_path / "metrics.csv"
    log = CSVLog(path)
    log.append(_rec(1, "eval", loss=0.5, lr=0.1, metrics={"ok": True, "note": "x", "acc": np.float32(0.25), "n": 3}))
    assert path.read_text().splitlines() == [HEADER + ",metrics.acc,metrics.n,metrics.note,metrics.ok",
                                             "1,eval,0.5,0.1,1.0,2.0,0.25,3,,"]
    assert read_metrics_csv(path) == [{"step": 1, "split": "eval", "loss": 0.5, "lr": 0.1,
                                       "metrics": {"acc": 0.25, "n": 3.0}, "elapsed": 1.0, "time": 2.0}]


def test_read_metrics_csv_steps_are_ints_and_other_columns_are_ignored(tmp_path):
    """kills: loggers.py ``_row_to_record`` ``int(row["step"])`` -> ``float(...)`` (a float step compares
    equal to the int, so the type is checked) and ``column.startswith("metrics.")`` -> ``column not in
    CSV_BASE_COLUMNS`` (a column added by hand, e.g. a note, read as a metric: ValueError)."""
    path = tmp_path / "metrics.csv"
    path.write_text(HEADER + ",note,metrics.acc\n7,eval,0.5,0.1,1.0,2.0,hello,0.75\n")
    (record,) = read_metrics_csv(path)
    assert type(record["step"]) is int
    assert record == {"step": 7, "split": "eval", "loss": 0.5, "lr": 0.1, "metrics": {"acc": 0.75},
                      "elapsed": 1.0, "time": 2.0}


def test_read_metrics_csv_names_the_file_and_line_of_a_table_without_a_split_column(tmp_path):
    """kills: loggers.py ``read_metrics_csv`` catching only ``(TypeError, ValueError)`` (a table without a
    ``split`` column raises a bare KeyError naming no file)."""
    path = tmp_path / "metrics.csv"
    path.write_text("step,loss,lr,elapsed,time\n1,0.5,0.1,1.0,2.0\n")
    with pytest.raises(ValueError, match=r"metrics\.csv:2: not a metrics row \(KeyError: 'split'\)"):
        read_metrics_csv(path)


def test_csv_log_creates_its_folder_and_truncate_of_no_file_creates_nothing(tmp_path):
    """kills: loggers.py ``CSVLog._rewrite`` without ``path.parent.mkdir(parents=True, exist_ok=True)`` (a log in
    a folder not made yet: FileNotFoundError) and ``truncate`` without the ``not self.path.exists()`` check (a
    resume that switches the CSV writer on writes a header-only file and later readers see an empty table)."""
    missing = tmp_path / "resumed" / "metrics.csv"
    assert CSVLog(missing).truncate(5) == 0
    assert not missing.exists() and not missing.parent.exists()
    path = tmp_path / "a" / "b" / "metrics.csv"
    CSVLog(path).append(_rec(1))
    assert path.read_text().splitlines() == [HEADER, "1,train,0.5,0.1,1.0,2.0"]


def test_log_group_keeps_a_generator_of_writers(tmp_path):
    """kills: loggers.py ``LogGroup.__init__`` ``list(writers)`` -> ``writers`` (a generator of writers is used
    up by the first append: later records and the close reach no writer)."""
    paths = [tmp_path / "a.csv", tmp_path / "b.csv"]
    group = LogGroup(CSVLog(p) for p in paths)
    group.append(_rec(1))
    group.append(_rec(2))
    assert group.truncate(1) == 1
    group.close()
    for p in paths:
        assert p.read_text().splitlines() == [HEADER, "1,train,0.5,0.1,1.0,2.0"]


class _Writer:
    """Stand-in ``SummaryWriter`` that records every call."""

    def __init__(self, log_dir, purge_step=None):
        self.calls = [("open", log_dir, purge_step)]
        _Writer.made.append(self)

    def add_scalar(self, tag, value, global_step):
        self.calls.append((tag, value, global_step))

    def flush(self):
        self.calls.append(("flush",))

    def close(self):
        self.calls.append(("close",))


def test_tensorboard_takes_a_record_without_metrics(tmp_path, monkeypatch):
    """kills: loggers.py ``TensorBoardLog.append`` ``dict(record.get("metrics") or {})`` -> ``dict(...)`` (a
    record whose ``metrics`` is None raises TypeError)."""
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = _Writer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    _Writer.made = []
    log = TensorBoardLog(tmp_path / "tb")
    log.append({"step": 4, "split": "eval", "loss": 0.25, "lr": 0.5, "metrics": None})
    log.close()
    (writer,) = _Writer.made
    assert writer.calls == [("open", str(tmp_path / "tb"), None), ("eval/loss", 0.25, 4), ("eval/lr", 0.5, 4),
                            ("flush",), ("close",)]


def test_tensorboard_missing_names_the_option_and_keeps_the_import_error(tmp_path, monkeypatch):
    """kills: loggers.py the ``TrainConfig.loggers:`` prefix dropped from the missing-tensorboard message, and
    ``from err`` -> ``from None`` (the original import error no longer chained)."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ModuleNotFoundError) as info:
        TensorBoardLog(tmp_path / "tb")
    assert str(info.value).startswith("TrainConfig.loggers: expected the 'tensorboard' package for the "
                                      "'tensorboard' logger, got an import error (")
    assert str(info.value).endswith("install it (pip install tensorboard) or drop 'tensorboard' from loggers")
    assert isinstance(info.value.__cause__, ImportError)
    assert TensorBoardLog(tmp_path / "tb", active=False).truncate(3) == 0  # an inactive one never imports it


# ---------------------------------------------------------------------------- equivalent mutants
# Of the 102 mutants applied in this audit (45 in analysis/plots.py, 24 in experiments/plots.py, 33 in
# train/loggers.py), these four survive the suite with this file, because no input tells them from the code:
# - experiments/plots.py ``if not runs: continue`` dropped: a setting without runs has no completed and no
#   failed logs, so ``_mean_band([])`` is None and the partial list is empty; nothing is drawn either way.
# - experiments/plots.py ``r.status == "completed"`` -> ``r.status.startswith("c")``: ``RunResult.status`` is
#   ``"completed"`` or ``"failed: <reason>"``, never another word starting with ``c``.
# - train/loggers.py ``_row_to_record`` metric cells ``float(text)`` -> ``_parse_number(text)``: the
#   ``text != ""`` guard just before means ``_parse_number`` always calls ``float``.
# - train/loggers.py ``CSVLog.append`` ``if rows is None: _, rows = self._read()`` -> ``if True``: re-reading
#   the rows just read (or the file this writer alone appends to) gives the same rows; it only costs a read.
# Mutants considered and not applied, for the same reason: ``newline=""`` dropped from the append's ``open``
# (no newline translation on POSIX, where the tests run), ``encoding="utf-8"`` dropped there (the locale is
# UTF-8 here), and ``.cpu()`` dropped in ``plot_frequency_response`` (the tests draw CPU tensors only).
