r"""Reference implementations built from explicit matrices (for tests and for the exact operator).

They are slow and simple on purpose: every fast path in the package is tested against them
in float64.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from diffusionformer.ops._checks import check_scale

__all__ = ["dense_attention_reference", "heat_kernel_reference", "polynomial_reference"]


def dense_attention_reference(
    q: Tensor, k: Tensor, *, allowed: Tensor | None = None, scale: float | None = None
) -> Tensor:
    r"""Explicit :math:`P = \operatorname{softmax}(q k^\top s)` restricted to ``allowed`` entries.

    Rows with no allowed entry are zero, with zero gradients. Computed in float64 with an explicit
    exponential.

    Args:
        q: queries.
        k: keys.
        allowed: bool mask, True where ``j`` may be attended by ``i`` (default: all).
        scale: score scale, default ``1 / sqrt(C)``.

    Shapes:
        ``q``: ``(..., N, C)``, ``k``: ``(..., M, C)``, ``allowed``: broadcastable to ``(..., N, M)`` -> ``(..., N, M)``.

    Examples:
        >>> dense_attention_reference(torch.zeros(2, 3), torch.zeros(2, 3))
        tensor([[0.5000, 0.5000],
                [0.5000, 0.5000]], dtype=torch.float64)
    """
    if scale is None and q.shape[-1] == 0:  # else a bare ZeroDivisionError of 0 ** -0.5
        raise ValueError(f"dense_attention_reference: the default scale 1 / sqrt(C) needs q and k with a head "
                         f"dimension C >= 1, got q of shape {tuple(q.shape)}; pass scale= for C = 0")
    # a NaN or inf scale came back as a NaN matrix, True as scale 1, "x" as torch's "only integer tensors ...":
    # the checks of attention_matrix (C only sets the default, which C = 0 has not)
    scale = q.shape[-1] ** -0.5 if scale is None else check_scale(scale, 1)
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    if allowed is None:
        allowed = torch.ones_like(s, dtype=torch.bool)
    allowed = allowed.expand_as(s)
    if s.shape[-1] == 0:  # no key: every row is empty (amax over no entry is an error), as torch.softmax gives
        return s.clone()
    # shift by the row maximum over the allowed entries (0 for a row with none), exponentiate only allowed
    # entries: no inf appears anywhere, so a fully masked row has zero gradients, not NaN ones
    m = torch.where(allowed, s, torch.full_like(s, -math.inf)).amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.where(allowed, (torch.where(allowed, s, m) - m).exp(), torch.zeros_like(s))
    z = e.sum(-1, keepdim=True)
    # only a row with no allowed entry (z == 0) reads 0: a NaN score keeps its row NaN, as torch.softmax
    return torch.where(z != 0, e / torch.where(z != 0, z, torch.ones_like(z)), torch.zeros_like(e))


def polynomial_reference(P: Tensor, v: Tensor, coeffs: Tensor) -> Tensor:
    r""":math:`\big(\sum_k c_k P^k\big) v` with explicit matrix powers in float64.

    Args:
        P: (batched) square matrices.
        v: signals.
        coeffs: weights on ``P^0 .. P^K``; a leading head dimension broadcasts against ``P``'s
            second-to-last batch dimension when ``P`` is ``(B, H, N, N)`` and ``coeffs`` is ``(H, K+1)``.

    Shapes:
        ``P``: ``(..., N, N)``, ``v``: ``(..., N, C)``, ``coeffs``: ``(K+1,)`` or ``(H, K+1)`` -> ``(..., N, C)``.

    Examples:
        >>> P = torch.tensor([[0., 1.], [1., 0.]])
        >>> polynomial_reference(P, torch.tensor([[1.], [2.]]), torch.tensor([1., -1.])).flatten().tolist()
        [-1.0, 1.0]
    """
    _check_matrices_and_signals("polynomial_reference", P, v)
    P, v, coeffs = P.double(), v.double(), coeffs.double()
    N = P.shape[-1]
    eye = torch.eye(N, dtype=torch.float64, device=P.device).expand_as(P)
    total = torch.zeros_like(P)
    power = eye
    for kk in range(coeffs.shape[-1]):
        c = coeffs[..., kk]
        c = c.reshape(c.shape + (1, 1)) if coeffs.dim() > 1 else c
        total = total + c * power
        power = power @ P
    return total @ v


def heat_kernel_reference(P: Tensor, v: Tensor, t: float | Tensor) -> Tensor:
    r"""Exact heat diffusion :math:`\exp(-t (I - P)) v` via :func:`torch.linalg.matrix_exp` (float64).

    Args:
        P: (batched) square matrices.
        v: signals.
        t: diffusion time, a scalar or one value per matrix in the batch (broadcast as ``(..., 1, 1)``).

    Shapes:
        ``P``: ``(..., N, N)``, ``v``: ``(..., N, C)`` -> ``(..., N, C)``.

    Examples:
        >>> P = torch.full((2, 2), 0.5)
        >>> heat_kernel_reference(P, torch.tensor([[1.], [3.]]), 0.0).flatten().tolist()
        [1.0, 3.0]
    """
    _check_matrices_and_signals("heat_kernel_reference", P, v)
    if isinstance(t, bool) or not isinstance(t, (numbers.Real, Tensor)):  # True read as t = 1, "x" as torch's error
        raise TypeError(f"heat_kernel_reference: expected t to be a float or a tensor of times, got "
                        f"{type(t).__name__} ({t!r})")
    P, v = P.double(), v.double()
    t = torch.as_tensor(t, dtype=torch.float64, device=P.device)
    if not bool(torch.isfinite(t).all()):  # else exp(-t (I - P)) v came back all NaN, without a word
        raise ValueError(f"heat_kernel_reference: expected finite diffusion times t, got {t.tolist()}")
    if t.dim() > 0:
        t = t.reshape(t.shape + (1, 1))
    eye = torch.eye(P.shape[-1], dtype=torch.float64, device=P.device)
    return _matrix_exp(-t * (eye - P)) @ v


def _check_matrices_and_signals(who: str, P: object, v: object) -> None:
    """``P`` square matrices ``(..., N, N)`` and ``v`` signals ``(..., N, C)`` on those N nodes, else a ValueError
    naming ``who`` (not a matmul's "mat1 and mat2 shapes cannot be multiplied" three lines down)."""
    if not isinstance(P, Tensor) or not isinstance(v, Tensor):
        name, t = ("P", P) if not isinstance(P, Tensor) else ("v", v)
        raise TypeError(f"{who}: expected {name} to be a tensor, got {type(t).__name__}")
    if P.dim() < 2 or P.shape[-1] != P.shape[-2]:
        raise ValueError(f"{who}: expected P of shape (..., N, N) (square matrices), got {tuple(P.shape)}")
    if v.dim() < 2 or v.shape[-2] != P.shape[-1]:
        raise ValueError(f"{who}: expected v of shape (..., N, C) with N={P.shape[-1]} (the size of P), "
                         f"got {tuple(v.shape)}")


def _matrix_exp(A: Tensor) -> Tensor:
    """:func:`torch.linalg.matrix_exp` of ``A`` ``(..., N, N)``, accurate for a batch of one matrix too.

    For a lone matrix torch takes another code path than for a batch, and there (measured with torch 2.13
    against ``scipy.linalg.expm``) ``exp(-t (I - P))`` came out 1.4e-5 off in float32 near ``t = 0.3`` and
    7e-11 off in float64 near ``t = 0.02``, while a batch of several matrices is exact to rounding. A lone
    matrix is therefore run as a batch of two copies.
    """
    N = A.shape[-1]
    if A.dim() < 2 or N < 2 or A.numel() != N * N:  # a real batch, a 1 x 1 (exp) or an empty one: no such step
        return torch.linalg.matrix_exp(A)
    return torch.linalg.matrix_exp(A.reshape(1, N, N).expand(2, N, N))[0].reshape(A.shape)
