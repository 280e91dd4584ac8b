"""Edge probes (tenth pass) of analysis/report.py, spectral.py and plots.py against numpy/scipy float64 references."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from diffusionformer.analysis.capture import LayerCapture
from diffusionformer.analysis.report import layer_reports
from diffusionformer.analysis.spectral import pca_token_rgb, power_law_exponent


def _pooled_ratio_ref(X: np.ndarray, lengths: list[int]) -> float:
    """sum_b ||C X_b||^2 / ||X - 1 mu^T||^2 over the real tokens, in float64 numpy."""
    toks = [X[b, :n] for b, n in enumerate(lengths) if n]
    within = sum(((t - t.mean(0)) ** 2).sum() for t in toks)
    allt = np.concatenate(toks)
    return float(within / ((allt - allt.mean(0)) ** 2).sum())


@pytest.mark.parametrize("scale", [1e-200, 1e-170])
def test_bug_report_variance_ratio_tiny_float64_tokens(scale):
    """Bug: layer_reports' variance_ratio was 0.0 ("collapsed") for float64 tokens of |x| < 1e-162 (squares underflow)."""
    X = torch.randn(3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ref = _pooled_ratio_ref(X.numpy(), [5, 5, 5])  # the ratio is scale-free: computed at unit scale
    got = layer_reports(LayerCapture({0: X * scale}))[0].metrics["variance_ratio"]
    assert got == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("scale", [1e200, 1e160])
def test_bug_report_variance_ratio_huge_float64_tokens(scale):
    """Bug: layer_reports' variance_ratio was NaN (inf / inf) for finite float64 tokens of |x| > 1e154."""
    X = torch.randn(3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    ref = _pooled_ratio_ref(X.numpy(), [3, 5, 2])
    got = layer_reports(LayerCapture({0: X * scale}, mask=mask))[0].metrics["variance_ratio"]
    assert got == pytest.approx(ref, rel=1e-9)


def test_pins_power_law_exponent_batched_range_matches_scipy_linregress():
    stats = pytest.importorskip("scipy.stats")
    s = torch.rand(2, 3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) + 0.01
    got = power_law_exponent(s, start=2, stop=6)
    ss = -np.sort(-s.numpy(), axis=-1)
    i = np.arange(2, 7)
    for a in range(2):
        for b in range(3):
            ref = -stats.linregress(np.log(i), np.log(ss[a, b, 1:6] ** 2)).slope
            assert float(got[a, b]) == pytest.approx(ref, rel=1e-10, abs=1e-12)


def test_pins_pca_token_rgb_matches_numpy_eigh():
    X = torch.randn(2, 6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    out = pca_token_rgb(X, (2, 3)).permute(0, 2, 3, 1).reshape(12, 3).numpy()
    Z = X.numpy().reshape(12, 5)
    Z = Z - Z.mean(0)
    _, V = np.linalg.eigh(Z.T @ Z)
    V = V[:, ::-1][:, :3]
    for c in range(3):
        v = V[:, c] * np.sign(V[np.argmax(np.abs(V[:, c])), c])
        p = Z @ v
        np.testing.assert_allclose(out[:, c], (p - p.min()) / (p.max() - p.min()), atol=1e-9)


def test_pins_plots_single_point_nan_constant_save():
    pytest.importorskip("matplotlib")
    from diffusionformer.analysis.plots import plot_metric_by_depth, plot_spectra

    for ax in (plot_metric_by_depth({"a": [1.0]}, "y", logy=True),
               plot_metric_by_depth({"a": [math.nan, None, 2.0], "b": [3.0, 3.0, 3.0]}, "y", logy=True),
               plot_spectra({"a": torch.tensor([3.0]), "b": torch.tensor([math.nan, 2.0, 2.0])})):
        ax.figure.savefig(io.BytesIO(), format="png")
    assert ax.lines[1].get_ydata().tolist() == [1.0, 1.0]


@pytest.mark.parametrize("images, pca_map", [
    (torch.rand(1, 3, 0, 4), torch.rand(1, 3, 2, 2)),
    (torch.rand(1, 0, 4), torch.rand(1, 3, 2, 2)),
    (torch.rand(1, 3, 4, 4), torch.rand(1, 3, 2, 0)),
])
def test_bug_plot_pca_token_maps_empty_grid_clear_error(images, pca_map):
    """Bug: an image or map with a zero-size grid crashed in imshow ("zero-size array to reduction") or drew nothing."""
    pytest.importorskip("matplotlib")
    from diffusionformer.analysis.plots import plot_pca_token_maps

    with pytest.raises(ValueError, match=r"H, W >= 1|h, w >= 1"):
        plot_pca_token_maps(images, {"m": pca_map})

