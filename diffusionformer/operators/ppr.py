r"""Personalised PageRank (APPNP) diffusion."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from diffusionformer.operators.base import (MAX_DEGREE, DiffusionOperator, _check_loaded_constant, _check_tol,
                                             _host_numbers, _meta_repr, _powers, check_count, check_finite_parameter,
                                             check_flag, check_real, static_dtype)
from diffusionformer.operators.registry import register_operator
from diffusionformer.ops.engine import _tensor_cache

__all__ = ["PPROperator", "ppr_coefficients", "ppr_steps_for_tolerance"]


def ppr_coefficients(alpha: Tensor, steps: int) -> Tensor:
    r"""Weights of ``K`` APPNP iterations :math:`Z_{k+1} = (1 - \alpha) P Z_k + \alpha V`, ``Z_0 = V``.

    :math:`Z_K = \alpha \sum_{k<K} (1-\alpha)^k P^k V + (1-\alpha)^K P^K V`: the personalised
    PageRank series :math:`\alpha (I - (1-\alpha) P)^{-1}` truncated with its tail mass on
    ``P^K``, so the weights sum to one.

    Shapes:
        ``alpha``: ``()`` or ``(G,)`` -> ``(K+1,)`` or ``(G, K+1)``.

    Examples:
        >>> ppr_coefficients(torch.tensor(0.5), 2)
        tensor([0.5000, 0.2500, 0.2500])
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:  # True was K = 1
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    # in float32 at least, rounded to alpha's dtype once: a half-precision 1 - alpha (bfloat16 keeps 8 bits) and
    # its powers carried their rounding K-fold (alpha = 0.01, K = 100: weights summing to 0.90 in bfloat16)
    a = alpha.to(torch.promote_types(alpha.dtype, torch.float32))
    keep = 1.0 - a
    k, last = _ppr_table(steps, a.device, a.dtype)
    # (1 - alpha)^k times alpha, and times 1 on P^K: a fixed number of kernels whatever K; the powers with finite
    # derivatives of every order where 1 - alpha rounds to 0, a saturated logit (_powers)
    return (_powers(keep, k) * torch.where(last, 1.0, a.unsqueeze(-1))).to(alpha.dtype)


