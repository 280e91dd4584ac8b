"""Modules: :class:`DiffusionAttention` and (in :mod:`diffusionformer.nn.block`) transformer blocks."""

from diffusionformer.nn.attention import AttentionIntermediates, DiffusionAttention
from diffusionformer.nn.heads import HeadGroup, parse_heads

__all__ = ["AttentionIntermediates", "DiffusionAttention", "HeadGroup", "parse_heads"]
