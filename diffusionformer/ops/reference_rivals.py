r"""Float64 references for the rival operators, written from the papers' equations with explicit matrices.

Slow and literal on purpose: every rival's fast path (SDPA, edge softmax, the layer's
context) is tested against these. ``allowed`` is the bool mask of admissible keys
(``None``: all), as in :func:`~diffusionformer.ops.reference.dense_attention_reference`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from diffusionformer.ops.reference import dense_attention_reference

__all__ = [
    "attnscale_reference",
    "chebyshev_reference",
    "differential_reference",
    "grand_nl_reference",
    "neutreno_reference",
    "ppr_exact_reference",
    "rival_reference",
    "uniform_matrix_reference",
    "value_residual_reference",
]


def uniform_matrix_reference(N: int, allowed: Tensor | None = None) -> Tensor:
    r"""The direct-current matrix :math:`DC`: row ``i`` uniform over the admissible keys of ``i`` (float64).

    Examples:
        >>> uniform_matrix_reference(2, torch.ones(2, 2, dtype=torch.bool).tril())
        tensor([[1.0000, 0.0000],
                [0.5000, 0.5000]], dtype=torch.float64)
    """
    A = torch.ones(N, N, dtype=torch.float64) if allowed is None else allowed.double()
    rows = A.sum(-1, keepdim=True)
    return torch.where(rows > 0, A / torch.where(rows > 0, rows, torch.ones_like(rows)), torch.zeros_like(A))


def ppr_exact_reference(P: Tensor, v: Tensor, alpha: float) -> Tensor:
    r""":math:`\alpha (I - (1-\alpha) P)^{-1} v` with an explicit inverse."""
    P, v = P.double(), v.double()
    eye = torch.eye(P.shape[-1], dtype=torch.float64, device=P.device)
    return alpha * torch.linalg.inv(eye - (1.0 - alpha) * P) @ v


def chebyshev_reference(P: Tensor, v: Tensor, theta: Tensor) -> Tensor:
    r""":math:`\sum_k \theta_k T_k(P) v` with the matrix recursion :math:`T_{k+1} = 2 P T_k - T_{k-1}`.

    Shapes:
        ``P``: ``(B, H, N, N)``, ``v``: ``(B, H, N, C)``, ``theta``: ``(H, K+1)``.
    """
    P, v, theta = P.double(), v.double(), theta.double()
    eye = torch.eye(P.shape[-1], dtype=torch.float64, device=P.device).expand_as(P)
    T = [eye, P]
    while len(T) < theta.shape[-1]:
        T.append(2.0 * P @ T[-1] - T[-2])
    total = sum(theta[:, k].view(1, -1, 1, 1) * T[k] for k in range(theta.shape[-1]))
    return total @ v


def attnscale_reference(q: Tensor, k: Tensor, v: Tensor, omega: Tensor, allowed: Tensor | None = None) -> Tensor:
    r"""AttnScale: :math:`(DC + (1 + \omega_h)(P - DC))\, v` with explicit matrices."""
    P = dense_attention_reference(q, k, allowed=allowed)
    if allowed is None:  # every key: (N, M) on P's device (N queries may differ from M keys: a decoding step)
        allowed = torch.ones(P.shape[-2:], dtype=torch.bool, device=P.device)
    DC = uniform_matrix_reference(P.shape[-1], allowed)
    w = omega.double().view(1, -1, 1, 1)
    return (DC + (1.0 + w) * (P - DC)) @ v.double()


def neutreno_reference(q: Tensor, k: Tensor, v: Tensor, v0: Tensor | None, lam: float,
                       allowed: Tensor | None = None) -> Tensor:
    r"""NeuTRENO: :math:`P v + \lambda (v_0 - v)` (plain attention when ``v0`` is None)."""
    out = dense_attention_reference(q, k, allowed=allowed) @ v.double()
    return out if v0 is None else out + lam * (v0.double() - v.double())


def value_residual_reference(q: Tensor, k: Tensor, v: Tensor, v0: Tensor | None, lam: float,
                             allowed: Tensor | None = None) -> Tensor:
    r"""Value residual: :math:`P (v + \lambda v_1)` (plain attention when ``v0`` is None)."""
    vv = v.double() if v0 is None else v.double() + lam * v0.double()
    return dense_attention_reference(q, k, allowed=allowed) @ vv


def differential_reference(q: Tensor, k: Tensor, v: Tensor, lq1: Tensor, lk1: Tensor, lq2: Tensor, lk2: Tensor,
                           gain: Tensor, lambda_init: float, allowed: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    r"""Differential attention, term by term from Ye et al. (2024), float64.

    :math:`P_i = \operatorname{softmax}(q_i k_i^\top / \sqrt{C/2})` on the halves of each head,
    :math:`\lambda = e^{\lambda_{q1}\cdot\lambda_{k1}} - e^{\lambda_{q2}\cdot\lambda_{k2}} + \lambda_{init}`,
    output :math:`(1 - \lambda_{init})\, g \odot y / \sqrt{\overline{y^2} + \epsilon}` with
    :math:`y = (P_1 - \lambda P_2) v`.
    """
    C = q.shape[-1]
    h = C // 2
    s = h**-0.5
    P1 = dense_attention_reference(q[..., :h], k[..., :h], allowed=allowed, scale=s)
    P2 = dense_attention_reference(q[..., h:], k[..., h:], allowed=allowed, scale=s)
    lam = (math.exp(float((lq1.detach().double() * lk1.detach().double()).sum()))
           - math.exp(float((lq2.detach().double() * lk2.detach().double()).sum())) + lambda_init)
    y = (P1 - lam * P2) @ v.double()
    rms = torch.sqrt((y * y).mean(-1, keepdim=True) + eps)
    return (1.0 - lambda_init) * gain.double() * y / rms


def grand_nl_reference(q: Tensor, k: Tensor, v: Tensor, t: float, steps: int, method: str = "euler",
                       allowed: Tensor | None = None) -> Tensor:
    r"""GRAND-nl: integrate :math:`\dot X = (P(X) - I) X` for ``X = [q | k | v]`` and return the ``v`` part.

    ``P(X)`` is rebuilt from the current ``q``, ``k`` at every evaluation (explicit softmax).
    """
    C = q.shape[-1]
    X = torch.cat([q.double(), k.double(), v.double()], dim=-1)

    def f(X: Tensor) -> Tensor:
        P = dense_attention_reference(X[..., :C], X[..., C : 2 * C], allowed=allowed, scale=C**-0.5)
        return P @ X - X

    tau = t / steps
    for _ in range(steps):
        if method == "euler":
            X = X + tau * f(X)
        elif method == "rk4":
            a = f(X)
            b = f(X + tau / 2 * a)
            c = f(X + tau / 2 * b)
            d = f(X + tau * c)
            X = X + tau / 6 * (a + 2 * b + 2 * c + d)
        else:
            raise ValueError(f"method must be 'euler' or 'rk4', got {method!r}")
    return X[..., 2 * C :]


def rival_reference(op, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None = None,  # noqa: ANN001
                    v0: Tensor | None = None, depth: int = 0) -> Tensor:
    """The float64 reference of a rival operator ``op`` on head-major ``(B, G, N, C)`` inputs."""
    from diffusionformer import operators as ops

    if isinstance(op, ops.ExactPPROperator):
        return ppr_exact_reference(dense_attention_reference(q, k, allowed=allowed), v, op.alpha)
    if isinstance(op, ops.AttnScaleOperator):
        return attnscale_reference(q, k, v, op.omega.detach(), allowed)
    if isinstance(op, ops.NeuTRENOOperator):
        return neutreno_reference(q, k, v, v0, op.lam, allowed)
    if isinstance(op, ops.ValueResidualOperator):
        return value_residual_reference(q, k, v, v0, op.lam, allowed)
    if isinstance(op, ops.DifferentialOperator):
        return differential_reference(q, k, v, op.lambda_q1.detach(), op.lambda_k1.detach(), op.lambda_q2.detach(),
                                      op.lambda_k2.detach(), op.subln.weight.detach(), op.init_value(depth), allowed)
    if isinstance(op, ops.NonlinearDiffusionOperator):
        return grand_nl_reference(q, k, v, op.t, op.steps, op.method, allowed)
    raise TypeError(f"no rival reference for {type(op).__name__}")
