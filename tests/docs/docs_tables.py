"""The markdown-table reader the docs-claims tests share (imported as a folder module: ``tests/docs/conftest.py``
puts this folder on ``sys.path``, pytest runs with ``--import-mode=importlib``)."""

from __future__ import annotations


def markdown_tables(text: str) -> list[tuple[str, list[dict[str, str]]]]:
    """``(last heading above, rows keyed by the header)`` of every markdown table of ``text`` (separator rows
    skipped)."""
    out, heading, header, rows = [], "", None, []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif not set("".join(cells)) <= set("-: "):
                rows.append(dict(zip(header, cells)))
            continue
        if header is not None:
            out.append((heading, rows))
            header, rows = None, []
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
    return out
