"""``.. df-operator-table::``: the table of registered operators, generated from the registry.

The rows come from :func:`diffusionformer.operators.list_operators` at build time, so a
newly registered operator appears in the docs without editing them. For each operator the
table shows its name and aliases, its class, the first sentence of its docstring (which by
the project's convention states ``f(P)``), the degree ``K`` and coefficients of an instance
built with default arguments, and its capability flags.
"""

from __future__ import annotations

import inspect
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

_MAX_COEFFS = 4
_EMPTY = "\\ "  # an empty cell in a list-table


def _summary(cls: type) -> str:
    # the class's own docstring: ``inspect.getdoc`` would show a base class's text (for an
    # operator without a docstring, the generic one of ``DiffusionOperator``) as its definition
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    first = doc.split("\n\n", 1)[0]
    return " ".join(first.split())


def _defaults(cls: type) -> tuple[str, str]:
    """(degree, coefficients) of an instance built with default arguments."""
    from diffusionformer.operators import build_operator

    op = build_operator(cls)
    if not op.is_polynomial:
        return "--", "not a polynomial in :math:`P`"
    c = op.head_coefficients(1)[0].detach().double().tolist()
    shown = ", ".join(f"{x:.4g}" for x in c[:_MAX_COEFFS])
    if len(c) > _MAX_COEFFS:
        shown += ", ..."
    return str(op.degree), f"({shown})"


def operator_table_rst() -> str:
    """The reStructuredText ``list-table`` of every registered operator."""
    from diffusionformer.operators import list_operators, operator_class

    lines = [
        ".. list-table:: Registered operators (generated from ``list_operators()``)",
        "   :header-rows: 1",
        "   :widths: 12 14 16 36 6 16 6 6",
        "",
        "   * - name",
        "     - aliases",
        "     - class",
        "     - definition",
        "     - default :math:`K`",
        "     - default coefficients on :math:`P^0, P^1, \\dots`",
        "     - sparse",
        "     - polynomial",
    ]
    for name in list_operators():
        cls = operator_class(name)
        degree, coeffs = _defaults(cls)
        aliases = ", ".join(f"``{a}``" for a in cls.aliases) or _EMPTY
        summary = _summary(cls) or _EMPTY
        lines += [
            f"   * - ``{name}``",
            f"     - {aliases}",
            f"     - :class:`~{cls.__module__}.{cls.__qualname__}`",
            f"     - {summary}",
            f"     - {degree}",
            f"     - {coeffs}",
            f"     - {'yes' if cls.supports_sparse else 'no'}",
            f"     - {'yes' if cls.is_polynomial else 'no'}",
        ]
    return "\n".join(lines)


class OperatorTableDirective(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        try:
            text = operator_table_rst()
        except Exception as exc:  # a broken operator must fail the docs build loudly
            logger.warning("df-operator-table: cannot build the table: %r", exc, location=self.get_location())
            return []
        container = nodes.container()
        lines = StringList(text.splitlines(), source="<df-operator-table>")
        self.state.nested_parse(lines, self.content_offset, container)
        return list(container.children)


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("df-operator-table", OperatorTableDirective)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
