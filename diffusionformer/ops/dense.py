r"""Dense back-end: diffusion with the row-stochastic attention matrix of a batch of sequences.

For every head ``h`` the kernels use

.. math::
    P_h = \operatorname{softmax}\big(q_h k_h^\top \cdot \text{scale} + \text{mask}\big),

and :func:`diffuse` returns :math:`\sum_{k=0}^{K} c_{h,k} P_h^k v_h`, computed by the engine
(:func:`~diffusionformer.ops.engine.polynomial`) on one of two back-ends:

* :class:`SdpaBackend` (``"sdpa"``): :func:`torch.nn.functional.scaled_dot_product_attention`
  once per power (fused flash / memory-efficient kernels, ``O(N)`` extra memory);
* :class:`MatrixBackend` (``"matrix"``): materialise ``P`` once and multiply ``K`` times
  (cheaper for small ``N`` and several steps; needed when the attention weights are returned);
* :class:`~diffusionformer.ops.triton.backend.TritonBackend` (``"triton"``): the Triton kernels,
  all affine heads of a call in one launch and all K-step heads in one launch per power of ``P``
  (optional: needs triton; see :mod:`diffusionformer.ops.triton.backend` for what it supports).

``backend="auto"`` takes the Triton back-end for CUDA tensors when triton imports and the call
is supported, and otherwise applies the rule of :func:`choose_dense_backend`. Static coefficients of
degree ``<= 1`` (Python floats) take one fused call and the affine combination
(:func:`~diffusionformer.ops.engine.affine`).

A query with no admissible key (a fully masked row) gets a zero row of ``P``, as in the
sparse back-end, so such a position outputs ``c_0 v`` and never NaN.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from diffusionformer.config import _check_flag, _value_type
from diffusionformer.ops._checks import DENSE_BACKENDS, SPARSE_BACKENDS, _backend_hint, _check_is_causal, _in_vmap, check_attn_mask, check_dropout, check_layout, check_scale, check_tensor
from diffusionformer.ops.recompute import _in_place_allowed
from diffusionformer.ops.triton.backend import TritonBackend, split_mask, triton_unsupported
from diffusionformer.ops.engine import (
    Backend,
    Heads,
    _pure_cache,
    active_heads,
    affine,
    affine_coefficients,
    all_heads,
    merge_heads,
    polynomial,
    positions,
    select,
    split_heads,
    static_tensor,
    work_dtype,
)

DenseBackend = Literal["auto", "sdpa", "matrix", "triton"]

#: ``"auto"`` materialises ``P`` for heads with ``K >= 2`` steps when ``N * M`` is at most the
#: entry for the largest listed ``K' <= K``, for non-causal graphs (see :func:`choose_dense_backend`).
MATERIALISE_MAX_ELEMENTS: dict[int, int] = {2: 128 * 128, 3: 256 * 256, 4: 384 * 384, 8: 512 * 512}
#: The same limits for causal graphs (the fused kernel skips the masked half of the work).
MATERIALISE_MAX_ELEMENTS_CAUSAL: dict[int, int] = {2: 64 * 64, 3: 128 * 128, 4: 256 * 256, 8: 384 * 384}
#: ``"auto"`` takes the Triton back-end only for head sizes up to this (the kernels' shared-memory
#: use was checked, by compiling for sm_90, up to 128; ``backend="triton"`` takes any size).
TRITON_AUTO_MAX_HEAD_DIM: int = 128
#: Whether ``"auto"`` takes the Triton back-end on CUDA at all. ``False`` until the kernels have been
#: measured against the stock kernels on a GPU (issue 15; they are verified only under
#: ``TRITON_INTERPRET=1`` and compiled for sm_90 so far): ``backend="triton"`` opts in per call or layer.
TRITON_IN_AUTO: bool = False
#: On CUDA devices ``"auto"`` materialises ``P`` for heads with ``K >= 4`` steps when ``N * M`` lies
#: in this range, causal or not (measured on an H200: below it the calls are launch-bound and the
#: fused kernel wins; above it was not measured, and ``P`` takes ``B H N M`` floats).
CUDA_MATERIALISE_ELEMENTS: tuple[int, int] = (1024 * 1024, 2048 * 2048)

__all__ = [
    "DENSE_BACKENDS",
    "MATERIALISE_MAX_ELEMENTS",
    "MATERIALISE_MAX_ELEMENTS_CAUSAL",
    "CUDA_MATERIALISE_ELEMENTS",
    "TRITON_AUTO_MAX_HEAD_DIM",
    "TRITON_IN_AUTO",
    "MatrixBackend",
    "SdpaBackend",
    "attention_matrix",
    "choose_dense_backend",
    "diffuse",
    "diffuse_with_weights",
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
    if k.device != q.device:
        raise ValueError(f"q and k must be on one device, got {q.device} and {k.device}")


def _check_v(q: Tensor, k: Tensor, v: Tensor) -> None:
    check_tensor("v", v, 4, "(B, H, M, C_v)")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v must have shape (B, H, M, C_v) matching k {tuple(k.shape)}, got {tuple(v.shape)}"
        )
    if v.device != q.device:
        raise ValueError(f"v must be on the device of q ({q.device}), got {v.device}")
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
    _check_is_causal(is_causal)
    if attn_mask is None:
        return None, is_causal
    attn_mask = check_attn_mask(attn_mask, shape, dtype)
    if attn_mask.device != device:
        raise ValueError(f"attn_mask must be on the device of q ({device}), got {attn_mask.device}")
    B, H, N, M = shape
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
    attn_mask, is_causal = normalise_mask(attn_mask, is_causal, (B, H, N, k.shape[2]), q.device, q.dtype)
    low = _autocast_dtype(q) if attn_mask is not None and attn_mask.is_floating_point() else None
    if low is not None and attn_mask is not None:
        # autocast computes the scores (and SDPA's mask) in ``low``: finite biases beyond its range (-1e9 under
        # float16) are clamped to it, as for inputs in ``low`` (else -inf: a row of them became a masked row)
        info = torch.finfo(low)
        if info.max < torch.finfo(attn_mask.dtype).max:
            attn_mask = torch.where(attn_mask.isfinite(), attn_mask.clamp(info.min, info.max), attn_mask)
    return attn_mask, is_causal


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


def _attention_matrix(
    q: Tensor, k: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float, row_ok: Tensor | None
) -> Tensor:
    """:func:`attention_matrix` on validated inputs (masks normalised, ``row_ok`` precomputed), in float32 at least."""
    N, M = q.shape[2], k.shape[2]
    work = work_dtype(q.dtype)
    # the scale is folded into q (N x C instead of N x M multiplications); the scores are a
    # fresh tensor, so masks are applied in place, but out of place inside an eager torch.func transform
    # (see _in_place_allowed: linearize folds the scores of unbatched inputs into a constant)
    # .to(work): autocast returns the product in its dtype; the mask is added in float32 as for half inputs
    scores = torch.matmul(q.to(work) * scale, k.to(work).transpose(-2, -1)).to(work)
    fresh = _in_place_allowed()
    if is_causal:
        # top-left aligned: row i keeps keys j <= i, so every row keeps at least key 0
        causal = torch.ones(N, M, dtype=torch.bool, device=q.device).triu_(1)
        scores = scores.masked_fill_(causal, float("-inf")) if fresh else scores.masked_fill(causal, float("-inf"))
    if attn_mask is not None:
        # (a mask batched by torch.vmap beside unbatched q and k, inside the transform: vmap refuses it in place)
        if attn_mask.dtype == torch.bool:
            scores = (scores.masked_fill_ if fresh else scores.masked_fill)(~attn_mask, float("-inf"))
        else:
            scores = scores.add_(attn_mask.to(work)) if fresh else scores + attn_mask.to(work)
        if row_ok is not None:
            # A row without keys gets finite scores before the softmax (so gradients stay finite)
            # and is zeroed afterwards.
            scores = scores.masked_fill_(~row_ok, 0.0) if fresh else scores.masked_fill(~row_ok, 0.0)
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
    q, k, x = _autocast_mixed(q, k, x)
    _check_qk(q, k)
    check_tensor("x", x, 4, "(B, H, M, C_x)")
    if x.shape[:3] != k.shape[:3]:
        raise ValueError(f"x must have shape (B, H, M, C_x) matching k {tuple(k.shape)}, got {tuple(x.shape)}")
    if x.dtype != q.dtype:
        raise TypeError(f"x must have the dtype of q and k, got {x.dtype} and {q.dtype}")
    if x.device != q.device:
        raise ValueError(f"x must be on the device of q ({q.device}), got {x.device}")
    scale = check_scale(scale, q.shape[-1])
    dropout_p = check_dropout(dropout_p)
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
    return _zero_rows(_fused(q, k, x, attn_mask, is_causal, scale, dropout_p, row_ok), row_ok)


def _fused(q: Tensor, k: Tensor, x: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float,
           dropout_p: float, row_ok: Tensor | None) -> Tensor:
    """``P x`` by torch's fused kernel, or, for dropout inside an eager :func:`torch.vmap`, by ``P`` formed
    explicitly with the dropout out of place: the kernel drops in place, which ``vmap(..., randomness="different")``
    refuses on unbatched inputs ("Cannot ask for different inplace randomness on an unbatched tensor": Monte Carlo
    samples of one input); the rows the kernel leaves to :func:`_zero_rows` come out zero here too."""
    if dropout_p > 0.0 and not torch.compiler.is_compiling() and _in_vmap():
        P = F.dropout(_attention_matrix(q, k, attn_mask, is_causal, scale, row_ok), p=dropout_p)
        return torch.matmul(P, x.to(P.dtype)).to(_autocast_dtype(x) or x.dtype)
    return F.scaled_dot_product_attention(q, k, x, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p,
                                          scale=scale)


def _zero_rows(y: Tensor, row_ok: Tensor | None) -> Tensor:
    """``y`` with the rows of queries without an admissible key set to 0.

    Kernels differ on such rows (0 on CPU, NaN on some GPU kernels): this pins them to the
    documented zero row of ``P``.
    """
    return y if row_ok is None else y.masked_fill(~row_ok, 0.0)


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
    ``K = 2``, 256 for ``K = 3``, 384 for ``K = 4..7`` and 512 for ``K >= 8``; on causal graphs
    up to 64, 128, 256 and 384 (the fused kernel skips the masked blocks, the matmuls do
    not). Beyond, ``"sdpa"``. The limits were measured with ``benchmarks/bench_kstep.py``
    (``H = 8``, ``C = 32``, ``B N = 2048`` tokens, CPU, forward and forward+backward gave the
    same crossovers; see ``docs/performance.md``).

    Triton comes first (when :data:`TRITON_IN_AUTO` is set): for CUDA tensors, when triton
    imports and the call is supported (self-attention, no ``need_weights``, no float
    ``attn_mask`` that requires grad, float32/float16/bfloat16, ``v`` with the head size of ``q``), ``"auto"``
    runs :class:`~diffusionformer.ops.triton.backend.TritonBackend` (one fused launch for all
    affine heads, one launch per power of ``P`` for all K-step heads) before this rule is
    consulted, unless every head is plain attention with static coefficients (then the stock
    fused SDPA kernel, flash or cuDNN, is exactly the operation and stays) or the head size
    exceeds :data:`TRITON_AUTO_MAX_HEAD_DIM`; this function is the rule for the remaining calls.

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
    for name, value in (("num_queries", num_queries), ("num_keys", num_keys), ("max_degree", max_degree)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be a non-negative int, got {_value_type(value)} ({value!r})")
        if value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value}")
    _check_is_causal(is_causal)
    if not isinstance(device_type, str):
        raise TypeError(f"device_type must be a device type string such as 'cpu' or 'cuda' (torch.device.type), "
                        f"got {_value_type(device_type)} ({device_type!r})")
    if ":" in device_type:  # str(q.device) is "cuda:0", which is not "cuda": the CPU rule would apply silently
        raise ValueError(f"device_type must be a device type such as 'cpu' or 'cuda' (torch.device.type), not a "
                         f"device with an index, got {device_type!r} (use {device_type.partition(':')[0]!r})")
    return _choose_dense_backend(int(num_queries), int(num_keys), int(max_degree), is_causal, device_type)


def _choose_dense_backend(num_queries: int, num_keys: int, max_degree: int, is_causal: bool, device_type: str) -> str:
    """:func:`choose_dense_backend` on arguments the engine built itself (unchecked)."""
    if max_degree <= 1:
        return "sdpa"
    if device_type == "cuda":
        low, high = CUDA_MATERIALISE_ELEMENTS
        return "matrix" if max_degree >= 4 and low <= num_queries * num_keys <= high else "sdpa"
    table = MATERIALISE_MAX_ELEMENTS_CAUSAL if is_causal else MATERIALISE_MAX_ELEMENTS
    limit = table[max(d for d in table if d <= max_degree)]
    return "matrix" if num_queries * num_keys <= limit else "sdpa"


def _select_mask(mask: Tensor | None, heads: Heads) -> Tensor | None:
    """A mask's heads ``heads`` (masks shared by all heads, ``(B, 1, N, M)``, are returned as is)."""
    return mask if mask is None or mask.shape[1] == 1 else select(mask, heads, 1)


