r"""``DiffusionGraphTransformer``: sparse diffusion attention over a graph's edges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool
from torch_geometric.utils import to_dense_batch

from diffusionformer.config import document_fields
from diffusionformer.graph.core import AttentionGraph
from diffusionformer.graph.interop import from_edge_index
from diffusionformer.nn.attention import DiffusionAttention
from diffusionformer.nn.block import DropPath, Mlp, make_norm, resolve_layer_heads
from diffusionformer.ops.rivals import LayerState
from diffusionformer.models.common import ModelIntermediates, check_positive, check_probability, init_transformer_weights

__all__ = ["DiffusionGraphTransformer", "GraphBlock", "GraphTransformerConfig"]


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
    heads: Any = None  #: head spec for every layer, a per-layer list, or {layer: spec}
    laplacian_heads: int | list[int] | None = None  #: trailing Laplacian heads per layer

    def __post_init__(self) -> None:
        check_positive("GraphTransformerConfig", in_channels=self.in_channels, num_classes=self.num_classes,
                       dim=self.dim, depth=self.depth, num_heads=self.num_heads, mlp_ratio=self.mlp_ratio)
        check_probability("GraphTransformerConfig", dropout=self.dropout, attn_dropout=self.attn_dropout,
                          input_dropout=self.input_dropout)
        if self.task not in ("node", "graph"):
            raise ValueError(f"GraphTransformerConfig.task must be 'node' or 'graph', got {self.task!r}")
        if self.pool not in ("mean", "add", "max"):
            raise ValueError(f"GraphTransformerConfig.pool must be 'mean', 'add' or 'max', got {self.pool!r}")
        if self.dim % self.num_heads:
            raise ValueError(f"GraphTransformerConfig: num_heads={self.num_heads} must divide dim={self.dim}")
        resolve_layer_heads(self.depth, self.num_heads, self.heads, self.laplacian_heads)


class GraphBlock(nn.Module):
    r"""Pre-norm block on a graph: sparse diffusion attention over edges (+ optional global attention).

    .. math::
        x \leftarrow x + \mathrm{Attn}_{E}(\mathrm{Norm}(x)) [+ \mathrm{Attn}_{global}(\mathrm{Norm}(x))],
        \qquad x \leftarrow x + \mathrm{MLP}(\mathrm{Norm}(x))

    The graph is an :class:`~diffusionformer.graph.AttentionGraph` (built once per batch by
    :class:`DiffusionGraphTransformer`) or a bare ``edge_index``.

    ``state`` and ``global_state`` are the :class:`~diffusionformer.ops.rivals.LayerState` of the
    edge-attention stack and of the global-attention stack of the model (the first layer's
    values and the depth, for the rival operators that read them).

    Shapes:
        ``x``: ``(N, D)``, ``graph``: a sparse graph over ``N`` nodes or ``edge_index`` ``(2, E)``,
        ``batch``: ``(N,)`` -> ``(N, D)``.
    """

    def __init__(self, dim: int, num_heads: int, heads: Any = None, *, mlp_ratio: float = 2.0, dropout: float = 0.0,
                 attn_dropout: float = 0.0, global_attention: bool = False, norm_layer: str = "layernorm") -> None:
        super().__init__()
        self.norm1 = make_norm(norm_layer, dim)
        self.attn = DiffusionAttention(dim, num_heads, heads, dropout=attn_dropout)
        self.global_attn = DiffusionAttention(dim, num_heads, heads, dropout=attn_dropout) if global_attention else None
        self.drop = nn.Dropout(dropout)
        self.norm2 = make_norm(norm_layer, dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dropout=dropout)

    def forward(self, x: Tensor, graph: AttentionGraph | Tensor, batch: Tensor | None = None,
                state: LayerState | None = None, global_state: LayerState | None = None) -> Tensor:
        if isinstance(graph, Tensor):
            graph = AttentionGraph.sparse(graph, x.shape[0], batch=batch, checked=False)
        if batch is None:
            batch = graph.batch
        h = self.norm1(x)
        update = self.attn(h, graph, state=state)
        if self.global_attn is not None:
            dense, mask = to_dense_batch(h, batch)  # (G, Nmax, D), (G, Nmax)
            g = self.global_attn(dense, key_padding_mask=~mask, state=global_state)
            update = update + g[mask]
        x = x + self.drop(update)
        return x + self.mlp(self.norm2(x))


class DiffusionGraphTransformer(nn.Module):
    r"""Graph transformer whose heads diffuse over the graph's edges.

    Node features are embedded, ``L`` :class:`GraphBlock` s attend over incoming edges (plus a
    self loop per node) with the configured head operators, and a linear head classifies
    nodes (``task="node"``) or pooled graphs (``task="graph"``). Node-permutation equivariant
    (graph outputs invariant).

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
    """

    def __init__(self, config: GraphTransformerConfig) -> None:
        super().__init__()
        if not isinstance(config, GraphTransformerConfig):
            raise TypeError(f"config must be a GraphTransformerConfig, got {type(config).__name__}")
        self.config = c = config
        specs = resolve_layer_heads(c.depth, c.num_heads, c.heads, c.laplacian_heads)
        self.input_drop = nn.Dropout(c.input_dropout)
        self.embed = nn.Linear(c.in_channels, c.dim)
        self.blocks = nn.ModuleList(
            GraphBlock(c.dim, c.num_heads, spec, mlp_ratio=c.mlp_ratio, dropout=c.dropout, attn_dropout=c.attn_dropout,
                       global_attention=c.global_attention, norm_layer=c.norm)
            for spec in specs
        )
        self.norm = make_norm(c.norm, c.dim)
        self.head = nn.Linear(c.dim, c.num_classes)
        init_transformer_weights(self, c.depth)


    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None, *,
                return_intermediates: bool = False) -> Any:
        """Node or graph logits (plus :class:`ModelIntermediates` when asked)."""
        c = self.config
        if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[1] != c.in_channels:
            raise ValueError(f"x must have shape (N, in_channels={c.in_channels}), got {tuple(getattr(x, 'shape', ()))}")
        N = x.shape[0]
        if batch is not None and (batch.dim() != 1 or batch.shape[0] != N):
            raise ValueError(f"batch must have shape (N,) = ({N},), got {tuple(batch.shape)}")
        if c.task == "graph" and batch is None:
            batch = torch.zeros(N, dtype=torch.long, device=x.device)
        # the graph is built once per batch by the builder; its edge_index is checked by the kernel
        graph = from_edge_index(edge_index, N, batch=batch, self_loops=True if c.self_loops else None, checked=False)
        h = self.embed(self.input_drop(x.to(self.embed.weight.dtype)))
        inter = ModelIntermediates(embeddings=h) if return_intermediates else None
        state, global_state = LayerState(), LayerState()  # one per attention stack (local edges, global)
        for block in self.blocks:
            h = block(h, graph, batch, state=state, global_state=global_state)
            if inter is not None:
                inter.hidden_states.append(h)
        h = self.norm(h)
        if c.task == "graph":
            pool = {"mean": global_mean_pool, "add": global_add_pool, "max": global_max_pool}[c.pool]
            h = pool(h, batch)
        out = self.head(h)
        return (out, inter) if inter is not None else out
