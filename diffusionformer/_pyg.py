"""PyG imported without its known import-time deprecation warning: :func:`_import_pyg`.

Private; called before each (lazy) ``import torch_geometric...`` of the package, so that a user's script run with
``python -W error`` (or under ``warnings.simplefilter("error")``) can use the graph models and data.
"""

from __future__ import annotations

import importlib
import sys
import warnings

#: PyG 2.8 decorates some of its functions with ``torch.jit.script`` at import, which torch >= 2.10 deprecates (and
#: on Python 3.14 says is unsupported): a ``DeprecationWarning`` from a third party's import, an error under
#: ``-W error`` at our first use of a graph model or dataset
_JIT_SCRIPT_DEPRECATED = r"`torch\.jit\.script` is (deprecated|not supported in Python 3\.14\+)"


def _import_pyg() -> None:
    """Import ``torch_geometric`` (a ``ModuleNotFoundError`` when it is not installed), silencing exactly the
    deprecation warning of ``torch.jit.script`` that its import gives; nothing once it is imported (the warning
    filters are then left alone: no ``catch_warnings`` per call)."""
    if "torch_geometric" in sys.modules:
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_JIT_SCRIPT_DEPRECATED, category=DeprecationWarning)
        importlib.import_module("torch_geometric")  # and its subpackages
