"""Edge probes of the runner's per-run overhead (45): after every finished run ``run_experiment`` rewrote the
figures of every task (a second or more per task: matplotlib's constrained layout and PNG writing), although a run
changes its own task's figures only. A ``run_experiment`` call now keeps what it last drew (``plots._PLOT_CACHE``)
and skips a task whose rows and run logs are unchanged and whose two files on disk are still the ones it wrote.
These tests pin that the figures stay byte-identical to the uncached ones after every step, that the figures are
drawn again when a log or a figure is rewritten by another process, and that unchanged tasks are not redrawn."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from diffusionformer.experiments import load_experiment_config  # noqa: E402
from diffusionformer.experiments import plots  # noqa: E402
from diffusionformer.experiments.results import RunResult, finished_runs, run_dir  # noqa: E402

_TRAIN = {"max_steps": 2, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
          "checkpoint_interval": 2}


def _cfg(tasks=("t0", "t1"), seeds=(0,)):
    return load_experiment_config({
        "name": "ov", "seeds": list(seeds),
        "tasks": [{"name": t, "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2}, "train": dict(_TRAIN)} for t in tasks],
        "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}],
    })


def _records(loss0, acc):
    return [{"step": 1, "split": "train", "loss": loss0, "metrics": {}},
            {"step": 2, "split": "train", "loss": loss0 / 2, "metrics": {}},
            {"step": 2, "split": "eval", "loss": 1.0, "metrics": {"test_acc": acc}}]


def _log(out, task, op, seed, records):
    rdir = run_dir(out, task, op, seed)
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _row(task, op, seed, value, status="completed"):
    return RunResult(task, op, seed, status, "test_acc", value, {"test_acc": value})


def _pngs(out):
    return {p.name: p.read_bytes() for p in sorted((out / "plots").glob("*.png"))}


@pytest.fixture
def drawn(monkeypatch):
    """The figure paths ``plots._save_figure`` wrote, in order (the figures are still really written)."""
    paths = []
    real = plots._save_figure

    def save(fig, path):
        paths.append(Path(path).name)
        real(fig, path)

    monkeypatch.setattr(plots, "_save_figure", save)
    return paths


def _other_process(code, *args):
    """``code`` in a fresh interpreter (another worker writing the comparison's files)."""
    subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True, timeout=120)


# rewrite a file in place with bytes of the same length and put its mtime back: only the content (and ctime) differ
_SAME_SIZE_IN_PLACE = """
import os, sys
p = sys.argv[1]; old = sys.argv[2].encode(); new = sys.argv[3].encode()
st = os.stat(p)
with open(p, "rb") as f:
    data = f.read()
assert len(old) == len(new) and old in data
data = data.replace(old, new, 1)
with open(p, "r+b") as f:
    f.write(data)
os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
"""


def test_pins_cached_figures_equal_the_uncached_ones_after_every_step(tmp_path, drawn):
    """Bug (overhead): every write of a study's outputs drew every task's figures again. Pins: with the cache of a
    ``run_experiment`` call, after each step (a run added to one task, a log rewritten by another process with the
    same size and mtime, a row's value changed, nothing changed) the figures are byte-identical to those drawn
    without a cache, and only the figures of a task whose inputs changed are drawn."""
    config = _cfg()
    a, b = tmp_path / "a" / "ov", tmp_path / "b" / "ov"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    rows: list[RunResult] = []

    def step(change):
        change(a)
        change(b)
        del drawn[:]
        token = plots._PLOT_CACHE.set(cache)
        try:
            plots.plot_experiment(a, config, list(rows))
        finally:
            plots._PLOT_CACHE.reset(token)
        now = list(drawn)
        plots.plot_experiment(b, config, list(rows))  # no cache: every task drawn
        assert _pngs(a) == _pngs(b)
        return sorted(now)

    cache: dict = {}

    def add(task, op, loss, acc):
        def change(out):
            _log(out, task, op, 0, _records(loss, acc))
        rows.append(_row(task, op, 0, acc))
        return change

    t0 = ["t0_curves.png", "t0_final.png"]
    t1 = ["t1_curves.png", "t1_final.png"]
    assert step(add("t0", "attention", 2.0, 0.5)) == t0
    assert step(add("t0", "lap", 1.5, 0.625)) == t0
    assert step(add("t1", "attention", 3.0, 0.25)) == t1  # t0's runs did not change: not drawn again
    assert step(add("t1", "lap", 2.5, 0.375)) == t1

    def rewrite_log(out):  # another worker rewrote t0/attention's log: same size, same mtime, other losses
        _other_process(_SAME_SIZE_IN_PLACE, run_dir(out, "t0", "attention", 0) / "metrics.jsonl", '"loss": 2.0',
                       '"loss": 4.0')
    assert step(rewrite_log) == t0

    def nothing(out):
        pass
    rows[3] = _row("t1", "lap", 0, 0.875)  # a row changed (its log did not)
    assert step(nothing) == t1
    rows[1] = _row("t0", "lap", 0, 0.625, status="failed")  # t0/lap's status only: its curve is drawn dotted now
    assert step(nothing) == t0
    assert step(nothing) == []  # the pass after the last run: nothing to draw


