r"""A GCN baseline (Kipf & Welling, ICLR 2017) run through the same data path as the graph transformer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch  # noqa: F401  (doctests)
import torch.nn.functional as F
from torch import Tensor, nn

from diffusionformer._imports import _import_pyg
from diffusionformer.config import _python_numbers, document_fields
from diffusionformer.nn._weights import _reset_children, _stored_weight
from diffusionformer.models.common import (_check_block_diagonal, _check_graph_call, _check_graph_devices,
                                           _check_graph_task, _check_node_features, _check_real_features, _conv_edges,
                                           _readout_batch, check_positive_int, check_probability)

__all__ = ["GCN", "GCNConfig"]


@document_fields
@dataclass
class GCNConfig:
    """Configuration of :class:`GCN` (defaults: PyG's Planetoid example, 2 layers, 16 hidden, dropout 0.5)."""

    in_channels: int = 16  #: node feature width F
    num_classes: int = 2  #: output classes
    task: Literal["node", "graph"] = "node"  #: node or graph classification
    hidden: int = 16  #: hidden width
    num_layers: int = 2  #: GCN layers
    dropout: float = 0.5  #: dropout on the input of every layer
    pool: Literal["mean", "add", "max"] = "mean"  #: graph readout for task="graph"

    def __post_init__(self) -> None:
        _python_numbers(self)  # a sweep grid's numpy numbers are read as Python numbers
        check_positive_int("GCNConfig", in_channels=self.in_channels, num_classes=self.num_classes, hidden=self.hidden,
                           num_layers=self.num_layers)
        check_probability("GCNConfig", dropout=self.dropout)
        _check_graph_task("GCNConfig", self.task, self.pool)


class GCN(nn.Module):
    r"""Graph convolutional network :math:`H^{l+1} = \sigma(\hat D^{-1/2} \hat A \hat D^{-1/2} H^l W^l)`.

    The reference baseline for node classification: PyG's example reaches about 81.5% test
    accuracy on Cora's public split. Called as
    :class:`~diffusionformer.models.DiffusionGraphTransformer` is: ``(x, edge_index, batch)`` and the
    keyword ``num_graphs`` (the graph transformer's other keywords are its own).

    Shapes:
        ``x``: ``(N, F)``, ``edge_index``: ``(2, E)``, ``batch``: ``(N,)`` -> ``(N, C)`` or ``(G, C)``.
        An edge ``(j, i)`` of ``edge_index`` sends node ``j``'s features to node ``i`` (PyG's source-to-target
        order): pass both directions for an undirected graph.

    :math:`\hat A` is ``A`` with a self-loop of weight 1 on every node (PyG's
    ``add_remaining_self_loops``): a node that already has a self-loop in ``edge_index`` keeps
    weight 1 there, not 2; repeated edges add up.

    Examples:
        >>> GCN(GCNConfig(in_channels=3, num_classes=2))(torch.randn(4, 3), torch.tensor([[0, 1], [1, 2]])).shape
        torch.Size([4, 2])
    """

    def __init__(self, config: GCNConfig) -> None:
        super().__init__()
        if not isinstance(config, GCNConfig):
            raise TypeError(f"config must be a GCNConfig, got {type(config).__name__}")
        _import_pyg()
        from torch_geometric.nn import GCNConv

        self.config = c = config
        dims = [c.in_channels] + [c.hidden] * (c.num_layers - 1) + [c.hidden if c.task == "graph" else c.num_classes]
        self.convs = nn.ModuleList(GCNConv(a, b, cached=False) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(c.hidden, c.num_classes) if c.task == "graph" else nn.Identity()

    def reset_parameters(self) -> None:
        """Initialise every parameter again, in place: each PyG convolution's ``reset_parameters`` (PyG's
        initialisation), then the readout head's (graph tasks)."""
        _reset_children(self, type(self).__name__)

    def forward(self, x: Tensor, edge_index: Tensor | None = None, batch: Tensor | None = None, *,
                num_graphs: int | None = None) -> Tensor:
        """Node logits ``(N, C)`` or graph logits ``(G, C)``, from a graph's tensors as PyG's models take them:
        ``model(data.x, data.edge_index, data.batch)`` (``edge_index`` is required; ``model(data)`` or a call without
        it is a ``TypeError`` saying so).

        ``num_graphs``: the number of graphs ``G`` of a graph readout (PyG's ``data.num_graphs``; may exceed
        ``batch.max() + 1``, the extra graphs being empty), instead of ``batch.max() + 1``; checked and
        otherwise unused for node tasks, as in :class:`~diffusionformer.models.DiffusionGraphTransformer`.
        ``edge_index`` may also be a torch sparse adjacency ``(N, N)``, which PyG reads as ``adj_t`` (row ``i``
        holds the sources of target ``i``: the transpose of the adjacency); its values weight the edges, and PyG
        adds 1 to every diagonal entry (``add_self_loops``: a self loop already there gets weight 2, not 1).
        """
        if edge_index is None or not isinstance(x, Tensor):  # model(data): how to call it (free for tensors)
            _check_graph_call(self, x, edge_index)
        c = self.config
        _check_node_features(x, c.in_channels)
        _check_real_features(x=x)
        _check_graph_devices(x, edge_index=edge_index, batch=batch)
        dtype = _stored_weight(self.convs[0].lin, owner=self).dtype  # a parameter-free lin: the model's
        edge_index = _conv_edges(edge_index, x.shape[0], dtype)
        one_graph = batch is None  # no edge can cross graphs: nothing to check
        batch, num_graphs = _readout_batch(batch, num_graphs, x.shape[0], x.device)
        _check_block_diagonal(edge_index, None if one_graph else batch)
        batch = batch.long()  # int32 ids pass the check, but PyG's pools scatter with int64 indices
        x = x.to(dtype)  # as the graph transformer reads its x: float64 or int features, float32 model
        for i, conv in enumerate(self.convs):
            x = F.dropout(x, c.dropout, self.training)
            x = conv(x, edge_index)
            if i < len(self.convs) - 1 or c.task == "graph":
                x = F.relu(x)
        if c.task == "graph":
            _import_pyg()
            from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool

            pool: Any = {"mean": global_mean_pool, "add": global_add_pool, "max": global_max_pool}[c.pool]
            x = pool(x, batch, size=num_graphs)
        return self.head(x)
