"""Tests written in a mutation-testing audit of the Sphinx extensions in ``docs/_ext/``: the API
reference helpers (``df_api.py``: public-name coverage, references through re-exports, public bases,
skipped PyTorch plumbing, constants' doc comments, the dropped ``Fields:`` section), the page-code
directives (``df_exec.py``: ``df-exec`` and ``df-table``), the operator table
(``df_operator_table.py``), the removal of stale autosummary stubs (``df_stale_stubs.py``) and the
summaries that are not cut inside literals (``df_autosummary_summary.py``).

Each test kills a mutant of the extension code that the rest of the suite (the full docs build of
``tests/docs/``) let through; its docstring names it (file and mutation). The extensions are tested
as plain Python functions, without a Sphinx build: they are imported from ``docs/_ext``, fed
stand-in application, environment, domain and directive-state objects that record what they are
given, and checked against an independent reference: warnings, reStructuredText tables and page
lists written out by hand, a throw-away package (written under ``tmp_path``) whose modules, ``#:``
comments and classes are known, operator coefficients computed with ``math``, and docutils' own
parser for the summaries. Mutants judged equivalent are listed, with the reason, at the end of the
file. One test, whose docstring starts with "Bug:", pins a defect fixed here: an operator without a
docstring of its own was listed with ``DiffusionOperator``'s generic text as its definition.
CPU only, deterministic, no network; files only under ``tmp_path``.
"""

from __future__ import annotations

import inspect
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sphinx")

from docutils import nodes  # noqa: E402
from docutils.frontend import get_default_settings  # noqa: E402
from docutils.parsers.rst import Parser  # noqa: E402
from docutils.statemachine import StringList  # noqa: E402

# docs/_ext is on sys.path: tests/docs/conftest.py puts it there

import df_api  # noqa: E402
import df_autosummary_summary  # noqa: E402
import df_exec  # noqa: E402
import df_operator_table  # noqa: E402
import df_stale_stubs  # noqa: E402

from diffusionformer.config import FIELDS_HEADER  # noqa: E402
from diffusionformer.operators import DiffusionOperator, register_operator, unregister_operator  # noqa: E402

PKG = "diffusionformer_mkdocs"  # the fixture ``pkg`` makes df_api treat it as the library (its ``_ROOT``)
FOREIGN = "mkdocs_foreign_lib"


# --------------------------------------------------------------------------------------------
# stand-ins


# ``log`` (tests/docs/conftest.py): the recording stand-in for the extensions' logger


class _Domain:
    """The ``py`` domain: ``objects`` and ``modules`` dicts, and a recording ``resolve_xref``."""

    def __init__(self, objects=(), modules=()):
        self.objects = dict.fromkeys(objects, None)
        self.modules = dict.fromkeys(modules, None)
        self.calls = []

    def resolve_xref(self, env, fromdoc, builder, typ, target, node, contnode):
        self.calls.append((fromdoc, builder, typ, target))
        return ("resolved", target)


class _Env:
    def __init__(self, domain):
        self.domain = domain
        self.asked = 0

    def get_domain(self, name):
        assert name == "py"
        self.asked += 1
        return self.domain


def _app(**config):
    return SimpleNamespace(config=SimpleNamespace(**config), builder="the-builder")


class _Recorder:
    """An application for ``setup()``: records config values and event connections."""

    def __init__(self):
        self.config_values, self.connections, self.directives = {}, [], {}

    def add_config_value(self, name, default, rebuild, types=None):
        self.config_values[name] = default

    def connect(self, event, handler, priority=500):
        self.connections.append((event, handler, priority))

    def add_directive(self, name, cls):
        self.directives[name] = cls


# --------------------------------------------------------------------------------------------
# a throw-away package that df_api treats as part of the library

_FILES = {
    f"{FOREIGN}.py": '''
        class Module:
            def forward(self):
                """Define the computation performed at every call."""

            def blank(self):
                """Foreign text."""
        ''',
    f"{PKG}/__init__.py": '''
        from .core import LIMIT, NAMES, VERSION, Base, Head, Layer, Thing, helper
        from . import a_alias, a_equal, sub

        __all__ = ["Thing", "helper", "NAMES", "LIMIT", "VERSION", "ghost"]
        ''',
    f"{PKG}/a_alias.py": '''
        from .core import NAMES
        ''',
    f"{PKG}/a_equal.py": '''
        #: a different list that happens to be equal
        NAMES = ["a", "b"]
        ''',
    f"{PKG}/core.py": '''
        from mkdocs_foreign_lib import Module

        #: the names the tests look up
        #: (two comment lines)
        NAMES = ["a", "b"]
        LIMIT = 3
        VERSION = "mk-1.0"


        class Base:
            size = 5

            def method(self):
                """Base doc."""


        class Thing(Base):
            size2 = 7


        def helper():
            """Help."""


        class Layer(Module):
            def coefficients(self):
                """Ours."""

            def blank(self):
                ""


        class Head(Layer):
            def forward(self):
                pass

            def coefficients(self):
                pass

            def blank(self):
                pass


        class Documented(Module):
            def forward(self):
                """Our own forward."""
        ''',
    f"{PKG}/sub/__init__.py": "",
    f"{PKG}/sub/b.py": "",
    f"{PKG}/sub/_c.py": "",
    f"{PKG}/_priv.py": "",
    f"{PKG}/_p2/__init__.py": "",
    f"{PKG}/_p2/d.py": "",
    f"{PKG}/e.py": "",
}


