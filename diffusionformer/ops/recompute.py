r"""Recompute a cheap tensor in the backward pass instead of keeping it for the output projection.

A layer whose heads are not all plain attention combines the propagated values into its
output ``z`` (``c0 v + c1 P v``, a sum of powers, a concatenation of head groups) and then
projects it, ``y = z W^T``. Autograd keeps ``z`` until the backward pass (the projection's
weight gradient is ``g^T z``), on top of the tensors the attention calls keep anyway: the
values ``v`` and every call's output ``P^k v``. So ``z`` is one extra activation of the
layer's full width, kept only because it was formed, although it is a few element-wise
operations away from tensors that are kept regardless. nanoGPT's attention keeps nothing of
the kind (the attention output is both the kernel's saved output and the projection's
input).

:func:`recompute_saved` drops that copy: inside it, a tensor autograd saves that is ``z`` (or a
view of it) is stored as a recipe and rebuilt by calling the same function again when the
backward pass needs it. The recomputation repeats the forward operations on the same inputs,
so the rebuilt tensor has the forward's bits and the gradients are unchanged; the cost is
the combination's element-wise operations once more per layer in the backward pass.

:class:`~diffusionformer.nn.DiffusionAttention` uses it on the paths whose propagations are
kept by autograd anyway: its affine path (``P v`` and ``v``) and the engine on the fused
kernel, whose outputs the kernel keeps for its own backward pass (the engine records them and
replays them, ``ops.dense._SdpaReplay``). Where keeping them would cost memory of its own (a
materialised ``P``, whose products no kernel keeps; heads that change the output after the
engine), the layer keeps ``z`` as autograd would.

``torch.compile`` needs none of this (its partitioner recomputes cheap element-wise operations
by itself), so the context does nothing while compiling; it also does nothing without autograd
history, inside another saved-tensor hook (``torch.utils.checkpoint``, which recomputes the
whole block anyway) or inside a ``torch.func`` transform (which refuses saved-tensor hooks).
Higher-order gradients (``create_graph=True``) stay exact: autograd gives the rebuilt tensor the
original's place in the graph.

The layers do it when asked (``DiffusionAttention(recompute=True)``,
:func:`~diffusionformer.nn.set_recompute`, ``GPTConfig(recompute=True)``): it trades host and
element-wise work for memory, and at small sizes, where a GPU waits for the host, the host
time counts (``docs/performance.md``, "Memory").
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.autograd.forward_ad as _forward_ad
from torch import Tensor

__all__ = ["recompute_saved", "wants_recompute"]


class _Rebuild:
    """What :func:`recompute_saved` stores in place of a saved view of ``z``: how to rebuild it."""

    __slots__ = ("fn", "size", "stride", "offset", "z_size", "z_stride", "z_dtype")

    def __init__(self, fn: Callable[[], Tensor], saved: Tensor, z_offset: int, z_size: torch.Size,
                 z_stride: tuple[int, ...], z_dtype: torch.dtype) -> None:
        self.fn = fn
        self.size, self.stride = saved.size(), saved.stride()
        self.offset = saved.storage_offset() - z_offset  # where the view starts within z
        self.z_size, self.z_stride, self.z_dtype = z_size, z_stride, z_dtype

    def __call__(self) -> Tensor:
        if torch.is_grad_enabled():  # create_graph=True: the rebuilt tensor is a constant all the same
            with torch.no_grad():
                z = self.fn()
        else:
            z = self.fn()
        # the shape too: a larger tensor with z's strides would hand out its first elements as z's, silently
        if z.shape != self.z_size or z.stride() != self.z_stride or z.dtype is not self.z_dtype:
            raise RuntimeError(
                f"recompute_saved: the recomputed tensor has shape {tuple(z.shape)}, strides {z.stride()} and dtype "
                f"{z.dtype}, the forward's {tuple(self.z_size)}, {self.z_stride} and {self.z_dtype}; the function "
                "must repeat the forward's operations"
            )
        return z.as_strided(self.size, self.stride, z.storage_offset() + self.offset)


def _span(t: Tensor) -> tuple[int, int, bool]:
    """The storage elements ``[first, last]`` that ``t`` reaches, and whether ``t`` fills them each once (a
    permuted contiguous layout, no gap between its elements and none shared); ``last < first`` when empty."""
    first = t.storage_offset()
    if t.numel() == 0:
        return first, first - 1, True
    expected, dense, last = 1, True, first
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        last += (size - 1) * stride
        if size > 1:
            dense = dense and stride == expected
            expected *= size
    return first, last, dense


class _Kept:
    """A tensor :func:`recompute_saved` saves as it is, with its version when saved: autograd checks no version of
    a tensor that passed through saved-tensor hooks, so that an in-place change between the forward and the
    backward pass (an optimizer step on the projection's weight) would give gradients of the changed tensor
    silently; the unpacking raises as autograd does without the hooks."""

    __slots__ = ("t", "version")

    def __init__(self, t: Tensor) -> None:
        self.t, self.version = t, t._version

    def __call__(self) -> Tensor:
        t = self.t
        if t._version != self.version:
            raise RuntimeError(
                "recompute_saved: one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: a {t.dtype} tensor of shape {tuple(t.shape)} is at version {t._version}; "
                f"expected version {self.version} instead"
            )
        return t


def _unpack(p: _Kept | _Rebuild) -> Tensor:
    return p()


_TOP_HOOKS = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
_FUNCTORCH_STACK = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)
_HOOKS_ENABLED = getattr(torch._C._autograd, "_saved_tensors_hooks_is_enabled", None)


def _outer_hooks() -> bool:
    """Whether saved-tensor hooks are already active (``torch.utils.checkpoint``, offloading) or disabled
    (:func:`torch.autograd.graph.disable_saved_tensors_hooks`, where registering one raises)."""
    if _TOP_HOOKS is None or _HOOKS_ENABLED is None:  # unknown torch internals: stay out of the way
        return True
    return _TOP_HOOKS(True) is not None or not _HOOKS_ENABLED()


def _in_functorch() -> bool:
    """Whether a ``torch.func`` transform (``grad``, ``vjp``, ``vmap``, ...) is running: they refuse saved-tensor hooks."""
    return _FUNCTORCH_STACK is None or _FUNCTORCH_STACK() is not None


def _in_forward_ad() -> bool:
    """Whether a forward-mode AD level (:func:`torch.autograd.forward_ad.dual_level`) is open in eager mode: dual tensors
    may flow, and forward AD refuses ``out=`` kernels and ``autograd.Function`` objects without ``jvp``, as the
    ``torch.func`` transforms refuse them."""
    return not torch.compiler.is_compiling() and getattr(_forward_ad, "_current_level", -1) >= 0


def _in_eager_transform() -> bool:
    """Whether an eager ``torch.func`` transform is running or a forward-mode AD level is open (:func:`_in_forward_ad`;
    not compiling: dynamo traces the transforms itself, and the functorch stack is not to be read there). The test of
    every path that a transform or dual tensors refuse (``out=`` kernels, ``autograd.Function`` objects without
    ``setup_context`` or ``jvp``)."""
    return _in_forward_ad() or (not torch.compiler.is_compiling() and _in_functorch())


def _in_place_allowed() -> bool:
    """Whether a fresh intermediate may be written in place: always when compiling, else outside eager transforms
    (:func:`_in_eager_transform`): ``torch.func.linearize`` folds intermediates of unbatched inputs into constants
    that refuse an in-place write ("a leaf Variable that requires grad is being used in an in-place operation"), and
    ``vmap`` refuses writing a batched mask into an unbatched tensor. The one test of the dense engine's masks and
    the exact PPR solve's diagonal."""
    return torch.compiler.is_compiling() or not _in_eager_transform()


#: whether a tensor is batched by torch's legacy vmap (``None`` where torch has no such test)
_LEGACY_BATCHED = getattr(getattr(torch._C, "_functorch", None), "is_legacy_batchedtensor", None)


def _batched_grad(grad: Tensor) -> bool:
    """Whether a custom backward pass runs batched: its output gradient batched by the legacy vmap that
    ``torch.autograd.grad(..., is_grads_batched=True)`` (``autograd.functional.jacobian(..., vectorize=True)``) runs the
    backward pass under, or inside an eager transform (:func:`_in_eager_transform`: ``torch.func.vmap`` over a
    ``torch.autograd.grad``). Neither batches ``out=`` kernels, in-place updates of views or sparse CSR operands: the
    backward passes take stock out-of-place operations there."""
    if torch.compiler.is_compiling():  # dynamo traces the backward pass with fake tensors: no vmap to see
        return False
    return (_LEGACY_BATCHED is not None and _LEGACY_BATCHED(grad)) or _in_eager_transform()


def wants_recompute() -> bool:
    """Whether :func:`recompute_saved` would act now: autograd on, eager (not compiling, not inside a
    ``torch.func`` transform) and no outer saved-tensor hooks.

    Layers ask before they record what a recomputation needs.
    """
    return torch.is_grad_enabled() and not torch.compiler.is_compiling() and not _outer_hooks() and not _in_functorch()


def recompute_saved(z: Tensor, fn: Callable[[], Tensor]) -> "_RecomputeSaved":
    r"""Inside the block, autograd saves ``z`` (or a view of ``z``) as ``fn``, called again in the backward pass.

    ``fn`` must recompute ``z`` from tensors autograd keeps anyway, repeating the forward's
    operations (then the rebuilt tensor equals ``z`` bit for bit, with ``z``'s strides, and no
    gradient changes). It runs under ``no_grad`` and must not modify its inputs; it should not
    hold a reference to ``z`` (autograd keeps it as long as the graph). Tensors other than ``z``
    and its views are saved as usual, and so is ``z`` once it was changed in place inside the
    block (``fn`` rebuilds the ``z`` of the block's start). The block is an ordinary block (``z``
    is kept) unless :func:`wants_recompute`.

    Args:
        z: the tensor not to keep (it and its views are recognised by their common base tensor).
        fn: recomputes ``z``.

    Shapes:
        ``fn()`` returns ``z``'s shape, strides and dtype (a RuntimeError in the backward pass otherwise).

    Examples:
        >>> a = torch.randn(3, requires_grad=True); w = torch.randn(2, 3, requires_grad=True)
        >>> z = a * 2.0
        >>> with recompute_saved(z, lambda: a.detach() * 2.0):
        ...     y = torch.nn.functional.linear(z, w)  # linear saves z for w's gradient: stored as the recipe
        >>> y.sum().backward()
        >>> torch.equal(w.grad, (a.detach() * 2.0).expand(2, 3))
        True
    """
    if not isinstance(z, Tensor):
        raise TypeError(f"recompute_saved: z must be a tensor, got {type(z).__name__}")
    if not callable(fn):
        raise TypeError(f"recompute_saved: fn must be callable (it recomputes z), got {type(fn).__name__}")
    return _RecomputeSaved(z, fn)


class _RecomputeSaved:
    """The context of :func:`recompute_saved` (a class: a generator-based context costs more per call)."""

    __slots__ = ("hooks",)

    def __init__(self, z: Tensor, fn: Callable[[], Tensor]) -> None:
        self.hooks = None
        if not (z.requires_grad and wants_recompute()):
            return
        # plain values only: autograd keeps the hooks (and so their closures) as long as the graph, and a
        # reference to z there would keep the very tensor this is meant to release. z and its views share one
        # base tensor, which lives for the whole block (the caller holds z): its id identifies them there.
        base = z._base if z._base is not None else z
        base_id, dtype, offset, size, stride = id(base), z.dtype, z.storage_offset(), z.shape, z.stride()
        # a view of that base is one of z's views only where it lies within the elements of z: where z is a slice
        # of a larger tensor, another slice of it has z's base too, and rebuilt from fn() (z's elements alone) it
        # read past the rebuilt storage in the backward pass ("setStorage: ... out of bounds")
        z_id, (lo, hi, z_dense) = id(z), _span(z)
        # z and its views share one version counter: an in-place change inside the block (a forward pre-hook of the
        # projection adding to its input) makes z differ from what fn() rebuilds, so such a z is saved as usual
        version = z._version

        def pack(t: Tensor) -> _Kept | _Rebuild:
            if t.dtype is dtype and (id(t) == base_id or id(t._base) == base_id):
                if t._version != version:
                    return _Kept(t)
                if id(t) == z_id:
                    return _Rebuild(fn, t, offset, size, stride, dtype)
                first, last, _ = _span(t)
                if z_dense and lo <= first and last <= hi:
                    return _Rebuild(fn, t, offset, size, stride, dtype)
            return _Kept(t)  # with autograd's version check, which the hooks would skip

        self.hooks = torch.autograd.graph.saved_tensors_hooks(pack, _unpack)

    def __enter__(self) -> None:
        if self.hooks is not None:
            self.hooks.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.hooks is not None:
            self.hooks.__exit__(*exc)
