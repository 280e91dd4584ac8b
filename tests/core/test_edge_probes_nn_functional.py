"""Edge-case probes of the layer-level API: ``diffusionformer.nn``, ``diffusionformer.functional``
and the operator registry.

Probed: ``diffuse`` / ``diffuse_sparse`` / ``edge_attention`` / ``propagate_sparse`` on empty
batches, zero nodes and zero edges, one token, duplicate edges, int32 and non-contiguous edge
indices, expanded (stride-0) and transposed inputs, float64 / bfloat16 / float16, bool and float
masks with fully masked rows, numpy numbers, mixed devices (meta); ``DiffusionAttention`` against
``torch.nn.MultiheadAttention`` with padding and masks, B=0 / N=0 / N=1, gradcheck, pickle,
deepcopy, strict state-dict round trips, autocast, NaN parameters, replaced operators;
``edge_feature_attention``; the KV cache with GQA and rotary; ``RotaryEmbedding`` against a
hand-written rotation; ``DropPath``; ``build_operator`` / ``register_operator`` names.

Found and fixed (each pinned by a "Bug:" test below):

* ``edge_feature_attention`` used the layer's stale plan after ``layer.operators[i]`` was
  replaced (degree and coefficients of the old operators): silently wrong output;
* ``edge_feature_attention`` did not validate its inputs: ``x`` of shape ``(B, N, D)`` gave "too
  many values to unpack", an out-of-range ``edge_index`` a bare ``IndexError``, a float one a
  ``RuntimeError`` from ``index_select``, a list of edge keys an ``AttributeError``;
* ``diffuse`` / ``diffuse_sparse`` accepted ``q``, ``k``, ``v`` on different devices: the
  ``"matrix"`` back-end returned uninitialised numbers for a meta ``k`` (a CPU ``q``), the others
  failed deep inside torch; an ``attn_mask`` on another device gave "Tensor on device cpu is not on
  the expected device meta!";
* ``diffuse_sparse(num_nodes=np.int64(N))`` was refused (numpy ints are ints everywhere else);
* ``RotaryEmbedding`` on an ``x`` with fewer than 3 dims raised ``IndexError: tuple index out of
  range``, and positions given as a list an ``AttributeError``;
* ``build_operator("I - P")`` was "unknown" although names are documented to match ignoring
  spaces; ``register_operator(name=5)`` raised ``AttributeError: 'int' object has no attribute
  'strip'``;
* ``DropPath`` in training turned a 1-D input ``(D,)`` into ``(1, D)``.
"""

from __future__ import annotations

import copy
import io
import math
import pickle

import numpy as np
import pytest
import torch
from torch import nn

import diffusionformer.functional as DF
from diffusionformer.nn import DiffusionAttention, DropPath, LayerKVCache, RotaryEmbedding, edge_feature_attention
from diffusionformer.operators import DiffusionOperator, build_operator, register_operator, unregister_operator

f64 = torch.float64


def _rand(*shape: int, seed: int, dtype: torch.dtype = f64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=f64).to(dtype)


