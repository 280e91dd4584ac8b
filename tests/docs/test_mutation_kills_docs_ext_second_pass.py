"""Tests written in a second mutation-testing audit of the Sphinx extensions in ``docs/_ext/``: the API
reference helpers (``df_api.py``: the coverage check over several and recursive specs, imports of
broken modules, docstrings inherited from outside the library, constants' doc comments in
subpackages, the event connections), the page-code directives (``df_exec.py``, run through docutils'
own parser), the operator table (``df_operator_table.py``), the removal of stale autosummary stubs
(``df_stale_stubs.py``) and the summaries that are not cut inside literals
(``df_autosummary_summary.py``).

Each test kills a mutant of the extension code that the first audit
(``test_mutation_kills_docs_ext.py``) and the rest of ``tests/docs/`` let through; its docstring
names it (file and mutation). As in the first audit the extensions are plain Python functions
tested without a Sphinx build: they are imported from ``docs/_ext`` and fed small stand-ins (a
logger, a ``py`` domain, a directive state, an application recording its ``setup``) or a real
docutils document, and checked against an independent reference: warnings, tables, traceback
lines, page lists and event tables written out by hand, and a throw-away package (written under
``tmp_path``) whose modules, ``#:`` comments and classes are known. Mutants judged equivalent are
listed, with the reason, at the end of the file. No library defect was found in this pass.
CPU only, deterministic, no network; files only under ``tmp_path``.
"""

from __future__ import annotations

import inspect
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sphinx")

from docutils import nodes  # noqa: E402
from docutils.core import publish_doctree  # noqa: E402
from docutils.frontend import get_default_settings  # noqa: E402
from docutils.parsers.rst import Parser, directives  # noqa: E402
from docutils.statemachine import StringList  # noqa: E402

# docs/_ext is on sys.path: tests/docs/conftest.py puts it there

import df_api  # noqa: E402
import df_autosummary_summary  # noqa: E402
import df_exec  # noqa: E402
import df_operator_table  # noqa: E402
import df_stale_stubs  # noqa: E402

from diffusionformer.operators import DiffusionOperator, register_operator, unregister_operator  # noqa: E402

PKG = "diffusionformer_mk2"  # the fixture ``pkg2`` makes df_api treat it as the library (its ``_ROOT``)


# --------------------------------------------------------------------------------------------
# stand-ins


# ``log`` (tests/docs/conftest.py): the recording stand-in for the extensions' logger


class _PyDomain:
    def __init__(self, objects=(), modules=()):
        self.objects = dict.fromkeys(objects, None)
        self.modules = dict.fromkeys(modules, None)


class _CountingEnv:
    def __init__(self, domain):
        self.domain, self.asked = domain, 0

    def get_domain(self, name):
        self.asked += 1
        return self.domain


class _SetupApp:
    """Records everything ``setup()`` registers, with the rebuild kind and the priority."""

    def __init__(self):
        self.config, self.events, self.directives = [], [], []

    def add_config_value(self, name, default, rebuild, types=None):
        self.config.append((name, default, rebuild, types))

    def connect(self, event, handler, priority=500):
        self.events.append((event, handler.__name__, priority))

    def add_directive(self, name, cls):
        self.directives.append((name, cls))


_SAFE = {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}


# --------------------------------------------------------------------------------------------
# a throw-away package that df_api treats as part of the library

_FILES = {
    f"{PKG}/__init__.py": '''
        from .core import Thing

        __all__ = ["Thing"]
        ''',
    f"{PKG}/broken.py": '''
        from .core import does_not_exist  # ImportError, not ModuleNotFoundError
        ''',
    f"{PKG}/core.py": '''
        import torch

        __all__ = ["Thing", "Plain"]


        class Thing:
            """A thing."""


        class Plain:
            def run(self):
                pass


        class NoDoc:
            pass


        NO_DOC = NoDoc()


        class Outer:
            class Inner(torch.nn.Module):
                def forward(self, x):
                    return x
        ''',
    f"{PKG}/sub/__init__.py": '''
        from .impl import LIMITS

        __all__ = ["LIMITS", "Undocumented"]

        from .impl import Undocumented
        ''',
    f"{PKG}/sub/impl.py": '''
        #: the limits of the sub package
        LIMITS = (1, 2)


        class Undocumented:
            pass
        ''',
}


