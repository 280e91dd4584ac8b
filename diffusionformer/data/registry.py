"""The dataset registry: one name -> one loader function.

A loader is a function ``loader(*, seed, [root], **options) -> TaskData`` whose keyword-only
parameters (besides ``seed`` and ``root``) are its options. Registration is strict (a
duplicate name raises; :func:`unregister_dataset` frees a name to register it again); look-up
is forgiving about case and ``-``/``_`` (``"PTC-MR"`` finds ``"ptc_mr"``); an unknown name
lists the valid ones and an unknown option is named.
"""

from __future__ import annotations

import difflib
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, TypeVar, get_args

import numpy as np

from diffusionformer.config import _check_flag, _choice_hint, _value_type, check_value

from .base import TaskData
from .paths import resolve_root
from .splits import _check_seed

__all__ = ["DatasetSpec", "register_dataset", "unregister_dataset", "load_dataset", "list_datasets", "dataset_spec"]

KINDS = ("image", "sequence", "text", "sequence_lm", "node", "graph")

F = TypeVar("F", bound=Callable[..., TaskData])


@dataclass(frozen=True)
class DatasetSpec:
    """What the registry knows about a dataset before loading it.

    Args:
        name: canonical registry name.
        kind: the ``kind`` of the returned container.
        needs_root: whether the files come from the data root.
        loader: the function that builds it.
        options: option name -> default value.
        summary: first line of the loader's docstring.
    """

    name: str
    kind: str
    needs_root: bool
    loader: Callable[..., TaskData]
    options: dict[str, Any]
    summary: str


