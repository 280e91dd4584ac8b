r"""The uniform map :math:`DC\,x` without an attention call, for masks known from the call's structure.

AttnScale's direct-current part averages the values over each row's admissible keys,

.. math::
    (DC\,x)_i = \frac{1}{|A_i|} \sum_{j \in A_i} x_j, \qquad (DC\,x)_i = 0 \text{ when } A_i = \emptyset.

The general form is a zero-score attention call (:meth:`~diffusionformer.ops.rivals.RivalContext.uniform`),
``O(N^2)`` per head. When the admissible set is known from the call's structure alone, a
reduction over keys does it in ``O(N)``:

* no mask: the plain mean over keys, one row broadcast to every query;
* a causal mask (``A_i = {j <= i}``): the cumulative mean, ``cumsum / count``;
* a mask over keys only (key padding, bool of shape ``(B, G, 1, M)``), with or without the
  causal mask: the masked (cumulative) sum over the masked (cumulative) count.

Sums run in float32 (float64 for float64 inputs), as the fused attention kernels accumulate;
the result has the dtype the attention call returns (the autocast dtype under autocast).
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffusionformer.ops._checks import _check_is_causal

__all__ = ["uniform_mean"]


def uniform_mean(x: Tensor, key_mask: Tensor | None = None, *, is_causal: bool = False) -> Tensor:
    r""":math:`DC\,x` for self-attention (queries = keys): no mask, causal, a mask over keys, or both.

    Args:
        x: the signal over the keys.
        key_mask: bool, True = admissible key, the same for every query: four dimensions
            ``(B or 1, G or 1, 1, M)``; ``None`` admits every key.
        is_causal: query ``i`` admits only keys ``j <= i`` (as well).

    Shapes:
        ``x``: ``(B, G, M, C)``; ``key_mask``: ``(B, G, 1, M)``, ``B`` and ``G`` possibly 1 -> ``(B, G, M, C)``.

    Examples:
        >>> x = torch.tensor([[[[1.], [3.], [5.]]]])
        >>> uniform_mean(x).flatten().tolist()
        [3.0, 3.0, 3.0]
        >>> uniform_mean(x, is_causal=True).flatten().tolist()
        [1.0, 2.0, 3.0]
        >>> uniform_mean(x, torch.tensor([False, True, True]).view(1, 1, 1, 3), is_causal=True).flatten().tolist()
        [0.0, 3.0, 4.0]
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor of shape (B, G, M, C), got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"x must have shape (B, G, M, C), got {tuple(x.shape)}")
    if not x.is_floating_point():  # an integer x would be averaged into truncated integers
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    _check_is_causal(is_causal)
    M = x.shape[-2]
    if key_mask is not None:
        if not isinstance(key_mask, Tensor):
            raise TypeError("key_mask must be a bool tensor of shape (B, G, 1, M) or None, "
                            f"got {type(key_mask).__name__}")
        if key_mask.device != x.device:
            raise ValueError(f"key_mask must be on the device of x ({x.device}), got {key_mask.device}")
        if key_mask.dtype != torch.bool:
            raise TypeError(f"key_mask must be bool (True = admissible key), got {key_mask.dtype}")
        if key_mask.dim() != 4 or key_mask.shape[-2] != 1 or key_mask.shape[-1] != M:
            raise ValueError(f"key_mask must have shape (B, G, 1, M) with M = {M}, got {tuple(key_mask.shape)}")
        if key_mask.shape[0] not in (1, x.shape[0]) or key_mask.shape[1] not in (1, x.shape[1]):
            B, G = x.shape[0], x.shape[1]
            raise ValueError(f"key_mask must have shape (B or 1, G or 1, 1, M) = ({B} or 1, {G} or 1, 1, {M}), "
                             f"got {tuple(key_mask.shape)}")
    out_dtype = x.dtype
    # no autocast on the meta device (shape inference of a deferred-init model), whose is_autocast_enabled raises
    if x.dtype != torch.float64 and torch.amp.is_autocast_available(x.device.type) and \
            torch.is_autocast_enabled(x.device.type):
        out_dtype = torch.get_autocast_dtype(x.device.type)  # what the attention call would return
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    xs = x.to(out_dtype).to(work)  # the values the attention call would read, summed in `work`
    if key_mask is None:
        if not is_causal:
            return xs.mean(dim=-2, keepdim=True).expand_as(xs).to(out_dtype)
        count = torch.arange(1, M + 1, dtype=work, device=x.device).view(M, 1)  # (M, 1)
        return (xs.cumsum(dim=-2) / count).to(out_dtype)
    w = key_mask.transpose(-1, -2).to(work)  # (B, G, M, 1)
    wx = xs * w
    if is_causal:
        total, count = wx.cumsum(dim=-2), w.cumsum(dim=-2)
    else:
        total, count = wx.sum(dim=-2, keepdim=True), w.sum(dim=-2, keepdim=True)
    # rows without an admissible key: total and count are both 0 -> a zero row
    out = total / count.clamp_min(1.0)
    return out.expand(*torch.broadcast_shapes(out.shape, xs.shape)).to(out_dtype)
