"""KV-cache decoding of the context rivals: exact by recomputation over all cached tokens.

The registry-wide cache tests live in ``test_models_gpt_modern.py``; here: a mixed layer
against an explicit float64 reference, the layer state (first layer's values, depth) in
cached decoding, NeuTRENO / value residuals in a 2-layer GPT, and what the cache keeps.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.nn.rotary import RotaryEmbedding
from diffusionformer.ops.reference_rivals import rival_reference
from diffusionformer.ops.rivals import LayerState
from diffusionformer.testing import reference_qkv


def _decode(layer: DiffusionAttention, x: torch.Tensor, chunks: list[int], state_for=None, positions=None):
    """The layer's cached output for ``x`` fed in ``chunks`` (a prompt, then tokens); ``state_for(T)``
    gives the LayerState of a step that ends at ``T`` tokens, ``positions`` the rotary positions."""
    cache, rows, start = LayerKVCache(), [], 0
    for n in chunks:
        T = start + n
        pos = None if positions is None else positions[start:T]
        st = None if state_for is None else state_for(T)
        rows.append(attend_cached(layer, x[:, start:T], cache, pos, st))
        start = T
    assert start == x.shape[1] and cache.length == start
    return torch.cat(rows, dim=1), cache


def _reference_mixed(layer: DiffusionAttention, x: torch.Tensor, depth: int) -> torch.Tensor:
    """Explicit float64 reference of an ``attention, laplacian, differential`` layer (GQA, no q/k norm or
    rotary): projections by hand, causal softmax per head, the differential rival's own reference."""
    B, N, D = x.shape
    H, C = layer.num_heads, layer.head_dim
    q, k, v = reference_qkv(layer, x)  # (B, N, H, C), key/value heads repeated for GQA
    mask = torch.ones(N, N, dtype=torch.bool).tril()
    out = torch.zeros(B, N, H, C, dtype=x.dtype)
    names = layer.head_operator_names
    for h in range(H):
        P = torch.softmax((q[:, :, h] @ k[:, :, h].transpose(1, 2) / math.sqrt(C)).masked_fill(~mask, -math.inf), -1)
        if names[h] == "attention":
            out[:, :, h] = P @ v[:, :, h]
        elif names[h] == "laplacian":
            out[:, :, h] = v[:, :, h] - P @ v[:, :, h]
        else:
            op = [o for o, (s, c) in zip(layer.operators, layer._groups) if s <= h < s + c][0]
            hv = lambda t: t[:, :, h].unsqueeze(1)  # noqa: E731  (B, 1, N, C)
            out[:, :, h] = rival_reference(op, hv(q), hv(k), hv(v), allowed=mask, depth=depth)[:, 0]
    return layer.out_proj(out.reshape(B, N, D))


def test_a_mixed_layer_with_differential_heads_decodes_exactly():
    torch.manual_seed(0)
    layer = DiffusionAttention(24, 6, "attention:2,laplacian:2,differential:2", causal=True,
                               num_kv_heads=3).double()
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    # depth 3 through a layer state, as the layer would see it as a model's fourth layer
    expected = _reference_mixed(layer, x, depth=3)
    torch.testing.assert_close(layer(x, state=LayerState(depth=3)), expected, rtol=0, atol=1e-12)
    got, cache = _decode(layer, x, [3, 1, 2, 1], state_for=lambda T: LayerState(depth=3))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    # the depth is read: at depth 0 (no state) the differential heads differ
    assert not torch.allclose(_decode(layer, x, [3, 1, 2, 1])[0], expected, atol=1e-6)
    assert tuple(cache.inputs.shape) == (2, 7, 24) and tuple(cache.queries.shape) == (2, 6, 7, 4)
    assert cache.positions is None  # no rotary embedding


