"""Fixtures shared by the tests of the Sphinx extensions in ``docs/_ext/``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXT = Path(__file__).resolve().parents[2] / "docs" / "_ext"
if str(EXT) not in sys.path:  # the extension modules (df_api, df_exec, ...) import by name in every test here
    sys.path.insert(0, str(EXT))
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # docs_tables, the tests' shared markdown-table reader
    sys.path.insert(0, _HERE)


class _Log:
    """Stands in for a ``sphinx.util.logging`` logger: records ``(level, message, location)``."""

    def __init__(self):
        self.records = []

    def _record(self, level, msg, *args, location=None, **kwargs):
        self.records.append((level, msg % args if args else msg, location))

    def warning(self, msg, *args, **kwargs):
        self._record("warning", msg, *args, **kwargs)

    def info(self, msg, *args, **kwargs):
        self._record("info", msg, *args, **kwargs)

    def warnings(self):
        return [m for level, m, _ in self.records if level == "warning"]


@pytest.fixture
def log(monkeypatch):
    """A recording stand-in for the ``logger`` of every extension module (``df_api``, ``df_exec``,
    ``df_operator_table``, ``df_stale_stubs``), the modules the tests import from ``docs/_ext``."""
    pytest.importorskip("sphinx")
    import df_api
    import df_exec
    import df_operator_table
    import df_stale_stubs

    rec = _Log()
    for mod in (df_api, df_exec, df_operator_table, df_stale_stubs):
        monkeypatch.setattr(mod, "logger", rec)
    return rec


@pytest.fixture
def throwaway_package(tmp_path, monkeypatch):
    """Install a package written under ``tmp_path`` as the library ``df_api`` documents: ``install(name, files,
    *, submodules=(), also_unload=())`` writes ``files`` (path -> source, dedented), puts them on ``sys.path``,
    sets ``df_api._ROOT`` to ``name``, imports ``name`` and its ``submodules`` and returns the package; its
    modules (and those named in ``also_unload``) leave ``sys.modules`` after the test."""
    import importlib
    import textwrap

    import df_api

    unload: list[tuple[str, tuple[str, ...]]] = []

    def install(name, files, *, submodules=(), also_unload=()):
        root = tmp_path / f"site-{name}"
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        monkeypatch.syspath_prepend(str(root))
        monkeypatch.setattr(df_api, "_ROOT", name)
        importlib.invalidate_caches()
        unload.append((name, tuple(also_unload)))
        module = importlib.import_module(name)
        for sub in submodules:
            importlib.import_module(f"{name}.{sub}")
        return module

    yield install
    for name, others in unload:
        for mod in [m for m in sys.modules if m == name or m.startswith(f"{name}.") or m in others]:
            del sys.modules[mod]

