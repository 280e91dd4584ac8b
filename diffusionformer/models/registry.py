"""Named model presets: ``create_model(name, **overrides)`` and ``list_models()``.

Examples:
    >>> model = create_model("gpt-char-small", heads="attention:2,laplacian:2")
    >>> model.blocks[0].attn.heads_spec()
    'attention:2,laplacian:2'
    >>> "vit-mnist" in list_models()
    True
"""

from __future__ import annotations

import copy
import difflib
import warnings
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable

from torch import nn

from diffusionformer._warnings import user_stacklevel
from diffusionformer.config import _check_flag, config_from_dict
from diffusionformer.data.ssl import SSLConfig
from diffusionformer.models.dino import DINO, DINOConfig
from diffusionformer.models.gcn import GCN, GCNConfig
from diffusionformer.models.gin import GIN, GINConfig
from diffusionformer.models.gpt import DiffusionGPT, GPTConfig
from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphTransformerConfig
from diffusionformer.models.vit import DiffusionViT, ViTConfig

__all__ = ["ModelPreset", "create_model", "get_preset", "list_models", "model_config", "register_model",
           "split_task_settings", "task_config", "unregister_model"]


@dataclass(frozen=True)
class ModelPreset:
    """A named model: its class, config class and the config values that differ from the defaults.

    ``task_config_cls`` (e.g. :class:`~diffusionformer.data.ssl.SSLConfig` for DINO) holds the
    settings of the model's task that are not the model's (views, k-NN evaluation), and
    ``task_defaults`` the preset's values of them that differ from that class's defaults.
    """

    name: str
    model_cls: Callable[[Any], nn.Module]
    config_cls: type
    defaults: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    task_config_cls: type | None = None
    task_defaults: dict[str, Any] = field(default_factory=dict)


_PRESETS: dict[str, ModelPreset] = {}


def register_model(name: str, model_cls: Callable[[Any], nn.Module], config_cls: type, description: str = "",
                   *, task_config_cls: type | None = None, task_defaults: dict[str, Any] | None = None,
                   **defaults: Any) -> ModelPreset:
    """Register a preset (strict: a taken name raises ``ValueError``, naming :func:`unregister_model`, the way to
    replace it; a ``model_cls`` that cannot be called a ``TypeError``; defaults are validated now)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"preset name must be a non-empty string, got {name!r}")
    if name in _PRESETS:
        # a notebook cell run twice registers the name again: say how to replace it
        raise ValueError(f"model preset {name!r} is already registered (by {_PRESETS[name].model_cls!r}); to replace "
                         f"it (a class defined again), call unregister_model({name!r}) first")
    if not callable(model_cls):  # else stored, and create_model failed with "'int' object is not callable"
        raise TypeError(f"preset {name!r}: model_cls must be a model class or a callable taking the config, "
                        f"got {type(model_cls).__name__} {model_cls!r}")
    if not (isinstance(config_cls, type) and is_dataclass(config_cls)):  # else "config_from_dict: cls must be ..."
        raise TypeError(f"preset {name!r}: config_cls must be a dataclass (the model's config class), got "
                        f"{type(config_cls).__name__} {config_cls!r}")
    config_from_dict(config_cls, defaults, where=f"preset {name!r}")
    if task_defaults and task_config_cls is None:
        raise ValueError(f"preset {name!r}: task_defaults {sorted(task_defaults)} need a task_config_cls, got None")
    if task_config_cls is not None:
        config_from_dict(task_config_cls, task_defaults or {}, where=f"preset {name!r} task_defaults")
    # deep copies: a list or dict default (``heads={1: ...}``) stayed the caller's object, so mutating it later
    # (or a built model's ``config.heads``, the same object) silently changed every later build of the preset
    preset = ModelPreset(name, model_cls, config_cls, copy.deepcopy(dict(defaults)), description, task_config_cls,
                         copy.deepcopy(dict(task_defaults or {})))
    _PRESETS[name] = preset
    return preset


def unregister_model(name: str) -> ModelPreset:
    """Remove preset ``name`` and return it (for tests and interactive work: a notebook cell that registers a
    preset, run again). A built-in preset may be removed too; registering the name again builds the new class.

    Args:
        name: the preset's name, as :func:`register_model` was given it.

    Returns:
        The removed :class:`ModelPreset`.

    Raises:
        TypeError: ``name`` is not a ``str``.
        ValueError: no preset is registered under ``name`` (with a close match, if any), as :func:`get_preset`.

    Examples:
        >>> from diffusionformer.models import DiffusionViT, ViTConfig
        >>> _ = register_model("doc-vit", DiffusionViT, ViTConfig, input_size=(8, 8), patch_size=2, dim=8, depth=1)
        >>> unregister_model("doc-vit").name
        'doc-vit'
        >>> "doc-vit" in list_models()
        False
    """
    get_preset(name)  # the "unknown model ... (did you mean ...)" error
    return _PRESETS.pop(name)


def list_models() -> list[str]:
    """Names of the registered presets, sorted."""
    return sorted(_PRESETS)


def get_preset(name: str) -> ModelPreset:
    if not isinstance(name, str):
        raise TypeError(f"model name must be a string, got {type(name).__name__}")
    if name not in _PRESETS:
        # also case- and separator-blind: "VIT-MNIST" and "Vit_Mnist" had no hint (difflib compares characters)
        close = (difflib.get_close_matches(name, list(_PRESETS), n=1)
                 or difflib.get_close_matches(name.lower().replace("_", "-"), list(_PRESETS), n=1))
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown model {name!r}{hint}; available: {list_models()}")
    return _PRESETS[name]


def split_task_settings(name: str, overrides: dict[str, Any], *, warn: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model overrides, task settings)``: the keys of ``overrides`` that are fields of preset
    ``name``'s ``task_config_cls`` (e.g. DINO's views and k-NN settings, once ``DINOConfig``
    fields) split off, with a ``DeprecationWarning`` when there are any and ``warn``."""
    _check_flag(warn, "split_task_settings: warn")
    preset = get_preset(name)
    if preset.task_config_cls is None:
        return dict(overrides), {}
    keys = {f.name for f in fields(preset.task_config_cls)}
    moved = {k: v for k, v in overrides.items() if k in keys}
    if moved and warn:
        task_cls = preset.task_config_cls.__name__
        warnings.warn(f"model {name!r}: {sorted(moved)} are settings of the task ({task_cls}), no longer "
                      f"{preset.config_cls.__name__} fields; set them in the task's `ssl` table (experiment "
                      f"configs) or pass build_task(..., ssl={task_cls}(...)); as model overrides they are "
                      "deprecated", DeprecationWarning, stacklevel=user_stacklevel())
    return {k: v for k, v in overrides.items() if k not in keys}, moved


