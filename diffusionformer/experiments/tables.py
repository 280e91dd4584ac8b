"""Tables of a comparison: seeds aggregated per (task, operator setting) and written as markdown."""

from __future__ import annotations

import math
import re
import statistics
from typing import Any, Mapping

from diffusionformer.experiments.config import ExperimentConfig, _lower_is_better
from diffusionformer.experiments.results import RunResult
from diffusionformer.experiments.stats import _fmean

__all__ = ["aggregate", "format_status", "format_table"]


def _device_kind(device: Any) -> str | None:
    """The kind of a run's recorded device (``"cuda:0"`` -> ``"cuda"``); ``None`` when not recorded."""
    return device.partition(":")[0] if isinstance(device, str) and device else None


def _gpu_name(run: RunResult) -> str | None:
    """The GPU model a run trained on (its summary's ``device_name``), ``None`` on CPU or when not recorded."""
    name = run.device_name
    return name if isinstance(name, str) and name and _device_kind(run.device) != "cpu" else None


_NOT_RECORDED = "device not recorded"


def _elapsed_by_device(runs: list[RunResult]) -> dict[str, tuple[float, int]] | None:
    """``{device: (total training seconds, number of runs)}`` of the timed ``runs`` when they trained on devices of
    more than one kind, or on GPUs of more than one model (``device_name``: an H100 call's seeds and an H200 call's);
    ``None`` for one kind of one model (or none known). A device is its GPU model where its summary records one,
    else its kind (runs whose device is not recorded under ``"device not recorded"``).

    Examples:
        >>> rs = [RunResult("t", "a", s, "completed", "acc", 0.5, elapsed=e, device=d)
        ...       for s, (e, d) in enumerate([(2.0, "cuda:0"), (6.0, "cpu"), (4.0, "cpu")])]
        >>> _elapsed_by_device(rs), _elapsed_by_device(rs[1:])
        ({'cpu': (10.0, 2), 'cuda': (2.0, 1)}, None)
        >>> gs = [RunResult("t", "a", s, "completed", "acc", 0.5, elapsed=e, device="cuda:0", device_name=g)
        ...       for s, (e, g) in enumerate([(2.0, "NVIDIA H100"), (3.0, "NVIDIA H200"), (4.0, "NVIDIA H100")])]
        >>> _elapsed_by_device(gs), _elapsed_by_device(gs[::2])
        ({'NVIDIA H100': (6.0, 2), 'NVIDIA H200': (3.0, 1)}, None)
    """
    timed = [(_device_kind(r.device), _gpu_name(r), r.elapsed) for r in runs if r.elapsed is not None]
    if (len({kind for kind, _, _ in timed if kind is not None}) < 2
            and len({name for _, name, _ in timed if name is not None}) < 2):
        return None
    out: dict[str, tuple[float, int]] = {}
    labelled = [(name or kind or _NOT_RECORDED, elapsed) for kind, name, elapsed in timed]
    for label, elapsed in sorted(labelled, key=lambda t: (t[0] == _NOT_RECORDED, t[0])):
        total, n = out.get(label, (0.0, 0))
        out[label] = (total + elapsed, n + 1)
    return out


