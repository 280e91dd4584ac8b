"""Edge probes of the public operator harness (``diffusionformer.testing``) and the registry's extension API.

Deliberately wrong user operators must fail :func:`~diffusionformer.testing.assert_operator` with an
``AssertionError`` naming the law, right ones must pass, and the caller's operator must come back untouched.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.nn.heads import parse_heads
from diffusionformer.operators import (AttnScaleOperator, DiffusionOperator, ExactHeatOperator, build_operator,
                                       list_operators, register_operator)
from diffusionformer.testing import assert_operator


class _Lazy(DiffusionOperator):
    """``(I + P) / 2``, right in every respect; the wrong operators below change one thing."""

    degree = 1

    def coefficients(self) -> torch.Tensor:
        return torch.tensor([0.5, 0.5])


class _StaticOfAnotherLength(_Lazy):
    def static_coefficients(self):  # noqa: ANN201
        return (0.5, 0.5, 0.0)


def test_bug_static_coefficients_of_another_length_fail_the_harness():
    """Bug: ``static_coefficients()`` with one entry more than ``coefficients()`` made the harness crash with
    torch's ``RuntimeError: The expanded size of the tensor (2) must match ...`` (from ``expand_as``) instead of
    raising the ``AssertionError`` naming the law that its docstring promises."""
    with pytest.raises(AssertionError, match=r"static_coefficients\(\) has shape \(3,\), coefficients\(\) \(2, 2\)"):
        assert_operator(_StaticOfAnotherLength())


class _FloatDegree(_Lazy):
    degree = 1.0


class _BoolDegree(_Lazy):
    degree = True


class _FlagsButPolynomial(_Lazy):
    needs_uniform_map = True


@pytest.mark.parametrize("op,match", [
    (_FloatDegree(), r"_FloatDegree.degree must be an int in \[0, 1024\], got 1.0"),
    (_BoolDegree(), r"_BoolDegree.degree must be an int in \[0, 1024\], got True"),
    (_FlagsButPolynomial(), r"declares capability flags \(uses_context\) but is_polynomial=True"),
], ids=["float-degree", "bool-degree", "flags"])
def test_bug_the_harness_fails_an_operator_the_layer_refuses(op, match):
    """Bug: an operator with ``degree = 1.0`` or ``degree = True`` (``(2, 2) == (2, 1.0 + 1)``), or with a capability
    flag while ``is_polynomial = True``, passed the harness, but :class:`DiffusionAttention` refuses each of them."""
    with pytest.raises(ValueError):
        DiffusionAttention(8, 2, heads=[op, op])
    with pytest.raises(AssertionError, match=match):
        assert_operator(op)


class _MatrixHookDisagrees(_Lazy):
    """Coefficients of ``(I + P) / 2`` but ``P v`` on a materialised ``P``."""

    def apply_matrix(self, P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return P @ v


class _CausalHookDisagrees(_Lazy):
    def apply_causal_matrix(self, P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return 1.001 * super().apply_causal_matrix(P, v)


@pytest.mark.parametrize("op,match", [
    (_MatrixHookDisagrees(), r"apply_matrix\(P, v\) causal=False vs float64 reference of coefficients\(\)"),
    (_CausalHookDisagrees(), r"apply_causal_matrix\(P, v\) causal=True vs float64 reference of coefficients\(\)"),
], ids=["apply_matrix", "apply_causal_matrix"])
def test_bug_the_harness_checks_a_polynomials_matrix_hooks(op, match):
    """Bug: a polynomial operator whose ``apply_matrix`` (what ``VisionTransformer.attention_maps(kind="operator")``
    calls for every head) or ``apply_causal_matrix`` disagreed with its ``coefficients()`` passed the harness: only
    the engine's back-ends, which read the coefficients, were compared with the reference."""
    with pytest.raises(AssertionError, match=match):
        assert_operator(op)
    assert_operator(_Lazy())


