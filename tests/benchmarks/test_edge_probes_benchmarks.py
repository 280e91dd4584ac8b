"""Edge-case probes of the benchmark scripts' command lines (the Triton kernels' probes of the same sitting are in
``tests/ops/test_edge_probes_triton.py``).

Probed: ``gpu_suite.sh``'s options and ``GPU_SUITE_STEPS`` (a stand-in python, as in ``test_gpu_suite_smoke.py``);
``_common.parse_args`` / ``Report`` (``--out`` a file, the command written with the tables); ``run_all.py``'s
``--only`` / ``--threads`` / ``--out`` / ``--include`` / ``--report-only``.

Found and fixed (tests marked "Bug:"):

* ``gpu_suite.sh``: a misspelt step in ``GPU_SUITE_STEPS`` ran nothing for it and exited 0; ``--issue15 --smoke``
  took ``--smoke`` for OUT_DIR and started the GPU path; a misspelt option (``--smok``) was taken for OUT_DIR.
* ``--out`` naming a file: every script measured its first table and then died with a FileExistsError (the
  measurements lost); ``run_all.py`` likewise, with a traceback.
* ``run_all.py --only bench_dens`` ran the rest and recorded a failed script; ``--only`` with no names ran the whole
  suite; ``--threads 0`` silently meant all cores and ``--threads -1`` was a bare RuntimeError of torch;
  ``--include`` of a folder without README.md crashed only after the whole suite had run; ``--report-only`` on a
  folder without ``run_all.json`` was a FileNotFoundError traceback.
* The command written with the tables left out ``--rounds``, so it did not rerun what was measured.
* ``bench_triton_blocks.py --sizes 0 0`` swept a size twice and counted it twice in its summary (``check_indices``
  now refuses an index given twice).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _common as C  # noqa: E402
import run_all  # noqa: E402

SUITE = BENCH / "gpu_suite.sh"
STUB = """#!/usr/bin/env bash
# a stand-in python: logs its arguments, answers every check (CUDA visible, xdist and triton import)
echo "$*" >> "$STUB_LOG"
exit 0
"""
needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash, timeout")


def _suite(tmp_path: Path, *args: str, steps: str | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log = tmp_path / "calls.txt"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_SUITE_", "BENCH_ISSUE15_ARGS"))}
    env.update(PYTHON=str(stub), STUB_LOG=str(log))
    if steps is not None:
        env["GPU_SUITE_STEPS"] = steps
    res = subprocess.run(["bash", str(SUITE), *args], env=env, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    calls = log.read_text().splitlines() if log.exists() else []
    return res, [c for c in calls if "benchmarks/" in c or "tests/ops" in c]


# ---------------------------------------------------------------------------- gpu_suite.sh
@needs_bash
@pytest.mark.parametrize("smoke", [True, False], ids=["smoke", "gpu"])
def test_gpu_suite_unknown_step_is_refused_before_anything_runs(tmp_path, smoke):
    """Bug: ``GPU_SUITE_STEPS=host,memroy`` silently skipped the misspelt step and exited 0 (a GPU call spent on
    half the work); now exit 2 naming the step and the valid ones, nothing started."""
    args = ["--smoke"] if smoke else ["--issue15"]
    res, calls = _suite(tmp_path, *args, str(tmp_path / "out"), steps="host,memroy")
    assert res.returncode == 2
    assert "unknown step 'memroy'" in res.stderr and "memory" in res.stderr
    assert calls == []


@needs_bash
def test_gpu_suite_issue15_and_smoke_in_either_order(tmp_path):
    """Bug: ``--issue15 --smoke OUT`` took ``--smoke`` for OUT_DIR and went down the GPU path (``mkdir -p --smoke``);
    now both orders are the CPU smoke run into OUT."""
    res, calls = _suite(tmp_path, "--issue15", "--smoke", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    assert len(calls) == 1 and "benchmarks/bench_issue15.py --smoke --device cpu" in calls[0]
    assert f"--out {tmp_path / 'out'}" in calls[0]


@needs_bash
@pytest.mark.parametrize("args, message", [
    (["--smok"], "unknown option '--smok'"),
    (["--smoke", "a", "b"], "one OUT_DIR at most"),
])
def test_gpu_suite_bad_options_are_refused(tmp_path, args, message):
    """Bug: a misspelt option was taken for OUT_DIR (the GPU path started with ``OUT=--smok``) and a second OUT_DIR
    was silently ignored."""
    res, calls = _suite(tmp_path, *args)
    assert res.returncode == 2 and message in res.stderr
    assert calls == []


@needs_bash
def test_gpu_suite_empty_items_in_the_steps_are_skipped(tmp_path):
    """A trailing or doubled comma in ``GPU_SUITE_STEPS`` is not a step name: the named steps run, in order."""
    res, calls = _suite(tmp_path, "--issue15", str(tmp_path / "out"), steps="tests,,issue15,")
    assert res.returncode == 0, res.stderr
    assert [next(w for w in c.split() if w.startswith(("benchmarks/", "tests/"))) for c in calls] == [
        "tests/ops", "benchmarks/bench_issue15.py"]


# ---------------------------------------------------------------------------- _common
def test_out_that_is_a_file_is_a_usage_error_before_any_work(tmp_path, monkeypatch, capsys):
    """Bug: ``bench_dense.py --out results.md`` (a file) measured its first table and then failed with a
    FileExistsError from ``mkdir``, losing the measurement; now a usage error up front."""
    monkeypatch.setattr(C, "setup_threads", lambda n: pytest.fail("threads set up for a bad command line"))
    target = tmp_path / "results.md"
    target.write_text("keep me")
    with pytest.raises(SystemExit) as e:
        C.parse_args("t", ["--device", "cpu", "--out", str(target)])
    assert e.value.code == 2
    assert "--out" in capsys.readouterr().err
    assert target.read_text() == "keep me"


def test_out_folder_is_made_and_the_command_written_reruns_the_rounds(tmp_path, monkeypatch):
    """Bug: the command written with the tables dropped ``--rounds`` (a ``--rounds 3`` run claimed the default
    rounds). A nested ``--out`` that does not exist yet is made."""
    info = {"cpu": "c", "cores": 1, "torch_threads": 1, "torch": "t", "device": "cpu", "clock": "wall",
            "loadavg_1min": 0.0}
    monkeypatch.setattr(C, "machine_info", lambda *a, **k: info)  # importing PyG for it takes seconds
    out = tmp_path / "a" / "b"
    args = C.parse_args("t", ["--device", "cpu", "--threads", "1", "--rounds", "3", "--out", str(out)])
    assert out.is_dir()
    rep = C.Report("bench_x", "X", args)
    rep.table("t", ["a"], [[1.0]])
    assert rep.command() == "python benchmarks/bench_x.py --device cpu --threads 1 --rounds 3"
    assert "--rounds 3" in (out / "bench_x.md").read_text()
    default = C.Report("bench_x", "X", C.parse_args("t", ["--device", "cpu", "--threads", "1", "--out", str(out)]))
    assert default.command() == "python benchmarks/bench_x.py --device cpu --threads 1"


def test_a_size_index_given_twice_is_refused_before_any_work(tmp_path, monkeypatch):
    """Bug: ``bench_triton_blocks.py --sizes 0 0`` swept size 0 twice (its GPU time again) and counted it twice in
    the summary's geometric mean over sizes; now a SystemExit naming the index, nothing written."""
    import bench_triton_blocks as TB

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(TB, "run_job", lambda *a, **k: pytest.fail("work started"), raising=False)
    with pytest.raises(SystemExit, match=r"--sizes names \[0\] more than once"):
        TB.main(["--device", "cpu", "--threads", "1", "--sizes", "0", "1", "0", "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())
    C.check_indices("s", "--sizes", [2, 0, 1], [10, 20, 30], "all")  # distinct indices in any order pass


# ---------------------------------------------------------------------------- run_all.py
@pytest.fixture
def no_subprocess(monkeypatch):
    """run_all.main must refuse before it starts any benchmark."""
    monkeypatch.setattr(run_all.subprocess, "call", lambda *a, **k: pytest.fail(f"a benchmark was started: {a}"))
    monkeypatch.setattr(C, "setup_threads", lambda n: pytest.fail("threads set up for a bad command line"))


@pytest.mark.parametrize("argv, message", [
    (["--only", "bench_dens"], "unknown benchmark 'bench_dens'; did you mean 'bench_dense'?"),
    (["--only", "bench_dense.py"], "did you mean 'bench_dense'?"),
    (["--only"], "--only was given without names"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--threads", "-1"], "--threads must be >= 1, got -1"),
])
def test_run_all_bad_selection_is_refused_up_front(argv, message, tmp_path, no_subprocess, capsys):
    """Bug: ``--only bench_dens`` ran the other names and recorded a failed script; ``--only`` with no names (an
    empty expansion) ran the whole 10-15 min suite; ``--threads 0`` silently meant all cores and ``--threads -1``
    was a bare RuntimeError of torch. Now usage errors before any benchmark."""
    with pytest.raises(SystemExit) as e:
        run_all.main([*argv, "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_run_all_out_file_and_missing_include_are_refused_up_front(tmp_path, no_subprocess, capsys):
    """Bug: ``--include other_run`` without ``other_run/README.md`` crashed with a FileNotFoundError only after the
    whole suite had run (no README.md for it); ``--out`` a file was a FileExistsError traceback."""
    (tmp_path / "other").mkdir()
    with pytest.raises(SystemExit):
        run_all.main(["--out", str(tmp_path / "out"), "--include", str(tmp_path / "other")])
    assert "--include: no README.md in" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        run_all.main(["--out", str(tmp_path / "file")])
    assert "--out" in capsys.readouterr().err


def test_run_all_report_only_without_a_run_is_a_usage_error(tmp_path, capsys):
    """Bug: ``--report-only`` on a folder without ``run_all.json`` was a FileNotFoundError traceback."""
    with pytest.raises(SystemExit) as e:
        run_all.main(["--report-only", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "no run_all.json" in capsys.readouterr().err


def test_run_all_report_only_rebuilds_a_committed_cuda_run(tmp_path):
    """A results folder of the committed CUDA run rebuilds its README with every table and the GPU named."""
    src = BENCH / "results-cuda"
    for f in src.iterdir():
        if f.suffix in (".md", ".json"):
            shutil.copy(f, tmp_path / f.name)
    assert run_all.main(["--report-only", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    for name in ("bench_dense", "bench_kstep", "bench_sparse"):
        assert (src / f"{name}.md").read_text().split("\n", 1)[0] in text  # its title, a level-2 heading
    assert "GPU " in text and "notes below were written about the CPU results" in text
