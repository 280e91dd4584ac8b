"""Makes ``tests/experiments``' shared helpers (``experiments_tiny_configs``) importable here too: pytest runs with
``--import-mode=importlib``, which leaves ``sys.path`` alone; and gives the writers of small benchmark-format files
(``tests/data/data_writers.py``) as the ``data_writers`` fixture, a throwaway model preset name
(``preset_name``) and an empty data cache folder (``cache``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

_TESTS = Path(__file__).resolve().parents[1]
_EXPERIMENTS = str(_TESTS / "experiments")
if _EXPERIMENTS not in sys.path:
    sys.path.insert(0, _EXPERIMENTS)


@pytest.fixture(scope="session")
def data_writers() -> ModuleType:
    """tests/data/data_writers.py (the writers of small files in the benchmark formats), under the one module name
    tests/data/conftest.py shares."""
    name = "diffusionformer_tests_data_writers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _TESTS / "data" / "data_writers.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def preset_name():
    """A throwaway model preset name, removed from the registry afterwards."""
    from diffusionformer.models import list_models, unregister_model

    name = "reliability-throwaway-vit"
    yield name
    if name in list_models():
        unregister_model(name)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty data cache folder for this test, where ``$DIFFUSIONFORMER_CACHE`` points the data loaders."""
    from diffusionformer.data import CACHE_ENV

    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder
