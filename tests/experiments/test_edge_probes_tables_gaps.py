"""Edge-case probes of how a comparison's results are reported (``experiments.tables``, ``gaps``, ``publish``,
``outputs``, ``results``, ``plots`` and the ``status`` / ``publish`` commands).

Probed without finding a fault: means, sample std and paired Δ/t of ``aggregate``, ``format_table`` and the gap
tables against numpy/scipy with missing seeds, one seed, NaN/inf metrics and failed runs (pairing is by seed);
``status`` on an empty or half-written results folder; figures with all-NaN series or one point; unicode, ``*`` and
backticks in names (rendered as markdown, the columns stay); newlines and ``..`` in names (refused by the config).

Found and fixed (tests named ``test_bug_...``):

- ``tables``/``gaps``/``publish``: a ``|`` in a task or setting name (the config allows it) ended the table cell, so
  every later number of the row stood under the next column's head; it is now escaped as ``\\|``.
- ``publish``: a ``results.json`` row with a value of the wrong type (``"0.5"``, ``true``, a 400-digit int, a list
  seed) failed with a bare "must be real number, not str", an ``OverflowError`` traceback or "unhashable type:
  'list'" naming no file, or (``true``) was averaged as 1.0; ``run`` (``outputs``) kept such a row and then failed
  the same way after training every run. ``publish`` now names the file, the row and the field; ``run`` drops the row.
- ``results``/``publish``/``outputs``: a run file of arrays nested thousands deep (``summary.json``,
  ``results.json``, ``manifest.json``, a published log) raised a ``RecursionError`` traceback from ``status``,
  ``run`` and ``publish``; it is an unreadable file as a truncated one is.
- ``publish``: a comparison named ``index`` overwrote ``docs/results/index.md`` (the hand-written toctree of every
  results page) with its page, listing itself; it is refused before anything is written.
- ``publish``: a published folder that was a symlink (to a folder shared elsewhere) was left behind as
  ``.<name>.previous`` (``shutil.rmtree`` refuses links, errors ignored), and the next ``publish`` failed on it with
  "OSError: Cannot call rmtree on a symbolic link"; the link is now unlinked (its target is never touched).
- ``gaps``: an evaluation whose loss is a 400-digit int (a hand-edited log) raised ``OverflowError`` from
  ``math.isfinite``; it is left out as a non-finite loss is.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from scipy import stats

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import RunResult, read_json_dict, run_dir, run_status
from diffusionformer.experiments.tables import aggregate, format_status, format_table

_DEEP = "[" * 100_000 + "]" * 100_000  # nested beyond Python's recursion limit


def _config(ops=("attention", "lap"), seeds=(0, 1, 2), name="probe", task="d", **raw):
    return load_experiment_config({"name": name, "seeds": list(seeds), "operators": [{"name": o} for o in ops],
                                   "tasks": [{"name": task, "dataset": "digits", "model": "vit-digits",
                                              "train": {"max_steps": 2}}], **raw})


def _runs(op, values, task="d"):
    return [RunResult(task, op, s, "completed", "test_acc", v, {"test_acc": v}, 10, 1.0) for s, v in values.items()]


def _cells(line):
    """The cells of a markdown table row, split where GFM splits them: at every ``|`` not escaped by ``\\``."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _table_rows(text):
    return [line for line in text.splitlines() if line.startswith("|") and not line.startswith("|---")]


def _publishable(tmp_path, name="probe", values=None):
    """A results root with a comparison of one task, one setting and two finished runs (summary.json, metrics.jsonl
    and results.json written as `run` writes them)."""
    values = values or {0: 0.5, 1: 0.7}
    cfg = _config(ops=("attention",), seeds=tuple(values), name=name)
    out = tmp_path / "res" / name
    for seed, v in values.items():
        rdir = run_dir(out, "d", "attention", seed)
        rdir.mkdir(parents=True)
        ev = {"split": "eval", "step": 2, "metrics": {"test_acc": v}}
        (rdir / "summary.json").write_text(json.dumps({"status": "completed", "eval": ev, "step": 2, "elapsed": 1.0}))
        (rdir / "metrics.jsonl").write_text(json.dumps(ev) + "\n")
    runs = _runs("attention", values)
    (out / "results.json").write_text(json.dumps({"runs": [r.__dict__ for r in runs], "summary": aggregate(runs)}))
    return cfg, tmp_path / "res"


