"""Simulated failures for testing that training resumes exactly: a kill inside any method."""

from __future__ import annotations

import inspect
import numbers
import struct
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from diffusionformer.config import _check_flag, _choice_hint

__all__ = ["assert_same_checkpoint_weights", "interrupt_on_call"]


@contextmanager
def interrupt_on_call(owner: Any, name: str, call: int, *, after: bool = False) -> Iterator[dict[str, int]]:
    """Patch ``owner.name`` so that its ``call``-th call raises :class:`KeyboardInterrupt`.

    A stand-in for a killed process at a chosen point of training (e.g. inside the ``loss``
    of a task adapter). The original is restored on exit, also when the interrupt
    propagates. With ``after=True`` the original runs first, so side effects of that call
    (an EMA update, an optimizer step inside the method) happen before the "kill".

    Args:
        owner: the class (or object) whose attribute is patched, e.g. a task adapter class; a special method
            (``__call__``, ``__len__`` ...) on its class, which Python looks it up on (an instance's is refused).
        name: the method's name, e.g. ``"loss"``.
        call: which call raises, counting from 1.
        after: run the original before raising.

    Yields a dict whose ``"calls"`` counts the calls made so far.

    Examples:
        >>> class Task:
        ...     def loss(self, x):
        ...         return x
        >>> with interrupt_on_call(Task, "loss", 2) as seen:
        ...     Task().loss(1)
        ...     try:
        ...         Task().loss(2)
        ...     except KeyboardInterrupt:
        ...         print("killed at call", seen["calls"])
        1
        killed at call 2
        >>> Task().loss(3)  # restored
        3
    """
    if isinstance(call, bool) or not isinstance(call, numbers.Integral):  # a call 1.5 would never come: no kill
        raise TypeError(f"call must be an int, got {type(call).__name__} {call!r}")
    call = int(call)  # a numpy int as the int it equals
    if call < 1:
        raise ValueError(f"call must be >= 1, got {call}")
    _check_flag(after, "after")
    if not isinstance(name, str):
        raise TypeError(f"name must be a str (the method's name), got {type(name).__name__} {name!r}")
    if not hasattr(owner, name):
        hint = _choice_hint(name, [n for n in dir(owner) if not n.startswith("__")])
        raise AttributeError(f"interrupt_on_call: {owner!r} has no attribute {name!r}{hint}")
    if name.startswith("__") and name.endswith("__") and not isinstance(owner, (type, types.ModuleType)):
        # ``obj(x)``, ``len(obj)``... look special methods up on the type: a patch on the instance is never called
        raise TypeError(f"interrupt_on_call: {name} is looked up on the class, not on the instance {owner!r}; "
                        f"patch the class instead: interrupt_on_call(type(obj), {name!r}, ...)")
    original = getattr(owner, name)
    if not callable(original):  # a property or a data attribute: the wrapper would replace its value, never called
        raise TypeError(f"interrupt_on_call: {owner!r}.{name} must be a method, got "
                        f"{type(inspect.getattr_static(owner, name)).__name__}")
    # restore what owner itself held (a staticmethod or classmethod object, or nothing when inherited)
    own = getattr(owner, "__dict__", None)
    inherited = own is not None and name not in own
    stored = original if own is None or inherited else own[name]
    # the kind of method, found where it is defined (an inherited static or class method looks up as a function)
    static = inspect.getattr_static(owner, name)
    # a callable that is no descriptor (a builtin such as ``math.sqrt``, a ``functools.partial``, an object with
    # ``__call__``) is called without ``self`` through an instance: a plain-function wrapper would be bound to it
    static_kind = isinstance(static, (staticmethod, classmethod)) or not hasattr(type(static), "__get__")
    # a class method patched on a class: ``original`` is bound to ``owner``, but a subclass calls it with its own class
    class_method = isinstance(owner, type) and isinstance(static, classmethod)
    seen = {"calls": 0}

    def patched(*args: Any, **kwargs: Any) -> Any:
        fn = original
        if class_method:  # bound to the class it was looked up on, as the original would be
            cls, *args = args
            fn = static.__get__(None, cls)
        seen["calls"] += 1
        if seen["calls"] == call:
            if after:
                fn(*args, **kwargs)
            raise KeyboardInterrupt(f"simulated kill in {name} (call {call})")
        return fn(*args, **kwargs)

    # a method looked up on a class is a plain function: setattr puts the wrapper in its place. A static method
    # (or a class method patched on an instance) looks up as a function that takes no ``self`` (``original`` is
    # already bound for a class method): the wrapper must not be bound to the instance either.
    setattr(owner, name, classmethod(patched) if class_method else staticmethod(patched) if static_kind else patched)
    try:
        yield seen
    finally:
        if inherited:
            delattr(owner, name)
        else:
            setattr(owner, name, stored)


