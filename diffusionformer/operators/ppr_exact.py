r"""Exact personalised PageRank :math:`\alpha (I - (1 - \alpha) P)^{-1}` by a dense solve."""

from __future__ import annotations

import torch
from torch import Tensor

from diffusionformer.operators.base import DiffusionOperator, check_real
from diffusionformer.operators.registry import register_operator
from diffusionformer.ops.recompute import _in_place_allowed

__all__ = ["ExactPPROperator"]


@register_operator
class ExactPPROperator(DiffusionOperator):
    r"""Personalised PageRank in closed form, :math:`f(P) = \alpha\,(I - (1-\alpha) P)^{-1}` (dense only).

    The limit ``K -> infinity`` of the truncated :class:`~diffusionformer.operators.PPROperator`
    (APPNP, Gasteiger et al., ICLR 2019): the stationary state of a walk on ``P`` that
    teleports home with probability ``alpha``. On an eigenvalue :math:`\lambda` of ``P`` it
    acts as :math:`\alpha / (1 - (1-\alpha)\lambda)`: 1 on the constant mode, a low-pass filter
    whose cut-off sharpens as ``alpha -> 0``. Since :math:`|\lambda| \le 1` the matrix
    :math:`I - (1-\alpha)P` is strictly diagonally dominant for ``alpha > 0``, so the solve is
    always well posed. It costs one ``O(N^3)`` solve per head and needs the materialised
    ``P``, so it suits short sequences and serves as the reference the truncated series
    approximates; it refuses the sparse back-end. Under a causal mask ``P`` is lower
    triangular, and :meth:`apply_causal_matrix` solves by forward substitution in ``O(N^2)``
    per column instead. Its condition number grows like ``1 / alpha``: the causal solve stays
    accurate for any ``alpha`` whose :math:`v_0 / \alpha` fits the dtype (its diagonal is formed
    as :math:`\alpha + (1-\alpha)(1 - P_{ii})`; the first row's pivot is ``alpha`` itself, so
    ``alpha`` below about ``1e-38`` in float32 or ``1e-300`` in float64 overflows), while the LU
    solve loses about :math:`\epsilon / \alpha` (rounding of ``P`` included): without a causal
    mask run the layer in float64 for ``alpha < 1e-3``, and expect no accuracy from float64
    either below about ``1e-12``.

    Args:
        alpha: teleport probability in ``(0, 1]``.
        num_heads: number of heads ``G`` this instance serves.

    Shapes:
        :meth:`apply_matrix`: ``P`` ``(B, G, N, N)``, ``v`` ``(B, G, N, C)`` -> ``(B, G, N, C)``.

    Examples:
        >>> P = torch.full((1, 1, 2, 2), 0.5); v = torch.tensor([[[[1.], [3.]]]])
        >>> ExactPPROperator(alpha=1.0).apply_matrix(P, v).flatten().tolist()
        [1.0, 3.0]
        >>> ExactPPROperator(alpha=0.5).apply_matrix(P, v).flatten().tolist()
        [1.5, 2.5]
    """

    name = "ppr-exact"
    aliases = ("exact-ppr", "pagerank-exact", "appnp-exact")
    supports_sparse = False
    is_polynomial = False
    example_kwargs = {"alpha": 0.2}
    _takes_float32_P = True  # the solve runs in float32: P's gradient would overflow float16

    def __init__(self, alpha: float = 0.1, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        alpha = check_real(alpha, "alpha")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must lie in (0, 1], got {alpha}")
        self.alpha = float(alpha)

    def spec_kwargs(self) -> dict:
        return {"alpha": self.alpha}

    @property
    def degree(self) -> int:
        raise NotImplementedError("ppr-exact is not a polynomial in P: it has no finite degree")

    def coefficients(self) -> Tensor:
        raise NotImplementedError(
            "ppr-exact is not a polynomial in P; use apply_matrix() on a materialised P "
            "(the dense back-end does this automatically), or 'ppr' for the truncated series"
        )

    def check_attention_dropout(self, p: float) -> None:
        r"""Dropout on ``P`` needs ``p < alpha``, else :math:`I - (1-\alpha) P` may be singular.

        Inverted dropout scales the kept entries of a row by ``1/(1-p)``, so a row of the dropped
        ``P`` sums to at most ``1/(1-p)`` and :math:`I - (1-\alpha) P` stays strictly diagonally
        dominant (invertible) exactly when :math:`(1-\alpha)/(1-p) < 1`, i.e. ``p < alpha``. At
        ``p >= alpha`` it can be singular: the first row of a causal ``P`` is ``[1, 0, ...]``, and
        with ``p = alpha`` its kept entry becomes ``1/(1-\alpha)``.

        Examples:
            >>> ExactPPROperator(alpha=0.2).check_attention_dropout(0.2)
            Traceback (most recent call last):
            ...
            ValueError: ppr-exact(alpha=0.2) with attention dropout 0.2: ...
        """
        if p >= self.alpha:
            raise ValueError(
                f"ppr-exact(alpha={self.alpha:g}) with attention dropout {p:g}: dropout scales the kept entries of P "
                f"by 1/(1-p), so I - (1 - alpha) P is only guaranteed invertible for dropout < alpha; lower the "
                f"layer's dropout below {self.alpha:g} or raise alpha above {p:g}"
            )

    def apply_matrix(self, P: Tensor, v: Tensor) -> Tensor:
        return self._solve(P, v, lower_triangular=False)

    def apply_causal_matrix(self, P: Tensor, v: Tensor) -> Tensor:
        r"""As :meth:`apply_matrix` for a lower-triangular ``P`` (a causal call).

        :math:`I - (1-\alpha) P` is then lower triangular with diagonal
        :math:`1 - (1-\alpha) P_{ii} \ge \alpha > 0`, so forward substitution
        (``torch.linalg.solve_triangular``, ``O(N^2)`` per column) replaces the LU solve
        (``O(N^3)``). Only the lower triangle of ``P`` is read: its strictly upper part, zero
        under the causal mask, gets no gradient.
        """
        return self._solve(P, v, lower_triangular=True)

    def _solve(self, P: Tensor, v: Tensor, *, lower_triangular: bool) -> Tensor:
        work = torch.float64 if torch.float64 in (P.dtype, v.dtype) else torch.float32  # the wider of the two, >= fp32
        P = P.to(work)
        system = P * -(1.0 - self.alpha)  # the off-diagonal part of I - (1 - alpha) P, (B, G, N, N)
        # its diagonal as alpha + (1 - alpha)(1 - P_ii), not 1 - (1 - alpha) P_ii: in float32, 1 - alpha rounds to 1
        # for alpha < 6e-8, so a causal row 0 (P_00 = 1) had the diagonal 0 instead of alpha (an inf output), and
        # the cancellation cost digits of every diagonal entry with P_ii near 1 for small alpha
        diagonal = (1.0 - P.diagonal(dim1=-2, dim2=-1)) * (1.0 - self.alpha) + self.alpha
        if _in_place_allowed():
            system.diagonal(dim1=-2, dim2=-1).copy_(diagonal)
        else:  # out of place inside an eager torch.func transform (see _in_place_allowed)
            system = torch.diagonal_scatter(system, diagonal, dim1=-2, dim2=-1)
        if lower_triangular:
            out = torch.linalg.solve_triangular(system, v.to(work), upper=False)
        else:
            out = torch.linalg.solve(system, v.to(work))
        return (self.alpha * out).to(v.dtype)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:g}, num_heads={self.num_heads}"