@pytest.fixture
def pkg2(throwaway_package):
    return throwaway_package(PKG, _FILES, submodules=("sub",))


def _warn(full):
    return f"public name {full} is not documented in the API reference (add it to a page under docs/api/)"


# --------------------------------------------------------------------------------------------
# df_api: coverage and imports


def test_coverage_goes_on_after_a_spec_that_does_not_import(pkg2, log):
    """df_api.py, ``check_coverage``: ``continue`` -> ``return`` after a spec that cannot be imported
    (the specs after it are not checked at all), and ``except ImportError`` -> ``except
    ModuleNotFoundError`` (a module whose own import fails, ``cannot import name``, crashes the
    build instead of being reported)."""
    domain = _PyDomain(objects=[f"{PKG}.Thing"])
    app = SimpleNamespace(config=SimpleNamespace(df_api_modules=[f"{PKG}.broken", f"{PKG}.sub"]))
    df_api.check_coverage(app, _CountingEnv(domain))
    messages = [m for level, m, _ in log.records]
    assert len(messages) == 3, log.records
    assert messages[0].startswith(f"df_api_modules: cannot import '{PKG}.broken': cannot import name 'does_not_exist'")
    assert messages[1:] == [_warn(f"{PKG}.sub.LIMITS"), _warn(f"{PKG}.sub.Undocumented")]


def test_recursive_spec_of_a_plain_module(pkg2, log):
    """df_api.py, ``_public_modules``: ``hasattr(module, "__path__")`` dropped (a ``"mod.*"`` spec for a
    plain module, not a package, raises AttributeError on ``__path__``)."""
    assert [m.__name__ for m in df_api._public_modules(f"{PKG}.core.*")] == [f"{PKG}.core"]
    domain = _PyDomain(objects=[f"{PKG}.Thing"])
    app = SimpleNamespace(config=SimpleNamespace(df_api_modules=[f"{PKG}.core.*"]))
    df_api.check_coverage(app, _CountingEnv(domain))
    assert log.records == [("warning", _warn(f"{PKG}.core.Plain"), None)]


def test_import_path_through_a_module_that_fails_to_import(pkg2):
    """df_api.py, ``_import_path``: ``except ImportError`` -> ``except ModuleNotFoundError``: a target in
    a module whose import raises ``ImportError`` escapes as an exception from a ``missing-reference``
    handler instead of reading as "no such object"."""
    assert df_api._import_path(f"{PKG}.broken.anything") is df_api._MISSING
    assert df_api._import_path(f"{PKG}.core.Thing") is sys.modules[f"{PKG}.core"].Thing


def test_empty_documented_index_is_cached_too(pkg2):
    """df_api.py, ``_documented``: ``if cache is not None`` -> ``if cache`` (an empty index, a page set
    without library objects, is rebuilt on every reference)."""
    app, env = SimpleNamespace(), _CountingEnv(_PyDomain(objects=["os.path"]))
    assert df_api._documented(app, env) == {}
    assert df_api._documented(app, env) == {}
    assert env.asked == 1


# --------------------------------------------------------------------------------------------
# df_api: autodoc hooks


def test_method_without_any_docstring_is_not_skipped(pkg2):
    """df_api.py, ``skip_foreign_docstrings``: ``owner is not None and`` dropped (AttributeError on
    ``None.__module__`` for a method that no class documents), and ``_owner_of_docstring`` returning
    the last class of the MRO (``object``, foreign) instead of None when no base has a docstring."""
    core = sys.modules[f"{PKG}.core"]
    assert df_api.skip_foreign_docstrings(None, "class", "run", core.Plain.run, False, {}) is None


def test_method_of_a_nested_class_with_torch_docstring_is_skipped(pkg2):
    """df_api.py, ``_owner_of_docstring``: ``qualname.rsplit(".", 1)[1]`` -> ``qualname.split(".")[1]``
    (for ``Outer.Inner.forward`` the member name read is ``Inner``, so PyTorch's generic ``forward``
    text is not found and the member is kept)."""
    core = sys.modules[f"{PKG}.core"]
    assert df_api._owner_of_docstring(core.Outer.Inner.forward) is torch.nn.Module
    assert df_api.skip_foreign_docstrings(None, "class", "forward", core.Outer.Inner.forward, False, {}) is True


