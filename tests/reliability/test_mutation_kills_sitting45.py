"""Mutation audit (sitting 45) of the library code changed that day: tests that kill mutants the day's tests left
alive (each docstring names the mutant). CUDA is simulated where named (``torch.cuda.is_available`` /
``get_device_name`` patched): no GPU is used.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data import _optional
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.outputs import manifest


def _broken_import(monkeypatch, exc: ImportError) -> None:
    def fail(name, package=None):
        raise exc

    monkeypatch.setattr(_optional.importlib, "import_module", fail)


def test_kills_optional_plain_importerror_called_missing(monkeypatch):
    """kills: data/_optional.py ``missing = ... else ""`` -> ``else None`` (an installed package whose import raises a
    plain ImportError, as a compiled extension built for another torch does, called "not installed")."""
    _broken_import(monkeypatch, ImportError("undefined symbol: _ZN3c10"))
    with pytest.raises(ImportError, match="installed but does not import: undefined symbol") as info:
        _optional.import_optional("sklearn.datasets", package="scikit-learn", dataset="digits")
    assert "which is not installed" not in str(info.value)


def test_kills_optional_nameless_modulenotfound_called_broken(monkeypatch):
    """kills: data/_optional.py ``if missing is None or (...)`` -> ``if (...)`` (a ModuleNotFoundError that names no
    module is the package missing: it is not said to be "installed but does not import")."""
    _broken_import(monkeypatch, ModuleNotFoundError("No module named sklearn"))
    with pytest.raises(ImportError, match="which is not installed") as info:
        _optional.import_optional("sklearn.datasets", package="scikit-learn", dataset="digits")
    assert "does not import" not in str(info.value)


def _two_tasks(**top):
    task = {"dataset": "digits", "model": "vit-digits", "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
            "train": {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0}}
    return load_experiment_config({
        "name": "where2", "seeds": [0], **top,
        "tasks": [{**task, "name": "on_cpu", "train": {**task["train"], "device": "cpu"}},
                  {**task, "name": "on_gpu1", "train": {**task["train"], "device": "cuda:1"}}],
        "operators": [{"name": "attention"}],
    })


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"SIMULATED GPU {device}")


def test_kills_manifest_names_the_gpu_index_the_runs_train_on(two_gpus):
    """kills: experiments/outputs.py ``_where_trained`` ``gpu = d.index or 0`` -> ``gpu = 0`` (``run --device cuda:1``
    on a two-GPU machine recorded GPU 0's name)."""
    assert manifest(_two_tasks(), device="cuda:1")["cuda"] == "SIMULATED GPU 1"
    assert manifest(_two_tasks(), device="cuda")["cuda"] == "SIMULATED GPU 0"


def test_kills_manifest_of_the_chosen_tasks_only(two_gpus):
    """kills: experiments/outputs.py ``_where_trained`` ``config.tasks if tasks is None else tasks`` -> ``config.tasks``
    (``run --task on_cpu`` trains on the CPU only: the GPU another task of the config would use is not recorded, and
    the CPU kernel set is)."""
    config = _two_tasks()
    cpu_only = manifest(config, None, [config.tasks[0]])
    assert cpu_only["cuda"] is None and cpu_only["cpu_kernels"] == torch.backends.cpu.get_cpu_capability()
    gpu_only = manifest(config, None, [config.tasks[1]])
    assert gpu_only["cuda"] == "SIMULATED GPU 1" and gpu_only["cpu_kernels"] is None
    both = manifest(config)
    assert both["cuda"] == "SIMULATED GPU 1" and both["cpu_kernels"] == torch.backends.cpu.get_cpu_capability()


def test_kills_pyg_import_silences_other_deprecations(monkeypatch):
    """kills: _imports.py ``filterwarnings("ignore", message=_JIT_SCRIPT_DEPRECATED, category=DeprecationWarning)`` ->
    without ``message=`` (every DeprecationWarning of PyG's import silenced, not only torch.jit.script's)."""
    import sys
    import warnings
    from types import SimpleNamespace

    from diffusionformer import _imports

    def fake_import(name):
        warnings.warn("`torch.jit.script` is deprecated. Please switch to torch.compile", DeprecationWarning)
        warnings.warn("some other deprecation of the import", DeprecationWarning)

    monkeypatch.delitem(sys.modules, "torch_geometric", raising=False)  # put back after the test
    monkeypatch.setattr(_imports, "importlib", SimpleNamespace(import_module=fake_import))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _imports._import_pyg()
    assert [str(w.message) for w in seen] == ["some other deprecation of the import"]


def test_kills_runner_gpu_call_notes_no_kernel_change(tmp_path, monkeypatch):
    """kills: experiments/runner.py ``if before and isinstance(record["cpu_kernels"], str) and ...`` -> ``if before
    and ...`` (an invocation training on the GPU only, after CPU runs, said "these with None" CPU kernels)."""
    import json

    from diffusionformer.experiments import runner as runner_mod
    from diffusionformer.experiments.runner import run_experiment

    cfg = load_experiment_config({
        "name": "gpucall", "seeds": [0],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0}}],
        "operators": [{"name": "attention"}],
    })
    out = tmp_path / "gpucall"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"git_commit": None, "cpu_kernels": "ELSEWHERE",
                                                   "cpu_kernel_sets": ["ELSEWHERE"]}), encoding="utf-8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "SIMULATED GPU")
    monkeypatch.setattr(runner_mod, "_one_run", lambda *a, **k: None)  # nothing trains: the record and note only
    said: list[str] = []
    run_experiment(cfg, tmp_path, progress=False, log=said.append)  # device "auto": the (simulated) GPU
    record = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert record["cuda"] == "SIMULATED GPU" and record["cpu_kernels"] is None, record
    assert record["cpu_kernel_sets"] == ["ELSEWHERE"], record
    assert not [s for s in said if "CPU kernels" in s], said


