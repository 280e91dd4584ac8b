"""Delete autosummary stub pages that no autosummary directive asks for any more.

Autosummary writes one stub per documented object into ``docs/api/generated/`` (git-ignored)
but never removes one. After a name is renamed or dropped from a page, its old stub stays
behind and breaks a ``-W`` build of an existing checkout ("document isn't included in any
toctree", or a failed import). After autosummary has generated the stubs, this extension
collects every stub that the pages request (directly, or through other requested stubs,
e.g. the package pages) and deletes the rest from the generated folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sphinx.ext.autosummary.generate import find_autosummary_in_files
from sphinx.util import logging

logger = logging.getLogger(__name__)


def _requested(files: list[Path]) -> set[Path]:
    stubs = set()
    for entry in find_autosummary_in_files([str(f) for f in files]):
        if entry.path:
            stubs.add(Path(os.path.abspath(entry.path)) / f"{entry.name}.rst")
    return stubs


def remove_stale_stubs(app: Any) -> None:
    if not app.config.autosummary_generate:
        return
    src = Path(app.srcdir).resolve()
    generated = (src / app.config.df_generated_dir).resolve()
    if not generated.is_dir():
        return
    pages = [
        p for p in src.rglob("*.rst")
        if generated not in p.resolve().parents and "_build" not in p.relative_to(src).parts
    ]
    wanted = _requested(pages)
    frontier = {p for p in wanted if p.parent == generated and p.is_file()}
    while frontier:  # stubs may request further stubs (package pages, recursive modules)
        new = _requested(sorted(frontier)) - wanted
        wanted |= new
        frontier = {p for p in new if p.parent == generated and p.is_file()}
    for stub in generated.glob("*.rst"):
        if stub.resolve() not in wanted:
            logger.info("removing stale autosummary stub %s", stub.name)
            stub.unlink()


def setup(app: Any) -> dict[str, Any]:
    app.add_config_value("df_generated_dir", "api/generated", "env", types=[str])
    # after sphinx.ext.autosummary's own builder-inited handler (priority 500) has generated the stubs
    app.connect("builder-inited", remove_stale_stubs, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
