"""The operator registry: strict when registering, forgiving when resolving.

Examples:
    >>> from diffusionformer.operators import build_operator, list_operators
    >>> "laplacian" in list_operators()
    True
    >>> build_operator("I-P").name
    'laplacian'
"""

from __future__ import annotations

import ast
import difflib
import inspect
import re
from typing import Any, Callable, Iterable, TypeVar

import torch  # noqa: F401  (used in doctests)

from diffusionformer.operators.base import _DECLARED, DiffusionOperator

__all__ = [
    "build_operator",
    "list_operators",
    "operator_class",
    "parse_operator_spec",
    "register_operator",
    "unregister_operator",
]

# importlib.reload of this module (a notebook) runs it again, while the operator modules that registered into these
# at import are not: they keep what they hold (else every name was unknown, with "valid names: []")
_REGISTRY: dict[str, type[DiffusionOperator]] = globals().get("_REGISTRY", {})
_ALIASES: dict[str, str] = globals().get("_ALIASES", {})

T = TypeVar("T", bound=type[DiffusionOperator])


#: dashes that typeset text puts in place of the hyphen-minus: "I−P" copied from a paper (U+2212), "heat–exact"
_DASHES = str.maketrans({c: "-" for c in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe63\uff0d"})


def _normalise(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"operator names and aliases must be str, got {type(name).__name__} ({name!r})")
    # spaces and underscores ignored around and instead of the hyphens: "I - P", "heat_exact", "grand nl"
    return re.sub(r"[\s_]*-[\s_]*|[\s_]+", "-", name.translate(_DASHES).strip().lower())


def register_operator(
    cls: T | None = None, *, name: str | None = None, aliases: tuple[str, ...] | None = None
) -> T | Callable[[T], T]:
    """Class decorator adding an operator to the registry.

    Args:
        cls: a subclass of :class:`DiffusionOperator`.
        name: registry name (default: ``cls.name``; one inherited from a registered parent is taken: refused,
            naming the parent).
        aliases: extra names resolved to this operator (default: ``cls.aliases`` as the class itself
            declares them; a subclass does not inherit its registered parent's aliases).

    Raises:
        TypeError: ``cls`` is not a :class:`DiffusionOperator` subclass, or a name is not a ``str``.
        ValueError: the name or an alias is already taken, is empty, or holds characters of the spec
            syntax (``()[]{}:,``) or is ``true``/``false`` (specs could not name it); ``cls`` is
            already registered (under another name: give more names with ``aliases``); or ``cls`` sets a class
            attribute that misspells a capability flag (``is_polynomal = False``, which Python takes as a new
            attribute: the operator ran with the flag's default), or sets a flag on a mixin that comes after
            :class:`DiffusionOperator` in its bases (whose default is the one read).

    Examples:
        >>> from diffusionformer.operators import DiffusionOperator
        >>> @register_operator(name="doc-halfway")
        ... class Halfway(DiffusionOperator):
        ...     degree = 1
        ...     def coefficients(self):
        ...         return torch.tensor([0.5, 0.5])
        >>> build_operator("doc_halfway").coefficients()
        tensor([0.5000, 0.5000])
        >>> unregister_operator("doc-halfway")
    """

    def wrap(c: T) -> T:
        if not isinstance(c, type) or not issubclass(c, DiffusionOperator):
            raise TypeError(f"register_operator expects a subclass of DiffusionOperator, got {c!r}")
        owner = next((k for k, v in _REGISTRY.items() if v is c), None)
        if owner is not None:  # a second name would rename the class: instances of the first would write it
            raise ValueError(f"{c.__name__} is already registered as {owner!r}; give it more names with aliases=..., "
                             f"or register a subclass")
        key = _normalise(name if name is not None else c.name)
        if not key:
            raise ValueError(f"{c.__name__} needs a non-empty registry name (class attribute `name` or name=...)")
        # the class's own aliases: a subclass of a registered operator does not claim its parent's names
        names = aliases if aliases is not None else c.__dict__.get("aliases", ())
        if isinstance(names, str):  # one alias, not its characters
            names = (names,)
        if not isinstance(names, Iterable):
            raise TypeError(f"aliases of {c.__name__} must be a str or a sequence of str, got {type(names).__name__} "
                            f"({names!r})")
        names = tuple(names)  # a generator is read once
        alias_keys = tuple(_normalise(a) for a in names)
        if "" in alias_keys:  # '' or '  ' would resolve operator_class('') (and any blank name) to this operator
            raise ValueError(f"{c.__name__}: aliases must be non-empty names, got {names[alias_keys.index('')]!r}")
        for k in (key, *alias_keys):
            _check_resolvable(k, c)
        _check_flag_spelling(c)
        for k in (key, *alias_keys):
            if k in _REGISTRY or k in _ALIASES:
                owner = _REGISTRY.get(k) or _REGISTRY[_ALIASES[k]]
                again = owner not in c.__mro__ and (owner.__module__, owner.__qualname__) == (
                    c.__module__, c.__qualname__)
                if k == key and name is None and "name" not in c.__dict__ and not again:
                    # a subclass that declares no name of its own: unregistering the holder (the advice below, for a
                    # class defined again) removed the parent it derives from, a built-in among them, or the sibling
                    # class that inherits the name from their base (the class defined again, of a base that is not
                    # registered, has the holder's module and qualified name, and gets the advice)
                    parent = next(b for b in c.__mro__ if "name" in b.__dict__)
                    raise ValueError(f"{c.__name__} has no registry name of its own: it inherits {key!r} from "
                                     f"{parent.__name__}, which {owner.__name__} holds; give it one (a class attribute "
                                     f"`name = ...`, or register_operator(name=...))")
                # a notebook cell run twice defines the class again: say how to replace it
                raise ValueError(f"operator name {k!r} is already registered by {owner.__name__}; to replace it "
                                 f"(a class defined again), call unregister_operator({owner.name!r}) first")
        _DECLARED[c] = _own_names(c)
        c.name = key
        c.aliases = alias_keys
        _REGISTRY[key] = c
        for a in alias_keys:
            _ALIASES[a] = key
        return c

    if cls is None:
        return wrap
    return wrap(cls)


def _check_resolvable(key: str, cls: type) -> None:
    """Refuse a name or alias that :func:`parse_operator_spec` and head specs cannot read back as that name."""
    bad = sorted(set(key) & set(_SPEC_SYNTAX))
    if bad or key in ("true", "false"):
        what = f"the characters {bad}, which" if bad else "a boolean literal, which"
        raise ValueError(f"{cls.__name__}: operator name {key!r} contains {what} operator and head specs "
                         f"('name(key=value):count,...') cannot read as a name")


def _check_flag_spelling(cls: type) -> None:
    """Refuse a class attribute that misspells a capability flag of :class:`DiffusionOperator` (``is_polynomal``,
    ``supports_kv_cashe``, ``need_second_map``): Python reads it as a new attribute, so the operator ran with the
    flag's default (its polynomial instead of its ``apply_matrix``, or cached decoding it cannot serve) without a
    word. Only a value of the flag's type counts (a bool; a dict for ``example_kwargs``), and a private name of one's
    own (``_is_polynomial``) is no slip for a public flag. A flag set on a mixin that comes after
    :class:`DiffusionOperator` in the bases (``class Op(DiffusionOperator, Mixin)``) is refused too: the
    :class:`DiffusionOperator` default shadows it."""
    flags = {k: type(v) for k, v in vars(DiffusionOperator).items()
             if isinstance(v, (bool, dict)) and not k.startswith("__")}
    shadowed = cls.__mro__[cls.__mro__.index(DiffusionOperator):]  # read after DiffusionOperator's own attributes
    for klass in (k for k in cls.__mro__ if k not in DiffusionOperator.__mro__):  # the mixins after it included
        for attr, value in vars(klass).items():
            if attr in flags and klass in shadowed and getattr(cls, attr) is not value:
                raise ValueError(f"{cls.__name__}: {klass.__name__} sets the capability flag {attr} = {value!r}, "
                                 f"but comes after DiffusionOperator in the bases, whose {attr} = "
                                 f"{getattr(cls, attr)!r} is the one read; put {klass.__name__} before it")
            if attr in flags or attr.startswith("__"):
                continue
            # a slip of a letter or two, not a longer name of one's own (is_polynomial_like, supports_sparse_grad)
            close = [f for f in difflib.get_close_matches(attr, flags, n=3, cutoff=0.8)
                     if isinstance(value, flags[f]) and abs(len(f) - len(attr)) <= 2
                     and (f.startswith("_") or not attr.startswith("_"))]
            if close:
                raise ValueError(f"{cls.__name__}: class attribute {attr!r} = {value!r} is not a capability flag of "
                                 f"DiffusionOperator (did you mean {close[0]!r}?); the flags are "
                                 f"{sorted(f for f in flags if not f.startswith('_'))}")


#: characters of the spec syntax (arguments, counts, lists of heads, templates): never part of a name
_SPEC_SYNTAX = "()[]{}:,"


def unregister_operator(name: str) -> None:
    """Remove an operator and its aliases (for tests and interactive work)."""
    key = _normalise(name)
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        operator_class(name)  # raises the "unknown operator ... (did you mean ...)" error
    cls = _REGISTRY.pop(key)
    for a in cls.aliases:
        _ALIASES.pop(a, None)
    # the class as it declared itself: registered again (under another name), it claimed the aliases of this
    # registration, the old name among them when that was given as an alias
    declared = _DECLARED.pop(cls, None)
    if declared is not None:
        _put_names(cls, declared)


def _own_names(cls: type) -> dict[str, Any]:
    """The ``name`` and ``aliases`` that ``cls`` holds itself (not inherited), which registering writes."""
    return {k: cls.__dict__[k] for k in ("name", "aliases") if k in cls.__dict__}


def _put_names(cls: type, names: dict[str, Any]) -> None:
    """Give ``cls`` the ``name`` and ``aliases`` of :func:`_own_names` again (one absent there: none of its own)."""
    for attr in ("name", "aliases"):
        if attr in names:
            setattr(cls, attr, names[attr])
        elif attr in cls.__dict__:
            delattr(cls, attr)


def list_operators() -> list[str]:
    """Names of the registered operators, sorted.

    Examples:
        >>> list_operators()[:3]
        ['attention', 'attnscale', 'differential']
    """
    return sorted(_REGISTRY)


def operator_class(name: str) -> type[DiffusionOperator]:
    """Resolve a name or alias (case, spaces and underscores ignored) to its class."""
    if not isinstance(name, str):
        raise TypeError(f"operator name must be a str, got {type(name).__name__}")
    key = _normalise(name)
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        aliases = ", ".join(f"{a!r}->{t!r}" for a, t in sorted(_ALIASES.items()))
        close = difflib.get_close_matches(key, [*_REGISTRY, *_ALIASES], n=3, cutoff=0.7)
        close = list(dict.fromkeys(_REGISTRY[_ALIASES.get(c, c)].name for c in close))
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise ValueError(f"unknown operator {name!r}{hint}; valid names: {list_operators()} (aliases: {aliases})")
    return _REGISTRY[key]


_SPEC = re.compile(r"^\s*([^()\s][^()]*?)\s*(?:\((.*)\))?\s*$", re.S)


class _NonFiniteNames(ast.NodeTransformer):
    """Reads the bare names ``inf`` and ``nan`` (``repr`` of a non-finite float) as float constants."""

    def visit_Name(self, name: ast.Name) -> ast.AST:
        return ast.Constant(float(name.id)) if name.id in ("inf", "nan") else name


def parse_operator_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split ``"heat(t=0.5, learnable=True)"`` into ``("heat", {"t": 0.5, "learnable": True})``.

    Values are Python literals (numbers, booleans, strings, None, tuples/lists, dicts/sets), and ``inf``,
    ``-inf`` and ``nan`` as the floats :meth:`DiffusionOperator.spec` writes them as.

    Examples:
        >>> parse_operator_spec("ppr(alpha=0.2, steps=4)")
        ('ppr', {'alpha': 0.2, 'steps': 4})
        >>> parse_operator_spec("I-P")
        ('I-P', {})
    """
    if not isinstance(spec, str):  # else re's "expected string or bytes-like object", which names no argument
        raise TypeError(f"operator spec must be a str, got {type(spec).__name__} ({spec!r})")
    m = _SPEC.match(spec)
    if m is None:
        raise ValueError(f"cannot parse operator spec {spec!r}; expected 'name' or 'name(key=value, ...)'")
    name, args = m.group(1), m.group(2)
    kwargs: dict[str, Any] = {}
    if args and args.strip():
        try:
            call = ast.parse(f"f({args})", mode="eval").body
        except SyntaxError as exc:
            raise ValueError(f"cannot parse the arguments of operator spec {_shortened(spec)}: {exc.msg}") from None
        except (RecursionError, MemoryError):  # the parser's stack overflows: '-----...1', '1+1+...+1j'
            raise ValueError(f"cannot parse the arguments of operator spec {_shortened(spec)}: nested too deeply "
                             f"for a Python literal") from None
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f"):
            raise ValueError(
                f"cannot parse operator spec {spec!r}; expected 'name' or 'name(key=value, ...)' "
                "with one pair of parentheses"
            )
        if call.args:
            raise ValueError(f"operator spec {spec!r}: arguments must be given as key=value")
        for kw in call.keywords:
            if kw.arg is None:
                raise ValueError(f"operator spec {spec!r}: arguments must be given as key=value, not **mapping")
            if kw.arg in kwargs:
                raise ValueError(f"operator spec {spec!r}: argument {kw.arg!r} is given twice")
            try:
                kwargs[kw.arg] = ast.literal_eval(_NonFiniteNames().visit(kw.value))  # type: ignore[index]
            except (ValueError, TypeError):  # TypeError: a set of lists, '{[1]}', is unhashable
                raise ValueError(
                    f"operator spec {_shortened(spec)}: the value of {kw.arg!r} must be a Python literal"
                ) from None
            except RecursionError:  # ast's visitors recurse: a literal of a few hundred unary minuses
                raise ValueError(f"operator spec {_shortened(spec)}: the value of {kw.arg!r} is nested too deeply "
                                 f"for a Python literal") from None
    if name.strip().lower() == "true" or name.strip().lower() == "false":
        raise ValueError(f"invalid operator name {name!r}")
    return name, kwargs


def _shortened(spec: str, limit: int = 120) -> str:
    """``repr(spec)``, its middle cut out past ``limit`` characters (an error message about a 100,000-character spec
    stays readable)."""
    text = repr(spec)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 :]} ({len(spec)} characters)"


def build_operator(spec: Any, **kwargs: Any) -> DiffusionOperator:
    """Build an operator from a name, an alias, a spec string, a class or an instance.

    Args:
        spec: ``"heat"``, ``"I-P"``, ``"heat(t=0.5)"``, ``HeatOperator`` or an instance.
        **kwargs: constructor arguments (merged over those of a spec string; not allowed with an instance).

    Raises:
        ValueError: unknown name (the message lists the valid ones) or bad arguments.
        TypeError: ``spec`` of an unsupported type, or an unknown keyword argument.

    Examples:
        >>> build_operator("heat", t=0.5, steps=4).degree
        4
    """
    if isinstance(spec, DiffusionOperator):
        if kwargs:
            raise TypeError(f"cannot pass arguments {sorted(kwargs)} together with an operator instance")
        return spec
    if isinstance(spec, type) and issubclass(spec, DiffusionOperator):
        cls = spec
    elif isinstance(spec, str):
        name, spec_kwargs = parse_operator_spec(spec)
        cls = operator_class(name)
        kwargs = {**spec_kwargs, **kwargs}
    else:
        raise TypeError(
            "operator spec must be a name, a DiffusionOperator subclass or instance, "
            f"got {type(spec).__name__}"
        )
    unknown = _unknown_arguments(cls, kwargs)
    if unknown:
        raise TypeError(f"cannot build operator {cls.name!r} with arguments {kwargs}: {unknown}")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise TypeError(f"cannot build operator {cls.name!r} with arguments {kwargs}: {exc}") from None


def _unknown_arguments(cls: type, kwargs: dict[str, Any]) -> str:
    """A message naming the keyword arguments ``cls`` does not take, with "did you mean"; '' if none.

    A constructor with ``**kwargs`` takes any name, so it reports none.
    """
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # no introspectable signature: let the constructor decide
        return ""
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return ""
    valid = [n for n, p in params.items()
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    messages = []
    for key in kwargs:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=2)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            messages.append(f"unknown argument {key!r}{hint}")
    if not messages:
        return ""
    return "; ".join(messages) + f"; valid arguments: {valid}"
