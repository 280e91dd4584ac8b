r"""Sparse back-end: diffusion over the edges of a graph (PyTorch Geometric conventions).

``edge_index[0]`` holds the source ``j`` and ``edge_index[1]`` the target ``i`` of every edge;
the message ``x_j`` flows to ``i``. The attention matrix has one entry per edge,

.. math::
    P_{ij} = \frac{\exp(q_i \cdot k_j \cdot s)}{\sum_{j' \in \mathcal{N}(i)} \exp(q_i \cdot k_{j'} \cdot s)},

which is exactly PyG's :class:`~torch_geometric.nn.conv.TransformerConv` weighting. A node
without incoming edges has an all-zero row of ``P`` (so ``P x`` is 0 there and a Laplacian
head passes its value through unchanged). Edge weights are computed once and reused for
every power of ``P``.

The sum over powers is the engine's loop (:func:`~diffusionformer.ops.engine.polynomial`)
on one of two back-ends, chosen with ``backend``:

* :class:`CsrBackend` (``"csr"``, the default, ``"auto"``): edges sorted once by target,
  ``P`` as one CSR matrix per head, sparse-dense products on :func:`torch.sparse.mm` and
  memory-light autograd functions (:mod:`diffusionformer.ops.csr`); memory ``O(E H + N H C)``;
* :class:`NativeBackend` (``"native"`` / ``"torch_scatter"``): the gather-multiply-scatter
  reference (PyG's message passing: ``(E, H, C)`` messages, then a scatter-sum with native
  kernels or torch-scatter).
"""

from __future__ import annotations

import numbers
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import handle_torch_function, has_torch_function

from diffusionformer.config import _check_flag
from diffusionformer.ops._checks import (DENSE_BACKENDS, SPARSE_BACKENDS, _SPARSE_ADJACENCY_FIX, _backend_hint,
                                         _check_is_causal, _check_strided, _proxy_tracing, check_dropout,
                                         check_index_range, check_layout, check_scale, check_tensor, checks_values)
from diffusionformer.ops.engine import (Backend, Heads, affine, affine_coefficients, polynomial, select, static_tensor,
                                         work_dtype)
from diffusionformer.ops.recompute import _in_eager_transform, _in_functorch
from diffusionformer.ops.csr import EdgeLayout, _edge_layout, csr_edge_scores, csr_edge_softmax, csr_propagate
from diffusionformer.ops.scatter import ScatterBackend, scatter_sum, segment_softmax

__all__ = [
    "SPARSE_BACKENDS",
    "CsrBackend",
    "NativeBackend",
    "check_edge_index",
    "diffuse_sparse",
    "diffuse_sparse_with_weights",
    "edge_attention",
    "propagate_sparse",
]

SparseBackend = Literal["auto", "csr", "native", "torch_scatter"]


def _use_csr(backend: str) -> bool:
    if backend == "auto":
        # torch.compile cannot trace sparse CSR tensors; the gather-scatter path compiles (and fuses); torch.func
        # transforms refuse the CSR kernels' autograd.Functions (no setup_context, out= kernels without batching rules),
        # and forward-mode AD too (they have no jvp; _in_eager_transform counts both); allow_mutation_on_saved_tensors
        # reads the data pointer of every out= argument, which a sparse CSR tensor has not; make_fx cannot trace them
        # either ("Sparse CSR tensors do not have strides")
        return (not torch.compiler.is_compiling() and not _in_eager_transform() and not _mutation_on_saved_allowed()
                and not _proxy_tracing())
    if backend == "csr":
        if _mutation_on_saved_allowed():
            raise ValueError("backend='csr' cannot run under torch.autograd.graph.allow_mutation_on_saved_tensors(): "
                             "its sparse kernels write into CSR tensors, which the context cannot clone; use "
                             "backend='auto' or 'native' there")
        if _in_eager_transform():
            raise ValueError(
                "backend='csr' cannot run inside a torch.func transform (grad, vjp, vmap, ...): its sparse kernels have "
                "no functorch support; use backend='auto' or 'native' there" if _in_functorch() else
                "backend='csr' cannot run under forward-mode AD (torch.autograd.forward_ad, torch.func.linearize): its "
                "sparse kernels have no jvp; use backend='auto' or 'native' there")
        # else torch's "Sparse CSR tensors do not have strides", deep in the CSR kernels (linearize's make_fx is
        # refused above: it traces under forward-mode AD)
        if _proxy_tracing():
            raise ValueError("backend='csr' cannot run while make_fx traces the call: its sparse CSR tensors cannot be "
                             "traced; use backend='auto' or 'native' there")
        return True
    if backend in ("native", "torch_scatter"):
        return False
    hint = _backend_hint(backend, SPARSE_BACKENDS, DENSE_BACKENDS, "dense (B, H, N, C) inputs")
    raise ValueError(f"sparse backend must be one of {SPARSE_BACKENDS}, got {backend!r}{hint}")