@pytest.fixture
def pkg(throwaway_package):
    return throwaway_package(PKG, _FILES, also_unload=(FOREIGN,))


# --------------------------------------------------------------------------------------------
# df_api: import paths, identities, the documented index


def test_import_path_outside_the_library_and_plain_package(pkg):
    """df_api.py: ``_import_path`` without the "not under the library" check (imports ``os.path``)
    and with ``range(len(parts) - 1, ...)`` (a bare package name no longer imports); also ImportError
    ending the search instead of trying a shorter module path."""
    assert df_api._import_path("os.path") is df_api._MISSING
    assert df_api._import_path(PKG) is pkg
    assert df_api._import_path(f"{PKG}.core.Thing.method") is pkg.Base.method
    assert df_api._import_path(f"{PKG}.core.nothing") is df_api._MISSING



def test_a_package_named_like_the_library_is_not_the_library(pkg, monkeypatch):
    """df_api.py: ``_ours`` as a bare ``startswith(_ROOT)`` (without the dot): a neighbouring package such as
    ``diffusionformer_mkdocs`` (or ``os`` for a root ``o``) would be indexed and documented as ours."""
    monkeypatch.setattr(df_api, "_ROOT", "diffusionformer")
    assert df_api._import_path(PKG) is df_api._MISSING
    assert df_api._import_path(f"{PKG}.core.Thing") is df_api._MISSING
    assert [df_api._ours(n) for n in ("diffusionformer", "diffusionformer.nn", "diffusionformer_x", "diffusion")] == [
        True, True, False, False]
    monkeypatch.setattr(df_api, "_ROOT", PKG)
    assert df_api._import_path(PKG) is pkg

def test_identity_matches_objects_but_not_shared_scalars():
    """df_api.py: ``_identity`` without ``obj is None`` (None matched by identity) or without ``str``
    in the shared-scalar tuple (an interned string would match unrelated names)."""
    obj = object()
    assert df_api._identity(obj) == id(obj)
    for value in (None, df_api._MISSING, True, 3, 1.5, "mk-1.0"):
        assert df_api._identity(value) is None


def test_documented_index_prefers_the_shortest_path_and_includes_modules(pkg):
    """df_api.py: ``_documented`` with the modules left out, names sorted longest first, or
    ``index[key] = name`` (the last, longest path wins instead of the public one)."""
    domain = _Domain(objects=[f"{PKG}.core.Thing", f"{PKG}.Thing", "os.path", f"{PKG}.core.LIMIT"],
                     modules=[f"{PKG}.sub"])
    app = _app()
    index = df_api._documented(app, _Env(domain))
    assert index == {id(pkg.Thing): f"{PKG}.Thing", id(pkg.sub): f"{PKG}.sub"}


def test_documented_index_is_cached_until_reset(pkg):
    """df_api.py: ``_documented`` without its cache (``if False``), without storing it on the app,
    and ``_reset`` that does not clear it (the next reading phase would use stale ids)."""
    domain = _Domain(objects=[f"{PKG}.Thing"])
    app, env = _app(), _Env(domain)
    first = df_api._documented(app, env)
    assert app._df_api_documented is first
    domain.objects[f"{PKG}.helper"] = None
    assert df_api._documented(app, env) is first and env.asked == 1
    df_api._reset(app, env)
    assert app._df_api_documented is None
    assert df_api._documented(app, env) == {id(pkg.Thing): f"{PKG}.Thing", id(pkg.helper): f"{PKG}.helper"}


def test_public_modules_recursive_and_plain(pkg):
    """df_api.py: ``_public_modules`` with ``any`` -> ``all`` (private modules kept) or without the
    ``recursive and`` guard (a plain spec also walks the submodules)."""
    names = sorted(m.__name__ for m in df_api._public_modules(f"{PKG}.*"))
    assert names == [PKG, f"{PKG}.a_alias", f"{PKG}.a_equal", f"{PKG}.core", f"{PKG}.e", f"{PKG}.sub", f"{PKG}.sub.b"]
    assert [m.__name__ for m in df_api._public_modules(PKG)] == [PKG]


# --------------------------------------------------------------------------------------------
# df_api: coverage check


def test_coverage_warns_exactly_for_undocumented_names(pkg, log):
    """df_api.py, ``check_coverage``: match by identity dropped (A15: Thing documented under its
    defining path would warn), match by name dropped (A16: the int LIMIT documented by name would
    warn), strings matched by identity (A6: VERSION documented only under ``core`` would pass),
    the ``continue`` after an ``__all__`` entry that does not exist (A14: a second warning), and the
    three warnings turned into ``logger.info`` (A17, A18)."""
    domain = _Domain(objects=[f"{PKG}.core.Thing", f"{PKG}.LIMIT", f"{PKG}.core.VERSION", f"{PKG}.core.NAMES"])
    app = _app(df_api_modules=[PKG, f"{PKG}_missing"])
    df_api.check_coverage(app, _Env(domain))
    warnings = log.warnings()
    assert len(warnings) == 4, log.records
    assert warnings[:2] == [
        f"public name {PKG}.{name} is not documented in the API reference (add it to a page under docs/api/)"
        for name in ("helper", "VERSION")
    ]
    assert warnings[2] == f"{PKG}.__all__ lists 'ghost', which the module does not define"
    assert warnings[3].startswith(f"df_api_modules: cannot import '{PKG}_missing': ")


