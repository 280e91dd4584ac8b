"""Tests written in a mutation-testing audit of the attention layer, head layouts, KV cache and generation.

Each test kills a mutant of ``diffusionformer/nn/attention.py`` (``DiffusionAttention``),
``diffusionformer/nn/heads.py``, ``diffusionformer/nn/kv_cache.py``, ``diffusionformer/nn/_skip.py``
or the generation path of ``diffusionformer/models/gpt.py`` that the rest of the suite let
through (the docstring of each test names it). References are independent of the code under
test: ``P`` built by hand in float64 (explicit exponentials over the admissible keys), powers
of ``P`` by matrix products, :class:`torch.nn.MultiheadAttention` with copied weights, the full
forward pass for the cache, and the documented contract (bad input gets a clear error naming
the argument). CPU only, deterministic (seeded).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.nn import DiffusionAttention, set_recompute
from diffusionformer.nn._skip import is_noop
from diffusionformer.nn.heads import format_head_spec, parse_heads, resolve_layer_heads
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.operators import build_operator
from diffusionformer.operators.heat import ExactHeatOperator

f64 = torch.float64


def _x(B: int, N: int, D: int, seed: int = 0) -> Tensor:
    return torch.randn(B, N, D, generator=torch.Generator().manual_seed(seed), dtype=f64)


def _qkv(layer: DiffusionAttention, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``q``, ``k``, ``v`` ``(B, H, N, C)`` by hand from the ``qkv`` weights (no q/k norm, no rotary)."""
    B, N, D = x.shape
    H, C = layer.num_heads, layer.head_dim
    qkv = x @ layer.qkv.weight.T + layer.qkv.bias
    q, k, v = (qkv[..., i * D : (i + 1) * D].reshape(B, N, H, C).transpose(1, 2) for i in range(3))
    return q, k, v


