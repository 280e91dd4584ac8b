"""Edge probes (fifth pass) of the analysis: PCA token maps of rank-deficient tokens, and figures of odd names."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from diffusionformer.analysis import pca_token_rgb
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.plots import plot_experiment
from diffusionformer.experiments.results import RunResult, run_dir


def _pca_rgb_reference(X: np.ndarray, h: int, w: int) -> np.ndarray:
    """float64 numpy reference: top-3 right singular vectors of the centred tokens, sign by the largest entry,
    projections min-max scaled over the batch."""
    B, T, D = X.shape
    Z = X.reshape(B * T, D) - X.reshape(B * T, D).mean(axis=0)
    _, _, Vt = np.linalg.svd(Z, full_matrices=False)
    V = Vt[:3].T
    V = V * np.sign(V[np.abs(V).argmax(axis=0), np.arange(V.shape[1])])
    P = Z @ V
    rgb = (P - P.min(axis=0)) / (P.max(axis=0) - P.min(axis=0))
    return rgb.reshape(B, h, w, 3).transpose(0, 3, 1, 2)


def test_pca_token_rgb_of_full_rank_tokens_matches_a_numpy_reference() -> None:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(2, 6, 5, dtype=torch.float64, generator=g) * torch.tensor([5.0, 3.0, 2.0, 0.5, 0.1], dtype=torch.float64)
    np.testing.assert_allclose(pca_token_rgb(X, (2, 3)).numpy(), _pca_rgb_reference(X.numpy(), 2, 3), atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bug_pca_token_rgb_leaves_the_channels_beyond_the_rank_at_zero(dtype: torch.dtype) -> None:
    """Bug: tokens of rank 1 (or 2) in a general direction gave channels 2 and 3 full-range colours: the directions
    of the null space carry only rounding noise (projections ~1e-16), and the min-max scaling stretched that noise
    to [0, 1] (a random image), where the docstring promises 0 for a constant projection. They are now 0."""
    g = torch.Generator().manual_seed(1)
    direction = torch.randn(5, generator=g, dtype=torch.float64)
    X = torch.arange(8.0, dtype=torch.float64).reshape(2, 4, 1) * direction + torch.randn(5, generator=g, dtype=torch.float64)
    rgb = pca_token_rgb(X.to(dtype), (2, 2))
    assert rgb.dtype == dtype
    assert torch.equal(rgb[:, 1:], torch.zeros_like(rgb[:, 1:]))
    expected = torch.arange(8.0).reshape(2, 1, 2, 2) / 7.0  # the one real component, increasing along the line
    flip = direction[direction.abs().argmax()] < 0  # sign fixed by the largest entry of the direction
    torch.testing.assert_close(rgb[:, :1].double(), 1 - expected.double() if flip else expected.double(), atol=1e-5, rtol=0)
    # rank 2: the third channel is 0, the first two are the reference's
    Y = torch.randn(2, 4, 2, generator=g, dtype=torch.float64) @ torch.randn(2, 5, generator=g, dtype=torch.float64)
    rgb2 = pca_token_rgb(Y, (2, 2))
    assert torch.equal(rgb2[:, 2], torch.zeros_like(rgb2[:, 2]))
    np.testing.assert_allclose(rgb2[:, :2].numpy(), _pca_rgb_reference(Y.numpy(), 2, 2)[:, :2], atol=1e-10)


def _legend_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_bug_analysis_figures_draw_names_with_dollars_and_list_names_with_a_leading_underscore() -> None:
    """Bug: a name was passed to matplotlib as a label or title as it was, so ``"x$^$"`` (read as mathtext) made
    ``savefig`` fail with a ParseSyntaxException, and ``"_base"`` (matplotlib's mark of an unlabelled artist) drew
    a line with no legend entry. Names are now literal text and every line is in the legend."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from diffusionformer.analysis import plot_frequency_response, plot_metric_by_depth, plot_pca_token_maps, plot_spectra

    names = ("_base", "x$^$", "lr $10^{-3}$")
    axes = [
        plot_metric_by_depth({n: [1.0, 0.5] for n in names}, ylabel="v", logy=True),
        plot_spectra({n: torch.tensor([3.0, 1.0]) for n in names}),
        plot_frequency_response({n: torch.tensor([1.0, -1.0]) for n in names}),
    ]
    for ax in axes:
        assert len(_legend_texts(ax)) == 3, _legend_texts(ax)
        assert _legend_texts(ax)[0] == "_base"
        ax.figure.savefig(io.BytesIO(), format="png")
        # drawn as the literal name: matplotlib strips the escape of a "$" in text without mathtext
        assert [t._preprocess_math(t.get_text())[0] for t in ax.get_legend().get_texts()] == list(names)
    heads = plot_frequency_response({"_h": torch.tensor([[1.0, -1.0], [0.0, 1.0]])})
    assert _legend_texts(heads) == ["_h[0]", "_h[1]"]
    fig = plot_pca_token_maps(torch.rand(1, 3, 4, 4), {"x$^$": torch.rand(1, 3, 2, 2)})
    fig.savefig(io.BytesIO(), format="png")
    # a caller's own labelled artist on a given ax stays in the legend, first
    ax = Figure().add_subplot()
    ax.axvline(0.5, label="mine")
    plot_metric_by_depth({"_a": [1.0], "b": [2.0]}, ylabel="v", ax=ax)
    assert _legend_texts(ax) == ["mine", "_a", "b"]


@pytest.mark.parametrize("where", ["task", "setting"])
def test_bug_config_refuses_names_with_dollars_before_anything_trains(where: str) -> None:
    """Bug: a config could name a task ``"t$^$"`` or a setting ``"a$_$"``; ``plot_experiment`` put the names into
    titles, legend labels and tick labels, where ``$`` opens mathtext, and ``savefig`` failed with a
    ParseSyntaxException after the whole comparison had trained (the published page's MyST dollarmath reads them
    as math too). Such names are now refused when the config loads."""
    task, setting = ("t$^$", "a") if where == "task" else ("t", "a$_$")
    raw = {"name": "probe", "seeds": [0],
           "tasks": [{"name": task, "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 2}}],
           "operators": [{"name": setting}, {"name": "_b"}]}
    with pytest.raises(ValueError, match=r"without whitespace, '/', '\\', ':', '\$' or NUL"):
        load_experiment_config(raw)


def test_plot_experiment_saves_the_figures_of_odd_but_valid_names(tmp_path) -> None:
    """Names a config accepts (a leading underscore, unicode, mathtext-like carets) draw and save."""
    pytest.importorskip("matplotlib")
    cfg = load_experiment_config({
        "name": "probe", "seeds": [0],
        "tasks": [{"name": "t^x_\u00e9", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 2}}],
        "operators": [{"name": "a_{1}"}, {"name": "_b"}],
    })
    results = []
    for op in ("a_{1}", "_b"):
        rdir = run_dir(tmp_path, "t^x_\u00e9", op, 0)
        rdir.mkdir(parents=True)
        records = [{"step": 1, "split": "train", "loss": 1.0, "metrics": {}},
                   {"step": 1, "split": "eval", "loss": 1.0, "metrics": {"test_acc": 0.5}}]
        (rdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        results.append(RunResult("t^x_\u00e9", op, 0, "completed", "test_acc", 0.5))
    written = plot_experiment(tmp_path, cfg, results)
    assert [p.name for p in written] == ["t^x_\u00e9_curves.png", "t^x_\u00e9_final.png"]
    assert all(p.is_file() and p.stat().st_size > 0 for p in written)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(p.name for p in written)  # no leftovers
