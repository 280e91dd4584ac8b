"""Run a comparison: every operator setting x every task x every seed, resumable.

Layout of ``<out>/<name>/``::

    manifest.json                 resolved config, command, machine, versions
    runs/<task>/<operator>/seed<k>/{metrics.jsonl, summary.json, checkpoint.pt, run_config.json}
    results.json                  one row per run (final metrics, parameters, wall time)
    results.md                    mean ± std over seeds per task and operator setting
    plots/<task>_curves.png       training loss and headline metric over steps
    plots/<task>_final.png        final headline metric per operator (seeds as dots)

A finished run (its ``summary.json`` says completed) is never trained again; an interrupted
one continues from its last checkpoint, bit-identically. A run being trained holds
``<run>/.lock`` (process id and host): a second ``run`` of the same config on the same
results folder skips the runs another live process holds, so two workers can share a
comparison (``tasks=`` / ``--tasks`` splits it by task). ``results.json`` always lists every
finished run of the config found on disk, whichever process trained it. ``run_config.json`` records what
defines a run (data, resolved model config, training budget): reusing a task or operator
name with a changed definition is refused instead of silently mixing old and new results.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from diffusionformer.data import load_dataset
from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig, train_config
from diffusionformer.experiments.stats import difference_t, paired_t, welch_t  # re-exported: their home is stats
from diffusionformer.experiments.store import LOCK_NAME
from diffusionformer.experiments.store import _pid_alive as _pid_alive  # noqa: F401  (back-compat)
from diffusionformer.experiments.store import acquire_lock as _acquire_lock
from diffusionformer.experiments.store import live_holder as _live_holder
from diffusionformer.experiments.store import read_lock as _read_lock  # noqa: F401  (back-compat)
from diffusionformer.experiments.store import release_lock as _release_lock
from diffusionformer.experiments.tasks import as_metrics, build_task, model_overrides_for_data
from diffusionformer.models import create_model, get_preset, model_config
from diffusionformer.train import NonFiniteLossError, Trainer, read_metrics, seed_everything
from diffusionformer.train.metrics import write_json_atomic

__all__ = ["RunResult", "aggregate", "build_model", "finished_runs", "format_status", "format_table", "run_dir",
           "difference_t", "first_reach", "git_commit", "paired_t", "read_curves", "run_experiment", "run_status", "select_evaluation",
           "task_data", "welch_t"]


@dataclass
class RunResult:
    """One run (task, operator setting, seed) as the runner reports it.

    ``value`` is the task's metric at the end of training; ``selected_value`` is the same
    metric at the evaluation picked by the task's ``select_by`` (early stopping on the
    validation split), which is what the published tables report when a task has one.
    ``reach_step`` is the first evaluated step at which the task's ``reach`` threshold was met.
    ``learned`` holds the learned diffusion parameters per layer (diffusion times,
    polynomial coefficients, teleport probabilities) at the end of training.
    """

    task: str
    operator: str
    seed: int
    status: str  #: "completed" or "failed: <reason>"
    metric: str
    value: float | None
    final: dict[str, float] = field(default_factory=dict)
    num_parameters: int | None = None
    elapsed: float | None = None
    learned: dict[str, list[float]] = field(default_factory=dict)
    #: the task's metric at the evaluation picked by ``select_by`` (None without one)
    selected_value: float | None = None
    selected_step: int | None = None
    #: the first evaluated step at which the task's ``reach`` key met its threshold (None if never)
    reach_step: int | None = None


def run_dir(out: Path, task: str, operator: str, seed: int) -> Path:
    return out / "runs" / task / operator / f"seed{seed}"


def task_data(task: TaskConfig, seed: int, data_root: str | None, cache: dict[int | None, Any]) -> Any:
    """The dataset of ``task``'s run with ``seed``: loaded once per fold (once without folds) into ``cache``."""
    fold = task.fold_of(seed)
    if fold not in cache:
        cache[fold] = load_dataset(task.dataset, root=data_root, seed=task.data_seed, **task.dataset_kwargs(seed))
    return cache[fold]