# --------------------------------------------------------------------------------------------
# df_api: references through re-exports


def _node(target, module=None, cls=None, domain="py"):
    node = {"refdomain": domain, "reftarget": target, "refdoc": "api/page", "reftype": "class"}
    if module:
        node["py:module"] = module
    if cls:
        node["py:class"] = cls
    return node


def _resolve(node, objects):
    domain = _Domain(objects=objects)
    result = df_api.resolve_reexport(_app(), _Env(domain), node, "contnode")
    return result, domain.calls


def test_reexport_resolves_to_the_documented_path(pkg):
    """df_api.py, ``resolve_reexport``: the target passed to ``resolve_xref`` is the documented name,
    not the candidate (A22); a non-``py`` reference is left alone (A19)."""
    result, calls = _resolve(_node(f"{PKG}.core.Thing"), [f"{PKG}.Thing"])
    assert result == ("resolved", f"{PKG}.Thing")
    assert calls == [("api/page", "the-builder", "class", f"{PKG}.Thing")]
    assert _resolve(_node(f"{PKG}.core.Thing", domain="std"), [f"{PKG}.Thing"]) == (None, [])


def test_reexport_candidates_from_the_current_module_and_class(pkg):
    """df_api.py, ``resolve_reexport``: without the ``module.target`` candidate (A23) or the
    ``module.class.target`` candidate (A20)."""
    result, _ = _resolve(_node("Thing", module=f"{PKG}.core"), [f"{PKG}.Thing"])
    assert result == ("resolved", f"{PKG}.Thing")
    result, _ = _resolve(_node("method", module=f"{PKG}.core", cls="Thing"), [f"{PKG}.Base.method"])
    assert result == ("resolved", f"{PKG}.Base.method")


def test_reexport_leaves_a_name_that_is_already_the_documented_one(pkg):
    """df_api.py, ``resolve_reexport``: ``name == candidate`` no longer skipped (Sphinx already
    failed on that name; the mutant asks the domain again)."""
    assert _resolve(_node(f"{PKG}.helper"), [f"{PKG}.helper"]) == (None, [])


def test_attribute_documented_on_the_class_or_a_base(pkg):
    """df_api.py, ``_documented_name``: without the ``in domain.objects`` check (A25: the attribute
    is sent to the first documented class of the MRO even where it is not documented there), the
    MRO without the class itself (A26), and a module owner not rejected (A24: AttributeError)."""
    objects = [f"{PKG}.Thing", f"{PKG}.Base", f"{PKG}.Base.size", f"{PKG}.Thing.size2"]
    assert _resolve(_node(f"{PKG}.core.Thing.size"), objects)[0] == ("resolved", f"{PKG}.Base.size")
    assert _resolve(_node(f"{PKG}.core.Thing.size2"), objects)[0] == ("resolved", f"{PKG}.Thing.size2")
    assert _resolve(_node(f"{PKG}.core.nothing"), objects) == (None, [])


# --------------------------------------------------------------------------------------------
# df_api: autodoc hooks


def test_skip_members_documented_only_outside_the_library(pkg):
    """df_api.py, ``skip_foreign_docstrings``: ``not`` dropped from the library check (A32: library
    docstrings skipped, foreign ones kept), own-docstring check dropped (A31: a method with its own
    text is skipped), ``what != "class"`` dropped (A30), and ``if doc is not None`` in
    ``_owner_of_docstring`` (A29: an empty docstring counts as the owner)."""
    core = sys.modules[f"{PKG}.core"]

    def skip(obj, what="class"):
        return df_api.skip_foreign_docstrings(None, what, "x", obj, False, {})

    assert skip(core.Head.forward) is True  # only torch-like plumbing text
    assert skip(core.Head.blank) is True  # the library's empty docstring does not count
    assert skip(core.Head.coefficients) is None  # text inherited from the library stays
    assert skip(core.Documented.forward) is None  # its own docstring
    assert skip(core.Head.forward, what="module") is None


def test_constant_gets_the_defining_modules_comment(pkg):
    """df_api.py, ``constant_docstring``/``_doc_comment_of_reexport``: the comment is looked up in
    the submodule whose attribute *is* the object (A40 ``!=``: an equal list elsewhere), after
    skipping submodules that only import it (A41: stops at the first one); ``.strip()`` dropped from
    the comparison with the type's docstring (A37: autodoc's trailing blank line); ``lines[:]`` ->
    ``lines`` (A39); empty lines not filled (A36)."""
    obj = pkg.NAMES
    lines = inspect.cleandoc(list.__doc__).splitlines() + [""]
    df_api.constant_docstring(None, "data", f"{PKG}.NAMES", obj, None, lines)
    assert lines == ["the names the tests look up", "(two comment lines)", ""]
    empty: list[str] = []
    df_api.constant_docstring(None, "data", f"{PKG}.NAMES", obj, None, empty)
    assert empty == ["the names the tests look up", "(two comment lines)", ""]


