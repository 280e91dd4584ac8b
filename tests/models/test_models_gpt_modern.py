"""GPT's modern parts: KV cache for every operator, RoPE, GQA/MQA, zero-init, nucleus sampling."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.models.sampling import top_p_filter
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.nn.rotary import RotaryEmbedding, RotaryEmbedding2D
from diffusionformer.ops.reference_rivals import rival_reference
from diffusionformer.operators import list_operators, operator_class
from diffusionformer.testing import reference_qkv

OPERATORS = list_operators()


def _gpt(heads: str, **kw) -> DiffusionGPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=13, block_size=10, n_layer=2, n_head=4, n_embd=16, heads=heads, **kw)
    return DiffusionGPT(cfg).double().eval()


@pytest.mark.parametrize("variant", [{}, {"rope": True, "n_kv_head": 2}, {"n_kv_head": 1}])
@pytest.mark.parametrize("name", OPERATORS)
def test_cached_greedy_generation_equals_uncached_for_every_operator(name, variant):
    model = _gpt(f"attention:2,{name}:2", **variant)
    prompt = torch.randint(0, 13, (3, 4), generator=torch.Generator().manual_seed(1))
    # 4 + 12 tokens > block_size 10: the window slides and the cache is rebuilt
    plain = model.generate(prompt, 12, temperature=0)
    cached = model.generate(prompt, 12, temperature=0, use_cache=True)
    assert torch.equal(plain, cached)


@pytest.mark.parametrize("name", OPERATORS)
def test_cached_logits_equal_the_full_forward_rows(name):
    model = _gpt(f"{name}:3,attention:1", rope=True)
    idx = torch.randint(0, 13, (2, 9), generator=torch.Generator().manual_seed(2))
    cache = model.new_cache()
    rows = [model.forward_cached(idx[:, :4], cache)]  # a prompt, then one token at a time
    rows += [model.forward_cached(idx[:, i : i + 1], cache) for i in range(4, 9)]
    torch.testing.assert_close(torch.cat(rows, dim=1), model(idx)[0], rtol=0, atol=1e-12)
    assert [c.length for c in cache] == [9, 9]
    with pytest.raises(ValueError, match="block_size=10, got 9 \\+ 2"):
        model.forward_cached(idx[:, :2], cache)


def test_the_cache_keeps_one_sequence_per_power_of_P():
    layer = DiffusionAttention(8, 2, "heat(steps=3):1,attention:1", causal=True, num_kv_heads=1).double()
    cache = LayerKVCache()
    attend_cached(layer, torch.randn(2, 5, 8, dtype=torch.float64), cache)
    assert [tuple(p.shape) for p in cache.powers] == [(2, 1, 5, 4)] + [(2, 2, 5, 4)] * 3
    assert tuple(cache.keys.shape) == (2, 1, 5, 4) and cache.queries is None
    with pytest.raises(ValueError, match="expected a causal layer"):
        attend_cached(DiffusionAttention(8, 2), torch.randn(1, 2, 8), LayerKVCache())


def _rotation_matrix(pos: float, C: int, base: float) -> torch.Tensor:
    """Block-diagonal rotation of RoFormer, built entry by entry in float64."""
    R = torch.zeros(C, C, dtype=torch.float64)
    for i in range(C // 2):
        angle = pos * base ** (-2 * i / C)
        c, s = math.cos(angle), math.sin(angle)
        R[2 * i, 2 * i], R[2 * i, 2 * i + 1], R[2 * i + 1, 2 * i], R[2 * i + 1, 2 * i + 1] = c, -s, s, c
    return R


def test_rope_equals_an_explicit_rotation_and_is_relative():
    C, base = 8, 10000.0
    rope = RotaryEmbedding(C, base)
    x = torch.randn(2, 5, 3, C, dtype=torch.float64)  # (B, N, H, C)
    positions = torch.tensor([0, 1, 4, 7, 100])
    ref = torch.stack([x[:, n] @ _rotation_matrix(float(p), C, base).T for n, p in enumerate(positions)], dim=1)
    torch.testing.assert_close(rope(x, positions), ref, rtol=0, atol=1e-12)
    q, k = torch.randn(C, dtype=torch.float64), torch.randn(C, dtype=torch.float64)
    rot = lambda v, p: rope(v[None, None], torch.tensor([p]))[0, 0]  # noqa: E731
    assert float(rot(q, 3) @ rot(k, 7)) == pytest.approx(float(q @ rot(k, 4)), abs=1e-12)


def test_rope_2d_rotates_halves_by_row_and_column():
    C = 8
    rope = RotaryEmbedding2D(C, base=100.0)
    x = torch.randn(4, 2, C, dtype=torch.float64)
    grid = torch.tensor([[0, 0], [0, 3], [2, 1], [5, 5]])
    for n, (r, c) in enumerate(grid.tolist()):
        R = torch.block_diag(_rotation_matrix(r, C // 2, 100.0), _rotation_matrix(c, C // 2, 100.0))
        torch.testing.assert_close(rope(x, grid)[n], x[n] @ R.T, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="expected explicit \\(N, 2\\) positions"):
        rope(x)


def _reference_layer(layer: DiffusionAttention, x: torch.Tensor, rotary: RotaryEmbedding | None) -> torch.Tensor:
    """Explicit float64 reference: projections by hand, rotation by matrices, GQA by repeating,
    causal softmax, then f(P) per head (explicit polynomial or the operator's matrix function)."""
    B, N, D = x.shape
    H, C = layer.num_heads, layer.head_dim
    q, k, v = reference_qkv(layer, x)  # (B, N, H, C), key/value heads repeated for GQA
    q_raw, k_raw = q, k

    def rotate(t: torch.Tensor) -> torch.Tensor:  # (B, N, h, C)
        if rotary is None:
            return t
        Rs = [_rotation_matrix(float(n), C, rotary.base) for n in range(N)]
        return torch.stack([t[:, n] @ Rs[n].T for n in range(N)], dim=1)

    q, k = rotate(q), rotate(k)
    out = torch.zeros(B, N, H, C, dtype=x.dtype)
    mask = torch.ones(N, N, dtype=torch.bool).tril()
    names = layer.head_operator_names
    coeffs = layer.coefficients()
    for h in range(H):
        S = q[:, :, h] @ k[:, :, h].transpose(1, 2) / math.sqrt(C)
        P = torch.softmax(S.masked_fill(~mask, float("-inf")), dim=-1)  # (B, N, N)
        op = [o for o, (s, c) in zip(layer.operators, layer._groups) if s <= h < s + c][0]
        if names[h] == "grand-nl":
            # the state X = [q_raw | k_raw | v] evolves; P(X) from the *rotated* q, k of the state
            X = torch.cat([q_raw[:, :, h], k_raw[:, :, h], v[:, :, h]], dim=-1)  # (B, N, 3C)

            def field(X: torch.Tensor) -> torch.Tensor:
                qq, kk = rotate(X[..., :C].unsqueeze(2))[:, :, 0], rotate(X[..., C : 2 * C].unsqueeze(2))[:, :, 0]
                Pt = torch.softmax((qq @ kk.transpose(1, 2) / math.sqrt(C)).masked_fill(~mask, float("-inf")), dim=-1)
                return Pt @ X - X

            tau = op.t / op.steps
            for _ in range(op.steps):
                assert op.method == "euler"
                X = X + tau * field(X)
            out[:, :, h] = X[..., 2 * C :]
            continue
        if op.uses_context or names[h] == "ppr-exact":  # the rivals' explicit float64 references
            hv = lambda t: t[:, :, h].unsqueeze(1)  # noqa: E731  (B, 1, N, C)
            out[:, :, h] = rival_reference(op, hv(q), hv(k), hv(v), allowed=mask)[:, 0]
            continue
        if names[h] == "heat-exact":
            fP = torch.linalg.matrix_exp(-op.t.double().reshape(-1)[0] * (torch.eye(N, dtype=x.dtype) - P))
        else:
            fP = sum(coeffs[h, j] * torch.linalg.matrix_power(P, j) for j in range(coeffs.shape[1]))
        out[:, :, h] = fP @ v[:, :, h]
    return layer.out_proj(out.reshape(B, N, D))


@pytest.mark.parametrize("kv", [4, 2, 1])
@pytest.mark.parametrize("name", OPERATORS)
def test_rope_and_gqa_layers_match_the_explicit_reference_for_every_operator(name, kv):
    torch.manual_seed(0)
    rotary = RotaryEmbedding(4, base=50.0)
    layer = DiffusionAttention(16, 4, f"{name}:2,attention:2", causal=True, num_kv_heads=kv, rotary=rotary).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    expected = _reference_layer(layer, x, rotary)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-10)
    cache = LayerKVCache()  # and the cached path on the same layer
    got = torch.cat([attend_cached(layer, x[:, :3], cache)] + [attend_cached(layer, x[:, i : i + 1], cache)
                                                                for i in range(3, 6)], dim=1)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


