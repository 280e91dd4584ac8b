"""What PyTorch allocates on the CPU during a call, from the profiler's memory events.

CPU tensors have no ``torch.cuda.max_memory_allocated``; the profiler (``profile_memory=True``)
records every allocation and free the calling thread makes while it runs (not those of other
threads the call starts). Allocation sizes are exact and
deterministic on the CPU, so tests can assert memory to the byte (what a layer keeps for its
backward pass) and the benchmarks measure peaks the GPU will see (``benchmarks/bench_memory.py``).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable

__all__ = ["cpu_allocations"]


def cpu_allocations(fn: Callable[[], Any]) -> tuple[Any, list[int], list[int]]:
    """Run ``fn()`` under the profiler; its result, and the byte change and running total of each CPU event.

    Frees of memory allocated before the call are not recorded (the profiler does not know their
    size), and the running total ("Total Allocated") starts from whatever an earlier profiled
    window left behind, so measure from the first event: ``sum(changes)`` is what the call still
    holds at its end, and ``max(totals) - (totals[0] - changes[0])`` its peak above the start.

    Args:
        fn: the call to measure (no arguments).

    Returns:
        ``(result, changes, totals)``: ``fn``'s result and, per CPU memory event in order, the bytes
        allocated (negative: freed) and the profiler's running total after it.

    Raises:
        RuntimeError: when a profiler is already running (profilers do not nest).

    Examples:
        >>> import torch
        >>> _, changes, _ = cpu_allocations(lambda: torch.empty(256, dtype=torch.float32).fill_(1.0))
        >>> sum(changes)  # the call's result, 256 float32, is still held at its end
        1024
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not callable(fn):
        raise TypeError(f"cpu_allocations: fn must be callable (the call to measure), got {type(fn).__name__}")
    # one profiler at a time: a second one started inside stops the session when it exits, and the outer
    # one's exit and trace export then crash the interpreter (a segmentation fault, not an exception)
    if torch.autograd._profiler_enabled():
        raise RuntimeError("cpu_allocations: a profiler is already running (an enclosing cpu_allocations or "
                           "torch.profiler.profile); measure outside it")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.remove(path)
    memory = [e["args"] for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0]
    return result, [int(a.get("Bytes", 0)) for a in memory], [int(a.get("Total Allocated", 0)) for a in memory]
