"""Second round of edge probes of :func:`~diffusionformer.testing.assert_operator`: can the harness fail?

Deliberately wrong user operators, written as ``docs/tutorials/custom_operator.rst`` shows, must fail the harness
with an ``AssertionError`` naming the law (the first round is ``test_edge_probes_testing_harness.py``).
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.operators import DiffusionOperator
from diffusionformer.testing import assert_operator


class _Lazy(DiffusionOperator):
    """``(I + P) / 2`` with fixed coefficients, right in every respect."""

    degree = 1

    def coefficients(self) -> torch.Tensor:
        return torch.tensor([0.5, 0.5])

    def static_coefficients(self) -> tuple[float, ...]:
        return (0.5, 0.5)


class _NestedStatic(_Lazy):
    """``static_coefficients()`` as one row of a ``(1, K+1)`` table instead of a flat tuple."""

    def static_coefficients(self):  # noqa: ANN201
        return ((0.5, 0.5),)


class _StringStatic(_Lazy):
    def static_coefficients(self):  # noqa: ANN201
        return ("0.5", "0.5")


def test_bug_the_harness_fails_nested_static_coefficients():
    """Bug: ``static_coefficients()`` returning a nested ``((c0, c1),)`` (or ``(G, K+1)``) tuple passed the harness,
    which accepted shapes ``(1, K+1)`` and ``(G, K+1)``, but the layer reads one flat tuple of floats and raised
    ``TypeError: float() argument must be a string or a real number, not 'tuple'``. A static_coefficients() that
    is not a tuple of numbers made the harness crash with torch's ``ValueError: too many dimensions 'str'``."""
    with pytest.raises(TypeError, match=r"_NestedStatic: static_coefficients\(\) must return a flat tuple"):
        DiffusionAttention(8, 2, heads=[_NestedStatic(), _NestedStatic()])
    with pytest.raises(AssertionError, match=r"static_coefficients\(\) has shape \(1, 2\), coefficients\(\) \(2, 2\); "
                                             r"expected a flat tuple of degree \+ 1 = 2 floats"):
        assert_operator(_NestedStatic())
    with pytest.raises(AssertionError, match=r"_StringStatic: static_coefficients\(\) must be a tuple of floats, got "
                                             r"\('0.5', '0.5'\)"):
        assert_operator(_StringStatic())
    assert_operator(_Lazy())
    assert DiffusionAttention(8, 2, heads=[_Lazy(), _Lazy()])(torch.randn(1, 3, 8)).shape == (1, 3, 8)


