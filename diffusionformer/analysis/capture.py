r"""Capture the residual stream (and attention maps) of a model layer by layer, with hooks.

For a model with blocks ``model.blocks[0 .. L-1]`` the *residual stream* is

``X^(0) = embeddings (the input of block 0)``,  ``X^(l) = Block_{l-1}(X^(l-1))``, ``l = 1..L``,

so layer index ``l`` runs over ``0..L`` (``0`` = embeddings, ``l`` = after block ``l - 1``),
as in :class:`~diffusionformer.models.ModelIntermediates`. The tokens of every layer are
read with forward hooks on ``model.blocks[i]`` (a pre-hook on block 0 for the embeddings);
the model's own code path is never changed and the hooks are always removed afterwards.

Attention maps are *recomputed*: a pre-hook on block ``i`` calls
``block.attn(block.norm1(x), ..., return_intermediates=True)`` on the block's input ``x``
with the block's own attention arguments (``key_padding_mask``/``attn_mask`` keywords of a
dense :class:`~diffusionformer.nn.Block`; the ``edge_index`` argument of a
:class:`~diffusionformer.models.GraphBlock`). This is the ``P`` that block ``i`` diffuses
over; the block itself still runs its fused path. The optional dense ``global_attn`` of a
``GraphBlock`` is not captured. Use it in eval mode (``capture_dataset`` switches the model
to eval and back): in training mode the block drops entries of ``P`` at random, which the
recorded ``P`` (before dropout) leaves out; recording draws no random numbers, so the training
pass it observes is the same with or without it.

Dense models (ViT, GPT) give tokens ``(B, T, D)``. Graph models give nodes ``(N, D)`` with the
``batch`` vector of the block call (or, where the blocks got none, the Batch's own);
``capture_dataset`` pads them per graph to ``(G, N_max, D)`` with a boolean ``mask`` (valid
nodes first, in node order), so a graph is a "sequence" of its nodes.
"""

from __future__ import annotations

import copy
import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from diffusionformer._modes import _evaluating
from diffusionformer._imports import _import_pyg
from diffusionformer.analysis.metrics import _check_flag, _is_int
from diffusionformer.config import _device_argument

__all__ = ["LayerCapture", "LayerRecorder", "capture_dataset", "pad_by_batch"]

IGNORE_INDEX = -100  #: label of padded tokens and of tokens without a target


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------


class _NoBlocks(TypeError):
    """A model without transformer blocks to capture (a GCN or GIN baseline): ``analyze`` skips its task."""


def _blocks(model: nn.Module) -> nn.ModuleList | nn.Sequential:
    """``model.blocks``: an ``nn.ModuleList``, or an ``nn.Sequential`` (timm's ``VisionTransformer.blocks``), whose
    forward calls each block in turn, as the models' forward calls the list's."""
    inner = model
    while not isinstance(getattr(inner, "blocks", None), (nn.ModuleList, nn.Sequential)) \
            and isinstance(getattr(inner, "module", None), nn.Module):
        inner = inner.module  # DistributedDataParallel / DataParallel: hooks on the wrapped model's blocks
    blocks = getattr(inner, "blocks", None)
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)) or len(blocks) == 0:
        got = type(blocks).__name__ if blocks is not None else "no attribute `blocks`"
        inside = next((name for name in ("backbone", "student", "model", "encoder")
                       if isinstance(getattr(getattr(inner, name, None), "blocks", None),
                                     (nn.ModuleList, nn.Sequential))), None)
        raise _NoBlocks(
            f"capture needs a model with a non-empty nn.ModuleList `model.blocks` (DiffusionViT, DiffusionGPT, "
            f"DiffusionGraphTransformer; an nn.Sequential too), got {type(model).__name__} with {got}"
            + (f": capture model.{inside}, which has them (e.g. a DINO model's backbone)" if inside else "")
        )
    return blocks


def _check_layers(layers: Iterable[int] | None, L: int) -> list[int]:
    if layers is None:
        return list(range(L + 1))
    if isinstance(layers, Tensor) and not layers.is_floating_point() and not layers.is_complex() \
            and layers.dtype != torch.bool:
        layers = layers.tolist()  # a tensor of indices (a 0-dim one too) as the ints it holds
    if _is_int(layers):
        layers = [layers]
    out: list[int] = []
    for layer in layers:
        if not _is_int(layer) or not -(L + 1) <= layer <= L:
            raise ValueError(
                f"layers must hold residual-stream indices in [0, {L}] (0 = embeddings, l = after block l-1; "
                f"negative counts from the end), got {layer!r}"
            )
        out.append(int(layer) % (L + 1))
    if not out:
        raise ValueError(f"layers must name at least one layer in [0, {L}], got none")
    return sorted(set(out))


def pad_by_batch(x: Tensor, batch: Tensor | None, num_graphs: int | None = None) -> tuple[Tensor, Tensor]:
    r"""Pad node rows into one padded "sequence" per graph (like PyG's ``to_dense_batch``).

    Node ``n`` of graph ``g = batch[n]`` goes to row ``g``, position ``n - ptr[g]`` where
    ``ptr[g]`` is the first node of graph ``g``; ``batch`` must be sorted (PyG batches are), so
    each graph's valid positions are a prefix ``0 .. N_g - 1`` in node order.

    Args:
        x: node rows.
        batch: graph id of each node, sorted; ``None`` means one graph.
        num_graphs: number of graphs ``G`` (default ``batch.max() + 1``); ids outside ``[0, G)`` are a ``ValueError``,
            and so is a ``G`` other than 1 without ``batch``.

    Shapes:
        x: ``(N, *F)``; batch: ``(N,)`` -> padded ``(G, N_max, *F)`` (zeros) and mask
        ``(G, N_max)`` bool (True = a node).

    Examples:
        >>> x = torch.tensor([[1.0], [2.0], [3.0]])
        >>> padded, mask = pad_by_batch(x, torch.tensor([0, 0, 1]))
        >>> padded[..., 0], mask
        (tensor([[1., 2.],
                [3., 0.]]), tensor([[ True,  True],
                [ True, False]]))
    """
    if not isinstance(x, Tensor) or x.ndim < 1:
        raise ValueError(f"x must be a tensor of node rows (N, ...), got {getattr(x, 'shape', type(x).__name__)}")
    N = x.shape[0]
    if batch is None:
        if num_graphs is not None and (not _is_int(num_graphs) or num_graphs != 1):  # else one graph, silently
            raise ValueError(f"batch=None means one graph, but num_graphs={num_graphs!r}: pass the batch vector of "
                             "the graphs (graph id of each node)")
        return x.unsqueeze(0), torch.ones(1, N, dtype=torch.bool, device=x.device)
    if not isinstance(batch, Tensor) or batch.shape != (N,) or batch.is_floating_point() or batch.is_complex() \
            or batch.dtype == torch.bool:
        got = f"{batch.dtype} of shape {tuple(batch.shape)}" if isinstance(batch, Tensor) else type(batch).__name__
        raise ValueError(f"batch must be an integer tensor of shape ({N},), got {got}")
    batch = batch.long()  # as indices: uint8 ids were read as a boolean mask, int8/int16 ones refused by indexing
    if num_graphs is not None and (not _is_int(num_graphs) or num_graphs < 0):
        raise ValueError(f"num_graphs must be a non-negative int or None, got {num_graphs!r}")
    if N > 1 and bool((batch[1:] < batch[:-1]).any()):
        raise ValueError("batch must be sorted (nodes of each graph contiguous, as in a PyG Batch)")
    G = int(batch.max()) + 1 if num_graphs is None and N > 0 else (num_graphs or 0)
    if N > 0 and (int(batch.min()) < 0 or int(batch.max()) >= G):
        raise ValueError(f"batch must hold graph ids in [0, {G}) (num_graphs={num_graphs}), "
                         f"got ids in [{int(batch.min())}, {int(batch.max())}]")
    counts = torch.bincount(batch, minlength=G)  # (G,)
    ptr = torch.cumsum(counts, 0) - counts  # first node of each graph
    pos = torch.arange(N, device=x.device) - ptr[batch]
    n_max = int(counts.max()) if G > 0 else 0
    padded = x.new_zeros((G, n_max, *x.shape[1:]))
    padded[batch, pos] = x
    mask = torch.zeros(G, n_max, dtype=torch.bool, device=x.device)
    mask[batch, pos] = True
    return padded, mask


