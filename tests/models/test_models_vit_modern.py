"""ViT: 2-D RoPE, attention maps (P and f(P)) and attention rollout."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.models import DiffusionViT, ViTConfig, attention_rollout
from diffusionformer.nn import DiffusionAttention, RotaryEmbedding2D


def _vit(**kw) -> DiffusionViT:
    torch.manual_seed(0)
    cfg = dict(input_size=(8, 8), patch_size=2, dim=16, depth=2, num_heads=2, num_classes=3)
    cfg.update(kw)
    return DiffusionViT(ViTConfig(**cfg)).double().eval()


def test_rope_vit_positions_and_no_absolute_embedding():
    vit = _vit(rope=True, heads="attention:1,heat(steps=2):1")
    assert vit.pos_embed is None and isinstance(vit.blocks[0].attn.rotary, RotaryEmbedding2D)
    pos = vit.token_positions()
    assert pos.shape == (17, 2) and pos[0].tolist() == [0, 0] and pos[1].tolist() == [1, 1]
    assert pos[5].tolist() == [2, 1]  # patch 4 of a 4x4 grid: row 1, column 0
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    assert vit(x).shape == (2, 3)
    signal = _vit(rope=True, input_size=(12,), patch_size=3, in_channels=2, pool="mean")
    assert signal.token_positions().tolist() == [1, 2, 3, 4]
    assert signal(torch.randn(2, 12, 2, dtype=torch.float64)).shape == (2, 3)
    with pytest.raises(ValueError, match="divisible by 4, got 6"):
        ViTConfig(dim=12, num_heads=2, rope=True)


def test_2d_rope_attention_depends_on_relative_grid_offsets_only():
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, "attention:1,heat(steps=3):1", rotary=RotaryEmbedding2D(8)).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    grid = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1]])
    a = layer(x, positions=grid)
    torch.testing.assert_close(a, layer(x, positions=grid + torch.tensor([3, 5])), rtol=0, atol=1e-12)
    assert not torch.allclose(a, layer(x, positions=grid.flip(1)))  # transposing the grid changes offsets


def test_positions_without_a_rotary_embedding_are_refused_not_ignored():
    """Bug: ``DiffusionAttention(...)(x, positions=grid)`` on a layer without ``rotary`` ignored the positions and
    returned the position-free output, as did a ViT without ``rope`` called with ``positions=``;
    both now raise."""
    layer = DiffusionAttention(16, 2, "attention:1,heat(steps=3):1").double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"positions= places the tokens for a rotary embedding, and this layer has "
                                         r"none \(build it with rotary=RotaryEmbedding"):
        layer(x, positions=torch.arange(6))
    assert layer(x, positions=None).shape == (2, 6, 16)
    vit = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, num_classes=3, dim=16, num_heads=2, depth=1))
    with pytest.raises(ValueError, match="positions= places the tokens"):
        vit(torch.randn(1, 1, 8, 8), positions=torch.arange(5))


def test_attention_maps_are_the_explicit_softmax_and_operator_matrices():
    vit = _vit(rope=True, heads={0: "laplacian:1,heat(t=0.7, steps=4):1"})
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    maps = vit.attention_maps(x)
    ops = vit.attention_maps(x, kind="operator")
    assert len(maps) == 2 and maps[0].shape == (2, 2, 17, 17)
    # layer 0 by hand: embed, norm, project, rotate, softmax
    z = vit._embed(x)
    attn = vit.blocks[0].attn
    q, k, _ = attn._project(vit.blocks[0].norm1(z), vit.token_positions())
    P = torch.softmax(torch.einsum("bnhc,bmhc->bhnm", q, k) / math.sqrt(8), dim=-1)
    torch.testing.assert_close(maps[0], P, rtol=0, atol=1e-12)
    eye = torch.eye(17, dtype=torch.float64)
    torch.testing.assert_close(ops[0][:, 0], eye - P[:, 0], rtol=0, atol=1e-12)  # Laplacian head
    heat = sum(math.exp(-0.7) * 0.7**j / math.factorial(j) * torch.linalg.matrix_power(P[:, 1], j) for j in range(5))
    torch.testing.assert_close(ops[0][:, 1], heat, rtol=0, atol=1e-12)
    torch.testing.assert_close(ops[1], maps[1], rtol=0, atol=0)  # layer 1: attention heads, f(P) = P


def test_attention_rollout_matches_an_explicit_product():
    g = torch.Generator().manual_seed(0)
    maps = [torch.softmax(torch.randn(2, 3, 5, 5, generator=g, dtype=torch.float64), -1) for _ in range(3)]
    ref = torch.eye(5, dtype=torch.float64).expand(2, 5, 5)
    for A in maps:
        layer = 0.5 * torch.eye(5, dtype=torch.float64) + 0.5 * (A[:, 0] + A[:, 1] + A[:, 2]) / 3
        ref = layer @ ref
    torch.testing.assert_close(attention_rollout(maps), ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(attention_rollout(maps).sum(-1), torch.ones(2, 5, dtype=torch.float64))
    vit = _vit()
    x = torch.randn(1, 1, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(vit.attention_rollout(x), attention_rollout(vit.attention_maps(x)))
    with pytest.raises(ValueError, match="residual in \\(0, 1\\]"):
        attention_rollout(maps, residual=0.0)