def _task_key_hint(preset: ModelPreset, overrides: dict[str, Any]) -> None:
    """A ``ValueError`` for an override that is no field of the preset's config or task settings and whose
    closest name is a task setting (``local_crop`` for DINO's ``local_crops``): the config's own unknown-key
    error listed the config's fields only, with no "did you mean"."""
    if preset.task_config_cls is None:
        return
    model_keys = [f.name for f in fields(preset.config_cls) if f.init]
    task_keys = [f.name for f in fields(preset.task_config_cls) if f.init]
    for key in overrides:
        if key in model_keys or key in task_keys:
            continue
        close = difflib.get_close_matches(str(key), model_keys + task_keys, n=1)
        if close and close[0] in task_keys:
            task_cls = preset.task_config_cls.__name__
            raise ValueError(f"model {preset.name!r}: unknown key {key!r} (did you mean {close[0]!r}? a setting of "
                             f"the task, {task_cls}: set it in the task's `ssl` table or pass build_task(..., "
                             f"ssl={task_cls}(...))); valid model keys: {sorted(model_keys)}")


def task_config(name: str, **settings: Any) -> Any:
    """Preset ``name``'s validated task settings (``task_config_cls``) with ``settings`` applied;
    ``None`` for a preset without any (then ``settings`` must be empty)."""
    preset = get_preset(name)
    if preset.task_config_cls is None:
        if settings:
            raise ValueError(f"model {name!r} has no task settings, got {sorted(settings)}")
        return None
    return config_from_dict(preset.task_config_cls, {**copy.deepcopy(preset.task_defaults), **settings},
                            where=f"model {name!r} {preset.task_config_cls.__name__}")


