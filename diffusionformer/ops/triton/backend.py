r"""The Triton kernels as a back-end of the engine: a whole layer in one affine and one polynomial call.

For a layer whose head ``h`` needs powers of ``P_h`` up to its degree ``d_h``,

.. math::
    \text{out}_h = \sum_{k=0}^{d_h} c_{h,k} P_h^k v_h ,

:meth:`TritonBackend.diffuse` splits the heads once into

* the *affine* heads (``d_h <= 1``: attention, Laplacian, learned ``c_0 I + c_1 P``), all of them
  in **one** :func:`~diffusionformer.ops.triton.affine_attention` launch whose epilogue forms
  ``c_0 v + c_1 P v``;
* the *K-step* heads (``d_h >= 2``: heat, PPR, polynomials, learned heat), all of them in **one**
  :func:`~diffusionformer.ops.triton.polynomial_attention` call: one launch per power of ``P``
  for all of them, coefficients accumulated in the kernel (a head of lower degree than the
  largest gets zero coefficients beyond its degree),

and writes both back in head order (token-major, ``(B, N, H, C)`` storage, so the layer's
``transpose(1, 2).reshape(B, N, D)`` is free). Head subsets are taken with
:func:`~diffusionformer.ops.engine.select` (strided views for runs of consecutive heads: the
kernels read any strides), and the coefficient tensors of static (Python float) coefficients
and the masks that zero coefficients beyond a head's degree are built once per layout and
device and cached: no host synchronisation, no per-head Python work per call.

When the back-end applies
-------------------------
:func:`triton_unsupported` names the first unsupported feature of a call, or returns ``None``:

* triton not installed; tensors neither on CUDA nor on CPU under ``TRITON_INTERPRET=1``;
* a call inside an eager ``torch.func`` transform (``grad``, ``vmap``, ``jvp``, ...) or under forward-mode AD:
  the kernels' autograd.Functions have no functorch rules;
* dtypes other than float32, float16, bfloat16 (float64 is not supported);
* ``v`` with a head size other than that of ``q`` and ``k``;
* more than 65535 sequence-heads ``B * H`` (the kernels launch one program row per
  sequence-head on the grid's second axis, which CUDA caps at 65535);
* a float ``attn_mask`` that requires grad while grad mode is on (the kernels give no gradient to
  the mask; under :func:`torch.no_grad` none is asked for);
* returning the attention weights (``need_weights``, which the layer also sets for
  non-polynomial operators).

Supported besides ``is_causal``: any ``attn_mask``, bool (True = attend) or float (added to the
scores), broadcastable to ``(B, H, N, N)`` (a window, a grid, a per-head mask); a bool mask that
depends on the key alone (``(B, 1, 1, N)``, a key padding mask folded in by the layer) takes the
kernels' cheaper key-padding path. Dropout on ``P``: every power gets its own mask, drawn in the
kernels from a Philox seed and drawn again by the backward pass
(:mod:`diffusionformer.ops.triton.attention`).

``backend="triton"`` raises a :class:`ValueError` naming that feature. ``backend="auto"`` takes
the Triton back-end only when :data:`~diffusionformer.ops.dense.TRITON_IN_AUTO` is set (it is
``False`` until the kernels have been measured on a GPU), and then for CUDA tensors when triton
imports and the call is supported, and
otherwise falls back to the rule of :func:`~diffusionformer.ops.dense.choose_dense_backend`. One
exception under ``"auto"``: when every head is plain attention given as static coefficients
(``c_0, c_1 = 0, 1``, an all-attention layer), the stock fused SDPA kernel (flash or cuDNN)
computes exactly that and is kept; and ``"auto"`` keeps head sizes above
:data:`~diffusionformer.ops.dense.TRITON_AUTO_MAX_HEAD_DIM` (128) on the PyTorch back-ends.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from diffusionformer.ops.engine import Backend, Heads, _pure_cache, _tensor_cache, head_runs, select
from diffusionformer.ops.recompute import _in_eager_transform
from diffusionformer.ops.triton._launch import _MAX_GRID_Y, _TRITON_PIP

__all__ = ["TritonBackend", "key_padding_from_mask", "split_mask", "triton_unsupported"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _runs_here(device: torch.device) -> bool:
    """Whether the kernels run on tensors of ``device``: CUDA, or CPU under the Triton interpreter."""
    from diffusionformer.ops.triton import _kernels

    if not _kernels.HAS_TRITON:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and type(_kernels._first_step).__name__ == "InterpretedFunction"


def split_mask(attn_mask: Tensor | None, batch_size: int) -> tuple[Tensor | None, Tensor | None]:
    """``(key_padding_mask, general_mask)`` for the kernels: a bool mask that depends on the key alone
    becomes a ``(B, N)`` key padding mask (the kernels' cheaper path), any other mask stays 4-D (one broadcast
    along the keys too, ``(B, 1, 1, 1)``: its key padding mask would have one column where the kernels read ``N``).

    Args:
        attn_mask: a validated 4-dimensional mask (bool True = attend, or float), or ``None``.
        batch_size: ``B``.

    Examples:
        >>> pad, general = split_mask(torch.tensor([True, False]).view(1, 1, 1, 2), 1)
        >>> pad.tolist(), general
        ([[False, True]], None)
    """
    if attn_mask is None:
        return None, None
    if attn_mask.dtype == torch.bool and attn_mask.shape[1] == 1 and attn_mask.shape[2] == 1 and attn_mask.shape[3] > 1:
        return key_padding_from_mask(attn_mask, batch_size), None
    return None, attn_mask


def key_padding_from_mask(attn_mask: Tensor | None, batch_size: int) -> Tensor | None:
    """The ``(B, N)`` key padding mask (True = padding) of a bool ``attn_mask`` that depends on the key alone.

    Args:
        attn_mask: a validated 4-dimensional bool mask (True = attend) whose head and query
            dimensions are 1, or ``None``.
        batch_size: ``B``.

    Shapes:
        ``attn_mask``: ``(B, 1, 1, N)`` or ``(1, 1, 1, N)`` -> ``(B, N)``.

    Examples:
        >>> key_padding_from_mask(torch.tensor([True, False]).view(1, 1, 1, 2), 2).tolist()
        [[False, True], [False, True]]
    """
    if attn_mask is None:
        return None
    return ~attn_mask[:, 0, 0, :].expand(batch_size, attn_mask.shape[-1])




def triton_unsupported(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, need_weights: bool) -> str | None:
    """The first feature of a (validated) dense call the Triton back-end does not support, or ``None``.

    ``attn_mask`` is the user's mask made 4-dimensional (bool True = attend, or float), before
    ``is_causal`` is folded into it. See the module docstring for the rule.
    """
    from diffusionformer.ops.triton import is_available

    if not is_available():
        return f"running without the 'triton' package ({_TRITON_PIP})"
    if not _runs_here(q.device):
        return (f"{q.device.type} tensors (the kernels run on CUDA, or on CPU under TRITON_INTERPRET=1 set "
                "before triton is first imported)")
    if _in_eager_transform():  # else torch's "it must override the setup_context staticmethod" or "implement the jvp"
        return ("a torch.func transform (grad, vmap, jvp, jacrev, ...) or forward-mode AD (the kernels' "
                "autograd.Functions have no functorch support)")
    if q.dtype not in _DTYPES:
        return f"dtype {q.dtype} (supported: float32, float16, bfloat16)"
    if v.shape[-1] != q.shape[-1]:
        return f"values of head size {v.shape[-1]} != the query head size {q.shape[-1]}"
    if q.shape[0] * q.shape[1] > _MAX_GRID_Y:
        return (f"B * H = {q.shape[0] * q.shape[1]} sequence-heads, more than the {_MAX_GRID_Y} a CUDA grid's "
                "second axis holds (the kernels launch one program row per sequence-head)")
    if attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled():  # no_grad: none is asked for
        return "a float attn_mask that requires grad (the kernels give the mask no gradient)"
    if need_weights:
        return "need_weights (the kernels never materialise P; non-polynomial operators need it)"
    return None


# ---------------------------------------------------------------------------- cached layouts
@_pure_cache(maxsize=256)
def _split(degrees: tuple[int, ...]) -> tuple[Heads, Heads, tuple[tuple[int, int, int, int], ...]]:
    """``(affine heads, K-step heads, segments)``; a segment ``(start, stop, group, pos)`` takes heads
    ``start .. stop - 1`` of the output from group ``group`` (0 affine, 1 K-step) at position ``pos``."""
    low = tuple(h for h, d in enumerate(degrees) if d <= 1)
    high = tuple(h for h, d in enumerate(degrees) if d >= 2)
    segments = []
    for group, heads in enumerate((low, high)):
        pos = 0
        for a, b in head_runs(heads):
            segments.append((a, b, group, pos))
            pos += b - a
    return low, high, tuple(sorted(segments))


@_tensor_cache(maxsize=256)
def _degree_mask(degrees: tuple[int, ...], width: int, device: torch.device) -> Tensor:
    """``(H, width)`` float32: 1 where the power ``j <= degrees[h]``, else 0 (built once per layout and device)."""
    with torch.inference_mode(False):
        rows = [[1.0 if j <= d else 0.0 for j in range(width)] for d in degrees]
        return torch.tensor(rows, dtype=torch.float32, device=device)


@_tensor_cache(maxsize=256)
def _static_tensor(rows: tuple[tuple[float, ...], ...], degrees: tuple[int, ...], device: torch.device) -> Tensor:
    """Static coefficients as a float32 ``(H, K+1)`` tensor on ``device``, zero beyond each head's degree (cached)."""
    with torch.inference_mode(False):
        c = [[x if j <= d else 0.0 for j, x in enumerate(r)] for r, d in zip(rows, degrees)]
        return torch.tensor(c, dtype=torch.float64, device="cpu").to(device=device, dtype=torch.float32)


