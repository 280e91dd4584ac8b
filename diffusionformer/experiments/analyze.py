"""Token-geometry analysis of a finished comparison: ``python -m diffusionformer.experiments analyze CONFIG``.

For every finished run of ``<out>/<name>/runs/<task>/<operator>/seed<k>/`` the model is rebuilt
with its trained weights by :func:`~diffusionformer.experiments.load_run` (from the resolved
config the runner recorded in ``run_config.json`` and ``checkpoint.pt``), and the residual stream of
held-out data (a seeded random subset of the ``test`` split of the same dataset with the
same ``data_seed``; seeded windows of the ``val`` stream for text) is captured layer by layer
(:func:`~diffusionformer.analysis.capture_dataset`) and measured
(:func:`~diffusionformer.analysis.layer_reports`). Written under ``<out>/<name>/analysis/``::

    metrics.json                     per task / operator / seed / layer, and mean ± std over seeds
    README.md                        first vs last layer per operator setting, one table per task
    plots/<task>_smoothing.png       variance, variance ratio, Dirichlet energy (complete graph and
                                     attention graph) by depth, one line per operator setting
    plots/<task>_spectra.png         last-layer token spectra; effective rank and power-law exponent by depth
    plots/<task>_collapse.png        Neural Collapse / ANOVA (classification) or next-token NC1 and
                                     linear probe (language models) by depth
    plots/<task>_pca_maps.png        PCA maps of patch tokens for a few held-out images (image tasks)
    plots/<task>_frequency_response.png  f(lambda) of every head of the last block, per setting
    plots/<task>_learned_operators.png   learned diffusion times / coefficients per layer and head

Layer ``0`` is the embedding output (the input of block 0); layer ``l`` the residual stream
after block ``l - 1``. For a ViT the class token is left out (patch tokens only).

Each run's measurements are cached in ``<run>/analysis_cache.pt``, keyed by the checkpoint
(step, size, modification time), the analysis settings, the registered metrics and :data:`ANALYSIS_VERSION`;
a second ``analyze`` of a growing comparison measures only the new runs. A completed run whose checkpoint is gone (a
results archive of ``gpu_study.sh``, packed without checkpoints after the GPU call analysed its runs) is read from
its cache when that was made with the same analysis settings at the run's final step, instead of skipped.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import warnings
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from diffusionformer._modes import _evaluating
from diffusionformer._warnings import user_stacklevel
from diffusionformer.analysis.capture import _NoBlocks, _check_capture_limits, capture_dataset
from diffusionformer.analysis.report import layer_reports, list_metrics
from diffusionformer.config import _choice_hint
from diffusionformer.data.base import ClassificationData
from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
from diffusionformer.experiments.reload import PREPROCESSING_NAME, _preprocessing_changes, _preprocessing_of, load_run
from diffusionformer.experiments.build import task_data
from diffusionformer.experiments.results import (_DATA_KEYS, _runs_of_another_train, _task_identity,
                                                 read_json_dict, run_dir)
from diffusionformer.experiments.stats import welch_t
from diffusionformer.experiments.tasks import find_adapter, heldout_batches, model_family
from diffusionformer.models import learned_operator_parameters
from diffusionformer.train.checkpoint import CHECKPOINT_NAME
from diffusionformer.train.metrics import write_json_atomic, write_text_atomic

__all__ = ["analyze_experiment", "analyze_run"]

#: bump when what :func:`analyze_run` measures changes (invalidates every run's cache);
#: 2: held-out examples are a seeded random subset instead of the first ``max_examples``;
#: 3: the ANOVA fractions of padded graphs are measured (they were None), float64 models captured in float64;
#: 4: the test split of the CIFAR-10 JPEG zips in a seeded random order (its held-out subset and PCA images changed);
#: equal tokens centre to exactly 0, half-precision captures fit the power law above their epsilon
ANALYSIS_VERSION = 4
_CACHE_NAME = "analysis_cache.pt"
_PCA_IMAGES = 4
_RUN_HINT = "run `python -m diffusionformer.experiments run CONFIG` first (with the same config and --out)"


# ----------------------------------------------------------------------------- runs on disk
def _run_state(rdir: Path) -> str:
    """``"completed"``, ``"weightless"`` (completed, its checkpoint gone), ``"unfinished"`` (started, not completed)
    or ``"missing"``."""
    record = read_json_dict(rdir / "summary.json")  # None when half-written or foreign: not finished
    if record is not None and record.get("status") == "completed":
        return "completed" if (rdir / CHECKPOINT_NAME).is_file() else "weightless"
    return "unfinished" if rdir.is_dir() else "missing"


def _weightless(rdir: Path) -> str:
    """Why a completed run without its checkpoint cannot be analysed, and what to do: ``--restart`` discards every run
    of the comparison (a GPU call's among them), so it is not the advice for one run."""
    return (f"run {rdir} is marked completed but its checkpoint {rdir / CHECKPOINT_NAME} is missing; "
            f"{_RUN_HINT.replace('first', 'again with --restart')} only to train every run of the comparison again "
            "(it discards them all). A results archive without checkpoints (as gpu_study.sh packs) brings a run's "
            "tables, not its weights (its analysis_cache.pt is read instead only if made with these analysis settings "
            "at the run's final step, as gpu_study.sh's analysis makes it): analyse the run where its checkpoint is, "
            f"or copy the checkpoint back into its folder; --partial analyses the other runs; to train this run again "
            f"alone, delete {rdir} and `run` again without --restart")


_Run = tuple[TaskConfig, OperatorSetting, int, Path]


def _find_runs(out: Path, config: ExperimentConfig, partial: bool = False,
               reusable: Any = None) -> tuple[list[_Run], list[str]]:
    """The runs to analyse and the skipped ones; ``reusable(rdir)``: whether a completed run without its checkpoint
    has a cache to be read from (then it is analysed, from its cache)."""
    runs_root = out / "runs"
    if not runs_root.is_dir():
        raise FileNotFoundError(f"no runs of experiment {config.name!r}: {runs_root} does not exist; {_RUN_HINT}")
    done, missing, skipped = [], [], []
    for task in config.tasks:
        for setting in config.operators:
            for seed in config.seeds:
                rdir = run_dir(out, task.name, setting.name, seed)
                state = _run_state(rdir)
                if state == "completed":
                    done.append((task, setting, seed, rdir))
                elif state == "weightless" and reusable is not None and reusable(rdir):
                    done.append((task, setting, seed, rdir))
                elif state == "weightless":
                    if not partial:
                        raise FileNotFoundError(_weightless(rdir))
                    skipped.append(str(rdir))
                    warnings.warn(f"{_weightless(rdir)}; skipping it", RuntimeWarning, stacklevel=user_stacklevel())
                elif state == "missing":
                    missing.append(str(rdir / CHECKPOINT_NAME))
                else:
                    skipped.append(str(rdir))
                    warnings.warn(f"run {rdir} is not finished (no completed summary.json); skipping it",
                                  RuntimeWarning, stacklevel=user_stacklevel())
    if missing and partial:
        skipped += [str(Path(m).parent) for m in missing]
        warnings.warn(f"{len(missing)} run(s) of {config.name!r} not trained yet; analysing the {len(done)} finished ones",
                      RuntimeWarning, stacklevel=user_stacklevel())
    elif missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise FileNotFoundError(f"{len(missing)} run(s) of {config.name!r} have no checkpoint: {shown}; {_RUN_HINT}")
    if not done:
        raise FileNotFoundError(f"no finished run of {config.name!r} under {runs_root} to analyse; {_RUN_HINT}")
    return done, skipped


def _check_run_data(rdir: Path, task: TaskConfig, seed: int) -> None:
    """Refuse a run whose ``run_config.json`` names other data (dataset, its options, ``data_seed``, folds) or another
    model preset than ``task`` now does: its held-out split, loaded from the config, would not be the one it was
    trained beside (another ``data_seed`` reshuffles it: the model's training examples among the "held-out" ones)."""
    stored = read_json_dict(rdir / "run_config.json")
    if stored is None:  # absent or unreadable: load_run names it
        return
    now = _task_identity(task, seed)  # the runner's own record of a run's data and preset
    changed = [f"{k}: {stored.get(k)!r} then {now.get(k)!r}" for k in (*_DATA_KEYS, "model")
               if stored.get(k) != now.get(k)]
    if changed:
        raise ValueError(f"run {rdir} was trained on other data or another model than task {task.name!r} of the "
                         f"config names now ({', '.join(changed)}); analyse it with the config it was run with, "
                         "or run it again with --restart")


def _check_run_preprocessing(rdir: Path, prepared: dict[str, Any]) -> None:
    """Refuse a run whose inputs were prepared otherwise than its data's now, ``prepared`` (that data's
    :func:`~diffusionformer.experiments.reload._data_preprocessing`, computed once per data: its fingerprint hashes
    the data) against ``preprocessing.json`` (another vocabulary, of the same size too, other pixel statistics, or
    another fingerprint of its tokens or graph): its data changed since it was trained (a new Python's
    ``pydoc_data``, a replaced data file), so it would be measured on ids, pixels or a graph that meant something
    else in training. A run without a readable record (an older version's) is measured as before."""
    recorded = read_json_dict(rdir / PREPROCESSING_NAME)
    changes = "" if recorded is None else _preprocessing_changes(recorded, prepared)
    if changes:
        raise ValueError(f"run {rdir}: its inputs were prepared otherwise than this data's ({changes}: "
                         f"{rdir / PREPROCESSING_NAME} records the former): its data changed since it was trained; "
                         "analyse it on the data it was trained on, or run it again with --restart")


def _warn_other_train(config: ExperimentConfig, out_root: Path) -> None:
    """Warn when finished runs were made with another train or model config than ``config``'s (a longer
    ``max_steps``, another ``lr`` or head layout, a ``run --set`` not repeated here; or other data, task settings,
    model class or default dtype: the warning names which): ``run`` and ``publish`` refuse
    them, and their measurements would be filed under this config's names without a word."""
    changed = _runs_of_another_train(config, out_root, verb="analyse")
    if changed:
        warnings.warn(f"analyze (their measurements are filed under this config's names): {changed}", RuntimeWarning,
                      stacklevel=user_stacklevel())


def _check_split(split: object) -> None:
    """The held-out split to measure: ``"test"`` or ``"val"`` (``"train"`` would measure the training examples and
    call them held-out)."""
    if split not in ("test", "val"):
        raise ValueError(f"split must be 'test' or 'val', got {split!r}{_choice_hint(split, ('test', 'val'))}")


# ----------------------------------------------------------------------------- held-out data
def _heldout(
    data: Any, model: torch.nn.Module, split: str, max_examples: int, batch_size: int
) -> tuple[list[Any], dict[str, Any]]:
    """Batches of held-out data for ``capture_dataset`` and a description of them (the data's task adapter)."""
    return heldout_batches(data, model, split, max_examples, batch_size)


# ----------------------------------------------------------------------------- one run
def analyze_run(
    model: torch.nn.Module,
    data: Any,
    *,
    split: str = "test",
    max_examples: int = 512,
    max_attention_examples: int = 64,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Per-layer token-geometry metrics of one trained model on held-out data.

    Args:
        model: a trained ViT, GPT or graph transformer (moved to ``device``, run in eval mode; the
            training mode of each of its modules is restored on return); for a
            self-supervised :class:`~diffusionformer.models.DINO` its teacher backbone
            (``model.backbone``) is analysed, without predictions (it has no classifier).
        data: the task's dataset container (``load_dataset`` output).
        split: ``"test"`` or ``"val"`` (text corpora only have ``val``).
        max_examples: held-out sequences (graphs) to analyse.
        max_attention_examples: of those, how many keep their attention maps.
        batch_size: sequences per forward pass.
        device: where the model runs.

    Returns:
        ``{"layers": [{"layer": l, metric: value, ...}], "spectra": [[s_1, ...] per layer],
        "coefficients": [(H, K+1) per block], "pca_rgb": tensor or None, "info": {...}}``.

    Raises:
        ValueError: ``split`` is not ``"test"`` or ``"val"``.
    """
    _check_split(split)
    family = model_family(model)
    network = find_adapter(family, data, "analysed")  # e.g. DINO: the teacher ViT, its evaluation network
    if network is not None:
        model = network.analysed(model)  # type: ignore[misc]
    model = model.to(device)
    with _evaluating(model):  # the caller's model: its modes come back
        return _analyze_eval(model, data, family, network, split, max_examples, max_attention_examples,
                             batch_size, device)


def _analyze_eval(model: torch.nn.Module, data: Any, family: type | None, network: Any, split: str, max_examples: int,
                  max_attention_examples: int, batch_size: int, device: str | torch.device) -> dict[str, Any]:
    """:func:`analyze_run` of ``model`` in eval mode (``network``: its ``"analysed"`` adapter or None)."""
    batches, info = _heldout(data, model, split, max_examples, batch_size)
    scored = find_adapter(family, data, "predictions")
    is_seq_cls = bool(scored is not None and scored.predictions)
    if network is not None and network.note:
        info["network"] = network.note
    cap = capture_dataset(model, batches, max_examples=max_examples, attentions=True,
                          max_attention_examples=max_attention_examples, keep_outputs=is_seq_cls, device=device)
    prefix = int(getattr(model, "num_prefix", 0) or 0)
    if prefix:
        cap = cap.drop_prefix(prefix)
        info["tokens"] = f"patch tokens ({prefix} class token dropped)"
    predictions = cap.outputs.argmax(dim=-1) if is_seq_cls and cap.outputs is not None else None
    if predictions is not None and cap.labels is not None:
        # cross-checks with the run's own evaluation (same numbers when all of the split is analysed)
        info["accuracy"] = int((predictions == cap.labels).sum()) / cap.num_examples
        info["loss"] = float(torch.nn.functional.cross_entropy(cap.outputs.double(), cap.labels))
    reports = layer_reports(cap, predictions=predictions)
    info.update(num_examples=cap.num_examples, num_attention_examples=cap.num_attention_examples,
                tokens_per_sequence=int(cap.states[0].shape[1]))
    return {
        "layers": [{"layer": r.layer, **r.metrics} for r in reports],
        "spectra": [r.singular_values.tolist() for r in reports],
        "coefficients": [blk.attn.coefficients().detach().cpu().tolist()  # type: ignore[union-attr]
                         for blk in model.blocks],  # type: ignore[union-attr]
        "pca_rgb": _pca_rgb(model, data, split, device),
        "info": info,
    }


@torch.no_grad()
def _pca_rgb(model: torch.nn.Module, data: Any, split: str, device: str | torch.device) -> torch.Tensor | None:
    from diffusionformer.analysis import pca_token_rgb

    grid = getattr(getattr(model, "config", None), "grid_size", None)
    if not (isinstance(data, ClassificationData) and data.kind == "image" and hasattr(model, "forward_patch_tokens")
            and grid is not None and len(grid) == 2):
        return None
    images = data.split(split)[0][:_PCA_IMAGES].to(device)
    tokens = model.forward_patch_tokens(images).float().cpu()  # type: ignore[operator]
    return pca_token_rgb(tokens, tuple(int(g) for g in grid))


# ----------------------------------------------------------------------------- aggregation
def _summary(per_seed: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Mean, sample std (0 for one seed) and count over seeds, per layer and metric.

    Rows are matched by their ``layer`` index, not by position, so a seed that lacks a layer or a metric lowers
    that entry's ``n`` instead of cutting every seed to the shortest list."""
    by_layer: dict[Any, list[dict[str, Any]]] = {}
    for layers in per_seed:
        for r in layers:
            by_layer.setdefault(r["layer"], []).append(r)
    rows = []
    for layer in sorted(by_layer):
        layer_rows = by_layer[layer]
        row: dict[str, Any] = {"layer": layer}
        for key in dict.fromkeys(k for r in layer_rows for k in r):
            if key == "layer":
                continue
            vals = [float(r[key]) for r in layer_rows if r.get(key) is not None and math.isfinite(float(r[key]))]
            row[key] = {
                "mean": statistics.fmean(vals) if vals else None,
                "std": (statistics.stdev(vals) if len(vals) > 1 else 0.0) if vals else None,
                "n": len(vals),
            }
        rows.append(row)
    return rows


def _means(summary: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    mean = [r[key]["mean"] if r.get(key) and r[key]["mean"] is not None else math.nan for r in summary]
    std = [r[key]["std"] if r.get(key) and r[key]["std"] is not None else math.nan for r in summary]
    return mean, std


# ----------------------------------------------------------------------------- entry point
def analyze_experiment(
    config: ExperimentConfig,
    out_root: str | Path = "results",
    *,
    data_root: str | None = None,
    max_examples: int = 512,
    device: str | torch.device | None = None,
    split: str = "test",
    max_attention_examples: int = 64,
    progress: bool = True,
    plots: bool = True,
    partial: bool = False,
) -> dict[str, Any]:
    """Analyse every finished run of ``config`` and write ``<out_root>/<name>/analysis/``.

    Args:
        config: the experiment that was run.
        out_root: the results root given to ``run`` (``--out``).
        data_root: data root for datasets that need one (else ``$DIFFUSIONFORMER_DATA``).
        max_examples: held-out sequences (graphs) per run.
        device: where models run: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (default, or ``"auto"``: CUDA if available, else
            CPU).
        split: held-out split, ``"test"`` or ``"val"`` (text corpora always use ``val``).
        max_attention_examples: sequences per run whose attention maps are kept (attention-graph
            Dirichlet energy).
        progress: show a progress bar over runs.
        plots: write the figures (needs matplotlib; skipped with a warning without it).
        partial: analyse the finished runs of a comparison that is still being run (runs not
            trained yet, and finished runs whose checkpoint is not here, as in a GPU call's results archive, are
            listed in ``skipped_runs``) instead of refusing.

    Returns:
        The content of ``metrics.json``.

    Raises:
        FileNotFoundError: the runs (or, without ``partial``, some run's checkpoint) are missing; the message
            names the path and says to run the comparison first. Unfinished runs are skipped
            with a ``RuntimeWarning``; finished runs made with another train or model config (or other data, task
            settings, model class or default dtype) than ``config``'s are measured with one.
        ValueError: an unknown ``device`` or one this machine lacks; a finished run cannot be measured (e.g. its
            model gives NaN tokens); the message names the run's folder.
    """
    if not isinstance(config, ExperimentConfig):
        raise TypeError(f"config must be an ExperimentConfig (load_experiment_config), got {type(config).__name__}")
    _check_split(split)
    # capture_dataset's rules, before any run is loaded
    max_examples, max_attention_examples = _check_capture_limits(max_examples, max_attention_examples)
    if device is not None:  # run's rule (cpu, cuda, cuda:N that this machine has), before any run is loaded
        from diffusionformer.experiments.gpu import check_device

        device = check_device(str(device) if isinstance(device, torch.device) else device)  # "auto": None
    dev = device if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(out_root) / config.name
    settings = {"version": ANALYSIS_VERSION, "split": split, "max_examples": max_examples,
                "max_attention_examples": max_attention_examples,
                "metrics": [m.key for m in list_metrics()]}  # a metric registered since: measure again
    reuse: dict[Path, dict[str, Any]] = {}  # completed runs without their checkpoint: their cached analysis

    def reusable(rdir: Path) -> bool:
        blob = _weightless_cache(rdir, settings)
        if blob is not None:
            reuse[rdir] = blob
        return blob is not None

    runs, skipped = _find_runs(out, config, partial, reusable)
    for task, _, seed, rdir in runs:  # every run before any is measured
        _check_run_data(rdir, task, seed)
    _warn_other_train(config, Path(out_root))
    result: dict[str, Any] = {
        "experiment": config.name,
        "split": split,
        "max_examples": max_examples,
        "max_attention_examples": max_attention_examples,
        "layer_index": "0 = embeddings (input of block 0); l = residual stream after block l-1",
        "skipped_runs": skipped,
        "skipped_tasks": {},
        "tasks": {},
    }
    pca: dict[str, dict[str, torch.Tensor]] = {}
    spectra: dict[str, dict[str, list[list[list[float]]]]] = {}
    images: dict[str, torch.Tensor] = {}
    pca_fold: dict[str, int | None] = {}  # the fold whose test images the task's PCA maps are of
    bar = tqdm(total=len(runs), desc=f"analyze {config.name}", unit="run", disable=True if not progress else None,
               dynamic_ncols=True)  # None: on a terminal only
    try:
        for task in config.tasks:
            task_runs = [r for r in runs if r[0] is task]
            if not task_runs:
                continue
            loaded: dict[int | None, Any] = {}
            prepared: dict[int, dict[str, Any]] = {}  # each fold's data's preprocessing record, hashed once
            kind = task_data(task, task_runs[0][2], data_root, loaded).kind
            entry: dict[str, Any] = {"dataset": task.dataset, "model": task.model, "kind": kind, "operators": {}}
            result["tasks"][task.name] = entry
            for _, setting, seed, rdir in task_runs:
                data = task_data(task, seed, data_root, loaded)
                bar.set_postfix_str(f"{task.name} / {setting.name} / seed {seed}")
                if rdir in reuse:  # its checkpoint is not here: what the analysis where it was measured
                    step, res, learned = reuse[rdir]["key"]["step"], reuse[rdir]["result"], reuse[rdir]["learned"]
                    model = None
                else:
                    _check_run_preprocessing(rdir, _preprocessing_of(data, prepared))
                    run = load_run(rdir)
                    model, step = run.model, run.step
                    # from the loaded model (not the run's flat learned_operators.json): shapes kept, e.g. (G, K+1)
                    learned = {name: p.detach().cpu().tolist()
                               for name, p in learned_operator_parameters(model).items()}
                    stat = (rdir / CHECKPOINT_NAME).stat()
                    key = {**settings, "step": run.step, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
                    res = _cached(rdir / _CACHE_NAME, key, learned)
                if res is None:
                    try:
                        res = analyze_run(model, data, split=split, max_examples=max_examples,
                                          max_attention_examples=max_attention_examples,
                                          batch_size=min(task.eval_batch_size or 256, 256), device=dev)
                    except _NoBlocks as exc:  # a GCN/GIN baseline beside the transformers: the other tasks go on
                        warnings.warn(f"analyze: task {task.name!r} skipped: its model has no transformer blocks "
                                      f"whose tokens could be measured ({exc})", RuntimeWarning, stacklevel=2)
                        result["skipped_tasks"][task.name] = f"model {type(model).__name__}: no transformer blocks"
                        del result["tasks"][task.name]
                        bar.update(len(task_runs))
                        break
                    except ValueError as exc:  # e.g. a diverged model's NaN tokens: say which run
                        raise ValueError(f"run {rdir}: {exc}") from exc
                    _store(rdir / _CACHE_NAME, key, res, learned)
                res = {**res, "info": dict(res["info"])}
                accuracy, loss = res["info"].pop("accuracy", None), res["info"].pop("loss", None)
                entry.update(res["info"])
                op = entry["operators"].setdefault(setting.name, {"seeds": {}})
                op["seeds"][str(seed)] = {
                    # None: measured where its checkpoint was (a GPU call), read here from its cache
                    "checkpoint": None if rdir in reuse else str(rdir / CHECKPOINT_NAME),
                    "step": step,
                    "heldout_accuracy": accuracy,
                    "heldout_loss": loss,
                    "layers": res["layers"],
                    "coefficients": res["coefficients"],
                    "learned_operators": learned,
                    "singular_values_last_layer": res["spectra"][-1],
                }
                spectra.setdefault(task.name, {}).setdefault(setting.name, []).append(res["spectra"])
                # one row of images per task: only maps of those images (with folds, each fold has its own test
                # split; --partial may leave a setting without a run of the fold the images are of)
                if (res["pca_rgb"] is not None and setting.name not in pca.get(task.name, {})
                        and pca_fold.setdefault(task.name, task.fold_of(seed)) == task.fold_of(seed)):
                    pca.setdefault(task.name, {})[setting.name] = res["pca_rgb"]
                    images[task.name] = data.split(split)[0][:_PCA_IMAGES]
                bar.update(1)
            for op in entry["operators"].values():
                op["summary"] = _summary([s["layers"] for s in op["seeds"].values()])
    finally:
        bar.close()

    adir = out / "analysis"
    adir.mkdir(parents=True, exist_ok=True)
    earlier = read_json_dict(adir / "metrics.json") or {}  # the tasks of the analysis these files replace
    tasks = [t.name for t in config.tasks]
    for key in ("tasks", "skipped_tasks"):
        if isinstance(earlier.get(key), dict):
            tasks += [t for t in earlier[key] if isinstance(t, str)]
    write_json_atomic(adir / "metrics.json", result)
    write_text_atomic(adir / "README.md", _markdown(result))
    written: list[Path] = []
    if plots:
        try:
            written = _write_plots(adir / "plots", result, spectra, pca, images)
        except ImportError as exc:  # matplotlib missing: metrics are still written
            warnings.warn(f"analysis plots skipped: {exc}", RuntimeWarning, stacklevel=2)
    _remove_stale_plots(adir / "plots", tasks, written)
    return json.loads((adir / "metrics.json").read_text())


#: the figures :func:`_write_plots` draws per task, ``<task>_<name>.png``
_FIGURES = ("smoothing", "spectra", "collapse", "pca_maps", "frequency_response", "learned_operators")


def _remove_stale_plots(pdir: Path, tasks: list[str], written: list[Path]) -> None:
    """Remove the figures of an earlier analysis (of ``tasks``: the config's and the earlier ``metrics.json``'s) that
    this one did not draw (``plots=False``, a task or setting dropped, a figure with nothing to show): they would sit
    beside the new ``metrics.json`` as if of it. Only the names :func:`_write_plots` gives are touched."""
    if not pdir.is_dir():
        return
    keep = {p.name for p in written}
    for task in dict.fromkeys(tasks):
        for figure in _FIGURES:
            path = pdir / f"{task}_{figure}.png"
            if path.name in keep or path.parent != pdir or "/" in task or "\\" in task:  # a hostile task name
                continue
            if path.is_symlink() or path.is_file():
                path.unlink(missing_ok=True)


def _load_cache(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # unreadable or from an incompatible version: measure again
        return None
    return blob if isinstance(blob, dict) and isinstance(blob.get("key"), dict) else None


def _cached(path: Path, key: dict[str, Any], learned: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The cached :func:`analyze_run` result at ``path`` if it was made under ``key`` (else None); a cache written
    without the learned operator parameters gets ``learned`` added (to be read once the checkpoint is gone)."""
    blob = _load_cache(path)
    if blob is None or blob.get("key") != key:
        return None
    if learned is not None and not isinstance(blob.get("learned"), dict):
        _store(path, key, blob["result"], learned)
    return blob["result"]


def _weightless_cache(rdir: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The cache of a completed run whose checkpoint is gone (a ``gpu_study.sh`` results archive), if it was made with
    ``settings`` at the run's final step (its ``summary.json``) and holds the learned operator parameters; else None.
    Its checkpoint's size and time cannot be checked: the step stands for them (a run trained again from step 0 by
    ``--restart`` or by hand loses its folder, cache included)."""
    blob = _load_cache(rdir / _CACHE_NAME)
    if blob is None or not isinstance(blob.get("learned"), dict) or not isinstance(blob.get("result"), dict):
        return None
    key = blob["key"]
    summary = read_json_dict(rdir / "summary.json") or {}
    final = summary.get("step")
    if any(key.get(k) != v for k, v in settings.items()) or not isinstance(final, int) or key.get("step") != final:
        return None
    return blob


def _store(path: Path, key: dict[str, Any], res: dict[str, Any], learned: dict[str, Any] | None = None) -> None:
    """Cache ``res`` (and the run's learned operator parameters, for when its checkpoint is gone) under ``key``."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save({"key": key, "result": res, "learned": learned}, tmp)
        tmp.replace(path)
    except BaseException:  # a full disk, an interrupt: no partial temporary left in the run's folder
        tmp.unlink(missing_ok=True)
        raise


# ----------------------------------------------------------------------------- markdown
def _fmt(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.4g}"


def _last_layer_values(op: dict[str, Any], key: str) -> list[float]:
    vals = [s["layers"][-1].get(key) for s in op["seeds"].values()]
    return [float(v) for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]


def _cell(values: list[float], base: list[float] | None) -> str:
    """``mean ± std (t)``: ``t`` is Welch's statistic against the first setting's values."""
    if not values:
        return "n/a"
    sd = f"{statistics.stdev(values):.2g}" if len(values) > 1 else "n/a"  # one value has no sample std (as tables.py)
    text = f"{_fmt(statistics.fmean(values))} ± {sd}"
    t = welch_t(values, base) if base is not None else None
    return text + ("" if t is None else f" ({t:+.1f})")


def _markdown(result: dict[str, Any]) -> str:
    # the split each task measured, as its record says: text has no test split, its held-out windows are val's
    measured = {name: task.get("split", result["split"]) for name, task in result["tasks"].items()}
    splits = sorted(set(measured.values())) or [result["split"]]
    where = f"`{splits[0]}`" if len(splits) == 1 else ", ".join(
        f"`{s}` ({', '.join(n for n, m in measured.items() if m == s)})" for s in splits)
    lines = [f"# Token geometry: {result['experiment']}", "",
             f"Held-out split {where}, up to {result['max_examples']} examples per run. "
             "Layer 0 = embeddings, L = last block. Cells: mean ± sample std over seeds, and in brackets "
             "Welch's t of the difference to the first setting (exploratory: not adjusted for the many metrics and "
             "layers; |t| below about 3 is within seed noise at these few seeds). "
             "Per-layer values of every metric are in metrics.json.", ""]
    for name, why in (result.get("skipped_tasks") or {}).items():
        lines += [f"Task `{name}` is not measured: {why} (token geometry is measured per block of a ViT, GPT or "
                  "graph transformer).", ""]
    always = [m for m in list_metrics() if m.column and m.group in ("smoothing", "spectral")]
    labelled = [m for m in list_metrics() if m.column and m.group not in ("smoothing", "spectral")]
    for name, task in result["tasks"].items():
        seeds = [s for op in task["operators"].values() for s in op["seeds"].values()]
        # a label metric has a column where some run has it (sequence labels: nc1; token labels: token_nc1)
        present = [m for m in labelled if any(m.key in s["layers"][0] for s in seeds)] or labelled[-1:]
        columns = [*always, *present]
        lines += [f"## {name} ({task['dataset']}, {task['model']})", "",
                  f"| operator | {always[0].column} L0 | " + " | ".join(f"{m.column} L" for m in columns) + " |",
                  "|---|---|" + "---|" * len(columns)]
        ops = list(task["operators"].items())
        first = ops[0][1] if ops else None
        for op_name, op in ops:
            key0 = always[0].key  # the first column also at the embeddings
            v0 = [float(v) for v in (s["layers"][0].get(key0) for s in op["seeds"].values())
                  if isinstance(v, (int, float)) and math.isfinite(v)]  # as _last_layer_values
            cells = [_cell(v0, None)]
            for key in [m.key for m in columns]:
                base = None if op is first or first is None else _last_layer_values(first, key)
                cells.append(_cell(_last_layer_values(op, key), base))
            lines.append(f"| {op_name} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += _learned_markdown(task)
    return "\n".join(lines)


def _learned_markdown(task: dict[str, Any]) -> list[str]:
    """Learned operator parameters per block: mean [min, max] over heads and seeds, or mean theta_k."""
    rows = []
    for op_name, op in task["operators"].items():
        per_block: dict[tuple[str, int], list[torch.Tensor]] = {}
        for seed in op["seeds"].values():
            for key, layers in _learned_series(seed.get("learned_operators", {})).items():
                for layer, value in layers.items():
                    per_block.setdefault((key, layer), []).append(value)
        for (key, layer), values in sorted(per_block.items()):
            v = torch.cat([x.reshape(-1, x.shape[-1]) if x.dim() == 2 else x.reshape(-1, 1) for x in values])
            if v.shape[1] > 1:  # polynomial coefficients theta_0..theta_K
                text = "theta = " + ", ".join(f"{c:+.3f}" for c in v.mean(0).tolist())
            else:
                text = f"{v.mean().item():.3f} [{v.min().item():.3f}, {v.max().item():.3f}]"
            rows.append(f"| {op_name} | {key} | {layer} | {text} | {v.shape[0]} |")
    if not rows:
        return []
    return ["Learned operator parameters at the end of training (mean over heads and seeds; "
            "[min, max] for per-head scalars; theta_k = coefficient of P^k):", "",
            "| operator | parameter | block | value | heads x seeds |", "|---|---|---|---|---|", *rows, ""]


# ----------------------------------------------------------------------------- plots
def _by_depth(ax: Any, task: dict[str, Any], key: str, ylabel: str, logy: bool = False) -> bool:
    """One line per operator setting (mean over seeds) with a ±std band; False if nothing to draw."""
    from diffusionformer.analysis import plot_metric_by_depth
    from diffusionformer.analysis.plots import _relegend

    series = {name: _means(op["summary"], key) for name, op in task["operators"].items()}
    if all(all(math.isnan(v) for v in mean) for mean, _ in series.values()):
        ax.set_visible(False)
        return False
    plot_metric_by_depth({name: mean for name, (mean, _) in series.items()}, ylabel, ax=ax,
                         xlabel="layer (0 = embeddings)", logy=logy)
    for line, (mean, std) in zip(ax.lines, series.values()):
        lo = [m - s for m, s in zip(mean, std)]
        hi = [m + s for m, s in zip(mean, std)]
        ax.fill_between(range(len(mean)), lo, hi, color=line.get_color(), alpha=0.2)
    _integer_x(ax)
    _relegend(ax, fontsize=7)  # ax.legend(fontsize=7) dropped the settings named "_..." from the legend
    return True


def _integer_x(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _panels(group: str) -> list[tuple[str, str, bool]]:
    """``(key, label, logy)`` of the registered metrics of ``group`` that have a panel, in panel order."""
    return [(m.key, m.label, m.logy) for m in sorted((m for m in list_metrics(group) if m.panel is not None),
                                                      key=lambda m: m.panel)]


def _figure(**kwargs: Any) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the environment
        from diffusionformer._imports import matplotlib_error

        raise matplotlib_error(exc, 'plots need matplotlib: pip install "diffusionformer[plot]"', "plots need") from exc
    return Figure(layout="constrained", **kwargs)


def _grid(panels: list[tuple[str, str, bool]], task: dict[str, Any], title: str) -> Any:
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = _figure(figsize=(4.2 * cols, 3.3 * rows))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (key, label, logy) in zip(axes, panels):
        _by_depth(ax, task, key, label, logy)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig


def _learned_series(learned: dict[str, Any]) -> dict[str, dict[int, torch.Tensor]]:
    """``{"blocks.0.attn.operators.1.t": [...]}`` -> ``{"t": {0: tensor}}`` (PPR logits as ``alpha``).

    Values keep their shape: ``(G,)`` per head for times and restart probabilities,
    ``(G, K + 1)`` for polynomial coefficients.
    """
    out: dict[str, dict[int, torch.Tensor]] = {}
    for name, values in learned.items():
        m = re.search(r"blocks\.(\d+)\..*operators\.\d+\.(\w+)$", name)
        if m is None:
            continue
        layer, key = int(m.group(1)), m.group(2)
        value = torch.tensor(values, dtype=torch.float64)
        if key == "alpha_logit":
            key, value = "alpha", torch.sigmoid(value)
        out.setdefault(key, {})[layer] = value
    return out


def _plot_learned(fig: Any, learned: dict[str, list[dict[str, dict[int, torch.Tensor]]]], title: str) -> None:
    """One panel per (setting, parameter): per-head values by layer, or coefficients ``theta_k`` by ``k``."""
    panels = [(name, key) for name, runs in learned.items() for key in sorted({k for r in runs for k in r})]
    axes = fig.subplots(1, len(panels), squeeze=False).ravel()
    for ax, (name, key) in zip(axes, panels):
        layers = sorted({layer for r in learned[name] for layer in r.get(key, {})})
        for run in learned[name]:
            for layer, value in sorted(run.get(key, {}).items()):
                color = f"C{layers.index(layer)}"
                if value.dim() == 2:  # (heads, K + 1): one line per head and seed
                    for h, row in enumerate(value):
                        ax.plot(range(row.numel()), row.tolist(), "-o", color=color, ms=3, lw=1, alpha=0.6,
                                label=f"block {layer}" if (run is learned[name][0] and h == 0) else None)
                else:  # one value per head
                    jitter = [layer + 0.08 * (h - (value.numel() - 1) / 2) for h in range(value.numel())]
                    ax.scatter(jitter, value.flatten().tolist(), color=color, s=14, alpha=0.8)
        if any(r.get(key, {}) and next(iter(r[key].values())).dim() == 2 for r in learned[name]):
            ax.axhline(0.0, color="0.7", lw=0.8)
            ax.set(xlabel="k (coefficient of P^k)", ylabel=key, title=f"{name}: {key} (lines = heads x seeds)")
            ax.legend(fontsize=7)
        else:
            ax.set(xlabel="block (dots = heads, all seeds)", ylabel=key, title=f"{name}: {key}")
        _integer_x(ax)
    fig.suptitle(title)


def _write_plots(pdir: Path, result: dict[str, Any], spectra: dict[str, dict[str, list[Any]]],
                 pca: dict[str, dict[str, torch.Tensor]], images: dict[str, torch.Tensor]) -> list[Path]:
    from diffusionformer.analysis import plot_frequency_response, plot_pca_token_maps, plot_spectra
    from diffusionformer.analysis.plots import _relegend
    from diffusionformer.experiments.plots import _save_figure

    _figure()  # fail early (ImportError) without matplotlib
    pdir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        path = pdir / name
        _save_figure(fig, path)  # an interrupted drawing leaves the earlier figure whole, not a torn PNG
        written.append(path)

    for tname, task in result["tasks"].items():
        if not task["operators"]:
            continue
        save(_grid(_panels("smoothing"), task,
                   f"{tname}: smoothing by depth (mean ± std over seeds)"), f"{tname}_smoothing.png")

        fig = _figure(figsize=(12.6, 3.4))
        ax_s, ax_r, ax_a = fig.subplots(1, 3)
        last = {name: torch.tensor(runs).mean(dim=0)[-1] for name, runs in spectra[tname].items()}
        plot_spectra(last, ax=ax_s)
        ax_s.set_title("last layer, sequence-centred tokens")
        _by_depth(ax_r, task, "effective_rank", "effective rank")
        _by_depth(ax_a, task, "power_law_alpha", "power-law exponent alpha")
        fig.suptitle(f"{tname}: token spectra")
        save(fig, f"{tname}_spectra.png")

        first_seed = next(iter(next(iter(task["operators"].values()))["seeds"].values()))["layers"][0]
        labelled = _panels("sequence_label")
        panels = labelled if any(p[0] in first_seed for p in labelled) else _panels("token_label")
        save(_grid(panels, task, f"{tname}: collapse and separability by depth"), f"{tname}_collapse.png")

        if tname in pca:
            fig = plot_pca_token_maps(images[tname], pca[tname], max_images=_PCA_IMAGES)
            fig.suptitle(f"{tname}: top-3 PCA of last-layer patch tokens")
            save(fig, f"{tname}_pca_maps.png")

        coeffs = {}
        for name, op in task["operators"].items():
            c = torch.tensor(next(iter(op["seeds"].values()))["coefficients"][-1], dtype=torch.float64)
            kept = ~torch.isnan(c).any(dim=-1)  # a head that is no polynomial in P has a row of NaN: no line
            if c.numel() and bool(kept.all()):
                coeffs[name] = c
            else:  # each line labelled by its head's index: the rows kept, re-counted from 0, named heads wrongly
                coeffs.update({f"{name}[{h}]": c[h] for h in kept.nonzero().flatten().tolist()})
        if coeffs:
            fig = _figure(figsize=(6.0, 4.0))
            ax = plot_frequency_response(coeffs, ax=fig.subplots())
            _relegend(ax, fontsize=6, ncol=2)  # every head's line, those of a setting "_..." too
            ax.set_title(f"{tname}: f(lambda) of each head, last block (first seed)")
            save(fig, f"{tname}_frequency_response.png")

        learned = {name: [_learned_series(s["learned_operators"]) for s in op["seeds"].values()]
                   for name, op in task["operators"].items()}
        learned = {name: runs for name, runs in learned.items() if any(runs)}
        if learned:
            n = sum(len({k for r in runs for k in r}) for runs in learned.values())
            fig = _figure(figsize=(4.6 * n, 3.6))
            _plot_learned(fig, learned, f"{tname}: learned operator parameters")
            save(fig, f"{tname}_learned_operators.png")
    return written

