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

Every unknown key and mistyped value of a config is reported in one error
(:class:`ConfigErrors`), not the first alone:

    >>> config_from_dict(Cfg, {"detph": 4, "rate": "fast"})
    Traceback (most recent call last):
    ...
    diffusionformer.config.ConfigErrors: Cfg: 2 problems:
      - Cfg: unknown key 'detph'; valid keys: ['depth', 'rate'] (did you mean 'depth'?)
      - Cfg.rate: expected a float, got str 'fast'
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import numbers
import types
import typing
from typing import Any, Mapping, TypeVar

__all__ = ["FIELDS_HEADER", "ConfigErrors", "check_value", "config_from_dict", "config_to_dict", "document_fields"]

T = TypeVar("T")


class ConfigErrors(ValueError, TypeError):
    """Several problems of one config at once: unknown keys, mistyped values, failed range checks.

    A ``ValueError`` and a ``TypeError`` alike (its parts are either), so code that catches one
    of them keeps working; a config with a single problem raises that problem's own error.

    Attributes:
        problems: one sentence per problem, each naming its key path.
    """

    def __init__(self, problems: list[str], where: str) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{where}: {len(self.problems)} problems:\n{lines}")


def _raise_collected(errors: list[Exception], where: str) -> None:
    """Raise nothing, the one error as it is, or :class:`ConfigErrors` listing every problem."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors([p for e in errors for p in (e.problems if isinstance(e, ConfigErrors) else [str(e)])], where)


def _in_context(exc: Exception, prefix: str) -> Exception:
    """``exc`` again with ``prefix`` before its message, of its own type: a :class:`ConfigErrors` (whose constructor
    takes its problems, not one message, so ``type(exc)(text)`` fails on it) with ``prefix`` before each problem.

    Examples:
        >>> _in_context(TypeError("x: expected an int"), "task 't': ")
        TypeError("task 't': x: expected an int")
        >>> print(_in_context(ConfigErrors(["a: bad", "b: bad"], "Cfg"), "task 't': "))
        task 't': 2 problems:
          - task 't': a: bad
          - task 't': b: bad
    """
    if isinstance(exc, ConfigErrors):
        return ConfigErrors([f"{prefix}{p}" for p in exc.problems], prefix.rstrip(": "))
    return type(exc)(f"{prefix}{exc}")


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):  # typing.Optional[int] is named "Optional" alone
        return " | ".join(_type_name(arm) for arm in typing.get_args(tp))
    return "None" if tp is type(None) else getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _python_number(value: Any) -> Any:
    """A numpy (or other registered) integral/real number as the Python int/float it equals; anything else,
    Python bools, ints and floats included, as it is (a numpy bool stays one, for the checks to refuse)."""
    if type(value) in (bool, int, float) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _python_numbers(config: Any) -> None:
    """Every field of a model config that holds a numpy number (``np.int64`` from a sweep grid), alone or in a
    list/tuple, set to the Python number it equals, so the checks that follow read it and the config
    serialises and compares like one written with Python numbers (model configs, :class:`~diffusionformer.data.ssl.SSLConfig`)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, dict):  # heads={np.int64(0): ...}: a numpy key failed json.dumps (checkpoint, identity)
            items = {_python_number(k): _python_number(v) for k, v in value.items()}
            if any(a is not b or items[a] is not v for a, (b, v) in zip(items, value.items())):
                setattr(config, f.name, items)
        elif isinstance(value, (list, tuple)):
            items = [_python_number(v) for v in value]
            if any(a is not b for a, b in zip(items, value)):
                setattr(config, f.name, type(value)(items))
        elif _python_number(value) is not value:
            setattr(config, f.name, _python_number(value))


def _value_type(value: Any) -> str:
    """The type of ``value`` for an error message: ``int`` for a builtin, ``numpy.bool`` (not ``bool``, which would
    read as a contradiction in "expected a bool, got bool") for anything else."""
    tp = type(value)
    return tp.__qualname__ if tp.__module__ == "builtins" else f"{tp.__module__}.{tp.__qualname__}"