def build_model(task: TaskConfig, setting: OperatorSetting, data: Any) -> torch.nn.Module:
    """The model of one run: preset + data-derived sizes + task overrides + the operator setting."""
    preset = get_preset(task.model)
    overrides = {**model_overrides_for_data(data, preset.config_cls), **task.model_overrides}
    resolved = model_config(task.model, **overrides)
    heads = getattr(resolved, "num_heads", getattr(resolved, "n_head", 0))
    if heads:
        overrides.update(setting.overrides(int(heads)))
    elif setting.heads is not None or setting.laplacian_heads is not None:
        raise ValueError(f"operator setting {setting.name!r} sets heads but model {task.model!r} has no attention heads")
    else:
        overrides.update(setting.model_overrides)
    return create_model(task.model, **overrides)


def _learned(model: torch.nn.Module) -> dict[str, list[float]]:
    from diffusionformer.models import learned_operator_parameters

    out = {}
    for name, p in learned_operator_parameters(model).items():
        out[name] = [float(x) for x in p.detach().flatten().tolist()]
    return out


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def run_experiment(
    config: ExperimentConfig,
    out_root: str | Path = "results",
    *,
    data_root: str | None = None,
    resume: bool = True,
    progress: bool = True,
    device: str | None = None,
    tasks: Sequence[str] | None = None,
    log: Callable[[str], None] = print,
) -> list[RunResult]:
    """Train every run of ``config`` (skipping finished ones) and write the aggregated results.

    Args:
        config: the validated experiment.
        out_root: results go to ``<out_root>/<config.name>/``.
        data_root: data root for datasets that need one (else ``$DIFFUSIONFORMER_DATA``).
        resume: continue interrupted runs and skip finished ones (``False``: start every run afresh).
        progress: show progress bars.
        device: override every task's ``train.device`` (default: ``config.device`` when set);
            checked first (:func:`~diffusionformer.experiments.gpu.check_device`).
        tasks: train only the tasks of these names (default: all); finished runs of the
            other tasks still appear in the results.
        log: where messages go.

    Returns:
        One :class:`RunResult` per run trained or found finished, in config order (runs held
        by another process and not yet finished are left out).

    Raises:
        ValueError: before anything is written or trained, listing every run that would fail
            to start (:func:`~diffusionformer.experiments.validate.check_experiment`: dataset,
            model and heads, metric keys, training budget).
    """
    out = Path(out_root) / config.name
    chosen = _choose_tasks(config, tasks)
    from diffusionformer.experiments.validate import check_experiment

    check_experiment(config, data_root=data_root, tasks=[t.name for t in chosen])  # every run resolves, or nothing starts
    device = device if device is not None else config.device
    if device is not None:
        from diffusionformer.experiments.gpu import check_device

        check_device(device)
    dist_ctx = _maybe_init_distributed(device)
    if _is_main():
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "manifest.json", _manifest(config))
    runs = [(t, o, s) for t in chosen for o in config.operators for s in config.seeds]
    results: list[RunResult] = []
    bar = tqdm(total=len(runs), desc=config.name, unit="run", disable=not (progress and _is_main()), dynamic_ncols=True)
    try:
        for task in chosen:
            loaded: dict[int | None, Any] = {}
            for setting in config.operators:
                for seed in config.seeds:
                    data = task_data(task, seed, data_root, loaded)
                    bar.set_postfix_str(f"{task.name} / {setting.name} / seed {seed}")
                    done_before = resume and _completed(run_dir(out, task.name, setting.name, seed))
                    result = _one_run(out, task, setting, seed, data, resume, progress, device, log)
                    if result is not None:
                        results.append(result)
                    bar.update(1)
                    if _is_main() and result is not None and not done_before:  # tables and plots after each new run
                        _write_outputs(out, config, finished_runs(out, config, results))
        if _is_main():
            _write_outputs(out, config, finished_runs(out, config, results))
    finally:
        bar.close()
        if dist_ctx is not None:
            dist_ctx.shutdown()
    return finished_runs(out, config, results)


