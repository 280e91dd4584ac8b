"""Edge-case probes of a comparison's results files damaged or outdated by hand (``experiments.publish``: the page and
``summary`` read ``results.json``).

Found and fixed (tests named ``test_bug_...``):

- ``publish_experiment``, ``summary_table``: the rows of ``results.json`` were tabulated under the config's metric
  whatever metric they recorded: after a task's ``metric`` was changed in the config (``test_acc`` to ``test_loss``,
  no retraining needed), the page's ``test_loss`` column showed each run's ``test_acc``. Such rows are now refused
  with an error naming the file, the run and both metrics (``run`` rewrites ``results.json`` with the new metric).
- ``publish_experiment``, ``summary_table``: two rows of ``results.json`` for one run (task, setting, seed) with
  different values: the last one was tabulated, silently. Now refused with an error naming the file and the run.
- ``train.read_metrics`` (and so ``run``'s plots, ``publish``): a log line whose ``step`` was an int past int64
  (``1e30`` written as an int, a flipped digit) was read as a record: ``run`` failed drawing the curves with numpy's
  "ufunc 'isfinite' not supported for the input types", naming no file. Such a line (and a negative step, which no
  trainer writes) is now skipped with the warning naming the file and line, as any other line that is no record.
- ``publish_experiment``: a ``manifest.json`` list (``git_commits``, ``cpu_kernel_sets``, ``torch_versions``,
  ``world_sizes``, ``torch_thread_counts``) that was not a list failed with a bare "'int' object is not iterable"
  (no file named), and a string was read a character each: the page said the runs were trained under the kernel sets
  "A, V, X, 2". Such a field is now read as absent, as ``run``'s manifest merge reads it (``outputs._merged``).
- ``publish_experiment``, ``summary_table``: a ``results.json`` row of a run whose folder no longer holds it finished
  (``run --restart`` stopped while retraining it: its ``summary.json`` is removed first, ``results.json`` is rewritten
  only when a run ends) was tabulated as a finished seed, with no warning, beside the new run's partial log published
  as its log, while ``status`` called the run interrupted. Such a row is now left out, as ``run`` leaves it out when it
  next writes ``results.json`` (``outputs._other_finished_rows``), and ``publish`` names the run as not finished.
- ``publish_experiment``: an ``analysis/README.md`` that was not UTF-8 failed with a bare "'utf-8' codec can't decode
  byte 0xff" (the command printed no file name); now a ValueError naming the file. A damaged analysis figure's error
  said "`run` the comparison again to redraw its figures", which does not draw them: it now says `analyze`.
- ``publish_experiment``, ``summary_table``: a ``results.json`` that was a FIFO or a folder read as missing:
  "results.json not found: run ... first" (``summary`` left the comparison out, or said there were no results) for a
  comparison that had run. Now a ValueError naming the file and what it is.
- ``publish_experiment``: a ``results.json`` row with a negative ``num_parameters`` or ``elapsed`` (or step) was
  published as it was ("-3" parameters, "-5.0" s per run), where the same value in a ``summary.json`` is refused. Now
  such a row is named as the rows of the wrong type are (``results._row_problem``); ``run`` drops it and reads the run
  back from its folder.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from diffusionformer.experiments import load_experiment_config, publish_experiment, summary_table
from diffusionformer.experiments.plots import plot_experiment
from diffusionformer.experiments.publish import _load_runs
from diffusionformer.experiments.results import run_dir
from diffusionformer.train import read_metrics
from experiments_tiny_configs import FINISHED_OPS, finished_study

OPS = FINISHED_OPS
_study = finished_study


def _publish(config, out, docs):
    """``publish_experiment`` into ``docs`` with an index whose toctree takes the page; the page's text."""
    docs.mkdir(exist_ok=True)
    (docs / "index.md").write_text("# Results\n\n```{toctree}\n:maxdepth: 1\n\n```\n")
    return publish_experiment(config, out, docs).read_text()


def _with_metric(config, metric):
    raw = {"name": config.name, "seeds": list(config.seeds), "operators": OPS,
           "tasks": [{"name": "t", "dataset": "digits", "model": "vit-digits", "metric": metric,
                      "train": {"max_steps": 4}}]}
    return load_experiment_config(raw)


