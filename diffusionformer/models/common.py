"""Pieces shared by the model families: weight init, head specs, typed intermediates."""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from diffusionformer.config import _choice_hint, _value_type
from diffusionformer.graph._checks import check_within_graphs
from diffusionformer.nn.attention import DiffusionAttention, _node_types_text
from diffusionformer.nn.block import Block
from diffusionformer.operators import DiffusionOperator
from diffusionformer.ops._checks import checks_values
from diffusionformer.ops.sparse import check_edge_index

__all__ = ["ModelIntermediates", "check_positive", "check_positive_int", "init_transformer_weights", "learned_operator_parameters"]


@dataclass
class ModelIntermediates:
    """Per-layer states a model can return besides its output.

    Attributes:
        hidden_states: the residual stream after each block (``L`` tensors).
        embeddings: the residual stream entering the first block.
    """

    hidden_states: list[Tensor] = field(default_factory=list)
    embeddings: Tensor | None = None


def check_positive(where: str, **values: Any) -> None:
    """Every value a positive, finite int or float (for float fields: ``mlp_ratio``, temperatures); see
    :func:`check_positive_int`."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{where}.{name} must be positive, got {value!r}")
        if not math.isfinite(value):  # NaN passes ``<= 0``; an infinite temperature or ratio is no setting either
            raise ValueError(f"{where}.{name} must be a finite float, got {value!r}")


def check_positive_int(where: str, **values: Any) -> None:
    """Every value a positive int (sizes: widths, depths, counts): a float or bool is a ``TypeError``.

    Examples:
        >>> check_positive_int("GPTConfig", n_embd=128.0)
        Traceback (most recent call last):
        ...
        TypeError: GPTConfig.n_embd must be a positive int, got float 128.0
    """
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{where}.{name} must be a positive int, got {type(value).__name__} {value!r}")
        if value <= 0:
            raise ValueError(f"{where}.{name} must be a positive int, got {value!r}")
        if value > sys.maxsize:  # else "OverflowError: cannot fit 'int' into an index-sized integer", naming no field
            raise ValueError(f"{where}.{name} must be a positive int of at most {sys.maxsize} (a size that fits an "
                             f"index), got {value!r}")


def _check_graph_task(where: str, task: Any, pool: Any) -> None:
    """``task`` of a graph model (``"node"`` or ``"graph"``) and its readout ``pool``
    (``"mean"``, ``"add"`` or ``"max"``)."""
    if task not in ("node", "graph"):
        raise ValueError(f"{where}.task must be 'node' or 'graph', got {task!r}{_choice_hint(task, ('node', 'graph'))}")
    if pool not in ("mean", "add", "max"):
        raise ValueError(f"{where}.pool must be 'mean', 'add' or 'max', got {pool!r}"
                         f"{_choice_hint(pool, ('mean', 'add', 'max'))}")


def _check_size(name: str, value: object) -> int | None:
    """``max_num_nodes`` / ``num_graphs``: ``None`` or a positive integer (a shape, never a tensor; numpy ints
    too, returned as the Python int they equal, bools refused)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
        raise ValueError(f"{name}: expected None or a positive int, got {value!r}")
    return None if value is None else int(value)


def _check_num_graphs(batch: Tensor | None, num_graphs: Any) -> int | None:
    """``num_graphs`` of a graph model's forward against ``batch``: ``None`` or a positive int; one graph without
    ``batch``; with it, graph ids in ``[0, num_graphs)`` (non-negative when ``num_graphs`` is ``None``), read on
    the host in eager mode on CPU only, before any kernel reads them. Returns ``num_graphs`` as a Python int
    (or ``None``)."""
    num_graphs = _check_size("num_graphs", num_graphs)
    if batch is None:
        if num_graphs not in (None, 1):
            raise ValueError(f"num_graphs: a call without batch holds one graph, got num_graphs={num_graphs}")
        return num_graphs
    if batch.numel() and checks_values(batch):
        lo, hi = int(batch.min()), int(batch.max())
        if lo < 0 or (num_graphs is not None and hi >= num_graphs):
            want = "non-negative graph ids" if num_graphs is None else f"graph ids in [0, num_graphs={num_graphs})"
            raise ValueError(f"batch: expected {want}, got ids in [{lo}, {hi}]")
    return num_graphs


