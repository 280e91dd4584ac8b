"""Shared stand-ins of the experiment tests (and ``experiments_tiny_configs`` made importable: pytest runs with
``--import-mode=importlib``, which leaves ``sys.path`` alone)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from diffusionformer.experiments.results import run_dir

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


class _Proc:
    """A ``subprocess.Popen`` stand-in for run_workers: records its arguments and calls, starts nothing."""

    started: list = []
    code_of = staticmethod(lambda k: 0)

    def __init__(self, cmd, stdout=None, stderr=None, env=None):
        self.k = len(self.started)
        self.cmd, self.stdout, self.stderr, self.env, self.pid = cmd, stdout, stderr, env, 4000 + self.k
        self.terminated = self.killed = False
        self.wait_timeouts = []
        self.started.append(self)

    def poll(self):
        return None

    def wait(self, timeout=None):
        self.wait_timeouts.append(timeout)
        return self.code_of(self.k)

    def terminate(self):
        self.terminated = True

    def kill(self):
        self.killed = True


@pytest.fixture
def procs(monkeypatch):
    import subprocess

    _Proc.started = []
    monkeypatch.setattr(subprocess, "Popen", _Proc)
    monkeypatch.setattr(_Proc, "code_of", staticmethod(lambda k: 0))
    return _Proc


def _write_run(out, task, op, seed, records, status="completed", **summary):
    """A run folder by hand: ``summary.json`` (``status`` None: none) and ``metrics.jsonl``."""
    rdir = run_dir(out, task, op, seed)
    rdir.mkdir(parents=True, exist_ok=True)
    if status is not None:
        (rdir / "summary.json").write_text(json.dumps({"status": status, **summary}))
    (rdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return rdir


@pytest.fixture
def write_run():
    """:func:`_write_run`: writes the run folder ``run_dir(out, task, op, seed)`` the runner would leave."""
    return _write_run


class _StandInFigure:
    """A matplotlib ``Figure`` stand-in for ``experiments.plots._figure``: its axes are ``ax_class`` objects that
    record what is drawn, every figure made is kept in ``made``, and ``savefig`` writes a placeholder file."""

    ax_class: type = object
    made: list = []

    def __init__(self, **kwargs):
        self.axes = []
        type(self).made.append(self)

    def subplots(self, *shape):
        self.axes = [self.ax_class() for _ in range(shape[1] if shape else 1)]
        return tuple(self.axes) if shape else self.axes[0]

    def suptitle(self, text):
        pass

    def savefig(self, path, dpi=None):
        path.write_bytes(b"figure")


@pytest.fixture
def stand_in_figure(monkeypatch):
    """``install(ax_class)``: puts a :class:`_StandInFigure` whose axes are ``ax_class`` in place of
    ``experiments.plots._figure`` for the test, and returns that class (its ``made`` lists the figures)."""
    from diffusionformer.experiments import plots

    def install(ax_class):
        figure = type("_Figure", (_StandInFigure,), {"ax_class": ax_class, "made": []})
        monkeypatch.setattr(plots, "_figure", figure)
        return figure

    return install
