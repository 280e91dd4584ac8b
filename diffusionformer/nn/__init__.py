"""Modules: :class:`DiffusionAttention` and (in :mod:`diffusionformer.nn.block`) transformer blocks."""

from diffusionformer.nn.attention import AttentionIntermediates, DiffusionAttention
from diffusionformer.nn.block import Block, DropPath, LayerScale, Mlp, make_norm
from diffusionformer.nn.heads import HeadGroup, parse_heads, resolve_layer_heads
from diffusionformer.ops.rivals import LayerState

__all__ = [
    "AttentionIntermediates",
    "Block",
    "DiffusionAttention",
    "DropPath",
    "HeadGroup",
    "LayerScale",
    "LayerState",
    "Mlp",
    "make_norm",
    "parse_heads",
    "resolve_layer_heads",
]