def _choose_tasks(config: ExperimentConfig, names: Sequence[str] | None) -> list[TaskConfig]:
    if names is None:
        return list(config.tasks)
    known = [t.name for t in config.tasks]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"unknown task(s) {unknown or names!r} for {config.name!r}; its tasks are {known}")
    return [t for t in config.tasks if t.name in set(names)]


def finished_runs(out: str | Path, config: ExperimentConfig, results: Sequence[RunResult] = ()) -> list[RunResult]:
    """Every run of ``config`` in config order: those in ``results``, else the finished ones on disk.

    A run is finished on disk when its ``summary.json`` says completed; runs neither in
    ``results`` nor finished are left out.

    Args:
        out: the comparison's folder (``<out_root>/<config.name>``).
        config: the comparison.
        results: runs already in memory (they take precedence over the files).
    """
    out = Path(out)
    have = {(r.task, r.operator, r.seed): r for r in results}
    merged = []
    for task in config.tasks:
        for setting in config.operators:
            for seed in config.seeds:
                r = have.get((task.name, setting.name, seed))
                if r is None:
                    rdir = run_dir(out, task.name, setting.name, seed)
                    summary = _read_summary(rdir)
                    if summary is not None and summary.get("status") == "completed":
                        r = _result_from_files(task, setting, seed, rdir, summary)
                if r is not None:
                    merged.append(r)
    return merged


def _completed(rdir: Path) -> bool:
    summary = _read_summary(rdir)
    return summary is not None and summary.get("status") == "completed"


