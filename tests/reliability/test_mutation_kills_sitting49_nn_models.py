"""Mutation audit (sitting 49) of nn/heads.py (``parse_heads``, ``format_head_spec``), nn/attention.py,
nn/kv_cache.py, models/sampling.py, models/gin.py and models/gcn.py: tests that kill mutants the earlier tests left
alive (each docstring names the mutant). No GPU is used; the references are written by hand (float64 attention
matrices, the full forward without a cache, PyG's convolutions).

98 mutants (heads.py 16, attention.py 23, kv_cache.py 13, sampling.py 14, gin.py 13, gcn.py 11, _skip.py 8): 81
killed by earlier tests, 16 survivors killed here (heads.py 2, attention.py 8, kv_cache.py 3, gin.py 2, gcn.py 1),
1 equivalent:

* sampling.py ``top_p_filter`` dropping ``drop_sorted[..., 0] = False``: the exclusive sum's first entry is the
  ``0.0`` that ``pad`` puts there, and ``p > 0`` is checked, so ``0.0 >= p`` is never true (a row of ``-inf``
  gives NaN probabilities, and ``NaN >= p`` is false too): the most likely token is kept either way.

Survivors of the module's own test files that other earlier tests kill (so not redone here): attention.py
``_dense_mask``'s key-padding shape check and integer-mask check on a call with no tokens, the ``num_kv_heads``
check of ``from_multihead_attention``, the causal matrix hook; kv_cache.py's batch-size, training-dropout, head-dim
and causal-layer checks; sampling.py's 0-d, integer and ``+inf`` logits checks.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.heads import format_head_spec, parse_heads
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.operators import build_operator
from diffusionformer.operators.ppr_exact import ExactPPROperator


# ---------------------------------------------------------------------------------------------------- nn/heads.py
def test_kills_format_head_spec_keeps_a_tuple_a_tuple():
    """kills: nn/heads.py ``format_head_spec`` ``type(heads)(...)`` -> ``list(...)`` (a tuple of per-layer specs came
    back a list, against the docstring's "a list stays a list, a tuple a tuple": a config holding a tuple layout
    compared unequal to itself once formatted). Each entry is formatted, ``{half}`` rounded down."""
    got = format_head_spec(("attention:{half},laplacian:{half}", "heat(t=0.5):{H}"), 5)
    assert type(got) is tuple
    assert got == ("attention:2,laplacian:2", "heat(t=0.5):5")
    got = format_head_spec(["laplacian:{H}"], 3)
    assert type(got) is list and got == ["laplacian:3"]


def test_kills_parse_heads_groups_one_instance_by_identity_not_equality():
    """kills: nn/heads.py ``parse_heads`` ``heads[h + run] is entry`` -> ``heads[h + run] == entry`` (two distinct
    operators that compare equal, e.g. by value, on consecutive heads were taken for one shared instance: the second
    one's parameters were dropped from the layer). Only the same instance repeated is one group."""
    base = type(build_operator("heat", num_heads=1))

    class ValueEqual(base):  # equal to any operator of its class, hashable as a module must be
        def __eq__(self, other):
            return type(other) is type(self)

        __hash__ = base.__hash__

    a, b = ValueEqual(num_heads=1), ValueEqual(num_heads=1)
    groups = parse_heads([a, b, a], 3)
    assert [(g.operator is op, g.start, g.count) for g, op in zip(groups, (a, b, a))] == [(True, 0, 1), (True, 1, 1),
                                                                                          (True, 2, 1)]
    assert len(groups) == 3
    shared = parse_heads([a, a, b], 3)
    assert [(g.operator is op, g.start, g.count) for g, op in zip(shared, (a, b))] == [(True, 0, 2), (True, 2, 1)]


# ------------------------------------------------------------------------------------------------ nn/attention.py
def _qkv64(layer: DiffusionAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's q, k, v ``(..., H, N, C)`` in float64, from its weights by hand (no layer code)."""
    H, C = layer.num_heads, layer.head_dim
    w, b = layer.qkv.weight.double(), layer.qkv.bias.double()
    qkv = x.double() @ w.T + b
    q, k, v = qkv.split(H * C, dim=-1)
    return tuple(t.unflatten(-1, (H, C)).transpose(-3, -2) for t in (q, k, v))


def _causal_attention64(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(C))`` under the causal mask, float64, written out."""
    N, C = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(C)
    future = torch.ones(N, N, dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(dim=-1)


def test_kills_sparse_causal_intermediates_keep_the_self_loops():
    """kills: nn/attention.py ``_forward_sparse`` ``keep = edge_index[0] <= edge_index[1]`` -> ``<`` (a causal layer's
    ``return_intermediates`` dropped every self loop from the edges and weights it returned, though each token attends
    to itself: the weights per target no longer summed to 1). Checked against the causal attention matrix built by
    hand in float64: ``attn_weights[e, h] = P[h, dst, src]``, and the output against ``P v`` projected."""
    torch.manual_seed(0)
    N = 4
    layer = DiffusionAttention(8, 2, "attention", causal=True).double().eval()
    x = torch.randn(N, 8, dtype=torch.float64)
    src, dst = torch.meshgrid(torch.arange(N), torch.arange(N), indexing="ij")
    edge_index = torch.stack([src.flatten(), dst.flatten()])  # every pair, self loops included, both directions
    y, inter = layer(x, edge_index=edge_index, return_intermediates=True)
    q, k, v = _qkv64(layer, x)
    P = _causal_attention64(q, k)  # (H, N, N)
    keep = edge_index[0] <= edge_index[1]
    assert torch.equal(inter.edge_index, edge_index[:, keep])
    assert int((inter.edge_index[0] == inter.edge_index[1]).sum()) == N
    want = P[:, inter.edge_index[1], inter.edge_index[0]].T  # (E, H)
    torch.testing.assert_close(inter.attn_weights, want, rtol=1e-12, atol=1e-12)
    out = (P @ v).transpose(0, 1).reshape(N, 8)
    torch.testing.assert_close(y, layer.out_proj(out), rtol=1e-12, atol=1e-12)


def test_kills_dense_intermediates_come_back_in_the_input_dtype():
    """kills: nn/attention.py ``_forward_dense`` ``AttentionIntermediates(P.to(v.dtype), ...)`` -> ``(P, ...)`` (a
    bfloat16 layer's ``attn_weights`` came back float32, the engine's working dtype, unlike its output and the sparse
    path's weights). Values checked against the float64 causal matrix of the same weights."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, "attention", causal=True).to(torch.bfloat16).eval()
    x = torch.randn(2, 5, 8).to(torch.bfloat16)
    y, inter = layer(x, return_intermediates=True)
    assert y.dtype == torch.bfloat16 and inter.attn_weights.dtype == torch.bfloat16
    q, k, _ = _qkv64(layer, x)
    torch.testing.assert_close(inter.attn_weights.double(), _causal_attention64(q, k), rtol=0, atol=3e-2)


class _SpyPPR(ExactPPROperator):
    """``ppr-exact`` that records which matrix hook the layer calls, with the dtype of the ``P`` it is handed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, torch.dtype]] = []

    def apply_matrix(self, P, v):
        self.calls.append(("apply_matrix", P.dtype))
        return super().apply_matrix(P, v)

    def apply_causal_matrix(self, P, v):
        self.calls.append(("apply_causal_matrix", P.dtype))
        return super().apply_causal_matrix(P, v)


class _SpyPPRInputDtype(_SpyPPR):
    _takes_float32_P = False


def test_kills_matrix_heads_get_p_in_the_dtype_they_ask_for():
    """kills: nn/attention.py ``_forward_dense`` ``if not op._takes_float32_P: Pg = Pg.to(v.dtype)`` -> ``if
    op._takes_float32_P`` (with bfloat16 inputs the operators that declare ``_takes_float32_P`` -- heat-exact,
    ppr-exact: their float16 gradients overflow -- were handed a bfloat16 ``P``, and the others a float32 one)."""
    torch.manual_seed(0)
    x = torch.randn(1, 4, 8).to(torch.bfloat16)
    for cls, want in ((_SpyPPR, torch.float32), (_SpyPPRInputDtype, torch.bfloat16)):
        spy = cls(alpha=0.3)
        layer = DiffusionAttention(8, 2, ["attention", spy], causal=True).to(torch.bfloat16).eval()
        assert layer(x).dtype == torch.bfloat16
        assert spy.calls == [("apply_causal_matrix", want)]


def test_kills_heads_spec_writes_a_shared_stateless_instance_as_the_string_layout():
    """kills: nn/attention.py ``_group_spec`` ``if op.num_heads == count or not op.state_dict()`` -> ``if op.num_heads
    == count`` (one stateless instance on two heads was written ``laplacian(num_heads=1):2``: nothing is shared
    between heads without state, so the layer built from ``"laplacian:2"`` is the same layer, yet the two specs, and
    the configs and run keys made from them, differed). A learnable instance shared so keeps ``num_heads=1``."""
    lap = build_operator("laplacian", num_heads=1)
    shared = DiffusionAttention(6, 3, [lap, lap, "attention"])
    assert shared.heads_spec() == "laplacian:2,attention:1"
    assert DiffusionAttention(6, 3, "laplacian:2,attention:1").heads_spec() == shared.heads_spec()
    heat = build_operator("heat(t=0.5, learnable=True)", num_heads=1)
    spec = DiffusionAttention(8, 2, [heat, heat]).heads_spec()
    assert spec.endswith("num_heads=1):2") and spec.startswith("heat(")


def test_kills_learned_coefficients_wider_than_the_degree_are_refused():
    """kills: nn/attention.py ``_coefficients`` ``c.shape[1] > op.degree + 1`` -> ``> op.degree + 2`` (an operator
    of degree 1 whose learned coefficients have a third column, a weight on ``P^2``, was padded by -1: that weight
    was dropped silently and the heads computed ``c0 I + c1 P``, not the operator's polynomial)."""
    from diffusionformer.operators.basic import LaplacianOperator

    class Wide(LaplacianOperator):  # coefficients read as learned (no static ones), one column too many
        def static_coefficients(self):
            return None

        def coefficients(self):
            return torch.tensor([1.0, -1.0, 0.5])

    layer = DiffusionAttention(8, 2, [Wide(), "attention"])
    for call in (layer.coefficients, lambda: layer(torch.randn(1, 4, 8))):
        with pytest.raises(ValueError, match=r"Wide\.coefficients\(\) must have degree \+ 1 = 2 columns, got shape "
                                             r"\(1, 3\)"):
            call()


def test_kills_the_default_backend_takes_the_fused_affine_path(monkeypatch):
    """kills: nn/attention.py ``_fused_affine_path`` ``backend == "sdpa" or (backend == "auto" and ...)`` ->
    ``backend == "sdpa"`` (a layer on the default ``backend="auto"`` never took the fused path of fixed ``a I + b P``
    heads on CPU: every call went through the functional API's checks, against the class docstring's "an
    all-attention layer then costs the calls of nanoGPT's attention"). The output equals nn.MultiheadAttention's."""
    torch.manual_seed(0)
    calls = []
    fused = DiffusionAttention._forward_affine
    monkeypatch.setattr(DiffusionAttention, "_forward_affine",
                        lambda self, *a, **k: calls.append(self.backend) or fused(self, *a, **k))
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    layer = DiffusionAttention.from_multihead_attention(mha).eval()
    assert layer.backend == "auto"
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(layer(x), mha(x, x, x, need_weights=False)[0], rtol=1e-5, atol=1e-6)
    assert calls == ["auto"]


def test_kills_from_multihead_attention_refuses_add_zero_attn():
    """kills: nn/attention.py ``from_multihead_attention`` ``or mha.add_zero_attn`` dropped (a MultiheadAttention with
    ``add_zero_attn=True``, whose softmax also weighs a zero key and value, was copied into a layer without that
    extra key: its outputs differed from the module's with no word)."""
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True, add_zero_attn=True)
    with pytest.raises(ValueError, match=r"only MultiheadAttention with .*no add_zero_attn"):
        DiffusionAttention.from_multihead_attention(mha)


def test_kills_empty_batch_refuses_a_one_dimensional_attn_mask():
    """kills: nn/attention.py ``_check_mask_shape`` ``2 <= attn_mask.dim()`` -> ``1 <= attn_mask.dim()`` (a 1-d mask,
    which ``nn.MultiheadAttention`` refuses and which reads as a per-key mask of either polarity, was broadcast and
    taken on a call with no sequences when a key padding mask came along: folded with the padding, it was 4-d by the
    time the functional API checked it, though refused once there are sequences). Checked as given, before the
    padding widens it."""
    attn = DiffusionAttention(8, 2)
    for kpm in (None, torch.zeros(0, 3, dtype=torch.bool)):
        with pytest.raises(ValueError, match=r"attn_mask must be broadcastable to \(B, H, N, M\) = \(0, 2, 3, 3\), "
                                             r"got shape \(3,\)"):
            attn(torch.randn(0, 3, 8), attn_mask=torch.ones(3, dtype=torch.bool), key_padding_mask=kpm)
    assert attn(torch.randn(0, 3, 8), attn_mask=torch.ones(3, 3, dtype=torch.bool)).shape == (0, 3, 8)



# ------------------------------------------------------------------------------------------------- nn/kv_cache.py
def test_kills_kv_cache_keeps_a_copy_of_the_first_inputs():
    """kills: nn/kv_cache.py ``attend_cached`` ``... else x.clone()`` -> ``... else x`` (a layer with context heads
    kept the caller's prompt tensor itself as its cached inputs: a decoding loop that refills one input buffer in
    place rewrote the cached history, and every later step recomputed the context heads that read ``x`` -- GRAND-nl
    re-projecting with q/k norm -- over the wrong tokens). Each step is checked against the rows of the full forward
    without a cache."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, "attention:1,grand-nl:1", causal=True, qk_norm=True).double().eval()
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    full = layer(x)
    cache = LayerKVCache()
    buf = x[:, :3].clone()
    torch.testing.assert_close(attend_cached(layer, buf, cache), full[:, :3], rtol=1e-10, atol=1e-10)
    buf.zero_()  # the caller's buffer reused: the cache must not see it
    for t in range(3, 6):
        step = attend_cached(layer, x[:, t : t + 1].clone(), cache)
        torch.testing.assert_close(step, full[:, t : t + 1], rtol=1e-10, atol=1e-10)


def test_kills_kv_cache_of_another_degree_is_refused():
    """kills: nn/kv_cache.py ``_check_cache_fits`` ``len(cache.powers) != K + 1`` -> ``< K + 1`` (a cache filled by
    degree-2 heads was taken silently after the operators were replaced by degree-1 ones, against the docstring's
    "the cache was filled for other operators": its ``P^2 v`` rows were dropped, so the cache no longer served the
    layer it was filled for). The same cache with the operators put back still decodes exactly."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, "polynomial(steps=2, init=[0.1, 0.5, 0.4]):2", causal=True).double().eval()
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    full = layer(x)
    cache = LayerKVCache()
    attend_cached(layer, x[:, :3], cache)
    degree2 = layer.operators[0]
    layer.operators[0] = build_operator("laplacian", num_heads=2)
    with pytest.raises(ValueError, match=r"2 powers of P for degree K=1\).*start a new LayerKVCache"):
        attend_cached(layer, x[:, 3:], cache)
    assert len(cache.powers) == 3 and cache.length == 3  # the refused call left the cache as it was
    layer.operators[0] = degree2
    torch.testing.assert_close(attend_cached(layer, x[:, 3:], cache), full[:, 3:], rtol=1e-10, atol=1e-10)


def test_kills_kv_cache_sums_the_powers_before_rounding_to_the_half_dtype():
    """kills: nn/kv_cache.py ``attend_cached`` ``coeffs[...] * new_rows`` -> ``coeffs[...] * new_rows.to(v.dtype)``
    (each power ``P^k v`` of a bfloat16 layer was rounded to bfloat16 before the weighted sum, as the layer's own
    path does not: a third of the outputs were an ulp or more off). With an identity output projection the cached
    output must be the float64 formula ``sum_k c_k P^k v``, from the layer's bfloat16 q, k, v and coefficients,
    rounded once to bfloat16 (allowing 2% of entries a rounding tie)."""
    torch.manual_seed(0)
    D, H, N = 16, 2, 12
    layer = DiffusionAttention(D, H, "polynomial(steps=3, init=[0.1, 0.5, -0.7, 1.1]):2", causal=True)
    layer = layer.to(torch.bfloat16).eval()
    with torch.no_grad():
        layer.out_proj.weight.copy_(torch.eye(D))
        layer.out_proj.bias.zero_()
    x = torch.randn(2, N, D).to(torch.bfloat16)
    y = attend_cached(layer, x, LayerKVCache())
    with torch.no_grad():
        q, k, v = (t.unflatten(-1, (H, D // H)).transpose(1, 2) for t in layer.qkv(x).double().split(D, -1))
        c = layer.coefficients()[0].double()
    P = _causal_attention64(q, k)
    out, pv = c[0] * v, v
    for step in range(1, 4):
        pv = P @ pv
        out = out + c[step] * pv
    want = out.transpose(1, 2).reshape(2, N, D).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16
    assert (y != want).float().mean().item() <= 0.02


# --------------------------------------------------------------------------------------------------- models/gin.py
def _gin_explicit(model, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
    """GIN by hand in float64 (one graph, sum readout): ``h' = MLP((1 + eps) h + A h)``, ``A[dst, src]`` counting
    edges, each layer's readout through its head, summed."""
    model = copy.deepcopy(model).double()
    x = x.double()
    A = torch.zeros(x.shape[0], x.shape[0], dtype=torch.float64)
    A.index_put_((edge_index[1], edge_index[0]), torch.ones(edge_index.shape[1], dtype=torch.float64), accumulate=True)
    hs = [x]
    for conv in model.convs:
        hs.append(conv.nn((1 + float(conv.eps)) * hs[-1] + A @ hs[-1]))
    return sum(head(h.sum(0, keepdim=True)) for head, h in zip(model.heads, hs))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_kills_gin_reads_float64_and_integer_features_in_the_model_dtype(dtype):
    """kills: models/gin.py ``forward`` ``x = x.to(dtype)`` dropped (float64 or integer node features, which the
    graph transformer and GCN read in the model's dtype, failed in the first linear layer with "mat1 and mat2 must
    have the same dtype"). The float32 model's output is that of ``x.float()``, and the float64 formula's."""
    from diffusionformer.models import GIN, GINConfig

    torch.manual_seed(0)
    model = GIN(GINConfig(in_channels=3, num_classes=2, hidden=8, num_layers=3)).eval()
    x = torch.randint(-3, 4, (5, 3)).to(dtype)
    edge_index = torch.tensor([[0, 1, 2, 3, 1], [1, 2, 3, 4, 0]])
    y = model(x, edge_index)
    assert y.dtype == torch.float32
    assert torch.equal(y, model(x.float(), edge_index))
    torch.testing.assert_close(y.double(), _gin_explicit(model, x, edge_index), rtol=1e-5, atol=1e-5)


def test_kills_gin0_refuses_a_negative_learned_epsilon():
    """kills: models/gin.py ``_load_from_state_dict`` ``(eps != 0).any()`` -> ``(eps > 0).any()`` (the state dict of a
    GIN-eps model that learned a negative epsilon loaded into a GIN-0 model without a word, which then ran with
    ``1 + eps != 1``, as the refusal of a positive one says it must not)."""
    from diffusionformer.models import GIN, GINConfig

    torch.manual_seed(0)
    learned = GIN(GINConfig(in_channels=3, num_classes=2, hidden=8, num_layers=3, train_eps=True))
    with torch.no_grad():
        learned.convs[1].eps.fill_(-0.25)
    gin0 = GIN(GINConfig(in_channels=3, num_classes=2, hidden=8, num_layers=3))
    with pytest.raises(RuntimeError, match=r"convs\.1\.eps is fixed at 0 \(train_eps=False, GIN-0\), but the state "
                                           r"dict holds \[-0\.25\]"):
        gin0.load_state_dict(learned.state_dict())
    assert float(gin0.convs[1].eps) == 0.0
    with torch.no_grad():
        learned.convs[1].eps.zero_()
    gin0.load_state_dict(learned.state_dict())  # epsilon 0 everywhere: taken


# --------------------------------------------------------------------------------------------------- models/gcn.py
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_kills_gcn_reads_float64_and_integer_features_in_the_model_dtype(dtype):
    """kills: models/gcn.py ``forward`` ``x = x.to(dtype)`` dropped (float64 or integer node features failed inside
    PyG's GCNConv with a dtype error, though the model reads them in its own dtype, as the graph transformer does).
    Checked against PyG's GCNConv layers of the same weights called by hand on ``x.float()``."""
    from torch_geometric.nn import GCNConv

    from diffusionformer.models import GCN, GCNConfig

    torch.manual_seed(0)
    model = GCN(GCNConfig(in_channels=3, num_classes=2, hidden=8, num_layers=2)).eval()
    x = torch.randint(-3, 4, (5, 3)).to(dtype)
    edge_index = torch.tensor([[0, 1, 2, 3, 1, 2], [1, 2, 3, 4, 0, 1]])
    y = model(x, edge_index)
    assert y.dtype == torch.float32
    convs = [GCNConv(3, 8), GCNConv(8, 2)]
    for mine, theirs in zip(model.convs, convs):
        theirs.load_state_dict(mine.state_dict())
    want = convs[1](convs[0](x.float(), edge_index).relu(), edge_index)
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)
