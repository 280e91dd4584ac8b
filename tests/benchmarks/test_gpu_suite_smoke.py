"""``benchmarks/gpu_suite.sh --smoke``: which scripts the CPU smoke run starts, with a stand-in python.

Without ``GPU_SUITE_STEPS`` it runs the issue-15 script alone (as before); with it, the scripts of the
named steps, so that the second GPU call's split (``host,memory,compile,blocks``) is tried on CPU too
instead of running the issue-15 script again. A script that fails makes the smoke run fail.
"""

from __future__ import annotations

import shutil

import pytest

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def test_default_smoke_runs_the_issue15_script_with_the_gpu_calls_backend(tmp_path, gpu_suite_stub):
    res, calls = gpu_suite_stub.run("--smoke", str(tmp_path / "out"), steps=None)
    assert res.returncode == 0, res.stderr
    assert gpu_suite_stub.scripts(calls) == ["benchmarks/bench_issue15.py"]
    assert "--smoke" in calls[0] and "--library-backend sdpa" in calls[0] and "--device cpu" in calls[0]


def test_smoke_of_the_first_call_is_the_issue15_script(tmp_path, gpu_suite_stub):
    res, calls = gpu_suite_stub.run("--smoke", str(tmp_path / "out"), steps="tests,issue15")
    assert res.returncode == 0, res.stderr
    assert gpu_suite_stub.scripts(calls) == ["benchmarks/bench_issue15.py"]


def test_smoke_of_the_second_call_runs_its_scripts(tmp_path, gpu_suite_stub):
    res, calls = gpu_suite_stub.run("--smoke", str(tmp_path / "out"), steps="host,memory,compile,blocks")
    assert res.returncode == 0, res.stderr
    assert gpu_suite_stub.scripts(calls) == ["benchmarks/bench_host.py", "benchmarks/bench_memory.py",
                                             "benchmarks/bench_compile.py", "benchmarks/bench_triton_blocks.py"]
    assert all("--device cpu" in c for c in calls)
    assert calls[-1].startswith("TRITON_INTERPRET=1 ") and "--smoke" in calls[-1]


def test_a_failing_script_fails_the_smoke_run_after_the_others(tmp_path, gpu_suite_stub):
    res, calls = gpu_suite_stub.run("--smoke", str(tmp_path / "out"), steps="host,memory,compile",
                                    fail="bench_memory.py")
    assert res.returncode != 0
    assert gpu_suite_stub.scripts(calls) == ["benchmarks/bench_host.py", "benchmarks/bench_memory.py",
                                             "benchmarks/bench_compile.py"]
    assert "FAILED: bench_memory.py" in res.stdout
