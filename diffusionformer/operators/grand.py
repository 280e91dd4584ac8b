r"""Nonlinear diffusion (GRAND-nl, Chamberlain et al., ICML 2021): re-attend at every step."""

from __future__ import annotations

import difflib
import math
import numbers

import torch
from torch import Tensor

from diffusionformer.operators.base import DiffusionOperator, check_count, check_finite_float
from diffusionformer.operators.registry import register_operator

__all__ = ["NonlinearDiffusionOperator"]

FIXED_STEP = ("euler", "rk4")
# the solver names torchdiffeq takes (its SOLVERS table, 0.2.x), checked here so a typo gets "did you mean"
TORCHDIFFEQ_METHODS = ("dopri8", "dopri5", "bosh3", "fehlberg2", "adaptive_heun", "midpoint", "heun2", "heun3",
                       "explicit_adams", "implicit_adams", "fixed_adams", "scipy_solver")
# its fixed-grid solvers: without a grid they take one step between the given times, here one step of size t
_TORCHDIFFEQ_FIXED_GRID = ("midpoint", "heun2", "heun3", "explicit_adams", "implicit_adams", "fixed_adams")
# attention calls per step, one after the other (each a hop), of the solvers that make a fixed number: the Adams methods
# start with RK4 steps and iterate their corrector to a tolerance
_STAGES = {"euler": 1, "rk4": 4, "midpoint": 2, "heun2": 2, "heun3": 3}