def _softmax(q: Tensor, k: Tensor, allowed: Tensor) -> Tensor:
    """``P = exp(s) / sum exp(s)`` over the allowed keys, ``s = q k^T / sqrt(C)``, by hand; zero rows without keys."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    e = torch.where(allowed, (s - s.amax(-1, keepdim=True)).exp(), torch.zeros((), dtype=s.dtype))
    z = e.sum(-1, keepdim=True)
    return e / torch.where(z > 0, z, torch.ones((), dtype=s.dtype))


def _merge(layer: DiffusionAttention, heads: Tensor) -> Tensor:
    """``(B, H, N, C)`` -> the output projection of the concatenated heads."""
    B, H, N, C = heads.shape
    return heads.transpose(1, 2).reshape(B, N, H * C) @ layer.out_proj.weight.T + layer.out_proj.bias


# ---------------------------------------------------------------------------- attention: argument validation
def test_zero_heads_or_zero_width_are_refused_by_name():
    """Kills: ``DiffusionAttention.__init__`` accepting ``value < 0`` instead of ``value < 1`` for ``dim`` and
    ``num_heads`` (``num_heads=0`` then fails with a bare ZeroDivisionError, ``dim=0`` builds an empty layer)."""
    with pytest.raises(ValueError, match=r"num_heads must be a positive int, got 0"):
        DiffusionAttention(8, 0)
    with pytest.raises(ValueError, match=r"dim must be a positive int, got 0"):
        DiffusionAttention(0, 1)


def test_dropout_of_one_is_refused():
    """Kills: the dropout range check ``0 <= dropout < 1`` relaxed to ``<= 1`` (every probability dropped)."""
    with pytest.raises(ValueError, match=r"dropout must lie in \[0, 1\), got 1.0"):
        DiffusionAttention(8, 2, dropout=1.0)


def test_num_kv_heads_that_do_not_divide_num_heads_are_refused():
    """Kills: the ``num_heads % num_kv_heads`` check dropped (the layer is built and fails later in a reshape)."""
    with pytest.raises(ValueError, match=r"num_kv_heads: expected a positive int dividing num_heads=4, got 3"):
        DiffusionAttention(8, 4, num_kv_heads=3)


def test_qk_norm_follows_bias_false():
    """Kills: the query LayerNorm built with ``bias=True`` whatever ``bias`` says (nanoGPT's bias-free
    LayerNorm); the parameter count is the four weight matrices and the two norm gains only."""
    D, H = 8, 2
    layer = DiffusionAttention(D, H, qk_norm=True, bias=False)
    assert layer.q_norm.bias is None and layer.k_norm.bias is None
    assert sum(p.numel() for p in layer.parameters()) == 4 * D * D + 2 * (D // H)


def test_an_operator_refuses_the_layer_dropout_at_construction():
    """Kills: ``__init__`` skipping ``op.check_attention_dropout`` (``ppr-exact(alpha)`` needs ``dropout < alpha``):
    the bad layer must be refused when it is built, not at its first training call."""
    with pytest.raises(ValueError, match=r"ppr-exact\(alpha=0.2\) with attention dropout 0.3"):
        DiffusionAttention(8, 2, heads="attention:1,ppr-exact(alpha=0.2):1", dropout=0.3)
    DiffusionAttention(8, 2, heads="attention:1,ppr-exact(alpha=0.2):1", dropout=0.1)  # p < alpha is fine


def test_from_multihead_attention_keeps_the_attention_dropout():
    """Kills: ``from_multihead_attention`` not passing ``mha.dropout`` on (the copy trains without dropout)."""
    mha = nn.MultiheadAttention(8, 2, dropout=0.25, batch_first=True)
    assert DiffusionAttention.from_multihead_attention(mha).dropout == 0.25


# ---------------------------------------------------------------------------- attention: coefficients and plan
def test_coefficients_are_nan_rows_for_non_polynomial_heads():
    """Kills: ``coefficients()`` returning zero rows for non-polynomial heads (``nan_for_nonpolynomial=False``):
    documented as NaN rows, so that a zero row is never mistaken for a head that outputs nothing."""
    layer = DiffusionAttention(8, 4, heads="attention:1,laplacian:1,heat-exact(t=0.4):2")
    c = layer.coefficients()
    assert c.shape == (4, 2)
    torch.testing.assert_close(c[:2], torch.tensor([[0.0, 1.0], [1.0, -1.0]]), rtol=0, atol=0)
    assert bool(torch.isnan(c[2:]).all())
    _, inter = layer(torch.randn(1, 3, 8), return_intermediates=True)
    assert bool(torch.isnan(inter.coefficients[2:]).all()) and not bool(torch.isnan(inter.coefficients[:2]).any())


def test_coefficients_follow_an_operator_replaced_before_any_call():
    """Kills: ``_check_plan`` made a no-op: ``coefficients()`` right after ``layer.operators[0] = ...`` must
    describe the new operator (heat with 3 Taylor steps: ``c_k = e^{-t} t^k / k!``), not the old plan."""
    layer = DiffusionAttention(8, 2, heads="attention:2")
    t = 0.5
    layer.operators[0] = build_operator("heat(t=0.5, steps=3)", num_heads=2)
    row = torch.tensor([math.exp(-t) * t**k / math.factorial(k) for k in range(4)])
    torch.testing.assert_close(layer.coefficients(), row.expand(2, 4), rtol=1e-6, atol=1e-7)


def test_attend_cached_follows_an_operator_replaced_before_any_call():
    """Kills: ``attend_cached`` not refreshing the layer's plan (``layer._check_plan()`` dropped): after
    replacing a polynomial head by ``heat-exact``, the cached call must equal the full causal forward."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads="attention:1,heat(t=0.5, steps=3):1", causal=True).double()
    layer.operators[1] = build_operator("heat-exact(t=0.5)", num_heads=1)
    x = _x(1, 5, 8)
    torch.testing.assert_close(attend_cached(layer, x, LayerKVCache()), layer(x), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- attention: masks, dropout, hooks
def test_bool_attn_mask_and_key_padding_are_intersected():
    """Kills: ``_dense_mask`` folding the key padding into a bool ``attn_mask`` with ``|`` instead of ``&``
    (padded keys attended again); reference: ``P`` by hand over ``attn_mask & ~padding`` per head."""
    torch.manual_seed(0)
    B, N, D, H = 2, 5, 8, 2
    layer = DiffusionAttention(D, H, heads="attention:1,laplacian:1").double()
    x = _x(B, N, D)
    attn_mask = torch.rand(N, N, generator=torch.Generator().manual_seed(1)) < 0.6
    attn_mask |= torch.eye(N, dtype=torch.bool)  # every row keeps a key
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[0, 3:] = True
    q, k, v = _qkv(layer, x)
    allowed = attn_mask[None, None] & ~pad[:, None, None, :]  # (B, 1, N, N)
    assert bool(allowed.any(-1).all()) and not bool((attn_mask[None, None] | ~pad[:, None, None, :]).equal(allowed))
    P = _softmax(q, k, allowed)
    heads = P @ v
    heads[:, 1] = v[:, 1] - heads[:, 1]  # laplacian: (I - P) v
    for backend in ("sdpa", "matrix"):
        layer.backend = backend
        torch.testing.assert_close(layer(x, attn_mask=attn_mask, key_padding_mask=pad), _merge(layer, heads),
                                   rtol=0, atol=1e-12)


class _RecordingHeat(ExactHeatOperator):
    """``heat-exact`` that records which matrix hook the layer called."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def apply_matrix(self, P: Tensor, v: Tensor) -> Tensor:
        self.calls.append("matrix")
        return super().apply_matrix(P, v)

    def apply_causal_matrix(self, P: Tensor, v: Tensor) -> Tensor:
        self.calls.append("causal")
        return super().apply_matrix(P, v)


def test_causal_calls_use_the_causal_matrix_hook():
    """Kills: the layer (``_forward_dense``) and the KV cache (``attend_cached``) calling ``apply_matrix``
    instead of ``apply_causal_matrix`` on causal calls (the documented hook that lets ``ppr-exact`` use a
    triangular solve); non-causal calls keep ``apply_matrix``."""
    op = _RecordingHeat(t=0.4)
    layer = DiffusionAttention(8, 2, heads=["attention", op], causal=True).double()
    x = _x(1, 4, 8)
    layer(x)
    assert op.calls == ["causal"]
    attend_cached(layer, x, LayerKVCache())
    assert op.calls == ["causal", "causal"]
    open_layer = DiffusionAttention(8, 2, heads=["attention", _RecordingHeat(t=0.4)]).double()
    open_layer(x)
    open_layer(x, is_causal=True)
    assert open_layer.operators[1].calls == ["matrix", "causal"]


@pytest.mark.parametrize("heads", [None, "attention:1,laplacian:1", "attention:1,heat(t=0.5, steps=3):1",
                                   "attention:1,heat-exact(t=0.4):1"])
def test_dense_layer_has_no_dropout_in_eval(heads):
    """Kills: ``_call_dropout`` returning ``self.dropout`` outside training (dense calls dropping ``P`` in eval),
    on the fused affine path, the engine's path and the materialised-``P`` path."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads=heads, dropout=0.0).double().eval()
    x = _x(2, 5, 8)
    expected, expected_causal = layer(x), layer(x, is_causal=True)
    layer.dropout = 0.5
    for seed in range(3):
        torch.manual_seed(seed)
        torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)
        torch.testing.assert_close(layer(x, is_causal=True), expected_causal, rtol=0, atol=0)


