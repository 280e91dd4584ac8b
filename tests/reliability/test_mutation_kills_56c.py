"""Kills of live mutants of sitting 56's new library code (mutation audit 56c: ``git diff 80acb53..`` of
``diffusionformer``): each test fails with one hand-made mutant that the sitting's tests let live, and passes as the
code is."""

from __future__ import annotations

import json
import shlex
import warnings

import pytest
import torch

from diffusionformer.experiments import load_experiment_config, publish_experiment
from diffusionformer.experiments.publish import _load_runs, _warn_unanalysed
from diffusionformer.experiments.results import RunResult, run_dir
from experiments_tiny_configs import FINISHED_OPS, TINY_DIGITS_TOML, finished_study

OPS = FINISHED_OPS
_study = finished_study


def _edit_row(results, index, **changes):
    data = json.loads(results.read_text())
    data["runs"][index].update(changes)
    results.write_text(json.dumps(data))


def _publish(config, out, docs):
    """``publish_experiment`` into ``docs`` with an index whose toctree takes the page; the page's text."""
    docs.mkdir(exist_ok=True)
    (docs / "index.md").write_text("# Results\n\n```{toctree}\n:maxdepth: 1\n\n```\n")
    return publish_experiment(config, out, docs).read_text()


# ---------------------------------------------------------------- publish._listed


def test_the_manifests_count_lists_are_read_as_ints_without_bools(tmp_path):
    """Kills ``_listed`` without ``not isinstance(v, bool)`` (an edited ``true`` was a count: "processes per run:
    True, 1, 2") and ``_listed(manifest, "torch_thread_counts")`` / ``"world_sizes"`` without ``int`` (no count read:
    the Machine line's warning of several thread counts or process counts gone)."""
    out, config, _ = _study(tmp_path)
    manifest = {"git_commit": "abc", "torch": "2.13.0", "cpu_kernels": "AVX512", "world_sizes": [True, 1, 2],
                "torch_thread_counts": [True, 2, 4]}
    (out / "h" / "manifest.json").write_text(json.dumps(manifest))
    page = _publish(config, out, tmp_path / "docs")
    assert "; torch threads: 2, 4 (" in page and "; processes per run: 1, 2 (" in page


# ---------------------------------------------------------------- publish._warn_unanalysed


def _runs(seeds, task="t", status="completed"):
    return [RunResult(task, "op", s, status, "test_acc", 0.5) for s in seeds]


def _analysis(tmp_path, tasks, **extra):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"tasks": tasks, **extra}))
    return path


MEASURED_0_1 = {"t": {"operators": {"op": {"seeds": {"0": {}, "1": {}}}}}}


def test_unanalysed_warning_counts_the_measured_runs_and_names_six_of_seven_left(tmp_path):
    """Kills ``measured {len(left)}`` for ``{len(done) - len(left)}`` (the power-user test has 1 of 2, where both
    read 1) and ``len(left) > 7`` for ``> 6`` (seven runs left: six named, then ", ...")."""
    path = _analysis(tmp_path, MEASURED_0_1)
    with pytest.warns(RuntimeWarning, match="token-geometry analysis") as caught:
        _warn_unanalysed(_runs(range(9)), path, tmp_path)
    text = str(caught[0].message)
    assert "measured 2 of the 9 finished runs" in text
    assert "'t' / 'op' seed 7, ..." in text and "seed 8" not in text and "seed 1," not in text