def _mutation_on_saved_allowed() -> bool:
    """Whether a :func:`torch.autograd.graph.allow_mutation_on_saved_tensors` context is open (eager mode)."""
    return bool(getattr(torch.autograd.graph, "_allow_mutation_on_saved_tensors_enabled", False))


def _without_values(t: Tensor) -> bool:
    """``t`` is a meta or fake tensor (a shape-only dry run): no values to read, no meta kernels for CSR products."""
    return t.is_meta or isinstance(t, FakeTensor)


def _use_csr_on(backend: str, like: Tensor) -> bool:
    """:func:`_use_csr` for inputs like ``like``: a meta or fake input (a dry run) takes the gather-scatter path under
    ``"auto"`` (the layout's sortedness test reads the edges, and the CSR kernels have no meta implementation) and
    is refused under ``"csr"``."""
    if not _without_values(like):
        return _use_csr(backend)
    if backend == "csr":
        kind = "meta" if like.is_meta else "fake"
        raise ValueError(f"backend='csr' cannot run on {kind} tensors (a dry run without values): its sparse "
                         "kernels have no meta implementation; use backend='auto' or 'native' there")
    _use_csr(backend)  # validates the name
    return False


def check_edge_index(edge_index: object, num_nodes: int) -> Tensor:
    """Validate a PyG ``edge_index`` of shape ``(2, E)``.

    Bounds are checked for CPU tensors in eager mode only (a bounds check on an accelerator would
    force a host synchronisation, and under :func:`torch.compile` it is data-dependent control
    flow; out-of-range indices there fail inside the gather kernel).
    """
    if not isinstance(edge_index, Tensor):
        raise TypeError(f"edge_index must be a LongTensor of shape (2, E), got {type(edge_index).__name__}")
    _check_strided("edge_index", edge_index, _SPARSE_ADJACENCY_FIX)
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        # the hint of the graph API (AttentionGraph.sparse) for a list of pairs
        hint = (": a list of (source, target) pairs of shape (E, 2) becomes one with edge_index.t()"
                if edge_index.dim() == 2 and edge_index.shape[1] == 2 else "")
        raise ValueError(f"edge_index must have shape (2, E), got {tuple(edge_index.shape)}{hint}")
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"edge_index must be an integer tensor (int64 or int32), got {edge_index.dtype}")
    check_index_range("edge_index", edge_index, "num_nodes", num_nodes)
    return edge_index.long()


def _check_edge_device(edge_index: Tensor, like: Tensor, name: str) -> None:
    """``edge_index`` on the device of the tensor ``name`` (else the kernels fail with torch's own device errors)."""
    if edge_index.device != like.device:
        raise ValueError(f"edge_index must be on the device of {name} ({like.device}), got {edge_index.device}")


def _check_nodes(q: Tensor, k: Tensor, num_nodes: int | None) -> int:
    check_tensor("q", q, 3, "(N, H, C)")
    check_tensor("k", k, 3, "(N, H, C)")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape (N, H, C), got {tuple(q.shape)} and {tuple(k.shape)}")
    if k.dtype != q.dtype:
        raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
    if k.device != q.device:
        raise ValueError(f"q and k must be on one device, got {q.device} and {k.device}")
    return _check_num_nodes(num_nodes, q.shape[0], "q")