class _PerHeadResolvent(DiffusionOperator):
    """``(1 - b) (I - b P)^{-1} v`` with a learned ``b`` per head: a right non-polynomial, dense-only operator."""

    is_polynomial = False
    supports_sparse = False
    degree = 0

    def __init__(self, num_heads: int = 2) -> None:
        super().__init__(num_heads)
        self.b = torch.nn.Parameter(torch.full((num_heads, 1, 1), 0.5))

    def coefficients(self) -> torch.Tensor:
        return torch.zeros(1)

    def apply_matrix(self, P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        eye = torch.eye(P.shape[-1], dtype=P.dtype)
        return (1 - self.b) * torch.linalg.solve(eye - self.b * P, v)


def test_bug_the_harness_leaves_the_callers_operator_alone():
    """Bug: the harness cast the caller's operator in place (``op.to(dtype)``, then ``op.double()`` for the reference
    of a non-polynomial) and bound it to its own ``head_dim=4``: after ``assert_operator(op, dtype=torch.float32)``
    a float32 ``heat-exact`` was float64, the rest of the "float32" check ran a float64 operator (a right operator
    with per-head parameters failed with ``linalg.solve: Expected A and B to have the same dtype``), and an unbound
    differential operator could no longer serve a layer of another head width ("built for head_dim=4")."""
    op = build_operator("heat-exact", t=0.7, learnable=True)
    before = {k: v.clone() for k, v in op.state_dict().items()}
    assert_operator(op, dtype=torch.float32)
    assert_operator(op)
    after = op.state_dict()
    assert after.keys() == before.keys()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())

    assert_operator(_PerHeadResolvent(), dtype=torch.float32)
    assert_operator(_PerHeadResolvent())

    diff = build_operator("differential")
    assert_operator(diff)
    assert diff.head_dim is None
    assert DiffusionAttention(32, 4, heads=diff)(torch.randn(1, 3, 32)).shape == (1, 3, 32)


def test_bug_the_harness_refuses_arguments_given_with_an_instance():
    """Bug: ``assert_operator(HeatOperator(), t=5.0)`` dropped ``t=5.0`` silently and tested the instance's
    ``t=1.0``; ``build_operator`` refuses arguments with an instance, and so does the harness now."""
    op = build_operator("heat")
    with pytest.raises(TypeError, match=r"cannot pass operator arguments \['t'\] together with an operator instance"):
        assert_operator(op, t=5.0)
    assert_operator(op)


class _MeanShift(DiffusionOperator):
    """``P v - 0.5 DC v``: a user's context operator (no explicit formula in the library)."""

    is_polynomial = False
    needs_uniform_map = True
    degree = 0

    def coefficients(self) -> torch.Tensor:
        return torch.tensor([0.0])

    def apply_context(self, ctx) -> torch.Tensor:  # noqa: ANN001
        return ctx.propagate(ctx.v) - 0.5 * ctx.uniform(ctx.v)


class _MeanShiftSparseOff(_MeanShift):
    def apply_context(self, ctx) -> torch.Tensor:  # noqa: ANN001
        return super().apply_context(ctx) * (1.001 if ctx.is_sparse else 1.0)


class _MeanShiftLeaks(_MeanShift):
    """The uniform part over every key, under a causal mask too."""

    def apply_context(self, ctx) -> torch.Tensor:  # noqa: ANN001
        return ctx.propagate(ctx.v) - 0.5 * ctx.v.mean(-2, keepdim=True)


def test_bug_the_harness_checks_a_users_context_operator():
    """Bug: every context operator a user writes (capability flags, ``apply_context``, as the tutorial shows) made
    the harness raise ``TypeError: no rival reference for _MeanShift``: the float64 reference knew the library's
    rivals only. Its own dense path on a float64 copy is the reference now, so the other laws apply to it."""
    layer = DiffusionAttention(8, 2, heads=[_MeanShift(), _MeanShift()])
    assert layer(torch.randn(1, 5, 8)).shape == (1, 5, 8)
    assert_operator(_MeanShift())
    assert_operator(_MeanShift(), dtype=torch.float32)
    with pytest.raises(AssertionError, match=r"sparse vs dense \(causal=False\)"):
        assert_operator(_MeanShiftSparseOff())
    with pytest.raises(AssertionError, match="causal output before position 1 saw the future"):
        assert_operator(_MeanShiftLeaks())


