"""User walk 60l: the modern model parts (RoPE, GQA/MQA, q/k norm, RMSNorm, SwiGLU, bias=False, tied head, KV cache,
2-D RoPE) against independent float64 references written from the formulas the docs claim, for the softmax head and
the diffusion heads that reuse the same q/k path."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.models import DiffusionGPT, DiffusionViT, GPTConfig, ViTConfig
from diffusionformer.nn import DiffusionAttention, RotaryEmbedding, RotaryEmbedding2D

SPECS = {
    "attention": "attention:4",
    "laplacian": "laplacian:4",
    "heat": "heat(t=0.7, steps=3):4",
    "ppr": "ppr(alpha=0.3, steps=4):4",
    "polynomial": "polynomial(steps=2):4",
    "mixed": "attention:1,laplacian:1,heat(t=1.5, steps=2):1,ppr(alpha=0.5, steps=3):1",
}


# ---- independent float64 references (no library code) -------------------------------------------------------------

def ref_rope_interleaved(x, pos, base):
    """RoFormer's pairs (x_{2i}, x_{2i+1}) rotated by pos * base^(-2i/C); x (N, H, C), pos (N,) float64."""
    C = x.shape[-1]
    out = torch.empty_like(x)
    for i in range(C // 2):
        theta = base ** (-2.0 * i / C)
        ang = pos.to(torch.float64) * theta
        c, s = torch.cos(ang)[:, None], torch.sin(ang)[:, None]
        a, b = x[..., 2 * i], x[..., 2 * i + 1]
        out[..., 2 * i] = a * c - b * s
        out[..., 2 * i + 1] = a * s + b * c
    return out


def ref_rmsnorm(x, g, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def ref_layernorm(x, g, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + eps) * g
    return y if b is None else y + b


def ref_f_of_p(kind, P, op):
    """f(P) from the operator's documented formula; P (N, N)."""
    N = P.shape[-1]
    eye = torch.eye(N, dtype=P.dtype)
    if kind == "attention":
        return P
    if kind == "laplacian":
        return eye - P
    if kind == "heat":
        t, K = float(op.t), op.degree
        return sum(math.exp(-t) * t**k / math.factorial(k) * torch.linalg.matrix_power(P, k) for k in range(K + 1))
    if kind == "ppr":
        a, K = float(op.alpha), op.degree
        f = sum(a * (1 - a) ** k * torch.linalg.matrix_power(P, k) for k in range(K))
        return f + (1 - a) ** K * torch.linalg.matrix_power(P, K)
    if kind == "polynomial":
        theta = op.theta.to(torch.float64).reshape(-1)
        return sum(theta[k] * torch.linalg.matrix_power(P, k) for k in range(theta.numel()))
    raise AssertionError(kind)


def _op_kind(op):
    return {"AttentionOperator": "attention", "LaplacianOperator": "laplacian", "HeatOperator": "heat",
            "PPROperator": "ppr", "PolynomialOperator": "polynomial"}[type(op).__name__]


def ref_attention(attn, x, positions):
    """One DiffusionAttention by hand: (B, N, D) -> (B, N, D); causal, q/k norm (LayerNorm per head) then RoPE,
    k/v heads repeated over query groups (repeat_kv)."""
    B, N, D = x.shape
    H, C, G = attn.num_heads, attn.head_dim, attn.num_kv_heads
    W = attn.qkv.weight
    qkv = x @ W.T + (attn.qkv.bias if attn.qkv.bias is not None else 0)
    q, k, v = qkv[..., : H * C], qkv[..., H * C : H * C + G * C], qkv[..., H * C + G * C :]
    q, k, v = q.reshape(B, N, H, C), k.reshape(B, N, G, C), v.reshape(B, N, G, C)
    if isinstance(attn.q_norm, torch.nn.LayerNorm):
        qn, kn = attn.q_norm, attn.k_norm
        q = ref_layernorm(q, qn.weight, None if qn.bias is None else qn.bias, qn.eps)
        k = ref_layernorm(k, kn.weight, None if kn.bias is None else kn.bias, kn.eps)
    if attn.rotary is not None:
        q = torch.stack([ref_rope_interleaved(q[b], positions, attn.rotary.base) for b in range(B)])
        k = torch.stack([ref_rope_interleaved(k[b], positions, attn.rotary.base) for b in range(B)])
    out = torch.zeros(B, N, H, C, dtype=x.dtype)
    heads = [(op, h) for op in attn.operators for h in range(op.num_heads)]
    assert len(heads) == H
    mask = torch.ones(N, N, dtype=torch.bool).tril()
    for b in range(B):
        for h, (op, local) in enumerate(heads):
            g = h // (H // G)  # repeat_kv: query head h reads kv head h // (H / G)
            s = q[b, :, h] @ k[b, :, g].T / math.sqrt(C)
            P = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
            kind = _op_kind(op)
            if kind == "polynomial":
                theta = op.theta.to(torch.float64)
                theta = theta[local] if theta.dim() == 2 else theta
                f = sum(theta[j] * torch.linalg.matrix_power(P, j) for j in range(theta.numel()))
            else:
                f = ref_f_of_p(kind, P, op)
            out[b, :, h] = f @ v[b, :, g]
    y = out.reshape(B, N, D) @ attn.out_proj.weight.T
    return y + (attn.out_proj.bias if attn.out_proj.bias is not None else 0)


def ref_norm(mod, x):
    if isinstance(mod, torch.nn.RMSNorm):
        eps = mod.eps if mod.eps is not None else torch.finfo(x.dtype).eps
        return ref_rmsnorm(x, mod.weight, eps)
    return ref_layernorm(x, mod.weight, None if mod.bias is None else mod.bias, mod.eps)


def ref_swiglu(mlp, x):
    Hd = mlp.hidden_dim
    W1 = mlp.fc1.weight
    gate, up = x @ W1[:Hd].T, x @ W1[Hd:].T
    if mlp.fc1.bias is not None:
        gate, up = gate + mlp.fc1.bias[:Hd], up + mlp.fc1.bias[Hd:]
    h = gate * torch.sigmoid(gate) * up
    return h @ mlp.fc2.weight.T + (0 if mlp.fc2.bias is None else mlp.fc2.bias)


def ref_gpt(model, idx):
    x = model.tok_emb.weight[idx]
    positions = torch.arange(idx.shape[1], dtype=torch.float64)
    for blk in model.blocks:
        x = x + ref_attention(blk.attn, ref_norm(blk.norm1, x), positions)
        x = x + ref_swiglu(blk.mlp, ref_norm(blk.norm2, x))
    return ref_norm(model.norm, x) @ model.tok_emb.weight.T  # tied head


def _llama_gpt(spec, n_kv_head=2, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=23, block_size=12, n_layer=2, n_head=4, n_embd=32, heads=spec, rope=True, n_kv_head=n_kv_head,
               qk_norm=True, norm="rmsnorm", mlp="swiglu", bias=False, tie_weights=True)
    cfg.update(kw)
    model = DiffusionGPT(GPTConfig(**cfg)).double().eval()
    with torch.no_grad():  # non-trivial gains, so a norm's weight that is not applied shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".norm" in name or "q_norm" in name or "k_norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            if "theta" in name:
                p.copy_(torch.randn_like(p))
    return model


# ---- the reference formulas ----------------------------------------------------------------------------------------

def test_rotary_is_roformer_interleaved_pairs_base_10000():
    rope = RotaryEmbedding(8)
    assert rope.base == 10000.0
    x = torch.randn(5, 3, 8, dtype=torch.float64)
    pos = torch.arange(5)
    torch.testing.assert_close(rope(x), ref_rope_interleaved(x, pos.double(), 10000.0), rtol=0, atol=1e-13)
    off = torch.arange(7, 12)  # positions offset under a KV cache
    torch.testing.assert_close(rope(x, off), ref_rope_interleaved(x, off.double(), 10000.0), rtol=0, atol=1e-12)


def test_make_norm_rmsnorm_and_swiglu_width_follow_the_docs():
    torch.manual_seed(1)
    model = _llama_gpt(SPECS["attention"])
    blk = model.blocks[0]
    assert isinstance(blk.norm1, torch.nn.RMSNorm) and blk.mlp.hidden_dim == int(2 * 32 * 4.0 / 3)
    assert blk.attn.qkv.bias is None and blk.attn.out_proj.bias is None and blk.attn.q_norm.bias is None
    assert model.lm_head.weight is model.tok_emb.weight
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    torch.testing.assert_close(blk.norm1(x), ref_norm(blk.norm1, x), rtol=0, atol=1e-13)
    torch.testing.assert_close(blk.mlp(x), ref_swiglu(blk.mlp, x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", list(SPECS))
def test_gpt_llama_parts_match_reference(kind):
    model = _llama_gpt(SPECS[kind])
    idx = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(idx)[0]
    torch.testing.assert_close(logits, ref_gpt(model, idx), rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("n_kv_head", [1, 2, 4])
def test_kv_cache_matches_full_recompute(kind, n_kv_head):
    model = _llama_gpt(SPECS[kind], n_kv_head=n_kv_head)
    idx = torch.randint(0, 23, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(idx)[0]
        cache = model.new_cache()
        parts = [model.forward_cached(idx[:, :5], cache)]
        parts += [model.forward_cached(idx[:, t : t + 1], cache) for t in range(5, 10)]
        parts.append(model.forward_cached(idx[:, 10:], cache))
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-10)


def test_kv_cache_past_block_size_is_refused_and_generate_slides():
    model = _llama_gpt(SPECS["heat"])
    idx = torch.randint(0, 23, (1, 12), generator=torch.Generator().manual_seed(4))
    cache = model.new_cache()
    with torch.no_grad():
        model.forward_cached(idx, cache)
        with pytest.raises(ValueError, match="block_size"):
            model.forward_cached(idx[:, :1], cache)
    out = model.generate(idx[:, :10], 6, temperature=0, use_cache=True)
    assert torch.equal(out, model.generate(idx[:, :10], 6, temperature=0))


def test_num_kv_heads_not_dividing_is_a_clear_error():
    with pytest.raises(ValueError, match="n_kv_head"):
        GPTConfig(n_head=4, n_embd=32, n_kv_head=3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        DiffusionAttention(32, 4, num_kv_heads=3)


def test_state_dict_round_trip_keeps_logits():
    model = _llama_gpt(SPECS["mixed"], n_kv_head=1)
    again = DiffusionGPT(model.config).double().eval()
    again.load_state_dict(model.state_dict())
    idx = torch.randint(0, 23, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(model(idx)[0], again(idx)[0])
    assert again.lm_head.weight is again.tok_emb.weight


# ---- ViT 2-D RoPE ---------------------------------------------------------------------------------------------------

def ref_rope_2d(x, pos, base):
    """Axial: channels [0, C/2) rotate as a C/2-dim 1-D RoPE by the row, [C/2, C) by the column."""
    C = x.shape[-1]
    h = C // 2
    return torch.cat([ref_rope_interleaved(x[..., :h], pos[:, 0].double(), base),
                      ref_rope_interleaved(x[..., h:], pos[:, 1].double(), base)], dim=-1)


def test_rotary_2d_matches_axial_reference():
    rope = RotaryEmbedding2D(8)
    x = torch.randn(6, 2, 8, dtype=torch.float64)
    pos = torch.tensor([[0, 0], [1, 1], [1, 2], [2, 1], [3, 0], [0, 3]])
    torch.testing.assert_close(rope(x, pos), ref_rope_2d(x, pos, 100.0), rtol=0, atol=1e-13)


@pytest.mark.parametrize("spec", ["attention:1,laplacian:1", "heat(t=0.5, steps=3):1,ppr(alpha=0.4, steps=3):1"])
def test_vit_2d_rope_attention_matches_reference(spec):
    torch.manual_seed(6)
    vit = DiffusionViT(ViTConfig(input_size=(6, 4), patch_size=2, dim=16, depth=1, num_heads=2, rope=True,
                                 heads=spec, qk_norm=True)).double().eval()
    attn = vit.blocks[0].attn
    pos = vit.token_positions()
    assert pos.tolist()[:4] == [[0, 0], [1, 1], [1, 2], [2, 1]]  # class token at the origin, 3 x 2 patch grid
    x = torch.randn(2, pos.shape[0], 16, dtype=torch.float64)
    with torch.no_grad():
        got = attn(x, positions=pos)
    # the reference rotates by hand (non-causal: a ViT's complete graph)
    B, N, D = x.shape
    H, C = 2, 8
    qkv = x @ attn.qkv.weight.T + attn.qkv.bias
    q, k, v = qkv.split(D, dim=-1)
    q, k, v = q.reshape(B, N, H, C), k.reshape(B, N, H, C), v.reshape(B, N, H, C)
    qn, kn = attn.q_norm, attn.k_norm
    q = ref_layernorm(q, qn.weight, qn.bias, qn.eps)
    k = ref_layernorm(k, kn.weight, kn.bias, kn.eps)
    q = torch.stack([ref_rope_2d(q[b], pos, 100.0) for b in range(B)])
    k = torch.stack([ref_rope_2d(k[b], pos, 100.0) for b in range(B)])
    out = torch.zeros(B, N, H, C, dtype=torch.float64)
    for b in range(B):
        for h, op in enumerate(attn.operators):
            P = torch.softmax(q[b, :, h] @ k[b, :, h].T / math.sqrt(C), dim=-1)
            out[b, :, h] = ref_f_of_p(_op_kind(op), P, op) @ v[b, :, h]
    want = out.reshape(B, N, D) @ attn.out_proj.weight.T + attn.out_proj.bias
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def _registered():
    from diffusionformer.operators.registry import list_operators
    return list_operators()


@pytest.mark.parametrize("name", _registered())
@pytest.mark.parametrize("n_kv_head", [1, 2])
def test_kv_cache_every_registered_operator_with_rope_gqa_qk_norm(name, n_kv_head):
    from diffusionformer.operators.registry import operator_class
    kwargs = dict(getattr(operator_class(name), "example_kwargs", {}) or {})
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    spec = f"attention:1,{name}({args}):3" if args else f"attention:1,{name}:3"
    model = _llama_gpt(spec, n_kv_head=n_kv_head, n_layer=3)
    idx = torch.randint(0, 23, (2, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        full = model(idx)[0]
        cache = model.new_cache()
        parts = [model.forward_cached(idx[:, :4], cache)]
        parts += [model.forward_cached(idx[:, t : t + 1], cache) for t in range(4, 9)]
        parts.append(model.forward_cached(idx[:, 9:], cache))
    atol = 1e-6 if name == "grand-nl" else 1e-10
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=atol)


def test_compiled_rope_gqa_model_compiles_twice_over_sequence_lengths():
    """docs/performance.md: a compiled model compiles once more when the sequence length first changes, not after."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model = _llama_gpt("attention:2,heat(t=0.7, steps=2):2", n_kv_head=1)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    with torch.no_grad():
        for T in (5, 7, 9, 12):
            idx = torch.randint(0, 23, (2, T), generator=torch.Generator().manual_seed(T))
            torch.testing.assert_close(compiled(idx)[0], model(idx)[0], rtol=0, atol=1e-10)
    assert counter.frame_count == 2
    torch._dynamo.reset()


# ---- a run's identity: rope_base is the model's own default only ---------------------------------------------------

@pytest.mark.parametrize("preset, other", [("gpt-char-tiny", 100.0), ("vit-digits", 10000.0)])
def test_rope_base_at_the_other_models_default_is_another_run(preset, other):
    """GPT's RoPE base defaults to 10000, the ViT's to 100: a GPT run at base 100 (or a ViT run at 10000) was recorded
    without ``rope_base``, so it was the same run as one at the model's own default, resumed or skipped as done
    under the other base; runs at the model's own default keep the identity they were published with."""
    from diffusionformer.experiments.config import TaskConfig
    from diffusionformer.experiments.results import _definition
    from diffusionformer.experiments.runner import _run_identity
    from diffusionformer.models import create_model
    from diffusionformer.train import TrainConfig

    task, train = TaskConfig("t", "digits", preset), TrainConfig(max_steps=2)
    own = _run_identity(task, create_model(preset, rope=True), train)
    assert "rope_base" not in own["model_config"]  # the model's default: as published
    moved = _run_identity(task, create_model(preset, rope=True, rope_base=other), train)
    assert moved["model_config"]["rope_base"] == other
    assert _definition(moved) != _definition(own)  # the stored identity, read back, keeps it too
