r"""Heat-kernel operators :math:`\exp(-t (I - P))`: truncated series and the exact dense reference."""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn

from diffusionformer.config import _choice_hint
from diffusionformer.operators.base import (DiffusionOperator, _check_loaded_constant, _check_tol, _host_numbers,
                                            _meta_repr, _powers, check_finite_float, check_finite_parameter, check_flag,
                                            check_real, static_dtype)
from diffusionformer.operators.registry import register_operator
from diffusionformer.ops._checks import checks_values
from diffusionformer.ops.engine import _tensor_cache
from diffusionformer.ops.reference import _matrix_exp

__all__ = ["ExactHeatOperator", "HeatOperator", "heat_coefficients", "heat_steps_for_tolerance", "heat_truncation_error"]

MAX_STEPS = 256
EXACT_MIN_T = -40.0  # heat-exact's lowest t: e^(2 * 40) = 5.5e34 still fits float32
#: heat-exact's largest t is this over the working dtype's eps: the scaling and squaring of matrix_exp (and the
#: row sums of a rounded P, off by ~eps) cost up to about t * eps (measured in float32 against float64 on 12 nodes:
#: 1.4e-4 at t = 1e4, 1.5e-3 at 1e5, 9.8e-2 at 1e7, NaN at 1e12; float64 garbage at 1e16)
_EXACT_T_EPS = 1e-2
#: the truncation error accepted for an explicit ``steps`` when no ``tol`` is given: a Taylor
#: series cut where it has lost more than half its mass makes a head that mostly outputs nothing
MAX_TRUNCATION_ERROR = 0.5
_METHODS = ("taylor", "euler")


