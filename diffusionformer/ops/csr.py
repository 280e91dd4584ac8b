r"""CSR fast path of the sparse back-end: a target-sorted edge layout and memory-light kernels.

The sparse attention of :mod:`diffusionformer.ops.sparse` needs three things per layer:

* edge scores :math:`s_{e,h} = q_{i,h} \cdot k_{j,h}` for every edge ``e = (j -> i)``
  (a *sampled dense-dense product*, SDDMM);
* their softmax over each target's incoming edges;
* ``K`` products :math:`(P_h x_h)_i = \sum_{j \to i} P_{ij,h} x_{j,h}` (sparse-dense
  products, SpMM), with the same ``P`` every step.

Written with gathers and scatters, each of these materialises an edge-by-feature tensor
``(E, H, C)`` (and autograd keeps it for the backward pass). Here the edges are sorted once by
target so that ``P_h`` is a CSR matrix, and:

* SpMM runs on :func:`torch.addmm` with a CSR matrix per head, SDDMM on
  :func:`torch.sparse.sampled_addmm` (MKL / native kernels on CPU, cuSPARSE on CUDA): one
  library call per head, no ``(E, H, C)`` tensor;
* edge quantities are kept head-major, ``(H, E)``, so each head's row is directly the value
  array of its CSR matrix;
* the softmax uses segment reductions over the sorted targets;
* three :class:`torch.autograd.Function` objects save only node-sized tensors and the
  ``(H, E)`` weights; their backward passes are the same SDDMM / SpMM kernels on the
  transposed layout (built once, on demand). Under ``create_graph=True`` (second-order
  gradients) the backward passes compute the same sums by differentiable gathers and scatters
  (``(E, H, C)`` temporaries), since the sparse kernels' ``out=`` calls record no graph.

Memory is therefore ``O(E H + N H C)`` instead of ``O(E H C)``, and a layer issues ``O(H)``
kernel calls whatever ``E`` (on a CPU shared with other jobs every parallel region may wait
for a preempted thread, so few large calls also keep the time steady). Nothing in this
module synchronises with the host, so it runs unchanged on CUDA. Half-precision inputs are
computed in float32 by the caller (:func:`~diffusionformer.ops.sparse.diffuse_sparse`).
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any

import torch
from torch import Tensor

from diffusionformer.ops._checks import _FUNCTORCH, checks_values
from diffusionformer.ops.engine import _tensors_traced
from diffusionformer.ops.recompute import _batched_grad

__all__ = ["EdgeLayout", "csr_edge_scores", "csr_edge_softmax", "csr_propagate", "sddmm_heads", "spmm_heads"]


class EdgeLayout:
    r"""The edges of a graph sorted by target: ``P`` as a CSR matrix (rows = targets ``i``).

    Edges are sorted by ``(target, source)`` (stable, so duplicate edges keep their order);
    an input that is already sorted (a PyG ``edge_index`` sorted by column) is not copied.

    Built once per graph and shared by the score, softmax and propagation kernels and their
    backward passes (the sparse entry points share it between consecutive calls with the same
    unmodified ``edge_index`` tensor: see ``_edge_layout``). The transposed layout (rows =
    sources, needed by the backward pass) is built on first use and cached.

    Attributes:
        num_nodes: ``N``.
        num_edges: ``E``.
        order: position in the caller's edge list of every sorted edge, or ``None`` when the
            input was already sorted by target (checked in eager mode on CPU only; other inputs are sorted).
        src: sources ``j`` in sorted order.
        dst: targets ``i`` in sorted order (non-decreasing).
        crow: CSR row pointers ``(N + 1,)``: the incoming edges of ``i`` are ``crow[i]:crow[i+1]``.
        index_dtype: int32 when ``N`` and ``E`` fit (the dtype of ``src``, ``dst``, ``crow``), else int64.

    Args:
        edge_index: ``(source j, target i)`` pairs, PyG convention (validated by the caller).
        num_nodes: ``N``.

    Shapes:
        ``edge_index``: ``(2, E)``.

    Examples:
        >>> layout = EdgeLayout(torch.tensor([[0, 2, 1], [2, 0, 0]]), 3)
        >>> layout.dst.tolist(), layout.src.tolist(), layout.crow.tolist()
        ([0, 0, 2], [1, 2, 0], [0, 2, 2, 3])
        >>> layout.to_input_order(torch.tensor([10., 20., 30.])).tolist()
        [30.0, 20.0, 10.0]
    """

    def __init__(self, edge_index: Tensor, num_nodes: int) -> None:
        src, dst = edge_index[0].long(), edge_index[1].long()
        self.num_nodes = N = int(num_nodes)
        self.num_edges = E = int(dst.shape[0])
        self.order: Tensor | None = None
        # sort by (target, source): CSR rows with ascending columns, as sparse libraries expect
        key = dst * N + src
        # the sortedness test reads the keys on the host: where checks_values allows (eager CPU: on an accelerator
        # a device synchronisation, under torch.compile data-dependent control flow); else always sort
        if not checks_values(key) or not _is_sorted(key):
            key, order = torch.sort(key, stable=True)
            dst = key.div(N, rounding_mode="floor")  # cheaper than two gathers by ``order``
            src = key - dst * N
            self.order = order
        # 32-bit indices when they fit: half the memory, and MKL's CSR routines take them as is
        self.index_dtype = torch.int32 if max(N, E) < 2**31 - 1 else torch.int64
        self.src, self.dst = src.to(self.index_dtype), dst.to(self.index_dtype)
        self.crow = _row_pointers(self.dst, N)
        self._transposed: tuple[Tensor, Tensor, Tensor] | None = None

    def transposed(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(order, col, crow)`` of the transpose: edges sorted by source.

        ``order`` indexes the target-sorted edges, ``col`` holds their targets, ``crow`` the
        row pointers over sources.
        """
        if self._transposed is None:
            _, order = torch.sort(self.src.long() * self.num_nodes + self.dst.long(), stable=True)
            src_sorted = self.src.index_select(0, order)
            self._transposed = (order, self.dst.index_select(0, order), _row_pointers(src_sorted, self.num_nodes))
        return self._transposed

    def to_input_order(self, t: Tensor) -> Tensor:
        """Reorder an edge tensor ``(E, ...)`` from sorted order back to the caller's order."""
        if self.order is None:
            return t
        out = torch.empty_like(t)
        out[self.order] = t
        return out

    def from_input_order(self, t: Tensor) -> Tensor:
        """Reorder an edge tensor ``(E, ...)`` from the caller's order into sorted order."""
        return t if self.order is None else t.index_select(0, self.order)


