"""Edge-case probes: KV-cached decoding and operators' default ``apply_matrix`` in real float16 / bfloat16.

Probed: :func:`~diffusionformer.nn.kv_cache.attend_cached` (prefill, then single steps and chunks, explicit rotary
positions, ``qk_norm``, grouped keys/values) against the uncached causal layer, both against the same (rounded) layer
in float64, for every registered operator (polynomial heads, matrix heads, rivals); the default
:meth:`~diffusionformer.operators.DiffusionOperator.apply_matrix` of polynomial operators on
:func:`~diffusionformer.ops.dense.attention_matrix`'s ``P`` against float64; ``generate`` of a half model with
temperature / top-k / top-p against a float64 sampler on the model's own logits.

Two bugs (``test_bug_*``): the cached decoding step computed scores, ``P``, the powers and their sum in the half
dtype (the layer computes them in float32 and casts once), and the default ``apply_matrix`` rounded the
coefficients, ``P`` and every power to the half dtype.
"""

from __future__ import annotations

import copy

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.nn.rotary import RotaryEmbedding
from diffusionformer.operators import build_operator, list_operators
from diffusionformer.operators.registry import operator_class
from diffusionformer.ops.dense import attention_matrix

HALF = [torch.float16, torch.bfloat16]


def _spec(name: str) -> str:
    kw = operator_class(name).example_kwargs
    return name if not kw else name + "(" + ", ".join(f"{k}={v!r}" for k, v in kw.items()) + ")"


def _errors(spec: str, dt: torch.dtype, N: int = 40, chunks: tuple[int, ...] = (5, 1, 3, 1, 1, 4)):
    """Relative max errors against the float64 layer of (the half layer, the half cache decoding the same tokens).

    The output projection is the identity, so the outputs are the heads' outputs rounded once; queries and keys are
    scaled up (a sharp softmax). The cache takes a prefill and then ``chunks`` cyclically, at explicit positions."""
    torch.manual_seed(0)
    layer = DiffusionAttention(32, 4, heads=spec, causal=True, num_kv_heads=2, qk_norm=True,
                               rotary=RotaryEmbedding(8)).eval()
    with torch.no_grad():
        # projections exact in either dtype and any summation order (quarters times small integers, sums below
        # 64): CPU half matmuls of one row and of many round differently, which would blur what is compared here
        layer.qkv.weight.copy_(torch.randint(-2, 3, layer.qkv.weight.shape) / 4)
        layer.qkv.bias.zero_()
        layer.out_proj.weight.copy_(torch.eye(32))
        layer.out_proj.bias.zero_()
        layer.q_norm.weight.fill_(2.5)
        layer.k_norm.weight.fill_(2.5)
    half = copy.deepcopy(layer).to(dt)
    ref = copy.deepcopy(half).double()  # the same rounded weights
    x = torch.randint(-3, 4, (2, N, 32)).to(dt)
    pos = torch.arange(N) + 7
    with torch.no_grad():
        want = ref(x.double(), positions=pos)
        full = half(x, positions=pos)
        cache, parts, t, i = LayerKVCache(), [], 0, 0
        while t < N:
            n = min(chunks[i % len(chunks)], N - t)
            parts.append(attend_cached(half, x[:, t : t + n], cache, positions=pos[t : t + n]))
            t, i = t + n, i + 1
        got = torch.cat(parts, 1)
    assert full.dtype == got.dtype == dt and cache.keys.dtype == dt and all(p.dtype == dt for p in cache.powers)
    scale = want.abs().max()
    return float((full.double() - want).abs().max() / scale), float((got.double() - want).abs().max() / scale)


@pytest.mark.parametrize("spec, dt", [("ppr-exact(alpha=0.01)", torch.float16), ("ppr-exact(alpha=0.01)", torch.bfloat16),
                                      ("heat-exact(t=8.0)", torch.bfloat16)])
def test_bug_kv_cache_half_matrix_heads_are_as_accurate_as_the_layer(spec, dt):
    """Bug: a half cache decoding an exact head built ``P`` in the half dtype (scores and softmax too) and handed it
    to the operator, whose condition (``1/alpha`` for the PPR solve) amplified ``P``'s rounding: 2.5-6x the layer's
    own error against float64 (the layer hands the exact operators ``P`` in float32)."""
    e_layer, e_cache = _errors(spec, dt)
    assert e_cache <= 1.1 * e_layer, (e_layer, e_cache)


@pytest.mark.parametrize("spec, dt", [
    ("heat(t=0.7, steps=4, learnable=True)", torch.float16), ("heat(t=2.0, steps=8)", torch.float16),
    ("heat(t=2.0, steps=8)", torch.bfloat16), ("heat(t=8.0, steps=24)", torch.bfloat16),
    ("ppr(alpha=0.2, steps=4)", torch.bfloat16), ("ppr(alpha=0.05, steps=16)", torch.bfloat16),
    ("polynomial(steps=3, init=[0.1, 0.6, 0.2, 0.1])", torch.float16),
])
def test_bug_kv_cache_half_polynomial_heads_are_as_accurate_as_the_layer(spec, dt):
    """Bug: the cached step rounded the coefficients to the half dtype and summed ``c_k P^k v`` in it (``P`` too),
    where the layer sums in float32 and casts once: the cached outputs were 1.4-2.5x further from float64 than the
    uncached forward of the same half layer."""
    e_layer, e_cache = _errors(spec, dt)
    assert e_cache <= 1.1 * e_layer, (e_layer, e_cache)