@_tensor_cache(maxsize=64)
def _ppr_table(steps: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``k = 0 .. K`` in ``dtype`` (in float32 where ``dtype`` cannot hold them exactly: bfloat16 past 256, where
    ``k = 299`` was 300, a second "last" term) and the mask of ``k = K`` on ``device``, built once."""
    with torch.inference_mode(False):
        exact = not dtype.is_floating_point or steps <= 2 / torch.finfo(dtype).eps  # its integers exact up to 2 / eps
        k = torch.arange(steps + 1, dtype=dtype if exact else torch.float32, device=device)
        return k, k == steps


def ppr_steps_for_tolerance(alpha: float, tol: float) -> int:
    r"""Smallest ``K`` whose truncation error :math:`2 (1 - \alpha)^K` is at most ``tol``.

    The ``K``-step series differs from the full personalised PageRank
    :math:`\alpha (I - (1-\alpha) P)^{-1}` by :math:`(1-\alpha)^K P^K - \alpha \sum_{k \ge K}
    (1-\alpha)^k P^k`, whose two parts each have :math:`\infty`-norm at most
    :math:`(1-\alpha)^K` for a row-stochastic ``P``.

    Examples:
        >>> ppr_steps_for_tolerance(0.5, 1e-3)
        11
    """
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol}")
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must lie in (0, 1], got {alpha}")
    if alpha == 1.0 or tol >= 2.0:
        return 1
    steps = math.log(tol / 2.0) / math.log1p(-alpha)  # inf for a subnormal alpha: log1p(-alpha) underflows
    K = max(1, math.ceil(min(steps, 2.0**62) - 1e-12))
    q = 1.0 - alpha  # the base PPROperator's check raises to K
    if K <= 2**31 and q < 1.0:  # settle the rounded logarithms on the bound itself, as PPROperator checks it:
        # alpha=0.95, tol=0.1 gave K=1, whose 2 (1 - alpha) = 0.1000000000000001 the operator then refused, naming
        # K=1. The start is the logarithm of q itself, which rounds up to 1e-16 / alpha (relative) off 1 - alpha:
        # from log1p(-alpha) the loops stepped 2e8 times (alpha=1e-16); with q = 1 (alpha below about 6e-17) the
        # checked bound never falls below 2 and they never ended, so the logarithm's K stands there
        K = max(1, math.ceil(min(math.log(tol / 2.0) / math.log(q), 2.0**62) - 1e-12))
        while 2.0 * q**K > tol:
            K += 1
        while K > 1 and 2.0 * q ** (K - 1) <= tol:
            K -= 1
    return K


@register_operator
class PPROperator(DiffusionOperator):
    r"""Personalised PageRank, :math:`f(P) = \alpha \sum_{k<K} (1-\alpha)^k P^k + (1-\alpha)^K P^K`.

    The propagation of APPNP (Gasteiger, Bojchevski & Günnemann, "Predict then Propagate",
    ICLR 2019): a random walk that teleports back to its start with probability ``alpha``,
    a low-pass filter that keeps a share ``alpha`` of every token's own value.

    Args:
        alpha: teleport probability in ``(0, 1]``.
        steps: ``K`` power-iteration steps; ``None`` picks the smallest ``K`` whose
            :meth:`truncation_error` meets ``tol`` (default ``1e-4``).
        tol: when given with ``steps``, a ``K`` whose truncation error (at the initial
            ``alpha``) exceeds it is refused, naming the ``K`` that would do. Without it a
            short ``K`` is accepted as the ``K``-step APPNP operator it is (its weights
            always sum to one, so no head goes silent).
        learnable: learn ``alpha`` per head (through a logit, so it stays in ``(0, 1)``).
        num_heads: number of heads ``G`` this instance serves.

    Shapes:
        :meth:`coefficients`: ``(K+1,)`` or ``(G, K+1)`` (learned).

    Examples:
        >>> PPROperator(alpha=0.5, steps=3).coefficients()
        tensor([0.5000, 0.2500, 0.1250, 0.1250])
    """

    name = "ppr"
    aliases = ("appnp", "pagerank", "personalized-pagerank", "personalised-pagerank")
    example_kwargs = {"alpha": 0.2, "steps": 4}

    def __init__(self, alpha: float = 0.1, steps: int | None = 10, learnable: bool = False, num_heads: int = 1,
                 tol: float | None = None) -> None:
        super().__init__(num_heads)
        alpha = check_real(alpha, "alpha")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must lie in (0, 1], got {alpha}")
        tol = _check_tol(tol)
        if steps is None:
            steps = ppr_steps_for_tolerance(float(alpha), 1e-4 if tol is None else float(tol))
            if steps > MAX_DEGREE:
                raise ValueError(f"ppr(alpha={alpha:g}) needs more than {MAX_DEGREE} steps to meet "
                                 f"tol={1e-4 if tol is None else tol:g}; use a larger alpha or tol")
        steps = check_count(steps, "steps")
        if tol is not None and 2.0 * (1.0 - alpha) ** steps > tol:
            raise ValueError(f"ppr(alpha={alpha:g}, steps={steps}): truncation error {2.0 * (1.0 - alpha) ** steps:.3g} "
                             f"exceeds tol={tol:g}; steps={ppr_steps_for_tolerance(float(alpha), float(tol))} would do "
                             "(or pass steps=None to choose it)")
        learnable = check_flag(learnable, "learnable")  # before its use below: learnable='yes' is a TypeError
        if learnable and alpha >= 1.0:
            raise ValueError("a learnable alpha must start strictly below 1")
        self.steps = steps
        self.learnable = learnable
        self._alpha0 = float(alpha)
        self._static: tuple[float, ...] | None = None
        if learnable:
            self.alpha_logit = nn.Parameter(torch.full((num_heads,), math.log(alpha / (1.0 - alpha))))
        else:
            self.register_buffer("_alpha", torch.tensor(float(alpha), dtype=torch.float64))
            with _host_numbers():  # Python floats, also under `with torch.device("meta")` (deferred init)
                self._static = tuple(ppr_coefficients(torch.tensor(float(alpha), dtype=torch.float64), steps).tolist())
            self.register_buffer("_c", torch.tensor(self._static, dtype=static_dtype()), persistent=False)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A learnable ``alpha`` back to its initial value (every head); a fixed ``alpha`` is no parameter."""
        if self.learnable:
            self.alpha_logit.fill_(math.log(self._alpha0 / (1.0 - self._alpha0)))

    def spec_kwargs(self) -> dict:
        return {"alpha": self._alpha0, "steps": self.steps, "learnable": self.learnable}

    @property
    def degree(self) -> int:
        return self.steps

    @property
    def alpha(self) -> Tensor:
        """The teleport probability (per head when learned)."""
        if self.learnable:
            check_finite_parameter(self, "alpha_logit", self.alpha_logit)
            return torch.sigmoid(self.alpha_logit)
        return self._alpha

    def coefficients(self) -> Tensor:
        if not self.learnable:
            return self._c
        alpha = self.alpha
        c = ppr_coefficients(alpha.double(), self.steps)
        return c if alpha.dtype == torch.float64 else c.float()

    def static_coefficients(self) -> tuple[float, ...] | None:
        return self._static

    def _load_from_state_dict(self, state_dict, prefix, *args):  # type: ignore[override]
        if not self.learnable:  # the fixed coefficients were built from the constructor's alpha
            _check_loaded_constant(self, state_dict, prefix, "_alpha", self._alpha0, "alpha", args[-1])
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _fixed_constants(self) -> dict[str, float]:
        return {} if self.learnable else {"_alpha": self._alpha0}

    def truncation_error(self) -> Tensor:
        r"""Bound :math:`2 (1 - \alpha)^K` on the ``inf``-norm distance to the full PageRank series, per head."""
        if not self.learnable:  # the float the constructor's tol check and ppr_steps_for_tolerance compute: torch's
            # pow differs by an ulp, so steps=None with a tol gave a truncation_error() over that tol
            bound = 2.0 * (1.0 - self._alpha0) ** self.steps
            return torch.tensor(bound, dtype=torch.float64, device=self._alpha.device)
        return 2.0 * (1.0 - self.alpha.detach().double()) ** self.steps

    def extra_repr(self) -> str:
        # not through ``alpha``: printing a model whose learned alpha diverged shows nan instead of raising
        a = torch.sigmoid(self.alpha_logit.detach()) if self.learnable else self._alpha
        a_repr = _meta_repr(a) or (f"{a.item():g}" if a.numel() == 1 else f"{[round(x, 4) for x in a.tolist()]}")
        return f"alpha={a_repr}, steps={self.steps}, learnable={self.learnable}, num_heads={self.num_heads}"
