"""DiffusionAttention: equality with nn.MultiheadAttention and TransformerConv, head layout, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.nn import TransformerConv

from diffusionformer import DiffusionAttention, list_operators
from diffusionformer.operators import operator_class
from diffusionformer.ops.reference import dense_attention_reference, polynomial_reference
from diffusionformer.testing import complete_edge_index, causal_edge_index


def _mha(D=16, H=4, seed=0):
    torch.manual_seed(seed)
    mha = nn.MultiheadAttention(D, H, batch_first=True).double()
    with torch.no_grad():
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    return mha.eval()


def test_equals_multihead_attention():
    mha = _mha()
    attn = DiffusionAttention.from_multihead_attention(mha).eval()
    x = torch.randn(3, 9, 16, dtype=torch.float64)
    ref = mha(x, x, x, need_weights=False)[0]
    assert torch.allclose(attn(x), ref, atol=1e-12)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[0, 5:] = True
    pad[2, 1:] = True
    ref = mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]
    assert torch.allclose(attn(x, key_padding_mask=pad), ref, atol=1e-12)
    causal = nn.Transformer.generate_square_subsequent_mask(9, dtype=torch.float64)
    ref = mha(x, x, x, attn_mask=causal, need_weights=False)[0]
    causal_attn = DiffusionAttention.from_multihead_attention(mha, causal=True).eval()
    assert torch.allclose(causal_attn(x), ref, atol=1e-12)


def test_attention_weights_match_multihead_attention():
    mha = _mha(seed=1)
    attn = DiffusionAttention.from_multihead_attention(mha).eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    _, w = mha(x, x, x, need_weights=True, average_attn_weights=False)
    y, inter = attn(x, return_intermediates=True)
    assert torch.allclose(inter.attn_weights, w, atol=1e-12)
    assert inter.coefficients.shape == (4, 2) and inter.backend == "matrix"


def test_laplacian_heads_are_v_minus_attention_per_head():
    mha = _mha(seed=2)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    mixed = DiffusionAttention.from_multihead_attention(mha, heads="attention:2,laplacian:2").eval()
    H, C = 4, 4
    qkv = x @ mha.in_proj_weight.T + mha.in_proj_bias
    q, k, v = (t.view(2, 6, H, C).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
    P = dense_attention_reference(q, k)
    heads = P @ v
    heads[:, 2:] = v[:, 2:] - heads[:, 2:]
    ref = heads.transpose(1, 2).reshape(2, 6, 16) @ mha.out_proj.weight.T + mha.out_proj.bias
    assert torch.allclose(mixed(x), ref, atol=1e-12)
    # the general (non-fused) path agrees with the fused one
    general = DiffusionAttention.from_multihead_attention(mha, heads="attention:2,laplacian:2", backend="matrix").eval()
    assert torch.allclose(general(x), ref, atol=1e-12)
    assert mixed.head_operator_names == ["attention", "attention", "laplacian", "laplacian"]


def test_equals_transformer_conv():
    torch.manual_seed(3)
    conv = TransformerConv(16, 4, heads=4, root_weight=False).double().eval()
    attn = DiffusionAttention.from_transformer_conv(conv).eval()
    x = torch.randn(12, 16, dtype=torch.float64)
    edges = torch.randint(0, 12, (2, 40))
    assert torch.allclose(attn(x, edge_index=edges), conv(x, edges), atol=1e-12)
    y, inter = attn(x, edge_index=edges, return_intermediates=True)
    _, (ei, alpha) = conv(x, edges, return_attention_weights=True)
    assert torch.equal(ei, inter.edge_index) and torch.allclose(alpha, inter.attn_weights, atol=1e-12)


@pytest.mark.parametrize("name", list_operators())
def test_layer_dense_equals_sparse_for_every_operator(name):
    torch.manual_seed(4)
    kwargs = {}
    if not operator_class(name).supports_sparse:  # dense-only operators (heat-exact, ppr-exact) refuse clearly
        layer = DiffusionAttention(12, 3, heads=name).double().eval()
        x = torch.randn(1, 5, 12, dtype=torch.float64)
        with pytest.raises(ValueError, match="does not support the sparse back-end"):
            layer(x[0], edge_index=complete_edge_index(5))
        return
    for causal, edges in ((False, complete_edge_index(5)), (True, complete_edge_index(5))):
        layer = DiffusionAttention(12, 3, heads=f"{name}:2,attention:1", causal=causal, **kwargs).double().eval()
        x = torch.randn(1, 5, 12, dtype=torch.float64)
        dense = layer(x)[0]
        sparse = layer(x[0], edge_index=edges)  # causal=True filters the edges to j <= i
        assert torch.allclose(dense, sparse, atol=1e-12)
        if causal:
            assert torch.allclose(layer(x[0], edge_index=causal_edge_index(5)), dense, atol=1e-12)


@pytest.mark.parametrize("heads", ["heat(t=0.7, steps=3):2,laplacian:1,attention:1", "ppr(alpha=0.2, steps=3):4",
                                   "polynomial(steps=2, init=[0.1, 0.5, 0.4]):3,heat-exact(t=0.4):1"])
@pytest.mark.parametrize("backend", ["sdpa", "matrix"])
def test_layer_against_explicit_reference(heads, backend):
    torch.manual_seed(5)
    layer = DiffusionAttention(16, 4, heads=heads, backend=backend).double().eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    H, C = 4, 4
    qkv = layer.qkv(x)
    q, k, v = (t.view(2, 6, H, C).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
    P = dense_attention_reference(q, k)
    outs = []
    for h, (op, (s, c)) in enumerate(zip(layer.operators, layer._groups)):
        if op.is_polynomial:
            outs.append(polynomial_reference(P[:, s : s + c], v[:, s : s + c], op.head_coefficients(c).detach()))
        else:
            I = torch.eye(6, dtype=torch.float64)
            outs.append(torch.linalg.matrix_exp(-0.4 * (I - P[:, s : s + c])) @ v[:, s : s + c])
    ref = layer.out_proj(torch.cat(outs, dim=1).transpose(1, 2).reshape(2, 6, 16))
    assert torch.allclose(layer(x), ref, atol=1e-10)


def test_causal_layer_never_sees_the_future_for_every_operator():
    for name in list_operators():
        torch.manual_seed(6)
        layer = DiffusionAttention(8, 2, heads=f"{name}:1,attention:1", causal=True).double().eval()
        x = torch.randn(1, 7, 8, dtype=torch.float64)
        y = layer(x)
        x2 = x.clone()
        x2[:, 4:] += torch.randn(1, 3, 8, dtype=torch.float64)
        assert torch.allclose(layer(x2)[:, :4], y[:, :4], atol=1e-12), name
        assert not torch.allclose(layer(x2)[:, 4:], y[:, 4:])


def test_parameter_counts():
    base = sum(p.numel() for p in DiffusionAttention(32, 8).parameters())
    assert base == 4 * 32 * 32 + 4 * 32
    assert sum(p.numel() for p in DiffusionAttention(32, 8, heads="attention:6,laplacian:2").parameters()) == base
    heat = DiffusionAttention(32, 8, heads="attention:6,heat(t=1.0, learnable=True):2")
    assert sum(p.numel() for p in heat.parameters()) == base + 2
    assert sum(p.numel() for p in DiffusionAttention(32, 8, qk_norm=True).parameters()) == base + 4 * 4


def test_fully_padded_sequence_is_finite_and_gradients_flow():
    layer = DiffusionAttention(8, 2, heads="attention:1,heat(t=1.0, steps=3, learnable=True):1")
    x = torch.randn(2, 4, 8, requires_grad=True)
    pad = torch.zeros(2, 4, dtype=torch.bool)
    pad[1] = True
    y = layer(x, key_padding_mask=pad)
    assert torch.isfinite(y).all()
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.operators[1].t.grad).all()


def test_learned_time_receives_gradient_and_trains():
    torch.manual_seed(7)
    layer = DiffusionAttention(8, 2, heads="heat(t=0.5, steps=6, learnable=True):2")
    target = DiffusionAttention(8, 2, heads="heat(t=2.0, steps=6):2")
    target.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("operators")}, strict=False)
    opt = torch.optim.Adam([layer.operators[0].t], lr=0.05)
    x = torch.randn(4, 6, 8)
    for _ in range(150):
        opt.zero_grad()
        loss = (layer(x) - target(x).detach()).pow(2).mean()
        loss.backward()
        opt.step()
    assert torch.allclose(layer.operators[0].t.detach(), torch.full((2,), 2.0), atol=0.1)


def test_repr_and_heads_spec():
    layer = DiffusionAttention(16, 4, heads="attention:3,I-P:1", causal=True)
    assert layer.heads_spec() == "attention:3,laplacian:1"
    text = repr(layer)
    assert "dim=16, num_heads=4, heads='attention:3,laplacian:1', causal=True, backend='auto'" in text
    assert "(1): LaplacianOperator(num_heads=1)" in text
    assert "(qkv): Linear(in_features=16, out_features=48, bias=True)" in text


@pytest.mark.parametrize("heads", ["attention:2,heat(t=0.5, learnable=True, steps=3):1,I-P:1",
                                   "ppr(alpha=0.3, steps=2, learnable=True):2,polynomial(steps=2, init='laplacian'):2",
                                   ["attention", "polynomial(steps=1, init=[0.2, 0.8])", "heat-exact(t=0.3)", "lap"]])
def test_heads_spec_rebuilds_the_layer(heads):
    a = DiffusionAttention(8, 4, heads=heads)
    b = DiffusionAttention(8, 4, heads=a.heads_spec())
    assert b.heads_spec() == a.heads_spec()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 5, 8)
    assert torch.equal(a(x), b(x))


def test_state_dict_round_trip():
    a = DiffusionAttention(8, 2, heads="polynomial(steps=2):1,ppr(learnable=True, steps=2):1")
    b = DiffusionAttention(8, 2, heads="polynomial(steps=2):1,ppr(learnable=True, steps=2):1")
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 3, 8)
    assert torch.equal(a(x), b(x))


def test_per_head_list_and_shared_instances():
    from diffusionformer.operators import HeatOperator

    shared = HeatOperator(t=0.3, steps=2, learnable=True)
    layer = DiffusionAttention(8, 4, heads=["attention", shared, shared, "I-P"])
    assert layer.heads_spec() == "attention:1,heat(t=0.3, steps=2, method='taylor', learnable=True, num_heads=1):2,laplacian:1"  # rebuilds one shared t
    assert sum(p.numel() for p in layer.parameters()) == 4 * 64 + 4 * 8 + 1
    per_head = HeatOperator(t=0.3, steps=2, learnable=True, num_heads=2)
    layer = DiffusionAttention(8, 4, heads=["attention", per_head, per_head, "I-P"])
    assert layer.coefficients().shape == (4, 3)


BAD = [
    (ValueError, "divisible", lambda: DiffusionAttention(10, 3)),
    (ValueError, "assigns 3 heads but the layer has num_heads=4", lambda: DiffusionAttention(8, 4, heads="attention:2,laplacian:1")),
    (ValueError, "unknown operator 'lapalcian'", lambda: DiffusionAttention(8, 4, heads="lapalcian:4")),
    (ValueError, "must be an integer", lambda: DiffusionAttention(8, 4, heads="attention:two")),
    (ValueError, "per-head list must have num_heads=4", lambda: DiffusionAttention(8, 4, heads=["attention"] * 3)),
    (TypeError, "heads must be None", lambda: DiffusionAttention(8, 4, heads=3)),
    (ValueError, "dropout must lie", lambda: DiffusionAttention(8, 4, dropout=1.5)),
    (ValueError, "backend must be one of", lambda: DiffusionAttention(8, 4, backend="cuda")),
    (ValueError, "last dimension dim=8", lambda: DiffusionAttention(8, 4)(torch.randn(2, 3, 7))),
    (ValueError, "key_padding_mask must have shape", lambda: DiffusionAttention(8, 4)(torch.randn(2, 3, 8), key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))),
    (TypeError, "key_padding_mask must be a bool", lambda: DiffusionAttention(8, 4)(torch.randn(2, 3, 8), key_padding_mask=torch.zeros(2, 3))),
    (ValueError, "dense input x must have shape", lambda: DiffusionAttention(8, 4)(torch.randn(3, 8))),
    (ValueError, "sparse input x must have shape", lambda: DiffusionAttention(8, 4)(torch.randn(1, 3, 8), edge_index=torch.zeros(2, 1, dtype=torch.long))),
    (ValueError, "edge_index values must lie", lambda: DiffusionAttention(8, 4)(torch.randn(3, 8), edge_index=torch.tensor([[0], [5]]))),
    (TypeError, "x must be floating point", lambda: DiffusionAttention(8, 4)(torch.ones(2, 3, 8, dtype=torch.long))),
    (ValueError, "num_heads=2 but covers 1", lambda: DiffusionAttention(8, 4, heads=["attention", __import__("diffusionformer").build_operator("heat", num_heads=2, learnable=True), "attention", "attention"])),
]


@pytest.mark.parametrize("err,match,call", BAD, ids=[m for _, m, _ in BAD])
def test_bad_configuration_and_input(err, match, call):
    with pytest.raises(err, match=match):
        call()


def test_non_finite_learned_parameter_is_reported():
    layer = DiffusionAttention(8, 2, heads="heat(learnable=True, steps=2):2")
    with torch.no_grad():
        layer.operators[0].t.fill_(float("inf"))
    with pytest.raises(ValueError, match="not finite"):
        layer(torch.randn(1, 3, 8))
