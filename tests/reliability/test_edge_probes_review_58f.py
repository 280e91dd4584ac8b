"""Review (sitting 58) of a learnable heat head's default ``steps`` over the room its time may learn into (commits
fbe2e30 and 9f4c0ba: a sharpening ``t`` also takes the ``K`` that ``-max(2|t|, 1)``, or ``min_t`` if higher, needs),
and the experiments page's hops of grand-nl's solvers (3e431b8: ``None`` where the solver chooses its calls).

Where no ``K <= MAX_STEPS`` meets the tolerance at an edge of that room the head is refused, and the refusal must say
so: it named a time the user never gave ("needs more than 256 steps for t=-72.0") and no way out.
Tests whose docstring starts with "Bug:" failed before their fix.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from diffusionformer.experiments.minibatch import MiniBatchConfig, check_num_neighbors, propagation_hops
from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig
from diffusionformer.operators import HeatOperator, build_operator
from diffusionformer.operators.heat import MAX_STEPS, heat_steps_for_tolerance


def test_bug_learnable_heat_whose_room_above_is_out_of_reach_says_so():
    """Bug: ``HeatOperator(t=150, learnable=True)`` raised "the heat kernel needs more than 256 steps for t=300.0":
    ``300`` is the room a learned ``t`` is given, not a ``t`` the user passed, and no way out was named. The refusal
    now names the room's edge and an explicit ``steps``."""
    room = rf"heat\(t=150, learnable=True\): steps=None leaves a learned t room to reach 300.*{MAX_STEPS}.*steps="
    with pytest.raises(ValueError, match=room):
        HeatOperator(t=150.0, learnable=True)
    with pytest.raises(ValueError, match=room):  # through the registry's spec as well
        build_operator("heat(t=150.0, learnable=True)")
    assert HeatOperator(t=150.0, learnable=True, steps=MAX_STEPS).steps == MAX_STEPS  # the way out builds


@pytest.mark.parametrize("t, min_t", [(-36.0, float("-inf")), (-40.0, -75.0)])
def test_room_below_out_of_reach_builds_as_before(t, min_t):
    """A sharpening head whose room below (``-72``, ``-75``) no ``K <= MAX_STEPS`` covers built before the room
    below was covered (``t=-36``: ``K = 134``): it still builds, with the ``K`` of its ``t`` and of the room above."""
    op = HeatOperator(t=t, learnable=True, min_t=min_t)
    assert op.steps == max(heat_steps_for_tolerance(t, 1e-4), heat_steps_for_tolerance(2 * abs(t), 1e-4))


def test_reachable_room_still_sets_the_steps_and_round_trips():
    """The rule itself is kept: ``t=-1`` gets the ``K`` of ``-2`` whatever a farther ``min_t``, ``t=-20`` the ``K``
    of ``min_t=-40``; the spec (an explicit ``steps``) rebuilds the same head."""
    near = HeatOperator(t=-1.0, learnable=True).steps
    assert HeatOperator(t=-1.0, learnable=True, min_t=-100.0).steps == near
    op = HeatOperator(t=-20.0, learnable=True, min_t=-40.0)
    assert op.steps == 148
    again = build_operator(op.spec())
    assert (again.steps, again.min_t, again.learnable) == (op.steps, -40.0, True)


def test_experiments_page_hops_of_grand_nl_solvers(monkeypatch):
    """The experiments page's claim (added with this review of 3e431b8): grand-nl counts a hop per attention call, and
    a setting whose solver chooses its calls (adaptive, Adams) has no known ``R``: one int ``num_neighbors`` is
    refused (as it was not before 3e431b8, when such a setting read as ``K`` hops), a list warns."""
    monkeypatch.setitem(sys.modules, "torchdiffeq", types.ModuleType("torchdiffeq"))
    sys.modules["torchdiffeq"].odeint = None  # built, never called here

    def model(heads: str) -> DiffusionGraphTransformer:
        torch.manual_seed(0)
        return DiffusionGraphTransformer(GraphTransformerConfig(in_channels=4, num_classes=2, dim=8, depth=2,
                                                                num_heads=2, heads=heads))

    assert propagation_hops(model("attention:1,grand-nl(t=1.0, steps=3, method='midpoint'):1")) == 2 * 6
    assert propagation_hops(model("grand-nl(t=1.0, steps=3, method='rk4'):2")) == 2 * 12
    for method in ("dopri5", "explicit_adams"):
        hops = propagation_hops(model(f"attention:1,grand-nl(t=1.0, steps=3, method='{method}'):1"))
        assert hops is None
        problem, _ = check_num_neighbors(MiniBatchConfig(8, 5), hops)
        assert "R is unknown or unbounded; give a list" in problem
        problem, warning = check_num_neighbors(MiniBatchConfig(8, [5, 5]), hops)
        assert problem is None and "unknown or unbounded" in warning
