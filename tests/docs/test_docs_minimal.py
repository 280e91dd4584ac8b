"""Small Sphinx projects built with the docs' own ``conf.py``: offline math and ``publish``.

Each test writes a few pages into a temporary source folder whose ``conf.py`` runs
``docs/conf.py`` (same extensions, theme and MathJax settings; only the API coverage check is
switched off, since these projects document no API) and builds it with ``sphinx -W``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
REQUIRED_MODULES = ("sphinx", "furo", "myst_parser", "matplotlib", "sphinx-mathjax-offline")
MISSING = [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]

pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"building the docs needs the 'docs' extra (missing: {', '.join(MISSING)}); "
    "install it with pip install -e '.[docs]'")

#: a tag that makes the browser fetch ``url`` (scripts, stylesheets, icons, images, frames)
_LOADING_TAG = re.compile(r"<(script|link|img|iframe|source|embed|object)\b[^>]*>", re.I)
_URL_ATTR = re.compile(r"""\b(?:src|href|data)\s*=\s*["']?([^"'\s>]+)""", re.I)
_CSS_URL = re.compile(r"""(?:@import\s+|url\()\s*["']?((?:https?:)?//[^"')\s]+)""", re.I)


def _remote(url: str) -> bool:
    return url.startswith(("http://", "https://", "//"))


def external_resources(html_dir: Path) -> list[str]:
    """``file: url`` for every resource the built pages would load from outside the build.

    Links a reader may click (``<a href="https://...">``) are not loads and are not reported.
    """
    found = []
    for page in sorted(html_dir.rglob("*.html")):
        for tag in _LOADING_TAG.finditer(page.read_text(errors="replace")):
            for url in _URL_ATTR.findall(tag.group(0)):
                if _remote(url):
                    found.append(f"{page.relative_to(html_dir)}: {url}")
    for css in sorted(html_dir.rglob("*.css")):
        found += [f"{css.relative_to(html_dir)}: {url}" for url in _CSS_URL.findall(css.read_text(errors="replace"))]
    return found


def test_external_resources_finds_scripts_styles_and_css_imports(tmp_path):
    """The checker itself: remote loads are reported, local files and clickable links are not."""
    (tmp_path / "a.html").write_text(
        '<script src="https://cdn.example.org/mathjax/tex-chtml.js"></script>'
        "<link rel='stylesheet' href=//fonts.example.org/css>"
        '<script src="_static/mathjax/tex-chtml.js"></script><a href="https://example.org">a link</a>')
    (tmp_path / "s.css").write_text('@import url("https://fonts.example.org/x.css"); body { background: url(img.png) }')
    assert external_resources(tmp_path) == ["a.html: https://cdn.example.org/mathjax/tex-chtml.js",
                                            "a.html: //fonts.example.org/css", "s.css: https://fonts.example.org/x.css"]


def _project(src: Path, pages: dict[str, str]) -> Path:
    src.mkdir(parents=True, exist_ok=True)
    (src / "conf.py").write_text(
        "import runpy\n"
        f"globals().update({{k: v for k, v in runpy.run_path({str(DOCS / 'conf.py')!r}).items() if not k.startswith('__')}})\n"
        "df_api_modules = []  # no API pages in this project\n"
    )
    for name, text in pages.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return src


def _build(src: Path, out: Path) -> None:
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(src), str(out)]
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if result.returncode != 0:
        pytest.fail(f"sphinx build of {src} failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-6000:]}")


def test_math_renders_offline(tmp_path):
    """Pages with math load the bundled MathJax from ``_static`` and nothing from the network."""
    src = _project(tmp_path / "src", {
        "index.md": "# Heat\n\nThe heat kernel $e^{-t(I - P)}$ smooths tokens.\n\n"
                    "```{math}\n\\exp(-t(I - P)) = e^{-t} \\sum_k \\frac{t^k}{k!} P^k\n```\n\n"
                    "```{toctree}\nlaplacian\n```\n",
        "laplacian.rst": "Laplacian\n=========\n\nRows of :math:`I - P` sum to zero.\n",
    })
    html = tmp_path / "html"
    _build(src, html)
    assert external_resources(html) == []
    for page in ("index.html", "laplacian.html"):
        text = (html / page).read_text()
        assert re.search(r'<script[^>]+src="_static/mathjax/tex-chtml\.js', text), f"{page} does not load the bundled MathJax"
    assert (html / "_static" / "mathjax" / "tex-chtml.js").is_file()
    assert any((html / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))


@pytest.mark.slow
def test_published_page_joins_the_results_toctree_and_the_docs_still_build(tmp_path):
    """``publish`` into a copy of docs/results: the page is in the index's toctree once, and ``sphinx -W`` passes."""
    from diffusionformer.experiments import load_experiment_config, publish_experiment, run_experiment

    cfg = load_experiment_config({
        "name": "tiny-published", "seeds": [0, 1],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                   "train": {"max_steps": 2, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
                             "checkpoint_interval": 2}}],
        "operators": [{"name": "attention"}, {"name": "laplacian-half", "laplacian_heads": "half"}],
    })
    run_experiment(cfg, tmp_path / "results", progress=False, log=lambda s: None)
    src = _project(tmp_path / "src", {"index.md": "# Docs\n\n```{toctree}\nresults/index\n```\n"})
    shutil.copytree(DOCS / "results", src / "results")
    index = src / "results" / "index.md"
    before = index.read_text()
    for _ in range(2):  # idempotent
        page = publish_experiment(cfg, tmp_path / "results", src / "results", config_path="tiny.toml")
    toctree = re.search(r"```\{toctree\}\n(.*?)```", index.read_text(), re.S).group(1).split("\n")
    assert toctree.count("tiny-published") == 1 and page == src / "results" / "tiny-published.md"
    assert index.read_text().replace("tiny-published\n", "", 1) == before  # nothing else changed
    _build(src, tmp_path / "html")
    assert (tmp_path / "html" / "results" / "tiny-published.html").is_file()


def _code_lines(rst: str) -> list[str]:
    """The lines of the literal and directive blocks (``::``-introduced, indented) of an rst page."""
    out, in_block = [], False
    for line in rst.splitlines():
        if line.rstrip().endswith("::"):
            in_block = True
            continue
        if in_block and line.strip() and not line.startswith(" "):
            in_block = False
        if in_block and line.strip():
            out.append(line)
    return out


@pytest.mark.parametrize("page", ["quickstart", "own_model_data"])
def test_quickstart_code_fits_the_content_column(page):
    """Code lines of the quickstart (and of the doctest-only tutorial on a user's model and data) stay within 80
    characters (the furo column shows about that many)."""
    lines = _code_lines((DOCS / "tutorials" / f"{page}.rst").read_text())
    assert len(lines) > 40  # the parser found the doctest blocks
    wide = [line for line in lines if len(line) > 80]
    assert not wide, wide