@pytest.mark.parametrize("reader", ["publish", "summary"])
def test_bug_rows_of_another_metric_are_refused(tmp_path, reader):
    out, config, results = _study(tmp_path)
    changed = _with_metric(config, "test_loss")  # the config edited after the runs: their rows hold test_acc
    with pytest.raises(ValueError, match=r"(?s)results\.json.*'test_acc'.*'test_loss'"):
        if reader == "publish":
            _publish(changed, out, tmp_path / "docs")
        else:
            summary_table([changed], out)


def test_rows_of_the_configs_metric_are_read(tmp_path):
    out, config, _ = _study(tmp_path)
    assert "| h / t | test_acc (0.6000) | +0.0667 (p 0.057; Holm 0.057) |" in summary_table([config], out)


@pytest.mark.parametrize("reader", ["publish", "summary"])
def test_bug_two_rows_of_one_run_are_refused(tmp_path, reader):
    out, config, results = _study(tmp_path)
    data = json.loads(results.read_text())
    data["runs"].append(dict(data["runs"][1], value=0.99))  # attention seed 1 again, with another value
    results.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"(?s)results\.json.*run 6 .*'t' / 'attention' seed 1.*run 1"):
        if reader == "publish":
            _publish(config, out, tmp_path / "docs")
        else:
            summary_table([config], out)


@pytest.mark.parametrize("step", [10**30, 2**63, -1])
def test_bug_a_log_step_no_trainer_writes_is_skipped_naming_the_line(tmp_path, step):
    pytest.importorskip("matplotlib")
    out, config, _ = _study(tmp_path)
    log = run_dir(out / "h", "t", "lap", 1) / "metrics.jsonl"
    good = log.read_text()
    bad = {"step": step, "split": "eval", "loss": 1.0, "metrics": {"test_acc": 0.9}}
    log.write_text(json.dumps(bad) + "\n" + good)
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:1: skipping a line that is not a metrics record"):
        assert read_metrics(log) == [json.loads(good)]  # the good record kept
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:1: skipping"):
        written = plot_experiment(out / "h", config, _load_runs(config, out / "h"))
    assert [p.name for p in written] == ["t_curves.png", "t_final.png"]


def test_a_log_step_of_int64_max_and_zero_are_read(tmp_path):
    log = tmp_path / "metrics.jsonl"
    records = [{"step": s, "split": "eval", "metrics": {"test_acc": 0.5}} for s in (0, 2**63 - 1)]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert read_metrics(log) == records


@pytest.mark.parametrize("bad", [7, True, "AVX2", {"AVX2": 1}])
def test_bug_a_manifest_list_of_another_type_is_read_as_absent(tmp_path, bad):
    out, config, _ = _study(tmp_path)
    manifest = {"git_commit": "abc", "torch": "2.13.0", "cpu_kernels": "AVX512", "git_commits": bad,
                "cpu_kernel_sets": bad, "torch_versions": bad, "cuda_devices": bad, "world_sizes": bad,
                "torch_thread_counts": bad}
    (out / "h" / "manifest.json").write_text(json.dumps(manifest))
    page = _publish(config, out, tmp_path / "docs")
    assert "; CUDA: none; CPU kernels: AVX512\n" in page  # the last invocation's, as a manifest without the lists
    assert "- **Versions:** torch 2.13.0, " in page and "- **Git commit:** `abc`\n" in page


@pytest.mark.parametrize("reader", ["publish", "summary"])
def test_bug_a_row_of_a_run_being_retrained_is_left_out(tmp_path, reader):
    out, config, _ = _study(tmp_path)
    rdir = run_dir(out / "h", "t", "lap", 2)
    (rdir / "summary.json").unlink()  # `run --restart` stopped while retraining it: its row is the discarded run's
    (rdir / "run_config.json").write_text(json.dumps({"dataset": "digits", "model": "vit-digits"}))  # the new run's
    (rdir / "metrics.jsonl").write_text(json.dumps({"step": 1, "split": "train", "loss": 2.0, "metrics": {}}) + "\n")
    if reader == "summary":  # seeds 0 and 1 paired: +0.05 each, no spread (with seed 2 it was +0.0667, p 0.057)
        row = "| h / t | test_acc (0.6000) | +0.0500 (p n/a; Holm n/a) [2 vs 3 seeds] |"
        assert row in summary_table([config], out)
        return
    with pytest.warns(RuntimeWarning, match=r"publish: 1 of 6 runs of 'h' not finished \('t' / 'lap' seed 2\)"):
        page = _publish(config, out, tmp_path / "docs")
    assert "| lap | 0.6000 ± 0.0707 | +0.0500 |" in page


