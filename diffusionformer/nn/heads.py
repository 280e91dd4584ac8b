"""Head specifications: which operator runs on which head of a layer, and of every layer of a model.

This module is the one place where head layouts are resolved. A model's layout is, inside
the library, a per-layer list of specs (:func:`resolve_layer_heads`); every way of writing
one is sugar turned into that list here:

* one spec for every layer, a per-layer list, or a ``{layer: spec}`` dict;
* ``laplacian_heads``: the seed paper's layout (the last ``k`` heads of a layer are
  Laplacian), an int, ``"half"`` (``H // 2``) or one entry per layer;
* templates ``{H}`` (heads per layer) and ``{half}`` (``H // 2``) inside spec strings
  (:func:`format_head_spec`), so one setting fits models of different widths.

A layer's spec is then parsed into operator groups by :func:`parse_heads`.
"""

from __future__ import annotations

import copy
import inspect
import numbers
import operator
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from diffusionformer.config import _choice_hint
from diffusionformer.operators import DiffusionOperator, build_operator
from diffusionformer.operators.base import _label, _spec_text
from diffusionformer.operators.registry import _unknown_arguments, operator_class, parse_operator_spec

__all__ = ["HeadGroup", "format_head_spec", "laplacian_count", "parse_heads", "resolve_layer_heads", "split_top_level"]


