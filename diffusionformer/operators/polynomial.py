r"""Learned polynomial filters in ``P`` (GPR-GNN style)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from diffusionformer.operators.base import DiffusionOperator, check_finite_parameter
from diffusionformer.operators.registry import build_operator, register_operator

__all__ = ["PolynomialOperator"]


@register_operator
class PolynomialOperator(DiffusionOperator):
    r"""A learned polynomial :math:`f(P) = \sum_{k=0}^{K} \theta_k P^k`, one ``theta`` per head.

    The generalised PageRank filter of GPR-GNN (Chien, Peng, Li & Milenkovic, ICLR 2021) on
    the attention graph: training chooses low-pass (attention-like), high-pass
    (Laplacian-like) or band filters. Any other polynomial operator can serve as the
    initialisation.

    Args:
        steps: ``K``.
        init: initial coefficients: an operator spec (``"attention"``, ``"laplacian"``,
            ``"heat(t=1)"``, an operator instance), or a tensor/list of shape ``(K'+1,)`` or
            ``(G, K'+1)`` with ``K' <= K`` (zero-padded to ``K``).
        num_heads: number of heads ``G`` this instance serves.

    Shapes:
        :meth:`coefficients`: ``(G, K+1)``.

    Examples:
        >>> PolynomialOperator(steps=3, init="laplacian").coefficients()
        tensor([[ 1., -1.,  0.,  0.]], grad_fn=<MulBackward0>)
    """

    name = "polynomial"
    aliases = ("poly", "gpr", "gprgnn", "learned-polynomial")
    example_kwargs = {"steps": 3, "init": [0.1, 0.6, 0.2, 0.1]}

    def __init__(self, steps: int = 3, init: Any = "attention", num_heads: int = 1) -> None:
        super().__init__(num_heads)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be a non-negative int, got {steps!r}")
        self.steps = steps
        self._init = init.spec() if isinstance(init, DiffusionOperator) else (
            torch.as_tensor(init).tolist() if isinstance(init, (Tensor, list, tuple)) else init)
        theta = self._initial(init, steps, num_heads)
        self.theta = nn.Parameter(theta)

    @staticmethod
    def _initial(init: Any, steps: int, G: int) -> Tensor:
        if isinstance(init, (Tensor, list, tuple)):
            c = torch.as_tensor(init, dtype=torch.float32).detach().clone()
        else:
            op = build_operator(init)
            if not op.is_polynomial:
                raise ValueError(f"cannot initialise a polynomial from {op.name!r}, which is not a polynomial in P")
            c = op.coefficients().detach().float()
        if c.dim() == 1:
            c = c.unsqueeze(0).expand(G, -1)
        if c.dim() != 2 or c.shape[0] != G:
            raise ValueError(f"init coefficients must have shape (K+1,) or ({G}, K+1), got {tuple(c.shape)}")
        if c.shape[1] > steps + 1:
            raise ValueError(
                f"init has degree {c.shape[1] - 1}, more than steps={steps}; raise steps or truncate init"
            )
        if not torch.isfinite(c).all():
            raise ValueError("init coefficients must be finite")
        out = torch.zeros(G, steps + 1)
        out[:, : c.shape[1]] = c
        return out

    def spec_kwargs(self) -> dict:
        return {"steps": self.steps, "init": self._init}

    @property
    def degree(self) -> int:
        return self.steps

    def coefficients(self) -> Tensor:
        check_finite_parameter(self, "theta", self.theta)
        return self.theta * 1.0

    def extra_repr(self) -> str:
        return f"steps={self.steps}, num_heads={self.num_heads}"