def heat_coefficients(t: Tensor, steps: int, method: str = "taylor") -> Tensor:
    r"""Weights on ``P^0 .. P^K`` of the truncated heat kernel :math:`\exp(-t (I - P))`.

    * ``"taylor"``: :math:`c_k = e^{-t} t^k / k!` (the Poisson weights, in float64: as a vector
      of powers for ``K <= 20`` and as a running product beyond, so there is no overflow or
      NaN up to ``t`` of several hundred and the gradient in ``t`` is finite everywhere,
      ``t = 0`` included);
    * ``"euler"``: :math:`((1 - t/K) I + (t/K) P)^K`, i.e.
      :math:`c_k = \binom{K}{k} (1 - t/K)^{K-k} (t/K)^k` (``K`` explicit Euler steps of
      ``dx/dt = -(I - P) x``).

    Args:
        t: diffusion time(s); negative values sharpen (inverse diffusion).
        steps: ``K``, the highest power of ``P`` (at most 1029 for ``"euler"``, whose binomials overflow past it).
        method: ``"taylor"`` or ``"euler"``.

    Shapes:
        ``t``: ``()`` or ``(G,)`` -> ``(K+1,)`` or ``(G, K+1)``, float64.

    Examples:
        >>> heat_coefficients(torch.tensor(1.0), 3)
        tensor([0.3679, 0.3679, 0.1839, 0.0613], dtype=torch.float64)
        >>> heat_coefficients(torch.tensor(1.0), 2, "euler")
        tensor([0.2500, 0.5000, 0.2500], dtype=torch.float64)
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:  # True was K = 1
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    t = t.to(torch.float64)
    if method == "taylor":
        if steps > _VECTOR_STEPS:
            c = [torch.exp(-t)]
            for k in range(1, steps + 1):
                c.append(c[-1] * t / k)
            return torch.stack(c, dim=-1)
        # a fixed number of kernels whatever K (the running product costs 2 K tiny launches each way)
        k, inv_factorial = _taylor_table(steps, t.device)
        # t^k as t.pow(k), with finite derivatives of every order at t = 0 (_powers)
        return torch.exp(-t).unsqueeze(-1) * _powers(t, k) * inv_factorial
    if method == "euler":
        if steps == 0:
            raise ValueError("the Euler heat kernel needs steps >= 1")
        if steps > _EULER_MAX_STEPS:  # else inf binomials times underflowed powers: every coefficient NaN, silently
            raise ValueError(f"the Euler heat kernel's binomials C(K, k) overflow a float past K = {_EULER_MAX_STEPS}"
                             f", got steps={steps}; use fewer steps or method='taylor'")
        a, b = 1.0 - t / steps, t / steps
        # a fixed number of kernels whatever K: (a, b)^(K - k, k) in one table of powers, with finite derivatives of
        # every order at a = 0 or b = 0 (_powers; 2 (K+1) pow calls and two stacks before)
        exponents, binom = _euler_table(steps, t.device)
        ab = _powers(torch.stack((a, b), dim=-1), exponents)  # (..., 2, K+1)
        # the powers' product first: binom * a^(K-k) overflowed to inf for t < 0 near the K limit (a > 1) where
        # b^k underflowed to 0, inf * 0 = NaN; the product of the powers only underflows where c_k is below 1e-15
        return binom * (ab.select(-2, 0) * ab.select(-2, 1))
    raise ValueError(f"method must be 'taylor' or 'euler', got {method!r}{_choice_hint(method, _METHODS)}")


#: the largest Euler K whose binomials fit a float64: C(1030, 515) overflows it
_EULER_MAX_STEPS = 1029

#: up to this K the Taylor weights are computed as ``e^{-t} t^k / k!`` with a vector of powers (``|t|^K``
#: stays far from float64's overflow for any ``|t| < 10^15``); beyond it, as the running product
_VECTOR_STEPS = 20


@_tensor_cache(maxsize=64)
def _taylor_table(steps: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """``k = 0 .. K`` and ``1 / k!`` in float64 on ``device``, built once (no copy to the device per call)."""
    with torch.inference_mode(False):
        # made on the CPU by name (a default device of meta has no values to copy), then moved
        k = torch.arange(steps + 1, dtype=torch.float64, device="cpu")
        return k.to(device), torch.tensor([1.0 / math.factorial(i) for i in range(steps + 1)],
                                          dtype=torch.float64, device="cpu").to(device)


@_tensor_cache(maxsize=64)
def _euler_table(steps: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The exponents ``(K - k, k)`` as a ``(2, K+1)`` table and the binomials ``C(K, k)``, ``k = 0 .. K``, in float64
    on ``device``, built once (no copy to the device per call)."""
    # exact integers, rounded once to float64 (exp(lgamma) was 1e-12 relative off at K = 1000); inf past a float's
    # range (K > 1029), as exp(lgamma) overflowed. Not via _taylor_table, whose 1 / k! overflows a float past K = 170
    # (Euler's K may be large: it converges as 1/K); not math.comb per k, 1.4 s at K = 5000
    binom, c = [], 1
    for j in range(steps + 1):
        try:
            binom.append(float(c))
        except OverflowError:
            binom.append(math.inf)
        c = c * (steps - j) // (j + 1)  # C(K, j + 1), exact
    with torch.inference_mode(False):  # made on the CPU (a default device of meta has no values)
        k = torch.arange(steps + 1, dtype=torch.float64, device="cpu")
        return (torch.stack((steps - k, k)).to(device),
                torch.tensor(binom, dtype=torch.float64, device="cpu").to(device))


