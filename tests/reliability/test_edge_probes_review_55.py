"""Fresh-eyes review of sitting 55's commits (b5343fd..): edge cases the new checks and centrings missed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import DiffusionOperator, register_operator, unregister_operator
from diffusionformer.testing import assert_operator


class _Static(DiffusionOperator):
    """Plain attention ``f(P) = P`` whose ``static_coefficients()`` each test sets."""

    name = "review55-static"
    static: object = (0.0, 1.0)

    @property
    def degree(self) -> int:
        return 1

    def coefficients(self) -> torch.Tensor:
        return torch.tensor([0.0, 1.0])

    def static_coefficients(self) -> object:
        return self.static


@pytest.fixture
def static_operator():
    register_operator(_Static)
    yield _Static
    unregister_operator(_Static.name)
    _Static.static = (0.0, 1.0)


@pytest.mark.parametrize("static", [(False, True), torch.tensor([False, True]), ("0", "1"), "01",
                                    (np.complex128(0.0), np.complex128(1 + 2j))],
                         ids=["bools", "bool-tensor", "number-strings", "a-string", "numpy-complex"])
@pytest.mark.parametrize("heads", ["review55-static:2", "polynomial:1,review55-static:1"])
def test_bug_static_coefficients_that_are_no_numbers_are_refused(static_operator, static, heads):
    """Bug: the layer's new ``_static_row`` (09800a4) read ``static_coefficients()`` with ``float()``, so bools were
    taken as 0.0 and 1.0, number strings ``("0", "1")`` and even the string ``"01"`` (character by character) as
    coefficients, and a NumPy complex as its real part (a ``ComplexWarning`` at most), all silently: the tutorial
    promises "finite numbers; anything else is refused", and the functional API refuses bools and strings as static
    rows ("coeffs given as a sequence must hold numbers")."""
    static_operator.static = static
    with pytest.raises(TypeError, match=r"operator 'review55-static': static_coefficients\(\) must return a flat"):
        DiffusionAttention(8, 2, heads=heads)


@pytest.mark.parametrize("static", [(np.float32(0.0), np.int64(1)), np.array([0.0, 1.0]), torch.tensor([0.0, 1.0])],
                         ids=["numpy-numbers", "numpy-array", "tensor"])
def test_static_coefficients_of_numpy_numbers_or_a_tensor_are_still_taken(static_operator, static):
    """NumPy numbers are numbers, and a real tensor of them was always read: the layer gives attention's output."""
    static_operator.static = static
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads="review55-static:2")
    torch.manual_seed(0)
    reference = DiffusionAttention(8, 2, heads="attention:2")
    assert layer._static_coefficients == ((0.0, 1.0), (0.0, 1.0))
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(layer(x), reference(x))


class _Refusing(DiffusionOperator):
    """An operator whose ``coefficients()`` raises a ``ValueError`` (its own check of a parameter, say)."""

    @property
    def degree(self) -> int:
        return 1

    def coefficients(self) -> torch.Tensor:
        raise ValueError("review55: no coefficients")


def test_bug_assert_operator_reports_a_coefficients_error_as_a_failed_law():
    """Bug: 09800a4 moved a first ``op.coefficients()`` call (its finiteness law) in front of the ``try`` that turns
    the operator's ``TypeError``/``ValueError`` into an ``AssertionError``: ``assert_operator`` let the operator's
    bare ``ValueError`` escape, where it had said "coefficients() cannot serve 2 heads: ..." (the tutorial: it
    "returns ``None`` or raises an ``AssertionError`` naming the first law that fails")."""
    with pytest.raises(AssertionError, match=r"_Refusing: coefficients\(\) cannot serve 2 heads: review55: no coeff"):
        assert_operator(_Refusing())
