r"""Rotary position embeddings (RoPE) for queries and keys, in 1-D (sequences) and 2-D (grids).

RoPE (Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021)
rotates each pair of channels ``(x_{2i}, x_{2i+1})`` of a query or key at position ``m`` by
the angle ``m \theta_i`` with ``\theta_i = \mathrm{base}^{-2i/C}``:

.. math::
    \begin{pmatrix} x'_{2i} \\ x'_{2i+1} \end{pmatrix} =
    \begin{pmatrix} \cos m\theta_i & -\sin m\theta_i \\ \sin m\theta_i & \cos m\theta_i \end{pmatrix}
    \begin{pmatrix} x_{2i} \\ x_{2i+1} \end{pmatrix},
    \qquad (R_m q)^\top (R_n k) = q^\top R_{n-m}\, k,

so the score of a query at ``m`` and a key at ``n`` depends on ``n - m`` only. Applied to
``q`` and ``k`` before the scores, every head of a :class:`~diffusionformer.nn.DiffusionAttention`
(attention, Laplacian, heat, ...) diffuses over the rotated ``P``. The 2-D variant (as in
Heo et al., "Rotary Position Embedding for Vision Transformer", ECCV 2024, axial form)
rotates the first half of the channels by the row and the second half by the column of a
patch. Neither has parameters.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor, nn

from diffusionformer.nn._factory import _check_factory
from diffusionformer.ops._checks import checks_values

__all__ = ["RotaryEmbedding", "RotaryEmbedding2D", "apply_rotary"]


def _check_dim(name: str, head_dim: int, multiple: int) -> None:
    # numbers.Integral: a numpy int from a sweep is an int here, as it is to the operators
    if (isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral) or head_dim < multiple
            or head_dim % multiple):
        raise ValueError(f"{name}: expected head_dim a positive multiple of {multiple}, got {head_dim!r}")


def apply_rotary(x: Tensor, angles: Tensor) -> Tensor:
    r"""Rotate channel pairs ``(x_{2i}, x_{2i+1})`` of ``x`` by ``angles[..., i]``.

    Args:
        x: ``(..., N, H, C)`` queries or keys.
        angles: ``(N, C/2)`` rotation angles per position and pair (broadcast over heads).

    Shapes:
        ``(..., N, H, C) -> (..., N, H, C)``.

    Examples:
        >>> x = torch.tensor([[[1.0, 0.0]]])                    # (N=1, H=1, C=2)
        >>> apply_rotary(x, torch.tensor([[torch.pi / 2]])).round(decimals=6).abs()  # (1, 0) -> (0, 1)
        tensor([[[0., 1.]]])
    """
    return _apply_rotary(x, angles, check_values=True)


def _apply_rotary(x: Tensor, angles: Tensor, check_values: bool) -> Tensor:
    """:func:`apply_rotary`; ``check_values=False`` skips the finiteness test of ``angles`` (a pass over them and, on
    CPU, a host sync) where they come from positions already found finite (:meth:`RotaryEmbedding.angles`)."""
    if not isinstance(x, Tensor) or x.dim() < 3 or x.shape[-1] % 2:
        raise ValueError(f"apply_rotary: expected x of shape (..., N, H, C) with C even, got "
                         f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    if not x.is_floating_point():  # cos and sin cast to an integer dtype are 0 and 1: x came back unrotated
        raise TypeError(f"apply_rotary: expected floating-point x, got dtype {x.dtype}")
    if not isinstance(angles, Tensor) or angles.is_complex() or angles.dtype == torch.bool:
        raise TypeError(f"apply_rotary: expected real angles, got "
                        f"{angles.dtype if isinstance(angles, Tensor) else type(angles).__name__}")
    C = x.shape[-1]
    if angles.dim() != 2 or angles.shape[-1] * 2 != C or angles.shape[0] != x.shape[-3]:
        raise ValueError(
            f"apply_rotary: expected angles of shape (N, C/2) = ({x.shape[-3]}, {C // 2}), got {tuple(angles.shape)}"
        )
    if angles.device != x.device:  # else the rotation failed with a bare "expected device" error
        raise ValueError(f"apply_rotary: expected angles on the device of x ({x.device}), got {angles.device}")
    if check_values and angles.is_floating_point() and checks_values(angles) and not bool(torch.isfinite(angles).all()):
        # cos(inf) is NaN: the rotated queries came back NaN, silently (RotaryEmbedding refuses such positions)
        raise ValueError("apply_rotary: expected finite angles, got NaN or inf")
    # cos and sin in the wider of the two dtypes: an integer angle's cos was taken in float32 (torch's default dtype),
    # and float32 (or float16) angles were too, so a float64 x was rotated to ~1e-7 only
    wide = (torch.promote_types(angles.dtype, x.dtype) if angles.is_floating_point()
            else torch.float32 if angles.device.type == "mps" else torch.float64)
    angles = angles.to(wide)
    cos = angles.cos().to(x.dtype)[:, None, :]  # (N, 1, C/2)
    sin = angles.sin().to(x.dtype)[:, None, :]
    pairs = x.unflatten(-1, (C // 2, 2))  # (..., N, H, C/2, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


def _check_positions(positions: Tensor) -> None:
    """Positions are real numbers: a bool or complex tensor is a ``TypeError``; a NaN or infinite position (a
    NaN row of angles, so NaN queries) is a ``ValueError`` in eager mode on CPU (:func:`checks_values`)."""
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"RotaryEmbedding: expected integer or float positions, got dtype {positions.dtype}")
    if positions.is_floating_point() and checks_values(positions) and not bool(torch.isfinite(positions).all()):
        raise ValueError("RotaryEmbedding: expected finite positions, got NaN or inf")


class RotaryEmbedding(nn.Module):
    r"""1-D RoPE: position ``m`` rotates channel pair ``i`` by ``m\, \mathrm{base}^{-2i/C}``.

    Args:
        head_dim: ``C``, even.
        base: the frequency base (10000 in RoFormer and LLaMA).
        device: torch's factory argument (:func:`torch.nn.utils.skip_init`, building a model on ``"meta"``),
            checked and otherwise without effect: the module holds no tensors, its angles are computed on
            the device of the positions.
        dtype: likewise checked (a floating-point dtype) and without effect: the angles are computed in
            float64 and their cosines and sines cast to the dtype of ``x``.

    Shapes:
        ``x``: ``(..., N, H, C)``, ``positions``: ``(N,)`` (int or float; default ``0..N-1``)
        -> ``(..., N, H, C)``.

    Examples:
        >>> rope = RotaryEmbedding(4)
        >>> q, k = torch.randn(3, 1, 4), torch.randn(3, 1, 4)
        >>> s = (rope(q)[:, 0] @ rope(k)[:, 0].T)                 # scores of positions 0..2
        >>> s2 = (rope(q, torch.arange(5, 8))[:, 0] @ rope(k, torch.arange(5, 8))[:, 0].T)
        >>> torch.allclose(s, s2, atol=1e-5)                      # shift-invariant
        True
    """

    ndim = 1

    def __init__(self, head_dim: int, base: float = 10000.0, *, device: torch.device | str | int | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        _check_dim("RotaryEmbedding", head_dim, 2)
        if isinstance(base, bool) or not isinstance(base, numbers.Real) or not 1 < base < float("inf"):
            raise ValueError(f"{type(self).__name__}: expected base a finite float > 1, got {base!r}")
        _check_factory(device, dtype, type(self).__name__)
        self.head_dim = int(head_dim)
        self.base = float(base)

    def inv_freq(self, device: torch.device | None = None) -> Tensor:
        """``theta_i = base^{-2i/C}``, ``(C/2,)`` in float64."""
        C = self.head_dim
        return self.base ** (-torch.arange(0, C, 2, dtype=torch.float64, device=device) / C)

    def default_positions(self, N: int, device: torch.device | None = None) -> Tensor:
        """``0, 1, ..., N-1``."""
        return torch.arange(N, device=device)

    def angles(self, positions: Tensor) -> Tensor:
        """``(N,)`` positions -> ``(N, C/2)`` angles (float64)."""
        if positions.dim() != 1:
            raise ValueError(f"RotaryEmbedding: expected positions of shape (N,), got {tuple(positions.shape)}")
        _check_positions(positions)
        return positions.to(torch.float64)[:, None] * self.inv_freq(positions.device)[None, :]

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() < 3:
            raise ValueError(f"{type(self).__name__}: expected x of shape (..., N, H, C), "
                             f"got {tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        if positions is not None and not isinstance(positions, Tensor):
            raise TypeError(f"{type(self).__name__}: expected positions as a tensor, got {type(positions).__name__}")
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"RotaryEmbedding: expected x with last dim head_dim={self.head_dim}, got {tuple(x.shape)}")
        if positions is None:
            positions = self.default_positions(x.shape[-3], x.device)
        elif positions.shape[:1] != x.shape[-3:-2]:
            raise ValueError(f"{type(self).__name__}: expected positions for the N={x.shape[-3]} tokens of x "
                             f"{tuple(x.shape)}, got positions of shape {tuple(positions.shape)}")
        elif positions.device != x.device:  # else the rotation failed in a bare "expected device" error
            raise ValueError(f"{type(self).__name__}: expected positions on the device of x ({x.device}), "
                             f"got {positions.device}")
        return _apply_rotary(x, self.angles(positions), check_values=False)  # positions checked finite

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}"


class RotaryEmbedding2D(RotaryEmbedding):
    r"""Axial 2-D RoPE: channels ``[0, C/2)`` rotate by the row ``r``, ``[C/2, C)`` by the column ``c``,
    each half with the 1-D frequencies of a ``C/2``-dimensional RoPE.

    Then ``(R_{r,c} q)^\top (R_{r',c'} k)`` depends only on ``(r' - r, c' - c)``.

    Args:
        head_dim: ``C``, a multiple of 4.
        base: the frequency base.
        device: as :class:`RotaryEmbedding`'s (checked; the module holds no tensors).
        dtype: as :class:`RotaryEmbedding`'s (checked; the angles are float64).

    Shapes:
        ``x``: ``(..., N, H, C)``, ``positions``: ``(N, 2)`` rows and columns (required) ->
        ``(..., N, H, C)``.

    Examples:
        >>> rope = RotaryEmbedding2D(8)
        >>> grid = torch.tensor([[0, 0], [0, 1], [1, 0]])
        >>> rope(torch.randn(2, 3, 1, 8), grid).shape
        torch.Size([2, 3, 1, 8])
    """

    ndim = 2

    def __init__(self, head_dim: int, base: float = 100.0, *, device: torch.device | str | int | None = None,
                 dtype: torch.dtype | None = None) -> None:
        _check_dim("RotaryEmbedding2D", head_dim, 4)
        super().__init__(head_dim, base, device=device, dtype=dtype)

    def inv_freq(self, device: torch.device | None = None) -> Tensor:
        half = self.head_dim // 2
        return self.base ** (-torch.arange(0, half, 2, dtype=torch.float64, device=device) / half)

    def default_positions(self, N: int, device: torch.device | None = None) -> Tensor:
        raise ValueError("RotaryEmbedding2D: expected explicit (N, 2) positions (row, column), got none")

    def angles(self, positions: Tensor) -> Tensor:
        if positions.dim() != 2 or positions.shape[1] != 2:
            raise ValueError(f"RotaryEmbedding2D: expected positions of shape (N, 2), got {tuple(positions.shape)}")
        _check_positions(positions)
        f = self.inv_freq(positions.device)[None, :]  # (1, C/4)
        p = positions.to(torch.float64)
        return torch.cat([p[:, :1] * f, p[:, 1:] * f], dim=1)  # (N, C/2)
