"""Torch's factory keyword arguments (``device=``, ``dtype=``) of the nn layers.

Every :mod:`torch.nn` layer takes them (``nn.Linear(4, 4, device="meta", dtype=torch.bfloat16)``), and
:func:`torch.nn.utils.skip_init` calls a layer class with ``device="meta"``. A layer passes them on to the
torch layers it builds (so its projections and norms are initialised in that dtype, as torch's are), builds the
rest (head operators, activation and user-given parts) under ``with torch.device(device)`` and casts those to
``dtype`` as :meth:`torch.nn.Module.to` does; with neither given nothing changes.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

__all__: list[str] = []


def _check_factory(device: Any, dtype: Any, where: str) -> tuple[torch.device | None, torch.dtype | None]:
    """``(device, dtype)`` of a layer's constructor checked: ``None`` or a torch device (``torch.device``, a str such
    as ``"cuda:0"``, an index), ``None`` or a floating-point ``torch.dtype``; else an error naming ``where`` and the
    value (torch's ``nn.Linear`` says "argument 'dtype' must be torch.dtype, not str" for ``"float32"``, and for
    ``torch.int64`` "Only Tensors of floating point and complex dtype can require gradients", naming neither)."""
    if dtype is not None:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"{where}: dtype must be a torch.dtype such as torch.float32 (or None), got "
                            f"{type(dtype).__name__} ({dtype!r})")
        if not dtype.is_floating_point:  # complex too: the softmax, norms and operators are real
            raise TypeError(f"{where}: dtype must be a floating-point torch.dtype (torch.float32, torch.float64, "
                            f"torch.bfloat16, torch.float16): the parameters are learned, got {dtype}")
    if device is not None:
        if isinstance(device, bool):  # torch.device(True) is the device of index 1
            raise TypeError(f"{where}: device must be a torch.device, a str or an index (or None), got {device!r}")
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as e:  # torch's own message lists the device types
            raise type(e)(f"{where}: device={device!r} is not a torch device: {e}") from e
    return device, dtype


def _on_device(device: torch.device | None) -> Any:
    """``with torch.device(device)`` (tensors made without a device go there), or nothing for ``None``."""
    return contextlib.nullcontext() if device is None else device


def _cast_part(module: nn.Module, device: torch.device | None, dtype: torch.dtype | None,
               given: bool = False) -> nn.Module:
    """``module`` (a part a layer did not build with the factory arguments itself: a head operator, an activation,
    a user's callable's module, or an instance ``given`` to the layer) moved to ``device`` and its floating-point
    tensors cast to ``dtype``, in place, as :meth:`torch.nn.Module.to` does (integer and bool buffers kept, an
    operator's fixed constants in float64 or float32, never half). A part built here, in the default dtype, is not
    cast to that same dtype: ``dtype=torch.float32`` builds the layer built without it (a ``.to(torch.float32)``
    made ppr's float64 constant ``alpha`` float32)."""
    if not given and dtype == torch.get_default_dtype():
        dtype = None
    if device is None and dtype is None:
        return module
    return module.to(device=device, dtype=dtype)
