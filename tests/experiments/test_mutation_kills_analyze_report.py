"""Tests written by a second mutation-testing audit of the study analysis (``experiments/analyze.py``:
finding runs on disk and its errors, argument checks, the per-run cache, the per-seed records and
their summary, the README tables, the figure helpers, the ``analyze`` command line) and of the
token-geometry report (``analysis/report.py``: padded and empty sequences, the thresholds below
which a metric is ``None``, the metric registry, float64 and the probe seed).
Each kills a mutant that the existing suite let through, checked against an independent reference:
hand-computed values and strings, numpy, files written by hand, and a study whose runs are
fabricated on disk (a stand-in ``load_run``/``analyze_run`` that return hand-written results).
Each docstring names the mutant it kills (file: mutation)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from diffusionformer.analysis import LayerCapture, layer_reports
from diffusionformer.analysis import report as R
from diffusionformer.analysis.metrics import linear_probe_accuracy
from diffusionformer.experiments import analyze as A
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import run_dir

TRAIN = {"max_steps": 4, "batch_size": 16, "eval_interval": 4, "checkpoint_interval": 4, "warmup_steps": 0}


# ----------------------------------------------------------------------------- a study fabricated on disk
def _config(seeds: tuple[int, ...] = (0, 1), operators: tuple[str, ...] = ("attention", "laplacian")) -> Any:
    return load_experiment_config({
        "name": "fake", "seeds": list(seeds),
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 16, "depth": 2, "num_heads": 2}, "train": TRAIN}],
        "operators": [{"name": o, **({"laplacian_heads": 1} if o == "laplacian" else {})} for o in operators],
    })


def _finish(out: Path, op: str, seed: int, *, summary: str | None = '{"status": "completed"}',
            checkpoint: bool = True) -> Path:
    """A run directory written by hand: a summary (text as given) and a checkpoint file."""
    rdir = run_dir(out / "fake", "digits", op, seed)
    rdir.mkdir(parents=True, exist_ok=True)
    if summary is not None:
        (rdir / "summary.json").write_text(summary)
    if checkpoint:
        (rdir / "checkpoint.pt").write_bytes(b"weights")
    return rdir


class _Tagged(torch.nn.Module):
    def __init__(self, rdir: Path) -> None:
        super().__init__()
        self.rdir = Path(rdir)


def _result(op: str, seed: int, split: str) -> dict[str, Any]:
    """What the stand-in ``analyze_run`` measures for one run: hand-written numbers."""
    layers = [{"layer": 0, "within_variance": 1.0 + seed, "nc1": 2.0},
              {"layer": 1, "within_variance": 0.5 + seed, "nc1": 1.0 + seed}]
    return {"layers": layers, "spectra": [[4.0, 2.0, 1.0], [3.0, 1.0, 0.5]], "coefficients": [[[0.0, 1.0]]],
            "pca_rgb": torch.full((1, 3, 2, 2), float(seed)),
            "info": {"accuracy": 0.25 * (seed + 1), "loss": 2.0 + seed, "num_examples": 8, "split": split}}


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A finished 2 settings x 2 seeds study on disk; measuring a run is recorded in ``calls``, plots in ``plots``."""
    config = _config()
    for op in ("attention", "laplacian"):
        for seed in (0, 1):
            _finish(tmp_path, op, seed)
    calls: list[tuple[str, int, str, int]] = []
    plots: dict[str, Any] = {}

    def analyze_run(model: _Tagged, data: Any, *, split: str, max_examples: int, max_attention_examples: int,
                    batch_size: int, device: Any) -> dict[str, Any]:
        op, seed = model.rdir.parent.name, int(model.rdir.name[len("seed"):])
        calls.append((op, seed, split, max_attention_examples))
        return _result(op, seed, split)

    def write_plots(pdir: Path, result: Any, spectra: Any, pca: Any, images: Any) -> list[Path]:
        plots.update(pca=pca, images=images)
        return []

    monkeypatch.setattr(A, "load_run", lambda rdir: SimpleNamespace(model=_Tagged(rdir), step=4))
    monkeypatch.setattr(A, "analyze_run", analyze_run)
    monkeypatch.setattr(A, "_write_plots", write_plots)
    return SimpleNamespace(config=config, out=tmp_path, calls=calls, plots=plots)


def _analyze(f: SimpleNamespace, **kwargs: Any) -> dict[str, Any]:
    return A.analyze_experiment(f.config, f.out, progress=False, device="cpu", **kwargs)


# ----------------------------------------------------------------------------- analyze.py: runs on disk
def test_a_run_with_an_unreadable_summary_is_skipped_as_unfinished(fake: SimpleNamespace) -> None:
    """Kills analyze.py A1 (``_run_state`` re-raising the ``JSONDecodeError`` of a half-written
    ``summary.json`` instead of treating the run as not finished)."""
    rdir = _finish(fake.out, "laplacian", 1, summary='{"status": "compl')  # cut short by a crash
    with pytest.warns(RuntimeWarning, match=r"laplacian.seed1 is not finished"):
        result = _analyze(fake, plots=False)
    assert result["skipped_runs"] == [str(rdir)]
    assert sorted(result["tasks"]["digits"]["operators"]["laplacian"]["seeds"]) == ["0"]


