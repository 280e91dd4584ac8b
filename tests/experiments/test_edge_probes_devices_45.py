"""Edge-case probes: run times over devices of different kinds, and a matplotlib that is installed but broken.

Found and fixed (tests named ``test_bug_...``):

- ``tables.aggregate`` / ``format_table`` / ``publish_experiment``: the ``time/run (s)`` cell averaged the run
  times of a row's seeds though they trained on devices of different kinds (a GPU call's seeds and CPU seeds;
  ``summary.json`` records each run's ``device``), and the page's "Training wall time: X min in all" summed them,
  saying so nowhere. Such a cell now names the kinds with the mean per kind, the wall-time line the minutes per kind;
  a row (a page) of one device kind, or of runs whose summary does not record it, is written as before.
- ``experiments.plots._figure`` (``analyze``, ``run``, ``gaps``), ``experiments.analyze._figure``,
  ``analysis.plots._figure_class``, ``graph.export.draw_attention_graph``: a matplotlib that is installed but fails
  to import (a dependency of it missing) was reported as "plots need matplotlib: pip install ...". The message now
  says it is installed but does not import and quotes the error, as ``data._optional.import_optional`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import finished_runs, run_dir

INDEX = "# Results\n\n```{toctree}\n:maxdepth: 1\n\n```\n"


def _config():
    return load_experiment_config({
        "name": "dev", "seeds": [0, 1, 2],
        "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 4}}],
        "operators": [{"name": "base"}, {"name": "lap", "laplacian_heads": 1}]})


def _runs(out, devices):
    """Run folders of ``dev`` by hand: ``devices[(op, seed)]`` is the summary's ``device`` (``None``: not recorded,
    as in a summary written before it was); the elapsed seconds are 10 on cuda and 100 otherwise."""
    for (op, seed), device in devices.items():
        rdir = run_dir(out, "d", op, seed)
        rdir.mkdir(parents=True)
        rec = {"step": 4, "split": "eval", "metrics": {"test_acc": 0.5 + seed / 10}}
        (rdir / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
        summary = {"status": "completed", "eval": rec, "num_parameters": 7,
                   "elapsed": 10.0 if str(device).startswith("cuda") else 100.0}
        if device is not None:
            summary["device"] = device
        (rdir / "summary.json").write_text(json.dumps(summary))
    return finished_runs(out, _config())


def _all(device):
    return {(op, s): device for op in ("base", "lap") for s in (0, 1, 2)}


def _time_cells(text):
    return {ln.split("|")[1].strip(): ln.split("|")[-2].strip() for ln in text.splitlines()
            if ln.startswith("| base |") or ln.startswith("| lap |")}


def test_bug_time_per_run_over_devices_of_different_kinds_says_so(tmp_path):
    """Bug: a row whose seeds trained on cuda (10 s) and cpu (100 s) showed "time/run (s)" 70.0, a mean over two
    devices of different speeds that the table gave as one device's time. It now names the kinds, with the mean
    per kind (computed here by hand); the other row, all on cpu, keeps its plain cell."""
    from diffusionformer.experiments.tables import aggregate, format_table

    devices = _all("cpu") | {("lap", 0): "cuda:0"}
    runs = _runs(tmp_path / "out", devices)
    assert {(r.operator, r.seed): r.device for r in runs} == devices
    rows = {r["operator"]: r for r in aggregate(runs)}
    assert "elapsed_by_device" not in rows["base"]
    assert rows["lap"]["elapsed_by_device"] == {"cpu": 100.0, "cuda": 10.0}
    cells = _time_cells(format_table(list(rows.values()), _config()))
    assert cells == {"base": "100.0", "lap": "70.0 (mixed devices: cpu 100.0, cuda 10.0)"}


def test_bug_a_pages_wall_time_over_devices_of_different_kinds_is_split(tmp_path):
    """Bug: the page's wall-time line summed cuda and cpu minutes as "X min in all" without a word. With one cuda
    run (10 s) and five cpu runs (100 s each) it now adds the minutes per kind; ``results.json`` keeps each run's
    device, so that a later ``publish`` (which reads it) still tells them apart."""
    from diffusionformer.experiments.outputs import write_outputs
    from diffusionformer.experiments.publish import publish_experiment

    out = tmp_path / "results"
    runs = _runs(out / "dev", _all("cpu") | {("lap", 0): "cuda"})
    write_outputs(out / "dev", _config(), runs)
    stored = json.loads((out / "dev" / "results.json").read_text())["runs"]
    assert sorted(r["device"] for r in stored) == ["cpu"] * 5 + ["cuda"]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(INDEX)
    text = publish_experiment(_config(), out, docs).read_text()
    line = next(ln for ln in text.splitlines() if "Training wall time" in ln)
    assert "8.5 min in all, of which 8.3 min on cpu, 0.2 min on cuda (per-run times in the tables)" in line
    assert _time_cells(text)["lap"] == "70.0 (mixed devices: cpu 100.0, cuda 10.0)"


def test_pins_one_device_kind_writes_as_before(tmp_path):
    """Runs all on one device kind (``cuda:0`` and ``cuda:1`` are one kind), and runs whose summaries do not record
    the device (older ones, or mixed with one known kind), give the same table, page and ``results.json`` summary as
    before: byte for byte the output of runs without ``device`` (whose ``results.json`` rows say ``null``)."""
    from diffusionformer.experiments.outputs import write_outputs
    from diffusionformer.experiments.publish import publish_experiment

    def outputs(tag, devices):
        out = tmp_path / tag / "results"
        write_outputs(out / "dev", _config(), _runs(out / "dev", devices))
        docs = tmp_path / tag / "docs"
        docs.mkdir()
        (docs / "index.md").write_text(INDEX)
        page = publish_experiment(_config(), out, docs).read_text()
        return (page, (out / "dev" / "results.md").read_text(),
                json.loads((out / "dev" / "results.json").read_text()))

    old = outputs("old", _all(None))
    assert all(r["device"] is None for r in old[2]["runs"])
    assert "mixed" not in old[1] and "of which" not in old[0]
    for tag, devices in (("cpu", _all("cpu")), ("half", _all(None) | {("base", 0): "cpu", ("lap", 1): "cpu"})):
        page, md, results = outputs(tag, devices)
        assert (page, md, results["summary"]) == (old[0], old[1], old[2]["summary"])
    cuda = outputs("cuda", {(op, s): f"cuda:{s % 2}" for op in ("base", "lap") for s in (0, 1, 2)})
    assert "mixed" not in cuda[1] and "of which" not in cuda[0]


_BROKEN = textwrap.dedent("""
    import sys

    class _Broken:  # matplotlib installed, one of its dependencies missing
        def find_spec(self, name, path=None, target=None):
            if name == "matplotlib" or name.startswith("matplotlib."):
                raise ImportError("No module named 'kiwisolver'", name="kiwisolver")
            return None

    class _Missing:
        def find_spec(self, name, path=None, target=None):
            if name == "matplotlib" or name.startswith("matplotlib."):
                raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")
            return None

    sys.meta_path.insert(0, _Broken() if sys.argv[1] == "broken" else _Missing())
    for m in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        del sys.modules[m]
    from diffusionformer.analysis.plots import _figure_class
    from diffusionformer.experiments.analyze import _figure as analyze_figure
    from diffusionformer.experiments.plots import _figure
    from diffusionformer.graph.export import draw_attention_graph

    for f in (_figure, analyze_figure, _figure_class, lambda: draw_attention_graph(None, {})):
        try:
            f()
        except ImportError as exc:
            print(exc)
        else:
            print("no error")