@dataclass
class HeadGroup:
    """A run of consecutive heads ``start .. start + count - 1`` served by one operator."""

    operator: DiffusionOperator
    start: int
    count: int

    @property
    def stop(self) -> int:
        return self.start + self.count


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses/brackets.

    Examples:
        >>> split_top_level("heat(t=1, steps=4):2,attention:2")
        ['heat(t=1, steps=4):2', 'attention:2']
    """
    parts, depth, cur = [], 0, []
    for ch, bare in zip(text, _mask_strings(text)):  # brackets and separators inside a quoted value are its text
        if bare in "([{":
            depth += 1
        elif bare in ")]}":
            depth -= 1
        if bare == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _quoted_spans(text: str) -> list[tuple[int, int]]:
    """``(start, stop)`` of the contents of the quoted string values in ``text`` (inside parentheses, where an
    operator's arguments are: ``"polynomial(init='heat(t=0.5)')"``; an unterminated one runs to the end)."""
    spans, depth, quote, escaped, start = [], 0, "", False, 0
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                spans.append((start, i))
                quote = ""
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch in "'\"" and depth > 0:
            quote, start = ch, i + 1
    if quote:
        spans.append((start, len(text)))
    return spans


def _mask_strings(text: str) -> str:
    """``text`` with the characters inside its quoted values replaced by ``_`` (same length): the spec syntax
    (``()[]{}:,``, the templates) is read outside them only, a value such as ``tag='a)b'`` or ``'{H}'`` is text."""
    chars = list(text)
    for start, stop in _quoted_spans(text):
        chars[start:stop] = "_" * (stop - start)
    return "".join(chars)


def _count_colon(item: str) -> int | None:
    """The index of the ``:`` before an item's head count (the last one outside brackets and quoted values), or
    ``None`` when the item gives no count."""
    depth = 0
    bare = _mask_strings(item)
    for i in range(len(item) - 1, -1, -1):
        ch = bare[i]
        if ch in ")]}":
            depth += 1
        elif ch in "([{":
            depth -= 1
        elif ch == ":" and depth == 0:
            return i
    return None


def _split_count(item: str) -> tuple[str, int | None]:
    i = _count_colon(item)
    if i is None:
        return item.strip(), None
    count_text = item[i + 1 :].strip()
    # ASCII digits only: int() also read '1_0' (10), '+2', '\u0662' (an Arabic-Indic 2) and '-0' as counts
    if re.fullmatch(r"-[0-9]+", count_text):
        raise ValueError(f"head count must be non-negative, got {count_text} in {item!r}")
    if not re.fullmatch(r"[0-9]+", count_text):
        raise ValueError(f"head count after ':' must be an integer, got {count_text!r} in {item!r}")
    return item[:i].strip(), int(count_text)


def parse_heads(heads: Any, num_heads: int) -> list[HeadGroup]:
    """Resolve a head specification into operator groups laid out in the order given.

    Args:
        heads: ``None`` (all attention); a string ``"attention:6,laplacian:2"`` (counts after
            ``:``; a single item without a count takes every head; operator arguments in
            parentheses, ``"heat(t=0.5, learnable=True):2"``); or a sequence with one entry per
            head (name, class or instance). An instance repeated on consecutive heads is one
            group (shared, or per-head parameters when its ``num_heads`` equals the run length).
        num_heads: ``H``.

    Raises:
        ValueError: counts that do not add up to ``H``, unknown operators, empty specs.
        TypeError: an unsupported spec type.

    Examples:
        >>> [(g.operator.name, g.start, g.count) for g in parse_heads("attention:3,I-P:1", 4)]
        [('attention', 0, 3), ('laplacian', 3, 1)]
        >>> [(g.operator.name, g.count) for g in parse_heads("attention:{half},laplacian:{half}", 4)]
        [('attention', 2), ('laplacian', 2)]
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    num_heads = int(num_heads)
    if isinstance(heads, str):
        heads = format_head_spec(heads, num_heads)
    if heads is None:
        return [HeadGroup(build_operator("attention", num_heads=num_heads), 0, num_heads)]
    if isinstance(heads, DiffusionOperator):
        if heads.num_heads not in (1, num_heads):
            raise ValueError(f"operator {type(heads).__name__} was built for num_heads={heads.num_heads} heads, but it "
                             f"is given alone for a layer of num_heads={num_heads}; build it with num_heads=1 or "
                             f"{num_heads}, or list the other heads too")
        heads = [heads] * num_heads
    if isinstance(heads, str):
        items = [it for it in split_top_level(heads) if it]
        if not items:
            raise ValueError("empty head specification; expected e.g. 'attention:6,laplacian:2'")
        parsed = [_split_count(it) for it in items]
        if len(parsed) == 1 and parsed[0][1] is None:
            parsed = [(parsed[0][0], num_heads)]
        groups: list[HeadGroup] = []
        start = 0
        for spec, count in parsed:
            count = 1 if count is None else count
            if count == 0:  # serves no head, but a misspelt name or argument is an error all the same
                _check_unused_spec(spec)
                continue
            groups.append(HeadGroup(build_operator(spec, num_heads=_group_num_heads(spec, count)), start, count))
            start += count
        if start != num_heads:
            raise ValueError(
                f"head specification {heads!r} assigns {start} heads but the layer has num_heads={num_heads}"
            )
        return groups
    if isinstance(heads, Sequence) and not isinstance(heads, (bytes, bytearray)):  # bytes: a str, not a list of ints
        if len(heads) != num_heads:
            raise ValueError(f"a per-head list must have num_heads={num_heads} entries, got {len(heads)}")
        groups = []
        h = 0
        while h < num_heads:
            entry = heads[h]
            if isinstance(entry, DiffusionOperator):
                run = 1
                while h + run < num_heads and heads[h + run] is entry:
                    run += 1
                if entry.num_heads not in (1, run):
                    raise ValueError(
                        f"operator instance {_label(entry)} has num_heads={entry.num_heads} but covers "
                        f"{run} consecutive heads (starting at head {h}); expected "
                        + ("1" if run == 1 else f"1 or {run}")
                    )
                groups.append(HeadGroup(entry, h, run))
                h += run
            else:
                if isinstance(entry, str):  # 'heat(num_heads=3)' serves one head: refused, not overridden to 1
                    _group_num_heads(entry, 1)
                groups.append(HeadGroup(build_operator(entry, num_heads=1), h, 1))
                h += 1
        return groups
    raise TypeError(
        "heads must be None, a string like 'attention:6,laplacian:2', or a list with one operator per head; "
        f"got {type(heads).__name__}"
    )


def _check_unused_spec(spec: str) -> None:
    """Build the operator of a zero-count head item and drop it: a misspelt name or argument is an error all the same.

    Built on the meta device, so that parameter initialisations (``differential(head_dim=8):0``) draw nothing from
    the global generator and the model's initialisation is unchanged; a save and restore of the global generator
    (``torch.random.fork_rng``) rewound the draws other threads made meanwhile. An operator whose constructor does
    not run on meta tensors is built on the default device under ``fork_rng`` as before.
    """
    try:
        with torch.device("meta"):
            build_operator(spec)
        return
    except (RuntimeError, NotImplementedError):  # a constructor that reads tensor values: no meta kernels
        pass
    with torch.random.fork_rng(devices=[]):
        build_operator(spec)


def _group_num_heads(spec: str, count: int) -> int:
    """``num_heads`` of the operator serving ``count`` heads: ``count`` (one parameter set per head), or
    ``1`` when the spec item says ``num_heads=1`` (one operator shared by the heads, as
    :meth:`~diffusionformer.nn.DiffusionAttention.heads_spec` writes a shared instance)."""
    given = parse_operator_spec(spec)[1].get("num_heads", count)
    if isinstance(given, bool) or not isinstance(given, int) or given not in (1, count):
        if count == 1:
            raise ValueError(f"head spec item {spec!r}:1: num_heads must be 1 (the item serves one head), got {given!r}")
        raise ValueError(f"head spec item {spec!r}:{count}: num_heads must be 1 (one operator shared by the {count} "
                         f"heads) or {count} (one per head), got {given!r}")
    return given


def format_head_spec(heads: Any, num_heads: int) -> Any:
    """Fill the templates ``{H}`` (``num_heads``) and ``{half}`` (``num_heads // 2``) of a head spec.

    Outside quoted values; the braces of the dict and set literals of operator arguments (``w={'k': 2}``) are those
    values', and the templates inside them are filled (``w={'k': {H}}``).

    Strings are formatted; lists, tuples and ``{layer: spec}`` mappings are formatted entry by
    entry (a list stays a list, a tuple a tuple, a mapping becomes a dict with int keys);
    anything else is returned as is.

    Raises:
        ValueError: an unknown template name.

    Examples:
        >>> format_head_spec("attention:{half},heat(t=0.5):{half}", 8)
        'attention:4,heat(t=0.5):4'
        >>> format_head_spec({"1": "laplacian:{H}"}, 2)
        {1: 'laplacian:2'}
    """
    if isinstance(heads, str):
        if "{" not in heads:
            return heads
        text = _escape_literal_braces(heads)
        try:  # outside quoted values only: a value '{H}' or 'a{b}' is a string, not a template
            parts, end = [], 0
            for start, stop in _quoted_spans(text):
                parts += [text[end:start].format(H=num_heads, half=num_heads // 2), text[start:stop]]
                end = stop
            return "".join(parts) + text[end:].format(H=num_heads, half=num_heads // 2)
        except (KeyError, IndexError, ValueError, TypeError, AttributeError) as err:  # '{H[0]}', '{H.x}' too
            raise ValueError(f"head spec {heads!r}: only the templates {{H}} and {{half}} are known ({err})") from None
    if isinstance(heads, (list, tuple)):
        return type(heads)(format_head_spec(h, num_heads) for h in heads)
    if isinstance(heads, Mapping):  # any mapping (a read-only MappingProxyType too), not only a dict
        out: dict[int, Any] = {}
        keys: dict[int, Any] = {}
        for k, v in heads.items():
            layer = _layer_key(k)
            if layer in out:  # {"1": ..., 1: ...}: one of the two specs would be dropped silently
                raise ValueError(f"heads given as a dict names layer {layer} twice (keys {keys[layer]!r} and {k!r})")
            out[layer], keys[layer] = format_head_spec(v, num_heads), k
        return out
    return heads


def _escape_literal_braces(text: str) -> str:
    """``text`` with the braces of the dict and set literals among an operator's arguments doubled (outside their
    quoted values), so that :meth:`str.format` keeps them: ``w={'k': 2}``, ``w={}``, ``w=[{1, 2}]`` are values, which
    the layer's ``heads_spec()`` writes as :meth:`~diffusionformer.operators.DiffusionOperator.spec` does (they were
    read as templates: "only the templates {H} and {half} are known"); ``t={H}``, which no literal reads, is one."""
    masked = _mask_strings(text)
    out, parens, i = [], 0, 0
    while i < len(text):
        ch = masked[i]
        parens += (ch == "(") - (ch == ")")
        stop = _closing_brace(masked, i) if ch == "{" and parens > 0 else None
        if stop is None:
            out.append(text[i])
            i += 1
            continue
        group, bare = text[i : stop + 1], masked[i : stop + 1]
        # the templates inside a literal ({'k': {H}}, {{half}, 1}) are filled as elsewhere: it is read with them as 0
        spans = [] if bare in _COUNT_TEMPLATES else [m.span() for m in re.finditer(r"\{(?:H|half)\}", bare)]
        probe = group
        for start, end in reversed(spans):
            probe = probe[:start] + "0" + probe[end:]
        try:
            parse_operator_spec(f"x(v={probe})")
        except ValueError:  # not a literal: a template (filled or refused by format_head_spec)
            out.append(group)
        else:
            keep = {j for start, end in spans for j in (start, end - 1)}  # the templates' own braces
            out.append("".join(c * 2 if m in "{}" and j not in keep else c
                               for j, (c, m) in enumerate(zip(group, bare))))
        i = stop + 1
    return "".join(out)


def _closing_brace(masked: str, start: int) -> int | None:
    """The index of the ``}`` that closes the ``{`` at ``start`` of a string masked by :func:`_mask_strings`."""
    depth = 0
    for j in range(start, len(masked)):
        depth += (masked[j] == "{") - (masked[j] == "}")
        if depth == 0:
            return j
    return None


#: the templates a head count may be written as, kept as they are by :func:`_spec_as_read`
_COUNT_TEMPLATES = ("{H}", "{half}")


def _item_as_read(item: str) -> str:
    """One item of a head spec string as :func:`_spec_as_read` writes it.

    Raises:
        ValueError, TypeError: an item that does not read as a registered operator with arguments it takes, and a
            count that is neither a non-negative int nor a template.
    """
    i = _count_colon(item)
    count = ""
    if i is not None:
        count_text = item[i + 1 :].strip()
        count = f":{count_text}" if count_text in _COUNT_TEMPLATES else f":{_split_count(item)[1]}"  # "02" is 2
        item = item[:i]
    name, kwargs = parse_operator_spec(item)
    cls = operator_class(name)  # an unknown name: ValueError
    if _unknown_arguments(cls, kwargs):
        raise ValueError(f"operator {cls.name!r} takes no argument of {sorted(kwargs)}")
    try:  # the constructor's order, which DiffusionOperator.spec writes; others (a **kwargs constructor's) after
        order = list(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        order = []
    keys = sorted(kwargs, key=lambda k: (0, order.index(k), "") if k in order else (1, 0, k))
    text = _spec_text(cls.name, {k: kwargs[k] for k in keys})
    # read back as the same operator and values, and free of template braces, or the spelling is kept as given
    back_name, back = parse_operator_spec(text)
    if (operator_class(back_name) is not cls or [(k, repr(v)) for k, v in back.items()]
            != [(k, repr(kwargs[k])) for k in keys] or "{" in _mask_strings(text)):
        raise ValueError(f"{text!r} does not read back as {item!r}")
    return text + count


def _spec_as_read(spec: Any) -> Any:
    """A head spec string as the library reads it, the one spelling of one head layout that run identities,
    checkpoints' model records and ``summary``'s columns compare (the model configs record ``heads`` so).

    Operator names as the registry names them (aliases, case, spaces and ``_`` resolved: ``"I-P"`` and
    ``"Laplacian"`` are ``"laplacian"``), whitespace around items and counts dropped, operator arguments in the
    order of the operator's constructor and their values written as ``repr`` writes them (``.5`` is ``0.5``,
    ``"attention"`` is ``'attention'``), as :meth:`~diffusionformer.operators.DiffusionOperator.spec` and
    :meth:`~diffusionformer.nn.DiffusionAttention.heads_spec` write them: ``"attention:6,laplacian:2"`` and
    ``"attention:2,heat(t=0.5, steps=4, method='taylor', learnable=True):2"`` are their own. The templates
    ``{H}``/``{half}`` are kept. A spec that does not read so (an unknown operator or argument, a count of the
    wrong form) is returned as given, for the config's own checks to report; so is anything but a string (a
    per-head list).

    Examples:
        >>> _spec_as_read("Attention:2, I-P:2")
        'attention:2,laplacian:2'
        >>> _spec_as_read("attention:{half},heat(learnable=True, t=.5):{half}")
        'attention:{half},heat(t=0.5, learnable=True):{half}'
    """
    if not isinstance(spec, str):
        return spec
    items, read_items = [], {}  # each distinct item read once: a 10,000-item spec of two kinds reads two
    try:
        for item in split_top_level(spec):
            if item:
                if item not in read_items:
                    read_items[item] = _item_as_read(item)
                items.append(read_items[item])
    except (ValueError, TypeError):
        return spec
    read = ",".join(items)
    return read if items and read != spec else spec


def _layout_as_read(heads: Any) -> Any:
    """A model config's ``heads`` (a spec for every layer, a per-layer list or a ``{layer: spec}`` mapping) with
    its spec strings as read (:func:`_spec_as_read`); other entries (``None``, a per-head list) and other values
    as given, and ``heads`` itself where nothing changes."""
    if isinstance(heads, str):
        return _spec_as_read(heads)
    if isinstance(heads, (list, tuple)):
        read = [_spec_as_read(h) for h in heads]
        if all(r is h for r, h in zip(read, heads)):
            return heads
        return tuple(read) if isinstance(heads, tuple) else read
    if isinstance(heads, Mapping):
        entries = {k: _spec_as_read(v) for k, v in heads.items()}
        return heads if all(entries[k] is v for k, v in heads.items()) else entries
    return heads


def _layer_key(key: Any) -> int:
    """A key of a ``{layer: spec}`` dict as a layer index (TOML keys arrive as strings: ``"1"``)."""
    try:
        if isinstance(key, bool):
            raise ValueError
        if isinstance(key, str):  # an optional '-' and ASCII digits: int() also read '1_0' (10), ' 1', '+1'
            if not re.fullmatch(r"-?[0-9]+", key):
                raise ValueError
            return int(key)
        return operator.index(key)
    except (TypeError, ValueError):
        raise ValueError(f"heads given as a dict maps layer indices to specs ({{1: 'laplacian:2'}}); "
                         f"got the key {key!r}") from None


def laplacian_count(count: Any, num_heads: int) -> Any:
    """``laplacian_heads`` with ``"half"`` (one value, or list entries) replaced by ``num_heads // 2``.

    Examples:
        >>> laplacian_count("half", 6), laplacian_count([0, "half"], 4), laplacian_count(3, 8)
        (3, [0, 2], 3)
    """
    if isinstance(count, str) and count == "half":  # a numpy array compared with "half" has no single truth value
        return num_heads // 2
    if isinstance(count, list):
        return [laplacian_count(c, num_heads) for c in count]
    return count


def _own_operators(specs: list[Any]) -> list[Any]:
    """A model's per-layer head specs (:func:`resolve_layer_heads`) with the operator instances in them copied, once
    per layer: a spec string builds each layer's operators anew, and an instance is a template the same way (as
    ``nn.TransformerEncoder`` copies its layer). Two layers given one instance (``heads=[op, op]``), or two models
    built from one config, shared its parameters: trained together, and training one model changed the other; the
    config's instance stays as given. Instances shared by heads of one layer stay shared within it."""
    owned = []
    for layer, spec in enumerate(specs):
        try:
            owned.append(spec if spec is None or isinstance(spec, str) else copy.deepcopy(spec))
        except Exception as exc:  # noqa: BLE001 - torch's deepcopy error names neither the operator nor the layer
            raise TypeError(f"heads of layer {layer}: {spec!r} cannot be copied ({type(exc).__name__}: {exc}); an "
                            "operator in a model config is copied for every layer of every model built from it, as "
                            "a spec string is built anew: make it copyable (copy.deepcopy), or give a spec "
                            "string") from exc
    return owned


