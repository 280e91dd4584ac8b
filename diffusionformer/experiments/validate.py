"""Check a whole comparison before anything trains: every task x setting x seed, all problems at once.

A config that loads (:func:`~diffusionformer.experiments.load_experiment_config` checks its
keys and types) can still fail hours into a run: a dataset name the registry does not know,
a head layout that does not fit the second setting's model, a headline ``metric`` that the
task never evaluates. :func:`validate_experiment` resolves, for every run, what the runner
will resolve:

- the dataset: registered name (with a "did you mean"), known options, and (when
  ``load_data``, or for a model that does not build from its preset's sizes) the data itself, loaded once per
  task;
- the model: the preset, the task's overrides, the sizes taken from the data and the
  operator setting's heads, built exactly as the runner builds it
  (:func:`~diffusionformer.experiments.runner.build_model`), so bad head strings,
  operator arguments (e.g. a heat head whose ``steps`` cannot reach its tolerance) and
  model options are all caught, and a graph transformer the graph tasks cannot run (``pe`` or
  ``edge_dim`` set, an operator that needs a dense ``P``) too;
- the metric keys: ``metric``, ``select_by`` and the ``reach`` key must be keys of the
  task's evaluation (:func:`evaluation_keys`);
- the training budget of every seed;
- a node task's ``minibatch``: node data, and ``num_neighbors`` against each setting's
  model (more hops than its propagation hops ``R`` is a problem, fewer a ``UserWarning``).

It returns the problems as sentences; :func:`check_experiment` raises one ``ValueError``
listing them all. ``run`` calls it before it writes anything, ``show`` before it prints.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, MutableMapping, Sequence

from diffusionformer._warnings import user_stacklevel
from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig, train_config

__all__ = ["check_experiment", "evaluation_keys", "validate_experiment"]

_SPLIT_KEYS = ("val_loss", "val_acc", "test_loss", "test_acc", "loss")
#: evaluation keys of each task adapter (experiments/tasks.py), by dataset kind
_EVAL_KEYS: dict[str, tuple[str, ...]] = {
    "image": ("loss", "val_acc", "test_loss", "test_acc"),
    "sequence": ("loss", "val_acc", "test_loss", "test_acc"),
    "sequence_lm": ("loss", "val_acc", "test_loss", "test_acc"),
    "text": ("train_loss", "val_loss", "gap_loss", "loss"),
    "node": _SPLIT_KEYS,
    "graph": _SPLIT_KEYS,
}
_DINO_KEYS = ("knn_val_acc", "knn_test_acc", "loss")
#: dataset options that no loader takes from ``dataset_options``: where each is set instead
_OPTION_HOMES = {"seed": "the split's seed is the task's data_seed", "data_seed": "a key of the task itself",
                 "root": "the data root is run's --data-root or $DIFFUSIONFORMER_DATA"}


def evaluation_keys(dataset_kind: str, model: str) -> tuple[str, ...]:
    """The keys a run's evaluation reports, from the dataset's kind and the model preset.

    Args:
        dataset_kind: ``dataset_spec(name).kind`` (``"image"``, ``"text"``, ``"node"``, ...).
        model: a model preset name (DINO presets report k-NN accuracies instead).

    Examples:
        >>> evaluation_keys("image", "vit-digits")
        ('loss', 'val_acc', 'test_loss', 'test_acc')
        >>> evaluation_keys("image", "dino-digits")
        ('knn_val_acc', 'knn_test_acc', 'loss')
    """
    from diffusionformer.models import DINOConfig, get_preset

    if get_preset(model).config_cls is DINOConfig:
        return _DINO_KEYS
    if dataset_kind not in _EVAL_KEYS:
        hint = _hint(dataset_kind, sorted(_EVAL_KEYS)) if isinstance(dataset_kind, str) else ""
        raise ValueError(f"dataset_kind must be one of {sorted(_EVAL_KEYS)}, got {dataset_kind!r}{hint}")
    return _EVAL_KEYS[dataset_kind]


def _hint(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure: torch's ``OutOfMemoryError`` (CUDA), its CPU or MPS allocator's
    ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory", "MPS backend out of memory"), or a size whose
    bytes overflow torch's int64 storage size (``dim = 2**61``: too large for any memory, no allocation tried); not
    any error whose text says "out of memory" (a bug's own RuntimeError would be reported as a model too large)."""
    import torch

    text = str(exc)
    return isinstance(exc, getattr(torch, "OutOfMemoryError", ())) or any(
        words in text for words in ("can't allocate memory", "MPS backend out of memory",
                                    "Storage size calculation overflowed"))


