"""Edge probes of the rival anti-oversmoothing operators (differential, NeuTRENO, AttnScale) and edge features.

References are the papers' equations as explicit float64 matrices (softmax of masked scores, the uniform
map as the normalised admissible-key matrix), and PyG's ``TransformerConv`` for the edge-feature scores.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.nn import DiffusionAttention, edge_feature_attention
from diffusionformer.operators.differential import DifferentialOperator
from diffusionformer.ops.rivals import LayerState

f64 = torch.float64


def _heads(layer: DiffusionAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, N, D = x.shape
    H, C = layer.num_heads, D // layer.num_heads
    return tuple(t.view(B, N, H, C).transpose(1, 2) for t in layer.qkv(x).split(D, -1))  # type: ignore[return-value]


def _softmax(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1), nan=0.0)


def _differential_ref(layer: DiffusionAttention, x: torch.Tensor, allowed: torch.Tensor, depth: int = 0) -> torch.Tensor:
    """(1 - l_init) RMSNorm((P1 - lambda P2) v), lambda = e^{q1.k1} - e^{q2.k2} + l_init, in explicit float64."""
    q, k, v = _heads(layer, x)
    op = layer.operators[0]
    h = q.shape[-1] // 2
    P1 = _softmax(q[..., :h] @ k[..., :h].transpose(-1, -2) / math.sqrt(h), allowed)
    P2 = _softmax(q[..., h:] @ k[..., h:].transpose(-1, -2) / math.sqrt(h), allowed)
    li = 0.8 - 0.6 * math.exp(-0.3 * depth)
    lam = torch.exp((op.lambda_q1.double() * op.lambda_k1.double()).sum()) \
        - torch.exp((op.lambda_q2.double() * op.lambda_k2.double()).sum()) + li
    y = P1 @ v - lam * (P2 @ v)
    y = y / torch.sqrt((y**2).mean(-1, keepdim=True) + 1e-5) * op.subln.weight.double() * (1 - li)
    B, _, N, _ = y.shape
    return layer.out_proj(y.transpose(1, 2).reshape(B, N, -1))


def _attnscale_ref(layer: DiffusionAttention, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """DC v + (1 + omega_h)(P - DC) v with DC the row-normalised admissible keys."""
    q, k, v = _heads(layer, x)
    P = _softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), allowed)
    A = allowed.expand_as(P).to(f64)
    DC = A / A.sum(-1, keepdim=True).clamp_min(1.0)
    w = layer.operators[0].omega.to(f64).view(1, -1, 1, 1)
    y = DC @ v + (1 + w) * ((P - DC) @ v)
    B, _, N, _ = y.shape
    return layer.out_proj(y.transpose(1, 2).reshape(B, N, -1))


def test_bug_bind_made_parameters_follow_the_layer_dtype_and_device():
    """Bug: an unbound DifferentialOperator put into a float64 layer (layer.operators[i] = op) got float32 parameters.

    ``bind`` creates differential attention's parameters when the layer first sees the operator; for an operator
    swapped into an already cast layer that happened after the cast, so a float64 layer held float32
    ``lambda_*`` / gain (a CUDA layer: CPU ones), and ``op.double()`` before the assignment cannot help (an
    unbound operator has no parameters). The float64 output then carried a float32 lambda.
    """
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2).double()
    layer.operators[0] = DifferentialOperator()
    x = torch.randn(2, 4, 8, dtype=f64)
    y = layer(x)
    dtypes = {n: p.dtype for n, p in layer.operators.named_parameters()}
    assert set(dtypes.values()) == {f64}, dtypes
    with torch.no_grad():  # lambda far from its init, where a float32 exp differs in the 8th digit
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(layer.operators[0], name).copy_(torch.linspace(-0.7, 0.9, 2, dtype=f64))
    y = layer(x)
    ref = _differential_ref(layer, x, torch.ones(1, 1, 4, 4, dtype=torch.bool))
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_pins_differential_and_attnscale_masks_vs_float64_reference(causal):
    """Causal, key padding with a fully padded sequence, and a per-head bool mask with fully masked rows."""
    torch.manual_seed(1)
    B, N, D, H = 2, 5, 16, 2
    x = torch.randn(B, N, D, dtype=f64)
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[0, 3:] = True
    kpm[1] = True
    am = torch.rand(B, H, N, N) > 0.4
    am[0, 0, 2] = False
    tril = torch.ones(N, N, dtype=torch.bool).tril() if causal else torch.ones(N, N, dtype=torch.bool)
    for spec, ref in (("differential", _differential_ref), ("attnscale", _attnscale_ref)):
        layer = DiffusionAttention(D, H, heads=spec, causal=causal).double()
        with torch.no_grad():
            for p in layer.operators.parameters():
                p.add_(torch.randn_like(p) * 0.3)
        torch.testing.assert_close(layer(x, key_padding_mask=kpm), ref(layer, x, ~kpm[:, None, None, :] & tril),
                                   rtol=0, atol=1e-12)
        torch.testing.assert_close(layer(x, attn_mask=am), ref(layer, x, am & tril), rtol=0, atol=1e-12)


def test_pins_rivals_sparse_equals_dense_on_the_same_graph():
    """The edge-softmax path and the dense path give the same output on one graph, NeuTRENO through a LayerState."""
    torch.manual_seed(2)
    N, D, H = 6, 16, 2
    x = torch.randn(N, D, dtype=f64)
    adj = torch.rand(N, N) > 0.5
    adj.fill_diagonal_(True)
    dst, src = adj.nonzero().T
    ei = torch.stack([src, dst])
    for causal in (False, True):
        first = DiffusionAttention(D, H, causal=causal).double()
        for spec in ("differential", "attnscale(omega=0.4)", "neutreno(lam=0.3)"):
            layer = DiffusionAttention(D, H, heads=spec, causal=causal).double()
            st = LayerState()
            ys = layer(first(x, edge_index=ei, state=st), edge_index=ei, state=st)
            st = LayerState()
            yd = layer(first(x[None], attn_mask=adj, state=st), attn_mask=adj, state=st)[0]
            torch.testing.assert_close(ys, yd, rtol=0, atol=1e-12)


def test_pins_edge_feature_scores_match_pyg_transformer_conv():
    """P equals TransformerConv's alpha with edge_dim; the output is its message without the edge term."""
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    N, D, H, Fe = 6, 8, 2, 3
    conv = pyg.TransformerConv(D, D // H, heads=H, edge_dim=Fe, root_weight=False).double()
    plain = pyg.TransformerConv(D, D // H, heads=H, root_weight=False).double()
    plain.load_state_dict({k: v for k, v in conv.state_dict().items() if "edge" not in k})
    layer = DiffusionAttention.from_transformer_conv(plain).double()
    x = torch.randn(N, D, dtype=f64)
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2], [1, 2, 3, 4, 5, 0, 3, 3, 1]])
    e = torch.randn(ei.shape[1], Fe, dtype=f64)
    out, (_, alpha) = conv(x, ei, e, return_attention_weights=True)
    ek = conv.lin_edge(e)
    y, P = edge_feature_attention(layer, x, ei, ek, return_weights=True)
    torch.testing.assert_close(P, alpha, rtol=0, atol=1e-12)
    edge_msg = torch.zeros(N, H, D // H, dtype=f64).index_add_(0, ei[1], alpha[..., None] * ek.view(-1, H, D // H))
    torch.testing.assert_close(y, out - edge_msg.reshape(N, D), rtol=0, atol=1e-12)
