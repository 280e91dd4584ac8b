"""Edge-case probes of publishing and reloading results, second round (``experiments.publish``, ``gaps``).

The page and the gap tables are checked against references computed here from the per-run logs with numpy (mean,
sample std, the metric at the best ``select_by`` evaluation, the first step that meets ``reach``, val - train), and
the figure paths of a page are read with markdown-it, the parser MyST builds the docs with.

Found and fixed (tests named ``test_bug_...``):

- ``publish``: a page regenerated in place (``publish CONFIG --out docs/results --to docs/results``) of a study whose
  ``select_by`` or ``reach`` was named after it ran lost its "at best ..." table and said "never" in its reach table:
  the values were recomputed from the run folders, which a docs folder does not have; the published logs are read.
- ``gaps``: the tables of a published folder (``gaps CONFIG --out docs/results``) took a failed run's partial log
  (publish writes it too) as a finished seed, so they differed from the tables of the results folder.
- ``publish``: a comparison or task named with a character markdown percent-encodes or reads as syntax (``größe``,
  ``λ-half``, ``[x]``, ``a(b``, ``a|b``) got figure links that ``sphinx -W`` refused ("image file not readable") or
  that rendered as plain text; such a figure is now MyST's ``{image}`` directive, which takes the path as it is.
- ``publish``: a comparison named ``x<y>`` or ``x.md`` was added to the toctree as an entry Sphinx reads as another
  page (``y``, ``x``), so ``sphinx -W`` failed, and every publish added it again; it is refused, named.

Probed and found sound: publishing twice is byte-identical (the page, the copied files and the logs; also across
``PYTHONHASHSEED`` values), a setting removed from the config leaves no stale log behind, a missing seed, a failed run
and a NaN metric are counted as the legend says, the merged manifest lists every commit, and ``load_run`` rebuilds the
exact model of ``run_config.json`` (same logits) and names a checkpoint of another operator or a truncated file.
"""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import RunResult, run_dir

INDEX = "# Results\n\n```{toctree}\n:maxdepth: 1\n\n```\n"


