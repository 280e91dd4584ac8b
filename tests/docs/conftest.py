"""Fixtures shared by the tests of the Sphinx extensions in ``docs/_ext/``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXT = Path(__file__).resolve().parents[2] / "docs" / "_ext"


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
    if str(EXT) not in sys.path:
        sys.path.insert(0, str(EXT))
    import df_api
    import df_exec
    import df_operator_table
    import df_stale_stubs

    rec = _Log()
    for mod in (df_api, df_exec, df_operator_table, df_stale_stubs):
        monkeypatch.setattr(mod, "logger", rec)
    return rec