def test_method_whose_module_does_not_import_is_kept(pkg2):
    """df_api.py, ``_owner_of_docstring``: ``except ImportError`` narrowed to ``ModuleNotFoundError``
    or removed (a member whose ``__module__`` raises on import crashes autodoc's skip event)."""

    def method(self):
        pass

    method.__doc__ = None
    for module in (f"{PKG}.broken", "no_such_module_mk2"):
        method.__module__, method.__qualname__ = module, "Some.method"
        assert df_api._owner_of_docstring(method) is None
        assert df_api.skip_foreign_docstrings(None, "class", "method", method, False, {}) is None


def test_constant_comment_from_a_subpackage(pkg2):
    """df_api.py, ``_doc_comment_of_reexport``: ``name.rpartition(".")`` -> ``partition`` (for
    ``pkg.sub.LIMITS`` the package read is ``pkg``, so the comment in ``pkg.sub.impl`` is not found),
    and ``except PycodeError: continue`` -> ``return []`` (a module without source, sorted before the
    defining one, ends the search)."""
    obj = sys.modules[f"{PKG}.sub"].LIMITS
    dynamic = types.ModuleType(f"{PKG}.sub.aaa_dynamic")
    dynamic.LIMITS = obj
    sys.modules[dynamic.__name__] = dynamic
    lines = inspect.cleandoc(tuple.__doc__).splitlines() + [""]
    df_api.constant_docstring(None, "data", f"{PKG}.sub.LIMITS", obj, None, lines)
    assert lines == ["the limits of the sub package", ""]


def test_constant_of_a_type_without_docstring_keeps_its_text(pkg2):
    """df_api.py, ``constant_docstring``: ``type_doc and`` dropped (``inspect.cleandoc(None)`` raises for
    a constant whose class has no docstring), and ``==`` -> ``in`` (own text that happens to occur in
    the type's docstring is replaced)."""
    core = sys.modules[f"{PKG}.core"]
    own = ["Own text.", ""]
    df_api.constant_docstring(None, "data", f"{PKG}.core.NO_DOC", core.NO_DOC, None, own)
    assert own == ["Own text.", ""]
    short = ["empty list."]  # list.__doc__: "... the constructor creates a new empty list. ..."
    df_api.constant_docstring(None, "data", f"{PKG}.core.X", [], None, short)
    assert short == ["empty list."]


def test_df_api_setup_connects_every_hook():
    """df_api.py, ``setup``: the config value's rebuild kind ``"env"`` changed (a new module list would
    not re-check the reading phase), the coverage check moved to ``env-updated``, or any of the
    ``missing-reference`` / ``autodoc-*`` connections dropped, or ``parallel_read_safe`` False."""
    app = _SetupApp()
    assert df_api.setup(app) == _SAFE
    assert app.config == [("df_api_modules", [], "env", [list])]
    assert app.events == [
        ("env-updated", "_reset", 500),
        ("env-check-consistency", "check_coverage", 500),
        ("missing-reference", "resolve_reexport", 500),
        ("autodoc-skip-member", "skip_foreign_docstrings", 500),
        ("autodoc-process-bases", "public_bases", 500),
        ("autodoc-process-docstring", "constant_docstring", 500),
        ("autodoc-process-docstring", "drop_fields_section", 400),
    ]


# --------------------------------------------------------------------------------------------
# df_exec


class _RecState:
    """Directive state recording ``nested_parse``'s lines, their source and the offset."""

    def __init__(self, env):
        self.document = SimpleNamespace(settings=SimpleNamespace(env=env))
        self.calls = []

    def nested_parse(self, lines, offset, container):
        self.calls.append((list(lines), lines.source(0) if len(lines) else None, offset))
        container += nodes.paragraph(text="\n".join(lines))


class _Lines:
    reporter = None

    def get_source_and_line(self, lineno):
        return "page.rst", lineno


def _directive(cls, code, env, name, arguments=()):
    state = _RecState(env)
    directive = cls(name, list(arguments), {}, StringList(code.splitlines()), 10, 11, "", state, _Lines())
    return directive, state


def test_exec_output_is_parsed_with_its_source_and_offset(log):
    """df_exec.py, ``_parse_rst``: the content offset replaced by 0 (warnings in the printed text point
    at the top of the page), the source name ``<df-exec output in page>`` replaced."""
    directive, state = _directive(df_exec.ExecDirective, "print('*hi*')", SimpleNamespace(temp_data={}, docname="page"),
                                  "df-exec")
    out = directive.run()
    assert [n.astext() for n in out] == ["*hi*"]
    assert state.calls == [(["*hi*"], "<df-exec output in page>", 11)]