def _check_num_nodes(num_nodes: int | None, N: int, name: str) -> int:
    """``num_nodes`` checked against the ``N`` rows of the tensor ``name`` (``N`` when ``None``)."""
    if num_nodes is None:
        return N
    if isinstance(num_nodes, torch.SymInt):  # a traced size (torch.export without dynamo): left symbolic
        if num_nodes != N:
            raise ValueError(f"num_nodes={num_nodes} disagrees with {name}, which has N={N} rows")
        return N
    if not isinstance(num_nodes, numbers.Integral) or isinstance(num_nodes, bool):  # numpy ints too
        raise TypeError(f"num_nodes must be an int or None, got {type(num_nodes).__name__}")
    if num_nodes != N:
        raise ValueError(f"num_nodes={num_nodes} disagrees with {name}, which has N={N} rows")
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
    _check_edge_device(edge_index, q, "q")
    scale = check_scale(scale, q.shape[-1])
    if _use_csr_on(backend, q):
        work = work_dtype(q.dtype)
        layout = _edge_layout(edge_index, N)
        scores = csr_edge_scores(_head_major(q, work), _head_major(k, work), layout, scale)
        return layout.to_input_order(csr_edge_softmax(scores, layout).t()).to(q.dtype)
    return _native_edge_attention(q, k, edge_index, N, scale, None, backend).to(q.dtype)


def _native_edge_attention(
    q: Tensor, k: Tensor, edge_index: Tensor, N: int, scale: float, edge_mask: Tensor | None, backend: ScatterBackend
) -> Tensor:
    """Edge weights ``(E, H)`` in the working dtype (float32 for half inputs, as the CSR path keeps them)."""
    src, dst = edge_index[0], edge_index[1]
    work = work_dtype(q.dtype)
    # cast before the gathers: their backward (a scatter-sum over the edges) then also sums in the working dtype
    scores = (q.to(work).index_select(0, dst) * k.to(work).index_select(0, src)).sum(-1) * scale
    if edge_mask is not None:
        scores = scores.masked_fill(~edge_mask.unsqueeze(-1), float("-inf"))
    return segment_softmax(scores, dst, N, backend=backend)


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
    N = _check_num_nodes(num_nodes, x.shape[0], "x")
    edge_index = check_edge_index(edge_index, N)
    _check_edge_device(edge_index, x, "x")
    check_tensor("weights", weights, 2, "(E, H)")
    if weights.dim() != 2 or weights.shape[0] != edge_index.shape[1] or weights.shape[1] != x.shape[1]:
        raise ValueError(
            f"weights must have shape (E, H) = ({edge_index.shape[1]}, {x.shape[1]}), got {tuple(weights.shape)}"
        )
    if weights.device != x.device:
        raise ValueError(f"weights must be on the device of x ({x.device}), got {weights.device}")
    if _use_csr_on(backend, x):
        work = work_dtype(x.dtype)
        layout = _edge_layout(edge_index, N)
        w = layout.from_input_order(weights.to(work)).t()  # (H, E)
        y = csr_propagate(w, _head_major(x, work), layout)  # (H, N, C)
        return y.permute(1, 0, 2).to(x.dtype)
    work = work_dtype(x.dtype)  # as the CSR path: products and sums in float32 for half inputs, cast once at the end
    return _native_propagate(weights.to(work), x.to(work), edge_index[0], edge_index[1], N, backend).to(x.dtype)


def _native_propagate(weights: Tensor, x: Tensor, src: Tensor, dst: Tensor, N: int, backend: ScatterBackend) -> Tensor:
    messages = x.index_select(0, src) * weights.unsqueeze(-1).to(x.dtype)
    return scatter_sum(messages, dst, N, backend=backend)


