r"""Dense back-end: diffusion with the row-stochastic attention matrix of a batch of sequences.

For every head ``h`` the kernels use

.. math::
    P_h = \operatorname{softmax}\big(q_h k_h^\top \cdot \text{scale} + \text{mask}\big),

and :func:`diffuse` returns :math:`\sum_{k=0}^{K} c_{h,k} P_h^k v_h`. Two ways to apply ``P``:

* ``"sdpa"``: :func:`torch.nn.functional.scaled_dot_product_attention` once per power (fused
  flash / memory-efficient kernels, ``O(N)`` extra memory);
* ``"matrix"``: materialise ``P`` once and multiply ``K`` times (cheaper for small ``N`` and
  several steps; needed when the attention weights are returned).

``backend="auto"`` applies the rule of :func:`choose_dense_backend`.

A query with no admissible key (a fully masked row) gets a zero row of ``P``, as in the
sparse back-end, so such a position outputs ``c_0 v`` and never NaN.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from diffusionformer.ops._checks import (
    active_heads,
    check_coefficients,
    check_degrees,
    check_scale,
    check_tensor,
)

DenseBackend = Literal["auto", "sdpa", "matrix"]
DENSE_BACKENDS: tuple[str, ...] = ("auto", "sdpa", "matrix")

#: ``"auto"`` materialises ``P`` for operators with ``K >= 2`` when ``N * M`` is at most this.
MATERIALISE_MAX_ELEMENTS: int = 256 * 256

__all__ = [
    "DENSE_BACKENDS",
    "MATERIALISE_MAX_ELEMENTS",
    "attention_matrix",
    "choose_dense_backend",
    "diffuse",
    "propagate_dense",
]


def _check_qk(q: Tensor, k: Tensor) -> None:
    check_tensor("q", q, 4, "(B, H, N, C)")
    check_tensor("k", k, 4, "(B, H, M, C)")
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share batch, heads and head_dim: q is {tuple(q.shape)} (B, H, N, C), "
            f"k is {tuple(k.shape)} (B, H, M, C)"
        )
    if k.dtype != q.dtype:
        raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")


def _check_v(q: Tensor, k: Tensor, v: Tensor) -> None:
    check_tensor("v", v, 4, "(B, H, M, C_v)")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v must have shape (B, H, M, C_v) matching k {tuple(k.shape)}, got {tuple(v.shape)}"
        )
    if q.shape[2] != k.shape[2]:
        raise ValueError(
            "diffusion applies P repeatedly, so P must be square: queries and keys must be the same "
            f"tokens (N == M), got N={q.shape[2]} and M={k.shape[2]}"
        )


def normalise_mask(
    attn_mask: Tensor | None,
    is_causal: bool,
    shape: tuple[int, int, int, int],
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[Tensor | None, bool]:
    """Validate ``attn_mask`` against ``shape = (B, H, N, M)`` and fold ``is_causal`` into it when both are given.

    Returns ``(mask, is_causal)`` with ``mask`` bool (True = attend) or float (added to scores,
    cast to ``dtype``).
    """
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if attn_mask is None:
        return None, is_causal
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask must be a tensor or None, got {type(attn_mask).__name__}")
    B, H, N, M = shape
    if attn_mask.dim() > 4 or attn_mask.dim() < 2:
        raise ValueError(
            f"attn_mask must be broadcastable to (B, H, N, M) = {(B, H, N, M)}, got shape {tuple(attn_mask.shape)}"
        )
    try:
        torch.broadcast_shapes(attn_mask.shape, (B, H, N, M))
    except RuntimeError:
        raise ValueError(
            f"attn_mask must be broadcastable to (B, H, N, M) = {(B, H, N, M)}, got shape {tuple(attn_mask.shape)}"
        ) from None
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(f"attn_mask must be bool (True = attend) or floating point, got {attn_mask.dtype}")
    if attn_mask.is_floating_point():
        attn_mask = attn_mask.to(dtype)
    attn_mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
    if is_causal:
        causal = torch.ones(N, M, dtype=torch.bool, device=device).tril()
        if attn_mask.dtype == torch.bool:
            attn_mask = attn_mask & causal
        else:
            attn_mask = attn_mask.masked_fill(~causal, float("-inf"))
        is_causal = False
    return attn_mask, is_causal


def _normalise_mask(
    attn_mask: Tensor | None, is_causal: bool, q: Tensor, k: Tensor
) -> tuple[Tensor | None, bool]:
    B, H, N, _ = q.shape
    return normalise_mask(attn_mask, is_causal, (B, H, N, k.shape[2]), q.device, q.dtype)


def _rows_with_keys(attn_mask: Tensor | None) -> Tensor | None:
    """``(..., N, 1)`` bool: whether each query row has at least one admissible key."""
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:
        return attn_mask.any(dim=-1, keepdim=True)
    return (attn_mask > float("-inf")).any(dim=-1, keepdim=True)


def attention_matrix(
    q: Tensor,
    k: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    r"""The row-stochastic attention matrix :math:`P = \operatorname{softmax}(q k^\top \cdot s + \text{mask})`.

    Rows with no admissible key are all-zero (not NaN). Scores and the softmax run in
    float32 for half-precision inputs; ``P`` is returned in the input dtype.

    Args:
        q: queries.
        k: keys.
        attn_mask: bool (True = attend) or additive float mask, broadcastable to ``(B, H, N, M)``.
        is_causal: mask out keys ``j > i`` (top-left aligned, as in SDPA).
        scale: score scale, default ``1 / sqrt(C)``.

    Shapes:
        ``q``: ``(B, H, N, C)``, ``k``: ``(B, H, M, C)`` -> ``(B, H, N, M)``.

    Examples:
        >>> q = torch.zeros(1, 1, 2, 4); k = torch.zeros(1, 1, 2, 4)
        >>> attention_matrix(q, k, is_causal=True)
        tensor([[[[1.0000, 0.0000],
                  [0.5000, 0.5000]]]])
    """
    _check_qk(q, k)
    scale = check_scale(scale, q.shape[-1])
    attn_mask, is_causal = _normalise_mask(attn_mask, is_causal, q, k)
    N, M = q.shape[2], k.shape[2]
    dtype = q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    scores = torch.matmul(q.to(work), k.to(work).transpose(-2, -1)) * scale
    if is_causal:
        causal = torch.ones(N, M, dtype=torch.bool, device=q.device).tril()
        attn_mask = causal
    row_ok = _rows_with_keys(attn_mask)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(work)
        # A row without keys gets finite scores before the softmax (so gradients stay finite)
        # and is zeroed afterwards.
        scores = scores.masked_fill(~row_ok, 0.0)
    P = torch.softmax(scores, dim=-1)
    if row_ok is not None:
        P = P.masked_fill(~row_ok, 0.0)
    return P.to(dtype)


def propagate_dense(
    q: Tensor,
    k: Tensor,
    x: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    r"""One diffusion step :math:`P x` through the fused SDPA kernel.

    Args:
        q: queries.
        k: keys.
        x: the signal to propagate (values, or an earlier ``P^k v``).
        attn_mask: bool (True = attend) or additive float mask broadcastable to ``(B, H, N, M)``.
        is_causal: causal mask (top-left aligned).
        scale: score scale, default ``1 / sqrt(C)``.
        dropout_p: dropout on ``P`` (only use while training).

    Shapes:
        ``q``: ``(B, H, N, C)``, ``k``: ``(B, H, M, C)``, ``x``: ``(B, H, M, C_x)`` -> ``(B, H, N, C_x)``.

    Examples:
        >>> q = torch.zeros(1, 1, 2, 4); k = torch.zeros(1, 1, 2, 4)
        >>> x = torch.tensor([[[[1.], [3.]]]])
        >>> propagate_dense(q, k, x).flatten().tolist()
        [2.0, 2.0]
    """
    _check_qk(q, k)
    check_tensor("x", x, 4, "(B, H, M, C_x)")
    scale = check_scale(scale, q.shape[-1])
    attn_mask, is_causal = _normalise_mask(attn_mask, is_causal, q, k)
    return _sdpa(q, k, x, attn_mask, is_causal, scale, dropout_p, _rows_with_keys(attn_mask))


def _sdpa(
    q: Tensor,
    k: Tensor,
    x: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float,
    dropout_p: float,
    row_ok: Tensor | None,
) -> Tensor:
    y = F.scaled_dot_product_attention(
        q, k, x, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale
    )
    if row_ok is not None:
        # Kernels differ on rows with no admissible key (0 on CPU, NaN on some GPU kernels):
        # pin them to the documented zero row of P.
        y = y.masked_fill(~row_ok, 0.0)
    return y


def choose_dense_backend(num_queries: int, num_keys: int, max_degree: int) -> str:
    """The rule behind ``backend="auto"``.

    * ``K <= 1`` (attention, Laplacian, any ``a I + b P``): ``"sdpa"``, one fused call;
    * ``K >= 2`` and ``N * M <= MATERIALISE_MAX_ELEMENTS``: ``"matrix"`` (one softmax, ``K``
      small matmuls beat ``K`` fused calls that each recompute the softmax);
    * otherwise ``"sdpa"`` (memory ``O(N)`` per call instead of ``O(N^2)``).

    The threshold was set from ``benchmarks/bench_dense.py`` (see the performance docs).

    Examples:
        >>> choose_dense_backend(1024, 1024, 1), choose_dense_backend(64, 64, 4), choose_dense_backend(1024, 1024, 4)
        ('sdpa', 'matrix', 'sdpa')
    """
    if max_degree <= 1:
        return "sdpa"
    return "matrix" if num_queries * num_keys <= MATERIALISE_MAX_ELEMENTS else "sdpa"


def _select(t: Tensor, heads: slice | list[int]) -> Tensor:
    if isinstance(heads, slice):
        return t[:, heads]
    return t.index_select(1, torch.tensor(heads, device=t.device))


def _accumulate(out: Tensor, heads: slice | list[int], value: Tensor) -> Tensor:
    H = out.shape[1]
    if isinstance(heads, slice):
        if heads.start == 0 and heads.stop == H:
            return out + value
        out[:, heads] += value
        return out
    return out.index_add(1, torch.tensor(heads, device=out.device), value)


def diffuse_with_weights(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    coeffs: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    backend: str = "auto",
    degrees: Sequence[int] | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """:func:`diffuse` that can also return ``P`` (``need_weights=True`` forces ``"matrix"``)."""
    _check_qk(q, k)
    _check_v(q, k, v)
    B, H, N, C = q.shape
    M = k.shape[2]
    scale = check_scale(scale, C)
    coeffs = check_coefficients(coeffs, H, v)
    K = coeffs.shape[1] - 1
    degrees = check_degrees(degrees, H, K)
    if backend not in DENSE_BACKENDS:
        raise ValueError(f"backend must be one of {DENSE_BACKENDS}, got {backend!r}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must lie in [0, 1), got {dropout_p}")
    if v.dtype != q.dtype:
        raise TypeError(f"v must have the dtype of q ({q.dtype}), got {v.dtype}")
    attn_mask, is_causal = _normalise_mask(attn_mask, is_causal, q, k)
    max_degree = max(degrees) if degrees else 0
    if need_weights:
        backend = "matrix"
    elif backend == "auto":
        backend = choose_dense_backend(N, M, max_degree)

    c = coeffs.to(v.dtype)[None, :, :, None, None]  # (1, H, K+1, 1, 1)
    out = v * c[:, :, 0]
    P: Tensor | None = None
    if backend == "matrix" and (max_degree >= 1 or need_weights):
        P = attention_matrix(q, k, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    row_ok = _rows_with_keys(attn_mask)

    cur = v
    prev_heads: slice | list[int] = slice(0, H)
    for step in range(1, max_degree + 1):
        heads = active_heads(degrees, step)
        # restrict the running power to the heads still active (a subset of the previous ones)
        cur = _restrict(cur, prev_heads, heads, H)
        if backend == "matrix":
            Pa = _select(P, heads)
            if dropout_p > 0.0:
                Pa = F.dropout(Pa, p=dropout_p)
            cur = torch.matmul(Pa, cur)
        else:
            cur = _sdpa(
                _select(q, heads),
                _select(k, heads),
                cur,
                attn_mask if attn_mask is None or attn_mask.shape[1] == 1 else _select(attn_mask, heads),
                is_causal,
                scale,
                dropout_p,
                row_ok if row_ok is None or row_ok.shape[1] == 1 else _select(row_ok, heads),
            )
        out = _accumulate(out, heads, _select(c[:, :, step], heads) * cur)
        prev_heads = heads
    return out, P


def _restrict(cur: Tensor, prev: slice | list[int], new: slice | list[int], H: int) -> Tensor:
    """Select from ``cur`` (laid out over heads ``prev``) the heads ``new``."""
    prev_idx = list(range(H))[prev] if isinstance(prev, slice) else prev
    new_idx = list(range(H))[new] if isinstance(new, slice) else new
    if prev_idx == new_idx:
        return cur
    pos = [prev_idx.index(h) for h in new_idx]
    if pos == list(range(pos[0], pos[-1] + 1)):
        return cur[:, pos[0] : pos[-1] + 1]
    return cur.index_select(1, torch.tensor(pos, device=cur.device))


def diffuse(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    coeffs: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    backend: str = "auto",
    degrees: Sequence[int] | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    r"""Polynomial diffusion on dense token graphs: :math:`\sum_{k=0}^{K} c_{h,k} P_h^k v_h`.

    With ``P_h = softmax(q_h k_h^T * scale + mask)`` row-stochastic, ``coeffs = (0, 1)`` is
    standard attention, ``(1, -1)`` the Laplacian head ``(I - P) v`` of Zhang & Papyan
    (arXiv 2602.09297), and truncated series give heat kernels, personalised PageRank and
    learned polynomials (see :mod:`diffusionformer.operators`). Operators with ``K <= 1``
    cost one fused attention call for all heads.

    Args:
        q: queries.
        k: keys (the same tokens as the queries: ``P`` is square).
        v: values.
        coeffs: weights on ``P^0 .. P^K``, one row per head or one row shared by all heads;
            differentiable.
        attn_mask: bool (True = attend) or additive float mask broadcastable to ``(B, H, N, N)``,
            as in :func:`~torch.nn.functional.scaled_dot_product_attention`.
        is_causal: position ``i`` attends to ``j <= i`` only (may be combined with ``attn_mask``).
        scale: score scale, default ``1 / sqrt(C)``.
        backend: ``"auto"`` (rule of :func:`choose_dense_backend`), ``"sdpa"`` (re-propagate
            with the fused kernel) or ``"matrix"`` (materialise ``P``).
        degrees: optional highest power used by each head (``<= K``); heads are propagated
            only as far as they need (a layer with ``G`` of ``H`` heads needing ``K`` steps
            costs ``1 + (K - 1) G / H`` fused calls).
        dropout_p: dropout on ``P`` at every step (training only).

    Shapes:
        ``q``, ``k``: ``(B, H, N, C)``; ``v``: ``(B, H, N, C_v)``; ``coeffs``: ``(H, K+1)`` or
        ``(K+1,)`` -> ``(B, H, N, C_v)``.

    Examples:
        >>> q = torch.zeros(1, 1, 2, 4); k = torch.zeros(1, 1, 2, 4)
        >>> v = torch.tensor([[[[1.], [3.]]]])
        >>> diffuse(q, k, v, torch.tensor([1., -1.])).flatten().tolist()  # (I - P) v
        [-1.0, 1.0]
    """
    out, _ = diffuse_with_weights(
        q,
        k,
        v,
        coeffs,
        attn_mask=attn_mask,
        is_causal=is_causal,
        scale=scale,
        backend=backend,
        degrees=degrees,
        dropout_p=dropout_p,
    )
    return out