def test_gqa_equals_a_full_layer_with_repeated_kv_heads():
    torch.manual_seed(0)
    gqa = DiffusionAttention(16, 4, "heat(steps=2):2,laplacian:2", num_kv_heads=2).double()
    full = DiffusionAttention(16, 4, "heat(steps=2):2,laplacian:2").double()
    C = 4
    with torch.no_grad():
        W, b = gqa.qkv.weight, gqa.qkv.bias
        kW, vW = W[16:24].unflatten(0, (2, C)), W[24:].unflatten(0, (2, C))
        kb, vb = b[16:24].unflatten(0, (2, C)), b[24:].unflatten(0, (2, C))
        full.qkv.weight.copy_(torch.cat([W[:16], kW.repeat_interleave(2, 0).flatten(0, 1),
                                         vW.repeat_interleave(2, 0).flatten(0, 1)]))
        full.qkv.bias.copy_(torch.cat([b[:16], kb.repeat_interleave(2, 0).flatten(), vb.repeat_interleave(2, 0).flatten()]))
        full.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(gqa(x), full(x), rtol=0, atol=1e-12)
    edges = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 0]])
    torch.testing.assert_close(gqa(x[0], edge_index=edges), full(x[0], edge_index=edges), rtol=0, atol=1e-12)
    assert gqa.qkv.weight.shape == (32, 16) and "num_kv_heads=2" in repr(gqa)


