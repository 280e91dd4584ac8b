r"""``DiffusionGraphTransformer``: sparse diffusion attention over a graph's edges."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from diffusionformer._imports import _import_pyg, _lazy_exports
from diffusionformer.config import _check_flag, _choice_hint, _python_numbers, document_fields
from diffusionformer.graph.core import AttentionGraph, _check_index_tensor, _edge_index_shape_error
from diffusionformer.graph.interop import _check_not_meta, from_edge_index
from diffusionformer.nn.attention import DiffusionAttention, _not_a_tensor
from diffusionformer.nn._weights import _reset_children, _stored_weight
from diffusionformer.nn.block import make_mlp, make_norm, resolve_layer_heads
from diffusionformer.nn.heads import _layout_as_read, _own_operators
from diffusionformer.nn.edge_features import _check_edge_operators, edge_feature_attention
from diffusionformer.ops._checks import _vmapped, check_index_range, checks_values
from diffusionformer.ops.rivals import LayerState
from diffusionformer.models.common import (ModelIntermediates, _check_batch, _check_block_options, _check_bools,
                                           _check_graph_call, _check_graph_devices, _check_graph_task, _check_mlp_ratio,
                                           _check_num_graphs, _check_node_features, _check_real_features, _check_size,
                                           check_positive_int, check_probability, init_transformer_weights)

__all__ = ["DiffusionGraphTransformer", "GraphBlock", "GraphTransformerConfig", "positional_encoding_transform"]

_PE_KINDS = (None, "laplacian", "random_walk")


@document_fields
@dataclass
class GraphTransformerConfig:
    """Configuration of :class:`DiffusionGraphTransformer`."""

    in_channels: int = 16  #: node feature width F
    num_classes: int = 2  #: output classes
    task: Literal["node", "graph"] = "node"  #: node classification or graph classification (pooling)
    dim: int = 64  #: width D
    depth: int = 2  #: number of blocks L
    num_heads: int = 4  #: heads per layer H
    mlp_ratio: float = 2.0  #: MLP hidden width / D
    dropout: float = 0.0  #: dropout on residual branches
    attn_dropout: float = 0.0  #: dropout on edge attention weights
    input_dropout: float = 0.0  #: dropout on input features
    self_loops: bool = True  #: every node also attends to itself
    global_attention: bool = False  #: add dense attention over all nodes of the same graph (GraphGPS style)
    pool: Literal["mean", "add", "max"] = "mean"  #: graph readout for task="graph"
    norm: str = "layernorm"  #: "layernorm" or "rmsnorm"
    heads: Any = None  #: head spec for every layer, a per-layer list, or {layer: spec}; an operator is copied per layer
    laplacian_heads: int | str | list[int | str] | None = None  #: trailing Laplacian heads per layer; "half": H // 2
    edge_dim: int | None = None  #: edge feature width; edge features enter the scores (TransformerConv's edge_dim)
    pe: str | None = None  #: positional encoding passed as ``pe=``: None, "laplacian" or "random_walk"
    pe_dim: int = 8  #: width of the positional encoding (eigenvectors k, or walk length)
    pe_sign_flip: bool = True  #: random sign flip of each Laplacian eigenvector in training
    mlp: str = "gelu"  #: MLP: "gelu", "swiglu" (gated SiLU) or "geglu"; gated ones 2/3 as wide (about the same parameters)

    def __post_init__(self) -> None:
        _python_numbers(self)  # a sweep grid's numpy numbers are read as Python numbers
        check_positive_int("GraphTransformerConfig", in_channels=self.in_channels, num_classes=self.num_classes,
                           dim=self.dim, depth=self.depth, num_heads=self.num_heads)
        _check_mlp_ratio("GraphTransformerConfig", self.dim, self.mlp_ratio)
        self.norm, self.mlp = _check_block_options("GraphTransformerConfig", norm=self.norm, mlp=self.mlp)
        _check_bools("GraphTransformerConfig", self_loops=self.self_loops, global_attention=self.global_attention,
                     pe_sign_flip=self.pe_sign_flip)
        check_probability("GraphTransformerConfig", dropout=self.dropout, attn_dropout=self.attn_dropout,
                          input_dropout=self.input_dropout)
        _check_graph_task("GraphTransformerConfig", self.task, self.pool)
        if self.dim % self.num_heads:
            raise ValueError(f"GraphTransformerConfig: num_heads={self.num_heads} must divide dim={self.dim}")
        resolve_layer_heads(self.depth, self.num_heads, self.heads, self.laplacian_heads)
        self.heads = _layout_as_read(self.heads)  # recorded as read, as norm and mlp: one spelling of one layout
        if self.edge_dim is not None:
            check_positive_int("GraphTransformerConfig", edge_dim=self.edge_dim)
        if self.pe not in _PE_KINDS:
            raise ValueError(f"GraphTransformerConfig.pe: expected one of {_PE_KINDS}, got {self.pe!r}"
                             f"{_choice_hint(self.pe, _PE_KINDS)}")
        check_positive_int("GraphTransformerConfig", pe_dim=self.pe_dim)


def positional_encoding_transform(config: GraphTransformerConfig, attr_name: str = "pe") -> Any:
    """The PyG transform that adds the positional encoding ``config.pe`` expects, as ``data.pe``.

    ``"laplacian"``: :class:`~torch_geometric.transforms.AddLaplacianEigenvectorPE` with
    ``k = pe_dim`` (the eigenvectors of the ``k`` smallest non-trivial eigenvalues of the
    normalised Laplacian; Dwivedi et al., "Benchmarking GNNs", JMLR 2023); their signs are
    arbitrary, so the model flips each one at random in training (``pe_sign_flip``), while the
    transform fixes them (each eigenvector's first entry of largest magnitude positive): the same
    graph always gets the same PE, and the transform draws no random number. A graph
    of ``N <= k`` nodes has ``N - 1`` of them: the other columns are zero (as GraphGPS pads
    them), so graphs of every size batch together. A graph of several components has the eigenvalue 0 once
    per component, and each of its eigenvectors takes a column: up to 2000 nodes such a graph goes to the dense
    solver (PyG's ARPACK, which it uses from 100 nodes on, missed some of them; beyond 2000 nodes it still may).
    The graph must be undirected (each edge in
    both directions, with equal weights) and alone (not a ``Batch`` of several graphs, whose
    eigenvectors would mix them): else a ``ValueError``.
    ``"random_walk"``: :class:`~torch_geometric.transforms.AddRandomWalkPE` with
    ``walk_length = pe_dim`` (the return probabilities of 1..k-step random walks; Dwivedi et
    al., "Graph Neural Networks with Learnable Structural and Positional Representations",
    ICLR 2022), sign-free; a repeated edge counts as often as it is listed, at every size, and
    an ``edge_weight`` ``w`` is the step's weight: probability ``w / (sum of the source's weights)``.
    An ``edge_weight`` (either PE) must be an ``(E,)`` tensor of finite, non-negative weights (else a
    ``ValueError``); integer weights are read as floats.

    Args:
        config: the model config (``pe`` and ``pe_dim``).
        attr_name: the ``Data`` attribute to write.

    Raises:
        TypeError: ``config`` is not a :class:`GraphTransformerConfig` (a model's is ``model.config``).
        ValueError: ``config.pe`` is neither ``"laplacian"`` nor ``"random_walk"``.

    Examples:
        >>> from torch_geometric.data import Data
        >>> cfg = GraphTransformerConfig(in_channels=1, pe="random_walk", pe_dim=3)
        >>> ring = Data(edge_index=torch.tensor([[0, 1, 2, 1, 2, 0], [1, 2, 0, 0, 1, 2]]), num_nodes=3)
        >>> positional_encoding_transform(cfg)(ring).pe[0]   # return after 1, 2, 3 steps on a triangle
        tensor([0.0000, 0.5000, 0.2500])
    """
    from diffusionformer.models._graph_pe import _LaplacianPE, _RandomWalkPE

    if not isinstance(config, GraphTransformerConfig):  # else "'str' object has no attribute 'pe'"
        hint = (" (the model's is model.config)" if isinstance(getattr(config, "config", None), GraphTransformerConfig)
                else f" with pe={config!r}" if isinstance(config, str) else "")
        raise TypeError(f"positional_encoding_transform: expected a GraphTransformerConfig{hint}, got "
                        f"{type(config).__name__}")
    if config.pe == "laplacian":
        return _LaplacianPE(config.pe_dim, attr_name=attr_name, is_undirected=True)
    if config.pe == "random_walk":
        return _RandomWalkPE(config.pe_dim, attr_name=attr_name)
    raise ValueError(f"positional_encoding_transform: expected config.pe 'laplacian' or 'random_walk', got {config.pe!r}")


# The PE transforms subclass PyG's: they live in ``_graph_pe`` (imported on first use, so that ``import
# diffusionformer.models`` does not import PyG); their old names here still resolve (PEP 562), for references
# and pickles by this module's path.
__getattr__ = _lazy_exports(__name__, {name: "diffusionformer.models._graph_pe"
                                       for name in ("_LaplacianPE", "_RandomWalkPE")})[0]


def _check_sorted_batch(batch: Tensor) -> None:
    """A ``ValueError`` unless the graph ids of ``batch`` are non-decreasing (reads values: call under ``checks_values``)."""
    if batch.shape[0] > 1 and bool((batch[1:] < batch[:-1]).any()):
        raise ValueError("batch: expected sorted graph ids (the nodes of each graph contiguous, as in a "
                         "PyG Batch), got an unsorted batch")


def _check_global_ids(batch: Tensor, num_graphs: int | None) -> None:
    """The graph ids of ``batch`` for the global attention: in ``[0, num_graphs)`` (non-negative when ``num_graphs``
    is ``None``) and sorted (reads values: call under ``checks_values``)."""
    if batch.shape[0]:
        lo, hi = int(batch.min()), int(batch.max())
        if num_graphs is None and lo < 0:
            raise ValueError(f"batch: expected non-negative graph ids, got min {lo}")
        if num_graphs is not None and not (0 <= lo and hi < num_graphs):
            raise ValueError(f"batch: expected graph ids in [0, num_graphs={num_graphs}), got ids in [{lo}, {hi}]")
    _check_sorted_batch(batch)


def _check_same_batch(batch: Tensor, own: Tensor) -> None:
    """``batch`` beside a graph that has its own (``own``): the same graph ids, else a ``ValueError`` (reads values:
    only under ``checks_values``, so on an accelerator or under :func:`torch.compile` a mismatch passes unchecked)."""
    if checks_values(batch) and checks_values(own) and not torch.equal(batch, own):  # (False for another shape)
        raise ValueError(f"GraphBlock: batch differs from the graph's own batch (the local attention reads the "
                         f"graph's, the global attention batch): got batch of shape {tuple(batch.shape)} beside the "
                         f"graph's {tuple(own.shape)}; pass the graph's batch or batch=None")


def _check_edge_attr(edge_attr: Tensor, edge_index: Any, edge_dim: int) -> Tensor:
    """``edge_attr`` a real tensor of shape ``(E, edge_dim)``, ``E`` read from ``edge_index``, whose form is checked
    first (else a list ``edge_index`` was an ``AttributeError`` and an ``(E, 2)`` one an error about ``edge_attr``);
    returns ``edge_index`` as int64 (an unsigned one failed in PyG's self-loop surgery: "Promotion for uint16 ...")."""
    e = _check_index_tensor("edge_index", edge_index, "(2, E)")
    if e.dim() != 2 or e.shape[0] != 2:
        raise _edge_index_shape_error(tuple(e.shape))
    if not isinstance(edge_attr, Tensor):
        raise TypeError(f"edge_attr: expected a Tensor of shape (E, edge_dim), got {type(edge_attr).__name__}")
    if edge_attr.shape != (e.shape[1], edge_dim):
        raise ValueError(f"edge_attr: expected shape (E, edge_dim) = ({e.shape[1]}, {edge_dim}), "
                         f"got {tuple(edge_attr.shape)}")
    _check_real_features(edge_attr=edge_attr)  # a cast to the block's dtype dropped the imaginary part
    return e


def _node_positions(batch: Tensor, num_graphs: int) -> tuple[Tensor, Tensor]:
    r"""The position of every node in its graph and the node count of every graph, read from no host value.

    .. math::
        n_g = \#\{i : b_i = g\}, \qquad \mathrm{ptr}_g = \sum_{g' < g} n_{g'}, \qquad
        \mathrm{pos}_i = i - \mathrm{ptr}_{b_i}

    for a sorted ``batch`` (the nodes of each graph contiguous, as in a PyG ``Batch``): node ``i``
    is row ``pos_i`` of its graph's block in :func:`~torch_geometric.utils.to_dense_batch`'s
    layout. Every shape is fixed by ``N`` and ``num_graphs`` (a scatter-add, not ``bincount``,
    whose length depends on the values).

    Shapes:
        ``batch``: ``(N,)`` -> ``pos``: ``(N,)``, ``counts``: ``(num_graphs,)``.
    """
    counts = torch.zeros(num_graphs, dtype=batch.dtype, device=batch.device).scatter_add_(
        0, batch, torch.ones_like(batch))
    ptr = torch.cumsum(counts, 0) - counts  # first node of every graph
    return torch.arange(batch.shape[0], device=batch.device) - ptr[batch], counts


class GraphBlock(nn.Module):
    r"""Pre-norm block on a graph: sparse diffusion attention over edges (+ optional global attention).

    .. math::
        x \leftarrow x + \mathrm{Attn}_{E}(\mathrm{Norm}(x)) [+ \mathrm{Attn}_{global}(\mathrm{Norm}(x))],
        \qquad x \leftarrow x + \mathrm{MLP}(\mathrm{Norm}(x))

    The graph is an :class:`~diffusionformer.graph.AttentionGraph` (built once per batch by
    :class:`DiffusionGraphTransformer`) or a bare ``edge_index``. Beside a graph with its own ``batch``, the
    ``batch`` argument (the global attention's graph ids) must hold the same ids, or be ``None`` to take the graph's:
    another is a ``ValueError`` in eager mode on CPU (unchecked elsewhere, as the other checks of ``batch`` below).

    ``edge_attr`` (for a block built with ``edge_dim``) enters the edge scores through
    :func:`~diffusionformer.nn.edge_features.edge_feature_attention` (polynomial operators only).
    Row ``e`` of ``edge_attr`` belongs to column ``e`` of the graph's ``edge_index``: a graph built
    with ``self_loops=True`` or ``False`` has its edges reordered (self loops removed, then appended),
    so build it with ``self_loops=None`` from edges already in the order of the features, or let
    :class:`DiffusionGraphTransformer` add the self loops with their features.
    ``state`` and ``global_state`` are the :class:`~diffusionformer.ops.rivals.LayerState` of the
    edge-attention stack and of the global-attention stack of the model (the first layer's
    values and the depth, for the rival operators that read them).

    Global attention pads the nodes of every graph into ``(G, N_max, D)`` (nodes ``(N, D)`` of a sparse graph or an
    ``edge_index``: a dense graph is a ``ValueError``). Without sizes,
    :func:`~torch_geometric.utils.to_dense_batch` reads ``G`` and ``N_max`` from ``batch`` and a
    boolean index gathers the nodes back (a host synchronisation on an accelerator, a
    data-dependent shape under :func:`torch.compile`). With ``max_num_nodes`` (and
    ``num_graphs``) given, node ``i`` goes to row ``pos_i = i - ptr_{b_i}`` of graph ``b_i``
    and comes back by the same index, so every shape is fixed by the call's Python ints: no
    host read, and ``torch.compile(fullgraph=True)`` captures it. The padded keys are masked,
    so the result equals the inferred-size one (to rounding, exactly for the same ``N_max``).
    With or without sizes, ``batch`` must be sorted (the nodes of each graph contiguous, as in a
    PyG ``Batch``): in eager mode on CPU (where value checks run, see
    :func:`~diffusionformer.ops._checks.checks_values`) an unsorted ``batch`` is a
    ``ValueError``; on an accelerator or under :func:`torch.compile` it is not checked (no host
    read) and the global-attention output would mix graphs, so sort the nodes first. A graph
    with more than ``max_num_nodes`` nodes is likewise a ``ValueError`` in eager mode on CPU;
    elsewhere its node's index is out of range (an indexing error, never a silently dropped node).

    The MLP is ``mlp_layer``'s (:func:`~diffusionformer.nn.make_mlp`: ``"gelu"``, ``"swiglu"`` or ``"geglu"``).

    Shapes:
        ``x``: ``(N, D)``, ``graph``: a sparse graph over ``N`` nodes or ``edge_index`` ``(2, E)``,
        ``batch``: ``(N,)`` -> ``(N, D)``.
    """

    def __init__(self, dim: int, num_heads: int, heads: Any = None, *, mlp_ratio: float = 2.0, dropout: float = 0.0,
                 attn_dropout: float = 0.0, global_attention: bool = False, norm_layer: str = "layernorm",
                 edge_dim: int | None = None, mlp_layer: str = "gelu") -> None:
        super().__init__()
        _check_flag(global_attention, "GraphBlock: global_attention")
        _check_mlp_ratio("GraphBlock", dim, mlp_ratio)
        if edge_dim is not None:  # as the config checks it: True built a 1-wide W_e, 0 one that reads nothing
            if isinstance(edge_dim, numbers.Integral) and not isinstance(edge_dim, bool):
                edge_dim = int(edge_dim)  # a numpy int from a sweep
            check_positive_int("GraphBlock", edge_dim=edge_dim)
        self.norm1 = make_norm(norm_layer, dim)
        self.attn = DiffusionAttention(dim, num_heads, heads, dropout=attn_dropout)
        # W_e of the edge features in the scores (TransformerConv's lin_edge); see nn/edge_features.py
        self.edge_proj = nn.Linear(edge_dim, dim, bias=False) if edge_dim is not None else None
        if edge_dim is not None:  # refused when the model is built (a config check), not at its first forward
            _check_edge_operators(self.attn, "GraphBlock(edge_dim=...)")
        self.global_attn = DiffusionAttention(dim, num_heads, heads, dropout=attn_dropout) if global_attention else None
        if global_attention:  # its forward's to_dense_batch: imported here, not under the first compiled call
            _import_pyg()
        self.drop = nn.Dropout(dropout)
        self.norm2 = make_norm(norm_layer, dim)
        self.mlp = make_mlp(mlp_layer, dim, mlp_ratio, dropout=dropout)

    def reset_parameters(self) -> None:
        """Initialise the block's parameters again, in place, as its constructor did (each part's own
        ``reset_parameters``, in construction order)."""
        _reset_children(self, type(self).__name__)

    def forward(self, x: Tensor, graph: AttentionGraph | Tensor, batch: Tensor | None = None,
                edge_attr: Tensor | None = None, state: LayerState | None = None,
                global_state: LayerState | None = None, *, max_num_nodes: int | None = None,
                num_graphs: int | None = None) -> Tensor:
        if not isinstance(x, Tensor):  # else "'tuple' object has no attribute 'dim'"
            raise _not_a_tensor(x, "GraphBlock: ")
        if x.dim() == 0 or x.shape[-1] != self.attn.dim:  # else the norm's bare "Given normalized_shape=[8],
            # expected input with shape [*, 8]", naming neither the block nor dim (a 0-d x: an IndexError)
            raise ValueError(f"GraphBlock: x must have last dimension dim={self.attn.dim}, got shape {tuple(x.shape)}")
        if isinstance(graph, Tensor) and x.dim() != 2:  # an edge_index's graph takes its node count from x: of
            # another rank, "batch must have shape (num_nodes,) = (1,), got (5,)" blamed a right batch
            raise ValueError(f"GraphBlock: beside an edge_index, x must be the nodes, of shape (num_nodes, D), got "
                             f"shape {tuple(x.shape)}")
        if not isinstance(graph, (Tensor, AttentionGraph)):  # else "'list' object has no attribute 'batch'"
            raise TypeError(f"GraphBlock: graph must be an AttentionGraph or an edge_index tensor of shape (2, E), "
                            f"got {type(graph).__name__}")
        if isinstance(batch, Tensor) and (batch.is_floating_point() or batch.is_complex()):
            # a PyG conv's edge_weight passed third (conv(x, edge_index, edge_weight)): the model's error, naming batch
            # as the third argument (other integer dtypes stay the graph's to check: it takes them)
            _check_batch(batch, x.shape[0] if x.dim() else 0)
        if batch is not None:  # int64 ids, as the graph reads an int16 or uint8 batch: the global attention's
            # scatters failed on them with torch's bare "scatter(): Expected dtype int32/int64 for index" (and a list
            # beside an AttentionGraph with "'list' object has no attribute 'shape'")
            batch = _check_index_tensor("batch", batch, "(num_nodes,)")
        # no node: an AttentionGraph needs one ("num_nodes must be >= 1", an argument the call never gave); the edges
        # go to the layers as edge_index, which map no node to none and check them
        no_nodes = isinstance(graph, Tensor) and x.dim() == 2 and x.shape[0] == 0
        if isinstance(graph, Tensor) and not no_nodes:
            graph = AttentionGraph.sparse(graph, x.shape[0], batch=batch, checked=False)
        if self.global_attn is not None and not no_nodes and graph.layout != "sparse":
            # else to_dense_batch made (1, B, N, D) of the (B, N, D) tokens: "dense input x must have shape (B, N, D),
            # got (1, ...)", from a layer the call never named
            raise ValueError("GraphBlock: global attention pads the nodes of each graph of a sparse graph (its batch), "
                             f"got a {graph.layout} AttentionGraph; pass nodes x of shape (N, D) with a sparse graph "
                             "or an edge_index, or build the block with global_attention=False")
        if self.global_attn is not None and isinstance(batch, Tensor) and x.dim() == 2:  # (N,), beside a graph that
            # checked its own ids (an edge_index's graph checked these): else torch's bare "The expanded size of the
            # tensor (5) must match the existing size (4)" from the padding (x of another rank: the graph names x)
            _check_batch(batch, x.shape[0])
        if batch is None and not no_nodes:
            batch = graph.batch
        elif isinstance(graph, AttentionGraph) and graph.batch is not None and batch is not graph.batch:
            _check_same_batch(batch, graph.batch)  # else the local attention read the graph's, the global one batch
        if self.global_attn is not None and batch is not None and batch.shape[0] and checks_values(batch):
            # the global attention's graph ids, checked once and before the local attention, which refuses the edges
            # across graphs that bad ids (out of range, unsorted) make of block-diagonal edges: these errors name the
            # cause (a call without batch is one graph, its ids made below)
            sized = not (max_num_nodes is None and num_graphs is None)
            G = _check_size("num_graphs", num_graphs) if sized else None
            _check_global_ids(batch, (int(batch.max()) + 1 if G is None else G) if sized else None)
        h = self.norm1(x)
        if self.edge_proj is None and edge_attr is not None:  # else the edge features were dropped without a word
            raise ValueError("GraphBlock: got edge_attr, but the block was built without edge_dim (its edge features "
                             "would be ignored); build it with edge_dim=edge_attr.shape[1]")
        if self.edge_proj is not None:
            if edge_attr is None:
                raise ValueError("GraphBlock: expected edge_attr (the block was built with edge_dim), got None")
            if not no_nodes and graph.layout != "sparse":  # else a TypeError about an edge_index never passed
                raise ValueError("GraphBlock: edge_attr needs a sparse graph (its edge_index orders the edge features), "
                                 f"got a {graph.layout} AttentionGraph")
            # through attention_kwargs, as the layer takes a graph: the checks an unchecked graph (a bare edge_index)
            # defers to the call (bounds, no edge across the graphs of batch) ran there; read directly, an edge
            # between two graphs was attended over without a word
            edge_index = graph if no_nodes else graph.attention_kwargs(h)["edge_index"]
            _check_edge_attr(edge_attr, edge_index, self.edge_proj.in_features)
            _check_graph_devices(x, edge_attr=edge_attr)  # else an error about edge_keys, never passed
            update = edge_feature_attention(self.attn, h, edge_index, self.edge_proj(edge_attr.to(h.dtype)))
        else:
            update = self.attn(h, edge_index=graph, state=state) if no_nodes else self.attn(h, graph, state=state)
        if self.global_attn is not None:
            # (the graph ids were checked above: g[mask] returns nodes in sorted-id order, pos_i = i - ptr_{b_i}
            # holds for sorted ids only)
            # sizes read from batch (host syncs); under torch.vmap the out-of-place gather of _global_sized (to_dense_batch
            # writes the batched features into an unbatched zero tensor in place, which vmap refuses)
            # (_vmapped is not read while compiling, as in ops.dense: dynamo cannot trace functorch's C check and
            # broke the graph there at every compiled call)
            if (max_num_nodes is None and num_graphs is None and not no_nodes
                    and (torch.compiler.is_compiling() or not _vmapped(h))):
                _import_pyg()
                from torch_geometric.utils import to_dense_batch

                dense, mask = to_dense_batch(h, batch)  # (G, Nmax, D), (G, Nmax)
                g = self.global_attn(dense, key_padding_mask=~mask, state=global_state)
                update = update + g[mask]
            else:
                update = update + self._global_sized(h, batch, max_num_nodes, num_graphs, global_state)
        x = x + self.drop(update)
        return x + self.mlp(self.norm2(x))

    def _global_sized(self, h: Tensor, batch: Tensor | None, max_num_nodes: int | None, num_graphs: int | None,
                      global_state: LayerState | None) -> Tensor:
        """Global attention in the ``(G, M, D)`` layout of the given sizes, gathered back by index (no boolean mask)."""
        max_num_nodes = _check_size("max_num_nodes", max_num_nodes)
        num_graphs = _check_size("num_graphs", num_graphs)
        N, D = h.shape
        if batch is None:  # one graph
            if num_graphs not in (None, 1):
                raise ValueError(f"num_graphs: a call without batch holds one graph, got num_graphs={num_graphs}")
            batch = torch.zeros(N, dtype=torch.long, device=h.device)
        G = num_graphs if num_graphs is not None else int(batch.max()) + 1 if N else 1  # host read if not given
        pos, counts = _node_positions(batch, G)  # (N,), (G,)
        M = max_num_nodes if max_num_nodes is not None else max(int(counts.max()), 1)  # host read if not given
        if checks_values(counts) and int(counts.max()) > M:
            g = int(counts.argmax())
            raise ValueError(f"max_num_nodes: graph {g} has {int(counts[g])} nodes, more than "
                             f"max_num_nodes={M}; expected max_num_nodes >= the largest graph's node count")
        dense = h.new_zeros(G, M, D).index_put((batch, pos), h)  # (G, M, D); pos >= M is an index error
        padding = torch.arange(M, device=h.device) >= counts.unsqueeze(1)  # (G, M): True where no node
        g = self.global_attn(dense, key_padding_mask=padding, state=global_state)
        return g[batch, pos]  # (N, D)


class DiffusionGraphTransformer(nn.Module):
    r"""Graph transformer whose heads diffuse over the graph's edges.

    Node features are embedded, ``L`` :class:`GraphBlock` s attend over incoming edges (plus a
    self loop per node) with the configured head operators, and a linear head classifies
    nodes (``task="node"``) or pooled graphs (``task="graph"``). Node-permutation equivariant
    (graph outputs invariant).

    With ``global_attention=True`` (GraphGPS style) every node also attends to all nodes of its
    graph, padded per graph. Give the padded size ``max_num_nodes`` and ``num_graphs`` to
    ``forward`` and the padding, the gather back and the graph readout take their shapes from
    these Python ints instead of from ``batch`` (the same result, no host read of ``batch``),
    which ``torch.compile(model, fullgraph=True)`` needs to capture one graph without
    data-dependent shapes. (With ``self_loops=True`` the edges' self-loop normalisation,
    :func:`~torch_geometric.utils.remove_self_loops`, is still a boolean mask: captured by the
    compiler, but a ``nonzero``.)

    Args:
        config: a :class:`GraphTransformerConfig`.

    Shapes:
        ``x``: ``(N, F)``, ``edge_index``: ``(2, E)``, ``batch``: ``(N,)`` (graph task, or global
        attention over a batch) -> ``(N, num_classes)`` or ``(num_graphs, num_classes)``.

    Examples:
        >>> cfg = GraphTransformerConfig(in_channels=3, num_classes=2, dim=8, num_heads=2, laplacian_heads=1)
        >>> model = DiffusionGraphTransformer(cfg)
        >>> model(torch.randn(5, 3), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])).shape
        torch.Size([5, 2])
        >>> gps = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, dim=8, num_heads=2, task="graph",
        ...                                                        global_attention=True))
        >>> batch = torch.tensor([0, 0, 0, 1, 1])  # two graphs of 3 and 2 nodes
        >>> gps(torch.randn(5, 3), torch.tensor([[0, 1, 3], [1, 2, 4]]), batch, max_num_nodes=4, num_graphs=2).shape
        torch.Size([2, 2])
    """

    def __init__(self, config: GraphTransformerConfig) -> None:
        super().__init__()
        if not isinstance(config, GraphTransformerConfig):
            raise TypeError(f"config must be a GraphTransformerConfig, got {type(config).__name__}")
        self.config = c = config
        if c.self_loops or c.task == "graph":
            # the forward's self loops and graph pool are PyG's: imported now, not inside the first call (under
            # torch.compile dynamo traced PyG's import: a graph break and warnings of typing's lru_cache)
            _import_pyg()
        specs = _own_operators(resolve_layer_heads(c.depth, c.num_heads, c.heads, c.laplacian_heads))
        self.input_drop = nn.Dropout(c.input_dropout)
        self.embed = nn.Linear(c.in_channels, c.dim)
        self.pe_embed = nn.Linear(c.pe_dim, c.dim) if c.pe is not None else None
        self.blocks = nn.ModuleList(
            GraphBlock(c.dim, c.num_heads, spec, mlp_ratio=c.mlp_ratio, dropout=c.dropout, attn_dropout=c.attn_dropout,
                       global_attention=c.global_attention, norm_layer=c.norm, edge_dim=c.edge_dim, mlp_layer=c.mlp)
            for spec in specs
        )
        self.norm = make_norm(c.norm, c.dim)
        self.head = nn.Linear(c.dim, c.num_classes)
        init_transformer_weights(self, c.depth)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise every parameter again, in place, as the constructor did: each part's own
        ``reset_parameters`` in construction order, then :func:`init_transformer_weights`; under one seed the
        values of a model built anew."""
        _reset_children(self, type(self).__name__)
        init_transformer_weights(self, self.config.depth)

    def _prepare_edges(self, edge_index: Tensor, num_nodes: int, edge_attr: Tensor) -> tuple[Tensor, Tensor]:
        """Self loops (with zero edge features) as :func:`~diffusionformer.graph.from_edge_index` sets them."""
        if self.config.self_loops:
            _import_pyg()
            from torch_geometric.utils import add_self_loops, remove_self_loops

            # meta edges refused and the bounds checked before the surgery, as from_edge_index does (else torch's
            # NotImplementedError of nonzero on meta; an out-of-range self loop was removed silently)
            _check_not_meta(edge_index, True)
            check_index_range("edge_index", edge_index, "num_nodes", num_nodes)
            edge_index, edge_attr = remove_self_loops(edge_index, edge_attr)
            edge_index, edge_attr = add_self_loops(edge_index, edge_attr, fill_value=0.0, num_nodes=num_nodes)
        return edge_index, edge_attr

    def _no_nodes(self, x: Tensor, edge_index: Tensor, batch: Tensor | None, num_graphs: int | None,
                  return_intermediates: bool) -> Any:
        """The forward of a batch with no node: ``(0, num_classes)`` node logits, or the logits of
        ``num_graphs`` empty graphs (the head of a zero readout, as for an empty graph beside others)."""
        if not isinstance(edge_index, Tensor) or edge_index.shape != (2, 0):
            raise ValueError(f"edge_index: a batch with no node holds no edge, expected shape (2, 0), "
                             f"got {tuple(getattr(edge_index, 'shape', ()))}")
        h = self.embed(x.to(_stored_weight(self.embed, owner=self).dtype))  # (0, D)
        inter = ModelIntermediates(embeddings=h, hidden_states=[h] * len(self.blocks)) if return_intermediates else None
        out = self._readout(h, batch, num_graphs)  # num_graphs=None and no graph id: no graph
        return (out, inter) if inter is not None else out

    def _readout(self, h: Tensor, batch: Tensor | None, num_graphs: int | None) -> Tensor:
        """Logits from the last residual stream: norm, the graph pool (``task="graph"``), head."""
        h = self.norm(h)
        if self.config.task == "graph":
            _import_pyg()
            from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool

            pool = {"mean": global_mean_pool, "add": global_add_pool, "max": global_max_pool}[self.config.pool]
            h = pool(h, batch, num_graphs)  # num_graphs=None: batch.max() + 1 (a host read)
        return self.head(h)

    def forward(self, x: Tensor, edge_index: Tensor | None = None, batch: Tensor | None = None, *,
                edge_attr: Tensor | None = None, pe: Tensor | None = None,
                max_num_nodes: int | None = None, num_graphs: int | None = None,
                return_intermediates: bool = False) -> Any:
        """Node or graph logits (plus :class:`ModelIntermediates` when asked).

        Args:
            x: node features ``(N, F)``; ``N = 0`` (with ``(2, 0)`` edges) gives ``(0, num_classes)``
                node logits, or for ``task="graph"`` the logits of ``num_graphs`` empty graphs (none
                when neither ``batch`` nor ``num_graphs`` names one; one without ``batch``).
            edge_index: ``(2, E)`` edges ``(source j, target i)``; required (a call without it, or
                ``model(data)`` with a PyG ``Data``, is a ``TypeError`` naming
                ``model(data.x, data.edge_index, data.batch)``).
            batch: graph index per node ``(N,)``; sorted (as in a PyG ``Batch``) with global
                attention: a ``ValueError`` in eager mode on CPU, unchecked on an accelerator
                or under :func:`torch.compile`.
            edge_attr: edge features ``(E, edge_dim)`` (required when ``edge_dim`` is set). With
                ``self_loops``, the self loops given are replaced by one per node with zero
                features (as :class:`~torch_geometric.nn.conv.GATConv` with ``fill_value=0.0`` fills
                them; its default ``fill_value="mean"`` gives a loop the mean of the node's in-edge features).
            pe: positional encoding ``(N, pe_dim)`` (required when ``pe`` is set), e.g. from
                :func:`positional_encoding_transform`; added to the node embedding through a
                linear map. Laplacian eigenvectors get a random sign per column in training.
            max_num_nodes: an upper bound on the node count of every graph (e.g. the dataset's
                largest graph); global attention pads each graph to it instead of reading the
                largest graph's size from ``batch``. With ``num_graphs`` too, the forward
                compiles with ``fullgraph=True`` and, with ``self_loops=False``, reads no tensor
                value on the host (the self-loop normalisation of ``self_loops=True`` is a boolean
                mask, a ``nonzero``); the result equals the call without sizes. A larger graph is
                a ``ValueError`` (eager mode on CPU) or an indexing error, never dropped nodes.
            num_graphs: the number of graphs ``G`` in the batch (PyG's ``data.num_graphs``; may
                exceed ``batch.max() + 1``, the extra graphs being empty), for global attention
                and the graph readout instead of ``batch.max() + 1``.
            return_intermediates: also return the residual stream after every block.
        """
        c = self.config
        if edge_index is None or not isinstance(x, Tensor):  # model(data): how to call it (free for tensors)
            extra = "".join(f", {k}=data.{k}" for k, on in (("edge_attr", c.edge_dim), ("pe", c.pe)) if on)
            _check_graph_call(self, x, edge_index, extra)
        _check_flag(return_intermediates, "return_intermediates")
        _check_node_features(x, c.in_channels)
        N = x.shape[0]
        _check_graph_devices(x, edge_index=edge_index, batch=batch, edge_attr=edge_attr, pe=pe)
        _check_batch(batch, N)
        if batch is not None:  # int32 ids pass the check, but PyG's pools scatter with int64 indices
            batch = batch.long()
        max_num_nodes = _check_size("max_num_nodes", max_num_nodes)
        num_graphs = _check_num_graphs(batch, num_graphs)
        # eager CPU: the graph checks its edges (bounds, no edge across graphs); elsewhere the kernel
        # checks the bounds (no host synchronisation per batch)
        checked = isinstance(edge_index, Tensor) and checks_values(edge_index)
        if c.task == "graph" and batch is None:  # one graph (an empty one when N = 0)
            batch, num_graphs = torch.zeros(N, dtype=torch.long, device=x.device), 1 if N == 0 else num_graphs
        for name, value in (("edge_attr", edge_attr), ("pe", pe)):
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"{name}: expected a Tensor or None, got {type(value).__name__}")
        _check_real_features(x=x, edge_attr=edge_attr, pe=pe)
        if (c.edge_dim is None) != (edge_attr is None):
            raise ValueError(f"edge_attr: expected {'(E, edge_dim) edge features' if c.edge_dim else 'None'} "
                             f"(edge_dim={c.edge_dim}), got {None if edge_attr is None else tuple(edge_attr.shape)}")
        if edge_attr is not None:
            edge_index = _check_edge_attr(edge_attr, edge_index, c.edge_dim)
        if (c.pe is None) != (pe is None) or (pe is not None and pe.shape != (N, c.pe_dim)):
            raise ValueError(f"pe: expected {f'shape (N, pe_dim) = ({N}, {c.pe_dim})' if c.pe else 'None'} "
                             f"(pe={c.pe!r}), got {None if pe is None else tuple(pe.shape)}")
        if N == 0:  # no node to attend over (an attention graph has one at least): the blocks map nothing
            return self._no_nodes(x, edge_index, batch, num_graphs, return_intermediates)
        if edge_attr is None:
            graph = from_edge_index(edge_index, N, batch=batch, self_loops=True if c.self_loops else None,
                                    checked=checked)
        else:  # the edge features follow the edges (self loops get zero features)
            edges, edge_attr = self._prepare_edges(edge_index, N, edge_attr)
            graph = AttentionGraph.sparse(edges, N, batch=batch, checked=checked)
        h = self.embed(self.input_drop(x.to(_stored_weight(self.embed, owner=self).dtype)))
        if self.pe_embed is not None and pe is not None:
            pe = pe.to(h.dtype)
            if c.pe == "laplacian" and c.pe_sign_flip and self.training:  # eigenvector signs are arbitrary
                pe = pe * (torch.randint(0, 2, (1, c.pe_dim), device=pe.device) * 2 - 1).to(pe.dtype)
            h = h + self.pe_embed(pe)
        inter = ModelIntermediates(embeddings=h) if return_intermediates else None
        state, global_state = LayerState(), LayerState()  # one per attention stack (local edges, global)
        for block in self.blocks:
            h = block(h, graph, batch, edge_attr, state=state, global_state=global_state,
                      max_num_nodes=max_num_nodes, num_graphs=num_graphs)
            if inter is not None:
                inter.hidden_states.append(h)
        out = self._readout(h, batch, num_graphs)
        return (out, inter) if inter is not None else out