@pytest.mark.parametrize("case", ["skipped task", "failed runs", "tasks not an object"])
def test_unanalysed_warning_leaves_out_what_the_analysis_cannot_measure(tmp_path, case):
    """Kills dropping ``r.task not in unanalysable`` (a task the analysis skipped: its runs are no omission),
    dropping ``r.status == "completed"`` (a failed run has nothing to analyse) and ``tasks is None`` for
    ``not isinstance(tasks, dict)`` (an edited ``"tasks": []`` failed with "'list' object has no attribute
    'items'")."""
    runs = _runs([0, 1])
    if case == "skipped task":
        path = _analysis(tmp_path, MEASURED_0_1, skipped_tasks={"u": "no attention heads"})
        runs += _runs([0, 1, 2], task="u")
    elif case == "failed runs":
        path = _analysis(tmp_path, MEASURED_0_1)
        runs += _runs([2, 3], status="failed: loss is NaN")
    else:
        path = _analysis(tmp_path, [])
        runs += _runs([2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_unanalysed(runs, path, tmp_path)


def test_unanalysed_warning_reads_skipped_tasks_of_another_type_as_none(tmp_path):
    """Kills ``unanalysable or {}`` for the ``isinstance(..., dict)`` test: an edited ``"skipped_tasks": 5`` failed
    with "argument of type 'int' is not iterable" instead of warning of the run left out."""
    path = _analysis(tmp_path, MEASURED_0_1, skipped_tasks=5)
    with pytest.warns(RuntimeWarning, match=r"measured 2 of the 3 finished runs .*'t' / 'op' seed 2"):
        _warn_unanalysed(_runs([0, 1, 2]), path, tmp_path)


# ---------------------------------------------------------------- publish._load_runs


def test_a_failed_row_of_a_run_folder_without_summary_is_kept(tmp_path):
    """Kills dropping ``r.status == "completed"`` from the retraining filter: a failed run's folder has its
    ``run_config.json`` and no completed summary, like a run being retrained; its failed row is what the page
    reports of it, and was dropped."""
    out, config, results = _study(tmp_path)
    rdir = run_dir(out / "h", "t", "lap", 2)
    (rdir / "summary.json").unlink()
    (rdir / "run_config.json").write_text(json.dumps({"dataset": "digits", "model": "vit-digits"}))
    _edit_row(results, 5, status="failed: loss is NaN", value=None)
    runs = {(r.operator, r.seed): r.status for r in _load_runs(config, out / "h")}
    assert runs[("lap", 2)] == "failed: loss is NaN"


def test_a_completed_row_of_a_finished_run_with_its_run_config_is_kept(tmp_path):
    """Kills ``_retraining`` without ``not _completed(rdir)``: every run folder ``run`` writes has its
    ``run_config.json``; a finished run's row (its parameter count and time) was dropped and read back from the
    folder without them."""
    out, config, _ = _study(tmp_path)
    rdir = run_dir(out / "h", "t", "lap", 2)
    (rdir / "run_config.json").write_text(json.dumps({"dataset": "digits", "model": "vit-digits"}))
    row = next(r for r in _load_runs(config, out / "h") if (r.operator, r.seed) == ("lap", 2))
    assert (row.status, row.value, row.num_parameters, row.elapsed) == ("completed", 0.8, 10, 1.0)


@pytest.mark.parametrize("dropped", ["setting", "seed"])
def test_rows_of_another_metric_outside_the_config_are_left_out_not_refused(tmp_path, dropped):
    """Kills the metric check without ``r.operator in settings and r.seed in seeds``: a row the config does not
    name (a setting or seed dropped from it since) is left out of the page whatever its metric, not refused."""
    out, config, results = _study(tmp_path)
    _edit_row(results, 5, metric="test_loss")  # lap seed 2
    raw = {"name": "h", "seeds": [0, 1, 2] if dropped == "setting" else [0, 1],
           "operators": OPS[:1] if dropped == "setting" else OPS,
           "tasks": [{"name": "t", "dataset": "digits", "model": "vit-digits", "metric": "test_acc",
                      "train": {"max_steps": 4}}]}
    runs = _load_runs(load_experiment_config(raw), out / "h")
    assert ("lap", 2) not in {(r.operator, r.seed) for r in runs}
    assert all(r.metric == "test_acc" for r in runs)


# ---------------------------------------------------------------- results._row_problem


@pytest.mark.parametrize("value", [-1, -0.5])
def test_a_results_row_with_an_elapsed_just_below_zero_is_refused(tmp_path, value):
    """Kills ``v < -1`` for ``v < 0`` (the hostile-results test refuses -3 only)."""
    out, config, results = _study(tmp_path)
    _edit_row(results, 2, elapsed=value)
    with pytest.raises(ValueError, match=rf"run 2 of 'runs': elapsed must be >= 0 or null, got '{value}'"):
        _publish(config, out, tmp_path / "docs")


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_bug_a_results_row_with_a_wall_time_not_finite_is_refused(tmp_path, value):
    """Bug (found by the ``v < 0`` mutants): a ``results.json`` row whose ``elapsed`` was ``Infinity`` or ``NaN``
    (JSON as Python writes it) passed the new ``>= 0`` check and was published as "Training wall time: inf min in
    all" (``nan``), where a ``summary.json``'s ``elapsed`` must be a finite number. Now named as a negative one is."""
    out, config, results = _study(tmp_path)
    _edit_row(results, 2, elapsed=value)
    with pytest.raises(ValueError, match=rf"run 2 of 'runs': elapsed must be finite or null, got '{value}'"):
        _publish(config, out, tmp_path / "docs")


@pytest.mark.parametrize("field", ["num_parameters", "elapsed", "selected_step", "reach_step"])
def test_a_results_row_with_zero_counts_is_read(tmp_path, field):
    """Kills ``v <= 0`` for ``v < 0``: a run stopped at step 0 or timed at 0.0 s is a row, not a damaged file."""
    out, config, results = _study(tmp_path)
    _edit_row(results, 2, **{field: 0})
    row = next(r for r in _load_runs(config, out / "h") if (r.operator, r.seed) == ("attention", 2))
    assert getattr(row, field) == 0


# ---------------------------------------------------------------- operators.heat._euler_table


def test_euler_table_made_under_inference_mode_still_trains():
    """Kills ``_euler_table`` without ``torch.inference_mode(False)``: a first Euler call under inference mode cached
    inference tensors, and every later training step failed ("Inference tensors cannot be saved for backward")."""
    from diffusionformer.operators.heat import heat_coefficients

    steps = 37  # a table no other test builds: made here first
    with torch.inference_mode():
        heat_coefficients(torch.tensor(0.5), steps, "euler")
    t = torch.tensor(0.5, requires_grad=True)
    (heat_coefficients(t, steps, "euler") * torch.arange(steps + 1.0)).sum().backward()
    assert t.grad == pytest.approx(1.0)  # the binomial mean K t / K: its derivative is 1


# ---------------------------------------------------------------- experiments.cli run --precision

TWO_TASKS_TOML = TINY_DIGITS_TOML.replace("[[operators]]", """[[tasks]]
name = "digits.2"
dataset = "digits"
model = "vit-digits"
model_overrides = {dim = 8, depth = 1, num_heads = 2}
[tasks.train]
max_steps = 2
batch_size = 8
warmup_steps = 0
eval_interval = 2
[[operators]]""", 1)


def test_run_precisions_status_command_sets_the_amp_of_every_task(tmp_path, monkeypatch, capsys):
    """Kills the status command's ``--set tasks.NAME.train.amp`` for the first task only: the second task's runs read
    as "made with another train" (a task name with a dot, quoted as a TOML key)."""
    from diffusionformer.experiments.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "two.toml").write_text(TWO_TASKS_TOML)
    run = ["run", "two.toml", "--no-progress", "--out", "res", "--precision", "bf16", "--threads", "1"]
    assert main([*run, "--set", "operators=attention"]) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if "from another shell: " in x)
    argv = shlex.split(line.split("from another shell: ")[1])[3:]
    assert "tasks.digits.train.amp=\"bf16\"" in argv and "tasks.\"digits.2\".train.amp=\"bf16\"" in argv
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 of 2 runs completed") and "another train" not in out


