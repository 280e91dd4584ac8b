"""Edge-case probes of publishing, third round (``experiments.publish``, ``experiments.tables``).

The page is rendered with markdown-it (CommonMark and GFM tables, the parser MyST builds the docs with) and the text
of each heading and table cell is compared with the names of the config.

Found and fixed (tests named ``test_bug_...``):

- ``format_table``, ``publish_experiment``, ``summary_table``: a task, setting or comparison name holding markdown
  syntax the config allows (``__lap__``, ``*x*``, ``dig<b>its``, ``[x]``, ``a&amp;b``) was written as it is: the page
  showed a bold ``lap`` (so a setting ``__lap__`` read like a setting ``lap``), raw HTML or an entity. Such
  characters are now backslash-escaped; an ordinary ``lap_half`` is written unchanged.
"""

from __future__ import annotations

import json

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import RunResult, run_dir

INDEX = "# Results\n\n```{toctree}\n:maxdepth: 1\n\n```\n"


def _raw(name, task, ops, seeds=(0, 1)):
    return {"name": name, "seeds": list(seeds),
            "tasks": [{"name": task, "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 4}}],
            "operators": [{"name": o, **({} if i == 0 else {"laplacian_heads": 1})} for i, o in enumerate(ops)]}


def _study(tmp_path, name, task, ops):
    """A results folder of ``ops`` x seeds 0, 1 (run folders and ``results.json``) and a docs folder with an index."""
    out = tmp_path / "results"
    src = out / name
    rows = []
    for i, op in enumerate(ops):
        for s in (0, 1):
            rdir = run_dir(src, task, op, s)
            rdir.mkdir(parents=True)
            rec = {"step": 2, "split": "eval", "metrics": {"test_acc": 0.5 + s / 10 + i / 50}}
            (rdir / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
            (rdir / "summary.json").write_text(json.dumps({"status": "completed", "eval": rec}))
            rows.append(RunResult(task, op, s, "completed", "test_acc", rec["metrics"]["test_acc"],
                                  dict(rec["metrics"]), 10, 1.0))
    (src / "results.json").write_text(json.dumps({"runs": [r.__dict__ for r in rows], "summary": []}))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(INDEX)
    return out, docs, load_experiment_config(_raw(name, task, ops))


def _rendered(text):
    """The plain text of each heading and of each table's cells (rows of cells) as markdown-it renders ``text``."""
    markdown_it = pytest.importorskip("markdown_it")
    tokens = markdown_it.MarkdownIt("commonmark").enable("table").parse(text)
    headings, rows = [], []
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            headings.append(_plain(tokens[i + 1]))
        elif tok.type == "tr_open":
            rows.append([])
        elif tok.type == "inline" and tokens[i - 1].type in ("td_open", "th_open"):
            rows[-1].append(_plain(tok))
    return headings, rows


def _plain(inline):
    """The text an inline token shows: text, code and raw HTML as written, emphasis and link marks dropped."""
    return "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline", "html_inline"))


@pytest.mark.parametrize("name,task,setting", [
    ("pub", "digits", "__lap__"), ("pub", "dig<b>its", "*lap*"), ("a&amp;b", "[x]", "lap_half"),
    ("p_", "_t", "l`a`p"), ("pub", "a~~b~~", "x<y"),
])
def test_bug_names_with_markdown_syntax_are_shown_as_they_are(tmp_path, name, task, setting):
    """Bug: the tables and headings wrote names as they are: a setting ``__lap__`` rendered as a bold ``lap`` (the
    same text as a setting ``lap``), ``*lap*`` as an italic ``lap``, a task ``dig<b>its`` as raw HTML, ``[x]``
    and ``a&amp;b`` as link text and an entity. The page must show each name as the config spells it."""
    from diffusionformer.experiments.publish import publish_experiment

    out, docs, config = _study(tmp_path, name, task, ("attention", setting))
    text = publish_experiment(config, out, docs).read_text(encoding="utf-8")
    headings, rows = _rendered(text)
    assert headings[0] == name
    assert headings[1] == f"{task} (digits, vit-digits): test_acc, higher is better"
    table = [r for r in rows if r and r[0] in ("operator", "attention", setting)]
    assert [r[0] for r in table] == ["operator", "attention", setting]
    assert table[0][2] == "Δ vs attention"
    assert len({len(r) for r in table}) == 1  # every row has the header's columns
    if setting == "lap_half":  # an ordinary name is written unchanged
        assert "| lap_half |" in text


def test_bug_summary_table_shows_names_with_markdown_syntax_as_they_are(tmp_path):
    """Bug: ``summary_table`` wrote the comparison, task and setting names as they are: ``__lap__`` rendered as a
    bold ``lap`` in its header, ``dig<b>its`` as raw HTML."""
    from diffusionformer.experiments.publish import summary_table

    out, _, config = _study(tmp_path, "s_", "dig<b>its", ("attention", "__lap__"))
    headings, rows = _rendered(summary_table([config], out))
    assert rows[0] == ["task", "metric (baseline mean)", "__lap__"]
    assert rows[1][:2] == ["s_ / dig<b>its", "test_acc (0.5500)"]
    assert len(rows[1]) == 3


@pytest.mark.parametrize("name", ["a`b", "x``y", "`z"])
def test_bug_a_backtick_in_a_name_keeps_its_code_spans_whole(tmp_path, name):
    """Bug: the page's metric-log path and primary contrasts are code spans fenced by one backtick: a comparison or
    setting name holding one closed the span early and showed the rest as markdown (CommonMark: a span is fenced
    by more backticks than any run inside it)."""
    markdown_it = pytest.importorskip("markdown_it")
    from diffusionformer.experiments.publish import _code

    for text in (name, f"{name}/logs/<task>/<operator>/seed<k>.json"):
        (para,) = [t for t in markdown_it.MarkdownIt("commonmark").parse(f"see {_code(text)} here") if t.type == "inline"]
        assert [(c.type, c.content) for c in para.children] == [("text", "see "), ("code_inline", text),
                                                                 ("text", " here")]


def test_bug_a_comparison_name_with_a_backtick_keeps_the_log_path_whole_on_its_page(tmp_path):
    markdown_it = pytest.importorskip("markdown_it")
    from diffusionformer.experiments.publish import publish_experiment

    out, docs, config = _study(tmp_path, "a`b", "digits", ("attention", "lap"))
    text = publish_experiment(config, out, docs).read_text(encoding="utf-8")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("- **Per-run metric logs:**")]
    codes = [c.content for t in markdown_it.MarkdownIt("commonmark").parse(line) if t.type == "inline"
             for c in t.children if c.type == "code_inline"]
    assert codes == ["a`b/logs/<task>/<operator>/seed<k>.json"]
