"""The data and the model of one run, as the runner, the validator and the analysis build them."""

from __future__ import annotations

import numbers
from typing import Any

import torch

from diffusionformer.data import load_dataset
from diffusionformer.experiments.config import OperatorSetting, TaskConfig
from diffusionformer.experiments.tasks import model_overrides_for_data
from diffusionformer.models import create_model, get_preset, model_config
from diffusionformer.models.registry import split_task_settings, task_config

__all__ = ["add_setting_overrides", "build_model", "task_data"]


def task_data(task: TaskConfig, seed: int, data_root: str | None, cache: dict[int | None, Any]) -> Any:
    """The dataset of ``task``'s run with ``seed``: loaded once per fold (once without folds) into ``cache``."""
    fold = task.fold_of(seed)
    if fold not in cache:
        cache[fold] = load_dataset(task.dataset, root=data_root, seed=task.data_seed, **task.dataset_kwargs(seed))
    return cache[fold]


def add_setting_overrides(overrides: dict[str, Any], resolved: Any, task: TaskConfig, setting: OperatorSetting) -> None:
    """Add an operator setting's model overrides (its head layout for the resolved model's head count) to ``overrides``.

    The head count is the model's as built: the setting's own ``num_heads``/``n_head`` among its model overrides
    when it sets one (its ``{H}``, ``{half}`` and ``"half"`` are of those heads), else ``resolved``'s.

    Raises:
        ValueError: if the setting sets heads and the model has no attention heads, or the task's
            ``model_overrides`` set a head layout too.
    """
    own = "heads" if setting.heads is not None else "laplacian_heads" if setting.laplacian_heads is not None else None
    given = sorted({"heads", "laplacian_heads"} & set(task.model_overrides))
    if own and given:  # else the setting's heads replaced the task's silently, or the model refused "both" naming neither
        raise ValueError(f"task {task.name!r}: model_overrides sets {given[0]} and operator setting {setting.name!r} sets "
                         f"{own}; give the head layout once (in the operator settings)")
    field = next((f for f in ("num_heads", "n_head") if hasattr(resolved, f)), None)
    if field is not None and field in setting.model_overrides:
        # else "half" of a setting with model_overrides = {num_heads = 4} was half the task's heads (1 Laplacian head
        # of 4, silently), and "attention:{H}" was refused as assigning the task's 2 heads of the setting's 4
        rest, _ = split_task_settings(task.model, setting.model_overrides, warn=False)
        resolved = model_config(task.model, **{**overrides, **rest})
    heads = getattr(resolved, field, 0) if field is not None else 0
    if heads:
        overrides.update(setting.overrides(int(heads)))
    elif setting.heads is not None or setting.laplacian_heads is not None:
        raise ValueError(f"operator setting {setting.name!r} sets heads but model {task.model!r} has no attention heads")
    else:
        overrides.update(setting.model_overrides)