def test_gpt_options_and_defaults():
    base = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=16)
    default = DiffusionGPT(base)
    assert default.pos_emb is not None and default.blocks[0].attn.rotary is None
    assert default.blocks[0].attn.num_kv_heads == 4
    rope = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=16, rope=True,
                                  n_kv_head=1))
    assert rope.pos_emb is None and isinstance(rope.blocks[1].attn.rotary, RotaryEmbedding)
    assert rope.num_parameters() < default.num_parameters()
    zero = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=16, zero_init_proj=True))
    idx = torch.randint(0, 11, (2, 8))
    _, _, inter = zero(idx, return_intermediates=True)
    for h in inter.hidden_states:  # every residual branch starts at zero
        torch.testing.assert_close(h, inter.embeddings, rtol=0, atol=0)
    assert zero.blocks[0].attn.out_proj.weight.abs().sum() == 0 and default.blocks[0].mlp.fc2.weight.abs().sum() > 0
    with pytest.raises(ValueError, match="n_kv_head: expected None or a positive int dividing n_head=4, got 3"):
        GPTConfig(n_head=4, n_embd=16, n_kv_head=3)
    with pytest.raises(ValueError, match="rope: expected an even head dim"):
        GPTConfig(n_head=4, n_embd=12, rope=True)


def _reference_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep, row by row, the most likely tokens until their probability reaches p (Python loop)."""
    keep = torch.zeros_like(logits, dtype=torch.bool)
    probs = torch.softmax(logits.double(), dim=-1)
    for b in range(logits.shape[0]):
        total = 0.0
        for j in sorted(range(logits.shape[1]), key=lambda j: -float(probs[b, j])):
            keep[b, j] = True
            total += float(probs[b, j])
            if total >= p:
                break
    return keep


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.999, 1.0])
def test_top_p_filter_matches_a_reference(p):
    logits = torch.randn(16, 23, generator=torch.Generator().manual_seed(int(p * 1000)), dtype=torch.float64) * 2
    kept = top_p_filter(logits, p).isfinite()
    assert torch.equal(kept, _reference_top_p(logits, p))
    assert torch.equal(top_p_filter(logits, p)[kept], logits[kept])


def test_generate_with_top_p():
    model = _gpt("attention:4")
    prompt = torch.randint(0, 13, (2, 3), generator=torch.Generator().manual_seed(0))
    tiny = model.generate(prompt, 6, top_p=1e-6, generator=torch.Generator().manual_seed(5))
    assert torch.equal(tiny, model.generate(prompt, 6, temperature=0))  # only the top token survives
    one = model.generate(prompt, 6, top_p=1.0, generator=torch.Generator().manual_seed(5))
    assert torch.equal(one, model.generate(prompt, 6, generator=torch.Generator().manual_seed(5)))
    cached = model.generate(prompt, 6, top_p=0.8, use_cache=True, generator=torch.Generator().manual_seed(7))
    assert torch.equal(cached, model.generate(prompt, 6, top_p=0.8, generator=torch.Generator().manual_seed(7)))
    with pytest.raises(ValueError, match=r"top_p must be a float in \(0, 1\]"):
        model.generate(prompt, 1, top_p=0.0)


def test_top_p_boundary_is_inclusive():
    # probabilities exact in binary: the set {0.5} reaches p = 0.5, {0.5, 0.25} reaches 0.75
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.125]], dtype=torch.float64).log()
    assert top_p_filter(logits, 0.5).isfinite().tolist() == [[True, False, False, False]]
    assert top_p_filter(logits, 0.75).isfinite().tolist() == [[True, True, False, False]]
    assert torch.equal(_reference_top_p(logits, 0.75), top_p_filter(logits, 0.75).isfinite())


def test_an_operator_can_opt_out_of_the_cache():
    class NoCacheHeat(operator_class("heat")):
        supports_kv_cache = False

    layer = DiffusionAttention(8, 2, [NoCacheHeat(), "attention"], causal=True)
    with pytest.raises(ValueError, match="does not support a KV cache.*use_cache=False"):
        attend_cached(layer, torch.randn(1, 3, 8), LayerKVCache())
