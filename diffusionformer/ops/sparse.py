r"""Sparse back-end: diffusion over the edges of a graph (PyTorch Geometric conventions).

``edge_index[0]`` holds the source ``j`` and ``edge_index[1]`` the target ``i`` of every edge;
the message ``x_j`` flows to ``i``. The attention matrix has one entry per edge,

.. math::
    P_{ij} = \frac{\exp(q_i \cdot k_j \cdot s)}{\sum_{j' \in \mathcal{N}(i)} \exp(q_i \cdot k_{j'} \cdot s)},

which is exactly PyG's :class:`~torch_geometric.nn.conv.TransformerConv` weighting. A node
without incoming edges has an all-zero row of ``P`` (so ``P x`` is 0 there and a Laplacian
head passes its value through unchanged). Edge weights are computed once and reused for
every power of ``P``.

Two implementations, chosen with ``backend``:

* ``"csr"`` (the default, ``"auto"``): edges sorted once by target, ``P`` as one CSR matrix
  per head, sparse-dense products on :func:`torch.sparse.mm` and memory-light autograd
  functions (:mod:`diffusionformer.ops.csr`); memory ``O(E H + N H C)``;
* ``"native"`` / ``"torch_scatter"``: the gather-multiply-scatter reference (PyG's message
  passing: ``(E, H, C)`` messages, then a scatter-sum with native kernels or torch-scatter).
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
from diffusionformer.ops.csr import EdgeLayout, csr_edge_scores, csr_edge_softmax, csr_propagate
from diffusionformer.ops.scatter import ScatterBackend, scatter_sum, segment_softmax

__all__ = ["SPARSE_BACKENDS", "check_edge_index", "diffuse_sparse", "edge_attention", "propagate_sparse"]

SparseBackend = Literal["auto", "csr", "native", "torch_scatter"]
SPARSE_BACKENDS: tuple[str, ...] = ("auto", "csr", "native", "torch_scatter")


def _use_csr(backend: str) -> bool:
    if backend in ("auto", "csr"):
        return True
    if backend in ("native", "torch_scatter"):
        return False
    raise ValueError(f"sparse backend must be one of {SPARSE_BACKENDS}, got {backend!r}")


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs are computed in float32 (scores, softmax and sums)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def check_edge_index(edge_index: object, num_nodes: int) -> Tensor:
    """Validate a PyG ``edge_index`` of shape ``(2, E)``.

    Bounds are checked for CPU tensors only (a bounds check on an accelerator would force a
    host synchronisation; out-of-range indices there fail inside the gather kernel).
    """
    if not isinstance(edge_index, Tensor):
        raise TypeError(f"edge_index must be a LongTensor of shape (2, E), got {type(edge_index).__name__}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape (2, E), got {tuple(edge_index.shape)}")
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"edge_index must be an integer tensor (int64), got {edge_index.dtype}")
    if edge_index.device.type == "cpu" and edge_index.numel() > 0:
        lo, hi = int(edge_index.min()), int(edge_index.max())
        if lo < 0 or hi >= num_nodes:
            raise ValueError(
                f"edge_index values must lie in [0, num_nodes={num_nodes}), got range [{lo}, {hi}]"
            )
    return edge_index.long()


def _check_nodes(q: Tensor, k: Tensor, num_nodes: int | None) -> int:
    check_tensor("q", q, 3, "(N, H, C)")
    check_tensor("k", k, 3, "(N, H, C)")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape (N, H, C), got {tuple(q.shape)} and {tuple(k.shape)}")
    if k.dtype != q.dtype:
        raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
    N = q.shape[0]
    if num_nodes is None:
        return N
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool):
        raise TypeError(f"num_nodes must be an int or None, got {type(num_nodes).__name__}")
    if num_nodes != N:
        raise ValueError(f"num_nodes={num_nodes} disagrees with q, which has N={N} rows")
    return N


def edge_attention(
    q: Tensor,
    k: Tensor,
    edge_index: Tensor,
    *,
    num_nodes: int | None = None,
    scale: float | None = None,
    backend: SparseBackend = "auto",
) -> Tensor:
    r"""Edge weights :math:`P_{ij}`: the softmax of :math:`q_i \cdot k_j \cdot s` over ``i``'s incoming edges.

    Args:
        q: queries of the nodes.
        k: keys of the nodes.
        edge_index: ``(source j, target i)`` pairs.
        num_nodes: number of nodes (default ``N`` of ``q``).
        scale: score scale, default ``1 / sqrt(C)``.
        backend: ``"auto"``/``"csr"`` (sorted CSR kernels) or ``"native"``/``"torch_scatter"``
            (gather-scatter reference, see :func:`~diffusionformer.ops.scatter.scatter_sum`).

    Shapes:
        ``q``, ``k``: ``(N, H, C)``; ``edge_index``: ``(2, E)`` -> ``(E, H)``.

    Examples:
        >>> q = torch.zeros(3, 1, 2); k = torch.zeros(3, 1, 2)
        >>> edge_attention(q, k, torch.tensor([[0, 1, 2], [2, 2, 0]])).flatten().tolist()
        [0.5, 0.5, 1.0]
    """
    N = _check_nodes(q, k, num_nodes)
    edge_index = check_edge_index(edge_index, N)
    scale = check_scale(scale, q.shape[-1])
    if _use_csr(backend):
        work = _work_dtype(q.dtype)
        layout = EdgeLayout(edge_index, N)
        scores = csr_edge_scores(_head_major(q, work), _head_major(k, work), layout, scale)
        return layout.to_input_order(csr_edge_softmax(scores, layout).t()).to(q.dtype)
    return _native_edge_attention(q, k, edge_index, N, scale, None, backend)


def _native_edge_attention(
    q: Tensor, k: Tensor, edge_index: Tensor, N: int, scale: float, edge_mask: Tensor | None, backend: ScatterBackend
) -> Tensor:
    src, dst = edge_index[0], edge_index[1]
    dtype = q.dtype
    work = _work_dtype(dtype)
    scores = (q.index_select(0, dst).to(work) * k.index_select(0, src).to(work)).sum(-1) * scale
    if edge_mask is not None:
        scores = scores.masked_fill(~edge_mask.unsqueeze(-1), float("-inf"))
    return segment_softmax(scores, dst, N, backend=backend).to(dtype)


def propagate_sparse(
    weights: Tensor,
    x: Tensor,
    edge_index: Tensor,
    *,
    num_nodes: int | None = None,
    backend: SparseBackend = "auto",
) -> Tensor:
    r"""One diffusion step on a sparse graph: :math:`(P x)_i = \sum_{j \to i} P_{ij} x_j`.

    Args:
        weights: one weight per edge and head (e.g. from :func:`edge_attention`).
        x: node signal.
        edge_index: ``(source j, target i)`` pairs.
        num_nodes: number of nodes (default ``x.shape[0]``).
        backend: ``"auto"``/``"csr"`` or ``"native"``/``"torch_scatter"`` (see :func:`edge_attention`).

    Shapes:
        ``weights``: ``(E, H)``; ``x``: ``(N, H, C)``; ``edge_index``: ``(2, E)`` -> ``(N, H, C)``.

    Examples:
        >>> w = torch.tensor([[0.5], [0.5]]); x = torch.tensor([[[2.]], [[4.]], [[0.]]])
        >>> propagate_sparse(w, x, torch.tensor([[0, 1], [2, 2]])).flatten().tolist()
        [0.0, 0.0, 3.0]
    """
    check_tensor("x", x, 3, "(N, H, C)")
    N = x.shape[0] if num_nodes is None else num_nodes
    edge_index = check_edge_index(edge_index, N)
    if weights.dim() != 2 or weights.shape[0] != edge_index.shape[1] or weights.shape[1] != x.shape[1]:
        raise ValueError(
            f"weights must have shape (E, H) = ({edge_index.shape[1]}, {x.shape[1]}), got {tuple(weights.shape)}"
        )
    if _use_csr(backend):
        work = _work_dtype(x.dtype)
        layout = EdgeLayout(edge_index, N)
        w = layout.from_input_order(weights.to(work)).t()  # (H, E)
        y = csr_propagate(w, _head_major(x, work), layout)  # (H, N, C)
        return y.permute(1, 0, 2).to(x.dtype)
    return _native_propagate(weights, x, edge_index[0], edge_index[1], N, backend)


def _native_propagate(weights: Tensor, x: Tensor, src: Tensor, dst: Tensor, N: int, backend: ScatterBackend) -> Tensor:
    messages = x.index_select(0, src) * weights.unsqueeze(-1).to(x.dtype)
    return scatter_sum(messages, dst, N, backend=backend)


def diffuse_sparse(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    edge_index: Tensor,
    coeffs: Tensor,
    *,
    num_nodes: int | None = None,
    scale: float | None = None,
    degrees: Sequence[int] | None = None,
    dropout_p: float = 0.0,
    backend: SparseBackend = "auto",
) -> Tensor:
    r"""Polynomial diffusion on a sparse graph: :math:`\sum_{k=0}^{K} c_{h,k} P_h^k v_h`.

    ``P_h`` is the per-head edge softmax of :func:`edge_attention`, computed once and reused
    for all ``K`` steps. Nodes without incoming edges have a zero row of ``P``. The default
    back-end keeps memory linear in ``E H`` (no edge-by-feature tensor, also in the backward
    pass); half-precision inputs are computed in float32 and returned in their dtype.

    Args:
        q: queries.
        k: keys.
        v: values.
        edge_index: ``(source j, target i)`` pairs, PyG convention.
        coeffs: weights on ``P^0 .. P^K`` per head ``(H, K+1)`` or shared ``(K+1,)``.
        num_nodes: number of nodes (default ``N`` of ``q``).
        scale: score scale, default ``1 / sqrt(C)``.
        degrees: optional highest power used by each head (see :func:`~diffusionformer.ops.dense.diffuse`).
        dropout_p: dropout on the edge weights at every step (training only).
        backend: ``"auto"``/``"csr"`` (sorted CSR kernels) or ``"native"``/``"torch_scatter"``
            (gather-scatter reference).

    Shapes:
        ``q``, ``k``: ``(N, H, C)``; ``v``: ``(N, H, C_v)``; ``edge_index``: ``(2, E)``;
        ``coeffs``: ``(H, K+1)`` or ``(K+1,)`` -> ``(N, H, C_v)``.

    Examples:
        >>> q = torch.zeros(2, 1, 4); k = torch.zeros(2, 1, 4); v = torch.tensor([[[1.]], [[3.]]])
        >>> complete = torch.tensor([[0, 1, 0, 1], [0, 0, 1, 1]])
        >>> diffuse_sparse(q, k, v, complete, torch.tensor([1., -1.])).flatten().tolist()
        [-1.0, 1.0]
    """
    out, _ = _diffuse_sparse(
        q, k, v, edge_index, coeffs, num_nodes=num_nodes, scale=scale, degrees=degrees,
        dropout_p=dropout_p, backend=backend, need_weights=False,
    )
    return out


def diffuse_sparse_with_weights(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    edge_index: Tensor,
    coeffs: Tensor,
    *,
    num_nodes: int | None = None,
    scale: float | None = None,
    degrees: Sequence[int] | None = None,
    dropout_p: float = 0.0,
    backend: SparseBackend = "auto",
) -> tuple[Tensor, Tensor]:
    """:func:`diffuse_sparse` that also returns the edge weights ``(E, H)`` (in the order of ``edge_index``)."""
    out, alpha = _diffuse_sparse(
        q, k, v, edge_index, coeffs, num_nodes=num_nodes, scale=scale, degrees=degrees,
        dropout_p=dropout_p, backend=backend, need_weights=True,
    )
    assert alpha is not None
    return out, alpha


def _diffuse_sparse(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    edge_index: Tensor,
    coeffs: Tensor | None,
    *,
    num_nodes: int | None,
    scale: float | None,
    degrees: Sequence[int] | None,
    dropout_p: float,
    backend: str,
    need_weights: bool,
    edge_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Shared body; ``edge_mask`` ``(E,)`` bool gives masked edges weight 0 without a host sync.

    ``coeffs=None`` computes plain attention ``P v`` (no coefficients, no combination step).
    """
    N = _check_nodes(q, k, num_nodes)
    check_tensor("v", v, 3, "(N, H, C_v)")
    if v.shape[:2] != q.shape[:2]:
        raise ValueError(f"v must have shape (N, H, C_v) with (N, H) = {tuple(q.shape[:2])}, got {tuple(v.shape)}")
    if v.dtype != q.dtype:
        raise TypeError(f"v must have the dtype of q ({q.dtype}), got {v.dtype}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must lie in [0, 1), got {dropout_p}")
    H = q.shape[1]
    if coeffs is None:
        coeffs, degrees = None, [1] * H
    else:
        coeffs = check_coefficients(coeffs, H, v)
        degrees = check_degrees(degrees, H, coeffs.shape[1] - 1)
    edge_index = check_edge_index(edge_index, N)
    scale = check_scale(scale, q.shape[-1])
    if _use_csr(backend):
        return _diffuse_csr(q, k, v, edge_index, coeffs, N, scale, degrees, dropout_p, need_weights, edge_mask)
    if coeffs is None:
        coeffs = torch.tensor([0.0, 1.0], dtype=v.dtype if v.dtype == torch.float64 else torch.float32, device=v.device)
        coeffs = check_coefficients(coeffs, H, v)
    return _diffuse_native(q, k, v, edge_index, coeffs, N, scale, degrees, dropout_p, backend, edge_mask)


