"""Edge probes and review findings of sitting 49 (each test's docstring says what was wrong)."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.operators.basic import LaplacianOperator


def _float64_heads(layer: DiffusionAttention, x: torch.Tensor, weights: list[tuple[float, ...]]) -> torch.Tensor:
    """The layer's output with head ``h`` computing ``sum_k weights[h][k] P^k v`` from explicit float64 matrices."""
    B, N, E = x.shape
    H = layer.num_heads
    C = E // H
    x = x.double()
    q, k, v = (x @ layer.qkv.weight.double().T + layer.qkv.bias.double()).split(E, dim=-1)
    q, k, v = (t.view(B, N, H, C).transpose(1, 2) for t in (q, k, v))
    P = torch.softmax(q @ k.transpose(-2, -1) / C ** 0.5, dim=-1)
    heads = []
    for h, c in enumerate(weights):
        out, term = torch.zeros_like(v[:, h]), v[:, h]
        for ck in c:
            out = out + ck * term
            term = P[:, h] @ term
        heads.append(out)
    o = torch.stack(heads, 1).transpose(1, 2).reshape(B, N, E)
    return o @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()


@pytest.mark.parametrize("static_too", [False, True])
def test_subclass_overriding_coefficients_alone_is_not_run_with_its_parents_constants(static_too):
    """Bug: a subclass of a fixed operator that redefined ``coefficients()`` alone (``LaplacianOperator`` returning
    ``(1, -2)``) kept its parent's ``static_coefficients()`` ``(1, -1)``: the layer's fused path trusted those, so the
    heads computed ``v - P v`` while ``layer.coefficients()`` and ``return_intermediates`` said ``v - 2 P v``. Such a
    class has no static coefficients now (the layer reads ``coefficients()``); one that defines both keeps its own."""

    class Steeper(LaplacianOperator):
        def coefficients(self):
            return torch.tensor([1.0, -2.0], device=self._c.device, dtype=self._c.dtype)

        if static_too:
            def static_coefficients(self):
                return (1.0, -2.0)

    op = Steeper()
    assert op.static_coefficients() == ((1.0, -2.0) if static_too else None)
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, ["attention", op]).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        got = layer(x)
        want = _float64_heads(layer, x, [(0.0, 1.0), (1.0, -2.0)])
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert LaplacianOperator().static_coefficients() == (1.0, -1.0)  # the parent keeps its fast path
