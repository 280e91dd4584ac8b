"""Edge-case probes of ``diffusionformer.experiments`` and ``diffusionformer.analysis``.

Probed: experiment configs (misspelt keys and sections, wrong types, seeds given as strings, bools or out of the
seed range, empty lists, duplicate names, bad operator heads), the command line (``--tasks`` with an unknown
name, ``--threads``/``--workers``/``--max-examples`` out of range, ``--out`` naming a file), the run store
(truncated, foreign or non-UTF-8 ``summary.json``/``metrics.jsonl``/``results.json``, completed runs whose
headline metric is NaN), ``publish`` and ``summary`` on such stores, the statistics against scipy (paired t,
Welch, exact Wilcoxon with ties, NaN/inf inputs, one or zero pairs), the analysis metrics on ``T = 1``, one
sequence, strided/expanded inputs and float64 against explicit formulas, capture on models without attention
layers and with numpy-typed limits, layer reports and ``analyze`` on a model that gives NaN tokens, and the
figures with one point, NaN values and malformed inputs.

Found and fixed (tests named ``test_bug_...``):

- ``results``: a completed run whose headline metric was NaN (written ``null`` to ``summary.json``, since strict
  JSON has no NaN) made every later read of the comparison (``run`` resuming, ``status``, ``publish``,
  ``summary``) fail with "metric 'test_acc' is not among the evaluation keys"; it now reads back as NaN (counted
  as non-finite, as on the first pass).
- ``publish``: such a run read back from ``results.json`` lost its "(1 non-finite)" note on the page; and a
  truncated or foreign ``results.json`` made ``publish``/``summary`` fail with a bare JSON or ``RunResult``
  message naming no file.
- ``experiments.plots``: one NaN seed made a setting's mean point of the final-metric figure NaN (not drawn),
  where the table shows the mean of the finite seeds.
- ``stats``: ``wilcoxon_p`` returned a p (0.5) for NaN differences; ``paired_t`` raised a bare
  ``AttributeError: 'float' object has no attribute 'numerator'`` and ``welch_t`` returned NaN for NaN values;
  ``test_train_ratio=inf`` gave an infinite interval with p = 1. All are a ``ValueError`` naming the problem.
- ``analysis``: numpy ints (``np.int64`` from a sweep) were refused as ``k``/``start``/``stop``/``grid_hw``, as
  capture ``layers``/``max_examples``/``drop_prefix`` and as ``num_points``; ``plot_frequency_response`` with a
  list of coefficients raised ``AttributeError: 'list' object has no attribute 'detach'``; ``layer_reports`` on
  NaN tokens said "X holds NaN or inf values" without the layer, and ``analyze`` did not say which run.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from diffusionformer.analysis import (LayerCapture, capture_dataset, energy_top_k, layer_reports,
                                      plot_frequency_response, power_law_exponent, variance_ratio,
                                      within_sequence_variance)
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import finished_runs, run_dir
from diffusionformer.experiments.stats import (nadeau_bengio, paired_difference, paired_t, welch_difference,
                                               welch_t, wilcoxon_p)
from diffusionformer.train.metrics import write_json_atomic


def _config(seeds=(0, 1), operators=("attention",), **task):
    return load_experiment_config({
        "name": "probe", "seeds": list(seeds),
        "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 2}, **task}],
        "operators": [{"name": o} for o in operators],
    })


def _eval(step, **metrics):
    return {"step": step, "split": "eval", "loss": 1.0, "lr": 0.0, "metrics": metrics, "elapsed": 1.0, "time": 0.0}


def _write_runs(out, values, op="attention"):
    """Runs whose ``summary.json`` is written as the Trainer writes it (``write_json_atomic``: NaN -> null)."""
    for seed, value in values.items():
        rdir = run_dir(out, "d", op, seed)
        rdir.mkdir(parents=True, exist_ok=True)
        record = _eval(2, test_acc=value, val_acc=0.5)
        write_json_atomic(rdir / "summary.json", {"status": "completed", "eval": record, "num_parameters": 10,
                                                  "elapsed": 1.0})
        train = {**record, "split": "train", "metrics": {}}
        (rdir / "metrics.jsonl").write_text(json.dumps(train) + "\n" + json.dumps(record) + "\n")


# ----------------------------------------------------------------------------- configs
@pytest.mark.parametrize("mutate,err,match", [
    (lambda c: c.update(seeds=["0", "1"]), TypeError, r"seeds\[0\]: expected an int, got str '0'"),
    (lambda c: c.update(seeds=[True]), TypeError, "expected an int, got bool"),
    (lambda c: c.update(seeds=[]), ValueError, "at least one task, one operator setting and one seed"),
    (lambda c: c.update(task=[]), ValueError, r"unknown key 'task'.*did you mean 'tasks'"),
    (lambda c: c["tasks"][0].update(eval_batch_size="5"), TypeError, r"eval_batch_size: expected int \| None, got str"),
    (lambda c: c["operators"][0].update(laplacian_heads=1.5), TypeError, "laplacian_heads"),
    (lambda c: c["operators"][0].update(name="a\u00a0b"), ValueError, "without whitespace"),
])
def test_a_malformed_config_is_refused_naming_the_key(mutate, err, match):
    raw = {"name": "probe", "seeds": [0], "operators": [{"name": "attention"}],
           "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 2}}]}
    mutate(raw)
    with pytest.raises(err, match=match):
        load_experiment_config(raw)


def test_seeds_outside_the_trainers_range_are_problems_of_the_config_not_of_a_run():
    # refused when the config is read (sitting 58: once per seed, named seeds[i], not once per task and run)
    with pytest.raises(ValueError) as info:
        _config(seeds=(-1, 2**64))
    assert "seeds[0]" in str(info.value) and ">= 0" in str(info.value) and "got -1" in str(info.value)
    assert "seeds[1]" in str(info.value) and "<= 4294967295" in str(info.value)


# ----------------------------------------------------------------------------- the run store
def test_bug_a_completed_run_with_a_nan_metric_reads_back_as_non_finite(tmp_path):
    """Bug: the Trainer writes a NaN metric as null (strict JSON), and reading the run back raised "metric
    'test_acc' is not among the evaluation keys ['val_acc', ...]": every later `run`, `status`, `publish` and
    `summary` of the comparison failed. The run now reads back as NaN and the table counts it as non-finite."""
    from diffusionformer.experiments.tables import aggregate, format_table

    cfg = _config(seeds=(0, 1, 2))
    _write_runs(tmp_path / "probe", {0: float("nan"), 1: 0.5, 2: 0.7})
    runs = finished_runs(tmp_path / "probe", cfg)
    assert [r.seed for r in runs] == [0, 1, 2] and math.isnan(runs[0].value) and math.isnan(runs[0].final["test_acc"])
    (row,) = aggregate(runs)
    assert row["n"] == 2 and row["non_finite"] == 1 and row["mean"] == pytest.approx(0.6)
    assert "2 (1 non-finite)" in format_table([row], cfg)


def test_bug_publish_keeps_the_non_finite_count_of_results_json(tmp_path):
    """Bug: results.json stores a NaN value as null, and publish read it back as None, so the published table said
    "2" seeds where `run`'s said "2 (1 non-finite)": a diverged seed vanished from the page without a word."""
    from diffusionformer.experiments.outputs import write_outputs
    from diffusionformer.experiments.publish import publish_experiment

    cfg = _config(seeds=(0, 1, 2))
    out = tmp_path / "res"
    _write_runs(out / "probe", {0: 0.6, 1: float("nan"), 2: 0.7})
    write_outputs(out / "probe", cfg, finished_runs(out / "probe", cfg))
    assert json.loads((out / "probe" / "results.json").read_text())["runs"][1]["value"] is None  # strict JSON
    with pytest.warns(RuntimeWarning, match="toctree"):
        page = publish_experiment(cfg, out, tmp_path / "docs")
    (line,) = [l for l in page.read_text().splitlines() if l.startswith("| attention")]
    assert "0.6500 ± 0.0707" in line and "2 (1 non-finite)" in line


