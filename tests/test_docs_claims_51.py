"""Probe 51b: the library names the docs give, in cross-references and in backticks, are names the code has.

The Sphinx build runs with ``nitpicky = False`` (no intersphinx, so torch and PyG names render as text): a
``{func}`~diffusionformer.ops.engine.polynomial``` or ``:class:`~diffusionformer.nn.DiffusionAttention``` whose
target was renamed builds without a warning, as plain text, and a dotted name in backticks (``ops.dense._split_paths``,
``results._normalized_identity``, ``diffusionformer.nn.kv_cache``) is never looked at by the build. design.md and
performance.md name dozens of such functions, private helpers included, to say where a rule lives; a rename leaves
them pointing nowhere. The test reads README.md and the pages (``docs/*.md``, ``docs/*.rst``, ``docs/api``,
``docs/theory``, ``docs/tutorials``, ``docs/results/*.md``) and checks

- every Python cross-reference role whose target is under ``diffusionformer`` resolves (module, then attributes);
- every dotted name in backticks whose leading part ends a library module's path (``engine.`` for
  ``diffusionformer.ops.engine``, ``config.`` for ``diffusionformer.config`` or ``diffusionformer.experiments.config``,
  ``diffusionformer.`` itself) resolves in one of those modules; names of torch's that share a module's last part
  (``nn.Linear``) and ``train.<key>`` paths of a ``[tasks.train]`` key pass as what they are;
- every private name in backticks (``_affine_heads``, ``_SdpaReplay``) occurs in the library, benchmarks,
  experiment scripts or docs extensions.

Existing docs tests check the experiments CLI commands and the benchmark options the pages quote
(tests/docs/test_edge_probes_commands_45.py, tests/docs/test_performance_claims.py), the snippets and doctests and the
public API's coverage; none of them reads these names.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "diffusionformer"
# library code a page may name a private helper of
SOURCES = (PACKAGE, ROOT / "benchmarks", ROOT / "experiments" / "scripts", ROOT / "docs" / "_ext")
# Dotted names in backticks that look like a library module's but are something else: {name: what it is}.
ALLOWED = {
    "data.num_graphs": "a PyG Batch's attribute (performance.md, the graph transformer's compile note)",
}

# optional packages whose names share a library module's last part (``triton.`` and ``ops.triton``)
_OPTIONAL = {"triton", "torch_geometric", "torch_scatter", "networkx", "scipy", "sklearn", "matplotlib", "tensorboard"}
_ROLE = re.compile(r"(?:\{|:)(?:py:)?(?:func|class|meth|attr|mod|data|obj|exc|const)(?:\}|:)`([^`]+)`")
_MD_LITERAL = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_RST_LITERAL = re.compile(r"``([^`\n]+)``")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?")
_FILE_SUFFIXES = {"py", "md", "rst", "json", "jsonl", "csv", "toml", "txt", "png", "pt", "sh", "gz"}
_PRIVATE = re.compile(r"_[A-Za-z]\w*(?:\(\))?")


def doc_files() -> list[Path]:
    docs = ROOT / "docs"
    files = [ROOT / "README.md", *sorted(docs.glob("*.md")), *sorted(docs.glob("*.rst"))]
    for sub in ("api", "theory", "tutorials"):
        files += sorted((docs / sub).glob("*.rst"))
    return files + sorted((docs / "results").glob("*.md"))


def prose_lines(path: Path, text: str | None = None):
    """``(line number, line)`` of ``path``'s prose: fenced code of markdown and doctest lines left out."""
    text = path.read_text(encoding="utf-8") if text is None else text
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if path.suffix == ".md" and stripped.startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced or stripped.startswith((">>>", "...")):
            continue
        yield i, line


