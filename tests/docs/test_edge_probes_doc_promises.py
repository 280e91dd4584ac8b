"""Edge probes: documented promises (docstrings, Raises/Args clauses) checked against the code."""
import pytest
import torch

from diffusionformer.operators.heat import heat_coefficients
from diffusionformer.operators.ppr import ppr_coefficients


def test_bug_heat_coefficients_refuses_bool_steps():
    """Bug: heat_coefficients(t, True) returned the K = 1 weights: its check ``steps must be a non-negative int``
    let a bool through (as int), unlike every other count of the library (bools refused)."""
    with pytest.raises(ValueError, match="steps"):
        heat_coefficients(torch.tensor(1.0), True)
    assert heat_coefficients(torch.tensor(1.0), 1).shape == (2,)


def test_bug_ppr_coefficients_refuses_bool_steps():
    """Bug: ppr_coefficients(alpha, True) returned the K = 1 weights: its check ``steps must be a positive int``
    let a bool through (as int)."""
    with pytest.raises(ValueError, match="steps"):
        ppr_coefficients(torch.tensor(0.5), True)
    assert torch.allclose(ppr_coefficients(torch.tensor(0.5), 1), torch.tensor([0.5, 0.5]))
