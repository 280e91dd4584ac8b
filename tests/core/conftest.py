"""Fixtures shared by the tests of tests/core (the files are imported by path: no imports between them)."""

from __future__ import annotations

import math

import pytest


def _rope_reference(x, pos, base):
    """RoFormer: pair ``(x_2i, x_2i+1)`` of token ``n`` rotated by ``pos[n] base^(-2i/C)``, one by one (``x``:
    ``(..., N, heads, C)``)."""
    C = x.shape[-1]
    out = x.clone()
    for n in range(x.shape[-3]):
        for i in range(C // 2):
            th = float(pos[n]) * base ** (-2 * i / C)
            a, b = x[..., n, :, 2 * i], x[..., n, :, 2 * i + 1]
            out[..., n, :, 2 * i] = a * math.cos(th) - b * math.sin(th)
            out[..., n, :, 2 * i + 1] = a * math.sin(th) + b * math.cos(th)
    return out


@pytest.fixture
def rope_ref():
    """The explicit RoPE rotation ``rope_ref(x, pos, base)``, an independent reference for RotaryEmbedding."""
    return _rope_reference