def aggregate(results: list[RunResult]) -> list[dict[str, Any]]:
    """Mean, sample standard deviation and count over seeds per (task, operator).

    A row whose timed runs trained on devices of more than one kind (``summary.json``'s ``device``: a GPU call's
    seeds and CPU seeds), or on GPUs of more than one model (its ``device_name``: an H100 call's seeds and an H200
    call's), has ``elapsed_by_device``, ``{kind or GPU model: mean seconds per run}``: its ``elapsed_mean`` mixes
    them, and the tables say so."""
    rows: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        rows.setdefault((r.task, r.operator), []).append(r)
    table = []
    for (task, op), rs in rows.items():
        vals = [r.value for r in rs if r.value is not None and math.isfinite(r.value)]
        table.append({
            "task": task,
            "operator": op,
            "metric": rs[0].metric,
            "mean": _fmean(vals) if vals else None,
            "std": statistics.stdev(vals) if len(vals) > 1 else None,  # one value has no sample std
            "n": len(vals),
            "failed": sum(1 for r in rs if r.status != "completed"),
            # completed runs whose metric is NaN or inf: out of the mean and the pairing, and said so
            "non_finite": sum(1 for r in rs if r.status == "completed" and r.value is not None
                              and not math.isfinite(r.value)),
            "values": vals,
            "seeds": [r.seed for r in rs if r.value is not None and math.isfinite(r.value)],
            "by_seed": {r.seed: r.value for r in rs if r.value is not None and math.isfinite(r.value)},
            "num_parameters": next((r.num_parameters for r in rs if r.num_parameters is not None), None),
            "elapsed_mean": (_fmean([r.elapsed for r in rs if r.elapsed is not None])
                             if any(r.elapsed is not None for r in rs) else None),
        })
        chosen = [r for r in rs if r.selected_value is not None and math.isfinite(r.selected_value)]
        if chosen:
            selected = [r.selected_value for r in chosen]
            table[-1].update(selected_mean=_fmean(selected), selected_std=statistics.stdev(selected) if len(selected) > 1 else None,
                             selected_values=selected, selected_steps=[r.selected_step for r in chosen],
                             selected_by_seed={r.seed: r.selected_value for r in chosen})
        # per completed run (None: never reached, or the task has no `reach`); read only for tasks with `reach`
        table[-1]["reach_steps"] = [r.reach_step for r in rs if r.status == "completed"]
        table[-1]["reach_by_seed"] = {r.seed: r.reach_step for r in rs if r.status == "completed"}
        totals = _elapsed_by_device(rs)
        if totals is not None:  # only then: a row of one device kind is written as before
            table[-1]["elapsed_by_device"] = {k: total / n for k, (total, n) in totals.items()}
    return table


def _cell(text: str) -> str:
    r"""``text`` as one cell of a markdown table: a ``|`` (allowed in task and setting names) escaped as ``\|``,
    which would otherwise end the cell and shift every later number under the next column's head.

    Examples:
        >>> _cell("heads|half")
        'heads\\|half'
    """
    return text.replace("|", "\\|")


#: markdown that a name could hold: emphasis (``*``; a ``_`` not between two letters or digits), a code span, raw HTML
#: or an entity (``<``, ``&``), a link (``[``, ``]``), strikethrough (``~``)
_MARKUP = re.compile(r"[*`<>&\[\]~]|(?<![^\W_])_|_(?![^\W_])")


def _text(name: str) -> str:
    r"""A task, setting or comparison name as literal markdown text: the characters markdown reads as syntax
    backslash-escaped, so that a setting ``__lap__`` is not shown as a bold ``lap`` (nor ``dig<b>its`` as HTML).

    Examples:
        >>> _text("__lap__"), _text("lap_half")
        ('\\_\\_lap\\_\\_', 'lap_half')
    """
    return _MARKUP.sub(lambda m: "\\" + m.group(0), name)


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _time_cell(row: Mapping[str, Any]) -> str:
    """The mean training seconds per run of ``row``; where its runs trained on devices of more than one kind or GPUs of
    more than one model, the mean per kind (per GPU model where recorded) after it (the mean over all of them mixes,
    say, a GPU's seeds with a CPU's, or an H100's with an H200's).

    Examples:
        >>> _time_cell({"elapsed_mean": 4.0})
        '4.0'
        >>> _time_cell({"elapsed_mean": 4.0, "elapsed_by_device": {"cpu": 6.0, "cuda": 2.0}})
        '4.0 (mixed devices: cpu 6.0, cuda 2.0)'
    """
    cell = _fmt(row["elapsed_mean"], 1)
    by_device = row.get("elapsed_by_device")
    if by_device:
        cell += " (mixed devices: " + ", ".join(f"{_text(k)} {v:.1f}" for k, v in by_device.items()) + ")"
    return cell


