r"""Differential attention (Ye et al., 2024): the difference of two softmax maps."""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from diffusionformer.operators.base import DiffusionOperator, check_finite_float, check_finite_parameter
from diffusionformer.operators.registry import register_operator

__all__ = ["DifferentialOperator", "lambda_init_schedule"]


def lambda_init_schedule(depth: int) -> float:
    r""":math:`\lambda_{init} = 0.8 - 0.6 \exp(-0.3\, l)` for the layer of 0-based index ``l``.

    While :func:`torch.compile` traces, it is the power :math:`0.8 - 0.6\, (e^{-0.3})^l` (equal up to rounding),
    which keeps a symbolic depth symbolic: one graph for every layer (see the performance page, "Recompiles").

    Examples:
        >>> round(lambda_init_schedule(0), 4), round(lambda_init_schedule(11), 4)
        (0.2, 0.7779)
    """
    if isinstance(depth, bool) or not isinstance(depth, numbers.Integral) or depth < 0:  # numpy ints too
        raise ValueError(f"depth must be a non-negative int, got {depth!r}")
    if torch.compiler.is_compiling():
        # as a power (equal up to rounding), which keeps a symbolic depth symbolic (a block compiled on its own reads
        # the state's depth): math.exp fixed it to its value, one graph per layer, past dynamo's recompile limit
        return 0.8 - 0.6 * math.exp(-0.3) ** depth
    return 0.8 - 0.6 * math.exp(-0.3 * int(depth))


