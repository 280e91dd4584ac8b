"""The tensor that holds a module's weight, read without computing the weight.

Layers read their weights' device and dtype (to cast an input, to build a cache). Under
:mod:`torch.nn.utils.parametrize` (``weight_norm``, ``spectral_norm``, ``orthogonal``) reading
``module.weight`` runs the parametrization once more per call (``spectral_norm`` in training mode
then advanced its power iteration twice per forward), and under :mod:`torch.nn.utils.prune`
``module.weight`` is a plain tensor recomputed by a forward pre-hook, so after ``model.double()``
it kept the old dtype until the module's next call (the input was cast to that stale dtype).
A module replaced by one without a tensor ``weight`` (a hand-written adapter wrapping the layer, as
LoRA does; :func:`torch.ao.quantization.quantize_dynamic`'s ``Linear``, whose ``weight`` is a
method) gives its first floating-point parameter or buffer instead.
"""

from __future__ import annotations

from itertools import chain

from torch import Tensor, nn

__all__: list[str] = []


def _stored_weight(module: nn.Module, name: str = "weight", owner: nn.Module | None = None) -> Tensor:
    """``module``'s parameter ``name`` as stored: the parameter itself, the (first) original of a parametrization, or
    prune's ``<name>_orig``; else ``getattr(module, name)`` when it is a tensor, else (a module replaced by an adapter
    or a quantized one) its first floating-point parameter or buffer, else ``owner``'s (the layer or model holding
    ``module``, whose device and dtype are the ones asked for); a ``TypeError`` naming the module when neither holds
    one (the device and dtype the caller reads are nowhere)."""
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
    if w is None:  # else AttributeError "'function' object has no attribute 'device'" from the caller
        raise TypeError(f"{type(module).__name__} has no tensor {name!r} and no floating-point parameter or buffer to "
                        "read the device and dtype from")
    return w


def _reset_children(module: nn.Module, where: str) -> None:
    """Call ``reset_parameters()`` on each child of ``module`` in registration order (the order the constructors
    drew their random numbers in); a child without one is searched the same way, and one that holds parameters
    itself but has no ``reset_parameters`` is refused (a reset that left it as trained would pass for a fresh
    model). ``module``'s own parameters are its ``reset_parameters``'s to set."""
    for name, child in module.named_children():
        reset = getattr(child, "reset_parameters", None)
        if callable(reset):
            reset()
            continue
        own = [n for n, _ in child.named_parameters(recurse=False)]
        if own:
            raise TypeError(f"{where}.reset_parameters: {where}.{name} ({type(child).__name__}) holds parameters "
                            f"{own} and has no reset_parameters(); give it one that re-initialises them")
        _reset_children(child, f"{where}.{name}")
