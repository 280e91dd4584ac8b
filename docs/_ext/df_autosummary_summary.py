"""Keep autosummary's one-line summaries from cutting inside inline literals.

``sphinx.ext.autosummary.extract_summary`` takes the first sentence of a docstring by
splitting at a period followed by whitespace. Its check that the cut did not break inline
markup re-parses the whole paragraph instead of the cut text, so a first sentence such as
``Weights on ``P^0 .. P^K`` of ...`` is cut inside the literal and docutils then warns
"Inline literal start-string without end-string" (a Sphinx limitation, seen in Sphinx
7.2 to 9.0). Library docstrings legitimately write ranges like ``P^0 .. P^K``, so this
extension hides periods inside ````literals```` and ```roles``` from the sentence split
and restores them afterwards. Nothing else about the summaries changes.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from sphinx.ext import autosummary

_INLINE = re.compile(r"``.+?``|`[^`]+`")
_HIDDEN_PERIOD = "\ue000"  # a private-use code point, never present in docstrings


def _hide_periods(line: str) -> str:
    return _INLINE.sub(lambda m: m.group(0).replace(".", _HIDDEN_PERIOD), line)


def _wrap(original: Any) -> Any:
    def extract_summary(doc: Sequence[str], settings: Any) -> str:
        summary = original([_hide_periods(line) for line in doc], settings)
        return summary.replace(_HIDDEN_PERIOD, ".")

    extract_summary.__wrapped__ = original  # type: ignore[attr-defined]
    return extract_summary


def setup(app: Any) -> dict[str, Any]:
    if not hasattr(autosummary.extract_summary, "__wrapped__"):
        autosummary.extract_summary = _wrap(autosummary.extract_summary)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