@lru_cache(maxsize=None)
def _modules_by_suffix() -> dict[str, tuple[str, ...]]:
    """``{"engine": ("diffusionformer.ops.engine",), "ops.engine": (...), ...}`` for every library module."""
    index: dict[str, list[str]] = {}
    for py in PACKAGE.rglob("*.py"):
        parts = list(py.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        for k in range(len(parts)):
            index.setdefault(".".join(parts[k:]), []).append(".".join(parts))
    return {k: tuple(sorted(v)) for k, v in index.items()}


@lru_cache(maxsize=None)
def _source_words() -> frozenset[str]:
    words: set[str] = set()
    for folder in SOURCES:
        for py in folder.rglob("*.py"):
            words.update(re.findall(r"\w+", py.read_text(encoding="utf-8")))
    return frozenset(words)


def _resolves(module: str, attrs: list[str]) -> bool:
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return False
    for i, attr in enumerate(attrs):
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
            continue
        try:  # a submodule not imported by its package
            obj = importlib.import_module(".".join([module, *attrs[: i + 1]]))
        except ImportError:
            return False
    return True


def _resolves_outside(parts: list[str]) -> bool:
    """``parts`` names an object of a package other than the library (``triton.autotune``); one of the optional
    packages that is not installed here is taken at its word."""
    if parts[0] == "diffusionformer" or importlib.util.find_spec(parts[0]) is None:
        return parts[0] in _OPTIONAL
    return _resolves(parts[0], parts[1:])


def _train_keys() -> set[str]:
    from diffusionformer.train import TrainConfig

    return {f.name for f in dataclasses.fields(TrainConfig)}


def stale_name(name: str, *, role: bool) -> str | None:
    """Why ``name`` (a role's target, or a dotted name in backticks) names nothing in the library, else ``None``."""
    if role:
        name = name.strip().lstrip("~!.")
        if "<" in name:  # explicit title: `text <target>`
            name = name[name.index("<") + 1 : name.rindex(">")]
        if not name.startswith("diffusionformer"):
            return None  # torch's and relative targets render as text by design
    name = name.removesuffix("()")
    if name in ALLOWED:
        return None
    parts = name.split(".")
    if parts[0] == "__main__":  # a script's own class (`__main__.PixelNet`), not the library's __main__ modules
        return None
    index = _modules_by_suffix()
    for k in range(len(parts), 0, -1):  # the longest leading part that ends a module's path
        modules = index.get(".".join(parts[:k]))
        if modules:
            break
    else:
        return None  # not a library name (torch.func.functional_call, F.scaled_dot_product_attention, ...)
    if parts[-1] in _FILE_SUFFIXES:  # runner.py, metrics.jsonl: a file's name
        return None
    if any(_resolves(m, parts[k:]) for m in modules):
        return None
    if k == 1 and parts[0] != "diffusionformer" and set(parts[1:]) <= _source_words():
        # one bare leading word (`dino.task_config`, `batch.batch_size`) may be a variable named like a module: only a
        # name the library does not have anywhere is stale
        return None
    if _resolves("torch", parts) or _resolves_outside(parts):  # nn.Linear: torch's; triton.autotune: triton's
        return None
    if parts[0] == "train" and len(parts) == 2 and parts[1] in _train_keys():  # train.batch_size: a --set path
        return None
    return f"{name!r}: no {'.'.join(parts[k:])!r} in {' or '.join(modules)}"


def stale_private(name: str) -> str | None:
    name = name.removesuffix("()")
    words = _source_words()
    if name in words or any(w.endswith(name) for w in words):  # `_with_weights`: the tail of diffuse_with_weights
        return None
    return f"{name!r} occurs nowhere in the library's code"


def check_page(path: Path, text: str | None = None) -> list[str]:
    """Every stale name of one page, as ``"path:line: why"``."""
    problems = []
    literal = _MD_LITERAL if path.suffix == ".md" else _RST_LITERAL
    where = path.relative_to(ROOT) if path.is_absolute() and path.is_relative_to(ROOT) else path
    for i, line in prose_lines(path, text):
        for m in _ROLE.finditer(line):
            if why := stale_name(m.group(1), role=True):
                problems.append(f"{where}:{i}: role target {why}")
        for m in literal.finditer(line):
            value = m.group(1).strip()
            if _DOTTED.fullmatch(value):
                why = stale_name(value, role=False)
            elif _PRIVATE.fullmatch(value):
                why = stale_private(value)
            else:
                continue
            if why:
                problems.append(f"{where}:{i}: {why}")
    return problems


def test_docs_name_only_what_the_code_has():
    problems = [p for path in doc_files() for p in check_page(path)]
    assert not problems, "names in the docs that the code does not have:\n" + "\n".join(problems)


def test_the_check_reads_the_pages():
    """Not vacuous: the pages hold hundreds of role targets and dotted or private names the check resolves."""
    roles = names = 0
    for path in doc_files():
        literal = _MD_LITERAL if path.suffix == ".md" else _RST_LITERAL
        for _, line in prose_lines(path):
            roles += sum(1 for m in _ROLE.finditer(line) if "diffusionformer" in m.group(1))
            names += sum(1 for m in literal.finditer(line)
                         if _DOTTED.fullmatch(m.group(1).strip()) or _PRIVATE.fullmatch(m.group(1).strip()))
    assert roles > 150 and names > 150, (roles, names)


def test_allowed_entries_are_still_needed():
    """An allowed name no page mentions any more is dropped from :data:`ALLOWED`."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in doc_files())
    assert [name for name in ALLOWED if f"`{name}`" not in text] == []


def test_the_check_catches_each_kind_of_stale_name(tmp_path):
    """The checker itself: a role to a renamed function (MyST and rst), a renamed private helper under a module
    suffix, a dotted public name and a private name that no longer exist are reported; the live names beside them,
    torch's ``nn.Linear``, a ``train.`` key and code in a fence are not."""
    md = tmp_path / "page.md"
    md.write_text(
        "See {func}`~diffusionformer.functional.diffuse_dense` and {func}`~diffusionformer.functional.diffuse`.\n"
        "The loop is `engine.polynomial_loop`, beside `engine.polynomial` and `ops.dense._split_paths`.\n"
        "Helpers: `_no_such_helper`, `_split_paths`, `nn.Linear`, `train.batch_size`, `torch.func.vmap`.\n"
        "```python\nx = `diffusionformer.gone`\n```\n", encoding="utf-8")
    rst = tmp_path / "page.rst"
    rst.write_text(":class:`~diffusionformer.nn.DiffusionAttentionOld` and :class:`~diffusionformer.nn.Block`,\n"
                   "``diffusionformer.experiments.cli.main`` but not ``diffusionformer.experiments.cli.mainx``.\n",
                   encoding="utf-8")
    found = check_page(md) + check_page(rst)
    assert len(found) == 5, found
    for stale in ("diffuse_dense", "polynomial_loop", "_no_such_helper", "DiffusionAttentionOld", "mainx"):
        assert sum(stale in p for p in found) == 1, (stale, found)