@pytest.mark.parametrize("summary", [b"[]", b'"completed"', b'{"status": "completed\xff"}'], ids=["list", "string", "latin1"])
def test_bug_a_summary_that_is_not_a_json_object_or_not_utf8_is_an_unfinished_run(fake: SimpleNamespace,
                                                                                     summary: bytes) -> None:
    """Bug: ``_run_state`` called ``.get`` on whatever ``summary.json`` held, so a summary that is valid JSON
    but not an object (``[]``) crashed the analysis with an AttributeError, and one that is not UTF-8 with a
    UnicodeDecodeError naming no file. Both now count as an unfinished run, as a half-written one does."""
    rdir = _finish(fake.out, "laplacian", 1, summary=None)
    (rdir / "summary.json").write_bytes(summary)
    with pytest.warns(RuntimeWarning, match=r"laplacian.seed1 is not finished"):
        result = _analyze(fake, plots=False)
    assert result["skipped_runs"] == [str(rdir)]


def test_a_completed_run_without_its_checkpoint_says_to_rerun_with_restart(tmp_path: Path) -> None:
    """Kills analyze.py A3 (the hint of a completed run whose checkpoint is gone loses its
    ``again with --restart``: re-running without it would skip the completed run)."""
    for op in ("attention", "laplacian"):
        for seed in (0, 1):
            _finish(tmp_path, op, seed, checkpoint=(op, seed) != ("attention", 1))
    with pytest.raises(FileNotFoundError, match=r"attention.seed1.checkpoint\.pt is missing; run `python -m "
                       r"diffusionformer\.experiments run CONFIG` again with --restart \(with the same config"):
        A.analyze_experiment(_config(), tmp_path, progress=False)


@pytest.mark.parametrize("n_missing", [5, 6])
def test_the_missing_runs_message_shows_five_paths_and_counts_the_rest(tmp_path: Path, n_missing: int) -> None:
    """Kills analyze.py A8 (four paths shown, not five) and A9 (`` and 0 more`` when exactly five are missing)."""
    config = _config(seeds=tuple(range(n_missing + 1)), operators=("attention",))
    _finish(tmp_path, "attention", 0)
    with pytest.raises(FileNotFoundError) as info:
        A.analyze_experiment(config, tmp_path, progress=False)
    msg = str(info.value)
    assert msg.startswith(f"{n_missing} run(s) of 'fake' have no checkpoint: ")
    shown = [str(run_dir(tmp_path / "fake", "digits", "attention", s) / "checkpoint.pt") for s in range(1, 6)]
    assert ", ".join(shown) in msg and msg.count("checkpoint.pt") == 5
    assert ("and 1 more;" in msg) == (n_missing == 6) and "and 0 more" not in msg


def test_partial_with_no_run_finished_still_refuses(tmp_path: Path) -> None:
    """Kills analyze.py A11 (no error when ``partial`` leaves no finished run: an empty analysis is written)."""
    (tmp_path / "fake" / "runs").mkdir(parents=True)
    with pytest.warns(RuntimeWarning, match=r"4 run\(s\) of 'fake' not trained yet; analysing the 0 finished"):
        with pytest.raises(FileNotFoundError, match=r"no finished run of 'fake' under .*runs to analyse"):
            A.analyze_experiment(_config(), tmp_path, progress=False, partial=True)
    assert not (tmp_path / "fake" / "analysis").exists()


# ----------------------------------------------------------------------------- analyze.py: arguments
def test_analyze_experiment_checks_its_arguments_before_reading_runs(tmp_path: Path) -> None:
    """Kills analyze.py A13 (``split="train"`` accepted: the model would be analysed on its training
    data), A14 (``max_examples=True`` taken as 1), A15 (``max_examples=0`` accepted) and A16 (a dict
    config dies in an ``AttributeError`` instead of the ``TypeError`` naming ``load_experiment_config``)."""
    config = _config()
    with pytest.raises(ValueError, match=r"split must be 'test' or 'val', got 'train'"):
        A.analyze_experiment(config, tmp_path, split="train")
    for bad in (True, 0, -3, 2.0):
        with pytest.raises(ValueError, match=rf"max_examples must be a positive int, got {bad!r}"):
            A.analyze_experiment(config, tmp_path, max_examples=bad)
    for bad in (True, -1, 1.5):  # was checked only by capture_dataset, after the first model was loaded
        with pytest.raises(ValueError, match=rf"max_attention_examples must be a non-negative int, got {bad!r}"):
            A.analyze_experiment(config, tmp_path, max_attention_examples=bad)
    with pytest.raises(TypeError, match=r"config must be an ExperimentConfig \(load_experiment_config\), got dict"):
        A.analyze_experiment({"name": "fake"}, tmp_path)  # type: ignore[arg-type]
    assert not (tmp_path / "fake").exists()


