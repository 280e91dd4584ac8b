"""Edge probes 53c: the theory pages' mathematics (docs/theory) checked against the implementation."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.operators import HeatOperator, heat_steps_for_tolerance, heat_truncation_error


def _bound(t: float, steps: int, method: str) -> float:
    return float(heat_truncation_error(torch.tensor(t, dtype=torch.float64), steps, method))


@pytest.mark.parametrize("t, steps", [(-0.56, 76), (2.01, 65), (0.04, 235)])
def test_euler_steps_for_tolerance_meet_the_bound_the_operator_checks(t: float, steps: int) -> None:
    """Bug: heat_steps_for_tolerance(t, tol, "euler") took K = ceil(2 t^2 e^(2|t|) / tol) in Python floats, unchecked
    against heat_truncation_error: for a tol one ulp below the bound at K it returned that K, whose bound exceeds tol,
    and HeatOperator(t, steps=K, method="euler", tol=tol) refused it with "steps=K would do" (naming the same K)."""
    tol = math.nextafter(_bound(t, steps, "euler"), 0.0)
    K = heat_steps_for_tolerance(t, tol, "euler")
    assert _bound(t, K, "euler") <= tol
    assert _bound(t, K - 1, "euler") > tol  # and the smallest such K
    HeatOperator(t=t, steps=K, method="euler", tol=tol)  # accepted
    assert HeatOperator(t=t, steps=None, method="euler", tol=tol).truncation_error().item() <= tol


@pytest.mark.parametrize("t, steps, method", [(1.37, 105, "euler"), (-0.5, 170, "euler"), (-1.05, 26, "taylor"),
                                              (-2.9, 60, "taylor"), (-0.29, 29, "taylor")])
def test_steps_for_tolerance_is_the_smallest_steps(t: float, steps: int, method: str) -> None:
    """Bug: heat_steps_for_tolerance, documented as the smallest K whose bound is at most tol, returned K + 1 for a tol
    equal to the bound at K: Euler rounded its float estimate up, and Taylor multiplied the tails by math.exp(2|t|)
    (t < 0) where heat_truncation_error multiplies by torch.exp, one ulp apart."""
    tol = _bound(t, steps, method)
    assert heat_steps_for_tolerance(t, tol, method) == steps


@pytest.mark.parametrize("t, tol", [(300.0, 1e-300), (349.0, 1e-4), (2.0, 1e-320)])
def test_euler_steps_for_a_tolerance_out_of_reach_is_a_value_error(t: float, tol: float) -> None:
    """Bug: heat_steps_for_tolerance(t, tol, "euler") with 2 t^2 e^(2|t|) / tol past float's range (an inf estimate)
    raised a bare OverflowError ("cannot convert float infinity to integer") from math.ceil, also from
    HeatOperator(method="euler", tol=...), not the ValueError that says no K up to MAX_STEPS meets tol."""
    with pytest.raises(ValueError, match="needs more than 256 steps"):
        heat_steps_for_tolerance(t, tol, "euler")
    with pytest.raises(ValueError, match="needs more than 256 steps"):
        HeatOperator(t=t, method="euler", tol=tol)


@pytest.mark.parametrize("alpha, tol", [(0.29, 0.7158219999999998), (0.8889374902383845, 0.002739885699500913),
                                        (0.88, 0.0034559999999999994)])
def test_ppr_steps_none_meets_tol_by_its_own_truncation_error(alpha: float, tol: float) -> None:
    """Bug: PPROperator(steps=None, tol=...) is documented to pick the smallest K whose truncation_error() meets tol,
    but truncation_error() computed 2 (1 - alpha)^K with torch's pow while the choice (ppr_steps_for_tolerance and the
    constructor's check) used Python's, an ulp apart: the chosen operator reported a bound over its own tol."""
    from diffusionformer.operators import PPROperator

    op = PPROperator(alpha=alpha, steps=None, tol=tol)
    assert float(op.truncation_error()) <= tol
    assert float(PPROperator(alpha=alpha, steps=op.steps - 1).truncation_error()) > tol


def test_bug_a_huge_euler_step_count_is_written_short():
    """Bug: for tol = 1e-300 the Euler refusal printed K as an integer of 303 digits; it is written 4.37e+302."""
    from diffusionformer.operators.heat import heat_steps_for_tolerance

    with pytest.raises(ValueError, match=r"K=4\.37e\+302 > 256 steps") as info:
        heat_steps_for_tolerance(2.0, 1e-300, method="euler")
    assert len(str(info.value)) < 200
    with pytest.raises(ValueError, match=r"K=\d+ > 256 steps"):  # a K of a few digits stays exact
        heat_steps_for_tolerance(5.0, 1e-2, method="euler")
