"""API reference helpers: public-name coverage, references through re-exports, tidier autodoc.

Five jobs; the first two are driven by the objects actually documented in the Python domain:

* **Coverage.** Every name in the ``__all__`` of the modules listed in the config value
  ``df_api_modules`` must be documented somewhere (under any of its import paths). An entry
  ``"pkg.*"`` covers ``pkg`` and all its public submodules. A missing name is a Sphinx
  warning, so ``sphinx-build -W`` fails when a public name is added to the library but not
  to the reference.
* **Re-exports.** The library refers to objects by their defining module
  (``diffusionformer.ops.dense.diffuse``) or by a re-export (``diffusionformer.DiffusionAttention``)
  while the reference documents each object once, at its public path
  (``diffusionformer.functional.diffuse``). An unresolved ``py`` cross-reference whose
  target imports to a documented object is resolved to that object's entry.
* **Bases.** "Bases:" lines show public classes only: a private base (``_FixedOperator``)
  is replaced by its own bases.
* **Torch plumbing.** A method that the library overrides without a docstring of its own
  (``forward``, ``extra_repr``) would inherit PyTorch's generic text ("Define the
  computation performed at every call..."), which says nothing about the library. Such
  members are left out; methods whose docstring is inherited from a ``diffusionformer``
  base class (e.g. ``coefficients``) stay. Likewise a module constant whose ``#:`` doc
  comment autodoc cannot see (it reads comments only in the documented module, not in the
  submodule a package re-exports from) would show its type's docstring ("Built-in
  immutable sequence."): it gets the defining module's comment instead, or no text.
* **Config fields.** The ``Fields:`` section that ``document_fields`` appends to a config's
  docstring for ``help()`` is dropped: the page documents each field from its ``#:`` comment.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from types import ModuleType
from typing import Any

from docutils import nodes
from sphinx.errors import PycodeError
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging

logger = logging.getLogger(__name__)

_ROOT = "diffusionformer"
_MISSING = object()


def _ours(name: str) -> bool:
    """Whether a dotted name is the package or inside it (``diffusionformer_extras`` is not)."""
    return name == _ROOT or name.startswith(_ROOT + ".")


def _import_path(path: str) -> Any:
    """The object at a dotted path (``pkg.mod.Class.attr``), or ``_MISSING``."""
    if not _ours(path):
        return _MISSING
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return _MISSING
        return obj
    return _MISSING


def _identity(obj: Any) -> int | None:
    """Objects that are matched by identity: modules, classes, functions, properties, constants."""
    if obj is _MISSING or obj is None or isinstance(obj, (bool, int, float, str)):
        # Small ints and strings are shared by unrelated names: match those by name only.
        return None
    return id(obj)


def _documented(app: Any, env: Any) -> dict[int, str]:
    """id(object) -> its documented full name, for every documented ``diffusionformer`` object.

    Cached on the application (not the pickled environment: ids are per process) and
    rebuilt after every reading phase.
    """
    cache = getattr(app, "_df_api_documented", None)
    if cache is not None:
        return cache
    domain = env.get_domain("py")
    names = [n for n in domain.objects if _ours(n)] + [m for m in domain.modules if _ours(m)]
    index: dict[int, str] = {}
    for name in sorted(names, key=len):  # shortest (public) path wins
        key = _identity(_import_path(name))
        if key is not None:
            index.setdefault(key, name)
    app._df_api_documented = index
    return index


def _public_modules(spec: str) -> list[ModuleType]:
    recursive = spec.endswith(".*")
    name = spec[:-2] if recursive else spec
    module = importlib.import_module(name)
    found = [module]
    if recursive and hasattr(module, "__path__"):
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{name}."):
            if any(part.startswith("_") for part in info.name.split(".")):
                continue
            found.append(importlib.import_module(info.name))
    return found


def check_coverage(app: Any, env: Any) -> None:
    """Warn for every public name of ``df_api_modules`` that no page documents."""
    domain = env.get_domain("py")
    documented_names = set(domain.objects) | set(domain.modules)
    documented = _documented(app, env)
    for spec in app.config.df_api_modules:
        try:
            modules = _public_modules(spec)
        except ImportError as exc:
            logger.warning("df_api_modules: cannot import %r: %s", spec, exc)
            continue
        for module in modules:
            for name in getattr(module, "__all__", ()):
                full = f"{module.__name__}.{name}"
                obj = getattr(module, name, _MISSING)
                if obj is _MISSING:
                    logger.warning("%s.__all__ lists %r, which the module does not define", module.__name__, name)
                    continue
                key = _identity(obj)
                if full in documented_names or (key is not None and key in documented):
                    continue
                logger.warning(
                    "public name %s is not documented in the API reference (add it to a page under docs/api/)",
                    full,
                )


def resolve_reexport(app: Any, env: Any, node: nodes.Element, contnode: nodes.Node) -> nodes.Node | None:
    """Resolve ``py`` references to documented objects reached through another import path."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    module, cls = node.get("py:module"), node.get("py:class")
    candidates = [target]
    if module:
        candidates.append(f"{module}.{target}")
        if cls:
            candidates.append(f"{module}.{cls}.{target}")
    documented = _documented(app, env)
    domain = env.get_domain("py")
    for candidate in candidates:
        name = _documented_name(candidate, documented, domain)
        if name is None or name == candidate:
            continue
        return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], name, node, contnode)
    return None