def test_cli_passes_partial_data_root_and_device_to_the_analysis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kills cli.py C1 (``--partial`` dropped: the command refuses a comparison still being run) and
    C2 (``--data-root`` dropped)."""
    from diffusionformer.experiments.cli import main

    seen: dict[str, Any] = {}
    monkeypatch.setattr(A, "analyze_experiment", lambda config, out, **kw: seen.update(name=config.name, out=out, **kw))
    toml = tmp_path / "fake.toml"
    toml.write_text('name = "fake"\nseeds = [0]\n[[tasks]]\nname = "digits"\ndataset = "digits"\nmodel = "vit-digits"\n'
                    '[[operators]]\nname = "attention"\n')
    argv = ["analyze", str(toml), "--out", str(tmp_path), "--data-root", str(tmp_path / "data"), "--max-examples", "7",
            "--device", "cpu", "--no-progress", "--threads", str(torch.get_num_threads())]
    assert main([*argv, "--partial"]) == 0
    assert seen == {"name": "fake", "out": str(tmp_path), "data_root": str(tmp_path / "data"), "max_examples": 7,
                    "device": "cpu", "progress": False, "partial": True}
    assert main(argv) == 0 and seen["partial"] is False


# ----------------------------------------------------------------------------- analyze.py: per-run records and cache
def test_each_seed_records_the_last_layers_spectrum_and_its_own_heldout_accuracy(fake: SimpleNamespace) -> None:
    """Kills analyze.py A20 (``singular_values_last_layer`` is the embeddings' spectrum) and A19 (the
    held-out accuracy and loss read with ``get``: they also land in the task's entry, where the
    last seed's value would pass for the task's)."""
    for _ in range(2):  # measured, then read back from each run's cache
        task = _analyze(fake, plots=False)["tasks"]["digits"]
        assert "accuracy" not in task and "loss" not in task and task["num_examples"] == 8
        for op in ("attention", "laplacian"):
            for seed in (0, 1):
                rec = task["operators"][op]["seeds"][str(seed)]
                assert rec["singular_values_last_layer"] == [3.0, 1.0, 0.5]
                assert rec["heldout_accuracy"] == 0.25 * (seed + 1) and rec["heldout_loss"] == 2.0 + seed
    assert len(fake.calls) == 4


def test_the_cache_is_keyed_by_split_and_attention_examples(fake: SimpleNamespace) -> None:
    """Kills analyze.py A17 (``max_attention_examples`` left out of the cache key) and A18 (``split``
    left out): another setting would silently read the measurements of the old one."""
    _analyze(fake, plots=False)
    _analyze(fake, plots=False)
    assert len(fake.calls) == 4  # the second analysis reads every run's cache
    _analyze(fake, plots=False, max_attention_examples=8)
    assert [c[3] for c in fake.calls[4:]] == [8] * 4
    # each run caches its last analysis only: this one differs from it in the split alone
    result = _analyze(fake, plots=False, split="val", max_attention_examples=8)
    assert [c[2] for c in fake.calls[8:]] == ["val"] * 4 and result["tasks"]["digits"]["split"] == "val"


def test_the_summary_is_over_every_seed_and_the_pca_maps_are_of_the_first(fake: SimpleNamespace) -> None:
    """Kills analyze.py A55 (``_summary`` over the first seed only) and A61 (the PCA maps of a setting
    replaced by those of its last seed instead of kept from the first)."""
    result = _analyze(fake)
    summary = result["tasks"]["digits"]["operators"]["laplacian"]["summary"]
    assert summary[1]["within_variance"] == {"mean": 1.0, "std": pytest.approx(math.sqrt(0.5), rel=1e-12), "n": 2}
    assert summary[0]["nc1"] == {"mean": 2.0, "std": 0.0, "n": 2}
    pca = fake.plots["pca"]["digits"]
    assert sorted(pca) == ["attention", "laplacian"]
    assert all(torch.equal(t, torch.zeros(1, 3, 2, 2)) for t in pca.values())  # seed 0's maps
    assert fake.plots["images"]["digits"].shape[0] == 4


def test_without_matplotlib_the_plots_are_skipped_with_a_warning(fake: SimpleNamespace,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Kills analyze.py A22 (the ``ImportError`` of missing matplotlib not caught: the analysis dies
    after measuring every run)."""
    def no_matplotlib(*args: Any) -> None:
        raise ImportError('plots need matplotlib: pip install "diffusionformer[plot]"')

    monkeypatch.setattr(A, "_write_plots", no_matplotlib)
    with pytest.warns(RuntimeWarning, match=r"analysis plots skipped: plots need matplotlib"):
        result = _analyze(fake)
    adir = fake.out / "fake" / "analysis"
    assert json.loads((adir / "metrics.json").read_text()) == result
    assert (adir / "README.md").read_text().startswith("# Token geometry: fake")


def test_a_cache_that_is_not_a_dict_is_measured_again(tmp_path: Path) -> None:
    """Kills analyze.py A23 (``_cached`` calling ``.get`` on whatever the file holds: a cache saved
    as a list dies in an ``AttributeError`` instead of being measured again)."""
    path = tmp_path / "analysis_cache.pt"
    torch.save([{"key": {"version": 2}}, {"result": 1}], path)
    assert A._cached(path, {"version": 2}) is None
    torch.save({"key": {"version": 2}, "result": {"layers": []}}, path)
    assert A._cached(path, {"version": 2}) == {"layers": []} and A._cached(path, {"version": 3}) is None