def _read_summary(rdir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((rdir / "summary.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def run_status(config: ExperimentConfig, out_root: str | Path) -> list[dict[str, Any]]:
    """Where every run of ``config`` stands, without loading any model or data.

    One row per run in config order: ``task``, ``operator``, ``seed``, ``state`` (``"completed"``,
    ``"failed"``, ``"running"`` (a live process holds its lock), ``"interrupted"`` (started, not
    finished, nobody training it) or ``"missing"``), ``step`` (updates logged so far),
    ``max_steps``, ``elapsed`` (training seconds so far) and ``holder`` (the lock's process).

    Args:
        config: the comparison.
        out_root: the results root given to ``run`` (``--out``).
    """
    out = Path(out_root) / config.name
    rows = []
    for task in config.tasks:
        max_steps = train_config(task, config.seeds[0]).max_steps  # the task's budget, defaults resolved
        for setting in config.operators:
            for seed in config.seeds:
                rdir = run_dir(out, task.name, setting.name, seed)
                summary = _read_summary(rdir)
                row: dict[str, Any] = {"task": task.name, "operator": setting.name, "seed": seed, "max_steps": max_steps,
                                       "step": 0, "elapsed": None, "holder": None}
                if summary is not None and summary.get("status") == "completed":
                    row.update(state="completed", step=summary.get("step", max_steps), elapsed=summary.get("elapsed"))
                elif not rdir.is_dir():
                    row["state"] = "missing"
                else:
                    records = read_curves(rdir)
                    if records:
                        row.update(step=int(records[-1].get("step", 0)), elapsed=records[-1].get("elapsed"))
                    holder = _live_holder(rdir)
                    row["holder"] = None if holder is None else f"pid {holder[0]} on {holder[1]}"
                    if holder is not None:
                        row["state"] = "running"
                    elif summary is not None and str(summary.get("status", "")).startswith("failed"):
                        row["state"] = "failed"
                    else:
                        row["state"] = "interrupted" if (records or (rdir / "checkpoint.pt").is_file()) else "missing"
                rows.append(row)
    return rows


def format_status(rows: list[dict[str, Any]]) -> str:
    """A markdown table per task of :func:`run_status` rows, and an estimate of the training time left.

    The estimate scales the mean training time of a task's completed runs by the steps each
    unfinished run still has to do (one worker; divide by the number of workers).

    Args:
        rows: the output of :func:`run_status`.
    """
    lines, left_total, unknown = [], 0.0, 0
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    done = sum(r["state"] == "completed" for r in rows)
    lines.append(f"{done} of {len(rows)} runs completed")
    for task in tasks:
        rs = [r for r in rows if r["task"] == task]
        finished = [r for r in rs if r["state"] == "completed" and r["elapsed"]]
        per_step = (statistics.fmean(r["elapsed"] / max(r["step"], 1) for r in finished)) if finished else None
        lines += ["", f"### {task}", "", "| operator | seed | state | step | training time (s) |", "|---|---|---|---|---|"]
        for r in rs:
            steps = f"{r['step']} / {r['max_steps']}" if r["max_steps"] else str(r["step"])
            state = r["state"] + (f" ({r['holder']})" if r["holder"] else "")
            lines.append(f"| {r['operator']} | {r['seed']} | {state} | {steps} | {_fmt(r['elapsed'], 0)} |")
            if r["state"] != "completed":
                if per_step is None or not r["max_steps"]:
                    unknown += 1
                else:
                    left_total += per_step * max(r["max_steps"] - r["step"], 0)
    left = f"about {left_total / 60:.0f} min of training left on one worker"
    if unknown:
        left += f" (plus {unknown} run(s) of tasks with no finished run to time)"
    lines[0] += f"; {left}."
    return "\n".join(lines) + "\n"


def _maybe_init_distributed(device: str | None) -> Any:
    """Join the torchrun process group once for all runs (the trainer then reuses it)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    from diffusionformer.train import init_distributed

    return init_distributed(device or "auto")


RUN_CONFIG_NAME = "run_config.json"


# Fields added to the configs after runs were published, with their defaults: at the default they
# stay out of a run's identity (so earlier runs resume), set to anything else they are part of it.
_NEW_MODEL_FIELDS: dict[str, Any] = {"rope": False, "rope_base": (100.0, 10000.0), "n_kv_head": None,
                                     "zero_init_proj": False, "edge_dim": None, "pe": None, "pe_dim": 8,
                                     "pe_sign_flip": True}
_NEW_TRAIN_FIELDS: dict[str, Any] = {"grad_accum_steps": 1, "weight_decay_rule": "default", "loggers": ("jsonl",)}


def _without_new_defaults(d: dict[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``d`` without the keys of ``new`` whose value is the default listed there (a tuple: any of them)."""
    def at_default(key: str, value: Any) -> bool:
        default = new[key]
        if isinstance(default, tuple) and key != "loggers":
            return value in default
        return (list(value) if isinstance(value, (list, tuple)) else value) == (
            list(default) if isinstance(default, tuple) else default)
    return {k: v for k, v in d.items() if not (k in new and at_default(k, v))}


def _run_identity(task: TaskConfig, model: torch.nn.Module, train: Any) -> dict[str, Any]:
    """What makes two runs the same run: data, resolved model config, training budget."""
    import dataclasses

    model_cfg = getattr(model, "config", None)
    model_dict = dataclasses.asdict(model_cfg) if dataclasses.is_dataclass(model_cfg) else None
    identity: dict[str, Any] = {
        "dataset": task.dataset,
        "dataset_options": task.dataset_options,
        "data_seed": task.data_seed,
        "model": task.model,
        # a field added after runs were published joins the identity only when set, so earlier runs keep resuming
        "model_config": None if model_dict is None else _without_new_defaults(model_dict, _NEW_MODEL_FIELDS),
        "train": _without_new_defaults({k: v for k, v in train.to_dict().items() if k not in ("progress", "device")},
                                       _NEW_TRAIN_FIELDS),
    }
    if task.augment:  # only when set, so earlier runs keep their identity
        identity["augment"] = task.augment
    if task.label_smoothing:
        identity["label_smoothing"] = task.label_smoothing
    if task.folds is not None:  # only then, so runs made before folds existed keep their identity
        identity["folds"] = task.folds
        identity["fold"] = task.fold_of(train.seed)
    return json.loads(json.dumps(identity, default=str))


def _check_identity(rdir: Path, identity: dict[str, Any], task: TaskConfig, setting: OperatorSetting) -> None:
    path = rdir / RUN_CONFIG_NAME
    if not path.is_file():
        return
    stored = json.loads(path.read_text())
    if stored != identity:
        changed = sorted(k for k in set(stored) | set(identity) if stored.get(k) != identity.get(k))
        raise ValueError(
            f"{rdir} holds a run of task {task.name!r} / setting {setting.name!r} made with a different "
            f"{', '.join(changed)}; rename the task or operator setting, or pass --restart to discard it"
        )


def _one_run(out: Path, task: TaskConfig, setting: OperatorSetting, seed: int, data: Any, resume: bool,
             progress: bool, device: str | None, log: Callable[[str], None]) -> RunResult | None:
    """Train (or resume, or read back) one run; ``None`` when another live process holds it."""
    rdir = run_dir(out, task.name, setting.name, seed)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if not distributed:
        holder = _acquire_lock(rdir)
        if holder is not None:
            log(f"[{task.name} / {setting.name} / seed {seed}] skipped: {holder} is training it ({rdir / LOCK_NAME}).")
            return None
    try:
        return _train_one(rdir, task, setting, seed, data, resume, progress, device, log)
    finally:
        if not distributed:
            _release_lock(rdir)


def _train_one(rdir: Path, task: TaskConfig, setting: OperatorSetting, seed: int, data: Any, resume: bool,
               progress: bool, device: str | None, log: Callable[[str], None]) -> RunResult:
    summary_path = rdir / "summary.json"
    extra = {"progress": progress and _is_main()}
    if device is not None:
        extra["device"] = device
    cfg = train_config(task, seed, **extra)
    seed_everything(seed)
    model = build_model(task, setting, data)
    identity = _run_identity(task, model, cfg)
    if resume:
        _check_identity(rdir, identity, task, setting)
    if resume and summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        if summary.get("status") == "completed":
            return _result_from_files(task, setting, seed, rdir, summary)
    if not resume and rdir.exists() and _is_main():
        import shutil

        for entry in rdir.iterdir():  # everything but this process's lock
            if not entry.name.startswith(LOCK_NAME):  # nor other workers' lock claims in flight
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    if _is_main():
        rdir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(rdir / RUN_CONFIG_NAME, identity)
    adapter = build_task(data, model, eval_batch_size=task.eval_batch_size, augment=task.augment,
                         label_smoothing=task.label_smoothing)
    trainer = Trainer(model, adapter, cfg, rdir, resume=True)
    try:
        summary = trainer.fit()
    except NonFiniteLossError as exc:
        log(f"[{task.name} / {setting.name} / seed {seed}] stopped: {exc}. The last good checkpoint is kept in {rdir}.")
        return RunResult(task.name, setting.name, seed, f"failed: {exc}", task.metric, None)
    if _is_main():
        learned = _learned(model)
        if learned:
            write_json_atomic(rdir / "learned_operators.json", learned)
    return _result_from_files(task, setting, seed, rdir, summary)


def _result_from_files(task: TaskConfig, setting: OperatorSetting, seed: int, rdir: Path, summary: dict[str, Any]) -> RunResult:
    final = as_metrics(summary.get("eval"))
    value = final.get(task.metric)
    if value is None and summary.get("eval"):
        raise ValueError(f"task {task.name!r}: metric {task.metric!r} is not among the evaluation keys {sorted(final)}")
    learned_path = rdir / "learned_operators.json"
    learned = json.loads(learned_path.read_text()) if learned_path.is_file() else {}
    curves = read_curves(rdir) if task.select_by or task.reach else []
    selected_value, selected_step = select_evaluation(curves, task) if task.select_by else (None, None)
    return RunResult(task.name, setting.name, seed, "completed", task.metric, value, final,
                     summary.get("num_parameters"), summary.get("elapsed"), learned, selected_value, selected_step,
                     first_reach(curves, task) if task.reach else None)


def select_evaluation(records: list[dict[str, Any]], task: TaskConfig) -> tuple[float | None, int | None]:
    """``(metric, step)`` of the evaluation with the best ``task.select_by`` (the earliest among ties).

    ``select_by`` is maximised unless its name ends in ``loss``. ``(None, None)`` when no
    evaluation has both keys.

    Examples:
        >>> t = TaskConfig("t", "digits", "vit-digits", select_by="val_acc")
        >>> evals = [{"split": "eval", "step": s, "metrics": {"val_acc": a, "test_acc": b}}
        ...          for s, a, b in [(10, 0.7, 0.60), (20, 0.8, 0.65), (30, 0.8, 0.70), (40, 0.75, 0.72)]]
        >>> select_evaluation(evals, t)
        (0.65, 20)
    """
    if not task.select_by:
        raise ValueError(f"task {task.name!r} has no select_by key")
    key, sign = task.select_by, (-1.0 if task.select_by.endswith("loss") else 1.0)
    best: tuple[float, int, float] | None = None
    for r in records:
        m = as_metrics(r) if r.get("split") == "eval" else {}
        if key in m and task.metric in m and math.isfinite(m[key]):
            score = sign * m[key]
            if best is None or score > best[0]:
                best = (score, int(r["step"]), float(m[task.metric]))
    return (None, None) if best is None else (best[2], best[1])


def first_reach(records: list[dict[str, Any]], task: TaskConfig) -> int | None:
    """The first evaluated step at which ``task.reach``'s key meets its threshold, else ``None``.

    The key must reach ``>=`` the threshold, or ``<=`` for keys ending in ``loss``. The step
    is a multiple of the evaluation interval, so it bounds the true first step from above.

    Args:
        records: a run's metrics log (:func:`read_curves`); only ``"eval"`` records count,
            in step order, and non-finite values never meet the threshold.
        task: a task with ``reach = {key: threshold}``.

    Returns:
        The step, or ``None`` when no evaluation met the threshold.

    Raises:
        ValueError: if ``task`` has no ``reach``.

    Examples:
        >>> t = TaskConfig("t", "digits", "vit-digits", reach={"val_acc": 0.9})
        >>> evals = [{"split": "eval", "step": s, "metrics": {"val_acc": a}}
        ...          for s, a in [(250, 0.2), (500, 0.93), (750, 0.85), (1000, 0.99)]]
        >>> first_reach(evals, t), first_reach(evals[:1], t)
        (500, None)
    """
    if not task.reach:
        raise ValueError(f"task {task.name!r} has no reach threshold")
    (key, threshold), = task.reach.items()
    sign = -1.0 if key.endswith("loss") else 1.0
    for r in sorted((r for r in records if r.get("split") == "eval"), key=lambda r: int(r["step"])):
        value = as_metrics(r).get(key)
        if value is not None and math.isfinite(value) and sign * value >= sign * threshold:
            return int(r["step"])
    return None


# ----------------------------------------------------------------------------- aggregation
def aggregate(results: list[RunResult]) -> list[dict[str, Any]]:
    """Mean, sample standard deviation and count over seeds per (task, operator)."""
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
            "mean": statistics.fmean(vals) if vals else None,
            "std": statistics.stdev(vals) if len(vals) > 1 else (0.0 if vals else None),
            "n": len(vals),
            "failed": sum(1 for r in rs if r.status != "completed"),
            "values": vals,
            "seeds": [r.seed for r in rs if r.value is not None],
            "by_seed": {r.seed: r.value for r in rs if r.value is not None and math.isfinite(r.value)},
            "num_parameters": rs[0].num_parameters,
            "elapsed_mean": statistics.fmean([r.elapsed for r in rs if r.elapsed is not None]) if any(r.elapsed for r in rs) else None,
        })
        chosen = [r for r in rs if r.selected_value is not None and math.isfinite(r.selected_value)]
        if chosen:
            selected = [r.selected_value for r in chosen]
            table[-1].update(selected_mean=statistics.fmean(selected), selected_std=statistics.stdev(selected) if len(selected) > 1 else 0.0,
                             selected_values=selected, selected_steps=[r.selected_step for r in chosen],
                             selected_by_seed={r.seed: r.selected_value for r in chosen})
        # per completed run (None: never reached, or the task has no `reach`); read only for tasks with `reach`
        table[-1]["reach_steps"] = [r.reach_step for r in rs if r.status == "completed"]
        table[-1]["reach_by_seed"] = {r.seed: r.reach_step for r in rs if r.status == "completed"}
    return table


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _reach_steps_cell(row: Mapping[str, Any]) -> str:
    """``"mean ± std (k of n)"`` of the steps to the threshold over the runs that reached it."""
    steps = row.get("reach_steps") or []
    hit = [s for s in steps if s is not None]
    if not hit:
        return f"never (0 of {len(steps)})" if steps else "never"
    spread = f" ± {statistics.stdev(hit):.0f}" if len(hit) > 1 else ""
    return f"{statistics.fmean(hit):.0f}{spread} ({len(hit)} of {len(steps)})"


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
    stat_heads = (["Δ vs " + baseline, "95% CI"] + ([] if compact else ["df"]) + ["p"]
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
        return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]

    for task in config.tasks:
        rows = [r for r in table if r["task"] == task.name]
        if not rows:
            continue
        arrow = "lower is better" if task.minimize else "higher is better"
        lines.append(f"### {task.name} ({task.dataset}, {task.model}): {task.metric}, {arrow}")
        lines.append("")
        if task.folds is not None:
            lines.append(f"{task.folds}-fold cross-validation: seed s tests on fold s % {task.folds}; the spread is over "
                         f"folds and the comparison is paired over folds with the Nadeau-Bengio correction.")
            lines.append("")
        lines += header(["operator", f"{task.metric} mean ± std", *stat_heads, "seeds", "params", "time/run (s)"])
        for r in rows:
            failed = f" ({r['failed']} failed)" if r["failed"] else ""
            cells = [r["operator"], f"{_fmt(r['mean'])} ± {_fmt(r['std'])}", *stat_cells(task.name, r["operator"], "final", 4),
                     f"{r['n']}{failed}", str(r["num_parameters"] or "n/a"), _fmt(r["elapsed_mean"], 1)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        if compact:
            continue
        if task.select_by is not None and any("selected_mean" in r for r in rows):
            lines += [f"#### {task.name}: {task.metric} at best {task.select_by}", ""]
            lines += header(["operator", f"{task.metric} mean ± std", *stat_heads])
            for r in rows:
                sel = f"{_fmt(r['selected_mean'])} ± {_fmt(r['selected_std'])}" if "selected_mean" in r else "n/a"
                lines.append("| " + " | ".join([r["operator"], sel, *stat_cells(task.name, r["operator"], "selected", 4)]) + " |")
            lines.append("")
        if task.reach is not None:
            (rkey, rval), = task.reach.items()
            lines += [f"#### {task.name}: steps to {rkey} {'≤' if rkey.endswith('loss') else '≥'} {rval:g}", ""]
            lines += header(["operator", "steps mean ± std (runs that reached it)", *stat_heads])
            for r in rows:
                cells = [r["operator"], _reach_steps_cell(r), *stat_cells(task.name, r["operator"], "reach", 0)]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    if lines and stat_heads:
        lines.append(table_legend(config, compact=compact))
        lines.append("")
    return "\n".join(lines)


def _manifest(config: ExperimentConfig) -> dict[str, Any]:
    from diffusionformer import __version__

    return {
        "config": config.to_dict(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "diffusionformer": __version__,
        "machine": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "git_commit": git_commit(),
    }


def git_commit(path: str | Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the checkout holding ``path`` (default: this package), with
    ``"+dirty"`` appended when tracked files differ from it; ``None`` outside a git checkout or
    without git."""
    import subprocess

    where = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def _write_outputs(out: Path, config: ExperimentConfig, results: list[RunResult]) -> None:
    rows = [r.__dict__ for r in results]
    table = aggregate(results)
    write_json_atomic(out / "results.json", {"runs": rows, "summary": table})
    text = f"# {config.name}\n\n{config.description}\n\nSeeds: {config.seeds}. Mean ± sample std over seeds.\n\n"
    (out / "results.md").write_text(text + format_table(table, config))
    try:
        from diffusionformer.experiments.plots import plot_experiment

        plot_experiment(out, config, results)
    except ImportError as exc:  # matplotlib missing: results are still written
        print(f"plots skipped: {exc}", file=sys.stderr)


def read_curves(rdir: Path) -> list[dict[str, Any]]:
    """The records of a run's metrics log (empty when it has none yet)."""
    path = rdir / "metrics.jsonl"
    return read_metrics(path) if path.is_file() else []
