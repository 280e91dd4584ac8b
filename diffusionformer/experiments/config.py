"""Experiment configs: TOML files validated strictly, with command-line overrides.

A comparison names tasks (dataset + model preset + training budget), operator settings
(head layouts applied to every task's model) and seeds::

    name = "default"
    seeds = [0, 1, 2]

    [[tasks]]
    name = "digits"
    dataset = "digits"
    model = "vit-digits"
    metric = "test_acc"
    [tasks.train]
    max_steps = 300
    batch_size = 64

    [[operators]]
    name = "attention"

    [[operators]]
    name = "laplacian-half"
    laplacian_heads = "half"

Head specs may use ``{H}`` (heads per layer) and ``{half}`` (``H // 2``) so one setting fits
models of different widths, e.g. ``heads = "attention:{half},heat(t=0.5, learnable=True):{half}"``.
"""

from __future__ import annotations

import collections
import copy
import math
import numbers
import os
import sys
import unicodedata
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping

from diffusionformer._warnings import user_stacklevel
from diffusionformer.config import (_choice_hint, _closest_choice, _in_context, _python_number, _raise_collected,
                                    _value_type, check_value, config_from_dict, config_to_dict, document_fields)
from diffusionformer.data.splits import _MAX_SEED  # the largest data_seed: the splits' torch generators take it
from diffusionformer.nn.heads import format_head_spec, laplacian_count
from diffusionformer.train import TrainConfig
from diffusionformer.train.config import _MAX_RUN_SEED, _check_int

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "ExperimentConfig",
    "OperatorSetting",
    "TaskConfig",
    "apply_overrides",
    "load_experiment_config",
    "parse_override",
]


#: the quantities a contrast is taken on (compare.KINDS): the final metric, the metric at the best select_by
#: evaluation, the steps to a reach threshold
_QUANTITIES = ("final", "selected", "reach")
_QUANTITY_WORDS = {"final": "final metric", "selected": "metric at the best evaluation", "reach": "steps to the threshold"}

#: the most folds whose runs an error lists one by one (``folds = 10**6`` listed a million counts)
_MAX_LISTED_FOLDS = 64

#: the longest name of a task, setting or experiment: the files named after it stay within 255 bytes
_MAX_NAME_BYTES = 200

#: the device names of Windows, reserved in every folder and with any extension (``nul.txt`` is the device NUL):
#: case ignored, ``COM0``-``COM9`` and ``LPT0``-``LPT9`` with the superscript digits ``¹²³`` too
_WINDOWS_DEVICES = frozenset({"CON", "PRN", "AUX", "NUL",
                              *(f"{p}{d}" for p in ("COM", "LPT") for d in "0123456789\u00b9\u00b2\u00b3")})
#: characters no Windows file name may hold (besides ``:``, ``/``, ``\\`` and control characters, refused everywhere)
_WINDOWS_ONLY = '<>"|?*'


def _on_windows() -> bool:
    """Whether file names are Windows' (where :data:`_WINDOWS_ONLY` cannot name a folder)."""
    return os.name == "nt"


def _folded(name: str) -> str:
    """``name`` as a case-insensitive file system (macOS, Windows) compares it: NFC, case folded.

    Examples:
        >>> _folded("Cafe\u0301") == _folded("caf\u00e9")
        True
    """
    return unicodedata.normalize("NFC", name).casefold()


def _folder_twin(folder: str | os.PathLike[str], name: str, suffix: str = "") -> str | None:
    """The entry of ``folder`` (``<other>`` or ``<other><suffix>``, hidden ones aside) whose ``other`` differs from
    ``name`` and is yet the same name on a case-insensitive file system (``Study`` against ``study``, NFD against
    NFC): there they are one file, the other comparison's. ``None`` when there is none or no ``folder``."""
    try:
        entries = sorted(os.listdir(folder))
    except OSError:  # absent (nothing published or run yet), or not a folder (refused where it is used)
        return None
    for entry in entries:
        stem = entry.removesuffix(suffix) if suffix else entry
        if stem != name and not entry.startswith(".") and _folded(stem) == _folded(name):
            return entry
    return None


def _refuse_results_twin(out: str | os.PathLike[str], name: str) -> None:
    """A ``ValueError`` when the results root ``out`` holds another comparison's folder that is ``name``'s on macOS
    and Windows (:func:`_folder_twin`): there each would resume, rewrite and report the other's runs."""
    twin = _folder_twin(out, name)
    if twin is not None:
        raise ValueError(f"--out {str(out)!r}: it holds the comparison {twin!r}, whose name differs from {name!r} only "
                         "in case or in Unicode normalization: on a case-insensitive file system (macOS, Windows) the "
                         "two are one results folder, and each would take the other's runs as its own; rename the "
                         "comparison (its `name`) or use another --out")


