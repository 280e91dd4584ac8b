"""Edge probes of cached decoding with the K-step and rival operators: GQA layouts whose operator groups cross the
key/value groups, operator options (Euler heat, Chebyshev polynomials, learned PPR, RK4 GRAND-nl) filled in chunks of
5, 1 and 3 tokens against the full float64 forward, the cache's dtype under bf16, generate's determinism per seed, and
the refusal of an operator without cache support placed behind a servable layer."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.operators.registry import operator_class

_LAYOUTS = [
    # n_head=6 over 3 or 2 key/value groups: the operator groups straddle the kv groups
    {"n_head": 6, "n_kv_head": 3, "rope": True,
     "heads": ["heat(method='euler',steps=5):1,neutreno:3,ppr(learnable=True,steps=3):2",
               "differential:2,polynomial(steps=4,basis='chebyshev'):3,heat-exact:1"]},
    {"n_head": 6, "n_kv_head": 2, "qk_norm": True, "norm": "rmsnorm",
     "heads": ["attnscale:1,ppr-exact:2,grand-nl(method='rk4',steps=3):3",
               "value-residual:5,heat(learnable=True,t=0.7):1"]},
    {"n_head": 4, "n_kv_head": 1, "rope": True,
     "heads": ["polynomial(steps=3,init=[0.5,0.5]):3,attnscale(omega=0.5,learnable=False):1",
               "ppr(alpha=0.3,steps=4):1,differential(depth=3):2,neutreno(lam=0.3):1"]},
]


def _model(kw: dict, seed: int = 0) -> DiffusionGPT:
    torch.manual_seed(seed)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=10, n_layer=2, n_embd=4 * kw["n_head"], **kw))
    model = model.double().eval()
    with torch.no_grad():  # learned operator parameters away from their initial values
        for name, p in model.named_parameters():
            if "operators" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("kw", _LAYOUTS)
def test_pins_cached_rivals_in_chunks_of_five_one_three_equal_the_full_forward(kw):
    model = _model(kw)
    idx = torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)[0]
        cache, rows, s = model.new_cache(), [], 0
        for c in (5, 1, 3):
            rows.append(model.forward_cached(idx[:, s : s + c], cache))
            s += c
        assert [c.length for c in cache] == [9, 9]
        with pytest.raises(ValueError, match="block_size=10, got 9 \\+ 2"):
            model.forward_cached(idx[:, :2], cache)
        assert [c.length for c in cache] == [9, 9]  # the refused call left the cache as it was
    torch.testing.assert_close(torch.cat(rows, dim=1), full, rtol=0, atol=1e-10)


def test_pins_bf16_model_keeps_a_bf16_cache_close_to_the_float64_forward():
    model = _model(_LAYOUTS[0])
    idx = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(idx)[0]
        model.to(torch.bfloat16)
        cache, rows, s = model.new_cache(), [], 0
        for c in (5, 1, 3):
            rows.append(model.forward_cached(idx[:, s : s + c], cache))
            s += c
    out = torch.cat(rows, dim=1)
    assert out.dtype == torch.bfloat16
    for layer in cache:
        held = [layer.keys, *layer.powers] + [t for t in (layer.queries, layer.inputs) if t is not None]
        assert all(t.dtype == torch.bfloat16 for t in held)
    assert (out.double() - ref).abs().max() < 0.05 * ref.abs().max()


def test_pins_generate_with_the_cache_is_deterministic_per_seed_and_equals_uncached():
    model = _model(_LAYOUTS[1])
    prompt = torch.randint(0, 11, (2, 4), generator=torch.Generator().manual_seed(2))
    runs = [model.generate(prompt, 9, top_k=5, generator=torch.Generator().manual_seed(s), use_cache=u)
            for s, u in ((7, True), (7, True), (7, False))]  # 4 + 9 > block_size: the window slides
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    assert torch.equal(runs[0][:, :4], prompt)


@pytest.mark.parametrize("base", ["heat", "ppr-exact", "neutreno"])
def test_pins_generate_refuses_an_operator_without_cache_support_behind_a_servable_layer(base):
    class _NoCache(operator_class(base)):
        supports_kv_cache = False

    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16,
                                   heads=f"{base}:1,attention:1")).eval()
    op = _NoCache(num_heads=1)
    op.bind(head_dim=8)
    model.blocks[1].attn.operators[0] = op
    prompt = torch.randint(0, 11, (1, 3), generator=torch.Generator().manual_seed(0))
    model.train()
    # named by its class: the parent's name alone named an operator that does support a cache (review 53g)
    with pytest.raises(ValueError, match=rf"operator \S*_NoCache \(a subclass of '{base}'\) does not support a KV "
                                         r"cache.*use_cache=False"):
        model.generate(prompt, 2, use_cache=True)
    assert all(m.training for m in model.modules())  # the refused call restored the training mode
    model.eval()
    assert model.generate(prompt, 2).shape == (1, 5)


def test_pins_cached_heat_and_ppr_heads_with_gqa_equal_explicit_float64_matrices():
    """Independent reference: P = softmax(q k^T / sqrt(C)) on the causal graph built by hand from the qkv weights
    (key/value head g serving query heads 2g, 2g+1), with heat's truncated Taylor weights exp(-t) t^k / k! and PPR's
    alpha (1-alpha)^k plus the remaining mass (1-alpha)^(K+1) on P^K, summed over explicit powers of P in float64."""
    from math import exp, factorial

    from diffusionformer.nn import DiffusionAttention, LayerKVCache, attend_cached

    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, "heat(t=1.5,steps=4):2,ppr(alpha=0.3,steps=3):2", causal=True,
                               num_kv_heads=2).double().eval()
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    heat_c = [exp(-1.5) * 1.5**k / factorial(k) for k in range(5)]
    ppr_c = [0.3 * 0.7**k for k in range(3)] + [0.7**3]
    torch.testing.assert_close(layer.operators[0].coefficients().flatten()[:5].tolist(), heat_c, rtol=0, atol=1e-14)
    torch.testing.assert_close(layer.operators[1].coefficients().flatten()[:4].tolist(), ppr_c, rtol=0, atol=1e-14)
    with torch.no_grad():
        W, b = layer.qkv.weight, layer.qkv.bias
        qkv = x @ W.T + b
        q, k, v = qkv[..., :16].unflatten(-1, (4, 4)), qkv[..., 16:24].unflatten(-1, (2, 4)), qkv[..., 24:].unflatten(-1, (2, 4))
        causal = torch.ones(9, 9, dtype=torch.bool).tril()
        heads = []
        for h in range(4):
            g = h // 2
            S = q[:, :, h] @ k[:, :, g].transpose(-1, -2) / 2.0
            P = torch.softmax(S.masked_fill(~causal, float("-inf")), dim=-1)
            coeffs = heat_c if h < 2 else ppr_c
            acc, Pk = torch.zeros_like(v[:, :, g]), v[:, :, g]
            for c in coeffs:
                acc = acc + c * Pk
                Pk = P @ Pk
            heads.append(acc)
        ref = layer.out_proj(torch.cat(heads, dim=-1))
        cache, rows, s = LayerKVCache(), [], 0
        for c in (5, 1, 3):
            rows.append(attend_cached(layer, x[:, s : s + c], cache))
            s += c
    torch.testing.assert_close(torch.cat(rows, dim=1), ref, rtol=0, atol=1e-10)
