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
import sys
import json
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

if importlib.util.find_spec("triton") is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (``-n N``) each worker process gets its share of the cores for torch's
# intra-op threads, by the runner's rule for its workers (diffusionformer.experiments.threads:
# $OMP_NUM_THREADS when set, else cores // N): N processes with a thread per core each
# oversubscribe the machine.
_XDIST_WORKERS = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
if _XDIST_WORKERS.isdigit() and int(_XDIST_WORKERS) > 1:
    from diffusionformer.experiments.threads import plan_threads

    torch.set_num_threads(plan_threads(workers=int(_XDIST_WORKERS)).threads)


@pytest.fixture
def task_adapters():
    """The task-adapter registry (``experiments.tasks._ADAPTERS``), restored after the test whatever it registered."""
    from diffusionformer.experiments import tasks

    before = dict(tasks._ADAPTERS)
    yield tasks._ADAPTERS
    tasks._ADAPTERS.clear()
    tasks._ADAPTERS.update(before)


def _write_run_folder(rdir: Path, *, dim: int = 16, heads: str = "attention:1,laplacian:1",
                      summary: dict[str, Any] | None = None) -> tuple[Path, torch.nn.Module]:
    """A run folder as the runner leaves it: ``run_config.json`` and a trainer checkpoint (step 3) of a tiny
    vit-digits model (seed 0), and ``summary.json`` when ``summary`` is given; returns it and the model in eval mode."""
    from diffusionformer.config import config_to_dict
    from diffusionformer.models import get_preset
    from diffusionformer.train import TrainConfig
    from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT, model_record, save_checkpoint

    preset = get_preset("vit-digits")
    config = preset.config_cls(**{**preset.defaults, "dim": dim, "depth": 1, "num_heads": 2, "heads": heads})
    torch.manual_seed(0)
    model = preset.model_cls(config)
    rdir.mkdir(parents=True)
    (rdir / "run_config.json").write_text(json.dumps({"model": "vit-digits", "model_config": config_to_dict(config)}))
    save_checkpoint(rdir / "checkpoint.pt", {"format": CHECKPOINT_FORMAT, "step": 3, "model": model.state_dict(),
                                             "optimizer": {}, "rng": {}, "config": TrainConfig().to_dict(),
                                             "model_record": model_record(model)})
    if summary is not None:
        (rdir / "summary.json").write_text(json.dumps(summary))
    return rdir, model.eval()


@pytest.fixture
def run_folder() -> Callable[..., tuple[Path, torch.nn.Module]]:
    """``run_folder(rdir, *, dim=16, heads=..., summary=None) -> (rdir, model)``: a saved run of a tiny vit-digits
    model for the reload tests (tests/experiments, tests/reliability)."""
    return _write_run_folder


@pytest.fixture(scope="session")
def nanogpt_reference():
    """nanoGPT's ``model.py`` as reproduced in ``tests/models/nanogpt_reference.py`` (MIT), loaded by path once;
    ``.diffusionformer_names(n_layer)`` maps its parameter names to :class:`DiffusionGPT`'s."""
    name = "diffusionformer_tests_nanogpt_reference"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "models" / "nanogpt_reference.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        module.diffusionformer_names = _nanogpt_names
    return sys.modules[name]


def _nanogpt_names(n_layer: int) -> dict[str, str]:
    """nanoGPT parameter name -> DiffusionGPT parameter name, for ``n_layer`` blocks."""
    out = {"transformer.wte.weight": "tok_emb.weight", "transformer.wpe.weight": "pos_emb.weight",
           "transformer.ln_f.weight": "norm.weight", "transformer.ln_f.bias": "norm.bias",
           "lm_head.weight": "lm_head.weight"}
    parts = {"ln_1": "norm1", "attn.c_attn": "attn.qkv", "attn.c_proj": "attn.out_proj", "ln_2": "norm2",
             "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
    for i in range(n_layer):
        for a, b in parts.items():
            for kind in ("weight", "bias"):
                out[f"transformer.h.{i}.{a}.{kind}"] = f"blocks.{i}.{b}.{kind}"
    return out
