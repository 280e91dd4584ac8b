"""Shared fixtures of the benchmark-script tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

_SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_suite.sh"

_STUB_PYTHON = """#!/usr/bin/env bash
# a stand-in python: logs its arguments (and TRITON_INTERPRET), fails for the script named in $FAIL_SCRIPT
echo "TRITON_INTERPRET=${TRITON_INTERPRET:-} $*" >> "$STUB_LOG"
[[ -n "${FAIL_SCRIPT:-}" && "$*" == *"$FAIL_SCRIPT"* ]] && exit 3
exit 0
"""


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """The scripts' ``main`` sets ``torch.set_num_threads(--threads)``: give the rest of the session its count back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture
def gpu_suite_stub(tmp_path):
    """``benchmarks/gpu_suite.sh`` with a stand-in python (CUDA available to every check):

    ``run(*args, steps=None, fail="") -> (completed process, calls)`` runs ``bash gpu_suite.sh ARGS`` with
    ``GPU_SUITE_STEPS=steps`` (unset for ``None``); the stand-in logs each call as ``TRITON_INTERPRET=... ARGS`` to
    ``tmp_path/calls.txt`` (appended over runs) and exits 3 for the script named ``fail``; ``calls`` are the logged
    lines naming a ``benchmarks/`` script. ``scripts(calls)`` gives those scripts' paths."""
    stub = tmp_path / "python"
    stub.write_text(_STUB_PYTHON)
    stub.chmod(0o755)
    log = tmp_path / "calls.txt"

    def run(*args: str, steps: str | None = None, fail: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_SUITE_", "BENCH_ISSUE15_ARGS"))}
        env.update(PYTHON=str(stub), STUB_LOG=str(log), FAIL_SCRIPT=fail)
        if steps is not None:
            env["GPU_SUITE_STEPS"] = steps
        res = subprocess.run(["bash", str(_SUITE), *args], env=env, capture_output=True, text=True, timeout=60,
                             cwd=tmp_path)
        calls = log.read_text().splitlines() if log.exists() else []
        return res, [c for c in calls if "benchmarks/" in c]

    def scripts(calls: list[str]) -> list[str]:
        return [next(w for w in c.split() if w.startswith("benchmarks/")) for c in calls]

    return SimpleNamespace(run=run, scripts=scripts)