def heat_steps_for_tolerance(t: float, tol: float, method: str = "taylor") -> int:
    r"""Smallest ``K`` whose truncation error bound is at most ``tol``.

    For a row-stochastic ``P`` (``\|P^k\|_\infty = 1``) the Taylor remainder is bounded by the
    Poisson tail :math:`\sum_{k > K} e^{-t} t^k / k!` for ``t >= 0`` and by
    :math:`e^{2|t|} \Pr[\mathrm{Poisson}(|t|) > K]` for ``t < 0``. The Euler product has error
    at most :math:`2 t^2 e^{2|t|} / K` (first order in ``1/K``); its ``K`` is also at least ``t``
    (fewer steps make an unstable product, see :class:`HeatOperator`).

    Examples:
        >>> heat_steps_for_tolerance(1.0, 1e-3)
        5
    """
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol}")
    if not math.isfinite(float(t)):  # a NaN t would pass every comparison below and give K = 0
        raise ValueError(f"t must be finite, got {t}")
    a = abs(float(t))
    if 2 * a > 700:  # e^(2|t|) overflows a float: no K <= MAX_STEPS meets any useful tol
        raise ValueError(f"the heat kernel needs more than {MAX_STEPS} steps for t={t}, tol={tol}; use a smaller |t|")
    if method == "euler":
        # and K >= t: fewer steps make an unstable product (weight 1 - t/K < 0 on I) that HeatOperator refuses
        lowest = max(1, math.ceil(t))
        need = 2 * a * a * math.exp(2 * a) / tol  # inf past float's range (tol=1e-300): ceil raised OverflowError
        K = max(lowest, math.ceil(need)) if math.isfinite(need) else None
        if K is not None and K <= MAX_STEPS + 1:
            # settled on the bound itself, as HeatOperator checks it: the rounded estimate gave K + 1 (not the
            # smallest) and K whose bound was 1 ulp over tol, which the operator then refused, naming that K
            while K <= MAX_STEPS and _bound_at(t, K, "euler") > tol:
                K += 1
            while K > lowest and _bound_at(t, K - 1, "euler") <= tol:
                K -= 1
        if K is None or K > MAX_STEPS:
            # a K of 302 digits (tol=1e-300) is written as 1.48e+301
            need_text = "more than" if K is None else f"K={K if K < 10**9 else format(K, '.3g')} >"
            raise ValueError(
                f"the Euler heat kernel needs {need_text} {MAX_STEPS} steps for t={t}, "
                f"tol={tol}; give steps= explicitly or use method='taylor'"
            )
        return K
    if method != "taylor":
        raise ValueError(f"method must be 'taylor' or 'euler', got {method!r}{_choice_hint(method, _METHODS)}")
    # the bounds, bit for bit, that heat_truncation_error(t, K) gives (e^(2|t|) included, which math.exp rounded
    # differently: K + 1 for a tol equal to the bound at K): an explicit steps=K with this tol passes
    bounds = _taylor_bounds(torch.tensor(float(t), dtype=torch.float64, device="cpu")).tolist()
    for K, bound in enumerate(bounds):
        if bound <= tol:
            return K
    raise ValueError(f"the heat kernel needs more than {MAX_STEPS} steps for t={t}, tol={tol}")


def _bound_at(t: float, steps: int, method: str) -> float:
    """``heat_truncation_error(t, steps, method)`` of a Python ``t`` as a float (computed on the CPU)."""
    return float(heat_truncation_error(torch.tensor(float(t), dtype=torch.float64, device="cpu"), steps, method))


def _poisson_tails(a: Tensor, steps: int) -> Tensor:
    r""":math:`\Pr[\mathrm{Poisson}(a) > K]` for ``K = 0 .. max(steps, MAX_STEPS)``, float64, to about 2e-13 relative
    (checked against mpmath: the sum of up to 2 K_max + 400 rounded terms).

    Not ``1 - sum_{k <= K} pmf(k)``: that cancels to 0 (or a rounding residue) once the tail falls below
    float64's eps, which read a tail of 5e-19 (t = 1e-9, K = 1) as 0 and, times e^(2|t|) for t < 0, a bound of
    28 (t = -20, K = 66) as 0. Past the mean (``K + 1 > a``) the tail is summed from its own terms, smallest
    first; below it ``1 - cdf`` is accurate (the tail is then at least about 1/2). The terms go to
    ``2 K_max + 400``, where the neglected remainder is far below a relative eps. ``a``: ``()`` or ``(G,)``.
    """
    K_max = max(steps, MAX_STEPS)  # one length whatever steps: the same tails for every caller
    k = torch.arange(2 * K_max + 401, dtype=torch.float64, device=a.device)
    a = a.to(torch.float64).unsqueeze(-1)
    pmf = torch.exp(torch.xlogy(k, a) - a - torch.lgamma(k + 1))  # xlogy: the pmf of Poisson(0) is [1, 0, ...]
    cdf = pmf.cumsum(-1)[..., : K_max + 1]
    rest = pmf.flip(-1).cumsum(-1).flip(-1)[..., 1 : K_max + 2]  # sum_{k > K} pmf(k), smallest terms first
    return torch.where(k[: K_max + 1] + 1 > a, rest, 1.0 - cdf).clamp(0.0, 1.0)