def _check_path_name(what: str, name: object) -> str:
    """A name that becomes one folder of the results tree: non-empty, no whitespace, ``/``, ``\\``, ``:``, ``$`` or
    NUL, not ``.`` or ``..`` (a space would also break the figure links of the published page: MyST renders
    ``![x](my study/a.png)`` as plain text; ``:`` separates task and setting in ``primary`` and is no file name
    character on Windows; ``$`` opens math in matplotlib's titles and legends (``"t$^$"`` failed ``savefig`` after
    the whole comparison had trained) and in the published page (MyST dollarmath); NUL ends a path), at most
    ``_MAX_NAME_BYTES`` bytes in UTF-8.

    Nor a leading ``.``: a hidden folder, and ``.x.previous`` / ``.x.publishing`` are the temporary folders that
    publishing comparison ``x`` renames and deletes (and the case-twin checks skip hidden entries).

    Nor, as Windows would take the folder for another one or for none, a control character, a trailing ``.``
    (Windows drops it: ``heat.`` is the folder of ``heat``), or a device name of :data:`_WINDOWS_DEVICES` with or
    without an extension (``con``, ``NUL.txt``); on Windows, none of :data:`_WINDOWS_ONLY` either (elsewhere they
    are kept: results of such names exist). A name must be UTF-8 text: a lone surrogate (an undecodable byte of
    the command line) named a folder on Linux, then ``results.md`` failed to be written after every run trained.
    Nor an invisible format character (Unicode category Cf: a zero-width space or joiner, a direction mark):
    ``"atten\\u200btion"`` printed as ``attention`` beside the baseline of that name, in every table and folder list.

    Examples:
        >>> _check_path_name("task name", "digits")
        'digits'
        >>> _check_path_name("task name", "console.v2")  # only the device name itself is reserved
        'console.v2'
    """
    if (not isinstance(name, str) or not name or any(c in name for c in "/\\:$\0") or name in (".", "..")
            or any(c.isspace() for c in name)):
        raise ValueError(f"{what} must be a non-empty string without whitespace, '/', '\\', ':', '$' or NUL and not '.' "
                         f"or '..' (it names a results folder), got {name!r}")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"{what} must be UTF-8 text (it names a results folder and is written into results.md), got "
                         f"{name!r}, which holds a lone surrogate (a byte of the command line that is not UTF-8?)") from None
    if size > _MAX_NAME_BYTES:  # else every run trains, then a figure of it fails with "File name too long"
        raise ValueError(f"{what} must be at most {_MAX_NAME_BYTES} bytes in UTF-8 (files are named after it, e.g. "
                         f"'<name>_frequency_response.png' and hidden temporary copies, and a file name holds at most "
                         f"255 bytes), got {size} bytes: {name[:40]!r}...")
    control = [c for c in name if unicodedata.category(c) == "Cc"]
    if control:
        raise ValueError(f"{what} must not hold control characters (it names a results folder, and Windows refuses "
                         f"them in file names), got {name!r}, which holds {control[0]!r}")
    invisible = [c for c in name if unicodedata.category(c) == "Cf"]
    if invisible:  # else "atten\u200btion" was a second setting printed as "attention" in every table and folder list
        raise ValueError(f"{what} must not hold invisible format characters (zero-width spaces and joiners, direction "
                         f"marks: two names would print alike, or one as another), got {name!r}, which holds "
                         f"U+{ord(invisible[0]):04X} {unicodedata.name(invisible[0], 'a format character')}")
    if name.endswith("."):
        raise ValueError(f"{what} must not end in '.' (it names a results folder, and Windows drops a trailing '.': "
                         f"{name!r} would be the folder of {name.rstrip('.')!r}), got {name!r}")
    if name.startswith("."):  # ".x.previous" is the folder publishing comparison "x" steps aside (and then deletes)
        raise ValueError(f"{what} must not start with '.' (it names a results folder, a hidden one, and the hidden "
                         f"'.<name>.publishing' / '.<name>.previous' folders are publish's temporary copies), "
                         f"got {name!r}")
    if name.partition(".")[0].upper() in _WINDOWS_DEVICES:
        raise ValueError(f"{what} must not be a Windows device name (CON, PRN, AUX, NUL, COM0-COM9, LPT0-LPT9, case "
                         f"ignored, with or without an extension: its folder would be the device), got {name!r}")
    if _on_windows() and any(c in name for c in _WINDOWS_ONLY):
        raise ValueError(f"{what} must not hold any of {' '.join(_WINDOWS_ONLY)} on Windows (it names a results "
                         f"folder), got {name!r}")
    return name


#: the name endings of the evaluation keys that are minimised (metric, select_by, reach): a loss, a perplexity, an
#: error rate or distance; every other key is maximised
_LOWER_IS_BETTER = ("loss", "ppl", "perplexity", "error", "err", "mse", "mae", "rmse", "nll", "bpc", "bpb")


def _lower_is_better(key: str) -> bool:
    """Whether the evaluation key ``key`` is minimised: its name ends in one of :data:`_LOWER_IS_BETTER` (case
    ignored). Only "loss" was read as such, so ``select_by = "val_ppl"`` picked the worst evaluation.

    Examples:
        >>> [_lower_is_better(k) for k in ("val_loss", "val_ppl", "test_error", "val_acc", "test_f1")]
        [True, True, True, False, False]
    """
    return key.lower().endswith(_LOWER_IS_BETTER)


