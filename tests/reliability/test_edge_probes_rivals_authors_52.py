"""The rival operators against their AUTHORS' public code (not against references we wrote from the papers).

Each test ports the relevant forward of the authors' repository (a few lines, the repository, path and
licence named above it), builds it with the SAME weights as our layer (the parameter map is spelled out),
and compares outputs (and gradients where cheap) in float64:

* dense without a mask, and sparse on the complete graph, against the authors' forward as written;
* causal and padded calls where the authors' code has no mask (AttnScale, NeuTRENO): row ``i`` of a causal
  call must equal the authors' forward on the prefix ``x[:, : i + 1]`` (last row), and the valid rows of a
  padded sample the authors' forward on the unpadded sample; the same holds for a sparse causal graph.

Authors' sources (read at the commits fetched for this probe):

* differential: microsoft/unilm ``Diff-Transformer/multihead_diffattn.py`` (MIT);
* AttnScale: VITA-Group/ViT-Anti-Oversmoothing ``attnscale.py`` (MIT);
* NeuTRENO: tamnguyen9520/NeuTRENO_NeurIPS2024 ``DeiT/neutreno.py`` (no licence file in the repository: a few
  lines transcribed for this test only);
* value residual: Zcchill/Value-Residual-Learning ``src/modeling/modeling_llama_resformer.py`` (MIT);
* GRAND-nl: twitter-research/graph-neural-pde ``src/function_transformer_attention.py`` (Apache-2.0);
* ppr-exact: pyg-team/pytorch_geometric ``torch_geometric/nn/conv/appnp.py`` (MIT);
* Chebyshev basis: pyg-team/pytorch_geometric ``torch_geometric/nn/conv/cheb_conv.py`` (MIT); monomial
  basis: jianhao2016/GPRGNN ``src/GNN_models.py`` ``GPR_prop`` (no licence file: its recurrence only).

The last three tests are Bug: tests of GRAND-nl where a row of P does not sum to 1.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from diffusionformer import DiffusionAttention
from diffusionformer.ops.rivals import LayerState

f64 = torch.float64
D, H, N, B = 16, 2, 6, 2
C = D // H
ATOL = 1e-10


def _complete_edges(n: int, causal: bool = False) -> torch.Tensor:
    """All edges ``(source j, target i)`` of the complete graph (self loops included); ``j <= i`` when causal."""
    j, i = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    keep = (j <= i) if causal else torch.ones_like(j, dtype=torch.bool)
    return torch.stack([j[keep], i[keep]])


def _causal_by_prefix(authors, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
    """Row ``i`` = the authors' unmasked forward on the prefix ``[: i + 1]`` (its last row): what a causal call is."""
    rows = [authors(x[:, : i + 1], *(e[:, : i + 1] for e in extra))[:, -1] for i in range(x.shape[1])]
    return torch.stack(rows, 1)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max())


