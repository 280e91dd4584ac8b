"""Sitting 58: one row of coefficients ``(1, K+1)`` through the Triton kernels (under TRITON_INTERPRET=1 on CPU, see
this folder's conftest.py), as the dense back ends take it: shared by every head, its gradient the sum over heads."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from diffusionformer.ops.triton import polynomial_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@requires_triton
@pytest.mark.usefixtures("triton_kernels")
def test_one_row_of_coefficients_equals_that_row_for_every_head():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 8, generator=g).to(DEVICE) for _ in range(3))
    row = torch.tensor([[0.3, 0.5, -0.2]], device=DEVICE, requires_grad=True)
    rows = row.detach().expand(3, -1).clone().requires_grad_(True)
    out = polynomial_attention(q, k, v, row)
    ref = polynomial_attention(q, k, v, rows)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    w = torch.randn(out.shape, generator=g).to(DEVICE)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    assert row.grad.shape == (1, 3)
    torch.testing.assert_close(row.grad, rows.grad.sum(0, keepdim=True), atol=1e-4, rtol=1e-4)
