"""Review of the 53-series changes (helper 53g): regressions and cross-feature bugs found in them."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import HeatOperator


class _MatrixHeat(HeatOperator):
    """A user's subclass of a registered operator that runs as a function of a materialised P (not registered)."""

    is_polynomial = False

    def apply_matrix(self, P, v):
        return torch.matrix_exp(P) @ v


def test_bug_an_unregistered_subclass_is_not_named_by_its_parents_name():
    """Bug: ``_label`` named an operator by its ``name`` even when inherited from a registered parent whose
    behaviour the subclass changes (which ``operator_hops`` no longer trusts): a ``HeatOperator`` subclass with its
    own ``apply_matrix`` on a sparse input read "operator 'heat' does not support the sparse back-end ... use ... a
    polynomial operator such as 'heat'", naming the built-in that does support it, not the offending class."""
    op = _MatrixHeat()
    layer = DiffusionAttention(8, 2, heads=[op, op])
    x, edge_index = torch.randn(4, 8), torch.tensor([[0, 1, 2], [1, 2, 3]])
    with pytest.raises(ValueError, match=r"operator _MatrixHeat \(a subclass of 'heat'\) does not support the sparse"):
        layer(x, edge_index=edge_index)


def test_pins_a_registered_operator_and_its_parametrized_wrapper_keep_their_name():
    """The registered class (and torch's parametrize wrapper of it, which adds no behaviour) is named by ``name``."""
    from torch.nn.utils import parametrize

    from diffusionformer.operators.base import _label

    op = HeatOperator(learnable=True)
    assert _label(op) == "'heat'"
    parametrize.register_parametrization(op, "t", torch.nn.Identity())
    assert _label(op) == "'heat'"


@pytest.mark.parametrize("name", ["heat", "ppr"])
def test_bug_a_hessian_of_the_coefficients_does_not_poison_later_transforms(name):
    """Bug: ``_tensor_cache`` (the heat and PPR tables of ``k`` and ``1/k!``) cached the tensors built inside nested
    ``torch.func`` transforms (``hessian``, ``grad(grad(f))``: the second derivatives ``_powers`` made finite),
    which belong to the transforms' levels: every later ``torch.func.grad`` or ``jvp`` of those coefficients in the
    process failed with torch's "INTERNAL ASSERT FAILED ... level <= current_level ... escaped?"."""
    from torch.func import grad, hessian, jvp

    from diffusionformer.operators.heat import _taylor_table, heat_coefficients
    from diffusionformer.operators.ppr import _ppr_table, ppr_coefficients

    _taylor_table.cache_clear()
    _ppr_table.cache_clear()
    x = torch.tensor(0.25, dtype=torch.float64)
    f = (lambda s: heat_coefficients(s, 3).sum()) if name == "heat" else (lambda s: ppr_coefficients(s, 3).sum())
    h = hessian(f)(x)
    g = grad(f)(x)
    _, tangent = jvp(f, (x,), (torch.ones_like(x),))
    ref = x.clone().requires_grad_(True)
    (d1,) = torch.autograd.grad(f(ref), ref, create_graph=True)
    (d2,) = torch.autograd.grad(d1, ref)
    assert torch.equal(g, d1.detach())
    torch.testing.assert_close(tangent, d1.detach())  # forward mode: the same derivative to rounding
    torch.testing.assert_close(h, d2)