@document_fields
@dataclass
class TaskConfig:
    """One task of a comparison: a dataset, a model preset and a training budget."""

    name: str  #: label used in paths and tables
    dataset: str  #: a name from diffusionformer.data.list_datasets()
    model: str  #: a preset from diffusionformer.models.list_models()
    metric: str = "test_acc"  #: headline metric (an evaluation key); minimised if lower is better (loss, ppl, error...)
    dataset_options: dict[str, Any] = field(default_factory=dict)  #: options passed to load_dataset
    model_overrides: dict[str, Any] = field(default_factory=dict)  #: config overrides of the preset
    train: dict[str, Any] = field(default_factory=dict)  #: TrainConfig fields (the seed comes from `seeds`)
    data_seed: int = 0  #: seed of the dataset split, in [0, 2**64 - 1] (fixed so that runs compare on the same data)
    #: batch size of evaluation passes; unset: the task's own (64 windows for text, 512 otherwise); part of a
    #: run's identity (a text task's windows, a DINO task's validation images, a sampled node evaluation's draws)
    eval_batch_size: int | None = None
    #: an evaluation key (e.g. "val_acc") that picks, per run, the evaluation whose `metric` is
    #: reported beside the final one (model selection on validation data); maximised unless lower is better
    select_by: str | None = None
    #: k-fold cross-validation: the run of seed ``s`` tests on fold ``s % folds`` (the dataset
    #: gets ``fold`` and ``num_folds``; its other folds give train and val), so seeds
    #: ``0 .. folds - 1`` make one K-fold estimate and the table's mean and spread are over folds (more seeds
    #: repeat the partition ``data_seed`` fixed, with a warning: Nadeau-Bengio counts them as fresh passes)
    folds: int | None = None
    #: learning speed: ``{key = threshold}`` with one evaluation key, e.g. ``{val_acc = 0.9}``;
    #: each run reports the first evaluated step at which the key reaches the threshold
    #: (``>=``, or ``<=`` for lower-is-better keys), and the table its mean over seeds; an accuracy's
    #: threshold is a fraction in [0, 1] (``val_acc = 90`` is refused: no run can reach it)
    reach: dict[str, float] | None = None
    #: training-batch augmentation of image classification: ``{crop_padding = 4, flip = true}``
    #: (pad, random crop of the original size, horizontal flip; empty: none); ``crop_padding`` is smaller than
    #: the images' sides (a crop of a wider padding may hold padding alone)
    augment: dict[str, Any] = field(default_factory=dict)
    #: label smoothing of the training loss of classification tasks (0: none)
    label_smoothing: float = 0.0
    #: settings of the self-supervised (DINO) task, :class:`~diffusionformer.data.ssl.SSLConfig`
    #: fields: views (``local_crops``, crop scales, jitter, blur, noise) and k-NN evaluation
    #: (``knn_k``, ``knn_temperature``); the model preset gives the defaults
    ssl: dict[str, Any] = field(default_factory=dict)
    #: neighbour-sampled mini-batch training of a node task,
    #: :class:`~diffusionformer.experiments.minibatch.MiniBatchConfig` fields: ``batch_size`` (seed
    #: nodes per update), ``num_neighbors`` (per hop, ``-1`` = all; one int: every propagation hop)
    #: and ``eval`` (``"full"`` or ``"sampled"``); empty: full-batch training
    minibatch: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def _misplaced_key_hint(key: str) -> str:
        return _key_home(key, "task")

    def __post_init__(self) -> None:
        _check_path_name("task name", self.name)
        # the types a TOML file cannot get wrong (config_from_dict checks them), from Python: else a bare "'int' object
        # is not iterable" or "'list' object has no attribute 'get'" naming neither the task nor the key
        check_value(self.metric, str, f"task {self.name!r}: metric")
        for key in ("dataset_options", "model_overrides", "train", "augment"):
            check_value(getattr(self, key), dict, f"task {self.name!r}: {key}")
        if self.folds is not None:
            if not isinstance(self.folds, int) or isinstance(self.folds, bool) or self.folds < 2:
                raise ValueError(f"task {self.name!r}: folds must be an int >= 2, got {self.folds!r}")
            clash = sorted({"fold", "num_folds"} & set(self.dataset_options))
            if clash:
                raise ValueError(f"task {self.name!r}: with folds = {self.folds}, the run's seed sets "
                                 f"{' and '.join(clash)}; remove it from dataset_options")
        if "seed" in self.train:
            raise ValueError(f"task {self.name!r}: set seeds with the top-level `seeds`, not train.seed")
        train_config(self, seed=0)  # validates the training budget now, naming any bad key
        if isinstance(self.data_seed, bool) or not isinstance(self.data_seed, numbers.Integral) \
                or not 0 <= self.data_seed <= _MAX_SEED:
            # else the split's torch generator fails ("Overflow when unpacking long long") only when the data load,
            # after the tasks before it trained; a negative seed would alias a positive one (-1 is 2**64 - 1)
            raise ValueError(f"task {self.name!r}: data_seed must be an int in [0, 2**64 - 1] (a torch generator "
                             f"seed), got {self.data_seed!r}")
        self.data_seed = int(self.data_seed)  # a numpy int (a sweep grid's) as the Python int it equals
        size = self.eval_batch_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, numbers.Integral)
                                 or not 1 <= size <= sys.maxsize):
            # a tensor size, as train.batch_size: 2**63 passed, then a text task's first evaluation (after its training
            # steps) failed in torch ("Overflow when unpacking long long", a C++ backtrace naming no key)
            raise ValueError(f"task {self.name!r}: eval_batch_size must be positive, an int at most {sys.maxsize} "
                             f"(a tensor size), got {size!r}")
        self.eval_batch_size = None if size is None else int(size)  # a numpy int (a sweep grid's) as the int it equals
        if self.select_by is not None and (not isinstance(self.select_by, str) or not self.select_by):
            raise ValueError(f"task {self.name!r}: select_by must be an evaluation key such as 'val_acc', got {self.select_by!r}")
        unknown = sorted(set(self.augment) - {"crop_padding", "flip"})
        if unknown:
            raise ValueError(f"task {self.name!r}: unknown augment key(s) {unknown}"
                             f"{_did_you_mean(str(unknown[0]), ['crop_padding', 'flip'])}; expected crop_padding, flip")
        pad = _python_number(self.augment.get("crop_padding", 0))  # a sweep grid's np.int64 as the int it equals
        if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:  # (it was refused as "must be an int >= 0,
            # got np.int64(2)", which ClassificationTask takes; kept as the int, the run's JSON identity holds it)
            raise ValueError(f"task {self.name!r}: augment.crop_padding must be an int >= 0, got {pad!r}")
        if "crop_padding" in self.augment:
            self.augment = {**self.augment, "crop_padding": pad}
        if not isinstance(self.augment.get("flip", False), bool):
            flip = self.augment["flip"]  # a numpy bool too, named as one
            raise ValueError(f"task {self.name!r}: augment.flip must be true or false, got {_value_type(flip)} ({flip!r})")
        if isinstance(self.label_smoothing, bool) or not isinstance(self.label_smoothing, (int, float)) \
                or not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"task {self.name!r}: label_smoothing must be a float in [0, 1), got {self.label_smoothing!r}")
        self._check_ssl()
        self._check_minibatch()
        if self.reach is not None:
            ok = isinstance(self.reach, dict) and len(self.reach) == 1
            key, value = next(iter(self.reach.items())) if ok else (None, None)
            if not (ok and isinstance(key, str) and key and isinstance(value, (int, float))
                    and not isinstance(value, bool) and math.isfinite(value)):
                raise ValueError(f"task {self.name!r}: reach must be one evaluation key with a finite threshold, "
                                 f"e.g. reach = {{ val_acc = 0.9 }}; got {self.reach!r}")
            self.reach = {key: float(value)}

    def _check_ssl(self) -> None:
        """Move SSL settings given (deprecated) as model overrides to ``ssl``, and validate ``ssl``."""
        from diffusionformer.models.registry import get_preset, split_task_settings, task_config

        if not isinstance(self.ssl, dict):
            raise TypeError(f"task {self.name!r}: ssl must be a table of SSLConfig fields, got {type(self.ssl).__name__}")
        try:
            preset = get_preset(self.model)
        except (TypeError, ValueError):
            return  # an unknown model is reported where the model is built or the config validated
        rest, moved = split_task_settings(self.model, self.model_overrides, warn=False)
        if moved:
            clash = sorted(set(moved) & set(self.ssl))
            if clash:
                raise ValueError(f"task {self.name!r}: {clash} set in both model_overrides and ssl; keep them in ssl only")
            warnings.warn(f"task {self.name!r}: model_overrides {sorted(moved)} are settings of the SSL task, no "
                          f"longer of the model; move them to the task's ssl table ([tasks.ssl]); the run and its "
                          "identity are the same either way", DeprecationWarning, stacklevel=user_stacklevel())
            self.model_overrides = rest
            self.ssl = {**moved, **self.ssl}
        if self.ssl:
            if preset.task_config_cls is None:
                raise ValueError(f"task {self.name!r}: ssl applies to self-supervised (DINO) presets only, "
                                 f"not to model {self.model!r}; got {sorted(self.ssl)}")
            try:
                _build_table(lambda ssl: task_config(self.model, **ssl), self.ssl, "ssl", "ssl: unknown key",
                             own=preset.task_config_cls)
            except (TypeError, ValueError) as exc:  # several problems: every one, each naming the task
                raise _in_context(exc, f"task {self.name!r}: ") from None

    def _check_minibatch(self) -> None:
        """Validate ``minibatch`` (types and sizes; the hops against each model are checked by validate)."""
        from diffusionformer.experiments.minibatch import MiniBatchConfig

        if not isinstance(self.minibatch, dict):
            raise TypeError(f"task {self.name!r}: minibatch must be a table of MiniBatchConfig fields, "
                            f"got {type(self.minibatch).__name__}")
        if not self.minibatch:
            return
        where = f"task {self.name!r} minibatch"
        _build_table(lambda table: MiniBatchConfig.from_dict(table, where=where), self.minibatch, "minibatch",
                     f"{where}: unknown key")
        accum = self.train.get("grad_accum_steps", 1)
        if accum != 1:
            raise ValueError(f"task {self.name!r}: minibatch trains on one sampled subgraph per update, which "
                             f"grad_accum_steps cannot split; got grad_accum_steps = {accum!r}: raise "
                             "minibatch.batch_size instead")

    def minibatch_config(self) -> Any:
        """The task's :class:`~diffusionformer.experiments.minibatch.MiniBatchConfig`, ``None`` when full-batch."""
        from diffusionformer.experiments.minibatch import MiniBatchConfig

        return MiniBatchConfig.from_dict(self.minibatch, where=f"task {self.name!r} minibatch") if self.minibatch else None

    @property
    def minimize(self) -> bool:
        return _lower_is_better(self.metric)

    def fold_of(self, seed: int) -> int | None:
        """The test fold of the run with ``seed`` (``None`` without cross-validation)."""
        return None if self.folds is None else seed % self.folds

    def dataset_kwargs(self, seed: int) -> dict[str, Any]:
        """Options for ``load_dataset`` in the run with ``seed`` (``dataset_options`` plus the fold)."""
        if self.folds is None:
            return dict(self.dataset_options)
        return {**self.dataset_options, "fold": self.fold_of(seed), "num_folds": self.folds}