# ----------------------------------------------------------------------------------------------- AttnScale
# VITA-Group/ViT-Anti-Oversmoothing, attnscale.py, class Attention.forward (MIT licence). Parameter map:
# self.qkv.weight = layer.qkv.weight (q | k | v blocks, heads contiguous, as our qkv), qkv_bias=False,
# self.lamb = op.omega, self.proj = layer.out_proj (its bias 0: our layer has bias=False).
def _vita_attnscale(x, qkv_w, lamb, proj_w, num_heads):
    Bb, Nn, Cc = x.shape
    qkv = (x @ qkv_w.T).reshape(Bb, Nn, 3, num_heads, Cc // num_heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    attn = (q @ k.transpose(-2, -1)) * (Cc // num_heads) ** -0.5
    attn = attn.softmax(dim=-1)
    attn_d = torch.ones(attn.shape[-2:], dtype=x.dtype) / Nn
    attn_d = attn_d[None, None, ...]
    attn_h = attn - attn_d
    attn_h = attn_h * (1.0 + lamb[None, :, None, None])
    attn = attn_d + attn_h
    return (attn @ v).transpose(1, 2).reshape(Bb, Nn, Cc) @ proj_w.T


def _attnscale_layer():  # noqa: ANN202
    torch.manual_seed(0)
    layer = DiffusionAttention(D, H, heads="attnscale", bias=False).double().eval()
    with torch.no_grad():
        layer.operators[0].omega.copy_(torch.tensor([0.7, -0.4]))
    return layer


@pytest.mark.parametrize("mode", ["dense", "sparse", "causal", "sparse-causal", "padded"])
def test_attnscale_matches_the_authors_code(mode):
    layer = _attnscale_layer()
    op = layer.operators[0]
    x = torch.randn(B, N, D, dtype=f64, requires_grad=True)

    def authors(xx):
        return _vita_attnscale(xx, layer.qkv.weight, op.omega, layer.out_proj.weight, H)

    if mode == "dense":
        got, want = layer(x), authors(x)
    elif mode == "sparse":
        got, want = layer(x[0], edge_index=_complete_edges(N)), authors(x[:1])[0]
    elif mode == "causal":
        got, want = layer(x, is_causal=True), _causal_by_prefix(authors, x)
    elif mode == "sparse-causal":
        causal = DiffusionAttention(D, H, heads="attnscale", bias=False, causal=True).double().eval()
        causal.operators[0].omega = op.omega  # the same parameters
        causal.qkv, causal.out_proj = layer.qkv, layer.out_proj
        got, want = causal(x[0], edge_index=_complete_edges(N)), _causal_by_prefix(authors, x[:1])[0]
    else:  # padded: the valid rows of a padded sample are the authors' forward on the sample without its padding
        pad = torch.zeros(B, N, dtype=torch.bool)
        pad[1, 4:] = True
        out = layer(x, key_padding_mask=pad)
        got, want = torch.cat([out[0], out[1, :4]]), torch.cat([authors(x[:1])[0], authors(x[1:, :4])[0]])
    assert _max_diff(got, want) < ATOL
    ga = torch.autograd.grad(got.square().sum(), (x, op.omega))
    gb = torch.autograd.grad(want.square().sum(), (x, op.omega))
    for a, b in zip(ga, gb):
        assert _max_diff(a, b) < ATOL


# ----------------------------------------------------------------------------------------------- NeuTRENO
# tamnguyen9520/NeuTRENO_NeurIPS2024, DeiT/neutreno.py, Attention.forward: `res = self.alpha*(v0 - v) if
# self.layerth > 0 else 0.; x = (attn @ v) + res`, layer 0 returning its v as v0 (alpha = 0.6). Parameter map:
# qkv and proj as AttnScale's; v0 = layer 0's v of ITS input (the same tensor our LayerState records).
def _neutreno_authors(x, qkv_w, proj_w, num_heads, v0=None, alpha=0.6):
    Bb, Nn, Cc = x.shape
    qkv = (x @ qkv_w.T).reshape(Bb, Nn, 3, num_heads, Cc // num_heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    attn = ((q @ k.transpose(-2, -1)) * (Cc // num_heads) ** -0.5).softmax(dim=-1)
    res = alpha * (v0 - v) if v0 is not None else 0.0
    out = ((attn @ v) + res).transpose(1, 2).reshape(Bb, Nn, Cc) @ proj_w.T
    return out, v


def _two_layers(heads: str, causal: bool = False):  # noqa: ANN202
    torch.manual_seed(1)
    return [DiffusionAttention(D, H, heads=heads, bias=False, causal=causal).double().eval() for _ in range(2)]


@pytest.mark.parametrize("mode", ["dense", "sparse", "causal", "padded"])
def test_neutreno_matches_the_authors_code(mode):
    l0, l1 = _two_layers("neutreno")
    x0 = torch.randn(B, N, D, dtype=f64, requires_grad=True)
    x1 = torch.randn(B, N, D, dtype=f64, requires_grad=True)

    def authors(a, b):
        _, v0 = _neutreno_authors(a, l0.qkv.weight, l0.out_proj.weight, H)
        return _neutreno_authors(b, l1.qkv.weight, l1.out_proj.weight, H, v0=v0)[0]

    def ours(a, b, **kw):
        s = LayerState()
        l0(a, state=s, **kw)
        return l1(b, state=s, **kw)

    if mode == "dense":
        got, want = ours(x0, x1), authors(x0, x1)
    elif mode == "sparse":
        got, want = ours(x0[0], x1[0], edge_index=_complete_edges(N)), authors(x0[:1], x1[:1])[0]
    elif mode == "causal":
        got, want = ours(x0, x1, is_causal=True), _causal_by_prefix(authors, x0, x1)
    else:
        pad = torch.zeros(B, N, dtype=torch.bool)
        pad[0, 3:] = True
        out = ours(x0, x1, key_padding_mask=pad)
        got = torch.cat([out[0, :3], out[1]])
        want = torch.cat([authors(x0[:1, :3], x1[:1, :3])[0], authors(x0[1:], x1[1:])[0]])
    assert _max_diff(got, want) < ATOL
    # the gradient flows into v0 (layer 0's qkv) in both
    ga = torch.autograd.grad(got.square().sum(), (x0, x1, l0.qkv.weight))
    gb = torch.autograd.grad(want.square().sum(), (x0, x1, l0.qkv.weight))
    for a, b in zip(ga, gb):
        assert _max_diff(a, b) < ATOL


# ----------------------------------------------------------------------------------------------- value residual
# Zcchill/Value-Residual-Learning, src/modeling/modeling_llama_resformer.py, LlamaAttention.forward (eager path,
# MIT licence): layer 0 appends its v_proj(x) to formal_layer_values, later layers use
# `value_states = 0.5*formal_layer_values[0] + 0.5*value_states` before the (causal) attention. RoPE left out
# (it touches q and k only; our layer here has none). Parameter map: q_proj | k_proj | v_proj = layer.qkv
# blocks; o_proj = 2 * layer.out_proj: the authors' 0.5 V_1 + 0.5 V_n is half of our lam=1 sum V_n + V_1.
def _resformer_authors(x, wq, wk, wv, wo, num_heads, first=None, causal=True):
    bsz, q_len, _ = x.shape
    head_dim = wq.shape[0] // num_heads
    query_states, key_states, value_states = x @ wq.T, x @ wk.T, x @ wv.T
    raw = value_states
    if first is not None:
        value_states = 0.5 * first + 0.5 * value_states
    query_states = query_states.view(bsz, q_len, num_heads, head_dim).transpose(1, 2)
    key_states = key_states.view(bsz, q_len, num_heads, head_dim).transpose(1, 2)
    value_states = value_states.view(bsz, q_len, num_heads, head_dim).transpose(1, 2)
    attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(head_dim)
    if causal:
        attn_weights = attn_weights + torch.triu(torch.full((q_len, q_len), float("-inf"), dtype=x.dtype), 1)
    attn_weights = F.softmax(attn_weights, dim=-1)  # theirs upcasts to float32; we stay in float64
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).reshape(bsz, q_len, -1)
    return attn_output @ wo.T, raw


@pytest.mark.parametrize("mode", ["causal", "dense", "sparse-causal", "padded"])
def test_value_residual_matches_the_authors_code(mode):
    causal = mode in ("causal", "sparse-causal")
    l0, l1 = _two_layers("value-residual", causal=causal)
    x0 = torch.randn(B, N, D, dtype=f64, requires_grad=True)
    x1 = torch.randn(B, N, D, dtype=f64, requires_grad=True)

    def authors(a, b):
        _, v1 = _resformer_authors(a, *l0.qkv.weight.chunk(3), l0.out_proj.weight, H, causal=causal)
        return _resformer_authors(b, *l1.qkv.weight.chunk(3), 2.0 * l1.out_proj.weight, H, first=v1,
                                  causal=causal)[0]

    def ours(a, b, **kw):
        s = LayerState()
        l0(a, state=s, **kw)
        return l1(b, state=s, **kw)

    if mode in ("causal", "dense"):
        got, want = ours(x0, x1), authors(x0, x1)
    elif mode == "sparse-causal":
        got, want = ours(x0[0], x1[0], edge_index=_complete_edges(N)), authors(x0[:1], x1[:1])[0]
    else:
        pad = torch.zeros(B, N, dtype=torch.bool)
        pad[1, 2:] = True
        out = ours(x0, x1, key_padding_mask=pad)
        got = torch.cat([out[0], out[1, :2]])
        want = torch.cat([authors(x0[:1], x1[:1])[0], authors(x0[1:, :2], x1[1:, :2])[0]])
    assert _max_diff(got, want) < ATOL
    ga = torch.autograd.grad(got.square().sum(), (x0, x1, l0.qkv.weight))
    gb = torch.autograd.grad(want.square().sum(), (x0, x1, l0.qkv.weight))
    for a, b in zip(ga, gb):
        assert _max_diff(a, b) < ATOL


# ----------------------------------------------------------------------------------------------- differential
# microsoft/unilm, Diff-Transformer/multihead_diffattn.py, MultiheadDiffAttn.forward (MIT licence), without
# rotary and GQA. Parameter map: q_proj | k_proj | v_proj = layer.qkv blocks, out_proj = layer.out_proj,
# lambda_q1 .. lambda_k2 and subln.weight = the operator's; its num_heads = our H (it halves a baseline's
# head count: one of our differential heads of width C is one of its heads of width 2 * head_dim = C).
# `attn_mask`: the authors' additive mask argument (None = their causal default).
def _unilm_diffattn(x, wq, wk, wv, wo, lq1, lk1, lq2, lk2, gain, depth, num_heads, attn_mask=None):
    bsz, tgt_len, embed_dim = x.shape
    src_len = tgt_len
    head_dim = embed_dim // num_heads // 2
    q = (x @ wq.T).view(bsz, tgt_len, 2 * num_heads, head_dim)
    k = (x @ wk.T).view(bsz, src_len, 2 * num_heads, head_dim)
    v = (x @ wv.T).view(bsz, src_len, num_heads, 2 * head_dim)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q = q * head_dim**-0.5
    attn_weights = torch.matmul(q, k.transpose(-1, -2))
    if attn_mask is None:
        attn_mask = torch.triu(torch.zeros([tgt_len, src_len]).to(x.dtype).fill_(float("-inf")), 1)
    attn_weights = torch.nan_to_num(attn_weights)
    attn_weights = attn_weights + attn_mask
    attn_weights = F.softmax(attn_weights, dim=-1)  # theirs upcasts to float32; we stay in float64
    lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)
    lambda_full = torch.exp(torch.sum(lq1 * lk1, dim=-1)) - torch.exp(torch.sum(lq2 * lk2, dim=-1)) + lambda_init
    attn_weights = attn_weights.view(bsz, num_heads, 2, tgt_len, src_len)
    attn_weights = attn_weights[:, :, 0] - lambda_full * attn_weights[:, :, 1]
    attn = torch.matmul(attn_weights, v)
    attn = attn * torch.rsqrt(attn.pow(2).mean(-1, keepdim=True) + 1e-5) * gain  # their RMSNorm(2 d, eps=1e-5)
    attn = attn * (1 - lambda_init)
    return attn.transpose(1, 2).reshape(bsz, tgt_len, num_heads * 2 * head_dim) @ wo.T