@register_operator
class DifferentialOperator(DiffusionOperator):
    r"""Differential attention: :math:`(1-\lambda_{init})\,\mathrm{RMSNorm}\big((P_1 - \lambda P_2)\, v\big)`.

    From Ye, Dong, Xia, Sun, Zhu, Huang & Wei, "Differential Transformer" (2024); the layout
    follows the authors' reference ``multihead_diffattn.py`` (microsoft/unilm,
    ``Diff-Transformer/``). Each head of width ``C`` splits its query and key into two halves
    of width ``C/2`` (the reference's ``q.view(B, N, 2 H, C/2)``: half 1 gives map 1, half 2 map 2),

    .. math::
        P_i = \operatorname{softmax}\!\Big(\frac{q_i k_i^\top}{\sqrt{C/2}} + \text{mask}\Big),
        \qquad \lambda = e^{\lambda_{q1} \cdot \lambda_{k1}} - e^{\lambda_{q2} \cdot \lambda_{k2}} + \lambda_{init},

    subtracts the second map to cancel common-mode "attention noise", normalises each head's
    output with an RMSNorm over ``C`` (``eps = 1e-5``, learned gain) and scales it by
    :math:`1 - \lambda_{init}`, with :math:`\lambda_{init} = 0.8 - 0.6 e^{-0.3 l}` at layer
    ``l`` (0-based, :func:`lambda_init_schedule`). The re-parameterisation vectors
    :math:`\lambda_{q1}, \lambda_{k1}, \lambda_{q2}, \lambda_{k2} \in \mathbb{R}^{C/2}`
    (init :math:`\mathcal{N}(0, 0.1^2)`) and the RMSNorm gain are shared by the heads of one
    instance, as the reference shares them across a layer's heads.

    The operator adds ``4 (C/2) + C = 3C`` parameters per instance (a head group). The
    reference pairs ``H`` differential heads with a ``2H``-head baseline of width ``C/2``;
    here a differential head replaces one head of width ``C`` (same projections), so the
    layer's cost in projections is unchanged. ``P_1 - lambda P_2`` has rows summing to
    ``1 - lambda`` and is not a function of one ``P``; the operator declares
    ``needs_second_map`` and runs on any back-end through the layer's context.

    With a rotary embedding the layer rotates each head's full width ``C`` before the split
    (channel pairs ``(2i, 2i+1)``, ``head_dim`` divisible by 4), so map 1 sees the higher half
    of RoPE's frequencies and map 2 the lower half; the reference rotates each half at width
    ``C/2`` with the full range. Both maps' scores depend on relative positions alone either way.

    Args:
        depth: the layer index ``l`` for :math:`\lambda_{init}`; ``None`` (default) takes it from
            the model's :class:`~diffusionformer.ops.rivals.LayerState` (0 without one).
        lambda_init: a fixed :math:`\lambda_{init}` instead of the schedule.
        head_dim: ``C`` (even); set by the layer through :meth:`bind` when omitted.
        num_heads: number of heads ``G`` this instance serves.

    Examples:
        >>> op = DifferentialOperator(head_dim=8)
        >>> sum(p.numel() for p in op.parameters())
        24
    """

    name = "differential"
    aliases = ("diff-attention", "differential-attention", "diff-attn")
    is_polynomial = False
    needs_second_map = True
    example_kwargs = {"head_dim": 8, "depth": 2}

    def __init__(self, depth: int | None = None, lambda_init: float | None = None, head_dim: int | None = None,
                 num_heads: int = 1) -> None:
        super().__init__(num_heads)
        if depth is not None:
            lambda_init_schedule(depth)  # validates
            depth = int(depth)  # a numpy int: the spec writes a Python int
        self.depth = depth
        self.lambda_init = None if lambda_init is None else check_finite_float(lambda_init, "lambda_init")
        if self.lambda_init == 1.0:  # the output is scaled by 1 - lambda_init: a head of zeros that never learns
            raise ValueError("lambda_init=1 scales the head's output by 1 - lambda_init = 0 (a dead head that gets "
                             "no gradient); the paper's schedule gives 0.2 .. 0.8 (lambda_init=None uses it)")
        self.head_dim: int | None = None
        self._spec_head_dim = head_dim is not None  # given here, not bound by a layer: the spec must carry it
        if head_dim is not None:
            self.bind(head_dim=head_dim)

    def bind(self, *, head_dim: int) -> None:
        if isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral) or head_dim < 2 or head_dim % 2:
            raise ValueError(f"differential attention splits each head in two: head_dim must be an even int >= 2, got {head_dim!r}")
        head_dim = int(head_dim)
        if self.head_dim is not None:
            if self.head_dim != head_dim:
                raise ValueError(f"this differential operator was built for head_dim={self.head_dim}, the layer has {head_dim}")
            return
        self.head_dim = head_dim
        half = head_dim // 2
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, nn.Parameter(torch.zeros(half).normal_(mean=0.0, std=0.1)))
        self.subln = nn.RMSNorm(head_dim, eps=1e-5, elementwise_affine=True)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The four ``lambda`` vectors drawn again from N(0, 0.1^2) (in the order :meth:`bind` drew them) and the
        output RMSNorm's weight back to 1; an operator not yet bound to a head width has no parameters."""
        if self.head_dim is None:
            return
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(self, name).normal_(mean=0.0, std=0.1)
        self.subln.reset_parameters()

    def spec_kwargs(self) -> dict:
        kwargs: dict = {}
        if self.depth is not None:
            kwargs["depth"] = self.depth
        if self.lambda_init is not None:
            kwargs["lambda_init"] = self.lambda_init
        if self._spec_head_dim:  # a standalone operator's parameters have C/2 and C entries: rebuild them bound
            kwargs["head_dim"] = self.head_dim
        return kwargs

    @property
    def degree(self) -> int:
        raise NotImplementedError("differential attention uses two score maps; it is not a polynomial in one P")

    def coefficients(self) -> Tensor:
        raise NotImplementedError("differential attention is not a polynomial in P; the layer calls apply_context()")

    def init_value(self, depth: int = 0) -> float:
        """:math:`\\lambda_{init}` at layer ``depth`` (the fixed value, the ``depth`` argument, or the schedule)."""
        if self.lambda_init is not None:
            return self.lambda_init
        return lambda_init_schedule(self.depth if self.depth is not None else depth)

    def lambda_full(self, depth: int = 0) -> Tensor:
        r""":math:`\lambda = e^{\lambda_{q1}\cdot\lambda_{k1}} - e^{\lambda_{q2}\cdot\lambda_{k2}} + \lambda_{init}` (a scalar)."""
        if self.head_dim is None:
            raise ValueError("differential attention is not bound to a head width: call bind(head_dim=C) "
                             "or use it inside a DiffusionAttention")
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            check_finite_parameter(self, name, getattr(self, name))
        l1 = torch.exp((self.lambda_q1 * self.lambda_k1).sum())
        l2 = torch.exp((self.lambda_q2 * self.lambda_k2).sum())
        return l1 - l2 + self.init_value(depth)

    def apply_context(self, ctx) -> Tensor:  # noqa: ANN001
        C = ctx.q.shape[-1]
        lam = self.lambda_full(ctx.depth)  # raises when unbound
        check_finite_parameter(self, "subln.weight", self.subln.weight)  # the gain: a NaN would NaN every output
        if C != self.head_dim:
            raise ValueError(f"differential attention bound to head_dim={self.head_dim}, got heads of width {C}")
        half = C // 2
        scale = half**-0.5
        q1, q2 = ctx.q[..., :half], ctx.q[..., half:]
        k1, k2 = ctx.k[..., :half], ctx.k[..., half:]
        y = ctx.attend(q1, k1, ctx.v, scale=scale) - lam.to(ctx.v.dtype) * ctx.attend(q2, k2, ctx.v, scale=scale)
        work = torch.float64 if y.dtype == torch.float64 else torch.float32  # the norm in full precision,
        gain = self.subln.weight.to(work)  # its gain too: a half-precision gain beside float32 input makes rms_norm warn
        normed = F.rms_norm(y.to(work), self.subln.normalized_shape, gain, self.subln.eps)
        return (normed * (1.0 - self.init_value(ctx.depth))).to(y.dtype)

    def extra_repr(self) -> str:
        return f"depth={self.depth}, lambda_init={self.lambda_init}, head_dim={self.head_dim}, num_heads={self.num_heads}"