def _check_batch(batch: Any, num_nodes: int) -> None:
    """A graph model's ``batch``: ``None`` or integer graph ids of shape ``(N,)``. A floating-point one of shape
    ``(E,)`` is most likely PyG's ``edge_weight`` passed third, as ``GCNConv(x, edge_index, edge_weight)`` takes it:
    the error says so."""
    weights = (" (the third positional argument is batch, the graph id of each node: edge weights are not taken "
               "there; see the model's forward for how it takes weighted edges or edge features)"
               if isinstance(batch, Tensor) and (batch.is_floating_point() or batch.is_complex()) else "")
    if batch is not None and (not isinstance(batch, Tensor) or batch.dim() != 1 or batch.shape[0] != num_nodes):
        raise ValueError(f"batch must have shape (N,) = ({num_nodes},), got {tuple(getattr(batch, 'shape', ()))}"
                         f"{weights}")
    if batch is not None and batch.dtype not in (torch.int64, torch.int32):
        # (an int16 or uint8 batch read "must hold integer graph ids, got dtype torch.int16": it does)
        how = " (as int64: batch.long())" if not weights else weights
        raise TypeError(f"batch must hold integer graph ids of dtype torch.int64 or torch.int32, got dtype "
                        f"{batch.dtype}{how}")


def _sized_edge_index(edge_index: Tensor, num_nodes: int) -> Tensor:
    """A PyG ``EdgeIndex`` (checked, in bounds) with the sparse size ``(N, N)`` of the ``N`` rows of ``x``; other
    tensors as they are. PyG's message passing checks ``x`` against an EdgeIndex's sparse size: one sorted with
    ``sort_by`` (PyG infers ``(max + 1, None)``) or sized for fewer nodes (an isolated last node) failed in GIN with
    PyG's bare "Encountered tensor with size 6 in dimension -2, but expected size 5", where the plain edges run; one
    sized for more nodes than ``x`` has rows is a ``ValueError`` naming it. Sort order and symmetry are kept."""
    if "torch_geometric" not in sys.modules:  # (an EdgeIndex is PyG's: PyG is imported once one exists)
        return edge_index
    edge_index_cls = getattr(sys.modules["torch_geometric"], "EdgeIndex", None)  # PyG >= 2.5
    if edge_index_cls is None or not isinstance(edge_index, edge_index_cls):
        return edge_index
    size = tuple(edge_index.sparse_size())
    if any(s is not None and s > num_nodes for s in size):
        raise ValueError(f"edge_index: an EdgeIndex of sparse_size {size} describes more nodes than x has rows "
                         f"(N={num_nodes}); give x a row per node, or build the EdgeIndex with "
                         f"sparse_size=({num_nodes}, {num_nodes})")
    if size == (num_nodes, num_nodes):
        return edge_index
    return edge_index_cls(edge_index.as_tensor(), sparse_size=(num_nodes, num_nodes),
                          sort_order=edge_index.sort_order, is_undirected=edge_index.is_undirected)