@pytest.mark.parametrize("mode", ["causal", "dense", "sparse", "sparse-causal", "padded"])
def test_differential_matches_the_authors_code(mode):
    torch.manual_seed(2)
    causal = mode in ("causal", "sparse-causal")
    layer = DiffusionAttention(D, H, heads="differential", bias=False, causal=causal).double().eval()
    op = layer.operators[0]
    with torch.no_grad():
        op.subln.weight.copy_(torch.rand(C, dtype=f64) + 0.5)
    x = torch.randn(B, N, D, dtype=f64, requires_grad=True)
    depth = 2
    params = (op.lambda_q1, op.lambda_k1, op.lambda_q2, op.lambda_k2, op.subln.weight)

    def authors(xx, mask=None):
        if mask is None and not causal:
            mask = torch.zeros(xx.shape[1], xx.shape[1], dtype=f64)
        return _unilm_diffattn(xx, *layer.qkv.weight.chunk(3), layer.out_proj.weight, *params, depth, H, mask)

    def ours(xx, **kw):
        return layer(xx, state=LayerState(depth=depth), **kw)

    if mode in ("causal", "dense"):
        got, want = ours(x), authors(x)
    elif mode in ("sparse", "sparse-causal"):
        got, want = ours(x[0], edge_index=_complete_edges(N)), authors(x[:1])[0]
    else:  # padding through the authors' own additive mask argument
        pad = torch.zeros(B, N, dtype=torch.bool)
        pad[1, 4:] = True
        mask = torch.zeros(B, 1, N, N, dtype=f64).masked_fill(pad[:, None, None, :], float("-inf"))
        got, want = ours(x, key_padding_mask=pad), authors(x, mask)
        got, want = torch.cat([got[0], got[1, :4]]), torch.cat([want[0], want[1, :4]])
    assert _max_diff(got, want) < ATOL
    ga = torch.autograd.grad(got.square().sum(), (x, *params))
    gb = torch.autograd.grad(want.square().sum(), (x, *params))
    for a, b in zip(ga, gb):
        assert _max_diff(a, b) < ATOL


