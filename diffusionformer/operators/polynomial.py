r"""Learned polynomial filters in ``P`` (GPR-GNN style)."""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import Tensor, nn

from diffusionformer.config import _choice_hint
from diffusionformer.operators.base import (DiffusionOperator, _host_numbers, _registered_class, check_count,
                                            check_finite_parameter)
from diffusionformer.operators.registry import build_operator, register_operator

__all__ = ["PolynomialOperator", "chebyshev_matrix"]

BASES = ("monomial", "chebyshev")


def chebyshev_matrix(steps: int, dtype: torch.dtype = torch.float64) -> Tensor:
    r"""Monomial coefficients of the Chebyshev polynomials :math:`T_0 .. T_K`: row ``k`` holds :math:`T_k`.

    :math:`T_0 = 1`, :math:`T_1 = x`, :math:`T_{k+1} = 2 x T_k - T_{k-1}`, so
    :math:`\sum_k \theta_k T_k(P) = \sum_j (\theta M)_j P^j`. Lower triangular with
    :math:`M_{kk} = 2^{k-1}` (``k >= 1``), hence invertible.

    Shapes:
        ``(K+1, K+1)``.

    Examples:
        >>> chebyshev_matrix(3)
        tensor([[ 1.,  0.,  0.,  0.],
                [ 0.,  1.,  0.,  0.],
                [-1.,  0.,  2.,  0.],
                [ 0., -3.,  0.,  4.]], dtype=torch.float64)
    """
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:  # numpy ints too
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    steps = int(steps)
    M = torch.zeros(steps + 1, steps + 1, dtype=torch.float64)
    M[0, 0] = 1.0
    if steps >= 1:
        M[1, 1] = 1.0
    for k in range(1, steps):
        M[k + 1, 1:] = 2.0 * M[k, :-1]
        M[k + 1] -= M[k - 1]
    return M.to(dtype)


def _is_array(init: Any) -> bool:
    """Coefficients given as numbers (a tensor, list, tuple or numpy array), not an operator to copy."""
    return isinstance(init, (Tensor, list, tuple)) or (hasattr(init, "__array__") and not isinstance(init, str))


def _check_init_array(init: Any) -> None:
    """Refuse coefficients that are not real numbers (bools read as 1/0, complex numbers losing their imaginary
    part, strings) or that have no entry at all (a head that outputs zero), naming ``init``."""
    try:
        probe = init if isinstance(init, Tensor) else torch.as_tensor(init)  # the dtype as given
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"init must be an operator spec or numbers of shape (K+1,) or (G, K+1), got {init!r} "
                        f"({exc})") from None
    if probe.dtype == torch.bool or probe.is_complex():
        raise TypeError(f"init coefficients must be real numbers, got {probe.dtype}")
    if probe.dim() >= 1 and probe.shape[-1] == 0:
        raise ValueError(f"init coefficients must have at least one entry (the weight on P^0), got shape "
                         f"{tuple(probe.shape)}")