def test_a_failed_cache_write_keeps_the_previous_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kills analyze.py A26 (``_store`` writes the cache in place, not to a temporary file then
    renamed: a crash mid-write leaves a truncated cache)."""
    path = tmp_path / "analysis_cache.pt"
    A._store(path, {"v": 1}, {"layers": [1.0]})
    real_save = torch.save

    def crash(obj: Any, f: Any) -> None:
        Path(f).write_bytes(b"PK\x03\x04 half")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        A._store(path, {"v": 2}, {"layers": [2.0]})
    monkeypatch.setattr(torch, "save", real_save)
    assert A._cached(path, {"v": 1}) == {"layers": [1.0]}


# ----------------------------------------------------------------------------- analyze.py: numbers in the README
def test_fmt_writes_missing_and_non_finite_values_as_na() -> None:
    """Kills analyze.py A28 (``_fmt`` writing ``nan``/``inf`` instead of ``n/a``)."""
    assert [A._fmt(x) for x in (None, math.nan, math.inf, -math.inf)] == ["n/a"] * 4
    assert A._fmt(0.000123456) == "0.0001235" and A._fmt(123456.0) == "1.235e+05" and A._fmt(2.0) == "2"


def test_last_layer_values_skip_missing_and_non_finite_seeds() -> None:
    """Kills analyze.py A30 (a NaN of one seed kept: the cell's mean and std become ``nan``)."""
    op = {"seeds": {str(i): {"layers": [{"x": 9.0}, {"x": v}]} for i, v in enumerate([1.0, math.nan, None, 3, math.inf])}}
    assert A._last_layer_values(op, "x") == [1.0, 3.0]
    assert A._cell(A._last_layer_values(op, "x"), None) == "2 ± 1.4"


def test_cell_mean_sample_std_and_signed_welch_t() -> None:
    """Kills analyze.py A32 (no value: ``fmean([])`` raises instead of ``n/a``), A33 (std with 3
    significant digits), A34 (population std), A35 (t without its sign) and A36 (t of the
    first setting minus this one)."""
    assert A._cell([], [1.0, 2.0]) == "n/a"
    # mean 7/3; sample std sqrt(7/3) = 1.53 (population: 1.25)
    assert A._cell([1.0, 2.0, 4.0], None) == "2.333 ± 1.5"
    # Welch: (4 - 1) / sqrt(1/3 + 1/3) = 3.674
    assert A._cell([3.0, 4.0, 5.0], [0.0, 1.0, 2.0]) == "4 ± 1 (+3.7)"
    assert A._cell([0.0, 1.0, 2.0], [3.0, 4.0, 5.0]) == "1 ± 1 (-3.7)"
    assert A._cell([3.0], [0.0, 1.0, 2.0]) == "3 ± n/a"  # one seed: no std, no t


def _seed(l0: Any, last: dict[str, Any]) -> dict[str, Any]:
    return {"layers": [{"layer": 0, **{k: 1.0 for k in last}, "within_variance": l0}, {"layer": 1, **last}]}


def _table(operators: dict[str, Any]) -> list[str]:
    result = {"experiment": "e", "split": "test", "max_examples": 4,
              "tasks": {"t": {"dataset": "d", "model": "m", "operators": operators}}}
    return A._markdown(result).splitlines()


def test_readme_rows_compare_each_setting_against_the_first_one() -> None:
    """Kills analyze.py A40 (no Welch t at all), A41 (t of a setting against itself), A43 (the last
    setting taken as the baseline), A42 (a separator row one column short) and A44 (a seed without
    the embeddings' value breaks the table with a ``TypeError``)."""
    base = {"0": _seed(1.0, {"within_variance": 0.0, "nc1": 1.0}), "1": _seed(3.0, {"within_variance": 1.0, "nc1": 2.0}),
            "2": _seed(None, {"within_variance": 2.0, "nc1": 3.0})}
    other = {"0": _seed(2.0, {"within_variance": 3.0, "nc1": 1.0}), "1": _seed(2.0, {"within_variance": 4.0, "nc1": 2.0}),
             "2": _seed(2.0, {"within_variance": 5.0, "nc1": 3.0})}
    lines = _table({"attention": {"seeds": base}, "diffusion": {"seeds": other}})
    header = next(i for i, line in enumerate(lines) if line.startswith("| operator"))
    assert lines[header] == ("| operator | within-var L0 | within-var L | Dirichlet (complete) L | Dirichlet (attention) L "
                             "| eff. rank L | nc1 L |")
    assert lines[header + 1] == "|---|---|---|---|---|---|---|"
    assert lines[header + 1].count("|") == lines[header].count("|")
    assert lines[header + 2] == "| attention | 2 ± 1.4 | 1 ± 1 | n/a | n/a | n/a | 2 ± 1 |"
    # within-var: (4 - 1) / sqrt(1/3 + 1/3) = +3.7; nc1 equal in both settings: t = 0
    assert lines[header + 3] == "| diffusion | 2 ± 0 | 4 ± 1 (+3.7) | n/a | n/a | n/a | 2 ± 1 (+0.0) |"


def test_bug_a_non_finite_embedding_value_of_one_seed_does_not_break_the_readme() -> None:
    """Bug: the README's layer-0 column averaged every seed's value, non-finite ones included (the
    last-layer columns drop them): one NaN made ``statistics.stdev`` raise ``AttributeError`` after
    every run had been measured, and no README was written; an inf gave ``inf ± nan``. Also kills
    analyze.py A44 (the layer-0 values without their type check: a seed without the value raises)."""
    seeds = {"0": _seed(math.nan, {"within_variance": 1.0}), "1": _seed(2.0, {"within_variance": 2.0}),
             "2": _seed(4.0, {"within_variance": 3.0}), "3": _seed(math.inf, {"within_variance": 4.0}),
             "4": _seed(None, {"within_variance": 5.0})}
    row = next(line for line in _table({"a": {"seeds": seeds}}) if line.startswith("| a |"))
    assert row.startswith("| a | 3 ± 1.4 | 3 ± 1.6 |")  # L0: seeds 1 and 2 only; L: all five


def test_readme_label_column_appears_when_any_seed_has_it() -> None:
    """Kills analyze.py A39 (a label metric gets its column only when every seed has it) and A38
    (unlabelled runs fall back to the first label column, ``nc1``, instead of the last, ``token_nc1``)."""
    seeds = {"0": _seed(1.0, {"within_variance": 1.0, "nc1": 0.5}), "1": _seed(1.0, {"within_variance": 1.0})}
    header = next(line for line in _table({"a": {"seeds": seeds}}) if line.startswith("| operator"))
    assert header.endswith("| eff. rank L | nc1 L |")
    unlabelled = {"0": _seed(1.0, {"within_variance": 1.0})}
    lines = _table({"a": {"seeds": unlabelled}})
    assert next(line for line in lines if line.startswith("| operator")).endswith("| eff. rank L | token_nc1 L |")
    assert next(line for line in lines if line.startswith("| a |")).endswith("| n/a | n/a |")


def test_learned_parameter_rows_are_sorted_by_parameter_then_block() -> None:
    """Kills analyze.py A46 (rows in the order the parameters were recorded, not by parameter and block)."""
    learned = {"blocks.1.attn.operators.0.t": [2.0, 4.0], "blocks.10.attn.operators.0.t": [1.0, 1.0],
               "blocks.0.attn.operators.0.t": [1.0, 3.0], "blocks.0.attn.operators.0.alpha_logit": [0.0, 0.0]}
    rows = [r for r in A._learned_markdown({"operators": {"ppr": {"seeds": {"0": {"learned_operators": learned}}}}})
            if r.startswith("| ppr |")]
    assert rows == ["| ppr | alpha | 0 | 0.500 [0.500, 0.500] | 2 |", "| ppr | t | 0 | 2.000 [1.000, 3.000] | 2 |",
                    "| ppr | t | 1 | 3.000 [2.000, 4.000] | 2 |", "| ppr | t | 10 | 1.000 [1.000, 1.000] | 2 |"]


def test_summary_counts_only_finite_values_and_has_no_mean_without_any() -> None:
    """Kills analyze.py A49 (NaN/inf seeds averaged in), A50 (``n`` counts every seed, not the finite
    ones) and A51 (a mean of 0.0 instead of ``None`` where no seed has a value)."""
    per_seed = [[{"layer": 0, "x": 1.0, "y": None}], [{"layer": 0, "x": math.nan, "y": math.inf}],
                [{"layer": 0, "x": 4.0, "y": None}]]
    (row,) = A._summary(per_seed)
    assert row == {"layer": 0, "x": {"mean": 2.5, "std": pytest.approx(statistics.stdev([1.0, 4.0])), "n": 2},
                   "y": {"mean": None, "std": None, "n": 0}}


def test_bug_summary_matches_seeds_by_layer_and_does_not_cut_them_to_the_shortest() -> None:
    """Bug: ``_summary`` zipped the seeds' layer lists, so a seed with fewer layers (or a layer missing from
    its analysis) silently cut every seed to the shortest list, and a metric only a later seed had was dropped.
    Rows are now matched on ``layer``; a seed without a layer or a metric lowers that entry's ``n``."""
    per_seed = [[{"layer": 0, "x": 1.0}, {"layer": 1, "x": 2.0}, {"layer": 2, "x": 5.0}],
                [{"layer": 1, "x": 4.0, "z": 7.0}, {"layer": 0, "x": 3.0}]]
    rows = A._summary(per_seed)
    assert [r["layer"] for r in rows] == [0, 1, 2]
    assert rows[0]["x"] == {"mean": 2.0, "std": pytest.approx(statistics.stdev([1.0, 3.0])), "n": 2}
    assert rows[1] == {"layer": 1, "x": {"mean": 3.0, "std": pytest.approx(statistics.stdev([2.0, 4.0])), "n": 2},
                       "z": {"mean": 7.0, "std": 0.0, "n": 1}}
    assert rows[2] == {"layer": 2, "x": {"mean": 5.0, "std": 0.0, "n": 1}}


def test_means_for_plotting_turn_missing_values_into_nan() -> None:
    """Kills analyze.py A53 (a ``None`` mean passed on to the plot instead of NaN)."""
    summary = [{"x": {"mean": 1.0, "std": 0.5}}, {"x": {"mean": None, "std": None}}, {"y": {"mean": 2.0, "std": 0.0}}]
    mean, std = A._means(summary, "x")
    assert mean[0] == 1.0 and std[0] == 0.5
    assert all(isinstance(v, float) and math.isnan(v) for v in (*mean[1:], *std[1:]))


# ----------------------------------------------------------------------------- analyze.py: figure helpers
def test_panels_are_in_panel_order() -> None:
    """Kills analyze.py A56 (panels in registration order, not by their ``panel`` index)."""
    assert [p[0] for p in A._panels("smoothing")] == ["within_variance", "variance_ratio", "dirichlet_complete",
                                                      "dirichlet_attention", "mean_cosine", "rank_collapse_svd"]
    assert [p[0] for p in A._panels("sequence_label")] == ["nc1", "nc2_etf_distance", "nc4_agreement", "seq_probe_acc",
                                                           "anova_between_class_fraction", "anova_within_fraction"]
    assert A._panels("smoothing")[0] == ("within_variance", "within-sequence variance", True)


def test_grid_hides_unused_axes_and_empty_panels() -> None:
    """Kills analyze.py A57 (the unused cells of the last row drawn as empty axes) and A58 (a metric
    no run has, all NaN, drawn as an empty panel with a legend instead of hidden)."""
    pytest.importorskip("matplotlib")
    summary = [{"layer": l, "a": {"mean": 1.0 / (l + 1), "std": 0.1}, "b": {"mean": None, "std": None}} for l in range(3)]
    task = {"operators": {"attention": {"summary": summary}}}
    panels = [("a", "A", False), ("b", "B", False), ("a", "A again", True), ("a", "A3", False)]
    fig = A._grid(panels, task, "t")
    assert len(fig.axes) == 6  # 2 rows of 3
    assert [ax.get_visible() for ax in fig.axes] == [True, False, True, True, False, False]
    line = fig.axes[0].lines[0]
    assert list(line.get_ydata()) == pytest.approx([1.0, 0.5, 1.0 / 3])


# ----------------------------------------------------------------------------- report.py
def test_an_empty_sequence_is_left_out_of_the_per_sequence_metrics() -> None:
    """Kills report.py R24 (the mean of an empty sequence is 0/0: NaN Neural Collapse)."""
    X = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]], [[1.0, 1.0], [3.0, 1.0], [7.0, 7.0]],
                      [[5.0, 5.0], [5.0, 5.0], [5.0, 5.0]]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False], [False, False, False]])
    m = layer_reports(LayerCapture({0: X * mask.unsqueeze(-1)}, mask=mask, labels=torch.tensor([0, 1, 0])))[0].metrics
    # within-sequence variance: seq 0 around (1, 1): (1 + 1 + 2) / 3 = 4/3; seq 1 around (2, 1): (1 + 1) / 2 = 1
    assert m["within_variance"] == pytest.approx((4 / 3 + 1.0) / 2, rel=1e-12)
    assert all(math.isfinite(m[k]) for k in ("nc1", "nc2_equinorm", "variance_ratio", "effective_rank"))