# ----------------------------------------------------------------------------------------------- GRAND-nl
# twitter-research/graph-neural-pde, src/function_transformer_attention.py (Apache-2.0):
# ODEFuncTransformerAtt.forward: `attention, values = self.multihead_att_layer(x, self.edge_index);
# ax = self.multiply_attention(x, attention, values); f = alpha * (ax - x)` (mix_features off: ax =
# spmm(edge_index, attention.mean(dim=1), x)); SpGraphTransAttentionLayer.forward ('scaled_dot'):
# `prods = sum(q[edge[0]] * k[edge[1]]) / sqrt(d_k)`, `softmax(prods, edge[attention_norm_idx = 0])`.
# GRAND's edge[0] is the node that aggregates (spmm's row): its edge_index is our (source j, target i) flipped.
# One head (GRAND averages the heads' attention over one shared state; ours evolves a state per head), alpha = 1
# (no_alpha_sigmoid with alpha_train = 1: GRAND's learned time scale), the fixed-step integrator of this library
# (GRAND integrates with torchdiffeq). Parameter map: Q, K, V = layer.qkv blocks with their biases; ours returns
# v(t) = V(X(t)), so GRAND's X(t) goes through V and out_proj.
def _grand_f(x, edge, Wq, bq, Wk, bk):
    q, k = x @ Wq.T + bq, x @ Wk.T + bk
    prods = (q[edge[0]] * k[edge[1]]).sum(-1) / math.sqrt(q.shape[-1])
    # torch_geometric.utils.softmax(prods, edge[0]): a softmax over the edges of each aggregating node
    n = x.shape[0]
    mx = torch.full((n,), -math.inf, dtype=x.dtype).scatter_reduce(0, edge[0], prods, "amax")
    e = (prods - mx[edge[0]]).exp()
    att = e / torch.zeros(n, dtype=x.dtype).index_add(0, edge[0], e)[edge[0]]
    ax = torch.zeros_like(x).index_add(0, edge[0], att[:, None] * x[edge[1]])  # spmm(edge, att, n, n, x)
    return ax - x


