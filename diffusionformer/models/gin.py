r"""A GIN baseline (Xu et al., "How Powerful are Graph Neural Networks?", ICLR 2019) for graph classification."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch  # noqa: F401  (doctests)
import torch.nn.functional as F
from torch import Tensor, nn

from diffusionformer._imports import _import_pyg
from diffusionformer.config import _python_numbers, document_fields
from diffusionformer.nn._weights import _reset_children, _stored_weight
from diffusionformer.models.common import (_check_block_diagonal, _check_bools, _check_graph_call, _check_graph_devices,
                                           _check_graph_task, _check_node_features, _check_real_features, _conv_edges,
                                           _readout_batch, check_positive_int, check_probability)

__all__ = ["GIN", "GINConfig"]


@document_fields
@dataclass
class GINConfig:
    """Configuration of :class:`GIN` (defaults: the paper's graph-classification setup, GIN-0)."""

    in_channels: int = 16  #: node feature width F
    num_classes: int = 2  #: output classes
    task: Literal["node", "graph"] = "graph"  #: graph classification (readout) or node classification
    hidden: int = 64  #: hidden width
    num_layers: int = 5  #: layers counting the input one (num_layers - 1 GIN convolutions)
    dropout: float = 0.5  #: dropout before every prediction head
    pool: Literal["mean", "add", "max"] = "add"  #: graph readout (the paper: sum)
    train_eps: bool = False  #: learn epsilon (GIN-eps) instead of fixing it at 0 (GIN-0)

    def __post_init__(self) -> None:
        _python_numbers(self)  # a sweep grid's numpy numbers are read as Python numbers
        check_positive_int("GINConfig", in_channels=self.in_channels, num_classes=self.num_classes, hidden=self.hidden,
                           num_layers=self.num_layers)
        if self.num_layers < 2:
            raise ValueError(f"GINConfig.num_layers must be >= 2 (input layer + at least one convolution), got {self.num_layers}")
        check_probability("GINConfig", dropout=self.dropout)
        _check_graph_task("GINConfig", self.task, self.pool)
        _check_bools("GINConfig", train_eps=self.train_eps)


class GIN(nn.Module):
    r"""Graph isomorphism network :math:`h^{l+1}_v = \mathrm{MLP}^l\big((1+\epsilon) h^l_v + \sum_{u \in N(v)} h^l_u\big)`.

    Each MLP has two linear layers with batch normalisation and ReLU; every layer's
    representation (the input one included) is read out, mapped to class scores by its own
    linear head after dropout, and the scores are summed, as in the paper. The paper reports
    76.2 ± 2.8% (PROTEINS) and 89.4 ± 5.6% (MUTAG) by 10-fold cross-validation. Called as
    :class:`~diffusionformer.models.DiffusionGraphTransformer` is: ``(x, edge_index, batch)`` and the
    keyword ``num_graphs`` (the graph transformer's other keywords are its own).

    Shapes:
        ``x``: ``(N, F)``, ``edge_index``: ``(2, E)``, ``batch``: ``(N,)`` -> ``(G, C)`` or ``(N, C)``.
        An edge ``(j, i)`` of ``edge_index`` sends node ``j``'s features to node ``i`` (PyG's source-to-target
        order): pass both directions for an undirected graph.

    Examples:
        >>> model = GIN(GINConfig(in_channels=3, num_classes=2)).eval()
        >>> model(torch.randn(5, 3), torch.tensor([[0, 1, 3], [1, 2, 4]]), torch.tensor([0, 0, 0, 1, 1])).shape
        torch.Size([2, 2])
    """

    def __init__(self, config: GINConfig) -> None:
        super().__init__()
        if not isinstance(config, GINConfig):
            raise TypeError(f"config must be a GINConfig, got {type(config).__name__}")
        _import_pyg()
        from torch_geometric.nn import GINConv

        self.config = c = config
        dims = [c.in_channels] + [c.hidden] * (c.num_layers - 1)
        self.convs = nn.ModuleList(
            GINConv(nn.Sequential(nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU(), nn.Linear(b, b), nn.BatchNorm1d(b), nn.ReLU()),
                    train_eps=c.train_eps)
            for a, b in zip(dims[:-1], dims[1:])
        )
        self.heads = nn.ModuleList(nn.Linear(d, c.num_classes) for d in dims)

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
        # GIN-0 keeps epsilon at 0 in a buffer, which a GIN-eps model's state dict overwrote without a word: the
        # model then ran with the other model's learned epsilon; refused before any weight is written
        if not self.config.train_eps:
            for i in range(len(self.convs)):
                eps = state_dict.get(f"{prefix}convs.{i}.eps")
                if isinstance(eps, Tensor) and eps.device.type != "meta" and bool((eps != 0).any()):
                    raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}: {prefix}convs.{i}.eps "
                                       f"is fixed at 0 (train_eps=False, GIN-0), but the state dict holds "
                                       f"{eps.flatten().tolist()} (the weights of a train_eps=True model?)")
        super()._load_from_state_dict(state_dict, prefix, *args)

    def reset_parameters(self) -> None:
        """Initialise every parameter again, in place: each PyG convolution's ``reset_parameters`` (PyG's
        initialisation: its MLP's, the batch-norm statistics cleared, epsilon back to 0), then the heads'."""
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
        holds the sources of target ``i``: the transpose of the adjacency); its values weight the sum over the
        neighbours (a weighted GIN: :math:`(1 + \\epsilon) x_i + \\sum_j a_{ij} x_j`).
        """
        if edge_index is None or not isinstance(x, Tensor):  # model(data): how to call it (free for tensors)
            _check_graph_call(self, x, edge_index)
        c = self.config
        _check_node_features(x, c.in_channels)
        _check_real_features(x=x)
        _check_graph_devices(x, edge_index=edge_index, batch=batch)
        dtype = _stored_weight(self.heads[0], owner=self).dtype  # a quantized head: the model's
        edge_index = _conv_edges(edge_index, x.shape[0], dtype)
        one_graph = batch is None  # no edge can cross graphs: nothing to check
        batch, num_graphs = _readout_batch(batch, num_graphs, x.shape[0], x.device)
        _check_block_diagonal(edge_index, None if one_graph else batch)
        batch = batch.long()  # int32 ids pass the check, but PyG's pools scatter with int64 indices
        x = x.to(dtype)  # as the graph transformer reads its x: float64 or int features, float32 model
        hs = [x]
        for conv in self.convs:
            hs.append(conv(hs[-1], edge_index))
        if c.task == "graph":
            _import_pyg()
            from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool

            pool: Any = {"mean": global_mean_pool, "add": global_add_pool, "max": global_max_pool}[c.pool]
            hs = [pool(h, batch, size=num_graphs) for h in hs]
        return sum(head(F.dropout(h, c.dropout, self.training)) for head, h in zip(self.heads, hs))  # type: ignore[return-value]
