"""Strict construction of typed dataclass configs from plain dicts (TOML, CLI overrides).

Unknown keys are errors that name the key; values are checked against the annotations.

Examples:
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Cfg:
    ...     depth: int = 2
    ...     rate: float = 0.1
    >>> config_from_dict(Cfg, {"depth": 4})
    Cfg(depth=4, rate=0.1)
    >>> config_from_dict(Cfg, {"detph": 4})
    Traceback (most recent call last):
    ...
    ValueError: Cfg: unknown key 'detph'; valid keys: ['depth', 'rate'] (did you mean 'depth'?)
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import types
import typing
from typing import Any, Mapping, TypeVar

__all__ = ["FIELDS_HEADER", "check_value", "config_from_dict", "config_to_dict", "document_fields"]

T = TypeVar("T")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def check_value(value: Any, tp: Any, where: str) -> Any:
    """Check (and lightly coerce: int -> float, list -> tuple) ``value`` against annotation ``tp``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in typing.get_args(tp):
            try:
                return check_value(value, arm, where)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise TypeError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    if tp is type(None):
        if value is not None:
            raise TypeError(f"{where}: expected None, got {value!r}")
        return None
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ValueError(f"{where}: expected one of {list(typing.get_args(tp))}, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{where}: expected a float, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{where}: expected an int, got {type(value).__name__} {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{where}: expected a bool, got {type(value).__name__} {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise TypeError(f"{where}: expected a string, got {type(value).__name__} {value!r}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ValueError(f"{where}: expected {len(args)} items, got {len(value)}")
            items = [check_value(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args))]
        else:
            arg = args[0] if args else Any
            items = [check_value(v, arg, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"{where}: expected a table/dict, got {type(value).__name__}")
        args = typing.get_args(tp)
        if args:
            return {check_value(k, args[0], f"{where} key"): check_value(v, args[1], f"{where}[{k!r}]") for k, v in value.items()}
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"{where}: expected a table for {tp.__name__}, got {type(value).__name__}")
        return config_from_dict(tp, value, where=where)
    if isinstance(tp, type):
        if not isinstance(value, tp):
            raise TypeError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
        return value
    return value


def config_from_dict(cls: type[T], data: Mapping[str, Any], *, where: str | None = None) -> T:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and mistyped values.

    The dataclass's ``__post_init__`` then runs its own range checks.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__}: expected a table/dict, got {type(data).__name__}")
    where = where or cls.__name__
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{where}: unknown key {key!r}; valid keys: {sorted(fields)}{hint}")
        kwargs[key] = check_value(value, hints[key], f"{where}.{key}")
    return cls(**kwargs)


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain, JSON-friendly dict of a (nested) dataclass config."""
    return dataclasses.asdict(config)


#: first line of the section :func:`document_fields` appends to a class docstring
FIELDS_HEADER = "Fields:"


def _field_comments(cls: type) -> dict[str, str]:
    """``{field: text}`` from the ``#:`` comments of ``cls``'s own source (trailing or on the lines above)."""
    import io
    import textwrap
    import tokenize

    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (frozen app, REPL): nothing to add
        return {}
    comments: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and tok.string.startswith("#:"):
                comments[tok.start[0]] = tok.string[2:].strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return {}
    out: dict[str, str] = {}
    lines = source.splitlines()
    for row, line in enumerate(lines, start=1):
        stripped = line.strip()
        name = stripped.split(":", 1)[0].strip() if ":" in stripped else ""
        if not name.isidentifier() or line[: len(line) - len(line.lstrip())] != "    ":
            continue  # only annotated names directly in the class body
        text = comments.get(row) if row in comments and not stripped.startswith("#") else None
        above, r = [], row - 1
        while r >= 1 and lines[r - 1].strip().startswith("#:"):
            above.insert(0, comments.get(r, ""))
            r -= 1
        text = " ".join(filter(None, [*above, text or ""])).strip()
        if text:
            out.setdefault(name, text)
    return out


def document_fields(cls: type[T]) -> type[T]:
    """Class decorator: append each dataclass field's ``#:`` comment to the class docstring.

    Sphinx reads the ``#:`` comments of a config's fields from the source; ``help(cls)`` and
    ``cls.__doc__`` do not. This adds a ``Fields:`` section (name, type, default, comment) so
    both say what every field means; fields of base classes take their base's comments. The
    docs build drops the section again (``docs/_ext/df_api.py``), since there each field is
    documented from its comment.

    Examples:
        >>> from diffusionformer.models import GPTConfig  # decorated where it is defined
        >>> print("\\n".join(GPTConfig.__doc__.splitlines()[2:5]))
        Fields:
            vocab_size (int, default 65): number of token ids
            block_size (int, default 64): maximum context length T
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"document_fields: expected a dataclass, got {cls!r}")
    comments: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        comments.update(_field_comments(klass))  # a subclass's comment wins
    rows = []
    for f in dataclasses.fields(cls):
        if f.name not in comments:
            continue
        tp = f.type if isinstance(f.type, str) else _type_name(f.type)
        default = "" if f.default is dataclasses.MISSING else f", default {f.default!r}"
        rows.append(f"    {f.name} ({tp}{default}): {comments[f.name]}")
    if rows:
        head = inspect.cleandoc(cls.__doc__ or "")
        cls.__doc__ = (head + "\n\n" if head else "") + "\n".join([FIELDS_HEADER, *rows])
    return cls