def test_constant_docstring_leaves_real_text_and_clears_attributes(pkg):
    """df_api.py, ``constant_docstring``: ``("data",)`` only (A35: an attribute would keep the
    type's docstring); real text and other kinds of objects untouched."""
    own = ["Our own text.", ""]
    df_api.constant_docstring(None, "data", f"{PKG}.NAMES", pkg.NAMES, None, own)
    assert own == ["Our own text.", ""]
    attr = inspect.cleandoc(int.__doc__).splitlines() + [""]
    df_api.constant_docstring(None, "attribute", f"{PKG}.Base.size", 5, None, attr)
    assert attr == []
    method = inspect.cleandoc(list.__doc__).splitlines()
    df_api.constant_docstring(None, "method", f"{PKG}.x", [], None, method)
    assert method == inspect.cleandoc(list.__doc__).splitlines()


class PubA:
    pass


class PubB:
    pass


class PubD:
    pass


class _PrivTwo(PubA, PubB):
    pass


class _PrivOne(PubA):
    pass


def test_public_bases_replace_private_ones_in_place():
    """df_api.py, ``public_bases``: dedupe dropped (A43), private bases appended at the end (A44),
    ``isinstance(base, type)`` dropped (A45: a non-class named ``_x`` has no ``__bases__``),
    ``"__"`` prefix (A46), ``bases = shown`` (A47)."""
    bases = [_PrivOne, PubD]
    df_api.public_bases(None, "C", None, None, bases)
    assert bases == [PubA, PubD]
    alias = SimpleNamespace(__name__="_Alias")
    bases = [_PrivTwo, PubB, alias]
    df_api.public_bases(None, "C", None, None, bases)
    assert bases == [PubA, PubB, alias]


def test_public_bases_single_underscore_is_private():
    """df_api.py, ``public_bases``: ``startswith("__")`` (A46) keeps ``_Hidden`` in the line."""
    hidden = type("_Hidden", (PubD,), {})
    bases = [hidden]
    df_api.public_bases(None, "C", None, None, bases)
    assert bases == [PubD]


def _config_class(doc):
    return type("Cfg", (), {"__doc__": doc})


def test_fields_section_is_dropped_with_trailing_blanks():
    """df_api.py, ``drop_fields_section``: ``del lines[i]`` (A51: field rows stay), the blank-line
    cleanup removed (A52), the first header instead of the last (A50), and a header on line 0 missed
    (A54, ``range(..., 0, -1)``)."""
    cls = _config_class("Summary.\n\nFields:\n  a: x")
    lines = ["Summary.", "", "Fields:", "  own text", "", "", FIELDS_HEADER, "  a: x", "  b: y", ""]
    df_api.drop_fields_section(None, "class", "Cfg", cls, None, lines)
    assert lines == ["Summary.", "", "Fields:", "  own text"]
    lines = [FIELDS_HEADER, "  a: x"]
    df_api.drop_fields_section(None, "class", "Cfg", _config_class("Fields:\n  a: x"), None, lines)
    assert lines == []


def test_fields_section_only_for_classes_that_document_fields():
    """df_api.py, ``drop_fields_section``: ``what != "class"`` dropped (A48) and the check that the
    class's own docstring carries the appended section dropped (A49)."""
    lines = ["Summary.", "", FIELDS_HEADER, "  a: x"]
    df_api.drop_fields_section(None, "attribute", "Cfg", _config_class("S.\n\nFields:\n  a"), None, lines)
    assert lines == ["Summary.", "", FIELDS_HEADER, "  a: x"]
    df_api.drop_fields_section(None, "class", "Cfg", _config_class("Summary."), None, lines)
    assert lines == ["Summary.", "", FIELDS_HEADER, "  a: x"]


def test_fields_section_is_dropped_before_napoleon():
    """df_api.py, ``setup``: ``drop_fields_section`` connected at the default priority 500 (A55), so
    napoleon (priority 500, registered earlier) would rewrite ``Fields:`` first."""
    app = _Recorder()
    df_api.setup(app)
    (priority,) = [p for e, h, p in app.connections if h is df_api.drop_fields_section]
    assert priority < 500
    assert ("env-updated", df_api._reset, 500) in app.connections


# --------------------------------------------------------------------------------------------
# df_exec


class _State:
    """Directive state: ``document.settings.env`` and a ``nested_parse`` that records the rst text."""

    def __init__(self, env):
        self.document = SimpleNamespace(settings=SimpleNamespace(env=env))
        self.parsed: list[list[str]] = []

    def nested_parse(self, lines, offset, container):
        text = list(lines)
        self.parsed.append(text)
        container += nodes.paragraph(text="\n".join(text))


class _Machine:
    reporter = None

    def get_source_and_line(self, lineno):
        return "page.rst", lineno


