"""The two operators of the seed paper: attention ``P`` and the Laplacian head ``I - P``."""

from __future__ import annotations

import torch
from torch import Tensor

from diffusionformer.operators.base import DiffusionOperator
from diffusionformer.operators.registry import register_operator

__all__ = ["AttentionOperator", "LaplacianOperator"]


class _FixedOperator(DiffusionOperator):
    _coeffs: tuple[float, ...] = ()

    def __init__(self, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.register_buffer("_c", torch.tensor(self._coeffs), persistent=False)

    @property
    def degree(self) -> int:
        return len(self._coeffs) - 1

    def coefficients(self) -> Tensor:
        return self._c

    def static_coefficients(self) -> tuple[float, ...]:
        return self._coeffs


@register_operator
class AttentionOperator(_FixedOperator):
    r"""Standard softmax attention, :math:`f(P) = P`.

    The head averages the values of the tokens it attends to: a low-pass operator that moves
    the sequence mean (Vaswani et al., 2017). Coefficients ``(0, 1)``.

    Args:
        num_heads: number of heads ``G`` this instance serves.

    Shapes:
        :meth:`coefficients`: ``(2,)``.

    Examples:
        >>> AttentionOperator().coefficients()
        tensor([0., 1.])
    """

    name = "attention"
    aliases = ("P", "softmax", "attn")
    _coeffs = (0.0, 1.0)


@register_operator
class LaplacianOperator(_FixedOperator):
    r"""The Laplacian head, :math:`f(P) = I - P` (Zhang & Papyan, arXiv 2602.09297).

    ``I - P`` is the random-walk graph Laplacian of the token graph. Since ``(I - P) 1 = 0``
    the head ignores a constant shift of the values and acts only on within-sequence
    variation. A residual update ``x - tau (I - P) x`` is one explicit Euler step of the heat
    equation ``dx/dt = -(I - P) x`` (the gain ``tau`` is learned by the value and output
    projections). Costs the same fused call as attention (``v - sdpa(q, k, v)``)
    and adds no parameters. Coefficients ``(1, -1)``.

    Args:
        num_heads: number of heads ``G`` this instance serves.

    Shapes:
        :meth:`coefficients`: ``(2,)``.

    Examples:
        >>> LaplacianOperator().coefficients()
        tensor([ 1., -1.])
    """

    name = "laplacian"
    aliases = ("I-P", "lap", "laplace", "graph-laplacian")
    _coeffs = (1.0, -1.0)
