"""Edge probes of the run store, the results files and their round-trips (probe 41)."""

from __future__ import annotations

import json
import math
import tomllib

import pytest

from experiments_tiny_configs import TINY_DIGITS_TOML

from diffusionformer.experiments.config import TaskConfig, load_experiment_config
from diffusionformer.experiments.outputs import write_outputs
from diffusionformer.experiments.results import RunResult, finished_runs, run_dir, select_evaluation
from diffusionformer.experiments.tables import aggregate
from experiments_references import holm_reference  # noqa: E402


def _config(seeds: str = "[0, 1]"):
    return load_experiment_config(tomllib.loads(TINY_DIGITS_TOML.replace("seeds = [0]", f"seeds = {seeds}")))


def _completed_run(out, seed, value, metric="test_acc"):
    d = run_dir(out, "digits", "attention", seed)
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"status": "completed"}))
    return RunResult("digits", "attention", seed, "completed", metric, value, {metric: value})


def test_bug_non_finite_run_survives_a_results_json_round_trip(tmp_path):
    """Bug: a completed run whose metric was NaN is written to results.json as ``"value": null`` (strict JSON); an
    invocation on another seed (``--set seeds=[1]``) read that row back as a run with no value at all, so the table's
    ``non_finite`` count went from 1 to 0 and the NaN run vanished from the page without a word."""
    config = _config()
    r0, r1 = _completed_run(tmp_path, 0, math.nan), _completed_run(tmp_path, 1, 0.5)
    write_outputs(tmp_path, config, [r0, r1])
    first = json.loads((tmp_path / "results.json").read_text())["summary"][0]
    assert first["non_finite"] == 1
    write_outputs(tmp_path, config, [r1])  # a partial invocation: seed 0's row comes from results.json
    again = json.loads((tmp_path / "results.json").read_text())["summary"][0]
    assert (again["non_finite"], again["n"], again["failed"]) == (1, 1, 0)
    rows = {r["seed"]: r for r in json.loads((tmp_path / "results.json").read_text())["runs"]}
    assert rows[0]["value"] is None and rows[1]["value"] == 0.5  # still strict JSON on disk


def test_pins_results_json_round_trip_keeps_a_finite_row_and_a_run_without_evaluation(tmp_path):
    """Pins: a finite row is read back as written, and a completed run without any value (no evaluation record:
    ``final`` lacks the metric) stays a run without a value, not a non-finite one."""
    config = _config("[0, 1, 2]")
    r0 = _completed_run(tmp_path, 0, 0.25)
    r2 = _completed_run(tmp_path, 2, None)
    r2.final = {}
    r1 = _completed_run(tmp_path, 1, 0.5)
    write_outputs(tmp_path, config, [r0, r1, r2])
    write_outputs(tmp_path, config, [r1])
    row = json.loads((tmp_path / "results.json").read_text())["summary"][0]
    assert row["by_seed"] == {"0": 0.25, "1": 0.5}
    assert (row["n"], row["non_finite"], row["failed"]) == (2, 0, 0)


def test_bug_a_huge_int_metric_in_summary_json_does_not_crash_the_tables(tmp_path):
    """Bug: a ``summary.json`` whose metric is an int too large for a float (hand-edited, 400 digits) was read back
    as that int; ``aggregate`` then raised ``OverflowError: int too large to convert to float`` (math.isfinite), and
    every run of the comparison lost its table. results.json rows holding such a value were already refused; the
    summary is now read as a non-finite value, counted as such."""
    config = _config("[0]")
    d = run_dir(tmp_path, "digits", "attention", 0)
    d.mkdir(parents=True)
    big = "9" * 400
    (d / "summary.json").write_text('{"status": "completed", "eval": {"split": "eval", "step": 2, '
                                    '"metrics": {"test_acc": %s}}}' % big)
    runs = finished_runs(tmp_path, config)
    assert len(runs) == 1 and isinstance(runs[0].value, float) and math.isnan(runs[0].value)
    (row,) = aggregate(runs)
    assert (row["n"], row["non_finite"], row["mean"]) == (0, 1, None)