def _integrate(f, x, t, steps, method):
    tau = t / steps
    for _ in range(steps):
        if method == "euler":
            x = x + tau * f(x)
        else:
            k1 = f(x)
            k2 = f(x + tau / 2 * k1)
            k3 = f(x + tau / 2 * k2)
            k4 = f(x + tau * k3)
            x = x + tau / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return x


@pytest.mark.parametrize("method", ["euler", "rk4"])
@pytest.mark.parametrize("mode", ["sparse", "dense", "causal", "padded"])
def test_grand_nl_matches_the_authors_code(mode, method):
    torch.manual_seed(3)
    causal = mode == "causal"
    layer = DiffusionAttention(D, 1, heads=f"grand-nl(t=1.5, steps=3, method='{method}')", bias=True,
                               causal=causal).double().eval()
    with torch.no_grad():  # biases large enough to matter (the projected equation relies on P being row-stochastic)
        layer.qkv.bias.normal_(0, 1.0)
    Wq, Wk, Wv = layer.qkv.weight.chunk(3)
    bq, bk, bv = layer.qkv.bias.chunk(3)

    def authors(xn, edge):  # noqa: ANN001, ANN202  -- xn (n, D), GRAND's edge orientation
        X = _integrate(lambda s: _grand_f(s, edge, Wq, bq, Wk, bk), xn, 1.5, 3, method)
        return layer.out_proj(X @ Wv.T + bv)

    x = torch.randn(B, N, D, dtype=f64, requires_grad=True)
    if mode == "sparse":  # a random directed graph with self loops, as GRAND's add_remaining_self_loops
        g = torch.Generator().manual_seed(0)
        adj = (torch.rand(N, N, generator=g) < 0.4) | torch.eye(N, dtype=torch.bool)
        src, dst = adj.nonzero().T  # our (source j, target i)
        ours_edges = torch.stack([src, dst])
        got, want = layer(x[0], edge_index=ours_edges), authors(x[0], ours_edges.flip(0))
    elif mode in ("dense", "causal"):
        e = _complete_edges(N, causal).flip(0)
        got, want = layer(x), torch.stack([authors(x[b], e) for b in range(B)])
    else:
        pad = torch.zeros(B, N, dtype=torch.bool)
        pad[0, 4:] = True
        out = layer(x, key_padding_mask=pad)
        got = torch.cat([out[0, :4], out[1]])
        want = torch.cat([authors(x[0, :4], _complete_edges(4).flip(0)), authors(x[1], _complete_edges(N).flip(0))])
    assert _max_diff(got, want) < 1e-9
    ga = torch.autograd.grad(got.square().sum(), (x, layer.qkv.weight))
    gb = torch.autograd.grad(want.square().sum(), (x, layer.qkv.weight))
    for a, b in zip(ga, gb):
        assert _max_diff(a, b) < 1e-8


# ----------------------------------------------------------------------------------------------- ppr-exact, polynomials
# pyg-team/pytorch_geometric (MIT): APPNP.forward `h = x; for _ in range(K): x = propagate(x); x = x * (1 - alpha);
# x = x + alpha * h` (normalize=False: the edge weights are used as given), and ChebConv.forward `Tx_0 = x;
# out = lins[0](Tx_0); Tx_1 = propagate(x); out += lins[1](Tx_1); Tx_2 = 2 * propagate(Tx_1) - Tx_0; ...`
# (its L_hat given directly as the propagation matrix). jianhao2016/GPRGNN GPR_prop.forward: `hidden = x *
# temp[0]; for k: x = propagate(x); hidden = hidden + temp[k + 1] * x`. propagate(x)_i = sum_j w_ji x_j over
# edges (source j, target i): with w = our P_ij that is P x. Parameter map: the propagation weights are our
# layer's P (its own q, k), lins[k] = theta_k * I, temp = theta (monomial).
def _P_of(layer, x, allowed=None):
    q, k, _ = (t.transpose(1, 2) for t in layer._project(x))
    s = (q @ k.transpose(-1, -2)) * layer.head_dim**-0.5
    if allowed is not None:
        s = s.masked_fill(~allowed, -math.inf)
    return torch.nan_to_num(torch.softmax(s, -1))


