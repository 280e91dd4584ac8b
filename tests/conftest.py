"""Settings of the whole test session that must be in place before any test module is imported.

``TRITON_INTERPRET=1`` without a CUDA device: the Triton kernel tests (tests/ops) then run on CPU
tensors under the interpreter. It is set here, at the root, because importing PyG (the conftests
of tests/data and tests/graph do) imports triton, and a triton imported before the variable is
set runs the kernels compiled, which on CPU fails with "Cannot call @triton.jit'd outside of the
scope of a kernel". tests/ops/conftest.py keeps the same rule for runs of that folder alone.
"""

from __future__ import annotations

import importlib.util
import os

import torch

if importlib.util.find_spec("triton") is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