# importlib.reload of this module (a notebook) keeps the datasets the loader modules registered at import (they are
# not run again)
_REGISTRY: dict[str, DatasetSpec] = globals().get("_REGISTRY", {})
_CONTAINERS: tuple[type, ...] = get_args(TaskData)  # the data containers, TaskData's members


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def register_dataset(name: str, *, kind: str, needs_root: bool = False) -> Callable[[F], F]:
    """Decorator that registers ``loader`` under ``name``.

    Args:
        name: canonical name shown by :func:`list_datasets`.
        kind: one of ``image, sequence, text, sequence_lm, node, graph``.
        needs_root: the loader takes a ``root`` keyword (the resolved data root).

    Raises:
        ValueError: on a duplicate (the message names :func:`unregister_dataset`, the way to replace it) or empty
            name or an unknown kind.
        TypeError: when the name is not a str, ``needs_root`` not a bool, or the loader is not callable, has
            positional parameters, ``*args`` or ``**kwargs``, an option without a default, or lacks
            ``seed``/``root`` (or takes ``root`` without ``needs_root``: it would never be passed one).

    :func:`load_dataset` refuses what the loader returns unless it is a data container of the registered ``kind``.
    """
    if not isinstance(name, str):  # else "'int' object has no attribute 'strip'"
        raise TypeError(f"dataset name must be a str, got {type(name).__name__} ({name!r})")
    if not _key(name):  # else registered under "" (listed as a blank name)
        raise ValueError(f"dataset name must be a non-empty string, got {name!r}")
    name = name.strip()  # looked up stripped; listed as given (" my data ") it was no name a config reads back as is
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}{_choice_hint(kind, KINDS)}")
    _check_flag(needs_root, f"register_dataset({name!r}): needs_root")  # else "no" was truthy: a root passed

    def decorator(loader: F) -> F:
        key = _key(name)
        if key in _REGISTRY:  # a notebook cell run twice registers the name again: say how to replace it
            taken = _REGISTRY[key].name
            by = f" (as {taken!r})" if taken != name else ""
            raise ValueError(f"dataset {name!r} is already registered{by}; to replace it (a loader defined again), "
                             f"call unregister_dataset({taken!r}) first")
        if not callable(loader):
            raise TypeError(f"loader for {name!r} must be a function, got {type(loader).__name__} ({loader!r})")
        params = inspect.signature(loader).parameters
        positional = [p.name for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if positional:
            raise TypeError(
                f"loader for {name!r} must take keyword-only arguments, got {positional}"
            )
        variadic = [p.name for p in params.values() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if variadic:  # "must take keyword-only arguments, got ['kw']" for **kw, itself keywords
            raise TypeError(f"loader for {name!r} must name its options as keyword-only parameters with defaults "
                            f"(its options are read from them), not take *args or **kwargs; got {variadic}")
        required = {"seed", "root"} if needs_root else {"seed"}
        if not required <= set(params):
            raise TypeError(f"loader for {name!r} must accept {sorted(required)}")
        if "root" in params and not needs_root:  # else load_dataset(root=...) is "missing ... 'root'", or ignored
            raise TypeError(f"loader for {name!r} takes a 'root' parameter, which only a dataset registered with "
                            "needs_root=True is passed: register it with needs_root=True, or drop the parameter")
        options = {
            p.name: p.default for p in params.values() if p.name not in ("seed", "root")
        }
        no_default = [key for key, default in options.items() if default is inspect.Parameter.empty]
        if no_default:  # else listed with default inspect._empty, and a config without it failed at its load
            raise TypeError(f"loader for {name!r} must give each option a default (its options are read from them, "
                            f"and a config may leave any out); got none for {no_default}")
        doc = inspect.getdoc(loader) or ""
        _REGISTRY[key] = DatasetSpec(
            name=name,
            kind=kind,
            needs_root=needs_root,
            loader=loader,
            options=options,
            summary=doc.splitlines()[0] if doc else "",
        )
        return loader

    return decorator


_OPTION_KINDS = {bool: "a bool", int: "an int", float: "a number", str: "a str"}


def _check_option_type(spec: DatasetSpec, key: str, value: Any) -> Any:
    """Refuse an option whose type cannot be that of its default (bool, int, float, str, read by the config
    files' :func:`~diffusionformer.config.check_value`: numpy numbers pass, bools are no numbers; a ``None``
    default is not checked): ``normalize="no"`` or ``val_fraction="0.1"`` would otherwise be read as truthy or
    fail deep inside the loader. Returns the value as the loader is given it: a numpy number (of an unchecked
    option too) as the Python number it equals, an int for a float default as a float."""
    default = spec.options[key]
    kind = type(default)
    if kind not in _OPTION_KINDS:  # `limit: int | None = None` given a sweep grid's np.int64: was passed on as one
        return value.item() if isinstance(value, (np.integer, np.floating)) else value
    try:
        return check_value(value, kind, f"load_dataset({spec.name!r}): option {key!r}")
    except TypeError:
        raise TypeError(f"load_dataset({spec.name!r}): option {key!r} must be {_OPTION_KINDS[kind]} (default "
                        f"{default!r}), got {_value_type(value)} {value!r}") from None


def dataset_spec(name: str) -> DatasetSpec:
    """The :class:`DatasetSpec` registered under ``name`` (case and ``-``/``_`` insensitive).

    Raises:
        ValueError: for an unknown name, listing the valid names.

    Examples:
        >>> dataset_spec("CSBM").kind
        'node'
    """
    if not isinstance(name, str):
        raise TypeError(f"dataset name must be a str, got {type(name).__name__}")
    try:
        return _REGISTRY[_key(name)]
    except KeyError:
        close = difflib.get_close_matches(_key(name), list(_REGISTRY), n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(repr(_REGISTRY[c].name) for c in close)}?)" if close else ""
        raise ValueError(
            f"unknown dataset {name!r}{hint}; valid names: {', '.join(list_datasets())}"
        ) from None


def unregister_dataset(name: str) -> DatasetSpec:
    """Remove dataset ``name`` (case and ``-``/``_`` insensitive, as :func:`load_dataset` reads it) and return its
    :class:`DatasetSpec` (for tests and interactive work: a notebook cell that registers a loader, run again). A
    built-in dataset may be removed too; registering the name again loads with the new loader.

    Args:
        name: the dataset's name (any spelling :func:`load_dataset` accepts).

    Returns:
        The removed :class:`DatasetSpec`.

    Raises:
        TypeError: ``name`` is not a ``str``.
        ValueError: no dataset is registered under ``name`` (with a close match, if any), as :func:`dataset_spec`.

    Examples:
        >>> @register_dataset("doc-recall", kind="sequence_lm")
        ... def _doc_recall(*, seed):
        ...     return load_dataset("assoc-recall", num_examples=20, num_pairs=2, vocab_size=8, seed=seed)
        >>> unregister_dataset("DOC_RECALL").name
        'doc-recall'
        >>> "doc-recall" in list_datasets()
        False
    """
    spec = dataset_spec(name)  # the "unknown dataset ... (did you mean ...)" error
    return _REGISTRY.pop(_key(spec.name))


def list_datasets(kind: str | None = None) -> list[str]:
    """Sorted canonical names of the registered datasets, optionally only those of ``kind``.

    Examples:
        >>> "digits" in list_datasets() and "cora" in list_datasets("node")
        True
    """
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)} or None, got {kind!r}{_choice_hint(kind, KINDS)}")
    return sorted(s.name for s in _REGISTRY.values() if kind is None or s.kind == kind)


