"""The ImportError of a plotting function whose lazy ``import matplotlib`` failed: :func:`matplotlib_error`.

Private; used where a figure is drawn (``analysis.plots``, ``experiments.plots``, ``graph.export``); its
:func:`_not_installed` also by :func:`diffusionformer.data._optional.import_optional`.
"""

from __future__ import annotations


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
