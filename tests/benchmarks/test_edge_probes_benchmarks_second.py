"""Edge-case probes of the benchmark scripts, second sitting (the first: ``test_edge_probes_benchmarks.py``).

Probed: which copy of the package the scripts import, ``Report``'s files when a write is cut short and the command
written with the tables, ``gpu_suite.sh``'s grid step and OUT_DIR, ``run_all.py`` without CUDA and its command,
``bench_kstep.py``'s caption. The GPU paths are run with stand-ins (a stand-in python for ``gpu_suite.sh``, stand-in
timings): CPU only, no network, files only under ``tmp_path``.

Found and fixed (tests named ``test_bug_*``):

* ``_common`` imported ``diffusionformer`` before it put the checkout on ``sys.path``: a script run from a checkout
  benchmarked another copy of the package installed in the environment (or failed with a ModuleNotFoundError
  without one);
* ``Report.write`` truncated ``<name>.md`` / ``.json`` and then wrote them: a run killed while writing (a GPU call's
  time limit) lost every table it had finished;
* the command written with the tables left out the script's own options (``bench_issue15.py --smoke
  --library-backend sdpa`` was recorded as ``bench_issue15.py``, which runs the full sizes with another back-end);
  ``run_all.py`` left out ``--only``;
* ``gpu_suite.sh``: a failed script in the grid step (``run_all.py`` exits 1) ended the whole suite under ``set -e``,
  before the issue-15, compile and block steps; a relative OUT_DIR was taken inside the checkout, not in the
  caller's directory;
* ``run_all.py --device cuda`` without CUDA was an AssertionError traceback of torch;
* ``bench_kstep.py``'s kernel table claimed 5 (or 3) rounds when ``--rounds`` set another count;
* ``bench_issue15.py --device cpu`` without ``--smoke`` ran the full GPU sizes after a printed hint (sitting 33).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _common as C  # noqa: E402
import bench_kstep as KS  # noqa: E402
import run_all  # noqa: E402

SUITE = BENCH / "gpu_suite.sh"
INFO = {"cpu": "c", "cores": 1, "torch_threads": 1, "torch": "t", "device": "cpu", "clock": "wall",
        "loadavg_1min": 0.0, "date": "d"}
needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.fixture
def no_machine_info(monkeypatch):
    monkeypatch.setattr(C, "machine_info", lambda *a, **k: dict(INFO))  # importing PyG for it takes seconds


# ---------------------------------------------------------------------------- _common: the package imported
def test_bug_scripts_import_the_package_of_their_own_checkout(tmp_path):
    """Bug: ``_common`` imported ``diffusionformer`` before putting the checkout on ``sys.path``, so a script run
    from a checkout (``python benchmarks/bench_issue15.py``) benchmarked whichever copy came first on the path (an
    installed one, another checkout's) or failed without one. A decoy package earlier on the path shows it: the
    package ``_common`` finds must be the checkout's."""
    decoy = tmp_path / "diffusionformer"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise SystemExit('decoy imported')\n")
    code = f"""
import importlib.machinery, sys, types
sys.modules['torch'] = types.ModuleType('torch')  # not what is probed, and seconds to import
class Spy:  # reports where the path finder takes the package from, and stops there
    def find_spec(self, name, path=None, target=None):
        if name == 'diffusionformer':
            spec = importlib.machinery.PathFinder.find_spec(name, sys.path)
            print(spec.origin if spec else None)
            raise SystemExit(0)
        return None
sys.meta_path.insert(0, Spy())
sys.path.insert(0, {str(BENCH)!r})  # what running a script of benchmarks/ does
import _common
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()) == ROOT / "diffusionformer" / "__init__.py"


# ---------------------------------------------------------------------------- _common: Report
def _report(tmp_path: Path, argv: list[str] | None = None, extra=None) -> C.Report:  # noqa: ANN001
    args = C.parse_args("t", ["--device", "cpu", "--threads", "1", "--out", str(tmp_path), *(argv or [])], extra)
    return C.Report("bench_x", "X", args)


@pytest.mark.parametrize("cut", [1, 2], ids=["md", "json"])
def test_bug_a_report_write_cut_short_keeps_the_previous_files_whole(tmp_path, monkeypatch, no_machine_info, cut):
    """Bug: ``Report.write`` opened ``bench_x.md`` and ``.json`` for writing (truncating them) and then wrote: a run
    killed in between (the GPU call's time limit; here an interrupt in the middle of the ``cut``-th file's write, or
    just before its new version would replace the old) left a truncated report and lost the finished tables. Now
    each file is written beside and moved over the old one."""
    rep = _report(tmp_path)
    rep.table("first", ["a"], [[1.0]])
    md, js = (tmp_path / "bench_x.md").read_text(), (tmp_path / "bench_x.json").read_text()
    writes = []
    write_text, replace = Path.write_text, os.replace

    def cut_write_text(self, data, *a, **k):  # noqa: ANN001, ANN202
        writes.append(self)
        if len(writes) < cut:
            return write_text(self, data, *a, **k)
        with open(self, "w") as f:
            f.write(data[: len(data) // 2])
        raise KeyboardInterrupt

    def cut_replace(src, dst, *a, **k):  # noqa: ANN001, ANN202
        writes.append(dst)
        if len(writes) < cut:
            return replace(src, dst, *a, **k)
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", cut_write_text)
    monkeypatch.setattr(os, "replace", cut_replace)
    with pytest.raises(KeyboardInterrupt):
        rep.table("second", ["a"], [[2.0]])
    monkeypatch.undo()
    assert (tmp_path / "bench_x.md").read_text() == (md if cut == 1 else rep.markdown())
    assert (tmp_path / "bench_x.json").read_text() == js
    assert [t["caption"] for t in json.loads(js)["tables"]] == ["first"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench_x.json", "bench_x.md"]  # no temporary left
    rep.write()  # the next write (the table "second" is in the report) goes through
    assert [t["caption"] for t in json.loads((tmp_path / "bench_x.json").read_text())["tables"]] == ["first", "second"]


def _issue15_like(p: argparse.ArgumentParser) -> None:
    """Options of the kinds the scripts add (``bench_issue15.py``'s, ``--compile-only`` of the warm-up processes)."""
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--library-backend", default="auto", choices=["auto", "sdpa", "matrix"])
    p.add_argument("--parts", nargs="*", default=["layers", "profile", "gpt", "dropout"])
    p.add_argument("--layer-sizes", nargs="*", type=int, default=None)
    C.add_warm_arguments(p)


def test_bug_the_command_written_with_the_tables_has_the_scripts_options(tmp_path, no_machine_info):
    """Bug: the command written with the tables left out each script's own options: the GPU call's
    ``bench_issue15.py --smoke --library-backend sdpa --parts gpt`` was recorded as ``bench_issue15.py --device
    ...``, which reruns the full sizes on the ``auto`` back-end. Options left at their defaults stay out, and so does
    ``--compile-only`` (the warm-up processes' own)."""
    rep = _report(tmp_path, ["--smoke", "--library-backend", "sdpa", "--parts", "gpt", "--layer-sizes", "0", "2",
                             "--warm-workers", "0"], _issue15_like)
    assert rep.command() == ("python benchmarks/bench_x.py --device cpu --threads 1 --smoke --library-backend sdpa "
                             "--parts gpt --layer-sizes 0 2 --warm-workers 0")
    rep.table("t", ["a"], [[1.0]])
    assert json.loads((tmp_path / "bench_x.json").read_text())["command"] == rep.command()
    assert "--library-backend sdpa" in (tmp_path / "bench_x.md").read_text()
    plain = _report(tmp_path, ["--parts", "layers", "profile", "gpt", "dropout", "--compile-only", "0", "2"],
                    _issue15_like)
    assert plain.command() == "python benchmarks/bench_x.py --device cpu --threads 1"


# ---------------------------------------------------------------------------- gpu_suite.sh
STUB = """#!/usr/bin/env bash
# a stand-in python: logs its arguments, answers every check, fails for the script named in $FAIL_SCRIPT
echo "$*" >> "$STUB_LOG"
[[ -n "${FAIL_SCRIPT:-}" && "$*" == *"$FAIL_SCRIPT"* ]] && exit 1
exit 0
"""


def _suite(tmp_path: Path, *args: str, steps: str, fail: str = "", cwd: Path | None = None):  # noqa: ANN202
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log = tmp_path / "calls.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_SUITE_", "BENCH_ISSUE15_ARGS"))}
    env.update(PYTHON=str(stub), STUB_LOG=str(log), FAIL_SCRIPT=fail, GPU_SUITE_STEPS=steps)
    res = subprocess.run(["bash", str(SUITE), *args], env=env, capture_output=True, text=True, timeout=60,
                         cwd=cwd or tmp_path)
    calls = log.read_text().splitlines() if log.exists() else []
    return res, [c for c in calls if "benchmarks/" in c]