def _conv_edges(edge_index: Any, num_nodes: int, dtype: torch.dtype) -> Any:
    """The edges of a GCN/GIN forward: an ``edge_index`` ``(2, E)`` checked (shape, dtype; bounds on CPU in eager
    mode); a torch sparse adjacency, which PyG's convolutions read as ``adj_t`` (row ``i`` lists the sources of target
    ``i``, the transpose of the adjacency), checked to be ``(N, N)`` (else a bare error from torch's matmul) in the
    COO, CSR or CSC layout, its values cast to the model's ``dtype`` (as ``x`` is; float32 values in a float64
    model, or integer ones, were a bare dtype error from torch's matmul), an uncoalesced COO one coalesced
    into a new tensor (PyG's ``to_edge_index`` flags its input coalesced in place, unsorted: the caller's
    tensor then gave a wrong ``to_sparse_csr()`` and wrong results in the next model) and a CSC one handed to PyG
    as CSR (GCN's ``gcn_norm`` raised ``NotImplementedError`` for CSC); other objects (a
    ``torch_sparse.SparseTensor``) passed to PyG as they are."""
    if isinstance(edge_index, Tensor) and edge_index.layout == torch.strided:
        return _sized_edge_index(check_edge_index(edge_index, num_nodes), num_nodes)
    if not isinstance(edge_index, Tensor):
        return edge_index
    if edge_index.layout not in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc):
        raise ValueError(f"edge_index: a sparse adjacency (adj_t) must have the layout torch.sparse_coo, "
                         f"torch.sparse_csr or torch.sparse_csc, got {edge_index.layout}")
    if tuple(edge_index.shape) != (num_nodes, num_nodes):
        raise ValueError(f"edge_index: a sparse adjacency (adj_t) must have shape (N, N) = ({num_nodes}, {num_nodes}), "
                         f"got {tuple(edge_index.shape)}")
    _check_real_features(edge_index=edge_index)  # its values weight the edges
    if edge_index.layout == torch.sparse_coo and not edge_index.is_coalesced():
        edge_index = edge_index.coalesce()
    elif edge_index.layout == torch.sparse_csc:  # the same matrix, in the layout gcn_norm takes
        edge_index = edge_index.to_sparse_csr()
    return edge_index.to(dtype)


def _check_block_diagonal(edge_index: Any, batch: Tensor | None) -> None:
    """The edges of a GCN/GIN forward (an ``edge_index`` or a torch sparse ``adj_t``, as :func:`_conv_edges` returns
    them) within the graphs of ``batch``: an edge between two graphs is a ``ValueError`` in eager mode on CPU, as
    the graph transformer's :class:`~diffusionformer.graph.AttentionGraph` refuses it (the convolutions mixed the
    graphs' features without a word, and the readout of each graph then read the other's nodes)."""
    if batch is None or not isinstance(edge_index, Tensor) or not checks_values(batch):
        return
    e = edge_index if edge_index.layout == torch.strided else edge_index.to_sparse_coo().coalesce().indices()
    if not e.numel() or checks_values(e):
        check_within_graphs(e, batch)


def _check_graph_call(model: nn.Module, x: Any, edge_index: Any, extra: str = "") -> None:
    """A graph model called with a PyG ``Data``/``Batch`` (``model(data)``), or with no ``edge_index``: a TypeError
    saying how to call it (Python's bare "missing 1 required positional argument: 'edge_index'" named neither).
    Called only where ``edge_index`` is None or ``x`` is no tensor (free for a call with tensors); returns otherwise.
    ``extra``: the model's other inputs from the batch, e.g. ``", edge_attr=data.edge_attr"``."""
    name = type(model).__name__
    call = f"model(data.x, data.edge_index, data.batch{extra})"
    if any(k.__module__.startswith("torch_geometric.data") for k in type(x).__mro__):  # no import of PyG
        merge = "merge its node and edge types with data.to_homogeneous(), then " if hasattr(x, "node_types") else ""
        raise TypeError(f"{name} takes the tensors of a graph, not a PyG {type(x).__name__}: {merge}call {call} "
                        "(the convention of PyG's own models, e.g. torch_geometric.nn.models.GCN)")
    if edge_index is None:
        raise TypeError(f"{name}: edge_index is required ((2, E) edges: source j, target i); call "
                        f"model(x, edge_index, batch), or with a PyG batch {call}")


def _check_node_features(x: Any, in_channels: int) -> None:
    """``x`` a ``(N, in_channels)`` tensor (a ValueError); a dict (a ``HeteroData``'s ``x_dict``) was reported as
    shape ``()``, naming neither its type nor what to do with several node types."""
    if isinstance(x, Tensor) and x.dim() == 2 and x.shape[1] == in_channels:
        return
    if isinstance(x, dict):
        raise ValueError(f"x must have shape (N, in_channels={in_channels}), got {_node_types_text(x)}: the model "
                         "runs on one node set; merge the node and edge types with data.to_homogeneous(), or pass one "
                         "node type's x and the edge_index of one edge type within it")
    got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
    raise ValueError(f"x must have shape (N, in_channels={in_channels}), got {got}")