#: the layout of the last ``edge_index`` given to :func:`_edge_layout`: ``(weak reference to its storage, ``id`` of
#: the tensor, its identity key, a copy of its values on CPU else None, layout)``, or ``None``; cleared when that
#: storage is freed. The storage is referenced, not the tensor: :func:`torch.utils.swap_tensors` refuses a tensor with a
#: weak reference (``load_state_dict`` under ``torch.__future__.set_swap_module_params_on_conversion(True)`` swaps
#: an ``edge_index`` buffer)
_LAST_LAYOUT: list[Any] = [None]
#: reentrant: a garbage collection run by an allocation while the lock is held (making the new entry) can free the
#: last edges' storage, whose callback takes the lock in the same thread (a plain Lock deadlocked there)
_LAST_LAYOUT_LOCK = threading.RLock()


def _layout_key(edge_index: Tensor, num_nodes: int) -> tuple[Any, ...] | None:
    """What makes two calls' ``edge_index`` the same edges: the tensor's storage, geometry and version counter (an
    in-place write, ``set_`` or ``.data =`` changes one of them), with ``num_nodes``; ``None`` where no layout is
    shared: while tensors are traced (:func:`torch.compile`, :func:`torch.jit.trace`, a dispatch mode such as
    ``make_fx``'s: a layout made before would be recorded as constants, not as operations on the traced edges), in
    inference mode (a layout made there holds inference tensors, which a later training call could not save for its
    backward), while a CUDA graph is captured (a layout made before the capture, freed when other edges come, would
    be replayed from freed memory), and for tensor subclasses, meta tensors and tensors wrapped by functorch (no
    storage to name)."""
    if (type(edge_index) is not Tensor or _tensors_traced() or torch.compiler.is_compiling()
            or torch.is_inference_mode_enabled()
            or edge_index.is_inference() or edge_index.is_meta
            or (_FUNCTORCH is None or _FUNCTORCH.is_functorch_wrapped_tensor(edge_index))
            or (edge_index.is_cuda and torch.cuda.is_current_stream_capturing())):
        return None
    return (edge_index.data_ptr(), edge_index.device, edge_index.dtype, tuple(edge_index.shape), edge_index.stride(),
            edge_index.storage_offset(), edge_index._version, int(num_nodes))


