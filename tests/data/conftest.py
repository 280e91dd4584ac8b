"""Fixtures for the data tests: an isolated cache, and the staged data root when present."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from diffusionformer.data import CACHE_ENV, DATA_ENV

REPO = Path(__file__).resolve().parents[2]
_CALLER_DATA_ROOT = os.environ.get(DATA_ENV)  # read before any test clears it


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache folder for the whole session (decoded arrays are reused between tests)."""
    return tmp_path_factory.mktemp("dfcache")


@pytest.fixture(scope="module", autouse=True)
def _isolated_env(session_cache: Path):
    """Never touch ~/.cache, and never pick up a data root from the caller's environment
    unless a test asks for it through ``real_root``. Module-scoped (an autouse fixture is set up
    before the other fixtures of its scope) so that module-scoped fixtures see it too, and undone
    at the end of each module: session-scoped, it stayed in place for the rest of the session, and
    the tests of other folders run after tests/data found ``$DIFFUSIONFORMER_DATA`` deleted (a test
    that read the staged root from it at collection and again at run time failed). Tests may still
    override it with ``monkeypatch``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(session_cache))
        mp.delenv(DATA_ENV, raising=False)
        yield


def _staged_root() -> Path | None:
    candidates = [Path(_CALLER_DATA_ROOT)] if _CALLER_DATA_ROOT else []
    candidates.append(REPO.parent / "shared" / "data")
    for path in candidates:
        if (path / "SHA256SUMS").is_file():
            return path
    return None


@pytest.fixture(scope="session")
def real_root() -> Path:
    """The staged benchmark root ($DIFFUSIONFORMER_DATA or <repo>/../shared/data)."""
    root = _staged_root()
    if root is None:
        pytest.skip(
            f"staged data root absent: set {DATA_ENV} or provide <repo>/../shared/data "
            f"(with SHA256SUMS) to run the real-data tests"
        )
    return root


def _load_writers() -> ModuleType:
    """``data_writers.py`` beside this file, importable under pytest's importlib mode."""
    name = "diffusionformer_tests_data_writers"
    if name not in sys.modules:
        path = Path(__file__).with_name("data_writers.py")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def writers() -> ModuleType:
    """Writers of tiny files in the benchmark formats (see data_writers.py)."""
    return _load_writers()