def test_set_recompute_can_switch_it_off():
    """Kills: ``set_recompute`` setting ``recompute = True`` whatever ``enabled`` says."""
    model = nn.Sequential(DiffusionAttention(8, 2, recompute=True), DiffusionAttention(8, 2, recompute=True))
    assert set_recompute(model, False) == 2
    assert [m.recompute for m in model] == [False, False]


def test_the_cache_refuses_is_causal_like_the_other_structure_arguments():
    """Kills: ``forward(cache=..., is_causal=True)`` accepted silently (the check listing the graph arguments
    that ``cache=`` does not take lost ``is_causal``)."""
    layer = DiffusionAttention(8, 2, causal=True)
    with pytest.raises(ValueError, match="cache= runs causal decoding on dense tokens"):
        layer(torch.randn(1, 3, 8), cache=LayerKVCache(), is_causal=True)


# ---------------------------------------------------------------------------- heads: layouts
def test_negative_head_counts_are_refused():
    """Kills: ``_split_count`` accepting ``count == -1`` (``count < -1``): ``"attention:5,laplacian:-1"``
    adds up to 4 heads and must still be refused by name."""
    with pytest.raises(ValueError, match=r"head count must be non-negative, got -1 in 'laplacian:-1'"):
        parse_heads("attention:5,laplacian:-1", 4)