def _head_major(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``(N, H, C)`` -> contiguous ``(H, N, C)`` in ``dtype``."""
    return t.to(dtype).permute(1, 0, 2).contiguous()


class CsrBackend(Backend):
    """``P x`` as one CSR sparse-dense product per head (:func:`~diffusionformer.ops.csr.csr_propagate`).

    Args:
        alpha: edge weights per head in the layout's sorted order, ``(H, E)``.
        layout: the graph's :class:`~diffusionformer.ops.csr.EdgeLayout`.
        dropout_p: dropout on the edge weights at every step.

    Shapes:
        :meth:`propagate`: ``x`` head-major ``(H', N, C)`` -> ``(H', N, C)``.
    """

    name = "csr"
    head_axis = 0

    def __init__(self, alpha: Tensor, layout: EdgeLayout, dropout_p: float = 0.0) -> None:
        self.alpha, self.layout, self.dropout_p = alpha, layout, dropout_p

    def propagate(self, x: Tensor, heads: Heads) -> Tensor:
        w = select(self.alpha, heads, 0)
        if self.dropout_p > 0.0:
            w = F.dropout(w, p=self.dropout_p)
        return csr_propagate(w, x, self.layout)

    def weights(self) -> Tensor:
        """``(E, H)`` in the caller's edge order."""
        return self.layout.to_input_order(self.alpha.t())


class NativeBackend(Backend):
    """``P x`` by gather-multiply-scatter (PyG's message passing; the readable reference).

    Args:
        alpha: edge weights ``(E, H)`` in the order of ``edge_index``.
        edge_index: ``(source j, target i)`` pairs.
        num_nodes: ``N``.
        scatter: ``"native"``, ``"torch_scatter"`` or ``"auto"`` (see :func:`~diffusionformer.ops.scatter.scatter_sum`).
        dropout_p: dropout on the edge weights at every step.

    Shapes:
        :meth:`propagate`: ``x`` node-major ``(N, H', C)`` -> ``(N, H', C)``.
    """

    name = "native"
    head_axis = 1

    def __init__(self, alpha: Tensor, edge_index: Tensor, num_nodes: int, scatter: str = "auto",
                 dropout_p: float = 0.0) -> None:
        self.alpha, self.src, self.dst = alpha, edge_index[0], edge_index[1]
        self.num_nodes, self.scatter, self.dropout_p = num_nodes, scatter, dropout_p

    def propagate(self, x: Tensor, heads: Heads) -> Tensor:
        w = select(self.alpha, heads, 1)
        if self.dropout_p > 0.0:
            w = F.dropout(w, p=self.dropout_p)
        return _native_propagate(w, x, self.src, self.dst, self.num_nodes, self.scatter)  # type: ignore[arg-type]

    def weights(self) -> Tensor:
        return self.alpha


def diffuse_sparse(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    edge_index: Tensor,
    coeffs: Tensor | Sequence[float] | Sequence[Sequence[float]],
    *,
    num_nodes: int | None = None,
    scale: float | None = None,
    degrees: Sequence[int] | None = None,
    dropout_p: float = 0.0,
    backend: SparseBackend = "auto",
    is_causal: bool = False,
) -> Tensor:
    r"""Polynomial diffusion on a sparse graph: :math:`\sum_{k=0}^{K} c_{h,k} P_h^k v_h`.

    ``P_h`` is the per-head edge softmax of :func:`edge_attention`, computed once and reused
    for all ``K`` steps. Nodes without incoming edges have a zero row of ``P``. The default
    back-end keeps memory linear in ``E H`` (no edge-by-feature tensor, also in the backward
    pass); half-precision inputs are computed in float32 and returned in their dtype. It is not an
    autocast operation (as PyG's scatter kernels): under :func:`torch.autocast` float32 inputs stay
    float32 and so does the output, where the dense :func:`~diffusionformer.ops.dense.diffuse` returns
    the autocast dtype as :func:`~torch.nn.functional.scaled_dot_product_attention` does; a sparse
    :class:`~diffusionformer.nn.DiffusionAttention` still returns the autocast dtype (its output
    projection casts), as a dense one. Coefficients given as Python numbers are static, as in
    :func:`~diffusionformer.ops.dense.diffuse` (degree ``<= 1``: one propagation and an
    in-place combination).

    Args:
        q: queries.
        k: keys.
        v: values.
        edge_index: ``(source j, target i)`` pairs, PyG convention.
        coeffs: weights on ``P^0 .. P^K`` per head ``(H, K+1)`` or shared ``(1, K+1)`` / ``(K+1,)``; a
            tensor (differentiable) or Python numbers (static).
        num_nodes: number of nodes (default ``N`` of ``q``).
        scale: score scale, default ``1 / sqrt(C)``.
        degrees: optional highest power used by each head (see :func:`~diffusionformer.ops.dense.diffuse`).
        dropout_p: dropout on the edge weights at every step, applied whenever it is positive (pass 0
            outside training).
        backend: ``"auto"``/``"csr"`` (sorted CSR kernels) or ``"native"``/``"torch_scatter"``
            (gather-scatter reference).
        is_causal: ignore the edges whose source comes after their target (``j > i``), so
            node ``i`` never sees a later node.

    Shapes:
        ``q``, ``k``: ``(N, H, C)``; ``v``: ``(N, H, C_v)``; ``edge_index``: ``(2, E)``;
        ``coeffs``: ``(H, K+1)``, ``(1, K+1)`` or ``(K+1,)`` -> ``(N, H, C_v)``.

    Examples:
        >>> q = torch.zeros(2, 1, 4); k = torch.zeros(2, 1, 4); v = torch.tensor([[[1.]], [[3.]]])
        >>> complete = torch.tensor([[0, 1, 0, 1], [0, 0, 1, 1]])
        >>> diffuse_sparse(q, k, v, complete, torch.tensor([1., -1.])).flatten().tolist()
        [-1.0, 1.0]
        >>> diffuse_sparse(q, k, v, complete, [0., 1.], is_causal=True).flatten().tolist()
        [1.0, 2.0]
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):  # not cast: float32 in, float32 out
        ...     diffuse_sparse(q, k, v, complete, [0., 1.]).dtype
        torch.float32
    """
    out, _ = diffuse_sparse_with_weights(
        q, k, v, edge_index, coeffs, num_nodes=num_nodes, scale=scale, degrees=degrees,
        dropout_p=dropout_p, backend=backend, is_causal=is_causal, need_weights=False,
    )
    return out


def diffuse_sparse_with_weights(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    edge_index: Tensor,
    coeffs: Tensor | Sequence[float] | Sequence[Sequence[float]],
    *,
    num_nodes: int | None = None,
    scale: float | None = None,
    degrees: Sequence[int] | None = None,
    dropout_p: float = 0.0,
    backend: SparseBackend = "auto",
    is_causal: bool = False,
    need_weights: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """:func:`diffuse_sparse` that also returns the edge weights ``(E, H)``, in the order of ``edge_index``.

    Edges ignored by ``is_causal`` get weight 0. With ``need_weights=False`` the weights
    are ``None``. The other arguments are those of :func:`diffuse_sparse`; this is the one
    place where they are validated (and where ``edge_index``'s bounds are checked, the only
    host synchronisation of a sparse call).

    Examples:
        >>> q = torch.zeros(2, 1, 4); k = torch.zeros(2, 1, 4); v = torch.tensor([[[1.]], [[3.]]])
        >>> _, w = diffuse_sparse_with_weights(q, k, v, torch.tensor([[0, 1, 0, 1], [0, 0, 1, 1]]), [0., 1.], is_causal=True)
        >>> w.flatten().tolist()
        [1.0, 0.0, 0.5, 0.5]
    """
    if (type(q) is not Tensor or type(k) is not Tensor or type(v) is not Tensor) and has_torch_function((q, k, v)):
        # a Tensor subclass with __torch_function__ (a logging tensor) gets the call as one function, as torch's own
        # functional API does: run per operation, it wrapped the CSR kernels' sparse tensors in the subclass ("Sparse
        # CSR tensors do not have strides"); the output comes back as the subclass, as on the dense path
        return handle_torch_function(
            diffuse_sparse_with_weights, (q, k, v), q, k, v, edge_index, coeffs, num_nodes=num_nodes, scale=scale,
            degrees=degrees, dropout_p=dropout_p, backend=backend, is_causal=is_causal, need_weights=need_weights)
    N = _check_nodes(q, k, num_nodes)
    check_tensor("v", v, 3, "(N, H, C_v)")
    if v.shape[:2] != q.shape[:2]:
        raise ValueError(f"v must have shape (N, H, C_v) with (N, H) = {tuple(q.shape[:2])}, got {tuple(v.shape)}")
    if v.dtype != q.dtype:
        raise TypeError(f"v must have the dtype of q ({q.dtype}), got {v.dtype}")
    if v.device != q.device:
        raise ValueError(f"v must be on the device of q ({q.device}), got {v.device}")
    dropout_p = check_dropout(dropout_p)
    _check_is_causal(is_causal)
    _check_flag(need_weights, "need_weights")
    _use_csr_on(backend, q)  # validates the name (and refuses 'csr' where it cannot run)
    H = q.shape[1]
    coeffs, degrees = check_layout(coeffs, degrees, H, v)
    edge_index = check_edge_index(edge_index, N)
    _check_edge_device(edge_index, q, "q")
    scale = check_scale(scale, q.shape[-1])
    edge_mask = keep = None
    if is_causal:
        keep = edge_index[0] <= edge_index[1]
        if not checks_values(edge_index):
            # mask instead of filtering: a boolean index synchronises with the host (a data-dependent shape, which a
            # meta or fake edge_index cannot give, nor a compiled graph); filtered in eager mode on CPU only
            edge_mask, keep = keep, None
        else:
            edge_index = edge_index[:, keep]
    out, weights = _diffuse_sparse(q, k, v, edge_index, coeffs, N, scale, degrees,
                                   float(dropout_p), backend, need_weights, edge_mask)
    if weights is not None and keep is not None:  # back to the caller's edges, 0 on the dropped ones
        weights = weights.new_zeros(keep.shape[0], H).index_put_((keep,), weights)
    return out, weights


def _diffuse_sparse(
    q: Tensor, k: Tensor, v: Tensor, edge_index: Tensor, coeffs: Tensor | tuple[tuple[float, ...], ...], N: int,
    scale: float, degrees: tuple[int, ...], dropout_p: float, backend: str, need_weights: bool,
    edge_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The body of :func:`diffuse_sparse_with_weights` on validated inputs (unchecked).

    ``edge_mask`` ``(E,)`` bool gives masked edges weight 0 without a host sync.
    """
    dtype = v.dtype
    work = work_dtype(dtype)
    engine: Backend
    if _use_csr_on(backend, v):
        layout = _edge_layout(edge_index, N)
        scores = csr_edge_scores(_head_major(q, work), _head_major(k, work), layout, scale)  # (H, E), sorted edges
        if edge_mask is not None:
            scores = scores.masked_fill(~layout.from_input_order(edge_mask).unsqueeze(0), float("-inf"))
        engine = CsrBackend(csr_edge_softmax(scores, layout), layout, dropout_p)  # one CSR value vector per head
        vb = _head_major(v, work)  # (H, N, C)
    else:
        alpha = _native_edge_attention(q, k, edge_index, N, scale, edge_mask, backend)  # type: ignore[arg-type]
        engine = NativeBackend(alpha, edge_index, N, backend, dropout_p)
        vb = v.to(work)  # (N, H, C); P and every power in the working dtype, as on the CSR path
    weights = engine.weights().to(dtype) if need_weights else None
    if isinstance(coeffs, tuple) and len(coeffs[0]) == 2:  # static, degree <= 1: one propagation
        c0, c1 = affine_coefficients(coeffs, degrees)
        out = affine(engine, vb, c0, c1)
    else:
        if isinstance(coeffs, tuple):
            coeffs = static_tensor(coeffs, v.device, work)  # built and copied to the device once
        out = polynomial(engine, vb, coeffs.to(work), degrees)
    return out.movedim(engine.head_axis, 1).to(dtype), weights