@pytest.mark.parametrize("name", ["neutreno", "value-residual"])
def test_first_layer_values_from_the_state_in_a_cached_layer(name):
    torch.manual_seed(1)
    layer = DiffusionAttention(16, 4, f"{name}:2,attention:2", causal=True).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    v0 = torch.randn(2, 4, 6, 4, dtype=torch.float64)  # a first layer's values of all 6 tokens
    full = layer(x, state=LayerState(first_values=v0, depth=1))
    # at each step the state holds the first layer's values of the T tokens so far
    got, _ = _decode(layer, x, [2, 1, 1, 2], state_for=lambda T: LayerState(first_values=v0[:, :, :T], depth=1))
    torch.testing.assert_close(got, full, rtol=0, atol=1e-12)
    # explicit reference of the context heads: their rows of the output before out_proj
    B, N, D = x.shape
    q, k, v = (t.transpose(1, 2) for t in layer._project(x))  # (B, H, N, C)
    mask = torch.ones(N, N, dtype=torch.bool).tril()
    ref = rival_reference(layer.operators[0], q[:, :2], k[:, :2], v[:, :2], allowed=mask, v0=v0[:, :2])
    P = torch.softmax((q[:, 2:] @ k[:, 2:].transpose(-1, -2) / 2.0).masked_fill(~mask, -math.inf), -1)
    heads = torch.cat([ref, P @ v[:, 2:]], dim=1)  # (B, H, N, C)
    torch.testing.assert_close(got, layer.out_proj(heads.transpose(1, 2).reshape(B, N, D)), rtol=0, atol=1e-12)


def _gpt(heads, **kw) -> DiffusionGPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=13, block_size=10, n_layer=len(heads), n_head=4, n_embd=16, heads=heads, **kw)
    return DiffusionGPT(cfg).double().eval()


def _cached_logits(model: DiffusionGPT, idx: torch.Tensor, prompt: int) -> torch.Tensor:
    cache = model.new_cache()
    rows = [model.forward_cached(idx[:, :prompt], cache)]
    rows += [model.forward_cached(idx[:, i : i + 1], cache) for i in range(prompt, idx.shape[1])]
    return torch.cat(rows, dim=1)


@pytest.mark.parametrize("variant", [{}, {"rope": True, "n_kv_head": 2}, {"n_kv_head": 1, "qk_norm": True}])
def test_neutreno_and_value_residual_in_a_two_layer_gpt(variant):
    model = _gpt(["attention:2,laplacian:2", "neutreno:2,value-residual:2"], **variant)
    idx = torch.randint(0, 13, (3, 9), generator=torch.Generator().manual_seed(3))
    full = model(idx)[0]
    torch.testing.assert_close(_cached_logits(model, idx, 3), full, rtol=0, atol=1e-12)
    # the second layer reads the first layer's values: without them (lam = 0) the logits change
    for op in model.blocks[1].attn.operators:
        op.lam = 0.0
    assert not torch.allclose(model(idx)[0], full, atol=1e-6)
    torch.testing.assert_close(_cached_logits(model, idx, 3), model(idx)[0], rtol=0, atol=1e-12)


