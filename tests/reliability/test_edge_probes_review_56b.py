"""Review of commit 55f6773 (cached fixed coefficient rows, ``_Pow.apply``, the Euler heat table; helper 56j).

Probed and found equal to the commit before (bit for bit, float32, float64 and bfloat16 layers): the coefficients of
layers mixing fixed, learned and non-polynomial operators; forward and gradients after ``.double()``, ``.half()``,
``deepcopy``, ``torch.save``/``torch.load(weights_only=False)``, meta init with ``to_empty`` and
``reset_parameters``, ``load_state_dict`` (``assign=True`` on meta too), ``layer.operators[i] = op``,
``parametrize``, a first call under ``inference_mode``, autocast, checkpointing, double backward, anomaly mode,
``torch.func`` ``grad``/``vmap``/``hessian``/``jacrev``/``functional_call`` and ``torch.compile(fullgraph=True)``
(static and dynamic shapes). The Euler weights at ``K = 200`` and ``1000`` are as close to the exact rationals as
before (the ``lgamma`` binomials were about 1e-12 relative off at ``K = 1000``; exact integers since, see
test_edge_probes_fixes_56c.py).

Found: ``layer.coefficients()`` handed out a view of an operator's own parameter; ``_Pow``'s custom ``jvp`` (now
the Euler weights' too) is not differentiated by an outer forward level (``jacfwd(jacfwd)``, ``jacfwd(hessian)``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import hessian, jacfwd, jacrev

from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import DiffusionOperator
from diffusionformer.operators.base import _powers
from diffusionformer.operators.heat import heat_coefficients
from diffusionformer.operators.ppr import ppr_coefficients


class _OwnWeights(DiffusionOperator):
    """A user's learned operator whose ``coefficients()`` is its parameter itself (``[c_0, c_1]``)."""

    def __init__(self) -> None:
        super().__init__(1)
        self.w = nn.Parameter(torch.tensor([0.25, 0.75]))

    @property
    def degree(self) -> int:
        return 1

    def coefficients(self) -> torch.Tensor:
        return self.w


def test_bug_layer_coefficients_is_no_view_of_an_operators_parameter():
    """Bug: a layer whose heads are one operator that needs no cast nor padding returned that operator's own
    ``coefficients()`` from :meth:`DiffusionAttention.coefficients` (since the rows were no longer concatenated):
    a view of the operator's parameter, so a caller editing the tensor it was handed (normalising the rows for a
    plot) rewrote the model's weights. It copied before, as it copies the cached rows of an all-fixed layer."""
    layer = DiffusionAttention(8, 1, [_OwnWeights()])
    c = layer.coefficients()
    assert c.requires_grad  # still differentiable in the parameter
    with torch.no_grad():
        c.mul_(2.0)
    assert layer.operators[0].w.tolist() == [0.25, 0.75]
    assert layer.coefficients().tolist() == [[0.25, 0.75]]


def _second_derivatives(f, t):
    """``(jacfwd(jacfwd(f)), hessian(f))`` at ``t``: forward over forward, and torch.func's forward over reverse."""
    return jacfwd(jacfwd(f))(t), hessian(f)(t)


@pytest.mark.parametrize("method", ["euler", "taylor"])
@pytest.mark.parametrize("t", [0.0, 0.7, 3.0])
def test_bug_forward_over_forward_second_derivative_of_heat_weights(method, t):
    """Bug: the learned heat powers' ``_Pow`` has a custom ``jvp``, which torch does not differentiate at an outer
    forward level: ``jacfwd(jacfwd(f))`` of any function of the weights read 0 for its share of the second
    derivative, silently (a Taylor ``K = 3`` mean: -2.44 against the Hessian's -0.40). The commit moved the Euler
    weights onto ``_Pow`` too, which had been right with ``pow`` (Σ_k k c_k / K = t / K: second derivative 0, read
    as -0.44 at ``K = 3``). Under nested forward-mode levels the powers are torch's ``pow`` (finite there at 0)."""
    K = 3
    w = torch.arange(K + 1, dtype=torch.float64) / K

    def f(z):
        return (heat_coefficients(z, K, method) * w).sum()

    ff, fr = _second_derivatives(f, torch.tensor(t, dtype=torch.float64))
    assert torch.isfinite(ff) and torch.allclose(ff, fr, atol=1e-12)
    if method == "euler":
        assert abs(ff.item()) < 1e-12  # the mean of the binomial weights is t: linear in t


def test_bug_forward_over_forward_second_derivative_of_ppr_weights():
    """The learned PPR weights go through the same powers: ``jacfwd(jacfwd)`` agrees with the Hessian."""
    w = torch.arange(5, dtype=torch.float64)

    def f(a):
        return (ppr_coefficients(a, 4) * w).sum()

    ff, fr = _second_derivatives(f, torch.tensor(0.3, dtype=torch.float64))
    assert torch.allclose(ff, fr, atol=1e-12) and abs(fr.item()) > 1e-3


def test_bug_forward_over_forward_agrees_with_double_backward_at_the_ends():
    """At ``t = 0`` (and ``t = K`` for Euler), where ``_Pow`` keeps reverse-mode second derivatives finite, forward
    over forward is finite too (torch's ``pow`` masks the exponent 0 in its forward rule) and agrees with them."""
    for method, K, t in (("taylor", 4, 0.0), ("euler", 4, 0.0), ("euler", 4, 4.0)):
        x = torch.tensor(t, dtype=torch.float64, requires_grad=True)
        c = heat_coefficients(x, K, method)
        (g,) = torch.autograd.grad((c * c).sum(), x, create_graph=True)
        (gg,) = torch.autograd.grad(g, x)
        ff = jacfwd(jacfwd(lambda z: (heat_coefficients(z, K, method) ** 2).sum()))(x.detach())
        assert torch.isfinite(gg) and torch.allclose(gg, ff, atol=1e-12)


@pytest.mark.parametrize("x0", [0.0, 0.5])
def test_bug_third_derivative_of_the_powers_through_jacfwd_of_hessian(x0):
    """``jacfwd(hessian(f))`` (two forward levels around a reverse one) of ``Σ_k x^k``, ``k = 0 .. 4``, read 0
    instead of ``6 + 24 x``, at 0 too; reverse over reverse over reverse was right."""
    k = torch.arange(5, dtype=torch.float64)

    def f(z):
        return _powers(z, k).sum()

    x = torch.tensor(x0, dtype=torch.float64)
    assert jacrev(jacrev(jacrev(f)))(x).item() == pytest.approx(6 + 24 * x0)
    assert jacfwd(hessian(f))(x).item() == pytest.approx(6 + 24 * x0)