def _attention_matrix_heads(
    q: Tensor, k: Tensor, heads: Heads, attn_mask: Tensor | None, is_causal: bool, scale: float,
    working_dtype: bool = False,
) -> Tensor:
    r""":math:`P_h` for the heads ``heads`` only, in the dtype of ``q`` (with ``working_dtype``, in the working dtype:
    float32 for half inputs): one softmax over their queries and keys.

    What :func:`_diffuse_checked` with ``need_weights`` materialises for every head, restricted to
    ``heads`` (the layer's non-polynomial heads, which apply a matrix function to ``P``): the same
    mask (validated against all ``H`` heads, causal folded in as there), scale and zero rows for
    queries without an admissible key. ``q``, ``k`` and ``scale`` are the caller's, already checked.

    Shapes:
        ``q``: ``(B, H, N, C)``, ``k``: ``(B, H, M, C)``, ``heads``: ``H'`` increasing indices
        -> ``(B, H', N, M)``.
    """
    attn_mask, is_causal = _normalise_mask(attn_mask, is_causal, q, k)
    row_ok = _rows_with_keys(attn_mask)
    P = _attention_matrix(select(q, heads, 1), select(k, heads, 1), _select_mask(attn_mask, heads), is_causal,
                          scale, _select_mask(row_ok, heads))
    return P if working_dtype else P.to(q.dtype)


