r"""Associative recall, the synthetic test of in-context lookup used for H3 (Fu et al., "Hungry
Hungry Hippos", ICLR 2023) and Zoology (Arora et al., "Zoology: Measuring and Improving
Recall in Efficient Language Models", 2023).

A sequence lists ``P`` key-value pairs and ends with a query key:

.. math::  k_1\, v_1\, k_2\, v_2 \dots k_P\, v_P\, q, \qquad q = k_j,

and the model must output :math:`v_j` after reading :math:`q`. Keys come from the lower half
of the vocabulary ``[0, V // 2)`` and are distinct within a sequence (so the answer is
unique); values come from the upper half ``[V // 2, V)`` and may repeat. ``T = 2P + 1``.
Targets are :data:`~diffusionformer.data.base.IGNORE_INDEX` everywhere but the last position.

With ``num_queries = Q > 1`` (multi-query associative recall, Zoology's MQAR) the pairs are
followed by ``Q`` distinct query keys of the sequence, each with its value as the target at its
own position, ``T = 2P + Q``: ``Q`` training signals per sequence instead of one.
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor

from .base import IGNORE_INDEX, SequenceTaskData, _as_count, _is_bool
from .registry import register_dataset
from .splits import generator as seeded_generator
from .splits import _require_generator, require_heldout, split_sizes

__all__ = ["make_assoc_recall", "load_assoc_recall"]


#: Random numbers drawn at once for the keys: the rows of ``rand(N, V // 2).argsort(1)`` are made a block at a time.
_KEY_BLOCK = 1 << 20

#: Largest key range ``V // 2``: float32 uniforms take only ``2**24`` values, and one row already holds ``V // 2``.
_MAX_KEYS = 1 << 24


def _distinct_keys(N: int, num_keys: int, P: int, generator: torch.Generator | None) -> Tensor:
    """``rand(N, num_keys).argsort(dim=1)[:, :P]`` (``P`` distinct keys per row), made ``_KEY_BLOCK // num_keys`` rows
    at a time: the same numbers from the same generator, without the ``(N, num_keys)`` tensor (``N = 10**4``,
    ``V = 131072`` held 8 GB)."""
    rows = max(1, _KEY_BLOCK // num_keys)
    blocks = [torch.rand(min(rows, N - start), num_keys, generator=generator).argsort(dim=1)[:, :P].clone()
              for start in range(0, N, rows)]
    return torch.cat(blocks)  # (N, P)


def _int_or_same(value: object) -> object:
    """``value`` as a Python int when it is an integer other than a bool (NumPy and 0-d tensor ints too), else as is."""
    if _is_bool(value):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def make_assoc_recall(
    num_examples: int, num_pairs: int, vocab_size: int, generator: torch.Generator, num_queries: int = 1
) -> tuple[Tensor, Tensor]:
    """Generate associative-recall inputs and targets (see the module docstring).

    Args:
        num_examples: ``N``.
        num_pairs: ``P`` key-value pairs per sequence; at most ``vocab_size // 2``.
        vocab_size: ``V`` in ``[4, 2**25 + 1]``; keys ``[0, V // 2)``, values ``[V // 2, V)``.
        generator: source of randomness.
        num_queries: ``Q`` distinct keys queried per sequence, in ``[1, P]`` (``Q = 1`` draws
            exactly what earlier versions drew).

    Shapes:
        - inputs, targets: ``(N, 2P + Q)`` int64

    Examples:
        >>> x, y = make_assoc_recall(3, 2, 8, torch.Generator().manual_seed(0))
        >>> x.shape, bool((y[:, :-1] == -100).all())
        (torch.Size([3, 5]), True)
        >>> bool(((x[:, 0:-1:2] == x[:, -1:]) & (x[:, 1::2] == y[:, -1:])).any(1).all())
        True
    """
    num_examples, num_pairs, vocab_size = (_as_count(name, v) for name, v in (
        ("num_examples", num_examples), ("num_pairs", num_pairs), ("vocab_size", vocab_size)))
    num_queries = _int_or_same(num_queries)  # a numpy int (or a 0-d int tensor, as num_pairs) as the int it equals
    _require_generator(generator, "make_assoc_recall")
    if num_examples < 1:
        raise ValueError(f"num_examples must be >= 1, got {num_examples}")
    if vocab_size < 4:
        raise ValueError(f"vocab_size must be >= 4, got {vocab_size}")
    num_keys = vocab_size // 2
    if num_keys > _MAX_KEYS:
        raise ValueError(
            f"vocab_size must be at most {2 * _MAX_KEYS + 1} (keys are drawn as random orders of the "
            f"vocab_size // 2 key tokens, {_MAX_KEYS} at most), got {vocab_size}"
        )
    if not 1 <= num_pairs <= num_keys:
        raise ValueError(
            f"num_pairs must be in [1, vocab_size // 2 = {num_keys}] so that keys are distinct, "
            f"got {num_pairs}"
        )
    if isinstance(num_queries, bool) or not isinstance(num_queries, int) or not 1 <= num_queries <= num_pairs:
        raise ValueError(f"num_queries must be an int in [1, num_pairs = {num_pairs}], got {num_queries!r}")
    N, P, Q = num_examples, num_pairs, num_queries
    keys = _distinct_keys(N, num_keys, P, generator)  # (N, P) distinct
    values = torch.randint(num_keys, vocab_size, (N, P), generator=generator)  # (N, P)
    if Q == 1:
        which = torch.randint(0, P, (N, 1), generator=generator)  # (N, 1) queried pair
    else:
        which = torch.rand(N, P, generator=generator).argsort(dim=1)[:, :Q]  # (N, Q) distinct pairs
    query = keys.gather(1, which)  # (N, Q)
    answer = values.gather(1, which)  # (N, Q)
    pairs = torch.stack([keys, values], dim=2).reshape(N, 2 * P)  # k1 v1 k2 v2 ...
    inputs = torch.cat([pairs, query], dim=1)  # (N, 2P + Q)
    targets = torch.full_like(inputs, IGNORE_INDEX)
    targets[:, 2 * P :] = answer
    return inputs, targets


@register_dataset("assoc-recall", kind="sequence_lm")
def load_assoc_recall(
    *,
    seed: int = 0,
    num_examples: int = 10_000,
    num_pairs: int = 8,
    vocab_size: int = 64,
    num_queries: int = 1,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
) -> SequenceTaskData:
    """Seeded associative-recall examples split into train/val/test (default 80/10/10).

    Args:
        seed: seed of the generator.
        num_examples: total examples over the three splits.
        num_pairs: key-value pairs per sequence (``T = 2 * num_pairs + num_queries``).
        vocab_size: token vocabulary (keys in the lower half, values in the upper half).
        num_queries: queried keys per sequence (multi-query recall for ``> 1``).
        val_fraction, test_fraction: shares of the examples in val and test.

    Shapes:
        - x, y of each split: ``(N_split, 2 * num_pairs + num_queries)`` int64
    """
    num_examples = _as_count("num_examples", num_examples)
    # the sizes as the ints they equal: a numpy vocab_size was the data's vocab_size, a 0-d tensor the meta's num_pairs
    num_pairs, vocab_size = _as_count("num_pairs", num_pairs), _as_count("vocab_size", vocab_size)
    num_queries = _int_or_same(num_queries)
    if num_examples < 1:
        raise ValueError(f"num_examples must be >= 1, got {num_examples}")
    n_train, n_val, n_test = split_sizes(num_examples, val_fraction, test_fraction)
    require_heldout("assoc-recall", (n_train, n_val, n_test), val_fraction, test_fraction)
    if n_train == 0:  # else the first training step's torch.randint(0, 0) ("expects 'from' to be less than 'to'")
        raise ValueError(
            f"assoc-recall: val_fraction={val_fraction} and test_fraction={test_fraction} leave the train split "
            f"empty ({n_val} + {n_test} of {num_examples} examples held out); use more examples or smaller fractions"
        )
    x, y = make_assoc_recall(num_examples, num_pairs, vocab_size, seeded_generator(seed), num_queries)
    a, b = n_train, n_train + n_val
    return SequenceTaskData(
        name="assoc-recall",
        x_train=x[:a],
        y_train=y[:a],
        x_val=x[a:b],
        y_val=y[a:b],
        x_test=x[b:],
        y_test=y[b:],
        vocab_size=vocab_size,
        meta={
            "source": "generated (H3 / Zoology-style associative recall)",
            "licence": "synthetic",
            "num_pairs": num_pairs,
            "num_queries": num_queries,
            "keys": [0, vocab_size // 2],
            "values": [vocab_size // 2, vocab_size],
            "seed": seed,
            "sizes": {"train": n_train, "val": n_val, "test": n_test},
        },
    )
