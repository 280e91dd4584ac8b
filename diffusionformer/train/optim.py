"""AdamW with the usual split into decayed matrices and non-decayed vectors/embeddings."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from diffusionformer.config import _choice_hint

from .config import TrainConfig, _check_device, _type_name

__all__ = ["param_groups", "build_optimizer"]


def _exempt_names(model: nn.Module) -> set[str]:
    # timm convention: a model may list parameter names (e.g. "pos_embed", "cls_token") that
    # must not be decayed via a ``no_weight_decay()`` method returning an iterable of names.
    hook = getattr(model, "no_weight_decay", None)
    inner = model
    while hook is None and isinstance(getattr(inner, "module", None), nn.Module):
        # DistributedDataParallel / DataParallel do not forward attribute look-ups: the wrapped model's hook was
        # never found, and its position embedding and class token were decayed without a word
        inner = inner.module
        hook = getattr(inner, "no_weight_decay", None)
    if hook is None:
        return set()
    if not callable(hook):  # a set of names as a class attribute: a bare "'set' object is not callable"
        raise TypeError(f"{type(model).__name__}.no_weight_decay: expected a method returning parameter names (the "
                        f"timm hook), got {type(hook).__name__} ({hook!r})")
    names = hook()
    iterable = not isinstance(names, str) and isinstance(names, Iterable)
    names = list(names) if iterable else names  # a generator is read once
    if not iterable or not all(isinstance(n, str) for n in names):
        raise TypeError(
            f"{type(model).__name__}.no_weight_decay(): expected an iterable of parameter names, "
            f"got {names!r}"
        )
    names = set(names)
    owner = getattr(hook, "__self__", None)
    if isinstance(owner, nn.Module) and owner is not model:
        # the hook of a module inside a wrapper (torch.compile's OptimizedModule forwards attribute look-ups to it,
        # its parameters are "_orig_mod.<name>"; DDP's are "module.<name>"): its names are relative to that module,
        # and were refused as "unknown" names of the wrapper
        prefix = next((name for name, module in model.named_modules() if module is owner), None)
        if prefix:
            names = {f"{prefix}.{name}" for name in names}
    return names


def param_groups(model: nn.Module, weight_decay: float, rule: str = "default") -> list[dict[str, Any]]:
    r"""Split trainable parameters into a decayed and a non-decayed AdamW group.

    ``rule="default"``: a parameter ``p`` is decayed iff ``p.dim() >= 2`` (weight matrices,
    convolution kernels) and it is neither owned by an ``nn.Embedding`` (token/position tables,
    and any weight tied to one) nor named by ``model.no_weight_decay()`` (the timm hook, e.g.
    ``{"pos_embed", "cls_token"}``; names relative to the module whose method it is, so a ``torch.compile``,
    ``DistributedDataParallel`` or ``DataParallel`` wrapper's hook is the model's inside it).

    ``rule="nanogpt"``: ``p`` is decayed iff ``p.dim() >= 2``, embeddings included, exactly as
    nanoGPT's ``GPT.configure_optimizers`` (Karpathy, ``nanoGPT/model.py``);
    ``no_weight_decay()`` is ignored.

    Under both rules biases and norm gains (``dim < 2``) are never decayed, frozen parameters
    (``requires_grad=False``) are left out and shared parameters appear once, under their
    first name in ``model.named_parameters()``. Learned operator parameters follow the same
    shape rule: a polynomial head's coefficients ``theta`` ``(G, K + 1)`` are decayed (towards
    the zero operator), the per-head vectors (heat times, PPR teleport logits, AttnScale and
    differential scalars) are not; name them in ``no_weight_decay()`` to exempt them.

    Args:
        model: the module to optimise.
        weight_decay: decay of the first group (``>= 0``).
        rule: ``"default"`` or ``"nanogpt"``.

    Returns:
        ``[{"params": decayed, "weight_decay": weight_decay, "names": [...]},
        {"params": rest, "weight_decay": 0.0, "names": [...]}]`` (empty groups dropped).

    Examples:
        >>> model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 4), nn.LayerNorm(4))
        >>> [(g["names"], g["weight_decay"]) for g in param_groups(model, 0.1)]
        [(['1.weight'], 0.1), (['0.weight', '1.bias', '2.weight', '2.bias'], 0.0)]
        >>> [(g["names"], g["weight_decay"]) for g in param_groups(model, 0.1, rule="nanogpt")]
        [(['0.weight', '1.weight'], 0.1), (['1.bias', '2.weight', '2.bias'], 0.0)]
    """
    if not isinstance(model, nn.Module):  # e.g. model.parameters(), what torch.optim takes: a bare AttributeError
        raise TypeError(f"param_groups: expected model to be an nn.Module, got {type(model).__name__}")
    if rule not in ("default", "nanogpt"):
        raise ValueError(f"param_groups: expected rule 'default' or 'nanogpt', got {rule!r}"
                         f"{_choice_hint(rule, ('default', 'nanogpt'))}")
    if isinstance(weight_decay, bool) or not isinstance(weight_decay, numbers.Real):
        raise TypeError(f"param_groups: expected weight_decay a float >= 0, got {_type_name(weight_decay)} "
                        f"({weight_decay!r})")
    if not (math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"param_groups: expected weight_decay a finite float >= 0, got {weight_decay}")
    weight_decay = float(weight_decay)  # a NumPy rate in a group's state_dict fails torch.load(weights_only=True)
    if rule == "nanogpt":
        decay = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
        return _groups(decay, no_decay, weight_decay)
    exempt_ids = {
        id(p)
        for module in model.modules()
        if isinstance(module, nn.Embedding)
        for p in module.parameters(recurse=False)
    }
    exempt_names = _exempt_names(model)
    known = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    unknown = sorted(exempt_names - known)
    if unknown:
        raise ValueError(
            f"{type(model).__name__}.no_weight_decay(): expected names of parameters, got unknown "
            f"{unknown}"
        )
    for name, p in model.named_parameters(remove_duplicate=False):
        if name in exempt_names:
            exempt_ids.add(id(p))
    decay: list[tuple[str, nn.Parameter]] = []
    no_decay: list[tuple[str, nn.Parameter]] = []
    for name, p in model.named_parameters():  # remove_duplicate=True: tied weights once
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and id(p) not in exempt_ids else no_decay).append((name, p))
    return _groups(decay, no_decay, weight_decay)


def _groups(decay: list[tuple[str, nn.Parameter]], no_decay: list[tuple[str, nn.Parameter]],
            weight_decay: float) -> list[dict[str, Any]]:
    groups = [
        {"params": [p for _, p in decay], "weight_decay": weight_decay, "names": [n for n, _ in decay]},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0, "names": [n for n, _ in no_decay]},
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` (``config.weight_decay_rule``) with ``config.lr``,
    ``config.betas``, ``config.weight_decay``.

    Uses the fused CUDA kernel on CUDA and PyTorch's default elsewhere (on CPU, the per-tensor loop). The group
    key ``"names"`` is kept so that a saved optimizer state says which tensor is which.

    Args:
        model: the (unwrapped) module, already on ``device``.
        config: the training config.
        device: the training device.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"build_optimizer: expected config to be a TrainConfig, got {type(config).__name__} "
                        "(use TrainConfig.from_dict for mappings)")
    _check_device("build_optimizer", device)
    groups = param_groups(model, config.weight_decay, config.weight_decay_rule)
    if not groups:
        raise ValueError(
            f"build_optimizer: expected a model with trainable parameters, got {type(model).__name__} "
            "with none"
        )
    fused = device.type == "cuda"
    return torch.optim.AdamW(
        groups, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay, fused=fused or None
    )
