"""Placeholder modules that a layer may skip instead of calling.

Layers keep optional parts as attributes even when they are off (``Block.ls1`` without
LayerScale, ``Block.drop_path`` without stochastic depth, ``DiffusionAttention.q_norm`` without
q/k norm), so state dicts, ``repr`` and user code see the same names whatever the options.
An off part is an :class:`torch.nn.Identity`, and calling one costs a module call (about a
microsecond of Python per call, several per layer) for nothing. A layer skips such a module
when skipping cannot be observed: the module is exactly ``nn.Identity`` (not a subclass) and no
hook, its own or a global one, would run on the call (hooks such as those of model-summary
tools still see every module).
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules import module as _module

__all__ = ["global_hooks", "is_noop"]


def global_hooks() -> bool:
    """Whether any global module hook (``torch.nn.modules.module.register_module_*_hook``) is registered."""
    return bool(_module._global_forward_hooks or _module._global_forward_pre_hooks
                or _module._global_backward_hooks or _module._global_backward_pre_hooks)


def is_noop(m: nn.Module, hooked: bool | None = None) -> bool:
    """Whether calling ``m`` would return its input and run nothing else: a hook-free ``nn.Identity``.

    Args:
        m: the module.
        hooked: :func:`global_hooks` when the caller has it already (one check for several modules).

    Examples:
        >>> is_noop(nn.Identity()), is_noop(nn.Dropout(0.0))
        (True, False)
        >>> m = nn.Identity(); h = m.register_forward_hook(lambda mod, inp, out: None)
        >>> is_noop(m)
        False
    """
    if type(m) is not nn.Identity:
        return False
    if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
        return False
    return not (global_hooks() if hooked is None else hooked)