# ----------------------------------------------------------------------------- numbers against numpy/scipy
def test_table_numbers_match_numpy_with_a_missing_seed_a_nan_and_a_failed_run():
    """Mean and sample std over the finite seeds, Δ and paired t over the seeds both settings have (by seed, not
    by position), against numpy/scipy in float64."""
    cfg = _config(seeds=(0, 1, 2, 3, 4))
    base = {0: 0.51, 1: 0.62, 2: 0.58, 3: math.nan, 4: 0.55}
    other = {1: 0.70, 2: 0.61, 3: 0.66, 4: 0.64}
    failed = RunResult("d", "lap", 0, "failed: boom", "test_acc", None, {}, None, 0.5)
    table = aggregate(_runs("attention", base) + _runs("lap", other) + [failed])
    a, b = table
    fa = [v for v in base.values() if math.isfinite(v)]
    assert a["mean"] == pytest.approx(np.mean(fa), rel=1e-15) and a["std"] == pytest.approx(np.std(fa, ddof=1), rel=1e-14)
    assert (a["n"], a["non_finite"], b["n"], b["failed"]) == (4, 1, 4, 1)
    row = _cells([line for line in format_table(table, cfg).splitlines() if line.startswith("| lap |")][0])
    common = [1, 2, 4]
    t = stats.ttest_rel([other[s] for s in common], [base[s] for s in common])
    assert row[2] == f"{np.mean([other[s] - base[s] for s in common]):+.4f}" and row[4] == "2"
    assert float(row[5]) == pytest.approx(t.pvalue, abs=5e-4) and row[8].startswith("4 (1 failed) (3 paired")


def test_gap_differences_pair_by_seed_against_scipy(tmp_path):
    from diffusionformer.experiments.gaps import gap_table, primary_table

    cfg = _config(seeds=(0, 1, 2, 3), primary=["d:lap"])
    vals = {"attention": {0: 2.0, 1: 2.2, 2: 2.1}, "lap": {1: 2.5, 2: 2.0, 3: 1.0}}
    rows = {"d": {op: {s: {"final_val": v, "final_train": 1.0, "final_gap": v - 1.0, "best_val": v, "best_step": 2.0,
                           "best_gap": v - 1.0} for s, v in d.items()} for op, d in vals.items()}}
    t = stats.ttest_rel([2.5, 2.0], [2.2, 2.1])  # seeds 1 and 2: the only ones both settings have
    (line,) = [line for line in gap_table(cfg, tmp_path, rows).splitlines() if line.startswith("| lap")]
    assert f"{0.1:+.4f} (t {t.statistic:+.1f}, 1 df)" in line
    (line,) = [line for line in primary_table(cfg, tmp_path, rows=rows).splitlines() if line.startswith("| d, lap, final")]
    assert _cells(line)[4:6] == ["1", format(t.pvalue, ".2g")]