def _check_real_features(**tensors: Any) -> None:
    """Every tensor among ``tensors`` (``x``, ``edge_attr``, ``pe``, a sparse adjacency; ``None`` and non-tensors
    skipped) real: a complex one is a ``TypeError`` naming it (the models' cast to their float dtype dropped its
    imaginary part with only a ``ComplexWarning``)."""
    for name, value in tensors.items():
        if isinstance(value, Tensor) and value.is_complex():
            raise TypeError(f"{name} must hold real values, got dtype {value.dtype} (a cast to the model's dtype "
                            f"would drop the imaginary part); pass its .real, .abs() or torch.view_as_real of it")


def _check_graph_devices(x: Tensor, **tensors: Any) -> None:
    """Every tensor among ``tensors`` (``edge_index``, ``batch``; ``None`` and non-tensors skipped) on ``x``'s
    device: else a ``ValueError`` naming it (a meta ``edge_index`` or ``batch`` on a CPU model failed inside
    ``torch.nonzero`` or ``Tensor.item``, with no word of which argument)."""
    for name, value in tensors.items():
        if isinstance(value, Tensor) and value.device != x.device:
            raise ValueError(f"{name} must be on x's device {x.device}, got {value.device}")


def _readout_batch(batch: Tensor | None, num_graphs: Any, num_nodes: int,
                   device: torch.device) -> tuple[Tensor, int | None]:
    """The graph id of every node for a GCN/GIN readout (zeros without ``batch``; its shape and dtype checked by
    :func:`_check_batch`) and ``num_graphs`` checked against it as the graph transformer checks it
    (:func:`_check_num_graphs`), as a Python int or ``None``; without ``batch``, 1 (one graph, an empty one when
    there is no node: read from the zeros, ``batch.max() + 1`` gave no graph at all)."""
    _check_batch(batch, num_nodes)
    num_graphs = _check_num_graphs(batch, num_graphs)
    if batch is None:
        return torch.zeros(num_nodes, dtype=torch.long, device=device), 1
    return batch, num_graphs


def _check_mlp_ratio(where: str, dim: int, mlp_ratio: Any) -> None:
    """``mlp_ratio`` positive, finite and large enough for an MLP hidden width ``int(dim * mlp_ratio) >= 1``
    (for a width of 0 :class:`~diffusionformer.nn.block.Mlp` names its ``hidden_dim``, which no config has)."""
    check_positive(where, mlp_ratio=mlp_ratio)  # positive and finite
    if int(dim * mlp_ratio) < 1:
        raise ValueError(f"{where}.mlp_ratio={mlp_ratio!r} gives an MLP hidden width int(dim * mlp_ratio) = "
                         f"{int(dim * mlp_ratio)} for dim={dim}; expected a width >= 1")