def test_zero_head_groups_are_left_out():
    """Kills: ``parse_heads`` keeping a group of zero heads (the ``count == 0: continue`` skip dropped):
    ``"attention:4,laplacian:0"`` is the all-attention layer, one group, and its spec says so."""
    groups = parse_heads("attention:4,laplacian:0", 4)
    assert [(g.operator.name, g.start, g.count) for g in groups] == [("attention", 0, 4)]
    assert DiffusionAttention(8, 4, heads="laplacian:0,attention:4").heads_spec() == "attention:4"


def test_a_shared_instance_must_fit_its_run_of_heads():
    """Kills: ``parse_heads`` accepting an operator instance whose ``num_heads`` is neither 1 nor the length
    of its run of consecutive heads (here 3 per-head parameters for a run of 2)."""
    op = build_operator("heat(learnable=True)", num_heads=3)
    with pytest.raises(ValueError, match=r"operator instance 'heat' has num_heads=3 but covers 2 consecutive heads"):
        parse_heads([op, op, "attention", "attention"], 4)


def test_half_template_rounds_down_for_an_odd_head_count():
    """Kills: the ``{half}`` template computed as ``ceil(H / 2)`` instead of ``H // 2`` (equal for even ``H``)."""
    assert format_head_spec("attention:{half},laplacian:{H}", 5) == "attention:2,laplacian:5"
    groups = parse_heads("laplacian:{half},attention:3", 5)
    assert [(g.operator.name, g.start, g.count) for g in groups] == [("laplacian", 0, 2), ("attention", 2, 3)]


def test_laplacian_heads_beyond_the_layer_are_refused():
    """Kills: ``resolve_layer_heads`` accepting ``laplacian_heads > num_heads`` (bound ``k <= H`` loosened)."""
    with pytest.raises(ValueError, match=r"laplacian_heads\[0\] must be an int in \[0, 4\], got 5"):
        resolve_layer_heads(2, 4, laplacian_heads=5)
    assert resolve_layer_heads(2, 4, laplacian_heads=4) == ["laplacian:4", "laplacian:4"]


def test_negative_layer_keys_count_from_the_last_layer():
    """Kills: ``resolve_layer_heads`` refusing negative ``{layer: spec}`` keys (``0 <= layer`` instead of
    ``-L <= layer``): ``-1`` is the last layer, as for a Python list."""
    assert resolve_layer_heads(3, 4, heads={-1: "laplacian:4", "0": "attention:{half},laplacian:{half}"}) == [
        "attention:2,laplacian:2", None, "laplacian:4"]
    with pytest.raises(ValueError, match=r"layer index -4 out of range for 3 layers"):
        resolve_layer_heads(3, 4, heads={-4: "laplacian:4"})


def test_heads_and_laplacian_heads_are_exclusive():
    """Kills: ``resolve_layer_heads`` silently ignoring ``heads=`` when ``laplacian_heads=`` is given too."""
    with pytest.raises(ValueError, match="give either heads= or laplacian_heads=, not both"):
        resolve_layer_heads(2, 4, heads="laplacian:4", laplacian_heads=1)


def test_an_item_without_a_count_among_others_is_one_head():
    """Kills: ``parse_heads`` giving an item without ``:count`` every head (``num_heads``) when other items
    follow; documented: only a single item without a count takes every head, otherwise it is one head."""
    groups = parse_heads("attention,laplacian:2,heat(t=0.5, steps=2)", 4)
    assert [(g.operator.name, g.start, g.count) for g in groups] == [("attention", 0, 1), ("laplacian", 1, 2),
                                                                     ("heat", 3, 1)]
    assert [(g.operator.name, g.count) for g in parse_heads("laplacian", 4)] == [("laplacian", 4)]


