"""Publish a finished comparison into the docs: tables, figures, command, machine, wall times.

``python -m diffusionformer.experiments publish CONFIG --out results --to docs/results`` writes
``docs/results/<name>.md`` and copies the small result files (``results.json``, ``results.md``,
PNG plots, the analysis ``metrics.json`` and figures when present) to ``docs/results/<name>/``.
Checkpoints are never copied. The page is regenerated from those files by running the command
again, so every table in the docs can be rebuilt from a results folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from diffusionformer.experiments.config import ExperimentConfig
from diffusionformer.experiments.runner import RunResult, aggregate, format_table, read_curves, run_dir, select_evaluation

__all__ = ["publish_experiment"]


def _copy(src: Path, dst: Path) -> Path | None:
    if not src.is_file():
        return None
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def publish_experiment(config: ExperimentConfig, out_root: str | Path, docs_dir: str | Path,
                       *, config_path: str | None = None) -> Path:
    """Write the results page of ``config`` from ``<out_root>/<name>/`` into ``docs_dir``.

    Raises:
        FileNotFoundError: the comparison has no ``results.json`` yet (run it first).
    """
    src = Path(out_root) / config.name
    results_path = src / "results.json"
    if not results_path.is_file():
        raise FileNotFoundError(
            f"{results_path} not found: run `python -m diffusionformer.experiments run {config_path or 'CONFIG'}` first"
        )
    data = json.loads(results_path.read_text())
    runs = [RunResult(**r) for r in data["runs"]]
    tasks = {t.name: t for t in config.tasks}
    for r in runs:  # results written before a task had select_by: pick from the run's own log
        task = tasks.get(r.task)
        if task is not None and task.select_by and r.selected_value is None and r.status == "completed":
            r.selected_value, r.selected_step = select_evaluation(read_curves(run_dir(src, r.task, r.operator, r.seed)), task)
    manifest: dict[str, Any] = json.loads((src / "manifest.json").read_text()) if (src / "manifest.json").is_file() else {}
    docs = Path(docs_dir)
    dst = docs / config.name
    if dst.exists():
        shutil.rmtree(dst)
    _copy(results_path, dst / "results.json")
    _copy(src / "manifest.json", dst / "manifest.json")
    for png in sorted((src / "plots").glob("*.png")):
        _copy(png, dst / "plots" / png.name)
    analysis = src / "analysis"
    _copy(analysis / "metrics.json", dst / "analysis" / "metrics.json")
    for png in sorted((analysis / "plots").glob("*.png")):
        _copy(png, dst / "analysis" / png.name)

    table = aggregate(runs)
    total = sum(r.elapsed or 0.0 for r in runs)
    done = sum(1 for r in runs if r.status == "completed")
    expected = len(config.tasks) * len(config.operators) * len(config.seeds)
    lines = [
        f"# {config.name}",
        "",
        config.description.strip(),
        "",
        f"- **Command:** `python -m diffusionformer.experiments run {config_path or '<config>'}`"
        " (add `--data-root <root>` for standard benchmarks), then `publish` with the same config",
        f"- **Config:** `{config_path}`" if config_path else "- **Config:** see `manifest.json`",
        f"- **Runs:** {done} of {expected} finished (tasks x operator settings x seeds {config.seeds})",
        f"- **Machine:** {manifest.get('processor', '?')}, {manifest.get('cpu_count', '?')} CPUs, "
        f"{manifest.get('machine', '?')}; CUDA: {manifest.get('cuda') or 'none'}",
        f"- **Versions:** torch {manifest.get('torch', '?')}, diffusionformer {manifest.get('diffusionformer', '?')}, "
        f"Python {manifest.get('python', '?')}",
        f"- **Training wall time:** {total / 60:.1f} min in all (per-run times in the tables)",
        "",
        "Tables give the mean ± sample standard deviation over seeds of the final evaluation "
        "(after the last step; no early stopping); Δ is the difference of means against the first setting "
        "and t its Welch statistic (|t| below about 3 is within seed noise at 3 seeds). Where a task names "
        "`select_by`, the metric is also given at each run's evaluation with the best value of that key.",
        "",
        format_table(table, config).replace("### ", "## "),
    ]
    for task in config.tasks:
        for kind, caption in (("curves", "training loss and headline metric (mean ± std over seeds)"),
                              ("final", "final metric per setting (dots: seeds)")):
            png = dst / "plots" / f"{task.name}_{kind}.png"
            if png.is_file():
                lines += [f"![{task.name}: {caption}]({config.name}/plots/{png.name})", ""]
    analysis_pngs = sorted((dst / "analysis").glob("*.png")) if (dst / "analysis").is_dir() else []
    if analysis_pngs:
        lines += ["## Token geometry", "",
                  f"From `python -m diffusionformer.experiments analyze {config_path or '<config>'}`; "
                  f"numbers in [`metrics.json`]({config.name}/analysis/metrics.json).", ""]
        lines += [f"![{p.stem}]({config.name}/analysis/{p.name})\n" for p in analysis_pngs]
    page = docs / f"{config.name}.md"
    page.write_text("\n".join(lines) + "\n")
    return page
