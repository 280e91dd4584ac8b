"""Figures of a comparison: training curves and final metric per operator setting."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from diffusionformer._files import leftover_temps
from diffusionformer.experiments.config import ExperimentConfig
from diffusionformer.experiments.results import RunResult, _is_finite, read_curves, run_dir

__all__ = ["plot_experiment"]


def _figure(*args: Any, **kwargs: Any) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the environment
        from diffusionformer._imports import matplotlib_error

        raise matplotlib_error(exc, 'plots need matplotlib: pip install "diffusionformer[plot]"', "plots need") from exc
    return Figure(*args, **kwargs)


_STALE_SECONDS = 600.0


@contextlib.contextmanager
def _replace_when_written(path: Path) -> Iterator[Path]:
    """A path of ``path``'s name in a hidden folder beside it, moved over ``path`` (``os.replace``) once written:
    an interrupt or error while writing leaves the earlier file whole and nothing else behind. The name, and so
    the suffix that picks the figure format, is kept; the folder keeps a leftover of a killed process out of
    ``plots/*.png``, and the next write of the figure removes such leftovers once they are
    ``_STALE_SECONDS`` old (a writer that is still busy with one is never that slow)."""
    path = Path(path)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp_dir / path.name
        os.replace(tmp_dir / path.name, path)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    now = time.time()
    for old in leftover_temps(path):  # a killed process's, never removed
        with contextlib.suppress(OSError):
            if old.is_dir() and now - old.stat().st_mtime > _STALE_SECONDS:
                shutil.rmtree(old, ignore_errors=True)


def _save_figure(fig: Any, path: Path) -> None:
    """``fig.savefig(path, dpi=110)``, replacing ``path`` only once the figure is written whole."""
    with _replace_when_written(path) as tmp:
        fig.savefig(tmp, dpi=110)


def _series(records: list[dict[str, Any]], split: str, key: str) -> tuple[list[int], list[float]]:
    # a step logged twice (a resumed log that was not truncated) reads as its last record, as the trainer's
    # truncate promises; the steps in order (else a failed run's dotted line ran back to a re-logged step)
    last: dict[int, Any] = {}
    for r in records:
        if r.get("split") != split:
            continue
        last[int(r["step"])] = r.get("loss") if key == "loss" else r.get("metrics", {}).get(key)
    steps, values = [], []
    for step in sorted(last):
        v = last[step]
        # finite numbers only, as the tables read them: a hand-edited true is not 1.0, and a NaN of one seed would make
        # the band's mean NaN at that step (and count the seed in its n) where the tables leave the value out
        if _is_finite(v):
            steps.append(step)
            values.append(float(v))
    return steps, values


def _mean_band(curves: list[tuple[list[int], list[float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    curves = [c for c in curves if c[0]]
    if not curves:
        return None
    common = sorted(set.intersection(*[set(s) for s, _ in curves]))
    if not common:
        return None
    arr = np.array([[dict(zip(s, v))[t] for t in common] for s, v in curves])
    return np.array(common), arr.mean(0), arr.std(0)


# A completed run's line style per block of ten settings (never ":", which marks a failed run's partial curve) and
# the final plot's marker: matplotlib's colour cycle has ten colours, so setting 10 drew as setting 0 did
_LINESTYLES = ("-", "--", "-.", (0, (5, 1, 1, 1, 1, 1)))
_MARKERS = ("o", "s", "^", "D")


def _setting_style(i: int) -> tuple[str, Any, str]:
    """Colour, completed-run line style and final-plot marker of the ``i``-th setting: every setting of up to 40
    differs from every other in at least one of them (past 40 they repeat)."""
    block = (i // 10) % len(_LINESTYLES)
    return f"C{i % 10}", _LINESTYLES[block], _MARKERS[block]


def _file_identity(path: Path) -> tuple[int, ...] | None:
    """``path``'s (inode, size, mtime_ns, ctime_ns), ``None`` when it is not there: another process's rewrite (an
    ``os.replace`` gives a new inode; an edit in place a new ctime) changes it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def plot_experiment(out: Path, config: ExperimentConfig, results: list[RunResult]) -> list[Path]:
    """Write ``plots/<task>_curves.png`` and ``plots/<task>_final.png`` for every task with results."""
    return _plot_experiment(out, config, results, _PLOT_CACHE.get())


# The figures one `run_experiment` call drew last (set by it for its duration; None elsewhere): after each run of a
# study every task's figures were drawn again, although a run changes one task's only
_PLOT_CACHE: contextvars.ContextVar[dict[Any, Any] | None] = contextvars.ContextVar("_PLOT_CACHE", default=None)


def _plot_experiment(out: Path, config: ExperimentConfig, results: list[RunResult],
                     cache: dict[Any, Any] | None) -> list[Path]:
    """:func:`plot_experiment`; with ``cache`` (a dict kept by one ``run_experiment`` call), a task's two figures are
    drawn again only when what they show changed since this call last drew them, or when either file on disk is no
    longer the one it wrote (another worker's figures, an edited or deleted file): a run changes its own task's
    figures only, and drawing one costs a second or more. The rows and every run's log are still read each time
    (cheap, and never trusted across a change on disk); the figures are skipped only when what they would show
    equals what was drawn."""
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    written = []
    for task in config.tasks:
        task_results = [r for r in results if r.task == task.name]
        if not task_results:
            continue
        paths = (plots / f"{task.name}_curves.png", plots / f"{task.name}_final.png")
        curves: dict[tuple[str, int], list[dict[str, Any]]] = {}  # read in the order the figure drew them
        for setting in config.operators:
            runs = [r for r in task_results if r.operator == setting.name]
            for r in [r for r in runs if r.status == "completed"] + [r for r in runs if r.status != "completed"]:
                if (setting.name, r.seed) not in curves:
                    curves[(setting.name, r.seed)] = read_curves(run_dir(out, task.name, setting.name, r.seed))
        # everything the two figures are drawn from (repr: a NaN value equals itself there; a digest: a study's logs
        # are not kept in memory)
        metric_key = "loss" if task.metric == "val_loss" else task.metric
        drawn_from = hashlib.sha256(repr((
            task.name, task.metric, [s.name for s in config.operators],
            [(r.operator, r.seed, r.status, r.value) for r in task_results],
            [(k, _series(rec, "train", "loss"), _series(rec, "eval", metric_key)) for k, rec in curves.items()],
        )).encode()).hexdigest()
        if cache is not None:
            before = cache.get(paths)
            if before is not None and before == (drawn_from, *map(_file_identity, paths)):
                written.extend(paths)
                continue
            cache.pop(paths, None)
        fig = _figure(figsize=(10, 3.6), layout="constrained")  # first: its ImportError names the `plot` extra
        from matplotlib.lines import Line2D

        ax_loss, ax_metric = fig.subplots(1, 2)
        # the loss panel's legend entries, given to legend() as such: from the labels it leaves out a setting "_base"
        entries: list[tuple[Any, str]] = []
        for i, setting in enumerate(config.operators):
            runs = [r for r in task_results if r.operator == setting.name]
            if not runs:
                continue
            # The band is over the completed runs: a run that failed at step 300 of 1000 would cut every
            # curve of its setting to the steps all runs share. A failed run's partial log is drawn on its own.
            done = [curves[(setting.name, r.seed)] for r in runs if r.status == "completed"]
            failed = [curves[(setting.name, r.seed)] for r in runs if r.status != "completed"]
            color, style, _ = _setting_style(i)
            for ax, split, key in ((ax_loss, "train", "loss"), (ax_metric, "eval", metric_key)):
                series = [_series(rec, split, key) for rec in done]
                band = _mean_band(series)
                if band is not None:
                    x, m, sd = band  # over the runs with a curve: a run that failed before logging has none
                    label = f"{setting.name} (n={sum(1 for steps, _ in series if steps)})"
                    ax.plot(x, m, color=color, linestyle=style, label=label)
                    ax.fill_between(x, m - sd, m + sd, color=color, alpha=0.2)
                    if ax is ax_loss:
                        entries.append((Line2D([], [], color=color, linestyle=style), label))
                partial = [c for c in (_series(rec, split, key) for rec in failed) if c[0]]
                for j, (steps, values) in enumerate(partial):
                    label = f"{setting.name} failed (n={len(partial)})"
                    ax.plot(steps, values, color=color, linestyle=":", linewidth=1, label=label if j == 0 else None)
                    if ax is ax_loss and j == 0:
                        entries.append((Line2D([], [], color=color, linestyle=":", linewidth=1), label))
        ax_loss.set(xlabel="step", ylabel="train loss", title=f"{task.name}: training loss")
        ax_metric.set(xlabel="step", ylabel=task.metric, title=f"{task.name}: {task.metric} (mean ± std)")
        if entries:  # (no run logged a step: no legend)
            ax_loss.legend(handles=[h for h, _ in entries], labels=[lab for _, lab in entries], fontsize=8)
        path = plots / f"{task.name}_curves.png"
        _save_figure(fig, path)
        written.append(path)

        fig = _figure(figsize=(1.4 + 1.1 * len(config.operators), 3.4), layout="constrained")
        ax = fig.subplots()
        names = [s.name for s in config.operators]
        for i, name in enumerate(names):
            # the finite values, as the tables' mean (a NaN run would make the mean NaN and hide the setting's point)
            vals = [r.value for r in task_results
                    if r.operator == name and r.value is not None and math.isfinite(r.value)]
            if not vals:
                continue
            color, _, marker = _setting_style(i)
            ax.errorbar([i], [np.mean(vals)], yerr=[np.std(vals, ddof=1) if len(vals) > 1 else 0.0], fmt=marker,
                        color=color, capsize=4, markersize=8)
            jitter = np.linspace(-0.12, 0.12, len(vals)) if len(vals) > 1 else np.zeros(1)  # (linspace(n=1) is -0.12)
            ax.scatter(np.full(len(vals), i) + jitter, vals, color=color, marker=marker, s=12, alpha=0.6)
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        ax.set(ylabel=task.metric, title=f"{task.name}: final {task.metric}")
        ax.grid(axis="y", alpha=0.3)
        path = plots / f"{task.name}_final.png"
        _save_figure(fig, path)
        written.append(path)
        if cache is not None:
            cache[paths] = (drawn_from, *map(_file_identity, paths))
    return written
