"""Review findings of sitting 49, second pass: operator subclasses built from mixins, classes that declare a name
without being registered (or were unregistered since) and a polynomial started from an unregistered operator (each
test's docstring says what was wrong)."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import (DiffusionOperator, ExactPPROperator, LaplacianOperator, PolynomialOperator,
                                       build_operator, register_operator, unregister_operator)


class _SteeperMixin:
    """Supplies ``coefficients()`` ``(1, -2)`` to whatever fixed operator it is mixed into."""

    def coefficients(self):
        return torch.tensor([1.0, -2.0], device=self._c.device, dtype=self._c.dtype)


class _Steeper(LaplacianOperator):
    def coefficients(self):
        return torch.tensor([1.0, -2.0], device=self._c.device, dtype=self._c.dtype)


def test_a_mixin_supplying_coefficients_does_not_keep_the_parents_constants():
    """Bug: ``class Op(SteeperMixin, LaplacianOperator)``, whose ``coefficients()`` (from the mixin) are ``(1, -2)``,
    kept LaplacianOperator's ``static_coefficients()`` ``(1, -1)``: the check for a redefined ``coefficients()``
    looked at the class's own body only, so the layer's fused path ran ``v - P v`` while ``coefficients()`` said
    ``v - 2 P v``. Redefined is now as the MRO resolves it; a mixin that supplies ``static_coefficients()`` too, or
    only that, keeps it."""

    class Mixed(_SteeperMixin, LaplacianOperator):
        pass

    class StaticMixin:
        def static_coefficients(self):
            return (1.0, -2.0)

    class MixedBoth(StaticMixin, _SteeperMixin, LaplacianOperator):
        pass

    assert Mixed().static_coefficients() is None
    assert MixedBoth().static_coefficients() == (1.0, -2.0)
    assert LaplacianOperator().static_coefficients() == (1.0, -1.0)
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, [Mixed(), Mixed()]).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        got = layer(x)
        E, C = 8, 4
        q, k, v = (x.double() @ layer.qkv.weight.double().T + layer.qkv.bias.double()).split(E, dim=-1)
        q, k, v = (t.view(2, 5, 2, C).transpose(1, 2) for t in (q, k, v))
        P = torch.softmax(q @ k.transpose(-2, -1) / C ** 0.5, dim=-1)
        heads = (v - 2.0 * P @ v).transpose(1, 2).reshape(2, 5, E)
        want = heads @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_a_class_that_declares_a_name_without_being_registered_has_no_spec():
    """Bug: the spec took any class with ``name`` in its own body for a registered one, so a class that declares
    ``name = "laplacian"`` (a copy of LaplacianOperator running ``v - 2 P v``, never registered) wrote ``laplacian``
    (its checkpoints matched plain Laplacian heads and the spec rebuilt the other class), and an instance of a class
    unregistered since kept writing a name that now builds another class. Only a class the registry holds under that
    name has a spec now; registering it again gives it back."""

    class Copy(_Steeper):
        name = "laplacian"

    assert Copy().spec().startswith("<unregistered ") and Copy().spec().endswith(".Copy>")

    @register_operator
    class First(DiffusionOperator):
        name = "probe-49b-first"
        degree = 1

        def coefficients(self):
            return torch.tensor([0.0, 1.0])

    old = First()
    assert old.spec() == "probe-49b-first"
    unregister_operator("probe-49b-first")
    try:
        @register_operator(name="probe-49b-first")
        class Again(DiffusionOperator):  # a notebook cell run again with other coefficients
            degree = 1

            def coefficients(self):
                return torch.tensor([1.0, 0.0])

        assert old.spec().startswith("<unregistered ") and old.spec().endswith(".First>")
        assert Again().spec() == "probe-49b-first"
    finally:
        unregister_operator("probe-49b-first")
    register_operator(First)
    try:
        assert old.spec() == "probe-49b-first"
    finally:
        unregister_operator("probe-49b-first")


@pytest.mark.parametrize("basis", ["monomial", "chebyshev"])
def test_a_polynomial_started_from_an_unregistered_operator_has_a_rebuildable_spec(basis):
    """Bug: ``PolynomialOperator(init=op)`` records ``op.spec()``; for an operator of an unregistered class that is now
    ``'<unregistered module.Class>'``, so the polynomial (a registered operator, whose spec rebuilt it before) wrote
    ``polynomial(steps=2, init='<unregistered ...>')``, which build_operator refused: the layer's heads_spec and a
    run's model could not be rebuilt. It records the coefficients it started from instead."""
    poly = PolynomialOperator(steps=2, init=_Steeper(), num_heads=2, basis=basis)
    extra = "" if basis == "monomial" else ", basis='chebyshev'"
    assert poly.spec() == f"polynomial(steps=2, init=[1.0, -2.0, 0.0]{extra})"
    again = build_operator(poly.spec(), num_heads=2)
    torch.testing.assert_close(again.coefficients(), poly.coefficients())
    assert PolynomialOperator(steps=2, init=LaplacianOperator()).spec() == "polynomial(steps=2, init='laplacian')"


def test_a_mixin_supplying_apply_matrix_does_not_keep_the_parents_causal_hook():
    """Bug: ``class Op(MatrixMixin, ExactPPROperator)``, whose ``apply_matrix`` comes from the mixin, kept
    ExactPPROperator's triangular PPR solve as ``apply_causal_matrix``, so causal layers and cached decoding ran the
    parent's f(P) and non-causal calls the mixin's. It gets the default hook now (``apply_matrix`` on the triangular
    ``P``); a class that supplies both keeps its own, and ExactPPROperator keeps its solve."""

    class MatrixMixin:
        def apply_matrix(self, P, v):
            return P @ v

    class Mixed(MatrixMixin, ExactPPROperator):
        pass

    class Both(Mixed):
        def apply_causal_matrix(self, P, v):
            return P @ v

    assert Mixed.apply_causal_matrix is DiffusionOperator.apply_causal_matrix
    assert Both.apply_causal_matrix is Both.__dict__["apply_causal_matrix"]
    assert ExactPPROperator.apply_causal_matrix is not DiffusionOperator.apply_causal_matrix


def test_the_harness_names_an_unregistered_subclass_by_its_class():
    """Bug: ``assert_operator`` named the operator by ``op.name``, which an unregistered subclass inherits, so a
    failing ``Bad(LaplacianOperator)`` was reported as ``laplacian: static_coefficients() disagrees ...``: the
    library's operator, not the class under test. It names the class now (a registered class keeps its name)."""
    from diffusionformer.testing import assert_operator

    class Bad(_Steeper):
        def static_coefficients(self):
            return (1.0, -1.0)

    with pytest.raises(AssertionError, match=r"^Bad: static_coefficients\(\) disagrees"):
        assert_operator(Bad())