def _same(a: Any, b: Any) -> bool:
    """Equal, with lists (as TOML gives them) and tuples (as the data gives them) alike."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _check_data_overrides(sizes: dict[str, Any], overrides: dict[str, Any], task: TaskConfig, source: str) -> None:
    """Refuse an override that changes a size the model takes from the data (classes, channels, vocabulary...).

    Args:
        sizes: the data-derived config values (:func:`~diffusionformer.experiments.tasks.model_overrides_for_data`).
        overrides: the overrides to check (an equal value is allowed).
        task: the run's task, for the message.
        source: where ``overrides`` come from, for the message (e.g. ``"model_overrides"``).

    Raises:
        ValueError: naming the field, the override, the data's value and the task.
    """
    for key, value in overrides.items():
        if key not in sizes:  # not a data-derived size: the model config checks it
            continue
        if key == "vocab_size" and isinstance(value, numbers.Integral) and not isinstance(value, bool) \
                and value >= sizes[key]:
            continue  # a padded vocabulary (nanoGPT pads 50257 to 50304): the extra logits are never targets
        if not _same(value, sizes[key]):
            raise ValueError(f"task {task.name!r}: {source} sets {key} = {value!r}, but dataset {task.dataset!r} "
                             f"gives {key} = {sizes[key]!r}; the model takes {key} from the data, so drop the override")


def _check_graph_model(task: TaskConfig, model: torch.nn.Module) -> None:
    """Refuse a graph transformer that cannot run in the runner's graph tasks, which failed at its first training
    step although it builds: ``pe`` (a positional encoding) or ``edge_dim`` (edge features) set, which the task
    adapters never pass (they call ``model(x, edge_index[, batch])``), or an operator without a sparse back-end
    (``heat-exact``, ``ppr-exact``, any function of a materialised ``P`` that is neither a polynomial nor a context
    operator: they need a dense ``P``, and the graph transformer attends over edges).

    Raises:
        ValueError: naming the option or the operator, and the task.
    """
    from diffusionformer.models import DiffusionGraphTransformer

    if not isinstance(model, DiffusionGraphTransformer):
        return
    for key in ("pe", "edge_dim"):
        value = getattr(model.config, key)
        if value is not None:
            raise ValueError(f"task {task.name!r}: model {task.model!r} has {key} = {value!r}, but the experiment "
                             f"runner's graph tasks pass the model only x and edge_index (no "
                             f"{'positional encoding' if key == 'pe' else 'edge features'}); drop {key}")
    for layer, block in enumerate(model.blocks):
        # the layer's own test (its sparse call refuses the same operator): supports_sparse = False, and a function
        # of a materialised P (neither polynomial nor context: a user's apply_matrix) whatever supports_sparse says,
        # which passed this check and failed at the first training step
        block.attn._check_plan()
        dense = block.attn._sparse_unsupported
        if dense is not None:
            raise ValueError(f"task {task.name!r}: model {task.model!r} layer {layer} has operator {dense}, "
                             "which needs a dense P, and a graph transformer attends over the graph's edges (the "
                             "sparse back-end); use a polynomial operator such as 'heat' or 'ppr'")


def _check_context_model(task: TaskConfig, model: torch.nn.Module, data: Any) -> None:
    """Refuse a causal LM whose context cannot hold the task's windows, which built and validated, then failed at
    its first training step: a sequence task's rows longer than ``block_size`` (the model refuses ``T >
    block_size``), or text splits no longer than ``block_size`` (no window and its next token fits; a short
    ``train_chars``).

    Raises:
        ValueError: naming the task, the model's ``block_size`` and the data's length.
    """
    from diffusionformer.data import SequenceTaskData, TextData

    block = getattr(getattr(model, "config", None), "block_size", None)
    if not isinstance(block, numbers.Integral) or isinstance(block, bool):
        return
    if (isinstance(data, SequenceTaskData) and isinstance(getattr(data, "x_train", None), torch.Tensor)
            and data.seq_len > block):
        raise ValueError(f"task {task.name!r}: model {task.model!r} has block_size = {block}, but dataset "
                         f"{task.dataset!r} holds sequences of {data.seq_len} tokens, which the model refuses; set "
                         f"model_overrides.block_size = {data.seq_len} (or more)")
    if isinstance(data, TextData):
        for split in ("train", "val"):
            tokens = getattr(data, split, None)
            length = tokens.shape[0] if isinstance(tokens, torch.Tensor) else None
            if length is not None and block >= length:
                raise ValueError(f"task {task.name!r}: model {task.model!r} has block_size = {block}, but the "
                                 f"{split!r} split of dataset {task.dataset!r} holds {length} tokens, and a window "
                                 f"needs block_size + 1; set model_overrides.block_size below {length}")


def build_model(task: TaskConfig, setting: OperatorSetting, data: Any) -> torch.nn.Module:
    """The model of one run: preset + data-derived sizes + task overrides + the operator setting.

    A model with task settings (DINO) gets the run's as ``model.task_config``: the preset's
    defaults and the task's ``ssl`` table.

    Raises:
        ValueError: if the task's or the setting's overrides change a size the model takes from
            the data (:func:`_check_data_overrides`), a graph model could not run in the graph
            tasks (:func:`_check_graph_model`), or a language model's ``block_size`` does not fit the
            data's sequences (:func:`_check_context_model`), among the model's own checks.
    """
    preset = get_preset(task.model)
    sizes = model_overrides_for_data(data, preset.config_cls)
    _check_data_overrides(sizes, task.model_overrides, task, "model_overrides")
    _check_data_overrides(sizes, setting.model_overrides, task, f"operator setting {setting.name!r}")
    overrides = {**sizes, **task.model_overrides}
    add_setting_overrides(overrides, model_config(task.model, **overrides), task, setting)
    # task settings (DINO's views and k-NN evaluation): the task's `ssl` table, and any an operator
    # setting still passes (deprecated) among its model overrides
    overrides, moved = split_task_settings(task.model, overrides)
    model = create_model(task.model, **overrides)
    _check_graph_model(task, model)
    _check_context_model(task, model, data)
    settings = task_config(task.model, **{**task.ssl, **moved})
    if settings is not None:
        model.task_config = settings
    return model
