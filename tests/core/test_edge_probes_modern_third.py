"""Edge probes of the transformer block's modern parts against float64 references written out here: a stack of
blocks with value residuals (ResFormer), per-head qk-norm, RoPE, GQA, RMSNorm and LayerScale; stochastic depth in
a block (one Bernoulli draw per sample and branch, scaled by 1 / (1 - p)); the ViT's linear drop-path schedule
(timm's ``linspace(0, drop_path, depth)``); bf16 / fp16 blocks against float64.

No bug was found in this pass (nn/block.py, nn/_skip.py, the models' norm / LayerScale / drop-path options): the
tests below pin the behaviour that the earlier probe files did not already pin."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from diffusionformer.nn import Block
from diffusionformer.nn.block import DropPath
from diffusionformer.nn.rotary import RotaryEmbedding
from diffusionformer.ops.rivals import LayerState


def _rms(t, m):
    eps = torch.finfo(t.dtype).eps if m.eps is None else m.eps
    return t / torch.sqrt((t * t).mean(-1, keepdim=True) + eps) * m.weight


def _ln(t, m):
    mu = t.mean(-1, keepdim=True)
    var = ((t - mu) ** 2).mean(-1, keepdim=True)
    return (t - mu) / torch.sqrt(var + m.eps) * m.weight + m.bias


def _mlp(h, m):
    return nn.functional.gelu(h @ m.fc1.weight.T + m.fc1.bias) @ m.fc2.weight.T + m.fc2.bias


def test_value_residual_stack_reads_the_first_layers_values():
    """Three pre-norm blocks (RMSNorm, LayerScale, causal GQA with per-head LayerNorm on q and k, then RoPE):
    blocks 2 and 3 attend over ``v + lam * v_1`` with ``v_1`` the first block's values (repeated per kv group),
    never their own or the previous block's."""
    torch.manual_seed(0)
    D, H, G, N, B, lam = 16, 4, 2, 6, 2, 0.7
    C = D // H
    blocks = [Block(D, H, f"value-residual(lam={lam}):4", qk_norm=True, num_kv_heads=G, layer_scale=0.3,
                    norm_layer="rmsnorm", causal=True, rotary=RotaryEmbedding(C)).double().eval() for _ in range(3)]
    with torch.no_grad():
        for b in blocks:
            for p in b.parameters():
                p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(B, N, D, dtype=torch.float64)
    state, y = LayerState(), x
    for b in blocks:
        y = b(y, state=state)
    v1, r = None, x
    rep = H // G
    for b in blocks:
        a = b.attn
        qkv = _rms(r, b.norm1) @ a.qkv.weight.T + a.qkv.bias
        q = qkv[..., : H * C].view(B, N, H, C)
        k = qkv[..., H * C : H * C + G * C].view(B, N, G, C)
        v = qkv[..., H * C + G * C :].view(B, N, G, C)
        q, k = a.rotary(_ln(q, a.q_norm)), a.rotary(_ln(k, a.k_norm))  # qk-norm before RoPE
        k = torch.stack([k[:, :, h // rep] for h in range(H)], 2)
        v = torch.stack([v[:, :, h // rep] for h in range(H)], 2)
        vv = v if v1 is None else v + lam * v1
        v1 = v if v1 is None else v1
        s = torch.einsum("bihc,bjhc->bhij", q, k) / math.sqrt(C)
        s = s.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
        o = torch.einsum("bhij,bjhc->bihc", s.softmax(-1), vv).reshape(B, N, D) @ a.out_proj.weight.T + a.out_proj.bias
        r = r + b.ls1.gamma * o
        r = r + b.ls2.gamma * _mlp(_rms(r, b.norm2), b.mlp)
    torch.testing.assert_close(y, r, rtol=0, atol=1e-12)
    assert state.depth == 3


def test_block_drop_path_one_draw_per_sample_and_branch():
    """In training, each branch of each sample is kept (x 1/(1-p)) or dropped by its own Bernoulli draw (timm's
    DropPath, once for the attention branch and once for the MLP branch); identity in eval."""
    torch.manual_seed(0)
    B, N, D, p = 8, 3, 8, 0.4
    blk = Block(D, 2, drop_path=p, layer_scale=0.5, norm_layer="rmsnorm").double().train()
    x = torch.randn(B, N, D, dtype=torch.float64)
    torch.manual_seed(7)
    y = blk(x)
    torch.manual_seed(7)
    keep1 = torch.empty(B, 1, 1, dtype=torch.float64).bernoulli_(1 - p)
    keep2 = torch.empty(B, 1, 1, dtype=torch.float64).bernoulli_(1 - p)
    assert not torch.equal(keep1, keep2) and 0 < keep1.sum() < B  # the seed draws both outcomes, per sample
    ev = copy.deepcopy(blk).eval()
    a = ev.ls1(ev.attn(ev.norm1(x)))
    r = x + a * keep1 / (1 - p)
    r = r + ev.ls2(ev.mlp(ev.norm2(r))) * keep2 / (1 - p)
    torch.testing.assert_close(y, r, rtol=0, atol=1e-12)
    assert torch.equal(blk.eval()(x), ev(x))


def test_drop_path_keeps_the_dtype_and_scales_in_half_precision():
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        y = DropPath(0.25).train()(torch.ones(64, 2, 3, dtype=dtype))
        assert y.dtype == dtype
        flat = y.flatten(1).float()
        kept = (flat != 0).all(1)
        assert ((flat == 0).all(1) | kept).all() and 0 < kept.sum() < 64
        torch.testing.assert_close(flat[kept], torch.full_like(flat[kept], 1 / 0.75), rtol=4e-3, atol=0)


@pytest.mark.parametrize("depth,drop_path", [(1, 0.3), (4, 0.3), (5, 0.1)])
def test_vit_drop_path_schedule_is_timm_linspace(depth, drop_path):
    from diffusionformer.models import DiffusionViT, ViTConfig

    vit = DiffusionViT(ViTConfig(input_size=(4, 4), patch_size=2, dim=8, depth=depth, num_heads=2,
                                 drop_path=drop_path))
    want = torch.linspace(0, drop_path, depth, dtype=torch.float64).tolist() if depth > 1 else [0.0]
    got = [blk.drop_path.p if isinstance(blk.drop_path, DropPath) else 0.0 for blk in vit.blocks]
    assert got == pytest.approx(want, abs=1e-12)
    assert isinstance(vit.blocks[0].drop_path, nn.Identity)  # rate 0: skipped, no DropPath call


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 3e-2), (torch.float16, 4e-3)])
def test_half_precision_block_tracks_float64(norm, dtype, tol):
    torch.manual_seed(0)
    blk = Block(32, 4, norm_layer=norm, qk_norm=True, layer_scale=0.5).eval()
    x = torch.randn(2, 7, 32)
    ref = copy.deepcopy(blk).double()(x.double())
    y = copy.deepcopy(blk).to(dtype)(x.to(dtype))
    assert y.dtype == dtype
    assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < tol