@document_fields
@dataclass
class OperatorSetting:
    """A head layout applied to every task's model (``None`` everywhere: attention only)."""

    name: str  #: label used in paths and tables
    heads: Any = None  #: a head spec (string with optional {H}/{half}), a per-layer list or {layer: spec}
    laplacian_heads: int | str | list[int | str] | None = None  #: trailing Laplacian heads; "half" = H // 2
    model_overrides: dict[str, Any] = field(default_factory=dict)  #: other model settings of this variant

    @staticmethod
    def _misplaced_key_hint(key: str) -> str:
        return _key_home(key, "operator")

    def __post_init__(self) -> None:
        _check_path_name("operator setting name", self.name)
        check_value(self.model_overrides, dict, f"operator setting {self.name!r}: model_overrides")
        if self.heads is not None and self.laplacian_heads is not None:
            raise ValueError(f"operator setting {self.name!r}: give heads or laplacian_heads, not both")
        if isinstance(self.laplacian_heads, str) and self.laplacian_heads != "half":
            hint = " (did you mean 'half'?)" if self.laplacian_heads.strip().lower() == "half" else ""
            raise ValueError(f"operator setting {self.name!r}: laplacian_heads must be an int, a list or 'half', got "
                             f"{self.laplacian_heads!r}{hint}")
        own = "heads" if self.heads is not None else "laplacian_heads" if self.laplacian_heads is not None else None
        clash = sorted({"heads", "laplacian_heads"} & set(self.model_overrides)) if own else []
        if clash:  # else the setting's own layout replaced (or joined) the one in model_overrides, without a word
            raise ValueError(f"operator setting {self.name!r}: {own} is set and model_overrides sets {clash[0]} too; "
                             f"give the head layout once")

    def overrides(self, num_heads: int) -> dict[str, Any]:
        """Model-config overrides for a model with ``num_heads`` heads per layer."""
        out = dict(self.model_overrides)
        # the sugar ("half", {H}/{half}) is resolved where every head layout is: diffusionformer.nn.heads
        if self.laplacian_heads is not None:
            out["laplacian_heads"] = laplacian_count(self.laplacian_heads, num_heads)
        if self.heads is not None:
            out["heads"] = format_head_spec(self.heads, num_heads)
        return out


