"""Triton kernel tests: without a CUDA device they run under the Triton interpreter on CPU.

``TRITON_INTERPRET`` is read by ``triton.jit`` when a kernel is *decorated*, i.e. when
``diffusionformer.ops.triton._kernels`` is imported, so it is set here, before any test module of
this folder imports the kernels (importing torch or triton earlier does not matter: triton reads
the variable lazily). If the kernel module was already imported without it (for instance by
pytest's doctest collection of the package, run first), the ``triton_kernels`` fixture reloads it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if HAS_TRITON and DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

requires_triton = pytest.mark.skipif(
    not HAS_TRITON, reason="triton is not installed (pip install 'triton>=3.3'; Linux wheels only)"
)


@pytest.fixture
def triton_kernels():
    """The kernel module, interpreted when there is no CUDA device."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed (pip install 'triton>=3.3'; Linux wheels only)")
    from diffusionformer.ops.triton import _kernels

    if DEVICE == "cpu" and type(_kernels._first_step).__name__ != "InterpretedFunction":
        _kernels = importlib.reload(_kernels)
    return _kernels
