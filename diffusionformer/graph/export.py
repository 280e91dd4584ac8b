r"""The way back: a layer's attention graph as a weighted networkx ``DiGraph``, and a drawing helper.

matplotlib is imported lazily (the ``plot`` extra: ``pip install 'diffusionformer[plot]'``).
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any, Mapping

import torch
from torch import Tensor

from diffusionformer.config import _check_flag, _choice_hint
from diffusionformer.graph._checks import check_int
from diffusionformer.graph.core import (
    _SPARSE_ADJACENCY_FIX,
    AttentionGraph,
    _check_strided,
    _edge_index_shape_error,
)

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx
    from matplotlib.axes import Axes

__all__ = ["draw_attention_graph", "grid_layout", "to_networkx"]

HEAD_REDUCTIONS: tuple[str, ...] = ("mean", "max")


def _resolve_source(source: Any, weights: Tensor | None) -> tuple[Tensor | None, int | None, Tensor | None]:
    """``(edge_index or None, num_nodes or None, weights)`` from a graph, an edge_index or intermediates."""
    if isinstance(source, AttentionGraph):
        if source.is_dense and weights is not None and weights.dim() == 4:
            source = source.to_sparse(batch_size=weights.shape[0] if source.batch_size is None else None)
        else:
            source = source.to_sparse()
        return source.edge_index, source.num_nodes, weights
    if isinstance(source, Tensor):
        return source, None, weights
    if hasattr(source, "attn_weights") and hasattr(source, "edge_index"):  # AttentionIntermediates
        if weights is None:
            weights = source.attn_weights
        if weights is None:
            raise ValueError("the intermediates carry no attention weights")
        return source.edge_index, None, weights
    raise TypeError("graph_or_edge_index must be an AttentionGraph, an edge_index (2, E) tensor or "
                    f"AttentionIntermediates, got {type(source).__name__}")


def _edge_weights(edge_index: Tensor | None, weights: Tensor, num_nodes: int | None) -> tuple[Tensor, Tensor, int]:
    """Per-edge weights ``(E, H)`` for sparse ``(E,)``/``(E, H)`` or dense ``(B, H, N, N)`` weights."""
    if weights.dim() == 4:
        B, H, N, M = weights.shape
        if N != M:
            raise ValueError(f"dense weights must have shape (B, H, N, N), got {tuple(weights.shape)}")
        if edge_index is None:  # every entry with nonzero weight in some head
            b, i, j = (weights.detach() != 0).any(1).nonzero(as_tuple=True)
            edge_index = torch.stack([b * N + j, b * N + i])
        if num_nodes is not None and num_nodes != B * N:
            raise ValueError(f"dense weights (B, H, N, N) = {tuple(weights.shape)} need a graph over B * N = "
                             f"{B * N} nodes, got num_nodes={num_nodes}")
        if edge_index.numel() and int(edge_index.max()) >= B * N:
            raise ValueError(f"edge_index refers to node {int(edge_index.max())} but dense weights "
                             f"{tuple(weights.shape)} describe B * N = {B * N} nodes")
        if edge_index.numel() and int(edge_index.min()) >= 0:  # (negative ids: the range check of to_networkx)
            cross = int((edge_index[0] // N != edge_index[1] // N).sum())
            if cross:  # else edge b N + j -> b' N + i read the weight of j -> i in sequence b'
                raise ValueError(f"edge_index has {cross} edge(s) between different sequences of the dense weights "
                                 f"(B, H, N, N) = {tuple(weights.shape)} (token (b, i) is node b * N + i, and a "
                                 "token attends only within its own sequence)")
        src, dst = edge_index[0].to(weights.device), edge_index[1].to(weights.device)
        w = weights[dst // N, :, dst % N, src % N]  # (E, H)
        return edge_index, w, B * N
    if edge_index is None:
        raise ValueError("per-edge weights (E,) or (E, H) need an edge_index")
    if weights.dim() not in (1, 2) or weights.shape[0] != edge_index.shape[1]:
        raise ValueError(f"weights must have shape (E,) or (E, H) with E={edge_index.shape[1]}, or (B, H, N, N); "
                         f"got {tuple(weights.shape)}")
    w = weights if weights.dim() == 2 else weights[:, None]
    return edge_index, w, -1


def _reduce_heads(w: Tensor, head: int | str | None) -> Tensor:
    H = w.shape[1]
    if H == 0:  # the mean over no heads is NaN on every edge
        raise ValueError(f"weights have no heads (H=0), got per-edge weights of shape {tuple(w.shape)}")
    if w.is_complex():  # .double() would drop the imaginary part with only a warning
        raise TypeError(f"weights must be real, got dtype {w.dtype}")
    # float64 before reducing (integer counts and bool masks too): a bfloat16 mean rounded the exported weight to
    # 8 bits, and a float32 mean of large weights overflowed to inf
    w = w.double()
    if head is None:
        if H != 1:
            raise ValueError(f"weights have H={H} heads: choose one with head=<int> or reduce with head='mean'/'max'")
        return w[:, 0]
    if isinstance(head, str):
        if head not in HEAD_REDUCTIONS:
            raise ValueError(f"head must be an int in [0, {H}), one of {HEAD_REDUCTIONS} or None, got {head!r}"
                             f"{_choice_hint(head, HEAD_REDUCTIONS)}")
        return w.mean(1) if head == "mean" else w.amax(1)
    head = check_int("head", head, 0)
    if head >= H:
        raise ValueError(f"head must lie in [0, H={H}), got {head}")
    return w[:, head]


def _float_threshold(threshold: numbers.Real) -> float:
    """The float64 ``t`` with ``w > t`` iff ``w > threshold`` for every float64 ``w``: a Fraction or an int past
    float64 made the tensor comparison fail (TypeError, OverflowError), and a rounded-up ``t`` dropped ``w == t``."""
    try:
        t = float(threshold)
    except OverflowError:  # |threshold| beyond every finite float64: only +inf is above a huge one
        return float(torch.finfo(torch.float64).max) if threshold > 0 else -math.inf
    return math.nextafter(t, -math.inf) if t > threshold else t  # exact comparisons of float with int / Fraction


def _top_k_per_target(w: Tensor, dst: Tensor, k: int) -> Tensor:
    """Bool per edge: among the ``k`` largest weights into its target (ties: earlier edge first)."""
    order = torch.argsort(-w, stable=True)
    order = order[torch.argsort(dst[order], stable=True)]  # grouped by target, heaviest first
    sorted_dst = dst[order]
    first = torch.ones_like(sorted_dst, dtype=torch.bool)
    first[1:] = sorted_dst[1:] != sorted_dst[:-1]
    pos = torch.arange(order.numel(), device=w.device)
    start = torch.cummax(torch.where(first, pos, torch.zeros_like(pos)), 0).values
    keep = torch.zeros_like(first)
    keep[order] = (pos - start) < k
    return keep


def to_networkx(
    graph_or_edge_index: Any,
    weights: Tensor | None = None,
    *,
    threshold: float | None = None,
    top_k: int | None = None,
    head: int | str | None = "mean",
    num_nodes: int | None = None,
) -> "nx.DiGraph":
    r"""Export an attention graph to a networkx ``DiGraph`` with edges ``j -> i`` weighted by :math:`P_{ij}`.

    Edge ``j -> i`` (source ``j``, target ``i``, as in PyG) carries ``weight`` = the attention
    of ``i`` on ``j``, reduced over heads. Filters (both may be given; an edge must pass both):
    ``threshold`` keeps weights strictly above it; ``top_k`` keeps the ``k`` heaviest incoming
    edges of every node (ties: the earlier edge). Nodes are ``0 .. num_nodes - 1`` (dense inputs:
    token ``(b, i)`` is node ``b * N + i``, as in :meth:`AttentionGraph.to_sparse`) and all are
    kept, isolated or not. Duplicate edges collapse to the last one.

    Args:
        graph_or_edge_index: an :class:`AttentionGraph`, an ``edge_index`` ``(2, E)``, or the
            :class:`~diffusionformer.nn.AttentionIntermediates` of
            ``DiffusionAttention(..., return_intermediates=True)`` (its ``attn_weights`` and
            ``edge_index``; dense weights without a graph keep every nonzero entry).
        weights: ``(E,)`` or ``(E, H)`` per edge, or ``(B, H, N, N)`` dense (an ``edge_index``
            with it joins no two sequences); ``None`` for an unweighted graph (no ``weight`` attribute).
        threshold: keep edges with weight ``> threshold``.
        top_k: keep the ``top_k`` heaviest incoming edges per node.
        head: ``int`` picks a head; ``"mean"`` / ``"max"`` reduce over heads; ``None`` requires
            one head.
        num_nodes: node count for a bare ``edge_index`` (default ``max + 1``).

    Shapes:
        ``edge_index``: ``(2, E)``; ``weights``: ``(E,)``, ``(E, H)`` or ``(B, H, N, N)``.

    Examples:
        >>> ei = torch.tensor([[0, 1, 2, 0], [2, 2, 0, 1]])
        >>> G = to_networkx(ei, torch.tensor([0.2, 0.8, 1.0, 1.0], dtype=torch.float64), top_k=1)
        >>> sorted(G.edges(data="weight"))
        [(0, 1, 1.0), (1, 2, 0.8), (2, 0, 1.0)]
    """
    import networkx as nx

    if weights is not None and not isinstance(weights, Tensor):
        raise TypeError(f"weights must be a tensor or None, got {type(weights).__name__}")
    if weights is not None:
        _check_strided("weights", weights, "pass weights.to_dense()")
    edge_index, graph_nodes, weights = _resolve_source(graph_or_edge_index, weights)
    if edge_index is not None:
        _check_strided("edge_index", edge_index, _SPARSE_ADJACENCY_FIX)
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise _edge_index_shape_error(tuple(edge_index.shape))
        if edge_index.is_floating_point() or edge_index.is_complex() or edge_index.dtype == torch.bool:
            raise TypeError(f"edge_index must be an integer tensor, got dtype {edge_index.dtype}")
        edge_index = edge_index.long()
    if num_nodes is not None:
        num_nodes = check_int("num_nodes", num_nodes, 1)
        if graph_nodes is not None and num_nodes != graph_nodes:
            raise ValueError(f"num_nodes={num_nodes} disagrees with the graph's {graph_nodes} nodes")
    N = graph_nodes if graph_nodes is not None else num_nodes

    w = None
    if weights is not None:
        edge_index, w2, dense_nodes = _edge_weights(edge_index, weights.detach(), N)
        if dense_nodes > 0:
            N = dense_nodes
        w = _reduce_heads(w2, head).double().cpu()
    elif threshold is not None or top_k is not None:
        raise ValueError("threshold and top_k filter by weight: pass weights (or intermediates with attn_weights)")
    if edge_index is None:
        raise ValueError("no edges: pass an edge_index, a graph or sparse intermediates")
    edge_index = edge_index.cpu()
    if N is None:
        N = int(edge_index.max()) + 1 if edge_index.numel() else 0
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= N):
        raise ValueError(f"edge_index values must lie in [0, num_nodes={N}), got range "
                         f"[{int(edge_index.min())}, {int(edge_index.max())}]")

    if w is not None:
        keep = torch.ones(w.shape[0], dtype=torch.bool)
        if threshold is not None:
            if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
                raise TypeError(f"threshold must be a number, got {type(threshold).__name__}")
            if threshold != threshold:  # no weight is > NaN: an empty graph, silently
                raise ValueError(f"threshold must not be NaN, got {threshold!r}")
            keep &= w > _float_threshold(threshold)
        if top_k is not None:
            top_k = check_int("top_k", top_k, 1)
            keep &= _top_k_per_target(w, edge_index[1], top_k)
        edge_index, w = edge_index[:, keep], w[keep]

    G = nx.DiGraph()
    G.add_nodes_from(range(N))
    src, dst = edge_index.tolist()
    if w is None:
        G.add_edges_from(zip(src, dst))
    else:
        G.add_weighted_edges_from(zip(src, dst, w.tolist()))
    return G


def grid_layout(h: int, w: int, *, cls_token: bool = False) -> dict[int, tuple[float, float]]:
    """Drawing positions of the tokens of :func:`~diffusionformer.graph.grid` (row-major, row 0 on top).

    Patch ``(r, c)`` is drawn at ``(c, -r)``; a class token (node 0) sits left of the top row.

    Examples:
        >>> grid_layout(1, 2, cls_token=True)
        {0: (-1.5, 0.0), 1: (0.0, 0.0), 2: (1.0, 0.0)}
    """
    h, w = check_int("h", h, 1), check_int("w", w, 1)
    _check_flag(cls_token, "cls_token")
    off = 1 if cls_token else 0
    pos = {n + off: (float(n % w), float(-(n // w))) for n in range(h * w)}
    if cls_token:
        pos = {0: (-1.5, 0.0), **pos}
    return pos


def draw_attention_graph(
    G: "nx.DiGraph",
    ax: "Axes | None" = None,
    pos: Mapping[Any, Any] | Tensor | None = None,
    *,
    cmap: str = "viridis",
    node_size: float = 120.0,
    with_labels: bool = True,
    **kwargs: Any,
) -> "Axes":
    """Draw an attention graph from :func:`to_networkx`: edge width and colour follow ``weight``.

    Args:
        G: the graph (edges without ``weight`` count as 1).
        ax: matplotlib axes (default ``plt.gca()``).
        pos: node positions: a dict ``node -> (x, y)`` (e.g. :func:`grid_layout`) or an
            ``(N, 2)`` tensor; default a seeded spring layout.
        cmap: colormap of the edge weights.
        node_size: marker size of the nodes.
        with_labels: draw node ids.
        **kwargs: passed to :func:`networkx.draw_networkx`.

    Returns:
        the axes drawn on.

    Raises:
        ImportError: without matplotlib (install the ``plot`` extra).
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        from diffusionformer._imports import matplotlib_error

        raise matplotlib_error(
            err,
            "draw_attention_graph needs matplotlib; install the `plot` extra: pip install 'diffusionformer[plot]'",
            "draw_attention_graph needs",
        ) from err
    import networkx as nx

    if not isinstance(G, nx.Graph):
        raise TypeError(f"G must be a networkx graph, got {type(G).__name__}")
    _check_flag(with_labels, "with_labels")  # "no" is truthy: labels drawn where none were asked for
    weights = [float(d.get("weight", 1.0)) for _, _, d in G.edges(data=True)]
    bad = [(u, v) for (u, v), x in zip(G.edges(), weights) if not math.isfinite(x)]
    if bad:  # a NaN width or colour fails deep inside matplotlib's arrow drawing (StopIteration)
        raise ValueError(f"G has {len(bad)} edges with a NaN or infinite weight, e.g. {bad[0]}: remove them first "
                         "(G.remove_edges_from(...)), or export with to_networkx(..., threshold=...), which drops NaN")
    if pos is None:
        pos = nx.spring_layout(G, seed=0)
    elif isinstance(pos, Tensor):
        if pos.dim() != 2 or pos.shape != (G.number_of_nodes(), 2):
            raise ValueError(f"pos must have shape (N, 2) = ({G.number_of_nodes()}, 2), got {tuple(pos.shape)}")
        pos = {n: tuple(p) for n, p in zip(G.nodes, pos.tolist())}
    elif not isinstance(pos, Mapping):  # `n in array` tests values: "no position for nodes [0, 1, ...]"
        raise TypeError(f"pos must be a dict node -> (x, y) or an (N, 2) tensor, got {type(pos).__name__}")
    missing = [n for n in G.nodes if n not in pos]
    if missing:
        raise ValueError(f"pos has no position for nodes {missing[:5]}")
    edge_cmap = _cmap(cmap)
    top = max((abs(x) for x in weights), default=1.0) or 1.0
    widths = [0.5 + 2.5 * abs(x) / top for x in weights]
    created = None  # the pyplot figure made here for ax=None: closed again if the drawing fails
    if ax is None:  # after the checks: a refused pos or cmap left an empty pyplot figure open
        import matplotlib.pyplot as plt

        before = set(plt.get_fignums())
        ax = plt.gca()
        created = ax.figure if ax.figure.number not in before else None
    try:
        nx.draw_networkx(
            G, pos=pos, ax=ax, width=widths, edge_color=weights if weights else "k", edge_cmap=edge_cmap,
            node_size=node_size, with_labels=with_labels, arrows=True, **kwargs,
        )
    except BaseException:
        if created is not None:
            plt.close(created)
        raise
    ax.set_axis_off()
    return ax


def _cmap(name: str) -> Any:
    import matplotlib

    return matplotlib.colormaps[name]
