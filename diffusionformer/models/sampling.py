r"""Filters on next-token logits for sampling: top-k and nucleus (top-p)."""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from diffusionformer.ops._checks import checks_values

__all__ = ["top_k_filter", "top_p_filter"]


def _check_logits(name: str, logits: object) -> Tensor:
    """``logits`` as given when it is a floating-point tensor with a vocabulary dimension, whose entries are
    real numbers or ``-inf`` (a removed token), else a TypeError or ValueError naming the filter.

    NaN and ``+inf`` are read on CPU in eager mode only (:func:`~diffusionformer.ops._checks.checks_values`):
    a NaN row kept every token (``top_k``: NaN ranks above every number, so the ``k``-th largest
    could be NaN) and ``+inf`` made the probabilities of ``top_p`` NaN, which kept every token too.
    """
    if not isinstance(logits, Tensor):
        raise TypeError(f"{name}: logits must be a torch.Tensor of shape (B, V), got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"{name}: logits must be a floating-point tensor, got {logits.dtype}")
    if logits.dim() == 0:
        raise ValueError(f"{name}: logits must have shape (B, V) (or (V,)), got a 0-d tensor")
    if checks_values(logits) and logits.numel() > 0:
        bad = torch.isnan(logits) | (logits == float("inf"))
        if bad.any():
            where = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{name}: logits must be finite or -inf (a removed token), got "
                             f"{logits[where].item()} at index {where}")
    return logits


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest logits of each row (ties with the ``k``-th kept), the rest ``-inf``.

    Args:
        logits: ``(B, V)``.
        k: a positive int (clipped to ``V``); anything else is a ``ValueError``.

    Examples:
        >>> top_k_filter(torch.tensor([[1.0, 3.0, 2.0]]), 2)
        tensor([[-inf, 3., 2.]])
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:  # numpy ints too
        raise ValueError(f"top_k: expected a positive int, got {k!r}")
    _check_logits("top_k", logits)
    kth = torch.topk(logits, min(int(k), logits.shape[-1])).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    r"""Nucleus filtering (Holtzman et al., "The Curious Case of Neural Text Degeneration", ICLR
    2020): keep the smallest set of most likely tokens whose probability sums to at least ``p``.

    With the row's probabilities sorted, :math:`\pi_{(1)} \ge \pi_{(2)} \ge \dots`, token
    :math:`(r)` is kept iff :math:`\sum_{s < r} \pi_{(s)} < p`: the most likely token is
    always kept, and ``p = 1`` keeps every token (a copy of the logits, as for any ``p``). The
    running mass is summed in float64 (float32 on MPS, which has no float64), without the
    cancellation of ``cumsum - probs``: the mass compared with ``p`` carries float64 rounding
    (``~V * 1e-16``) instead of float32's (``~1e-7`` and up), which dropped or kept tokens.
    Tokens tied in probability at the edge of the kept set are ranked by an unstable sort:
    which of them are kept is not specified (:func:`top_k_filter`, by contrast, keeps every
    token tied with the ``k``-th).

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
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 < p <= 1.0:  # numpy floats too
        raise ValueError(f"top_p: expected a float in (0, 1], got {p!r}")
    p = float(p)  # a Fraction passed the check, then failed "'>=' not supported between Tensor and Fraction"
    _check_logits("top_p", logits)
    if p >= 1.0:  # every token: the mass before the last one is < 1 in exact arithmetic, not in float
        return logits.clone()  # a new tensor, as for p < 1: writing into the result left the caller's logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    dtype = torch.float32 if logits.device.type == "mps" else torch.float64
    probs = torch.softmax(sorted_logits.to(dtype), dim=-1)
    # (B, V): probability of the better-ranked tokens, an exclusive cumulative sum
    mass_before = torch.nn.functional.pad(probs[..., :-1].cumsum(dim=-1), (1, 0))
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))