def _edge_layout(edge_index: Tensor, num_nodes: int) -> EdgeLayout:
    """``EdgeLayout(edge_index, num_nodes)``, shared by consecutive calls with the same unmodified ``edge_index``
    tensor: the layers of a graph model all take the model's one ``edge_index``, and full-batch training gives the
    same one at every step; each call sorted the edges again (and its backward pass sorted the transpose again).
    A layout is immutable once made (its transposed layout is made once, on first use), so sharing it changes no
    value. On CPU the edges are also compared with a copy (a write through ``edge_index.numpy()`` bumps no version
    counter); on an accelerator that comparison would synchronise with the host, and the version counter decides."""
    key = _layout_key(edge_index, num_nodes)
    if key is None:
        return EdgeLayout(edge_index, num_nodes)
    storage = edge_index.untyped_storage()
    entry = _LAST_LAYOUT[0]
    if (entry is not None and entry[0]() is storage and entry[1] == id(edge_index) and entry[2] == key
            and (entry[3] is None or torch.equal(entry[3], edge_index))):
        return entry[4]
    layout = EdgeLayout(edge_index, num_nodes)
    values = edge_index.clone() if edge_index.device.type == "cpu" else None

    def forget(ref: Any) -> None:  # the edges' storage is freed: so is their layout
        with _LAST_LAYOUT_LOCK:
            if _LAST_LAYOUT[0] is not None and _LAST_LAYOUT[0][0] is ref:
                _LAST_LAYOUT[0] = None

    with _LAST_LAYOUT_LOCK:
        _LAST_LAYOUT[0] = (weakref.ref(storage, forget), id(edge_index), key, values, layout)
    return layout


def _is_sorted(index: Tensor) -> bool:
    return index.numel() < 2 or bool((index[1:] >= index[:-1]).all())


def _row_pointers(sorted_rows: Tensor, num_rows: int) -> Tensor:
    bounds = torch.arange(num_rows + 1, device=sorted_rows.device, dtype=sorted_rows.dtype)
    return torch.searchsorted(sorted_rows, bounds, out_int32=sorted_rows.dtype == torch.int32)


_CSR_BETA = "Sparse CSR tensor support is in beta"
# torch 2.11 (the GPU image) also warns once that "Sparse invariant checks are implicitly disabled", though
# check_invariants=False is passed: an error at import under ``python -W error``
_CSR_INVARIANTS = "Sparse invariant checks are implicitly disabled"


def _quiet_csr(crow: Tensor, col: Tensor, values: Tensor, size: tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_CSR_BETA)
        warnings.filterwarnings("ignore", message=_CSR_INVARIANTS)
        return torch.sparse_csr_tensor(crow, col, values, size, check_invariants=False, device=values.device)


# torch gives its beta warning once per process (TORCH_WARN_ONCE, in the CSR tensor's constructor, for every
# device): given here, at import, under the import lock. A catch_warnings() in every call swapped the process-wide
# filter list, not thread-safe (a filter another thread set meanwhile was dropped on exit), and marked the filters
# as changed, so every module's "already shown" registry was cleared: the user's once-per-location warnings came
# back after each sparse call
_quiet_csr(*(torch.zeros(n, dtype=dtype, device="cpu") for n, dtype in ((1, torch.long), (0, torch.long), (0, torch.float32))),
           (0, 0))


