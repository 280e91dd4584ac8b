"""A comparison's runs read back from disk: where a run lives, its result, its curves and its state.

Layout of ``<out>/<name>/runs/<task>/<operator>/seed<k>/``: ``summary.json`` (written when a run
ends; ``status`` is ``"completed"``, ``"non_finite"`` (stopped by a non-finite loss) or
``"failed: <reason>"``), ``metrics.jsonl`` (one record per logged step or evaluation),
``learned_operators.json`` and ``run_config.json``. Nothing here loads
a model or data, so reading results back is cheap and safe while other processes train.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from diffusionformer._files import zip_damage
from diffusionformer._warnings import user_stacklevel
from diffusionformer.experiments.config import (ExperimentConfig, OperatorSetting, TaskConfig, _lower_is_better,
                                                train_config)
from diffusionformer.experiments.store import _foreign_lock_note
from diffusionformer.experiments.store import live_holder as _live_holder
from diffusionformer.experiments.tasks import _default_eval_batch_size, as_metrics
from diffusionformer.nn.block import _names_as_read
from diffusionformer.train import read_metrics
from diffusionformer.train.checkpoint import CHECKPOINT_NAME

__all__ = ["RunResult", "finished_runs", "first_reach", "read_curves", "run_dir", "run_status", "select_evaluation"]


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
    #: the device it trained on, as its ``summary.json`` records it (``"cpu"``, ``"cuda:0"``; None when not recorded)
    device: str | None = None
    #: the GPU model it trained on (``summary.json``'s ``device_name``: ``"NVIDIA H100 80GB HBM3"``; None on CPU and
    #: when not recorded): ``device`` (``"cuda:0"``) does not tell an H100 call's runs from an H200 call's
    device_name: str | None = None


def run_dir(out: Path, task: str, operator: str, seed: int) -> Path:
    return out / "runs" / task / operator / f"seed{seed}"


def read_curves(rdir: Path) -> list[dict[str, Any]]:
    """The records of a run's metrics log (empty when it has none yet)."""
    path = rdir / "metrics.jsonl"
    return read_metrics(path) if path.is_file() else []


def finished_runs(out: str | Path, config: ExperimentConfig, results: Sequence[RunResult] = ()) -> list[RunResult]:
    """Every run of ``config`` in config order: those in ``results``, else the finished ones on disk.

    A run is finished on disk when its ``summary.json`` says completed; runs neither in
    ``results`` nor finished are left out, and so is (with a warning) a finished run on disk whose
    ``run_config.json`` holds another definition than a run of its task and operator setting in
    ``results``, whose row would be averaged with theirs: a run that ``resume=False`` has not
    restarted yet, or one trained meanwhile by another process from another config of the same name.

    Args:
        out: the comparison's folder (``<out_root>/<config.name>``).
        config: the comparison.
        results: runs already in memory (they take precedence over the files).
    """
    out = Path(out)
    have = {(r.task, r.operator, r.seed): r for r in results}
    defined: dict[tuple[str, str], dict[str, Any]] = {}  # the definition of the runs in `results`, by task and setting
    for r in results:
        if (r.task, r.operator) in defined:
            continue
        ident = _read_identity(run_dir(out, r.task, r.operator, r.seed))
        if ident is not None:
            defined[(r.task, r.operator)] = _definition(ident)
    merged = []
    for task in config.tasks:
        for setting in config.operators:
            for seed in config.seeds:
                r = have.get((task.name, setting.name, seed))
                if r is None:
                    rdir = run_dir(out, task.name, setting.name, seed)
                    summary = _read_summary(rdir)
                    if summary is not None and summary.get("status") == "completed":
                        ident = _read_identity(rdir)
                        now = defined.get((task.name, setting.name))
                        if ident is not None and now is not None and not _same_definition(_definition(ident), now):
                            changes = _identity_changes(*_comparable(_definition(ident), now))
                            warnings.warn(f"{rdir} holds a finished run made with a different "
                                          f"{changes} than the runs of task "
                                          f"{task.name!r} / setting {setting.name!r} beside it (a run not yet "
                                          "restarted, or one another process trained from another config of the "
                                          "same name); it is left out of the results",
                                          stacklevel=user_stacklevel())
                            continue
                        r = _result_from_files(task, setting, seed, rdir, summary)
                if r is not None:
                    merged.append(r)
    return merged


def _completed(rdir: Path) -> bool:
    summary = _read_summary(rdir)
    return summary is not None and summary.get("status") == "completed"


def _read_summary(rdir: Path) -> dict[str, Any] | None:
    return read_json_dict(rdir / "summary.json")


def read_json_dict(path: Path) -> dict[str, Any] | None:
    """A run file's JSON object, or ``None`` when it is missing or unreadable (truncated, not UTF-8,
    not an object, a folder, not a regular file): callers treat the run as unfinished and rebuild the file from the run.
    A FIFO or a device in a run file's place (``summary.json`` -> ``/dev/zero``) is not read: reading it would block
    for ever or fill the memory."""
    try:
        if not path.is_file():  # raises OSError for a name too long (a results.json row's 300-character task)
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # FileNotFoundError, IsADirectoryError, JSONDecodeError,
        return None  # UnicodeDecodeError; RecursionError: arrays nested thousands deep
    return data if isinstance(data, dict) else None