def _diffuse_csr(
    q: Tensor, k: Tensor, v: Tensor, edge_index: Tensor, coeffs: Tensor | None, N: int, scale: float,
    degrees: list[int], dropout_p: float, need_weights: bool, edge_mask: Tensor | None,
) -> tuple[Tensor, Tensor | None]:
    dtype = v.dtype
    work = _work_dtype(dtype)
    H = q.shape[1]
    layout = EdgeLayout(edge_index, N)
    scores = csr_edge_scores(_head_major(q, work), _head_major(k, work), layout, scale)  # (H, E), sorted edges
    if edge_mask is not None:
        scores = scores.masked_fill(~layout.from_input_order(edge_mask).unsqueeze(0), float("-inf"))
    alpha = csr_edge_softmax(scores, layout)  # (H, E): one CSR value vector per head
    v_hm = _head_major(v, work)  # (H, N, C)
    weights = layout.to_input_order(alpha.t()).to(dtype) if need_weights else None
    if coeffs is None:  # plain attention: P v
        w = F.dropout(alpha, p=dropout_p) if dropout_p > 0.0 else alpha
        return csr_propagate(w, v_hm, layout).permute(1, 0, 2).to(dtype), weights
    c = coeffs.to(work)  # (H, K+1)
    out = v_hm * c[:, 0, None, None]
    max_degree = max(degrees, default=0)
    if max_degree >= 1:
        w_all = alpha
        cur = v_hm
        prev = list(range(H))
        for step in range(1, max_degree + 1):
            heads = active_heads(degrees, step)
            idx = list(range(H))[heads] if isinstance(heads, slice) else heads
            if idx != prev:
                cur = _take(cur, [prev.index(h) for h in idx])
            w = w_all if len(idx) == H else _take(w_all, idx)
            if dropout_p > 0.0:
                w = F.dropout(w, p=dropout_p)
            cur = csr_propagate(w, cur, layout)  # (H', N, C)
            if len(idx) == H:
                out = out + c[:, step, None, None] * cur
            else:
                ci = c[:, step, None, None][idx[0] : idx[-1] + 1] if _is_run(idx) else _take(c[:, step, None, None], idx)
                out = _add_heads(out, idx, ci * cur)
            prev = idx
    return out.permute(1, 0, 2).to(dtype), weights


