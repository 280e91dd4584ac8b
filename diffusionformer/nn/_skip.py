"""Placeholder modules that a layer may skip instead of calling.

Layers keep optional parts as attributes even when they are off (``Block.ls1`` without
LayerScale, ``Block.drop_path`` without stochastic depth, ``DiffusionAttention.q_norm`` without
q/k norm), so state dicts, ``repr`` and user code see the same names whatever the options.
An off part is an :class:`torch.nn.Identity`, and calling one costs a module call (about a
microsecond of Python per call, several per layer) for nothing. A layer skips such a module
when skipping cannot be observed: the module is exactly ``nn.Identity`` (not a subclass), its
``forward`` is the class's (not replaced on the instance, as ``accelerate``'s
``add_hook_to_module`` does) and no hook, its own or a global one, would run on the call (hooks
such as those of model-summary tools still see every module).
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules import module as _module

__all__ = ["is_noop"]


def is_noop(m: nn.Module) -> bool:
    """Whether calling ``m`` would return its input and run nothing else: a hook-free ``nn.Identity``
    whose ``forward`` was not replaced on the instance.

    The test of :meth:`torch.nn.Module.__call__` for "no hook to run" (the module's own hooks and
    the global ones of ``torch.nn.modules.module.register_module_*_hook``), written out: layers ask
    it several times per call.

    Examples:
        >>> is_noop(nn.Identity()), is_noop(nn.Dropout(0.0))
        (True, False)
        >>> m = nn.Identity(); h = m.register_forward_hook(lambda mod, inp, out: None)
        >>> is_noop(m)
        False
    """
    # an instance attribute ``forward`` (a wrapper set by a tool) runs on the call: Module.__call__ reads self.forward
    return type(m) is nn.Identity and "forward" not in m.__dict__ and not (
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
        or _module._global_forward_hooks or _module._global_forward_pre_hooks
        or _module._global_backward_hooks or _module._global_backward_pre_hooks
    )
