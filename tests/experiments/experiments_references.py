"""Independent references the experiment tests share (imported as a folder module: ``tests/experiments/conftest.py``
puts this folder on ``sys.path``, pytest runs with ``--import-mode=importlib``)."""

from __future__ import annotations


def holm_reference(ps):
    """Holm's step-down adjustment written out: sort, multiply by ``m - rank``, running maximum, cap at 1. A None (no
    test) counts as p = 1 in the family and stays None."""
    v = [1.0 if p is None else p for p in ps]
    order = sorted(range(len(v)), key=lambda i: v[i])
    out, running = [0.0] * len(v), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(v) - rank) * v[i]))
        out[i] = running
    return [None if p is None else o for p, o in zip(ps, out)]