def _reach_steps_cell(row: Mapping[str, Any]) -> str:
    """``"mean ± std (k of n)"`` of the steps to the threshold over the runs that reached it."""
    steps = row.get("reach_steps") or []
    hit = [s for s in steps if s is not None]
    if not hit:
        return f"never (0 of {len(steps)})" if steps else "never"
    spread = f" ± {statistics.stdev(hit):.0f}" if len(hit) > 1 else ""
    return f"{statistics.fmean(hit):.0f}{spread} ({len(hit)} of {len(steps)})"


def _pairs_note(c: Any, row: Mapping[str, Any], rows: list[dict[str, Any]], baseline: str, by_seed: str = "by_seed") -> str:
    """``" (k paired)"`` when the contrast of ``row`` pairs fewer seeds than it or the baseline has (a seed missing,
    failed or non-finite on one side): its Δ, df and p are over those ``k`` common seeds, not the ``n`` shown.
    ``by_seed``: the row's values per seed of the contrast's kind (``selected_by_seed``, ``reach_by_seed``); in their
    tables a contrast with no pairs at all (censored steps, no selected value) is not noted: its cells say n/a."""
    if c is None or c.diff.n is None or (not c.diff.n and by_seed != "by_seed"):
        return ""
    base = next((b for b in rows if b["operator"] == baseline), {})
    have = max(len(row.get(by_seed) or {}), len(base.get(by_seed) or {}))
    return f" ({c.diff.n} paired with {_text(baseline)})" if c.diff.n < have else ""


def _contrast_cells(c: Any, digits: int, compact: bool) -> list[str]:
    """``Δ | 95% CI | [df |] p | [p Wilcoxon |] p Holm`` of a contrast (p Holm bold below 0.05)."""
    from diffusionformer.experiments.compare import format_ci, format_p, format_signed

    d = c.diff
    holm_p = format_p(c.p_holm)
    if c.p_holm is not None and c.p_holm < 0.05:
        holm_p = f"**{holm_p}**"
    cells = [format_signed(d.mean, digits), format_ci(d, digits)]
    if not compact:
        cells.append("n/a" if d.df is None else f"{d.df:g}")
    cells.append(format_p(d.p))
    if not compact:
        cells.append(format_p(d.p_wilcoxon))
    return cells + [holm_p]


