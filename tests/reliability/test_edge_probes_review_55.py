"""Fresh-eyes review of sitting 55's commits (b5343fd..): edge cases the new checks and centrings missed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

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


class _StaticScale(DiffusionOperator):
    """``c_0 I``: a fixed degree-0 head (``static_coefficients() == (2.0,)``)."""

    name = "review55-scale"

    @property
    def degree(self) -> int:
        return 0

    def coefficients(self) -> torch.Tensor:
        return torch.tensor([2.0])

    def static_coefficients(self) -> tuple[float, ...]:
        return (2.0,)


class _Learned(DiffusionOperator):
    """``(1 - a) I + a P`` with a learned ``a``."""

    name = "review55-learned"

    def __init__(self, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.a = nn.Parameter(torch.tensor(0.3))

    @property
    def degree(self) -> int:
        return 1

    def coefficients(self) -> torch.Tensor:
        return torch.stack([1 - self.a, self.a])


@pytest.fixture
def static_operator():
    classes = (_Static, _StaticScale, _Learned)
    for cls in classes:
        register_operator(cls)
    yield _Static
    for cls in classes:
        unregister_operator(cls.name)
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


# kills of mutants of the same check (helper 55o's audit)
def test_static_coefficients_one_entry_too_many_is_refused(static_operator):
    """``degree + 2`` entries (one past ``P^K``) are refused as many more are: the engine would drop ``c_{K+1}``."""
    static_operator.static = (0.0, 1.0, 0.5)
    with pytest.raises(ValueError, match=r"_Static\.static_coefficients\(\) must have degree \+ 1 = 2 entries, got 3"):
        DiffusionAttention(8, 2, heads="review55-static:2")


def test_static_coefficients_as_bytes_are_refused(static_operator):
    """``bytes`` iterate as ints (``b"\\x00\\x01"`` -> 0, 1): refused as a string is, not read as ``(0.0, 1.0)``."""
    static_operator.static = b"\x00\x01"
    match = r"operator 'review55-static': static_coefficients\(\) must return a flat tuple"
    with pytest.raises(TypeError, match=match):
        DiffusionAttention(8, 2, heads="review55-static:2")


def test_static_coefficients_as_a_number_are_refused(static_operator):
    """A bare number is no tuple of coefficients: refused, not read as ``(c_0,)`` padded to ``(c_0, 0.0)``."""
    static_operator.static = 1.0
    match = r"operator 'review55-static': static_coefficients\(\) must return a flat tuple"
    with pytest.raises(TypeError, match=match):
        DiffusionAttention(8, 2, heads="review55-static:2")


def test_degree_zero_static_head_beside_a_learned_head(static_operator):
    """A fixed ``c_0 I`` head beside a learned one takes the layer's affine path as ``(c_0, 0)``: its head is
    ``2 v``, exactly the reference combination (a row of one entry was read at ``c_1``: an IndexError)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads="review55-scale:1,review55-learned:1").double()
    assert layer._affine_heads == ((0,), (2.0,), (0.0,))
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    assert torch.isfinite(layer(x)).all()
