"""``benchmarks/gpu_suite.sh --smoke``: which scripts the CPU smoke run starts, with a stand-in python.

Without ``GPU_SUITE_STEPS`` it runs the issue-15 script alone (as before); with it, the scripts of the
named steps, so that the second GPU call's split (``host,memory,compile,blocks``) is tried on CPU too
instead of running the issue-15 script again. A script that fails makes the smoke run fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_suite.sh"

STUB = """#!/usr/bin/env bash
# a stand-in python: logs its arguments (and TRITON_INTERPRET), fails for the script named in $FAIL_SCRIPT
echo "TRITON_INTERPRET=${TRITON_INTERPRET:-} $*" >> "$STUB_LOG"
[[ -n "${FAIL_SCRIPT:-}" && "$*" == *"$FAIL_SCRIPT"* ]] && exit 3
exit 0
"""

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def smoke(tmp_path: Path, steps: str | None, fail: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log = tmp_path / "calls.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_SUITE_", "BENCH_ISSUE15_ARGS"))}
    env.update(PYTHON=str(stub), STUB_LOG=str(log), FAIL_SCRIPT=fail)
    if steps is not None:
        env["GPU_SUITE_STEPS"] = steps
    res = subprocess.run(["bash", str(SUITE), "--smoke", str(tmp_path / "out")], env=env, capture_output=True,
                         text=True, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return res, [c for c in calls if "benchmarks/" in c]


def scripts(calls: list[str]) -> list[str]:
    return [next(w for w in c.split() if w.startswith("benchmarks/")) for c in calls]


def test_default_smoke_runs_the_issue15_script_with_the_gpu_calls_backend(tmp_path):
    res, calls = smoke(tmp_path, None)
    assert res.returncode == 0, res.stderr
    assert scripts(calls) == ["benchmarks/bench_issue15.py"]
    assert "--smoke" in calls[0] and "--library-backend sdpa" in calls[0] and "--device cpu" in calls[0]


def test_smoke_of_the_first_call_is_the_issue15_script(tmp_path):
    res, calls = smoke(tmp_path, "tests,issue15")
    assert res.returncode == 0, res.stderr
    assert scripts(calls) == ["benchmarks/bench_issue15.py"]


def test_smoke_of_the_second_call_runs_its_scripts(tmp_path):
    res, calls = smoke(tmp_path, "host,memory,compile,blocks")
    assert res.returncode == 0, res.stderr
    assert scripts(calls) == ["benchmarks/bench_host.py", "benchmarks/bench_memory.py", "benchmarks/bench_compile.py",
                              "benchmarks/bench_triton_blocks.py"]
    assert all("--device cpu" in c for c in calls)
    assert calls[-1].startswith("TRITON_INTERPRET=1 ") and "--smoke" in calls[-1]


def test_a_failing_script_fails_the_smoke_run_after_the_others(tmp_path):
    res, calls = smoke(tmp_path, "host,memory,compile", fail="bench_memory.py")
    assert res.returncode != 0
    assert scripts(calls) == ["benchmarks/bench_host.py", "benchmarks/bench_memory.py", "benchmarks/bench_compile.py"]
    assert "FAILED: bench_memory.py" in res.stdout
