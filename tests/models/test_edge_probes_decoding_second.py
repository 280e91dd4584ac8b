"""Edge probes of incremental decoding, second round: the KV cache against the full causal forward with prefills
and chunks of several tokens (operator options, GQA/MQA, q/k norm, two RoPE bases), generate against nanoGPT's
own sampling loop (crop to ``block_size``, temperature, top_k), RoPE in half precision against a float64
reference, and the refusals of a shared layer cache and of logits that leave no token to choose."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.nn.rotary import RotaryEmbedding

_SPECS = ["heat(t=2.0, steps=5, method='euler', learnable=True):2,ppr(alpha=0.3, steps=4, learnable=True):2",
          "polynomial(steps=4, basis='chebyshev'):2,laplacian:2", "heat-exact:2,ppr-exact:2",
          "grand-nl(method='rk4', steps=3):2,attention:2", "differential:2,neutreno:1,value-residual:1",
          "attnscale:2,heat(t=-0.5):2"]


@pytest.mark.parametrize("spec", _SPECS)
def test_chunked_prefill_and_steps_equal_the_full_forward(spec):
    x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for kv, base, qk in ((4, None, False), (2, 10000.0, True), (1, 37.5, False)):
        torch.manual_seed(0)
        layer = DiffusionAttention(32, 4, spec, causal=True, num_kv_heads=kv, qk_norm=qk,
                                   rotary=None if base is None else RotaryEmbedding(8, base)).double().eval()
        with torch.no_grad():
            for name, p in layer.named_parameters():
                if "operators" in name:  # learned operator parameters away from their initial values
                    p.add_(0.2 * torch.randn_like(p))
            full = layer(x)
            for chunks in ([4, 1, 1, 1, 1, 1], [3, 2, 4], [9]):
                cache, rows, s = LayerKVCache(), [], 0
                for c in chunks:
                    rows.append(attend_cached(layer, x[:, s : s + c], cache))
                    s += c
                torch.testing.assert_close(torch.cat(rows, dim=1), full, rtol=0, atol=1e-10,
                                           msg=f"{spec} kv={kv} base={base} {chunks}")


def _nanogpt_generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    """nanoGPT's ``GPT.generate`` (model.py, MIT), with a generator for multinomial."""
    for _ in range(max_new_tokens):
        bs = model.config.block_size
        idx_cond = idx if idx.size(1) <= bs else idx[:, -bs:]
        logits = model(idx_cond)[0][:, -1, :] / temperature
        if top_k is not None:
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[:, [-1]]] = -float("inf")
        probs = F.softmax(logits, dim=-1)
        idx = torch.cat((idx, torch.multinomial(probs, num_samples=1, generator=generator)), dim=1)
    return idx


@pytest.mark.parametrize("kw", [{}, {"rope": True, "rope_base": 100.0, "n_kv_head": 1},
                                {"heads": "heat:1,ppr-exact:1"}, {"heads": "differential:1,value-residual:1"}])
def test_generate_equals_nanogpts_loop_across_block_size(kw):
    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=16, **kw)).double().eval()
    prompt = torch.randint(0, 11, (3, 4), generator=torch.Generator().manual_seed(1))
    long_prompt = torch.randint(0, 11, (2, 15), generator=torch.Generator().manual_seed(2))  # longer than block_size
    for p, n, temperature, top_k in ((prompt, 10, 1.0, None), (prompt, 10, 0.7, 3), (prompt, 4, 2.0, 100),
                                     (long_prompt, 3, 1.0, 11)):
        with torch.no_grad():
            ref = _nanogpt_generate(model, p, n, temperature, top_k, torch.Generator().manual_seed(5))
        for use_cache in (False, True):
            out = model.generate(p, n, temperature, top_k, torch.Generator().manual_seed(5), use_cache=use_cache)
            assert torch.equal(out, ref), (temperature, top_k, use_cache)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rope_in_half_precision_rounds_once_against_a_float64_reference(dtype):
    C = 16
    x = torch.randn(2, 7, 3, C, generator=torch.Generator().manual_seed(0)).to(dtype)
    pos = torch.tensor([0, 1, 5, 1000, 65504, 2**20, -7])
    for base in (10000.0, 1.5):
        z = torch.view_as_complex(x.double().unflatten(-1, (C // 2, 2)).contiguous())
        theta = base ** (-2 * torch.arange(C // 2, dtype=torch.float64) / C)
        rot = torch.polar(torch.ones(7, C // 2, dtype=torch.float64), pos.double()[:, None] * theta)
        ref = torch.view_as_real(z * rot[:, None]).flatten(-2)
        out = RotaryEmbedding(C, base)(x, pos)
        assert out.dtype == dtype
        eps = torch.finfo(dtype).eps
        assert (out.double() - ref).abs().max() <= 2 * eps * ref.abs().max()  # a few roundings of x's dtype


def test_bug_forward_cached_refuses_one_cache_shared_by_several_blocks():
    """Bug: ``forward_cached`` took ``[LayerKVCache()] * n_layer`` (one object in every slot): the second block read
    the first block's keys and powers as its own past tokens (and placed its new tokens after them), and the logits
    were wrong silently."""
    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, rope=True)).double()
    model.eval()
    idx = torch.randint(0, 11, (2, 3), generator=torch.Generator().manual_seed(0))
    shared = LayerKVCache()
    with pytest.raises(ValueError, match=r"same LayerKVCache object for several blocks.*new_cache\(\)"):
        model.forward_cached(idx, [shared] * 2)
    assert shared.length == 0  # refused before any layer ran
    with torch.no_grad():
        torch.testing.assert_close(model.forward_cached(idx, model.new_cache()), model(idx)[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kwargs", [{"temperature": 0.0}, {}, {"top_k": 2}, {"top_p": 0.5}])
@pytest.mark.parametrize("use_cache", [False, True])
def test_bug_generate_names_logits_of_minus_inf_for_every_token(kwargs, use_cache):
    """Bug: when the model's logits were -inf for every token, greedy decoding appended token 0 silently, sampling
    failed in torch.multinomial's bare "probability tensor contains either inf, nan" (-inf - -inf = NaN when
    shifted), and top_p named a NaN it never received. All now name the model's logits and the step."""
    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=16, tie_weights=False))
    model.eval()
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, 0] = -math.inf  # -inf * (a positive first feature) for every token
        model.norm.weight.fill_(1.0)
        model.norm.bias.zero_()
        model.norm.bias[0] = 100.0
    prompt = torch.tensor([[1, 2], [3, 4]])
    assert model(prompt)[0][:, -1].isneginf().all()
    with pytest.raises(ValueError, match=r"logits are -inf for every token at new token 0 of 2"):
        model.generate(prompt, 2, generator=torch.Generator().manual_seed(0), use_cache=use_cache, **kwargs)


def test_generate_still_samples_when_some_logits_are_minus_inf():
    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=16, tie_weights=False))
    model.eval()
    with torch.no_grad():
        model.lm_head.weight[1:, 0] = -math.inf  # every token but 0 removed
        model.norm.weight.fill_(1.0)
        model.norm.bias.zero_()
        model.norm.bias[0] = 100.0
    out = model.generate(torch.tensor([[1, 2]]), 3, generator=torch.Generator().manual_seed(0))
    assert out[0, 2:].tolist() == [0, 0, 0]
