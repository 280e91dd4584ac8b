"""Over-fitting tables from run logs: final/best validation loss and the train/validation gap."""

from __future__ import annotations

import json

import pytest

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.gaps import (GAP_MARKER, gap_curves, gap_rows, gap_table, main, plot_gaps, primary_table,
                                             write_gap_section)
from diffusionformer.experiments.publish import READING_MARKER, write_run_log
from diffusionformer.experiments.runner import run_dir
from experiments_tiny_configs import GAP_CURVES

stats = pytest.importorskip("scipy.stats")  # the reference; scipy is a test-only need

CFG = {"name": "g", "seeds": [0, 1, 2], "primary": ["lap"],
       "tasks": [{"name": "t", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss"}],
       "operators": [{"name": "attention"}, {"name": "lap", "laplacian_heads": 1}]}

CURVES = GAP_CURVES  # (train, val) at steps 100, 200, 300 per (setting, seed)


def _write(root):
    config = load_experiment_config(CFG)
    for (op, seed), curve in CURVES.items():
        rdir = run_dir(root / "g", "t", op, seed)
        rdir.mkdir(parents=True)
        (rdir / "summary.json").write_text(json.dumps({"status": "completed"}))
        lines = [json.dumps({"step": 100 * (i + 1), "split": "eval", "metrics": {"train_loss": t, "val_loss": v}})
                 for i, (t, v) in enumerate(curve)]
        lines.insert(1, json.dumps({"step": 150, "split": "train", "loss": 0.1}))  # train records are ignored
        (rdir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return config


def test_gap_rows_and_paired_differences_match_scipy(tmp_path):
    config = _write(tmp_path)
    rows = gap_rows(config, tmp_path)["t"]
    for (op, seed), curve in CURVES.items():
        r = rows[op][seed]
        assert r["final_val"] == curve[-1][1] and r["final_train"] == curve[-1][0]
        assert r["final_gap"] == pytest.approx(curve[-1][1] - curve[-1][0])
        best = min(range(3), key=lambda i: curve[i][1])
        assert r["best_val"] == curve[best][1] and r["best_step"] == 100 * (best + 1)
        assert r["best_gap"] == pytest.approx(curve[best][1] - curve[best][0])
    table = gap_table(config, tmp_path)
    gap = {op: [CURVES[(op, s)][-1][1] - CURVES[(op, s)][-1][0] for s in range(3)] for op in ("attention", "lap")}
    t = stats.ttest_rel(gap["lap"], gap["attention"]).statistic
    d = sum(a - b for a, b in zip(gap["lap"], gap["attention"])) / 3
    assert f"{d:+.4f} (t {t:+.1f}, 2 df)" in table
    assert "| lap (primary) | 3 |" in table and "exploratory" in table


def test_gap_section_is_replaced_not_repeated(tmp_path, capsys):
    _write(tmp_path)
    page = tmp_path / "page.md"
    page.write_text("# g\n\ntables\n")
    cfg = tmp_path / "g.toml"
    cfg.write_text('name = "g"\nseeds = [0, 1, 2]\nprimary = ["lap"]\n[[tasks]]\nname = "t"\ndataset = "pydoc-chars"\n'
                   'model = "gpt-char-tiny"\nmetric = "val_loss"\n[[operators]]\nname = "attention"\n'
                   '[[operators]]\nname = "lap"\nlaplacian_heads = 1\n')
    assert main([str(cfg), "--out", str(tmp_path), "--page", str(page)]) == 0
    assert main([str(cfg), "--out", str(tmp_path), "--page", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# g\n\ntables\n") and text.count(GAP_MARKER) == 1 and text.count("| attention | 3 |") == 1
    assert main([str(cfg), "--out", str(tmp_path / "none")]) == 1
    write_gap_section(page, "x\n")
    assert page.read_text().endswith("train/validation gap\n\nx\n")


def test_primary_contrasts_match_scipy_with_holm_over_the_named_quantities(tmp_path, capsys):
    config = _write(tmp_path)
    table = primary_table(config, tmp_path, ("final_val", "final_gap"))
    final = {op: {"final_val": [CURVES[(op, s)][-1][1] for s in range(3)],
                  "final_gap": [CURVES[(op, s)][-1][1] - CURVES[(op, s)][-1][0] for s in range(3)],
                  "best_val": [min(v for _, v in CURVES[(op, s)]) for s in range(3)]} for op in ("attention", "lap")}
    p = {}
    for q, label in [("final_val", "final val loss"), ("final_gap", "final gap"), ("best_val", "best val loss")]:
        a, b = final["lap"][q], final["attention"][q]
        d = [x - y for x, y in zip(a, b)]
        ref = stats.ttest_rel(a, b)
        ci = ref.confidence_interval(0.95)
        p[q] = ref.pvalue
        line = next(l for l in table.splitlines() if f"t, lap, {label} |" in l)
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert float(cells[1]) == pytest.approx(sum(d) / 3, abs=5e-5)
        assert cells[2] == f"[{ci.low:+.4f}, {ci.high:+.4f}]"
        assert float(cells[3]) == pytest.approx(ref.statistic, abs=5e-3) and cells[4] == "2"
        assert float(cells[5]) == pytest.approx(ref.pvalue, rel=5e-2)
        assert float(cells[6]) == pytest.approx(stats.wilcoxon(d).pvalue, rel=5e-2)
        if q == "best_val":
            assert cells[0].startswith("*exploratory:*") and cells[7] == ""  # not adjusted
    holm = {}  # Holm over the two primary cells
    (q1, p1), (q2, p2) = sorted(((q, p[q]) for q in ("final_val", "final_gap")), key=lambda x: x[1])
    holm[q1] = min(1.0, 2 * p1)
    holm[q2] = max(holm[q1], min(1.0, p2))
    for q, label in [("final_val", "final val loss"), ("final_gap", "final gap")]:
        line = next(l for l in table.splitlines() if f"t, lap, {label} |" in l)
        assert float(line.split("|")[8]) == pytest.approx(holm[q], rel=5e-2)
    assert "adjusted over the 2 primary cells" in table
    # only the primary cells are tested: a config without primary contrasts has no table
    assert primary_table(load_experiment_config({**CFG, "primary": []}), tmp_path) == ""
    with pytest.raises(ValueError, match="primary quantities"):
        primary_table(config, tmp_path, ("final_vall",))
    cfg = tmp_path / "g.toml"
    cfg.write_text('name = "g"\nseeds = [0, 1, 2]\nprimary = ["lap"]\n[[tasks]]\nname = "t"\ndataset = "pydoc-chars"\n'
                   'model = "gpt-char-tiny"\nmetric = "val_loss"\n[[operators]]\nname = "attention"\n'
                   '[[operators]]\nname = "lap"\nlaplacian_heads = 1\n')
    assert main([str(cfg), "--out", str(tmp_path), "--primary", "gap"]) == 2
    assert "primary quantities" in capsys.readouterr().err
    assert main([str(cfg), "--out", str(tmp_path), "--primary", "final_val,final_gap"]) == 0
    assert "### Primary contrasts: final val loss, final gap" in capsys.readouterr().out


def test_gaps_from_published_logs_equal_the_run_folders_and_keep_a_reading(tmp_path):
    config = _write(tmp_path / "results")
    docs = tmp_path / "docs"
    for (op, seed) in CURVES:  # what publish writes: one small JSON log per finished run
        records = [json.loads(line) for line in
                   (run_dir(tmp_path / "results" / "g", "t", op, seed) / "metrics.jsonl").read_text().splitlines()]
        write_run_log(records, docs / "g" / "logs" / "t" / op / f"seed{seed}.json")
    assert gap_rows(config, docs) == gap_rows(config, tmp_path / "results")
    assert gap_table(config, docs) == gap_table(config, tmp_path / "results")
    page = docs / "g.md"
    page.write_text("# g\n\ntables\n\n" + READING_MARKER + "\n\nOur reading.\n")
    write_gap_section(page, "first\n")
    write_gap_section(page, "second\n")
    text = page.read_text()
    assert text.startswith("# g\n\ntables\n\n" + GAP_MARKER) and "first" not in text
    assert text.endswith("second\n\n" + READING_MARKER + "\n\nOur reading.\n")


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"eval": {"step": [1, 2], "val_loss": [1.0]}}',
                                  '{"eval": {"step": ["a"], "val_loss": [1.0]}}', '{"eval": [1]}'])
def test_a_corrupt_published_log_is_named_not_a_traceback(tmp_path, capsys, text):
    docs = tmp_path / "docs"
    log = docs / "g" / "logs" / "t" / "attention" / "seed0.json"
    log.parent.mkdir(parents=True)
    log.write_text(text)
    cfg = tmp_path / "g.toml"
    cfg.write_text('name = "g"\nseeds = [0]\n[[tasks]]\nname = "t"\ndataset = "pydoc-chars"\n'
                   'model = "gpt-char-tiny"\nmetric = "val_loss"\n[[operators]]\nname = "attention"\n')
    assert main([str(cfg), "--out", str(docs)]) == 2
    err = capsys.readouterr().err
    assert str(log) in err and "not" in err


def test_gap_curves_are_the_seed_means_and_the_page_shows_the_figure(tmp_path):
    import numpy as np

    config = _write(tmp_path)
    curves = gap_curves(config, tmp_path)["t"]
    for op in ("attention", "lap"):
        runs = [CURVES[(op, s)] for s in range(3)]
        assert curves[op]["n"] == 3
        for key, f in (("val", lambda t, v: v), ("train", lambda t, v: t), ("gap", lambda t, v: v - t)):
            x, m, sd = curves[op][key]
            vals = np.array([[f(t, v) for t, v in run] for run in runs])
            assert list(x) == [100, 200, 300]
            np.testing.assert_allclose(m, vals.mean(0), rtol=1e-12)
            np.testing.assert_allclose(sd, vals.std(0), rtol=1e-12)
    pytest.importorskip("matplotlib")
    (png,) = plot_gaps(config, tmp_path, tmp_path / "plots")
    assert png.name == "t_gap.png" and png.read_bytes()[:4] == b"\x89PNG"
    cfg = tmp_path / "g.toml"
    cfg.write_text('name = "g"\nseeds = [0, 1, 2]\nprimary = ["lap"]\n[[tasks]]\nname = "t"\ndataset = "pydoc-chars"\n'
                   'model = "gpt-char-tiny"\nmetric = "val_loss"\n[[operators]]\nname = "attention"\n'
                   '[[operators]]\nname = "lap"\nlaplacian_heads = 1\n')
    page = tmp_path / "docs" / "g.md"
    page.parent.mkdir()
    assert main([str(cfg), "--out", str(tmp_path), "--page", str(page)]) == 0
    assert (tmp_path / "docs" / "g" / "plots" / "t_gap.png").is_file()
    assert "](g/plots/t_gap.png)" in page.read_text()