def _exec_env():
    return SimpleNamespace(temp_data={}, docname="page")


def _run(cls, code, env, *, arguments=(), show=False, name=None):
    state = _State(env)
    name = name or ("df-table" if cls is df_exec.TableDirective else "df-exec")
    directive = cls(name, list(arguments), {"show-source": None} if show else {}, StringList(code.splitlines()),
                    10, 11, "", state, _Machine())
    return directive.run(), state


def test_exec_parses_printed_rst_and_shares_the_page_namespace(log):
    """df_exec.py: stdout not redirected (E2: nothing to parse), a fresh namespace per directive
    (E1: ``x`` unknown in the second block), source shown without ``:show-source:`` (E6)."""
    env = _exec_env()
    out, state = _run(df_exec.ExecDirective, "x = 6 * 7\nprint('Result *bold*')\nprint('line two')", env)
    assert state.parsed == [["Result *bold*", "line two"]]
    assert [n.astext() for n in out] == ["Result *bold*\nline two"]
    out, state = _run(df_exec.ExecDirective, "print(f'x is {x}, page {__name__}')", env)
    assert state.parsed == [["x is 42, page df_exec:page"]]
    assert log.records == []
    _, state = _run(df_exec.ExecDirective, "print(x)", _exec_env())  # another page starts afresh
    assert state.parsed == [] and len(log.warnings()) == 1


def test_exec_show_source_comes_first(log):
    """df_exec.py: the ``language`` of the source block dropped (E7), the source left out of the
    result (E9)."""
    code = "print('hi')"
    out, _ = _run(df_exec.ExecDirective, code, _exec_env(), show=True)
    assert isinstance(out[0], nodes.literal_block) and out[0].astext() == code and out[0]["language"] == "python"
    assert [n.astext() for n in out[1:]] == ["hi"]


def test_exec_error_is_a_warning_with_the_traceback_in_the_page(log):
    """df_exec.py: ``except (ValueError, TypeError)`` (E3: a ZeroDivisionError escapes), the warning
    turned into ``info`` (E4), no traceback block (E5), the source dropped on error (E8)."""
    code = "print('before')\n1 / 0"
    out, state = _run(df_exec.ExecDirective, code, _exec_env(), show=True)
    assert state.parsed == []
    assert [type(n) for n in out] == [nodes.literal_block, nodes.literal_block]
    assert out[0].astext() == code
    assert out[1].astext().startswith("Traceback") and "ZeroDivisionError: division by zero" in out[1].astext()
    (warning,) = log.records
    assert warning[0] == "warning" and warning[2] == "page.rst:10"
    assert warning[1].startswith("df-exec: the code raised an exception:\nTraceback")


def test_exec_sys_exit_is_a_warning_not_the_end_of_the_build(log):
    """Bug: code calling ``sys.exit()`` (a script pasted into a page) raised ``SystemExit`` through the directive,
    which ended the whole docs build (with status 0 for ``sys.exit()``: pages after it silently missing). It is now
    reported like any exception: a warning at the directive with the traceback in the page."""
    env = _exec_env()
    out, state = _run(df_exec.ExecDirective, "import sys\nprint('before')\nsys.exit()", env)
    assert state.parsed == []
    assert [type(n) for n in out] == [nodes.literal_block] and out[0].astext().rstrip().endswith("SystemExit")
    (warning,) = log.records
    assert warning[0] == "warning" and warning[2] == "page.rst:10"
    _, state = _run(df_exec.ExecDirective, "print('after')", env)  # the page goes on
    assert state.parsed == [["after"]]


def test_table_renders_hand_written_list_table(log):
    """df_exec.py, ``df-table``: floats as ``.3g`` (E10), whitespace not collapsed (E11), an empty
    cell not escaped (E12), the title dropped (E20), the first data cell repeated (E22), no header
    row (E23)."""
    code = "table = [['op', 'value', 'note'], ['heat', 0.123456, 'a   b\\n c'], ['lap', 2, '']]"
    out, state = _run(df_exec.TableDirective, code, _exec_env(), arguments=["Ops *here*"])
    assert state.parsed == [[
        ".. list-table:: Ops *here*",
        "   :header-rows: 1",
        "",
        "   * - op",
        "     - value",
        "     - note",
        "   * - heat",
        "     - 0.1235",
        "     - a b c",
        "   * - lap",
        "     - 2",
        "     - \\ ",
    ]]
    assert log.records == [] and len(out) == 1


def test_table_without_title_and_tuple_rows(log):
    """df_exec.py, ``df-table``: ``.rstrip()`` dropped (E21: ``.. list-table:: `` with a trailing
    space), a tuple of tuples rejected (E17), exactly one data row rejected (E15)."""
    _, state = _run(df_exec.TableDirective, "table = (('h', 'k'), (1.0, True))", _exec_env())
    assert state.parsed == [[".. list-table::", "   :header-rows: 1", "", "   * - h", "     - k", "   * - 1",
                             "     - True"]]
    assert log.records == []


