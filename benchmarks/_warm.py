"""Kernel builds shared out over processes before a benchmark times anything (``--warm-workers``).

Kept apart from ``_common`` (which imports torch) so that its tests start light processes; the
scripts reach it as ``_common.warm_kernels``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence


def add_warm_arguments(p: argparse.ArgumentParser) -> None:
    """``--warm-workers P`` and the hidden ``--compile-only I P`` of a script that compiles Triton kernels."""
    p.add_argument("--warm-workers", type=int, default=None, metavar="P",
                   help="first run every Triton launch of the script once, untimed, in P processes at once, which "
                        "fills triton's on-disk kernel cache (default: 8 on CUDA, 0 on CPU)")
    p.add_argument("--compile-only", nargs=2, type=int, default=None, metavar=("I", "P"),
                   help="run share I of P of the script's Triton launches once, untimed, and exit "
                        "(what --warm-workers starts)")


def warm_kernels(script: str, argv: Sequence[str], args: argparse.Namespace, jobs: Sequence[Any],
                 run_job: Callable[[Any], None]) -> str:
    """Compile a script's Triton kernels in several processes before it times anything.

    On a fresh machine each kernel variant takes seconds to build, one after the other in the timing
    process. With ``args.warm_workers = P > 0`` (default 8 on CUDA) this starts ``P`` copies of
    ``script`` with ``--compile-only I P``; each runs ``run_job`` on ``jobs[I::P]`` once (a job that
    raises is skipped: the timed run reports it) and prints how many ran. A job is best a group of
    launches that share their kernels (the same variant at several sizes), so that no two
    processes build the same kernel. The kernels land in
    triton's on-disk cache, which the timing process then loads instead of compiling. In a
    ``--compile-only`` process this runs the share and exits. Returns a note for the report ("" when
    no warm-up ran). ``argv`` is passed on to the copies (sizes, ``--smoke``, the device).
    """
    if args.compile_only is not None:
        i, n = args.compile_only
        if not 0 <= i < n:
            raise SystemExit(f"{Path(script).stem}: --compile-only I P needs 0 <= I < P, got {i} {n}")
        done = 0
        for job in list(jobs)[i::n]:
            try:
                run_job(job)
                done += 1
            except Exception:  # noqa: BLE001,S112 - the timed run reports what cannot run
                continue
        torch = sys.modules.get("torch")  # the jobs imported it; this module does not need to
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        print(f"compiled {done}", flush=True)
        raise SystemExit(0)
    workers = args.warm_workers if args.warm_workers is not None else (8 if args.device == "cuda" else 0)
    if workers < 0:
        raise SystemExit(f"{Path(script).stem}: --warm-workers must be >= 0, got {workers}")
    if workers == 0 or not jobs:
        return ""
    t0 = time.perf_counter()
    base = [sys.executable, os.path.abspath(script), *argv]
    procs = [subprocess.Popen(base + ["--compile-only", str(i), str(workers)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(min(workers, len(jobs)))]
    ran, failed = 0, []
    for i, proc in enumerate(procs):
        out, err = proc.communicate()
        counts = [line for line in out.splitlines() if line.startswith("compiled ")]
        if proc.returncode == 0 and counts:
            ran += int(counts[-1].split()[1])
        else:
            last = (err.strip() or out.strip()).splitlines()[-1:] or [""]
            failed.append(f"worker {i} (exit {proc.returncode}): {last[0][-200:]}")
    note = (f"warm-up: {ran} of {len(jobs)} groups of Triton launches ran in {len(procs)} processes in "
            f"{time.perf_counter() - t0:.0f} s, untimed (the others cannot run, and show so below)")
    note += ("; " + "; ".join(failed)) if failed else ""
    print(note, flush=True)
    return note
