"""Edge probes of the modern model parts against float64 references written out here: LLaMA-style RoPE
(complex multiplication of interleaved pairs), repeat_kv for GQA, per-head qk-norm before RoPE, RMSNorm,
DropPath, LayerScale, and the 2-D RoPE of the ViT."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from diffusionformer.nn import Block, DiffusionAttention, make_norm
from diffusionformer.nn.block import DropPath, LayerScale
from diffusionformer.nn.kv_cache import LayerKVCache
from diffusionformer.nn.rotary import RotaryEmbedding, RotaryEmbedding2D, apply_rotary


def _freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    """Meta's LLaMA ``precompute_freqs_cis`` in float64/complex128."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64)[: dim // 2] / dim))
    t = torch.arange(end, dtype=torch.float64)
    return torch.polar(torch.ones(end, dim // 2, dtype=torch.float64), torch.outer(t, freqs))


def _llama_rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """LLaMA ``apply_rotary_emb`` for ``x`` ``(B, N, H, C)``: complex multiplication of pairs (x[2i], x[2i+1])."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * freqs_cis[None, :, None, :]).flatten(-2)


def _reference_attention(att: DiffusionAttention, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """LLaMA-style attention in float64 with the layer's weights: per-head LayerNorm of q and k, then RoPE,
    repeat_kv (query head h reads kv head h // (H / G)), softmax attention, output projection."""
    B, N, D = x.shape
    H, G, C = att.num_heads, att.num_kv_heads, att.head_dim
    W, b = att.qkv.weight, att.qkv.bias
    qkv = x @ W.T + (b if b is not None else 0)
    q = qkv[..., : H * C].view(B, N, H, C)
    k = qkv[..., H * C : H * C + G * C].view(B, N, G, C)
    v = qkv[..., H * C + G * C :].view(B, N, G, C)

    def ln(t, mod):
        mu = t.mean(-1, keepdim=True)
        var = ((t - mu) ** 2).mean(-1, keepdim=True)
        out = (t - mu) / torch.sqrt(var + mod.eps) * mod.weight
        return out + mod.bias if mod.bias is not None else out

    if isinstance(att.q_norm, nn.LayerNorm):
        q, k = ln(q, att.q_norm), ln(k, att.k_norm)
    if att.rotary is not None:
        fc = _freqs_cis(C, N, att.rotary.base)
        q, k = _llama_rope(q, fc), _llama_rope(k, fc)
    rep = H // G
    k = torch.stack([k[:, :, h // rep] for h in range(H)], dim=2)
    v = torch.stack([v[:, :, h // rep] for h in range(H)], dim=2)
    s = torch.einsum("bihc,bjhc->bhij", q, k) / math.sqrt(C)
    if causal:
        s = s.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
    o = torch.einsum("bhij,bjhc->bihc", s.softmax(-1), v).reshape(B, N, H * C)
    return o @ att.out_proj.weight.T + (att.out_proj.bias if att.out_proj.bias is not None else 0)


@pytest.mark.parametrize("C", [2, 6, 8])
def test_apply_rotary_matches_llama_complex_multiplication(C):
    """The interleaved-pair convention the docstring promises, against LLaMA's complex form, incl. head dims 2 (mod 4)."""
    torch.manual_seed(0)
    x = torch.randn(2, 9, 3, C, dtype=torch.float64)
    ref = _llama_rope(x, _freqs_cis(C, 9))
    torch.testing.assert_close(RotaryEmbedding(C)(x), ref, rtol=0, atol=1e-12)
    # positions beyond any "table": the angles are computed, not looked up
    far = torch.arange(100_000, 100_009)
    ref_far = _llama_rope(x, _freqs_cis(C, 100_009)[far])
    torch.testing.assert_close(RotaryEmbedding(C)(x, far), ref_far, rtol=0, atol=1e-9)


def test_apply_rotary_in_bfloat16_uses_float64_angles():
    """bf16 queries at position ~5000: the angles are not rounded to bf16 (that would rotate by up to ~16 rad off)."""
    torch.manual_seed(0)
    x = torch.randn(1, 4, 2, 8, dtype=torch.float64)
    pos = torch.arange(5000, 5004)
    ref = _llama_rope(x, _freqs_cis(8, 5004)[pos])
    out = RotaryEmbedding(8)(x.to(torch.bfloat16), pos)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=0.05)


@pytest.mark.parametrize("kv,qk_norm,rope", [(1, True, True), (2, True, True), (4, False, True), (2, True, False)])
def test_layer_matches_llama_style_reference(kv, qk_norm, rope):
    """GQA/MQA with qk-norm then RoPE, causal, against the explicit float64 reference (head h -> kv h // (H/G))."""
    torch.manual_seed(0)
    att = DiffusionAttention(32, 4, "attention:4", causal=True, num_kv_heads=kv, qk_norm=qk_norm,
                             rotary=RotaryEmbedding(8) if rope else None, backend="matrix").double().eval()
    if qk_norm:
        with torch.no_grad():  # non-trivial norm affine parameters, different for q and k
            for mod in (att.q_norm, att.k_norm):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.normal_()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    ref = _reference_attention(att, x, causal=True)
    torch.testing.assert_close(att(x), ref, rtol=0, atol=1e-12)
    # and the KV cache, token by token, with the rotary offset past the cached tokens
    cache = LayerKVCache()
    outs = [att(x[:, i : i + 1], cache=cache) for i in range(7)]
    torch.testing.assert_close(torch.cat(outs, 1), ref, rtol=0, atol=1e-12)


def test_gqa_head_mapping_is_h_div_group_not_h_mod_kv():
    """Zeroing kv head 1's value weights zeroes query heads 2 and 3 (H=4, G=2), not heads 1 and 3."""
    torch.manual_seed(0)
    att = DiffusionAttention(16, 4, "attention:4", num_kv_heads=2, backend="matrix").double()
    C = 4
    with torch.no_grad():
        att.qkv.weight[16 + 8 + C : 16 + 8 + 2 * C] = 0  # value rows of kv head 1
        att.qkv.bias[16 + 8 + C : 16 + 8 + 2 * C] = 0
        att.out_proj.weight.copy_(torch.eye(16, dtype=torch.float64))
        att.out_proj.bias.zero_()
    out = att(torch.randn(2, 5, 16, dtype=torch.float64)).view(2, 5, 4, C)
    assert out[:, :, 2:].abs().max() == 0 and out[:, :, :2].abs().min() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rmsnorm_matches_formula_eps_inside_sqrt(dtype):
    torch.manual_seed(0)
    norm = make_norm("rmsnorm", 6).to(dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 4, 6, dtype=dtype) * 1e-4  # small, so an eps outside the sqrt would show
    eps = torch.finfo(dtype).eps if norm.eps is None else norm.eps
    xd = x.double()
    ref = xd / torch.sqrt((xd**2).mean(-1, keepdim=True) + eps) * norm.weight.double()
    torch.testing.assert_close(norm(x).double(), ref, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=0)


def test_drop_path_draws_one_mask_per_sample_and_scales():
    torch.manual_seed(0)
    dp = DropPath(0.5).train()
    x = torch.ones(256, 3, 4, dtype=torch.float64)
    y = dp(x)
    per_sample = y.flatten(1)
    assert ((per_sample == 0).all(1) | (per_sample == 2.0).all(1)).all()  # whole sample kept (x 1/(1-p)) or dropped
    kept = (per_sample == 2.0).all(1).float().mean()
    assert 0.3 < kept < 0.7  # one draw per sample, not one per batch
    assert torch.equal(dp.eval()(x), x)


def test_layer_scale_init_and_block_with_it_starts_near_identity():
    ls = LayerScale(5)
    assert torch.equal(ls.gamma.data, torch.full((5,), 1e-5))
    blk = Block(8, 2, layer_scale=1e-5, norm_layer="rmsnorm").double().eval()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    assert (blk(x) - x).abs().max() < 1e-3


def test_rotary2d_rows_on_first_half_columns_on_second():
    """2-D RoPE: channels [0, C/2) rotate by the row with a C/2-dim LLaMA RoPE (base 100), [C/2, C) by the column."""
    torch.manual_seed(0)
    C = 8
    x = torch.randn(1, 5, 2, C, dtype=torch.float64)
    pos = torch.tensor([[0, 0], [1, 1], [1, 2], [2, 1], [3, 4]])
    out = RotaryEmbedding2D(C)(x, pos)
    fc = _freqs_cis(C // 2, 5, 100.0)
    torch.testing.assert_close(out[..., : C // 2], _llama_rope(x[..., : C // 2], fc[pos[:, 0]]), rtol=0, atol=1e-12)
    torch.testing.assert_close(out[..., C // 2 :], _llama_rope(x[..., C // 2 :], fc[pos[:, 1]]), rtol=0, atol=1e-12)


def test_vit_token_positions_row_major_with_class_token_at_origin():
    from diffusionformer.models import DiffusionViT, ViTConfig

    vit = DiffusionViT(ViTConfig(input_size=(4, 6), patch_size=2, dim=16, depth=1, num_heads=2, rope=True))
    pos = vit.token_positions()
    assert pos[0].tolist() == [0, 0]
    assert pos[1:].tolist() == [[r + 1, c + 1] for r in range(2) for c in range(3)]
    # the patch embedding's flatten order is row-major too: patch (r, c) of the image lands at token 1 + r * 3 + c
    img = torch.zeros(1, 1, 4, 6)
    img[0, 0, 2:4, 2:4] = 1.0  # patch (1, 1)
    with torch.no_grad():
        vit.patch_embed.weight.fill_(1.0)
        vit.patch_embed.bias.zero_()
        tok = vit._embed(img)[0, 1:, 0]
    assert tok.nonzero().flatten().tolist() == [1 * 3 + 1]
    sig = DiffusionViT(ViTConfig(input_size=(8,), patch_size=2, dim=8, depth=1, num_heads=2, rope=True, pool="mean"))
    assert sig.token_positions().tolist() == [1, 2, 3, 4]


def test_state_dict_round_trip_of_rope_gqa_models():
    """No rotary tables in the state dict (nothing to persist): a fresh model loads it strictly and agrees."""
    from diffusionformer.models import DiffusionGPT, GPTConfig

    cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=4, n_embd=16, rope=True, n_kv_head=2,
                    qk_norm=True, norm="rmsnorm")
    torch.manual_seed(0)
    a = DiffusionGPT(cfg).eval()
    torch.manual_seed(1)
    b = DiffusionGPT(cfg).eval()
    b.load_state_dict(a.state_dict(), strict=True)
    idx = torch.randint(0, 16, (2, 8))
    torch.testing.assert_close(a(idx)[0], b(idx)[0], rtol=0, atol=0)


@pytest.mark.parametrize("bad", [1.0, -0.5, 1.5, float("nan"), "0.2"])
def test_bug_drop_path_checks_its_settable_rate(bad):
    """Bug: ``DropPath.p`` is a plain attribute (a stochastic-depth schedule sets it), read unchecked in the forward:
    ``p = 1.0`` returned ``x * 0 / 0``, NaN everywhere, silently; ``-0.5`` was refused by ``bernoulli_`` as
    "p=1.5", NaN as a bare RuntimeError, a string as "unsupported operand type(s) for -"."""
    dp = DropPath(0.1).train()
    dp.p = bad
    with pytest.raises(ValueError, match=r"DropPath\.p must lie in \[0, 1\), got"):
        dp(torch.ones(4, 2, 3))
    assert torch.equal(dp.eval()(torch.ones(4, 2, 3)), torch.ones(4, 2, 3))  # identity in eval, whatever p
    dp.train().p = 0.0
    assert torch.equal(dp(torch.ones(4, 2, 3)), torch.ones(4, 2, 3))


def test_bug_apply_rotary_refuses_non_finite_angles():
    """Bug: ``apply_rotary`` (public) rotated by NaN or infinite angles and returned NaN queries silently, where
    ``RotaryEmbedding`` refuses the NaN or infinite positions that would give them."""
    x = torch.randn(3, 2, 4)
    for bad in (float("inf"), float("nan")):
        angles = torch.zeros(3, 2)
        angles[1, 0] = bad
        with pytest.raises(ValueError, match=r"apply_rotary: expected finite angles"):
            apply_rotary(x, angles)
    assert torch.isfinite(apply_rotary(x, torch.randn(3, 2))).all()
    assert torch.equal(apply_rotary(x, torch.zeros(3, 2, dtype=torch.long)), x)  # integer angles: no rotation


def test_bug_apply_rotary_names_angles_on_another_device():
    """Bug: angles on another device than ``x`` failed inside the rotation with torch's bare "Tensor on device meta
    is not on the expected device cpu!", naming no argument (``RotaryEmbedding`` already named its positions)."""
    with pytest.raises(ValueError, match=r"apply_rotary: expected angles on the device of x \(cpu\), got meta"):
        apply_rotary(torch.randn(3, 2, 4), torch.randn(3, 2, device="meta"))