def test_kills_scatter_auto_uses_torch_scatter_on_cpu(monkeypatch):
    """kills: ops/scatter.py ``_use_torch_scatter`` ``src.is_cuda and _scatter_module() is not None`` ->
    ``_scatter_module() is not None`` (backend="auto" handed CPU tensors to torch-scatter where it is installed, and
    imported that CUDA accelerator in a CPU process); checked against index_add_ / scatter_reduce_ in float64."""
    from types import SimpleNamespace

    from diffusionformer.ops import scatter

    def used(*args, **kwargs):
        raise AssertionError("torch_scatter called for a CPU tensor under backend='auto'")

    monkeypatch.setattr(scatter, "_torch_scatter", SimpleNamespace(scatter_add=used, scatter_max=used))
    src = torch.tensor([[1.0, -2.0], [3.0, 4.0], [-5.0, 0.5]], dtype=torch.float64)
    index = torch.tensor([2, 0, 2])
    want = torch.zeros(3, 2, dtype=torch.float64).index_add_(0, index, src)
    torch.testing.assert_close(scatter.scatter_sum(src, index, 3), want, rtol=0, atol=0)
    want_max = torch.zeros(3, 2, dtype=torch.float64).scatter_reduce_(
        0, index.view(-1, 1).expand_as(src), src, reduce="amax", include_self=False)
    torch.testing.assert_close(scatter.scatter_max(src, index, 3), want_max, rtol=0, atol=0)
    assert scatter.HAS_TORCH_SCATTER  # the stand-in is "installed"


def test_kills_scatter_dir_lists_the_lazy_flag():
    """kills: ops/scatter.py ``__dir__`` ``set(globals()) | set(_LAZY)`` -> ``set(globals())`` (``dir()`` and tab
    completion lost ``HAS_TORCH_SCATTER`` once it became lazy)."""
    from diffusionformer.ops import scatter

    assert "HAS_TORCH_SCATTER" in dir(scatter) and "scatter_sum" in dir(scatter)
    with pytest.raises(AttributeError, match="no attribute 'NOT_THERE'"):
        scatter.NOT_THERE  # noqa: B018


def test_kills_nav_cache_collapsed_toctree_is_sphinx_own(monkeypatch):
    """kills: docs/_ext/df_nav_cache.py ``if collapse or kwargs:`` -> ``if kwargs:`` (a template's ``toctree()``
    with the default ``collapse=True`` got the page-independent, uncollapsed tree instead of Sphinx's own)."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    ext = str(Path(__file__).resolve().parents[2] / "docs" / "_ext")
    sys.path.insert(0, ext)
    try:
        import df_nav_cache
    finally:
        sys.path.remove(ext)
    from sphinx.builders.html import StandaloneHTMLBuilder

    builder = object.__new__(StandaloneHTMLBuilder)
    builder.env = SimpleNamespace(tocs={})
    cached = []
    monkeypatch.setattr(df_nav_cache, "_HELPERS", True)
    monkeypatch.setattr(df_nav_cache, "_global_toctree", lambda *a: cached.append(a))
    context = {"toctree": lambda **kw: f"stock {sorted(kw.items())}"}
    df_nav_cache._page_context(SimpleNamespace(builder=builder), "index", "page.html", context, None)
    assert context["toctree"]() == "stock [('collapse', True), ('includehidden', False), ('maxdepth', 0), " \
                                   "('titles_only', False)]"
    assert context["toctree"](collapse=True, maxdepth=2).startswith("stock ")
    assert cached == []


def test_kills_pyg_import_once_leaves_filters_alone(monkeypatch):
    """kills: _imports.py ``if "torch_geometric" in sys.modules: return`` dropped (each lazy call site entered
    ``warnings.catch_warnings`` again, which resets the process's filters on exit, racing another thread's)."""
    import warnings
    from types import SimpleNamespace

    from diffusionformer import _imports

    _imports._import_pyg()  # imported now (or before)

    def again(*args, **kwargs):
        raise AssertionError("imported again / catch_warnings entered again")

    monkeypatch.setattr(_imports, "importlib", SimpleNamespace(import_module=again))
    monkeypatch.setattr(_imports, "warnings", SimpleNamespace(catch_warnings=again, filterwarnings=warnings.filterwarnings))
    _imports._import_pyg()
