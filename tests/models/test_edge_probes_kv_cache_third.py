"""Edge probes of cached decoding, third round: per-layer mixed operators (context rivals behind plain layers,
matrix heads, GQA/MQA, RoPE) against the full float64 forward in chunks, generate with and without the cache
(top-k, top-p, prompts longer than block_size, int32 ids), explicit rotary offsets and empty calls on a filled
cache, the filters on 1-D and 3-D logits, and the refusal of a cache filled by a layer of other query heads."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.models.sampling import top_k_filter, top_p_filter
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.nn.rotary import RotaryEmbedding

_PER_LAYER = [{"heads": ["attention:4", "value-residual:2,neutreno:2"], "n_kv_head": 2, "rope": True},
              {"heads": ["heat-exact:2,attention:2", "differential:2,ppr-exact:2"], "n_kv_head": 1},
              {"heads": ["laplacian:4", "value-residual:4"], "n_kv_head": 1, "rope": True, "qk_norm": True},
              {"heads": {1: "value-residual:4"}, "recompute": True},
              {"heads": ["polynomial(steps=3):2,heat:2", "attnscale:2,neutreno:2"], "rope": True, "n_kv_head": 2}]


@pytest.mark.parametrize("kw", _PER_LAYER)
def test_cached_logits_with_other_operators_per_layer_equal_the_full_forward(kw):
    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=4, n_embd=32, **kw)).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "operators" in name:
                p.add_(0.3 * torch.randn_like(p))
        idx = torch.randint(0, 13, (3, 8), generator=torch.Generator().manual_seed(2))
        full = model(idx)[0]
        for chunks in ([1] * 8, [3, 2, 3]):
            cache, rows, s = model.new_cache(), [], 0
            for c in chunks:
                rows.append(model.forward_cached(idx[:, s : s + c], cache))
                s += c
            torch.testing.assert_close(torch.cat(rows, dim=1), full, rtol=0, atol=1e-10, msg=f"{kw} {chunks}")


def test_generate_with_the_cache_equals_without_across_block_size_with_filters():
    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=13, block_size=6, n_layer=2, n_head=2, n_embd=16, rope=True,
                                   heads="heat:1,value-residual:1")).double().eval()
    for prompt in (torch.randint(0, 13, (2, 3), generator=torch.Generator().manual_seed(1)),
                   torch.randint(0, 13, (2, 9), generator=torch.Generator().manual_seed(3)).int()):  # > block_size
        for kw in ({"temperature": 0.0}, {"top_k": 4, "top_p": 0.9}, {"temperature": 0.5, "top_k": 10**9}):
            out = [model.generate(prompt, 8, generator=torch.Generator().manual_seed(5), use_cache=u, **kw)
                   for u in (False, True)]
            assert out[0].dtype == prompt.dtype and out[0].shape == (2, prompt.shape[1] + 8)
            assert torch.equal(out[0], out[1]), kw
            assert torch.equal(out[0][:, : prompt.shape[1]], prompt)


def test_cached_layer_with_explicit_rotary_offsets_and_empty_calls():
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, "attention:1,laplacian:1", causal=True, rotary=RotaryEmbedding(8)).double().eval()
    x = torch.randn(1, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = layer(x, positions=torch.arange(10, 15))
        cache = LayerKVCache()
        assert attend_cached(layer, x[:, :0], cache).shape == (1, 0, 16) and cache.keys is None
        a = attend_cached(layer, x[:, :2], cache, positions=torch.arange(10, 12))
        assert attend_cached(layer, x[:, :0], cache).shape == (1, 0, 16) and cache.length == 2
        b = attend_cached(layer, x[:, 2:], cache, positions=torch.arange(12, 15))
    torch.testing.assert_close(torch.cat([a, b], dim=1), full, rtol=0, atol=1e-12)


def test_filters_on_one_and_three_dimensional_logits_equal_the_rows():
    x = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0))
    for f, arg in ((top_k_filter, 3), (top_p_filter, 0.6)):
        rows = torch.stack([f(r, arg) for r in x.flatten(0, 1)]).unflatten(0, (2, 3))
        assert torch.equal(f(x, arg), rows)
    assert top_k_filter(torch.zeros(2, 0), 3).shape == (2, 0)


def test_bug_attend_cached_refuses_a_cache_of_other_query_heads():
    """Bug: a cache filled by a layer with the same key/value heads and head dim but other query heads (or width)
    passed the check of its keys, then failed far inside with torch.cat's bare "Sizes of tensors must match"
    error (powers of P, queries, inputs hold one row per query head or the layer's width)."""
    torch.manual_seed(0)
    small = DiffusionAttention(8, 2, "heat:2", causal=True, num_kv_heads=2).double().eval()
    big = DiffusionAttention(16, 4, "heat:4", causal=True, num_kv_heads=2).double().eval()
    cache = LayerKVCache()
    with torch.no_grad():
        attend_cached(small, torch.randn(1, 2, 8, dtype=torch.float64), cache)
        with pytest.raises(ValueError, match=r"expected a cache of 4 query heads .*powers\[1\] of shape \(1, 2, 2, 4\)"):
            attend_cached(big, torch.randn(1, 1, 16, dtype=torch.float64), cache)
        assert cache.length == 2  # left as it was
        attend_cached(small, torch.randn(1, 1, 8, dtype=torch.float64), cache)  # its own layer goes on
        assert cache.length == 3
