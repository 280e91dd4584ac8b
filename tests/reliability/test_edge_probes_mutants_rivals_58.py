"""Mutation audit (sitting 58) of the rival operators: what the audit found beyond the mutants the suite kills.

GRAND-nl accepts every ``torchdiffeq`` method name. Six of them (``midpoint``, ``heun2``, ``heun3``,
``explicit_adams``, ``implicit_adams``, ``fixed_adams``) are fixed-grid solvers, which torchdiffeq documents as
"``step_size=None``: if not passed then this defaults to stepping between the values of ``t``" (its
FURTHER_DOCUMENTATION.md); the operator asked for ``[0, t]`` only, so they took one step of size ``t`` whatever
``steps`` said. The test puts a stand-in ``torchdiffeq`` in ``sys.modules`` (its fixed-grid midpoint rule, with that
documented default) and checks the layer against a float64 reference written from the paper's model-space equation
(Chamberlain et al., "GRAND: Graph Neural Diffusion", ICML 2021): ``Xdot = (P(X) - I) X``, ``P(X) =
softmax((X W_q + b_q)(X W_k + b_k)^T / sqrt(C))``, the head's output ``X(t) W_v + b_v``.
"""

from __future__ import annotations

import math
import sys
import types

import torch

from diffusionformer import DiffusionAttention

f64 = torch.float64


def _midpoint(f, y, t0, t1, steps):  # noqa: ANN001, ANN202
    """The explicit midpoint rule from ``t0`` to ``t1`` in ``steps`` equal steps of the autonomous field ``f``."""
    h = (t1 - t0) / steps
    for _ in range(steps):
        y = y + h * f(y + h / 2 * f(y))
    return y


def _stand_in_torchdiffeq(calls: list) -> types.ModuleType:
    """A ``torchdiffeq`` whose ``odeint(func, y0, t, rtol, atol, method, options)`` runs the fixed-grid midpoint rule
    as torchdiffeq does: one step per interval of ``options['grid_constructor'](func, y0, t)``, else of ``t``."""
    mod = types.ModuleType("torchdiffeq")

    def odeint(func, y0, t, rtol=1e-7, atol=1e-9, method=None, options=None):  # noqa: ANN001, ANN202
        assert method == "midpoint"
        make = (options or {}).get("grid_constructor")
        grid = t if make is None else make(func, y0, t)
        calls.append(grid.tolist())
        y = y0
        for a, b in zip(grid[:-1].tolist(), grid[1:].tolist()):
            y = _midpoint(lambda y: func(None, y), y, a, b, 1)
        return torch.stack([y0, y])

    mod.odeint = odeint
    return mod


def test_bug_grand_nl_fixed_grid_torchdiffeq_methods_take_the_steps_they_are_given(monkeypatch):
    """Bug: ``grand-nl(t=2, steps=8, method='midpoint')`` integrated with ONE midpoint step of size 2 (torchdiffeq's
    fixed-grid solvers step between the given times unless given ``step_size``), silently: ``steps`` was documented
    as ignored by adaptive solvers only, and the docstring called every torchdiffeq name adaptive. The fixed-grid
    methods now get a grid of ``steps`` steps of ``t / steps``, as ``euler`` and ``rk4`` take ``K`` steps."""
    calls: list = []
    monkeypatch.setitem(sys.modules, "torchdiffeq", _stand_in_torchdiffeq(calls))
    torch.manual_seed(7)
    D, N, t, steps = 8, 5, 2.0, 8
    layer = DiffusionAttention(D, 1, heads=f"grand-nl(t={t}, steps={steps}, method='midpoint')", bias=True)
    layer = layer.double().eval()
    with torch.no_grad():
        layer.qkv.bias.normal_(0, 1.0)
    Wq, Wk, Wv = layer.qkv.weight.chunk(3)
    bq, bk, bv = layer.qkv.bias.chunk(3)
    x = torch.randn(1, N, D, dtype=f64)
    got = layer(x)[0]
    assert calls == [torch.linspace(0.0, t, steps + 1, dtype=f64).tolist()]

    def field(X):  # noqa: ANN001, ANN202  -- Xdot = (P(X) - I) X in model space
        P = torch.softmax((X @ Wq.T + bq) @ (X @ Wk.T + bk).T / math.sqrt(D), -1)
        return P @ X - X

    want = layer.out_proj(_midpoint(field, x[0], 0.0, t, steps) @ Wv.T + bv)
    assert (got - want).abs().max().item() < 1e-10
    one_step = layer.out_proj(_midpoint(field, x[0], 0.0, t, 1) @ Wv.T + bv)  # what the layer computed before
    assert (one_step - want).abs().max().item() > 1e-3
