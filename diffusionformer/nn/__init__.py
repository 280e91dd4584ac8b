"""Modules: :class:`DiffusionAttention` and (in :mod:`diffusionformer.nn.block`) transformer blocks."""

from diffusionformer.nn.attention import AttentionIntermediates, DiffusionAttention, set_recompute
from diffusionformer.nn.block import Block, DropPath, GatedMlp, LayerScale, Mlp, make_mlp, make_norm
from diffusionformer.nn.edge_features import edge_feature_attention
from diffusionformer.nn.heads import HeadGroup, parse_heads, resolve_layer_heads
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.nn.rotary import RotaryEmbedding, RotaryEmbedding2D, apply_rotary
from diffusionformer.ops.rivals import LayerState

__all__ = [
    "AttentionIntermediates",
    "Block",
    "DiffusionAttention",
    "DropPath",
    "GatedMlp",
    "HeadGroup",
    "LayerKVCache",
    "LayerScale",
    "LayerState",
    "Mlp",
    "RotaryEmbedding",
    "RotaryEmbedding2D",
    "apply_rotary",
    "attend_cached",
    "edge_feature_attention",
    "make_mlp",
    "make_norm",
    "parse_heads",
    "resolve_layer_heads",
    "set_recompute",
]