def _is_graph_batch(obj: Any) -> bool:
    return hasattr(obj, "x") and hasattr(obj, "edge_index") and not isinstance(obj, Tensor)


def _num_graphs(obj: Any) -> int:
    n = getattr(obj, "num_graphs", None)
    return int(n) if n is not None else 1


def _num_sequences(inputs: Any) -> int:
    if isinstance(inputs, Tensor):
        return int(inputs.shape[0])
    if _is_graph_batch(inputs):
        return _num_graphs(inputs)
    if isinstance(inputs, (tuple, list)) and inputs and isinstance(inputs[0], Tensor):
        return int(inputs[0].shape[0])
    raise TypeError(
        "each batch must be a tensor, a tuple of tensors (model(*inputs)) or a PyG Data/Batch, optionally paired "
        f"with labels as (inputs, labels); got {type(inputs).__name__}"
    )


def _per_node(labels: Tensor, inputs: Any) -> bool:
    """Whether ``labels`` of a graph batch hold one value per node (else one per graph)."""
    return int(labels.shape[0]) == int(inputs.num_nodes) and int(inputs.num_nodes) != _num_graphs(inputs)


def _cut_is_ambiguous(inputs: Any) -> bool:
    """Whether cutting a tuple batch to its first sequences could cut a shared tensor: another tensor of the
    tuple leads with the batch size ``B`` and has a second dimension of ``B`` too (a shared ``(T, T)`` mask when
    ``T == B`` reads as a per-sequence ``(B, T)`` one: cut to ``(k, T)`` it broadcast its first row over every
    query, silently wrong states for ``k = 1``). Such a batch runs whole and its records are cut instead."""
    if not isinstance(inputs, (tuple, list)) or not inputs or not isinstance(inputs[0], Tensor) or inputs[0].ndim == 0:
        return False
    B = inputs[0].shape[0]
    return any(isinstance(t, Tensor) and t.ndim >= 2 and t.shape[0] == B and B in t.shape[1:] for t in inputs[1:])


def _head(inputs: Any, labels: Tensor | None, k: int) -> tuple[Any, Tensor | None]:
    """The first ``k`` sequences (graphs) of a batch and their labels."""
    if isinstance(inputs, Tensor):
        return inputs[:k], None if labels is None else labels[:k]
    if isinstance(inputs, (tuple, list)):
        # the per-sequence tensors (the leading size of the first) are cut; a shared (T, T) attn_mask cut to (k, T)
        # failed in the model as an attn_mask of the wrong shape, and a None or a number in the tuple failed to slice
        B = inputs[0].shape[0]
        return (type(inputs)(t[:k] if isinstance(t, Tensor) and t.ndim > 0 and t.shape[0] == B else t for t in inputs),
                None if labels is None else labels[:k])
    _import_pyg()
    from torch_geometric.data import Batch

    graphs = inputs.to_data_list()[:k]
    if labels is not None:
        labels = labels[inputs.batch < k] if _per_node(labels, inputs) else labels[:k]
    return Batch.from_data_list(graphs), labels


def _to_device(inputs: Any, device: torch.device | None) -> Any:
    if device is None:
        return inputs
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(t.to(device) if isinstance(t, Tensor) else t for t in inputs)  # a None or a flag as it is
    return inputs.to(device)


def _split_item(item: Any) -> tuple[Any, Tensor | None]:
    """``(inputs, labels)`` of one batch: a 2-tuple/list is always ``(inputs, labels)``."""
    if isinstance(item, (tuple, list)) and len(item) == 2:
        inputs, labels = item
        if labels is not None and not isinstance(labels, Tensor):
            raise TypeError(
                f"a 2-tuple batch is read as (inputs, labels); labels must be a tensor or None, got "
                f"{type(labels).__name__} (for model(a, b) without labels pass ((a, b), None))"
            )
        return inputs, labels
    return item, None


def _innermost(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel (``.module``) and ``torch.compile`` (``._orig_mod``) wrappers, in
    either order, at most 4 deep; ``model`` itself when it wraps nothing. By ``isinstance``, not truthiness: ``bool()``
    of a compiled module calls its model's ``len()``, which most lack."""
    inner = model
    for _ in range(4):
        wrapped = getattr(inner, "module", None)
        wrapped = wrapped if isinstance(wrapped, nn.Module) else getattr(inner, "_orig_mod", None)
        if not isinstance(wrapped, nn.Module):
            break
        inner = wrapped
    return inner


def _takes_num_graphs(model: nn.Module) -> bool:
    """Whether the forward of ``model`` (the model inside DDP or torch.compile) has a ``num_graphs`` parameter."""
    # wrappers' forwards take any keyword: read the wrapped model's own signature
    return _forward_takes_num_graphs(type(_innermost(model)))


@functools.lru_cache(maxsize=64)
def _forward_takes_num_graphs(cls: type) -> bool:
    """Whether ``cls.forward`` has a ``num_graphs`` parameter (read once per class: not at every training step)."""
    try:
        return "num_graphs" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):  # no signature to read
        return False


def _takes_return_intermediates(attn: object) -> bool:
    """Whether ``attn`` is a module whose forward takes ``return_intermediates`` (a DiffusionAttention; a wrapper of
    one, such as ``torch.compile``'s, whose forward takes ``**kwargs``)."""
    if not isinstance(attn, nn.Module):
        return False
    try:
        params = inspect.signature(attn.forward).parameters
    except (TypeError, ValueError):  # no signature to read: left to the call
        return True
    return "return_intermediates" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _default_forward(model: nn.Module, inputs: Any) -> Any:
    if _is_graph_batch(inputs):
        batch = getattr(inputs, "batch", None)
        # the edge features and positional encoding a graph transformer built with edge_dim / pe needs, from the
        # batch (as the experiments pass them; the call without them failed asking for them)
        config = getattr(_innermost(model), "config", None)
        extra = {name: getattr(inputs, name) for name, wanted in
                 (("edge_attr", getattr(config, "edge_dim", None)), ("pe", getattr(config, "pe", None)))
                 if wanted is not None and isinstance(getattr(inputs, name, None), Tensor)}
        if batch is not None and _takes_num_graphs(model):
            # a trailing graph without nodes has no id in `batch`: a readout sized batch.max() + 1 gave it no row,
            # and the outputs of every later graph moved up by one (against the labels and the padded states)
            return model(inputs.x, inputs.edge_index, batch, num_graphs=_num_graphs(inputs), **extra)
        return model(inputs.x, inputs.edge_index, batch, **extra)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