def heat_truncation_error(t: Tensor, steps: int, method: str = "taylor") -> Tensor:
    r"""Bound on :math:`\|\exp(-t(I-P)) - \sum_{k \le K} c_k P^k\|_\infty` over row-stochastic ``P``.

    Taylor: the Poisson tail :math:`1 - \sum_{k \le K} e^{-|t|} |t|^k / k!`, times
    :math:`e^{2|t|}` for ``t < 0``; Euler: :math:`2 t^2 e^{2|t|} / K` (see
    :func:`heat_steps_for_tolerance`). Past ``MAX_STEPS`` the Poisson tail is the regularised
    incomplete gamma function, raised by 1e-8 relative to stay a bound.

    Shapes:
        ``t``: ``()`` or ``(G,)`` -> the same, float64.

    Examples:
        >>> heat_truncation_error(torch.tensor(1.0), 2).item() < 0.081
        True
        >>> heat_truncation_error(torch.tensor(50.0), 4).item()  # the series has lost all its mass
        1.0
    """
    if method not in _METHODS:  # any other name would be read as "taylor"
        raise ValueError(f"method must be 'taylor' or 'euler', got {method!r}{_choice_hint(method, _METHODS)}")
    t = t.detach().double()
    if method == "euler":
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:  # steps=0: 0/0 or inf
            raise ValueError(f"the Euler heat kernel needs steps >= 1, got {steps!r}")
        return 2 * t * t * torch.exp(2 * t.abs()) / steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    if steps > MAX_STEPS:  # past the operators' cap, _poisson_tails' terms would take 2 * steps float64s (GBs)
        a = t.abs()
        # the regularised incomplete gamma is the Poisson tail, to about 1e-11 relative here: raised by 1e-8
        # relative it stays a bound
        tail = (torch.special.gammainc(torch.full_like(a, steps + 1.0), a) * (1 + 1e-8)).clamp(max=1.0)
        return torch.where(t < 0, torch.exp(2 * a) * tail, tail)
    return _taylor_bounds(t)[..., steps]


def _taylor_bounds(t: Tensor) -> Tensor:
    r"""The Taylor bounds of :func:`heat_truncation_error` for every ``K = 0 .. MAX_STEPS`` at once: the Poisson
    tails of ``|t|``, times :math:`e^{2|t|}` for ``t < 0`` (the values :func:`heat_steps_for_tolerance` reads).
    ``t``: float64 ``()`` or ``(G,)`` -> ``(MAX_STEPS + 1,)`` or ``(G, MAX_STEPS + 1)``."""
    a = t.abs()
    tails = _poisson_tails(a, MAX_STEPS)
    return torch.where((t < 0).unsqueeze(-1), torch.exp(2 * a).unsqueeze(-1) * tails, tails)


