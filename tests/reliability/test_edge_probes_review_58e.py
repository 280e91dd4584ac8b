"""Review (sitting 58) of grand-nl's torchdiffeq fixed-grid methods (commit 6043855).

torchdiffeq 0.2.5's fixed-grid solvers (``FixedGridODESolver``) build their grid from ``options['step_size']`` as
``niters = ceil((t1 - t0) / step_size + 1)`` points, the last one set to ``t1``: ``step_size = t / K`` rounds
``t / (t / K)`` to a hair above ``K`` for many ``t, K`` (``t=0.3, K=5`` in float32), so the solver took ``K + 1``
steps, a last one of size ~0, each with its attention calls. ``options['grid_constructor']`` (the other documented
way, exclusive of ``step_size``) is given the ``K + 1`` points themselves. The stand-in below is torchdiffeq's grid
rule and midpoint step; the real package is checked too where it is installed.

``calls_per_forward`` (the hops a layer propagates, ``operator_hops``, for neighbour sampling) counted one call per
step for every method but ``rk4``: midpoint and Heun2 re-attend twice per step, Heun3 three times, and the Adams
and adaptive methods a number their solver chooses.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.experiments.minibatch import operator_hops
from diffusionformer.operators import build_operator


def _stand_in_torchdiffeq() -> types.ModuleType:
    """torchdiffeq 0.2.5's ``odeint`` for ``method='midpoint'``: its fixed grid (``step_size`` or ``grid_constructor``,
    else the given times) and its midpoint step."""
    mod = types.ModuleType("torchdiffeq")

    def odeint(func, y0, t, *, rtol=1e-7, atol=1e-9, method=None, options=None):  # noqa: ANN001, ANN202
        assert method == "midpoint"
        options = dict(options or {})
        step_size, make = options.get("step_size"), options.get("grid_constructor")
        if step_size is not None:  # FixedGridODESolver._grid_constructor_from_step_size
            niters = torch.ceil((t[-1] - t[0]) / step_size + 1).item()
            grid = torch.arange(0, niters, dtype=t.dtype, device=t.device) * step_size + t[0]
            grid[-1] = t[-1]
        else:
            grid = t if make is None else make(func, y0, t)
        assert grid[0] == t[0] and grid[-1] == t[-1]

        f, y = func, y0
        for t0, t1 in zip(grid[:-1], grid[1:]):
            dt = t1 - t0
            y = y + dt * f(t0 + dt / 2, y + dt / 2 * f(t0, y))
        return torch.stack([y0, y])

    mod.odeint = odeint
    return mod


def _midpoint_calls(monkeypatch, t: float, steps: int) -> int:  # noqa: ANN001
    """The attention calls of one forward of ``grand-nl(t, steps, method='midpoint')`` in float32."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 1, heads=f"grand-nl(t={t}, steps={steps}, method='midpoint')").eval()
    calls: list = []
    odeint = sys.modules["torchdiffeq"].odeint
    monkeypatch.setattr(sys.modules["torchdiffeq"], "odeint",
                        lambda func, *a, **k: odeint(lambda s, y: calls.append(s) or func(s, y), *a, **k))
    with torch.no_grad():
        layer(torch.randn(1, 4, 8))
    return len(calls)


@pytest.mark.parametrize("t, steps", [(0.3, 5), (0.1, 11), (1.0, 4)])
def test_bug_grand_nl_midpoint_takes_exactly_steps_steps(monkeypatch, t, steps):
    """Bug: ``grand-nl(t=0.3, steps=5, method='midpoint')`` took 6 midpoint steps in float32 (12 attention calls,
    not 10): torchdiffeq's ``step_size`` grid rounds ``0.3 / 0.06`` up. The grid is now given point by point."""
    monkeypatch.setitem(sys.modules, "torchdiffeq", _stand_in_torchdiffeq())
    assert _midpoint_calls(monkeypatch, t, steps) == 2 * steps


def test_bug_grand_nl_midpoint_takes_exactly_steps_steps_real_torchdiffeq(monkeypatch):
    """The same with the installed torchdiffeq (skipped where it is not)."""
    pytest.importorskip("torchdiffeq")
    assert _midpoint_calls(monkeypatch, 0.3, 5) == 10


def test_bug_grand_nl_hops_count_the_solver_stages(monkeypatch):
    """Bug: ``operator_hops`` of grand-nl with ``method='midpoint'`` and ``steps=1`` was 1 (``calls_per_forward``
    counted one call per step for every torchdiffeq method), while a node's output depends on nodes 2 hops away
    (the midpoint step attends at the midpoint state): neighbour sampling with ``num_neighbors=-1`` cut its receptive
    field in half. Heun3 re-attends 3 times a step; the Adams and adaptive methods choose their calls (None)."""
    monkeypatch.setitem(sys.modules, "torchdiffeq", _stand_in_torchdiffeq())
    op = build_operator("grand-nl", t=1.0, steps=1, method="midpoint")
    torch.manual_seed(0)
    layer = DiffusionAttention(4, 1, heads="grand-nl(t=1.0, steps=1, method='midpoint')").double().eval()
    edge_index = torch.tensor([[1, 2, 0, 1, 2], [0, 1, 0, 1, 2]])  # 2 -> 1 -> 0, and self loops
    x = torch.randn(3, 4, dtype=torch.float64)
    x2 = x.clone()
    x2[2] += 1.0
    with torch.no_grad():
        moved = (layer(x, edge_index=edge_index)[0] - layer(x2, edge_index=edge_index)[0]).abs().max().item()
    assert moved > 1e-6  # node 0 sees node 2, two hops away
    assert operator_hops(op) == 2
    assert operator_hops(build_operator("grand-nl", t=1.0, steps=3, method="heun3")) == 9
    assert operator_hops(build_operator("grand-nl", t=1.0, steps=3, method="dopri5")) is None
    assert operator_hops(build_operator("grand-nl", t=1.0, steps=3, method="explicit_adams")) is None
    assert operator_hops(build_operator("grand-nl", t=1.0, steps=3, method="rk4")) == 12