@pytest.mark.parametrize("text,what", [('{"runs": [{"task": "d", "oper', "JSONDecodeError"),
                                       ("[1, 2]", "TypeError"), ('{"runs": [{"task": "d", "extra": 1}]}', "TypeError")])
def test_bug_a_damaged_results_json_is_named_by_publish_and_summary(tmp_path, capsys, text, what):
    """Bug: a truncated or foreign results.json made `publish` and `summary` print "error: Expecting value: line 1
    column 28" or "RunResult.__init__() got an unexpected keyword argument", naming no file. The error now names
    results.json and says that `run` rewrites it."""
    from diffusionformer.experiments.cli import main

    toml = tmp_path / "probe.toml"
    toml.write_text('name = "probe"\nseeds = [0]\n[[tasks]]\nname = "d"\ndataset = "digits"\nmodel = "vit-digits"\n'
                    '[[operators]]\nname = "attention"\n')
    _write_runs(tmp_path / "res" / "probe", {0: 0.5})
    (tmp_path / "res" / "probe" / "results.json").write_text(text)
    for argv in (["publish", str(toml), "--out", str(tmp_path / "res"), "--to", str(tmp_path / "docs")],
                 ["summary", str(toml), "--out", str(tmp_path / "res")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "results.json is not a results file" in err and what in err and "`run` the comparison again" in err


def test_foreign_and_truncated_run_files_leave_the_run_unfinished(tmp_path):
    """A summary.json that is a JSON list, truncated or not UTF-8 is an unfinished run (not a crash), and a
    truncated last line of metrics.jsonl (a killed run) is skipped."""
    cfg = _config(seeds=(0, 1, 2, 3))
    out = tmp_path / "probe"
    _write_runs(out, {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.8})
    run_dir(out, "d", "attention", 0).joinpath("summary.json").write_text("[1, 2]")
    run_dir(out, "d", "attention", 1).joinpath("summary.json").write_text('{"status": "compl')
    run_dir(out, "d", "attention", 2).joinpath("summary.json").write_bytes(b'{"status": "\xff"}')
    with run_dir(out, "d", "attention", 3).joinpath("metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "spl')
    assert [(r.seed, r.value) for r in finished_runs(out, cfg)] == [(3, 0.8)]
    from diffusionformer.experiments.results import read_curves

    assert [r["split"] for r in read_curves(run_dir(out, "d", "attention", 3))] == ["train", "eval"]


def test_bug_the_final_metric_figure_draws_the_mean_of_the_finite_seeds(tmp_path, stand_in_figure):
    """Bug: plot_experiment averaged every seed's value, a NaN one included, so a setting with one diverged seed got
    a NaN mean (no point drawn) where results.md shows the mean of its finite seeds."""
    from diffusionformer.experiments import plots
    from diffusionformer.experiments.results import RunResult

    class Ax:
        def __init__(self):
            self.errorbars = []

        def errorbar(self, x, y, yerr=None, **kwargs):
            self.errorbars.append((list(x), list(y), list(yerr)))

        def __getattr__(self, name):  # plot, fill_between, scatter, set, legend, ... draw nothing here
            return lambda *args, **kwargs: None

    cfg = _config(seeds=(0, 1, 2))
    figure = stand_in_figure(Ax)
    results = [RunResult("d", "attention", s, "completed", "test_acc", v) for s, v in enumerate([0.6, math.nan, 0.7])]
    plots.plot_experiment(tmp_path, cfg, results)
    ((x, y, yerr),) = figure.made[1].axes[0].errorbars
    assert x == [0] and y == [pytest.approx(0.65)] and yerr == [pytest.approx(float(np.std([0.6, 0.7], ddof=1)))]


# ----------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("n", [2, 5])
def test_paired_and_welch_statistics_match_scipy(n):
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(n)
    a, b = rng.normal(size=n), rng.normal(0.3, 1.0, size=n)
    r, ref = paired_difference(dict(enumerate(a)), dict(enumerate(b))), stats.ttest_rel(a, b)
    ci = ref.confidence_interval()
    assert (r.t, r.p, r.low, r.high) == pytest.approx((ref.statistic, ref.pvalue, ci.low, ci.high), rel=1e-9)
    w, wref = welch_difference(a, b), stats.ttest_ind(a, b, equal_var=False)
    assert (w.t, w.p, w.df) == pytest.approx((wref.statistic, wref.pvalue, wref.df), rel=1e-9)


def test_wilcoxon_with_ties_is_the_exact_permutation_p():
    """Tied |d| get mid-ranks; the p is the exact one over all 2^n sign patterns (counted here by brute force)."""
    import itertools

    d = [1.0, 1.0, 2.0, -2.0, 3.0, 3.0, 3.0, -1.0]
    mags = sorted(abs(x) for x in d)
    rank = {m: (mags.index(m) + 1 + len(mags) - mags[::-1].index(m)) / 2 for m in set(mags)}
    w = sum(rank[abs(x)] for x in d if x > 0)
    stats = [sum(rank[abs(x)] for x, s in zip(d, signs) if s) for signs in itertools.product([0, 1], repeat=len(d))]
    p = 2 * min(sum(s <= w for s in stats), sum(s >= w for s in stats)) / len(stats)
    assert wilcoxon_p(d) == pytest.approx(min(1.0, p), abs=1e-15)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_bug_the_statistics_refuse_non_finite_values(bad):
    """Bug: wilcoxon_p([nan, 1, 2]) returned 0.5 (0.25 with inf), welch_t returned nan, and paired_t raised
    "AttributeError: 'float' object has no attribute 'numerator'" from inside the statistics module."""
    with pytest.raises(ValueError, match="non-finite"):
        wilcoxon_p([bad, 1.0, 2.0])
    with pytest.raises(ValueError, match="non-finite"):
        welch_t([1.0, 2.0, bad], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="non-finite"):
        paired_t({0: 1.0, 1: bad}, {0: 0.0, 1: 0.0})
    with pytest.raises(ValueError, match="positive number"):
        paired_difference({0: 1.0, 1: 2.0, 2: 4.0}, {0: 0.0, 1: 0.0, 2: 0.0}, test_train_ratio=math.inf)


def test_numpy_levels_and_folds_from_a_sweep_are_accepted():
    a, b = {0: 1.0, 1: 2.0, 2: 4.0}, {0: 0.0, 1: 0.5, 2: 0.7}
    assert paired_difference(a, b, level=np.float32(0.75)) == paired_difference(a, b, level=0.75)
    assert nadeau_bengio(a, b, np.int64(3)) == nadeau_bengio(a, b, 3)


# ----------------------------------------------------------------------------- analysis
def test_metrics_of_strided_float64_tokens_match_explicit_formulas():
    X = torch.randn(4, 3, 5, dtype=torch.float64).transpose(1, 2)  # (4, 5, 3), not contiguous
    Xn = X.numpy()
    within = ((Xn - Xn.mean(1, keepdims=True)) ** 2).sum((1, 2)) / 5
    total = ((Xn - Xn.mean((0, 1))) ** 2).sum((1, 2)) / 5
    assert within_sequence_variance(X).numpy() == pytest.approx(within, rel=1e-12)
    assert variance_ratio(X, "pooled").item() == pytest.approx(within.sum() / total.sum(), rel=1e-12)
    one = torch.randn(1, 4, 3).expand(5, 4, 3)  # stride 0 over sequences
    assert torch.equal(within_sequence_variance(one), within_sequence_variance(one[:1]).expand(5))
    assert within_sequence_variance(torch.randn(2, 1, 3)).tolist() == [0.0, 0.0]  # T = 1: no variation


def test_bug_numpy_ints_are_accepted_where_the_analysis_takes_an_int():
    """Bug: np.int64 (a sweep's or numpy's index) was refused: energy_top_k(s, np.int64(2)) said "k must be an
    integer in [1, 3] ... got np.int64(2)", and so did power_law_exponent, pca_token_rgb, capture_dataset
    (layers, max_examples), LayerCapture.drop_prefix and plot_frequency_response(num_points=...)."""
    from diffusionformer.analysis import pca_token_rgb
    from diffusionformer.models import DiffusionViT, ViTConfig

    s = torch.tensor([3.0, 2.0, 1.0, 0.5])
    assert torch.equal(energy_top_k(s, np.int64(2)), energy_top_k(s, 2))
    assert torch.equal(power_law_exponent(s, np.int64(2), np.int64(4)), power_law_exponent(s, 2, 4))
    tokens = torch.randn(1, 4, 5)
    assert torch.equal(pca_token_rgb(tokens, (np.int64(2), np.int64(2))), pca_token_rgb(tokens, (2, 2)))
    torch.manual_seed(0)
    vit = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=8, depth=2, num_heads=2))
    batches = [(torch.randn(3, 1, 8, 8), torch.tensor([0, 1, 2]))]
    cap = capture_dataset(vit, batches, layers=np.int64(1), max_examples=np.int64(2))
    ref = capture_dataset(vit, batches, layers=[1], max_examples=2)
    assert cap.layers == [1] and torch.equal(cap.states[1], ref.states[1])
    assert cap.drop_prefix(np.int64(1)).states[1].shape == (2, 4, 8)
    pytest.importorskip("matplotlib")
    ax = plot_frequency_response({"laplacian": torch.tensor([1.0, -1.0])}, num_points=np.int64(3))
    assert ax.lines[0].get_ydata().tolist() == [2.0, 1.0, 0.0]


def test_bug_plot_frequency_response_names_coefficients_that_are_not_a_tensor():
    """Bug: a list of coefficients raised "AttributeError: 'list' object has no attribute 'detach'"."""
    with pytest.raises(ValueError, match=r"named_coeffs\['heat'\] must be a tensor .* got list"):
        plot_frequency_response({"heat": [0.5, 0.5]})


def test_capture_of_a_model_whose_blocks_have_no_attention():
    """Blocks without attention (an MLP stack) capture their residual stream; asking for attention maps is a
    TypeError naming the block, and a model without blocks is named too."""
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(0)
    model, x = MLP(), torch.randn(2, 3, 4)
    cap = capture_dataset(model, [x])
    with torch.no_grad():
        assert torch.allclose(cap.states[2], model(x)) and torch.allclose(cap.states[1], model.blocks[0](x))
    with pytest.raises(TypeError, match="block 0 is a Linear"):
        capture_dataset(model, [x], attentions=True)
    with pytest.raises(TypeError, match="non-empty nn.ModuleList `model.blocks`"):
        capture_dataset(nn.Linear(4, 4), [x])


def test_bug_layer_reports_and_analyze_name_the_layer_and_the_run_of_nan_tokens(tmp_path, monkeypatch):
    """Bug: a model that gives NaN tokens made layer_reports fail with "X holds NaN or inf values" from a metric,
    naming no layer, and `analyze` of a comparison did not say which of its runs it was."""
    X = torch.randn(2, 3, 4)
    X[1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"capture.states\[1\] \(layer 1\) holds NaN or inf"):
        layer_reports(LayerCapture({0: torch.randn(2, 3, 4), 1: X}))

    from diffusionformer.experiments import analyze

    cfg = _config(seeds=(0,))
    out = tmp_path / "probe"
    _write_runs(out, {0: 0.5})
    rdir = run_dir(out, "d", "attention", 0)
    (rdir / "checkpoint.pt").write_bytes(b"")

    class Run:
        model, step = nn.Linear(1, 1), 2

    def bad_run(*args, **kwargs):
        layer_reports(LayerCapture({0: X}))

    monkeypatch.setattr(analyze, "load_run", lambda path: Run())
    monkeypatch.setattr(analyze, "analyze_run", bad_run)
    with pytest.raises(ValueError, match=rf"^run {rdir}: capture.states\[0\] \(layer 0\) holds NaN"):
        analyze.analyze_experiment(cfg, tmp_path, device="cpu", progress=False, plots=False)


def test_cli_refuses_bad_numbers_and_an_output_that_is_a_file(tmp_path, capsys):
    from diffusionformer.experiments.cli import main

    toml = tmp_path / "probe.toml"
    toml.write_text('name = "probe"\nseeds = [0]\n[[tasks]]\nname = "d"\ndataset = "digits"\nmodel = "vit-digits"\n'
                    '[tasks.train]\nmax_steps = 1\n[[operators]]\nname = "attention"\n')
    (tmp_path / "file").write_text("")
    cases = [(["run", str(toml), "--tasks", "dd", "--no-progress", "--out", str(tmp_path / "r")], "unknown task(s) ['dd']"),
             (["run", str(toml), "--threads", "0", "--out", str(tmp_path / "r")], "--threads: expected a positive int"),
             (["run", str(toml), "--workers", "0", "--out", str(tmp_path / "r")], "--workers: expected an int >= 1"),
             (["run", str(toml), "--no-progress", "--out", str(tmp_path / "file")], "expected the results folder, got the file"),
             (["analyze", str(toml), "--max-examples", "0", "--out", str(tmp_path / "r")], "max_examples must be a positive")]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