def _check_flag(value: Any, name: str) -> bool:
    """``value`` if it is a Python bool, else a TypeError ``"<name> must be a bool, got <type> (<value>)"``: a string
    ``"no"`` is truthy and would switch the option on, and a numpy bool is refused too, named ``numpy.bool`` (not the
    contradictory "must be a bool, got bool"). The one flag check of the package; a caller puts its prefix in ``name``
    (``"MetricsLog: active"``).

    Examples:
        >>> _check_flag(True, "pool")
        True
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {_value_type(value)} ({value!r})")
    return value


def _choice_hint(value: Any, choices: Any, aliases: Any = None) -> str:
    """`` (did you mean 'x'?)`` for a string ``value`` close to one of the string ``choices`` (a case-insensitive
    match first: ``"Sparse"`` -> ``'sparse'``, ``"BF16"`` -> ``'bf16'``; then :func:`difflib.get_close_matches`),
    ``""`` otherwise (a value that is not a string gets no hint). ``aliases`` maps other spellings of a choice (lower
    case) to it, asked first: ``"float32"`` means ``'off'`` for ``amp``, where spelling alone would point at ``'fp16'``.

    Examples:
        >>> _choice_hint("Sparse", ("dense", "sparse")), _choice_hint("sparce", ("dense", "sparse"))
        (" (did you mean 'sparse'?)", " (did you mean 'sparse'?)")
        >>> _choice_hint("xyz", ("dense", "sparse")), _choice_hint(3, ("dense", "sparse"))
        ('', '')
        >>> _choice_hint("FP32", ("off", "fp16"), {"fp32": "off"})
        " (did you mean 'off'?)"
    """
    if not isinstance(value, str):
        return ""
    folded = value.strip().lower()
    if aliases and folded in aliases:
        return f" (did you mean {aliases[folded]!r}?)"
    close = _closest_choice(value, choices)
    return f" (did you mean {close!r}?)" if close is not None else ""


def _closest_choice(value: str, choices: Any) -> str | None:
    """The string of ``choices`` closest to ``value``, as :func:`_choice_hint` suggests it (a case-insensitive
    match first, then :func:`difflib.get_close_matches` as spelt and in lower case), or None.

    Examples:
        >>> _closest_choice("BF16", ["bf16", "fp16"]), _closest_choice("rn", ["run", "show"]), _closest_choice("x", ["a"])
        ('bf16', 'run', None)
    """
    names = [c for c in choices if isinstance(c, str)]
    folded = value.strip().lower()
    close = ([c for c in names if c.lower() == folded] or difflib.get_close_matches(value, names, n=1)
             or difflib.get_close_matches(folded, [c.lower() for c in names], n=1))
    if close and close[0] not in names:  # matched in lower case: the choice as spelt
        close = [c for c in names if c.lower() == close[0]]
    return close[0] if close else None


def _device_argument(name: str, spec: Any) -> Any:
    """``torch.device(spec)`` for the argument ``name``; a value torch cannot read (``"cdua"``, ``3.5``) is a
    ValueError naming ``name`` with a "did you mean" among ``'cpu'``, ``'cuda'`` and ``'mps'``, not torch's
    RuntimeError listing every device type.

    Examples:
        >>> _device_argument("device", "cdua")
        Traceback (most recent call last):
        ValueError: device: expected a torch device such as 'cpu', 'cuda' or 'cuda:1', got 'cdua' (did you mean 'cuda'?)
    """
    import torch  # here: the configs themselves need no torch

    try:
        return torch.device(spec)
    except (RuntimeError, ValueError, TypeError) as err:
        raise ValueError(f"{name}: expected a torch device such as 'cpu', 'cuda' or 'cuda:1', got {spec!r}"
                         f"{_device_hint(spec)}") from err


def _device_hint(spec: Any, kinds: tuple[str, ...] = ("cpu", "cuda", "mps")) -> str:
    """`` (did you mean 'cuda:1'?)`` for a misspelt device string (``"cdua"``, ``"CUDA:1"``, ``"gpu"``, ``"Cpu"``): the
    closest of ``kinds`` (``gpu`` read as ``cuda``) with the index kept; ``""`` when nothing is close (a device of
    another kind, ``"tpu"``, is not suggested ``'cpu'``) or ``spec`` is not a string.

    Examples:
        >>> _device_hint("CUDA:1"), _device_hint("gpu"), _device_hint("tpu")
        (" (did you mean 'cuda:1'?)", " (did you mean 'cuda'?)", '')
    """
    if not isinstance(spec, str):
        return ""
    kind, sep, index = spec.strip().lower().partition(":")
    close = ["cuda"] if kind == "gpu" and "cuda" in kinds else difflib.get_close_matches(kind, kinds, n=1, cutoff=0.75)
    if not close:
        return ""
    suggestion = close[0] + (f":{index}" if sep and index.isdigit() and close[0] != "auto" else "")
    return f" (did you mean {suggestion!r}?)" if suggestion != spec else ""


def _same_container_kind(value: Any, tp: Any) -> bool:
    """Whether ``value`` is the kind of container annotation ``tp`` takes (a table for ``dict[...]`` or a dataclass, a
    list for ``list[...]`` or ``tuple[...]``), whatever its items: the arm of a union whose error names a bad item."""
    origin = tp if tp in (tuple, list, dict) else typing.get_origin(tp)
    if origin is dict or (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return isinstance(value, Mapping)
    return origin in (list, tuple) and isinstance(value, (list, tuple))


def check_value(value: Any, tp: Any, where: str) -> Any:
    """Check (and lightly coerce: int -> float, list -> tuple) ``value`` against annotation ``tp``."""
    # a bare ``tuple`` or ``list`` (a user's config: ``input_size: tuple = (8, 8)``) as ``tuple[Any, ...]``: else a TOML
    # or JSON list was refused for ``tuple``, so a run trained and its run_config.json could not be read back
    origin = tp if tp in (tuple, list) else typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors: list[tuple[Any, Exception]] = []
        for arm in typing.get_args(tp):
            try:
                return check_value(value, arm, where)
            except (TypeError, ValueError) as exc:
                errors.append((arm, exc))
        same_kind = [exc for arm, exc in errors if _same_container_kind(value, arm)]
        if len(same_kind) == 1:  # a table or list of the right kind whose item is wrong: that item's own error
            # (was "reach: expected dict | None, got dict {'val_acc': '0.5'}", naming neither the item nor its type)
            raise same_kind[0]
        raise TypeError(f"{where}: expected {_type_name(tp)}, got {_value_type(value)} {value!r}")
    if tp is type(None):
        if value is not None:
            raise TypeError(f"{where}: expected None, got {value!r}")
        return None
    if origin is typing.Literal:
        # a choice of the choice's own type, returned as spelt there: ``value in choices`` compared a numpy array
        # elementwise, so ``np.array(["mean"])`` passed and was stored (and a numpy str stayed one)
        for choice in typing.get_args(tp):
            same_type = isinstance(value, type(choice)) and isinstance(value, bool) == isinstance(choice, bool)
            if same_type and value == choice:
                return choice
        raise ValueError(f"{where}: expected one of {list(typing.get_args(tp))}, got {value!r}"
                         f"{_choice_hint(value, typing.get_args(tp))}")
    if tp is float:  # numpy numbers (a sweep grid's) are read as the Python numbers they equal
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{where}: expected a float, got {_value_type(value)} {value!r}")
        try:
            return float(value)
        except OverflowError:  # an int of 400 digits (TOML and JSON ints have no size limit)
            raise ValueError(f"{where}: expected a float, got an int of {int(value).bit_length()} bits, too large for one") from None
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{where}: expected an int, got {_value_type(value)} {value!r}")
        return int(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{where}: expected a bool, got {_value_type(value)} {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise TypeError(f"{where}: expected a string, got {_value_type(value)} {value!r}")
        return value
    if origin in (tuple, list):
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            key = where.rpartition(".")[2]
            # a TOML [tasks] header where [[tasks]] (one per entry) was meant: the one table came as a dict
            hint = (f" (a list of tables: in TOML, one [[{key}]] header per entry, not [{key}])" if isinstance(
                value, Mapping) and args and dataclasses.is_dataclass(args[0]) and key.isidentifier() else "")
            raise TypeError(f"{where}: expected a list, got {_value_type(value)} {value!r}{hint}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ValueError(f"{where}: expected {len(args)} items, got {len(value)}")
            items = [check_value(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args))]
        else:
            arg = args[0] if args else Any
            items, errors = [], []
            for i, v in enumerate(value):  # every item's problems, not the first item's alone
                try:
                    items.append(check_value(v, arg, f"{where}[{i}]"))
                except (TypeError, ValueError) as exc:
                    errors.append(exc)
            _raise_collected(errors, where)
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"{where}: expected a table/dict, got {_value_type(value)}")
        args = typing.get_args(tp)
        if args:
            return {check_value(k, args[0], f"{where} key"): check_value(v, args[1], f"{where}[{k!r}]") for k, v in value.items()}
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"{where}: expected a table for {tp.__name__}, got {_value_type(value)}")
        return config_from_dict(tp, value, where=where)
    if isinstance(tp, type):
        if not isinstance(value, tp):
            raise TypeError(f"{where}: expected {tp.__name__}, got {_value_type(value)} {value!r}")
        return value
    return value


def config_from_dict(cls: type[T], data: Mapping[str, Any], *, where: str | None = None) -> T:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and mistyped values.

    The dataclass's ``__post_init__`` then runs its own range checks (when every key and
    type is right).

    Raises:
        ValueError: an unknown key (with a "did you mean"), a missing required key, or a range check.
        TypeError: a mistyped value.
        ConfigErrors: several of these, every one listed, including those of nested
            configs (each table of a list of tables is checked, and range-checked, on its own).
    """
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):  # an instance is a dataclass too
        raise TypeError(f"config_from_dict: cls must be a dataclass type, got {cls!r}")
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__}: expected a table/dict, got {type(data).__name__}")
    where = where or cls.__name__
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    errors: list[Exception] = []
    for key, value in data.items():
        if key not in fields:
            # a class may name the table where a key of another table belongs (an experiment's 'lr' -> [tasks.train]);
            # else the closest field: "N_EMBD" -> 'n_embd' too
            placed = getattr(cls, "_misplaced_key_hint", None)
            hint = (placed(str(key)) if placed is not None else "") or _choice_hint(str(key), list(fields))
            errors.append(ValueError(f"{where}: unknown key {key!r}; valid keys: {sorted(fields)}{hint}"))
            continue
        try:
            kwargs[key] = check_value(value, hints[key], f"{where}.{key}")
        except (TypeError, ValueError) as exc:
            errors.append(exc)
    for name, f in fields.items():  # was: the dataclass's "__init__() missing 1 required positional argument"
        if name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            errors.append(ValueError(f"{where}: missing required key {name!r}"))
    _raise_collected(errors, where)
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
