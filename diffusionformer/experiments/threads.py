"""How many torch threads one worker of the experiment runner uses.

Every torch process starts with one intra-op thread per core. Two runner workers on a 2-core
machine (the README's "start ``run CONFIG`` twice") then run four spinning threads on two
cores, and the job takes many times longer than on an idle machine. The runner therefore sizes
its threads before training::

    threads = N                         given --threads N
              $OMP_NUM_THREADS          else, when it is set (a list "4,2": its first count)
              max(1, cores // workers)  otherwise

where ``cores`` are the CPUs this process may run on (its affinity mask) and ``workers`` is the
number of processes expected to share them: ``--workers N``, else ``$DIFFUSIONFORMER_WORKERS``,
else torchrun's ``$LOCAL_WORLD_SIZE``, else 1.

Examples:
    >>> plan_threads(cores=2, workers=2, environ={}).threads
    1
    >>> plan_threads(cores=16, environ={"LOCAL_WORLD_SIZE": "4"}).threads
    4
    >>> plan_threads(threads=3, cores=2, environ={"OMP_NUM_THREADS": "1"}).describe()
    'torch threads: 3 per worker (from --threads; 2 cores, 1 worker)'
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import Mapping

from diffusionformer.config import _value_type

__all__ = ["ThreadPlan", "WORKERS_ENV", "apply_threads", "available_cores", "plan_threads"]

#: environment variable telling each runner process how many workers share the machine
WORKERS_ENV = "DIFFUSIONFORMER_WORKERS"


@dataclass(frozen=True)
class ThreadPlan:
    """The thread count chosen for one worker and why.

    Attributes:
        threads: torch intra-op threads for this process (``torch.set_num_threads``).
        cores: CPUs this process may run on.
        workers: processes expected to share those CPUs.
        source: what decided ``threads``: ``"--threads"``, ``"OMP_NUM_THREADS"`` or
            ``"cores // workers"``.
    """

    threads: int
    cores: int
    workers: int
    source: str

    def describe(self) -> str:
        """One line for the console: the choice, where it came from and how to change it."""
        workers = f"{self.workers} worker{'s' if self.workers != 1 else ''}"
        if self.source == "cores // workers":
            return (f"torch threads: {self.threads} per worker ({self.cores} cores // {workers}; "
                    f"--threads N overrides, --workers N or ${WORKERS_ENV} sets the workers)")
        return f"torch threads: {self.threads} per worker (from {self.source}; {self.cores} cores, {workers})"


def available_cores() -> int:
    """CPUs this process may run on: its affinity mask where the OS has one, else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return max(1, os.cpu_count() or 1)


#: torch.set_num_threads takes a C int: a larger count is refused by name, not by torch's "Overflow when unpacking long"
_MAX_THREADS = 2**31 - 1


def _positive_int(value: object, what: str, limit: int | None = None) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what}: expected a positive int, got {value!r}")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ValueError(f"{what}: expected a positive int, got {value!r}") from None
    if not isinstance(value, numbers.Integral):  # a numpy int (a sweep grid's) is the int it equals
        # named by module too: a numpy bool's bare type name reads "bool"
        raise TypeError(f"{what}: expected a positive int, got {_value_type(value)}")
    if value < 1:
        raise ValueError(f"{what}: expected a positive int, got {value}")
    if limit is not None and value > limit:
        raise ValueError(f"{what}: expected a positive int of at most {limit} (torch.set_num_threads takes a C int), "
                         f"got {value}")
    return int(value)


def plan_threads(
    *,
    threads: int | None = None,
    workers: int | None = None,
    cores: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> ThreadPlan:
    """Choose the torch thread count of one worker (the rule of this module's docstring).

    Args:
        threads: an explicit count (``--threads``); wins over everything else.
        workers: processes sharing the machine (``--workers``); default from ``environ``
            (``$DIFFUSIONFORMER_WORKERS``, then ``$LOCAL_WORLD_SIZE``), else 1.
        cores: CPUs available (default: :func:`available_cores`).
        environ: the environment to read (default: ``os.environ``).

    Returns:
        The :class:`ThreadPlan`; nothing is changed (see :func:`apply_threads`).

    Raises:
        ValueError, TypeError: a count (argument or environment variable) is not a positive int.
    """
    env = os.environ if environ is None else environ
    cores = available_cores() if cores is None else _positive_int(cores, "cores")
    if workers is not None:
        workers = _positive_int(workers, "--workers")
    elif env.get(WORKERS_ENV, "").strip():
        workers = _positive_int(env[WORKERS_ENV], f"${WORKERS_ENV}")
    elif env.get("LOCAL_WORLD_SIZE", "").strip():
        workers = _positive_int(env["LOCAL_WORLD_SIZE"], "$LOCAL_WORLD_SIZE")
    else:
        workers = 1
    if threads is not None:
        return ThreadPlan(_positive_int(threads, "--threads", _MAX_THREADS), cores, workers, "--threads")
    if env.get("OMP_NUM_THREADS", "").strip():
        # OpenMP allows a list, one count per nesting level ("4,2"): torch's intra-op pool is the outer level
        omp = env["OMP_NUM_THREADS"]
        what = "$OMP_NUM_THREADS" if "," not in omp else f"$OMP_NUM_THREADS={omp!r} (its first, outer-level count)"
        return ThreadPlan(_positive_int(omp.split(",")[0], what, _MAX_THREADS), cores, workers, "OMP_NUM_THREADS")
    return ThreadPlan(max(1, cores // workers), cores, workers, "cores // workers")


def apply_threads(plan: ThreadPlan) -> None:
    """Set this process's torch intra-op threads to ``plan.threads``."""
    import torch

    torch.set_num_threads(plan.threads)