@register_operator
class PolynomialOperator(DiffusionOperator):
    r"""A learned polynomial :math:`f(P) = \sum_{k=0}^{K} \theta_k P^k`, one ``theta`` per head.

    The generalised PageRank filter of GPR-GNN (Chien, Peng, Li & Milenkovic, ICLR 2021) on
    the attention graph: training chooses low-pass (attention-like), high-pass
    (Laplacian-like) or band filters. Any other polynomial operator can serve as the
    initialisation.

    With ``basis="chebyshev"`` the learned weights are on the Chebyshev polynomials,
    :math:`f(P) = \sum_k \theta_k T_k(P)` with :math:`T_{k+1}(P) = 2 P T_k(P) - T_{k-1}(P)`
    (ChebNet, Defferrard et al. 2016; compared with the monomial basis in GPR-GNN and
    ChebNetII): the same function space, a better-conditioned parameterisation on the
    spectrum of ``P`` in ``[-1, 1]``. :meth:`coefficients` still returns monomial weights
    (``theta`` times :func:`chebyshev_matrix`), so the engine and its back-ends are unchanged.
    The monomial form of :math:`T_k` has coefficients of up to about :math:`2.4^k` (its leading
    one is :math:`2^{k-1}`) that cancel on :math:`[-1, 1]`: in float32 the relative error against
    the float64 recursion is about ``1e-5`` at ``K = 10`` and ``5e-4`` at ``K = 16``, so keep
    ``K <= 12`` in float32; float64 is good to about ``1e-9`` at ``K = 20``, ``1e-8`` at ``K = 24``
    and ``1e-5`` at ``K = 30`` (the cancellation grows like ``2.4^K``), so keep ``K <= 24`` in float64.

    Args:
        steps: ``K``.
        init: initial coefficients: an operator spec (``"attention"``, ``"laplacian"``,
            ``"heat(t=1)"``, an operator instance), or a tensor/list of shape ``(K'+1,)`` or
            ``(G, K'+1)`` with ``K' <= K`` (zero-padded to ``K``; the spec records an instance of an
            unregistered class, which has no spec, or one whose spec rebuilds other coefficients, such as a
            trained one, as these coefficients).
            Always monomial coefficients: with the Chebyshev basis they are converted.
        num_heads: number of heads ``G`` this instance serves.
        basis: ``"monomial"`` (default) or ``"chebyshev"``: the basis of the learned ``theta``.

    Shapes:
        :meth:`coefficients`: ``(G, K+1)``.

    Examples:
        >>> PolynomialOperator(steps=3, init="laplacian").coefficients()
        tensor([[ 1., -1.,  0.,  0.]], grad_fn=<MulBackward0>)
        >>> op = PolynomialOperator(steps=2, init=[0.0, 0.0, 1.0], basis="chebyshev")
        >>> op.theta.detach()  # P^2 = (T_0 + T_2) / 2
        tensor([[0.5000, 0.0000, 0.5000]])
    """

    name = "polynomial"
    aliases = ("poly", "gpr", "gprgnn", "learned-polynomial")
    example_kwargs = {"steps": 3, "init": [0.1, 0.6, 0.2, 0.1]}

    def __init__(self, steps: int = 3, init: Any = "attention", num_heads: int = 1, basis: str = "monomial") -> None:
        super().__init__(num_heads)
        steps = check_count(steps, "steps", minimum=0)
        if basis not in BASES:
            raise ValueError(f"basis must be one of {BASES}, got {basis!r}{_choice_hint(basis, BASES)}")
        self.steps = steps
        self.basis = basis
        device = torch.get_default_device()  # of theta and the basis: meta under `with torch.device("meta")`
        with _host_numbers():  # the initial values are read as numbers, also under a meta device (deferred init)
            if _is_array(init):
                _check_init_array(init)
            # spec() writes list coefficients as given (float64: 0.1, not float32's 0.10000000149011612)
            self._init = init.spec() if isinstance(init, DiffusionOperator) else (
                torch.as_tensor(init, dtype=torch.float64).tolist() if _is_array(init) else init)
            theta = self._initial(init, steps, num_heads)  # float64: the values as given
            if isinstance(init, DiffusionOperator) and (_registered_class(type(init)) is None
                                                        or not torch.equal(self._initial(self._init, steps, num_heads),
                                                                           theta)):
                # its spec '<unregistered module.Class>' rebuilds nothing, and a trained instance's spec rebuilds its
                # initial values, so neither did this polynomial's: it records the coefficients it started from (one
                # row when every head has the same)
                self._init = (theta[0] if bool((theta == theta[0]).all()) else theta).tolist()
            if basis == "chebyshev":
                M = chebyshev_matrix(steps)
                if not torch.isfinite(M).all():  # else theta below is NaN, reported later as a diverged parameter
                    raise ValueError(f"basis='chebyshev' with steps={steps}: the monomial weights of T_K (up to about "
                                     f"2.4^K) overflow float64 from K = 810 on; use fewer steps or basis='monomial'")
                # theta_cheb M = c  <=>  M^T theta_cheb^T = c^T (M lower triangular)
                theta = torch.linalg.solve_triangular(M.T, theta.T, upper=True).T
            # in the default dtype, as every other learned parameter (float64 under torch.set_default_dtype): a
            # float32 theta, or init values rounded to float32, cost a float64 model its precision
            self._theta0: list[list[float]] = theta.tolist()  # float64: reset_parameters rounds it as below
            theta = theta.to(torch.get_default_dtype())
            if not torch.isfinite(theta).all():  # a finite float64 value beyond the default dtype's range
                raise ValueError(f"init coefficients must be finite in {theta.dtype}")
        # rebuilt from the values: the real CPU tensors above are neither on a meta device nor, inside a
        # FakeTensorMode (a dry run), fake (the mode refused them at the first call)
        if basis == "chebyshev":
            work = torch.float64 if theta.dtype == torch.float64 else torch.float32  # as _apply makes it
            self.register_buffer("_basis", torch.tensor(M.tolist(), dtype=work, device=device), persistent=False)
        self.theta = nn.Parameter(torch.tensor(theta.tolist(), dtype=theta.dtype, device=device))

    @staticmethod
    def _initial(init: Any, steps: int, G: int) -> Tensor:
        if _is_array(init):
            c = torch.as_tensor(init, dtype=torch.float64).detach().clone()
        else:
            op = build_operator(init)
            if not op.is_polynomial:
                raise ValueError(f"cannot initialise a polynomial from {op.name!r}, which is not a polynomial in P")
            # (G, K+1): a one-head operator's row (a learnable heat or ppr gives (1, K+1)) serves every head
            c = op.head_coefficients(G).detach().double()
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
        out = torch.zeros(G, steps + 1, dtype=torch.float64)
        out[:, : c.shape[1]] = c
        return out

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """``theta`` back to the coefficients ``init`` gave it (in the basis), in its present dtype and device."""
        self.theta.copy_(torch.tensor(self._theta0, dtype=torch.float64).to(self.theta.dtype))

    def spec_kwargs(self) -> dict:
        kwargs = {"steps": self.steps, "init": self._init}
        if self.basis != "monomial":
            kwargs["basis"] = self.basis
        return kwargs

    @property
    def degree(self) -> int:
        return self.steps

    def coefficients(self) -> Tensor:
        check_finite_parameter(self, "theta", self.theta)
        if self.basis == "chebyshev":
            # in float32 (float64 for float64 theta), never half: the monomial weights of T_k reach ~2.4^k and
            # cancel, so a half-precision product (a half module, or the matmul autocast runs in bfloat16) is off
            # by percents; the elementwise product and sum are not autocast ops
            work = torch.float64 if self.theta.dtype == torch.float64 else torch.float32
            return (self.theta.to(work).unsqueeze(-1) * self._basis.to(work)).sum(-2)
        return self.theta * 1.0

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # the exact basis matrix in the working precision (float64 or float32), never half
        super()._apply(fn, recurse)
        M = getattr(self, "_basis", None)
        if isinstance(M, Tensor):
            dtype = torch.float64 if self.theta.dtype == torch.float64 else torch.float32
            with torch.inference_mode(False):  # `.to()` under inference mode: else a basis no training step can save
                self._basis = chebyshev_matrix(self.steps, dtype).to(M.device)
        return self

    def _materialise_caches(self, device: torch.device, dtype: torch.dtype | None = None) -> None:
        super()._materialise_caches(device, dtype)
        M = getattr(self, "_basis", None)
        work = torch.float64 if self.theta.dtype == torch.float64 else torch.float32  # as _apply makes it
        if isinstance(M, Tensor) and (M.is_meta or M.dtype != work):
            with torch.inference_mode(False):
                self._basis = chebyshev_matrix(self.steps, work).to(device)

    def extra_repr(self) -> str:
        basis = f", basis={self.basis!r}" if self.basis != "monomial" else ""
        return f"steps={self.steps}, num_heads={self.num_heads}{basis}"
