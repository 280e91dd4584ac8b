"""The package's import graph: no cycle between modules, and no library folder that nothing imports.

The graph is read from the source (``ast``), not from ``sys.modules``, so lazy imports inside
functions count: a cycle closed by a function-level import is still a cycle in the design. Imports
under ``if TYPE_CHECKING:`` never run and are left out. An import ``from a.b import c`` is an edge to
the module ``a.b.c`` when there is one, else to ``a.b`` (for a package: its ``__init__``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import diffusionformer

#: packages whose job is to be entered from outside (the command line, the test suite), not imported
ENTRY_POINTS = {"diffusionformer.experiments", "diffusionformer.testing"}
#: folders known to be imported by nothing yet, each with a note on the change that ends it (none now:
#: ``ops.triton`` became the engine's ``"triton"`` back-end). Never add one without such a note.
NOT_YET_WIRED: set[str] = set()


def module_files(root: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module under ``root/package`` (a package is its ``__init__``)."""
    mods = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """``{module: modules of package it imports}``, every import in the file (top level or not) but TYPE_CHECKING."""
    mods = module_files(root, package)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = _type_checking_nodes(tree)
        here = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = here
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                targets = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                if target == package or target.startswith(package + "."):
                    found = resolve(target)
                    if found is not None and found != mod:
                        graph[mod].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def unimported_folders(root: Path, package: str, exempt: set[str]) -> list[str]:
    """Sub-packages of ``package`` no module outside them imports (``exempt`` and their sub-packages excepted)."""
    graph = import_graph(root, package)
    folders = sorted(m for m, p in module_files(root, package).items() if p.name == "__init__.py" and m != package)
    lonely = []
    for folder in folders:
        if any(folder == e or folder.startswith(e + ".") for e in exempt):
            continue
        inside = lambda m: m == folder or m.startswith(folder + ".")  # noqa: E731
        if not any(inside(t) for src, targets in graph.items() if not inside(src) for t in targets):
            lonely.append(folder)
    return lonely


ROOT = Path(diffusionformer.__file__).resolve().parent.parent


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph(ROOT, "diffusionformer")) == []


def test_every_library_folder_is_imported_by_the_library():
    lonely = set(unimported_folders(ROOT, "diffusionformer", ENTRY_POINTS))
    assert lonely <= NOT_YET_WIRED, f"library folders nothing imports: {sorted(lonely - NOT_YET_WIRED)}"


def test_the_graph_is_the_packages_own():
    graph = import_graph(ROOT, "diffusionformer")
    assert "diffusionformer.experiments.runner" in graph
    assert "diffusionformer.experiments.results" in graph["diffusionformer.experiments.plots"]
    assert "diffusionformer.experiments.runner" not in graph["diffusionformer.experiments.plots"]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize("importer", ["from pkg.b import f", "from pkg import b", "import pkg.b", "from .b import f"])
def test_the_scan_finds_a_cycle_closed_inside_a_function(tmp_path, importer):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": f"def g():\n    {importer}\n",
        "pkg/b.py": "from pkg.a import g\n\ndef f():\n    return g\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import g\n",
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.c"] == set()  # TYPE_CHECKING imports never run
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_the_scan_finds_a_folder_nothing_imports(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "from pkg.used import x\n",
        "pkg/used/__init__.py": "x = 1\n",
        "pkg/lonely/__init__.py": "from pkg.lonely.inner import y\n",
        "pkg/lonely/inner.py": "from pkg.used import x\ny = x\n",
        "pkg/cli/__init__.py": "from pkg.used import x\n",
    })
    assert unimported_folders(tmp_path, "pkg", set()) == ["pkg.cli", "pkg.lonely"]
    assert unimported_folders(tmp_path, "pkg", {"pkg.cli"}) == ["pkg.lonely"]
