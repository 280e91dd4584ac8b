"""Head specifications: which operator runs on which head of a layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from diffusionformer.operators import DiffusionOperator, build_operator

__all__ = ["HeadGroup", "parse_heads", "split_top_level"]


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
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _split_count(item: str) -> tuple[str, int | None]:
    depth = 0
    for i in range(len(item) - 1, -1, -1):
        ch = item[i]
        if ch in ")]}":
            depth += 1
        elif ch in "([{":
            depth -= 1
        elif ch == ":" and depth == 0:
            count_text = item[i + 1 :].strip()
            try:
                count = int(count_text)
            except ValueError:
                raise ValueError(f"head count after ':' must be an integer, got {count_text!r} in {item!r}") from None
            if count < 0:
                raise ValueError(f"head count must be non-negative, got {count} in {item!r}")
            return item[:i].strip(), count
    return item.strip(), None


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
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    if heads is None:
        return [HeadGroup(build_operator("attention", num_heads=num_heads), 0, num_heads)]
    if isinstance(heads, DiffusionOperator):
        heads = [heads] * num_heads if heads.num_heads in (1, num_heads) else [heads]
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
            if count == 0:
                continue
            groups.append(HeadGroup(build_operator(spec, num_heads=count), start, count))
            start += count
        if start != num_heads:
            raise ValueError(
                f"head specification {heads!r} assigns {start} heads but the layer has num_heads={num_heads}"
            )
        return groups
    if isinstance(heads, Sequence):
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
                        f"operator instance {entry.name!r} has num_heads={entry.num_heads} but covers "
                        f"{run} consecutive heads (starting at head {h}); expected 1 or {run}"
                    )
                groups.append(HeadGroup(entry, h, run))
                h += run
            else:
                groups.append(HeadGroup(build_operator(entry, num_heads=1), h, 1))
                h += 1
        return groups
    raise TypeError(
        "heads must be None, a string like 'attention:6,laplacian:2', or a list with one operator per head; "
        f"got {type(heads).__name__}"
    )
