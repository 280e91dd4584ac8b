r"""k-nearest-neighbour graphs in feature space (data-dependent token graphs)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from diffusionformer._imports import _import_pyg
from diffusionformer.config import _check_flag, _choice_hint
from diffusionformer.graph._checks import check_int, check_layout
from diffusionformer.graph.core import AttentionGraph
from diffusionformer.ops._checks import checks_values

__all__ = ["KNN_METRICS", "knn"]

KNN_METRICS: tuple[str, ...] = ("euclidean", "cosine")


_KNN_BLOCK = 1 << 22  # distances held at once (per block of query rows): 16 MB in float32


def _pow2_scale(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    """``x`` times the power of two that brings ``|x|.amax(dims)`` into ``[0.5, 1)``: exact (no rounding), so
    distances keep their order, but squares of huge or tiny features neither overflow nor underflow."""
    if x.shape[-1] == 0:  # no features: every distance is 0
        return x
    # |x|'s amax without the copy |x| (of the size of x): the larger of amax and -amin
    peak = torch.maximum(x.amax(dim=dims, keepdim=True), x.amin(dim=dims, keepdim=True).neg())
    _, e = torch.frexp(peak)  # peak = m 2^e, m in [0.5, 1); 0 for a zero peak
    lim = int(math.log2(torch.finfo(x.dtype).max)) - 1  # 2^-e stays a normal number
    return x * torch.exp2(-e.clamp(-lim, lim).to(x.dtype))


def knn(
    x: Tensor,
    k: int,
    *,
    batch: Tensor | None = None,
    metric: str = "euclidean",
    self_loops: bool = False,
    layout: str = "sparse",
) -> AttentionGraph:
    r"""The k-nearest-neighbour graph: :math:`j \to i` for the ``k`` points :math:`j \ne i` closest to :math:`x_i`.

    Distances are :math:`\lVert x_i - x_j \rVert_2` (``"euclidean"``) or
    :math:`1 - \cos(x_i, x_j)` (``"cosine"``), computed only within a graph (``batch``) or a
    sequence (3-D ``x``); a point is never its own neighbour, so every node has exactly ``k``
    in-edges (``k + 1`` with ``self_loops``), as in :func:`torch_geometric.nn.knn_graph`
    with ``flow="source_to_target"``. Ties are broken by :func:`torch.topk`. The graph is not
    differentiable in ``x``; half-precision ``x`` is compared in float32, and a non-finite
    ``x`` is refused (in eager mode on CPU, where the check reads no device memory).
    The distances are computed for a block of query points at a time (about :math:`2^{22}` at once), and the
    graphs of a batch are padded only to the graphs of their size (within a factor of 2), so memory grows with
    ``N k`` and the largest graph's size, not its square; the time is still quadratic in the size of each graph.

    Args:
        x: point features.
        k: neighbours per node, ``1 <= k < N`` for every graph.
        batch: graph of each node for 2-D ``x`` (need not be sorted for the sparse layout).
        metric: ``"euclidean"`` or ``"cosine"``.
        self_loops: add ``i -> i``.
        layout: ``"sparse"`` (edges grouped by target, nearest first) or ``"dense"`` (as
            :meth:`AttentionGraph.to_dense`: ``(B, N, N)`` allowed mask, padding for graphs of
            unequal sizes).

    Shapes:
        ``x``: ``(N, D)`` with optional ``batch`` ``(N,)``, or ``(B, N, D)`` (node ``b * N + i``
        in the sparse layout) -> a graph with ``N`` (or ``B * N``) nodes and ``E = N k`` edges.

    Examples:
        >>> x = torch.tensor([[0.], [1.], [3.], [7.]])
        >>> knn(x, 1).edge_index
        tensor([[1, 0, 1, 2],
                [0, 1, 2, 3]])
        >>> knn(x[None], 1, layout="dense")
        AttentionGraph(dense, B=1, N=4, allowed=(1, 4, 4))
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor of shape (N, D) or (B, N, D), got "
                        f"{type(x).__name__ if not isinstance(x, Tensor) else x.dtype}")
    k = check_int("k", k, 1)
    check_layout(layout)
    if metric not in KNN_METRICS:
        raise ValueError(f"metric must be one of {KNN_METRICS}, got {metric!r}{_choice_hint(metric, KNN_METRICS)}")
    _check_flag(self_loops, "self_loops")
    if x.device.type == "meta":  # else an unclear Tensor.item() error from the size checks below
        raise ValueError("x is on the meta device: knn reads the values of x to choose neighbours, and a meta "
                         "tensor has none")
    dev = x.device
    x = x.detach()
    # a NaN/inf distance ties with the masked self entry; read on the host in eager mode on CPU only
    if x.numel() and checks_values(x) and not bool(torch.isfinite(x).all()):
        raise ValueError("x must be finite: a NaN or inf feature has no nearest neighbours (and could pick "
                         "the point itself)")
    if x.dim() == 3:
        if batch is not None:
            raise ValueError("batch is for 2-D x of shape (N, D); a 3-D x (B, N, D) is already batched")
        B, N, _ = x.shape
        dense_x = x
        node = torch.arange(B * N, device=dev).view(B, N)  # node id of each slot
        counts = torch.full((B,), N, device=dev)
        graph_batch = torch.arange(B, device=dev).repeat_interleave(N)
        total = B * N
    elif x.dim() == 2:
        total = x.shape[0]
        if batch is None:
            dense_x, node = x[None], torch.arange(total, device=dev)[None]
            counts = torch.full((1,), total, device=dev)
            graph_batch = None
        else:
            _import_pyg()
            from torch_geometric.utils import to_dense_batch

            if not isinstance(batch, Tensor) or batch.dim() != 1 or batch.shape[0] != total:
                raise ValueError(f"batch must be an integer tensor of shape (N,) = ({total},), got "
                                 f"{tuple(batch.shape) if isinstance(batch, Tensor) else type(batch).__name__}")
            if batch.dtype.is_floating_point or batch.dtype.is_complex or batch.dtype == torch.bool:
                raise ValueError(f"batch must be an integer tensor (the graph of each node), got dtype {batch.dtype}")
            if batch.device != dev:  # else a device-mismatch error from inside to_dense_batch
                raise ValueError(f"batch must be on x's device ({dev}), got {batch.device}")
            graph_batch = batch.long()
            if graph_batch.numel() and int(graph_batch.min()) < 0:
                raise ValueError(f"batch values must be >= 0 (the graph of each node), got range "
                                 f"[{int(graph_batch.min())}, {int(graph_batch.max())}]")
            if total == 0:  # no graph at all (to_dense_batch has no max of an empty batch): refused below
                counts = torch.zeros(1, dtype=torch.long, device=dev)
            else:
                counts = torch.bincount(graph_batch)  # (G,), as to_dense_batch's batch.max() + 1 graphs
    else:
        raise ValueError(f"x must have shape (N, D) or (B, N, D), got {tuple(x.shape)}")
    smallest = int(counts[counts > 0].min()) if bool((counts > 0).any()) else 0
    if k >= smallest:
        raise ValueError(f"k must be smaller than the number of nodes in every graph: got k={k}, "
                         f"smallest graph has N={smallest} nodes")

    G = counts.numel()
    if x.dim() == 2 and graph_batch is not None:
        # graphs of like sizes padded together (a power-of-two size class each): one (G, N_max) padding of a
        # batch with one large graph and many small ones held and searched G N_max^2 distances, quadratic in N
        sizes = counts.clamp(min=1).double().log2().ceil().long()
        pairs = []
        for size in sizes[counts > 0].unique().tolist():
            graphs = ((sizes == size) & (counts > 0)).nonzero().squeeze(1)
            slot = torch.full((G,), -1, dtype=torch.long, device=dev)
            slot[graphs] = torch.arange(graphs.numel(), device=dev)
            order = (slot[graph_batch] >= 0).nonzero().squeeze(1)  # this class's nodes, ascending
            order = order[torch.argsort(slot[graph_batch[order]], stable=True)]  # grouped by graph
            dense_x, real = to_dense_batch(x[order], slot[graph_batch[order]])  # (G', N_max', D)
            node = torch.full(real.shape, -1, dtype=torch.long, device=dev)
            node[real] = order
            pairs.append(_knn_edges(dense_x, node, k, metric, self_loops))
        src = torch.cat([s for s, _ in pairs])
        tgt = torch.cat([t for _, t in pairs])
        # back to the caller's node order: group by target node id
        order = torch.argsort(tgt, stable=True)
        edges = torch.stack([src[order], tgt[order]])
    else:
        edges = torch.stack(_knn_edges(dense_x, node, k, metric, self_loops))
    g = AttentionGraph.sparse(edges, total, batch=graph_batch, batch_size=None if graph_batch is None else G)
    return g if layout == "sparse" else g.to_dense()