def _additive_cpu_mask(attn_mask: Tensor | None, q: Tensor) -> Tensor | None:
    """A bool mask of CPU tensors as the additive mask the fused kernel makes of it (0 where allowed, ``-inf``
    elsewhere, in the dtype the kernel computes in), made once for all the calls of a back-end; any other mask as
    it is.

    The kernel converts a bool mask on every call and keeps each call's float copy for its backward pass: the
    ``K`` calls of a ``K``-step head kept ``K`` float copies of the mask (4 bytes per pair each, 1 GiB per copy
    for ``N = 16384``) beside the bool mask; converted here they share one. The same conversion as the kernel's,
    so the same bits. (CUDA kernels convert a bool mask each in their own way, so it is left to them there.)
    """
    if attn_mask is None or attn_mask.dtype != torch.bool or q.device.type != "cpu":
        return attn_mask
    dtype = _autocast_dtype(q) or q.dtype
    return torch.where(attn_mask, torch.zeros((), dtype=dtype), torch.full((), float("-inf"), dtype=dtype))


class SdpaBackend(Backend):
    """``P x`` through :func:`torch.nn.functional.scaled_dot_product_attention`: ``P`` is recomputed every step.

    Shapes:
        ``q``: ``(B, H, N, C)``, ``k``: ``(B, H, M, C)``; :meth:`propagate`: ``x`` ``(B, H', M, C_x)`` -> ``(B, H', N, C_x)``.
    """

    name = "sdpa"
    head_axis = 1
    recomputes_scores = True

    def __init__(self, q: Tensor, k: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float,
                 dropout_p: float, row_ok: Tensor | None) -> None:
        self.q, self.k, self.attn_mask, self.is_causal = q, k, _additive_cpu_mask(attn_mask, q), is_causal
        self.scale, self.dropout_p, self.row_ok = scale, dropout_p, row_ok
        #: a list to record each call's kernel output and row mask in (for :class:`_SdpaReplay`), or ``None``
        self.kernel_outputs: list[tuple[Tensor, Tensor | None]] | None = None
        self._selected: dict[Heads, tuple[Tensor, Tensor, Tensor | None, Tensor | None]] = {}

    def _heads(self, heads: Heads) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """``q``, ``k``, the mask and the row mask of the heads ``heads``, selected once per head set: the steps of
        a loop that propagate the same proper subset of heads share one selection, so the backward pass sums
        their gradients before the selection's single ``slice_backward`` instead of running one per step."""
        got = self._selected.get(heads)
        if got is None:
            got = self._selected[heads] = (select(self.q, heads, 1), select(self.k, heads, 1),
                                           _select_mask(self.attn_mask, heads), _select_mask(self.row_ok, heads))
        return got

    def propagate(self, x: Tensor, heads: Heads) -> Tensor:
        q, k, attn_mask, row_ok = self._heads(heads)
        y = _fused(q, k, x, attn_mask, self.is_causal, self.scale, self.dropout_p, row_ok)
        if self.kernel_outputs is not None:
            self.kernel_outputs.append((y, row_ok))
        return _zero_rows(y, row_ok)