def test_bug_select_evaluation_of_a_huge_int_metric_is_not_an_overflow():
    """Bug: an evaluation record whose reported metric is an int too large for a float (its ``select_by`` key
    fine) made ``select_evaluation`` raise ``OverflowError`` from ``float(...)`` instead of giving a non-finite
    value, which the tables leave out of the selected mean."""
    task = TaskConfig("t", "digits", "vit-digits", select_by="val_acc")
    evals = [{"split": "eval", "step": 10, "metrics": {"val_acc": 0.9, "test_acc": 10 ** 400}},
             {"split": "eval", "step": 20, "metrics": {"val_acc": 0.5, "test_acc": 0.7}}]
    value, step = select_evaluation(evals, task)
    assert step == 10 and math.isnan(value)
    evals[0]["metrics"]["test_acc"] = 3  # an ordinary int stays its value
    assert select_evaluation(evals, task) == (3.0, 10)


def _other_row(**row):
    return {"status": "completed", "metric": "test_acc", "value": 0.1, **row}


def test_bug_a_results_json_row_with_an_overlong_name_does_not_crash_write_outputs(tmp_path):
    """Bug: a ``results.json`` row (hand-edited, another tool's) whose task name is longer than a file name may be
    made ``write_outputs`` check ``runs/<300 chars>/.../summary.json``; ``Path.is_file`` raised
    ``OSError: [Errno 36] File name too long`` and the invocation's tables were never written. The row is dropped, as
    any other row whose run is not finished on disk; ``read_json_dict`` of such a path is None."""
    from diffusionformer.experiments.results import read_json_dict

    config = _config("[0]")
    r = _completed_run(tmp_path, 0, 0.5)
    run_dir(tmp_path, "digits", "attention", 7).parent.mkdir(parents=True, exist_ok=True)
    for row in (_other_row(task="a" * 300, operator="x", seed=0),
                _other_row(task="digits", operator="attention", seed=10 ** 300)):
        (tmp_path / "results.json").write_text(json.dumps({"runs": [row]}))
        write_outputs(tmp_path, config, [r])
        runs = json.loads((tmp_path / "results.json").read_text())["runs"]
        assert [(x["task"], x["seed"]) for x in runs] == [("digits", 0)]
    assert read_json_dict(tmp_path / ("b" * 300) / "summary.json") is None


def test_bug_a_results_json_row_cannot_pull_in_a_run_outside_the_comparison(tmp_path):
    """Bug: a ``results.json`` row naming task ``..`` and setting ``..`` pointed ``run_dir`` outside the
    comparison's folder (``out/runs/../../seed0``); a completed ``summary.json`` found there kept that row in the
    comparison's table as a finished run of a task no config can name."""
    out = tmp_path / "cmp"
    config = _config("[0]")
    r = _completed_run(out, 0, 0.5)
    (tmp_path / "seed0").mkdir()
    (tmp_path / "seed0" / "summary.json").write_text(json.dumps({"status": "completed"}))
    assert run_dir(out, "..", "..", 0).resolve() == (tmp_path / "seed0").resolve()
    (out / "results.json").write_text(json.dumps({"runs": [_other_row(task="..", operator="..", seed=0)]}))
    write_outputs(out, config, [r])
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [(x["task"], x["operator"]) for x in runs] == [("digits", "attention")]