def test_exec_traceback_names_the_directive_and_page(log):
    """df_exec.py, ``_run_code``: the code compiled as ``"<string>"`` (the traceback in the page and the
    warning no longer say which directive on which page failed, nor the line)."""
    directive, _ = _directive(df_exec.ExecDirective, "x = 1\nraise ValueError('bad value')",
                              SimpleNamespace(temp_data={}, docname="guide/intro"), "df-exec")
    (block,) = directive.run()
    assert '  File "<df-exec in guide/intro>", line 2, in <module>\n' in block.astext()
    assert block.astext().rstrip().endswith("ValueError: bad value")
    assert '"<df-exec in guide/intro>", line 2' in log.records[0][1]


def test_exec_lets_a_keyboard_interrupt_through(log):
    """df_exec.py, ``_run_code``: ``except Exception`` -> ``except BaseException`` (Ctrl-C during a
    page's code would be turned into a warning and the build would go on)."""
    directive, _ = _directive(df_exec.ExecDirective, "raise KeyboardInterrupt",
                              SimpleNamespace(temp_data={}, docname="page"), "df-exec")
    with pytest.raises(KeyboardInterrupt):
        directive.run()
    assert log.records == []


def test_table_integers_are_not_rounded(log):
    """df_exec.py, ``_cell``: ``.4g`` applied to ints too (``123456`` would show as ``1.235e+05``)."""
    env = SimpleNamespace(temp_data={}, docname="page")
    directive, state = _directive(df_exec.TableDirective, "table = [['n', 'x'], [123456, 2.5e-05], [10**7, 1234.5]]",
                                  env, "df-table")
    directive.run()
    assert state.calls[0][0][3:] == ["   * - n", "     - x", "   * - 123456", "     - 2.5e-05", "   * - 10000000",
                                     "     - 1234"]


@pytest.fixture
def rst_directives(monkeypatch, log):
    """df_exec's directives registered in docutils' own registry (undone after the test)."""
    monkeypatch.setattr(directives, "_directives", dict(directives._directives))
    directives.register_directive("df-table", df_exec.TableDirective)
    directives.register_directive("df-exec", df_exec.ExecDirective)

    def parse(text):
        env = SimpleNamespace(temp_data={}, docname="page")
        return publish_doctree(text, settings_overrides={"env": env, "report_level": 5})

    return parse


def test_table_title_with_spaces_and_show_source_through_docutils(rst_directives, log):
    """df_exec.py, ``TableDirective`` as docutils parses it: ``final_argument_whitespace = False`` (a
    title of several words is an error), ``optional_arguments = 0`` (no title allowed),
    ``has_content = False`` (the code is refused), ``:show-source:`` taking a value
    (``directives.unchanged``: then ``:show-source: yes`` would be accepted silently)."""
    doc = rst_directives(".. df-table:: Default degree of each operator\n   :show-source:\n\n"
                         "   table = [['op', 'K'], ['heat', 6]]\n")
    assert [type(n) for n in doc.children] == [nodes.literal_block, nodes.table]
    assert doc.children[0].astext() == "table = [['op', 'K'], ['heat', 6]]"
    table = doc.children[1]
    assert table.next_node(nodes.title).astext() == "Default degree of each operator"
    assert [e.astext() for e in table.findall(nodes.entry)] == ["op", "K", "heat", "6"]
    assert log.records == []
    bad = rst_directives(".. df-exec::\n   :show-source: yes\n\n   print('hi')\n")
    assert [type(n) for n in bad.children] == [nodes.system_message]
    assert "no argument is allowed" in bad.children[0].astext()


# --------------------------------------------------------------------------------------------
# df_operator_table


class _Spaced(DiffusionOperator):
    # a blank line that holds the indentation (editors that keep trailing spaces)
    __doc__ = "f(P)  =  2 P\n    - P^2.\n    \n    Not shown."
    degree = 2

    def coefficients(self):
        return torch.tensor([0.0, 2.0, -1.0])


