r"""AttnScale (Wang et al., ICLR 2022): re-weight the high-frequency part of ``P``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from diffusionformer.operators.base import (DiffusionOperator, _check_loaded_constant, _meta_repr, check_finite_float,
                                            check_finite_parameter, check_flag)
from diffusionformer.operators.registry import register_operator

__all__ = ["AttnScaleOperator"]


@register_operator
class AttnScaleOperator(DiffusionOperator):
    r"""AttnScale: :math:`f(P) = DC + (1 + \omega_h)\, HC`, with :math:`DC` the uniform average and :math:`HC = P - DC`.

    From Wang, Zheng, Chen & Wang, "Anti-Oversmoothing in Deep Vision Transformers via the
    Fourier Domain Analysis: From Theory to Practice" (ICLR 2022). A softmax map is a low-pass
    filter; AttnScale splits it into its direct-current part
    :math:`DC = \frac{1}{N} 1 1^\top` (here: each row's uniform average over its *admissible*
    keys, so causal row ``i`` averages ``j <= i`` and padding is ignored) and the rest
    :math:`HC = P - DC`, and amplifies the rest by a learned :math:`1 + \omega_h` per head
    (``omega`` starts at 0, where the head is plain attention):

    .. math::
        f(P)\, v = DC\, v + (1 + \omega_h)(P v - DC\, v).

    ``DC`` is not a function of ``P``, so the operator declares ``needs_uniform_map`` and runs
    through the layer's context: one attention call for ``P v``, and ``DC v`` as a mean,
    cumulative mean or masked mean when the dense call has no mask, a causal mask, key padding
    or both (:func:`~diffusionformer.ops.uniform_map.uniform_mean`; any other mask: a second,
    zero-score attention call). That call makes ``DC`` the softmax of the mask alone: the uniform
    average over the admissible keys for a bool mask or a float mask of ``0`` and ``-inf``, and a
    bias-weighted average ``softmax(mask)`` for a float mask with other finite entries (the
    scores' own bias, without ``QK^T``). Defined on every back-end: on a sparse graph ``DC`` is
    the mean over incoming edges.

    Args:
        omega: initial :math:`\omega` (the paper: 0).
        learnable: learn ``omega`` per head (the paper: yes).
        num_heads: number of heads ``G`` this instance serves.

    Examples:
        >>> AttnScaleOperator(num_heads=2).omega.tolist()
        [0.0, 0.0]
    """

    name = "attnscale"
    aliases = ("attn-scale", "attention-scale")
    is_polynomial = False
    needs_uniform_map = True
    example_kwargs = {"omega": 0.4}

    def __init__(self, omega: float = 0.0, learnable: bool = True, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        omega = check_finite_float(omega, "omega")  # a NaN/inf omega would make every output NaN
        learnable = check_flag(learnable, "learnable")
        self._omega0 = float(omega)
        self.learnable = learnable
        if learnable:
            self.omega = nn.Parameter(torch.full((num_heads,), float(omega)))
        else:  # float64: exact in a float64 layer
            self.register_buffer("omega", torch.full((num_heads,), float(omega), dtype=torch.float64))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A learnable ``omega`` back to its initial value (every head); a fixed ``omega`` is no parameter."""
        if self.learnable:
            self.omega.fill_(self._omega0)

    def spec_kwargs(self) -> dict:
        return {"omega": self._omega0, "learnable": self.learnable}

    def _load_from_state_dict(self, state_dict, prefix, *args):  # type: ignore[override]
        if not self.learnable:  # the spec records the constructor's omega
            _check_loaded_constant(self, state_dict, prefix, "omega", self._omega0, "omega", args[-1])
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _fixed_constants(self) -> dict[str, float]:
        return {} if self.learnable else {"omega": self._omega0}

    @property
    def degree(self) -> int:
        raise NotImplementedError("attnscale uses the uniform map DC, not only powers of P")

    def coefficients(self) -> Tensor:
        raise NotImplementedError("attnscale is not a polynomial in P; the layer calls apply_context()")

    def apply_context(self, ctx) -> Tensor:  # noqa: ANN001
        check_finite_parameter(self, "omega", self.omega)
        G = ctx.v.shape[1]
        if G != self.num_heads and self.num_heads != 1:
            raise ValueError(f"attnscale serves {self.num_heads} heads, got {G}")
        w = self.omega.to(ctx.v.dtype).view(1, -1, 1, 1)
        pv = ctx.propagate(ctx.v)
        dc = ctx.uniform(ctx.v)
        return dc + (1.0 + w) * (pv - dc)

    def extra_repr(self) -> str:
        omega = _meta_repr(self.omega) or [round(x, 4) for x in self.omega.detach().tolist()]
        return f"omega={omega}, learnable={self.learnable}, num_heads={self.num_heads}"