def _check_rope_base(where: str, value: Any) -> None:
    """A RoPE frequency base: a finite int or float > 1 (a base of 1 gives every position the same
    angle); else a ``ValueError`` naming ``<where>.rope_base``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 < value < math.inf:
        raise ValueError(f"{where}.rope_base: expected a finite float > 1, got {value!r}")


def _check_bools(where: str, **values: Any) -> None:
    """Every value a bool (a string such as ``"false"`` would be truthy): else a ``TypeError``."""
    for name, value in values.items():
        if not isinstance(value, bool):
            raise TypeError(f"{where}.{name}: expected bool, got {_value_type(value)} {value!r}")


_NORMS = ("layernorm", "rmsnorm")


def _check_block_options(where: str, *, norm: Any, backend: Any = "auto", layer_scale: Any = None,
                         mlp: Any = "gelu") -> tuple[str, str]:
    """A config's ``norm`` (``"layernorm"``/``"rmsnorm"``) and ``mlp`` (``"gelu"``/``"swiglu"``/``"geglu"``),
    ``_``/``-`` and case ignored as :func:`~diffusionformer.nn.block.make_norm` and
    :func:`~diffusionformer.nn.block.make_mlp` read them, ``backend`` (one of ``DENSE_BACKENDS``) and
    ``layer_scale`` (``None`` or a finite number), checked when the config is made rather than when the
    model is built; a misspelt name gets a "did you mean". Returns ``(norm, mlp)`` as read, which the configs
    record: ``"RMSNorm"`` and ``"rmsnorm"`` build one model, and a run's identity names the model, not its
    spelling (``"GELU"``, the default MLP, stays out of it as ``"gelu"`` does)."""
    import difflib

    from diffusionformer.nn.block import _MLP_KINDS, _name_key
    from diffusionformer.ops.dense import DENSE_BACKENDS

    key = _name_key(norm) if isinstance(norm, str) else None
    mlp_key = _name_key(mlp) if isinstance(mlp, str) else None
    # the hint compares the name as read (case, _ and - ignored): "SwiGLUE" is close to "swiglu"
    for name, value, read, choices in (("norm", norm, key, _NORMS), ("mlp", mlp, mlp_key, _MLP_KINDS),
                                       ("backend", backend, backend, DENSE_BACKENDS)):
        if read not in choices:
            # the backend as the ops' hint reads it (ops/_checks.py _backend_hint): "SDPA" is close to "sdpa"
            close = difflib.get_close_matches(read.lower().replace("-", "_"), choices, n=1) if isinstance(
                read, str) else []
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{where}.{name}: expected one of {list(choices)}, got {value!r}{hint}")
    if layer_scale is not None and (isinstance(layer_scale, bool) or not isinstance(layer_scale, numbers.Real)
                                    or not math.isfinite(layer_scale)):
        raise ValueError(f"{where}.layer_scale: expected None or a finite float, got {layer_scale!r}")
    return str(key), str(mlp_key)  # both checked above


def check_probability(where: str, **values: Any) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise ValueError(f"{where}.{name} must lie in [0, 1), got {value!r}")


def init_transformer_weights(model: nn.Module, num_layers: int, std: float = 0.02) -> None:
    """GPT-2 / nanoGPT initialisation: N(0, std) weights, zero biases, residual projections
    scaled by ``1 / sqrt(2 L)``. Operator parameters (diffusion times, polynomial
    coefficients) keep the values their constructors chose.

    The scaled projections are every :class:`~diffusionformer.nn.DiffusionAttention`'s
    ``out_proj`` and the MLP ``fc2`` of every :class:`~diffusionformer.nn.Block`. The MLP of a
    graph transformer's ``GraphBlock`` (not a ``Block``) keeps std ``std``, as the published
    graph results were trained.
    """
    # else num_layers=0 is a bare ZeroDivisionError, -1 "math domain error", True a silent 1 layer, and a negative
    # or NaN std torch's "normal expects std >= 0.0" naming neither argument
    check_positive_int("init_transformer_weights", num_layers=num_layers)
    check_positive("init_transformer_weights", std=std)
    # an operator's own submodules (a user's gate nn.Linear) are its parameters too: drawn N(0, std) with zero biases,
    # they lost the values its constructor (and its reset_parameters) chose
    in_operators = {id(m) for op in model.modules() if isinstance(op, DiffusionOperator) for m in op.modules()}
    for module in model.modules():
        if id(module) in in_operators:
            continue
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
    for module in model.modules():
        if isinstance(module, DiffusionAttention):
            nn.init.normal_(module.out_proj.weight, mean=0.0, std=std / math.sqrt(2 * num_layers))
        elif isinstance(module, Block):
            fc2 = getattr(module.mlp, "fc2", None)
            if isinstance(fc2, nn.Linear):
                nn.init.normal_(fc2.weight, mean=0.0, std=std / math.sqrt(2 * num_layers))


def learned_operator_parameters(model: nn.Module) -> dict[str, Tensor]:
    """The learned operator parameters (diffusion times, PPR logits, polynomial coefficients) by name.

    Examples:
        >>> from diffusionformer.nn import Block
        >>> sorted(learned_operator_parameters(Block(8, 2, heads="heat(learnable=True, steps=2):2")))
        ['attn.operators.0.t']
    """
    if not isinstance(model, nn.Module):  # else "'dict' object has no attribute 'named_parameters'"
        raise TypeError(f"learned_operator_parameters: expected model to be an nn.Module, got {type(model).__name__}")
    return {name: p for name, p in model.named_parameters() if ".operators." in f".{name}"}