def _dense_reference(q, k, v, coeffs, keep=None):
    """``sum_k c_k P^k v`` by explicit float64 matrices; ``keep`` (N, N) bool, rows without a key give a zero row."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    P = torch.softmax(s, dim=-1).nan_to_num(0.0)
    c = torch.as_tensor(coeffs, dtype=f64)
    c = c.expand(q.shape[1], -1) if c.dim() == 1 else c
    out, cur = 0, v
    for j in range(c.shape[1]):
        out = out + c[None, :, j, None, None] * cur
        cur = P @ cur
    return out


def _sparse_reference(q, k, v, edge_index, coeffs):
    """The sparse diffusion by an explicit dense float64 ``P`` (duplicate edges each count once)."""
    N, H, C = q.shape
    P = torch.zeros(H, N, N, dtype=f64)
    src, dst = edge_index.long()
    s = (q.double()[dst] * k.double()[src]).sum(-1) * C**-0.5  # (E, H)
    w = s.exp()
    denom = torch.zeros(N, H, dtype=f64).index_add_(0, dst, w)
    for e in range(src.numel()):
        P[:, dst[e], src[e]] += w[e] / denom[dst[e]]
    out, cur = 0, v.double().transpose(0, 1)
    for j, c in enumerate(coeffs):
        out = out + c * cur
        cur = P @ cur
    return out.transpose(0, 1)


_EDGES = torch.tensor([[0, 1, 2, 3, 0, 2, 4], [1, 2, 3, 0, 2, 2, 1]])


# ---------------------------------------------------------------------------- bugs: edge_feature_attention
def _edge_feature_reference(layer, x, ei, edge_keys, coeffs):
    """Edge-feature attention by explicit float64 matrices (TransformerConv's scores, no edge term in the message)."""
    H, C, D = layer.num_heads, layer.head_dim, layer.dim
    W, b = layer.qkv.weight.double(), layer.qkv.bias.double()
    q, k, v = [(x.double() @ W[i * D:(i + 1) * D].T + b[i * D:(i + 1) * D]).view(-1, H, C) for i in range(3)]
    N = x.shape[0]
    src, dst = ei
    s = (q[dst] * (k[src] + edge_keys.double().view(-1, H, C))).sum(-1) * C**-0.5  # (E, H)
    S = torch.full((H, N, N), float("-inf"), dtype=f64)
    S[:, dst, src] = s.T
    P = torch.softmax(S, dim=-1).nan_to_num(0.0)
    out, cur = 0, v.transpose(0, 1)
    for j in range(coeffs.shape[1]):
        out = out + coeffs[:, j, None, None] * cur
        cur = P @ cur
    return out.transpose(0, 1).reshape(N, D) @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()


def test_edge_feature_attention_follows_replaced_operators():
    """Bug: after ``layer.operators[0] = build_operator("heat", ...)`` on an ``attention`` layer,
    ``edge_feature_attention`` kept the old plan (degree 1): the heat series was cut to its first two
    terms and the output was silently wrong until the layer itself had been called once."""
    layer = DiffusionAttention(8, 2, heads="attention:1,laplacian:1").eval()
    layer.operators[0] = build_operator("heat", t=1.0, steps=3)
    layer.double()
    x, ek = _rand(5, 8, seed=1), _rand(_EDGES.shape[1], 8, seed=2)
    heat = [math.exp(-1.0) / math.factorial(j) for j in range(4)]  # e^{-t} t^j / j!, t = 1
    coeffs = torch.tensor([heat, [1.0, -1.0, 0.0, 0.0]], dtype=f64)
    y = edge_feature_attention(layer, x, _EDGES, ek)
    torch.testing.assert_close(y, _edge_feature_reference(layer, x, _EDGES, ek, coeffs), rtol=0, atol=1e-12)


@pytest.mark.parametrize("case, exc, match", [
    ("x (B, N, D)", ValueError, r"x must have shape \(N, D\)"),
    ("edge_index out of range", ValueError, r"edge_index values must lie in \[0, num_nodes=5\)"),
    ("float edge_index", TypeError, r"edge_index must be an integer tensor"),
    ("edge_keys list", TypeError, r"edge_keys must be a torch.Tensor"),
])
def test_edge_feature_attention_names_the_bad_argument(case, exc, match):
    """Bug: ``edge_feature_attention`` passed its inputs on unchecked: ``x`` of shape (1, N, D) gave
    "too many values to unpack", an edge index >= N a bare ``IndexError: index out of range in self``,
    a float ``edge_index`` a ``RuntimeError`` from ``index_select``, a list of edge keys an ``AttributeError``."""
    layer = DiffusionAttention(8, 2).double()
    x, ei, ek = _rand(5, 8, seed=3), _EDGES, _rand(_EDGES.shape[1], 8, seed=4)
    args = {"x (B, N, D)": (x[None], ei, ek), "edge_index out of range": (x, ei + 1, ek),
            "float edge_index": (x, ei.double(), ek), "edge_keys list": (x, ei, ek.tolist())}[case]
    with pytest.raises(exc, match=match):
        edge_feature_attention(layer, *args)


def test_edge_feature_attention_without_edges_is_the_zeroth_power():
    """E = 0: every row of ``P`` is zero, so the output is ``c_0 v`` projected (``c_0 = 0`` for attention,
    1 for Laplacian heads), with the edge keys ``(0, D)``; checked against the explicit reference."""
    layer = DiffusionAttention(8, 2, heads="attention:1,laplacian:1").double()
    x, ei = _rand(4, 8, seed=5), torch.zeros(2, 0, dtype=torch.long)
    coeffs = torch.tensor([[0.0, 1.0], [1.0, -1.0]], dtype=f64)
    y = edge_feature_attention(layer, x, ei, torch.zeros(0, 8, dtype=f64))
    torch.testing.assert_close(y, _edge_feature_reference(layer, x, ei, torch.zeros(0, 8), coeffs), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- bugs: devices
@pytest.mark.parametrize("backend", ["sdpa", "matrix"])
def test_diffuse_refuses_inputs_on_different_devices(backend):
    """Bug: ``diffuse(q, k_on_meta, v, backend="matrix")`` returned a CPU tensor of uninitialised numbers
    (``6e-38, 0, ...``); the SDPA path failed inside torch; an ``attn_mask`` on another device gave
    "Tensor on device cpu is not on the expected device meta!". Now a ValueError names the argument."""
    q, k, v = (_rand(1, 1, 3, 2, seed=s, dtype=torch.float32) for s in (6, 7, 8))
    with pytest.raises(ValueError, match=r"q and k must be on one device, got cpu and meta"):
        DF.diffuse(q, k.to("meta"), v, [0.0, 1.0], backend=backend)
    with pytest.raises(ValueError, match=r"v must be on the device of q \(cpu\), got meta"):
        DF.diffuse(q, k, v.to("meta"), torch.tensor([0.0, 1.0]), backend=backend)
    with pytest.raises(ValueError, match=r"attn_mask must be on the device of q \(cpu\), got meta"):
        DF.diffuse(q, k, v, [0.0, 1.0], backend=backend, attn_mask=torch.ones(3, 3, dtype=torch.bool, device="meta"))


def test_diffuse_sparse_refuses_inputs_on_different_devices():
    """Bug: ``diffuse_sparse`` with a meta ``k`` or ``v`` (CPU ``q``) failed with NotImplementedError
    "Could not run 'aten::sparse_sampled_addmm.out' with arguments from the 'SparseCsrMeta' backend"."""
    q, k, v = (_rand(5, 2, 3, seed=s) for s in (9, 10, 11))
    with pytest.raises(ValueError, match=r"q and k must be on one device"):
        DF.diffuse_sparse(q, k.to("meta"), v, _EDGES, [0.0, 1.0])
    with pytest.raises(ValueError, match=r"v must be on the device of q"):
        DF.diffuse_sparse(q, k, v.to("meta"), _EDGES, [0.0, 1.0])


def test_diffuse_sparse_takes_a_numpy_num_nodes():
    """Bug: ``num_nodes=np.int64(N)`` (a count from numpy) raised "num_nodes must be an int or None, got int64",
    while ``scale``, ``degrees`` and the layer sizes take numpy numbers. A float is still refused."""
    q, k, v = (_rand(5, 2, 3, seed=s) for s in (12, 13, 14))
    out = DF.diffuse_sparse(q, k, v, _EDGES, [0.5, -0.5, 0.25], num_nodes=np.int64(5))
    torch.testing.assert_close(out, _sparse_reference(q, k, v, _EDGES, [0.5, -0.5, 0.25]), rtol=0, atol=1e-12)
    with pytest.raises(TypeError, match="num_nodes must be an int or None, got float"):
        DF.diffuse_sparse(q, k, v, _EDGES, [0.5, -0.5], num_nodes=5.0)


# ---------------------------------------------------------------------------- bugs: rotary, DropPath
def test_rotary_names_a_bad_x_or_positions():
    """Bug: ``RotaryEmbedding(4)(torch.randn(5, 4))`` (no head axis) raised ``IndexError: tuple index out of
    range``, and positions given as a list or numpy array ``AttributeError: ... has no attribute 'shape'``."""
    rope = RotaryEmbedding(4)
    with pytest.raises(ValueError, match=r"RotaryEmbedding: expected x of shape \(\.\.\., N, H, C\), got \(5, 4\)"):
        rope(torch.randn(5, 4))
    for positions in ([0, 1, 2], np.arange(3)):
        with pytest.raises(TypeError, match="RotaryEmbedding: expected positions as a tensor"):
            rope(torch.randn(3, 1, 4), positions)


def test_rotary_refuses_bool_and_non_finite_positions():
    """Bug: bool positions were read as 0/1 and a NaN or infinite position gave a NaN row of queries, both
    without a word (1-D and 2-D RoPE). Both are now refused naming the positions; float positions otherwise still
    rotate by ``position * theta_i`` (checked by hand for position 1.5: pair 0 turns by 1.5 rad)."""
    from diffusionformer.nn import RotaryEmbedding2D

    rope, rope2 = RotaryEmbedding(4), RotaryEmbedding2D(4)
    x = torch.randn(3, 1, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"expected integer or float positions, got dtype torch.bool"):
        rope(x, torch.tensor([True, False, True]))
    with pytest.raises(TypeError, match=r"expected integer or float positions, got dtype torch.bool"):
        rope2(x, torch.ones(3, 2, dtype=torch.bool))
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="RotaryEmbedding: expected finite positions, got NaN or inf"):
            rope(x, torch.tensor([0.0, bad, 2.0]))
        with pytest.raises(ValueError, match="expected finite positions"):
            rope2(x, torch.tensor([[0.0, 0.0], [1.0, bad], [2.0, 2.0]]))
    y = rope(x, torch.tensor([0.0, 1.5, 2.0], dtype=torch.float64))
    c, s_ = math.cos(1.5), math.sin(1.5)
    want0 = x[1, 0, 0] * c - x[1, 0, 1] * s_
    want1 = x[1, 0, 0] * s_ + x[1, 0, 1] * c
    torch.testing.assert_close(y[1, 0, :2], torch.stack([want0, want1]), rtol=0, atol=1e-12)


def test_drop_path_keeps_the_shape_of_a_1d_input():
    """Bug: ``DropPath(p).train()`` on a 1-D input ``(D,)`` returned ``(1, D)`` (its mask was ``(1, 1)``).
    A 1-D input is one sample, like a 2-D one: kept whole (scaled by 1 / (1 - p)) or zeroed whole."""
    torch.manual_seed(0)
    dp = DropPath(0.5).train()
    x = torch.arange(1.0, 5.0)
    seen = set()
    for _ in range(20):
        y = dp(x)
        assert y.shape == x.shape
        assert torch.equal(y, 2 * x) or torch.equal(y, torch.zeros(4))
        seen.add(bool(y.any()))
    assert seen == {True, False}


# ---------------------------------------------------------------------------- bugs: registry names
def test_operator_names_ignore_spaces_around_hyphens():
    """Bug: ``build_operator("I - P")`` raised "unknown operator 'I - P' (did you mean 'laplacian'?)" although
    names are documented to match "ignoring case, spaces and underscores" and ``"I-P"`` is an alias."""
    assert build_operator("I - P").name == "laplacian"
    assert build_operator(" heat _ exact ").name == "heat-exact"
    assert build_operator("Grand NL").name == "grand-nl"
    assert build_operator("heat (t = 0.5)").spec() == build_operator("heat", t=0.5).spec()


def test_register_operator_refuses_a_name_that_is_not_a_string():
    """Bug: ``register_operator(name=5)`` raised ``AttributeError: 'int' object has no attribute 'strip'``;
    now a TypeError says that names are ``str``, and nothing is registered."""

    class Probe(DiffusionOperator):
        degree = 1

        def coefficients(self):
            return torch.tensor([0.5, 0.5])

    before = build_operator.__globals__["_REGISTRY"].copy()
    with pytest.raises(TypeError, match="operator names and aliases must be str, got int"):
        register_operator(name=5)(Probe)
    with pytest.raises(TypeError, match="operator names and aliases must be str, got int"):
        register_operator(name="probe-nn-alias", aliases=("ok", 7))(Probe)
    assert build_operator.__globals__["_REGISTRY"] == before


def test_register_build_unregister_round_trip():
    """A registered operator resolves by name, alias (case, spaces, underscores ignored) and spec, drives a
    layer (checked against the explicit reference ``0.5 v + 0.5 P v``), and is gone after unregistering."""

    class Halfway(DiffusionOperator):
        degree = 1

        def coefficients(self):
            return torch.tensor([0.5, 0.5])

    register_operator(name="probe_nn halfway", aliases=("Probe Half",))(Halfway)
    try:
        assert build_operator("PROBE-NN-HALFWAY").name == "probe-nn-halfway"
        assert isinstance(build_operator("probe_half()"), Halfway)
        q, k, v = (_rand(1, 2, 4, 3, seed=s) for s in (15, 16, 17))
        out = DF.diffuse(q, k, v, build_operator("probe half").coefficients().double())
        torch.testing.assert_close(out, _dense_reference(q, k, v, [0.5, 0.5]), rtol=0, atol=1e-12)
    finally:
        unregister_operator("probe-nn-halfway")
    with pytest.raises(ValueError, match="unknown operator"):
        build_operator("probe-half")


# ---------------------------------------------------------------------------- working edge cases (functional)
@pytest.mark.parametrize("backend", ["sdpa", "matrix"])
@pytest.mark.parametrize("float_mask", [False, True])
def test_diffuse_fully_masked_row_has_zero_row_of_p(backend, float_mask):
    """A query row whose every key is masked (bool False or float -inf) gets a zero row of ``P`` on every
    back-end: output ``c_0 v`` there, finite; the other rows match the explicit reference."""
    q, k, v = (_rand(2, 2, 4, 3, seed=s) for s in (18, 19, 20))
    keep = torch.ones(4, 4, dtype=torch.bool)
    keep[1] = False
    mask = torch.zeros(4, 4, dtype=f64).masked_fill(~keep, float("-inf")) if float_mask else keep
    coeffs = [0.3, -0.5, 0.25]
    out = DF.diffuse(q, k, v, coeffs, attn_mask=mask, backend=backend)
    torch.testing.assert_close(out, _dense_reference(q, k, v, coeffs, keep), rtol=0, atol=1e-12)
    torch.testing.assert_close(out[:, :, 1], 0.3 * v[:, :, 1], rtol=0, atol=1e-12)


def test_diffuse_empty_batch_and_no_tokens_have_shape_and_gradient():
    """B = 0 and N = 0 give empty outputs of the right shape whose backward gives zero-size gradients
    (static and tensor coefficients)."""
    for shape in ((0, 2, 4, 3), (2, 2, 0, 3)):
        q, k, v = (torch.zeros(shape, dtype=f64, requires_grad=True) for _ in range(3))
        c = torch.tensor([0.2, 0.3, 0.5], dtype=f64, requires_grad=True)
        for coeffs in (c, [0.2, 0.3, 0.5]):
            out = DF.diffuse(q, k, v, coeffs)
            assert out.shape == shape
            out.sum().backward()
        assert q.grad is None or q.grad.shape == shape
        assert v.grad.shape == shape
        assert c.grad is not None and torch.equal(c.grad, torch.zeros(3, dtype=f64))


def test_diffuse_strided_inputs_and_half_precision_match_the_reference():
    """Expanded (stride-0 batch), transposed (non-contiguous) inputs and per-head degrees match the float64
    reference; bfloat16 and float16 inputs stay close to it and keep their dtype."""
    q, k, v = (_rand(1, 2, 5, 3, seed=s) for s in (21, 22, 23))
    qe, ke, ve = (t.expand(3, -1, -1, -1) for t in (q, k, v))
    kt = k.transpose(-1, -2).contiguous().transpose(-1, -2)
    rows = [[0.3, -0.5, 0.0], [0.3, -0.5, 0.25]]
    ref = _dense_reference(q, k, v, rows)
    for backend in ("sdpa", "matrix"):
        out = DF.diffuse(qe, ke, ve, [0.3, -0.5, 0.25], degrees=[1, 2], backend=backend)
        torch.testing.assert_close(out, ref.expand(3, -1, -1, -1), rtol=0, atol=1e-12)
        torch.testing.assert_close(DF.diffuse(q, kt, v, torch.tensor(rows, dtype=f64), backend=backend), ref,
                                   rtol=0, atol=1e-12)
        for dtype in (torch.bfloat16, torch.float16):
            low = DF.diffuse(q.to(dtype), k.to(dtype), v.to(dtype), rows, backend=backend)
            assert low.dtype == dtype
            torch.testing.assert_close(low.double(), ref, rtol=0, atol=5e-2)


@pytest.mark.parametrize("backend", ["csr", "native"])
def test_diffuse_sparse_duplicates_int32_and_no_edges(backend):
    """Duplicate edges count once each, int32 and non-contiguous ``edge_index`` give the int64 result, and a
    graph without edges gives ``c_0 v`` (zero rows of ``P``); all against an explicit dense reference."""
    q, k, v = (_rand(5, 2, 3, seed=s) for s in (24, 25, 26))
    ei = torch.cat([_EDGES, _EDGES[:, :2]], dim=1)
    coeffs = [0.2, -0.7, 0.4]
    ref = _sparse_reference(q, k, v, ei, coeffs)
    for edges in (ei, ei.int(), ei.t().contiguous().t()):
        torch.testing.assert_close(DF.diffuse_sparse(q, k, v, edges, coeffs, backend=backend), ref,
                                   rtol=0, atol=1e-12)
    empty = DF.diffuse_sparse(q, k, v, torch.zeros(2, 0, dtype=torch.long), coeffs, backend=backend)
    torch.testing.assert_close(empty, 0.2 * v, rtol=0, atol=0)
    assert DF.edge_attention(q, k, torch.zeros(2, 0, dtype=torch.long), backend=backend).shape == (0, 2)


# ---------------------------------------------------------------------------- working edge cases (nn)
def test_layer_matches_multihead_attention_with_padding_and_masks():
    """``from_multihead_attention`` equals ``nn.MultiheadAttention`` with a key padding mask combined with a
    bool mask (MHA's True = masked is the layer's False) and with a float additive mask, and its attention
    weights (mean over heads) equal MHA's."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    layer = DiffusionAttention.from_multihead_attention(mha).eval()
    x = _rand(2, 5, 8, seed=27)
    kpm = torch.tensor([[False] * 5, [False, False, False, True, True]])
    keep = torch.ones(5, 5, dtype=torch.bool).tril() | torch.eye(5, dtype=torch.bool)
    fm = _rand(5, 5, seed=28)
    torch.testing.assert_close(layer(x, key_padding_mask=kpm, attn_mask=keep),
                               mha(x, x, x, key_padding_mask=kpm, attn_mask=~keep, need_weights=False)[0],
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(layer(x, attn_mask=fm), mha(x, x, x, attn_mask=fm, need_weights=False)[0],
                               rtol=0, atol=1e-12)
    _, inter = layer(x, return_intermediates=True)
    torch.testing.assert_close(inter.attn_weights.mean(1), mha(x, x, x)[1], rtol=0, atol=1e-12)


def test_layer_empty_batch_and_one_token():
    """B = 0 gives ``(0, N, D)`` (and ``(0, H, N, N)`` weights) with a working backward; N = 1 makes ``P = [1]``,
    so a Laplacian head outputs 0 and a heat head ``v`` (its coefficients sum to 1 after truncation):
    checked against the projections by hand."""
    layer = DiffusionAttention(8, 2, heads="laplacian:1,heat(t=0.5, steps=3):1").double()
    x = _rand(0, 5, 8, seed=29).requires_grad_()
    y, inter = layer(x, return_intermediates=True)
    assert y.shape == (0, 5, 8) and inter.attn_weights.shape == (0, 2, 5, 5)
    y.sum().backward()
    assert x.grad.shape == (0, 5, 8)
    x1 = _rand(3, 1, 8, seed=30)
    v = (x1 @ layer.qkv.weight[16:].T + layer.qkv.bias[16:]).view(3, 1, 2, 4)
    heat_sum = sum(math.exp(-0.5) * 0.5**j / math.factorial(j) for j in range(4))
    out = torch.cat([torch.zeros_like(v[..., 0, :]), heat_sum * v[..., 1, :]], dim=-1)
    torch.testing.assert_close(layer(x1), out @ layer.out_proj.weight.T + layer.out_proj.bias, rtol=0, atol=1e-12)


def test_layer_with_learned_operators_survives_copy_pickle_and_strict_state_dict():
    """deepcopy, pickle and a strict ``torch.save`` / ``torch.load(weights_only=True)`` round trip of a layer with
    learned heat and polynomial heads reproduce its output exactly; gradcheck passes in float64 (dense, sparse)."""
    torch.manual_seed(0)
    a = DiffusionAttention(4, 2, heads="heat(t=0.7, learnable=True):1,polynomial:1").double()
    with torch.no_grad():
        a.operators[1].theta.normal_()
    x = _rand(2, 3, 4, seed=31)
    for b in (copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert torch.equal(b(x), a(x))
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    c = DiffusionAttention(4, 2, heads="heat(t=0.7, learnable=True):1,polynomial:1").double()
    c.load_state_dict(torch.load(buf, weights_only=True), strict=True)
    assert torch.equal(c(x), a(x))
    xg = _rand(1, 3, 4, seed=32).requires_grad_()
    assert torch.autograd.gradcheck(lambda z: a(z), (xg,))
    assert torch.autograd.gradcheck(lambda z: a(z, edge_index=_EDGES[:, :4] % 3), (xg[0].detach().requires_grad_(),))


def test_kv_cache_with_gqa_rotary_and_matrix_heads_matches_the_full_forward():
    """Decoding token by token through ``cache=`` (a prompt of 3, then 3 single tokens, plus one empty step) with
    grouped-query attention, rotary positions and a non-polynomial head equals the full causal forward."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads="heat-exact:1,ppr(alpha=0.3, steps=3):1", causal=True,
                               rotary=RotaryEmbedding(4), num_kv_heads=1).double().eval()
    x = _rand(2, 6, 8, seed=33)
    cache = LayerKVCache()
    outs = [layer(x[:, :3], cache=cache)]
    assert layer(x[:, :0], cache=cache).shape == (2, 0, 8) and cache.length == 3
    outs += [layer(x[:, i:i + 1], cache=cache) for i in range(3, 6)]
    torch.testing.assert_close(torch.cat(outs, dim=1), layer(x), rtol=0, atol=1e-12)