def model_config(name: str, **overrides: Any) -> Any:
    """The validated config of preset ``name`` with ``overrides`` applied (unknown keys raise).

    Task settings among ``overrides`` (deprecated, see :func:`split_task_settings`) are
    validated and left out of the config.
    """
    preset = get_preset(name)
    overrides, moved = split_task_settings(name, overrides)
    if moved:
        task_config(name, **moved)
    _task_key_hint(preset, overrides)
    return config_from_dict(preset.config_cls, {**copy.deepcopy(preset.defaults), **overrides}, where=f"model {name!r}")


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build preset ``name`` with config ``overrides`` (e.g. ``heads=``, ``laplacian_heads=``).

    A preset with task settings (DINO: :class:`~diffusionformer.data.ssl.SSLConfig`) gives its
    model a ``task_config`` attribute: the preset's task defaults, plus any task settings passed
    (deprecated) among ``overrides``; a task adapter built without settings uses it.
    """
    preset = get_preset(name)
    overrides, moved = split_task_settings(name, overrides)
    settings = task_config(name, **moved)
    model = preset.model_cls(model_config(name, **overrides))
    if settings is not None:
        model.task_config = settings
    return model


# ----------------------------------------------------------------------------- presets
register_model("gpt-char-small", DiffusionGPT, GPTConfig,
               "nanoGPT's shakespeare-char CPU model: 4 layers, 4 heads, width 128, block 64",
               vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
register_model("gpt-char-tiny", DiffusionGPT, GPTConfig, "2 layers, 4 heads, width 64, block 64 (quick runs)",
               vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64, dropout=0.0)
register_model("gpt-recall", DiffusionGPT, GPTConfig, "2 layers, 4 heads, width 64 for associative recall",
               vocab_size=64, block_size=64, n_layer=2, n_head=4, n_embd=64)
register_model("vit-digits", DiffusionViT, ViTConfig, "8x8 digits, patch 2 (16 tokens), width 64, depth 4",
               input_size=(8, 8), patch_size=2, num_classes=10, dim=64, depth=4, num_heads=4)
register_model("vit-mnist", DiffusionViT, ViTConfig, "28x28 MNIST, patch 4 (49 tokens), width 64, depth 4",
               input_size=(28, 28), patch_size=4, num_classes=10, dim=64, depth=4, num_heads=4)
register_model("vit-cifar", DiffusionViT, ViTConfig, "32x32x3 CIFAR-10, patch 4 (64 tokens), width 128, depth 6",
               input_size=(32, 32), in_channels=3, patch_size=4, num_classes=10, dim=128, depth=6, num_heads=4)
register_model("vit-mnist1d", DiffusionViT, ViTConfig, "MNIST-1D signals (40 samples), patch 4, width 64, depth 4",
               input_size=(40,), in_channels=1, patch_size=4, num_classes=10, dim=64, depth=4, num_heads=4,
               pool="mean")
register_model("graph-node-small", DiffusionGraphTransformer, GraphTransformerConfig,
               "node classification: 2 blocks, width 64, 4 heads, sparse attention over edges",
               task="node", dim=64, depth=2, num_heads=4, dropout=0.5, input_dropout=0.5)
register_model("graph-graph-small", DiffusionGraphTransformer, GraphTransformerConfig,
               "graph classification: 3 blocks, width 64, 4 heads, mean pooling",
               task="graph", dim=64, depth=3, num_heads=4, dropout=0.1)
register_model("gcn-2layer", GCN, GCNConfig, "baseline: 2-layer GCN, 16 hidden, dropout 0.5 (PyG Planetoid example)",
               task="node", hidden=16, num_layers=2, dropout=0.5)
register_model("gin-graph", GIN, GINConfig,
               "baseline: GIN-0 for graph classification, 5 layers, 64 hidden, sum readout (Xu et al. 2019)",
               task="graph", hidden=64, num_layers=5, dropout=0.5, pool="add")
# DINO presets for short CPU runs: mean pooling and a faster teacher (momentum 0.99) leave the
# near-uniform start of training in a few hundred updates (a class token and 0.996 take thousands).
register_model("dino-digits", DINO, DINOConfig,
               "self-supervised DINO on 8x8 digits: ViT patch 2 (16 tokens), width 64, depth 4, 128 prototypes",
               input_size=(8, 8), patch_size=2, dim=64, depth=4, num_heads=4, pool="mean", momentum=0.99,
               out_dim=128, head_hidden=128, head_bottleneck=32,
               task_config_cls=SSLConfig, task_defaults={"blur_sigma": (0.1, 0.6)})
register_model("dino-mnist", DINO, DINOConfig,
               "self-supervised DINO on 28x28 MNIST: ViT patch 4 (49 tokens), width 64, depth 4, 256 prototypes",
               input_size=(28, 28), patch_size=4, dim=64, depth=4, num_heads=4, pool="mean", momentum=0.99,
               out_dim=256, head_hidden=256, head_bottleneck=64, task_config_cls=SSLConfig)