def _bit_equal(x: Any, y: Any) -> bool:
    """Same dtype, shape and bytes (``torch.equal`` alone takes 1.0 in float32 for 1.0 in float64, 0.0 for -0.0, and
    calls a NaN different from itself). A state dict may also hold a module's extra state (plain Python values,
    possibly holding tensors): those are compared by type and value, containers item by item."""
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(_bit_equal(v, y[k]) for k, v in x.items())
        if isinstance(x, (list, tuple)):
            return len(x) == len(y) and all(_bit_equal(a, b) for a, b in zip(x, y))
        if isinstance(x, float):  # a NaN equals itself, -0.0 is not 0.0
            return struct.pack("<d", x) == struct.pack("<d", y)
        return bool(x == y)
    if x.dtype != y.dtype or x.shape != y.shape or x.layout != y.layout:
        return False
    if x.is_quantized:  # a byte view of a quantized tensor crashed torch.equal (a segmentation fault)
        if x.qscheme() != y.qscheme():
            return False
        if x.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            params = [(x.q_scale(), y.q_scale()), (x.q_zero_point(), y.q_zero_point())]
        else:
            params = [(x.q_per_channel_scales(), y.q_per_channel_scales()), (x.q_per_channel_axis(), y.q_per_channel_axis()),
                      (x.q_per_channel_zero_points(), y.q_per_channel_zero_points())]
        return all(_bit_equal(a, b) for a, b in params) and _bit_equal(x.int_repr(), y.int_repr())
    if x.layout != torch.strided:  # a sparse buffer: the dense copy below refuses it ("unsupported memory format")
        # its stored indices and values, bit for bit (as saved: torch.save keeps them, coalesced or not); not its dense
        # copy, which adds each value to a zero: a stored -0.0 came out 0.0, equal to a stored 0.0
        x, y = x.to_sparse_coo(), y.to_sparse_coo()  # CSR, CSC, BSR, BSC: the same indices and values as COO
        return _bit_equal(x._indices(), y._indices()) and _bit_equal(x._values(), y._values())
    def as_bytes(t: torch.Tensor) -> torch.Tensor:  # contiguous first: a byte view needs unit stride
        # conjugate and negative views (saved and loaded as such) materialised first: a byte view refuses them
        flat = t.detach().resolve_conj().resolve_neg().contiguous().view(-1)
        if flat.stride(0) != 1:  # a one-element view of stride 2 (torch.save keeps a view's strides) or 0 (expand)
            # is contiguous as it is, and its byte view failed ("self.stride(-1) must be 1 to view Float as Byte"); a
            # copy of every tensor (one of each state dict's at a time, a model's largest twice) is not needed
            flat = flat.clone(memory_format=torch.contiguous_format)
        return flat.view(torch.uint8)

    return torch.equal(as_bytes(x), as_bytes(y))


def _checkpoint_entry(path: str | Path, key: str) -> Any:
    """``torch.load(path)[key]``; a missing key is a ``KeyError`` naming the file and the keys it holds."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or key not in payload:
        found = sorted(map(str, payload)) if isinstance(payload, dict) else type(payload).__name__
        raise KeyError(f"checkpoint {path} has no entry {key!r}; it holds {found}")
    entry = payload[key]
    if not isinstance(entry, dict):  # its iteration and items() would compare nonsense, or fail on a file itself
        raise TypeError(f"checkpoint {path}: entry {key!r} must be a state dict, got {type(entry).__name__}")
    return entry


def assert_same_checkpoint_weights(a: str | Path, b: str | Path, key: str = "model") -> None:
    """Assert that two checkpoints hold bit-identical tensors under ``key`` (same names, dtypes, shapes and bytes).

    Args:
        a, b: checkpoint files written by :class:`~diffusionformer.train.Trainer` (``torch.save`` dicts).
        key: the entry holding a state dict (``"model"``; ``"optimizer"`` state is nested and not compared).

    Raises:
        AssertionError: naming the tensors present in only one file, or the first ones that differ.
        KeyError: when a file has no entry ``key``, naming the entries it holds.
        TypeError: when the entry ``key`` is not a dict.
    """
    sa, sb = (_checkpoint_entry(path, key) for path in (a, b))
    if set(sa) != set(sb):
        # keys sorted as text: an int key beside str keys made sorted() raise TypeError instead of this assertion
        raise AssertionError(f"checkpoints hold different tensors: only in {a}: {sorted(set(sa) - set(sb), key=str)}, "
                             f"only in {b}: {sorted(set(sb) - set(sa), key=str)}")
    differ = [k for k, v in sa.items() if not _bit_equal(v, sb[k])]
    if differ:
        raise AssertionError(f"{len(differ)} of {len(sa)} tensors differ between {a} and {b}, e.g. {differ[:5]}")
