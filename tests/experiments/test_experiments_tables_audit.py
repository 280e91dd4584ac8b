"""Tables and geometry metrics on degenerate inputs (an audit's findings): each once showed a wrong number."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.analysis.metrics import dirichlet_energy, mean_pairwise_cosine, neural_collapse
from diffusionformer.analysis.spectral import effective_rank
from diffusionformer.experiments import gaps
from diffusionformer.experiments.compare import contrasts, table_legend
from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
from diffusionformer.experiments.results import RunResult
from diffusionformer.experiments.tables import aggregate, format_table

OPS = [OperatorSetting("attention"), OperatorSetting("lap", laplacian_heads=1)]


def _run(task, op, seed, value, reach=None):
    return RunResult(task, op, seed, "completed", "test_acc", value, reach_step=reach)


def test_steps_to_a_threshold_on_kfold_tasks_are_nadeau_bengio_corrected():
    task = TaskConfig("cv", "digits", "vit-digits", folds=5, reach={"val_acc": 0.9})
    cfg = ExperimentConfig("x", [task], OPS, seeds=list(range(5)))
    lap, att = [1000, 1200, 900, 1100, 1300], [1100, 1250, 1000, 1300, 1350]
    runs = [_run("cv", "lap", s, 0.8, lap[s]) for s in range(5)] + [_run("cv", "attention", s, 0.8, att[s]) for s in range(5)]
    reach = {c.kind: c for c in contrasts(aggregate(runs), cfg)}["reach"].diff
    d = [a - b for a, b in zip(lap, att)]
    mean = sum(d) / 5
    var = sum((x - mean) ** 2 for x in d) / 4
    t = mean / math.sqrt((1 / 5 + 1 / 4) * var)  # Nadeau & Bengio: (1/n + n_test/n_train) s^2
    assert reach.method == "Nadeau-Bengio" and reach.t == pytest.approx(t, rel=1e-12)


def test_the_legend_says_primary_contrasts_are_adjusted_among_themselves():
    t1 = TaskConfig("a", "digits", "vit-digits")
    with_primary = ExperimentConfig("y", [t1], OPS, seeds=[0, 1], primary=["lap"])
    assert "a primary contrast's over the primary contrasts of that quantity alone" in table_legend(with_primary)
    assert "primary contrast's" not in table_legend(ExperimentConfig("y", [t1], OPS, seeds=[0, 1]))


def test_one_seed_has_no_sample_std_and_a_nan_run_is_counted():
    t1 = TaskConfig("a", "digits", "vit-digits")
    one = format_table(aggregate([_run("a", "attention", 0, 0.8), _run("a", "lap", 0, 0.85)]),
                       ExperimentConfig("z", [t1], OPS, seeds=[0]))
    assert "0.8500 ± n/a" in one and "± 0.0000" not in one
    assert gaps._ms([2.5]) == "2.5000 ± n/a"
    runs = [_run("a", "attention", s, 0.8 + 0.01 * s) for s in range(3)]
    runs += [_run("a", "lap", 0, 0.9), _run("a", "lap", 1, 0.91), _run("a", "lap", 2, float("nan"))]
    table = aggregate(runs)
    lap = next(r for r in table if r["operator"] == "lap")
    assert lap["n"] == 2 and lap["non_finite"] == 1 and lap["seeds"] == [0, 1]
    assert "(1 non-finite)" in format_table(table, ExperimentConfig("w", [t1], OPS, seeds=[0, 1, 2]))


def test_gap_differences_without_spread_get_no_t_and_task_primaries_are_labelled():
    base = {s: {"final_val": 1.0 + 0.1 * s} for s in range(4)}
    shifted = {s: {"final_val": v["final_val"] + 0.05} for s, v in base.items()}
    assert gaps._diff(shifted, base, "final_val") == "+0.0500"  # was: a t of ~1e6 from rounding noise
    cfg = ExperimentConfig("g", [TaskConfig("a", "tinyshakespeare", "gpt-char-tiny", metric="val_loss")], OPS,
                           seeds=[0, 1], primary=["a:lap"])
    row = {s: {"final_val": 1.0, "final_train": 0.5, "final_gap": 0.5, "best_val": 1.0, "best_step": 10,
               "best_gap": 0.5} for s in (0, 1)}
    text = gaps.gap_table(cfg, "unused", rows={"a": {"attention": row, "lap": row}})
    assert "| lap (primary) |" in text


def test_geometry_metrics_refuse_nan_and_half_precision_instead_of_reading_collapse():
    X = torch.randn(2, 4, 3)
    X[0, 1, 0] = float("nan")
    with pytest.raises(ValueError, match="holds NaN or inf"):
        mean_pairwise_cosine(X)
    with pytest.raises(TypeError, match=r"must be float32 or float64, got torch.float16"):
        mean_pairwise_cosine(torch.randn(2, 4, 3).half())
    with pytest.raises(ValueError, match="holds NaN or inf"):  # was 0: "fully collapsed"
        effective_rank(torch.tensor([[float("nan"), 1.0, 1.0]]))
    P = torch.full((1, 3, 3), 1 / 3)
    assert torch.isfinite(dirichlet_energy(torch.randn(1, 3, 2), P)).all()


def test_cosine_treats_tokens_below_eps_as_zero_and_nc1_of_coinciding_means_is_infinite():
    X = torch.tensor([[[1.0, 0.0], [0.05, 0.0], [1.0, 0.0]]])
    # pairs: (0,2) cosine 1, the small token 0 with both: (1 + 1) / (3 * 2)
    assert mean_pairwise_cosine(X, eps=0.1).item() == pytest.approx(2 / 6)
    H = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    assert math.isinf(neural_collapse(H, torch.tensor([0, 0, 1, 1])).nc1)  # was 0, "perfect collapse"
    assert neural_collapse(torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]), torch.tensor([0, 0, 1, 1])).nc1 == 0.0
