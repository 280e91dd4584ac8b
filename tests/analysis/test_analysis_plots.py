"""Figures render to files; bad input fails loudly; a missing matplotlib names the extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import diffusionformer.analysis as analysis
from diffusionformer.analysis import (
    pca_token_rgb,
    plot_frequency_response,
    plot_metric_by_depth,
    plot_pca_token_maps,
    plot_spectra,
)

pytest.importorskip("matplotlib")


def saved(fig: object, path: Path) -> Path:
    fig.savefig(path)  # type: ignore[attr-defined]
    assert path.exists() and path.stat().st_size > 0
    return path


def test_pca_token_maps_tile_inputs_and_models(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    images = torch.rand(5, 3, 16, 16, generator=g)
    maps = {
        name: pca_token_rgb(torch.randn(5, 16, 8, generator=g), (4, 4))
        for name in ("attention", "laplacian")
    }
    fig = plot_pca_token_maps(images, maps, max_images=3)
    assert len(fig.axes) == 3 * 3
    assert [ax.get_title() for ax in fig.axes[:3]] == ["input", "attention", "laplacian"]
    saved(fig, tmp_path / "pca.png")
    grey = plot_pca_token_maps(torch.rand(2, 16, 16), {"m": torch.rand(2, 3, 4, 4)})  # (B, H, W)
    assert len(grey.axes) == 2 * 2
    with pytest.raises(ValueError, match=r"maps\['m'\] must have shape \(B >= 2, 3, h, w\), got"):
        plot_pca_token_maps(torch.rand(2, 1, 8, 8), {"m": torch.rand(1, 3, 4, 4)})
    with pytest.raises(ValueError, match="images must have 1 or 3 channels"):
        plot_pca_token_maps(torch.rand(2, 2, 8, 8), {"m": torch.rand(2, 3, 4, 4)})
    with pytest.raises(ValueError, match="at least one model"):
        plot_pca_token_maps(images, {})


def test_frequency_response_plot(tmp_path: Path) -> None:
    heads = torch.tensor([[1.0, -1.0], [0.5, 0.5]])
    coeffs = {"attention": torch.tensor([0.0, 1.0]), "heads": heads}
    ax = plot_frequency_response(coeffs, num_points=5)
    assert ax.get_legend_handles_labels()[1] == ["attention", "heads[0]", "heads[1]"]
    lines = {line.get_label(): line for line in ax.lines}
    assert lines["heads[0]"].get_ydata().tolist() == [2.0, 1.5, 1.0, 0.5, 0.0]  # 1 - lambda
    saved(ax.figure, tmp_path / "freq.png")
    with pytest.raises(ValueError, match="must be real"):
        plot_frequency_response({"c": torch.tensor([1j, 1.0])})


def test_metric_by_depth_and_spectra_on_given_axes(tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure()
    left, right = fig.subplots(1, 2)
    results = {"attention": [1.0, 0.5, 0.1], "laplacian": [1.0, 0.9, 0.8]}
    out = plot_metric_by_depth(results, "variance", left, logy=True)
    assert out is left and left.get_yscale() == "log" and len(left.lines) == 2
    assert left.get_ylabel() == "variance" and left.get_xlabel() == "layer"
    spectra = {"a": torch.tensor([1.0, 4.0, 0.0, 2.0]), "b": torch.arange(1.0, 9.0) ** -1.0}
    plot_spectra(spectra, right)
    assert right.get_xscale() == "log" and right.get_yscale() == "log"
    # sorted, zero dropped, normalised
    assert right.lines[0].get_ydata().tolist() == [1.0, 0.5, 0.25]
    saved(fig, tmp_path / "depth_spectra.png")
    with pytest.raises(ValueError, match=r"spectra\['x'\] must have shape \(R,\), got \(2, 2\)"):
        plot_spectra({"x": torch.ones(2, 2)})
    with pytest.raises(ValueError, match="at least one setting"):
        plot_metric_by_depth({}, "variance")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns when a log axis has no positive data
        zeros = plot_metric_by_depth({"a": [0.0, 0.0]}, "energy", logy=True)
    assert zeros.get_yscale() == "linear"


def test_missing_matplotlib_names_the_plot_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"diffusionformer\[plot\]"):
        plot_metric_by_depth({"a": [1.0]}, "x")


def test_package_exports_resolve() -> None:
    for name in analysis.__all__:
        assert getattr(analysis, name) is not None, name