@document_fields
@dataclass
class ExperimentConfig:
    """A comparison: every operator setting on every task, for every seed."""

    name: str  #: results go to <out>/<name>/
    tasks: list[TaskConfig]  #: what to train
    operators: list[OperatorSetting]  #: head layouts to compare (the first is the baseline of the Δ column)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  #: one run per seed
    description: str = ""  #: shown in the results README
    #: primary contrasts, named before the study runs: operator settings compared against the
    #: baseline (the first setting); findings rest on these, every other comparison is exploratory
    primary: list[str] = field(default_factory=list)
    #: the quantities a primary contrast is tested on, of "final" (the metric after the last step),
    #: "selected" (at the best ``select_by`` evaluation) and "reach" (steps to the threshold); the
    #: others are exploratory for every setting (default: all three)
    primary_quantities: list[str] = field(default_factory=lambda: list(_QUANTITIES))
    #: device of every run ("auto", "cpu", "cuda", "cuda:N"); ``run --device`` overrides it,
    #: ``None`` leaves each task's ``train.device``
    device: str | None = None
    #: "bf16" (bf16 autocast), "fp32" or "auto" (bf16 on CUDA only): sets each task's
    #: ``train.amp`` where the task does not set it; ``run --precision`` overrides both
    precision: str | None = None

    @staticmethod
    def _misplaced_key_hint(key: str) -> str:
        return _key_home(key, "top")

    def __post_init__(self) -> None:
        _check_path_name("experiment name", self.name)
        if not self.tasks or not self.operators or not self.seeds:
            raise ValueError("an experiment needs at least one task, one operator setting and one seed")
        # each seed is a run's TrainConfig.seed: checked once, named as written (was: one problem per task and seed,
        # each naming train.seed, a key the config refuses)
        errors, seeds = [], []
        for i, seed in enumerate(self.seeds):
            try:
                seeds.append(_check_int("seed", seed, 0, _MAX_RUN_SEED))
            except (TypeError, ValueError) as exc:
                errors.append(_in_context(exc, f"seeds[{i}]: "))
        _raise_collected(errors, "seeds")
        # numpy ints (a sweep grid's) as the Python ints they equal, as data_seed: an int64 seed's s % folds overflowed
        self.seeds = seeds
        self._check_primary()
        from diffusionformer.experiments.gpu import check_device, precision_amp

        if self.device is not None:
            check_device(self.device, available=False)  # spelling only: configs are read on any machine
        if self.precision is not None:
            amp = precision_amp(self.precision)
            for task in self.tasks:
                if "amp" not in task.train:
                    task.train = {**task.train, "amp": amp}
        for what, names in (("task", [t.name for t in self.tasks]), ("operator setting", [o.name for o in self.operators])):
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"duplicate {what} names: {sorted(dup)}")
            folded: dict[str, str] = {}
            for n in names:  # each name is a run folder: one folder on macOS's and Windows' default file systems
                # NFC too: macOS's file systems ignore Unicode normalization ("\u00e9" and "e\u0301" are one name)
                other = folded.setdefault(_folded(n), n)
                if other != n:
                    raise ValueError(f"{what} names {other!r} and {n!r} differ only in case or in Unicode normalization "
                                     "(a composed accent against a combining one): their run folders would be one "
                                     "folder on a case-insensitive file system (macOS, Windows); rename one")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"duplicate seeds: {self.seeds}")
        for task in self.tasks:
            if task.folds is not None:
                # the runs of the folds that have any: one pass over the seeds (was one per fold, so folds = 2**62
                # never ended, and folds = 10**6 was refused with a million counts)
                per_fold = collections.Counter(s % task.folds for s in self.seeds)
                if len(per_fold) != task.folds or len(set(per_fold.values())) != 1:
                    listed = task.folds <= _MAX_LISTED_FOLDS
                    runs = (f"runs per fold: {[per_fold[k] for k in range(task.folds)]}" if listed
                            else f"{len(self.seeds)} seeds for {task.folds} folds")
                    example = list(range(task.folds)) if listed else f"[0, 1, ..., {task.folds - 1}]"
                    raise ValueError(
                        f"task {task.name!r} uses {task.folds}-fold cross-validation: the seeds must cover "
                        f"every fold equally often (fold = seed % {task.folds}), e.g. "
                        f"seeds = {example}; got {self.seeds} ({runs})"
                    )
                if per_fold[0] > 1:  # data_seed fixes the partition: seeds s and s + K differ in weights and batches
                    # the one pass would be refused beside a task whose folds do not divide these (2 and 4 folds)
                    others = [f"{t.name!r} ({t.folds} folds)" for t in self.tasks if t.folds and task.folds % t.folds]
                    apart = f" in a config without task(s) {', '.join(others)}" if others else ""
                    warnings.warn(f"task {task.name!r}: {len(self.seeds)} seeds over {task.folds} folds repeat each "
                                  "fold of the same partition (fixed by data_seed), so the repeats differ only in "
                                  "initialisation and batches (the run's seed); the Nadeau-Bengio t counts them as "
                                  f"fresh partitions (n = {len(self.seeds)}), which is optimistic; one pass is seeds = "
                                  f"{list(range(task.folds))}{apart}", UserWarning, stacklevel=user_stacklevel())

    def _check_primary(self) -> None:
        if not isinstance(self.primary, list) or not all(isinstance(p, str) for p in self.primary):
            raise TypeError(f"primary must be a list of strings such as 'task:setting' or 'setting', got {self.primary!r}")
        tasks = [t.name for t in self.tasks]
        settings = [o.name for o in self.operators]
        baseline = settings[0]
        for entry in self.primary:
            task, _, setting = entry.rpartition(":")
            if task and task not in tasks:
                raise ValueError(f"primary contrast {entry!r}: unknown task {task!r}{_did_you_mean(task, tasks)}; "
                                 f"the tasks are {tasks}")
            if setting == baseline:
                raise ValueError(f"primary contrast {entry!r}: {baseline!r} is the baseline every contrast is taken "
                                 f"against; name one of {settings[1:]}")
            if setting not in settings:
                raise ValueError(f"primary contrast {entry!r}: unknown operator setting {setting!r}"
                                 f"{_did_you_mean(setting, settings[1:])}; the settings are {settings[1:]} "
                                 f"(format 'task:setting' or 'setting')")
        if len(set(self.primary)) != len(self.primary):
            raise ValueError(f"duplicate primary contrasts: {self.primary}")
        q = self.primary_quantities
        if not isinstance(q, list) or not all(isinstance(k, str) for k in q):
            raise TypeError(f"primary_quantities must be a list of strings of {list(_QUANTITIES)}, got {q!r}")
        for k in q:
            if k not in _QUANTITIES:
                raise ValueError(f"primary_quantities: unknown quantity {k!r}{_did_you_mean(k, list(_QUANTITIES))}; "
                                 f"the quantities are {list(_QUANTITIES)}")
        if not q or len(set(q)) != len(q):
            raise ValueError(f"primary_quantities must name each of its quantities once and at least one, got {q!r}")
        # a task has the selected quantity only with select_by, reach only with reach: else its primary contrasts
        # were tested on nothing, while the page named them primary
        has = {t.name: {"final"} | ({"selected"} if t.select_by else set()) | ({"reach"} if t.reach else set())
               for t in self.tasks}
        bare = sorted({t for t, _ in self.primary_contrasts() if not has[t] & set(q)})
        if bare:
            raise ValueError(f"primary_quantities {q}: task(s) {bare} of the primary contrasts have none of them "
                             "(the selected quantity needs the task's select_by, reach its reach): name the "
                             "contrasts of the tasks that have them ('task:setting'), or another quantity")

    def _primary_quantities_text(self) -> str:
        """``""`` when the primary contrasts are tested on every quantity, else the quantities in words
        (``"final metric"``), for the table legend and the published page."""
        if set(self.primary_quantities) >= set(_QUANTITIES):
            return ""
        return " and ".join(_QUANTITY_WORDS[k] for k in self.primary_quantities)

    def primary_contrasts(self) -> set[tuple[str, str]]:
        """The ``(task, setting)`` pairs named by ``primary`` (each against the baseline).

        Examples:
            >>> cfg = ExperimentConfig("x", [TaskConfig("a", "digits", "vit-digits"), TaskConfig("b", "digits", "vit-digits")],
            ...                        [OperatorSetting("attention"), OperatorSetting("lap", laplacian_heads=1)],
            ...                        primary=["a:lap"])
            >>> sorted(cfg.primary_contrasts())
            [('a', 'lap')]
        """
        out = set()
        for entry in self.primary:
            task, _, setting = entry.rpartition(":")
            out |= {(t.name, setting) for t in self.tasks if not task or t.name == task}
        return out

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)