@pytest.mark.parametrize("code", ["table = [['header only']]", "table = [['h'], 'ab']", "x = 1"])
def test_table_needs_rows_bound_by_its_own_code(code, log):
    """df_exec.py, ``df-table``: ``len(table) < 1`` (E14: a header alone renders), ``any`` rows
    (E16: a string row passes as a row), the old ``table`` of an earlier block kept (E13), the
    warning turned into ``info`` (E26)."""
    env = _exec_env()
    _run(df_exec.TableDirective, "table = [['h'], ['r']]", env)  # an earlier table on the page
    out, state = _run(df_exec.TableDirective, code, env, show=True)
    assert state.parsed == []
    assert [n.astext() for n in out] == [code]
    (warning,) = log.records
    assert warning[0] == "warning" and warning[2] == "page.rst:10"
    assert warning[1].startswith("df-table: the code must bind `table` to a list of rows")


def test_table_rows_must_match_the_header(log):
    """df_exec.py, ``df-table``: ``len(row) < width`` (E18: a long row passes), no ``return`` after
    the warning (E19: the broken table is rendered), the warning turned into ``info`` (E25)."""
    out, state = _run(df_exec.TableDirective, "table = [['a', 'b'], ['1'], ['1', '2', '3'], ['x', 'y']]",
                      _exec_env())
    assert out == [] and state.parsed == []
    assert log.records == [("warning", "df-table: every row must have 2 cells like the header; rows [1, 2] do not",
                            "page.rst:10")]


def test_table_code_error_is_reported_not_raised(log):
    """df_exec.py, ``df-table``: the ``namespace is None`` branch removed (E24: AttributeError on
    ``None.get``)."""
    out, state = _run(df_exec.TableDirective, "table = [['h'], [1 / 0]]", _exec_env())
    assert state.parsed == [] and len(out) == 1 and "ZeroDivisionError" in out[0].astext()
    assert log.warnings()[0].startswith("df-table: the code raised an exception")


# --------------------------------------------------------------------------------------------
# df_operator_table


class _Holder:
    class Quartic(DiffusionOperator):
        """Weights on ``P^0 .. P^4``:
        f(P) = sum_k c_k P^k.

        Second paragraph, not shown."""

        aliases = ()
        supports_sparse = False
        degree = 4

        def coefficients(self):
            return torch.tensor([0.5, 0.25, 0.125, 0.0625, 1 / 3])


class _Cubic(DiffusionOperator):
    """f(P) = P^0 - 2 P + ..."""

    aliases = ("mk-cube", "mk-third")
    degree = 3

    def coefficients(self):
        return torch.tensor([1.0, -2.0, 3.14159, 0.001234567])


class _Opaque(DiffusionOperator):
    ""

    is_polynomial = False
    supports_sparse = True
    degree = 1

    def coefficients(self):
        raise NotImplementedError


@pytest.fixture
def fake_operators():
    names = {"mk-quartic": _Holder.Quartic, "mk-cubic": _Cubic, "mk-opaque": _Opaque}
    for name, cls in names.items():
        register_operator(cls, name=name)
    yield names
    for name in names:
        unregister_operator(name)


def _row(rst, name):
    lines = rst.splitlines()
    start = lines.index(f"   * - ``{name}``")
    return lines[start:start + 8]


def test_operator_rows_written_by_hand(fake_operators):
    """df_operator_table.py: first line instead of first paragraph (O1), whitespace not joined (O2),
    five coefficients shown (O4), ``>=`` for the ellipsis (O5), ``.3g`` (O6), the constant term left
    out (O7), no ``\\ `` for no aliases / no definition (O8, O9), ``__name__`` for a nested class
    (O10), the sparse column showing ``is_polynomial`` (O11) and the reverse (O15), ``len(c)`` as the
    degree (O12), no ``...`` for a longer list (O16)."""
    rst = df_operator_table.operator_table_rst()
    mod = __name__
    assert _row(rst, "mk-quartic") == [
        "   * - ``mk-quartic``",
        "     - \\ ",
        f"     - :class:`~{mod}._Holder.Quartic`",
        "     - Weights on ``P^0 .. P^4``: f(P) = sum_k c_k P^k.",
        "     - 4",
        "     - (0.5, 0.25, 0.125, 0.0625, ...)",
        "     - no",
        "     - yes",
    ]
    assert _row(rst, "mk-cubic") == [
        "   * - ``mk-cubic``",
        "     - ``mk-cube``, ``mk-third``",
        f"     - :class:`~{mod}._Cubic`",
        "     - f(P) = P^0 - 2 P + ...",
        "     - 3",
        "     - (1, -2, 3.142, 0.001235)",
        "     - yes",
        "     - yes",
    ]
    assert _row(rst, "mk-opaque") == [
        "   * - ``mk-opaque``",
        "     - \\ ",
        f"     - :class:`~{mod}._Opaque`",
        "     - \\ ",
        "     - --",
        "     - not a polynomial in :math:`P`",
        "     - yes",
        "     - no",
    ]


class _Undocumented(DiffusionOperator):
    degree = 1

    def coefficients(self):
        return torch.tensor([0.0, 1.0])