def _knn_edges(dense_x: Tensor, node: Tensor, k: int, metric: str, self_loops: bool) -> tuple[Tensor, Tensor]:
    """The sources and targets (node ids, padding dropped, grouped by target slot, nearest first) of the k
    nearest neighbours within each of the padded graphs ``dense_x`` ``(G, M, D)``, ``node`` ``(G, M)`` their node
    ids (``-1``: padding)."""
    dev = dense_x.device
    G, M, _ = dense_x.shape
    if dense_x.dtype in (torch.float16, torch.bfloat16):  # no CPU cdist for them; neighbours need no more
        dense_x = dense_x.float()
    if metric == "euclidean":
        # scaled into [0.5, 1) per graph so that no square overflows (a self loop) or underflows; the direct
        # differences, not |x|^2 + |y|^2 - 2 x.y, which cancels for points far from the origin (N > 25)
        points = _pow2_scale(dense_x, (1, 2))
        zero = None
    else:
        points = F.normalize(_pow2_scale(dense_x, (2,)), dim=-1)  # per point: a tiny norm is not clamped to eps
        zero = (points == 0).all(dim=-1)  # a zero vector (left at 0 by F.normalize) has cos = 0 with every point
    # the distances of a block of query rows at a time: the whole (G, M, M) matrix (and its masks) took memory
    # quadratic in the largest graph, tens of GB on CPU for 100k points where the graph has N k edges
    rows = max(1, _KNN_BLOCK // max(G * M, 1))
    columns = torch.arange(M, device=dev)
    blocks = []
    for start in range(0, M, rows):
        stop = min(start + rows, M)
        dist = torch.cdist(points[:, start:stop], points, compute_mode="donot_use_mm_for_euclid_dist")  # (G, r, M)
        if zero is not None:
            # 1 - cos = |u_i - u_j|^2 / 2 from the direct differences: 1 - u.u rounds to 0 in float32 for angles
            # below ~3e-4 rad, which tied nearly parallel neighbours
            dist = dist.square() / 2
            dist = dist.masked_fill(zero[:, start:stop, None] | zero[:, None, :], 1.0)
        invalid = (columns[start:stop, None] == columns)[None] | (node[:, None, :] < 0)  # self, padding keys
        dist = dist.masked_fill(invalid, float("inf"))
        blocks.append(dist.topk(k, dim=-1, largest=False).indices)  # (G, r, k) slots of the neighbours
    nbr = torch.cat(blocks, dim=1)  # (G, M, k)
    src = torch.gather(node[:, None, :].expand(G, M, M), 2, nbr)  # (G, M, k) node ids
    dst = node[:, :, None].expand(G, M, k)
    if self_loops:
        src = torch.cat([node[:, :, None], src], dim=-1)
        dst = torch.cat([node[:, :, None], dst], dim=-1)
    keep = dst >= 0  # drop the padding slots
    return src[keep], dst[keep]
