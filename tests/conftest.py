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


@pytest.fixture(scope="session", autouse=True)
def _session_cache_env(tmp_path_factory: pytest.TempPathFactory):
    """``$DIFFUSIONFORMER_CACHE`` in a session folder for every test, so that no test writes the user's
    ``~/.cache/diffusionformer`` (tests/data puts its own in place for each of its modules)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DIFFUSIONFORMER_CACHE", str(tmp_path_factory.mktemp("session_cache")))
        yield


# pytest's own per-test variable, and what a library imported lazily (inside a test) sets once for the process:
# scikit-learn and joblib (KMP_*, at their import), torch at its CUDA initialisation (CUDA_MODULE_LOADING),
# inductor at its first compile (TORCHINDUCTOR_CACHE_DIR, _TORCHINDUCTOR_*); and the folders such an import appends
# to sys.path (setuptools adds its _vendor folder, under site-packages)
_ENV_NOT_GUARDED = frozenset({"PYTEST_CURRENT_TEST", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK", "CUDA_MODULE_LOADING",
                              "TORCHINDUCTOR_CACHE_DIR"})
_ENV_PREFIXES_NOT_GUARDED = ("_TORCHINDUCTOR_",)


def _guarded_env(key: str) -> bool:
    return key not in _ENV_NOT_GUARDED and not key.startswith(_ENV_PREFIXES_NOT_GUARDED)


def _guarded_path(entry: str) -> bool:
    return "site-packages" not in entry


def _process_state() -> dict[str, Any]:
    """The process-wide state a test must leave as it found it (a test that changes one without restoring it
    makes the tests after it order-dependent)."""
    return {
        "os.environ": {k: v for k, v in os.environ.items() if _guarded_env(k)},
        "torch default dtype": torch.get_default_dtype(),
        "torch grad mode": torch.is_grad_enabled(),
        "torch inference mode": torch.is_inference_mode_enabled(),
        "_torch num_threads": torch.get_num_threads(),  # not compared: put back after every test (see below)
        "torch deterministic algorithms": (torch.are_deterministic_algorithms_enabled(),
                                           torch.is_deterministic_algorithms_warn_only_enabled()),
        "torch anomaly mode": torch.is_anomaly_enabled(),
        "torch float32 matmul precision": torch.get_float32_matmul_precision(),
        "cwd": os.getcwd(),
        "sys.path": [p for p in sys.path if _guarded_path(p)],
        "_sys.path in full": list(sys.path),  # not compared: what is put back
        **{f"registry {m}.{n}": dict(getattr(sys.modules[m], n)) for m, n in _REGISTRIES if m in sys.modules},
    }


# the package's registries (a test that registers must unregister, or use a fixture that restores them); read only
# where the module is imported already, so that the check imports nothing
_REGISTRIES = (("diffusionformer.operators.registry", "_REGISTRY"), ("diffusionformer.operators.registry", "_ALIASES"),
               ("diffusionformer.models.registry", "_PRESETS"), ("diffusionformer.data.registry", "_REGISTRY"),
               ("diffusionformer.analysis.report", "_METRICS"), ("diffusionformer.experiments.tasks", "_ADAPTERS"))


def _restore_process_state(state: dict[str, Any]) -> None:
    for k in [k for k in os.environ if _guarded_env(k) and k not in state["os.environ"]]:
        del os.environ[k]
    os.environ.update(state["os.environ"])
    torch.set_default_dtype(state["torch default dtype"])
    torch.set_grad_enabled(state["torch grad mode"])
    torch.set_num_threads(state["_torch num_threads"])
    torch.use_deterministic_algorithms(state["torch deterministic algorithms"][0],
                                       warn_only=state["torch deterministic algorithms"][1])
    torch.set_anomaly_enabled(state["torch anomaly mode"])
    torch.set_float32_matmul_precision(state["torch float32 matmul precision"])
    os.chdir(state["cwd"])
    sys.path[:] = state["_sys.path in full"]
    for m, n in _REGISTRIES:
        if f"registry {m}.{n}" in state:
            registry = getattr(sys.modules[m], n)
            registry.clear()
            registry.update(state[f"registry {m}.{n}"])


def _describe_change(name: str, before: Any, after: Any) -> str:
    if name.startswith("registry "):
        return f"{name}: added {sorted(map(str, after.keys() - before.keys()))}, removed " \
               f"{sorted(map(str, before.keys() - after.keys()))}, replaced " \
               f"{sorted(str(k) for k in before.keys() & after.keys() if before[k] is not after[k])}"
    if name == "sys.path":
        added, removed = [p for p in after if p not in before], [p for p in before if p not in after]
        return f"sys.path: added {added}, removed {removed}"
    if name != "os.environ":
        return f"{name}: {before!r} -> {after!r}"
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return "os.environ: " + ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in changed)


@pytest.fixture(autouse=True)
def _leaves_process_state_as_found():
    """Fail (an error at teardown) a test that leaves os.environ, torch's default dtype, grad / inference /
    anomaly mode, deterministic-algorithms flag, float32 matmul precision, the cwd, sys.path or the package's
    registries changed, and put them back so that the tests after it are not affected; torch's intra-op thread
    count is put back after every test without failing it. Use ``monkeypatch`` (undone before this check) or
    try/finally. About 0.1 ms a test."""
    before = _process_state()
    yield
    after = _process_state()
    if after["_torch num_threads"] != before["_torch num_threads"]:
        # put back without failing: the CLI's `main`, which tests call in-process, sets the process's threads by its
        # plan for the machine's cores, as a command does (whether that changes them depends on the cores and the
        # number of xdist workers: a check would pass on one machine and fail on another)
        torch.set_num_threads(before["_torch num_threads"])
    changes = [_describe_change(k, before[k], after[k]) for k in before
               if not k.startswith("_") and k in after and before[k] != after[k]]
    if changes:
        _restore_process_state(before)
        pytest.fail("the test left process-wide state changed:\n  " + "\n  ".join(changes), pytrace=False)


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
        # the library's map, the one DiffusionGPT.from_nanogpt reads (imported here: after TRITON_INTERPRET is set)
        from diffusionformer.models.gpt import _nanogpt_names

        module.diffusionformer_names = _nanogpt_names
    return sys.modules[name]