_WRAPPED = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module", "module")


def _forward_signature(block: nn.Module) -> inspect.Signature:
    """The signature of ``block.forward``, read through wrappers whose forward takes ``(*args, **kwargs)``: a block
    compiled on its own (``torch.compile(block)``), activation checkpointing's ``checkpoint_wrapper``, FSDP; their
    calls pass the wrapped block's arguments (the tuple ``args`` was taken for the tokens: "'tuple' object has no
    attribute 'detach'")."""
    inner = block
    for _ in range(4):
        sig = inspect.signature(inner.forward)
        params = list(sig.parameters.values())
        if not params or params[0].kind is not inspect.Parameter.VAR_POSITIONAL:
            return sig
        wrapped = next((w for w in (getattr(inner, name, None) for name in _WRAPPED) if isinstance(w, nn.Module)),
                       None)
        if wrapped is None:
            break
        inner = wrapped
    raise TypeError(
        f"capture reads the token input of a block by its forward's parameters, but {type(block).__name__}.forward "
        f"takes {sig} (a wrapper of a block that capture cannot see through): give model.blocks the blocks "
        "themselves, or a torch.compile / checkpoint_wrapper / FSDP wrapper of them"
    )


def _split_block_call(
    block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Tensor, dict[str, Any], Tensor | None]:
    """``(x, attention kwargs, batch)`` of one block call, by the block's forward signature.

    The first argument is the token/node input; ``graph`` (an
    :class:`~diffusionformer.graph.AttentionGraph` or a bare ``edge_index``), ``edge_index``
    any ``**kwargs`` (dense blocks: ``key_padding_mask``, ``attn_mask``; also as named parameters) and a
    :class:`~diffusionformer.ops.rivals.LayerState` ``state`` (copied) go to the attention
    (``edge_attr`` to the edge-aware scores of a graph block); ``batch`` is the graph id per
    node (or the graph's own ``batch``).
    """
    sig = _forward_signature(block)
    bound = sig.bind(*args, **kwargs)
    names = list(bound.arguments)
    x = bound.arguments[names[0]]
    attn_kwargs: dict[str, Any] = {}
    for name in names[1:]:
        param = sig.parameters[name]
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            attn_kwargs.update(bound.arguments[name])
        elif name == "edge_index":
            attn_kwargs["edge_index"] = bound.arguments[name]
        elif name == "graph" and bound.arguments[name] is not None:  # an AttentionGraph, or a bare edge_index
            value = bound.arguments[name]
            attn_kwargs["edge_index" if isinstance(value, Tensor) else "graph"] = value
        elif name == "edge_attr":
            attn_kwargs["edge_attr"] = bound.arguments[name]
        elif name in ("key_padding_mask", "attn_mask", "is_causal") and bound.arguments[name] is not None:
            # a user's block naming the attention's dense shorthands: P recomputed without them attended the padding
            attn_kwargs[name] = bound.arguments[name]
        elif name == "state":
            attn_kwargs["state"] = bound.arguments[name]
    if attn_kwargs.get("state") is not None:
        # re-running the attention must neither advance the model's LayerState nor record values
        attn_kwargs["state"] = copy.copy(attn_kwargs["state"])
    batch = bound.arguments.get("batch")
    if batch is None and not isinstance(attn_kwargs.get("graph"), (Tensor, type(None))):
        batch = getattr(attn_kwargs["graph"], "batch", None)
    return x, attn_kwargs, batch


def _key_padding_of(attn_kwargs: dict[str, Any]) -> Tensor | None:
    """The ``key_padding_mask`` (``(B, T)`` bool, True = padding) of a dense block call: the keyword, or that of a
    dense :class:`~diffusionformer.graph.AttentionGraph` passed as ``graph``; ``None`` without one."""
    mask = attn_kwargs.get("key_padding_mask")
    graph = attn_kwargs.get("graph")
    if mask is None and getattr(graph, "layout", None) == "dense":
        mask = getattr(graph, "key_padding_mask", None)
    return mask.detach() if isinstance(mask, Tensor) and mask.dtype == torch.bool and mask.ndim == 2 else None


# ----------------------------------------------------------------------------------------
# Recording one forward pass
# ----------------------------------------------------------------------------------------


def _rng_untouched(x: Tensor) -> Any:
    """A context that restores the CPU generator (and that of ``x``'s accelerator) on exit."""
    if x.device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=[x.device], device_type=x.device.type)


#: the recorders whose hooks are on (entered, not yet exited): a block shared by two recorded models records, in
#: each model's recorder, only the calls made in that model's pass (LayerRecorder._others_call)
_RECORDING: "weakref.WeakSet[LayerRecorder]" = weakref.WeakSet()
#: held to add to, discard from or copy :data:`_RECORDING`: a recorder entered or exited in another thread while a block
#: hook walked the set raised "Set changed size during iteration" in that hook (a WeakSet's iteration is Python code)
_RECORDING_LOCK = threading.Lock()


