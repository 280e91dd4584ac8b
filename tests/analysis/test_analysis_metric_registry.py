"""A token-geometry metric is one registered function: the report, the analysis table and its figures read it."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.analysis import LayerCapture, layer_reports
from diffusionformer.analysis import report as R


@pytest.fixture
def token_norm():
    """A throwaway metric: the mean Euclidean norm of the real tokens (a column and a smoothing panel)."""

    @R.register_metric("test_token_norm", group="smoothing", label="mean token norm", panel=6, column="norm")
    def _norm(view: R.LayerView) -> float:
        return float(view.tokens.norm(dim=-1).mean())

    yield "test_token_norm"
    R.unregister_metric("test_token_norm")


def test_a_registered_metric_appears_in_every_layer_report(token_norm):
    X = torch.randn(6, 5, 3, dtype=torch.float32)
    mask = torch.ones(6, 5, dtype=torch.bool)
    mask[::2, 3:] = False  # padded sequences: only real tokens count
    reports = layer_reports(LayerCapture({0: X * mask.unsqueeze(-1), 1: 2 * X * mask.unsqueeze(-1)}, mask=mask))
    for report, scale in zip(reports, (1.0, 2.0)):
        real = (scale * X.double())[mask]  # float64 reference, written out
        expected = sum(float(row.pow(2).sum().sqrt()) for row in real) / real.shape[0]
        assert report.metrics[token_norm] == pytest.approx(expected, rel=1e-12)
        assert list(report.metrics)[len(R.SMOOTHING_METRICS)] == token_norm  # after the built-in smoothing metrics


def test_a_registered_metric_gets_a_column_and_a_panel_in_the_analysis(token_norm):
    from diffusionformer.experiments.analyze import _markdown, _panels

    assert _panels("smoothing")[-1] == (token_norm, "mean token norm", False)
    layers = [{"layer": 0, "within_variance": 1.0, token_norm: 3.0, "nc1": 0.5},
              {"layer": 1, "within_variance": 0.5, token_norm: 2.0, "nc1": 0.25}]
    result = {"experiment": "e", "split": "test", "max_examples": 4,
              "tasks": {"t": {"dataset": "d", "model": "m", "operators": {"attention": {"seeds": {"0": {"layers": layers}}}}}}}
    text = _markdown(result)
    header = next(line for line in text.splitlines() if line.startswith("| operator"))
    assert header == ("| operator | within-var L0 | within-var L | Dirichlet (complete) L | Dirichlet (attention) L "
                      "| norm L | eff. rank L | nc1 L |")
    row = next(line for line in text.splitlines() if line.startswith("| attention"))
    assert row == "| attention | 1 ± n/a | 0.5 ± n/a | n/a | n/a | 2 ± n/a | n/a | 0.25 ± n/a |"  # one seed; norm L: the last layer's 2.0


def test_without_the_metric_the_report_is_the_built_in_one():
    reports = layer_reports(LayerCapture({0: torch.randn(4, 3, 2)}, labels=torch.tensor([0, 1, 0, 1])))
    assert tuple(reports[0].metrics) == R.SMOOTHING_METRICS + R.SPECTRAL_METRICS + R.SEQUENCE_LABEL_METRICS
    assert [m.key for m in R.list_metrics("token_label")] == list(R.TOKEN_LABEL_METRICS) == ["token_nc1", "token_probe_acc"]


def test_the_registry_is_strict_when_registering():
    with pytest.raises(ValueError, match="already registered"):
        R.register_metric("nc1", group="sequence_label")
    with pytest.raises(ValueError, match="unknown metric group 'smooth'"):
        R.register_metric("x", group="smooth")
    with pytest.raises(KeyError, match="no metric 'nope'"):
        R.unregister_metric("nope")
    with pytest.raises(ValueError, match="unknown metric group"):
        R.list_metrics("labels")