class _IsolatedNodesKeepTheirValue(AttnScaleOperator):
    """AttnScale, but on the sparse path a node without in-edges outputs its own value instead of zero."""

    def apply_context(self, ctx) -> torch.Tensor:  # noqa: ANN001
        out = super().apply_context(ctx)
        if ctx.is_sparse:
            has_edges = torch.zeros(ctx.v.shape[2], dtype=torch.bool)
            has_edges[ctx._edge_index[1]] = True
            out = torch.where(has_edges[:, None], out, ctx.v)
        return out


def test_bug_the_harness_graph_has_a_node_without_in_edges():
    """Bug: the harness's random sparse graph is announced as checking "nodes without in-edges: zero row", but with
    every default seed each node kept some in-edge (7 nodes, half the edges), so an operator that filled such nodes
    with anything passed. One node of the random graph has no in-edges now."""
    with pytest.raises(AssertionError, match=r"sparse on a random graph vs float64 reference"):
        assert_operator(_IsolatedNodesKeepTheirValue(omega=0.5))
    assert_operator(AttnScaleOperator(omega=0.5))


@pytest.mark.parametrize("name", sorted(list_operators()))
def test_every_builtin_passes_the_harness_with_its_example_arguments(name):
    assert_operator(name, **type(build_operator(name)).example_kwargs)


class _NotDeterministic(_Lazy):
    def coefficients(self) -> torch.Tensor:
        return torch.tensor([0.5, 0.5]) + 1e-3 * torch.rand(2)


def test_a_non_deterministic_operator_fails_the_harness():
    with pytest.raises(AssertionError, match="vs float64 reference"):
        assert_operator(_NotDeterministic())


@pytest.mark.parametrize("spec,exc,match", [
    ("attention:4,bogus:0", ValueError, "unknown operator 'bogus'"),
    ("attention:4,laplacain:0", ValueError, r"unknown operator 'laplacain' \(did you mean 'laplacian'\?\)"),
    ("attention:4,heat(tt=1):0", TypeError, r"unknown argument 'tt' \(did you mean 't'\?\)"),
    ("heat(t='x'):0,attention:4", TypeError, "t must be a float, got str"),
], ids=["unknown", "misspelt", "misspelt-argument", "bad-value"])
def test_bug_head_spec_items_of_zero_heads_are_checked(spec, exc, match):
    """Bug: an item with count 0 was dropped before its operator was resolved, so ``"attention:4,bogus:0"`` and
    ``"attention:4,heat(tt=1):0"`` were accepted silently (a typo surfaced only once the count was raised). The item
    is built (and dropped) now, without drawing from the random generator: the model's initialisation is that of the
    same spec without the item."""
    with pytest.raises(exc, match=match):
        parse_heads(spec, 4)
    torch.manual_seed(0)
    with_item = DiffusionAttention(32, 4, heads="attention:4,differential(head_dim=8):0,laplacian:0")
    after = torch.rand(1)
    torch.manual_seed(0)
    without = DiffusionAttention(32, 4, heads="attention:4")
    assert torch.equal(torch.rand(1), after)
    assert with_item.heads_spec() == without.heads_spec() == "attention:4"
    assert all(torch.equal(a, b) for a, b in zip(with_item.state_dict().values(), without.state_dict().values()))


def test_bug_register_operator_names_aliases_that_are_not_a_sequence():
    """Bug: ``register_operator(cls, aliases=5)`` failed with Python's bare ``TypeError: 'int' object is not
    iterable``, naming neither the argument nor the class."""

    class _Five(_Lazy):
        name = "test-five-aliases"

    with pytest.raises(TypeError, match=r"aliases of _Five must be a str or a sequence of str, got int \(5\)"):
        register_operator(_Five, aliases=5)
    assert "test-five-aliases" not in list_operators()


def test_registry_names_are_case_and_spelling_insensitive_and_builtins_protected():
    class _Heat(_Lazy):
        name = "HEAT"

    with pytest.raises(ValueError, match="operator name 'heat' is already registered by HeatOperator"):
        register_operator(_Heat)
    with pytest.raises(ValueError, match="already registered by ExactHeatOperator"):
        register_operator(_Lazy, name="Heat_Exact")
    assert build_operator("Heat Exact").name == "heat-exact" and type(build_operator("EXPM")) is ExactHeatOperator
    with pytest.raises(ValueError, match=r"unknown operator 'heta' \(did you mean 'heat'"):
        parse_heads("attention:2,heta(t=0.5):2", 4)