# ---------------------------------------------------------------- nn.attention fixed rows on a meta base


def test_meta_cache_of_a_non_polynomial_operator_is_not_refused():
    """Kills the fixed rows' meta check without ``op.is_polynomial``: a non-polynomial operator's coefficients are
    never read (its rows are zeros), so a cache of it left on meta by ``functional_call`` of a meta base is no
    reason to refuse the call; a user's subclass of heat that runs as ``matrix_exp`` keeps heat's ``_c`` cache."""
    from torch.func import functional_call

    from diffusionformer.nn import DiffusionAttention
    from diffusionformer.operators import HeatOperator

    class _MatrixHeat(HeatOperator):
        is_polynomial = False

        def apply_matrix(self, P, v):
            return torch.matrix_exp(P) @ v

    def make():
        return DiffusionAttention(16, 4, heads=[_MatrixHeat(), _MatrixHeat(), "polynomial(steps=2)",
                                                "polynomial(steps=2)"]).double()

    torch.manual_seed(0)
    layer, base = make(), make().to("meta")
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    assert torch.allclose(functional_call(base, layer.state_dict(), (x,)), layer(x))


# ---------------------------------------------------------------- operators.base._Pow, _powers


def test_third_derivative_of_the_powers_at_zero_by_plain_autograd():
    """Kills ``_Pow.backward`` differentiable only under torch.func transforms: a ``create_graph=True`` backward ran
    plain ``pow``, whose own derivatives are NaN at 0 from the third on (``6`` for ``x^0 + .. + x^4``)."""
    from diffusionformer.operators.base import _powers

    x = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    y = _powers(x, torch.arange(5, dtype=torch.float64)).sum()
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    (gg,) = torch.autograd.grad(g, x, create_graph=True)
    (ggg,) = torch.autograd.grad(gg, x)
    assert (g.item(), gg.item(), ggg.item()) == (1.0, 2.0, 6.0)


def test_third_derivative_of_the_powers_at_zero_through_one_forward_level():
    """Kills ``_nested_forward_ad`` counting one forward level as nested (``> 0`` for ``> 1``): ``jacfwd`` of a
    reverse-over-reverse took torch's ``pow``, whose derivatives at 0 are NaN from the third on."""
    from torch.func import jacfwd, jacrev

    from diffusionformer.operators.base import _powers

    k = torch.arange(5, dtype=torch.float64)
    x = torch.tensor(0.0, dtype=torch.float64)
    assert jacfwd(jacrev(jacrev(lambda z: _powers(z, k).sum())))(x).item() == 6.0