# ---------------------------------------------------------------------------- kv cache
def test_the_cache_refuses_a_different_batch_size():
    """Kills: ``attend_cached`` without its batch-size check: new tokens of another batch size than the
    cached ones must get a ValueError naming both, not a broadcast or a bare shape error."""
    layer = DiffusionAttention(8, 2, causal=True)
    cache = LayerKVCache()
    attend_cached(layer, torch.randn(2, 3, 8), cache)
    with pytest.raises(ValueError, match=r"expected batch size 2 \(the cache's\), got 1"):
        attend_cached(layer, torch.randn(1, 1, 8), cache)


# ---------------------------------------------------------------------------- skipped placeholders
def test_an_identity_with_a_forward_pre_hook_is_called():
    """Kills: ``is_noop`` ignoring the module's own forward pre-hooks: a pre-hook on ``q_norm`` that doubles
    the queries must run (the layer equals the plain layer whose query weights are doubled)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2).double()
    x = _x(1, 4, 8)
    m = nn.Identity()
    assert is_noop(m)
    handle = layer.q_norm.register_forward_pre_hook(lambda mod, args: (2.0 * args[0],))
    assert not is_noop(layer.q_norm)
    ref = DiffusionAttention(8, 2).double()
    ref.load_state_dict(layer.state_dict())
    with torch.no_grad():
        ref.qkv.weight[:8] *= 2.0
        ref.qkv.bias[:8] *= 2.0
    torch.testing.assert_close(layer(x), ref(x), rtol=0, atol=1e-12)
    handle.remove()
    assert is_noop(layer.q_norm)


def test_a_global_forward_hook_sees_the_skipped_identities():
    """Kills: ``is_noop`` ignoring the global forward hooks (``register_module_forward_hook``): with one
    installed, ``q_norm`` and ``k_norm`` are called again, as model-summary tools expect."""
    layer = DiffusionAttention(8, 2).double()
    seen: list[str] = []
    handle = nn.modules.module.register_module_forward_hook(lambda mod, inp, out: seen.append(type(mod).__name__))
    try:
        assert not is_noop(nn.Identity())
        layer(_x(1, 3, 8))
    finally:
        handle.remove()
    assert seen.count("Identity") == 2 and is_noop(nn.Identity())


# ---------------------------------------------------------------------------- generation
def _gpt(**kw: object) -> DiffusionGPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, heads="attention:1,heat(t=0.5, steps=2):1")
    cfg.update(kw)
    return DiffusionGPT(GPTConfig(**cfg))


def test_generate_restores_the_training_mode():
    """Kills: ``generate`` leaving the model in training mode (``self.train(True)`` instead of
    ``self.train(was_training)``) after sampling from a model in eval mode; a training model stays training."""
    model = _gpt().eval()
    model.generate(torch.tensor([[1, 2]]), 2, temperature=0)
    assert not model.training and not any(m.training for m in model.modules())
    model.train()
    model.generate(torch.tensor([[1, 2]]), 2, temperature=0, use_cache=True)
    assert model.training


@pytest.mark.parametrize("use_cache", [False, True])
def test_generate_samples_without_dropout(use_cache):
    """Kills: ``generate`` not switching to eval (``self.eval()`` dropped): a model in training mode with
    dropout 0.5 must decode greedily as its eval copy does (reference: greedy decoding by hand with the
    full forward in eval mode)."""
    model = _gpt(dropout=0.5).train()
    prompt = torch.tensor([[3, 1, 4]])
    ref = prompt.clone()
    model.eval()
    with torch.no_grad():
        for _ in range(4):
            ref = torch.cat([ref, model(ref)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    model.train()
    torch.manual_seed(1)
    assert torch.equal(model.generate(prompt, 4, temperature=0, use_cache=use_cache), ref)


def test_generate_with_no_new_tokens_returns_the_prompt():
    """Kills: ``generate`` refusing ``max_new_tokens=0`` (``< 1`` instead of ``< 0``): zero new tokens is the
    prompt itself (documented ``(B, T0) -> (B, T0 + max_new_tokens)``); negative counts are refused."""
    model = _gpt()
    prompt = torch.tensor([[1, 2, 3]])
    assert torch.equal(model.generate(prompt, 0), prompt)
    with pytest.raises(ValueError, match=r"max_new_tokens must be a non-negative int, got -1"):
        model.generate(prompt, -1)


@pytest.mark.parametrize("use_cache", [False, True])
def test_generate_keeps_the_prompt_dtype(use_cache):
    """Kills: ``generate`` appending the sampled ids without ``.to(idx.dtype)`` (an int32 prompt comes back
    int64); the tokens equal those of the int64 prompt."""
    model = _gpt()
    prompt = torch.tensor([[1, 2, 3]])
    out32 = model.generate(prompt.int(), 3, temperature=0, use_cache=use_cache)
    assert out32.dtype == torch.int32
    assert torch.equal(out32.long(), model.generate(prompt, 3, temperature=0, use_cache=use_cache))


def test_generate_refuses_a_nan_temperature():
    """Bug: ``generate(temperature=nan)`` passed the ``temperature < 0`` check (NaN compares false) and failed
    later inside ``torch.multinomial`` with "probability tensor contains either inf, nan or element < 0";
    it is now refused up front with a ValueError naming ``temperature``."""
    model = _gpt()
    with pytest.raises(ValueError, match=r"temperature must be a non-negative float, got nan"):
        model.generate(torch.tensor([[1, 2]]), 1, temperature=float("nan"))


def test_a_layer_without_polynomial_heads_has_degree_zero():
    """Kills: ``max_degree`` defaulting to 1 when no head is a polynomial: an all-``heat-exact`` layer has
    ``K = 0`` (coefficients ``(H, 1)``, NaN) and its KV cache keeps the values only, no power of ``P``;
    the cached output still equals the full causal forward (reference: ``exp(-t (I - P)) v`` per head)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads="heat-exact(t=0.4):2", causal=True).double()
    assert layer.max_degree == 0
    c = layer.coefficients()
    assert c.shape == (2, 1) and bool(torch.isnan(c).all())
    x = _x(1, 4, 8)
    cache = LayerKVCache()
    y = attend_cached(layer, x, cache)
    assert len(cache.powers) == 1 and tuple(cache.powers[0].shape) == (1, 2, 4, 4)
    q, k, v = _qkv(layer, x)
    P = _softmax(q, k, torch.ones(4, 4, dtype=torch.bool).tril())
    heads = torch.linalg.matrix_exp(-0.4 * (torch.eye(4, dtype=f64) - P)) @ v
    torch.testing.assert_close(y, _merge(layer, heads), rtol=0, atol=1e-12)
    torch.testing.assert_close(layer(x), _merge(layer, heads), rtol=0, atol=1e-12)