def _to_degrees(c: Tensor, degrees: tuple[int, ...]) -> Tensor:
    """``c`` with the columns beyond each head's degree zeroed (differentiable; no copy when nothing is zeroed)."""
    width = c.shape[1]
    if all(d >= width - 1 for d in degrees):
        return c
    return c * _degree_mask(degrees, width, c.device)


# ---------------------------------------------------------------------------- the back-end
class TritonBackend(Backend):
    """``P`` recomputed block by block inside the Triton kernels (flash-style, never materialised).

    :meth:`diffuse` is the whole layer (module docstring); :meth:`propagate` and :meth:`affine`
    make it usable by the generic engine loop as well.

    Args:
        q: queries.
        k: keys (the same tokens as the queries).
        is_causal: position ``i`` attends to keys ``j <= i`` only.
        key_padding_mask: ``(B, N)`` bool, True marks padding keys, or ``None``.
        scale: score scale.
        attn_mask: a validated 4-D ``attn_mask`` (bool True = attend, or float added to the scores)
            broadcastable to ``(B, H, N, N)``, applied besides ``key_padding_mask``, or ``None``.
        dropout_p: dropout on ``P`` (training only): every launch, hence every power of ``P``, draws
            its own mask.

    Shapes:
        ``q``, ``k``: ``(B, H, N, C)``; signals ``(B, H', N, C)`` (heads along dim 1).
    """

    name = "triton"
    head_axis = 1
    recomputes_scores = True
    fused_affine = True

    def __init__(self, q: Tensor, k: Tensor, is_causal: bool, key_padding_mask: Tensor | None, scale: float,
                 dropout_p: float = 0.0, attn_mask: Tensor | None = None) -> None:
        self.q, self.k, self.is_causal, self.pad, self.scale = q, k, is_causal, key_padding_mask, scale
        self.dropout_p, self.attn_mask = dropout_p, attn_mask
        # the kernels' form of the padding mask (bytes, 1 = padding)
        self._pad = None if key_padding_mask is None else key_padding_mask.contiguous().view(torch.uint8)

    def _run(self, heads: Heads | None, v: Tensor, c: Tensor) -> Tensor:
        """``sum_j c_j P^j v`` for the heads ``heads`` (default all) on validated inputs (no re-checks)."""
        from diffusionformer.ops.triton._library import polynomial

        q, k = (self.q, self.k) if heads is None else (select(self.q, heads, 1), select(self.k, heads, 1))
        return polynomial(q, k, v, c.contiguous(), self._pad, self.is_causal, self.scale, self.dropout_p, None,
                          self._mask(heads))

    def _mask(self, heads: Heads | None) -> Tensor | None:
        """The general mask of the heads ``heads`` (all when ``None``; a mask shared by the heads as it is)."""
        m = self.attn_mask
        if m is None or heads is None or m.shape[1] == 1:
            return m
        return select(m, heads, 1)

    def _kw(self, heads: Heads | None = None) -> dict:
        return dict(is_causal=self.is_causal, key_padding_mask=self.pad, scale=self.scale, dropout_p=self.dropout_p,
                    attn_mask=self._mask(heads))

    def propagate(self, x: Tensor, heads: Heads) -> Tensor:
        from diffusionformer.ops.triton import affine_attention

        return affine_attention(select(self.q, heads, 1), select(self.k, heads, 1), x, 0.0, 1.0, **self._kw(heads))

    def affine(self, v: Tensor, c0: Sequence[float] | Tensor, c1: Sequence[float] | Tensor) -> Tensor:
        from diffusionformer.ops.triton import affine_attention

        H = v.shape[1]
        if not isinstance(c0, Tensor):
            c = _static_tensor(tuple(zip(c0, c1)), (1,) * H, v.device)
            c0, c1 = c[:, 0], c[:, 1]
        return affine_attention(self.q, self.k, v, c0, c1, **self._kw())

    def diffuse(self, v: Tensor, coeffs: Tensor | tuple[tuple[float, ...], ...], degrees: tuple[int, ...]) -> Tensor:
        r"""``sum_{k <= d_h} c_{h,k} P_h^k v_h`` for every head: one affine launch, one polynomial call.

        Args:
            v: values.
            coeffs: ``(H, K+1)`` tensor (may require grad) or static rows of Python floats.
            degrees: the degree ``d_h <= K`` of every head.

        Shapes:
            ``v``: ``(B, H, N, C)``; ``coeffs``: ``(H, K+1)`` -> ``(B, H, N, C)`` in the dtype of ``v``.
        """
        if isinstance(coeffs, tuple):
            c = _static_tensor(coeffs, degrees, v.device)
        else:
            c = _to_degrees(coeffs.float(), degrees)
        if c.shape[1] == 1:  # K = 0: c0 v, no propagation
            return (c[:, 0].view(1, -1, 1, 1) * v.float()).to(v.dtype)
        low, high, segments = _split(degrees)
        outs: list[Tensor | None] = []
        # inputs were validated by the entry point: the kernels are called directly (the
        # public wrappers would re-check, and a data-dependent check breaks torch.compile graphs)
        if low:  # affine_attention: one launch, epilogue c0 v + c1 P v
            outs.append(self._run(low, select(v, low, 1), select(c, low, 0)[:, :2]))
        else:
            outs.append(None)
        if high:  # polynomial_attention: one launch per power of P for all K-step heads
            K = max(degrees[h] for h in high)
            outs.append(self._run(high, select(v, high, 1), select(c, high, 0)[:, : K + 1]))
        if not high or not low:
            return outs[0] if high == () else outs[1]
        # heads back in order, stored (B, N, H, C) like the kernels' outputs
        pieces = [outs[g].narrow(1, pos, b - a).transpose(1, 2) for a, b, g, pos in segments]
        return torch.cat(pieces, dim=2).transpose(1, 2)