@pytest.mark.parametrize("dt", HALF)
@pytest.mark.parametrize("name", list_operators())
def test_pins_kv_cache_half_is_as_accurate_as_the_layer_for_every_operator(name, dt):
    """Every registered operator: the half cache (prefill, steps and chunks, positions, qk_norm, GQA) stays within
    the uncached half layer's own error of the float64 layer, and that error is the dtype's."""
    op = operator_class(name)
    if not op.supports_kv_cache:  # pragma: no cover - every built-in operator supports it today
        pytest.skip("no KV cache")
    e_layer, e_cache = _errors(_spec(name), dt)
    assert e_layer <= 16 * torch.finfo(dt).eps  # the dtype's rounding of q, k, v (sharp softmax, differences of maps)
    assert e_cache <= 1.25 * e_layer + torch.finfo(dt).eps / 4, (e_layer, e_cache)


@pytest.mark.parametrize("dt", HALF)
@pytest.mark.parametrize("spec", ["heat(t=8.0, steps=24)", "heat(t=0.7, steps=4)", "ppr(alpha=0.05, steps=16)",
                                  "heat(t=2.0, steps=8, learnable=True)"])
def test_bug_default_apply_matrix_in_half_rounds_once(spec, dt):
    """Bug: the default ``apply_matrix`` (polynomial operators) cast the coefficients and ``P`` to the half dtype
    and ran every power in it: 2-7x the rounding of the float64 result (heat with ``t = 8``: its coefficients
    ``e^-t t^k / k!`` rounded to bfloat16), while the layer and the exact operators compute in float32 and round
    once. Reference: the same (rounded) operator, ``P`` and ``v`` in float64."""
    torch.manual_seed(0)
    B, G, N, C = 2, 2, 32, 8
    q, k, v = (torch.randn(B, G, N, C) * s for s in (2.0, 2.0, 1.0))
    P = attention_matrix(q.to(dt), k.to(dt))  # the public route: P in the input dtype
    vh = v.to(dt)
    op = build_operator(spec, num_heads=G).to(dt)
    want = copy.deepcopy(op).double().apply_matrix(P.double(), vh.double())
    got = op.apply_matrix(P, vh)
    assert got.dtype == dt
    rounding = (want.to(dt).double() - want).abs().max()
    assert (got.double() - want).abs().max() <= 1.25 * rounding
    # the causal hook (default: apply_matrix) on a causal P, and the gradient flows in v's dtype
    Pc = attention_matrix(q.to(dt), k.to(dt), is_causal=True)
    wc = copy.deepcopy(op).double().apply_causal_matrix(Pc.double(), vh.double())
    vg = vh.clone().requires_grad_(True)
    gc = op.apply_causal_matrix(Pc, vg)
    assert (gc.double() - wc).abs().max() <= 1.25 * (wc.to(dt).double() - wc).abs().max()
    gc.float().sum().backward()
    assert vg.grad.dtype == dt and torch.isfinite(vg.grad).all()


def _reference_generate(model, idx, n, temperature, top_k, top_p, generator, use_cache):
    """nanoGPT's sampling loop on the model's own (half) logits, processed in float64 (top-k, temperature, nucleus,
    softmax); the probabilities are drawn in float32 (``torch.multinomial`` draws per dtype)."""
    cache = model.new_cache() if use_cache else None
    for i in range(n):
        with torch.no_grad():
            if use_cache:
                logits = model.forward_cached(idx if i == 0 else idx[:, -1:], cache)[:, -1]
            else:
                logits = model(idx)[0][:, -1]
        z = logits.double()
        if top_k is not None:
            kth = z.topk(top_k).values[:, -1:]
            z = z.masked_fill(z < kth, float("-inf"))
        probs = torch.softmax(z / temperature, dim=-1)
        if top_p is not None:
            srt, order = probs.sort(dim=-1, descending=True)
            before = srt.cumsum(-1) - srt
            keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < top_p)
            probs = torch.where(keep, probs, 0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        idx = torch.cat([idx, torch.multinomial(probs.float(), 1, generator=generator)], 1)
    return idx


@pytest.mark.parametrize("use_cache", [False, True])
@pytest.mark.parametrize("dt", HALF)
@pytest.mark.parametrize("temperature, top_k, top_p", [(0.7, None, None), (1.3, 5, None), (0.9, None, 0.8),
                                                       (2.0, 7, 0.6)])
def test_pins_half_generate_samples_as_a_float64_sampler_on_its_logits(temperature, top_k, top_p, dt, use_cache):
    """A half GPT (polynomial, exact and rival heads, RoPE, GQA) samples, with or without the cache, the tokens that a
    float64 sampler draws from the same model's logits with the same generator: the logits are filtered, scaled and
    normalised in float32 at least, never in the half dtype."""
    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=37, block_size=24, n_layer=2, n_head=4, n_embd=32, rope=True,
                                   n_kv_head=2, heads="heat(t=2.0, steps=6):1,ppr-exact(alpha=0.05):1,"
                                                      "neutreno(lam=0.6):1,attention:1")).to(dt).eval()
    prompt = torch.randint(0, 37, (3, 4))
    got = model.generate(prompt, 14, temperature, top_k, torch.Generator().manual_seed(3), top_p=top_p,
                         use_cache=use_cache)
    want = _reference_generate(model, prompt, 14, temperature, top_k, top_p, torch.Generator().manual_seed(3),
                               use_cache)
    assert torch.equal(got, want)