def _is_finite(value: Any) -> bool:
    """Whether ``value`` is a finite number (not a bool): an int of 400 digits from a hand-edited log is no more
    finite than ``Infinity`` (``math.isfinite`` raises OverflowError on it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _row_problem(data: Any) -> str | None:
    """What makes a ``results.json`` row no :class:`RunResult` the tables can read (``None`` when nothing does): not
    an object, a name that is not a string, a seed that is not an int, a value that is not a number or null
    (``"0.5"``, ``true``, an int of 400 digits), a step or parameter count that is not an int or null, a step,
    parameter count or wall time below 0, a wall time that is not finite (a ``summary.json``'s must be), a value of a
    run that did not complete (``run`` writes ``null``: the tables count the run as failed)."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key in ("task", "operator", "status", "metric"):
        if not isinstance(data.get(key), str):
            return f"{key} must be a string, got {str(data.get(key))[:80]!r}"
    for key in ("seed", "num_parameters", "selected_step", "reach_step"):
        v = data.get(key)
        if (v is not None or key == "seed") and (isinstance(v, bool) or not isinstance(v, int)):
            return f"{key} must be an int{'' if key == 'seed' else ' or null'}, got {str(v)[:80]!r}"
    for key in ("value", "selected_value", "elapsed"):
        v = data.get(key)
        if v is not None and not (isinstance(v, float) or (_is_finite(v) and isinstance(v, int))):
            return f"{key} must be a number or null, got {str(v)[:80]!r}"
    for key in ("num_parameters", "elapsed", "selected_step", "reach_step"):  # counts: the page showed "-3" params
        v = data.get(key)
        if v is not None and v < 0:
            return f"{key} must be >= 0 or null, got {str(v)[:80]!r}"
    if data.get("elapsed") is not None and not _is_finite(data["elapsed"]):  # NaN, Infinity: "nan min" on the page
        return f"elapsed must be finite or null, got {str(data['elapsed'])[:80]!r}"
    for key in ("value", "selected_value"):  # `run` writes null: else averaged in, while counted as failed
        if data["status"] != "completed" and data.get(key) is not None:
            return (f"{key} must be null for a run that did not complete (status {data['status'][:80]!r}), "
                    f"got {str(data[key])[:80]!r}")
    for key in ("device", "device_name"):
        if data.get(key) is not None and not isinstance(data[key], str):
            return f"{key} must be a string or null, got {str(data[key])[:80]!r}"
    return None


def _summary_number(summary: dict[str, Any], key: str, path: Path, *, integral: bool) -> Any:
    """``summary[key]`` (``num_parameters``: an int; ``elapsed``: a finite number >= 0), ``None`` when absent; a value
    of another type (``"many"``, ``true``, ``-3``) is left out with a warning naming the file, not passed on to the
    tables that add and format it."""
    value = summary.get(key)
    if value is None:
        return None
    if _is_finite(value) and value >= 0 and (isinstance(value, int) or not integral):
        return value
    warnings.warn(f"{path}: {key} must be {'an int' if integral else 'a finite number'} >= 0, got {value!r}; "
                  "it is left out of the tables", stacklevel=user_stacklevel())
    return None


def _summary_text(summary: dict[str, Any], key: str, path: Path) -> str | None:
    """``summary[key]`` (``device_name``: a string), ``None`` when absent (a summary written before it was recorded)
    or null (a run on CPU); a value of another type (``3``, ``["H100"]``) is left out with a warning naming the file,
    as :func:`_summary_number` does, not passed on to the tables that name it."""
    value = summary.get(key)
    if value is None or isinstance(value, str):
        return value
    warnings.warn(f"{path}: {key} must be a string or null, got {repr(value)[:80]}; it is left out of the tables",
                  stacklevel=user_stacklevel())
    return None


def _comparable(a: dict[str, Any], b: dict[str, Any], *, now: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two run identities (or definitions) as compared: without ``model_class`` when one was recorded without it (a run
    of a user's model made by a release before the class joined the identity is still the same run; its checkpoint's
    class check guards a resume). With ``now`` (``a`` recorded, ``b`` the identity this release builds), only ``a``
    without it is such a run: ``b`` without it is a library model's, another run than one of a user's class.
    Likewise without an entry of :data:`_RECORDED_SINCE` that one of them lacks (a run recorded before it joined the
    identity: its value is unknown, not another one; or a task that does not use it now)."""
    unknown = {k for k in _RECORDED_SINCE if (k in a) != (k in b)}  # recorded by one only: unknown, no change
    if ("model_class" in a) != ("model_class" in b) and not (now and "model_class" in a):
        unknown.add("model_class")
    if unknown:
        return ({k: v for k, v in a.items() if k not in unknown}, {k: v for k, v in b.items() if k not in unknown})
    return a, b


def _same_definition(a: dict[str, Any], b: dict[str, Any], *, now: bool = False) -> bool:
    """Whether two run identities (or definitions) are one, as :func:`_comparable` compares them."""
    x, y = _comparable(a, b, now=now)
    return x == y


def _definition(identity: dict[str, Any]) -> dict[str, Any]:
    """A run's ``run_config.json`` less what differs from seed to seed (``train.seed``, ``fold``): the same
    for every seed of one task and operator setting of one comparison."""
    d = {k: v for k, v in _normalized_identity(identity).items() if k != "fold"}
    if isinstance(d.get("train"), dict):
        d["train"] = {k: v for k, v in d["train"].items() if k != "seed"}
    return d


# The keys of a run's ``run_config.json`` that name its data; ``folds`` / ``fold`` only with cross-validation.
_DATA_KEYS = ("dataset", "dataset_options", "data_seed", "folds", "fold")


def _data_identity(task: TaskConfig, seed: int) -> dict[str, Any]:
    """The data a run of ``task`` with ``seed`` trains and is measured on, as its ``run_config.json`` records it
    (JSON values): the runner's identity and analyze's check that a run was trained on the config's data."""
    data: dict[str, Any] = {"dataset": task.dataset, "dataset_options": task.dataset_options,
                            "data_seed": task.data_seed}
    if task.folds is not None:  # only then, so runs made before folds existed keep their identity
        data["folds"] = task.folds
        data["fold"] = task.fold_of(seed)
    return json.loads(json.dumps(data, default=str))


def _task_identity(task: TaskConfig, seed: int) -> dict[str, Any]:
    """The entries of a run's identity (``run_config.json``) that ``task`` and ``seed`` give without a model, as JSON
    values, in the order the runner writes them: the data (:func:`_data_identity`), the preset's name, and, only when
    set (so earlier runs keep their identity), the default dtype when not float32, augmentation, label smoothing and
    mini-batching (with its defaults filled in); then the evaluation batch size (null where unset or set to what
    unset resolves to; left out where the evaluation is a mini-batch node task's whole graph).
    ``runner._run_identity`` adds the model's config and class and the training config; :func:`run_status` compares
    these without loading data."""
    import torch

    data = _data_identity(task, seed)
    entries: dict[str, Any] = {**{k: data[k] for k in ("dataset", "dataset_options", "data_seed")}, "model": task.model}
    default_dtype = torch.get_default_dtype()
    if default_dtype != torch.float32:
        # built at the caller's torch.set_default_dtype(torch.float64): a float64 run recorded the identity of the
        # config's float32 one, so a later run of the config in a fresh process read it back as finished (and its
        # table averaged it with float32 seeds). The default dtype, not the parameters' (class and config, recorded,
        # set those): a user's model holding a float64 parameter at the float32 default was recorded as another
        # dtype than its runs made before, which no longer resumed
        entries["dtype"] = str(default_dtype).removeprefix("torch.")
    if task.augment:
        entries["augment"] = task.augment
    if task.label_smoothing:
        entries["label_smoothing"] = task.label_smoothing
    if task.minibatch:
        entries["minibatch"] = task.minibatch_config().to_dict()
    if not (task.minibatch and task.minibatch_config().eval == "full"):  # a whole-graph evaluation reads none
        # which windows a text task scores, which images a DINO task's loss takes, which neighbourhoods a sampled
        # node evaluation draws, a batched loss's summation order; recorded unset too (null: the task's default),
        # as a run recorded without it reads as one of an unknown batch size (:data:`_RECORDED_SINCE`)
        # set to what unset resolves to: the same evaluation, so the same run as one of it unset (null)
        size = task.eval_batch_size
        entries["eval_batch_size"] = None if size == _default_eval_batch(task.dataset) else size
    entries.update({k: data[k] for k in ("folds", "fold") if k in data})  # cross-validation only
    return json.loads(json.dumps(entries, default=str))


#: the keys of :func:`_task_identity` (those set only when not at their default among them)
_TASK_KEYS = (*_DATA_KEYS, "model", "dtype", "augment", "label_smoothing", "minibatch", "eval_batch_size")

#: keys of a run's identity recorded only since runs were published, whatever their value: a run recorded without one
#: was made at a value not known (``eval_batch_size``: gpu_vision's published runs, made with 1024), not another one
_RECORDED_SINCE = ("eval_batch_size",)


def _default_eval_batch(dataset: Any) -> int | None:
    """The ``eval_batch_size`` an unset one resolves to for the registered ``dataset`` (by its kind, known without
    loading it: :func:`~diffusionformer.experiments.tasks.build_task`'s default); ``None`` for a dataset not
    registered here."""
    from diffusionformer.data import dataset_spec

    try:
        kind = dataset_spec(dataset).kind
    except (TypeError, ValueError):
        return None
    return _default_eval_batch_size(kind == "text")


# Fields added to the configs after runs were published, with their defaults: at the default they
# stay out of a run's identity (so earlier runs resume), set to anything else they are part of it.
_NEW_MODEL_FIELDS: dict[str, Any] = {"rope": False, "rope_base": (100.0, 10000.0), "n_kv_head": None,
                                     "zero_init_proj": False, "edge_dim": None, "pe": None, "pe_dim": 8,
                                     "pe_sign_flip": True, "recompute": False, "mlp": "gelu"}
_NEW_TRAIN_FIELDS: dict[str, Any] = {"grad_accum_steps": 1, "weight_decay_rule": "default", "loggers": ("jsonl",)}


def _new_model_fields(config_cls: Any) -> dict[str, Any]:
    """:data:`_NEW_MODEL_FIELDS` for a model config class (or the name of a preset): ``rope_base`` at that class's own
    default (GPT's 10000, the ViT's 100), either of them only where the class is not known. Either default for every
    model made a GPT run at base 100 (a ViT run at 10000) the same run as one at the model's own base."""
    import dataclasses

    if isinstance(config_cls, str):
        from diffusionformer.models import get_preset

        try:
            config_cls = get_preset(config_cls).config_cls
        except ValueError:  # a preset not registered now (a user's): its default is not known
            config_cls = None
    spec = ({f.name: f for f in dataclasses.fields(config_cls)}.get("rope_base")
            if isinstance(config_cls, type) and dataclasses.is_dataclass(config_cls) else None)
    own = None if spec is None else spec.default  # a default_factory's value too (MISSING kept it in every identity)
    if spec is not None and own is dataclasses.MISSING:
        own = None if spec.default_factory is dataclasses.MISSING else spec.default_factory()
    return _NEW_MODEL_FIELDS if own is None else {**_NEW_MODEL_FIELDS, "rope_base": own}


def _without_new_defaults(d: dict[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``d`` without the keys of ``new`` whose value is the default listed there (a tuple: any of them)."""
    def at_default(key: str, value: Any) -> bool:
        default = new[key]
        if isinstance(default, tuple) and key != "loggers":
            return value in default
        return (list(value) if isinstance(value, (list, tuple)) else value) == (
            list(default) if isinstance(default, tuple) else default)
    return {k: v for k, v in d.items() if not (k in new and at_default(k, v))}


def _normalized_identity(identity: dict[str, Any]) -> dict[str, Any]:
    """A stored ``run_config.json`` without the fields added later that sit at their defaults, as a run's identity
    leaves them out now: a run recorded before such a field existed and one recorded while it was still written at
    its default (``"recompute": false`` before it joined :data:`_NEW_MODEL_FIELDS`) are the same run."""
    d = dict(identity)
    if isinstance(d.get("model_config"), dict):
        d["model_config"] = _without_new_defaults(_names_as_read(d["model_config"]), _new_model_fields(d.get("model")))
    if isinstance(d.get("train"), dict):
        d["train"] = _without_new_defaults(d["train"], _NEW_TRAIN_FIELDS)
    size = d.get("eval_batch_size")
    if size is not None and size == _default_eval_batch(d.get("dataset")):  # as :func:`_task_identity` records it
        d["eval_batch_size"] = None
    return d


def _train_identity(train: Any) -> dict[str, Any]:
    """The ``train`` entry of a run's identity (``run_config.json``): the training config without its progress bar
    and device, and without fields added later that are at their defaults."""
    return _without_new_defaults({k: v for k, v in train.to_dict().items() if k not in ("progress", "device")},
                                 _NEW_TRAIN_FIELDS)


@dataclass
class _Change:
    """One part of a run's identity (``run_config.json``) where a stored run differs from the config: ``part`` is its
    key (``"train"``, ``"model_config"``, ``"model_class"``, ``"dtype"``, ``"data_seed"``, ...), ``old`` the stored
    run's value and ``new`` the config's (``None``: not recorded). ``run_status``'s ``changed`` text and the advice of
    :func:`_runs_of_another_train` are both made from these, so the advice never reads the text back."""

    part: str
    old: Any = None
    new: Any = None

    def keys(self) -> list[str]:
        """The entries of a dict-valued part that differ (``["lr"]``); empty for any other part."""
        a, b = self.old, self.new
        if not (isinstance(a, dict) and isinstance(b, dict)):
            return []
        return [s for s in sorted(set(a) | set(b)) if a.get(s) != b.get(s)]

    def text(self) -> str:
        """The part as ``changed`` names it: ``"train (lr: 0.001 then 0.5)"``, ``"model_class (a.A then b.B)"``,
        ``"eval_batch_size (64 then unset)"``,
        ``"dtype (float64 then float32: ...)"`` or the bare key."""
        a, b = self.old, self.new
        if isinstance(a, dict) and isinstance(b, dict):
            sub = ", ".join(f"{s}: {a.get(s, 'unset')!r} then {b.get(s, 'unset')!r}" for s in self.keys())
            return f"{self.part} ({sub})"
        if self.part in ("model_class", "eval_batch_size"):  # two classes of one preset name, two sizes: which ones
            return f"{self.part} ({a if a is not None else 'unset'} then {b if b is not None else 'unset'})"
        if self.part == "dtype":  # recorded only when not float32: the default dtype the model was built at
            return (f"{self.part} ({a if a is not None else 'float32'} then {b if b is not None else 'float32'}: "
                    "torch.get_default_dtype() when the models were built)")
        return self.part


def _identity_diff(stored: dict[str, Any], now: dict[str, Any]) -> list[_Change]:
    """The keys where two run identities differ, in key order, as :class:`_Change` records."""
    return [_Change(k, stored.get(k), now.get(k)) for k in sorted(set(stored) | set(now))
            if stored.get(k) != now.get(k)]


def _changes_text(changes: Sequence[_Change]) -> str:
    """``changes`` in words, as ``run_status``'s ``changed`` and the runner's refusals name them."""
    return ", ".join(c.text() for c in changes)


def _identity_changes(stored: dict[str, Any], now: dict[str, Any]) -> str:
    """The keys where two run identities differ, a dict-valued key with its changed entries:
    ``"train (lr: 0.001 then 0.5)"``."""
    return _changes_text(_identity_diff(stored, now))


def _model_class_name(cls: type) -> str | None:
    """A model class as a run's identity records it (``model_class``): ``module.qualname`` of a user's class, ``None``
    for one of the library's (their runs record none, so they keep their identity)."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    return None if name.startswith("diffusionformer.") else name


def _model_class_change(task: TaskConfig, stored: dict[str, Any], rdir: Path) -> list[_Change]:
    """``[_Change("model_class", old, new)]`` (``"model_class (old then new)"``) when a run's stored (normalized)
    identity records another class than the one ``task``'s preset builds now, else ``[]``: also when the run records
    none (a library class's, or made before the class joined the identity) and its checkpoint names none or the
    preset builds a library class now (:func:`_with_recorded_class`, :func:`_comparable`), or the preset is a
    factory, not a class (its model's class is known once it is built: ``run`` tells), or is not registered here."""
    from diffusionformer.models import get_preset

    try:
        cls = get_preset(task.model).model_cls
    except (ValueError, TypeError, KeyError):
        return []
    if not isinstance(cls, type):
        return []
    now = _model_class_name(cls)
    stored = _with_recorded_class(rdir, stored, now)
    if "model_class" not in stored or now == stored["model_class"]:
        return []
    return _identity_diff({"model_class": stored["model_class"]}, {} if now is None else {"model_class": now})


def _model_changes(task: TaskConfig, setting: OperatorSetting, stored: dict[str, Any]) -> list[_Change]:
    """What changed between a run's stored (normalized) ``model_config`` and the one ``task`` and ``setting`` give now,
    e.g. ``"model_config (laplacian_heads: 1 then 2)"`` (as :class:`_Change` records), else ``[]``; without loading the
    data: the sizes the model takes from the data are the stored ones, the head layout and the task's and setting's
    overrides are the config's (a model override dropped from the config since, back at its preset default, is not told
    from a data size; the fields of :data:`_NEW_MODEL_FIELDS` are no data size, so one of them dropped since is told: a
    setting's ``mlp = "swiglu"`` run, read without it, was "completed" and ``publish`` put it under the config's GELU),
    and a DINO run's task settings (the task's ``ssl`` table: ``"model_config (knn_k: 20 then 5)"``) as the runner
    records them."""
    import dataclasses

    from diffusionformer.experiments.build import add_setting_overrides
    from diffusionformer.models import get_preset, model_config
    from diffusionformer.models.registry import split_task_settings, task_config

    try:
        fields = {f.name for f in dataclasses.fields(get_preset(task.model).config_cls)}
        base = {k: v for k, v in stored.items()
                if k in fields and k not in ("heads", "laplacian_heads") and k not in _NEW_MODEL_FIELDS}
        overrides = {**base, **task.model_overrides}
        add_setting_overrides(overrides, model_config(task.model, **overrides), task, setting)
        overrides, moved = split_task_settings(task.model, overrides, warn=False)
        now = dataclasses.asdict(model_config(task.model, **overrides))
        # task settings (DINO's ssl table, and any a setting still passes among its overrides), as build_model gives
        # the model and the runner records them: they were not compared, so a run of other views or k-NN settings was
        # "completed" and published under the config while run refused it
        settings = task_config(task.model, **{**task.ssl, **moved})
    except (ValueError, TypeError, KeyError):  # the config's model does not build on the run's sizes: run says why
        return []
    if dataclasses.is_dataclass(settings):
        now.update(dataclasses.asdict(settings))
    now = json.loads(json.dumps(_without_new_defaults(now, _new_model_fields(task.model)), default=str))
    now.update({k: v for k, v in stored.items() if k not in fields and k not in now})  # entries no config names now
    return _identity_diff({"model_config": stored}, {"model_config": now})


def run_status(config: ExperimentConfig, out_root: str | Path) -> list[dict[str, Any]]:
    """Where every run of ``config`` stands, without loading any model or data.

    One row per run in config order: ``task``, ``operator``, ``seed``, ``state`` (``"completed"``,
    ``"failed"``, ``"running"`` (a live process holds its lock), ``"interrupted"`` (started, not
    finished, nobody training it) or ``"missing"``), ``step`` (updates logged so far), ``resumes_from`` (of an
    interrupted run: the step of its checkpoint, where ``run`` takes it up again and cuts its log back to, unless
    beyond ``max_steps``: a longer run's, which ``run`` fails; 0 without a checkpoint; ``None`` for a checkpoint that
    cannot be read, and for every other state), ``max_steps``,
    ``elapsed`` (training seconds so far), ``holder`` (the lock's process, e.g. ``"pid 4242 on nodeA"``; for a lock of
    another host, whose process cannot be checked from here, followed by how long ago the run last showed a sign of
    life: ``"pid 4242 on nodeA; nodeA is another host; the run last showed a sign of life 3 h 5 min ago"``),
    ``other_host`` (whether that lock is another host's: it holds for ever when that node failed), and
    ``changed``: for a run on disk made with another training or model config than ``config``'s now (a longer
    ``max_steps``, another ``lr``, another head layout or ``model_overrides``, a preset registered again with another
    model class, other ``dataset_options``, ``data_seed``, augmentation, label smoothing or ``eval_batch_size``, a DINO
    task's other ``ssl`` settings, another default dtype), what changed, e.g.
    ``"train (max_steps: 100 then 200)"`` or ``"model_config (laplacian_heads: 1 then 2)"`` (``run``
    refuses it until ``--restart``), else ``None``.

    Args:
        config: the comparison.
        out_root: the results root given to ``run`` (``--out``).
    """
    return [row for row, _ in _status_rows(config, out_root)]


def _nothing_to_continue(rdir: Path) -> bool:
    """Whether the run in ``rdir`` stopped before its first checkpoint and wrote no summary: nothing of it is
    continued, so ``run`` starts it again under the config whatever its ``run_config.json`` records."""
    return not any(os.path.lexists(rdir / name) for name in (CHECKPOINT_NAME, "summary.json"))


def _status_rows(config: ExperimentConfig, out_root: str | Path) -> list[tuple[dict[str, Any], list[_Change]]]:
    """:func:`run_status`'s rows, each with the :class:`_Change` records its ``changed`` text is made of (empty when
    ``changed`` is ``None``): what :func:`_runs_of_another_train` advises from."""
    out = Path(out_root) / config.name
    rows = []
    for task in config.tasks:
        max_steps = train_config(task, config.seeds[0]).max_steps  # the task's budget, defaults resolved
        trains = {seed: json.loads(json.dumps(_train_identity(train_config(task, seed)), default=str))
                  for seed in config.seeds}  # as run_config.json holds it
        task_entries = {seed: _task_identity(task, seed) for seed in config.seeds}
        for setting in config.operators:
            for seed in config.seeds:
                rdir = run_dir(out, task.name, setting.name, seed)
                summary = _read_summary(rdir)
                row: dict[str, Any] = {"task": task.name, "operator": setting.name, "seed": seed, "max_steps": max_steps,
                                       "step": 0, "resumes_from": None, "elapsed": None, "holder": None,
                                       "other_host": False, "changed": None}
                stored = _read_identity(rdir) if rdir.is_dir() else None
                stored = None if stored is None else _normalized_identity(stored)
                changes: list[_Change] = []
                if stored is not None and isinstance(stored.get("train"), dict) and stored["train"] != trains[seed]:
                    changes += _identity_diff({"train": stored["train"]}, {"train": trains[seed]})
                if stored is not None and isinstance(stored.get("model_config"), dict) and stored["model_config"]:
                    changes += _model_changes(task, setting, stored["model_config"])
                if stored is not None:  # a preset registered again with another class of the same config
                    changes += _model_class_change(task, stored, rdir)
                if stored is not None:  # other data (dataset_options, data_seed), augmentation, default dtype, ...
                    now = task_entries[seed]
                    changes += _identity_diff(*_comparable({k: stored[k] for k in _TASK_KEYS if k in stored},
                                                           {k: now[k] for k in _TASK_KEYS if k in now}))
                if changes and _nothing_to_continue(rdir):  # `run` starts it again under the config: no change
                    changes = []  # to report (its advice was `run --restart`, which retrains every run of the task)
                row["changed"] = _changes_text(changes) or None
                if summary is not None and summary.get("status") == "completed":
                    step = summary.get("step", max_steps)  # a hand-edited "ten" or -3 reads as the budget done
                    row.update(state="completed", step=step if _is_finite(step) and isinstance(step, int) and step >= 0
                               else max_steps, elapsed=_summary_number(summary, "elapsed", rdir / "summary.json",
                                                                        integral=False))
                elif not rdir.is_dir():
                    row["state"] = "missing"
                else:
                    records = read_curves(rdir)
                    if records:
                        elapsed = records[-1].get("elapsed")
                        row.update(step=int(records[-1].get("step", 0)),
                                   elapsed=elapsed if _is_finite(elapsed) and elapsed >= 0 else None)
                    holder = _live_holder(rdir)
                    row["holder"] = None if holder is None else f"pid {holder[0]} on {holder[1]}"
                    note = None if holder is None else _foreign_lock_note(rdir)
                    if note is not None:  # a failed node's lock holds for ever: its last sign of life tells
                        row["holder"] += f"; {note}"
                        row["other_host"] = True
                    if holder is not None:
                        row["state"] = "running"
                    elif summary is not None and _failed(summary):
                        row["state"] = "failed"
                    else:
                        checkpoint = rdir / "checkpoint.pt"
                        row["state"] = "interrupted" if (records or checkpoint.is_file()) else "missing"
                        if row["state"] == "interrupted":  # logged steps past the checkpoint are trained again
                            # a folder (a link to nothing) in its place: run refuses it, as an unreadable one (None)
                            row["resumes_from"] = (_checkpoint_step(checkpoint) if checkpoint.is_file()
                                                   else None if os.path.lexists(checkpoint) else 0)
                rows.append((row, changes))
    return rows


def _runs_of_another_train(config: ExperimentConfig, out_root: str | Path, *, verb: str | None = None) -> str | None:
    """Which finished runs of ``config`` under ``out_root`` were made with another definition than its own (another
    train or model config: a ``run --set ...`` read without the overrides, a setting redefined since; other data or
    task settings; another model class: a preset registered again; another default dtype: ``status`` counts them as
    not completed), said in words naming what differs; else None. ``publish`` refuses such runs, ``summary`` and
    ``analyze`` warn. With ``verb`` (``"publish"``, ``"analyse"``, ``"run `summary`"``), the message ends with what
    makes them this config's runs again, each where it fits: the ``--set`` overrides they were run with (naming the
    ``--set`` of each task entry that differs: ``--set tasks.t.data_seed=0``), the default dtype they were made at, the
    model class they were made with (which no ``--set`` value changes), or ``run --restart``. Made from
    :func:`_status_rows`' records, not by reading the ``changed`` text back."""
    changed = [(r, changes) for r, changes in _status_rows(config, out_root) if r["state"] == "completed" and changes]
    if not changed:
        return None
    first = changed[0][0]
    parts = [(r["task"], c) for r, changes in changed for c in changes]
    kinds = {_change_kind(c.part) for _, c in parts}
    named = []
    if "config" in kinds:
        named.append("another train or model config")
    for kind, words in (("data", "other data"), ("preset", "another model preset"), ("task", "other task settings")):
        if kind in kinds:
            keys = sorted({c.part for _, c in parts if _change_kind(c.part) == kind})
            named.append(words if kind == "preset" else f"{words} ({', '.join(keys)})")
    if "class" in kinds:
        named.append("another model class")
    if "dtype" in kinds:
        named.append("another default dtype")
    what = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
    text = (f"{len(changed)} finished run(s) of {config.name!r} were made with {what} than this config's, "
            f"e.g. {first['task']!r} / {first['operator']!r} seed {first['seed']} ({first['changed']})")
    if verb is None:
        return text
    fixes = []
    datasets = {t.name: t.dataset for t in config.tasks}
    # each run's own dataset, which its recorded unset eval_batch_size resolved by (the config's may be another)
    made_on = [(r["task"], c, next((d.old for d in changes if d.part == "dataset"), datasets.get(r["task"])))
               for r, changes in changed for c in changes]
    if kinds & {"config", "data", "preset", "task"}:
        sets = list(dict.fromkeys(s for task, c, dataset in made_on
                                  if _change_kind(c.part) in ("data", "preset", "task")
                                  for s in [_set_of(task, c, dataset)] if s))
        fixes.append(f"{verb} with the --set overrides they were run with" + (f" ({', '.join(sets)})" if sets else ""))
    dtype = next((c.old or "float32" for _, c in parts if c.part == "dtype"), None)
    if dtype is not None:  # no --set value either: the caller's default dtype (a notebook's set_default_dtype)
        fixes.append(f"{verb} after torch.set_default_dtype(torch.{dtype}), the default they were made at")
    swapped = next(((task, c) for task, c in parts if c.part == "model_class"), None)
    if swapped is not None:  # "--set overrides" cannot bring a class back: the advice named a fix that does not exist
        model = next((t.model for t in config.tasks if t.name == swapped[0]), None)
        fixes.append(f"register the class they were made with ({swapped[1].old}) as model preset {model!r} again "
                     "(no --set value changes a preset's class)")
    return f"{text}; {', or '.join([*fixes, 'redo them with `run --restart`'])}"


def _change_kind(part: str) -> str:
    """What kind of difference a :class:`_Change` of identity key ``part`` is, for the advice: ``"config"`` (train or
    model config), ``"class"``, ``"dtype"``, ``"data"`` (:data:`_DATA_KEYS`), ``"preset"`` (the preset's name) or
    ``"task"`` (augmentation, label smoothing, mini-batching, evaluation batch size)."""
    return {"train": "config", "model_config": "config", "model_class": "class", "dtype": "dtype",
            "model": "preset"}.get(part, "data" if part in _DATA_KEYS else "task")


#: the value of a task entry that a stored run without it was made with (:func:`_task_identity` leaves these out at
#: their defaults); ``folds`` has none a ``--set`` can give (TOML has no null)
_TASK_DEFAULTS: dict[str, Any] = {"augment": {}, "label_smoothing": 0.0, "minibatch": {}}


def _set_of(task: str, change: _Change, dataset: str | None = None) -> str | None:
    """The ``--set`` that gives task ``task``'s entry ``change.part`` the value its stored run was made with
    (``--set tasks.t.data_seed=0``, shell-quoted; an ``eval_batch_size`` recorded unset: the size the run's
    ``dataset`` resolves it to), ``None`` where none does (``fold``: it follows ``folds`` and the seed; ``folds`` of a
    run made without cross-validation)."""
    import shlex

    value = change.old if change.old is not None else _TASK_DEFAULTS.get(change.part)
    if value is None and change.part == "eval_batch_size":  # unset (TOML has no null): the size the task's
        value = _default_eval_batch(dataset)  # ``dataset`` resolves it to, which records as unset
    toml = None if change.part == "fold" else _toml_value(value)
    if toml is None:
        return None
    # not json.dumps: a character past U+FFFF was written as two \u surrogates, DEL as it is: keys TOML refuses
    name = _toml_key(task)
    if name is None:  # a task name TOML cannot spell
        return None
    return f"--set {shlex.quote(f'tasks.{name}.{change.part}={toml}')}"


def _toml_value(value: Any) -> str | None:
    """``value`` (a JSON value of a run's identity) as an inline TOML value, ``None`` where TOML has none (null, a lone
    surrogate)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if math.isfinite(value):
            return repr(value)
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        items = [_toml_value(v) for v in value]
        return None if None in items else f"[{', '.join(items)}]"
    if isinstance(value, dict):
        items = [(_toml_key(k), _toml_value(v)) for k, v in value.items()]
        if any(k is None or v is None for k, v in items):  # a key holding a lone surrogate has no TOML text either
            return None
        return "{" + ", ".join(f"{k} = {v}" for k, v in items) + "}"
    return None


def _toml_string(text: str) -> str | None:
    """``text`` as a TOML basic string, ``None`` where TOML has none (a lone surrogate, from a JSON ``"\\ud800"``):
    JSON's escapes are TOML's but for DEL, which JSON leaves as it is and a TOML string may not hold."""
    if any("\ud800" <= c <= "\udfff" for c in text):
        return None
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_key(key: str) -> str | None:
    """``key`` as a TOML key: bare where TOML allows it, else quoted (:func:`_toml_string`)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_string(key)


def _checkpoint_entry(path: Path, key: str) -> Any:
    """``checkpoint[key]`` of a trainer checkpoint, read without loading its tensors (``weights_only``,
    memory-mapped); ``None`` if the file cannot be read as one (``run`` says why when it resumes)."""
    import torch

    for mmap in (True, False):  # a file in torch's legacy format cannot be memory-mapped: read it whole
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap).get(key)
        except Exception:  # truncated, corrupt, refused by weights_only, not a mapping, unreadable
            continue
    return None


def _checkpoint_step(path: Path) -> int | None:
    """The ``step`` a trainer checkpoint holds (``None``: unreadable, see :func:`_checkpoint_entry`, a file whose bytes
    fail their CRC-32 included, which ``run`` refuses as corrupt though its step would load)."""
    if zip_damage(path) is not None:  # reads every byte: only for the step status says a run resumes from
        return None
    step = _checkpoint_entry(path, "step")
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


def _left_out_rope_base(model_config: Mapping[str, Any], record: Any) -> float | None:
    """The ``rope_base`` of a run folder written before 41b9968 whose ``run_config.json`` (``model_config``) left it
    out: the one its checkpoint's model record ``record`` holds, where that is 100.0 or 10000.0 (the runner left either
    out of every model's identity until then, so a ViT run at 10000, a GPT at 100, read as one at the model's own
    base); else ``None``: any other field or value is the record's to check, not to supply."""
    saved = record.get("config") if isinstance(record, Mapping) else None
    base = saved.get("rope_base") if isinstance(saved, Mapping) else None
    if ("rope_base" in model_config or not isinstance(base, (int, float)) or isinstance(base, bool)
            or base not in _NEW_MODEL_FIELDS["rope_base"]):
        return None
    return float(base)


def _read_identity(rdir: Path) -> dict[str, Any] | None:
    """A run's ``run_config.json`` (:func:`read_json_dict`) with the ``rope_base`` :func:`_left_out_rope_base` reads
    from its checkpoint, as ``load_run`` builds the run: else a GPT run at base 100 from before 41b9968 was ``status``'s
    completed run of the config at GPT's own 10000 (``run`` skipped it, the tables filed it there) and a changed run
    of the config at 100 (``run`` refused it). The record is read (memory-mapped, some ms) only for a model with RoPE
    on: without it the base changes nothing the model computes."""
    identity = read_json_dict(rdir / "run_config.json")
    model_config = identity.get("model_config") if identity is not None else None
    ckpt = rdir / CHECKPOINT_NAME
    if (not isinstance(model_config, dict) or "rope_base" in model_config or not model_config.get("rope")
            or not ckpt.is_file()):  # a FIFO there: torch.load waited for a writer for ever
        return identity
    base = _left_out_rope_base(model_config, _checkpoint_entry(ckpt, "model_record"))
    return identity if base is None else {**identity, "model_config": {**model_config, "rope_base": base}}


def _with_recorded_class(rdir: Path, stored: dict[str, Any], now: str | None) -> dict[str, Any]:
    """``stored`` (a run's identity) with the ``model_class`` its checkpoint's model record names, when the identity was
    recorded without one (before the class joined it, or of a library class: those record none) and the class is a
    user's (``now``, this release's identity's, is ``None`` for the library's classes: their runs are not read). Else a
    preset registered again with another class, every seed of it recorded so, was the same run: its rerun skipped,
    reporting the first class's results. A record naming a library class is kept too (``now`` is a user's, so it is
    another class): a preset first registered with ``DiffusionViT``, then with a user's subclass, was the same run."""
    if "model_class" in stored or now is None:
        return stored
    record = _checkpoint_entry(rdir / "checkpoint.pt", "model_record")
    recorded = record.get("class") if isinstance(record, dict) else None
    if not isinstance(recorded, str):
        return stored  # no checkpoint (or none readable): the trainer's model record check guards a resume
    return {**stored, "model_class": recorded}


def _failed(summary: dict[str, Any]) -> bool:
    """Whether a run's summary says it failed: ``"failed: <reason>"``, or ``"non_finite"`` (the Trainer stopped
    it on a non-finite loss)."""
    status = str(summary.get("status", ""))
    return status.startswith("failed") or status == "non_finite"


def _result_from_files(task: TaskConfig, setting: OperatorSetting, seed: int, rdir: Path, summary: dict[str, Any]) -> RunResult:
    record = summary.get("eval")
    if record is not None and not (isinstance(record, dict) and isinstance(record.get("metrics", {}), dict)):
        raise ValueError(f"{rdir / 'summary.json'}: 'eval' is not an evaluation record: {str(record)[:80]}")
    final = as_metrics(record)
    if record:  # a metric that was NaN or inf is written as null (strict JSON has no NaN): it stays non-finite
        final.update({k: math.nan for k, v in record.get("metrics", {}).items() if v is None})
    # an int too large for a float (a hand-edited 400-digit value) is no finite number either: passed on, the tables'
    # math.isfinite raised OverflowError and took every run of the comparison down with it
    final.update({k: math.nan for k, v in final.items() if not isinstance(v, float) and not _is_finite(v)})
    value = final.get(task.metric)
    if value is None and record and task.metric in record.get("metrics", {}):  # "0.5", true, a list: a hand edit
        raise ValueError(f"{rdir / 'summary.json'}: task {task.name!r}'s metric {task.metric!r} must be a number or "
                         f"null, got {str(record['metrics'][task.metric])[:80]!r}; delete the file to have `run` "
                         "rebuild it from the run's checkpoint")
    if value is None and record:
        raise ValueError(f"task {task.name!r}: metric {task.metric!r} is not among the evaluation keys {sorted(final)} "
                         f"of {rdir / 'summary.json'}")
    learned_path = rdir / "learned_operators.json"
    learned = read_json_dict(learned_path) if learned_path.exists() else {}
    if learned is None:
        warnings.warn(f"{learned_path} is unreadable; the run's learned operator values are left out of the tables",
                      stacklevel=user_stacklevel())
        learned = {}
    curves = read_curves(rdir) if task.select_by or task.reach else []
    selected_value, selected_step = select_evaluation(curves, task) if task.select_by else (None, None)
    spath = rdir / "summary.json"
    device = summary.get("device")  # absent in a summary written before it was recorded: the row reads as before
    return RunResult(task.name, setting.name, seed, "completed", task.metric, value, final,
                     _summary_number(summary, "num_parameters", spath, integral=True),
                     _summary_number(summary, "elapsed", spath, integral=False), learned, selected_value, selected_step,
                     first_reach(curves, task) if task.reach else None, device if isinstance(device, str) else None,
                     _summary_text(summary, "device_name", spath))


def select_evaluation(records: list[dict[str, Any]], task: TaskConfig) -> tuple[float | None, int | None]:
    """``(metric, step)`` of the evaluation with the best ``task.select_by`` (the earliest step among ties, in any log order).

    ``select_by`` is maximised unless lower is better (its name ends in ``loss``, ``ppl``, ``error``, ...:
    ``config._LOWER_IS_BETTER``). ``(None, None)`` when no
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
    key, sign = task.select_by, (-1.0 if _lower_is_better(task.select_by) else 1.0)
    best: tuple[float, int, float] | None = None
    # in step order, as first_reach: a log whose evaluations are not in step order keeps the earliest of a tie
    for r in sorted((r for r in records if r.get("split") == "eval"), key=lambda r: int(r["step"])):
        m = as_metrics(r)
        if key in m and task.metric in m and _is_finite(m[key]):
            score = sign * m[key]
            if best is None or score > best[0]:
                value = m[task.metric]  # an int too large for a float: non-finite, not an OverflowError
                value = float(value) if isinstance(value, float) or _is_finite(value) else math.nan
                best = (score, int(r["step"]), value)
    return (None, None) if best is None else (best[2], best[1])


def first_reach(records: list[dict[str, Any]], task: TaskConfig) -> int | None:
    """The first evaluated step at which ``task.reach``'s key meets its threshold, else ``None``.

    The key must reach ``>=`` the threshold, or ``<=`` for keys that are minimised (losses,
    perplexities, error rates, distances: as ``metric``'s direction). The step
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
    sign = -1.0 if _lower_is_better(key) else 1.0
    for r in sorted((r for r in records if r.get("split") == "eval"), key=lambda r: int(r["step"])):
        value = as_metrics(r).get(key)
        if _is_finite(value) and sign * value >= sign * threshold:
            return int(r["step"])
    return None
