"""Edge probes of head layouts: references for head groups that split a GQA key/value group, a model's parameter
count by hand, and the spec -> build -> heads_spec -> build round trip of a model (no bug found in this pass)."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.models.gpt import DiffusionGPT, GPTConfig
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.heads import resolve_layer_heads


@pytest.mark.parametrize("causal", [False, True])
def test_head_groups_splitting_a_kv_group_match_the_float64_reference(causal: bool) -> None:
    torch.manual_seed(0)
    D, H, G, N = 16, 4, 2, 5
    C = D // H
    layer = DiffusionAttention(D, H, "laplacian:1,attention:2,ppr(alpha=0.3, steps=2):1", num_kv_heads=G,
                               causal=causal).double()
    x = torch.randn(2, N, D, dtype=torch.float64)
    q, k, v = layer.qkv(x).split([H * C, G * C, G * C], -1)
    q = q.view(2, N, H, C).transpose(1, 2)
    k = k.view(2, N, G, C).transpose(1, 2).repeat_interleave(H // G, 1)  # query head h reads kv head h // (H / G)
    v = v.view(2, N, G, C).transpose(1, 2).repeat_interleave(H // G, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(C)
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), -math.inf)
    P = s.softmax(-1)
    a = 0.3
    f = [[1.0, -1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [a, a * (1 - a), (1 - a) ** 2]]  # I-P, P, P, PPR(2)
    out = []
    for h in range(H):
        acc, Pk = torch.zeros_like(v[:, h]), v[:, h]
        for c in f[h]:
            acc, Pk = acc + c * Pk, P[:, h] @ Pk
        out.append(acc)
    ref = layer.out_proj(torch.stack(out, 1).transpose(1, 2).reshape(2, N, D))
    torch.testing.assert_close(layer(x), ref, rtol=0, atol=1e-12)


def test_gpt_parameter_count_by_hand() -> None:
    V, T, L, H, D, kv = 11, 8, 2, 4, 16, 2
    m = DiffusionGPT(GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=H, n_embd=D, n_kv_head=kv,
                               heads={1: "attention:2,heat(learnable=True):2"}))
    qkv = D * (D + 2 * kv * (D // H)) + (D + 2 * kv * (D // H))
    block = 2 * D + qkv + (D * D + D) + 2 * D + (D * 4 * D + 4 * D) + (4 * D * D + D)
    expected = V * D + T * D + L * block + 2 + 2 * D  # one t per heat head in layer 1, tied output head
    assert sum(p.numel() for p in m.parameters()) == expected


@pytest.mark.parametrize("kv", [None, 2, 1])
def test_gpt_rebuilt_from_heads_spec_loads_and_matches(kv: int | None) -> None:
    torch.manual_seed(0)
    heads = resolve_layer_heads(2, 4, {0: "polynomial(init=[0.1,0.2], steps=1):{half},attention:{half}",
                                       -1: "attnscale:1,ppr(learnable=True):2,laplacian:1"})
    cfg = dict(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=16, n_kv_head=kv)
    m = DiffusionGPT(GPTConfig(**cfg, heads=heads)).double().eval()
    specs = [b.attn.heads_spec() for b in m.blocks]
    m2 = DiffusionGPT(GPTConfig(**cfg, heads=specs)).double().eval()
    m2.load_state_dict(m.state_dict())
    assert [b.attn.heads_spec() for b in m2.blocks] == specs
    idx = torch.randint(0, 11, (2, 6))
    y, y2 = m(idx), m2(idx)
    y, y2 = (y[0], y2[0]) if isinstance(y, tuple) else (y, y2)
    torch.testing.assert_close(y2, y, rtol=0, atol=0)
