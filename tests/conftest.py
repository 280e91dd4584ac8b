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

# Under pytest-xdist (``-n N``) each worker process gets its share of the cores for torch's
# intra-op threads, as the runner's workers do (diffusionformer.experiments.threads): N processes
# with a thread per core each oversubscribe the machine. An explicit $OMP_NUM_THREADS is kept.
_XDIST_WORKERS = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
if _XDIST_WORKERS.isdigit() and int(_XDIST_WORKERS) > 1 and not os.environ.get("OMP_NUM_THREADS", "").strip():
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, _cores // int(_XDIST_WORKERS)))