def _png(path):
    """A valid 2x2 RGB PNG written by hand (no Pillow needed)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * 2 for _ in range(2))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def _raw(name="pub", task="digits", ops=("attention", "lap"), seeds=(0, 1, 2), **task_fields):
    return {"name": name, "seeds": list(seeds),
            "tasks": [{"name": task, "dataset": "digits", "model": "vit-digits", "train": {"max_steps": 4},
                       **task_fields}],
            "operators": [{"name": o, **({} if i == 0 else {"laplacian_heads": 1})} for i, o in enumerate(ops)]}


def _write(src, task, op, seed, records, status="completed", metric="test_acc"):
    """A run folder (``metrics.jsonl``, ``summary.json``) and its ``results.json`` row as the runner made them."""
    rdir = run_dir(src, task, op, seed)
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    final = records[-1]["metrics"]
    (rdir / "summary.json").write_text(json.dumps({"status": status, "eval": records[-1]}))
    value = final.get(metric) if status == "completed" else None
    return RunResult(task, op, seed, status, metric, value, dict(final) if value is not None else {}, 10, 1.0)


def _results(src, rows):
    (src / "results.json").write_text(json.dumps({"runs": [r.__dict__ for r in rows], "summary": []}))


def _docs(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(INDEX)
    return docs


def _row(text, heading, op):
    block = text.split(heading, 1)[1]
    line = next(ln for ln in block.splitlines() if ln.startswith(f"| {op} |"))
    return [c.strip() for c in line.strip("|").split("|")]


# ----------------------------------------------------------------------------- publish in place
def test_bug_publishing_in_place_keeps_the_select_by_and_reach_tables(tmp_path):
    """Bug: a study whose ``select_by`` and ``reach`` were named after it ran (its results.json holds no selected
    values nor reach steps: ``publish`` recomputes them from the run logs) was published with both tables, but
    regenerating the page in place (``--out docs/results --to docs/results``, how a study whose raw results are gone
    is rebuilt) recomputed them from run folders the docs folder does not have: the "at best val_acc" table vanished
    and every reach cell said "never (0 of 3)"."""
    from diffusionformer.experiments.publish import publish_experiment

    out, rng = tmp_path / "results", np.random.default_rng(3)
    src, rows, logs = out / "pub", [], {}
    for op in ("attention", "lap"):
        for seed in (0, 1, 2):
            val, test = rng.uniform(0.3, 0.9, 4).round(6), rng.uniform(0.3, 0.9, 4).round(6)
            records = [{"step": 2 * (i + 1), "split": "eval", "metrics": {"val_acc": float(v), "test_acc": float(t)}}
                       for i, (v, t) in enumerate(zip(val, test))]
            rows.append(_write(src, "digits", op, seed, records))
            logs[op, seed] = (val, test)
    _results(src, rows)
    cfg = load_experiment_config(_raw(select_by="val_acc", reach={"val_acc": 0.6}))
    docs = _docs(tmp_path)
    first = publish_experiment(cfg, out, docs).read_text()
    again = publish_experiment(cfg, docs, docs).read_text()
    assert again == first

    for op in ("attention", "lap"):  # the references: numpy over the logs written above
        chosen = [logs[op, s][1][int(np.argmax(logs[op, s][0]))] for s in (0, 1, 2)]  # argmax: the first best
        cell = _row(again, "### digits: test_acc at best val_acc", op)[1]
        assert cell == f"{np.mean(chosen):.4f} ± {np.std(chosen, ddof=1):.4f}"
        steps = [2 * (int(np.argmax(logs[op, s][0] >= 0.6)) + 1) for s in (0, 1, 2) if (logs[op, s][0] >= 0.6).any()]
        reach = _row(again, "### digits: steps to val_acc ≥ 0.6", op)[1]
        assert len(steps) == 3 and reach == f"{np.mean(steps):.0f} ± {np.std(steps, ddof=1):.0f} (3 of 3)"


# ----------------------------------------------------------------------------- gaps of a published folder
def test_bug_gap_tables_of_a_published_folder_leave_out_a_failed_run(tmp_path):
    """Bug: ``publish`` writes the log of every run of the page, a failed one's (partial) too, and ``gaps`` read
    every published log as a finished run: the tables of ``--out docs/results`` counted lap 3 seeds with the failed
    run's val loss 7.2 in the mean (3.39 ± 3.01) where those of the results folder said 2 seeds, 1.6550 ± 0.0071."""
    from diffusionformer.experiments.gaps import gap_curves, gap_rows, gap_table
    from diffusionformer.experiments.publish import publish_experiment

    out = tmp_path / "results"
    src, rows, finals = out / "pub", [], {}
    for op, off in (("attention", 0.0), ("lap", 0.05)):
        for seed in (0, 1, 2):
            failed = op == "lap" and seed == 2
            steps = (2,) if failed else (2, 4)
            records = [{"step": st, "split": "eval",
                        "metrics": {"val_loss": 2.0 + off - 0.1 * st + 0.01 * seed + 5.0 * failed,
                                    "train_loss": 1.8 - 0.12 * st + 0.02 * seed}} for st in steps]
            rows.append(_write(src, "text", op, seed, records, status="failed: boom" if failed else "completed",
                               metric="val_loss"))
            if not failed:
                finals.setdefault(op, []).append(records[-1]["metrics"])
    _results(src, rows)
    raw = _raw(task="text", metric="val_loss")
    raw["tasks"][0].update(dataset="pydoc-chars", model="gpt-char-tiny")
    cfg = load_experiment_config(raw)
    docs = _docs(tmp_path)
    publish_experiment(cfg, out, docs)
    assert (docs / "pub" / "logs" / "text" / "lap" / "seed2.json").is_file()  # published, and kept so

    assert gap_rows(cfg, docs) == gap_rows(cfg, out)
    assert gap_table(cfg, docs) == gap_table(cfg, out)
    assert gap_curves(cfg, docs)["text"]["lap"]["n"] == 2
    table = gap_table(cfg, docs)
    for op, recs in finals.items():  # seeds, final val, final train, final gap against numpy
        val, train = np.array([r["val_loss"] for r in recs]), np.array([r["train_loss"] for r in recs])
        cells = _row(table, "train/validation gap", op)
        assert cells[1:5] == [str(len(recs))] + [f"{np.mean(x):.4f} ± {np.std(x, ddof=1):.4f}"
                                                 for x in (val, train, val - train)]


# ----------------------------------------------------------------------------- figure links
def _figure_paths(page):
    """The figure paths of a results page as MyST takes them: markdown-it's normalised ``src`` of an image (MyST
    does not decode it), the argument of an ``{image}`` directive."""
    markdown_it = pytest.importorskip("markdown_it")
    paths, texts = [], []
    for tok in markdown_it.MarkdownIt("commonmark").parse(page.read_text()):
        if tok.type == "fence" and tok.info.startswith("{image}"):
            paths.append(tok.info.split(None, 1)[1])
        for child in tok.children or []:
            if child.type == "image":
                paths.append(child.attrGet("src"))
            elif child.type == "text":
                texts.append(child.content)
    return paths, texts


@pytest.mark.parametrize("name,task", [("größe", "digits"), ("pub", "λ-half"), ("pub", "[x]"), ("a(b", "digits"),
                                       ("a)b", "dig`its"), ("a|b", "d%zz"), ("pub", "digits")])
