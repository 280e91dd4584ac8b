r"""The combination step of fused layers: :math:`c_0 v + c_1 P v` on some heads, ``P v`` on the others.

A layer whose heads all use fixed coefficients on ``P^0`` and ``P^1`` (attention, the
Laplacian ``I - P`` of Zhang & Papyan, any ``a I + b P``) runs one fused attention call for
every head and then combines its output ``y = P v`` with ``v`` on the non-attention heads only.
At inference this is done in place; for training :class:`AffineHeads` touches every element
once in each direction (the fused kernel keeps ``y`` for its backward pass, so ``y`` itself
cannot be overwritten).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

__all__ = ["AffineRun", "AffineHeads", "combine_affine"]

#: ``(start, stop, c0, c1)``: heads ``start .. stop - 1`` output ``c0 v + c1 y``.
AffineRun = tuple[int, int, float, float]


def _apply_runs(out: Tensor, v: Tensor, runs: Sequence[AffineRun]) -> None:
    for start, stop, c0, c1 in runs:
        ys, vs = out[:, :, start:stop], v[:, :, start:stop]
        if c0 == 1.0 and c1 == -1.0:  # Laplacian: (I - P) v
            torch.sub(vs, ys, out=ys)
        else:
            ys.mul_(c1).add_(vs, alpha=c0)


class AffineHeads(torch.autograd.Function):
    """``out = y`` except on the runs, where ``out = c0 v + c1 y``; the coefficients are Python floats.

    Shapes:
        ``y``, ``v``: ``(B, N, H, C)`` -> ``(B, N, H, C)``.
    """

    @staticmethod
    def forward(ctx: Any, y: Tensor, v: Tensor, runs: tuple[AffineRun, ...]) -> Tensor:
        ctx.runs = runs
        out = y.clone(memory_format=torch.contiguous_format)
        _apply_runs(out, v, runs)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        dy = dv = None
        if ctx.needs_input_grad[0]:
            dy = grad.clone(memory_format=torch.contiguous_format)
            for start, stop, _, c1 in ctx.runs:
                dy[:, :, start:stop].mul_(c1)
        if ctx.needs_input_grad[1]:
            dv = torch.zeros_like(grad, memory_format=torch.contiguous_format)
            for start, stop, c0, _ in ctx.runs:
                torch.mul(grad[:, :, start:stop], c0, out=dv[:, :, start:stop])
        return dy, dv, None


def combine_affine(y: Tensor, v: Tensor, runs: Sequence[AffineRun]) -> Tensor:
    r"""``c0 v + c1 y`` on the heads of ``runs`` and ``y`` elsewhere (``y = P v`` per head).

    Without autograd history ``y`` is updated in place (and returned); otherwise through
    :class:`AffineHeads`. Scalars multiply in float32 even for half-precision tensors.

    Args:
        y: the fused attention output ``P v``.
        v: the values.
        runs: ``(start, stop, c0, c1)`` per run of non-attention heads.

    Shapes:
        ``y``, ``v``: ``(B, N, H, C)`` -> ``(B, N, H, C)``.

    Examples:
        >>> y = torch.ones(1, 1, 2, 1); v = torch.full((1, 1, 2, 1), 3.0)
        >>> combine_affine(y, v, [(1, 2, 1.0, -1.0)]).flatten().tolist()  # head 1 is Laplacian
        [1.0, 2.0]
    """
    if not (y.requires_grad or v.requires_grad):
        _apply_runs(y, v, runs)
        return y
    return AffineHeads.apply(y, v, tuple(runs))
