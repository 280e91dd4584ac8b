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


@pytest.mark.parametrize("name", sorted(list_operators()))
def test_numpy_numbers_build_the_same_operator_as_python_numbers(name):
    """Bug: a numpy int from a sweep grid (``steps=np.int64(4)``, ``num_heads=np.int64(2)``) was
    refused by ppr/polynomial/grand-nl/heat/differential ("must be an int in [1, 1024], got
    np.int64(4)"), although numpy floats were read. Both now build the operator a Python number
    builds: the same spec (Python numbers in it, so it parses again) and the same parameters."""
    import numpy as np

    kwargs = dict(type(build_operator(name)).example_kwargs)
    as_numpy = {k: np.int64(v) if isinstance(v, int) and not isinstance(v, bool)
                else np.float64(v) if isinstance(v, float) else v for k, v in kwargs.items()}
    assert any(isinstance(v, np.int64) for v in as_numpy.values()) or name not in (
        "ppr", "polynomial", "grand-nl", "heat", "differential")  # the bug's cases do take an int
    torch.manual_seed(0)
    plain = build_operator(name, **kwargs, num_heads=2)
    torch.manual_seed(0)
    grid = build_operator(name, **as_numpy, num_heads=np.int64(2))
    assert grid.spec() == plain.spec() and "np." not in grid.spec()
    assert type(grid.num_heads) is int and grid.num_heads == 2
    assert build_operator(grid.spec(), num_heads=2).spec() == plain.spec()
    got, want = dict(grid.named_parameters()), dict(plain.named_parameters())
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_numpy_sizes_build_the_same_attention_layer():
    """Bug: ``DiffusionAttention(np.int64(32), np.int64(4))`` was refused ("dim must be a positive
    int, got np.int64(32)") as were numpy ``num_kv_heads``/``dropout``; torch's own layers take
    them. The layer built from numpy numbers now equals the one built from Python numbers."""
    import numpy as np

    from diffusionformer import DiffusionAttention

    torch.manual_seed(0)
    plain = DiffusionAttention(32, 4, num_kv_heads=2, dropout=0.25, heads="attention:{half},ppr:{half}")
    torch.manual_seed(0)
    grid = DiffusionAttention(np.int64(32), np.int32(4), num_kv_heads=np.uint8(2), dropout=np.float32(0.25),
                              heads="attention:{half},ppr:{half}")
    assert (grid.dim, grid.num_heads, grid.num_kv_heads, grid.dropout) == (32, 4, 2, 0.25)
    assert all(type(v) is int for v in (grid.dim, grid.num_heads, grid.num_kv_heads, grid.head_dim))
    assert [op.spec() for op in grid.operators] == [op.spec() for op in plain.operators]
    assert grid._groups == plain._groups == [(0, 2), (2, 2)]
    got, want = grid.state_dict(), plain.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    with pytest.raises(ValueError, match=r"num_heads must be a positive int, got np.True_"):
        DiffusionAttention(32, np.bool_(True))
