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
    head_runs,
)

DenseBackend = Literal["auto", "sdpa", "matrix"]
DENSE_BACKENDS: tuple[str, ...] = ("auto", "sdpa", "matrix")

#: ``"auto"`` materialises ``P`` for heads with ``K >= 2`` steps when ``N * M`` is at most the
#: entry for the largest listed ``K' <= K``, for non-causal graphs (see :func:`choose_dense_backend`).
MATERIALISE_MAX_ELEMENTS: dict[int, int] = {2: 128 * 128, 3: 256 * 256, 4: 384 * 384, 8: 512 * 512}
#: The same limits for causal graphs (the fused kernel skips the masked half of the work).
MATERIALISE_MAX_ELEMENTS_CAUSAL: dict[int, int] = {2: 64 * 64, 3: 128 * 128, 4: 256 * 256, 8: 384 * 384}
#: On CUDA devices ``"auto"`` materialises ``P`` for heads with ``K >= 4`` steps when ``N * M`` lies
#: in this range, causal or not (measured on an H200: below it the calls are launch-bound and the
#: fused kernel wins; above it was not measured, and ``P`` takes ``B H N M`` floats).
CUDA_MATERIALISE_ELEMENTS: tuple[int, int] = (1024 * 1024, 2048 * 2048)

__all__ = [
    "DENSE_BACKENDS",
    "MATERIALISE_MAX_ELEMENTS",
    "MATERIALISE_MAX_ELEMENTS_CAUSAL",
    "CUDA_MATERIALISE_ELEMENTS",
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
    try:  # broadcastable *to* the scores: it may not widen them, (2, 1) against N = M = 1 included
        ok = torch.broadcast_shapes(attn_mask.shape, (B, H, N, M)) == (B, H, N, M)
    except RuntimeError:
        ok = False
    if not ok:
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
    return _attention_matrix(q, k, attn_mask, is_causal, scale, _rows_with_keys(attn_mask)).to(q.dtype)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _attention_matrix(
    q: Tensor, k: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float, row_ok: Tensor | None
) -> Tensor:
    """:func:`attention_matrix` on validated inputs (masks normalised, ``row_ok`` precomputed), in float32 at least."""
    N, M = q.shape[2], k.shape[2]
    work = _work_dtype(q.dtype)
    # the scale is folded into q (N x C instead of N x M multiplications); the scores are a
    # fresh tensor, so masks are applied in place
    scores = torch.matmul(q.to(work) * scale, k.to(work).transpose(-2, -1))
    if is_causal:
        # top-left aligned: row i keeps keys j <= i, so every row keeps at least key 0
        scores = scores.masked_fill_(torch.ones(N, M, dtype=torch.bool, device=q.device).triu_(1), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill_(~attn_mask, float("-inf"))
        else:
            scores = scores.add_(attn_mask.to(work))
        if row_ok is not None:
            # A row without keys gets finite scores before the softmax (so gradients stay finite)
            # and is zeroed afterwards.
            scores = scores.masked_fill_(~row_ok, 0.0)
    P = torch.softmax(scores, dim=-1)
    if attn_mask is not None and row_ok is not None:
        P = P.masked_fill(~row_ok, 0.0)
    return P


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


def choose_dense_backend(num_queries: int, num_keys: int, max_degree: int, *, is_causal: bool = False,
                         device_type: str = "cpu") -> str:
    """The rule behind ``backend="auto"`` for heads that need ``K = max_degree`` powers of ``P``.

    * ``K <= 1`` (attention, Laplacian, any ``a I + b P``): ``"sdpa"``, one fused call;
    * ``K >= 2``: ``"matrix"`` (one softmax, then ``K`` batched matmuls with the materialised
      ``P``) when ``N * M`` is at most the limit in :data:`MATERIALISE_MAX_ELEMENTS` (or
      :data:`MATERIALISE_MAX_ELEMENTS_CAUSAL`) for the largest listed ``K' <= K``; otherwise
      ``"sdpa"`` (``K`` fused calls, each recomputing the softmax,
      but ``O(N)`` memory and no ``N x M`` temporaries, which are slow to allocate and fill).

    In words: one softmax plus ``K`` matmuls beat ``K`` fused calls up to ``N = M = 128`` for
    ``K = 2``, 256 for ``K = 3``, 384 for ``K = 4..7`` and 512 for ``K >= 8``; causal graphs
    halve these sequence lengths (the fused kernel skips the masked blocks, the matmuls do
    not). Beyond, ``"sdpa"``. The limits were measured with ``benchmarks/bench_kstep.py``
    (``H = 8``, ``C = 32``, ``B N = 2048`` tokens, CPU, forward and forward+backward gave the
    same crossovers; see ``docs/performance.md``).

    On CUDA (``device_type="cuda"``) the crossover runs the other way: the fused kernel wins
    for short sequences, where every call is launch-bound, and one softmax plus ``K`` matmuls
    win for long ones. There ``"matrix"`` is picked for ``K >= 4`` when ``N * M`` lies in
    :data:`CUDA_MATERIALISE_ELEMENTS` (``N = M`` from 1024 to 2048, causal or not; measured on
    an H200 with the same benchmark), else ``"sdpa"``.

    Args:
        num_queries: ``N``.
        num_keys: ``M``.
        max_degree: ``K``.
        is_causal: whether the graph is causal (the CPU limits depend on it; the CUDA rule does not).
        device_type: ``torch.device.type`` of the inputs; ``"cuda"`` uses the CUDA rule, any
            other type the CPU limits.

    Examples:
        >>> choose_dense_backend(1024, 1024, 1), choose_dense_backend(64, 64, 4), choose_dense_backend(1024, 1024, 4)
        ('sdpa', 'matrix', 'sdpa')
        >>> choose_dense_backend(128, 128, 2), choose_dense_backend(128, 128, 2, is_causal=True)
        ('matrix', 'sdpa')
        >>> choose_dense_backend(64, 64, 4, device_type="cuda"), choose_dense_backend(1024, 1024, 4, device_type="cuda")
        ('sdpa', 'matrix')
    """
    if max_degree <= 1:
        return "sdpa"
    if device_type == "cuda":
        low, high = CUDA_MATERIALISE_ELEMENTS
        return "matrix" if max_degree >= 4 and low <= num_queries * num_keys <= high else "sdpa"
    table = MATERIALISE_MAX_ELEMENTS_CAUSAL if is_causal else MATERIALISE_MAX_ELEMENTS
    limit = table[max(d for d in table if d <= max_degree)]
    return "matrix" if num_queries * num_keys <= limit else "sdpa"


def _runs(idx: list[int]) -> slice | list[int]:
    """``idx`` as a slice when it is a run of consecutive heads (views instead of copies)."""
    if idx and idx == list(range(idx[0], idx[-1] + 1)):
        return slice(idx[0], idx[-1] + 1)
    return idx


# Head subsets are taken with slices (views) and concatenations, never with index tensors: an
# index tensor built from a Python list would be a host-to-device copy in the forward pass.
def _select(t: Tensor, heads: slice | list[int]) -> Tensor:
    if isinstance(heads, slice):
        return t[:, heads]
    return torch.cat([t[:, a:b] for a, b in head_runs(heads)], dim=1)


def _select_mask(mask: Tensor | None, heads: slice | list[int]) -> Tensor | None:
    return mask if mask is None or mask.shape[1] == 1 else _select(mask, heads)


def _accumulate(out: Tensor, heads: slice | list[int], c: Tensor, x: Tensor) -> Tensor:
    """``out[:, heads] += c * x`` in place, one fused multiply-add (``out`` is a fresh tensor owned by the caller)."""
    if isinstance(heads, slice):
        out[:, heads].addcmul_(c, x)
        return out
    pos = 0
    for a, b in head_runs(heads):
        out[:, a:b].addcmul_(c[:, pos : pos + b - a], x[:, pos : pos + b - a])
        pos += b - a
    return out


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
    row_ok = _rows_with_keys(attn_mask)
    dtype = v.dtype
    # half-precision inputs: coefficients, the sum over powers and a materialised P in float32
    c = coeffs.to(_work_dtype(dtype))[None, :, :, None, None]  # (1, H, K+1, 1, 1)
    out = v * c[:, :, 0]
    if need_weights:
        P = _attention_matrix(q, k, attn_mask, is_causal, scale, row_ok)
        out = _propagate_matrix(out, P, v, c, list(range(H)), degrees, dropout_p)
        return out.to(dtype), P.to(dtype)
    high = [h for h, d in enumerate(degrees) if d >= 2]
    if backend == "auto":
        backend = choose_dense_backend(N, M, max(degrees, default=0), is_causal=is_causal, device_type=q.device.type)
        if backend == "matrix" and len(high) < H:
            # heads with K <= 1 keep the fused kernel; only the K-step heads materialise P
            low = _runs([h for h, d in enumerate(degrees) if d == 1])
            if low:
                y = _sdpa(_select(q, low), _select(k, low), _select(v, low), _select_mask(attn_mask, low), is_causal,
                          scale, dropout_p, _select_mask(row_ok, low))
                out = _accumulate(out, low, _select(c[:, :, 1], low), y)
            if high:
                sel = _runs(high)
                P = _attention_matrix(_select(q, sel), _select(k, sel), _select_mask(attn_mask, sel), is_causal, scale,
                                      _select_mask(row_ok, sel))
                out = _propagate_matrix(out, P, _select(v, sel), c, high, degrees, dropout_p)
            return out.to(dtype), None
    if backend == "matrix":
        P = _attention_matrix(q, k, attn_mask, is_causal, scale, row_ok)
        return _propagate_matrix(out, P, v, c, list(range(H)), degrees, dropout_p).to(dtype), None
    cur = v
    prev_heads: slice | list[int] = slice(0, H)
    for step in range(1, max(degrees, default=0) + 1):
        heads = active_heads(degrees, step)
        # restrict the running power to the heads still active (a subset of the previous ones)
        cur = _restrict(cur, prev_heads, heads, H)
        cur = _sdpa(_select(q, heads), _select(k, heads), cur, _select_mask(attn_mask, heads), is_causal, scale,
                    dropout_p, _select_mask(row_ok, heads))
        out = _accumulate(out, heads, _select(c[:, :, step], heads), cur)
        prev_heads = heads
    return out.to(dtype), None


def _propagate_matrix(
    out: Tensor, P: Tensor, v: Tensor, c: Tensor, heads_of_P: list[int], degrees: list[int], dropout_p: float
) -> Tensor:
    """Add ``sum_k c_k P^k v`` (``k >= 1``) for the heads ``heads_of_P`` whose ``P`` and ``v`` are given."""
    cur = v.to(P.dtype)
    prev = list(range(len(heads_of_P)))  # positions (within heads_of_P) of the heads in ``cur``
    for step in range(1, max((degrees[h] for h in heads_of_P), default=0) + 1):
        pos = [i for i, h in enumerate(heads_of_P) if degrees[h] >= step]
        if pos != prev:
            cur = _select(cur, _runs([prev.index(i) for i in pos]))
        Pa = _select(P, _runs(pos))
        if dropout_p > 0.0:
            Pa = F.dropout(Pa, p=dropout_p)
        cur = torch.matmul(Pa, cur)
        heads = _runs([heads_of_P[i] for i in pos])
        out = _accumulate(out, heads, _select(c[:, :, step], heads), cur)
        prev = pos
    return out


def _restrict(cur: Tensor, prev: slice | list[int], new: slice | list[int], H: int) -> Tensor:
    """Select from ``cur`` (laid out over heads ``prev``) the heads ``new``."""
    prev_idx = list(range(H))[prev] if isinstance(prev, slice) else prev
    new_idx = list(range(H))[new] if isinstance(new, slice) else new
    if prev_idx == new_idx:
        return cur
    return _select(cur, _runs([prev_idx.index(h) for h in new_idx]))


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