def _check_truncation(t: float, steps: int, method: str, tol: float | None) -> None:
    """Refuse a ``steps`` too small for ``t`` (a head that silently outputs almost nothing)."""
    spec = f"heat(t={t:g}, steps={steps}" + (f", method={method!r}" if method != "taylor" else "")
    if method == "euler":  # mass is conserved; the product is unstable (sign-alternating weights) for t > K
        if t > steps:
            raise ValueError(f"{spec}): the Euler product needs steps >= t (each step is 1 - t/K = {1 - t / steps:g} "
                             f"times I plus t/K times P); steps={math.ceil(t)} would do, or use method='taylor'")
        if tol is not None:  # a given tol binds the explicit steps as for Taylor (no default: the bound is loose)
            err = float(heat_truncation_error(torch.tensor(t, dtype=torch.float64), steps, method))
            if err > tol:
                try:
                    fix = (f"steps={heat_steps_for_tolerance(t, tol, method)} would do (or pass steps=None to choose "
                           "it, or a larger tol)")
                except ValueError:
                    fix = f"no steps up to {MAX_STEPS} would do; use method='taylor' or a larger tol"
                raise ValueError(f"{spec}): truncation error bound {err:.3g} exceeds tol={tol:g}; {fix}")
        return
    limit = MAX_TRUNCATION_ERROR if tol is None else tol
    err = float(heat_truncation_error(torch.tensor(t, dtype=torch.float64), steps))
    if err <= limit:
        return
    try:
        fix = f"steps={heat_steps_for_tolerance(t, limit)} would do"
    except ValueError:
        fix = f"no steps up to {MAX_STEPS} would do; use a smaller t"
    kept = float(heat_coefficients(torch.tensor(abs(t), dtype=torch.float64), steps).sum())
    why = (f"the truncated series keeps {kept:.3g} of the kernel's weight, so the head outputs "
           f"{'almost nothing' if kept < 0.05 else 'a damped signal'}") if t >= 0 else \
        f"a sharpening head's missing tail is amplified up to e^(2|t|) = {math.exp(2 * abs(t)):.3g} times"
    raise ValueError(f"{spec}): truncation error {err:.3g} exceeds tol={limit:g} ({why}); {fix} "
                     "(or pass steps=None to choose it, or a larger tol)")


def _check_time(t: object) -> float:
    return check_finite_float(t, "t")