class LayerRecorder:
    r"""Context manager that records the residual stream ``X^(l)`` of every forward pass.

    Registers a forward pre-hook on ``model.blocks[0]`` (embeddings ``X^(0)``, and the
    attention of block 0) and forward hooks on the blocks whose outputs are wanted, and, to tell the positions of a
    block shared across depth apart, a forward hook on every block (its calls) and hooks on the module that holds
    ``blocks`` (a pass); all hooks are removed on exit, also when the body raises. After each forward pass,
    ``states[l]`` holds ``X^(l)`` of that pass (detached copies, on the model's device, as the block
    saw it: ``(B, T, D)`` dense or ``(N, D)`` nodes), ``batch`` the graph id per node of a graph
    model (``None`` for dense models or one graph), and ``attentions[i]`` the
    :class:`~diffusionformer.nn.attention.AttentionIntermediates` of block ``i`` (when
    ``attentions=True``: recomputed from the block's input without an autograd graph, for
    every block ``i`` whose output ``i + 1`` is recorded). A later pass overwrites the earlier one. A module at several
    positions of ``model.blocks`` (weights shared across depth) is recorded at each: its ``k``-th call of a pass is
    position ``k``'s (a pass being a call of the model that holds ``blocks``, which also ends the count of one that
    raised or exited early; outside such a call, as in ``forward_cached``, the calls cycle through the positions, and
    a block call that raised ends the count). Within a call of that model, a block's calls past its last position (a
    refinement step after the loop, the stack run again on another input) are not recorded, shared or not: every
    position holds the first run's tokens. Calls inside a backward pass (the recomputation of
    ``torch.utils.checkpoint``) are not a forward pass and are not recorded, nor, outside a pass of this recorder's
    model, the calls of a block it shares with another model inside that model's pass where another recorder records
    it (a student and a teacher sharing a block, a wrapper holding the model's ``blocks``: each recorder held the other
    model's tokens); a model not recorded cannot be told apart, its calls of a shared block are recorded.

    Args:
        model: a model with ``model.blocks`` (``nn.ModuleList`` or ``nn.Sequential``); for a ``torch.compile`` model,
            run the model inside it (``compiled._orig_mod``) in the body: a compiled model that
            already ran skips hooks registered later (:func:`capture_dataset` does this itself). A model
            (or block) compiled in place, ``model.compile()``, runs eagerly inside the ``with`` block.
        layers: residual-stream indices to record, ``0..L`` (default: all).
        attentions: also recompute each recorded block's attention weights (blocks with a pre-norm ``norm1`` and a
            :class:`~diffusionformer.nn.DiffusionAttention` ``attn``: another block, or attention such as
            :class:`torch.nn.MultiheadAttention`, is a ``TypeError`` when the recorder is made, naming the block's
            class and its ``attn``'s).

    Examples:
        >>> from diffusionformer.models import DiffusionGPT, GPTConfig
        >>> gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16))
        >>> with LayerRecorder(gpt, attentions=True) as rec:
        ...     _ = gpt(torch.randint(0, 11, (3, 8)))
        >>> sorted(rec.states), rec.states[2].shape, rec.attentions[1].attn_weights.shape
        ([0, 1, 2], torch.Size([3, 8, 16]), torch.Size([3, 2, 8, 8]))
        >>> len(gpt.blocks[0]._forward_hooks), len(gpt.blocks[0]._forward_pre_hooks)
        (0, 0)
    """

    def __init__(self, model: nn.Module, layers: Iterable[int] | None = None, attentions: bool = False) -> None:
        self.blocks = _blocks(model)
        self._model = model
        self._compiled: list[tuple[nn.Module, Any]] = []  # modules compiled in place, eager while recording
        L = len(self.blocks)
        self.num_blocks = L
        self.layers = _check_layers(layers, L)
        _check_flag(attentions, "attentions")  # a numpy bool too, named as one (not "must be a bool, got bool")
        self.attention_blocks = [layer - 1 for layer in self.layers if layer >= 1] if attentions else []
        for i in self.attention_blocks:
            block = self.blocks[i]
            attn = getattr(block, "attn", None)
            # another attention (nn.MultiheadAttention) failed inside the hook with "forward() got an unexpected
            # keyword argument 'return_intermediates'", an argument the caller never passed
            wrong = [] if _takes_return_intermediates(attn) else [
                f"whose attn is a {type(attn).__name__}" if isinstance(attn, nn.Module) else "without attn"]
            if not isinstance(getattr(block, "norm1", None), nn.Module):
                wrong.append("without norm1")
            if wrong:
                raise TypeError(
                    f"attentions=True needs blocks with `attn` (DiffusionAttention) and `norm1` (pre-norm); "
                    f"block {i} is a {type(block).__name__} {' and '.join(wrong)}"
                )
        self.compute_attentions = True  #: switch the recomputation off (and on) between passes
        self.states: dict[int, Tensor] = {}
        self.attentions: dict[int, Any] = {}
        self.batch: Tensor | None = None
        self._key_padding: Tensor | None = None
        self._half: torch.dtype | None = None  # the coarsest half precision of the recorded states (_half_precision)
        self._handles: list[Any] = []
        # the positions of each module of model.blocks (several: weights shared across depth), and its calls in this
        # pass; each hook of position i acts on that position's call alone (all of them recorded every call, and every
        # layer held the last call's tokens; a call past the last position, another run of the stack inside the pass,
        # overwrote the layers of the blocks it calls: states of two inputs)
        self._positions: dict[int, list[int]] = {}
        self._calls: dict[int, int] = {}
        self._in_pass = False  # inside a call of the module that holds model.blocks (a pass: the count starts at 0)
        self._depth = 0  # nested ``with`` blocks of this recorder: the hooks stay until the outermost one ends

    def clear(self) -> None:
        """Forget the recorded pass."""
        self.states, self.attentions, self.batch = {}, {}, None
        self._key_padding = None  # key_padding_mask (True = padding) of block 0's dense call
        self._half = None
        self._calls, self._in_pass = {}, False

    def _record(self, layer: int, x: Tensor) -> None:
        # a copy: a block that updates its input in place (x += ..., under no_grad) changed the record. The precision
        # is read here, as the pass runs: an autocast entered by a `forward` callable (or switched off inside an outer
        # one) is not the one around capture_dataset's loop
        self.states[layer] = x.detach().clone()
        self._half = _coarser(self._half, _half_precision(x))

    def _pre_hook(self, i: int) -> Callable[..., None]:
        def hook(block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not self._is_call_of(i, block):
                return
            x, attn_kwargs, batch = _split_block_call(block, args, kwargs)
            if i == 0:
                self.batch = None if batch is None else batch.detach()
                self._key_padding = _key_padding_of(attn_kwargs)
                if 0 in self.layers:
                    self._record(0, x)
            if i in self.attention_blocks and self.compute_attentions:
                # a read-out like the detached states: no autograd graph kept (training passes), and no random numbers
                # drawn from the model's generators (attention dropout in training): the pass it observes is unchanged
                with torch.no_grad(), _rng_untouched(x):
                    self.attentions[i] = self._recompute(block, x, attn_kwargs)

        return hook

    @staticmethod
    def _recompute(block: nn.Module, x: Tensor, attn_kwargs: dict[str, Any]) -> Any:
        """The attention intermediates of ``block`` on its input ``x``."""
        if attn_kwargs.get("cache") is not None:
            # the cached path attends the new tokens over the cached ones and refuses return_intermediates ("takes no
            # graph, masks or return_intermediates", about an argument the caller never passed)
            raise ValueError(
                "LayerRecorder(attentions=True) cannot recompute the attention of a KV-cached decoding step "
                "(forward_cached, generate(use_cache=True)): the new tokens attend the cached ones, which the block "
                "input does not hold; record with attentions=False, or run the uncached forward to capture attentions"
            )
        edge_attr = attn_kwargs.pop("edge_attr", None)
        if edge_attr is not None and getattr(block, "edge_proj", None) is not None:
            # a GraphBlock with edge features: P comes from the edge-aware scores
            from diffusionformer.nn.attention import AttentionIntermediates
            from diffusionformer.nn.edge_features import edge_feature_attention

            graph = attn_kwargs.get("graph")
            edge_index = attn_kwargs["edge_index"] if graph is None else graph.edge_index
            _, P = edge_feature_attention(block.attn, block.norm1(x), edge_index,
                                          block.edge_proj(edge_attr.to(x.dtype)), return_weights=True)
            return AttentionIntermediates(P, block.attn.coefficients().detach(), edge_index, "sparse")
        _, inter = block.attn(block.norm1(x), **attn_kwargs, return_intermediates=True)
        return inter

    def _post_hook(self, i: int) -> Callable[..., None]:
        def hook(block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if not self._is_call_of(i, block):
                return
            if not isinstance(output, Tensor):
                raise TypeError(f"block {i} returned {type(output).__name__}; capture expects a tensor")
            self._record(i + 1, output)  # the next block may update its input in place

        return hook

    def _call_ended(self, block: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """Hook of every block, after the hooks that read its count (also when the call raised: ``output`` ``None``):
        one call more of ``block`` in this pass; none inside a backward pass (a checkpoint's recomputation), nor one
        that raised (a model that catches the error and calls the block again). Outside a pass of the module holding
        ``model.blocks`` (``forward_cached``, ``generate(use_cache=True)``) a call that raised ends the count (the
        recorder's own refusal of attentions on a cached step shifted every later cached pass)."""
        if torch._C._current_graph_task_id() != -1 or self._others_call(block):
            return
        if output is not None:
            self._calls[id(block)] = self._calls.get(id(block), 0) + 1
        elif not self._in_pass:
            self._calls = {}

    def _others_call(self, block: nn.Module) -> bool:
        """Whether this call of ``block`` is made in another recorded model's pass (:data:`_RECORDING`, a recorder of a
        model sharing the block, inside a call of the module holding its blocks) and outside one of this model's."""
        if self._in_pass:
            return False
        with _RECORDING_LOCK:
            recorders = tuple(_RECORDING)  # a snapshot, walked outside the lock
        return any(r is not self and r._in_pass and id(block) in r._positions for r in recorders)

    def _new_pass(self, owner: nn.Module, args: tuple[Any, ...], *output: Any) -> None:
        """Pre-hook (and, with ``output``, hook also called when it raised) of the module holding ``model.blocks``:
        the calls of the blocks count from 0 again (a pass that raised midway, or left early, shifted the positions
        of every later one)."""
        if torch._C._current_graph_task_id() == -1:
            self._calls, self._in_pass = {}, not output

    def _is_call_of(self, i: int, block: nn.Module) -> bool:
        """Whether this call of ``block`` is the one at position ``i`` of ``model.blocks``: its ``k``-th call of the
        pass is that of its ``k``-th position (one past its last, inside a call of the model, is none's); never inside
        a backward pass (a checkpoint's recomputation, in reverse order: the last position's call was read as the
        first's)."""
        if torch._C._current_graph_task_id() != -1 or self._others_call(block):
            return False
        positions = self._positions.get(id(block))
        if positions is None:  # a copy of the block (nn.DataParallel's replica)
            return True
        k = self._calls.get(id(block), 0)  # its calls before this one (counted once its hooks ran)
        if k >= len(positions) and self._in_pass:  # called again after its last position (a second run of the stack)
            return False
        return positions[k % len(positions)] == i

    def __enter__(self) -> "LayerRecorder":
        if self._depth:  # entered again inside its own block: the inner exit removed the outer block's hooks
            self._depth += 1
            return self
        self.clear()
        try:
            # a model compiled in place (model.compile(), nn.Module.compile) that already ran skips hooks registered
            # later, as a torch.compile wrapper does: nothing was recorded ("layers [0, 1, 2] were not recorded: did
            # the forward call run model.blocks?"); its modules run eagerly until the recorder exits
            for module in self._model.modules():
                impl = module.__dict__.get("_compiled_call_impl")
                if impl is not None:
                    self._compiled.append((module, impl))
                    module._compiled_call_impl = None
            self._positions = {}
            for i, block in enumerate(self.blocks):
                self._positions.setdefault(id(block), []).append(i)
            # the module that holds the blocks (under any name: `blocks` may be a property), called once per pass
            owner = next((m for m in self._model.modules() if any(c is self.blocks for c in m.children())), None)
            if owner is not None:
                self._handles.append(owner.register_forward_pre_hook(self._new_pass))
                self._handles.append(owner.register_forward_hook(self._new_pass, always_call=True))
            for i, block in enumerate(self.blocks):
                if i == 0 or i in self.attention_blocks:
                    self._handles.append(block.register_forward_pre_hook(self._pre_hook(i), with_kwargs=True))
                if i + 1 in self.layers:
                    self._handles.append(block.register_forward_hook(self._post_hook(i), with_kwargs=True))
            for block in {id(b): b for b in self.blocks}.values():  # after the hooks reading the count
                self._handles.append(block.register_forward_hook(self._call_ended, always_call=True))
        except BaseException:
            self.remove()
            raise
        self._depth = 1
        with _RECORDING_LOCK:
            _RECORDING.add(self)
        return self

    def remove(self) -> None:
        """Remove every hook this recorder registered (idempotent)."""
        self._depth = 0
        with _RECORDING_LOCK:
            _RECORDING.discard(self)
        while self._handles:
            self._handles.pop().remove()
        while self._compiled:
            module, impl = self._compiled.pop()
            module._compiled_call_impl = impl

    def __exit__(self, *exc: Any) -> None:
        if self._depth > 1:
            self._depth -= 1
            return
        self.remove()


# ----------------------------------------------------------------------------------------
# Captures over a dataset
# ----------------------------------------------------------------------------------------


@dataclass
class LayerCapture:
    r"""Token representations per layer of up to ``max_examples`` sequences (CPU, float32; float64 for a float64
    model).

    Attributes:
        states: residual-stream index ``l`` (0 = embeddings, ``l`` = after block ``l - 1``) ->
            tokens ``(B, T, D)``; graphs are padded per graph (see ``mask``).
        mask: ``(B, T)`` bool, True = a real token; valid tokens are a prefix of each row.
            ``None`` when nothing is padded. Graphs are padded per graph; a dense model whose blocks
            got a ``key_padding_mask`` (keyword or dense ``graph``) has its padded tokens marked here.
        labels: one label per sequence ``(B,)`` (e.g. image class, graph class) or per token
            ``(B, T)`` (e.g. next token of a language model, node class), ``-100`` where there
            is none (and at padding). ``None`` when the batches carried no labels.
        attentions: block index ``i`` -> the attention weights of block ``i`` for the first
            ``A`` sequences: ``(A, H, T, T)`` dense (rows sum to 1 over real tokens), or
            ``(E, H)`` per edge for graph blocks (see ``attention_edges``). ``None`` when not
            captured.
        attention_edges: block index -> ``(2, E)`` edges ``(source j, target i)`` of the sparse
            weights, indexing the valid tokens of the first ``A`` sequences in row-major order
            (``states[l][mask]``); ``None`` for dense models.
        outputs: the model's outputs (the first tensor of a tuple output), concatenated along
            dim 0: ``(B, C)`` logits per sequence, ``(B, T, V)`` per token (zero-padded to the longest batch, see
            ``mask``), or ``(N, C)`` per node.
            ``None`` unless asked for.
        extra: free-form information: ``num_batches`` (batches run through the model; a drawn batch of 0
            sequences is skipped and not counted), ``model`` (class name), ``num_attention_examples``, and
            ``precision`` (``"bfloat16"`` or ``"float16"``) where the tokens came from a model run in half precision
            or under autocast to it (widened to float32 here, they keep that precision's rounding), as the blocks
            ran: an autocast entered by ``forward`` counts, one switched off inside it does not.
    """

    states: dict[int, Tensor]
    mask: Tensor | None = None
    labels: Tensor | None = None
    attentions: dict[int, Tensor] | None = None
    attention_edges: dict[int, Tensor] | None = None
    outputs: Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def layers(self) -> list[int]:
        """Captured residual-stream indices, ascending."""
        return sorted(self.states)

    @property
    def embeddings(self) -> Tensor | None:
        """``X^(0)``, the tokens entering the first block (``None`` if layer 0 was not captured)."""
        return self.states.get(0)

    @property
    def hidden_states(self) -> list[Tensor]:
        """``X^(l)`` for the captured ``l >= 1``, in order (all blocks' outputs by default)."""
        return [self.states[layer] for layer in self.layers if layer >= 1]

    def _first_state(self) -> Tensor:
        """The tokens of the first captured layer; a ValueError for a capture without layers."""
        if not self.states:  # else a StopIteration (num_examples) or an IndexError (lengths, drop_prefix)
            raise ValueError("this LayerCapture holds no layers: states is empty, so it has no sequences")
        return self.states[self.layers[0]]

    @property
    def num_examples(self) -> int:
        """Number of sequences (graphs) ``B``."""
        return int(self._first_state().shape[0])

    @property
    def num_attention_examples(self) -> int:
        """Number ``A`` of leading sequences whose attention weights are kept (0 if none)."""
        return int(self.extra.get("num_attention_examples", 0)) if self.attentions else 0

    def lengths(self) -> Tensor:
        """Number of real tokens per sequence, ``(B,)``."""
        B, T = self._first_state().shape[:2]
        return self.mask.sum(dim=1) if self.mask is not None else torch.full((B,), T, dtype=torch.long)

    def drop_prefix(self, k: int) -> "LayerCapture":
        """A view without the first ``k`` tokens of each sequence (e.g. a ViT's class token).

        Dense attention weights are restricted to the remaining tokens (rows then sum to at
        most 1), and per-token outputs ``(B, T, V)`` to the remaining positions (per-sequence
        outputs ``(B, C)`` are kept); captures with sparse attention or padding cannot drop tokens.
        """
        if not _is_int(k) or k < 0:
            raise ValueError(f"k must be a non-negative int, got {k!r}")
        k = int(k)
        if k == 0:
            return self
        if self.mask is not None or self.attention_edges:
            raise ValueError("drop_prefix needs dense, unpadded tokens (a ViT/GPT capture), got a padded/graph capture")
        T = self._first_state().shape[1]
        if k >= T:
            raise ValueError(f"k must leave at least one token: k < T = {T}, got {k}")
        labels = self.labels
        if labels is not None and labels.ndim == 2:
            labels = labels[:, k:]
        attentions = None if self.attentions is None else {i: P[..., k:, k:] for i, P in self.attentions.items()}
        outputs = self.outputs
        if outputs is not None and outputs.ndim >= 3 and outputs.shape[1] == T:
            # per-token outputs (B, T, V) lose the dropped tokens too (else they no longer line up with the labels)
            outputs = outputs[:, k:]
        return LayerCapture({l: x[:, k:] for l, x in self.states.items()}, None, labels, attentions, None,
                            outputs, {**self.extra, "dropped_prefix": k})


def _collect_labels(labels: Tensor | None, inputs: Any, is_graph: bool, batch: Tensor | None, G: int,
                    T: int, index: int) -> Tensor | None:
    if labels is None:
        return None
    if not isinstance(labels, Tensor):
        raise TypeError(f"labels must be a tensor, got {type(labels).__name__}")
    labels = labels.detach()
    if not (labels.is_floating_point() or labels.is_complex()):  # ids padded with -100 need a signed dtype: uint8
        labels = labels.long()  # labels failed in torch ("cannot be converted to type uint8_t without overflow")
    if is_graph and labels.ndim == 1 and _per_node(labels, inputs):
        padded, _ = pad_by_batch(labels.to(batch.device if batch is not None else labels.device), batch, G)
        mask = pad_by_batch(labels.new_ones(labels.shape, dtype=torch.bool), batch, G)[0]
        return padded.masked_fill(~mask, IGNORE_INDEX).cpu()
    _check_batch_labels(labels, inputs, is_graph, G, T, index)
    return labels.cpu()


def _check_batch_labels(labels: Tensor, inputs: Any, is_graph: bool, G: int, T: int, index: int) -> None:
    """One label per sequence (graph) of the batch, or per token ``(G, T)`` of a dense batch."""
    rows_ok = labels.ndim >= 1 and labels.shape[0] == G
    if is_graph:
        if not rows_ok:
            raise ValueError(f"labels of batch {index} must have shape ({G},) (one per graph) or be one per node "
                             f"({int(inputs.num_nodes)},), got {tuple(labels.shape)}")
    elif not rows_ok or (labels.ndim == 2 and labels.shape[1] != T):
        raise ValueError(f"labels of batch {index} must have shape ({G},) or ({G}, {T}) (one per sequence or per "
                         f"token), got {tuple(labels.shape)}")


def _pad_seq(t: Tensor, T: int, dim: int, value: float = 0.0) -> Tensor:
    extra = T - t.shape[dim]
    if extra == 0:
        return t
    pad = [0, 0] * (t.ndim - 1 - dim) + [0, extra]
    return torch.nn.functional.pad(t, pad, value=value)


def _dense_mask(rec: LayerRecorder, index: int) -> Tensor | None:
    """The real tokens ``(B, T)`` of a dense pass whose blocks got a ``key_padding_mask`` (``None`` without one):
    padded tokens counted in every metric as real ones."""
    padding = rec._key_padding
    if padding is None:
        return None
    B, T = rec.states[rec.layers[0]].shape[:2]
    if tuple(padding.shape) != (B, T):
        raise ValueError(f"batch {index}: the blocks' key_padding_mask has shape {tuple(padding.shape)}, not that of "
                         f"their tokens ({B}, {T})")
    mask = ~padding
    if T > 1 and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        raise ValueError(f"batch {index}: the blocks' key_padding_mask pads a sequence before a real token (left "
                         "padding?); a capture keeps the real tokens of each sequence first, then the padding: pad "
                         "on the right")
    return mask


def _kept_dtype(x: Tensor) -> torch.dtype:
    """float64 for a float64 tensor (a model run in float64 to measure collapse below float32's resolution), else
    float32 (half precision widened, the memory bound kept)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


_HALF = (torch.float16, torch.bfloat16)


def _half_precision(x: Tensor) -> torch.dtype | None:
    """The half precision whose rounding the tokens ``x`` carry: their dtype, or the autocast dtype when autocast to
    half precision is on for their device (its products round there, and float32 residual sums carry it); ``None``
    otherwise."""
    if x.dtype in _HALF:
        return x.dtype
    if x.dtype != torch.float32:
        return None
    try:
        on, dtype = torch.is_autocast_enabled(x.device.type), torch.get_autocast_dtype(x.device.type)
    except RuntimeError:  # a device type autocast does not know ("unknown device type for autocast")
        return None
    return dtype if on and dtype in _HALF else None


def _coarser(a: torch.dtype | None, b: torch.dtype | None) -> torch.dtype | None:
    """The coarser of two half precisions (``None``: none)."""
    if a is None or b is None:
        return a if b is None else b
    return a if torch.finfo(a).eps >= torch.finfo(b).eps else b


class _Collector:
    """Moves each recorded pass to the CPU (float32, or float64 as the model gives it) and concatenates the passes
    at the end."""

    def __init__(self, recorder: LayerRecorder, max_attention_examples: int, keep_outputs: bool) -> None:
        self.recorder = recorder
        self.max_attention = max_attention_examples
        self.keep_outputs = keep_outputs
        self.states: dict[int, list[Tensor]] = {layer: [] for layer in recorder.layers}
        self.masks: list[Tensor | None] = []
        self.labels: list[Tensor | None] = []
        self.attn: dict[int, list[Tensor]] = {i: [] for i in recorder.attention_blocks}
        self.edges: dict[int, list[Tensor]] = {i: [] for i in recorder.attention_blocks}
        self.outputs: list[Tensor] = []
        self.num_attention = self.num_nodes = self.num_batches = 0
        self.is_graph = False
        self.half: torch.dtype | None = None  # the coarsest half precision of the recorded tokens

    def add(self, inputs: Any, labels: Tensor | None, out: Any, n: int, index: int) -> None:
        rec = self.recorder
        self.num_batches += 1
        missing = [layer for layer in rec.layers if layer not in rec.states]
        if missing:
            if not rec.states and _is_graph_batch(inputs) and int(inputs.num_nodes) == 0:
                # graphs without nodes: the model maps them without running its blocks (a batch_size=1 loader over
                # an empty graph); rows of length 0, as an empty graph inside a larger batch gets
                self._add_no_nodes(inputs, labels, out, n, index)
                return
            raise RuntimeError(f"layers {missing} were not recorded: did the forward call run model.blocks?")
        if any(x.is_meta for x in rec.states.values()):  # else torch's "Cannot copy out of meta tensor; no data!"
            raise ValueError(
                f"batch {index}: the model ran on the meta device, whose tensors hold no values: there are no token "
                "states to capture (a LayerRecorder records their shapes); load the model's weights on a real device "
                "first (model.to_empty(device='cpu'), then load_state_dict)"
            )
        is_graph = any(x.ndim == 2 for x in rec.states.values())
        if is_graph and not _is_graph_batch(inputs):
            # a tuple's or tensor's leading size counts nodes, not graphs: the count, the cut of the last batch
            # and the padding per graph would all be wrong
            raise TypeError(
                f"the model's blocks returned node states (a graph model), but the batch is a {type(inputs).__name__}: "
                "graphs are counted and cut by the batch vector of a PyG Data/Batch, so pass the Batch itself "
                "(with forward=... to call the model differently)"
            )
        batch = rec.batch
        if is_graph and batch is None and n > 1:
            # blocks called without a batch vector (forward=lambda m, b: m(b.x, b.edge_index)): the n graphs of the
            # Batch were padded as one "sequence" of all their nodes, beside n labels; cut them by the Batch's own ids
            batch, N = getattr(inputs, "batch", None), rec.states[rec.layers[0]].shape[0]
            if not isinstance(batch, Tensor) or batch.shape != (N,):
                raise ValueError(
                    f"batch {index}: the model's blocks got no batch vector, and the {n} graphs of the batch cannot be "
                    f"told apart in their {N} node states (the Batch's own batch vector is "
                    f"{'missing' if not isinstance(batch, Tensor) else f'of shape {tuple(batch.shape)}'}); pass "
                    "the batch vector to the model in forward=..."
                )
            batch = batch.to(rec.states[rec.layers[0]].device)
        mask = None if is_graph else _dense_mask(rec, index)
        # a dense batch that ran whole (its cut was ambiguous, see _cut_is_ambiguous): its first n sequences are kept
        whole = not is_graph and rec.states[rec.layers[0]].shape[0] > n
        if whole and mask is not None:
            mask = mask[:n]
        for layer in rec.layers:
            x = rec.states[layer]
            if is_graph:
                x, mask = pad_by_batch(x, batch, n)
            elif whole:
                x = x[:n]
            self.states[layer].append(x.to(device="cpu", dtype=_kept_dtype(x)))
        self.half = _coarser(self.half, rec._half)
        self.masks.append(None if mask is None else mask.cpu())
        T = rec.states[rec.layers[0]].shape[1] if not is_graph else 0
        kept = _collect_labels(labels, inputs, is_graph, batch, n, T, index)
        if not is_graph and mask is not None and kept is not None and kept.ndim == 2:
            kept = kept.masked_fill(~mask.cpu(), IGNORE_INDEX)  # per-token labels of key-padded tokens: none
        self.labels.append(kept)
        a = min(n, self.max_attention - self.num_attention)
        if a > 0 and rec.attention_blocks:
            kept_nodes = int(mask[:a].sum()) if mask is not None else 0
            for i in rec.attention_blocks:
                inter = rec.attentions[i]
                w = inter.attn_weights.detach().to(device="cpu", dtype=_kept_dtype(inter.attn_weights))
                if inter.edge_index is None:  # dense (B, H, T, T)
                    self.attn[i].append(w[:a])
                else:  # sparse (E, H): edges among the nodes of the first `a` graphs
                    ei = inter.edge_index.detach().cpu()
                    keep = (ei[1] < kept_nodes) & (ei[0] < kept_nodes)
                    self.attn[i].append(w[keep])
                    self.edges[i].append(ei[:, keep] + self.num_nodes)
            self.num_attention += a
            rec.compute_attentions = self.num_attention < self.max_attention  # no recomputation once full
        if mask is not None:
            self.num_nodes += int(mask.sum())
        self.is_graph = self.is_graph or is_graph
        self._add_outputs(out, n if whole else None)

    def _add_no_nodes(self, inputs: Any, labels: Tensor | None, out: Any, n: int, index: int) -> None:
        """A batch of ``n`` graphs without nodes: ``n`` rows of no tokens (their width is set in :meth:`finish`)."""
        self.is_graph = True
        for layer in self.recorder.layers:
            self.states[layer].append(torch.zeros(n, 0, 0))
        self.masks.append(torch.zeros(n, 0, dtype=torch.bool))
        self.labels.append(_collect_labels(labels, inputs, True, torch.zeros(0, dtype=torch.long), n, 0, index))
        a = min(n, self.max_attention - self.num_attention)
        if a > 0 and self.recorder.attention_blocks:  # attention examples with no edge, as inside a larger batch
            self.num_attention += a
            self.recorder.compute_attentions = self.num_attention < self.max_attention
        self._add_outputs(out)

    def _add_outputs(self, out: Any, n: int | None = None) -> None:
        """Keep the model's output (of its first ``n`` sequences, of a dense batch that ran whole)."""
        if self.keep_outputs:
            o = out[0] if isinstance(out, (tuple, list)) else out
            if not isinstance(o, Tensor):
                raise TypeError(f"keep_outputs needs a tensor output, got {type(o).__name__}")
            if n is not None and o.ndim > 0:
                o = o[:n]
            self.outputs.append(o.detach().to(device="cpu", dtype=_kept_dtype(o)))

    def finish(self, model_name: str) -> LayerCapture:
        first = self.states[self.recorder.layers[0]]
        T = max(x.shape[1] for x in first)
        mask: Tensor | None = None
        if any(m is not None for m in self.masks) or any(x.shape[1] != T for x in first):
            parts = [torch.ones(x.shape[:2], dtype=torch.bool) if m is None else m for m, x in zip(self.masks, first)]
            mask = torch.cat([_pad_seq(m, T, 1, False) for m in parts])
            mask = None if bool(mask.all()) else mask
        states = {}
        for layer, xs in self.states.items():
            D = max(x.shape[2] for x in xs)
            if D == 0:  # every batch held graphs without nodes
                raise ValueError("capture_dataset got graphs without any node: there are no node states to capture")
            states[layer] = torch.cat([_pad_seq(x.new_zeros(x.shape[0], 0, D) if x.shape[1] == 0 else x, T, 1)
                                       for x in xs])
        labels: Tensor | None = None
        if any(lab is not None for lab in self.labels):
            if any(lab is None for lab in self.labels):
                raise ValueError("either every batch carries labels or none does")
            labels = torch.cat([_pad_seq(lab, T, 1, IGNORE_INDEX) if lab.ndim == 2 else lab  # type: ignore[union-attr]
                                for lab in self.labels])  # type: ignore[misc]
        attentions = edges = None
        if self.num_attention > 0:  # (none for graphs when every attention example was a graph without nodes)
            if any(self.edges.values()):
                attentions = {i: torch.cat(p) for i, p in self.attn.items()}
                edges = {i: torch.cat(p, dim=1) for i, p in self.edges.items()}
            elif not self.is_graph:
                attentions = {i: torch.cat([_pad_seq(_pad_seq(P, T, 2), T, 3) for P in p])
                              for i, p in self.attn.items()}
        extra = {"num_batches": self.num_batches, "model": model_name, "num_attention_examples": self.num_attention}
        if self.half is not None:  # the resolution of the widened tokens, which layer_reports' spectra respect
            extra["precision"] = str(self.half).removeprefix("torch.")
        outputs = None
        if self.keep_outputs:  # per-token outputs (B, T, V) of batches of different lengths: padded like the states
            dense = all(x.ndim == 3 for x in first) and all(o.ndim >= 3 for o in self.outputs)
            T_out = max(o.shape[1] for o in self.outputs) if dense else 0
            outputs = torch.cat([_pad_seq(o, T_out, 1) if dense else o for o in self.outputs])
        return LayerCapture(states, mask, labels, attentions, edges, outputs, extra)


def _check_capture_limits(max_examples: object, max_attention_examples: object) -> tuple[int, int]:
    """``max_examples`` a positive int and ``max_attention_examples`` a non-negative int (numpy ints too, bools
    refused), as Python ints."""
    if not _is_int(max_examples) or max_examples < 1:
        raise ValueError(f"max_examples must be a positive int, got {max_examples!r}")
    if not _is_int(max_attention_examples) or max_attention_examples < 0:
        raise ValueError(f"max_attention_examples must be a non-negative int, got {max_attention_examples!r}")
    return int(max_examples), int(max_attention_examples)  # type: ignore[call-overload]


def capture_dataset(
    model: nn.Module,
    batches: Iterable[Any],
    *,
    layers: Iterable[int] | None = None,
    max_examples: int = 512,
    attentions: bool = False,
    max_attention_examples: int = 64,
    keep_outputs: bool = False,
    forward: Callable[[nn.Module, Any], Any] | None = None,
    device: str | torch.device | None = None,
) -> LayerCapture:
    r"""Stream ``batches`` through ``model`` and keep the residual stream of the first sequences.

    Memory bound: the raw tokens of at most ``max_examples`` sequences (graphs) are kept,
    on the CPU in float32 (float64 for a float64 model: twice that, and the collapse it measures reaches float64's
    resolution, not float32's 1e-7), i.e. ``max_examples * T * D * len(layers) * 4`` bytes, plus dense
    attention maps of at most ``max_attention_examples`` sequences
    (``A * H * T^2 * 4`` bytes per block). Iteration stops as soon as ``max_examples`` sequences
    are captured (no further batch is drawn), and the last batch is cut to fit before it
    runs. The model runs under ``torch.no_grad()`` in eval mode; the training mode of every
    submodule is restored and all hooks are removed afterwards (also on error).

    Each batch is ``inputs`` or ``(inputs, labels)`` (a 2-tuple is always read as the latter:
    write ``((a, b), None)`` for ``model(a, b)`` without labels):

    - ``inputs`` a tensor (``model(inputs)``: images for a ViT, token ids for a GPT), a tuple of
      tensors (``model(*inputs)``; the first counts the sequences, and a batch cut to fit cuts the tensors of its
      leading size, passing the others, such as a shared ``(T, T)`` mask or a ``None``, as they are; where a
      shared tensor cannot be told from a per-sequence one by its shape, ``(B, B)`` when ``T == B``, the batch
      runs whole and only its first sequences' records are kept) or a PyG
      ``Data``/``Batch``
      (``model(b.x, b.edge_index, b.batch)``, with ``num_graphs=b.num_graphs`` where the model's forward
      takes it: a trailing graph without nodes keeps its row; ``edge_attr=b.edge_attr`` and ``pe=b.pe`` for a
      model whose config sets ``edge_dim`` / ``pe``); pass ``forward(model, inputs)`` to call differently.
      A graph model needs the Data/Batch: its graphs are counted and cut by the batch vector, and a
      tuple ``(x, edge_index, batch)`` is refused with a ``TypeError``;
    - dense blocks called with a ``key_padding_mask`` (``forward=lambda m, b: m(*b)`` for ``model(x, pad)``): its
      padded tokens are left out by ``mask`` (they must come last in each sequence: a ``ValueError`` otherwise);
    - ``labels`` one per sequence ``(B,)``, per token ``(B, T)`` (``-100`` = none), or, for graph
      batches, per graph ``(G,)`` or per node ``(N,)`` (padded like the nodes).

    Args:
        model: a model with ``model.blocks`` (ViT, GPT, graph transformer, or any such); a
            ``DistributedDataParallel``/``DataParallel`` wrapper of one too (hooks on ``model.module.blocks``), or
            a ``torch.compile`` one; the wrapped model itself runs (eagerly, as does a model compiled in place with
            ``model.compile()``), so the hooks always fire.
        batches: an iterable of batches (consumed lazily).
        layers: residual-stream indices to keep, ``0..L`` (default: all ``L + 1``).
        max_examples: number of sequences to keep (``>= 1``).
        attentions: also keep each captured block's attention weights.
        max_attention_examples: number of leading sequences whose attention weights are kept
            (``0``: none, and ``attentions`` of the result is ``None``).
        keep_outputs: also keep the model outputs (e.g. logits, for predictions).
        forward: ``forward(model, inputs) -> output``; default as described above.
        device: where to run (inputs are moved there; the model is not moved).

    Returns:
        A :class:`LayerCapture`.

    Shapes:
        dense states ``(B, T, D)``; graph states ``(G, N_max, D)`` with ``mask`` ``(G, N_max)`` (a graph
        without nodes is a row of length 0, also when its batch holds no node at all).

    Examples:
        >>> from diffusionformer.models import DiffusionViT, ViTConfig
        >>> vit = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=8, depth=2, num_heads=2))
        >>> batches = [(torch.randn(3, 1, 8, 8), torch.tensor([0, 1, 2]))] * 4
        >>> cap = capture_dataset(vit, batches, max_examples=5, attentions=True, max_attention_examples=2)
        >>> cap.layers, cap.states[2].shape, cap.labels.tolist(), cap.attentions[0].shape
        ([0, 1, 2], torch.Size([5, 5, 8]), [0, 1, 2, 0, 1], torch.Size([2, 2, 5, 5]))
    """
    max_examples, max_attention_examples = _check_capture_limits(max_examples, max_attention_examples)
    _check_flag(keep_outputs, "keep_outputs")  # keep_outputs="no" is truthy: outputs kept (memory) where none were asked
    run = forward if forward is not None else _default_forward
    dev = None if device is None else _device_argument("device", device)
    recorder = LayerRecorder(model, layers, attentions)
    recorder.compute_attentions = max_attention_examples > 0
    collector = _Collector(recorder, max_attention_examples, keep_outputs)
    count = drawn = 0
    # the wrapped model runs eagerly: a torch.compile'd model that already ran skips hooks registered later (dynamo
    # does not guard on them), and nothing was recorded
    inner = _innermost(model)
    # eval mode, each submodule's own mode put back after (a frozen part stays in eval)
    with _evaluating(model), torch.no_grad(), recorder:
        for index, item in enumerate(batches):
            drawn += 1
            inputs, labels = _split_item(item)
            n = _num_sequences(inputs)
            if n == 0:
                continue
            if n > max_examples - count:
                n = max_examples - count
                if _cut_is_ambiguous(inputs):  # run whole: the collector keeps the records of the first n
                    labels = None if labels is None else labels[:n]
                else:
                    inputs, labels = _head(inputs, labels, n)
            inputs = _to_device(inputs, dev)
            recorder.clear()
            out = run(inner, inputs)
            collector.add(inputs, labels, out, n, index)
            count += n
            if count >= max_examples:
                break
    if count == 0:
        got = "" if drawn == 0 else f" of sequences: its {drawn} batch(es) all held 0 sequences"
        raise ValueError(f"capture_dataset got no examples: `batches` was empty{got}")
    return collector.finish(type(inner).__name__)

