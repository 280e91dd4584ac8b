r"""Graphs from PyTorch Geometric and networkx objects."""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import torch
from torch import Tensor

from diffusionformer._imports import _import_pyg
from diffusionformer.config import _device_argument, _value_type
from diffusionformer.graph._checks import check_int, check_layout
from diffusionformer.graph.core import (
    _SPARSE_ADJACENCY_FIX,
    AttentionGraph,
    _check_index_tensor,
    _check_strided,
    _edge_index_shape_error,
)
from diffusionformer.ops._checks import check_index_range

__all__ = ["from_edge_index", "from_networkx", "from_pyg"]


def _check_not_meta(edge_index: Tensor, self_loops: bool) -> None:
    """PyG's self-loop surgery reads the edges: on the meta device a ``ValueError`` (else torch's NotImplementedError
    of ``nonzero``, which names neither the self loops nor the device)."""
    if edge_index.device.type == "meta":
        raise ValueError(f"self_loops={self_loops} needs the values of edge_index, which is on the meta device: "
                         "add or remove the self loops on a real device")


def _set_self_loops(edge_index: Tensor, num_nodes: int, self_loops: bool | None) -> Tensor:
    _import_pyg()
    from torch_geometric.utils import add_self_loops, remove_self_loops

    if not isinstance(edge_index, Tensor):  # before PyG reads it
        raise TypeError(f"edge_index must be an integer tensor of shape (2, E), got {type(edge_index).__name__}")
    _check_strided("edge_index", edge_index, _SPARSE_ADJACENCY_FIX)  # before the shape check: an (N, N) adjacency
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:  # PyG would read a (2,) or (3, E) tensor as edges
        raise _edge_index_shape_error(tuple(edge_index.shape))
    if self_loops is None:
        return edge_index
    if not isinstance(self_loops, bool):
        raise TypeError(f"self_loops must be None (keep the graph's), True or False, got {_value_type(self_loops)} "
                        f"({self_loops!r})")
    # the dtype before PyG's surgery: its concatenation with the int64 self loops turned a bool tensor (a mask
    # taken for edges, refused without self_loops) into int64 edges
    edge_index = _check_index_tensor("edge_index", edge_index, "(2, E)")
    _check_not_meta(edge_index, self_loops)
    # the bounds before the surgery (CPU eager only, as the kernel's check): remove_self_loops dropped a self loop
    # out of range ((N, N), (-1, -1)) silently, and the error on another bad edge showed the added loops' range
    check_index_range("edge_index", edge_index, "num_nodes", num_nodes)
    edge_index, _ = remove_self_loops(edge_index)
    if self_loops:
        edge_index, _ = add_self_loops(edge_index, num_nodes=num_nodes)
    return edge_index


def from_edge_index(
    edge_index: Tensor,
    num_nodes: int,
    *,
    batch: Tensor | None = None,
    self_loops: bool | None = None,
    checked: bool = True,
) -> AttentionGraph:
    r"""The sparse graph of a PyG ``edge_index`` over ``num_nodes`` nodes: ``i`` attends to ``j`` iff ``j -> i`` is an edge.

    Args:
        edge_index: ``(source j, target i)`` pairs.
        num_nodes: ``N``.
        batch: graph of every node (``(N,)``), as in a PyG ``Batch``.
        self_loops: ``None`` keeps the edges as they are; ``True`` gives every node exactly one
            self loop (:func:`~torch_geometric.utils.remove_self_loops` then
            :func:`~torch_geometric.utils.add_self_loops`); ``False`` removes them. Either way the
            edges are first checked against ``num_nodes`` (in eager mode on CPU, ``checked`` or not),
            so a self loop out of range is refused, not removed.
        checked: ``False`` leaves the bounds check (a host synchronisation) to the kernel, which
            runs it once per call (see :class:`AttentionGraph`); models that build a graph per
            batch use it.

    Examples:
        >>> from_edge_index(torch.tensor([[0, 1], [1, 0]]), 3, self_loops=True).edge_index
        tensor([[0, 1, 0, 1, 2],
                [1, 0, 0, 1, 2]])
    """
    num_nodes = check_int("num_nodes", num_nodes, 1)  # numpy ints too; AttentionGraph asks the same of it
    edge_index = _set_self_loops(edge_index, num_nodes, self_loops)
    return AttentionGraph.sparse(edge_index, num_nodes, batch=batch, checked=checked)


