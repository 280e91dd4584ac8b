"""Edge-case probes of diffusionformer.analysis.spectral (third pass): frequency responses and eigenvalues."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.analysis.spectral import frequency_response


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex128])
@pytest.mark.parametrize("coeffs_shape", [(1,), (2, 1)])
def test_bug_frequency_response_of_degree_zero_is_a_fresh_tensor(dtype: torch.dtype,
                                                                 coeffs_shape: tuple[int, ...]) -> None:
    """Bug: for a degree-0 operator (coeffs ``(1,)`` or ``(G, 1)``) frequency_response returned ``c_0`` expanded
    to ``L`` points, a stride-0 view: any in-place op on the response died with "more than one element of the
    written-to tensor refers to a single memory location", and for float64/complex128 coeffs the view was of the
    caller's coeffs themselves (a write would change them). Every K >= 1 returned a fresh tensor."""
    coeffs = torch.arange(2.0, 2.0 + coeffs_shape[0]).reshape(coeffs_shape).to(dtype)
    before = coeffs.clone()
    lam = torch.tensor([-1.0, 0.0, 0.5, 1.0])
    f = frequency_response(coeffs, lam)
    G = coeffs_shape[0] if len(coeffs_shape) == 2 else None
    expect = before.to(f.dtype).reshape(-1, 1).expand(-1, 4)
    expect = expect[0] if G is None else expect
    torch.testing.assert_close(f, expect, rtol=0, atol=0)
    assert f.is_contiguous() and 0 not in f.stride()
    assert f.untyped_storage().data_ptr() != coeffs.untyped_storage().data_ptr()
    f.add_(1.0)  # in place: was a RuntimeError on the stride-0 view
    f[..., 0] = 7.0
    torch.testing.assert_close(coeffs, before, rtol=0, atol=0)  # the caller's coefficients untouched
    torch.testing.assert_close(f[..., 1:], expect[..., 1:] + 1.0, rtol=0, atol=0)


@pytest.mark.parametrize("which", ["coeffs", "lambdas"])
def test_bug_frequency_response_refuses_sparse_inputs_by_name(which: str) -> None:
    """Bug: a sparse ``coeffs`` or ``lambdas`` died with a bare NotImplementedError from inside torch
    ("Could not run 'aten::ne.Scalar' with arguments from the 'SparseCPU' backend") instead of the clear
    TypeError naming the argument that every other spectral function (eigenvalues_of, effective_rank, ...) gives."""
    args = {"coeffs": torch.tensor([1.0, 2.0]), "lambdas": torch.tensor([0.5, -0.5])}
    args[which] = args[which].to_sparse()
    with pytest.raises(TypeError, match=rf"{which} must be a dense \(strided\) tensor.*{which}\.to_dense\(\)"):
        frequency_response(args["coeffs"], args["lambdas"])
    dense = frequency_response(args["coeffs"].to_dense(), args["lambdas"].to_dense())
    torch.testing.assert_close(dense, torch.tensor([2.0, 0.0], dtype=torch.float64))
