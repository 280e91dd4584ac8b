"""``benchmarks/_warm.warm_kernels`` (``_common.warm_kernels`` in the scripts): a script's kernel builds shared out over processes before timing.

The benchmarks run it on a GPU only; here a stand-in script whose "jobs" append to a log shows the
contract: every job group runs exactly once over the worker processes, a group that raises is skipped
and not counted, a worker that dies is named in the note, and a ``--compile-only`` process exits
after its share.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

SCRIPT = r'''
import argparse, os, sys
sys.path.insert(0, {bench!r})
import _warm as C

p = argparse.ArgumentParser()
p.add_argument("--device", default="cpu")
p.add_argument("--log")
p.add_argument("--die", type=int, default=-1)
C.add_warm_arguments(p)
args = p.parse_args()
if args.compile_only is not None and args.compile_only[0] == args.die:
    sys.exit("worker failed on purpose")
import atexit
atexit.register(lambda: print("a warning at exit", file=sys.stderr))  # as a CUDA process may print at exit
jobs = [[g * 10 + i for i in range(2)] for g in range(7)]  # 7 groups of 2 launches

def run(group):
    if group[0] == 30:
        raise RuntimeError("this configuration cannot run")
    with open(args.log, "a") as f:
        for j in group:
            f.write(f"{{os.getpid()}} {{j}}\n")

note = C.warm_kernels(__file__, ["--log", args.log, "--die", str(args.die)], args, jobs, run)
print("NOTE:", note)
print("TIMED RUN")
'''


def run_script(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list[tuple[int, int]]]:
    script = tmp_path / "fake_bench.py"
    script.write_text(SCRIPT.format(bench=str(BENCH)))
    log = tmp_path / "log.txt"
    res = subprocess.run([sys.executable, str(script), "--log", str(log), *extra], capture_output=True, text=True,
                         timeout=300)
    lines = log.read_text().split() if log.exists() else []
    return res, [(int(a), int(b)) for a, b in zip(lines[::2], lines[1::2])]


@pytest.mark.slow
def test_every_group_runs_once_over_the_workers(tmp_path):
    res, ran = run_script(tmp_path, "--warm-workers", "3")
    assert res.returncode == 0, res.stderr
    # each launch once; group 3 (30, 31) raised and is absent; groups stay whole within one process
    assert sorted(j for _, j in ran) == [g * 10 + i for g in range(7) if g != 3 for i in range(2)]
    by_group = {}
    for pid, j in ran:
        by_group.setdefault(j // 10, set()).add(pid)
    assert all(len(pids) == 1 for pids in by_group.values())
    assert len({pid for pid, _ in ran}) == 3  # three processes shared the work
    note = next(line for line in res.stdout.splitlines() if line.startswith("NOTE:"))
    assert "6 of 7 groups" in note and "in 3 processes" in note and "worker" not in note
    assert "TIMED RUN" in res.stdout


@pytest.mark.slow
def test_a_dead_worker_is_named_in_the_note(tmp_path):
    res, ran = run_script(tmp_path, "--warm-workers", "2", "--die", "1")
    assert res.returncode == 0, res.stderr  # the timed run goes on
    note = next(line for line in res.stdout.splitlines() if line.startswith("NOTE:"))
    assert "worker 1 (exit 1): worker failed on purpose" in note and "4 of 7 groups" in note  # worker 0 ran groups 0, 2, 4 and 6
    assert sorted({j // 10 for _, j in ran}) == [0, 2, 4, 6]


def test_no_warm_up_by_default_on_cpu(tmp_path):
    res, ran = run_script(tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == "NOTE: " and ran == []


def test_compile_only_runs_its_share_and_exits(tmp_path):
    res, ran = run_script(tmp_path, "--compile-only", "1", "3")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "compiled 2"  # groups 1 and 4 (group 7 does not exist)
    assert "TIMED RUN" not in res.stdout
    assert sorted(j for _, j in ran) == [10, 11, 40, 41]
    bad, _ = run_script(tmp_path, "--compile-only", "3", "3")
    assert bad.returncode != 0 and "--compile-only I P needs 0 <= I < P" in bad.stderr
    neg, _ = run_script(tmp_path, "--warm-workers", "-1")
    assert neg.returncode != 0 and "--warm-workers must be >= 0" in neg.stderr
