"""Edge-case probes of the benchmark scripts, fifth sitting (GPU-only paths run with stand-ins: CPU only, no
network, files only under ``tmp_path``).

Found and fixed (tests named ``test_bug_*``):

* ``gpu_suite.sh``: ``GPU_SUITE_STEPS=host,memory`` without ``--issue15`` ran nothing for those steps and exited 0
  (they ran only with ``--issue15``, or inside the grid step), while the ``--smoke`` try of the same steps ran both;
* ``run_all.py``: a script that failed before its first table left the previous run's ``<name>.md`` in the folder
  (the committed ``benchmarks/results-cuda`` is the suite's default), and ``README.md`` showed it as this run's;
  ``--device cuda --clock cpu`` started every script, each of which refused it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _common as C  # noqa: E402
import run_all  # noqa: E402

INFO = {"cpu": "c", "cores": 1, "torch_threads": 1, "torch": "t", "device": "cpu", "clock": "wall",
        "loadavg_1min": 0.0, "date": "d"}
needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@needs_bash
def test_bug_gpu_suite_host_and_memory_steps_run_without_issue15(tmp_path, gpu_suite_stub):
    """Bug: ``GPU_SUITE_STEPS=host,memory,compile bash gpu_suite.sh OUT`` (no ``--issue15``) ran bench_compile.py
    alone and exited 0: host and memory ran only with ``--issue15`` or inside the grid step, which was not named (a
    GPU call spent on nothing), although the ``--smoke`` try of the same steps ran both scripts. Now they run alone
    whenever the grid step (run_all.py, which includes them) does not run."""
    res, calls = gpu_suite_stub.run(str(tmp_path / "out"), steps="host,memory,compile")
    assert res.returncode == 0, res.stderr
    assert gpu_suite_stub.scripts(calls) == ["benchmarks/bench_host.py", "benchmarks/bench_memory.py",
                                             "benchmarks/bench_compile.py"]
    smoke, smoke_calls = gpu_suite_stub.run("--smoke", str(tmp_path / "smoke"), steps="host,memory,compile")
    assert smoke.returncode == 0, smoke.stderr
    assert gpu_suite_stub.scripts(smoke_calls)[-3:] == gpu_suite_stub.scripts(calls)  # what the GPU call runs


@needs_bash
def test_gpu_suite_grid_step_still_runs_host_and_memory_once(tmp_path, gpu_suite_stub):
    """With the grid step, host and memory are run_all.py's (not run a second time); with --issue15 alone."""
    _, calls = gpu_suite_stub.run(str(tmp_path / "out"), steps="grid,host,memory")
    assert gpu_suite_stub.scripts(calls) == ["benchmarks/run_all.py"]
    (tmp_path / "calls.txt").unlink()
    _, calls = gpu_suite_stub.run("--issue15", str(tmp_path / "out"), steps="grid,host,memory")
    assert gpu_suite_stub.scripts(calls) == ["benchmarks/bench_host.py", "benchmarks/bench_memory.py"]


def test_bug_run_all_failed_script_does_not_show_the_previous_runs_tables(tmp_path, monkeypatch):
    """Bug: run_all.py left ``<name>.md`` of an earlier run in ``--out`` (gpu_suite.sh's default is the committed
    ``benchmarks/results-cuda``); a script that failed before its first table (bench_sparse.py without PyG, say)
    kept it, and README.md showed those old tables as this run's, beside "Failed: <name>". Now a script's old
    files are removed before it runs; its own partial tables still count."""
    monkeypatch.setattr(C, "machine_info", lambda *a, **k: dict(INFO))
    monkeypatch.setattr(C, "setup_threads", lambda n: n or 1)
    for name in ("bench_sparse", "bench_gpt"):
        (tmp_path / f"{name}.md").write_text(f"## {name}\n\nSTALE TABLE of {name}\n")
        (tmp_path / f"{name}.json").write_text("{}")

    def call(cmd):  # noqa: ANN001, ANN202 - bench_sparse fails before any table; bench_gpt writes one and fails
        name = Path(cmd[1]).stem
        if name == "bench_gpt":
            (tmp_path / "bench_gpt.md").write_text("## bench_gpt\n\nPARTIAL TABLE of this run\n")
        return 1

    monkeypatch.setattr(run_all.subprocess, "call", call)
    assert run_all.main(["--only", "bench_sparse", "bench_gpt", "--threads", "1", "--out", str(tmp_path)]) == 1
    readme = (tmp_path / "README.md").read_text()
    assert "STALE" not in readme
    assert "## bench_sparse\n\n(no result: the script failed)" in readme
    assert "PARTIAL TABLE of this run" in readme
    assert not (tmp_path / "bench_sparse.json").exists()
    assert json.loads((tmp_path / "run_all.json").read_text())["failed"] == ["bench_sparse", "bench_gpt"]


def test_bug_run_all_cuda_with_cpu_clock_is_a_usage_error(tmp_path, monkeypatch, capsys):
    """Bug: ``run_all.py --device cuda --clock cpu`` started every benchmark, each of which refused the pair (a
    usage error of its own), and the suite ended with every script failed; now a usage error before anything
    runs, as each script gives."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(run_all.subprocess, "call", lambda *a, **k: pytest.fail(f"a benchmark was started: {a}"))
    monkeypatch.setattr(C, "machine_info", lambda *a, **k: pytest.fail("machine_info called"))
    with pytest.raises(SystemExit) as e:
        run_all.main(["--device", "cuda", "--clock", "cpu", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "--clock cpu measures host CPU time" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