def test_operator_definition_cleaned_and_joined():
    """df_operator_table.py, ``_summary``: ``inspect.cleandoc`` dropped (the indented blank line no
    longer ends the paragraph), ``" ".join(first.split())`` -> ``first.replace("\\n", " ")`` (runs of
    spaces kept)."""
    assert df_operator_table._summary(_Spaced) == "f(P) = 2 P - P^2."
    register_operator(_Spaced, name="mk2-spaced")
    try:
        rst = df_operator_table.operator_table_rst()
    finally:
        unregister_operator("mk2-spaced")
    lines = rst.splitlines()
    row = lines[lines.index("   * - ``mk2-spaced``"):][:8]
    assert row[3:6] == ["     - f(P) = 2 P - P^2.", "     - 2", "     - (0, 2, -1)"]


def test_operator_table_header_written_by_hand():
    """df_operator_table.py: ``:header-rows: 0`` (the column names become a data row) and a changed
    column name."""
    assert df_operator_table.operator_table_rst().splitlines()[:12] == [
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


def _table_directive():
    state = _RecState(SimpleNamespace(temp_data={}, docname="ops"))
    return df_operator_table.OperatorTableDirective("df-operator-table", [], {}, StringList([]), 10, 11, "", state,
                                                    _Lines()), state


def test_operator_table_directive_returns_the_parsed_nodes(monkeypatch, log):
    """df_operator_table.py, ``OperatorTableDirective.run``: the container returned instead of its
    children."""
    monkeypatch.setattr(df_operator_table, "operator_table_rst", lambda: "line one\nline two")
    directive, state = _table_directive()
    out = directive.run()
    assert [type(n) for n in out] == [nodes.paragraph] and out[0].astext() == "line one\nline two"
    assert state.calls == [(["line one", "line two"], "<df-operator-table>", 11)]


def test_operator_table_directive_warns_for_any_error(monkeypatch, log):
    """df_operator_table.py: ``except Exception`` narrowed (``except (ImportError, RuntimeError)``): an
    operator whose defaults raise ``ValueError`` crashes the build with a traceback instead of a
    located warning."""

    def broken():
        raise ValueError("degree must be positive")

    monkeypatch.setattr(df_operator_table, "operator_table_rst", broken)
    directive, _ = _table_directive()
    assert directive.run() == []
    assert log.records == [
        ("warning", "df-operator-table: cannot build the table: ValueError('degree must be positive')", "page.rst:10")]


def test_exec_and_operator_table_setup():
    """df_exec.py / df_operator_table.py / df_autosummary_summary.py, ``setup``: a directive not
    registered or registered under another name, ``parallel_write_safe`` dropped."""
    app = _SetupApp()
    assert df_exec.setup(app) == _SAFE
    assert app.directives == [("df-exec", df_exec.ExecDirective), ("df-table", df_exec.TableDirective)]
    app = _SetupApp()
    assert df_operator_table.setup(app) == _SAFE
    assert app.directives == [("df-operator-table", df_operator_table.OperatorTableDirective)]
    assert df_autosummary_summary.setup(None) == _SAFE


# --------------------------------------------------------------------------------------------
# df_stale_stubs


def _autosummary(names, toctree):
    return ".. autosummary::\n" + f"   :toctree: {toctree}\n\n" + "".join(f"   {n}\n" for n in names) + "\n"


def _remove(src):
    df_stale_stubs.remove_stale_stubs(SimpleNamespace(srcdir=str(src), config=SimpleNamespace(
        autosummary_generate=True, df_generated_dir="api/generated")))


def test_stub_requested_from_a_page_in_a_subfolder_with_dotdot(tmp_path, log):
    """df_stale_stubs.py: ``src.glob`` instead of ``rglob`` (pages in subfolders not read, their stubs
    deleted) and ``os.path.abspath`` dropped (``api/pages/../generated`` not normalised, so the stub
    it asks for is not recognised and deleted)."""
    src = tmp_path / "src"
    gen = src / "api" / "generated"
    gen.mkdir(parents=True)
    (src / "api" / "pages").mkdir()
    (src / "api" / "pages" / "ops.rst").write_text("Ops\n===\n\n" + _autosummary(["pkg.deep"], "../generated"))
    (gen / "pkg.deep.rst").write_text("deep\n")
    (gen / "pkg.old.rst").write_text("old\n")
    _remove(src)
    assert sorted(p.name for p in gen.iterdir()) == ["pkg.deep.rst"]
    assert [m for _, m, _ in log.records] == ["removing stale autosummary stub pkg.old.rst"]


def test_requested_stub_not_generated_and_stubs_in_a_cycle(tmp_path, monkeypatch, log):
    """df_stale_stubs.py: ``p.is_file()`` dropped from either frontier (a requested stub that does not
    exist is opened: FileNotFoundError), and ``- wanted`` dropped (two stubs that request each other
    are followed for ever; the stand-in stops after 20 rounds)."""
    src = tmp_path / "src"
    gen = src / "api" / "generated"
    gen.mkdir(parents=True)
    (src / "index.rst").write_text(_autosummary(["pkg.a", "pkg.never"], "api/generated"))
    (gen / "pkg.a.rst").write_text(_autosummary(["pkg.b", "pkg.b_missing"], "."))
    (gen / "pkg.b.rst").write_text(_autosummary(["pkg.a"], "."))
    (gen / "pkg.gone.rst").write_text("gone\n")
    original, rounds = df_stale_stubs._requested, []

    def counted(files):
        rounds.append(sorted(Path(f).name for f in files))
        if len(rounds) > 20:
            raise RuntimeError("stub requests followed for ever")
        return original(files)

    monkeypatch.setattr(df_stale_stubs, "_requested", counted)
    _remove(src)
    assert sorted(p.name for p in gen.iterdir()) == ["pkg.a.rst", "pkg.b.rst"]
    assert rounds == [["index.rst"], ["pkg.a.rst"], ["pkg.b.rst"]]


# --------------------------------------------------------------------------------------------
# df_autosummary_summary


@pytest.fixture
def wrapped_summary():
    from sphinx.ext import autosummary

    original = getattr(autosummary.extract_summary, "__wrapped__", autosummary.extract_summary)
    return df_autosummary_summary._wrap(original), get_default_settings(Parser)


def test_summary_of_a_literal_with_a_backtick_and_of_two_lines(wrapped_summary):
    """df_autosummary_summary.py: the literal pattern ``[^`]+?`` (a literal holding a backtick is not
    hidden and the sentence is cut inside it) and only the first docstring line passed on (a first
    sentence over two lines is cut at the line end)."""
    wrapped, settings = wrapped_summary
    assert wrapped(["Uses ``a`b. c`` here. More."], settings) == "Uses ``a`b. c`` here."
    assert wrapped(["Weights on ``P^0 .. P^K`` of the", "heat kernel. Next."], settings) == (
        "Weights on ``P^0 .. P^K`` of the heat kernel.")


# --------------------------------------------------------------------------------------------
# Mutants judged equivalent (same observable behaviour), with the reason:
#
# df_api.py
# - ``[m for m in domain.modules if _ours(m)]`` -> ``list(domain.modules)`` in ``_documented``: a
#   module outside the library imports to ``_MISSING`` in ``_import_path``, whose identity is None,
#   so it never enters the index.
# - ``set(domain.objects) | set(domain.modules)`` -> ``set(domain.objects)`` in ``check_coverage``: a
#   documented module is also in the identity index (``_documented`` includes modules), and a name
#   in ``__all__`` that is a module is the same module object, so it still matches.
# - ``spec.endswith(".*")`` -> ``spec.endswith("*")``: differs only for a spec ending in ``*``
#   without the dot, a form the config value does not define (and ``name`` is then cut wrongly
#   either way).
# - ``isinstance(obj, type)`` dropped in ``drop_fields_section``: autodoc passes ``what="class"`` only
#   with a class.
# - ``return`` -> ``break`` after the ``Fields:`` section is cut: the loop is the last statement of
#   the function.
# - ``getattr(..., _MISSING)`` -> ``getattr(..., None)`` in ``_doc_comment_of_reexport``: only for a
#   ``None`` constant it also analyses modules that lack the name, which hold no ``#:`` comment for
#   it, so the search goes on to the defining module as before.
#
# df_exec.py
# - ``if namespace is None`` -> ``if not namespace`` in ``ExecDirective.run``: the namespace always
#   holds ``__name__``, so it is never empty.
# - ``value if isinstance(value, str)`` -> ``str(value)``: the same text for a ``str``.
# - the ``temp_data`` key renamed: private to the extension, cleared per page either way.
# - the width check over ``table[1:]`` only: the header row has the header's width by definition.
#
# df_stale_stubs.py
# - ``stub.resolve() not in wanted`` -> ``stub not in wanted``: ``generated`` is resolved, so its
#   glob yields resolved paths unless a stub is itself a symbolic link, which autosummary never
#   writes.
