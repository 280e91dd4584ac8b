"""Which direction the comparison reads an evaluation key in (the headline metric, ``select_by``, ``reach``):
lower is better for losses, perplexities, error rates and distances, higher for everything else. Checked against
hand-picked evaluations (the best one written out per case)."""

from __future__ import annotations

import pytest

from diffusionformer.experiments.config import TaskConfig
from diffusionformer.experiments.results import first_reach, select_evaluation


def _evals(key, values, metric="test_acc"):
    return [{"split": "eval", "step": 10 * (i + 1), "metrics": {key: v, metric: 0.1 * (i + 1)}}
            for i, v in enumerate(values)]


@pytest.mark.parametrize("key", ["val_ppl", "val_perplexity", "val_error", "val_mse", "val_rmse", "val_nll",
                                 "val_bpc", "Val_Loss"])
def test_bug_select_by_a_lower_is_better_key_picks_the_lowest_evaluation(key):
    """Bug: ``select_by`` was maximised unless its name ended in "loss", so a perplexity or an error rate picked the
    worst evaluation (step 20 here, perplexity 9.0) and reported the metric there; the lowest (step 30) is picked."""
    task = TaskConfig("t", "digits", "vit-digits", select_by=key)
    assert select_evaluation(_evals(key, [5.0, 9.0, 2.0, 4.0]), task) == (pytest.approx(0.3), 30)


def test_bug_reach_and_headline_direction_of_a_lower_is_better_key():
    """Bug: a reach threshold on ``val_ppl`` was read as ``>=``: the first evaluation above the perplexity target
    counted as reaching it (step 10, 50.0 >= 20); the first at or below it does (step 30). The headline metric
    ``test_error`` is minimised (tables' arrow, contrasts' sign); accuracy and F1 stay maximised."""
    task = TaskConfig("t", "digits", "vit-digits", reach={"val_ppl": 20.0})
    assert first_reach(_evals("val_ppl", [50.0, 30.0, 19.5, 10.0]), task) == 30
    assert TaskConfig("t", "digits", "vit-digits", metric="test_error").minimize
    assert TaskConfig("t", "digits", "vit-digits", metric="test_loss").minimize
    assert not TaskConfig("t", "digits", "vit-digits", metric="test_acc").minimize
    assert not TaskConfig("t", "digits", "vit-digits", metric="test_f1").minimize


def test_pins_accuracy_select_and_reach_keep_their_direction():
    """Pins: the keys the bundled tasks log keep their direction (val_acc maximised, val_loss minimised)."""
    acc = TaskConfig("t", "digits", "vit-digits", select_by="val_acc", reach={"val_acc": 0.8})
    assert select_evaluation(_evals("val_acc", [0.5, 0.9, 0.7]), acc) == (pytest.approx(0.2), 20)
    assert first_reach(_evals("val_acc", [0.5, 0.9, 0.7]), acc) == 20
    loss = TaskConfig("t", "digits", "vit-digits", select_by="val_loss")
    assert select_evaluation(_evals("val_loss", [0.5, 0.9, 0.2]), loss) == (pytest.approx(0.3), 30)