def test_rotary_matches_a_hand_written_rotation():
    """``RotaryEmbedding`` rotates pair ``i`` at position ``m`` by ``m base^{-2i/C}`` (float positions too):
    checked against explicit 2x2 rotations in float64."""
    rope = RotaryEmbedding(4, base=100.0)
    x = _rand(2, 3, 1, 4, seed=34)
    pos = torch.tensor([0.0, 1.5, 7.0], dtype=f64)
    ref = x.clone()
    for m in range(3):
        for i in range(2):
            th = float(pos[m]) * 100.0 ** (-2 * i / 4)
            a, b = x[:, m, :, 2 * i], x[:, m, :, 2 * i + 1]
            ref[:, m, :, 2 * i] = a * math.cos(th) - b * math.sin(th)
            ref[:, m, :, 2 * i + 1] = a * math.sin(th) + b * math.cos(th)
    torch.testing.assert_close(rope(x, pos), ref, rtol=0, atol=1e-12)


def test_coefficients_as_a_sequence_name_inputs_without_heads():
    """Bug: ``DF.diffuse(q, k, v, [0.0, 1.0])`` with ``H = 0`` heads said "coeffs rows must all have K+1 entries,
    got lengths []" (a message about coefficient rows the caller never gave). It now says the inputs have no
    head; coefficients given as a tensor still give the empty output (checked: shape ``(B, 0, N, C)``)."""
    q = torch.randn(2, 0, 4, 8)
    for backend in ("matrix", "sdpa"):
        with pytest.raises(ValueError, match=r"coeffs given as a sequence need inputs with H >= 1 heads, got H=0"):
            DF.diffuse(q, q, q, [0.0, 1.0], backend=backend)
        assert DF.diffuse(q, q, q, torch.tensor([0.0, 1.0]), backend=backend).shape == (2, 0, 4, 8)
    qs = torch.randn(4, 0, 8)
    with pytest.raises(ValueError, match=r"need inputs with H >= 1 heads, got H=0"):
        DF.diffuse_sparse(qs, qs, qs, torch.tensor([[0, 1], [1, 0]]), [0.0, 1.0])
