"""Registry behaviour and the property harness over every registered operator."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.operators import (
    DiffusionOperator,
    HeatOperator,
    LaplacianOperator,
    build_operator,
    list_operators,
    parse_operator_spec,
    register_operator,
    unregister_operator,
)
from diffusionformer.testing import assert_operator

BUILTIN = {"attention", "laplacian", "heat", "heat-exact", "ppr", "polynomial"}


def test_builtins_registered():
    assert BUILTIN <= set(list_operators())
    assert list_operators() == sorted(list_operators())


@pytest.mark.parametrize(
    "alias,name",
    [("I-P", "laplacian"), ("i-p", "laplacian"), ("P", "attention"), ("Softmax", "attention"), ("APPNP", "ppr"),
     ("gpr", "polynomial"), ("expm", "heat-exact"), ("heat_kernel", "heat"), (" Heat ", "heat")],
)
def test_aliases_resolve(alias, name):
    assert build_operator(alias).name == name


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown operator 'bogus'.*laplacian"):
        build_operator("bogus")


def test_build_from_class_instance_and_spec():
    assert isinstance(build_operator(LaplacianOperator), LaplacianOperator)
    op = HeatOperator(t=0.3, steps=2)
    assert build_operator(op) is op
    with pytest.raises(TypeError, match="together with an operator instance"):
        build_operator(op, t=1.0)
    h = build_operator("heat(t=0.25, steps=3)", num_heads=2)
    assert h.steps == 3 and h.t.item() == 0.25
    assert build_operator("heat(t=0.25)", t=0.5).t.item() == 0.5  # kwargs override the spec
    with pytest.raises(TypeError, match="cannot build operator 'heat'"):
        build_operator("heat", temperature=2.0)
    with pytest.raises(TypeError, match="operator spec must be"):
        build_operator(3.0)


def test_parse_spec_errors():
    assert parse_operator_spec("heat(t=-0.5, learnable=True)") == ("heat", {"t": -0.5, "learnable": True})
    with pytest.raises(ValueError, match="key=value"):
        parse_operator_spec("heat(0.5)")
    with pytest.raises(ValueError, match="Python literal"):
        parse_operator_spec("heat(t=foo)")


def test_register_is_strict():
    with pytest.raises(TypeError, match="subclass of DiffusionOperator"):
        register_operator(dict)  # type: ignore[arg-type]

    class Dup(DiffusionOperator):
        degree = 1

        def coefficients(self):
            return torch.tensor([0.0, 1.0])

    with pytest.raises(ValueError, match="already registered by AttentionOperator"):
        register_operator(Dup, name="attention")
    with pytest.raises(ValueError, match="already registered"):
        register_operator(Dup, name="fresh-name-xyz", aliases=("I-P",))
    assert "fresh-name-xyz" not in list_operators()


def test_user_operator_is_covered_by_the_harness():
    @register_operator(name="test-lazy-walk", aliases=("lazy",))
    class LazyWalk(DiffusionOperator):
        """(I + P) / 2: a lazy random walk."""

        degree = 1

        def coefficients(self):
            return torch.tensor([0.5, 0.5])

    try:
        assert build_operator("lazy").name == "test-lazy-walk"
        assert_operator("test-lazy-walk")
    finally:
        unregister_operator("test-lazy-walk")
    assert "test-lazy-walk" not in list_operators()


class WrongCoefficients(DiffusionOperator):
    """Claims degree 2 but its sparse path would be fine; coefficients have the wrong length."""

    degree = 2

    def coefficients(self):
        return torch.tensor([0.0, 1.0])


def test_harness_can_fail():
    with pytest.raises(AssertionError, match="coefficients have shape"):
        assert_operator(WrongCoefficients())


@pytest.mark.parametrize("name", sorted(set(list_operators())))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_every_registered_operator(name, dtype):
    assert_operator(name, dtype=dtype)


@pytest.mark.parametrize(
    "spec,kwargs",
    [
        ("heat", dict(t=2.5)),
        ("heat", dict(t=0.8, steps=5, method="euler")),
        ("heat", dict(t=-0.5, steps=12)),
        ("heat", dict(t=1.5, learnable=True)),
        ("ppr", dict(alpha=0.3, steps=4, learnable=True)),
        ("polynomial", dict(steps=4, init=[0.3, -0.2, 0.5, 0.1, -0.4])),
        ("polynomial", dict(steps=2, init="laplacian")),
        ("heat-exact", dict(t=0.7, learnable=True)),
        ("polynomial", dict(steps=4, init=[0.3, -0.2, 0.5, 0.1, -0.4], basis="chebyshev")),
        ("ppr-exact", dict(alpha=0.05)),
        ("attnscale", dict(omega=-0.6)),
        ("neutreno", dict(lam=0.3)),
        ("differential", dict(depth=5)),
        ("differential", dict(lambda_init=0.5)),
        ("grand-nl", dict(t=2.0, steps=3, method="rk4")),
    ],
)
def test_harness_on_configured_operators(spec, kwargs):
    assert_operator(spec, num_heads=3, **kwargs)
