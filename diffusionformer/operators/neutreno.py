r"""Cross-layer rivals that read the first layer's values: NeuTRENO and value residuals (ResFormer)."""

from __future__ import annotations

from torch import Tensor

from diffusionformer.operators.base import DiffusionOperator, check_finite_float
from diffusionformer.operators.registry import register_operator

__all__ = ["NeuTRENOOperator", "ValueResidualOperator"]


def _check_lambda(value: object, name: str) -> float:
    return check_finite_float(value, name)


class _FirstLayerValuesOperator(DiffusionOperator):
    """Shared part of the operators that read the first layer's values ``v0`` from the layer state.

    Subclasses set ``name``, ``example_kwargs``, the default ``lam`` and :meth:`apply_context`.
    """

    is_polynomial = False
    needs_layer_state = True

    def __init__(self, lam: float, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        self.lam = _check_lambda(lam, "lam")

    def spec_kwargs(self) -> dict:
        return {"lam": self.lam}

    @property
    def degree(self) -> int:
        raise NotImplementedError(f"{self.name} reads the first layer's values; it is not a polynomial in P")

    def coefficients(self) -> Tensor:
        raise NotImplementedError(f"{self.name} is not a polynomial in P; the layer calls apply_context()")

    def extra_repr(self) -> str:
        return f"lam={self.lam:g}, num_heads={self.num_heads}"


@register_operator
class NeuTRENOOperator(_FirstLayerValuesOperator):
    r"""NeuTRENO: :math:`P v + \lambda (v_0 - v)`, with :math:`v_0` the first layer's values.

    From Nguyen, Nguyen & Baraniuk, "Mitigating Over-smoothing in Transformers via Regularized
    Nonlocal Functionals" (NeurIPS 2023): attention is a gradient step of a nonlocal smoothing
    functional; adding a fidelity term :math:`\lambda \|v - v_0\|^2` to it pulls every layer
    back towards the first layer's values, which keeps the high frequencies the smoothing
    removes. ``lambda = 0.6`` is the authors' DeiT setting (``self.alpha = 0.6`` in their
    code). The first layer of a model (or a layer called without a
    :class:`~diffusionformer.ops.rivals.LayerState`) has :math:`v_0 = v`: plain attention.

    Args:
        lam: :math:`\lambda`, the fidelity weight.
        num_heads: number of heads ``G`` this instance serves.

    Examples:
        >>> NeuTRENOOperator().lam
        0.6
    """

    name = "neutreno"
    aliases = ("neu-treno",)
    example_kwargs = {"lam": 0.6}

    def __init__(self, lam: float = 0.6, num_heads: int = 1) -> None:
        super().__init__(lam, num_heads)

    def apply_context(self, ctx) -> Tensor:  # noqa: ANN001
        out = ctx.propagate(ctx.v)
        if ctx.v0 is None:
            return out
        return out + self.lam * (ctx.v0 - ctx.v)


@register_operator
class ValueResidualOperator(_FirstLayerValuesOperator):
    r"""Value residual (ResFormer): :math:`P (v + \lambda v_1)`, with :math:`v_1` the first layer's values.

    From Zhou et al., "Value Residual Learning For Alleviating Attention Concentration In
    Transformers" (2024): every layer after the first attends over its own values plus the
    first layer's, a residual connection on the values that keeps token information the
    attention would otherwise average away. ``lam = 1`` is the plain sum :math:`V_n + V_1`
    (the paper's weighted variants :math:`\lambda_1 V_n + \lambda_2 V_1` differ by a scale the
    output projection absorbs when :math:`\lambda_1 = \lambda_2`). The first layer (no
    earlier values) is plain attention.

    Args:
        lam: weight of the first layer's values.
        num_heads: number of heads ``G`` this instance serves.
    """

    name = "value-residual"
    aliases = ("resformer", "value-residual-attention")
    example_kwargs = {"lam": 1.0}

    def __init__(self, lam: float = 1.0, num_heads: int = 1) -> None:
        super().__init__(lam, num_heads)

    def apply_context(self, ctx) -> Tensor:  # noqa: ANN001
        v = ctx.v if ctx.v0 is None else ctx.v + self.lam * ctx.v0
        return ctx.propagate(v)