@register_operator
class NonlinearDiffusionOperator(DiffusionOperator):
    r"""GRAND-nl: integrate :math:`\dot X = (P(X) - I)\, X` to time ``t``, with ``P`` re-computed from ``X``.

    From Chamberlain, Rowbottom, Gorinova, Webb, Rossi & Bronstein, "GRAND: Graph Neural
    Diffusion" (ICML 2021), nonlinear variant: the attention :math:`P(X) = \operatorname{softmax}
    (X W_Q (X W_K)^\top / \sqrt{C} + \text{mask})` is recomputed from the current state at every
    step, so the diffusivity follows the features it smooths. The state is the head's input
    in model space; since the projections are affine and ``P`` is row-stochastic, the
    projected queries, keys and values follow the same equation,
    :math:`\dot q = (P - I) q`, :math:`\dot k = (P - I) k`, :math:`\dot v = (P - I) v`, which is what
    the operator integrates (a layer with q/k norm re-applies it to the evolving ``q``, ``k``). Where a
    row of ``P`` may not sum to 1 (a sparse graph's node without incoming edges, a dense mask row without
    keys, attention dropout) the projections' biases would not follow :math:`(P - I)`; the layer then
    hands the operator its biases and the bias-free parts :math:`q - b_q`, ... are integrated instead.
    The head's output is ``v(t)``.

    Solvers: ``"euler"`` (``K`` steps of :math:`X \leftarrow X + \tau (P(X) - I) X`,
    :math:`\tau = t / K`) and ``"rk4"`` (classical Runge-Kutta, ``K`` steps, 4 attention calls
    each); any other name is a solver of ``torchdiffeq``: its fixed-grid methods (``"midpoint"``,
    ``"heun2"``, ``"heun3"``, the Adams methods) take ``K`` steps of size :math:`\tau` too, the others
    (``"dopri5"``, ...) are adaptive
    (optional, not a dependency: a clear ``ImportError`` says how to install it; it integrates
    the whole batch, padded tokens included, with one step-size control, so a sample's output
    depends on its batch-mates to the solver's tolerance, while ``"euler"`` and ``"rk4"`` treat
    samples independently). Euler with
    ``t = 1, K = 1`` is one attention step, ``v <- P v``; Euler needs ``K >= t`` (as the heat kernel's
    Euler product: a step :math:`\tau > 1` weighs :math:`X` by :math:`1 - \tau < 0`). Defined on every back-end (the
    context's ``attend`` re-attends on the same graph).

    Args:
        t: integration time.
        steps: ``K`` fixed steps (ignored by adaptive solvers; torchdiffeq's fixed-grid methods take them).
        method: ``"euler"``, ``"rk4"`` or a ``torchdiffeq`` method name.
        rtol, atol: tolerances of an adaptive solver.
        num_heads: number of heads ``G`` this instance serves.

    Examples:
        >>> NonlinearDiffusionOperator(t=1.0, steps=2, method="rk4").calls_per_forward()
        8
    """

    name = "grand-nl"
    aliases = ("grand", "nonlinear-diffusion", "re-attention")
    is_polynomial = False
    reprojects_each_step = True
    example_kwargs = {"t": 1.0, "steps": 2, "method": "rk4"}

    def __init__(self, t: float = 1.0, steps: int = 4, method: str = "euler", rtol: float = 1e-5, atol: float = 1e-6,
                 num_heads: int = 1) -> None:
        super().__init__(num_heads)
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            raise ValueError(f"t must be a finite non-negative float, got {t!r}")
        steps = check_count(steps, "steps")
        if not isinstance(method, str):
            raise TypeError(f"method must be a str, got {type(method).__name__}")
        if method not in FIXED_STEP + TORCHDIFFEQ_METHODS:
            close = difflib.get_close_matches(method, FIXED_STEP + TORCHDIFFEQ_METHODS, n=2)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise ValueError(f"unknown method {method!r}{hint}; built in: {FIXED_STEP}, "
                             f"with torchdiffeq: {TORCHDIFFEQ_METHODS}")
        if method not in FIXED_STEP:
            _odeint()  # fail at construction, not in the forward pass
        if method == "euler" and t > steps:  # as heat's Euler product: a step of tau = t/K > 1 weighs X by 1 - tau < 0
            raise ValueError(f"grand-nl(t={t:g}, steps={steps}, method='euler'): explicit Euler needs steps >= t (each "
                             f"step is (1 - t/K) X + (t/K) P(X) X, here {1 - t / steps:g} X + ...: unstable for "
                             f"t/K > 1); steps={math.ceil(t)} would do, or use method='rk4'")
        self.t, self.steps, self.method = float(t), steps, method
        self.rtol, self.atol = check_finite_float(rtol, "rtol"), check_finite_float(atol, "atol")
        for name, tol in (("rtol", self.rtol), ("atol", self.atol)):
            if tol < 0:  # an adaptive solver's error test would accept no step
                raise ValueError(f"{name} must be a non-negative float, got {tol!r}")

    def spec_kwargs(self) -> dict:
        kwargs = {"t": self.t, "steps": self.steps, "method": self.method}
        if self.method not in FIXED_STEP:
            kwargs.update(rtol=self.rtol, atol=self.atol)
        return kwargs

    @property
    def degree(self) -> int:
        raise NotImplementedError("grand-nl recomputes P at every step; it is not a polynomial in one P")

    def coefficients(self) -> Tensor:
        raise NotImplementedError("grand-nl is not a polynomial in P; the layer calls apply_context()")

    def calls_per_forward(self) -> int | None:
        """Attention calls of the fixed-step solvers (``K`` Euler, ``4 K`` RK4, ``2 K`` midpoint and Heun2, ``3 K``
        Heun3); ``None`` where the solver chooses them (adaptive steps, the Adams methods)."""
        stages = _STAGES.get(self.method)
        return None if stages is None else self.steps * stages

    def apply_context(self, ctx) -> Tensor:  # noqa: ANN001
        C = ctx.q_raw.shape[-1]
        Cv = ctx.v.shape[-1]

        if self.t == 0.0:
            return ctx.v
        # where a row of P may not sum to 1 (no keys, attention dropout) the layer hands over its projection biases:
        # the state is then the linear part q - b_q, k - b_k, v - b_v, which follows (P - I) for every P (the biases
        # of a model-space state stay put); elsewhere both are the same equation, integrated with the biases
        bias = getattr(ctx, "_qkv_bias", None)
        bq = bk = bv = None  # bound before the closure below reads them (torch.compile traces no unbound cell)
        if bias is not None:
            bq, bk, bv = (b.to(ctx.v.dtype).unsqueeze(-2) for b in bias)  # (G, 1, C)

        def field(state: Tensor) -> Tensor:
            q, k = state[..., :C], state[..., C : 2 * C]
            if bias is not None:
                q, k = q + bq, k + bk
            q, k = ctx.normalise_qk(q, k)
            return ctx.attend(q, k, state) - state

        parts = [ctx.q_raw, ctx.k_raw, ctx.v] if bias is None else [ctx.q_raw - bq, ctx.k_raw - bk, ctx.v - bv]
        state = torch.cat(parts, dim=-1)  # (B, G, N, 2C + Cv)
        if self.method in FIXED_STEP:
            tau = self.t / self.steps
            for _ in range(self.steps):
                if self.method == "euler":
                    state = state + tau * field(state)
                else:
                    k1 = field(state)
                    k2 = field(state + 0.5 * tau * k1)
                    k3 = field(state + 0.5 * tau * k2)
                    k4 = field(state + tau * k3)
                    state = state + (tau / 6.0) * (k1 + 2 * k2 + 2 * k3 + k4)
        else:
            odeint = _odeint()
            times = torch.tensor([0.0, self.t], dtype=state.dtype, device=state.device)
            grid = {}
            if self.method in _TORCHDIFFEQ_FIXED_GRID:  # K + 1 grid points (its step_size option rounded t / (t / K)
                # up to K + 1 steps, a last one of size ~0: t=0.3, K=5 in float32)
                grid["options"] = {"grid_constructor": lambda _f, _y0, ts: torch.linspace(
                    0.0, self.t, self.steps + 1, dtype=ts.dtype, device=ts.device)}
            state = odeint(lambda _t, s: field(s), state, times, method=self.method, rtol=self.rtol, atol=self.atol,
                           **grid)[-1]
        out = state[..., 2 * C : 2 * C + Cv]
        return out if bias is None else out + bv

    def extra_repr(self) -> str:
        return f"t={self.t:g}, steps={self.steps}, method={self.method!r}, num_heads={self.num_heads}"


def _odeint():  # noqa: ANN202
    try:
        from torchdiffeq import odeint
    except ImportError:
        raise ImportError(
            "grand-nl with a torchdiffeq solver (any method but euler and rk4) needs torchdiffeq, which is not "
            "installed (pip install torchdiffeq); the built-in solvers are method='euler' and method='rk4'"
        ) from None
    return odeint
