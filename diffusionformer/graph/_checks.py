"""Input validation shared by the graph builders (clear errors, no bare asserts)."""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from diffusionformer.config import _choice_hint

__all__ = ["LAYOUTS", "check_int", "check_layout", "check_within_graphs"]

#: the two layouts of an :class:`~diffusionformer.graph.AttentionGraph`
LAYOUTS: tuple[str, ...] = ("dense", "sparse")


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as a Python int ``>= minimum`` (numpy ints too); TypeError for non-integers (bools included),
    ValueError below the bound. A symbolic size (a ``torch.SymInt``, as ``x.shape[1]`` is while
    :func:`torch.export.export` traces without dynamo with a dynamic dimension) is checked and kept symbolic."""
    if isinstance(value, torch.SymInt):
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
        return value  # type: ignore[return-value]  # int() would specialise the traced size
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_layout(layout: object) -> str:
    """``layout`` if it is ``"dense"`` or ``"sparse"``, else ValueError."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}{_choice_hint(layout, LAYOUTS)}")
    return str(layout)


def check_within_graphs(edge_index: Tensor, batch: Tensor) -> None:
    """ValueError when an edge of ``edge_index`` ``(2, E)`` joins two graphs of ``batch`` ``(N,)`` (the edges of a
    batch of graphs are block-diagonal); reads the values (a host synchronisation)."""
    if edge_index.numel() > 0:
        crossing = int((batch[edge_index[0]] != batch[edge_index[1]]).sum())
        if crossing:
            raise ValueError(f"edge_index connects nodes of different graphs ({crossing} edges with "
                             "batch[source] != batch[target]); graphs in a batch must be block-diagonal")


def _plain_ids(t: Tensor) -> Tensor:
    """A PyG ``EdgeIndex`` or ``Index`` (wrapper subclasses of Tensor) as its plain tensor (``as_tensor()``), other
    tensors as they are. Their metadata (a sparse size, a sort order) is PyG's to keep up to date, not ours: kept
    through our graphs it went stale (a size (3, 3) on 6 nodes reached PyG's GINConv, "expected size 3"), every op
    paid ``__torch_function__`` (2x a layer), and PyG's own ``is_undirected``/``coalesce`` failed on an EdgeIndex
    ("'Tensor' object has no attribute 'dim_size'")."""
    if type(t) is not Tensor and callable(getattr(t, "as_tensor", None)):
        return t.as_tensor()
    return t
