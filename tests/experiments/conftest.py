"""Shared stand-ins of the experiment tests."""

from __future__ import annotations

import json

import pytest

from diffusionformer.experiments.results import run_dir


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
