r"""Flash-style diffusion kernels in Triton: :func:`affine_attention` and :func:`polynomial_attention`.

For every head ``h`` with :math:`P_h = \operatorname{softmax}(q_h k_h^\top \cdot s + \text{mask})`
(a row with no admissible key is a zero row of ``P``, as everywhere in the library),

.. math::
    \text{polynomial\_attention}(q, k, v, c)_h = \sum_{k=0}^{K} c_{h,k}\, P_h^k v_h ,
    \qquad
    \text{affine\_attention}(q, k, v, c_0, c_1)_h = c_{0,h}\, v_h + c_{1,h}\, P_h v_h .

``P`` is never materialised: every application streams key blocks through an online softmax
(FlashAttention-2), so memory is ``O(N)`` per head. The mask is ``is_causal``, a key padding mask
and any ``attn_mask`` (bool, True = attend, or float added to the scores; broadcastable to
``(B, H, N, N)``: a graph such as a sliding window or a grid, read block by block).

Dropout on ``P`` (``dropout_p > 0``, training) drops every power with its own mask, as the
PyTorch back-ends do (:class:`~diffusionformer.ops.dense.MatrixBackend` and SDPA draw a fresh
mask per step): ``sum_k c_k (P * D_k) ... (P * D_1) v`` with ``D_t`` entries ``0`` (probability
``p``) or ``1 / (1 - p)``, with ``p`` rounded to a multiple of ``2^-16``. The masks are never
stored: one Philox draw under the call's ``seed`` decides 8 neighbouring keys ``8 g .. 8 g + 7`` of row
``i`` of ``D_t`` for head ``b H + h`` (counter ``(i ceil(N / 8) + g, b H + h, t, high word)``, 16 bits per
key), which the backward kernels draw again (``dP = sum_t D_t * (a_t y_{t-1}^T)``; the softmax
normaliser counts dropped keys, as :func:`torch.nn.functional.dropout` after the softmax does).
:func:`dropout_scales` writes the masks of a seed out, for tests and debugging.

Forward, one kernel launch per power of ``P`` for all ``B * H`` heads:

* step 1 (online softmax) computes ``y_1 = P v`` and the log-sum-exp of every row, and its
  epilogue writes ``c_0 v + c_1 y_1`` (for ``K = 1`` this is the output: attention, Laplacian
  and any learned ``c_0 I + c_1 P`` head in one launch, no extra pass);
* step ``k >= 2`` recomputes ``P`` block by block from ``q, k`` and the stored log-sum-exp,
  computes ``y_k = P y_{k-1}`` and accumulates ``out += c_k y_k`` in the same kernel (float32
  accumulator for half-precision inputs, cast once by the last step).

Backward (reverse recursion). With ``g`` the output gradient, the adjoint vectors
``a_K = c_K g``, ``a_m = c_m g + P^\top a_{m+1}`` give ``dv = a_0``,
``dc_{h,k} = \langle g_h, y_{h,k} \rangle`` and
``dP = \sum_{m=0}^{K-1} a_{m+1} y_m^\top`` (``y_0 = v``), which the softmax backward turns into
``dS = P \odot (dP - \delta)`` with ``\delta_i = \sum_{m=1}^{K} \langle a_{m,i}, y_{m,i} \rangle``
(``\delta`` is summed in float64, and for float32 inputs ``dP`` with compensated float32 sums: on long series
both are hundreds of times ``dS``, and plain float32 sums cost ``dq``, ``dk`` 30-270x the ``matrix``
back-end's error).
Launches: ``K`` transposed steps (``P^\top`` streamed over query blocks), then one kernel for
``dk`` and ``dv = c_0 g + P^\top a_1`` and one for ``dq``; both contract ``dP`` block by block
(inner dimension ``K C``), never ``N x N``. The forward pass saves ``y_1 .. y_K`` for this
(``K`` extra tensors the size of ``v``). The transposed steps also write ``\delta`` and the
per-row terms of ``dc`` (one ``(K+1, B, H, N)`` float32 tensor, summed by PyTorch), and
``a_K = c_K g`` is the first transposed launch without its ``P^\top`` term, so backward is
``K + 2`` launches plus one small reduction. Outputs and gradients are ``(B, H, N, C)`` tensors
stored as ``(B, N, H, C)`` (as SDPA's output), and the output gradient is read with its strides,
so a layer's ``transpose(1, 2).reshape(B, N, D)`` around the kernels copies nothing.

The forward and backward launches are registered as PyTorch custom operators
(``diffusionformer::triton_polynomial_fwd`` / ``_bwd``, :mod:`diffusionformer.ops.triton._library`,
with fake implementations and an autograd rule), so ``torch.compile(fullgraph=True)`` captures
a call as one graph node each way instead of breaking the graph; eager calls launch them from
an :class:`torch.autograd.Function` (less dispatch overhead).

Precision: scores, softmax statistics and accumulators are float32; ``P`` is cast to the input
dtype before each ``P x`` product (as in flash attention). float32 inputs use IEEE float32 dot
products (no TF32). A float ``attn_mask`` enters the scores less its row maximum over the admissible keys
(softmax ignores a per-row constant): a row whose every key carries a large negative bias (``-1e9``,
``torch.finfo(dtype).min``) keeps an exact log-sum-exp, so every power of ``P`` is its softmax. ``P`` recomputed
from the stored float32 log-sum-exp ``L`` (powers after the first, and the backward) carries a relative error of up
to about ``|L| 2^-24`` (its rounding), as in flash attention: negligible at ordinary scores, about 0.2% at
scores of order ``3e4`` (``|L| ~ 4.8e4``), where the first power (``exp2(s - m)`` against the running maximum) stays
exact. Under
``TRITON_INTERPRET=1`` (CPU tensors) bfloat16 dot operands are upcast to float32, because the interpreter's
bfloat16 ``tl.dot`` is not reliable.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from diffusionformer.ops._checks import (
    _check_is_causal, _check_strided, check_attn_mask, check_coefficients, check_dropout, check_scale,
)
from diffusionformer.ops.triton._launch import _check_inputs

__all__ = ["affine_attention", "dropout_scales", "polynomial_attention", "is_available"]


def is_available() -> bool:
    """Whether triton imports (the kernels then run on CUDA tensors, or on CPU under ``TRITON_INTERPRET=1``)."""
    from diffusionformer.ops.triton import _kernels

    return _kernels.HAS_TRITON


def polynomial_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    coeffs: Tensor,
    *,
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    seed: Tensor | None = None,
) -> Tensor:
    r"""K-step diffusion :math:`\sum_{k=0}^{K} c_{h,k} P_h^k v_h` in ``K`` Triton launches for all heads.

    Differentiable in ``q``, ``k``, ``v`` and ``coeffs`` (so learned heat times or polynomial
    coefficients train through it). See the module docstring for the kernels and the backward
    recursion.

    Args:
        q: queries.
        k: keys.
        v: values.
        coeffs: coefficients of ``P^0 .. P^K``, per head ``(H, K+1)`` or shared ``(1, K+1)`` / ``(K+1,)``.
        is_causal: position ``i`` attends to keys ``j <= i`` only.
        key_padding_mask: ``(B, N)`` bool, True marks padding keys (never attended to).
        attn_mask: bool (True = attend) or float (added to the scores) mask broadcastable to
            ``(B, H, N, N)``, applied besides ``is_causal`` and ``key_padding_mask`` (a window, a
            grid, a per-head mask); a row with no admissible key is a zero row of ``P``. No
            gradient flows to a float mask (one that requires grad is an error outside
            :func:`torch.no_grad`).
        scale: score scale, default ``1 / sqrt(C)``.
        dropout_p: dropout on ``P``, a fresh mask per power (training only; module docstring).
        seed: ``(1,)`` int64 tensor on the device of ``q`` that fixes the dropout masks;
            default a fresh draw from PyTorch's generator (``torch.manual_seed`` reproduces it).

    Shapes:
        ``q``, ``k``, ``v``: ``(B, H, N, C)`` (any strides; float32, float16 or bfloat16, CUDA,
        or CPU under ``TRITON_INTERPRET=1``) -> ``(B, H, N, C)`` in the dtype of ``q``.

    Raises:
        TypeError, ValueError: wrong types, shapes, dtypes or devices (the message names the
            argument), ``dropout_p`` outside ``[0, 1)``, or a malformed ``seed``.
    """
    _check_inputs(q, k, v, key_padding_mask)
    scale = check_scale(scale, q.shape[-1])
    dropout_p = check_dropout(dropout_p)
    seed = _check_seed(seed, q.device)
    if attn_mask is not None:
        B, H, N, _ = q.shape
        attn_mask = check_attn_mask(attn_mask, (B, H, N, N), q.dtype)
        if attn_mask.requires_grad and torch.is_grad_enabled():  # under no_grad no gradient is asked for
            raise ValueError("attn_mask requires grad, but the Triton kernels give the mask no gradient; "
                             "pass attn_mask.detach() or use diffusionformer.functional.diffuse")
        attn_mask = attn_mask.to(q.device)
    _check_is_causal(is_causal)
    H = q.shape[1]
    coeffs = check_coefficients(coeffs, H, q).float()
    if coeffs.shape[1] == 1:  # K = 0: no propagation at all; stored token-major as the kernels' outputs (so
        # out.transpose(1, 2).view(B, N, H * C) works for every K)
        B, _, N, C = v.shape
        out = torch.empty_strided((B, H, N, C), (N * H * C, C, H * C, 1), device=v.device, dtype=v.dtype)
        return out.copy_(coeffs[:, 0].view(1, H, 1, 1) * v.float())
    if not coeffs.is_contiguous():
        coeffs = coeffs.contiguous()
    pad = None
    if key_padding_mask is not None:
        pad = key_padding_mask.to(q.device).contiguous().view(torch.uint8)
    from diffusionformer.ops.triton._library import polynomial

    return polynomial(q, k, v, coeffs, pad, is_causal, scale, dropout_p, seed, attn_mask)


def affine_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    c0: Tensor | float,
    c1: Tensor | float,
    *,
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    seed: Tensor | None = None,
) -> Tensor:
    r"""Affine heads :math:`c_{0,h} v_h + c_{1,h} P_h v_h` in one flash-attention launch (forward).

    Attention is ``(c0, c1) = (0, 1)``, the Laplacian head ``(1, -1)``; learned ``c0``/``c1``
    get gradients. The combination happens in the kernel's epilogue: no second pass, no
    per-head slicing. The backward pass takes two launches (``dk, dv`` and ``dq``) plus two
    small reductions (``delta`` and the coefficient gradients).

    Args:
        q: queries.
        k: keys.
        v: values.
        c0: coefficient of ``I`` per head, a float or a tensor of shape ``(H,)``.
        c1: coefficient of ``P`` per head, a float or a tensor of shape ``(H,)``.
        is_causal: position ``i`` attends to keys ``j <= i`` only.
        key_padding_mask: ``(B, N)`` bool, True marks padding keys.
        attn_mask: bool or float mask broadcastable to ``(B, H, N, N)``, as in :func:`polynomial_attention`.
        scale: score scale, default ``1 / sqrt(C)``.
        dropout_p: dropout on ``P`` (training only), as in :func:`polynomial_attention`.
        seed: the dropout seed, as in :func:`polynomial_attention`.

    Shapes:
        ``q``, ``k``, ``v``: ``(B, H, N, C)``; ``c0``, ``c1``: ``(H,)`` or scalars -> ``(B, H, N, C)``.
    """
    _check_inputs(q, k, v, key_padding_mask)
    H = q.shape[1]
    cols = []
    for name, c in (("c0", c0), ("c1", c1)):
        if isinstance(c, numbers.Real) and not isinstance(c, bool):  # numpy reals too
            c = torch.full((H,), float(c), device=q.device)
        if not isinstance(c, Tensor):
            raise TypeError(f"{name} must be a float or a tensor of shape (H,) = ({H},), got {type(c).__name__}")
        _check_strided(name, c, f"pass {name}.to_dense()")
        if c.dim() == 0:
            c = c.expand(H)
        if tuple(c.shape) != (H,):
            raise ValueError(f"{name} must have shape (H,) = ({H},), got {tuple(c.shape)}")
        if not c.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {c.dtype}")
        cols.append(c.to(device=q.device, dtype=torch.float32))
    return polynomial_attention(
        q, k, v, torch.stack(cols, dim=1), is_causal=is_causal, key_padding_mask=key_padding_mask,
        attn_mask=attn_mask, scale=scale, dropout_p=dropout_p, seed=seed,
    )


def _check_seed(seed: object, device: torch.device) -> Tensor | None:
    if seed is None:
        return None
    if not isinstance(seed, Tensor) or seed.dtype != torch.int64 or tuple(seed.shape) != (1,):
        got = f"{seed.dtype} tensor of shape {tuple(seed.shape)}" if isinstance(seed, Tensor) else type(seed).__name__
        raise ValueError(f"seed must be a (1,) int64 tensor, got a {got}")
    if seed.device != device:
        raise ValueError(f"seed must be on the device of q ({device}), got {seed.device}")
    return seed


def dropout_scales(seed: Tensor, batch_size: int, num_heads: int, num_tokens: int, steps: int,
                   dropout_p: float) -> Tensor:
    r"""The dropout masks the kernels draw under ``seed``, written out: ``D[t - 1]`` is the mask of ``P^t``'s factor ``t``.

    Entries are ``0`` (dropped) or ``1 / (1 - rate)`` (kept), where ``rate`` is ``dropout_p`` rounded to a
    multiple of ``2^-16`` (the kernels decide an entry with 16 random bits), so that
    ``polynomial_attention(q, k, v, c, dropout_p=p, seed=seed)`` equals
    ``sum_k c_k (P * D[k-1]) ... (P * D[0]) v`` with the softmax matrix ``P`` (module docstring).
    For tests and debugging: it materialises ``steps * B * H * N * N`` floats.

    Args:
        seed: ``(1,)`` int64 tensor (CUDA, or CPU under ``TRITON_INTERPRET=1``).
        batch_size: ``B``.
        num_heads: ``H``.
        num_tokens: ``N``.
        steps: the number of powers ``K``.
        dropout_p: the dropout probability in ``[0, 1)``.

    Shapes:
        -> ``(steps, B, H, N, N)`` float32 on the device of ``seed``.
    """
    seed = _check_seed(seed, seed.device if isinstance(seed, Tensor) else torch.device("cpu"))
    if seed is None:
        raise ValueError("seed must be a (1,) int64 tensor, got None")
    dropout_p = check_dropout(dropout_p)
    for name, n in (("batch_size", batch_size), ("num_heads", num_heads), ("num_tokens", num_tokens),
                    ("steps", steps)):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:  # numpy ints too
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    from diffusionformer.ops.triton._launch import _dropout_scales

    return _dropout_scales(seed, int(batch_size), int(num_heads), int(num_tokens), int(steps), dropout_p)
