"""Tests written in a mutation audit (sitting 55b) of ``nn/heads.py``, ``nn/block.py``, ``models/vit.py``,
``models/dino.py``, ``data/augment.py``, ``data/ssl.py``, ``train/schedule.py`` and ``train/config.py``.

Each test kills a mutant the rest of the suite let through (its docstring names it). CPU only, deterministic.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.models.dino import DINOConfig, dino_loss
from diffusionformer.nn.block import DropPath
from diffusionformer.nn.heads import _split_count, parse_heads, split_top_level


# ---------------------------------------------------------------------------- nn/heads.py
def test_an_escaped_quote_inside_a_value_does_not_end_it():
    """Kills: ``_quoted_spans`` not reading ``\\`` as an escape (the value ``'p\\'q,r'`` ended at ``\\'``, so the
    next quote opened a value running to the end and the two items read as one)."""
    assert split_top_level("a(x='p\\'q,r'),b") == ["a(x='p\\'q,r')", "b"]


def test_a_quote_outside_parentheses_is_not_a_value():
    """Kills: quotes read as values at depth 0 too (``depth >= 0``): operator arguments are inside parentheses, and
    a stray apostrophe in an item swallowed the separators after it."""
    assert split_top_level("it's,b") == ["it's", "b"]


def test_a_count_colon_at_the_start_of_an_item_is_found():
    """Kills: the backwards scan of ``_count_colon`` stopping before index 0 (``':2'`` read as the name ``':2'``)."""
    assert _split_count(":2") == ("", 2)


def test_a_negative_count_of_several_digits_is_named_negative():
    """Kills: the negative-count pattern ``-[0-9]+`` narrowed to one digit (``-12`` was "must be an integer")."""
    with pytest.raises(ValueError, match=r"head count must be non-negative, got -12"):
        parse_heads("attention:-12", 4)


# ---------------------------------------------------------------------------- nn/block.py
def test_drop_path_of_zero_draws_nothing_in_training():
    """Kills: ``DropPath.forward``'s ``p == 0`` shortcut dropped (a draw from the global generator per call, so
    the model's random stream, and a seeded run, changed with a no-op layer)."""
    layer = DropPath(0.0).train()
    x = torch.randn(3, 4)
    torch.manual_seed(0)
    out = layer(x)
    after = torch.rand(1)
    torch.manual_seed(0)
    assert out is x and torch.equal(after, torch.rand(1))


# ---------------------------------------------------------------------------- models/dino.py
def test_dino_loss_refuses_zero_output_dimensions():
    """Kills: the ``K >= 1`` check dropped (a loss over no output dimension)."""
    with pytest.raises(ValueError, match=r"at least one sample and one output dimension, got B=2, K=0"):
        dino_loss(torch.zeros(2, 2, 0), torch.zeros(1, 2, 0), torch.zeros(0), 0.1, 0.04)


def test_dino_config_refuses_a_negative_teacher_temperature_warmup():
    """Kills: ``DINOConfig.warmup_teacher_temp_steps < 0`` relaxed to ``< -1`` (``-1`` read as no warm-up)."""
    with pytest.raises(ValueError, match=r"warmup_teacher_temp_steps must be an int >= 0, got -1"):
        DINOConfig(warmup_teacher_temp_steps=-1)