class _Resolvent(DiffusionOperator):
    """``(1 - b) (I - b P)^{-1} v``, a right non-polynomial, dense-only operator (the tutorial's pattern)."""

    is_polynomial = False
    supports_sparse = False
    degree = 0

    def __init__(self, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.b = torch.nn.Parameter(torch.full((1,), 0.5))

    def coefficients(self) -> torch.Tensor:
        return torch.zeros(1)

    def apply_matrix(self, P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        eye = torch.eye(P.shape[-1], dtype=P.dtype)
        return (1 - self.b) * torch.linalg.solve(eye - self.b * P, v)


class _Float64Output(_Resolvent):
    """Computes in float64 and returns float64 whatever the input dtype."""

    def apply_matrix(self, P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return super().apply_matrix(P.double(), v.double())


def test_bug_the_harness_fails_an_operator_that_changes_the_dtype():
    """Bug: an operator returning float64 for float32 inputs passed ``assert_operator(..., dtype=torch.float32)``:
    every output was cast to float64 before comparing, so the dtype was never looked at; yet every float32 layer
    using it fails (now naming the operator; it was torch's ``index_add_(): ... must have the same scalar type``)."""
    with pytest.raises(ValueError, match=r"_Float64Output\.apply_matrix\(P, v\) must return .* in the dtype of v"):
        DiffusionAttention(8, 2, heads=[_Float64Output(), _Float64Output()])(torch.randn(1, 5, 8))
    with pytest.raises(AssertionError, match=r"_Float64Output: dense backend='matrix' causal=False vs float64 "
                                             r"reference: output dtype is torch.float64, expected the input dtype "
                                             r"torch.float32"):
        assert_operator(_Float64Output(), dtype=torch.float32)
    assert_operator(_Float64Output())  # in float64 it is right
    assert_operator(_Resolvent(), dtype=torch.float32)


class _MixesTheBatch(_Resolvent):
    """Adds a tenth of the batch mean of ``v``: each sample's output depends on the other samples."""

    def apply_matrix(self, P: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return super().apply_matrix(P, v) + 0.1 * v.mean(0, keepdim=True)


class _ContextMixesTheBatch(DiffusionOperator):
    """A user's context operator, ``P v`` plus a tenth of the batch mean of ``v``."""

    is_polynomial = False
    needs_uniform_map = True
    degree = 0

    def coefficients(self) -> torch.Tensor:
        return torch.zeros(1)

    def apply_context(self, ctx) -> torch.Tensor:  # noqa: ANN001
        return ctx.propagate(ctx.v) + 0.1 * ctx.v.mean(0, keepdim=True)


@pytest.mark.parametrize("op", [_MixesTheBatch(), _ContextMixesTheBatch()], ids=["apply_matrix", "apply_context"])
def test_bug_the_harness_fails_an_operator_that_mixes_the_batch(op):
    """Bug: a non-polynomial or context operator whose output for one sample depended on the other samples of the
    batch passed every law: its reference is its own ``apply_matrix`` (or dense path) on the same whole batch, and
    the sparse back-end is compared with the dense one on batch element 0 alone. A layer using it gives a sample
    different outputs in different batches."""
    layer = DiffusionAttention(8, 2, heads=[op, op])
    x = torch.randn(2, 5, 8)
    assert not torch.allclose(layer(x)[:1], layer(x[:1]), atol=1e-4)
    with pytest.raises(AssertionError, match="output of batch element 0 depends on the other batch elements"):
        assert_operator(op)
    with pytest.raises(AssertionError, match="output of batch element 0 depends on the other batch elements"):
        assert_operator(op, dtype=torch.float32)
    assert_operator(_Resolvent())


class _WrongDegree(_Lazy):
    degree = 2


class _NaNParameter(_Resolvent):
    def __init__(self) -> None:
        super().__init__()
        with torch.no_grad():
            self.b.fill_(float("nan"))


class _InfCoefficient(_Lazy):
    def coefficients(self) -> torch.Tensor:
        return torch.tensor([float("inf"), 0.5])

    def static_coefficients(self):  # noqa: ANN201
        return None


class _ForgotSupportsSparse(_Resolvent):
    """Non-polynomial but leaves ``supports_sparse = True``: the sparse back-end reads its (zero) coefficients."""

    supports_sparse = True


@pytest.mark.parametrize("op,match", [
    (_WrongDegree(), r"coefficients have shape \(2, 2\), expected \(2, 3\)"),
    (_NaNParameter(), r"dense backend='matrix' causal=False vs float64 reference: max abs difference nan"),
    (_InfCoefficient(), "coefficients are not finite"),
    (_ForgotSupportsSparse(), r"sparse vs dense \(causal=False\)"),
], ids=["degree", "nan-parameter", "inf-coefficient", "supports-sparse"])
def test_the_harness_fails_other_wrong_operators(op, match):
    with pytest.raises(AssertionError, match=match):
        assert_operator(op)


def test_bug_layer_refuses_a_matrix_function_on_edges_whatever_supports_sparse_says():
    """Bug: a function of a materialised ``P`` (neither polynomial nor context) that left ``supports_sparse = True``
    ran on a sparse graph with its heads silently zero (the engine's 0 for a non-polynomial head); the layer now
    refuses it on edges as it refuses a dense-only operator, and the dense path is unchanged."""
    layer = DiffusionAttention(8, 2, heads=[_ForgotSupportsSparse(), _Lazy()])
    ei = torch.tensor([[0, 1, 2, 1], [1, 2, 0, 0]])
    with pytest.raises(ValueError, match="does not support the sparse back-end"):
        layer(torch.randn(3, 8), edge_index=ei)
    assert torch.isfinite(layer(torch.randn(1, 3, 8))).all()
