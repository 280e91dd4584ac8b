"""Edge probes of the rival operators (differential, AttnScale, NeuTRENO, value residual, GRAND-nl), fifth round.

The independent references below are transcribed from the papers' equations (float64, explicit matrices):

* differential attention: Ye et al., "Differential Transformer" (2024) and the authors'
  ``Diff-Transformer/multihead_diffattn.py`` (microsoft/unilm, MIT licence):
  ``lambda_init = 0.8 - 0.6 exp(-0.3 depth)`` (0-based layer index), ``lambda = exp(lq1.lk1) - exp(lq2.lk2)
  + lambda_init``, ``attn = softmax1 - lambda softmax2``, per-head RMSNorm (eps 1e-5, learned gain), output
  ``* (1 - lambda_init)``;
* NeuTRENO: Nguyen et al. (NeurIPS 2023), ``P v + lambda (v0 - v)`` with ``v0`` the first layer's values;
* value residual (ResFormer): Zhou et al. (2024), ``P (v + lambda v1)``;
* AttnScale: Wang et al. (ICLR 2022), ``(DC + (1 + omega)(P - DC)) v`` with ``DC`` uniform over each row's
  admissible keys.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.ops.rivals import LayerState

f64 = torch.float64
D, H, N, B = 16, 2, 5, 2
C = D // H


def _softmax(s: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(torch.softmax(s.masked_fill(~allowed, float("-inf")), -1))


def _reference_layer(layer, name, x, allowed, depth, v0, kw):  # noqa: ANN001, ANN202
    """One layer's output from its own projections, the rival's equation written out in float64."""
    q, k, v = (t.transpose(1, 2).double() for t in layer._project(x))
    op = layer.operators[0]
    if name == "differential":
        h = C // 2
        P1 = _softmax(q[..., :h] @ k[..., :h].transpose(-1, -2) / math.sqrt(h), allowed)
        P2 = _softmax(q[..., h:] @ k[..., h:].transpose(-1, -2) / math.sqrt(h), allowed)
        li = 0.8 - 0.6 * math.exp(-0.3 * depth)
        lam = (math.exp(float(op.lambda_q1.detach().double() @ op.lambda_k1.detach().double()))
               - math.exp(float(op.lambda_q2.detach().double() @ op.lambda_k2.detach().double())) + li)
        y = (P1 - lam * P2) @ v
        o = (1 - li) * op.subln.weight.double() * y / torch.sqrt((y * y).mean(-1, keepdim=True) + 1e-5)
    else:
        P = _softmax(q @ k.transpose(-1, -2) / math.sqrt(C), allowed)
        if name == "neutreno":
            o = P @ v + (0 if v0 is None else kw["lam"] * (v0 - v))
        elif name == "value-residual":
            o = P @ (v if v0 is None else v + kw["lam"] * v0)
        else:  # attnscale
            A = allowed.double().expand(P.shape)
            cnt = A.sum(-1, keepdim=True)
            DC = torch.where(cnt > 0, A / cnt.clamp_min(1), torch.zeros_like(A))
            o = (DC + (1 + op.omega.double().view(1, -1, 1, 1)) * (P - DC)) @ v
    return layer.out_proj(o.transpose(1, 2).reshape(x.shape[0], -1, D).to(x.dtype)), v


SPECS = [("differential", {}), ("neutreno", {"lam": 0.6}), ("value-residual", {"lam": 0.7}),
         ("attnscale", {"omega": 0.3})]


def _stack(name, kw, causal=False):  # noqa: ANN001, ANN202
    args = ", ".join(f"{a}={b}" for a, b in kw.items())
    spec = f"{name}({args}):{H}" if args else f"{name}:{H}"
    layers = [DiffusionAttention(D, H, heads=spec, causal=causal).double() for _ in range(3)]
    for layer in layers:  # move the learned scalars off their initial values
        for pname, p in layer.named_parameters():
            if "lambda" in pname or "omega" in pname or "subln" in pname:
                with torch.no_grad():
                    p.add_(0.3 * torch.randn_like(p))
    return layers


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("name,kw", SPECS)
def test_three_layer_stack_matches_the_papers_dense(name, kw, causal, pad):
    """A 3-layer stack sharing one LayerState: depth 0, 1, 2 for lambda_init, v0 from layer 0 only."""
    torch.manual_seed(0)
    layers = _stack(name, kw, causal)
    x = torch.randn(B, N, D, dtype=f64)
    allowed = torch.ones(B, 1, N, N, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    kpm = None
    if pad:
        kpm = torch.zeros(B, N, dtype=torch.bool)
        kpm[1, :2] = True  # causal rows 0, 1 of sequence 1 see no key
        allowed = allowed & ~kpm[:, None, None, :]
    state, h, hr, v0 = LayerState(), x, x, None
    for depth, layer in enumerate(layers):
        y = layer(h, key_padding_mask=kpm, state=state)
        yr, v = _reference_layer(layer, name, hr, allowed, depth, v0, kw)
        v0 = v if v0 is None else v0
        h, hr = h + y, hr + yr
    assert state.depth == 3
    torch.testing.assert_close(h, hr, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,kw", SPECS)
def test_three_layer_stack_matches_the_papers_sparse(name, kw):
    torch.manual_seed(1)
    layers = _stack(name, kw)
    pairs = [(j, i) for i in range(N) for j in range(N) if (i + j) % 3 != 1]
    edge_index = torch.tensor(pairs).T
    allowed = torch.zeros(1, 1, N, N, dtype=torch.bool)
    allowed[0, 0, edge_index[1], edge_index[0]] = True
    x = torch.randn(N, D, dtype=f64)
    state, h, hr, v0 = LayerState(), x, x[None], None
    for depth, layer in enumerate(layers):
        y = layer(h, edge_index=edge_index, state=state)
        yr, v = _reference_layer(layer, name, hr, allowed, depth, v0, kw)
        v0 = v if v0 is None else v0
        h, hr = h + y, hr + yr
    torch.testing.assert_close(h, hr[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("spec", ["value-residual:2", "value-residual(lam=0.5):1,neutreno:1"])
def test_bug_value_residual_first_values_in_another_dtype(spec):
    """Bug: value-residual crashed with "x must have the dtype of q and k" (naming neither v0 nor the state)
    when the LayerState's first values had another dtype than the layer (a float64 first layer, a float32 one
    after it; NeuTRENO in the same situation worked). The first layer's values now follow the layer's dtype."""
    torch.manual_seed(2)
    first = DiffusionAttention(8, 2, heads=spec).double()
    later = DiffusionAttention(8, 2, heads=spec)
    x = torch.randn(1, 4, 8)
    state = LayerState()
    first(x.double(), state=state)
    y = later(x, state=state)
    assert y.dtype == torch.float32
    # the same as with the first values given in float32
    state32 = LayerState(first_values=state.first_values.float(), depth=1)
    torch.testing.assert_close(y, later(x, state=state32))