def test_cached_decoding_samples_from_float32_logits():
    """Kills: ``generate(use_cache=True)`` keeping the model's half-precision logits for the per-token steps
    (``.float()`` dropped): the temperature and ``top_k`` must act on float32 logits, as on the uncached path.
    Two bfloat16 logits one ulp apart (1.90625, 1.9140625) become equal when divided by 1.5 in bfloat16, so
    ``top_k=1`` would then keep both; in float32 only the larger one is ever sampled."""
    model = _gpt()
    V = model.config.vocab_size
    row = torch.full((V,), -30.0, dtype=torch.bfloat16)
    row[4], row[7] = 1.90625, 1.9140625
    assert (row[4] / 1.5).item() == (row[7] / 1.5).item() and float(row[4]) / 1.5 < float(row[7]) / 1.5  # set-up

    def fake_forward_cached(idx: Tensor, cache: list) -> Tensor:  # the model's logits, in bfloat16
        cache[0].keys = torch.zeros(idx.shape[0], 1, (cache[0].length + idx.shape[1]), 1)
        return row.expand(idx.shape[0], idx.shape[1], V)

    model.forward_cached = fake_forward_cached
    out = model.generate(torch.zeros(400, 1, dtype=torch.long), 2, temperature=1.5, top_k=1, use_cache=True,
                         generator=torch.Generator().manual_seed(0))
    assert set(out[:, 1:].flatten().tolist()) == {7}
