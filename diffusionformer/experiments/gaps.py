r"""Over-fitting tables: train and validation loss, and their gap, from a comparison's run logs.

For every text task (evaluations with ``train_loss`` and ``val_loss`` measured on the same
protocol, see :class:`~diffusionformer.experiments.tasks.TextLMTask`) and every operator
setting, over seeds: the final validation and train loss and the gap
:math:`g = \mathrm{val} - \mathrm{train}` after the last step, the best (lowest) validation
loss with its step and the gap there. Differences to the baseline (the first setting) are
paired over seeds (a seed fixes the initial weights and the batches of every setting).

When the config names primary contrasts (``primary``), a last table tests them: for each
primary ``(task, setting)`` and each primary quantity (``--primary``; by default the ones the
config's ``primary_quantities`` name: ``final`` is the final validation loss, ``selected`` the best one where a
primary task has ``select_by``, ``reach`` has none; the over-fitting studies named the final validation loss and
the final gap), the paired difference to the baseline with its 95% confidence interval, the paired t (``df``
= seeds - 1), the Wilcoxon signed-rank p and the p adjusted by Holm's method over the primary
cells of the table (:mod:`~diffusionformer.experiments.stats`); the best validation loss of the
same settings follows as exploratory (no adjustment).

``python -m diffusionformer.experiments.gaps CONFIG --out results [--page docs/results/<name>.md]``
prints the tables, or writes them into the results page (replacing an earlier copy), so the
page can be rebuilt after ``publish``; with ``--page`` it also draws, per task, the train and
validation loss of the evaluations and their gap over steps (:func:`plot_gaps`,
``<name>/plots/<task>_gap.png`` beside the page).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Collection

from diffusionformer.experiments.config import (ExperimentConfig, _did_you_mean, _refuse_results_twin,
                                                load_experiment_config)
from diffusionformer.experiments.publish import (GAP_MARKER, READING_MARKER, _copy_png, _image, _read_page,
                                                 _run_log_path, read_run_log)
from diffusionformer.experiments.results import _is_finite, _runs_of_another_train, read_json_dict
from diffusionformer.experiments.runner import read_curves, run_dir
from diffusionformer.experiments.stats import holm, paired_difference
from diffusionformer.experiments.tables import _cell, _text
from diffusionformer.experiments.tasks import as_metrics
from diffusionformer.train.metrics import write_text_atomic

__all__ = ["GAP_MARKER", "QUANTITIES", "gap_curves", "gap_rows", "gap_table", "plot_gaps", "primary_table", "run_gaps",
           "write_gap_section"]


#: the quantities of :func:`run_gaps` a primary contrast may name, with their labels
QUANTITIES = {"final_val": "final val loss", "final_gap": "final gap", "final_train": "final train loss",
              "best_val": "best val loss", "best_gap": "gap at best val"}


def _eval_losses(records: list[dict[str, Any]]) -> tuple[list[int], list[float], list[float]]:
    """Steps, train and validation loss of the evaluations that measured both (as :func:`run_gaps` reads them)."""
    rows = []
    for r in records:
        m = as_metrics(r) if r.get("split") == "eval" else {}
        # _is_finite: a 400-digit int from a hand-edited log is left out, not an OverflowError of math.isfinite
        if "train_loss" in m and "val_loss" in m and _is_finite(m["val_loss"]) and _is_finite(m["train_loss"]):
            rows.append((int(r["step"]), m["train_loss"], m["val_loss"]))
    rows.sort(key=lambda row: row[0])  # by step, stable: of a step logged twice the later record is the final one
    return [s for s, _, _ in rows], [t for _, t, _ in rows], [v for _, _, v in rows]


def run_gaps(records: list[dict[str, Any]]) -> dict[str, float] | None:
    """Final and best-validation losses and gaps of one run's metrics log.

    Returns ``None`` when the log has no evaluation with both ``train_loss`` and ``val_loss``.

    Examples:
        >>> evals = [{"split": "eval", "step": s, "metrics": {"train_loss": t, "val_loss": v}}
        ...          for s, t, v in [(100, 2.0, 2.5), (200, 1.5, 2.25), (300, 1.0, 2.75)]]
        >>> run_gaps(evals)
        {'final_val': 2.75, 'final_train': 1.0, 'final_gap': 1.75, 'best_val': 2.25, 'best_step': 200.0, 'best_gap': 0.75}
    """
    evals = list(zip(*_eval_losses(records)))  # (step, train, val), by step
    if not evals:
        return None
    step, train, val = evals[-1]
    best = min(evals, key=lambda e: (e[2], e[0]))  # lowest val, earliest among ties
    return {"final_val": val, "final_train": train, "final_gap": val - train,
            "best_val": best[2], "best_step": float(best[0]), "best_gap": best[2] - best[1]}


def _unfinished(out: Path) -> set[tuple[Any, Any, Any]]:
    """``(task, setting, seed)`` of the runs that ``out/results.json`` lists as not completed (failed, stopped by a
    non-finite loss): ``publish`` writes their partial logs too, which the tables leave out as they do in the run
    folders."""
    rows = (read_json_dict(out / "results.json") or {}).get("runs")
    # names and seeds of other types name no run (and a list or an object is no set member: "unhashable type")
    return {(r["task"], r["operator"], r["seed"]) for r in rows if isinstance(r, dict)
            and r.get("status") != "completed" and isinstance(r.get("task"), str)
            and isinstance(r.get("operator"), str) and type(r.get("seed")) is int} if isinstance(rows, list) else set()


def _run_records(out: Path, task: str, setting: str, seed: int,
                 unfinished: Collection[tuple[Any, Any, Any]] = ()) -> list[dict[str, Any]] | None:
    """The metrics records of a finished run: its run folder's log, else the log ``publish`` wrote (unless
    ``unfinished``, :func:`_unfinished` of ``out``, lists the run); ``None`` when the run has not finished (or is not
    there)."""
    summary = run_dir(out, task, setting, seed) / "summary.json"
    published = _run_log_path(out, task, setting, seed)
    if summary.is_file():  # an unreadable summary (truncated, not UTF-8) is an unfinished run, as in results
        return read_curves(summary.parent) if (read_json_dict(summary) or {}).get("status") == "completed" else None
    if published.is_file() and (task, setting, seed) not in unfinished:  # a failed run's log is published too
        return read_run_log(published)
    return None


def gap_rows(config: ExperimentConfig, out_root: str | Path) -> dict[str, dict[str, dict[int, dict[str, float]]]]:
    """``{task: {setting: {seed: run_gaps(...)}}}`` over the finished runs with train/val losses.

    ``out_root`` is the results root the comparison was run into, or a docs folder it was
    published to (the per-run logs of ``publish``: ``<name>/logs/<task>/<setting>/seed<k>.json``).
    """
    out = Path(out_root) / config.name
    unfinished = _unfinished(out)
    rows: dict[str, dict[str, dict[int, dict[str, float]]]] = {}
    for task in config.tasks:
        for setting in config.operators:
            for seed in config.seeds:
                records = _run_records(out, task.name, setting.name, seed, unfinished)
                g = None if records is None else run_gaps(records)
                if g is not None:
                    rows.setdefault(task.name, {}).setdefault(setting.name, {})[seed] = g
    return rows


def _ms(values: list[float], digits: int = 4) -> str:
    if not values:
        return "n/a"
    sd = f"{statistics.stdev(values):.{digits}f}" if len(values) > 1 else "n/a"  # one value has no sample std
    return f"{statistics.fmean(values):.{digits}f} ± {sd}"


def _diff(row: dict[int, dict[str, float]], base: dict[int, dict[str, float]], key: str) -> str:
    seeds = sorted(set(row) & set(base))
    if not seeds:
        return ""
    d = [row[s][key] - base[s][key] for s in seeds]
    # paired_difference, as the primary-contrast table: no t where the differences do not spread
    t = paired_difference({s: row[s][key] for s in seeds}, {s: base[s][key] for s in seeds}).t
    return f"{statistics.fmean(d):+.4f}" + ("" if t is None else f" (t {t:+.1f}, {len(seeds) - 1} df)")


def gap_table(config: ExperimentConfig, out_root: str | Path,
              rows: dict[str, dict[str, dict[int, dict[str, float]]]] | None = None) -> str:
    """Markdown tables of :func:`gap_rows` (mean ± sample std over seeds; Δ paired over seeds); ``rows``: those
    :func:`gap_rows` already returned (read from ``out_root`` otherwise)."""
    rows = gap_rows(config, out_root) if rows is None else rows
    baseline = config.operators[0].name
    lines: list[str] = []
    for task in config.tasks:
        settings = rows.get(task.name, {})
        if not settings:
            continue
        base = settings.get(baseline, {})
        lines += [f"### {_text(task.name)}: train/validation gap", "",
                  "Losses from the same evaluation protocol on both splits; gap = val - train. "
                  f"Δ: mean of the per-seed differences to {_text(baseline)} with the paired t "
                  "(degrees of freedom = shared seeds - 1)."
                  + (f" Primary contrasts (named before the runs): {', '.join(map(_text, config.primary))}; the rest is "
                     "exploratory." if getattr(config, "primary", None) else ""), "",
                  "| operator | seeds | final val | final train | final gap | Δ final val | Δ final gap | "
                  "best val | at step | gap at best val | Δ best val |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for setting in config.operators:
            row = settings.get(setting.name)
            if not row:
                continue
            get = lambda k: [row[s][k] for s in sorted(row)]  # noqa: E731
            primary = (task.name, setting.name) in config.primary_contrasts() if getattr(config, "primary", None) else False
            label = _cell(_text(setting.name)) + (" (primary)" if primary else "")
            is_base = setting.name == baseline
            lines.append(
                f"| {label} | {len(row)} | {_ms(get('final_val'))} | {_ms(get('final_train'))} | {_ms(get('final_gap'))} | "
                f"{'' if is_base else _diff(row, base, 'final_val')} | {'' if is_base else _diff(row, base, 'final_gap')} | "
                f"{_ms(get('best_val'))} | {_ms(get('best_step'), 0)} | {_ms(get('best_gap'))} | "
                f"{'' if is_base else _diff(row, base, 'best_val')} |")
        lines.append("")
    return "\n".join(lines)


def _g(x: float | None, spec: str = ".2g") -> str:
    return "n/a" if x is None else format(x, spec)


def _p(p: float | None) -> str:
    """A p-value with two significant digits, more where two would round across 0.05 (0.0496: not "0.05")."""
    if p is None:
        return "n/a"
    digits = 2
    while digits < 17 and (float(f"{p:.{digits}g}") < 0.05) != (p < 0.05):
        digits += 1
    return f"{p:.{digits}g}"


#: the quantity of :data:`QUANTITIES` that stands for each of the config's ``primary_quantities`` ("reach", steps to a
#: threshold, has none); it is the config's own quantity where the task's metric (and ``select_by``) is the val loss
_CONFIG_QUANTITIES = {"final": "final_val", "selected": "best_val"}
_VAL_LOSS = ("val_loss", "loss")  # a text task's "loss" is its val_loss (TextLMTask.evaluate)


def _config_quantities(config: ExperimentConfig,
                       tasks: Collection[str] | None = None) -> tuple[tuple[str, ...], list[str]]:
    """The quantities of the config's ``primary_quantities`` (the default of :func:`primary_table` and ``--primary``;
    ``()`` where they have none, which tests ``final_val``, or where the config names no primary contrast) and notes
    where they are not the config's own: with none, that fallback; a primary task (of ``tasks``, default all) whose
    metric or ``select_by`` is not the val loss was named on another quantity."""
    primary = {name for name, _ in config.primary_contrasts()}
    named = [t for t in config.tasks if t.name in primary]
    if not named:  # no primary contrast: no primary table
        return (), []
    # "selected" only where a primary task has select_by: as in compare.py, a task without it has no selected contrast
    # (primary_table leaves such a task's best_val exploratory)
    selected = any(t.select_by for t in named)
    kinds = [k for k in config.primary_quantities if k == "final" or (k == "selected" and selected)]
    measured = named if tasks is None else [t for t in named if t.name in tasks]  # (no rows: no primary cell)
    if not kinds:
        why = "; ".join(w for k, w in (("reach", "reach is steps to a threshold"),
                                        ("selected", "selected needs a primary task with select_by"))
                        if k in config.primary_quantities)
        note = (f"the config's primary_quantities {config.primary_quantities} have no gap quantity ({why}): the "
                "primary contrasts are tested on the final val loss (final_val), which the config did not name; "
                "--primary names the quantities")
        return (), [note] if measured else []
    notes = []
    for t in measured:
        if "final" in kinds and t.metric not in _VAL_LOSS:
            notes.append(f"task {t.name!r}: the config's final quantity is its final {t.metric}; the final val loss "
                         "(final_val) of the primary table is not the same quantity")
        if "selected" in kinds and t.select_by and (t.metric not in _VAL_LOSS or t.select_by not in _VAL_LOSS):
            notes.append(f"task {t.name!r}: the config's selected quantity is its {t.metric} at the best "
                         f"{t.select_by}; the best val loss (best_val) of the primary table is not the same quantity")
    return tuple(_CONFIG_QUANTITIES[k] for k in kinds), notes


def _check_quantities(quantities: tuple[str, ...]) -> None:
    if not quantities or any(q not in QUANTITIES for q in quantities) or len(set(quantities)) != len(quantities):
        unknown = [q for q in quantities if q not in QUANTITIES]
        raise ValueError(f"primary quantities must be distinct names among {', '.join(QUANTITIES)}, "
                         f"got {list(quantities)}{_did_you_mean(unknown[0], list(QUANTITIES)) if unknown else ''}")


def primary_table(config: ExperimentConfig, out_root: str | Path, quantities: tuple[str, ...] | None = None,
                  rows: dict[str, dict[str, dict[int, dict[str, float]]]] | None = None) -> str:
    """The primary contrasts of ``config`` on ``quantities`` (Holm over them), then ``best_val`` as exploratory.

    Each cell compares a primary ``(task, setting)`` with the baseline (the first setting), paired
    over the seeds both finished (:func:`~diffusionformer.experiments.stats.paired_difference`); a named contrast
    without finished runs of its setting or of the baseline (on a task other runs finished) reads n/a and counts as
    ``p = 1`` in Holm's family. Returns ``""`` when the config names no primary contrast or none has finished
    runs. ``rows``: those :func:`gap_rows` already returned (read from ``out_root`` otherwise).

    Args:
        config: the comparison (its ``primary`` names the contrasts).
        out_root: the results root it was run into, or the docs folder it was published to.
        quantities: keys of :data:`QUANTITIES` tested together (Holm over all of their cells); ``None``: those the
            config's ``primary_quantities`` name (``final``: ``final_val``; ``selected``: ``best_val``, on the
            primary tasks with ``select_by``, exploratory on the others; ``final_val`` where none of them has a gap
            quantity, as ``reach``). The legend says which of them the config named before the runs.
        rows: what :func:`gap_rows` returned, if already read.

    Raises:
        ValueError: an unknown quantity (the keys of :data:`QUANTITIES`).
    """
    own = _config_quantities(config)[0]
    by_task = quantities is None  # the config's: best_val only where the task has select_by, as compare tests it
    quantities = (own or ("final_val",)) if quantities is None else quantities
    _check_quantities(quantities)
    primary = config.primary_contrasts()
    rows = gap_rows(config, out_root) if rows is None else rows
    baseline = config.operators[0].name
    named, extra = [], []  # (label, Difference, is primary): the primary cells first, then best_val (exploratory)
    in_cells: set[str] = set()  # the quantities with a primary cell: the header names these only
    for task in config.tasks:
        for setting in config.operators:
            # a named contrast whose setting (or baseline) has no finished run on a task the others measured keeps its
            # cells (n/a, p = 1 in Holm's family, as on the page): dropping it shrank the family named before the runs
            if (task.name, setting.name) not in primary or not rows.get(task.name):
                continue
            row, base = rows[task.name].get(setting.name) or {}, rows[task.name].get(baseline) or {}
            tested = [q for q in quantities if not (by_task and q == "best_val" and not task.select_by)]
            asked = [(q, True) for q in tested] + ([] if "best_val" in tested else [("best_val", False)])
            in_cells.update(tested)
            for q, is_primary in asked:
                d = paired_difference({s: v[q] for s, v in row.items()}, {s: v[q] for s, v in base.items()})
                (named if is_primary else extra).append((f"{_text(task.name)}, {_text(setting.name)}, {QUANTITIES[q]}", d,
                                                          is_primary))
    cells = named + extra
    if not any(d.n for _, d, prim in cells if prim):  # no named contrast has a finished pair: no table
        return ""
    adjusted = iter(holm([d.p for _, d, prim in cells if prim]))
    n_primary = sum(prim for _, _, prim in cells)
    # the quantities the config named are said to be named before the runs; the others (a reach-only config's
    # final_val, those the caller added) are said not to be; a quantity with no primary cell (the config's best_val
    # where no primary task with select_by has rows) is named by neither: its rows are exploratory
    quantities = [q for q in quantities if q in in_cells]
    named_q = [QUANTITIES[q] for q in quantities if q in own]
    other = [QUANTITIES[q] for q in quantities if q not in own]
    lines = [f"### Primary contrasts: {', '.join(QUANTITIES[q] for q in quantities)}", "",
             f"Named in the config before the runs: {', '.join(map(_text, config.primary))} against {_text(baseline)}"
             f"{', on the ' + ' and the '.join(named_q) if named_q else ''}."
             + (f" The config's primary_quantities ({', '.join(config.primary_quantities)}) do not name the "
                f"{' and the '.join(other)}, tested here as primary." if other else "")
             + " Δ: mean of the per-seed differences (setting - "
             f"{_text(baseline)}); 95% CI: its t interval; t and df: the paired t test (df = seeds - 1); p: its two-sided p; "
             f"p Wilcoxon: the exact signed-rank test of the same differences; p Holm: adjusted over the {n_primary} "
             "primary cells. Exploratory rows are not adjusted.", "",
             "| contrast | Δ | 95% CI | t | df | p | p Wilcoxon | p Holm |", "|---|---|---|---|---|---|---|---|"]
    for label, d, prim in cells:
        ci = "n/a" if d.low is None else f"[{d.low:+.4f}, {d.high:+.4f}]"
        lines.append(f"| {'' if prim else '*exploratory:* '}{_cell(label)} | {_g(d.mean, '+.4f')} | {ci} | {_g(d.t, '.2f')} | "
                     f"{_g(d.df, '.0f')} | {_p(d.p)} | {_p(d.p_wilcoxon)} | {_p(next(adjusted)) if prim else ''} |")
    return "\n".join(lines) + "\n"


def gap_curves(config: ExperimentConfig, out_root: str | Path) -> dict[str, dict[str, dict[str, Any]]]:
    """``{task: {setting: {"n": seeds, "val" | "train" | "gap": (steps, mean, std)}}}`` over the finished runs.

    The train and validation loss of the evaluations that measured both, and their gap, at the steps
    every seed of the setting evaluated; mean and (population) standard deviation over seeds, as
    the comparison's other figures. Reads the same logs as :func:`gap_rows`.

    Args:
        config: the comparison.
        out_root: the results root it was run into, or the docs folder it was published to.
    """
    from diffusionformer.experiments.plots import _mean_band

    out = Path(out_root) / config.name
    unfinished = _unfinished(out)
    curves: dict[str, dict[str, dict[str, Any]]] = {}
    for task in config.tasks:
        for setting in config.operators:
            runs = []
            for seed in config.seeds:
                records = _run_records(out, task.name, setting.name, seed, unfinished)
                losses = _eval_losses(records) if records is not None else None
                if losses is not None and losses[0]:
                    runs.append(losses)
            if not runs:
                continue
            entry: dict[str, Any] = {"n": len(runs)}
            for key, series in (("val", [(st, v) for st, _, v in runs]), ("train", [(st, t) for st, t, _ in runs]),
                                ("gap", [(st, [a - b for a, b in zip(v, t)]) for st, t, v in runs])):
                band = _mean_band(series)
                if band is not None:
                    entry[key] = band
            curves.setdefault(task.name, {})[setting.name] = entry
    return curves


def plot_gaps(config: ExperimentConfig, out_root: str | Path, plots: str | Path) -> list[Path]:
    """Write ``<plots>/<task>_gap.png`` per text task: train and validation loss of the evaluation protocol
    (left) and their gap (right) over steps, mean ± std over seeds per setting (:func:`gap_curves`).

    Needs matplotlib (an ImportError naming the extra otherwise).

    Args:
        config: the comparison.
        out_root: the results root it was run into, or the docs folder it was published to.
        plots: the folder to write the figures into (made if missing).

    Returns:
        The paths written, one per task with finished text runs.
    """
    from diffusionformer.experiments.plots import _figure, _save_figure

    _figure()  # fail early (ImportError) without matplotlib
    from matplotlib.lines import Line2D
    plots = Path(plots)
    written: list[Path] = []
    for task, settings in gap_curves(config, out_root).items():
        fig = _figure(figsize=(10, 3.6), layout="constrained")
        ax_loss, ax_gap = fig.subplots(1, 2)
        # the loss panel's legend entries, given to legend() as such: from the labels it leaves out a setting "_base"
        entries: list[tuple[Any, str]] = []
        for i, setting in enumerate(config.operators):
            entry = settings.get(setting.name)
            if entry is None:
                continue
            color, label = f"C{i}", f"{setting.name} (n={entry['n']})"
            for ax, key, style, lab in ((ax_loss, "val", "-", label + ", val"), (ax_loss, "train", "--", label + ", train"),
                                        (ax_gap, "gap", "-", label)):
                if key not in entry:
                    continue
                x, m, sd = entry[key]
                ax.plot(x, m, style, color=color, label=lab)
                ax.fill_between(x, m - sd, m + sd, color=color, alpha=0.15)
                if ax is ax_loss:
                    entries.append((Line2D([], [], linestyle=style, color=color), lab))
        fig.suptitle(task)
        ax_loss.set(xlabel="step", ylabel="loss", title="validation (solid) and train (dashed) loss")
        ax_gap.set(xlabel="step", ylabel="val - train", title="train/validation gap (mean ± std over seeds)")
        if entries:  # (no run logged a step: no legend)
            ax_loss.legend(handles=[h for h, _ in entries], labels=[lab for _, lab in entries], fontsize=7)
        plots.mkdir(parents=True, exist_ok=True)
        path = plots / f"{task}_gap.png"
        _save_figure(fig, path)
        written.append(path)
    return written


def write_gap_section(page: str | Path, table: str) -> Path:
    """Put ``table`` under :data:`GAP_MARKER` at the end of ``page``, replacing an earlier copy; a reading written
    by hand after :data:`~diffusionformer.experiments.publish.READING_MARKER` stays after it."""
    page = Path(page)
    page.parent.mkdir(parents=True, exist_ok=True)  # as plot_gaps makes it for the figures: not only with matplotlib
    text = _read_page(page) if page.is_file() else ""
    head, sep, reading = text.partition(READING_MARKER)
    text = head.split(GAP_MARKER)[0].rstrip() + "\n\n" + GAP_MARKER + "\n\n## Over-fitting: train/validation gap\n\n" + table
    write_text_atomic(page, text.rstrip() + "\n" + (f"\n{sep}{reading}" if sep else ""))  # the reading survives a failed write
    return page


def main(argv: list[str] | None = None) -> int:
    from diffusionformer.experiments.cli import _Parser  # a misspelt option gets a did-you-mean

    p = _Parser(prog="python -m diffusionformer.experiments.gaps", description=__doc__.split("\n")[0])
    p.add_argument("config")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default="results", help="results root the comparison was run into")
    p.add_argument("--page", default=None, help="results page to write the tables into (default: print them)")
    p.add_argument("--primary", default=None, metavar="Q[,Q...]",
                   help=f"quantities of the primary contrasts, Holm-adjusted together (among {', '.join(QUANTITIES)}; "
                        "default: those of the config's primary_quantities, final: final_val, selected: best_val)")
    args = p.parse_args(argv)
    try:
        config = load_experiment_config(args.config, args.overrides)
        quantities = None if args.primary is None else tuple(q.strip() for q in args.primary.split(",") if q.strip())
        if quantities is not None:  # else the config's (_write_tables)
            _check_quantities(quantities)
        for flag in ("out", "page"):  # `--page "$UNSET"` would print instead of writing, `--out ""` read the cwd
            if getattr(args, flag) == "":
                raise ValueError(f"--{flag}: expected a {'folder' if flag == 'out' else 'file'}, got an empty path")
        if args.page and Path(args.page).is_dir():
            raise ValueError(f"--page: expected the results page (a markdown file), got the folder {args.page!r}")
        _refuse_results_twin(args.out, config.name)  # else the tables of the other comparison's runs
    except (ValueError, TypeError, FileNotFoundError, PermissionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return _write_tables(config, args, quantities)
    except (ValueError, NotADirectoryError, FileExistsError, PermissionError) as exc:  # --page below a file, a torn figure
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _write_tables(config: ExperimentConfig, args: argparse.Namespace, quantities: tuple[str, ...] | None) -> int:
    """The tables of :func:`main`, printed or written into ``args.page``; its exit code. ``quantities``: those of
    ``--primary``, ``None`` for the config's (with a note on stderr where they are not the config's own)."""
    try:
        rows = gap_rows(config, args.out)
        table = gap_table(config, args.out, rows)
    except ValueError as exc:  # a corrupt run log: named, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not table:
        print(f"error: no finished runs with train_loss and val_loss under {Path(args.out) / config.name}", file=sys.stderr)
        return 1
    # warned, as summary and analyze do: the tables file those runs' numbers under this config's names (a run --set
    # not repeated here); publish refuses them
    changed = _runs_of_another_train(config, args.out, verb="run `gaps`")
    if changed:
        print(f"warning: gaps: {changed}", file=sys.stderr)
    if quantities is None:  # the config's, which primary_table takes per task
        for note in _config_quantities(config, rows)[1]:
            print(f"note: {note}", file=sys.stderr)
    if args.page:  # the figures beside the page's other files, reduced to a palette like publish's
        figures = []
        try:
            figures = plot_gaps(config, args.out, Path(args.page).parent / config.name / "plots")
        except ImportError as exc:
            print(f"warning: no gap figures: {exc}", file=sys.stderr)
        for png in figures:
            _copy_png(png, png)
            figure = _image(f"{png.stem[:-4]}: train and validation loss and their gap over steps (mean ± std over "
                            "seeds)", f"{config.name}/plots/{png.name}")
            table = table.rstrip() + f"\n\n{figure}\n"
    table = table.rstrip() + "\n\n" + primary_table(config, args.out, quantities, rows)
    if args.page:
        print(f"wrote {write_gap_section(args.page, table)}")
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