def _csr(crow: Tensor, col: Tensor, values: Tensor, size: tuple[int, int]) -> Tensor:
    if torch.is_warn_always_enabled():  # torch.set_warn_always(True) repeats the beta warning at every call
        return _quiet_csr(crow, col, values, size)
    return torch.sparse_csr_tensor(crow, col, values, size, check_invariants=False, device=values.device)


def sddmm_heads(crow: Tensor, col: Tensor, a: Tensor, b: Tensor) -> Tensor:
    r"""Per-head dot products on the stored entries (SDDMM): :math:`s_{h,e} = a_{h,r_e} \cdot b_{h,c_e}`.

    ``r_e`` is the row of entry ``e`` in the CSR structure ``(crow, col)`` and ``c_e = col[e]``;
    one :func:`torch.sparse.sampled_addmm` per head. Repeated entries (duplicate edges) each get
    their product. A structure with more entries than the ``R x M`` matrix has cells (only
    possible with duplicates) does not fit :func:`torch.sparse.sampled_addmm`, which sizes its
    result to at most ``R M`` entries; there the ``(H, R, M)`` dense products (fewer values than
    the ``H E`` results) are gathered at the entries instead.

    Args:
        crow: row pointers ``(R + 1,)``.
        col: column of every stored entry ``(E,)``.
        a: row operand, head-major.
        b: column operand, head-major.

    Shapes:
        ``a``: ``(H, R, C)``, ``b``: ``(H, M, C)`` -> ``(H, E)``.

    Examples:
        >>> crow = torch.tensor([0, 2, 3]); col = torch.tensor([0, 1, 1])
        >>> a = torch.tensor([[[1., 2.], [3., 4.]]]); b = torch.ones(1, 2, 2)
        >>> sddmm_heads(crow, col, a, b).tolist()
        [[3.0, 3.0, 7.0]]
    """
    H, R, _ = a.shape
    M = b.shape[1]
    E = col.shape[0]
    out = a.new_empty(H, E)
    if E == 0:
        return out
    if E > R * M:  # duplicates beyond R * M: the dense products, gathered per entry (a shape test, no host read)
        rows = torch.searchsorted(crow, torch.arange(E, device=crow.device, dtype=crow.dtype), right=True) - 1
        flat = rows.long() * M + col.long()  # (E,): the cell of every entry in the row-major (R, M) matrix
        return torch.bmm(a, b.transpose(1, 2)).flatten(1).index_select(1, flat)
    pattern = _csr(crow, col, a.new_zeros(E), (R, M))  # zeros: sampled_addmm reads them even with beta=0
    for h in range(H):  # the result's values are row h of ``out``
        torch.sparse.sampled_addmm(pattern, a[h], b[h].t(), beta=0.0, out=_csr(crow, col, out[h], (R, M)))
    return out


def spmm_heads(crow: Tensor, col: Tensor, values: Tensor, x: Tensor, num_rows: int) -> Tensor:
    r"""One CSR matrix per head times a dense matrix: :math:`y_h = A_h x_h`.

    ``A_h`` has row pointers ``crow``, column indices ``col`` and values ``values[h]``
    (:func:`torch.addmm` with a sparse CSR operand: MKL on CPU, cuSPARSE on CUDA).

    Args:
        crow: row pointers ``(R + 1,)``.
        col: column of every stored entry ``(E,)``.
        values: entries per head ``(H, E)``.
        x: dense right-hand sides, head-major.
        num_rows: ``R``.

    Shapes:
        ``values``: ``(H, E)``, ``x``: ``(H, M, C)`` -> ``(H, R, C)``.

    Examples:
        >>> crow = torch.tensor([0, 2, 2]); col = torch.tensor([0, 1])
        >>> spmm_heads(crow, col, torch.tensor([[0.5, 0.5]]), torch.tensor([[[2.], [4.]]]), 2).flatten().tolist()
        [3.0, 0.0]
    """
    H, M, C = x.shape
    # addmm with beta=0 ignores the output's previous content (checked on CPU by the tests);
    # elsewhere it starts from zeros to be safe
    out = x.new_empty(H, num_rows, C) if x.device.type == "cpu" else x.new_zeros(H, num_rows, C)
    if values.shape[1] == 0:
        return out.zero_()
    x = x.contiguous()
    for h in range(H):
        torch.addmm(out[h], _csr(crow, col, values[h], (num_rows, M)), x[h], beta=0.0, out=out[h])
    return out


