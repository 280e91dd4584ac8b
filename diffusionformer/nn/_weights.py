"""The tensor that holds a module's weight, read without computing the weight.

Layers read their weights' device and dtype (to cast an input, to build a cache). Under
:mod:`torch.nn.utils.parametrize` (``weight_norm``, ``spectral_norm``, ``orthogonal``) reading
``module.weight`` runs the parametrization once more per call (``spectral_norm`` in training mode
then advanced its power iteration twice per forward), and under :mod:`torch.nn.utils.prune`
``module.weight`` is a plain tensor recomputed by a forward pre-hook, so after ``model.double()``
it kept the old dtype until the module's next call (the input was cast to that stale dtype).
A module replaced by one without a tensor ``weight`` (a hand-written adapter wrapping the layer, as
LoRA does; :func:`torch.ao.quantization.quantize_dynamic`'s ``Linear``, whose ``weight`` is a
method) gives its first floating-point parameter or buffer instead, or its holder's; a quantized
module in a holder of none gives float32 on its packed weight's device, the precision it computes in.
"""

from __future__ import annotations

from itertools import chain

import torch
from torch import Tensor, nn

__all__: list[str] = []


def _stored_weight(module: nn.Module, name: str = "weight", owner: nn.Module | None = None) -> Tensor:
    """``module``'s parameter ``name`` as stored: the parameter itself, the (first) original of a parametrization, or
    prune's ``<name>_orig``; else ``getattr(module, name)`` when it is a tensor, else (a module replaced by an adapter)
    its first floating-point parameter or buffer, else ``owner``'s (the layer or model holding ``module``, whose device
    and dtype are the ones asked for), else for a quantized module float32 on its packed weight's device
    (:func:`_quantized_compute`); a ``TypeError`` naming the module when none holds one (the device and dtype the
    caller reads are nowhere)."""
    w = module._parameters.get(name)
    if w is not None:
        return w
    plist = getattr(module, "parametrizations", None)
    if plist is not None and name in plist:
        p = plist[name]
        return p.original if hasattr(p, "original") else p.original0
    w = module._parameters.get(name + "_orig")  # torch.nn.utils.prune
    if w is not None:
        return w
    w = getattr(module, name, None)
    if isinstance(w, Tensor):
        return w
    w = next((t for m in (module, owner) if m is not None for t in chain(m.parameters(), m.buffers())
              if t.is_floating_point()), None)
    if w is None:  # a quantized module in a holder of no floating-point tensor (a layer of parameter-free operators)
        w = _quantized_compute(module, name)
    if w is None:  # else AttributeError "'function' object has no attribute 'device'" from the caller
        raise TypeError(f"{type(module).__name__} has no tensor {name!r} and no floating-point parameter or buffer to "
                        "read the device and dtype from")
    return w


def _quantized_compute(module: nn.Module, name: str) -> Tensor | None:
    """For a module of :mod:`torch.ao.nn.quantized` whose ``name`` is a method returning its packed weight
    (:func:`torch.ao.quantization.quantize_dynamic`'s ``Linear``, a quantized ``Embedding``): an empty float32 tensor
    on that weight's device, the device and dtype the module computes in (float32 activations, whatever the weight's
    ``qint8`` or ``float16``); ``None`` for any other module. The last resort of :func:`_stored_weight` (it unpacks
    the weight): a layer of parameter-free operators (``ppr-exact``, ``neutreno``, ``value-residual``, ``grand-nl``
    without ``qk_norm``) whose ``qkv`` and ``out_proj`` are quantized holds no floating-point tensor to read."""
    method = getattr(module, name, None)
    if not callable(method) or not type(module).__module__.startswith("torch.ao.nn.quantized"):
        return None
    w = method()
    return torch.empty(0, dtype=torch.float32, device=w.device) if isinstance(w, Tensor) else None


def _reset_children(module: nn.Module, where: str) -> None:
    """Call ``reset_parameters()`` on each child of ``module`` in registration order (the order the constructors
    drew their random numbers in); a child without one is searched the same way. ``module``'s own parameters are
    its ``reset_parameters``'s to set. Everything that would refuse the reset is found (:func:`_check_reset`)
    before any part is reset, so a refused reset leaves the model as it was."""
    for reset in _check_reset(module, where):
        reset()


def _check_reset(module: nn.Module, where: str) -> list:
    """The ``reset_parameters`` calls that reset ``module``'s children (as :func:`_reset_children` makes them),
    after refusing, before anything moves, what would leave trained values in a model that reads as new: a
    reparametrized part (:func:`_refuse_reparametrized`), a part with parameters and no ``reset_parameters``, and
    a part whose ``_check_resettable()`` refuses (a learned operator without a reset of its own)."""
    _refuse_reparametrized(module, where)
    for sub in module.modules():
        check = getattr(sub, "_check_resettable", None)
        if callable(check):
            check()
    resets: list = []

    def collect(parent: nn.Module, path: str) -> None:
        for name, child in parent.named_children():
            reset = getattr(child, "reset_parameters", None)
            if callable(reset):
                resets.append(reset)
                continue
            own = [n for n, _ in child.named_parameters(recurse=False)]
            if own:
                raise TypeError(f"{where.split('.', 1)[0]}.reset_parameters: {path}.{name} ({type(child).__name__}) "
                                f"holds parameters {own} and has no reset_parameters(); give it one that "
                                "re-initialises them")
            collect(child, f"{path}.{name}")

    collect(module, where)
    return resets


def _refuse_reparametrized(module: nn.Module, path: str) -> None:
    """Refuse to reset ``module`` when it or a part of it is reparametrized (:mod:`torch.nn.utils.parametrize`'s
    ``weight_norm``/``spectral_norm``/``orthogonal``, the hook-based ``weight_norm``/``spectral_norm``, or
    :mod:`torch.nn.utils.prune`): its ``reset_parameters`` initialises ``module.weight``, there a tensor computed
    from the stored originals, so the originals, and the values the layer computes with, stayed as trained: a reset
    that passed for a fresh model's. ``path`` names ``module`` from the model whose reset was called."""
    from torch.nn.utils import parametrize, prune
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    for sub, m in module.named_modules():
        kinds = []
        if parametrize.is_parametrized(m):
            kinds.append(f"parametrizations of {sorted(m.parametrizations.keys())}")
        hooks = [type(h).__name__ for h in m._forward_pre_hooks.values()
                 if isinstance(h, (prune.BasePruningMethod, WeightNorm, SpectralNorm))]
        if hooks:
            kinds.append(f"hooks {hooks}")
        if kinds:
            name = f"{path}.{sub}" if sub else path
            raise TypeError(f"{path.split('.', 1)[0]}.reset_parameters: {name} ({type(m).__name__}) is "
                            f"reparametrized ({', '.join(kinds)}): its reset would initialise the computed weight, not "
                            "the stored originals, and leave the layer as trained; remove the reparametrization "
                            "(torch.nn.utils.parametrize.remove_parametrizations, prune.remove), reset, then apply it "
                            "again")
