"""The Sphinx documentation builds with warnings as errors, and the pages' examples pass.

Runs ``python -m sphinx -W --keep-going`` with the ``html`` and ``doctest`` builders into a
temporary directory (the doctest build reuses the html build's doctrees). Skipped, with the
reason, when the ``docs`` extra is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffusionformer.operators import list_operators

DOCS = Path(__file__).resolve().parents[2] / "docs"
# Paths under docs/ that a build may write (all git-ignored).
GENERATED = ("_build", "api/generated")
REQUIRED_MODULES = ("sphinx", "furo", "myst_parser", "matplotlib")
MISSING = [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"building the docs needs the 'docs' extra (missing: {', '.join(MISSING)}); "
        "install it with pip install -e '.[docs]'",
    ),
]


def _source_files() -> set[str]:
    """Files under docs/ that are not build products."""
    files = set()
    for path in DOCS.rglob("*"):
        rel = path.relative_to(DOCS).as_posix()
        if path.is_file() and "__pycache__" not in rel and not rel.startswith(GENERATED):
            files.add(rel)
    return files


def _sphinx(builder: str, out: Path, doctrees: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, "-d", str(doctrees)]
    cmd += [str(DOCS), str(out)]
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def _check(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        log = (result.stdout + result.stderr)[-6000:]
        pytest.fail(f"sphinx {what} build failed (exit {result.returncode}):\n{log}")


@pytest.fixture(scope="module")
def html_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, set[str], set[str]]:
    root = tmp_path_factory.mktemp("docs")
    before = _source_files()
    result = _sphinx("html", root / "html", root / "doctrees")
    after = _source_files()
    _check(result, "html")
    return root / "html", root / "doctrees", before, after


def test_html_builds_without_warnings(html_build):
    html, _, _, _ = html_build
    for page in ("index", "tutorials/quickstart", "theory/heat", "api/operators", "performance"):
        assert (html / f"{page}.html").is_file(), f"{page}.html was not built"


def test_figures_are_generated_at_build_time(html_build):
    html, _, _, _ = html_build
    images = {p.name for p in (html / "_images").glob("*.png")}
    for page in ("random_walk", "heat", "family", "oversmoothing"):
        assert any(name.startswith(f"{page}-") for name in images), f"no figure generated for theory/{page}"


def test_operator_table_lists_every_registered_operator(html_build):
    html, _, _, _ = html_build
    page = (html / "api" / "operators.html").read_text(encoding="utf-8")
    table = page[page.index("Registered operators") :]
    for name in list_operators():
        assert f'<span class="pre">{name}</span>' in table, f"operator {name!r} missing from the generated table"


def test_build_writes_only_ignored_paths(html_build):
    _, _, before, after = html_build
    assert after == before, f"the build created or removed files under docs/: {sorted(after ^ before)}"


def test_page_examples_pass_as_doctests(html_build, tmp_path):
    _, doctrees, _, _ = html_build
    result = _sphinx("doctest", tmp_path / "doctest", doctrees)
    _check(result, "doctest")
    report = (tmp_path / "doctest" / "output.txt").read_text(encoding="utf-8")
    assert "0 failures in tests" in report
    assert " passed and 0 failed" in report


def test_pages_load_nothing_from_the_network(html_build):
    """The README promises offline docs: no page loads a script, stylesheet or font from outside the build."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_df_docs_minimal", Path(__file__).with_name("test_docs_minimal.py"))
    minimal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(minimal)
    html, _, _, _ = html_build
    assert minimal.external_resources(html) == []
    assert "_static/mathjax/tex-chtml.js" in (html / "theory" / "heat.html").read_text()


def _sidebar(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index('<div class="sidebar-tree">')
    return text[start : text.index("</div>", start)]


def test_sidebar_is_the_whole_site_with_the_page_itself_marked_current(html_build):
    """Every page's sidebar (furo's navigation tree; docs/_ext/df_nav_cache.py builds its page-independent part
    once per build) lists the same pages, each link relative to the page and leading to a built page, with the page
    itself, and only it, marked current and linked to itself; a page outside the toctree has no current entry."""
    import re

    html, _, _, _ = html_build
    generated = sorted((html / "api" / "generated").glob("*.html"))
    module_page = next((html / "_modules").rglob("*.html"))
    pages = {"index": "", "theory/heat": "Heat kernels", "tutorials/quickstart": "Five-minute quickstart",
             "api/operators": "diffusionformer.operators"}  # fmt: skip
    sizes = set()
    for name, title in [*pages.items(), (generated[0].relative_to(html).with_suffix("").as_posix(), generated[0].stem),
                        (module_page.relative_to(html).with_suffix("").as_posix(), "")]:  # fmt: skip
        page = html / f"{name}.html"
        tree = _sidebar(page)
        sizes.add(tree.count("<li "))
        for href in re.findall(r'href="([^"#]+)(?:#[^"]*)?"', tree):
            assert (page.parent / href).resolve().is_file(), (name, href)
        current = re.findall(r'<li class="[^"]*current-page[^"]*"><a class="current reference internal" href="#">'
                             r"(.*?)</a>", tree)  # fmt: skip
        current = [re.sub(r"<[^>]*>", "", entry) for entry in current]
        if title == "":
            assert current == [] and "current" not in tree, name
            continue
        assert len(current) == 1 and tree.count("current-page") == 1, (name, current)
        assert current[0] == title, (name, current)
        assert 'href="#"' in tree and tree.count('href="#"') == 1, name
    assert len(sizes) == 1 and sizes.pop() > 100, "the sidebars list different pages"


def test_sidebar_cache_falls_back_to_sphinx_when_its_private_helpers_change(monkeypatch):
    """docs/_ext/df_nav_cache.py calls private Sphinx helpers: where they raise (a Sphinx that changed them), the page
    gets Sphinx's own toctree, and so do the later pages, not a failed build."""
    from types import SimpleNamespace

    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import df_nav_cache
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    from sphinx.builders.html import StandaloneHTMLBuilder

    builder = object.__new__(StandaloneHTMLBuilder)
    builder.env = SimpleNamespace(tocs={})
    calls = []

    def changed(*args, **kwargs):
        calls.append(args)
        raise TypeError("_entries_from_toctree() takes 10 positional arguments but 11 were given")

    monkeypatch.setattr(df_nav_cache, "_HELPERS", True)
    monkeypatch.setattr(df_nav_cache, "_global_toctree", changed)
    for page in ("index", "theory/heat"):
        context = {"toctree": lambda **kw: f"stock {sorted(kw.items())}"}
        df_nav_cache._page_context(SimpleNamespace(builder=builder), page, "page.html", context, None)
        got = context["toctree"](collapse=False, includehidden=True, maxdepth=-1, titles_only=True)
        assert got == "stock [('collapse', False), ('includehidden', True), ('maxdepth', -1), ('titles_only', True)]"
    assert len(calls) == 1  # the second page went the stock way at once