def _stock_backward(grad: Tensor) -> bool:
    """Whether a backward pass must take stock differentiable operations: under ``create_graph=True`` (the sparse
    kernels' ``out=`` calls record no graph) or with batched output gradients (``torch.autograd.grad(...,
    is_grads_batched=True)``, ``torch.autograd.functional.jacobian(..., vectorize=True)``: vmap has no batching
    rule for ``out=`` kernels nor for sparse CSR operands)."""
    return torch.is_grad_enabled() or _batched_grad(grad)


class _EdgeScores(torch.autograd.Function):
    """``s_{h,e} = scale * q_{h,dst} . k_{h,src}`` on the sorted edges; saves only ``q`` and ``k``."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, layout: EdgeLayout, scale: float) -> Tensor:
        ctx.layout, ctx.scale = layout, scale
        ctx.save_for_backward(q, k)
        return sddmm_heads(layout.crow, layout.src, q, k).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        q, k = ctx.saved_tensors
        layout: EdgeLayout = ctx.layout
        N = layout.num_nodes
        g = (grad * ctx.scale).contiguous()  # (H, E)
        dq = dk = None
        if _stock_backward(grad):  # create_graph=True or batched grads: differentiable gathers and scatters
            src, dst = layout.src.long(), layout.dst.long()
            if ctx.needs_input_grad[0]:
                dq = torch.zeros_like(q).index_add(1, dst, g.unsqueeze(-1) * k.index_select(1, src))
            if ctx.needs_input_grad[1]:
                dk = torch.zeros_like(k).index_add(1, src, g.unsqueeze(-1) * q.index_select(1, dst))
            return dq, dk, None, None
        if ctx.needs_input_grad[0]:  # dq_i = sum_{j -> i} g_e k_j
            dq = spmm_heads(layout.crow, layout.src, g, k, N)
        if ctx.needs_input_grad[1]:  # dk_j = sum_{j -> i} g_e q_i
            order, col, crow = layout.transposed()
            dk = spmm_heads(crow, col, g.index_select(1, order), q, N)
        return dq, dk, None, None


class _EdgeSoftmax(torch.autograd.Function):
    """Softmax of sorted edge scores ``(H, E)`` over each target's incoming edges; saves only the result."""

    @staticmethod
    def forward(ctx: Any, scores: Tensor, layout: EdgeLayout) -> Tensor:
        offsets = layout.crow.expand(scores.shape[0], -1).contiguous()  # (H, N + 1)
        ctx.layout, ctx.offsets = layout, offsets
        m = torch.segment_reduce(scores, "max", offsets=offsets, axis=1, unsafe=True)  # (H, N)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = (scores - m.index_select(1, layout.dst)).exp_()
        denom = torch.segment_reduce(e, "sum", offsets=offsets, axis=1, unsafe=True)
        denom = torch.where(denom != 0, denom, torch.ones_like(denom))  # a NaN sum stays NaN (as segment_softmax)
        alpha = e.div_(denom.index_select(1, layout.dst))
        ctx.save_for_backward(alpha)
        return alpha

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (alpha,) = ctx.saved_tensors
        if _stock_backward(grad):  # create_graph=True or batched gradients: a differentiable segment sum
            dot = alpha.new_zeros(alpha.shape[0], ctx.layout.num_nodes)
            dot = dot.index_add(1, ctx.layout.dst.long(), alpha * grad)
        else:
            dot = torch.segment_reduce(alpha * grad, "sum", offsets=ctx.offsets, axis=1, unsafe=True)
        return alpha * (grad - dot.index_select(1, ctx.layout.dst)), None