def _did_you_mean(name: str, choices: list[str]) -> str:
    """The package's one hint, :func:`diffusionformer.config._choice_hint` (case-blind first), under this module's
    name (its callers in the runner and gaps import it from here). A choice that is ``name`` in another Unicode
    normalization (``"caf\u00e9"`` against ``"cafe\u0301"``, typed on another system) is named as such: the two
    print alike, so "unknown 'café' (did you mean 'café'?)" alone was a riddle.

    Examples:
        >>> print(_did_you_mean("cafe\u0301", ["caf\u00e9", "lap"]))
         (did you mean 'café'? The two are the same text in another Unicode normalization: 'caf\\xe9' against 'cafe\\u0301'; spell it as the config does)
    """
    same = [c for c in choices if isinstance(name, str) and isinstance(c, str) and c != name
            and unicodedata.normalize("NFC", c) == unicodedata.normalize("NFC", name)]
    if same:
        return (f" (did you mean {same[0]!r}? The two are the same text in another Unicode normalization: "
                f"{ascii(same[0])} against {ascii(name)}; spell it as the config does)")
    return _choice_hint(name, choices)


def _key_home(key: str, here: str) -> str:
    """`` ('key' is a key of <table>...)`` for a key unknown in the table ``here`` of an experiment config (``"top"``,
    ``"task"``, ``"operator"``, ``"train"``, ``"minibatch"`` or ``"ssl"``) that is a key of another of its tables,
    else ``""``. Where that table encloses ``here``, the key was most likely written below a header: TOML reads every
    key below ``[[tasks]]`` or ``[tasks.train]`` into that table. (A look-alike of the wrong table was hinted instead:
    ``seeds`` below ``[[operators]]`` got "did you mean 'heads'?", ``seeds`` below ``[tasks.train]`` 'seed', which is
    refused, ``eval_batch_size`` in ``[tasks.minibatch]`` 'batch_size'.)

    Examples:
        >>> print(_key_home("lr", "task"))
         ('lr' is a key of [tasks.train])
        >>> print(_key_home("metric", "train"))
         ('metric' is a key of each [[tasks]] entry: TOML reads every key below a [table] header into that table; \
write it above the header)
        >>> _key_home("seed", "top")  # train.seed is refused: the top-level `seeds` set it
        ''
    """
    from diffusionformer.data.ssl import SSLConfig
    from diffusionformer.experiments.minibatch import MiniBatchConfig

    tables = {"top": ("the top level", ExperimentConfig), "task": ("each [[tasks]] entry", TaskConfig),
              "operator": ("each [[operators]] entry", OperatorSetting), "train": ("[tasks.train]", TrainConfig),
              "minibatch": ("[tasks.minibatch]", MiniBatchConfig), "ssl": ("[tasks.ssl]", SSLConfig)}
    if key in {f.name for f in fields(tables[here][1])}:
        return ""
    homes = [t for t, (_, cls) in tables.items() if t != here and key in {f.name for f in fields(cls)}
             and not (t == "train" and key == "seed")]
    if not homes:
        return ""
    enclosing = ("top",) if here in ("task", "operator") else () if here == "top" else ("top", "task")
    note = (": TOML reads every key below a [table] header into that table; write it above the header"
            if set(homes) & set(enclosing) else "")
    return f" ({key!r} is a key of {' and of '.join(tables[t][0] for t in homes)}{note})"


def _build_table(build: Callable[[dict[str, Any]], Any], table: Mapping[str, Any], here: str, unknown: str,
                 own: type | None = None) -> Any:
    """``build(table)``, a key of ``table`` (the table ``here`` of :func:`_key_home`) that is a key of another table
    refused as ``"<unknown> 'key' ('key' is a key of ...)"`` (`metric` written below [tasks.train]: named with its
    table, not a look-alike's), beside every problem ``build`` finds in the other keys. ``own``: the dataclass
    ``build`` makes where it may not be ``here``'s (a user preset's ``task_config_cls`` for ``ssl``): its keys
    are never misplaced."""
    valid = {f.name for f in fields(own)} if own is not None else set()
    misplaced = [k for k in table if isinstance(k, str) and k not in valid and _key_home(k, here)]
    errors: list[Exception] = [ValueError(f"{unknown} {k!r}{_key_home(k, here)}") for k in misplaced]
    built = None
    try:
        built = build({k: v for k, v in table.items() if k not in misplaced})
    except (TypeError, ValueError) as exc:
        errors.append(exc)
    _raise_collected(errors, here)
    return built