def _size_overflow(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's refusal of a size past int64 (a TypeError or ValueError "... Overflow when
    unpacking long long", with its C++ backtrace): an ``mlp_ratio`` whose hidden width is past ``sys.maxsize``."""
    return isinstance(exc, (TypeError, ValueError)) and "Overflow when unpacking long" in str(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, (ValueError, TypeError)) else text


def validate_experiment(config: ExperimentConfig, *, data_root: str | None = None, load_data: bool = True,
                        missing_data_ok: bool = False, tasks: Sequence[str] | None = None,
                        loaded: MutableMapping[str, Any] | None = None) -> list[str]:
    """Every problem of ``config`` that would stop one of its runs, without training anything.

    Args:
        config: a loaded comparison.
        data_root: data root for datasets read from files (else ``$DIFFUSIONFORMER_DATA``).
        load_data: load each task's dataset (once) to resolve data-derived model sizes and
            catch missing or damaged files; ``False`` resolves models from the preset's sizes (and a model
            that does not build from them from the data's, loaded for it: its missing or damaged files are then
            problems as with ``load_data``).
        missing_data_ok: a dataset whose data root or files are missing is not a problem
            (its models are resolved from the preset's sizes); ``show`` uses this.
        tasks: check only these tasks (default: all).
        loaded: datasets by task name: a task found there is not loaded again, and a dataset
            loaded here is stored there, so a caller can reuse it (the runner passes one task
            at a time, so only that task's data is held). Without ``load_data`` a dataset that
            needs a data root still has the root checked (not its files).

    Returns:
        One sentence per problem, each naming its task, setting and seed where they matter;
        empty when every run resolves.

    Raises:
        RuntimeError: called with ``load_data`` at the default device ``meta``, where no data loads and no run can
            train (``run_experiment`` refuses it); without ``load_data`` the config is checked there, its models built
            without memory.
    """
    from diffusionformer.data import dataset_spec, list_datasets
    from diffusionformer.models import get_preset, model_config
    from diffusionformer.train.trainer import _refuse_meta_default_device

    if load_data:
        # else every dataset "did not load" (a split drawn on meta gave "IndexError: index 65536 is out of bounds"),
        # blaming data that loads. Only then: a config checked without its data at meta (a large model's config,
        # built without memory) resolves as at 'cpu', and was refused
        _refuse_meta_default_device("validate_experiment", "made loading the data and building the models")
    if tasks is not None:
        tasks = _check_task_names(config, tasks)
    problems: list[str] = []

    def add(msg: str) -> None:
        if msg not in problems:
            problems.append(msg)

    for task in config.tasks:
        if tasks is not None and task.name not in tasks:
            continue
        where = f"task {task.name!r}"
        for seed in config.seeds:
            try:
                cfg = train_config(task, seed)
            except (TypeError, ValueError) as exc:
                add(f"{where} seed {seed}: {_first_line(exc)}")
                continue
            if "tensorboard" in cfg.loggers and not _tensorboard_available():
                add(f"{where}: train.loggers names 'tensorboard', but the tensorboard package is not installed "
                    "(pip install tensorboard, or drop it from loggers)")
        try:
            preset = get_preset(task.model)
        except (TypeError, ValueError) as exc:
            add(f"{where}: {_first_line(exc)}")
            preset = None
        try:
            spec = dataset_spec(task.dataset)
        except (TypeError, ValueError) as exc:
            add(f"{where}: {_first_line(exc)}")
            spec = None
        if spec is not None:
            unknown = [k for k in task.dataset_kwargs(config.seeds[0]) if k not in spec.options]
            folded = task.folds is not None and not {"fold", "num_folds"} <= set(spec.options)
            if folded:  # the runner's own options for `folds`: was "has no option(s) ['fold', 'num_folds']"
                with_folds = [n for n in list_datasets() if {"fold", "num_folds"} <= set(dataset_spec(n).options)]
                add(f"{where}: folds = {task.folds} (k-fold cross-validation) needs a dataset with fold splits, "
                    f"and dataset {spec.name!r} has none; datasets with folds: {with_folds}")
                unknown = [k for k in unknown if k not in ("fold", "num_folds")]
                spec_ok = False
            if unknown:
                hints = "".join(f" ({k!r}: {_OPTION_HOMES[k]})" if k in _OPTION_HOMES
                                else _hint(str(k), sorted(spec.options)) for k in unknown)
                add(f"{where}: dataset {spec.name!r} has no option(s) {unknown}{hints}; its options: "
                    f"{sorted(spec.options)}")
                spec_ok = False
            elif not folded:
                spec_ok = True
                # an option's type is known from the config alone: checked here, not first when the data load
                # (``run`` loads each task's data just before its runs, after the earlier tasks trained)
                from diffusionformer.data.registry import _check_option_type

                for key, value in task.dataset_kwargs(config.seeds[0]).items():
                    try:
                        _check_option_type(spec, key, value)
                    except (TypeError, ValueError) as exc:
                        add(f"{where}: {_first_line(exc)}")
                        spec_ok = False
            if preset is not None:
                keys = evaluation_keys(spec.kind, task.model)
                named = [("metric", task.metric), ("select_by", task.select_by)]
                named += [("reach", k) for k in (task.reach or {})]
                for what, key in named:
                    if key is not None and key not in keys:
                        add(f"{where}: {what} {key!r} is not an evaluation key of {spec.kind} tasks with "
                            f"{task.model!r}{_hint(key, keys)}; its keys: {list(keys)}")
                for key, threshold in (task.reach or {}).items():
                    if key in keys and key.endswith("acc") and not 0.0 <= threshold <= 1.0:
                        # an accuracy is a fraction: {val_acc = 90} (a percentage, as the tables print it) was never
                        # reached, and every run of the comparison trained to be reported as censored
                        percent = 1.0 < threshold <= 100.0
                        hint = f" (a percentage? As a fraction: {threshold / 100:g})" if percent else ""
                        effect = "no run can reach it" if threshold > 1.0 else "every run meets it at once"
                        add(f"{where}: reach {{{key} = {threshold:g}}}: {key} is an accuracy, a fraction in [0, 1], "
                            f"so {effect}{hint}")
        else:
            spec_ok = False
        if task.minibatch and spec is not None and spec.kind != "node":
            add(f"{where}: minibatch (neighbour-sampled training) applies to node tasks, and dataset "
                f"{spec.name!r} is of kind {spec.kind!r}")
        if (task.augment or task.label_smoothing) and spec is not None and preset is not None:
            _check_supervised_options(task, spec, preset, add)
        accum = task.train.get("grad_accum_steps", 1)
        if accum != 1 and spec is not None and preset is not None and not task.minibatch:
            from diffusionformer.models import DINOConfig

            if spec.kind == "node":  # full-batch: every micro-batch would be the whole graph again
                add(f"{where}: grad_accum_steps = {accum!r}, but a full-batch node task trains on the whole "
                    "graph at every update and cannot split it; drop grad_accum_steps")
            elif preset.config_cls is DINOConfig:  # the teacher and the centre move once per loss call
                add(f"{where}: grad_accum_steps = {accum!r}, but DINO updates its teacher and centre at every "
                    "loss call, so micro-batches would not add up to the full batch's update; drop grad_accum_steps")
        if preset is None:
            continue
        data: Any = None
        may_load = not load_data and spec is not None and spec_ok  # for a model's sizes, below
        if loaded is not None and task.name in loaded:
            data = loaded[task.name]
        elif spec is not None and spec_ok and load_data:  # once per task: every fold gives the model the same sizes
            data = _load_task_data(task, config.seeds[0], data_root, loaded, missing_data_ok, add)
        elif spec is not None and spec_ok and spec.needs_root and not missing_data_ok:
            from diffusionformer.data.paths import resolve_root

            root = resolve_root(data_root)
            if root is None or not root.is_dir():
                may_load = False  # the missing root is the problem: not reported twice by the load
                add(f"{where}: dataset {spec.name!r} reads files from a data root, and "
                    + ("none is set (pass --data-root or set $DIFFUSIONFORMER_DATA)" if root is None
                       else f"{str(root)!r} is not a directory"))
        if data is not None and task.augment:
            _check_crop_padding(task, data, add)
        # without data the preset's sizes stand in for the data's: a model that does not build from them (patch_size
        # = 8 of the 28x28 dino-mnist on 32x32 CIFAR-10) is judged on the data's own sizes, loaded for it (once)
        may_load = may_load and data is None
        for setting in config.operators:
            try:
                try:
                    model = _resolve_model(task, setting, data, preset, model_config)
                except (TypeError, ValueError, NotImplementedError):
                    if not may_load:
                        raise
                    may_load = False
                    data = _data_for_sizes(task, config.seeds[0], data_root, loaded, missing_data_ok, add)
                    if data is None:
                        raise
                    model = _resolve_model(task, setting, data, preset, model_config)
            except (TypeError, ValueError, NotImplementedError, OverflowError, MemoryError, RuntimeError) as exc:
                if isinstance(exc, (TypeError, ValueError, NotImplementedError)) and not _size_overflow(exc):
                    text = _first_line(exc)  # a model's own message may name the task already: not twice
                    text = text[len(where) + 2:] if text.startswith(f"{where}: ") else text
                    add(f"{where} / setting {setting.name!r}: {text}")
                    continue
                # sizes too large to build (depth = 10**20, dim = 2**40): else the bare OverflowError or torch's
                # allocator error ended `run` and `show` with a traceback naming neither the task nor the setting
                if isinstance(exc, RuntimeError) and not _out_of_memory(exc):
                    raise
                # the message without torch's C++ backtrace ("Exception raised from ...", then its frames)
                text = _first_line(exc).partition("\nException raised from ")[0]
                add(f"{where} / setting {setting.name!r}: model {task.model!r} cannot be built with model_overrides "
                    f"{ {**task.model_overrides, **setting.model_overrides} }, too large for this machine's "
                    f"memory: {text}")
                continue
            if task.minibatch:
                _check_minibatch(task, setting, model, add)
            _check_momentum_schedule(task, setting, model)
            _check_laplacian_heads(task, setting, model)
    return problems


def _data_for_sizes(task: TaskConfig, seed: int, data_root: str | None, loaded: MutableMapping[str, Any] | None,
                    missing_data_ok: bool, add: Callable[[str], None]) -> Any:
    """The task's dataset for its data-derived model sizes, or ``None`` where it does not load (a problem then, as
    :func:`_load_task_data` reports it) or cannot (at the default device ``meta``)."""
    import torch

    if torch.get_default_device().type == "meta":
        return None
    # its missing or damaged files reported: else `run` refused the model from the preset's sizes alone (the 28x28
    # of dino-mnist for CIFAR-10), naming neither the files nor the data's sizes that the model is built from
    return _load_task_data(task, seed, data_root, loaded, missing_data_ok, add)


def _load_task_data(task: TaskConfig, seed: int, data_root: str | None, loaded: MutableMapping[str, Any] | None,
                    missing_data_ok: bool, add: Callable[[str], None]) -> Any:
    """The task's dataset (stored in ``loaded``), or ``None`` where it does not load, a problem passed to ``add``
    (a missing data root or files not one with ``missing_data_ok``)."""
    from diffusionformer.data import DataRootError
    from diffusionformer.experiments.build import task_data

    try:
        data = task_data(task, seed, data_root, {})
    except DataRootError as exc:
        if not missing_data_ok:
            add(f"task {task.name!r}: {_first_line(exc)}")
        return None
    except Exception as exc:  # any failure to load is a problem of this task
        add(f"task {task.name!r}: dataset {task.dataset!r} does not load: {_first_line(exc)}")
        return None
    if loaded is not None:
        loaded[task.name] = data
    return data


def _check_momentum_schedule(task: TaskConfig, setting: OperatorSetting, model: Any) -> None:
    """A warning when a DINO model's momentum schedule is not the run's length: shorter, the teacher freezes
    (momentum 1) before the run ends; longer, its momentum never reaches 1 (the SSL tutorial: they must be equal)."""
    import warnings

    steps = getattr(getattr(model, "config", None), "schedule_steps", None)
    if steps is None:
        return
    try:
        max_steps = train_config(task, seed=0).max_steps
    except (TypeError, ValueError):  # a bad budget: a problem of its own, listed above
        return
    if steps == max_steps:
        return
    effect = "the teacher stops moving (momentum 1) before the run ends" if steps < max_steps else \
        "the teacher's momentum never reaches 1"
    warnings.warn(f"task {task.name!r} / setting {setting.name!r}: the DINO momentum schedule spans schedule_steps = "
                  f"{steps} steps and the run train.max_steps = {max_steps}: {effect}; set model_overrides."
                  f"schedule_steps = {max_steps}", UserWarning, stacklevel=user_stacklevel())


def _check_laplacian_heads(task: TaskConfig, setting: OperatorSetting, model: Any) -> None:
    """A warning when a setting's ``laplacian_heads`` gives the task's model no Laplacian head: ``"half"`` is ``H // 2``
    of its ``H`` heads per layer, 0 for one head, so the setting trained attention-only models under its own name (the
    baseline's, with a difference of exactly 0 to it), without a word."""
    import warnings

    from diffusionformer.operators import LaplacianOperator

    if setting.laplacian_heads is None or any(isinstance(m, LaplacianOperator) for m in model.modules()):
        return
    warnings.warn(f"task {task.name!r} / setting {setting.name!r}: laplacian_heads = {setting.laplacian_heads!r} gives "
                  f"model {task.model!r} no Laplacian head ('half' is H // 2 of its H heads per layer), so the setting "
                  "trains attention-only models; give it more heads (model_overrides) or a count of at least 1",
                  UserWarning, stacklevel=user_stacklevel())


def _check_supervised_options(task: TaskConfig, spec: Any, preset: Any, add: Any) -> None:
    """``augment`` and ``label_smoothing`` as the task adapter takes them: supervised classification (not
    DINO), and ``augment`` on images only (:func:`~diffusionformer.experiments.tasks.build_task` refuses the rest)."""
    from diffusionformer.models import DINOConfig

    named = [k for k in ("augment", "label_smoothing") if getattr(task, k)]
    where = f"task {task.name!r}"
    if spec.kind not in ("image", "sequence") or preset.config_cls is DINOConfig:
        verb, them = ("apply", "them") if len(named) > 1 else ("applies", "it")
        add(f"{where}: {' and '.join(named)} {verb} to supervised classification (image or sequence data, not "
            f"DINO), and dataset {spec.name!r} is of kind {spec.kind!r} with model {task.model!r}; drop {them}")
    elif task.augment and spec.kind != "image":
        add(f"{where}: augment (random crops and flips) needs images, and dataset {spec.name!r} is of kind "
            f"{spec.kind!r}; drop augment")


def _check_crop_padding(task: TaskConfig, data: Any, add: Any) -> None:
    """``augment.crop_padding`` against the size of the task's images (the task adapter's rule,
    :func:`~diffusionformer.experiments.tasks._crop_padding_problem`), before anything trains."""
    from diffusionformer.experiments.tasks import _crop_padding_problem

    shape = tuple(getattr(data, "input_shape", ()))
    problem = _crop_padding_problem(task.augment.get("crop_padding", 0), *shape[1:]) if len(shape) == 3 else None
    if problem:
        add(f"task {task.name!r}: augment.{problem}")


def _check_task_names(config: ExperimentConfig, tasks: Any) -> list[str]:
    """``tasks`` as a list of the config's task names; a bare string or an unknown name is refused (with a hint)."""
    try:
        if isinstance(tasks, (str, bytes)):  # "cora" would select every task whose name is a substring of it
            raise TypeError
        chosen = list(tasks)
    except TypeError:
        raise TypeError(f"tasks must be a list of task names, got {tasks!r}") from None
    names = [t.name for t in config.tasks]
    unknown = [t for t in chosen if t not in names]
    if unknown:
        hint = _hint(unknown[0], names) if isinstance(unknown[0], str) else ""
        raise ValueError(f"tasks: config {config.name!r} has no task(s) {unknown}{hint}; its tasks: {names}")
    return chosen


def _check_minibatch(task: TaskConfig, setting: OperatorSetting, model: Any, add: Any) -> None:
    """``num_neighbors`` against the model's propagation hops: a problem, or a warning for fewer hops."""
    import warnings

    from diffusionformer.experiments.minibatch import check_num_neighbors, propagation_hops

    problem, warning = check_num_neighbors(task.minibatch_config(), propagation_hops(model))
    if problem is not None:
        add(f"task {task.name!r} / setting {setting.name!r}: minibatch.{problem}")
    if warning is not None:
        warnings.warn(f"task {task.name!r} / setting {setting.name!r}: minibatch.{warning}", UserWarning,
                      stacklevel=user_stacklevel())


def _resolve_model(task: TaskConfig, setting: OperatorSetting, data: Any, preset: Any, model_config: Any) -> Any:
    """Build the run's model as the runner does (with data), else resolve and build it from the preset's sizes; the
    caller's global generators are left as they were (a check drew from them building its models: after
    ``torch.manual_seed(0)``, validating a config changed the weights of the next model the caller built)."""
    from diffusionformer.experiments.build import _check_graph_model, add_setting_overrides, build_model
    from diffusionformer.train.rng import _device_in_use, preserve_rng_state

    with preserve_rng_state(_device_in_use()):
        if data is not None:
            return build_model(task, setting, data)
        overrides = dict(task.model_overrides)
        add_setting_overrides(overrides, model_config(task.model, **overrides), task, setting)
        model = preset.model_cls(model_config(task.model, **overrides))
    _check_graph_model(task, model)
    return model


def _tensorboard_available() -> bool:
    """Whether the ``"tensorboard"`` logger can start (:mod:`torch.utils.tensorboard` imports)."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def check_experiment(config: ExperimentConfig, **kwargs: Any) -> None:
    """Raise one ``ValueError`` listing every problem :func:`validate_experiment` finds.

    Args:
        config: a loaded comparison.
        **kwargs: passed to :func:`validate_experiment`.

    Raises:
        ValueError: the problems found.
        RuntimeError: as :func:`validate_experiment` (at the default device ``meta``).
    """
    problems = validate_experiment(config, **kwargs)
    if problems:
        runs = len(config.tasks) * len(config.operators) * len(config.seeds)
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ValueError(f"config {config.name!r} ({runs} runs) has {len(problems)} problem(s); nothing was trained:\n{lines}")