def test_bug_an_empty_sequence_is_no_point_of_neural_collapse_or_the_sequence_probe() -> None:
    """Bug: the mean of a sequence without real tokens (an empty graph in a padded batch) was the zero vector,
    and it counted as a point of its class in NC1/NC2/NC4 and as an example of the sequence probe. The
    reference is the same capture with the empty sequence removed: every sequence-label metric must agree."""
    gen = torch.Generator().manual_seed(0)
    B, T, D = 9, 4, 3
    X = torch.randn(B, T, D, generator=gen, dtype=torch.float64) + torch.arange(B).remainder(2).view(B, 1, 1) * 3.0
    lengths = torch.tensor([4, 3, 0, 2, 4, 1, 3, 4, 2])
    mask = torch.arange(T) < lengths.unsqueeze(1)
    X = X * mask.unsqueeze(-1)
    labels = torch.arange(B).remainder(2)
    predictions = torch.tensor([0, 1, 1, 1, 0, 0, 0, 1, 0])
    keep = lengths > 0
    got = layer_reports(LayerCapture({0: X}, mask=mask, labels=labels), predictions=predictions)[0].metrics
    ref = layer_reports(LayerCapture({0: X[keep]}, mask=mask[keep], labels=labels[keep]),
                        predictions=predictions[keep])[0].metrics
    keys = ("nc1", "nc2_equinorm", "nc2_equiangularity", "nc2_etf_distance", "nc4_agreement", "seq_probe_acc")
    assert all(ref[k] is not None for k in keys)
    assert {k: got[k] for k in keys} == pytest.approx({k: ref[k] for k in keys}, rel=1e-12, abs=1e-12)