def test_status_of_an_empty_and_a_half_written_results_folder(tmp_path):
    cfg = _config(ops=("attention",), seeds=(0, 1))
    assert "0 of 2 runs completed" in format_status(run_status(cfg, tmp_path))
    rdir = run_dir(tmp_path / "probe", "d", "attention", 0)
    rdir.mkdir(parents=True)
    (rdir / "summary.json").write_text('{"status": "compl')
    (rdir / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 1.0, "elapsed": 2.0}\n{"step": 2, "sp')
    rows = run_status(cfg, tmp_path)
    assert [(r["state"], r["step"], r["elapsed"]) for r in rows] == [("interrupted", 1, 2.0), ("missing", 0, None)]


# ----------------------------------------------------------------------------- markdown of names
def test_bug_a_pipe_in_a_name_keeps_every_number_under_its_column(tmp_path):
    """Bug: a setting named ``heads|half`` (the config allows ``|``) wrote ``| heads|half | 0.7333 ± ...``: GFM
    split the name into two cells, so the mean stood under the Δ head, Δ under the CI head and so on, and the last
    column was cut. The name is now escaped (``heads\\|half``) in the results, status, gap and summary tables."""
    from diffusionformer.experiments.gaps import gap_table, primary_table
    from diffusionformer.experiments.publish import summary_table

    name = "heads|half"
    cfg = _config(ops=("attention", name), primary=[f"d:{name}"])
    table = aggregate(_runs("attention", {0: 0.5, 1: 0.6, 2: 0.7}) + _runs(name, {0: 0.6, 1: 0.7, 2: 0.9}))
    status = [dict(task="d", operator=name, seed=0, state="completed", step=2, max_steps=2, elapsed=1.0, holder=None,
                   changed=None)]
    g = {"final_val": 2.0, "final_train": 1.0, "final_gap": 1.0, "best_val": 2.0, "best_step": 2.0, "best_gap": 1.0}
    gaps = {"d": {"attention": {s: dict(g) for s in (0, 1, 2)},
                  name: {s: {**g, "final_val": 2.0 + s / 10} for s in (0, 1, 2)}}}
    for text in (format_table(table, cfg), format_table(table, cfg, compact=True), format_status(status),
                 gap_table(cfg, tmp_path, gaps), primary_table(cfg, tmp_path, rows=gaps)):
        lines = _table_rows(text)
        assert lines and any(name.replace("|", "\\|") in line for line in lines)
        assert {len(_cells(line)) for line in lines} == {len(_cells(lines[0]))}, text
    row = _cells([line for line in format_table(table, cfg).splitlines() if line.startswith("| heads")][0])
    assert row[:3] == ["heads\\|half", "0.7333 ± 0.1528", "+0.1333"]

    cfg, out = _publishable(tmp_path)
    raw = json.loads((out / "probe" / "results.json").read_text())
    cfg = _config(ops=("attention", name), seeds=(0, 1))
    for seed, v in ((0, 0.6), (1, 0.9)):  # the second setting's runs, finished on disk
        rdir = run_dir(out / "probe", "d", name, seed)
        rdir.mkdir(parents=True)
        ev = {"split": "eval", "step": 2, "metrics": {"test_acc": v}}
        (rdir / "summary.json").write_text(json.dumps({"status": "completed", "eval": ev}))
        raw["runs"].append(_runs(name, {seed: v})[0].__dict__)
    (out / "probe" / "results.json").write_text(json.dumps(raw))
    lines = _table_rows(summary_table([cfg], out))
    assert {len(_cells(line)) for line in lines} == {3} and "heads\\|half" in lines[0]


# ----------------------------------------------------------------------------- hostile results files
_WRONG = [
    ("value", "0.5", "value must be a number or null, got '0.5'"),
    ("value", True, "value must be a number or null, got 'True'"),
    ("value", 10 ** 400, "value must be a number or null, got '1000"),
    ("seed", [0], "seed must be an int, got '[0]'"),
    ("elapsed", "x", "elapsed must be a number or null"),
    ("selected_value", "x", "selected_value must be a number or null"),
    ("num_parameters", 1.5, "num_parameters must be an int or null"),
]


@pytest.mark.parametrize("field,value,why", _WRONG, ids=[f"{f}-{type(v).__name__}" for f, v, _ in _WRONG])
def test_bug_a_results_json_row_of_the_wrong_type_is_named(tmp_path, capsys, field, value, why):
    """Bug: a results.json row with a value of the wrong type made `publish` fail with "error: must be real number,
    not str" or "unhashable type: 'list'" (no file named) or an OverflowError traceback (a 400-digit int), or
    averaged ``true`` as 1.0 into the page; `run` kept such a row from an earlier call and then failed the same way
    after training every run. `publish` now names the file, the row and the field; `run` drops that row only."""
    from diffusionformer.experiments.cli import main
    from diffusionformer.experiments.outputs import _other_finished_rows

    cfg, out = _publishable(tmp_path)
    path = out / "probe" / "results.json"
    raw = json.loads(path.read_text())
    raw["runs"][0][field] = value
    path.write_text(json.dumps(raw))
    toml = tmp_path / "probe.toml"
    toml.write_text('name = "probe"\nseeds = [0, 1]\n[[tasks]]\nname = "d"\ndataset = "digits"\nmodel = "vit-digits"\n'
                    'train = {max_steps = 2}\n[[operators]]\nname = "attention"\n')
    assert main(["publish", str(toml), "--out", str(out), "--to", str(tmp_path / "docs")]) == 2
    err = capsys.readouterr().err
    assert f"{path} is not a results file" in err and f"run 0 of 'runs': {why}" in err
    assert not (tmp_path / "docs").exists()  # nothing published from it
    # `run` of the other seed: the bad row is dropped, the good one kept, and the tables can be written
    kept = _other_finished_rows(out / "probe", [])
    assert [r.seed for r in kept] == [1]
    aggregate(kept)


def test_bug_json_nested_thousands_deep_is_an_unreadable_file(tmp_path, capsys):
    """Bug: a summary.json, results.json, manifest.json or published log of arrays nested 100000 deep raised a
    RecursionError traceback from `status`, `run` (writing its tables) and `publish`. Each is now an unreadable
    file: an unfinished run, a results.json rebuilt, or a ValueError naming the file."""
    from diffusionformer.experiments.outputs import _other_finished_rows
    from diffusionformer.experiments.publish import _read_manifest, _stored_runs, read_run_log

    cfg, out = _publishable(tmp_path)
    summary = run_dir(out / "probe", "d", "attention", 0) / "summary.json"
    summary.write_text(_DEEP)
    assert read_json_dict(summary) is None
    assert [r["state"] for r in run_status(cfg, out)] == ["interrupted", "completed"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"runs": ' + _DEEP + "}")
    with pytest.raises(ValueError, match=f"{re.escape(str(bad))} is not a results file.*RecursionError"):
        _stored_runs(bad)
    with pytest.raises(ValueError, match=f"{re.escape(str(bad))} is not the manifest"):
        _read_manifest(bad)
    with pytest.raises(ValueError, match=f"{re.escape(str(bad))}: not a run log"):
        read_run_log(bad)
    (out / "probe" / "results.json").write_text(_DEEP)
    assert _other_finished_rows(out / "probe", []) == []


# ----------------------------------------------------------------------------- publish's folders
def test_bug_publish_refuses_a_comparison_named_index(tmp_path):
    """Bug: a comparison named ``index`` was published as docs/results/index.md, over the hand-written index of the
    results pages (its toctree of every page), which then listed itself. It is refused before anything is written."""
    from diffusionformer.experiments.publish import publish_experiment

    cfg, out = _publishable(tmp_path, name="index")
    docs = tmp_path / "docs"
    docs.mkdir()
    index = "# Results\n\nWritten by hand.\n\n```{toctree}\n:maxdepth: 1\n\nbaselines\n```\n"
    (docs / "index.md").write_text(index)
    with pytest.raises(ValueError, match="named 'index' would overwrite .*index.md"):
        publish_experiment(cfg, out, docs)
    assert (docs / "index.md").read_text() == index and sorted(p.name for p in docs.iterdir()) == ["index.md"]


def test_bug_publish_twice_over_a_published_folder_that_was_a_symlink(tmp_path):
    """Bug: with docs/results/<name> a symlink to a folder elsewhere, publish left the link behind as
    ``.<name>.previous`` (shutil.rmtree refuses a link; the error was ignored), and the next publish failed with
    "OSError: Cannot call rmtree on a symbolic link". The link is now unlinked; its target is left as it was."""
    from diffusionformer.experiments.publish import publish_experiment

    cfg, out = _publishable(tmp_path)
    docs, shared = tmp_path / "docs", tmp_path / "shared"
    docs.mkdir()
    shared.mkdir()
    (shared / "keep.txt").write_text("kept")
    (docs / "index.md").write_text("```{toctree}\n```\n")
    (docs / "probe").symlink_to(shared, target_is_directory=True)
    for _ in range(2):
        publish_experiment(cfg, out, docs)
        assert sorted(p.name for p in docs.iterdir()) == ["index.md", "probe", "probe.md"]
    assert not (docs / "probe").is_symlink() and (docs / "probe" / "results.json").is_file()
    assert [p.name for p in shared.iterdir()] == ["keep.txt"] and (shared / "keep.txt").read_text() == "kept"


# ----------------------------------------------------------------------------- gaps of hand-edited logs
def test_bug_a_400_digit_loss_is_left_out_of_the_gap_tables():
    """Bug: an evaluation whose val_loss was a 400-digit int (JSON reads it as an exact int) raised OverflowError
    from math.isfinite in the gap tables; it is now left out as a non-finite loss is."""
    from diffusionformer.experiments.gaps import run_gaps

    records = [{"split": "eval", "step": 1, "metrics": {"train_loss": 1.0, "val_loss": 2.0}},
               {"split": "eval", "step": 2, "metrics": {"train_loss": 1.0, "val_loss": 10 ** 400}}]
    assert run_gaps(records) == {"final_val": 2.0, "final_train": 1.0, "final_gap": 1.0, "best_val": 2.0,
                                 "best_step": 1.0, "best_gap": 1.0}
