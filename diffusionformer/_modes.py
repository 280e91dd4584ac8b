"""Module modes shared by concurrent calls: :func:`_evaluating`.

Private; used by the models' read-only passes (``DiffusionGPT.generate``, ``DiffusionViT.attention_maps``) and by
the analysis passes (``capture_dataset``, ``analyze_run``), which switch a model to eval mode and put every module's
own mode back (a frozen submodule of a training model stays in eval mode).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator

from torch import nn

#: model -> [calls inside :func:`_evaluating`, every module's mode before the first of them]
_EVAL_HOLDS: "weakref.WeakKeyDictionary[nn.Module, list]" = weakref.WeakKeyDictionary()
_EVAL_LOCK = threading.Lock()


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode while the block runs, every module's own mode put back when the last of the calls
    running at once (threads generating with one model) ends: each call saving and restoring the modes itself, the
    second saved the first's eval modes, and the first put training mode back while the second was decoding."""
    with _EVAL_LOCK:
        hold = _EVAL_HOLDS.get(model)
        if hold is None:
            hold = _EVAL_HOLDS[model] = [0, [(module, module.training) for module in model.modules()]]
            model.eval()
        hold[0] += 1
    try:
        yield
    finally:
        with _EVAL_LOCK:
            hold[0] -= 1
            if hold[0] == 0:
                del _EVAL_HOLDS[model]
                for module, mode in hold[1]:
                    module.training = mode