def load_dataset(
    name: str,
    *,
    root: str | os.PathLike[str] | None = None,
    seed: int = 0,
    **options: Any,
) -> TaskData:
    """Load a registered dataset as a typed container (see :mod:`diffusionformer.data.base`).

    Args:
        name: a name from :func:`list_datasets` (case and ``-``/``_`` insensitive).
        root: data root for datasets read from files; defaults to ``$DIFFUSIONFORMER_DATA``.
            Ignored by embedded datasets.
        seed: seed of every random choice (splits, generators).
        **options: dataset-specific options; see ``dataset_spec(name).options``.

    Raises:
        ValueError: unknown name (the message lists the valid names), a bad option value, or a
            loader that returned a container of another kind than registered.
        TypeError: unknown option (named in the message, with a close match if any), an
            option whose type differs from its default's (bool, int, float or str), or a loader
            that returned no data container.
        DataRootError: the dataset needs a data root and it or its files are missing.

    Examples:
        >>> data = load_dataset("assoc-recall", num_examples=20, num_pairs=2, vocab_size=8)
        >>> data.kind, data.x_train.shape[1]
        ('sequence_lm', 5)
    """
    spec = dataset_spec(name)
    unknown = [k for k in options if k not in spec.options]
    if unknown:
        valid = ", ".join(spec.options) or "none"
        close = [c for k in unknown for c in difflib.get_close_matches(k, list(spec.options), n=1, cutoff=0.6)]
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise TypeError(
            f"load_dataset({spec.name!r}) got unknown option(s) {', '.join(map(repr, unknown))}{hint}; "
            f"valid options: {valid}"
        )
    # a loader is given Python numbers (a sweep grid's np.int64 seed failed in a user's torch.Generator().manual_seed)
    options = {key: _check_option_type(spec, key, value) for key, value in options.items()}
    # here, not in each loader: the fixed-split loaders (cora, citeseer, pydoc-chars, ...) never read the seed and
    # took seed="x", None or -1 silently, while the seeded ones refuse them
    kwargs: dict[str, Any] = dict(options, seed=_check_seed(seed))
    if spec.needs_root:
        kwargs["root"] = resolve_root(root)
    data = spec.loader(**kwargs)
    # a registered loader's container is checked here: what the runner validates a config by (dataset_spec's kind:
    # the model family, evaluation keys) was not what it got, and a dict failed deep inside the task
    if not isinstance(data, _CONTAINERS):
        raise TypeError(f"the loader of dataset {spec.name!r} ({getattr(spec.loader, '__qualname__', spec.loader)!r}) "
                        f"must return a data container ({', '.join(c.__name__ for c in _CONTAINERS)}), got "
                        f"{type(data).__name__}")
    if data.kind != spec.kind:
        raise ValueError(f"the loader of dataset {spec.name!r} returned a container of kind {data.kind!r}, but the "
                         f"dataset is registered with kind {spec.kind!r}")
    return data
