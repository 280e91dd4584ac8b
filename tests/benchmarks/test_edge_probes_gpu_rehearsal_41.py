"""Probe 41: rehearsal on CPU of the GPU sitting's scripts (``benchmarks/gpu_suite.sh``, its ``bench_*.py``,
``experiments/scripts/gpu_study.sh``) under the GPU image's versions (torch 2.11, triton 3.6).

The scripts' CUDA-only branches (``torch.cuda.*`` memory counters and synchronisation, the CUDA profiler activity,
``torch.get_autocast_dtype`` on the library's autocast path, ...) never run on a CPU test machine, so a torch API
renamed or removed between the CPU and the GPU image's torch would first show on the GPU, as an AttributeError
after minutes of device time. The pin below resolves every such name the package, the benchmarks and the
experiment scripts spell out against the installed torch.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

# the device-only namespaces (and the autocast queries) whose members a CPU run never reaches
_DEVICE_API = re.compile(
    r"\btorch\.(?:cuda|amp|backends|compiler|library|profiler|nn\.attention|accelerator|autograd\.DeviceType)"
    r"(?:\.[A-Za-z_]\w*)+"
    r"|\btorch\.(?:get_autocast_dtype|is_autocast_enabled|set_autocast_dtype)\b"
)


def _resolves(name: str) -> bool:
    obj: object = torch
    parts = name.split(".")[1:]
    for i, part in enumerate(parts):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:  # a submodule that is not imported by ``import torch`` (torch.nn.attention, say)
            obj = importlib.import_module("torch." + ".".join(parts[: i + 1]))
        except ImportError:
            return False
    return True


def test_pins_device_only_torch_apis_exist_in_the_installed_torch():
    """Every ``torch.cuda.*`` / ``torch.amp.*`` / profiler / autocast name used by the package, the benchmarks and
    the experiment scripts resolves in the installed torch (the CUDA-only branches are never run on CPU)."""
    names: set[str] = set()
    for folder in ("diffusionformer", "benchmarks", "experiments"):
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(_DEVICE_API.findall(path.read_text(encoding="utf-8")))
    assert "torch.cuda.max_memory_allocated" in names and "torch.get_autocast_dtype" in names  # the scan sees them
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, f"torch {torch.__version__} has no {missing}"