def train_config(task: TaskConfig, seed: int, **extra: Any) -> TrainConfig:
    """The :class:`TrainConfig` of one run of ``task`` (strictly validated)."""
    values = {"progress": False, **task.train, **extra, "seed": seed}
    try:
        return _build_table(TrainConfig.from_dict, values, "train", "unknown TrainConfig key")
    except (TypeError, ValueError) as exc:
        raise _in_context(exc, f"task {task.name!r} train: ") from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``key.path=value`` (value in TOML syntax; bare words are strings).

    Examples:
        >>> parse_override("tasks.digits.train.max_steps=50")
        (['tasks', 'digits', 'train', 'max_steps'], 50)
        >>> parse_override("seeds=[0, 1]")
        (['seeds'], [0, 1])
        >>> parse_override("operators.heat.heads=attention:2,heat:2")
        (['operators', 'heat', 'heads'], 'attention:2,heat:2')
        >>> parse_override('tasks."csbm-h0.1".train.lr=0.01')  # a name holding a dot, quoted as in TOML
        (['tasks', 'csbm-h0.1', 'train', 'lr'], 0.01)
    """
    if "=" not in text:
        raise ValueError(f"override {text!r} must look like key.path=value")
    key, raw = text.split("=", 1)
    if '"' in key or "'" in key:  # a TOML dotted key: quoted parts may hold dots (and '=' would end the key early)
        path = _toml_key_path(text)
        raw = text[len(_toml_key_prefix(text)):]
    else:
        path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ValueError(f"override {text!r} has an empty key")
    try:
        doc = tomllib.loads(f"v = {raw.strip()}")
    except tomllib.TOMLDecodeError as exc:
        if raw.strip()[:1] in ("[", "{", '"', "'"):  # meant as a TOML list, table or string: not a bare word
            raise ValueError(f"override {text!r}: the value {raw.strip()!r} is not valid TOML ({exc}); e.g. "
                             "seeds=[0, 1], train={max_steps = 50} or name='x'") from None
        return path, raw.strip()
    if len(doc) > 1:  # "seeds=[1]\nname='x'": a second line would be dropped without a word
        raise ValueError(f"override {text!r}: the value is followed by other TOML keys "
                         f"({', '.join(repr(k) for k in doc if k != 'v')}); give each key a --set of its own")
    return path, doc["v"]


def _toml_key_prefix(text: str) -> str:
    """The part of ``text`` up to and including the ``=`` that ends its (possibly quoted) TOML key."""
    quote, escaped = None, False
    for i, c in enumerate(text):
        if escaped:  # escaped by a backslash in a "..." part: tasks."q\"x".lr's part does not close at its \"
            escaped = False
        elif quote is not None:
            escaped = quote == '"' and c == "\\"  # a '...' part has no escapes
            quote = None if c == quote else quote
        elif c in "\"'":
            quote = c
        elif c == "=":
            return text[:i + 1]
    raise ValueError(f"override {text!r} must look like key.path=value (a quote in its key is not closed)")


def _toml_key_path(text: str) -> list[str]:
    """The parts of the TOML dotted key of override ``text``: ``tasks."csbm-h0.1".lr`` is ``tasks``, ``csbm-h0.1``,
    ``lr``."""
    key = _toml_key_prefix(text)[:-1]
    try:
        node: Any = tomllib.loads(f"{key.strip()} = 0")
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"override {text!r}: {key.strip()!r} is not a key path (parts separated by '.', a part "
                         f"holding a '.' quoted as in TOML: tasks.\"csbm-h0.1\".train.lr=...): {exc}") from None
    path = []
    while isinstance(node, dict):
        (part, node), = node.items()
        path.append(part)
    if not all(path):
        raise ValueError(f"override {text!r} has an empty key part")
    return path


def _entry_end(names: list[Any], path: list[str], i: int, keys: Any = ()) -> int | None:
    """The index ``k`` (``i <= k < len(path) - 1``) such that ``path[i:k + 1]`` joined by dots names an entry:
    ``tasks.csbm-h0.1.train.lr`` addresses the task named ``csbm-h0.1``. Where several names fit (tasks ``csbm-h0``
    and ``csbm-h0.1``), the one followed by a field of the entry (one of ``keys``) wins, else the shortest (was: the
    shortest always, so ``csbm-h0.1``'s override went to ``csbm-h0`` as the unknown key ``'1'``)."""
    ends = [k for k in range(i, len(path) - 1) if ".".join(path[i:k + 1]) in names]
    keyed = [k for k in ends if path[k + 1] in keys]
    return keyed[0] if len(keyed) == 1 else ends[0] if ends else None


def _first_name(entries: Any) -> Any:
    """The name of the first of ``entries`` (a config's raw ``operators``), None where there is none."""
    if isinstance(entries, list) and entries and isinstance(entries[0], dict):
        return entries[0].get("name")
    return None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides to a raw config dict.

    ``tasks`` and ``operators`` entries are addressed by name (``tasks.digits.train.lr=1e-3``; a name holding a
    dot as it is, ``tasks.csbm-h0.1.train.lr=1e-3``, or quoted as in TOML, ``tasks."csbm-h0.1".train.lr=1e-3``);
    ``tasks=digits,text`` / ``operators=attention`` keep only the named entries.
    """
    if isinstance(overrides, (str, bytes)) or not all(isinstance(o, str) for o in overrides):
        raise TypeError(f"overrides must be a list of 'key.path=value' strings, got {overrides!r}")
    try:
        data = copy.deepcopy(data)
    except RecursionError:  # e.g. a TOML header [a.a.a. ...] of thousands of parts
        raise ValueError("experiment config: tables nested too deeply to read") from None
    for text in overrides:
        path, value = parse_override(text)
        if path[0] in ("tasks", "operators") and len(path) == 1:
            # names as written: a bare name that reads as a TOML number, bool or date ("0.50", "true", "1_000") is the
            # name, not the value's str() ("0.5", "True", "1000"), which names no entry
            listed = value if isinstance(value, (list, str)) else text.split("=", 1)[1]
            listed = [value] if isinstance(value, dict) else listed  # an inline table: a new entry, no name (below)
            wanted = listed if isinstance(listed, list) else [v.strip() for v in listed.split(",") if v.strip()]
            if not wanted:  # "tasks=" or "tasks=," would keep nothing to run
                raise ValueError(f"override {text!r}: name at least one of the {path[0]} to keep")
            odd = next((w for w in wanted if not isinstance(w, str)), None)
            if odd is not None:  # a table (a new entry in TOML form) read as a name: "no operators named [{...}]"
                raise ValueError(f"override {text!r}: {path[0]}=NAME,... keeps only the {path[0]} named, expected "
                                 f"names (strings), got {type(odd).__name__} {odd!r}; add or change [[{path[0]}]] "
                                 f"entries in the config file, or set one's keys by name ({path[0]}.NAME.KEY=VALUE)")
            entries = data.get(path[0], [])
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
                raise ValueError(f"override {text!r}: {path[0]} must be a list of tables ([[{path[0]}]] entries, each "
                                 f"with a name) to keep entries by name, got {entries!r}")
            known = [e.get("name") for e in entries]
            missing = [w for w in wanted if w not in known]
            if missing:
                raise ValueError(f"override {text!r}: no {path[0]} named {missing}; available: {known}"
                                 f"{_did_you_mean(str(missing[0]), [k for k in known if isinstance(k, str)])}")
            baseline = _first_name(data.get("operators"))
            data[path[0]] = [e for e in entries if e.get("name") in wanted]
            if isinstance(data.get("primary"), list):  # the primary contrasts that still run ('task:setting' or 'setting')
                if _first_name(data.get("operators")) != baseline:
                    # each contrast is against the baseline (the first setting): with it dropped, none of them runs
                    # (else "b" would become b against the new first setting, a contrast not named before the runs)
                    data["primary"] = []
                else:
                    # only the contrasts of the entries this filter dropped go: every other one is validated as
                    # written (was: only those naming a kept non-baseline setting and task were kept, so a contrast
                    # on the baseline, an unknown name or a non-string, refused without the filter, was dropped
                    # without a word by any filter, even `tasks=NAME` keeping every task)
                    # a list, not a set: a name that is not a string (a list) is the config's error to report
                    dropped = [n for n in known if n not in wanted]
                    part = 2 if path[0] == "operators" else 0  # 'task:setting': the setting, or the task
                    data["primary"] = [p for p in data["primary"]
                                       if not (isinstance(p, str) and p.rpartition(":")[part] in dropped)]
            continue
        node: Any = data
        i = 0
        while i < len(path) - 1:
            part = path[i]
            if isinstance(node, list):
                names = [e.get("name") for e in node if isinstance(e, dict)]
                entry_cls = {"tasks": TaskConfig, "operators": OperatorSetting}.get(path[0]) if i == 1 else None
                keys = [f.name for f in fields(entry_cls)] if entry_cls is not None else ()
                k = _entry_end(names, path, i, keys)  # a name may hold dots: "csbm-h0.1" is the parts "csbm-h0", "1"
                if k is None:
                    known = [n for n in names if isinstance(n, str)]
                    hint = next((h for h in (_did_you_mean(".".join(path[i:j]), known) for j in range(len(path) - 1, i, -1))
                                 if h), "")
                    raise ValueError(f"override {text!r}: no entry named {part!r} in {'.'.join(path[:i])}; available: "
                                     f"{names}{hint}")
                node = next(e for e in node if isinstance(e, dict) and e.get("name") == ".".join(path[i:k + 1]))
                i = k + 1
                continue
            elif isinstance(node, dict):
                node = node.setdefault(part, {})
            else:  # the value reached by path[:i] (a string, a number) has no keys
                raise ValueError(f"override {text!r}: {'.'.join(path[:i])} is not a table, got {node!r}")
            i += 1
        if isinstance(node, list):
            raise ValueError(f"override {text!r}: cannot set a key inside a list")
        if not isinstance(node, dict):
            raise ValueError(f"override {text!r}: {'.'.join(path[:-1])} is not a table, got {node!r}")
        node[path[-1]] = value
    return data


def load_experiment_config(path: str | Path | Mapping[str, Any], overrides: list[str] | None = None) -> ExperimentConfig:
    """Read and validate a TOML config (or a dict), applying ``overrides`` first.

    Raises ``FileNotFoundError`` for a missing file, ``ValueError`` for TOML syntax errors and
    unknown keys (named), ``TypeError`` for mistyped values.
    """
    if isinstance(path, Mapping):
        data = dict(path)
        where = "config"
    else:
        if isinstance(path, str) and not path:  # Path("") is the current folder: not the folder the user named
            raise FileNotFoundError("experiment config path is empty; expected a TOML file")
        p = Path(path)
        if p.is_dir():  # a folder where the TOML file was meant (e.g. experiments/configs)
            inside = sorted(p.glob("*.toml"))
            raise FileNotFoundError(f"experiment config {str(p)!r} not found: that path is a folder, expected a TOML "
                                    "file" + (f" such as {str(inside[0])!r}" if inside else ""))
        if not p.is_file():
            if p.is_symlink() and not p.exists():  # is_file() is False for a loop of links too: not "not found"
                raise FileNotFoundError(f"experiment config {str(p)!r} is a symbolic link that leads to no file (to a "
                                        f"missing path, or a loop of links): it points to {os.readlink(p)!r}")
            if p.exists():  # a FIFO, socket or device: reading one could wait for ever
                raise FileNotFoundError(f"experiment config {str(p)!r} is not a regular file (a FIFO, socket or "
                                        "device?); expected a TOML file")
            # a misspelt name (``defualt.toml``, ``default`` without its suffix) next to the configs it meant (files:
            # a folder named ``*.toml`` is refused above)
            near = (_closest_choice(p.name, [q.name for q in p.parent.glob("*.toml") if q.is_file()])
                    if p.parent.is_dir() else None)
            raise FileNotFoundError(f"experiment config {str(p)!r} not found"
                                    + (f" (did you mean {str(p.with_name(near))!r}?)" if near else ""))
        try:
            # TOML is UTF-8, whatever the locale; "utf-8-sig" drops the byte-order mark some Windows editors write
            data = tomllib.loads(p.read_text(encoding="utf-8-sig"))
        except UnicodeDecodeError as exc:
            raise ValueError(f"{p}: not UTF-8 text (TOML files are UTF-8): {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{p}: invalid TOML: {exc}") from None
        except RecursionError:  # tomllib recurses once per level of nested arrays, inline or dotted tables
            raise ValueError(f"{p}: invalid TOML: arrays or tables nested too deeply to read") from None
        where = p.name
    data = apply_overrides(data, overrides or [])
    return config_from_dict(ExperimentConfig, data, where=where)