class _SdpaReplay(Backend):
    """The results of an :class:`SdpaBackend` that recorded them (its ``kernel_outputs``), handed out again in
    order without computing attention: the kernel outputs are what the fused kernel keeps for its backward pass
    anyway, so a combination run again on this back-end repeats the forward's operations on the forward's
    tensors at no memory cost (see :mod:`diffusionformer.ops.recompute`)."""

    name = "sdpa"
    head_axis = 1

    def __init__(self, kernel_outputs: list[tuple[Tensor, Tensor | None]]) -> None:
        self.kernel_outputs, self._next = kernel_outputs, 0

    def propagate(self, x: Tensor, heads: Heads) -> Tensor:
        y, row_ok = self.kernel_outputs[self._next]
        self._next += 1
        if y.shape != x.shape:  # P is square: each step returns the shape it is given
            raise RuntimeError(f"_SdpaReplay: step {self._next} recorded {tuple(y.shape)} but is asked for "
                               f"{tuple(x.shape)}; the replay must repeat the recorded calls in order")
        return _zero_rows(y, row_ok)


class MatrixBackend(Backend):
    """``P x`` with a materialised ``P`` (one softmax, then one batched matmul per step).

    Args:
        P: the attention matrix of the heads ``heads_of_P``, ``(B, H_P, N, M)``, in the working dtype.
        heads_of_P: the (global) heads whose ``P`` is given.
        dropout_p: dropout on ``P`` at every step.
    """

    name = "matrix"
    head_axis = 1

    def __init__(self, P: Tensor, heads_of_P: Heads, dropout_p: float = 0.0) -> None:
        self.P, self.heads_of_P, self.dropout_p = P, heads_of_P, dropout_p

    def propagate(self, x: Tensor, heads: Heads) -> Tensor:
        Pa = select(self.P, positions(heads, self.heads_of_P), 1)
        if self.dropout_p > 0.0:
            Pa = F.dropout(Pa, p=self.dropout_p)
        return torch.matmul(Pa, x.to(Pa.dtype))

    def weights(self) -> Tensor:
        return self.P