def test_a_row_whose_run_folder_has_no_run_config_is_kept(tmp_path):
    out, config, _ = _study(tmp_path)
    (run_dir(out / "h", "t", "lap", 2) / "summary.json").unlink()  # a folder no run was started in since: its row
    assert "| h / t | test_acc (0.6000) | +0.0667 (p 0.057; Holm 0.057) |" in summary_table([config], out)


def test_a_published_folder_keeps_its_rows(tmp_path):
    out, config, _ = _study(tmp_path)
    docs = tmp_path / "docs"
    _publish(config, out, docs)
    # the published folder has no run folders: its rows are all it has
    assert "| h / t | test_acc (0.6000) | +0.0667 (p 0.057; Holm 0.057) |" in summary_table([config], docs)


def _with_analysis(out, readme: bytes, figure: bytes | None = None):
    from PIL import Image

    adir = out / "h" / "analysis"
    (adir / "plots").mkdir(parents=True)
    (adir / "metrics.json").write_text("{}")
    (adir / "README.md").write_bytes(readme)
    if figure is None:
        Image.new("RGB", (4, 4), (200, 10, 10)).save(adir / "plots" / "t_spectra.png")
    else:
        (adir / "plots" / "t_spectra.png").write_bytes(figure)
    return adir


def test_bug_an_analysis_readme_not_utf8_is_named(tmp_path):
    pytest.importorskip("PIL")
    out, config, _ = _study(tmp_path)
    adir = _with_analysis(out, b"# Token geometry\n\n\xff\xfe tables\n")
    readme = re.escape(str(adir / "README.md"))
    with pytest.raises(ValueError, match=rf"{readme}: not UTF-8 .*`analyze` the comparison again"):
        _publish(config, out, tmp_path / "docs")


def test_bug_a_damaged_analysis_figure_names_analyze(tmp_path):
    pytest.importorskip("PIL")
    out, config, _ = _study(tmp_path)
    adir = _with_analysis(out, b"# Token geometry\n\n## layer 0\n", figure=b"not a png")
    figure = re.escape(str(adir / "plots" / "t_spectra.png"))
    with pytest.raises(ValueError, match=rf"{figure}: not a readable PNG figure .*"
                                         r"`analyze` the comparison again to redraw its figures"):
        _publish(config, out, tmp_path / "docs")


def test_an_analysis_section_is_published(tmp_path):
    pytest.importorskip("PIL")
    out, config, _ = _study(tmp_path)
    _with_analysis(out, "# Token geometry\n\n## layer 0 ± std\n".encode())
    assert "### layer 0 ± std\n" in _publish(config, out, tmp_path / "docs")


@pytest.mark.parametrize("kind", ["a FIFO", "a folder"])
@pytest.mark.parametrize("reader", ["publish", "summary"])
def test_bug_a_results_file_that_is_no_regular_file_is_named(tmp_path, reader, kind):
    if kind == "a FIFO" and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    out, config, results = _study(tmp_path)
    results.unlink()
    os.mkfifo(results) if kind == "a FIFO" else results.mkdir()
    with pytest.raises(ValueError, match=rf"{re.escape(str(results))} is {kind}, not a results file"):
        if reader == "publish":
            _publish(config, out, tmp_path / "docs")
        else:
            summary_table([config], out)


@pytest.mark.parametrize("field", ["num_parameters", "elapsed", "selected_step", "reach_step"])
def test_bug_a_negative_count_in_a_results_row_is_named(tmp_path, field):
    out, config, results = _study(tmp_path)
    data = json.loads(results.read_text())
    data["runs"][2][field] = -3
    results.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"results\.json is not a results file .*run 2 of 'runs': {field} must be "
                                         r">= 0 or null, got '-3'"):
        _publish(config, out, tmp_path / "docs")
