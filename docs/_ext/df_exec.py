"""Run Python code in a page at build time and insert its results.

Two directives, sharing one namespace per page (like the cells of a notebook, so a table
can reuse what an earlier block computed):

``.. df-exec::``
    runs its content and parses what it prints as reStructuredText.

``.. df-table:: Optional title``
    runs its content, which must bind ``table`` to a list of rows (the first row is the
    header), and renders it as a table. Cells may use inline markup (``:math:`...```).

Both take ``:show-source:`` to display the code above the result. An exception in the
code (``SystemExit`` too: ``sys.exit()`` in a page must not end the build) is reported as a Sphinx warning at the directive's location (so ``-W`` fails the
build) and the traceback is shown in the page; code never fails silently.

The code runs in the process that builds the docs, against the installed library: the
tables are regenerated from the library at every build and cannot drift from it.
"""

from __future__ import annotations

import contextlib
import io
import traceback
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

_NAMESPACE_KEY = "df_exec_namespace"


class _ExecBase(SphinxDirective):
    has_content = True
    option_spec = {"show-source": directives.flag}

    def _namespace(self) -> dict[str, Any]:
        # ``temp_data`` is cleared after every document, so each page starts afresh.
        return self.env.temp_data.setdefault(_NAMESPACE_KEY, {"__name__": f"df_exec:{self.env.docname}"})

    def _run_code(self) -> tuple[str, dict[str, Any] | None, list[nodes.Node]]:
        """Execute the content; return (stdout, namespace or None on error, error nodes)."""
        code = "\n".join(self.content)
        namespace = self._namespace()
        out = io.StringIO()
        try:
            compiled = compile(code, f"<{self.name} in {self.env.docname}>", "exec")
            with contextlib.redirect_stdout(out):
                exec(compiled, namespace)
        except (Exception, SystemExit):  # reported as a build warning, never swallowed (sys.exit would end the build)
            tb = traceback.format_exc()
            logger.warning("%s: the code raised an exception:\n%s", self.name, tb, location=self.get_location())
            return out.getvalue(), None, [nodes.literal_block(tb, tb)]
        return out.getvalue(), namespace, []

    def _source_nodes(self) -> list[nodes.Node]:
        if "show-source" not in self.options:
            return []
        code = "\n".join(self.content)
        block = nodes.literal_block(code, code)
        block["language"] = "python"
        return [block]

    def _parse_rst(self, text: str) -> list[nodes.Node]:
        container = nodes.container()
        lines = StringList(text.splitlines(), source=f"<{self.name} output in {self.env.docname}>")
        self.state.nested_parse(lines, self.content_offset, container)
        return list(container.children)


class ExecDirective(_ExecBase):
    """``.. df-exec::``: run the code, parse what it prints as reStructuredText."""

    def run(self) -> list[nodes.Node]:
        printed, namespace, errors = self._run_code()
        if namespace is None:
            return self._source_nodes() + errors
        return self._source_nodes() + self._parse_rst(printed)


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else (f"{value:.4g}" if isinstance(value, float) else str(value))
    text = " ".join(text.split())
    return text if text else "\\ "


class TableDirective(_ExecBase):
    """``.. df-table:: title``: run the code, render the rows bound to ``table``."""

    optional_arguments = 1
    final_argument_whitespace = True

    def run(self) -> list[nodes.Node]:
        self._namespace().pop("table", None)  # each table must be bound by its own code
        _, namespace, errors = self._run_code()
        if namespace is None:
            return self._source_nodes() + errors
        table = namespace.get("table")
        rows_ok = isinstance(table, (list, tuple)) and all(isinstance(r, (list, tuple)) for r in table)
        if not rows_ok or len(table) < 2:
            logger.warning(
                "df-table: the code must bind `table` to a list of rows (header first, at least one data row), "
                "got %r",
                type(table).__name__,
                location=self.get_location(),
            )
            return self._source_nodes()
        width = len(table[0])
        bad = [i for i, row in enumerate(table) if len(row) != width]
        if bad:
            logger.warning(
                "df-table: every row must have %d cells like the header; rows %s do not", width, bad,
                location=self.get_location(),
            )
            return self._source_nodes()
        title = self.arguments[0] if self.arguments else ""
        lines = [f".. list-table:: {title}".rstrip(), "   :header-rows: 1", ""]
        for row in table:
            cells = [_cell(c) for c in row]
            lines.append(f"   * - {cells[0]}")
            lines.extend(f"     - {c}" for c in cells[1:])
        return self._source_nodes() + self._parse_rst("\n".join(lines))


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("df-exec", ExecDirective)
    app.add_directive("df-table", TableDirective)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
