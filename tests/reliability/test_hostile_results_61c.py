"""Probes of a finished comparison's result files damaged by hand or by a crash, as the read-side commands (``status``,
``summary``, ``publish``, ``gaps``, ``load_run``) read them.

Found and fixed (tests named ``test_bug_...``):

- ``train.read_metrics`` (and so ``publish``, ``gaps``, ``load_run``, ``run``'s plots): a ``metrics.jsonl`` line
  nested thousands deep (``[[[[...``, a damaged block of a log) raised ``RecursionError: maximum recursion depth
  exceeded while decoding a JSON array`` out of ``json.loads``, a traceback naming no file, where every other line
  that is not JSON is skipped with a warning naming the file and line. Now it is skipped so too.
- ``publish_experiment``, ``summary_table``: a ``results.json`` row of a run that did not complete (``"failed: ..."``,
  ``"non_finite"``) holding a value (a row edited or merged by hand: ``run`` writes ``null`` there) was averaged into
  its setting's mean and paired difference while the same table counted the run as failed and ``publish`` warned it
  had not finished: the page said "3 (1 failed)" beside a mean over three values. Such a row is now named as the
  rows of the wrong type are (``results._row_problem``); ``run`` drops it and reads the run back from its folder.
- ``gaps``: a ``results.json`` row whose task, setting or seed was a list or an object (a hand edit) stopped the
  command with a bare ``TypeError: unhashable type: 'list'`` (``gaps._unfinished``), where ``gaps`` otherwise reads a
  damaged ``results.json`` as listing no unfinished run. Such a row names no run: it is left out.
- ``publish_experiment`` (and ``add_to_toctree``, ``gaps --page``): an earlier results page or ``index.md`` that was not
  UTF-8 failed with a bare "'utf-8' codec can't decode byte 0xff" naming no file (as ``analysis/README.md`` did before
  56). Now a ValueError naming the file (``publish._read_page``); nothing is published and the page is kept.
- ``publish_experiment``: a ``manifest.json`` that was a FIFO or a folder read as absent: the page was published
  without its machine, versions and git commit, with no word, where a manifest of the wrong type is refused naming
  it. Now refused so too, as a ``results.json`` in that state is.
- ``summary_table``, ``publish_experiment`` (and ``run`` resuming the comparison): a run folder's ``summary.json``
  whose metric was ``"0.5"``, ``true`` or a list (a hand edit) was refused as "metric 'test_acc' is not among the
  evaluation keys [...]": the key is there, it is no number. The error now says so and that deleting the file has
  ``run`` rebuild it from the run's checkpoint.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from diffusionformer.experiments import publish_experiment, summary_table
from diffusionformer.experiments.gaps import main as gaps_main
from diffusionformer.experiments.results import run_dir
from diffusionformer.train import read_metrics
from experiments_tiny_configs import GAP_CURVES, TINY_GAPS_TOML, finished_study, write_gap_run


def _publish(config, out, docs):
    """``publish_experiment`` into ``docs`` with an index whose toctree takes the page; the page's text."""
    docs.mkdir(exist_ok=True)
    (docs / "index.md").write_text("# Results\n\n```{toctree}\n:maxdepth: 1\n\n```\n")
    return publish_experiment(config, out, docs).read_text()


def _gap_study(root):
    """The finished two-seed text comparison "g" of ``TINY_GAPS_TOML`` (its config file ``root/g.toml``), its run
    folders written by hand (no training) under ``root/g``."""
    (root / "g.toml").write_text(TINY_GAPS_TOML)
    for (op, seed), curve in GAP_CURVES.items():
        if seed < 2:
            write_gap_run(run_dir(root / "g", "t", op, seed), [(100 * (i + 1), t, v) for i, (t, v) in enumerate(curve)])


_DEEP = "[" * 100_000 + "]" * 100_000  # deeper than Python's recursion limit


def test_bug_a_log_line_nested_thousands_deep_is_skipped_naming_the_line(tmp_path):
    log = tmp_path / "metrics.jsonl"
    records = [{"step": s, "split": "eval", "metrics": {"test_acc": 0.5}} for s in (1, 2)]
    log.write_text(json.dumps(records[0]) + "\n" + _DEEP + "\n" + json.dumps(records[1]) + "\n")
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:2: skipping a malformed metrics line"):
        assert read_metrics(log) == records


def test_bug_a_run_log_nested_thousands_deep_does_not_stop_publish(tmp_path):
    out, config, _ = finished_study(tmp_path)
    log = run_dir(out / "h", "t", "lap", 1) / "metrics.jsonl"
    log.write_text(_DEEP + "\n" + log.read_text())
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:1: skipping a malformed metrics line"):
        page = _publish(config, out, tmp_path / "docs")
    assert "| lap | 0.6667 ± 0.1258 | +0.0667 |" in page  # the table is the rows', the log only lost its bad line


@pytest.mark.parametrize("status", ["failed: boom", "non_finite"])
@pytest.mark.parametrize("key", ["value", "selected_value"])
@pytest.mark.parametrize("reader", ["publish", "summary"])
def test_bug_a_value_in_the_row_of_a_run_that_did_not_complete_is_named(tmp_path, reader, key, status):
    out, config, results = finished_study(tmp_path)
    data = json.loads(results.read_text())
    assert (data["runs"][4]["operator"], data["runs"][4]["seed"]) == ("lap", 1)
    data["runs"][4].update({"status": status, "value": None, key: 0.99})  # averaged in, while counted as failed
    results.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"results\.json is not a results file .*run 4 of 'runs': {key} must be "
                                         rf"null for a run that did not complete \(status '{status}'\), got '0\.99'"):
        if reader == "publish":
            _publish(config, out, tmp_path / "docs")
        else:
            summary_table([config], out)


