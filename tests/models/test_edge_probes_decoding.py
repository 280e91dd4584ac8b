"""Edge probes of autoregressive decoding: the KV cache against the full causal forward for every
operator (RoPE, GQA, q/k norm, prompts of one token, a cache filled to block_size), RoPE against the
complex-number formula, and generate's handling of modes, logits and arguments."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.models.sampling import top_k_filter, top_p_filter
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.nn.rotary import RotaryEmbedding
from diffusionformer.operators import list_operators

_VARIANTS = [{}, {"rope": True, "n_kv_head": 2}, {"n_kv_head": 1, "qk_norm": True},
             {"bias": False, "norm": "rmsnorm", "rope": True, "n_kv_head": 1}]


def _gpt(heads: str = "attention:1,laplacian:1", *, perturb: bool = False, **kw) -> DiffusionGPT:
    torch.manual_seed(0)
    kw = {"vocab_size": 13, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16, "heads": heads, **kw}
    model = DiffusionGPT(GPTConfig(**kw)).double().eval()
    if perturb:  # learned operator parameters away from their initial values
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "operators" in name:
                    p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("name", list_operators())
def test_cached_logits_equal_the_full_forward_for_every_operator_and_variant(name):
    idx = torch.randint(0, 13, (3, 8), generator=torch.Generator().manual_seed(2))  # 3 different sequences
    for variant in _VARIANTS:
        model = _gpt(f"attention:1,{name}:2,laplacian:1", perturb=True, n_head=4, n_embd=32, **variant)
        full = model(idx)[0]
        for prompt in (1, 3):  # a prompt of one token; then one token a step up to block_size
            cache = model.new_cache()
            rows = [model.forward_cached(idx[:, :prompt], cache)]
            rows += [model.forward_cached(idx[:, i : i + 1], cache) for i in range(prompt, 8)]
            torch.testing.assert_close(torch.cat(rows, dim=1), full, rtol=0, atol=1e-10, msg=f"{variant} {prompt}")
            assert [c.length for c in cache] == [8, 8]
            with pytest.raises(ValueError, match="block_size=8, got 8 \\+ 1"):  # full: refused, not wrapped
                model.forward_cached(idx[:, :1], cache)


def test_rope_equals_the_complex_number_formula_with_offsets():
    C, base = 8, 500.0
    x = torch.randn(2, 5, 3, C, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([0, 7, 123456, -3, 2**40])
    z = torch.view_as_complex(x.unflatten(-1, (C // 2, 2)).contiguous())
    theta = base ** (-2 * torch.arange(C // 2, dtype=torch.float64) / C)
    rot = torch.polar(torch.ones(5, C // 2, dtype=torch.float64), pos.double()[:, None] * theta)
    ref = torch.view_as_real(z * rot[None, :, None]).flatten(-2)
    torch.testing.assert_close(RotaryEmbedding(C, base)(x, pos), ref, rtol=0, atol=1e-12)


def test_cached_layer_with_rope_offsets_and_gqa_equals_its_full_forward():
    layer = DiffusionAttention(16, 4, "attention:2,heat:2", causal=True, num_kv_heads=2, rotary=RotaryEmbedding(4))
    layer = layer.double()
    x = torch.randn(2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(100, 106)
    full = layer(x, positions=pos)
    cache = LayerKVCache()
    rows = [attend_cached(layer, x[:, :2], cache, pos[:2])]
    rows += [attend_cached(layer, x[:, i : i + 1], cache, pos[i : i + 1]) for i in range(2, 6)]
    torch.testing.assert_close(torch.cat(rows, dim=1), full, rtol=0, atol=1e-12)


def test_generate_arguments_and_outputs():
    model = _gpt()
    prompt = torch.randint(0, 13, (2, 3), generator=torch.Generator().manual_seed(0))
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            model.generate(prompt, 2, temperature=bad)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(prompt, 2, top_k=0)
    for bad in (0.0, 1.0000001, float("nan")):
        with pytest.raises(ValueError, match="top_p"):
            model.generate(prompt, 2, top_p=bad)
    for bad_prompt in (torch.tensor([[13]]), torch.tensor([[-1]]), torch.zeros(2, 0, dtype=torch.long),
                       torch.zeros(3, dtype=torch.long), prompt.to(torch.int16)):
        with pytest.raises(ValueError, match="idx"):
            model.generate(bad_prompt, 2)
    assert model.generate(prompt, 3, top_k=100).shape == (2, 6)  # k > vocab: every token
    assert model.generate(prompt.int(), 2, use_cache=True).dtype == torch.int32
    model.requires_grad_(True)
    out = model.generate(prompt, 2)
    assert not out.requires_grad and out.grad_fn is None
    a = model.generate(prompt, 12, generator=torch.Generator().manual_seed(3), use_cache=True)  # slides past block_size
    b = model.generate(prompt, 12, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_sampling_filters_match_explicit_references():
    logits = torch.tensor([[0.5, 0.3, 0.2, 0.0]], dtype=torch.float64).log()
    assert torch.equal(top_k_filter(logits, 10), logits)
    assert top_p_filter(logits, 0.5).isfinite().tolist() == [[True, False, False, False]]
    assert top_p_filter(logits, 0.5 + 1e-12).isfinite().tolist() == [[True, True, False, False]]
    assert torch.equal(top_p_filter(logits, 1.0), logits)


def test_bug_generate_restores_every_submodules_mode():
    """Bug: generate set the model to eval mode and then back with ``train(was_training)``, which put every
    submodule in the model's mode: a block kept in eval mode (frozen) in a training model came back in
    training mode."""
    model = _gpt(dropout=0.1)
    model.train()
    model.blocks[0].eval()
    model.generate(torch.tensor([[1, 2]]), 2, use_cache=True)
    assert model.training and model.blocks[1].training and model.blocks[1].attn.training
    assert not model.blocks[0].training and not model.blocks[0].attn.training
    model.eval()
    model.blocks[1].train()
    model.generate(torch.tensor([[1, 2]]), 1)
    assert not model.training and not model.blocks[0].training and model.blocks[1].training


def test_bug_forward_cached_refuses_a_cache_left_by_an_interrupted_call():
    """Bug: a forward_cached call stopped between layers (an error or KeyboardInterrupt in a later layer) left the
    first layers' caches one step ahead; the next call read its start from the first layer and gave the later
    layers' new tokens the wrong positions: wrong logits, silently."""
    model = _gpt()
    idx = torch.randint(0, 13, (2, 5), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache()
    model.forward_cached(idx[:, :3], cache)

    def stop(module, args):
        raise RuntimeError("stopped")

    handle = model.blocks[1].register_forward_pre_hook(stop)
    with pytest.raises(RuntimeError, match="stopped"):
        model.forward_cached(idx[:, 3:4], cache)
    handle.remove()
    with pytest.raises(ValueError, match=r"same number of tokens, got lengths \[4, 3\]"):
        model.forward_cached(idx[:, 4:5], cache)


@pytest.mark.parametrize("kwargs", [{"temperature": 0.0}, {}, {"top_k": 2}, {"top_p": 0.5}])
def test_bug_generate_names_infinite_logits(kwargs):
    """Bug: a model whose logits overflowed to +inf failed with torch.multinomial's bare "probability tensor
    contains either inf, nan" when sampling, with "top_k: logits must be finite" (a filter the caller never
    called) with top_k, with "top_p: ... got nan" with top_p (inf - inf when shifted), and greedy took the first
    +inf token silently. All now name the model's +inf logits and the step."""
    model = _gpt(tie_weights=False)
    with torch.no_grad():
        model.lm_head.weight[3] = math.inf
        model.lm_head.weight[3, 1:] = 0.0  # +inf * (a positive first feature) and nothing else
        model.norm.weight.fill_(1.0)
        model.norm.bias.zero_()
        model.norm.bias[0] = 100.0  # the first feature of every position is positive
    prompt = torch.tensor([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match=r"logits are \+inf at new token 0 of 2"):
        model.generate(prompt, 2, generator=torch.Generator().manual_seed(0), **kwargs)
