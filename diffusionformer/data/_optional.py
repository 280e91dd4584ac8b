"""Lazy imports of the optional data packages, with an error that names the extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from diffusionformer._imports import _not_installed

INSTALL_HINT = 'pip install "diffusionformer[data]"'


def import_optional(module: str, *, package: str, dataset: str) -> ModuleType:
    """Import ``module`` or raise an ImportError that says how to install it.

    Args:
        module: the module to import, e.g. ``"sklearn.datasets"``.
        package: the distribution that provides it, e.g. ``"scikit-learn"``.
        dataset: the dataset that needs it, for the message.

    Examples:
        >>> import_optional("json", package="json", dataset="demo").__name__
        'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        if _not_installed(err, module):
            raise ImportError(
                f"dataset {dataset!r} needs the optional package {package!r} "
                f"(module {module!r}), which is not installed: {INSTALL_HINT}"
            ) from err
        # the package is there but fails to import (a package it needs is missing, a broken build): "not
        # installed" was false, and the module at fault was named nowhere in the message the command line prints
        raise ImportError(
            f"dataset {dataset!r} needs the optional package {package!r} (module {module!r}), which is "
            f"installed but does not import: {err}: {INSTALL_HINT}"
        ) from err