def test_mean_cosine_averages_the_sequences_of_at_least_two_tokens() -> None:
    """Kills report.py R2 (sequences of exactly two tokens left out), R15 (single-token sequences
    passed to ``mean_pairwise_cosine``, which refuses them) and R3 (no sequence long enough:
    ``torch.cat([])`` raises instead of ``None``)."""
    X = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], [[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]],
                      [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
    m = layer_reports(LayerCapture({0: X}, mask=mask))[0].metrics
    assert m["mean_cosine"] == pytest.approx((0.0 + 1.0) / 2, abs=1e-12)  # orthogonal pair; three parallel tokens
    single = layer_reports(LayerCapture({0: torch.randn(3, 1, 2, dtype=torch.float64)}))[0].metrics
    assert single["mean_cosine"] is None and single["within_variance"] == 0.0


def test_token_metrics_count_classes_with_exactly_two_tokens() -> None:
    """Kills report.py R4 (``_num_classes`` counts classes with more than ``min_count`` tokens:
    token NC1 is ``None`` with two tokens per class) and R20 (token NC1 of a single class)."""
    X = torch.tensor([[[0.0, 1.0], [0.2, 1.0], [3.0, 0.0], [3.0, 0.4]]], dtype=torch.float64)
    m = layer_reports(LayerCapture({0: X}, labels=torch.tensor([[0, 0, 1, 1]])))[0].metrics
    # NC1 = tr(S_W S_B^+) / C: within scatter diag(0.01, 0.04) / 2 (per class), means (0.1, 1), (3, 0.2)
    mu = np.array([[0.1, 1.0], [3.0, 0.2]])
    sw = (np.diag([0.01, 0.0]) + np.diag([0.0, 0.04])) / 2
    sb = sum(np.outer(c - mu.mean(0), c - mu.mean(0)) for c in mu) / 2
    assert m["token_nc1"] == pytest.approx(np.trace(sw @ np.linalg.pinv(sb)) / 2, rel=1e-9)
    lone = layer_reports(LayerCapture({0: X}, labels=torch.tensor([[0, 0, 0, 1]])))[0].metrics
    assert lone["token_nc1"] is None  # one class with at least two tokens


def test_energy_top3_and_power_law_with_a_three_dimensional_spectrum() -> None:
    """Kills report.py R5 (energy of the top 2 directions) and R6 (the power law needs 4 ranks above
    the cutoff: ``None`` with 3)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(2, 6, 3, generator=g, dtype=torch.float64)
    m = layer_reports(LayerCapture({0: X}))[0].metrics
    centred = (X - X.mean(dim=1, keepdim=True)).reshape(-1, 3).numpy()
    s = np.linalg.svd(centred, compute_uv=False)
    assert m["energy_top3"] == pytest.approx(1.0, rel=1e-12)
    slope = np.polyfit(np.log(np.arange(1, 4)), np.log(s**2), 1)[0]
    assert m["power_law_alpha"] == pytest.approx(-slope, rel=1e-9)
    X4 = torch.randn(2, 6, 4, generator=g, dtype=torch.float64)
    s4 = np.linalg.svd((X4 - X4.mean(dim=1, keepdim=True)).reshape(-1, 4).numpy(), compute_uv=False)
    assert layer_reports(LayerCapture({0: X4}))[0].metrics["energy_top3"] == pytest.approx(
        float((s4[:3] ** 2).sum() / (s4**2).sum()), rel=1e-9)


def test_the_probe_lets_other_value_errors_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kills report.py R8 (every ``ValueError`` of the linear probe turned into ``None``: a real
    error, e.g. non-finite features, would pass for 'undefined')."""
    def broken(*args: Any, **kwargs: Any) -> float:
        raise ValueError("features must be finite")

    monkeypatch.setattr(R, "linear_probe_accuracy", broken)
    with pytest.raises(ValueError, match="features must be finite"):
        R._probe(torch.randn(6, 2, dtype=torch.float64), torch.tensor([0, 1, 0, 1, 0, 1]), seed=0)


def test_attention_energy_is_none_when_no_attention_example_was_kept() -> None:
    """Kills report.py R9 (no ``None`` for ``num_attention_examples == 0``: the energy of zero sequences)."""
    X = torch.randn(2, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    P = torch.full((2, 2, 3, 3), 1 / 3, dtype=torch.float64)
    cap = LayerCapture({0: X, 1: X}, attentions={0: P})  # no num_attention_examples recorded: 0
    assert cap.num_attention_examples == 0
    assert [r.metrics["dirichlet_attention"] for r in layer_reports(cap)] == [None, None]


def test_register_metric_refuses_an_empty_key_and_labels_default_to_the_key() -> None:
    """Kills report.py R10 (an empty key registered) and R11 (a metric registered without a label
    gets ``None`` as its axis label instead of its key)."""
    with pytest.raises(TypeError, match=r"metric key must be a non-empty string, got ''"):
        R.register_metric("", group="smoothing")
    assert "" not in [m.key for m in R.list_metrics()]
    R.register_metric("test_unlabelled", group="spectral")(lambda v: 1.0)
    try:
        (metric,) = [m for m in R.list_metrics("spectral") if m.key == "test_unlabelled"]
        assert metric.label == "test_unlabelled"
    finally:
        R.unregister_metric("test_unlabelled")


def test_shared_work_is_computed_once_per_layer() -> None:
    """Kills report.py R12 (``LayerView.cached`` recomputes for every metric that shares the work)."""
    computed: list[int] = []

    def shared(v: R.LayerView) -> float:
        return v.cached("test_shared", lambda: computed.append(v.layer) or float(v.layer))

    R.register_metric("test_shared_a", group="smoothing")(shared)
    R.register_metric("test_shared_b", group="smoothing")(shared)
    try:
        reports = layer_reports(LayerCapture({0: torch.randn(2, 3, 2), 1: torch.randn(2, 3, 2)}))
    finally:
        R.unregister_metric("test_shared_a")
        R.unregister_metric("test_shared_b")
    assert computed == [0, 1] and [r.metrics["test_shared_b"] for r in reports] == [0.0, 1.0]


def test_constant_tokens_have_zero_variance_ratio() -> None:
    """Kills report.py R13 (a variance ratio of 1 when there is no variance at all: fully collapsed
    tokens would read as not collapsed)."""
    m = layer_reports(LayerCapture({0: torch.full((3, 4, 2), 0.5, dtype=torch.float64)}))[0].metrics
    assert m["variance_ratio"] == 0.0 and m["within_variance"] == 0.0


def test_padded_sequences_have_the_anova_of_their_real_tokens_and_one_class_has_no_collapse() -> None:
    """Kills report.py R16 (the ANOVA split of padded graphs mixing padding into the groups: since sitting 52 it is
    the split of the real tokens, each mean weighted by its tokens) and R17 (Neural Collapse measured with a single
    class: it needs two)."""
    from diffusionformer.analysis.metrics import _anova_of_lengths, anova_decomposition

    X = torch.randn(4, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, True], [True, False, False]])
    padded = layer_reports(LayerCapture({0: X * mask.unsqueeze(-1)}, mask=mask, labels=torch.tensor([0, 1, 0, 1])))[0]
    real = _anova_of_lengths(X[mask], mask.sum(1), torch.tensor([0, 1, 0, 1])).fractions
    with_padding = anova_decomposition(X * mask.unsqueeze(-1), torch.tensor([0, 1, 0, 1])).fractions
    got = [padded.metrics[k] for k in ("anova_within_fraction", "anova_between_sequence_fraction",
                                       "anova_between_class_fraction")]
    assert got == pytest.approx(list(real), rel=1e-12) and got != pytest.approx(list(with_padding), rel=1e-3)
    assert padded.metrics["nc1"] is not None
    one = layer_reports(LayerCapture({0: X}, labels=torch.tensor([3, 3, 3, 3])))[0].metrics
    assert [one[k] for k in ("nc1", "nc2_equinorm", "nc2_etf_distance", "nc4_agreement", "seq_probe_acc")] == [None] * 5