def resolve_layer_heads(
    num_layers: int,
    num_heads: int,
    heads: Any = None,
    laplacian_heads: int | str | Sequence[int | str] | None = None,
) -> list[Any]:
    """One head specification per layer: the library's one representation of a model's head layout.

    Args:
        num_layers: depth ``L``.
        num_heads: heads per layer ``H``.
        heads: ``None`` (attention), one spec for every layer (a string such as
            ``"attention:2,laplacian:2"``, templates ``{H}``/``{half}`` allowed), a list of
            ``L`` specs (``None`` entries are attention), or a dict ``{layer: spec}``
            overriding some layers.
        laplacian_heads: convenience for the seed paper's layout: an int or ``"half"`` (every
            layer) or a list of ``L`` of them; the last ``k`` heads of a layer become
            Laplacian, as in the paper's own code. Exclusive with ``heads``.

    Examples:
        >>> resolve_layer_heads(3, 4, laplacian_heads=[0, 2, 4])
        [None, 'attention:2,laplacian:2', 'laplacian:4']
        >>> resolve_layer_heads(2, 2, heads={1: "heat(learnable=True):2"})
        [None, 'heat(learnable=True):2']
        >>> resolve_layer_heads(2, 4, laplacian_heads="half")
        ['attention:2,laplacian:2', 'attention:2,laplacian:2']
    """
    # numpy ints (a sweep grid's) are read as the ints they equal, as parse_heads reads num_heads
    if isinstance(num_layers, bool) or not isinstance(num_layers, numbers.Integral) or num_layers < 1:
        raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    num_layers, num_heads = int(num_layers), int(num_heads)
    if laplacian_heads is not None:
        if heads is not None:
            raise ValueError("give either heads= or laplacian_heads=, not both")
        if isinstance(laplacian_heads, str) and laplacian_heads != "half":
            raise ValueError(f"laplacian_heads must be an int, 'half' or a list of them, got {laplacian_heads!r}"
                             f"{_choice_hint(laplacian_heads, ('half',))}")
        one = isinstance(laplacian_heads, (numbers.Integral, str))
        if not (one or isinstance(laplacian_heads, (list, tuple))):
            raise ValueError(f"laplacian_heads must be an int, 'half' or a list of them, got {laplacian_heads!r}")
        counts = laplacian_count([laplacian_heads] * num_layers if one else list(laplacian_heads), num_heads)
        if len(counts) != num_layers:
            raise ValueError(f"laplacian_heads lists {len(counts)} layers, the model has {num_layers}")
        specs: list[Any] = []
        for i, k in enumerate(counts):
            if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= k <= num_heads:
                raise ValueError(f"laplacian_heads[{i}] must be an int in [0, {num_heads}], got {k!r}"
                                 f"{_choice_hint(k, ('half',))}")
            k = int(k)
            if k == 0:
                specs.append(None)
            elif k == num_heads:
                specs.append(f"laplacian:{k}")
            else:
                specs.append(f"attention:{num_heads - k},laplacian:{k}")
        return specs
    if isinstance(heads, (bytes, bytearray)):  # else read as a per-layer list of ints ("must have 2 entries, got 11")
        raise TypeError(f"heads must be None, a spec string, a per-layer list or a dict, got {type(heads).__name__} "
                        f"{heads!r} (decode it to a str)")
    heads = format_head_spec(heads, num_heads)
    if heads is None or isinstance(heads, str):
        return [heads] * num_layers
    if isinstance(heads, Mapping):
        specs = [None] * num_layers
        given: dict[int, int] = {}
        for layer, spec in heads.items():
            if isinstance(layer, bool) or not isinstance(layer, int) or not -num_layers <= layer < num_layers:
                raise ValueError(f"layer index {layer!r} out of range for {num_layers} layers")
            index = layer % num_layers
            if index in given:  # {1: ..., -1: ...} of two layers: the later spec silently replaced the earlier
                raise ValueError(f"heads given as a dict names layer {index} of {num_layers} twice "
                                 f"(keys {given[index]!r} and {layer!r})")
            given[index] = layer
            specs[index] = spec
        return specs
    if isinstance(heads, Sequence):
        if len(heads) != num_layers:
            raise ValueError(f"a per-layer heads list must have {num_layers} entries (one per layer), got {len(heads)}")
        return list(heads)
    raise TypeError(f"heads must be None, a spec string, a per-layer list or a dict, got {type(heads).__name__}")