def diffuse_with_weights(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    coeffs: Tensor | Sequence[float] | Sequence[Sequence[float]],
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    backend: str = "auto",
    degrees: Sequence[int] | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """:func:`diffuse` that can also return ``P``: ``(out, P)``, with ``P`` ``None`` unless ``need_weights``.

    ``need_weights=True`` materialises ``P`` (the ``"matrix"`` back-end) and returns it in
    the input dtype, ``(B, H, N, N)``. The arguments are those of :func:`diffuse`.

    Examples:
        >>> q = torch.zeros(1, 1, 2, 4); k = torch.zeros(1, 1, 2, 4); v = torch.tensor([[[[1.], [3.]]]])
        >>> out, P = diffuse_with_weights(q, k, v, [0.0, 1.0], is_causal=True, need_weights=True)
        >>> out.flatten().tolist(), P.flatten().tolist()
        ([1.0, 2.0], [1.0, 0.0, 0.5, 0.5])
    """
    q, k, v = _autocast_mixed(q, k, v)
    _check_qk(q, k)
    _check_v(q, k, v)
    H, C = q.shape[1], q.shape[3]
    scale = check_scale(scale, C)
    coeffs, degrees = check_layout(coeffs, degrees, H, v)
    if backend not in DENSE_BACKENDS:
        hint = _backend_hint(backend, DENSE_BACKENDS, SPARSE_BACKENDS, "sparse graphs: pass edge_index")
        raise ValueError(f"backend must be one of {DENSE_BACKENDS}, got {backend!r}{hint}")
    dropout_p = check_dropout(dropout_p)
    if v.dtype != q.dtype:
        raise TypeError(f"v must have the dtype of q ({q.dtype}), got {v.dtype}")
    _check_flag(need_weights, "need_weights")
    out, P = _diffuse_checked(q, k, v, coeffs, attn_mask, is_causal, scale, backend, degrees, dropout_p, need_weights)
    return out, (None if P is None else P.to(v.dtype))  # P in the input dtype, as attention_matrix returns it


def _diffuse_checked(
    q: Tensor, k: Tensor, v: Tensor, coeffs: Tensor | tuple[tuple[float, ...], ...], attn_mask: Tensor | None,
    is_causal: bool, scale: float, backend: str, degrees: tuple[int, ...], dropout_p: float, need_weights: bool,
    affine_heads: AffineHeadsPlan | None = None, rebuild: list[Callable[[], Tensor]] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`diffuse_with_weights` past its checks of ``q``, ``k``, ``v``, ``coeffs``, ``degrees``, ``scale``,
    ``backend`` and ``dropout_p`` (for callers that built them: :class:`~diffusionformer.nn.DiffusionAttention`);
    ``attn_mask`` and ``is_causal`` are validated here.

    ``affine_heads`` (with a coefficient tensor): ``(heads, c0, c1)``, heads whose rows of ``coeffs``
    are the fixed ``c0 I + c1 P`` (validated by the caller), which then take the affine path in the
    input dtype while the other heads run the loop (see :func:`_split_paths`).

    ``rebuild`` (a list, for the layers): the PyTorch paths append a function that forms ``out`` again from
    the propagated signals they keep (see :mod:`diffusionformer.ops.recompute`); nothing is appended
    where that does not apply (Triton, ``need_weights``, the affine path of static coefficients).

    ``P`` (with ``need_weights``) is returned in the working dtype, float32 for half inputs (not yet cast to the
    input dtype as :func:`diffuse_with_weights` returns it)."""
    if backend == "triton" or (backend == "auto" and TRITON_IN_AUTO and q.device.type == "cuda"):
        out = _try_triton(q, k, v, coeffs, attn_mask, is_causal, scale, backend,
                          degrees, dropout_p, need_weights)
        if out is not None:
            return out, None
    attn_mask, is_causal = _normalise_mask(attn_mask, is_causal, q, k)
    return _diffuse_dense(q, k, v, coeffs, attn_mask, is_causal, scale, backend,
                          degrees, dropout_p, need_weights, affine_heads, rebuild)


def _plain_attention(coeffs: Tensor | tuple[tuple[float, ...], ...], degrees: tuple[int, ...]) -> bool:
    """Static coefficients that make every head plain attention ``P v`` (``c_0, c_1 = 0, 1``, degree 1)."""
    if not isinstance(coeffs, tuple) or len(coeffs[0]) < 2 or any(d != 1 for d in degrees):
        return False
    c0, c1 = affine_coefficients(coeffs, degrees)
    return not any(c0) and all(c == 1.0 for c in c1)


def _try_triton(
    q: Tensor, k: Tensor, v: Tensor, coeffs: Tensor | tuple[tuple[float, ...], ...], attn_mask: Tensor | None,
    is_causal: bool, scale: float, backend: str, degrees: tuple[int, ...], dropout_p: float, need_weights: bool,
) -> Tensor | None:
    """The call on :class:`TritonBackend` when it supports it; ``None`` to fall back (``"auto"``), else ValueError."""
    _check_is_causal(is_causal)  # the mask below is normalised without it: a non-bool flag is an error here too
    if backend == "auto" and _plain_attention(coeffs, degrees):
        return None  # every head is softmax attention: the stock fused SDPA kernel is that exact operation
    if backend == "auto" and q.shape[-1] > TRITON_AUTO_MAX_HEAD_DIM:
        return None  # the kernels' shared memory was only checked up to this head size
    mask, _ = _normalise_mask(attn_mask, False, q, k)  # validated, 4-dimensional, causal not folded in
    reason = triton_unsupported(q, k, v, mask, need_weights)
    if reason is not None:
        if backend == "triton":
            raise ValueError(f"backend='triton' does not support {reason}; use backend='auto' to fall back to the "
                             "PyTorch back-ends")
        return None
    pad, general = split_mask(mask, q.shape[0])
    low = _autocast_dtype(q)
    if low is not None and low != q.dtype:  # what autocast does to the inputs of the fused kernel it stands in for
        q, k, v = q.to(low), k.to(low), v.to(low)
    return TritonBackend(q, k, is_causal, pad, scale, dropout_p, general).diffuse(v, coeffs, degrees)


def _autocast_mixed(q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    """``q``, ``k``, ``v`` of different dtypes under an enabled autocast of their device, cast as autocast casts the
    inputs of :func:`~torch.nn.functional.scaled_dot_product_attention`: float32 and half to the autocast dtype.
    With a float64 among them all are left as they are (refused by the dtype checks, as SDPA refuses them, naming
    the dtypes given); inputs of one dtype, or without an enabled autocast, are returned as they are."""
    ts = (q, k, v)
    if (not all(isinstance(t, Tensor) for t in ts) or q.dtype == k.dtype == v.dtype
            or any(t.dtype == torch.float64 for t in ts)):  # refused as SDPA refuses it, naming the dtypes given
        return q, k, v
    dev = q.device.type
    if dev not in ("cpu", "cuda") or not torch.is_autocast_enabled(dev):
        return q, k, v
    low = torch.get_autocast_dtype(dev)
    q, k, v = (t.to(low) if t.is_floating_point() and t.device.type == dev else t for t in ts)
    return q, k, v


def _autocast_dtype(t: Tensor) -> torch.dtype | None:
    """The dtype an enabled autocast of ``t``'s device gives a fused attention call on ``t`` (float32 and half
    inputs; float64 stays), else ``None``: every dense path returns the dtype ``F.scaled_dot_product_attention``
    returns, whichever back-end ``"auto"`` picks."""
    dev = t.device.type
    if dev in ("cpu", "cuda") and t.dtype != torch.float64 and t.is_floating_point() and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return None


def _diffuse_dense(
    q: Tensor, k: Tensor, v: Tensor, coeffs: Tensor | tuple[tuple[float, ...], ...], attn_mask: Tensor | None,
    is_causal: bool, scale: float, backend: str, degrees: tuple[int, ...], dropout_p: float, need_weights: bool,
    affine_heads: AffineHeadsPlan | None = None, rebuild: list[Callable[[], Tensor]] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`diffuse_with_weights` on validated inputs: picks the path and a back-end, runs the engine."""
    B, H, N, _ = q.shape
    M = k.shape[2]
    dtype = _autocast_dtype(v) or v.dtype  # every path returns what the fused kernel returns (autocast's dtype)
    work = work_dtype(v.dtype)
    row_ok = _rows_with_keys(attn_mask)
    if isinstance(coeffs, tuple):  # static coefficients (Python floats)
        if len(coeffs[0]) == 2 and backend != "matrix" and not need_weights:
            # degree <= 1: one fused call for every head, then c0 v + c1 P v in place
            c0, c1 = affine_coefficients(coeffs, degrees)
            sdpa = SdpaBackend(q, k, attn_mask, is_causal, scale, dropout_p, row_ok)
            return affine(sdpa, v, c0, c1), None
        split = _static_split(coeffs, degrees) if backend != "matrix" and not need_weights else None
        if split is not None:  # heads of degree <= 1 beside K-step heads
            plan, high, rows_high = split
            return _split_paths(q, k, v, plan, high, static_tensor(rows_high, v.device, work), degrees, attn_mask,
                                is_causal, scale, backend, dropout_p, row_ok, rebuild), None
        coeffs = static_tensor(coeffs, v.device, work)  # built and copied to the device once
    c = coeffs.to(work)
    if affine_heads is not None and backend != "matrix" and not need_weights and 0 < len(affine_heads[0]) < H:
        high = _complement(affine_heads[0], H)
        return _split_paths(q, k, v, affine_heads, high, select(c, high, 0), degrees, attn_mask, is_causal, scale,
                            backend, dropout_p, row_ok, rebuild), None
    if need_weights:
        P = _attention_matrix(q, k, attn_mask, is_causal, scale, row_ok)
        out = polynomial(MatrixBackend(P, all_heads(H), dropout_p), v, c, degrees)
        # P in the working dtype (float32 for half inputs): diffuse_with_weights casts it to the input dtype; the
        # layer hands it to exact operators as it is (their gradient of P overflows float16)
        return out.to(dtype), P
    if backend == "auto":
        backend = _choose_dense_backend(N, M, max((0, *degrees)), is_causal, q.device.type)
        high = active_heads(degrees, 2)
        if backend == "matrix" and len(high) < H:
            # heads with K <= 1 keep the fused kernel; only the K-step heads materialise P
            low = tuple(h for h in range(H) if degrees[h] == 1)
            out = polynomial(SdpaBackend(q, k, attn_mask, is_causal, scale, dropout_p, row_ok), v, c, degrees,
                             heads=low)
            P = _attention_matrix(select(q, high, 1), select(k, high, 1), _select_mask(attn_mask, high), is_causal,
                                  scale, _select_mask(row_ok, high))
            out = polynomial(MatrixBackend(P, high, dropout_p), v, c, degrees, heads=high, out=out)
            return out.to(dtype), None
    if backend == "matrix":
        engine: Backend = MatrixBackend(_attention_matrix(q, k, attn_mask, is_causal, scale, row_ok), all_heads(H),
                                        dropout_p)
    else:
        engine = SdpaBackend(q, k, attn_mask, is_causal, scale, dropout_p, row_ok)
    return _recorded(lambda e: polynomial(e, v, c, degrees).to(dtype), (engine,), rebuild), None


def _recorded(combine: Callable[..., Tensor], backends: tuple[Backend, ...],
              rebuild: list[Callable[[], Tensor]] | None) -> Tensor:
    """``combine(*backends)``; with ``rebuild`` (a list) and fused-kernel back-ends only, also appends a function
    that runs ``combine`` again on their recorded kernel outputs (:class:`_SdpaReplay`, ``ops.recompute``).

    ``combine`` must not refer to ``rebuild`` (the appended function keeps ``combine``: that would be a reference
    cycle holding the layer's tensors until the garbage collector runs).
    """
    if rebuild is None or not all(isinstance(b, SdpaBackend) for b in backends):
        return combine(*backends)
    for b in backends:
        b.kernel_outputs = []
    out = combine(*backends)
    outputs = [b.kernel_outputs for b in backends]  # the lists only: no reference to q, k or the mask
    rebuild.append(lambda: combine(*(_SdpaReplay(o) for o in outputs)))
    return out


#: ``(heads, c0, c1)``: heads (increasing) whose operator is the fixed ``c0[i] I + c1[i] P``
AffineHeadsPlan = tuple[Heads, tuple[float, ...], tuple[float, ...]]


@_pure_cache(maxsize=256)
def _complement(heads: Heads, num_heads: int) -> Heads:
    return tuple(h for h in range(num_heads) if h not in heads)


@_pure_cache(maxsize=256)
def _static_split(rows: tuple[tuple[float, ...], ...], degrees: tuple[int, ...]
                  ) -> tuple[AffineHeadsPlan, Heads, tuple[tuple[float, ...], ...]] | None:
    """For static rows: the heads of degree ``<= 1`` as an affine plan, the ``K``-step heads and their
    rows (made once per layout), or ``None`` unless both groups are present."""
    high = active_heads(degrees, 2)
    if not 0 < len(high) < len(rows):
        return None
    low = _complement(high, len(rows))
    c0, c1 = affine_coefficients(tuple(rows[h] for h in low), tuple(degrees[h] for h in low))
    return (low, c0, c1), high, tuple(rows[h] for h in high)


def _split_paths(
    q: Tensor, k: Tensor, v: Tensor, affine_heads: AffineHeadsPlan, high: Heads, c_high: Tensor,
    degrees: tuple[int, ...], attn_mask: Tensor | None, is_causal: bool, scale: float, backend: str, dropout_p: float,
    row_ok: Tensor | None, rebuild: list[Callable[[], Tensor]] | None = None,
) -> Tensor:
    """Fixed ``c0 I + c1 P`` heads beside heads of the loop: each group on its own path.

    The fixed affine heads (``affine_heads``) take the affine path (one fused call, ``c0 v + c1 P v``
    in the input dtype: plain attention heads return the kernel's output untouched); only the
    other heads (``high``, coefficients ``c_high``, ``(len(high), K+1)`` in the working dtype, fixed
    or learned) run the engine's loop with a float32 accumulator (on the fused kernel, or their
    own materialised ``P`` when ``backend="auto"`` picks ``"matrix"``). The two outputs are merged
    token-major in one concatenation. One more kernel call than a loop over all heads, but no
    float32 pass over the heads that do not need it; when each group is one run of heads, ``q``,
    ``k``, ``v`` are split in one operation, whose gradient is one concatenation. With ``rebuild``
    (a list), a function that forms the output again from the propagated signals is appended.
    """
    N, M = q.shape[2], k.shape[2]
    low, c0, c1 = affine_heads
    (q_lo, q_hi), (k_lo, k_hi), (v_lo, v_hi) = (split_heads(t, low, high, 1) for t in (q, k, v))
    deg_high = tuple(degrees[h] for h in high)
    if backend == "auto":
        backend = _choose_dense_backend(N, M, max(deg_high), is_causal, q.device.type)
    if backend != "matrix" and attn_mask is not None and attn_mask.shape[1] == 1:
        attn_mask = _additive_cpu_mask(attn_mask, q)  # one mask for both groups' fused calls: converted once
    m_lo, m_hi = ((attn_mask, attn_mask) if attn_mask is None or attn_mask.shape[1] == 1
                  else split_heads(attn_mask, low, high, 1))
    r_lo, r_hi = (row_ok, row_ok) if row_ok is None or row_ok.shape[1] == 1 else split_heads(row_ok, low, high, 1)
    lo: Backend = SdpaBackend(q_lo, k_lo, m_lo, is_causal, scale, dropout_p, r_lo)
    if backend == "matrix":
        hi: Backend = MatrixBackend(_attention_matrix(q_hi, k_hi, m_hi, is_causal, scale, r_hi),
                                    all_heads(len(high)), dropout_p)
    else:
        hi = SdpaBackend(q_hi, k_hi, m_hi, is_causal, scale, dropout_p, r_hi)

    inplace = None if rebuild is None else False  # a bool, not the list: no reference cycle through the closure
    # the forward's output dtype, fixed now: the replay runs in the backward pass, perhaps inside another autocast
    out_dtype = _autocast_dtype(v) or v.dtype

    def combine(lo: Backend, hi: Backend) -> Tensor:
        out_low = affine(lo, v_lo, c0, c1, inplace=inplace)
        out_high = polynomial(hi, v_hi, c_high, deg_high).to(out_dtype)
        return merge_heads(((low, out_low), (high, out_high)), 1)

    return _recorded(combine, (lo, hi), rebuild)


def diffuse(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    coeffs: Tensor | Sequence[float] | Sequence[Sequence[float]],
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
    learned polynomials (see :mod:`diffusionformer.operators`). The sum is computed by the
    engine (:mod:`diffusionformer.ops.engine`) on the back-end chosen by ``backend``.

    Coefficients given as Python numbers (a list or tuple) are *static*: with ``K <= 1``
    every head then costs one fused attention call for all heads, and ``c_0 v + c_1 P v``
    is combined in place at inference (the fast path of
    :class:`~diffusionformer.nn.DiffusionAttention`'s attention and Laplacian heads). A
    tensor is always taken through the general loop (its values are never read on the
    host, so it may be learned and live on any device).

    Args:
        q: queries.
        k: keys (the same tokens as the queries: ``P`` is square).
        v: values.
        coeffs: weights on ``P^0 .. P^K``, one row per head or one row shared by all heads;
            a tensor (differentiable) or Python numbers (static, see above).
        attn_mask: bool (True = attend) or additive float mask broadcastable to ``(B, H, N, N)``,
            as in :func:`~torch.nn.functional.scaled_dot_product_attention`; cast to ``q``'s dtype, a finite
            entry beyond its range (``-1e9`` for float16; under an enabled autocast, the range of the
            autocast dtype) clamped to it (a row of such biases still attends).
        is_causal: position ``i`` attends to ``j <= i`` only (may be combined with ``attn_mask``).
        scale: score scale, default ``1 / sqrt(C)``.
        backend: ``"auto"`` (Triton for supported CUDA calls, else the rule of
            :func:`choose_dense_backend`), ``"sdpa"`` (re-propagate with the fused kernel),
            ``"matrix"`` (materialise ``P``) or ``"triton"`` (the Triton kernels; a ValueError
            names any unsupported feature, see :mod:`diffusionformer.ops.triton.backend`).
        degrees: optional highest power used by each head (``<= K``); heads are propagated
            only as far as they need (a layer with ``G`` of ``H`` heads needing ``K`` steps
            costs ``1 + (K - 1) G / H`` fused calls).
        dropout_p: dropout on ``P`` at every step, applied whenever it is positive (as
            :func:`~torch.nn.functional.scaled_dot_product_attention`'s: pass 0 outside training).

    Shapes:
        ``q``, ``k``: ``(B, H, N, C)``; ``v``: ``(B, H, N, C_v)``; ``coeffs``: ``(H, K+1)``, or
        ``(1, K+1)`` / ``(K+1,)`` shared by all heads -> ``(B, H, N, C_v)``.

    Examples:
        >>> q = torch.zeros(1, 1, 2, 4); k = torch.zeros(1, 1, 2, 4)
        >>> v = torch.tensor([[[[1.], [3.]]]])
        >>> diffuse(q, k, v, torch.tensor([1., -1.])).flatten().tolist()  # (I - P) v
        [-1.0, 1.0]
        >>> diffuse(q, k, v, [1., -1.]).flatten().tolist()  # static: one fused call, combined in place
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
