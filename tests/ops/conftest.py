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



def _interpreter_problem() -> str | None:
    """Why the installed triton cannot interpret the kernels here, or ``None``.

    triton 3.6's interpreter turns a loop bound computed from a scalar argument into a
    one-element array and ``int()`` of that fails with numpy >= 2.4 ("only 0-dimensional arrays
    can be converted to Python scalars"); triton 3.7, 3.8 and 3.9 interpret the kernels with
    numpy 2.4, and triton 3.6 with numpy 2.3. Compiled kernels (a CUDA device) are not affected.
    """
    if not HAS_TRITON or DEVICE != "cpu":
        return None
    import numpy
    import triton

    def version(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("+")[0].split(".")[:2] if p.isdigit())

    if version(triton.__version__) < (3, 7) and version(numpy.__version__) >= (2, 4):
        return (f"triton {triton.__version__}'s interpreter fails with numpy {numpy.__version__} "
                "(pip install 'triton>=3.7' or 'numpy<2.4' to run the kernel tests on CPU)")
    return None


INTERPRETER_PROBLEM = _interpreter_problem()
requires_triton = pytest.mark.skipif(
    not HAS_TRITON or INTERPRETER_PROBLEM is not None,
    reason=INTERPRETER_PROBLEM or "triton is not installed (pip install 'triton>=3.6'; Linux wheels only)",
)


@pytest.fixture
def triton_kernels():
    """The kernel module, interpreted when there is no CUDA device."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed (pip install 'triton>=3.6'; Linux wheels only)")
    if INTERPRETER_PROBLEM is not None:
        pytest.skip(INTERPRETER_PROBLEM)
    from diffusionformer.ops.triton import _kernels

    if DEVICE == "cpu" and type(_kernels._first_step).__name__ != "InterpretedFunction":
        _kernels = importlib.reload(_kernels)
    return _kernels


@pytest.fixture
def fresh_dynamo():
    """An empty dynamo cache before and after the test: every compile test builds new modules, so none meets the
    recompile limit (past it dynamo would run the frame eagerly)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def example_spec():
    """``name -> "name(k=v, ...)"``: a registered operator's head spec with its ``example_kwargs`` (the arguments
    that exercise its code paths), the bare name without any."""
    from diffusionformer.operators import operator_class

    def spec(name: str) -> str:
        kwargs = operator_class(name).example_kwargs
        return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")" if kwargs else name

    return spec
