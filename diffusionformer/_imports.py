"""How the package imports what it imports lazily: :func:`_lazy_exports`, :func:`_import_pyg`,
:func:`_not_installed` and :func:`matplotlib_error`.

Private. A package's names defined in a module with heavy imports are imported on first access
(:func:`_lazy_exports`, PEP 562); PyG is imported through :func:`_import_pyg` before each lazy
``import torch_geometric...``, so that a user's script run with ``python -W error`` (or under
``warnings.simplefilter("error")``) can use the graph models and data; an optional package whose import
fails is told apart from a missing one (:func:`_not_installed`: the data packages' ``import_optional``,
and :func:`matplotlib_error` where a figure is drawn). Imports nothing from the package.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any, Callable, Mapping


def _lazy_exports(module: str, names: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` (PEP 562) of the module named ``module`` whose ``names`` (name -> the
    module that defines it) are imported on first access, then kept in ``module``'s globals (later look-ups skip
    the hook), so that importing ``module`` does not import theirs."""

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            setattr(sys.modules[module], name, value)
            return value
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[module])) | set(names))

    return __getattr__, __dir__


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


def matplotlib_error(err: ImportError, missing: str, needs: str) -> ImportError:
    """``ImportError(missing)`` when ``err`` says matplotlib itself is not installed; else an ImportError that
    says it is installed but does not import, quoting ``err`` (a package it needs is missing, a broken build):
    "pip install" alone was false there, and the module at fault was named nowhere in the printed message. As
    :func:`diffusionformer.data._optional.import_optional` tells the two apart for the data packages.

    Args:
        err: the ImportError the ``import matplotlib...`` raised.
        missing: the message for a matplotlib that is not installed (unchanged from before).
        needs: what needs it, the message's start, e.g. ``"plots need"``.

    Examples:
        >>> str(matplotlib_error(ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib"), "m", "x needs"))
        'm'
        >>> str(matplotlib_error(ImportError("No module named 'kiwisolver'", name="kiwisolver"), "m", "x needs"))
        "x needs matplotlib, which is installed but does not import: No module named 'kiwisolver'"
    """
    if _not_installed(err, "matplotlib"):
        return ImportError(missing)
    return ImportError(f"{needs} matplotlib, which is installed but does not import: {err}")


def _not_installed(err: ImportError, module: str) -> bool:
    """Whether ``err``, raised by an ``import`` of ``module``, says that ``module``'s top-level package is not
    installed (a ``ModuleNotFoundError`` naming it, or naming nothing), not that it is installed but fails to import
    (a package it needs is missing, a broken build).

    Examples:
        >>> _not_installed(ModuleNotFoundError("No module named 'sklearn'", name="sklearn"), "sklearn.datasets")
        True
        >>> _not_installed(ModuleNotFoundError("No module named 'scipy'", name="scipy"), "sklearn.datasets")
        False
    """
    name = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else ""
    return name is None or (bool(name) and name.split(".")[0] == module.split(".")[0])
