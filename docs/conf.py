"""Sphinx configuration of the diffusionformer documentation.

Build (offline, and the built pages load nothing from the network; warnings are errors)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
    python -m sphinx -W --keep-going -b doctest docs docs/_build/doctest

Figures and tables in the pages are computed from the library while the docs build
(``matplotlib.sphinxext.plot_directive`` and the ``df-exec`` / ``df-table`` /
``df-operator-table`` directives of ``docs/_ext``); autosummary writes its stub pages to
``docs/api/generated/`` (git-ignored).
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version as _version
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))  # document the source tree these docs belong to

# -- Project ---------------------------------------------------------------------------
project = "diffusionformer"
author = "diffusionformer developers"
copyright = "diffusionformer developers"
try:
    release = _version("diffusionformer")
except PackageNotFoundError as err:  # pragma: no cover - depends on the environment
    raise RuntimeError(
        "the docs take their version from the installed package metadata; install the package "
        "first: pip install -e '.[docs]'"
    ) from err
version = ".".join(release.split(".")[:2])

# -- Extensions ------------------------------------------------------------------------
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    # MathJax 3 bundled into _static/mathjax/ (mathjax_path = "mathjax/tex-chtml.js"): formulas
    # render without internet. tests/docs/test_docs_minimal.py checks that no page loads
    # anything from outside the build.
    "sphinx-mathjax-offline",
    "sphinx.ext.viewcode",
    "sphinx.ext.doctest",
    "myst_parser",
    "matplotlib.sphinxext.plot_directive",
    "df_exec",  # df-exec / df-table: run page code at build time
    "df_operator_table",  # df-operator-table: the operator registry as a table
    "df_api",  # public-name coverage check, cross-references through re-exports
    "df_autosummary_summary",  # summaries are not cut inside ``literals``
    "df_stale_stubs",  # delete stubs of names no page documents any more
    "df_nav_cache",  # furo's site-wide sidebar tree: built once per build, not once per page
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# results/<study>/analysis/README.md: the geometry tables that `publish` inlines into the study's page
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "results/*/analysis/README.md", "results/.*.publishing"]
templates_path = ["_templates"]
# No intersphinx: the build must work offline. References to torch/PyG names render as text.
nitpicky = False

# -- Autodoc / autosummary / napoleon --------------------------------------------------
autosummary_generate = True  # stub pages go to docs/api/generated/ (git-ignored)
autosummary_imported_members = False
autosummary_ignore_module_all = False  # package pages list exactly the names in __all__
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_inherit_docstrings = True
add_module_names = False
python_maximum_signature_line_length = 88

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = False
napoleon_attr_annotations = True
# ``Shapes:`` is the project's custom section for tensor shapes (free text, often several
# tensors per line): render it as a titled generic section like ``Examples:``.
napoleon_custom_sections = ["Shapes"]

# Every public name of these modules must be documented (``pkg.*``: with its submodules).
# Add a package here together with its page under docs/api/.
df_api_modules = [
    "diffusionformer",
    "diffusionformer.functional",
    "diffusionformer.ops.*",
    "diffusionformer.operators.*",
    "diffusionformer.nn.*",
    "diffusionformer.analysis.*",
    "diffusionformer.testing.*",
    "diffusionformer.graph",
    "diffusionformer.models",
    "diffusionformer.data",
    "diffusionformer.data.ssl",
    "diffusionformer.data.augment",
    "diffusionformer.train",
    "diffusionformer.experiments",
    "diffusionformer.experiments.tasks",
    "diffusionformer.experiments.threads",
    "diffusionformer.config",
]

# -- Code that runs while the docs build -----------------------------------------------
# The API docstrings' ``>>>`` examples are run by pytest (--doctest-modules); the doctest
# builder runs the pages' own ``.. doctest::`` / ``.. testcode::`` blocks.
doctest_test_doctest_blocks = ""
doctest_global_setup = "import torch\nimport diffusionformer"

plot_include_source = True
plot_html_show_formats = False
plot_html_show_source_link = False
plot_formats = [("png", 100)]
plot_pre_code = ""
plot_rcparams = {"figure.figsize": (6.4, 3.6), "font.size": 9, "savefig.bbox": "tight"}
plot_apply_rcparams = True

# -- HTML ------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"diffusionformer {release}"
html_static_path: list[str] = []
myst_enable_extensions = ["dollarmath"]