@pytest.mark.parametrize("how", ["in_place_same_size_and_mtime", "replaced_same_size", "deleted"])
def test_pins_a_figure_another_process_rewrote_is_drawn_again(tmp_path, drawn, how):
    """Bug (overhead): see above. Pins: the cache never trusts a figure file it did not write last: one another
    process rewrote (in place with the same size and mtime; or replaced by a file of the same size) or removed is
    drawn again, byte-identical to the uncached figure, although the rows and logs did not change."""
    config = _cfg(tasks=("t0",))
    out, ref = tmp_path / "a" / "ov", tmp_path / "b" / "ov"
    rows = [_row("t0", "attention", 0, 0.5)]
    for o in (out, ref):
        o.mkdir(parents=True)
        _log(o, "t0", "attention", 0, _records(2.0, 0.5))
    plots.plot_experiment(ref, config, rows)
    cache: dict = {}
    token = plots._PLOT_CACHE.set(cache)
    try:
        plots.plot_experiment(out, config, rows)
        assert _pngs(out) == _pngs(ref)
        del drawn[:]
        plots.plot_experiment(out, config, rows)
        assert drawn == []  # unchanged: skipped
        target = out / "plots" / "t0_curves.png"
        size = target.stat().st_size
        if how == "in_place_same_size_and_mtime":
            data = target.read_bytes()
            old = data[size // 2:size // 2 + 4].hex()
            _other_process(_SAME_SIZE_IN_PLACE.replace("sys.argv[2].encode()", "bytes.fromhex(sys.argv[2])")
                           .replace("sys.argv[3].encode()", "bytes.fromhex(sys.argv[3])"),
                           target, old, bytes(255 - x for x in bytes.fromhex(old)).hex())
        elif how == "replaced_same_size":
            _other_process("import os, sys; p = sys.argv[1]; n = os.path.getsize(p); "
                           "open(p + '.x', 'wb').write(b'x' * n); os.replace(p + '.x', p)", target)
        else:
            _other_process("import os, sys; os.remove(sys.argv[1])", target)
        assert _pngs(out) != _pngs(ref)
        plots.plot_experiment(out, config, rows)
    finally:
        plots._PLOT_CACHE.reset(token)
    assert drawn == ["t0_curves.png", "t0_final.png"]
    assert _pngs(out) == _pngs(ref)


def test_pins_a_study_draws_a_tasks_figures_after_its_own_runs_only(tmp_path, drawn):
    """Bug (overhead): a study of two tasks drew the first task's figures again after every run of the second and
    once more at the end (here 10 figures for 2 runs; n tasks: quadratic in n). Pins: each task's figures are drawn
    once per run of that task, the cache does not outlive the call, and the files at the end are byte-identical to
    figures drawn afresh from the runs on disk without a cache."""
    from diffusionformer.experiments import run_experiment

    config = _cfg(tasks=("t0", "t1"), seeds=(0,))
    config = load_experiment_config({**config.to_dict(), "operators": [{"name": "attention"}]})
    run_experiment(config, tmp_path / "r", progress=False, log=lambda s: None)
    assert drawn == ["t0_curves.png", "t0_final.png", "t1_curves.png", "t1_final.png"]
    assert plots._PLOT_CACHE.get() is None
    out = tmp_path / "r" / "ov"
    fresh = tmp_path / "fresh" / "ov"
    shutil.copytree(out, fresh)
    shutil.rmtree(fresh / "plots")
    plots.plot_experiment(fresh, config, finished_runs(fresh, config))
    assert _pngs(out) == _pngs(fresh)
    del drawn[:]
    run_experiment(config, tmp_path / "r", progress=False, log=lambda s: None)  # all finished: a new call draws
    assert drawn == ["t0_curves.png", "t0_final.png", "t1_curves.png", "t1_final.png"]
    assert _pngs(out) == _pngs(fresh)
    assert sorted(os.listdir(out / "plots")) == sorted(os.listdir(fresh / "plots"))  # no temporary left behind
