"""Build the site-wide navigation tree (furo's sidebar) once per build, not once per page.

Furo asks every page for the whole toctree (``collapse=False``, ``maxdepth=-1``,
``includehidden=True``). Sphinx rebuilds it for each page from every document's full table
of contents, copying all their sections before keeping only the titles: quadratic in the
number of pages, and about half of the html build with ~300 pages.

The page-independent part (which entries, their titles, their nesting: Sphinx's
``_entries_from_toctree``) is computed once per build and kept; each page then gets a copy
and the page-dependent rest of Sphinx's ``_resolve_toctree`` (the ``current`` marks, the
depth classes, the pruning copy, the links relative to the page), run through Sphinx's own
functions, so the pages are the same bytes as without this extension.

Sphinx's entries depend on the page in one place only: the page's own toctree ancestors are
deep-copied instead of pruning-copied, which differs only for ``.. only::`` nodes inside a
table of contents. When a table of contents holds one, or the toctree asked for is
collapsed, or the builder has its own toctree (singlehtml), or this Sphinx lacks the helpers or
calls them otherwise (a TypeError, AttributeError or KeyError from them), the page's toctree is built the
stock way (for the rest of the build in the last cases).
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from sphinx import addnodes

try:
    from sphinx.environment.adapters import toctree as _toctree
    from sphinx.util import url_re as _url_re
    from sphinx.util.matching import Matcher as _Matcher

    _HELPERS = all(
        callable(getattr(_toctree, name, None))
        for name in ("_entries_from_toctree", "_toctree_add_classes", "_toctree_copy")
    )
except ImportError:  # pragma: no cover - depends on the Sphinx version
    _HELPERS = False

_CACHE_ATTR = "_df_nav_cache"


def _has_only_nodes(env: Any) -> bool:
    return any(next(iter(toc.findall(addnodes.only)), None) is not None for toc in env.tocs.values())


def _templates(builder: Any, titles_only: bool, includehidden: bool, maxdepth: int) -> list[tuple[Any, Any, int]]:
    """The page-independent entries of each toctree of the root document (computed once)."""
    cache = builder.__dict__.setdefault(_CACHE_ATTR, {})
    key = (titles_only, includehidden, maxdepth)
    if key not in cache:
        env = builder.env
        included = _Matcher(env.config.include_patterns)
        excluded = _Matcher(env.config.exclude_patterns)
        templates = []
        for toctree in env.master_doctree.findall(addnodes.toctree):
            if toctree.get("hidden", False) and not includehidden:
                continue
            tree_titles_only = titles_only or toctree.get("titlesonly", False)
            tree_includehidden = includehidden or toctree.get("includehidden", False)
            entries = _toctree._entries_from_toctree(
                env, True, tree_titles_only, False, tree_includehidden, builder.tags,
                frozenset(), included, excluded, toctree, [],
            )  # fmt: skip
            templates.append((toctree, entries, maxdepth or toctree.get("maxdepth", -1)))
        cache[key] = templates
    return cache[key]


def _resolve(builder: Any, docname: str, toctree: Any, entries: list[Any], maxdepth: int) -> Any:
    """The rest of Sphinx's ``_resolve_toctree`` (``prune=True``, ``collapse=False``) for one page."""
    if not entries:
        return None
    newnode = addnodes.compact_paragraph("", "")
    if caption := toctree.attributes.get("caption"):
        caption_node = nodes.title(caption, "", *[nodes.Text(caption)])
        caption_node.line = toctree.line
        caption_node.source = toctree.source
        caption_node.rawsource = toctree["rawcaption"]
        if hasattr(toctree, "uid"):
            caption_node.uid = toctree.uid  # type: ignore[attr-defined]
            del toctree.uid
        newnode.append(caption_node)
    if maxdepth <= 0:
        # Sphinx marks the tree, then copies it pruned to maxdepth; with nothing to prune that copy keeps every
        # node, so copying the kept entries first and marking the copy gives the same tree with one copy, not two.
        newnode.extend(_toctree._toctree_copy(entry, 1, maxdepth, False, builder.tags) for entry in entries)
        newnode["toctree"] = True
        _toctree._toctree_add_classes(newnode, 1, docname)
    else:
        newnode.extend(entry.deepcopy() for entry in entries)
        newnode["toctree"] = True
        _toctree._toctree_add_classes(newnode, 1, docname)
        newnode = _toctree._toctree_copy(newnode, 1, maxdepth, False, builder.tags)
    if isinstance(newnode[-1], nodes.Element) and len(newnode[-1]) == 0:
        return None
    for refnode in newnode.findall(nodes.reference):
        if _url_re.match(refnode["refuri"]) is None:
            refnode["refuri"] = builder.get_relative_uri(docname, refnode["refuri"]) + refnode["anchorname"]
    return newnode


def _global_toctree(builder: Any, docname: str, titles_only: bool, includehidden: bool, maxdepth: int) -> Any:
    """What Sphinx's ``global_toctree_for_doc`` gives with ``collapse=False``."""
    resolved = (
        _resolve(builder, docname, toctree, entries, depth)
        for toctree, entries, depth in _templates(builder, titles_only, includehidden, maxdepth)
    )
    toctrees = [toctree for toctree in resolved if toctree is not None]
    if not toctrees:
        return None
    result = toctrees[0]
    for toctree in toctrees[1:]:
        result.extend(toctree.children)
    return result


def _stock_local_toctree(builder: Any) -> bool:
    """Whether the builder's toctree is the html builder's (singlehtml's rewrites its links: left alone)."""
    from sphinx.builders.html import StandaloneHTMLBuilder

    return (isinstance(builder, StandaloneHTMLBuilder)
            and type(builder)._get_local_toctree is StandaloneHTMLBuilder._get_local_toctree)  # fmt: skip


def _page_context(app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    stock = context.get("toctree")
    builder = app.builder
    if stock is None or not _HELPERS or not _stock_local_toctree(builder):
        return
    if builder.__dict__.get(_CACHE_ATTR + "_off") is None:
        builder.__dict__[_CACHE_ATTR + "_off"] = _has_only_nodes(builder.env)
    if builder.__dict__[_CACHE_ATTR + "_off"]:
        return

    def toctree(**kwargs: Any) -> str:
        # the same defaults as StandaloneHTMLBuilder._get_local_toctree
        collapse = kwargs.pop("collapse", True)
        includehidden = kwargs.pop("includehidden", False)
        if kwargs.get("maxdepth") == "":
            kwargs.pop("maxdepth")
        maxdepth = kwargs.pop("maxdepth", 0)
        titles_only = kwargs.pop("titles_only", False)
        if collapse or kwargs:
            return stock(collapse=collapse, includehidden=includehidden, maxdepth=maxdepth, titles_only=titles_only,
                         **kwargs)  # fmt: skip
        try:
            tree = _global_toctree(builder, pagename, bool(titles_only), bool(includehidden), int(maxdepth))
        except (TypeError, AttributeError, KeyError):  # a Sphinx whose private helpers changed: the stock way
            builder.__dict__[_CACHE_ATTR + "_off"] = True
            return stock(collapse=collapse, includehidden=includehidden, maxdepth=maxdepth, titles_only=titles_only)
        return builder.render_partial(tree)["fragment"]

    context["toctree"] = toctree


def setup(app: Any) -> dict[str, Any]:
    # before furo's handler (priority 500), which calls context["toctree"]
    app.connect("html-page-context", _page_context, priority=400)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
