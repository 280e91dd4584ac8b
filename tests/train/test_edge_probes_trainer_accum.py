"""Edge-case probes of the single-process training loop: metric values and names the log cannot hold as given."""

from __future__ import annotations

from typing import Any

import pytest
from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config

from diffusionformer.train import Trainer, seed_everything


class _Metrics(RegressionTask):
    """The regression task whose train (``where="train"``) or eval metrics are replaced by ``extra``."""

    def __init__(self, where: str, extra: dict[Any, Any]) -> None:
        super().__init__(global_rng=False)
        self.where, self.extra = where, extra

    def loss(self, model, batch):
        loss, metrics = super().loss(model, batch)
        return loss, (self.extra if self.where == "train" else metrics)

    def evaluate(self, model, max_batches):
        out = super().evaluate(model, max_batches)
        return {**out, **self.extra} if self.where == "eval" else out


def _fit(tmp_path, task, **overrides):
    seed_everything(0)
    cfg = tiny_config(max_steps=2, eval_interval=0, checkpoint_interval=0, **overrides)
    return Trainer(TinyMLP(dropout=0.0), task, cfg, tmp_path).fit()


@pytest.mark.parametrize("accum", [1, 2])
@pytest.mark.parametrize("where, match", [("train", r"task\.loss metrics\['count'\]"),
                                          ("eval", r"task\.evaluate\(\)\['count'\]")])
def test_bug_an_int_metric_beyond_the_float_range_is_named(tmp_path, where, match, accum):
    """Bug: an int metric beyond the float range (``10**400``) from task.loss or task.evaluate stopped the run with a
    bare ``OverflowError: int too large to convert to float``, naming neither the method nor the metric."""
    with pytest.raises(ValueError, match=match + r".*int beyond the float range"):
        _fit(tmp_path, _Metrics(where, {"count": 10**400}), grad_accum_steps=accum)


@pytest.mark.parametrize("accum", [1, 2])
@pytest.mark.parametrize("where, match", [("train", r"task\.loss metrics: .*naming \['1'\] more than once"),
                                          ("eval", r"task\.evaluate\(\): .*naming '1' more than once")])
def test_bug_metric_names_equal_as_strings_are_refused(tmp_path, where, match, accum):
    """Bug: metrics keyed ``1`` and ``"1"`` share the log's key ``"1"``: the train record logged the mean of the two
    values (2.0 for 1.0 and 3.0) and the eval record the last one, each without a word."""
    with pytest.raises(ValueError, match=match):
        _fit(tmp_path, _Metrics(where, {1: 1.0, "1": 3.0}), grad_accum_steps=accum)


def test_int_metrics_within_range_still_log(tmp_path):
    """The checks leave ordinary int metrics (and distinct names) alone."""
    summary = _fit(tmp_path, _Metrics("train", {"count": 10**30, "n": 3}), log_interval=1)
    assert summary["train"]["metrics"]["n"] == 3.0
    assert summary["train"]["metrics"]["count"] == pytest.approx(1e30, rel=1e-6)
