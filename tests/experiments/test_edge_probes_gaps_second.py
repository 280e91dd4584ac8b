"""Edge probes of the over-fitting tables (``experiments/gaps.py``): second pass.

Run folders and logs are written by hand; nothing trains, nothing needs a GPU.
"""

from __future__ import annotations

import json

from diffusionformer.experiments import gaps
from diffusionformer.experiments.runner import run_dir
from experiments_tiny_configs import TINY_GAPS_TOML

CONFIG_TOML = TINY_GAPS_TOML


def _write_runs(root):
    for op in ("attention", "lap"):
        for seed in (0, 1):
            rdir = run_dir(root / "g", "t", op, seed)
            rdir.mkdir(parents=True)
            (rdir / "summary.json").write_text(json.dumps({"status": "completed"}))
            lines = [json.dumps({"step": 100 * (i + 1), "split": "eval",
                                 "metrics": {"train_loss": 2.0 - 0.25 * i, "val_loss": 2.5 - 0.125 * i + 0.0625 * seed}})
                     for i in range(2)]
            (rdir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_bug_page_in_a_new_folder_without_matplotlib_is_written(tmp_path, monkeypatch, capsys):
    """Bug: ``python -m diffusionformer.experiments.gaps CONFIG --page new/dir/page.md`` without matplotlib (the figures
    skipped with a warning) failed with a FileNotFoundError traceback from the atomic write: the page's folder was
    only ever made by ``plot_gaps`` (with matplotlib the same command wrote the page)."""
    _write_runs(tmp_path)
    cfg = tmp_path / "g.toml"
    cfg.write_text(CONFIG_TOML)

    def no_matplotlib(*args, **kwargs):
        raise ImportError("matplotlib is needed for plots: pip install 'diffusionformer[plot]'")

    monkeypatch.setattr(gaps, "plot_gaps", no_matplotlib)
    page = tmp_path / "docs" / "results" / "g.md"
    assert gaps.main([str(cfg), "--out", str(tmp_path), "--page", str(page)]) == 0
    err = capsys.readouterr().err
    assert "warning: no gap figures" in err
    text = page.read_text(encoding="utf-8")
    assert gaps.GAP_MARKER in text and "### t: train/validation gap" in text
    # the final gap of every run is 2.375 + 0.0625 * seed - 1.75: mean over seeds 0.65625
    assert "| attention | 2 | 2.4062 ± 0.0442 | 1.7500 ± 0.0000 | 0.6562 ± 0.0442 |" in text