def test_probes_need_four_sequences_and_accept_four_tokens() -> None:
    """Kills report.py R18 (a sequence probe on 3 sequences) and R19 (no token probe on exactly 4
    labelled tokens)."""
    X = torch.tensor([[[0.0], [1.0]], [[0.2], [1.1]], [[5.0], [5.0]]], dtype=torch.float64)
    for seed in range(4):
        three = layer_reports(LayerCapture({0: X}, labels=torch.tensor([0, 1, 0])), probe_seed=seed)[0].metrics
        assert three["seq_probe_acc"] is None and three["nc1"] is not None
    tokens = layer_reports(LayerCapture({0: X[:2]}, labels=torch.tensor([[0, 1], [0, 1]])))[0].metrics
    expected = linear_probe_accuracy(X[:2].reshape(4, 1), torch.tensor([0, 1, 0, 1]), seed=0)
    assert tokens["token_probe_acc"] == expected == 1.0


def test_layer_reports_refuses_a_non_capture_and_labels_of_the_wrong_width() -> None:
    """Kills report.py R21 (no ``TypeError`` for a non-capture: an ``AttributeError`` deep inside) and
    R26 (per-token labels of the wrong width accepted)."""
    with pytest.raises(TypeError, match=r"capture must be a LayerCapture, got dict"):
        layer_reports({0: torch.randn(2, 3, 2)})  # type: ignore[arg-type]
    X = torch.randn(2, 3, 2)
    with pytest.raises(ValueError, match=r"one label per sequence \(2,\) or per token \(2, 3\), got \(2, 4\)"):
        layer_reports(LayerCapture({0: X}, labels=torch.zeros(2, 4, dtype=torch.long)))