def from_pyg(data: Any, *, self_loops: bool | None = None, layout: str = "sparse") -> AttentionGraph:
    r"""The graph of a PyG ``Data`` or ``Batch``: node ``i`` attends to ``j`` iff ``j -> i`` is in ``data.edge_index``.

    A ``Batch`` is block-diagonal by construction (its ``batch`` vector is kept, and edges
    across graphs are rejected), so graphs never attend to each other.
    Only the structure is read: ``edge_weight``, ``edge_attr`` and the other attributes of
    ``data`` are not part of an attention graph (edge features go to a model built with
    ``edge_dim``, as ``edge_attr=``).

    Args:
        data: a :class:`torch_geometric.data.Data` or :class:`~torch_geometric.data.Batch`
            (``edge_index``, ``num_nodes`` and, for a batch, ``batch``).
        self_loops: ``None`` keeps the edges as they are; ``True`` gives every node exactly one
            self loop (:func:`~torch_geometric.utils.remove_self_loops` then
            :func:`~torch_geometric.utils.add_self_loops`); ``False`` removes them (the edges are
            first checked against ``num_nodes`` in eager mode on CPU, as :func:`from_edge_index`
            checks them: a self loop out of range is refused, not removed).
        layout: ``"sparse"`` or ``"dense"`` (:meth:`AttentionGraph.to_dense`: ``x`` goes through
            :func:`torch_geometric.utils.to_dense_batch`).

    Examples:
        >>> from torch_geometric.data import Data
        >>> g = from_pyg(Data(edge_index=torch.tensor([[0, 1], [1, 0]]), num_nodes=3), self_loops=True)
        >>> g.edge_index
        tensor([[0, 1, 0, 1, 2],
                [1, 0, 0, 1, 2]])
    """
    _import_pyg()
    from torch_geometric.data import Data, HeteroData

    if isinstance(data, HeteroData):  # one edge_index per edge type, node ids per node type: no single graph
        raise TypeError("data must be a torch_geometric.data.Data or Batch, got HeteroData: merge its node and edge "
                        "types with data.to_homogeneous(), or pick one edge type with "
                        "from_edge_index(data[edge_type].edge_index, num_nodes)")
    if not isinstance(data, Data):
        raise TypeError(f"data must be a torch_geometric.data.Data or Batch, got {type(data).__name__}")
    check_layout(layout)
    if getattr(data, "edge_index", None) is None:
        if getattr(data, "adj_t", None) is not None:  # the ToSparseTensor layout: adj_t[target, source]
            raise ValueError("data has no edge_index but an adj_t (the ToSparseTensor layout); convert it back with "
                             "data.edge_index = torch_geometric.utils.to_edge_index(data.adj_t)[0].flip(0)")
        raise ValueError("data has no edge_index")
    N = data.num_nodes
    if N is None:
        raise ValueError("data.num_nodes is unknown (no x, no num_nodes); set data.num_nodes")
    batch = getattr(data, "batch", None)
    num_graphs = getattr(data, "num_graphs", None) if batch is not None else None
    edge_index = _set_self_loops(data.edge_index, int(N), self_loops)
    g = AttentionGraph.sparse(edge_index, int(N), batch=batch, batch_size=num_graphs)
    return g if layout == "sparse" else g.to_dense()


def from_networkx(
    G: Any,
    *,
    self_loops: bool | None = None,
    nodelist: Sequence[Hashable] | None = None,
    layout: str = "sparse",
    device: torch.device | str | None = None,
) -> AttentionGraph:
    r"""The graph of a networkx graph: the edge ``u -> v`` lets ``v`` attend to ``u``.

    Node ``n`` of the result is ``list(G.nodes)[n]`` (the graph's insertion order, as in
    :func:`torch_geometric.utils.from_networkx`) unless ``nodelist`` gives another order.
    An undirected edge ``{u, v}`` becomes both ``u -> v`` and ``v -> u``; parallel edges of a
    multigraph become one edge. Edges keep ``G.edges`` order. Edge and node attributes (a
    ``weight`` included) are not read: an attention graph is the structure only.

    Args:
        G: a ``networkx`` ``Graph``, ``DiGraph``, ``MultiGraph`` or ``MultiDiGraph``.
        self_loops: ``None`` keeps ``G``'s self loops; ``True`` gives every node one; ``False``
            removes them.
        nodelist: the node order (a permutation of ``G.nodes``).
        layout: ``"sparse"`` or ``"dense"`` (one sequence, ``allowed`` ``(N, N)``).
        device: where the graph's tensors live.

    Examples:
        >>> import networkx as nx
        >>> from_networkx(nx.path_graph(3)).edge_index
        tensor([[0, 1, 1, 2],
                [1, 0, 2, 1]])
        >>> from_networkx(nx.DiGraph([("a", "b")]), self_loops=True).edge_index
        tensor([[0, 0, 1],
                [1, 0, 1]])
    """
    import networkx as nx

    if not isinstance(G, nx.Graph):
        raise TypeError(f"G must be a networkx graph, got {type(G).__name__}")
    check_layout(layout)
    if device is not None:  # else "cdua" is torch's RuntimeError listing every device type it knows
        device = _device_argument("device", device)
    nodes = list(G.nodes) if nodelist is None else list(nodelist)
    if len(nodes) != G.number_of_nodes() or set(nodes) != set(G.nodes):
        raise ValueError(f"nodelist must be a permutation of G's {G.number_of_nodes()} nodes, got {len(nodes)} "
                         "entries that differ from G.nodes")
    if not nodes:
        raise ValueError("G has no nodes")
    index = {n: i for i, n in enumerate(nodes)}
    pairs: dict[tuple[int, int], None] = {}
    for u, v in G.edges():
        pairs[(index[u], index[v])] = None
        if not G.is_directed():
            pairs[(index[v], index[u])] = None
    edge_index = torch.tensor(list(pairs), dtype=torch.long, device=device).reshape(-1, 2).t().contiguous()
    edge_index = _set_self_loops(edge_index, len(nodes), self_loops)
    g = AttentionGraph.sparse(edge_index, len(nodes))
    return g if layout == "sparse" else g.to_dense()