@register_operator
class HeatOperator(DiffusionOperator):
    r"""Heat diffusion :math:`f(P) = \exp(-t (I - P)) = e^{-t} \sum_k \frac{t^k}{k!} P^k`, truncated at ``K``.

    ``t = 0`` is the identity, ``t -> infinity`` projects onto the stationary distribution, and
    the Laplacian head is its first-order term. With ``learnable=True`` every head learns its
    own ``t``; a negative ``t`` means sharpening (inverse diffusion, amplifying
    within-sequence differences), bounded below by ``min_t`` because the truncated series
    of :math:`e^{|t|(I-P)}` grows like :math:`e^{2|t|}`.

    Args:
        t: initial diffusion time.
        steps: ``K``; ``None`` picks the smallest ``K`` meeting ``tol`` at ``t`` (for learnable ``t``
            also at ``max(2 |t|, 1)``, to leave room to grow, and for a negative ``t`` at
            ``-max(2 |t|, 1)`` or ``min_t`` if higher, where some ``K`` up to ``MAX_STEPS`` meets ``tol``
            there; a learnable ``t`` whose room above needs more, e.g. ``t=150``, is refused). An explicit ``K``
            whose :meth:`truncation_error` at the initial ``t`` exceeds ``tol`` (default
            ``0.5``: the series would have lost half its weight) is refused with the ``K``
            that would do; with ``"euler"``, ``K < t`` is refused (an unstable product).
        method: ``"taylor"`` (default) or ``"euler"`` (``((1 - t/K) I + t/K P)^K``).
        learnable: learn ``t`` (one value per head).
        tol: truncation tolerance: ``steps=None`` meets it (default ``1e-4``); an explicit
            ``steps`` must meet it (default ``0.5``; with ``"euler"`` only a given ``tol``).
        min_t: lower bound on ``t`` (a real number, ``-inf`` for none; not NaN): an initial ``t``
            below it is refused, a learned ``t`` is clamped at it.
        num_heads: number of heads ``G`` this instance serves.

    A learned ``t`` has no upper bound: once training takes it past the time ``K`` was chosen
    for, the head is the truncated series of that ``t`` (its weights sum to less than 1;
    :meth:`truncation_error` says by how much), and with ``"euler"`` a ``t`` above ``K`` makes
    the product's weights alternate in sign. Pick ``steps`` (or ``tol``) for the largest ``t``
    you expect.

    Shapes:
        :meth:`coefficients`: ``(K+1,)`` (fixed ``t``) or ``(G, K+1)`` (learned).

    Examples:
        >>> op = HeatOperator(t=0.5, steps=2)
        >>> op.coefficients()
        tensor([0.6065, 0.3033, 0.0758])
        >>> HeatOperator(t=2.0, learnable=True, num_heads=3).t.shape
        torch.Size([3])
    """

    name = "heat"
    aliases = ("heat-kernel", "exp", "diffusion")
    example_kwargs = {"t": 0.7, "steps": 4, "learnable": True}

    def __init__(
        self,
        t: float = 1.0,
        steps: int | None = None,
        method: str = "taylor",
        learnable: bool = False,
        tol: float | None = None,
        min_t: float = -2.0,
        num_heads: int = 1,
    ) -> None:
        super().__init__(num_heads)
        t = _check_time(t)
        if method not in ("taylor", "euler"):
            raise ValueError(f"method must be 'taylor' or 'euler', got {method!r}{_choice_hint(method, _METHODS)}")
        learnable = check_flag(learnable, "learnable")
        min_t = check_real(min_t, "min_t")
        if math.isnan(min_t):  # clamp(min=nan) would make every learned time, and the head's output, NaN
            raise ValueError("min_t must be a number (-inf for no bound), got nan")
        if t < min_t:
            raise ValueError(f"t={t} is below min_t={min_t}, the bound on sharpening; pass min_t={t} or lower to "
                             "allow it (min_t=float('-inf'): no bound)")
        tol = _check_tol(tol)
        if steps is None:
            steps = heat_steps_for_tolerance(t, 1e-4 if tol is None else tol, method)
            if learnable:  # room to grow; and at t itself: a sharpening t's bound carries e^(2|t|), which the
                # positive max(2|t|, 1) alone missed (learnable t=-15 got K=52, whose error at t=-15 is 0.23)
                room = [max(2 * abs(t), 1.0)]
                if t < 0:  # room to grow for a sharpening time is downwards, to -max(2|t|, 1) or its bound min_t,
                    # where the series needs more terms than at t (learnable t=-1 got K=7: at -2, its bound, its
                    # weights summed to 0.998); not all the way to a far min_t (-50: K=184, a cost it never chose)
                    room.append(max(min_t, -room[0]))
                for edge in room:
                    try:
                        steps = max(steps, heat_steps_for_tolerance(edge, 1e-4 if tol is None else tol, method))
                    except ValueError:  # else "... for t=-72.0": a t never given, and no way out named
                        if edge < 0:  # room below out of reach (t=-36: -72): the K of t and above, as before
                            continue
                        raise ValueError(
                            f"heat(t={t:g}, learnable=True): steps=None leaves a learned t room to reach {edge:g}, "
                            f"where no steps up to {MAX_STEPS} meet the tolerance; pass steps= explicitly (checked at "
                            f"the initial t only)") from None
        elif isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < (1 if method == "euler" else 0):
            raise ValueError(f"steps must be a positive int (or None), got {steps!r}")
        else:
            steps = int(steps)  # a numpy int from a sweep: the spec writes a Python int
            if steps <= MAX_STEPS:
                with _host_numbers():  # reads the bound as a float, also under `with torch.device("meta")`
                    _check_truncation(t, steps, method, tol)
        if steps > MAX_STEPS:
            raise ValueError(f"steps={steps} exceeds the maximum of {MAX_STEPS}")
        # a tolerance looser than the default for explicit steps travels with the spec
        self._tol = float(tol) if tol is not None and tol > MAX_TRUNCATION_ERROR else None
        self.steps = steps
        self.method = method
        self.learnable = learnable
        self.min_t = float(min_t)
        self._t0 = t
        self._static: tuple[float, ...] | None = None
        if learnable:
            self.t = nn.Parameter(torch.full((num_heads,), t))
        else:
            self.register_buffer("t", torch.tensor(t, dtype=torch.float64))
            with _host_numbers():  # Python floats, also under `with torch.device("meta")` (deferred init)
                self._static = tuple(heat_coefficients(torch.tensor(t, dtype=torch.float64), steps, method).tolist())
            self.register_buffer("_c", torch.tensor(self._static, dtype=static_dtype()), persistent=False)

    @property
    def degree(self) -> int:
        return self.steps

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A learnable ``t`` back to its initial value (every head); a fixed ``t`` is no parameter."""
        if self.learnable:
            self.t.fill_(self._t0)

    def spec_kwargs(self) -> dict:
        kwargs = {"t": self._t0, "steps": self.steps, "method": self.method, "learnable": self.learnable}
        if self.min_t != -2.0:
            kwargs["min_t"] = self.min_t
        if self._tol is not None:
            kwargs["tol"] = self._tol
        return kwargs

    def effective_time(self) -> Tensor:
        """The diffusion time(s) in use (learned values clamped at ``min_t``)."""
        check_finite_parameter(self, "t", self.t)
        return self.t.clamp(min=self.min_t) if self.learnable else self.t

    def coefficients(self) -> Tensor:
        if not self.learnable:
            return self._c
        c = heat_coefficients(self.effective_time(), self.steps, self.method)
        return c.to(torch.float32) if self.t.dtype != torch.float64 else c

    def static_coefficients(self) -> tuple[float, ...] | None:
        return self._static

    def _load_from_state_dict(self, state_dict, prefix, *args):  # type: ignore[override]
        if not self.learnable:  # the fixed coefficients were built from the constructor's t
            _check_loaded_constant(self, state_dict, prefix, "t", self._t0, "t", args[-1])
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _fixed_constants(self) -> dict[str, float]:
        return {} if self.learnable else {"t": self._t0}

    def truncation_error(self) -> Tensor:
        """Bound on the ``inf``-norm error of the truncated series vs the exact kernel, per head."""
        return heat_truncation_error(self.effective_time(), self.steps, self.method)

    def extra_repr(self) -> str:
        t = self.t.detach()
        t_repr = _meta_repr(t) or (f"{t.item():g}" if t.numel() == 1 else f"{t.tolist()}")
        return f"t={t_repr}, steps={self.steps}, method={self.method!r}, learnable={self.learnable}, num_heads={self.num_heads}"


@register_operator
class ExactHeatOperator(DiffusionOperator):
    r"""Exact heat kernel :math:`\exp(-t (I - P))` via :func:`torch.linalg.matrix_exp` (dense only).

    A reference operator: it materialises ``P`` and its matrix exponential, ``O(N^3)`` per head,
    so it suits small graphs and tests. It has no polynomial form and refuses the sparse
    back-end.

    The matrix exponential loses about ``t * eps`` of the working dtype (scaling and squaring), so
    a call with ``t`` above ``1e-2 / eps`` (about ``8.4e4`` in float32, ``4.5e13`` in float64) is
    refused rather than returning garbage or NaN (a learned ``t`` is checked in eager mode on CPU).

    Args:
        t: diffusion time.
        learnable: learn ``t`` (one value per head; a learned ``t`` is clamped at ``-40``, the
            lowest ``t`` the constructor accepts).
        num_heads: number of heads ``G`` this instance serves.

    Shapes:
        :meth:`apply_matrix`: ``P`` ``(B, G, N, N)``, ``v`` ``(B, G, N, C)`` -> ``(B, G, N, C)``.

    Examples:
        >>> P = torch.full((1, 1, 2, 2), 0.5); v = torch.tensor([[[[1.], [3.]]]])
        >>> ExactHeatOperator(t=0.0).apply_matrix(P, v).flatten().tolist()
        [1.0, 3.0]
    """

    name = "heat-exact"
    aliases = ("expm", "matrix-exp", "exact-heat")
    example_kwargs = {"t": 0.7}
    _takes_float32_P = True  # matrix_exp runs in float32: P's gradient would overflow float16
    supports_sparse = False
    is_polynomial = False

    def __init__(self, t: float = 1.0, learnable: bool = False, num_heads: int = 1) -> None:
        super().__init__(num_heads)
        t = _check_time(t)
        if t < EXACT_MIN_T:
            raise ValueError(f"heat-exact(t={t:g}): t must be >= {EXACT_MIN_T:g}; exp(|t| (I - P)) grows like "
                             f"e^(2|t|), which leaves float32's range (3.4e38) below t = -44")
        if t > _EXACT_T_EPS / torch.finfo(torch.float64).eps:  # refused by apply_matrix in every dtype
            raise ValueError(f"heat-exact(t={t:g}): the matrix exponential loses about t * eps, "
                             f"{t * torch.finfo(torch.float64).eps:.2g} even in float64; use "
                             f"t <= {_EXACT_T_EPS / torch.finfo(torch.float64).eps:.3g}")
        self.learnable = check_flag(learnable, "learnable")
        self._t0 = t
        if learnable:
            self.t = nn.Parameter(torch.full((num_heads,), t))
        else:  # float64: a float64 layer applies exp(-t (I - P)) with t as given, not rounded to float32
            self.register_buffer("t", torch.full((num_heads,), t, dtype=torch.float64))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A learnable ``t`` back to its initial value (every head); a fixed ``t`` is no parameter."""
        if self.learnable:
            self.t.fill_(self._t0)

    def spec_kwargs(self) -> dict:
        return {"t": self._t0, "learnable": self.learnable}

    def _load_from_state_dict(self, state_dict, prefix, *args):  # type: ignore[override]
        if not self.learnable:  # the spec records the constructor's t
            _check_loaded_constant(self, state_dict, prefix, "t", self._t0, "t", args[-1])
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _fixed_constants(self) -> dict[str, float]:
        return {} if self.learnable else {"t": self._t0}

    @property
    def degree(self) -> int:
        raise NotImplementedError("heat-exact is not a polynomial in P: it has no finite degree")

    def coefficients(self) -> Tensor:
        raise NotImplementedError(
            "heat-exact is not a polynomial in P; use apply_matrix() on a materialised P "
            "(the dense back-end does this automatically)"
        )

    def apply_matrix(self, P: Tensor, v: Tensor) -> Tensor:
        check_finite_parameter(self, "t", self.t)
        G, N = P.shape[1], P.shape[-1]
        if self.num_heads not in (1, G):  # one t shared by the G heads (an instance given for several), or one each
            raise ValueError(f"heat-exact serves {self.num_heads} heads, got P with {G}")
        work = torch.float64 if P.dtype == torch.float64 else torch.float32
        limit = _EXACT_T_EPS / torch.finfo(work).eps
        if (self._t0 > limit if not self.learnable
                else checks_values(self.t) and bool((self.t.detach() > limit).any())):
            t_max = self._t0 if not self.learnable else float(self.t.detach().max())
            raise ValueError(f"heat-exact(t={t_max:g}) in {work}: the matrix exponential loses about t * eps = "
                             f"{t_max * torch.finfo(work).eps:.2g} (inaccurate, then NaN, as t grows); use t <= {limit:.3g}"
                             + (" or run the layer in float64" if work == torch.float32 else ""))
        eye = torch.eye(N, dtype=work, device=P.device)
        # a learned t is kept at EXACT_MIN_T or above, as the constructor keeps t: below it the kernel overflows
        t = self.t.clamp(min=EXACT_MIN_T).to(work).view(1, -1, 1, 1)
        kernel = _matrix_exp(-t * (eye - P.to(work)))  # not torch's own: off by 1e-5 for a lone float32 matrix
        return (kernel @ v.to(work)).to(v.dtype)

    def extra_repr(self) -> str:
        t = _meta_repr(self.t) or self.t.detach().tolist()
        return f"t={t}, learnable={self.learnable}, num_heads={self.num_heads}"