def test_every_rival_in_one_gpt_generates_the_uncached_tokens():
    model = _gpt(["differential:1,neutreno:1,attention:2", "value-residual:1,attnscale:1,grand-nl:1,laplacian:1",
                  "neutreno:2,differential:2"], rope=True, n_kv_head=2)
    idx = torch.randint(0, 13, (2, 10), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(_cached_logits(model, idx, 4), model(idx)[0], rtol=0, atol=1e-12)
    prompt = idx[:, :3]
    # 3 + 11 tokens > block_size 10: the window slides and the cache is rebuilt
    cached = model.generate(prompt, 11, temperature=0, use_cache=True)
    assert torch.equal(cached, model.generate(prompt, 11, temperature=0))


def test_context_layers_keep_their_inputs_and_positions():
    torch.manual_seed(2)
    rotary = RotaryEmbedding(4, base=50.0)
    layer = DiffusionAttention(16, 4, "grand-nl(t=1.0, steps=2, method='rk4'):2,heat(steps=2):2", causal=True,
                               qk_norm=True, rotary=rotary).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    positions = torch.arange(6) * 3 + 5  # GRAND-nl re-applies the q/k norm and rotation at these positions
    got, cache = _decode(layer, x, [2, 3, 1], positions=positions)
    torch.testing.assert_close(got, layer(x, positions=positions), rtol=0, atol=1e-12)
    assert not torch.allclose(got, layer(x), atol=1e-6)  # the positions matter
    torch.testing.assert_close(cache.inputs, x, rtol=0, atol=0)
    assert torch.equal(cache.positions, positions)
    plain = LayerKVCache()  # a layer without context operators keeps neither
    attend_cached(DiffusionAttention(16, 4, "heat-exact:2,attention:2", causal=True, rotary=rotary).double(), x, plain)
    assert plain.inputs is None and plain.positions is None and plain.queries is not None


def test_attend_cached_rejects_a_state_of_the_wrong_type():
    layer = DiffusionAttention(8, 2, "neutreno:1,attention:1", causal=True)
    with pytest.raises(TypeError, match="state: expected a LayerState or None, got dict"):
        attend_cached(layer, torch.randn(1, 2, 8), LayerKVCache(), state={})


def test_the_layer_state_is_built_only_for_models_with_context_operators(monkeypatch):
    entered = []
    original = LayerState.enter
    monkeypatch.setattr(LayerState, "enter", lambda self, v: entered.append(v.shape) or original(self, v))
    idx = torch.randint(0, 13, (2, 5), generator=torch.Generator().manual_seed(5))
    plain = _gpt(["attention:2,heat(steps=2):2", "laplacian:2,heat-exact:2"], n_kv_head=2)
    plain.forward_cached(idx, plain.new_cache())
    assert entered == []  # the incremental path copies no values for a state nobody reads
    rival = _gpt(["attention:2,heat(steps=2):2", "laplacian:2,neutreno:2"], n_kv_head=2)
    rival.forward_cached(idx, rival.new_cache())
    # every layer enters (depth); the first with its values of all tokens, repeated over query groups
    assert entered == [(2, 4, 5, 4), (2, 2, 5, 4)]


@pytest.mark.parametrize(("replacement", "says"), [
    ("ppr(alpha=0.2, steps=3)", "1 powers of P for degree K=3"),            # a higher degree: a short power read
    ("heat(t=0.5, steps=2)", "1 powers of P for degree K=2"),               # K up by exactly one: silently wrong
    ("heat-exact(t=0.5)", "no queries for the matrix heads"),              # a matrix head added
])
def test_bug_a_cache_filled_for_other_operators_is_refused(replacement, says):
    """Bug: with a layer's operators replaced during cached decoding, ``attend_cached`` read the stale
    cache: a degree up by one stored a short ``P^K v`` and the next step was silently wrong, a higher
    degree failed with a shape mismatch, a matrix head added found no cached queries. It now names
    what the cache lacks; a new cache decodes the new operators exactly (checked against the
    uncached layer on the whole sequence)."""
    from diffusionformer.operators import build_operator

    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, causal=True, heads="attention:1,laplacian:1").double().eval()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    cache = LayerKVCache()
    attend_cached(layer, x[:, :3], cache)
    layer.operators[1] = build_operator(replacement, num_heads=1).double()
    with pytest.raises(ValueError, match=rf"filled for other operators[\s\S]*{says}[\s\S]*new LayerKVCache"):
        attend_cached(layer, x[:, 3:4], cache)
    fresh = LayerKVCache()
    got = torch.cat([attend_cached(layer, x[:, :3], fresh), attend_cached(layer, x[:, 3:4], fresh),
                     attend_cached(layer, x[:, 4:], fresh)], dim=1)
    assert torch.allclose(got, layer(x), atol=1e-12, rtol=0)