def test_bug_every_figure_of_the_page_names_a_published_file(tmp_path, name, task):
    """Bug: the page linked its figures as ``![...](<name>/plots/<task>_curves.png)``; markdown-it percent-encodes
    a non-ASCII letter, ``[``, ``|`` or a ``%`` (MyST then looks for ``gr%C3%B6%C3%9Fe/plots/...``: ``sphinx -W``
    failed with "image file not readable"), and an unbalanced ``(`` or ``)``, or a backtick in the task name, ended
    the link: the figure was plain text on the page. Names the config allows."""
    from diffusionformer.experiments.publish import publish_experiment

    out = tmp_path / "results"
    src = out / name
    rows = [_write(src, task, op, s, [{"step": 2, "split": "eval", "metrics": {"test_acc": 0.5 + s / 10 + i / 50}}])
            for i, op in enumerate(("attention", "lap")) for s in (0, 1)]
    _results(src, rows)
    for kind in ("curves", "final"):
        _png(src / "plots" / f"{task}_{kind}.png")
    _png(src / "analysis" / "plots" / "rank.png")
    (src / "analysis" / "metrics.json").write_text("{}")
    docs = _docs(tmp_path)
    page = publish_experiment(load_experiment_config(_raw(name=name, task=task, seeds=(0, 1))), out, docs)

    paths, texts = _figure_paths(page)
    assert sorted(paths) == sorted([f"{name}/plots/{task}_curves.png", f"{name}/plots/{task}_final.png",
                                    f"{name}/analysis/rank.png"])
    assert all((docs / p).is_file() for p in paths)
    assert not any("_curves.png" in t or "rank.png" in t for t in texts)  # no figure left as text
    markdown_it = pytest.importorskip("markdown_it")
    links = [c.attrGet("href") for tok in markdown_it.MarkdownIt("commonmark").parse(page.read_text())
             for c in tok.children or [] if c.type == "link_open"]
    assert len(links) == 1 and links[0].endswith("/analysis/metrics.json")  # a ( or ) of the name keeps the link
    if name == "pub" and task == "digits":  # an ordinary name: markdown images, as before
        assert "![digits: training loss and headline metric (mean ± std over seeds)](pub/plots/digits_curves.png)" \
            in page.read_text().splitlines()


def test_bug_the_gap_figure_of_a_name_markdown_would_change_is_the_image_directive(write_run, tmp_path):
    """Bug: ``gaps --page`` linked its figure as ``![...](größe/plots/t_gap.png)`` too, which MyST looked for as
    ``gr%C3%B6%C3%9Fe/plots/t_gap.png`` (``sphinx -W``: "image file not readable")."""
    pytest.importorskip("matplotlib")
    from diffusionformer.experiments import gaps

    cfg = tmp_path / "g.toml"
    cfg.write_text('name = "größe"\nseeds = [0]\n[[tasks]]\nname = "t"\ndataset = "pydoc-chars"\n'
                   'model = "gpt-char-tiny"\nmetric = "val_loss"\n[[operators]]\nname = "attention"\n')
    write_run(tmp_path / "größe", "t", "attention", 0,
              [{"step": 10, "split": "eval", "metrics": {"train_loss": 1.5, "val_loss": 2.0}}])
    page = tmp_path / "docs" / "größe.md"
    assert gaps.main([str(cfg), "--out", str(tmp_path), "--page", str(page)]) == 0
    paths, _ = _figure_paths(page)
    assert paths == ["größe/plots/t_gap.png"] and (page.parent / paths[0]).is_file()


# ----------------------------------------------------------------------------- toctree entries
@pytest.mark.parametrize("name,page", [("x<y>", "y"), ("notes.md", "notes")])
def test_bug_publish_refuses_a_name_the_toctree_reads_as_another_page(tmp_path, name, page):
    """Bug: a comparison named ``x<y>`` was listed in the results toctree as ``x<y>``, which Sphinx reads as the
    page ``y`` titled ``x`` (``notes.md``: the page ``notes``): ``sphinx -W`` failed ("document isn't included in
    any toctree"), and as the entry never counted as listed, every publish added it once more."""
    from diffusionformer.experiments.publish import publish_experiment

    out = tmp_path / "results"
    _results(out / name, [_write(out / name, "digits", "attention", 0,
                                 [{"step": 2, "split": "eval", "metrics": {"test_acc": 0.5}}])])
    docs = _docs(tmp_path)
    cfg = load_experiment_config(_raw(name=name, ops=("attention",), seeds=(0,)))
    with pytest.raises(ValueError, match=rf"named {name!r} cannot be listed.*as the page {page!r}.*rename"):
        publish_experiment(cfg, out, docs)
    assert (docs / "index.md").read_text() == INDEX and sorted(p.name for p in docs.iterdir()) == ["index.md"]