def format_table(table: list[dict[str, Any]], config: ExperimentConfig, *, compact: bool = False) -> str:
    """A markdown table per task: mean ± std over seeds and the paired difference to the baseline.

    Each setting is compared with the config's first setting over the seeds both have
    (:mod:`~diffusionformer.experiments.compare`): Δ with its 95% confidence interval, the
    paired t test's degrees of freedom and p, the Wilcoxon signed-rank p and the p adjusted by
    Holm's method over the page's comparisons (Nadeau-Bengio corrected for k-fold tasks). Tasks
    with ``select_by`` add a table of the metric at each run's best evaluation of that key;
    tasks with ``reach`` a table of the steps to the threshold (mean over the runs that reached
    it; compared only where every run of both settings did). With a ``primary`` list, a role
    column marks primary and exploratory contrasts.

    Args:
        table: the output of :func:`aggregate`.
        config: the comparison.
        compact: the short form printed by ``run``: final metric only; Δ, CI, p and Holm p.
    """
    from diffusionformer.experiments.compare import contrasts, table_legend

    found = {(c.task, c.setting, c.kind): c for c in contrasts(table, config)}
    lines = []
    baseline = config.operators[0].name
    role = bool(config.primary)
    stat_heads = (["Δ vs " + _text(baseline), "95% CI"] + ([] if compact else ["df"]) + ["p"]
                  + ([] if compact else ["p Wilcoxon"]) + ["p Holm"])
    stat_heads += ["role"] if role else []
    if len(config.operators) == 1:  # nothing to compare
        stat_heads = []

    def stat_cells(task: str, op: str, kind: str, digits: int) -> list[str]:
        c = found.get((task, op, kind))
        if c is None:
            return [""] * len(stat_heads)
        return _contrast_cells(c, digits, compact) + ([c.role] if role else [])

    def header(cols: list[str]) -> list[str]:
        return ["| " + " | ".join(map(_cell, cols)) + " |", "|" + "---|" * len(cols)]

    for task in config.tasks:
        rows = [r for r in table if r["task"] == task.name]
        if not rows:
            continue
        arrow = "lower is better" if task.minimize else "higher is better"
        lines.append(f"### {_text(task.name)} ({_text(task.dataset)}, {_text(task.model)}): {_text(task.metric)}, {arrow}")
        lines.append("")
        if task.folds is not None:
            lines.append(f"{task.folds}-fold cross-validation: seed s tests on fold s % {task.folds}; the spread is over "
                         f"folds and the comparison is paired over folds with the Nadeau-Bengio correction.")
            lines.append("")
        lines += header(["operator", f"{task.metric} mean ± std", *stat_heads, "seeds", "params", "time/run (s)"])
        for r in rows:
            failed = f" ({r['failed']} failed)" if r["failed"] else ""
            failed += f" ({r['non_finite']} non-finite)" if r.get("non_finite") else ""
            failed += _pairs_note(found.get((task.name, r["operator"], "final")), r, rows, baseline)
            cells = [_text(r["operator"]), f"{_fmt(r['mean'])} ± {_fmt(r['std'])}", *stat_cells(task.name, r["operator"], "final", 4),
                     f"{r['n']}{failed}", str(r["num_parameters"] or "n/a"), _time_cell(r)]
            lines.append("| " + " | ".join(map(_cell, cells)) + " |")
        lines.append("")
        if compact:
            continue
        if task.select_by is not None and any("selected_mean" in r for r in rows):
            lines += [f"#### {_text(task.name)}: {_text(task.metric)} at best {_text(task.select_by)}", ""]
            lines += header(["operator", f"{task.metric} mean ± std", *stat_heads])
            for r in rows:
                sel = f"{_fmt(r['selected_mean'])} ± {_fmt(r['selected_std'])}" if "selected_mean" in r else "n/a"
                sel += _pairs_note(found.get((task.name, r["operator"], "selected")), r, rows, baseline, "selected_by_seed")
                cells = [_text(r["operator"]), sel, *stat_cells(task.name, r["operator"], "selected", 4)]
                lines.append("| " + " | ".join(map(_cell, cells)) + " |")
            lines.append("")
        if task.reach is not None:
            (rkey, rval), = task.reach.items()
            lines += [f"#### {_text(task.name)}: steps to {_text(rkey)} {'≤' if _lower_is_better(rkey) else '≥'} {rval:g}", ""]
            lines += header(["operator", "steps mean ± std (runs that reached it)", *stat_heads])
            for r in rows:
                steps = _reach_steps_cell(r) + _pairs_note(found.get((task.name, r["operator"], "reach")), r, rows, baseline,
                                                           "reach_by_seed")
                cells = [_text(r["operator"]), steps, *stat_cells(task.name, r["operator"], "reach", 0)]
                lines.append("| " + " | ".join(map(_cell, cells)) + " |")
            lines.append("")
    if lines and stat_heads:
        lines.append(table_legend(config, compact=compact))
        lines.append("")
    return "\n".join(lines)