class _Payload:
    """A pickle that makes a folder when unpickled: a hostile ``checkpoint.pt``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return os.mkdir, (self.marker,)


def test_pins_a_hostile_checkpoint_runs_no_code_in_status_or_load_run(tmp_path):
    """Pins: ``run_status`` (the resume step of an interrupted run) and ``load_run`` read a ``checkpoint.pt`` whose
    pickle would call ``os.mkdir`` without running it (``weights_only``): the step reads as unknown and ``load_run``
    raises CheckpointError."""
    import dataclasses

    import pytest
    import torch

    from diffusionformer import load_run
    from diffusionformer.experiments.results import run_status
    from diffusionformer.models import model_config
    from diffusionformer.train import CheckpointError

    config = _config("[0]")
    rdir = run_dir(tmp_path / config.name, "digits", "attention", 0)
    rdir.mkdir(parents=True)
    marker = tmp_path / "code-ran"
    torch.save({"step": 1, "model": _Payload(marker)}, rdir / "checkpoint.pt")
    cfg = dataclasses.asdict(model_config("vit-digits", dim=8, depth=1, num_heads=2))
    (rdir / "run_config.json").write_text(json.dumps({"model": "vit-digits", "model_config": cfg}, default=str))
    row = next(r for r in run_status(config, tmp_path) if r["operator"] == "attention")
    assert (row["state"], row["resumes_from"]) == ("interrupted", None)
    with pytest.raises(CheckpointError):
        load_run(rdir)
    assert not marker.exists()


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_bug_a_folder_named_lock_break_is_refused_by_name(tmp_path):
    """Bug: with a stale lock (a killed worker's) and a folder where the takeover's ``.lock.break`` goes,
    ``acquire_lock`` reported the run as held by the dead worker while the folder was young, and once it was older
    than UNREADABLE_GRACE_S crashed with a bare ``IsADirectoryError`` from ``unlink``; a folder in the lock's own
    place was already refused by name."""
    import os
    import platform
    import time

    import pytest

    from diffusionformer.experiments.store import LOCK_NAME, UNREADABLE_GRACE_S, acquire_lock

    dead = _dead_pid()
    for age in (0.0, 10 * UNREADABLE_GRACE_S):
        rdir = tmp_path / f"age{int(age)}"
        rdir.mkdir()
        (rdir / LOCK_NAME).write_text(json.dumps({"pid": dead, "host": platform.node()}))
        brk = rdir / (LOCK_NAME + ".break")
        brk.mkdir()
        os.utime(brk, (time.time() - age,) * 2)
        with pytest.raises(IsADirectoryError, match=r"\.lock\.break is a folder"):
            acquire_lock(rdir)
        assert brk.is_dir() and json.loads((rdir / LOCK_NAME).read_text())["pid"] == dead  # nothing removed
        brk.rmdir()
        assert acquire_lock(rdir) is None  # and once it is gone, the stale lock is taken over
        assert json.loads((rdir / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_pins_contrasts_holm_families_with_a_primary_contrast_match_scipy_and_a_written_out_holm():
    """Pins: with ``primary = ["digits:lap"]`` and ``primary_quantities = ["final"]``, the final-metric contrast of
    ``lap`` is adjusted alone (its raw paired-t p, scipy's ``ttest_rel``), ``lap2``'s over both final contrasts
    (Holm written out), and the ``selected`` contrasts are exploratory, adjusted among themselves."""
    from scipy import stats as sps

    from diffusionformer.experiments.compare import contrasts

    text = TINY_DIGITS_TOML.replace("seeds = [0]", "seeds = [0, 1, 2, 3]\nprimary = [\"digits:lap\"]\n"
                                    "primary_quantities = [\"final\"]")
    text = text.replace('model = "vit-digits"', 'model = "vit-digits"\nselect_by = "val_acc"')
    text += '[[operators]]\nname = "lap2"\nlaplacian_heads = 2\n'
    config = load_experiment_config(tomllib.loads(text))
    finals = {"attention": [0.50, 0.52, 0.49, 0.51], "lap": [0.55, 0.56, 0.50, 0.58], "lap2": [0.51, 0.50, 0.52, 0.53]}
    chosen = {"attention": [0.40, 0.45, 0.41, 0.43], "lap": [0.48, 0.44, 0.47, 0.49], "lap2": [0.41, 0.47, 0.40, 0.44]}
    runs = [RunResult("digits", op, s, "completed", "test_acc", finals[op][s], selected_value=chosen[op][s],
                      selected_step=10) for op in finals for s in range(4)]
    got = {(c.kind, c.setting): c for c in contrasts(aggregate(runs), config)}
    raw = {(kind, op): sps.ttest_rel(src[op], src["attention"]).pvalue
           for kind, src in (("final", finals), ("selected", chosen)) for op in ("lap", "lap2")}
    for key, c in got.items():
        assert math.isclose(c.diff.p, raw[key], rel_tol=1e-9)
    assert [got[k].primary for k in sorted(got)] == [True, False, False, False]  # only final / lap
    assert math.isclose(got[("final", "lap")].p_holm, raw[("final", "lap")], rel_tol=1e-9)
    fam = holm_reference([raw[("final", "lap")], raw[("final", "lap2")]])
    assert math.isclose(got[("final", "lap2")].p_holm, fam[1], rel_tol=1e-9)
    sel = holm_reference([raw[("selected", "lap")], raw[("selected", "lap2")]])
    assert [got[("selected", op)].p_holm for op in ("lap", "lap2")] == pytest.approx(sel, rel=1e-9)