def _head_major(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``(N, H, C)`` -> contiguous ``(H, N, C)`` in ``dtype``."""
    return t.to(dtype).permute(1, 0, 2).contiguous()


def _is_run(idx: list[int]) -> bool:
    return idx == list(range(idx[0], idx[-1] + 1))


# Head subsets use slices and concatenations, never index tensors built from Python lists
# (a host-to-device copy in the forward pass on CUDA).
def _take(t: Tensor, idx: list[int]) -> Tensor:
    """Rows ``idx`` of ``t`` along dim 0 (a view when they are consecutive)."""
    if _is_run(idx):
        return t[idx[0] : idx[-1] + 1]
    return torch.cat([t[a:b] for a, b in head_runs(idx)])


def _add_heads(out: Tensor, idx: list[int], value: Tensor) -> Tensor:
    """``out`` with ``value`` added to its rows ``idx`` (dim 0), out of place."""
    parts, pos, h = [], 0, 0
    for a, b in head_runs(idx):
        if a > h:
            parts.append(out[h:a])
        parts.append(out[a:b] + value[pos : pos + b - a])
        pos, h = pos + b - a, b
    if h < out.shape[0]:
        parts.append(out[h:])
    return torch.cat(parts)


_HEAD_INDEX: dict[tuple[tuple[int, ...], torch.device], Tensor] = {}


def _head_index(idx: Sequence[int], device: torch.device) -> Tensor:
    """``idx`` as a long tensor on ``device``, built once per (subset, device).

    The per-head step counts are fixed by the model, so the few subsets recur every forward;
    caching them avoids a host-to-device copy (and a CUDA sync point) per call.
    """
    key = (tuple(idx), device)
    t = _HEAD_INDEX.get(key)
    if t is None:
        t = _HEAD_INDEX[key] = torch.tensor(key[0], dtype=torch.long, device=device)
    return t


def _diffuse_native(
    q: Tensor, k: Tensor, v: Tensor, edge_index: Tensor, coeffs: Tensor, N: int, scale: float,
    degrees: list[int], dropout_p: float, backend: str, edge_mask: Tensor | None,
) -> tuple[Tensor, Tensor]:
    H = q.shape[1]
    alpha = _native_edge_attention(q, k, edge_index, N, scale, edge_mask, backend)  # type: ignore[arg-type]
    src, dst = edge_index[0], edge_index[1]
    c = coeffs.to(v.dtype)[None, :, :, None]  # (1, H, K+1, 1)
    out = v * c[:, :, 0]
    cur = v
    prev = list(range(H))
    for step in range(1, max(degrees, default=0) + 1):
        heads = active_heads(degrees, step)
        idx = list(range(H))[heads] if isinstance(heads, slice) else heads
        if idx != prev:
            cur = cur.index_select(1, _head_index([prev.index(h) for h in idx], v.device))
        sel = None if len(idx) == H else _head_index(idx, v.device)
        w = alpha if sel is None else alpha.index_select(1, sel)
        if dropout_p > 0.0:
            w = F.dropout(w, p=dropout_p)
        cur = _native_propagate(w, cur, src, dst, N, backend)  # type: ignore[arg-type]
        if sel is None:
            out = out + c[:, :, step] * cur
        else:
            out = out.index_add(1, sel, c.index_select(1, sel)[:, :, step] * cur)
        prev = idx
    return out, alpha