def format_status(rows: list[dict[str, Any]]) -> str:
    """A markdown table per task of :func:`run_status` rows, and an estimate of the training time left.

    The estimate scales the mean training time of a task's completed runs by the steps each
    unfinished run still has to do (one worker; divide by the number of workers), or where a task has no completed
    run yet, the time per step its running runs logged so far (the line says so); an interrupted run
    counts from the step its checkpoint resumes from, which its state names when the log went further (and a
    checkpoint of a step beyond ``max_steps``, which ``run`` fails instead of resuming from it). Runs made
    with another config (``changed``) are counted on a line of their own that says how to read or redo them; runs
    held by locks of other hosts on a line that names their locks and when to remove them (a node that failed).

    Args:
        rows: the output of :func:`run_status`.
    """
    lines, left_total, unknown, paced = [], 0.0, 0, False
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    done = sum(r["state"] == "completed" and not r.get("changed") for r in rows)
    lines.append(f"{done} of {len(rows)} runs completed")
    for task in tasks:
        rs = [r for r in rows if r["task"] == task]
        finished = [r for r in rs if r["state"] == "completed" and r["elapsed"]]  # timed, changed or not
        per_step = (statistics.fmean(r["elapsed"] / max(r["step"], 1) for r in finished)) if finished else None
        # none finished (the first run of a comparison): the pace the running runs logged, else "0 min left"
        going = [r for r in rs if r["state"] == "running" and r["step"] and r["elapsed"]]
        if per_step is None and going:
            per_step, paced = statistics.fmean(r["elapsed"] / r["step"] for r in going), True
        lines += ["", f"### {task}", "", "| operator | seed | state | step | training time (s) |", "|---|---|---|---|---|"]
        for r in rs:
            steps = f"{r['step']} / {r['max_steps']}" if r["max_steps"] else str(r["step"])
            state = r["state"] + (f" ({r['holder']})" if r["holder"] else "")
            resumes = r.get("resumes_from", r["step"])  # a row from before run_status named it: no note
            if r["state"] == "interrupted" and resumes is not None and r["max_steps"] and resumes > r["max_steps"]:
                # a longer run's checkpoint (its run_config.json lost): `run` fails the run, not resumes it
                state += f" (its checkpoint is of step {resumes}, beyond max_steps: `run` fails it)"
            elif r["state"] == "interrupted" and resumes != r["step"]:
                state += (" (its checkpoint is unreadable)" if resumes is None
                          else f" (resumes from step {resumes})")
            if r.get("changed"):  # `run` refuses it: its definition is not the config's any more
                state += f", made with another {r['changed']}: `run --restart` redoes it"
            lines.append(f"| {_cell(r['operator'])} | {r['seed']} | {_cell(state)} | {steps} | {_fmt(r['elapsed'], 0)} |")
            if r["state"] != "completed" or r.get("changed"):
                if per_step is None or not r["max_steps"]:
                    unknown += 1
                else:
                    done_steps = r["step"] if resumes is None else resumes  # an unreadable checkpoint: as logged
                    left_total += per_step * (r["max_steps"] if r.get("changed") else max(r["max_steps"] - done_steps, 0))
    # seconds of training (a tiny config's runs to redo) are not "about 0 min": that read as nothing left to do
    # (30 s too: :.0f rounds 0.5 min to the even 0)
    left = (("less than a minute" if 0 < left_total <= 30 else f"about {left_total / 60:.0f} min")
            + " of training left on one worker")
    if paced:
        left += " (tasks with no finished run: at the pace their running runs logged so far)"
    if unknown:
        left += f" (plus {unknown} run(s) of tasks with no finished run to time)"
    lines[0] += f"; {left}."
    # a lock of another host holds for ever when its node failed (never taken over: a slow node would train it twice)
    foreign = [r for r in rows if r["state"] == "running" and r.get("other_host") is True]
    if foreign:
        locks = ", ".join(f"runs/{r['task']}/{r['operator']}/seed{r['seed']}/.lock" for r in foreign[:5])
        lines.append("")
        lines.append(f"{len(foreign)} run(s) are held by locks of other hosts, whose processes cannot be checked from "
                     "here (each row gives the run's last sign of life): if such a host no longer trains its run (a "
                     "failed node, a job killed without clean-up, a host renamed, a node given a new machine id at a "
                     f"reboot), remove that run's lock in the comparison's folder ({locks}"
                     f"{' ...' if len(foreign) > 5 else ''}) and `run` resumes it from its checkpoint; never while "
                     "that host may still train it (it would be trained twice).")
    changed = sum(bool(r.get("changed")) for r in rows)
    if changed:  # most often the --set of `run` not repeated here: the per-run cells name `run --restart` alone
        lines.insert(1, f"{changed} run(s) were made with another config than this one (below): if they were run "
                        "with --set overrides or --import, give status the same ones; else `run --restart` trains "
                        "them again.")
    return "\n".join(lines) + "\n"