def _edges_weights(P):
    """(edge_index (source j, target i), weights P_ij) of the nonzero entries of one head's P (N, N)."""
    i, j = P.nonzero().T
    return torch.stack([j, i]), P[i, j]


def _propagate(x, edge, w):  # noqa: ANN001, ANN202  -- MessagePassing(aggr='add'): out_i = sum w * x_j
    return torch.zeros_like(x).index_add(0, edge[1], w[:, None] * x[edge[0]])


def _pyg_appnp(x, edge, w, K, alpha):
    h = x
    for _ in range(K):
        x = _propagate(x, edge, w)
        x = x * (1 - alpha)
        x = x + alpha * h
    return x


def _pyg_cheb(x, edge, w, theta):
    Tx_0 = x
    out = theta[0] * Tx_0
    Tx_1 = _propagate(x, edge, w)
    out = out + theta[1] * Tx_1
    for t in theta[2:]:
        Tx_2 = 2.0 * _propagate(Tx_1, edge, w) - Tx_0
        out = out + t * Tx_2
        Tx_0, Tx_1 = Tx_1, Tx_2
    return out


def _gpr_prop(x, edge, w, temp):
    hidden = x * temp[0]
    for k in range(len(temp) - 1):
        x = _propagate(x, edge, w)
        hidden = hidden + temp[k + 1] * x
    return hidden


def _per_head(layer, x, allowed, fn):
    """The head outputs ``fn(v_h, edges, weights, h)`` of every head, through out_proj."""
    P = _P_of(layer, x, allowed)
    _, _, v = layer._project(x)  # (B, N, H, C)
    out = torch.stack([torch.stack([fn(v[b, :, h], *_edges_weights(P[b, h]), h) for h in range(layer.num_heads)], 1)
                       for b in range(x.shape[0])])
    return layer.out_proj(out.reshape(x.shape[0], x.shape[1], -1))


@pytest.mark.parametrize("mode", ["dense", "causal", "padded"])
def test_ppr_exact_is_the_limit_of_pyg_appnp(mode):
    torch.manual_seed(4)
    alpha = 0.3
    layer = DiffusionAttention(D, H, heads=f"ppr-exact(alpha={alpha})", bias=False, causal=mode == "causal").double()
    x = torch.randn(B, N, D, dtype=f64)
    allowed = None
    pad = None
    if mode == "causal":
        allowed = torch.ones(N, N, dtype=torch.bool).tril()
    elif mode == "padded":
        pad = torch.zeros(B, N, dtype=torch.bool)
        pad[1, 4:] = True
        allowed = ~pad[:, None, None, :]
    got = layer(x, key_padding_mask=pad)
    want = _per_head(layer, x, allowed, lambda v, e, w, h: _pyg_appnp(v, e, w, 200, alpha))  # (0.7)^200 ~ 1e-31
    assert _max_diff(got, want) < ATOL
    with pytest.raises(ValueError, match="does not support the sparse back-end"):
        layer(x[0], edge_index=_complete_edges(N))


@pytest.mark.parametrize("basis", ["chebyshev", "monomial"])
@pytest.mark.parametrize("mode", ["dense", "causal", "padded", "sparse"])
def test_polynomial_matches_pyg_chebconv_and_gprgnn(basis, mode):
    torch.manual_seed(5)
    K = 4
    layer = DiffusionAttention(D, H, heads=f"polynomial(steps={K}, basis='{basis}')", bias=False,
                               causal=mode == "causal").double()
    op = layer.operators[0]
    with torch.no_grad():
        op.theta.copy_(torch.randn(H, K + 1, dtype=f64))
    port = _pyg_cheb if basis == "chebyshev" else _gpr_prop
    x = torch.randn(B, N, D, dtype=f64)
    allowed = pad = None
    if mode == "causal":
        allowed = torch.ones(N, N, dtype=torch.bool).tril()
    elif mode == "padded":
        pad = torch.zeros(B, N, dtype=torch.bool)
        pad[0, 3:] = True
        allowed = ~pad[:, None, None, :]
    if mode == "sparse":
        g = torch.Generator().manual_seed(1)
        adj = (torch.rand(N, N, generator=g) < 0.5) | torch.eye(N, dtype=torch.bool)  # adj[i, j]: i attends j
        i, j = adj.nonzero().T
        got = layer(x[0], edge_index=torch.stack([j, i]))
        want = _per_head(layer, x[:1], adj, lambda v, e, w, h: port(v, e, w, op.theta[h]))[0]
    else:
        got = layer(x, key_padding_mask=pad)
        want = _per_head(layer, x, allowed, lambda v, e, w, h: port(v, e, w, op.theta[h]))
    assert _max_diff(got, want) < 1e-9