class _Propagate(torch.autograd.Function):
    """``y_h = P_h x_h`` with ``P_h`` the CSR matrix of weights ``w[h]``; saves ``w`` and ``x``."""

    @staticmethod
    def forward(ctx: Any, w: Tensor, x: Tensor, layout: EdgeLayout) -> Tensor:
        ctx.layout = layout
        ctx.save_for_backward(w, x)
        return spmm_heads(layout.crow, layout.src, w, x, layout.num_nodes)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        w, x = ctx.saved_tensors
        layout: EdgeLayout = ctx.layout
        grad = grad.contiguous()
        dw = dx = None
        if _stock_backward(grad):  # create_graph=True or batched grads: differentiable gathers and scatters
            src, dst = layout.src.long(), layout.dst.long()
            g = grad.index_select(1, dst)  # (H, E, C)
            if ctx.needs_input_grad[0]:
                dw = (g * x.index_select(1, src)).sum(-1)
            if ctx.needs_input_grad[1]:
                dx = torch.zeros_like(x).index_add(1, src, w.unsqueeze(-1) * g)
            return dw, dx, None
        if ctx.needs_input_grad[0]:  # dw_e = g_i . x_j
            dw = sddmm_heads(layout.crow, layout.src, grad, x)
        if ctx.needs_input_grad[1]:  # dx_j = sum_{j -> i} w_e g_i
            order, col, crow = layout.transposed()
            dx = spmm_heads(crow, col, w.index_select(1, order), grad, layout.num_nodes)
        return dw, dx, None


def csr_edge_scores(q: Tensor, k: Tensor, layout: EdgeLayout, scale: float) -> Tensor:
    r"""Scaled edge scores :math:`q_i \cdot k_j \cdot s` per head, in the layout's sorted edge order.

    Args:
        q: queries, head-major.
        k: keys, head-major.
        layout: the graph's :class:`EdgeLayout`.
        scale: score scale.

    Shapes:
        ``q``, ``k``: ``(H, N, C)`` -> ``(H, E)``.

    Examples:
        >>> layout = EdgeLayout(torch.tensor([[0, 1], [1, 1]]), 2)
        >>> csr_edge_scores(torch.ones(1, 2, 4), torch.ones(1, 2, 4), layout, 0.5).tolist()
        [[2.0, 2.0]]
    """
    return _EdgeScores.apply(q.contiguous(), k.contiguous(), layout, scale)


def csr_edge_softmax(scores: Tensor, layout: EdgeLayout) -> Tensor:
    r"""Softmax of sorted edge scores over each target's incoming edges (see :func:`~diffusionformer.ops.scatter.segment_softmax`).

    A target whose scores are all ``-inf`` gets zero weights, not NaN.

    Args:
        scores: edge scores per head in the layout's sorted order.
        layout: the graph's :class:`EdgeLayout`.

    Shapes:
        ``scores``: ``(H, E)`` -> ``(H, E)``.

    Examples:
        >>> layout = EdgeLayout(torch.tensor([[0, 1, 2], [1, 1, 0]]), 3)
        >>> csr_edge_softmax(torch.tensor([[3., 0., 0.]]), layout).tolist()
        [[1.0, 0.5, 0.5]]
    """
    return _EdgeSoftmax.apply(scores, layout)


def csr_propagate(weights: Tensor, x: Tensor, layout: EdgeLayout) -> Tensor:
    r"""One diffusion step per head, :math:`(P_h x_h)_i = \sum_{j \to i} P_{ij,h} x_{j,h}`, head-major.

    Args:
        weights: edge weights per head in the layout's sorted order.
        x: node signal, head-major.
        layout: the graph's :class:`EdgeLayout`.

    Shapes:
        ``weights``: ``(H, E)``, ``x``: ``(H, N, C)`` -> ``(H, N, C)``.

    Examples:
        >>> layout = EdgeLayout(torch.tensor([[0, 1], [2, 2]]), 3)
        >>> csr_propagate(torch.tensor([[0.5, 0.5]]), torch.tensor([[[2.], [4.], [0.]]]), layout).flatten().tolist()
        [0.0, 0.0, 3.0]
    """
    return _Propagate.apply(weights.contiguous(), x.contiguous(), layout)
