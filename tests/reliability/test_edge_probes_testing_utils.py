"""Edge probes of diffusionformer.testing: the harness's seeds and its sparse checks of matrix operators."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators import DiffusionOperator
from diffusionformer.testing import assert_operator, complete_edge_index, reference_qkv


class _MatrixOnly(DiffusionOperator):
    """A function of a materialised P as the operator docs describe it: ``is_polynomial = False`` and
    ``apply_matrix`` only (no ``coefficients``)."""

    is_polynomial = False

    def apply_matrix(self, P, v):
        return P @ (P @ v)


class _MatrixOnlyDenseOnly(_MatrixOnly):
    """The same, declared dense-only as the docs ask."""

    supports_sparse = False


def test_bug_assert_operator_seed_near_2_64_overflows():
    """Bug: assert_operator(seed=2**64 - 1), a seed random_qkv accepts, crashed with manual_seed's unhelpful
    "Overflow when unpacking long long" (its laws draw with seed + 1, + 2, + 3)."""
    assert_operator("laplacian", seed=2**64 - 1, num_nodes=4, batch=1)
    # the offsets wrap as manual_seed reads seeds (modulo 2**64): a negative seed still draws what it drew
    ref = torch.randn(3, generator=torch.Generator().manual_seed(-4))
    assert torch.equal(ref, torch.randn(3, generator=torch.Generator().manual_seed(2**64 - 4)))
    assert_operator("laplacian", seed=-1, num_nodes=4, batch=1)
    with pytest.raises(ValueError, match="seed"):
        assert_operator("laplacian", seed=2**64)


def test_bug_harness_crashes_on_matrix_operator_without_coefficients():
    """Bug: a non-polynomial, non-context operator with apply_matrix only (coefficients() optional for it) that left
    supports_sparse at its default True crashed assert_operator with NotImplementedError from the sparse back-end
    instead of an AssertionError naming the wrong declaration (the layer refuses it on edges)."""
    x, edges = torch.randn(3, 8, dtype=torch.float64), complete_edge_index(3)
    layer = DiffusionAttention(8, 2, heads=_MatrixOnly(num_heads=2)).double()
    assert layer(x[None]).shape == (1, 3, 8)  # dense: runs
    with pytest.raises(ValueError, match="sparse"):
        layer(x, edge_index=edges)  # the reference: the layer refuses it on edges
    with pytest.raises(AssertionError, match="declares supports_sparse=True.*set supports_sparse = False"):
        assert_operator(_MatrixOnly(num_heads=2), num_nodes=4, batch=1)
    assert_operator(_MatrixOnlyDenseOnly(num_heads=2), num_nodes=4, batch=1)  # declared right: passes


def test_pins_harness_still_fails_a_wrong_matrix_operator():
    """The harness still fails a matrix operator whose causal hook reads the future (its causal output against
    apply_matrix on the lower-triangular P)."""

    class _Future(_MatrixOnly):
        def apply_causal_matrix(self, P, v):
            return P @ v + v.flip(-2)

    with pytest.raises(AssertionError, match="causal=True"):
        assert_operator(_Future(num_heads=2), num_nodes=4, batch=1)


def test_bug_reference_qkv_unbatched_input_unhelpful_error():
    """Bug: reference_qkv on an unbatched (N, D) input (one the layer accepts on edges) failed with "not enough
    values to unpack (expected 3, got 2)", naming neither the argument nor the expected shape."""
    layer = DiffusionAttention(8, 2)
    with pytest.raises(ValueError, match=r"x must be a \(B, N, D\) tensor, got \(3, 8\)"):
        reference_qkv(layer, torch.randn(3, 8))
    assert [tuple(t.shape) for t in reference_qkv(layer, torch.randn(1, 3, 8))] == [(1, 3, 2, 4)] * 3