""")


def _messages(mode):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _BROKEN, mode], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_bug_a_broken_matplotlib_is_not_called_missing():
    """Bug: with matplotlib installed but failing to import (``ImportError: No module named 'kiwisolver'``), the
    plotting functions said "plots need matplotlib: pip install ...", which it is; the error at fault was named
    nowhere in what ``analyze`` and ``run`` print. Checked in a fresh interpreter whose import system fails
    ``import matplotlib`` so."""
    pytest.importorskip("networkx")
    lines = _messages("broken")
    assert len(lines) == 4
    for line, who in zip(lines, ("plots need", "plots need", "diffusionformer.analysis.plots needs",
                                 "draw_attention_graph needs")):
        assert line == f"{who} matplotlib, which is installed but does not import: No module named 'kiwisolver'"


def test_pins_a_missing_matplotlib_keeps_its_message():
    """A matplotlib that is not installed keeps the message that says how to install it."""
    pytest.importorskip("networkx")
    assert _messages("missing") == [
        'plots need matplotlib: pip install "diffusionformer[plot]"',
        'plots need matplotlib: pip install "diffusionformer[plot]"',
        "diffusionformer.analysis.plots needs matplotlib; install the `plot` extra: pip install 'diffusionformer[plot]'",
        "draw_attention_graph needs matplotlib; install the `plot` extra: pip install 'diffusionformer[plot]'",
    ]
