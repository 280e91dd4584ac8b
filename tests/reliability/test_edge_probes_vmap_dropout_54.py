"""Attention dropout under ``torch.vmap(..., randomness="different")`` on an unbatched input (sitting 54).

Monte Carlo samples of one input (``vmap(lambda _: layer(x), randomness="different")(torch.arange(n))``) failed in
torch's fused kernel, which drops in place: "Cannot ask for different inplace randomness on an unbatched tensor".
Inside an eager vmap the dropout of the fused paths now forms ``P`` explicitly and drops out of place
(``diffusionformer.ops.dense._fused``); the samples' mean converges to the layer in eval mode (dropout is unbiased
and the layer is linear in the dropped ``P``), fully padded rows stay zero, and outside vmap the fused kernel runs.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

from diffusionformer.nn import DiffusionAttention

HEADS = ["attention:2", "laplacian:1,attention:1", "heat(t=0.5, steps=3):1,attention:1", "ppr(steps=2):2"]


def _samples(layer: DiffusionAttention, x: torch.Tensor, n: int, **kwargs) -> torch.Tensor:
    return vmap(lambda _: layer(x, **kwargs), randomness="different")(torch.arange(n))


@pytest.mark.parametrize("backend", ["auto", "sdpa"])
@pytest.mark.parametrize("heads", HEADS)
def test_bug_dropout_samples_of_one_input_under_vmap(heads, backend):
    """Bug: under ``vmap(..., randomness="different")`` of an unbatched input, attention dropout on the fused
    (``auto``/``sdpa``) paths raised "Cannot ask for different inplace randomness on an unbatched tensor" (only
    ``backend="matrix"`` ran). Now every sample draws its own mask, and their mean is the eval-mode output within
    five standard errors (per entry, from the samples' own spread)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads, dropout=0.3, backend=backend).double()
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    with torch.no_grad():
        want = layer.eval()(x)
        layer.train()
        torch.manual_seed(1)
        out = _samples(layer, x, 4000)
    assert out.shape == (4000, 1, 4, 8) and torch.isfinite(out).all()
    assert (out[0] - out[1]).abs().max() > 1e-3  # one mask per sample
    mean, se = out.mean(0), out.std(0) / 4000 ** 0.5
    assert ((mean - want).abs() <= 5 * se + 1e-12).all(), ((mean - want).abs() / se).max()
    with torch.no_grad():
        same = vmap(lambda _: layer(x), randomness="same")(torch.arange(3))
    assert torch.equal(same[0], same[1]) and torch.equal(same[1], same[2])


@pytest.mark.parametrize("heads", ["attention:2", "heat(t=0.5, steps=3):1,attention:1"])
def test_vmap_dropout_keeps_fully_padded_rows_zero_and_gradients_finite(heads):
    """A key padding mask that hides every key of one sequence: its rows of ``P`` are zero on the explicit path as
    on the fused one, so no mask reaches that sequence (its samples equal the eval-mode output: the bias for
    attention heads, the identity part of the polynomial for the heat head), and gradients stay finite."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads, dropout=0.5).double().train()
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    pad = torch.zeros(2, 4, dtype=torch.bool)
    pad[1] = True
    with torch.no_grad():
        want = layer.eval()(x, key_padding_mask=pad)[1]
    layer.train()
    out = _samples(layer, x, 8, key_padding_mask=pad)
    torch.testing.assert_close(out[:, 1], want.expand(8, 4, 8), rtol=0, atol=1e-14)
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad[0].abs().sum() > 0


def test_fused_kernel_runs_outside_vmap():
    """Outside vmap the dropout stays torch's fused kernel's: under one seed the layer's attention heads equal
    ``F.scaled_dot_product_attention`` with the same dropout, draw for draw."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, "attention:2", dropout=0.4).train()
    x = torch.randn(3, 5, 8)
    torch.manual_seed(7)
    got = layer(x)
    q, k, v = (t.transpose(1, 2) for t in layer._project(x, None))
    torch.manual_seed(7)
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4, scale=layer._scale)
    torch.testing.assert_close(got, layer.out_proj(y.transpose(1, 2).reshape(3, 5, 8)), rtol=0, atol=0)
