"""Run a comparison: every operator setting x every task x every seed, resumable.

Layout of ``<out>/<name>/``::

    manifest.json                 resolved config, command, --import modules, machine, versions
    runs/<task>/<operator>/seed<k>/{metrics.jsonl, summary.json, checkpoint.pt, run_config.json, preprocessing.json}
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

This module is the run loop; reading runs back lives in :mod:`~diffusionformer.experiments.results`,
tables in :mod:`~diffusionformer.experiments.tables`, the manifest and result files in
:mod:`~diffusionformer.experiments.outputs`, a run's data and model in :mod:`~diffusionformer.experiments.build`
and the locks in :mod:`~diffusionformer.experiments.store`.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from diffusionformer._files import folder_lock as _folder_lock
from diffusionformer._files import refusal_kind
from diffusionformer.experiments.build import build_model, task_data
from diffusionformer.experiments.config import (ExperimentConfig, OperatorSetting, TaskConfig, _did_you_mean,
                                               train_config)
from diffusionformer.experiments.outputs import git_commit
from diffusionformer.experiments.outputs import manifest as _manifest, merged_manifest
from diffusionformer.experiments.outputs import write_outputs as _write_outputs
from diffusionformer.experiments.plots import _PLOT_CACHE
from diffusionformer.experiments.reload import PREPROCESSING_NAME, _preprocessing_changes, _preprocessing_of
from diffusionformer.experiments.results import _NEW_TRAIN_FIELDS as _NEW_TRAIN_FIELDS  # noqa: F401  (its home)
from diffusionformer.experiments.results import _NEW_MODEL_FIELDS as _NEW_MODEL_FIELDS  # noqa: F401  (its home)
from diffusionformer.experiments.results import (_RECORDED_SINCE, _comparable, _completed, _definition,
                                                 _identity_changes, _model_class_name, _new_model_fields,
                                                 _normalized_identity, _nothing_to_continue, _read_identity,
                                                 _result_from_files,
                                                 _task_identity, _train_identity, _with_recorded_class,
                                                 _without_new_defaults, read_json_dict)
from diffusionformer.experiments.results import (RunResult, finished_runs, first_reach, read_curves, run_dir, run_status,
                                                 select_evaluation)
from diffusionformer.experiments.stats import difference_t, paired_t, welch_t  # re-exported: their home is stats
from diffusionformer.experiments.store import LOCK_NAME, _foreign_lock_advice, _foreign_lock_note, _own_lock
from diffusionformer.experiments.store import acquire_lock as _acquire_lock
from diffusionformer.experiments.store import live_holder as _live_holder
from diffusionformer.experiments.store import release_lock as _release_lock
from diffusionformer.experiments.tables import aggregate, format_status, format_table
from diffusionformer.experiments.tasks import build_task
from diffusionformer.train import CheckpointError, NonFiniteLossError, Trainer, seed_everything
from diffusionformer.train.distributed import DistContext, _env_world_size, _on_every_rank, _rank_zero, dist_env
from diffusionformer.train.metrics import write_json_atomic

# The names above from results, tables, outputs and build are re-exported for back-compat: their homes are
# those modules (runs read back from disk, markdown tables, manifest and result files, a run's data and model).
__all__ = ["RunResult", "aggregate", "build_model", "finished_runs", "format_status", "format_table", "run_dir",
           "difference_t", "first_reach", "git_commit", "paired_t", "read_curves", "run_experiment", "run_status", "select_evaluation",
           "task_data", "welch_t"]


def _learned(model: torch.nn.Module) -> dict[str, list[float]]:
    from diffusionformer.models import learned_operator_parameters

    out = {}
    for name, p in learned_operator_parameters(model).items():
        out[name] = [float(x) for x in p.detach().flatten().tolist()]
    return out


def _restore_learned(rdir: Path, model: torch.nn.Module, step: Any, log: Callable[[str], None]) -> None:
    """Write a finished run's missing (or unreadable) ``learned_operators.json`` from its final checkpoint: a run
    killed between its ``summary.json`` and that file (written after it) would otherwise lose its learned operator
    values from every table for good. Nothing is done for a model without learned operators or without a checkpoint
    that loads (the tables then leave the values out, as before)."""
    from diffusionformer.models import learned_operator_parameters
    from diffusionformer.train import load_checkpoint

    path = rdir / "learned_operators.json"
    if read_json_dict(path) is not None or not learned_operator_parameters(model):  # None: missing or unreadable
        return
    try:
        payload = load_checkpoint(rdir / "checkpoint.pt")
        if payload.get("step") != step:  # not the final weights the summary reports
            return
        model.load_state_dict(payload["model"])
    except (OSError, CheckpointError, RuntimeError, KeyError, TypeError, ValueError):
        return
    write_json_atomic(path, _learned(model))
    log(f"{path} was missing or unreadable (a run stopped after its summary); rewritten from its final checkpoint.")


def _not_resumed_advice(exc: CheckpointError, checkpoint: str, which: str) -> str:
    """What to do about a checkpoint that did not load: grant read access to an unreadable one (deleting it would
    lose a good file), else delete it to retrain that run (``which``: "this" or "its")."""
    if isinstance(exc.__cause__, PermissionError):
        return f"Give this user read access to {checkpoint} and run again to resume {which} run."
    other = getattr(exc, "_failed_on_rank", None)
    if other is not None:  # under torchrun another rank failed where this one read the file: it may be good
        return (f"Rank {other} could not resume from {checkpoint}, which this rank read: check that rank's access to "
                f"it (every rank must see the same results folder) and run again to resume {which} run; delete it "
                f"only if rank {other}'s cause above says it is damaged.")
    # what load_checkpoint found the file to hold (read there, with the file at hand: ``checkpoint`` may be a
    # placeholder such as the command line's "that checkpoint.pt")
    refused = exc._weights_only_refusal
    kind = None if refused is None else refusal_kind(refused)
    if kind == "blocked":  # no allow-list reaches it: the run cannot resume from it
        return (f"Delete {checkpoint} to train {which} run again from step 0: it names a global of a module that "
                "torch.load(weights_only=True) blocks, which no allow-list reaches (the trainer saves none).")
    if kind is not None:  # a whole file holding what weights_only refuses: not damage, so no advice to delete it
        allow = ("save it again with torch.save's default pickle protocol" if kind == "protocol"
                 else "allow the type it names (torch.serialization.add_safe_globals)")
        return (f"{checkpoint} is whole: {allow} if you trust its source and run again to resume {which} run, or "
                f"delete it to train {which} run again from step 0.")
    return (f"Delete {checkpoint} to train {which} run again from step 0 (--restart would discard every run of "
            "the comparison).")


def _world_size() -> int:
    """The processes ``WORLD_SIZE`` asks for (torchrun's; unset or blank: one), read as
    :func:`~diffusionformer.train.dist_env` reads it: one that is no integer, or below 1, is a ``ValueError`` (the
    runner took 0 and -2 for one process, whose trainer then refused them after the run's lock was taken)."""
    world = _env_world_size()
    if world is not None and world < 1:
        raise ValueError(f"WORLD_SIZE: expected an integer number of processes (as torchrun sets it), at least 1, "
                         f"got {os.environ['WORLD_SIZE'].strip()!r}")
    return 1 if world is None else world


def _distributed() -> bool:
    """Whether ``WORLD_SIZE`` asks for more than one process (unset or blank: one)."""
    return _world_size() > 1


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
            checked first (:func:`~diffusionformer.experiments.gpu.check_device`); without one, each chosen
            task's own CUDA ``train.device`` is checked first instead.
        tasks: train only the tasks of these names (default: all); finished runs of the
            other tasks still appear in the results.
        log: where messages go.

    Returns:
        One :class:`RunResult` per run trained or found finished, in config order (runs held
        by another process, or another call of this one, and not yet finished are left out).

    Each task's dataset is loaded once (once per fold with ``folds``), just before the task's
    runs, and checked then with its models built from it; only that task's data is held.

    Raises:
        ValueError: before anything is written or trained, listing every run that would fail
            to start on the config alone (:func:`~diffusionformer.experiments.validate.check_experiment`
            without data, but for a model that does not build from its preset's sizes, judged with its task's data and
            its files: dataset names and options, a missing data root, model and heads, metric
            keys, training budget, mini-batch options); and before a task's first run, listing
            the problems its loaded data reveals (files that do not load, data-derived model sizes
            that do not fit); the finished runs of the tasks before it are kept; with ``resume=False``,
            before anything is discarded, naming the runs another live process, or another call of this one (a
            thread), is training (they cannot be restarted; a lock an earlier call of this process left in place is
            taken back, said through ``log``); before anything is written, a ``WORLD_SIZE`` that is no integer or
            below 1, or a ``RANK`` outside ``[0, WORLD_SIZE)``.
        ModuleNotFoundError: before anything is written or trained, scipy missing where ``config`` has several
            seeds (the table's t tests and intervals need it; it comes with the ``experiments`` extra).
        RuntimeError: called under ``torch.inference_mode()``, or at the default device ``meta`` (nothing is
            written).

    Each run seeds Python's, NumPy's and torch's global generators with its seed; the caller's are put back on
    return (torch's CPU generator, and the current CUDA device's once CUDA is initialised: other CUDA devices', and
    the CUDA generators of a process that first uses CUDA in the call, are left reseeded). The runs are built at the
    caller's ``torch.get_default_dtype()``; a run built at another default than float32 records it (``dtype`` in
    ``run_config.json``), so that it is not taken for (or averaged with) a float32 run of the config.
    """
    from diffusionformer.train.rng import _device_in_use, preserve_rng_state
    from diffusionformer.train.trainer import _refuse_untrainable_state

    _refuse_untrainable_state("run_experiment")  # before anything is written (its models' weights could not be trained)
    # every run seeds the global generators with its seed (and the checks draw building models): a notebook's
    # streams were left where the last run ended
    with preserve_rng_state(_device_in_use()):
        return _run_experiment(config, out_root, data_root, resume, progress, device, tasks, log)


def _run_experiment(config: ExperimentConfig, out_root: str | Path, data_root: str | None, resume: bool,
                    progress: bool, device: str | None, tasks: Sequence[str] | None,
                    log: Callable[[str], None]) -> list[RunResult]:
    """:func:`run_experiment`, the caller's generators kept by it."""
    out = Path(out_root) / config.name
    chosen = _choose_tasks(config, tasks)
    from diffusionformer.experiments.validate import check_experiment

    # every run resolves on the config alone, or nothing starts; the data are checked task by task below
    check_experiment(config, data_root=data_root, tasks=[t.name for t in chosen], load_data=False)
    from diffusionformer.experiments.stats import _require_scipy

    _require_scipy(len(config.seeds), "nothing was trained")  # the table's t tests: not once the runs have trained
    device = device if device is not None else config.device
    if device is not None:
        from diffusionformer.experiments.gpu import check_device

        check_device(device)
    else:  # each task's own train.device: else a later task's "cuda" failed after the tasks before it trained
        _check_task_devices(chosen)
    runs = [(t, o, s) for t in chosen for o in config.operators for s in config.seeds]
    dist_ctx = _maybe_init_distributed(device)  # (its refusal before a lock taken back is said through log)
    if not resume and not _distributed():
        _refuse_restart_of_held_runs(out, runs, log)
    results: list[RunResult] = []
    # disable=None: shown on a terminal only, as the trainer's step bars (`run c.toml 2> log` filled the log with
    # the bar's redraws)
    bar = tqdm(total=len(runs), desc=config.name, unit="run", disable=True if not (progress and _rank_zero()) else None,
               dynamic_ncols=True)
    # a task's figures are drawn again only when its runs or their logs changed, or another process rewrote them
    plot_cache = _PLOT_CACHE.set({})
    recorded = False  # this invocation's manifest (machine, versions, commit): written when it first trains
    try:
        for i, task in enumerate(chosen):
            loaded = _checked_task_data(config, task, data_root, first=i == 0)
            prepared: dict[int, dict[str, Any]] = {}  # each loaded data's preprocessing record, hashed once
            if i == 0:  # the first task's data load: now something will train
                _rank_zero_writes(dist_ctx, f"creating {out}", lambda: out.mkdir(parents=True, exist_ok=True))
            for setting in config.operators:
                for seed in config.seeds:
                    data = task_data(task, seed, data_root, loaded)
                    bar.set_postfix_str(f"{task.name} / {setting.name} / seed {seed}")
                    # rank 0's reading for every rank (a worker finishing the run between two ranks' reads split
                    # them: one skipped the manifest's and the tables' agreements the other waited in)
                    rdir = run_dir(out, task.name, setting.name, seed)
                    done_before = resume and _rank_zero_reads(lambda: _completed(rdir))
                    # only an invocation that trains adds its commit: a pass over finished runs (the tables after
                    # parallel workers, a re-run) leaves the provenance of the comparison as it was (every rank
                    # comes here: under torchrun rank 0's write is agreed on)
                    if not done_before and not recorded:
                        _rank_zero_writes(dist_ctx, f"writing {out / 'manifest.json'}",
                                          lambda: _record_manifest(out, config, device, chosen, log))
                        recorded = True
                    result = _one_run(out, task, setting, seed, data, resume, progress, device, log, dist_ctx,
                                      prepared)
                    if result is not None:
                        results.append(result)
                    bar.update(1)
                    if result is not None and not done_before:  # tables and plots after each new run
                        _rank_zero_writes(dist_ctx, f"writing the results of {out}",
                                          lambda: _write_outputs(out, config, finished_runs(out, config, results)))
        _rank_zero_writes(dist_ctx, f"writing the results of {out}",
                          lambda: _write_outputs(out, config, finished_runs(out, config, results)))
    finally:
        _PLOT_CACHE.reset(plot_cache)
        bar.close()
        if dist_ctx is not None:
            dist_ctx.shutdown()
    return finished_runs(out, config, results)


def _record_manifest(out: Path, config: ExperimentConfig, device: str | None, chosen: Sequence[TaskConfig],
                     log: Callable[[str], None]) -> None:
    """Merge this invocation's record (machine, versions, commit) into ``out/manifest.json`` and say, through ``log``,
    where it differs from the invocations before it (torch version, CPU kernels, thread count)."""
    current = _manifest(config, device, chosen, _world_size())  # outside the lock: it runs git
    # read-merge-write under the comparison's lock: another invocation starting at once (one per seed, another machine
    # on a shared folder) would else drop the commit or kernel set it added
    with _folder_lock(out):
        previous = _read_manifest(out)
        record = merged_manifest(previous, current)
        earlier = merged_manifest(previous, {})  # what the invocations before this one saw
        before = earlier.get("cpu_kernel_sets", [])
        torches = earlier.get("torch_versions", [])
        counts = earlier.get("torch_thread_counts", [])
        write_json_atomic(out / "manifest.json", record)
    if torches and record["torch"] not in torches:
        log(f"note: earlier runs of {config.name} were trained with torch {', '.join(torches)}, "
            f"these with torch {record['torch']}: a seed's numbers need not match across torch "
            "versions; manifest.json lists both")
    # only runs trained on the CPU run its kernels (a GPU call's record none)
    if before and isinstance(record["cpu_kernels"], str) and record["cpu_kernels"] not in before:
        log(f"note: earlier runs of {config.name} were trained with torch's {', '.join(before)} CPU "
            f"kernels, these with {record['cpu_kernels']} (another processor, or "
            "$ATEN_CPU_CAPABILITY): float rounding differs between kernel sets, so runs of one "
            "seed need not match across them; manifest.json lists both")
    threads = record.get("torch_threads")
    if counts and isinstance(record["cpu_kernels"], str) and threads not in counts:
        log(f"note: earlier runs of {config.name} were trained with {', '.join(map(str, counts))} "
            f"torch thread(s), these with {threads} (--threads, $OMP_NUM_THREADS or --workers): "
            "a CPU reduction split over another number of threads rounds otherwise, so runs of "
            "one seed need not match across them; manifest.json lists both")


def _check_task_devices(tasks: Sequence[TaskConfig]) -> None:
    """Refuse, before anything trains, a task whose own ``train.device`` is a CUDA device this machine lacks (the
    trainer refused it only at that task's first run, after the runs of the tasks before it had trained).

    Raises:
        ValueError: naming the task and its device.
    """
    from diffusionformer.experiments.gpu import check_device

    for task in tasks:
        spec = train_config(task, seed=0).device
        if spec != "auto" and torch.device(spec).type == "cuda":
            try:
                check_device(spec)
            except ValueError as exc:
                raise ValueError(f"task {task.name!r} train.device: {exc}; nothing was trained") from None


#: the run folders (resolved) that a call of :func:`run_experiment` in this process trains now, any thread's: a lock
#: of this process on another run is one an earlier call left in place (its release failed), not a run in training;
#: another call (a thread, a nested call) skips these runs, as it skips the runs of another process
_TRAINING_HERE: set[Path] = set()
_TRAINING_HERE_LOCK = threading.Lock()  # (a run is claimed, looked up and added at once; taken out and released too)


def _refuse_restart_of_held_runs(out: Path, runs: Sequence[tuple[TaskConfig, OperatorSetting, int]],
                                 log: Callable[[str], None]) -> None:
    """Refuse ``resume=False`` (``--restart``) while another live process holds a lock of one of ``runs``, before
    anything is discarded: its run would be skipped, not restarted, and once that process finished it (under its own
    config) read back from disk into this comparison's table with the restarted runs, two definitions averaged
    under one name. A lock of this process is refused while another call of this process (another thread) trains the
    run; else an earlier call left it in place (its release failed): said through ``log``, and taken back (the
    run's claim takes this process's own lock).

    Raises:
        ValueError: naming the held runs' locks and their holders.
    """
    held, taken = [], []
    for task, setting, seed in runs:
        lock = run_dir(out, task.name, setting.name, seed) / LOCK_NAME
        with _TRAINING_HERE_LOCK:  # a claim in flight (this process's lock file, not yet in _TRAINING_HERE): after it
            holder = _live_holder(lock.parent)
            ours = holder is not None and _own_lock(lock.parent)
            trained = ours and lock.parent.resolve() in _TRAINING_HERE
        if ours:
            if trained:  # another call (another thread) of this process trains it
                held.append(f"{lock} (this process, process {holder[0]}: another call of run_experiment trains it)")
            else:  # left in place where its release failed: reclaimed below as a lock of this process
                taken.append(f"[{task.name} / {setting.name} / seed {seed}] {lock} is this process's own lock, left "
                             "in place by an earlier call whose release of it failed (nothing of this process trains "
                             "the run): taken back, the run is restarted")
        elif holder is not None:  # (-1, ""): an unreadable lock, young enough to be a claim being written
            who = "a process still writing it" if holder[0] < 0 else f"process {holder[0]} on {holder[1]}"
            held.append(f"{lock} ({who})")
    if held:
        raise ValueError(f"resume=False (--restart): {len(held)} run(s) to discard are being trained by another "
                         f"process or call: {'; '.join(held[:3])}{' ...' if len(held) > 3 else ''}; stop it (or "
                         "delete a lock whose process is gone) and run again; nothing was discarded")
    for note in taken:  # said once the call goes on (a refused call takes nothing back)
        log(note)


def _checked_task_data(config: ExperimentConfig, task: TaskConfig, data_root: str | None,
                       first: bool) -> dict[int | None, Any]:
    """Load ``task``'s data once and check its runs with it: the fold cache of :func:`task_data`.

    Raises:
        ValueError: listing the problems of ``task``'s runs (the data does not load, or a
            model built from it does not fit).
    """
    from diffusionformer.experiments.validate import validate_experiment

    seen: dict[str, Any] = {}
    with warnings.catch_warnings():  # the check of the whole config gave these warnings already
        warnings.filterwarnings("ignore", message=r"task '.*' / setting '.*': minibatch\.", category=UserWarning)
        warnings.filterwarnings("ignore", message=r"task '.*' / setting '.*': the DINO momentum schedule",
                                category=UserWarning)
        warnings.filterwarnings("ignore", message=r"task '.*' / setting '.*': laplacian_heads = ", category=UserWarning)
        problems = validate_experiment(config, data_root=data_root, tasks=[task.name], loaded=seen)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        done = "nothing was trained" if first else "the runs of the tasks before it are finished and kept"
        raise ValueError(f"config {config.name!r}: task {task.name!r} cannot start, its data reveal "
                         f"{len(problems)} problem(s); {done}:\n{lines}")
    # the checked load serves its fold's runs (a task checked without loading loads in task_data)
    return {task.fold_of(config.seeds[0]): seen[task.name]} if task.name in seen else {}


def _choose_tasks(config: ExperimentConfig, names: Sequence[str] | None) -> list[TaskConfig]:
    if names is None:
        return list(config.tasks)
    known = [t.name for t in config.tasks]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        hint = _did_you_mean(str(unknown[0]), known) if unknown else ""
        raise ValueError(f"unknown task(s) {unknown or names!r} for {config.name!r}; its tasks are {known}{hint}")
    return [t for t in config.tasks if t.name in set(names)]


def _rank_zero_writes(dist_ctx: DistContext | None, what: str, write: Callable[[], Any]) -> None:
    """``write()`` on rank 0 alone, the process that writes. Under a torchrun process group (``dist_ctx``) every rank
    calls this at the same point (:func:`~diffusionformer.train.distributed._on_every_rank`): if the write fails
    there, every rank stops at once naming rank 0 and the cause, rather than wait for it at its next collective."""
    if dist_ctx is None:  # one process, or no group joined: no collective
        if _rank_zero():
            write()
        return
    _on_every_rank(dist_ctx, what, write, here=dist_ctx.is_main)


def _rank_zero_reads(read: Callable[[], Any]) -> Any:
    """``read()`` on rank 0 alone and its value on every rank: under torchrun a decision taken from the results
    folder (a run's lock, whether it is finished) is rank 0's, so that every rank takes the same way and calls the
    same agreements (each rank's own reading split them where a worker sharing the comparison finished a run between
    two ranks' reads). An ``OSError`` or ``ValueError`` (a refusal of the run) of rank 0's ``read()`` is raised on
    every rank. A collective under torchrun: every rank calls it at the same point; one process just reads."""
    if not _distributed():
        return read()
    try:
        value = read() if _rank_zero() else None
    except (OSError, ValueError) as exc:  # (a folder where the lock goes, a run made with another config): every
        value = exc  # rank stops, not rank 0 alone (the others waited)
    shared: list[Any] = [value]
    torch.distributed.broadcast_object_list(shared, src=0)
    if isinstance(shared[0], (OSError, ValueError)):
        raise shared[0]
    return shared[0]


def _maybe_init_distributed(device: str | None) -> Any:
    """Join the torchrun process group once for all runs (the trainer then reuses it)."""
    if not _distributed():
        # the trainer's reading of a one-process environment (init_distributed), before anything is written: a stray
        # RANK=1 or a malformed one beside WORLD_SIZE=1 was refused there, once the run's lock and config were written
        dist_env()
        return None
    from diffusionformer.train import init_distributed

    return init_distributed(device or "auto")


RUN_CONFIG_NAME = "run_config.json"


def _run_identity(task: TaskConfig, model: torch.nn.Module, train: Any) -> dict[str, Any]:
    """What makes two runs the same run: data, resolved model config (and the model's class when it is a user's, not
    the library's), training budget."""
    import dataclasses

    model_cfg = getattr(model, "config", None)
    model_dict = dataclasses.asdict(model_cfg) if dataclasses.is_dataclass(model_cfg) else None
    task_cfg = getattr(model, "task_config", None)  # DINO's SSL settings, once DINOConfig fields: same keys
    if model_dict is not None and dataclasses.is_dataclass(task_cfg):
        model_dict.update(dataclasses.asdict(task_cfg))
    entries = _task_identity(task, train.seed)  # data, preset name, dtype, augmentation, ...: without a model
    identity: dict[str, Any] = {
        **{k: entries[k] for k in ("dataset", "dataset_options", "data_seed", "model")},
        # a field added after runs were published joins the identity only when set, so earlier runs keep resuming
        "model_config": None if model_dict is None else _without_new_defaults(model_dict,
                                                                               _new_model_fields(type(model_cfg))),
        "train": _train_identity(train),
    }
    model_class = _model_class_name(type(model))
    if model_class is not None:
        # a user's class (a registered custom preset or subclass): two classes registered under one preset name, a
        # config alike, were one run, and the second's rerun skipped as finished, reporting the first's results
        identity["model_class"] = model_class  # only then, so runs of the library's models keep their identity
    identity.update({k: v for k, v in entries.items() if k not in identity})  # in the order the files hold them
    return json.loads(json.dumps(identity, default=str))


def _with_rope_base(identity: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """``identity`` as ``run_config.json`` records it: with the ``rope_base`` of a model with RoPE on at its default
    too (the identity leaves it out, and readers drop it again: :func:`_normalized_identity`). A folder whose RoPE
    model lacks it is then one written before 41b9968 (or before this record), whose base its checkpoint holds:
    ``status``, ``run`` and the tables open a RoPE run's checkpoint for it (``results._read_identity``) only then
    (they opened every one's, its base left out at the default)."""
    config = identity.get("model_config")
    base = getattr(getattr(model, "config", None), "rope_base", None)
    if (not isinstance(config, dict) or not config.get("rope") or "rope_base" in config
            or not isinstance(base, (int, float)) or isinstance(base, bool)):
        return identity
    return {**identity, "model_config": {**config, "rope_base": float(base)}}


def _check_identity(rdir: Path, identity: dict[str, Any], task: TaskConfig, setting: OperatorSetting,
                    log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Refuse to continue the run in ``rdir`` when its ``run_config.json`` records another definition than
    ``identity``; a run that stopped before its first checkpoint (no checkpoint, no summary) has nothing to continue
    and starts again under ``identity``, said through ``log``. Returns the identity to record: ``identity``, less an
    entry of :data:`_RECORDED_SINCE` that the run continued was recorded without (its steps so far were made at a
    value not known: recording this config's would say the whole run was)."""
    recorded = _read_identity(rdir)  # a rope_base left out before 41b9968: the checkpoint's
    if recorded is None:  # absent, or unreadable: rewritten below; the trainer still checks the checkpoint's config
        return identity
    stored = _normalized_identity(recorded)  # a field added since, or recorded at its default, is no change
    stored = _with_recorded_class(rdir, stored, identity.get("model_class"))
    stored, now = _comparable(stored, identity, now=True)
    if stored != now and _nothing_to_continue(rdir):
        # it stopped before its first checkpoint (a batch too large for the memory, an error at its first step):
        # nothing of it is continued, so it starts again under this config (was refused, so that the corrected
        # config ran only with --restart, which discards and retrains every run of the chosen tasks)
        if log is not None and _rank_zero():
            log(f"[{task.name} / {setting.name}] {rdir} held a run made with a different "
                f"{_identity_changes(stored, now)} that stopped before its first checkpoint: it starts again "
                "under this config")
        return identity
    if stored != now:
        raise ValueError(
            f"{rdir} holds a run of task {task.name!r} / setting {setting.name!r} made with a different "
            f"{_identity_changes(stored, now)}; rename the task or operator setting, or pass --restart to discard it"
        )
    if _nothing_to_continue(rdir):  # trained from step 0 under this config: all of it is known
        return identity
    return {k: v for k, v in identity.items() if k in recorded or k not in _RECORDED_SINCE}


def _check_preprocessing(rdir: Path, preprocessing: dict[str, Any], task: TaskConfig,
                         setting: OperatorSetting) -> None:
    """Refuse to continue the run in ``rdir`` on inputs prepared otherwise than its ``preprocessing.json`` records
    (another vocabulary, of the same size too, other pixel statistics, or another fingerprint of its tokens or graph:
    its data changed since it started, e.g. a new Python's ``pydoc_data`` or a replaced data file): its weights were
    trained on token ids, pixel values or a graph that mean something else now, and the file was rewritten with the
    new record as if the whole run had been made on it.
    Nothing is compared for a run with nothing to continue (it starts again) or without a record (a folder of an older
    version); a record there but unreadable (truncated, not an object) is refused: it was rewritten from the data, a
    change since the run started with it, without a word."""
    path = rdir / PREPROCESSING_NAME
    if _nothing_to_continue(rdir) or not path.exists():  # absent: a folder of an older version (as load_run reads it)
        return
    recorded = read_json_dict(path)
    if recorded is None:
        raise ValueError(
            f"{rdir} holds a run of task {task.name!r} / setting {setting.name!r} whose {path} is unreadable "
            "(truncated, or not a JSON object): how its inputs were prepared cannot be compared with this data's; "
            "restore the file, remove it to resume on this data's record, or pass --restart to discard the run")
    changes = _preprocessing_changes(recorded, preprocessing)
    if changes:
        raise ValueError(
            f"{rdir} holds a run of task {task.name!r} / setting {setting.name!r} whose inputs were prepared otherwise "
            f"than this data's ({changes}: {rdir / PREPROCESSING_NAME} records the former): its data changed since the "
            "run started; resume it on the data it was made with, or pass --restart to discard it")


def _check_sibling_identity(rdir: Path, identity: dict[str, Any], task: TaskConfig, setting: OperatorSetting) -> None:
    """Refuse a run whose finished sibling seeds (same task and setting, on disk) were made with another
    definition: their rows would be averaged with this run's in the comparison's table."""
    mine = _definition(identity)
    for other in sorted(rdir.parent.glob("seed*")):
        if other == rdir or not _completed(other):
            continue
        stored = _read_identity(other)
        if stored is None:
            continue
        theirs, ours = _comparable(_definition(_with_recorded_class(other, stored, identity.get("model_class"))), mine,
                                   now=True)
        if theirs != ours:
            raise ValueError(
                f"{other} holds a finished run of task {task.name!r} / setting {setting.name!r} made with a different "
                f"{_identity_changes(theirs, ours)}, which the results table would average with this run's; rename "
                "the task or operator setting, or pass --restart to discard it")


def _one_run(out: Path, task: TaskConfig, setting: OperatorSetting, seed: int, data: Any, resume: bool,
             progress: bool, device: str | None, log: Callable[[str], None],
             dist_ctx: DistContext | None = None, prepared: dict[int, dict[str, Any]] | None = None
             ) -> RunResult | None:
    """Train (or resume, or read back) one run; ``None`` when another live process holds it. ``dist_ctx``: the
    torchrun process group's context, where rank 0's writes are agreed on (:func:`_rank_zero_writes`).
    ``prepared``: the preprocessing records of the caller's data objects by ``id`` (:func:`~diffusionformer.experiments.reload._preprocessing_of`)."""
    rdir = run_dir(out, task.name, setting.name, seed)
    # under torchrun rank 0 claims the lock for every rank (else a torchrun job trained a run that a worker was
    # training, both writing its checkpoint and log): every rank takes its decision
    training = rdir.resolve()
    with _TRAINING_HERE_LOCK:  # this process's lock is another call's too: else that call trained the run under this
        # one, released the lock this one went on training with, and took the run out of _TRAINING_HERE. The claim is
        # made under it too: a claim of the lock file a call ending the run still held (out of _TRAINING_HERE, the
        # file not yet removed) trained the run, and that call then removed the lock it trained under
        holder = _rank_zero_reads(lambda: _acquire_lock(rdir))
        ours = holder is None and training in _TRAINING_HERE
        if ours:
            holder = f"another call of run_experiment in this process (process {os.getpid()})"
        elif holder is None:
            _TRAINING_HERE.add(training)  # (until it ends: a lock left in place then is no call's of this process)
    if holder is not None and not resume:  # claimed after the check of run_experiment: the same refusal
        stop = "let that call end" if ours else "stop that process"  # (not this process, which would stop both)
        raise ValueError(f"[{task.name} / {setting.name} / seed {seed}] resume=False (--restart) cannot discard "
                         f"{rdir}: {holder} is training it ({rdir / LOCK_NAME}); {stop} and run "
                         "again (the runs before this one were restarted)")
    if holder is not None:
        if _rank_zero():
            note = _foreign_lock_note(rdir)  # a failed node's lock holds for ever: say how to tell and what to do
            log(f"[{task.name} / {setting.name} / seed {seed}] skipped: {holder} is training it ({rdir / LOCK_NAME})."
                + ("" if note is None else f" Note: {note}; {_foreign_lock_advice(rdir)}."))  # the host as named
        return None
    try:
        result = _train_one(rdir, task, setting, seed, data, resume, progress, device, log, dist_ctx, prepared)
    except BaseException:
        failed = None
        with _TRAINING_HERE_LOCK:  # out of _TRAINING_HERE and released at once (no claim between them, as above)
            _TRAINING_HERE.discard(training)
            # no agreement on the way out of an error: a rank may be stopping alone (the others in another collective)
            if not _distributed() or _rank_zero():
                try:
                    _release_run_lock(rdir)
                except OSError as exc:  # said, not raised: it replaced the run's own error (a refusal, a SIGTERM)
                    failed = exc
        if failed is not None:
            log(f"[{task.name} / {setting.name} / seed {seed}] {failed}")
        raise
    with _TRAINING_HERE_LOCK:
        _TRAINING_HERE.discard(training)
        # every rank comes here: rank 0's release is agreed (a failed one stopped rank 0 alone, the others went on)
        _rank_zero_writes(dist_ctx, f"releasing the lock {rdir / LOCK_NAME}", lambda: _release_run_lock(rdir))
    return result


def _release_run_lock(rdir: Path) -> None:
    """:func:`~diffusionformer.experiments.store.release_lock` of a run this process trained or read back; where
    removing the lock fails, the error says what becomes of the lock."""
    try:
        _release_lock(rdir)
    except OSError as exc:
        raise type(exc)(f"{exc}; the run's lock {rdir / LOCK_NAME} is left in place: a run started on this host once "
                        "this process (under torchrun: this job) has exited takes it over (as a later call in this "
                        "process does), one started on another host skips the run until the lock is removed") from exc


def _read_manifest(out: Path) -> dict[str, Any] | None:
    """The comparison's ``manifest.json``, or ``None`` when absent or unreadable, a FIFO or a device included (it is
    rewritten): :func:`read_json_dict`."""
    return read_json_dict(out / "manifest.json")


def _train_one(rdir: Path, task: TaskConfig, setting: OperatorSetting, seed: int, data: Any, resume: bool,
               progress: bool, device: str | None, log: Callable[[str], None],
               dist_ctx: DistContext | None = None, prepared: dict[int, dict[str, Any]] | None = None) -> RunResult:
    summary_path = rdir / "summary.json"
    extra = {"progress": progress and _rank_zero()}
    if device is not None:
        extra["device"] = device
    cfg = train_config(task, seed, **extra)
    seed_everything(seed)
    model = build_model(task, setting, data)
    identity = _run_identity(task, model, cfg)
    if resume:
        # rank 0's reading for every rank, its refusal raised on every rank (a worker finishing a sibling seed between
        # two ranks' reads made one rank refuse the run alone while the others went on to their next collective)
        def checked_identity() -> dict[str, Any]:
            checked = _check_identity(rdir, identity, task, setting, log)
            _check_sibling_identity(rdir, checked, task, setting)
            return checked
        identity = _rank_zero_reads(checked_identity)
        # rank 0's reading for every rank (absent: {}): a rank that read it otherwise trained the run alone, or
        # returned while the others trained it, and the job hung at their next collective
        summary = _rank_zero_reads(lambda: read_json_dict(summary_path) if summary_path.exists() else {})
        if summary is None:
            if _rank_zero():  # (rank 0 alone says so, as every note here)
                log(f"[{task.name} / {setting.name} / seed {seed}] {summary_path} is unreadable; "
                    "the run is finished from its checkpoint, which rewrites it.")
        elif summary.get("status") == "completed":
            _rank_zero_writes(dist_ctx, f"writing {rdir / 'learned_operators.json'}",
                              lambda: _restore_learned(rdir, model, summary.get("step"), log))
            return _result_from_files(task, setting, seed, rdir, summary)
    preprocessing = _preprocessing_of(data, {} if prepared is None else prepared)
    if resume:  # (rank 0's reading, its refusal raised on every rank)
        _rank_zero_reads(lambda: _check_preprocessing(rdir, preprocessing, task, setting))
    _rank_zero_writes(dist_ctx, f"writing {rdir / RUN_CONFIG_NAME}",
                      lambda: _start_run_folder(rdir, _with_rope_base(identity, model), resume, preprocessing))
    adapter = build_task(data, model, eval_batch_size=task.eval_batch_size, augment=task.augment,
                         label_smoothing=task.label_smoothing, minibatch=task.minibatch or None)
    try:
        trainer = Trainer(model, adapter, cfg, rdir, resume=True)
        summary = trainer.fit()
    except NonFiniteLossError as exc:
        # the message says which checkpoint was kept, if any: "no checkpoint had been written." (raised on every
        # rank alike: rank 0 alone says so)
        if _rank_zero():
            log(f"[{task.name} / {setting.name} / seed {seed}] stopped: {str(exc).rstrip('.')} (run folder {rdir}).")
        return RunResult(task.name, setting.name, seed, f"failed: {exc}", task.metric, None)
    except CheckpointError as exc:  # this run cannot resume; the others can
        if _rank_zero():
            log(f"[{task.name} / {setting.name} / seed {seed}] not resumed: {str(exc).rstrip('.')}. "
                f"{_not_resumed_advice(exc, str(rdir / 'checkpoint.pt'), 'this')}")
        return RunResult(task.name, setting.name, seed, f"failed: {exc}", task.metric, None)
    sizes = summary.get("world_sizes") or []
    if _rank_zero() and len(sizes) > 1:  # else a resume under another number of processes went without a word
        log(f"[{task.name} / {setting.name} / seed {seed}] note: trained by {' then '.join(map(str, sizes))} "
            "process(es) (resumed under another number): its numbers are those of no uninterrupted run; "
            f"{summary_path} lists them (world_sizes)")
    threads = summary.get("torch_threads") or []
    if _rank_zero() and len(threads) > 1:  # else silent where the comparison had seen the count (its manifest's note)
        log(f"[{task.name} / {setting.name} / seed {seed}] note: trained under {' then '.join(map(str, threads))} "
            "torch thread(s) on the CPU (resumed under another count: --threads, $OMP_NUM_THREADS or --workers): a CPU "
            "reduction split over another number of threads rounds otherwise, so its numbers need not be an "
            f"uninterrupted run's; {summary_path} lists them (torch_threads)")
    versions = summary.get("torch_versions") or []
    if _rank_zero() and len(versions) > 1:  # else silent where the comparison had seen the version (its manifest's)
        log(f"[{task.name} / {setting.name} / seed {seed}] note: trained with torch {' then '.join(versions)} "
            "(resumed under another torch version): a seed's numbers need not match across torch versions, so its "
            f"numbers need not be an uninterrupted run's; {summary_path} lists them (torch_versions)")
    learned = _learned(model)
    if learned:
        _rank_zero_writes(dist_ctx, f"writing {rdir / 'learned_operators.json'}",
                          lambda: write_json_atomic(rdir / "learned_operators.json", learned))
    return _result_from_files(task, setting, seed, rdir, summary)


def _start_run_folder(rdir: Path, identity: dict[str, Any], resume: bool,
                      preprocessing: dict[str, Any] | None = None) -> None:
    """Empty ``rdir`` of an earlier run when not ``resume`` (``--restart``; its lock kept), then record the run's
    ``identity`` in its ``run_config.json`` and, when given, how its inputs are prepared in ``preprocessing.json``
    (``load_run``'s ``run.preprocessing``: a run continued by this version gets it too, its data being the same)."""
    if not resume and rdir.exists():
        import shutil

        # the summary first, the run's definition last: a restart killed half-way never leaves a finished run without
        # its run_config.json (a rerun under the changed config read the old run back as its own, silently)
        first_last = {"summary.json": 0, RUN_CONFIG_NAME: 2}
        for entry in sorted(rdir.iterdir(), key=lambda e: first_last.get(e.name, 1)):  # all but this process's lock
            if not entry.name.startswith(LOCK_NAME):  # nor other workers' lock claims in flight
                # a link to a folder is removed, not followed (rmtree refuses it, half-way through the run's files)
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    rdir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(rdir / RUN_CONFIG_NAME, identity)
    if preprocessing is not None:
        write_json_atomic(rdir / PREPROCESSING_NAME, preprocessing)