# microsoft/unilm, Diff-Transformer/multihead_flashdiff_1.py, MultiheadDiffAttn.forward (MIT licence), the grouped-
# query layout: `q.reshape(bsz, N, H, 2, d)`, `k.reshape(bsz, N, H_kv, 2, d)`, `attn1 = flash_attn_func(q1, k1, v,
# causal=True)`, `attn2 = flash_attn_func(q2, k2, v, causal=True)` (flash attention: query head h reads key/value
# head h // (H / H_kv), scale d^-1/2). Note: the non-flash multihead_diffattn.py of the same folder applies its
# repeat_kv to the 2 H_kv half-heads, so there map 2 of head h reads key half-head (2h + 1) // n_rep, not the
# second half of key head h // n_rep: the authors' two files disagree under GQA; we follow the flash ones.
def _flash_attn(q, k, v, scale):  # noqa: ANN001, ANN202  -- flash_attn_func(q, k, v, causal=True), (B, N, heads, .)
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    s = s + torch.triu(torch.full(s.shape[-2:], float("-inf"), dtype=q.dtype), 1)
    return torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v)


def _unilm_flashdiff_1(x, wq, wk, wv, wo, lq1, lk1, lq2, lk2, gain, depth, num_heads, num_kv_heads):
    bsz, tgt_len, embed_dim = x.shape
    head_dim = embed_dim // num_heads // 2
    q = (x @ wq.T).view(bsz, tgt_len, 2 * num_heads, head_dim)
    k = (x @ wk.T).view(bsz, tgt_len, 2 * num_kv_heads, head_dim)
    v = (x @ wv.T).view(bsz, tgt_len, num_kv_heads, 2 * head_dim)
    q = q.reshape(bsz, tgt_len, num_heads, 2, head_dim)
    k = k.reshape(bsz, tgt_len, num_kv_heads, 2, head_dim)
    q1, q2 = q[:, :, :, 0], q[:, :, :, 1]
    k1, k2 = k[:, :, :, 0], k[:, :, :, 1]
    attn1 = _flash_attn(q1, k1, v, head_dim**-0.5)
    attn2 = _flash_attn(q2, k2, v, head_dim**-0.5)
    lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)
    lambda_full = torch.exp(torch.sum(lq1 * lk1, dim=-1)) - torch.exp(torch.sum(lq2 * lk2, dim=-1)) + lambda_init
    attn = attn1 - lambda_full * attn2
    attn = attn * torch.rsqrt(attn.pow(2).mean(-1, keepdim=True) + 1e-5) * gain
    attn = attn * (1 - lambda_init)
    return attn.reshape(bsz, tgt_len, num_heads * 2 * head_dim) @ wo.T


@pytest.mark.parametrize("num_kv_heads", [2, 1])
def test_differential_grouped_query_matches_the_authors_flash_code(num_kv_heads):
    torch.manual_seed(6)
    layer = DiffusionAttention(D, H, heads="differential", bias=False, causal=True,
                               num_kv_heads=num_kv_heads).double().eval()
    op = layer.operators[0]
    with torch.no_grad():
        op.subln.weight.copy_(torch.rand(C, dtype=f64) + 0.5)
    x = torch.randn(B, N, D, dtype=f64)
    wq, wk, wv = layer.qkv.weight.split([D, num_kv_heads * C, num_kv_heads * C])
    params = (op.lambda_q1, op.lambda_k1, op.lambda_q2, op.lambda_k2, op.subln.weight)
    got = layer(x, state=LayerState(depth=1))
    want = _unilm_flashdiff_1(x, wq, wk, wv, layer.out_proj.weight, *params, 1, H, num_kv_heads)
    assert _max_diff(got, want) < ATOL
    if num_kv_heads == 1:  # the non-flash file pairs the halves differently under GQA (see above)
        mha = _unilm_diffattn(x, wq, wk.repeat(2, 1), wv.repeat(2, 1), layer.out_proj.weight, *params, 1, H)
        assert _max_diff(mha, want) < ATOL  # repeating the key/value weights: the same heads, no GQA


