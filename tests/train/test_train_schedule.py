from __future__ import annotations

import math

import pytest

from diffusionformer.train import cosine_lr

KW = dict(lr=1.0, min_lr=0.1, warmup_steps=4, decay_steps=14)


def test_warmup_is_linear_to_peak():
    values = [cosine_lr(s, **KW) for s in range(5)]
    assert values == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_cosine_endpoints_midpoint_and_floor():
    assert cosine_lr(4, **KW) == 1.0
    assert cosine_lr(9, **KW) == pytest.approx(0.55)  # halfway: (lr + min_lr) / 2
    assert cosine_lr(14, **KW) == pytest.approx(0.1)
    assert cosine_lr(100, **KW) == 0.1
    # a quarter of the way: min + (1 + cos(pi / 4)) / 2 * (lr - min)
    kw = dict(lr=1.0, min_lr=0.0, warmup_steps=0, decay_steps=8)
    assert cosine_lr(2, **kw) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))


def test_monotone_after_warmup_and_no_warmup():
    values = [cosine_lr(s, **KW) for s in range(4, 20)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert cosine_lr(0, lr=0.5, min_lr=0.0, warmup_steps=0, decay_steps=10) == 0.5
    # decay_steps == warmup_steps: peak never held, straight to the floor
    assert cosine_lr(3, lr=1.0, min_lr=0.2, warmup_steps=3, decay_steps=3) == 0.2


def test_bad_arguments():
    with pytest.raises(ValueError, match="expected step >= 0, got -1"):
        cosine_lr(-1, **KW)
    with pytest.raises(ValueError, match=r"decay_steps >= warmup_steps \(4\), got 2"):
        cosine_lr(0, lr=1.0, min_lr=0.0, warmup_steps=4, decay_steps=2)