def test_a_failed_row_without_a_value_is_counted_as_failed(tmp_path):
    out, config, results = finished_study(tmp_path)
    data = json.loads(results.read_text())
    data["runs"][4].update(status="failed: boom", value=None)  # as `run` writes a failed run
    results.write_text(json.dumps(data))
    with pytest.warns(RuntimeWarning, match=r"1 of 6 runs of 'h' not finished \('t' / 'lap' seed 1\)"):
        page = _publish(config, out, tmp_path / "docs")
    assert "| lap | 0.6750 ± 0.1768 | +0.0750 |" in page and " 2 (1 failed) " in page  # seeds 0 and 2 only


@pytest.mark.parametrize("key, bad", [("task", ["t"]), ("operator", {"lap": 1}), ("seed", [0])])
def test_bug_a_results_row_of_a_list_or_object_name_does_not_stop_gaps(tmp_path, capsys, key, bad):
    _gap_study(tmp_path)
    row = {"task": "t", "operator": "lap", "seed": 0, "status": "failed: boom", "metric": "val_loss", "value": None}
    (tmp_path / "g" / "results.json").write_text(json.dumps({"runs": [dict(row, **{key: bad})]}))
    assert gaps_main([str(tmp_path / "g.toml"), "--out", str(tmp_path)]) == 0  # was: TypeError: unhashable type
    assert "| lap | " in capsys.readouterr().out


@pytest.mark.parametrize("name", ["h.md", "index.md"])
def test_bug_a_docs_page_not_utf8_is_named_and_kept(tmp_path, name):
    out, config, _ = finished_study(tmp_path)
    docs = tmp_path / "docs"
    docs.mkdir()
    if name == "h.md":
        (docs / "index.md").write_text("# Results\n\n```{toctree}\n:maxdepth: 1\n\n```\n")
    damaged = b"# Results\n\n\xff\xfe\n<!-- reading: written by hand; publish and gaps keep it -->\nmine\n"
    (docs / name).write_bytes(damaged)
    with pytest.raises(ValueError, match=rf"{re.escape(str(docs / name))}: not UTF-8 text .*save it as UTF-8"):
        publish_experiment(config, out, docs)
    assert (docs / name).read_bytes() == damaged and not (docs / "h").exists()  # nothing published, the page kept


def test_bug_a_gap_page_not_utf8_is_named(tmp_path, capsys):
    _gap_study(tmp_path)
    page = tmp_path / "docs" / "g.md"
    page.parent.mkdir()
    page.write_bytes(b"# g\n\xff\n")
    assert gaps_main([str(tmp_path / "g.toml"), "--out", str(tmp_path), "--page", str(page)]) == 2
    assert f"error: {page}: not UTF-8 text" in capsys.readouterr().err
    assert page.read_bytes() == b"# g\n\xff\n"


@pytest.mark.parametrize("kind", ["a FIFO", "a folder"])
def test_bug_a_manifest_that_is_no_regular_file_is_named(tmp_path, kind):
    if kind == "a FIFO" and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    out, config, _ = finished_study(tmp_path)
    manifest = out / "h" / "manifest.json"  # finished_study writes none: a manifest-less page is published
    os.mkfifo(manifest) if kind == "a FIFO" else manifest.mkdir()
    with pytest.raises(ValueError, match=rf"{re.escape(str(manifest))} is {kind}, not the manifest of a comparison"):
        _publish(config, out, tmp_path / "docs")


def test_a_comparison_without_a_manifest_is_published(tmp_path):
    out, config, _ = finished_study(tmp_path)
    assert "| lap | 0.6667 ± 0.1258 | +0.0667 |" in _publish(config, out, tmp_path / "docs")


@pytest.mark.parametrize("bad", ["0.5", True, [0.5], {"mean": 0.5}])
def test_bug_a_summary_metric_that_is_no_number_is_named_as_such(tmp_path, bad):
    out, config, results = finished_study(tmp_path)
    data = json.loads(results.read_text())
    data["runs"] = [r for r in data["runs"] if (r["operator"], r["seed"]) != ("lap", 1)]  # read from its folder
    results.write_text(json.dumps(data))
    path = run_dir(out / "h", "t", "lap", 1) / "summary.json"
    summary = json.loads(path.read_text())
    summary["eval"]["metrics"]["test_acc"] = bad  # was: "metric 'test_acc' is not among the evaluation keys []"
    path.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: task 't'\'s metric 'test_acc' must be a number or "
                                         r"null, got .*; delete the file to have `run` rebuild it"):
        summary_table([config], out)


def test_a_summary_without_the_metric_still_says_so(tmp_path):
    out, config, results = finished_study(tmp_path)
    results.write_text(json.dumps({"runs": [], "summary": []}))  # every run read from its folder
    path = run_dir(out / "h", "t", "lap", 1) / "summary.json"
    path.write_text(json.dumps({"status": "completed", "eval": {"step": 2, "split": "eval", "metrics": {"a": 1.0}}}))
    with pytest.raises(ValueError, match=r"metric 'test_acc' is not among the evaluation keys \['a'\]"):
        _publish(config, out, tmp_path / "docs")
