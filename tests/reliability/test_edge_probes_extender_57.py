"""A researcher extending the library with an operator of their own, following docs/tutorials/custom_operator.rst:
the contracts a custom operator is promised (spec round trip, harness laws, the layer's errors)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.utils import parametrize

from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import DiffusionOperator, build_operator, register_operator, unregister_operator
from diffusionformer.testing import assert_operator


class _PowerNoSpec(DiffusionOperator):
    """The tutorial's ``(I - P)^m`` as a newcomer writes it without ``spec_kwargs``: its spec drops ``order``."""

    name = "probe57-power"

    def __init__(self, order: int = 2, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.order = order
        self._static = tuple(float((-1) ** k * math.comb(order, k)) for k in range(order + 1))
        self.register_buffer("_c", torch.tensor(self._static), persistent=False)

    @property
    def degree(self) -> int:
        return self.order

    def coefficients(self) -> torch.Tensor:
        return self._c

    def static_coefficients(self) -> tuple[float, ...]:
        return self._static


class _PowerWithSpec(_PowerNoSpec):
    name = "probe57-power-spec"

    def spec_kwargs(self) -> dict:
        return {"order": self.order}


@pytest.fixture
def registered():
    names = []

    def reg(cls):
        register_operator(cls)
        names.append(cls.name)
        return cls

    yield reg
    for name in names:
        unregister_operator(name)


def test_assert_operator_refuses_a_spec_that_rebuilds_another_operator(registered):
    # spec() is what heads_spec(), the layer's repr and a checkpoint's model record write: an operator whose spec
    # dropped an architecture argument (order=3 read back as order=2) passed every law of the harness, and a resume
    # with another order was taken for the same model
    registered(_PowerNoSpec)
    assert_operator("probe57-power")  # the defaults: the spec rebuilds them
    with pytest.raises(AssertionError, match=r"probe57-power: spec\(\) 'probe57-power' rebuilds another operator.*"
                                             r"spec_kwargs"):
        assert_operator("probe57-power", order=3)


def test_assert_operator_accepts_a_spec_that_rebuilds_the_operator(registered):
    registered(_PowerWithSpec)
    assert_operator("probe57-power-spec", order=3)
    layer = DiffusionAttention(16, 4, heads="attention:2,probe57-power-spec(order=3):2")
    assert layer.heads_spec() == "attention:2,probe57-power-spec(order=3):2"


def test_assert_operator_still_takes_a_parametrized_operator():
    # parametrize's generated class writes its parent's spec; its state dict has other keys than the parent's
    op = build_operator("polynomial", steps=2, num_heads=2)
    parametrize.register_parametrization(op, "theta", torch.nn.Tanh())
    assert op.spec().startswith("polynomial")
    assert_operator(op)