@needs_bash
def test_bug_gpu_suite_goes_on_after_a_failed_grid_script(tmp_path):
    """Bug: the grid step ran ``run_all.py`` bare under ``set -e``; it exits 1 when any of its scripts failed
    (``bench_sparse.py`` without PyG, say), which ended the suite there: the issue-15, compile and block steps of
    that GPU call never ran. Now the failure is reported and the suite goes on, as for the other steps."""
    out = tmp_path / "out"
    res, calls = _suite(tmp_path, str(out), steps="grid,issue15,compile", fail="run_all.py")
    assert res.returncode == 0, res.stderr
    assert [c.split()[0] for c in calls] == ["benchmarks/run_all.py", "benchmarks/bench_issue15.py",
                                             "benchmarks/bench_compile.py"]
    assert "run_all.py FAILED" in res.stdout


@needs_bash
def test_bug_gpu_suite_relative_out_dir_is_in_the_callers_directory(tmp_path):
    """Bug: the suite moves to the checkout before it runs anything, so ``bash /path/to/gpu_suite.sh --smoke out``
    run from another folder wrote into ``/path/to/out`` (inside the checkout) and said "tables in out"; now a
    relative OUT_DIR is the caller's (the GPU path takes OUT_DIR the same way, but makes the folder itself, so
    only the smoke path, whose scripts are the stand-in, is run here)."""
    work = tmp_path / "work"
    work.mkdir()
    res, calls = _suite(tmp_path, "--smoke", "out", steps="issue15", cwd=work)
    assert res.returncode == 0, res.stderr
    assert len(calls) == 1 and f"--out {work / 'out'}" in calls[0]
    assert f"tables in {work / 'out'}" in res.stdout