def test_operator_without_docstring_has_an_empty_definition():
    """Bug: an operator class without a docstring of its own was listed with the first paragraph of
    ``DiffusionOperator``'s docstring ("Base class of all head operators ...") as its definition
    (``inspect.getdoc`` inherits docstrings); the cell is now empty (``\\ ``)."""
    register_operator(_Undocumented, name="mk-undocumented")
    try:
        row = _row(df_operator_table.operator_table_rst(), "mk-undocumented")
    finally:
        unregister_operator("mk-undocumented")
    assert row[3] == "     - \\ "
    assert row[4:6] == ["     - 1", "     - (0, 1)"]


def test_operator_table_columns_and_heat_coefficients():
    """df_operator_table.py: a ``:widths:`` entry dropped (O14: 7 widths for 8 columns); the heat
    kernel's default coefficients against ``e^{-1} / k!`` (t = 1, six steps shown as four and ``...``)."""
    rst = df_operator_table.operator_table_rst()
    lines = rst.splitlines()
    widths = next(line for line in lines if line.startswith("   :widths:")).split()[1:]
    header = lines[lines.index("   * - name"):]
    header = header[:next(i for i, line in enumerate(header[1:], 1) if line.startswith("   * - "))]
    assert len(widths) == len(header) == 8
    expected = ", ".join(f"{math.exp(-1) / math.factorial(k):.4g}" for k in range(4))
    row = _row(rst, "heat")
    assert row[4:6] == ["     - 6", f"     - ({expected}, ...)"]
    assert row[5] == "     - (0.3679, 0.3679, 0.1839, 0.06131, ...)"


def test_operator_table_directive_warns_when_an_operator_breaks(monkeypatch, log):
    """df_operator_table.py: the warning for a broken operator turned into ``info`` (O13): a ``-W``
    build would pass with the table missing."""

    def broken():
        raise RuntimeError("no defaults")

    monkeypatch.setattr(df_operator_table, "operator_table_rst", broken)
    state = _State(_exec_env())
    directive = df_operator_table.OperatorTableDirective("df-operator-table", [], {}, StringList([]), 10, 11, "",
                                                         state, _Machine())
    assert directive.run() == []
    assert log.records == [("warning", "df-operator-table: cannot build the table: RuntimeError('no defaults')",
                            "page.rst:10")]


# --------------------------------------------------------------------------------------------
# df_stale_stubs


def _autosummary(names, toctree="api/generated"):
    opt = f"   :toctree: {toctree}\n" if toctree else ""
    return ".. autosummary::\n" + opt + "\n" + "".join(f"   {n}\n" for n in names) + "\n"


def _stub_tree(src: Path) -> Path:
    gen = src / "api" / "generated"
    gen.mkdir(parents=True)
    (src / "api" / "x").mkdir()
    (src / "index.rst").write_text("Index\n=====\n\n" + _autosummary(["pkg.alpha", "pkg.beta"])
                                   + _autosummary(["pkg.notoc"], toctree=None))
    (gen / "pkg.alpha.rst").write_text("pkg.alpha\n=========\n\n" + _autosummary(["pkg.alpha.child"], toctree="."))
    (gen / "pkg.alpha.child.rst").write_text("child\n=====\n\n" + _autosummary(["pkg.alpha.grandchild"], toctree="."))
    (gen / "pkg.alpha.grandchild.rst").write_text("grandchild\n")
    (gen / "pkg.beta.rst").write_text("beta\n")
    (gen / "pkg.stale.rst").write_text("stale\n=====\n\n" + _autosummary(["pkg.stale_child"], toctree="."))
    (gen / "pkg.stale_child.rst").write_text("stale child\n")
    (gen / "pkg.built_only.rst").write_text("only requested by a page under _build\n")
    (gen / "keep.txt").write_text("not a stub\n")
    (src / "_build").mkdir()
    (src / "_build" / "copy.rst").write_text(_autosummary(["pkg.built_only"], toctree="../api/generated"))
    return gen


_KEPT = ["keep.txt", "pkg.alpha.child.rst", "pkg.alpha.grandchild.rst", "pkg.alpha.rst", "pkg.beta.rst"]
_ALL = sorted(_KEPT + ["pkg.built_only.rst", "pkg.stale.rst", "pkg.stale_child.rst"])


@pytest.mark.parametrize("gen_dir", ["api/generated", "api/x/../generated"])
def test_stale_stubs_removed_requested_chains_kept(tmp_path, gen_dir, log):
    """df_stale_stubs.py: stubs counted as pages (S3: a stale package stub keeps its stale child),
    pages under ``_build`` counted (S4), stubs requested by stubs not followed (S5) or followed one
    level only (S6, ``wanted |= new`` dropped), entries without ``:toctree:`` not skipped (S9:
    TypeError), nothing deleted (S8), the generated folder not resolved (S12, with ``..``)."""
    src = tmp_path / "src"
    gen = _stub_tree(src)
    df_stale_stubs.remove_stale_stubs(SimpleNamespace(srcdir=str(src), config=SimpleNamespace(
        autosummary_generate=True, df_generated_dir=gen_dir)))
    assert sorted(p.name for p in gen.iterdir()) == _KEPT
    assert sorted(m for _, m, _ in log.records) == [f"removing stale autosummary stub pkg.{n}.rst"
                                                   for n in ("built_only", "stale", "stale_child")]


