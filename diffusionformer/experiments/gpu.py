r"""Running a comparison on a GPU: device and precision checks, and concurrent worker processes.

A small model leaves most of a large GPU idle, so several runs of one comparison share it as
separate processes. Each ``run`` process takes the next run that no live process holds (the
run's ``.lock``, see :mod:`diffusionformer.experiments.runner`), so ``N`` processes started on
the same config and results folder train every run exactly once between them;
:func:`run_workers` starts them (``run CONFIG --workers N``) and waits for all.

``precision`` names the arithmetic of the forward and backward passes:

================  =========================================================================
``"bf16"``        bf16 autocast (``torch.autocast(device, dtype=torch.bfloat16)``): matrix
                  products in bf16, reductions, norms and the loss in float32; the weights,
                  gradients and AdamW state stay float32 (CUDA, and CPUs where torch supports
                  bf16 autocast)
``"fp32"``        no autocast
``"auto"``        bf16 on CUDA, fp32 elsewhere (the trainer's default)
================  =========================================================================

It sets each task's ``train.amp`` (``"bf16"``, ``"off"``, ``"auto"``).
"""

from __future__ import annotations

import math
import numbers
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from diffusionformer.config import _check_flag, _choice_hint, _device_hint
from diffusionformer.experiments.threads import WORKERS_ENV

__all__ = ["PRECISIONS", "check_device", "precision_amp", "run_workers", "worker_argv"]

#: ``precision`` -> ``TrainConfig.amp``
PRECISIONS = {"bf16": "bf16", "fp32": "off", "auto": "auto"}
# other spellings of a precision (TrainConfig.amp's among them): "off" is no near miss of "fp32"
_PRECISION_ALIASES = {"off": "fp32", "float32": "fp32", "none": "fp32", "bfloat16": "bf16"}
#: Set in every process :func:`run_workers` starts (to ``k/N``): a worker never starts workers itself.
WORKER_ENV = "DIFFUSIONFORMER_WORKER"
_DEVICE_TYPES = ("cpu", "cuda")


def precision_amp(precision: str) -> str:
    """The ``TrainConfig.amp`` value of ``precision`` (``"bf16"``, ``"fp32"`` or ``"auto"``).

    Examples:
        >>> precision_amp("fp32"), precision_amp("bf16")
        ('off', 'bf16')
    """
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {sorted(PRECISIONS)}, got {precision!r}"
                         f"{_choice_hint(precision, PRECISIONS, _PRECISION_ALIASES)}")
    return PRECISIONS[precision]


def check_device(spec: str, *, available: bool = True) -> torch.device | None:
    """Validate a ``--device`` value before any data is loaded or any model built.

    Args:
        spec: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        available: also check that the device exists on this machine (``False``: only the
            spelling, e.g. for a config written on a machine without a GPU).

    Returns:
        The ``torch.device`` (``None`` for ``"auto"``: CUDA when available, else CPU).

    Raises:
        TypeError: ``spec`` is not a string.
        ValueError: an unknown device, or CUDA asked for where torch sees none (or fewer
            devices than the index).

    Examples:
        >>> check_device("cpu")
        device(type='cpu')
        >>> check_device("tpu")
        Traceback (most recent call last):
        ...
        ValueError: device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'
        >>> check_device("CUDA:1", available=False)
        Traceback (most recent call last):
        ...
        ValueError: device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got 'CUDA:1' (did you mean 'cuda:1'?)
    """
    if not isinstance(spec, str):
        raise TypeError(f"device: expected a string such as 'cuda', got {type(spec).__name__} ({spec!r})")
    _check_flag(available, "check_device: available")
    if spec == "auto":
        return None
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in _DEVICE_TYPES:
        raise ValueError(f"device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {spec!r}"
                         f"{_device_hint(spec, _DEVICE_TYPES if ':' in spec else ('auto',) + _DEVICE_TYPES)}")
    if available and device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {spec!r} asked for, but torch.cuda.is_available() is False on this machine "
                f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}); "
                "use --device cpu, or run on a machine with a CUDA GPU"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"device {spec!r} asked for, but this machine has {count} CUDA device(s) "
                             f"(cuda:0 .. cuda:{count - 1})")
    return device


def worker_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` of a ``run`` command without its ``--workers N`` (and with ``--no-progress``).

    Examples:
        >>> worker_argv(["run", "c.toml", "--workers", "3", "--device", "cuda"])
        ['run', 'c.toml', '--device', 'cuda', '--no-progress']
        >>> worker_argv(["run", "c.toml", "--workers=2", "--no-progress"])
        ['run', 'c.toml', '--no-progress']
    """
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--workers":
            skip = True
            continue
        if arg.startswith("--workers="):
            continue
        if arg.startswith("--work") and "--workers".startswith(arg.split("=")[0]):
            raise ValueError(f"worker_argv: {arg!r} abbreviates --workers; spell it out")
        out.append(arg)
    if "--no-progress" not in out:
        out.append("--no-progress")
    return out


def run_workers(argv: Sequence[str], workers: int, log_dir: str | Path, *, stagger: float = 1.0,
                log=print) -> list[int]:
    """Start ``workers`` processes of ``python -m diffusionformer.experiments <argv>`` and wait for all.

    Every process runs the same ``run`` command; the run locks hand each run to one of them.
    A worker's output goes to ``<log_dir>/worker<k>.log``.

    Args:
        argv: the command line of one worker (``run CONFIG ...``, no ``--workers``).
        workers: number of processes (``>= 1``).
        log_dir: folder of the workers' logs.
        stagger: seconds between starts (so that the first runs are taken in order).
        log: where progress messages go.

    Returns:
        The workers' exit codes, in start order.
    """
    if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or workers < 1:
        raise ValueError(f"workers: expected an int >= 1, got {workers!r}")
    workers = int(workers)  # a numpy int (a sweep grid's) is the int it equals
    # checked before any worker starts: else a bad stagger fails between two starts, and the first worker is stopped
    if isinstance(stagger, bool) or not isinstance(stagger, numbers.Real) or not math.isfinite(stagger) or stagger < 0:
        raise ValueError(f"stagger: expected a finite number of seconds >= 0, got {stagger!r}")
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "diffusionformer.experiments", *argv]
    procs, files = [], []
    try:
        for k in range(workers):
            f = open(log_dir / f"worker{k}.log", "w")
            files.append(f)
            env = {**os.environ, WORKERS_ENV: str(workers),  # each sizes its threads to cores // workers
                   WORKER_ENV: f"{k}/{workers}"}
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env))
            log(f"worker {k}: pid {procs[-1].pid}, log {log_dir / f'worker{k}.log'}")
            if k + 1 < workers and stagger > 0:
                time.sleep(stagger)
        codes = [p.wait() for p in procs]
    except BaseException:
        for p in procs:  # interrupted: stop the workers (their runs resume from checkpoints later)
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        raise
    finally:
        for f in files:
            f.close()
    return codes
