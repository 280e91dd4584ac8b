"""Moving nested batches between devices."""

from __future__ import annotations

import copy
from collections import UserDict
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["to_device"]


def to_device(batch: Any, device: torch.device) -> Any:
    """Recursively move the tensors of ``batch`` to ``device``.

    Tensors are moved with ``non_blocking=True`` to an accelerator (a copy that overlaps the
    host's work; the device's stream orders it before any kernel reading it) and blocking to
    the CPU (a non-blocking copy from a GPU may be read on the host before it has landed);
    mappings, ``list`` and ``tuple`` (named tuples included) are rebuilt with their type (a ``dict`` subclass or
    ``UserDict`` is copied and updated, so a ``defaultdict`` keeps its factory; a mapping that cannot be rebuilt
    becomes a ``dict``); objects with a ``.to(device)`` method (e.g. a PyG ``Data``, or a named tuple such as a
    ``PackedSequence``) are moved by it (a PyG ``Data`` or an ``nn.Module`` in place: their ``.to`` moves
    the caller's object); other values (ints, strings, ``None``, and containers not named here: a
    dataclass, a ``set``, a ``deque``) are returned as they are, their tensors unmoved.

    Args:
        batch: a tensor, a nested container, or an object with ``.to``.
        device: the target device.

    Examples:
        >>> b = to_device({"x": torch.ones(2), "meta": [1, torch.zeros(1)]}, torch.device("cpu"))
        >>> b["x"].device, b["meta"][0]
        (device(type='cpu'), 1)
    """
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=torch.device(device).type != "cpu")
    if isinstance(batch, Mapping):
        return _rebuild_mapping(batch, {k: to_device(v, device) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # named tuple
        if callable(getattr(type(batch), "to", None)):  # a PackedSequence: its batch_sizes must stay on the CPU
            return batch.to(device)
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    to = getattr(batch, "to", None)
    # a class is a plain value: its ``to`` is an unbound method (``nn.Linear.to(device)`` is a crash, not a move)
    if callable(to) and not isinstance(batch, (str, bytes, type)):
        return to(device)
    return batch


def _rebuild_mapping(batch: Mapping, moved: dict) -> Any:
    """``moved`` (the new values of ``batch``'s items) as a mapping of ``batch``'s type, the caller's untouched."""
    if type(batch) is dict:
        return moved
    try:  # keep the mapping's type: an OrderedDict, a defaultdict's factory, a UserDict's attributes (a
        if isinstance(batch, (dict, UserDict)):  # copy with storage of its own, so the caller's is untouched)
            clone = copy.copy(batch)
            clone.update(moved)
            return clone
        return type(batch)(moved)  # other mappings are built from a dict, as torch's pin_memory does
    except TypeError:  # one that cannot be: a plain dict
        return moved
