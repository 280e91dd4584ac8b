r"""Filters on next-token logits for sampling: top-k and nucleus (top-p)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["top_k_filter", "top_p_filter"]


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest logits of each row (ties with the ``k``-th kept), the rest ``-inf``.

    Args:
        logits: ``(B, V)``.
        k: a positive int (clipped to ``V``).

    Examples:
        >>> top_k_filter(torch.tensor([[1.0, 3.0, 2.0]]), 2)
        tensor([[-inf, 3., 2.]])
    """
    kth = torch.topk(logits, min(k, logits.shape[-1])).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    r"""Nucleus filtering (Holtzman et al., "The Curious Case of Neural Text Degeneration", ICLR
    2020): keep the smallest set of most likely tokens whose probability sums to at least ``p``.

    With the row's probabilities sorted, :math:`\pi_{(1)} \ge \pi_{(2)} \ge \dots`, token
    :math:`(r)` is kept iff :math:`\sum_{s < r} \pi_{(s)} < p`: the most likely token is
    always kept, and ``p = 1`` keeps every token.

    Args:
        logits: ``(B, V)`` (already divided by the temperature).
        p: a float in ``(0, 1]``.

    Shapes:
        ``(B, V) -> (B, V)``; removed entries are ``-inf``.

    Examples:
        >>> logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
        >>> top_p_filter(logits, 0.75).isfinite()                # 0.5 < 0.75 <= 0.5 + 0.3
        tensor([[ True,  True, False]])
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
        raise ValueError(f"top_p: expected a float in (0, 1], got {p!r}")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # (B, V): probability of the better-ranked tokens
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))