def test_stale_stubs_untouched_without_autosummary_generate(tmp_path):
    """df_stale_stubs.py: the ``autosummary_generate`` check dropped (S1)."""
    gen = _stub_tree(tmp_path / "src")
    df_stale_stubs.remove_stale_stubs(SimpleNamespace(srcdir=str(tmp_path / "src"), config=SimpleNamespace(
        autosummary_generate=False, df_generated_dir="api/generated")))
    assert sorted(p.name for p in gen.iterdir()) == _ALL


def test_stale_stubs_setup_runs_after_autosummary():
    """df_stale_stubs.py, ``setup``: priority 400 (S10: runs before autosummary's own
    ``builder-inited`` handler at 500, so freshly renamed stubs are not there yet), default folder
    ``generated`` (S11: not where ``conf.py``'s autosummary writes)."""
    app = _Recorder()
    df_stale_stubs.setup(app)
    assert app.connections == [("builder-inited", df_stale_stubs.remove_stale_stubs, 900)]
    assert app.config_values == {"df_generated_dir": "api/generated"}


# --------------------------------------------------------------------------------------------
# df_autosummary_summary


@pytest.fixture
def summary():
    from sphinx.ext import autosummary

    original = getattr(autosummary.extract_summary, "__wrapped__", autosummary.extract_summary)
    settings = get_default_settings(Parser)
    return df_autosummary_summary._wrap(original), original, settings


@pytest.mark.parametrize("line, expected", [
    ("Weights on ``P^0 .. P^K`` of the kernel. More text.", "Weights on ``P^0 .. P^K`` of the kernel."),
    ("Computes :math:`a. b` fast. Next.", "Computes :math:`a. b` fast."),
    ("Uses ``x.y``. Then ``z``. End.", "Uses ``x.y``."),
])
def test_summary_not_cut_inside_literals(summary, line, expected):
    """df_autosummary_summary.py: roles not hidden (U1), a greedy literal pattern (U2: the sentence
    period between two literals is hidden too), hidden periods not restored (U3), the original given
    the raw lines (U6)."""
    wrapped, _, settings = summary
    assert wrapped([line, "", "Details."], settings) == expected


def test_summary_patch_is_applied_once(monkeypatch):
    """df_autosummary_summary.py, ``setup``: the ``hasattr`` guard dropped (U4) or ``__wrapped__``
    not set (U5): every new Sphinx application in the process wraps the wrapper again."""
    from sphinx.ext import autosummary

    original = getattr(autosummary.extract_summary, "__wrapped__", autosummary.extract_summary)
    monkeypatch.setattr(autosummary, "extract_summary", original)
    df_autosummary_summary.setup(None)
    df_autosummary_summary.setup(None)
    assert autosummary.extract_summary is not original
    assert autosummary.extract_summary.__wrapped__ is original


# --------------------------------------------------------------------------------------------
# Mutants judged equivalent (same observable behaviour), with the reason:
#
# df_api.py
# - A4  ``except AttributeError: continue`` in ``_import_path``: a shorter module prefix then fails
#   on the same missing attribute (the longer module path was importable, so it is an attribute of
#   the shorter one), so the loop still ends in ``_MISSING``.
# - A27 ``"<locals>"`` check dropped in ``_owner_of_docstring``: walking the qualname then meets
#   ``getattr(function, "<locals>", None)`` -> None, which is not a class: the same ``None``.
# - A28 ``cls.__mro__`` instead of ``cls.__mro__[1:]``: the class's own entry is the member itself,
#   whose ``__doc__`` is None (that is why it is asked), so it is never chosen.
# - A33 ``skip or`` dropped: with ``skip=True`` the hook returns True instead of None; Sphinx skips
#   the member either way.
# - A34 ``not callable(obj)`` dropped: a non-callable member with ``__doc__ is None`` (a property
#   without a getter docstring, an instance) has no ``__qualname__``, so ``_owner_of_docstring``
#   returns None and the hook returns None, as before.
# - A38 the re-export lookup also for ``attribute``: an attribute's name is ``pkg.mod.Class.attr``,
#   and no module's name starts with ``pkg.mod.Class.``, so the lookup returns ``[]`` as before.
# - A42 ``startswith(package)`` without the dot: the only extra modules are the package itself
#   (whose ``#:`` comments autodoc has already applied, so the hook is not reached with the type's
#   docstring) and sibling packages named ``<package>X``, which sort after ``<package>.`` and do not
#   hold the re-exported object.
#
# df_operator_table.py
# - O3  ``cls.is_polynomial`` for ``op.is_polynomial``: ``is_polynomial`` is a ``ClassVar`` of
#   ``DiffusionOperator``; no operator sets it per instance.
#
# df_stale_stubs.py
# - S2  ``generated.is_dir()`` check dropped: ``glob`` of a missing folder yields nothing, so nothing
#   is deleted either way (only the pages are parsed for nothing).
# - S7  ``p.parent == generated`` dropped from the first frontier: a requested file outside the
#   generated folder is a page under the source folder, already parsed as one, so following it adds
#   nothing new (``new`` is computed minus ``wanted``).
