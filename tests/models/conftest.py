"""Fixtures shared by the model tests (pytest's importlib mode: test files cannot import each other)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch

from diffusionformer.models import DiffusionGraphTransformer, DiffusionViT, GraphTransformerConfig, ViTConfig


@pytest.fixture
def tiny_vit() -> Callable[..., DiffusionViT]:
    """Builder of a float64 ViT on 4x4 inputs (patch 2, width 8, depth 2, 2 heads, 3 classes), seeded
    with 0; keyword arguments override the config."""

    def build(**kw: Any) -> DiffusionViT:
        torch.manual_seed(0)
        cfg = dict(input_size=(4, 4), patch_size=2, dim=8, depth=2, num_heads=2, num_classes=3)
        cfg.update(kw)
        return DiffusionViT(ViTConfig(**cfg)).double()

    return build


@pytest.fixture
def tiny_graph_transformer() -> Callable[..., DiffusionGraphTransformer]:
    """Builder of a float64 graph transformer (3 input channels, 2 classes, width 8, 2 heads, depth 1),
    seeded with 0; keyword arguments override the config."""

    def build(**kw: Any) -> DiffusionGraphTransformer:
        torch.manual_seed(0)
        cfg = dict(in_channels=3, num_classes=2, dim=8, num_heads=2, depth=1)
        cfg.update(kw)
        return DiffusionGraphTransformer(GraphTransformerConfig(**cfg)).double()

    return build


def _layer_norm(t: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    """LayerNorm over the last dim, by hand (biased variance, as torch)."""
    mu = t.mean(-1, keepdim=True)
    var = ((t - mu) ** 2).mean(-1, keepdim=True)
    out = (t - mu) / torch.sqrt(var + ln.eps) * ln.weight
    return out + ln.bias if ln.bias is not None else out


def _edge_softmax(attn: Any, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """One softmax-attention layer over edges ``j -> i`` (TransformerConv without edge features), by hand."""
    N, D = h.shape
    H = attn.num_heads
    C = D // H
    qkv = h @ attn.qkv.weight.T + attn.qkv.bias
    q, k, v = (qkv[:, i * D : (i + 1) * D].reshape(N, H, C) for i in range(3))
    out = torch.zeros(N, H, C, dtype=h.dtype)
    for i in range(N):
        js = src[dst == i]
        s = (q[i] * k[js]).sum(-1) / math.sqrt(C)  # (n_i, H)
        out[i] = (torch.softmax(s, 0).unsqueeze(-1) * v[js]).sum(0)
    return out.reshape(N, D) @ attn.out_proj.weight.T + attn.out_proj.bias


@pytest.fixture
def by_hand() -> SimpleNamespace:
    """References written out by hand: ``layer_norm(t, ln)`` and ``edge_softmax(attn, h, src, dst)``."""
    return SimpleNamespace(layer_norm=_layer_norm, edge_softmax=_edge_softmax)


@pytest.fixture
def rotate_pairs() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """RoPE written out (RoFormer): pairs ``(x_{2i}, x_{2i+1})`` of ``x`` ``(B, N, H, C)`` rotated by ``angles``
    ``(N, C/2)``."""

    def rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        a, b = x[..., 0::2], x[..., 1::2]
        cos, sin = angles.cos()[None, :, None], angles.sin()[None, :, None]
        out = torch.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out

    return rotate
