"""The public API's Google-style docstrings agree with the signatures they document.

Every public function, class (its constructor) and public method of a public class is walked: the
names exported by each subpackage's ``__all__`` and the names listed in the ``autosummary`` blocks of
``docs/api/*.rst``. Where a docstring has an ``Args:`` section:

* every name it lists is a parameter of the signature (``*args``/``**kwargs`` by their names);
* every parameter of the signature (bar ``self``/``cls`` of a method) is listed;
* a default it states (``default ``x``"``, ``Default: x``, ``defaults to x``, ``(default x)``,
  ``x`` (default)``) equals the signature's default when both are plain literals. A signature
  default of ``None`` is left alone: the docstring then says what ``None`` stands for
  (``scale`` "default ``1 / sqrt(C)``").

Docstrings without an ``Args:`` section (short methods, dataclasses documented by ``Fields:``) are
not checked: the house style describes such parameters in prose.

A few spot checks at the end confirm that ``Raises:`` sections name the exceptions the code raises.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: packages whose ``__all__`` is public API
PACKAGES = (
    "diffusionformer", "diffusionformer.functional", "diffusionformer.ops", "diffusionformer.ops.triton",
    "diffusionformer.nn", "diffusionformer.graph", "diffusionformer.operators", "diffusionformer.train",
    "diffusionformer.models", "diffusionformer.experiments", "diffusionformer.data", "diffusionformer.testing",
    "diffusionformer.analysis", "diffusionformer.config",
)

#: ``(qualified name, parameter, problem)`` accepted on purpose, each with its reason
ALLOWED = {
    # "``None`` picks the smallest ``K`` whose truncation error meets ``tol`` (default ``1e-4``)": the
    # parenthesis gives ``tol``'s default inside the ``steps`` entry; ``steps`` defaults to 10 (signature).
    ("diffusionformer.operators.ppr.PPROperator", "steps", "default"):
        "the stated default is tol's, quoted in the steps entry",
}

_ENTRY = re.compile(r"(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?:\([^)]*\))?\s*:(?:\s|$)(.*)")
_DEFAULTS = (
    re.compile(r"[Dd]efault(?:s to|:| is)?\s+``([^`]+)``"),
    re.compile(r"[Dd]efault(?:s to|:| is)\s+([^\s,;)`]+)"),
    re.compile(r"\(default\s+([^\s,;)`]+)\)"),
    re.compile(r"``([^`]+)``\s+\(default\)"),
)


def args_section(doc: str | None) -> dict[str, str] | None:
    """``{entry name: description}`` of the ``Args:`` section of ``doc`` (``None`` without one).

    An entry is a line at the section's first indentation, ``name (type): text`` or ``name: text``;
    ``a, b: text`` documents both. Continuation lines join their entry's text.
    """
    if not doc:
        return None
    lines = inspect.cleandoc(doc).splitlines()
    for i, line in enumerate(lines):
        if line.strip() != "Args:":
            continue
        indent = len(line) - len(line.lstrip())
        body = []
        for nxt in lines[i + 1:]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            body.append(nxt)
        filled = [b for b in body if b.strip()]
        if not filled:
            return {}
        level = min(len(b) - len(b.lstrip()) for b in filled)
        entries: dict[str, str] = {}
        current = None
        for b in filled:
            if len(b) - len(b.lstrip()) == level:
                m = _ENTRY.fullmatch(b.strip())
                if m is None:
                    entries.setdefault("<unparsed>", "")
                    entries["<unparsed>"] += b.strip()
                    current = None
                    continue
                current = m.group(1)
                entries[current] = m.group(2)
            elif current is not None:
                entries[current] += " " + b.strip()
        return entries
    return None


def stated_defaults(text: str) -> list[str]:
    return [m.group(1).rstrip(".") for pattern in _DEFAULTS for m in pattern.finditer(text)]


def _same_default(stated: str, actual: object) -> bool:
    try:
        value = ast.literal_eval(stated)
    except (ValueError, SyntaxError):
        # not a literal (``N``, ``all``, ``torch's global one``): a description, unless the default is a str
        return not isinstance(actual, str) or stated == actual
    if isinstance(value, bool) or isinstance(actual, bool):
        return value is actual
    plain = getattr(actual, "value", actual)  # an enum member as its value
    return value == plain or str(actual) == stated


def audit(name: str, fn: object, doc: str | None, *, method: bool) -> list[tuple[str, str, str]]:
    """The ``(parameter, problem, detail)`` mismatches between ``doc``'s ``Args:`` and ``fn``'s signature."""
    entries = args_section(doc)
    if entries is None:
        return []
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    params = list(sig.parameters.values())
    if method and params and params[0].name in ("self", "cls"):
        params = params[1:]
    star = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    by_name = {p.name: p for p in params}
    documented: dict[str, str] = {}
    problems = []
    for key, text in entries.items():
        if key == "<unparsed>":
            problems.append(("<unparsed>", "unparsed", text))
            continue
        for part in (k.strip() for k in key.split(",")):
            documented[part.lstrip("*")] = text
            if part.lstrip("*") not in by_name:
                problems.append((part, "not a parameter", str(sig)))
            elif star.get(by_name[part.lstrip("*")].kind, "") != part[: len(part) - len(part.lstrip("*"))]:
                problems.append((part, "stars differ from the signature", str(sig)))
    for p in params:
        if p.name not in documented:
            problems.append((p.name, "undocumented", str(sig)))
            continue
        for stated in stated_defaults(documented[p.name]):
            if p.default is inspect.Parameter.empty:
                problems.append((p.name, "default", f"states {stated!r} but the parameter is required"))
            elif p.default is not None and not _same_default(stated, p.default):
                problems.append((p.name, "default", f"states {stated!r}, signature {p.default!r}"))
    return [(param, kind, detail) for param, kind, detail in problems
            if (name, param, "default" if kind == "default" else kind) not in ALLOWED]


def _public_objects() -> dict[str, object]:
    objs: dict[str, object] = {}
    for package in PACKAGES:
        module = importlib.import_module(package)
        for n in getattr(module, "__all__", ()):
            objs[f"{package}.{n}"] = getattr(module, n)
    for rst in sorted((ROOT / "docs" / "api").glob("*.rst")):
        current, in_summary = None, False
        for line in rst.read_text(encoding="utf-8").splitlines():
            m = re.match(r"\.\. currentmodule:: (\S+)", line)
            if m:
                current = m.group(1)
                continue
            if line.startswith(".. autosummary::"):
                in_summary = True
                continue
            if not in_summary or not line.strip() or line.strip().startswith(":"):
                continue
            if not line.startswith("   "):
                in_summary = False
                continue
            if current is None or line.strip().startswith("diffusionformer."):
                continue  # whole packages (``index.rst``): their ``__all__`` is walked above
            obj: object = importlib.import_module(current)
            for attr in line.strip().split("."):
                obj = getattr(obj, attr)
            objs[f"{current}.{line.strip()}"] = obj
    return objs


def _callables() -> list[tuple[str, object, str | None, bool]]:
    """``(name, callable, docstring, is_method)`` of every public callable, each once, named where defined."""
    out, seen = [], set()

    def add(fn, doc, method, name=None):
        target = inspect.unwrap(fn) if callable(fn) else fn
        if id(target) in seen:
            return
        seen.add(id(target))
        out.append((name or f"{target.__module__}.{target.__qualname__}", fn, doc, method))

    for obj in _public_objects().values():
        if inspect.isclass(obj):
            if not obj.__module__.startswith("diffusionformer"):
                continue
            doc = obj.__doc__
            init = obj.__dict__.get("__init__")
            if args_section(doc) is None and init is not None:
                doc = init.__doc__
            add(obj, doc, False, f"{obj.__module__}.{obj.__qualname__}")
            for attr in dir(obj):
                if attr.startswith("_"):
                    continue
                raw = inspect.getattr_static(obj, attr)
                fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else (
                    raw.fget if isinstance(raw, property) else raw)
                if inspect.isfunction(fn) and fn.__module__.startswith("diffusionformer"):
                    add(fn, fn.__doc__, not isinstance(raw, staticmethod))
        elif callable(obj) and inspect.isfunction(inspect.unwrap(obj)):
            if obj.__module__.startswith("diffusionformer"):
                add(obj, obj.__doc__, False)
    return out


CALLABLES = _callables()
WITH_ARGS = [c for c in CALLABLES if args_section(c[2]) is not None]


def test_the_walk_reaches_the_public_api():
    """The walk is not vacuous: hundreds of callables, most documented ones with an ``Args:`` section."""
    names = {c[0] for c in CALLABLES}
    assert len(CALLABLES) > 300
    assert len(WITH_ARGS) > 150
    for expected in ("diffusionformer.nn.attention.DiffusionAttention", "diffusionformer.operators.heat.HeatOperator",
                     "diffusionformer.models.vit.DiffusionViT.attention_maps",
                     "diffusionformer.operators.registry.build_operator"):
        assert expected in names


@pytest.mark.parametrize("name, fn, doc, method", WITH_ARGS, ids=[c[0] for c in WITH_ARGS])
def test_args_section_matches_signature(name, fn, doc, method):
    assert audit(name, fn, doc, method=method) == []


def test_allow_list_entries_are_still_needed():
    """An allowed mismatch that no longer occurs is dropped from :data:`ALLOWED`."""
    by_name = {c[0]: c for c in CALLABLES}
    for name, param, kind in ALLOWED:
        _, fn, doc, method = by_name[name]
        entries = args_section(doc)
        assert entries is not None
        text = next(t for k, t in entries.items() if param in (x.strip().lstrip("*") for x in k.split(",")))
        default = inspect.signature(fn).parameters[param].default
        assert kind == "default" and any(not _same_default(s, default) for s in stated_defaults(text))


def _sample(a, b=2, *, mode="mean", flag=False, **kw):
    """Sample.

    Args:
        a: first.
        b: second (default 3).
        mode: ``"mean"`` (default) or ``"sum"``.
        flag: a flag; default ``True``.
        gone: no longer a parameter.
    """


def test_the_audit_catches_each_kind_of_mistake():
    """The checker itself: a wrong default (three spellings), a parameter that is not there and one left out."""
    problems = audit("_sample", _sample, _sample.__doc__, method=False)
    assert sorted((p, k) for p, k, _ in problems) == [
        ("b", "default"), ("flag", "default"), ("gone", "not a parameter"), ("kw", "undocumented")]


def test_the_audit_accepts_descriptive_and_matching_defaults():
    def f(x, scale=None, *, method="taylor", tol=1e-4, **kwargs):
        """F.

        Args:
            x: values.
            scale: the factor (default ``1 / sqrt(C)``).
            method: ``"taylor"`` (default) or ``"euler"``.
            tol: tolerance (default ``1e-4``).
            **kwargs: passed on.
        """

    assert audit("f", f, f.__doc__, method=False) == []


# -- Raises: spot checks ------------------------------------------------------------------------

def _raises_cases():
    from diffusionformer.data.registry import dataset_spec, load_dataset, register_dataset
    from diffusionformer.experiments.gpu import check_device
    from diffusionformer.experiments.threads import plan_threads
    from diffusionformer.nn.heads import format_head_spec, parse_heads
    from diffusionformer.operators import build_operator, register_operator

    return [
        ("parse_heads: counts that do not add up", ValueError, lambda: parse_heads("attention:3", 4)),
        ("parse_heads: unsupported spec type", TypeError, lambda: parse_heads(3.5, 4)),
        ("format_head_spec: unknown template", ValueError, lambda: format_head_spec("attention:{foo}", 4)),
        ("build_operator: unknown name", ValueError, lambda: build_operator("no-such-operator")),
        ("build_operator: unknown keyword", TypeError, lambda: build_operator("heat", bogus=1)),
        ("register_operator: not a subclass", TypeError, lambda: register_operator(int)),
        ("check_device: not a string", TypeError, lambda: check_device(3)),
        ("check_device: unknown device", ValueError, lambda: check_device("tpu")),
        ("dataset_spec: unknown name", ValueError, lambda: dataset_spec("no-such-data")),
        ("load_dataset: unknown option", TypeError, lambda: load_dataset("csbm", bogus=1)),
        ("register_dataset: unknown kind", ValueError, lambda: register_dataset("x", kind="bogus")),
        ("plan_threads: not positive", ValueError, lambda: plan_threads(threads=0)),
    ]


@pytest.mark.parametrize("index", range(12))
def test_raises_sections_spot_check(index):
    label, exc, call = _raises_cases()[index]
    with pytest.raises(exc):
        call()