def _documented_name(path: str, documented: dict[int, str], domain: Any) -> str | None:
    """The documented name of the object at ``path``; for an attribute of a class that is not
    documented on that class, the same attribute documented on a base class."""
    key = _identity(_import_path(path))
    if key is not None and key in documented:
        return documented[key]
    owner_path, _, attr = path.rpartition(".")
    owner = _import_path(owner_path) if owner_path else _MISSING
    if not isinstance(owner, type):
        return None
    for base in owner.__mro__:
        base_name = documented.get(id(base))
        if base_name is not None and f"{base_name}.{attr}" in domain.objects:
            return f"{base_name}.{attr}"
    return None


def _owner_of_docstring(member: Any) -> type | None:
    """For a function without its own docstring: the first base class that supplies one."""
    func = getattr(member, "__func__", member)
    qualname = getattr(func, "__qualname__", "")
    if not getattr(func, "__module__", None) or "." not in qualname or "<locals>" in qualname:
        return None
    try:
        module = importlib.import_module(func.__module__)
    except ImportError:
        return None
    cls: Any = module
    for part in qualname.split(".")[:-1]:
        cls = getattr(cls, part, None)
    if not isinstance(cls, type):
        return None
    name = qualname.rsplit(".", 1)[1]
    for base in cls.__mro__[1:]:
        doc = getattr(base.__dict__.get(name), "__doc__", None)
        if doc:
            return base
    return None


def skip_foreign_docstrings(app: Any, what: str, name: str, obj: Any, skip: bool, options: Any) -> bool | None:
    """Skip class members documented only by a docstring inherited from outside the library."""
    if skip or what != "class" or not callable(obj) or getattr(obj, "__doc__", "") is not None:
        return None
    owner = _owner_of_docstring(obj)
    if owner is not None and not _ours(owner.__module__):
        return True
    return None


def _doc_comment_of_reexport(name: str, obj: Any) -> list[str]:
    """The ``#:`` comment of a constant in the submodule that defines it (``pkg.sub.NAME``
    re-exported as ``pkg.NAME``): autodoc only reads comments in the documented module."""
    package, _, attr = name.rpartition(".")
    for modname in sorted(m for m in list(sys.modules) if m.startswith(f"{package}.")):
        if getattr(sys.modules[modname], attr, _MISSING) is not obj:
            continue
        try:
            comments = ModuleAnalyzer.for_module(modname).find_attr_docs()
        except PycodeError:
            continue
        if ("", attr) in comments:
            return list(comments["", attr])
    return []


def constant_docstring(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Constants: the defining module's ``#:`` comment for re-exports, never the type's docstring."""
    if what not in ("data", "attribute"):
        return
    type_doc = getattr(type(obj), "__doc__", None)
    if lines and not (type_doc and "\n".join(lines).strip() == inspect.cleandoc(type_doc).strip()):
        return
    lines[:] = _doc_comment_of_reexport(name, obj) if what == "data" else []


def public_bases(app: Any, name: str, obj: Any, options: Any, bases: list[type]) -> None:
    """Show public bases only: replace private ones by their own bases."""
    shown: list[type] = []
    pending = list(bases)
    while pending:
        base = pending.pop(0)
        if base in shown:
            continue
        if getattr(base, "__name__", "").startswith("_") and isinstance(base, type):
            pending[:0] = list(base.__bases__)
            continue
        shown.append(base)
    bases[:] = shown


def _reset(app: Any, env: Any, *args: Any) -> None:
    app._df_api_documented = None


def drop_fields_section(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Remove the ``Fields:`` section that :func:`diffusionformer.config.document_fields` appends
    for ``help()``: in these pages every field is documented from its ``#:`` comment already."""
    if what != "class" or not isinstance(obj, type):
        return
    from diffusionformer.config import FIELDS_HEADER

    if FIELDS_HEADER not in (obj.__dict__.get("__doc__") or ""):
        return
    for i in range(len(lines) - 1, -1, -1):
        if lines[i] == FIELDS_HEADER:
            del lines[i:]
            while lines and not lines[-1].strip():
                lines.pop()
            return


def setup(app: Any) -> dict[str, Any]:
    app.add_config_value("df_api_modules", [], "env", types=[list])
    app.connect("env-updated", _reset)
    app.connect("env-check-consistency", check_coverage)
    app.connect("missing-reference", resolve_reexport)
    app.connect("autodoc-skip-member", skip_foreign_docstrings)
    app.connect("autodoc-process-bases", public_bases)
    app.connect("autodoc-process-docstring", constant_docstring)
    app.connect("autodoc-process-docstring", drop_fields_section, priority=400)  # before napoleon
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