def test_the_sequence_probe_uses_the_given_seed() -> None:
    """Kills report.py R22 (``probe_seed`` ignored: every probe split drawn with seed 0)."""
    g = torch.Generator().manual_seed(0)
    means = torch.randn(20, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (20,), generator=g)
    X = torch.stack([means + 0.5, means - 0.5], dim=1)  # two tokens per sequence around its mean
    for seed in (0, 2):
        got = layer_reports(LayerCapture({0: X}, labels=y), probe_seed=seed)[0].metrics["seq_probe_acc"]
        assert got == pytest.approx(linear_probe_accuracy(means, y, seed=seed), abs=1e-12)
    assert linear_probe_accuracy(means, y, seed=0) != linear_probe_accuracy(means, y, seed=2)


def test_metrics_are_computed_in_float64() -> None:
    """Kills report.py R23 (tokens measured in float32: offsets of 1 on a value of 1e8 vanish)."""
    X = torch.tensor([[[1e8, 0.0], [1e8 + 1.0, 0.0]]], dtype=torch.float64)
    m = layer_reports(LayerCapture({0: X}))[0].metrics
    assert m["within_variance"] == 0.25  # tokens 0.5 either side of their mean
    assert m["dirichlet_complete"] > 0.0


# ----------------------------------------------------------------------------- equivalent mutants
# analyze.py A27 (``_cached`` without its ``is_file`` check): ``torch.load`` of a missing file raises
#   ``FileNotFoundError``, which the ``except Exception`` turns into the same ``None``.
# analyze.py A31 (``isinstance(v, (int, float))`` replaced by ``v is not None`` in
#   ``_last_layer_values``): a layer's metrics are ``float | None`` by ``layer_reports``' contract
#   (and JSON numbers read back as int/float), so no other type reaches the filter.
# analyze.py A45 (label columns chosen from the last layer's keys, not layer 0's): every layer of a
#   run has the same metric keys (``layer_reports`` measures the same groups for each layer).
# report.py R1 (``_groups`` without its ``n == 0`` skip): the empty block it would yield has
#   ``g.shape[1] == 0``, which ``_mean_per_sequence`` drops for every caller (``min_len`` is 1 or 2).
# report.py R7 (``_probe`` without its "fewer than 2 classes" check): ``linear_probe_accuracy`` then
#   raises "needs at least 2 classes in training", which ``_probe`` turns into the same ``None``.
# report.py R27 (``s[0] > 0`` dropped in ``_spectrum_summary``): an all-zero spectrum then has
#   ``r = #(s > 0) = 0 < 3``, so ``power_law_alpha`` stays ``None``.
# report.py R28 (no re-sort in ``_spectrum_summary``): its only input is ``torch.linalg.svdvals``,
#   which is already descending.
# report.py R29 (``layer < 1`` dropped in ``_dirichlet_attention``): layer 0 looks up block -1, and
#   attention maps are keyed by block indices >= 0, so it is ``None`` either way.