# ----------------------------------------------------------------------------------------------- Bug: tests
def _grand_model_space(layer, x, edge, t, steps, drop=None):
    """GRAND-nl's forward (the port above) in model space for a one-head layer with biases: X(t), then V, out_proj."""
    Wq, Wk, Wv = layer.qkv.weight.chunk(3)
    bq, bk, bv = layer.qkv.bias.chunk(3)
    X = _integrate(lambda s: _grand_f(s, edge, Wq, bq, Wk, bk), x, t, steps, "euler")
    return layer.out_proj(X @ Wv.T + bv)


def _grand_layer(**kw):  # noqa: ANN003, ANN202
    torch.manual_seed(7)
    layer = DiffusionAttention(D, 1, heads="grand-nl(t=1.5, steps=3)", bias=True, **kw).double()
    with torch.no_grad():
        layer.qkv.bias.normal_(0, 1.0)
    return layer


def test_grand_nl_node_without_incoming_edges_follows_the_model_space_equation():
    """Bug: GRAND-nl evolved the projected q, k, v (biases included) under (P - I), which equals GRAND's model-space
    equation only when every row of P sums to 1; on a sparse graph with a node without incoming edges (P's row 0)
    the biases decayed with the state (q_i(t) = e^-t (x_i W + b) instead of e^-t x_i W + b), so that node's output
    and every output that attends to it differed from GRAND's by O(|b|) (1.2 here), silently."""
    layer = _grand_layer().eval()
    x = torch.randn(N, D, dtype=f64)
    adj = torch.ones(N, N, dtype=torch.bool)
    adj[0] = False  # adj[i, j]: i receives from j; node 0 receives nothing
    i, j = adj.nonzero().T
    got = layer(x, edge_index=torch.stack([j, i]))
    want = _grand_model_space(layer, x, torch.stack([i, j]), 1.5, 3)
    assert _max_diff(got, want) < 1e-10


def test_grand_nl_mask_row_without_keys_follows_the_model_space_equation():
    """Bug: as above on the dense back-end: a bool attn_mask whose row admits no key (a query that sees nothing) gave
    that query's projected biases the decay of the state, and every query attending to it a wrong key."""
    layer = _grand_layer().eval()
    x = torch.randn(1, N, D, dtype=f64)
    allowed = torch.rand(N, N, generator=torch.Generator().manual_seed(2)) < 0.6
    allowed[2] = False
    allowed[3:, 2] = True  # the query without keys is still a key of others
    i, j = allowed.nonzero().T
    got = layer(x, attn_mask=allowed)[0]
    want = _grand_model_space(layer, x[0], torch.stack([i, j]), 1.5, 3)
    assert _max_diff(got, want) < 1e-10


def test_grand_nl_with_attention_dropout_follows_the_model_space_equation():
    """Bug: with attention dropout the rows of the dropped P sum to 1/(1-p) times their kept mass, not 1, so the
    projected biases drifted as (P - I) b instead of staying put: in training, GRAND-nl with biases and dropout
    integrated another equation than Xdot = (P(X) - I) X (with that dropped P) of its documentation."""
    layer = _grand_layer(dropout=0.3, backend="matrix").train()
    Wq, Wk, Wv = layer.qkv.weight.chunk(3)
    bq, bk, bv = layer.qkv.bias.chunk(3)
    x = torch.randn(1, N, D, dtype=f64)
    torch.manual_seed(11)
    got = layer(x)
    torch.manual_seed(11)
    X = x[0]
    for _ in range(3):  # the layer's dropped P: F.dropout of the materialised P, one call per step
        P = torch.softmax((X @ Wq.T + bq) @ (X @ Wk.T + bk).T * D**-0.5, -1)
        X = X + 0.5 * (F.dropout(P[None, None], p=0.3)[0, 0] @ X - X)
    want = layer.out_proj(X @ Wv.T + bv)
    assert _max_diff(got[0], want) < 1e-10


def test_ppr_exact_is_the_limit_of_the_installed_pyg_appnp():
    """The same as the port above with PyG's own APPNP (when installed): normalize=False, the edge weights P_ij."""
    APPNP = pytest.importorskip("torch_geometric.nn").APPNP
    torch.manual_seed(8)
    alpha = 0.3
    layer = DiffusionAttention(D, H, heads=f"ppr-exact(alpha={alpha})", bias=False, causal=True).double()
    x = torch.randn(1, N, D, dtype=f64)
    appnp = APPNP(K=200, alpha=alpha, normalize=False)
    got = layer(x)
    want = _per_head(layer, x, torch.ones(N, N, dtype=torch.bool).tril(),
                     lambda v, e, w, h: appnp(v, e, edge_weight=w))
    assert _max_diff(got, want) < ATOL