# ---------------------------------------------------------------------------- run_all.py
def test_bug_run_all_on_cuda_without_cuda_is_a_usage_error(tmp_path, monkeypatch, capsys):
    """Bug: ``run_all.py --device cuda`` on a machine without CUDA failed with torch's AssertionError ("Torch not
    compiled with CUDA enabled") from naming the GPU; now a usage error, as each script gives, before anything
    runs. ``--report-only`` needs no GPU and still rebuilds a CUDA run's README."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(run_all.subprocess, "call", lambda *a, **k: pytest.fail(f"a benchmark was started: {a}"))
    monkeypatch.setattr(C, "machine_info", lambda *a, **k: pytest.fail("machine_info called"))
    with pytest.raises(SystemExit) as e:
        run_all.main(["--device", "cuda", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "--device cuda was requested but torch.cuda.is_available() is False" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    (tmp_path / "run_all.json").write_text(json.dumps({"command": "c", "machine": dict(INFO, device="cuda"),
                                                        "minutes": 1.0, "loadavg_start": None, "loadavg_end": None}))
    assert run_all.main(["--device", "cuda", "--report-only", "--out", str(tmp_path)]) == 0


def test_bug_run_all_records_only_in_its_command(tmp_path, monkeypatch, no_machine_info):
    """Bug: ``run_all.py --only bench_gpt`` recorded its command as ``run_all.py --device cpu``: rerun, it runs the
    whole suite."""
    started = []
    monkeypatch.setattr(run_all.subprocess, "call", lambda cmd: started.append(cmd) or 0)
    monkeypatch.setattr(C, "setup_threads", lambda n: n or 1)
    assert run_all.main(["--only", "bench_gpt", "bench_host", "--threads", "1", "--out", str(tmp_path)]) == 0
    assert [Path(c[1]).name for c in started] == ["bench_gpt.py", "bench_host.py"]
    meta = json.loads((tmp_path / "run_all.json").read_text())
    assert meta["command"] == "python benchmarks/run_all.py --device cpu --threads 1 --only bench_gpt bench_host"
    assert meta["command"] in (tmp_path / "README.md").read_text()


# ---------------------------------------------------------------------------- bench_kstep.py
def test_bug_kstep_kernel_caption_gives_the_rounds_of_rounds(tmp_path, monkeypatch, no_machine_info):
    """Bug: with ``--rounds 2`` the kernel table's caption still said "median of 5 interleaved rounds, 3 for N >=
    1024 and --quick"; it gives the rounds measured."""
    seen = []

    def measure(fns, **kw):  # noqa: ANN001, ANN202
        seen.append(kw["rounds"])
        return {n: C.Timing([1.0] * kw["rounds"], 1) for n in fns}

    monkeypatch.setattr(KS, "kernel_callables", lambda *a: {b: (lambda: None) for b in ("sdpa", "matrix", "auto")})
    monkeypatch.setattr(C, "measure", measure)
    for rounds, text in ((2, "median of 2 interleaved rounds;"),
                         (None, "median of 5 interleaved rounds, 3 for N >= 1024 and --quick;")):
        argv = ["--quick"] + ([] if rounds is None else ["--rounds", str(rounds)])
        rep = _report(tmp_path, argv)
        KS.part_kernels(rep.args, rep)
        assert text in rep.sections[0][0]
    assert set(seen) == {2, 3}


# ---------------------------------------------------------------------------- bench_issue15: full sizes on a CPU
def test_bug_issue15_full_sizes_on_cpu_are_refused_before_anything_runs(monkeypatch, tmp_path):
    """Bug: ``bench_issue15.py --device cpu`` without ``--smoke`` printed a hint and then ran the full GPU grid (a
    12-layer GPT at T=1024, 4096-token layers: hours on a CPU). Refused up front now; chosen sizes still run."""
    import bench_issue15 as B

    # anything past the check stops the test at once (the code before ran the whole grid here)
    monkeypatch.setattr(B, "triton_ready", lambda dev: (_ for _ in ()).throw(RuntimeError("past the check")))
    with pytest.raises(SystemExit, match=r"--smoke.*--layer-sizes"):
        B.main(["--device", "cpu", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())
    # a size chosen on purpose is the user's call: it passes the check
    with pytest.raises(RuntimeError, match="past the check"):
        B.main(["--device", "cpu", "--out", str(tmp_path), "--layer-sizes", "2", "--parts", "layers"])
