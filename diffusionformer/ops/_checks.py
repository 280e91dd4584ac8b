"""Input validation shared by the dense and sparse kernels (clear errors, no bare asserts)."""

from __future__ import annotations

import difflib
import numbers
import operator
from collections.abc import Mapping, Set as AbstractSet
from typing import Any, Iterable, Sequence

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from diffusionformer.config import _check_flag
from diffusionformer.ops.engine import _pure_cache, static_coefficients


def check_tensor(name: str, x: object, ndim: int, layout: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {layout}, got {type(x).__name__}")
    _check_strided(name, x, f"pass {name}.to_dense()")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have shape {layout} ({ndim} dims), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    return x


#: how to turn a sparse adjacency matrix ``adj[source, target]`` (torch.sparse COO/CSR) into an edge_index, and PyG's
#: transposed ``adj_t`` (``conv(x, adj_t)``, ``ToSparseTensor``), whose every edge the first conversion alone reversed
_SPARSE_ADJACENCY_FIX = ("a sparse adjacency matrix adj[source, target] becomes an edge_index with "
                         "torch_geometric.utils.to_edge_index(adj)[0], and PyG's transposed adj_t[target, source] "
                         "(ToSparseTensor's, as in conv(x, adj_t)) one with to_edge_index(adj_t)[0].flip(0)")


def _check_strided(name: str, t: Tensor, fix: str) -> None:
    """TypeError for a sparse (COO, CSR, ...) tensor, which the kernels' gathers, scatters and bounds checks do not
    take (else a NotImplementedError or a memory-format error from inside torch that names no argument), or for a
    nested tensor (``torch.nested``, jagged or strided: "doesn't support sizes" or "unsupported: NestedIntNode" from
    inside torch, and a jagged one has no ``to_dense()``)."""
    if t.is_nested:
        raise TypeError(f"{name} must be a dense (strided) tensor, got a nested tensor (layout {t.layout}): pad the "
                        f"sequences with {name}.to_padded_tensor(0.0) and mask the padding, or pass each sequence "
                        "alone")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}: {fix}")


def checks_values(t: Tensor) -> bool:
    """Whether a check that reads the values of ``t`` on the host runs: a CPU tensor in eager mode.

    Such a check (``if not torch.isfinite(t).all(): raise ...``) is a device-to-host
    synchronisation on an accelerator and data-dependent control flow (a graph break) under
    :func:`torch.compile`, so it runs only in eager mode on CPU, where it is cheap and turns a
    NaN into a clear error instead of a NaN output three layers later. A fake tensor
    (:class:`~torch._subclasses.fake_tensor.FakeTensorMode`, a dry run) has no values to read, and
    a tensor batched by :func:`torch.vmap` none that one Python ``if`` can read (vmap refuses
    data-dependent control flow). Nor is a tensor while :func:`~torch.fx.experimental.proxy_tensor.make_fx` records
    the operations (:func:`torch.func.linearize` traces with it): its tensors refuse a host read.

    Examples:
        >>> checks_values(torch.zeros(2))
        True
    """
    return (t.device.type == "cpu" and not torch.compiler.is_compiling() and not isinstance(t, FakeTensor)
            and not _vmapped(t) and not _proxy_tracing())


_PROXY_KEY = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "PROXY", None)


def _proxy_tracing() -> bool:
    """Whether :func:`~torch.fx.experimental.proxy_tensor.make_fx` (``tracing_mode="real"``, as
    :func:`torch.func.linearize` calls it) records the operations: a host read of a tensor it traces fails with
    "trying to get value out of a tracing tensor" (its other modes trace a :class:`FakeTensor`)."""
    return _PROXY_KEY is not None and torch._C._get_dispatch_mode(_PROXY_KEY) is not None


_FUNCTORCH = getattr(torch._C, "_functorch", None)


def _vmapped(t: Tensor) -> bool:
    """Whether ``t`` is, or wraps (``torch.func.grad`` inside ``vmap``), a tensor batched by :func:`torch.vmap`."""
    if _FUNCTORCH is None:  # unknown torch internals: the check runs as before
        return False
    while _FUNCTORCH.is_functorch_wrapped_tensor(t):
        if _FUNCTORCH.is_batchedtensor(t):
            return True
        t = _FUNCTORCH.get_unwrapped(t)
    return False


_VMAP_TRANSFORM = getattr(getattr(_FUNCTORCH, "TransformType", None), "Vmap", None)


def _in_vmap() -> bool:
    """Whether a :func:`torch.vmap` level is running (outermost or under other transforms), whether or not the
    tensor at hand is batched: ``vmap(lambda _: model(x), randomness="different")(torch.arange(n))`` (Monte Carlo
    samples of a fixed input) draws its randomness on unbatched tensors."""
    stack = _FUNCTORCH.get_interpreter_stack() if hasattr(_FUNCTORCH, "get_interpreter_stack") else None
    return bool(stack) and _VMAP_TRANSFORM is not None and any(i.key() == _VMAP_TRANSFORM for i in stack)


def check_index_range(name: str, index: Tensor, size_name: str, size: int) -> None:
    """``index`` values must lie in ``[0, size)``: else a ``ValueError`` naming ``name``, ``size_name``
    and the range found. Runs only where :func:`checks_values` allows (no host sync, no graph break).

    Examples:
        >>> check_index_range("index", torch.tensor([0, 3]), "dim_size", 3)
        Traceback (most recent call last):
        ValueError: index values must lie in [0, dim_size=3), got range [0, 3]
    """
    if checks_values(index) and index.numel() > 0:
        lo, hi = int(index.min()), int(index.max())
        if lo < 0 or hi >= size:
            raise ValueError(f"{name} values must lie in [0, {size_name}={size}), got range [{lo}, {hi}]")


def _on_device_of_x(mask: Any, name: str, x: Tensor) -> Any:
    """A mask or ``edge_index`` on ``x``'s device (anything else as given, for the checks of its caller), as
    :meth:`~diffusionformer.graph.AttentionGraph.attention_kwargs` hands a graph's tensors to the layer; a meta one
    (no values to copy) is a ``ValueError`` naming it, not torch's "Cannot copy out of meta tensor"."""
    if not isinstance(mask, Tensor) or mask.device == x.device:
        return mask
    if mask.is_meta:
        raise ValueError(f"{name} is on the meta device, which has no values to copy to the device of x ({x.device})")
    return mask.to(x.device)


def _check_is_causal(is_causal: object) -> bool:
    """``is_causal`` if it is a Python bool, else a TypeError showing its full type and value (``bool("no")`` is
    True, so nothing else is read as a flag; a ``numpy.bool`` is refused too, and named ``numpy.bool``, not ``bool``).

    Examples:
        >>> _check_is_causal(1)
        Traceback (most recent call last):
        TypeError: is_causal must be a bool, got int (1)
    """
    _check_flag(is_causal, "is_causal")
    return is_causal


def check_coefficients(coeffs: object, num_heads: int, like: Tensor) -> Tensor:
    """Return coefficients as a ``(H, K+1)`` tensor on ``like``'s device (float32 at least)."""
    if not isinstance(coeffs, Tensor):
        if isinstance(coeffs, (list, tuple)):
            coeffs = torch.tensor(coeffs, dtype=torch.float64)
        else:
            # an operator (or its name) where its coefficients were meant: say how to get them
            hint = (" (an operator: pass its .coefficients())" if callable(getattr(coeffs, "coefficients", None))
                    else " (an operator's coefficients are build_operator(name).coefficients())"
                    if isinstance(coeffs, str) else "")
            raise TypeError(
                f"coeffs must be a tensor of shape (K+1,) or (H, K+1), got {type(coeffs).__name__}{hint}"
            )
    _check_strided("coeffs", coeffs, "pass coeffs.to_dense()")
    if coeffs.dtype == torch.bool or coeffs.is_complex():
        raise TypeError(f"coeffs must be real numbers, got {coeffs.dtype}")
    if not coeffs.is_floating_point():  # integer tensors, like the integer lists above and the layers' coefficients
        coeffs = coeffs.to(torch.float64)
    if coeffs.dim() == 1:
        coeffs = coeffs.unsqueeze(0).expand(num_heads, -1)
    elif coeffs.dim() == 2 and coeffs.shape[0] == 1:  # one row for every head, as broadcasting reads it (an operator
        coeffs = coeffs.expand(num_heads, -1)          # built with num_heads=1, e.g. polynomial's (1, K+1))
    elif coeffs.dim() != 2:
        raise ValueError(f"coeffs must have shape (K+1,) or (H, K+1), got shape {tuple(coeffs.shape)}")
    if coeffs.shape[0] != num_heads:
        raise ValueError(
            f"coeffs has {coeffs.shape[0]} rows but the inputs have H={num_heads} heads; "
            f"expected shape ({num_heads}, K+1), (1, K+1) or (K+1,)"
        )
    if coeffs.shape[1] < 1:
        raise ValueError("coeffs must have at least one column (the coefficient of P^0)")
    if checks_values(coeffs) and not torch.isfinite(coeffs.detach()).all():
        raise ValueError(f"coeffs must be finite, got {coeffs.detach().tolist()}")
    if coeffs.is_meta and not like.is_meta:  # else "Cannot copy out of meta tensor; no data!" from the copy below
        raise ValueError(f"coeffs is on the meta device, which has no values to copy to the device of the inputs "
                         f"({like.device})")
    dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
    return coeffs.to(device=like.device, dtype=dtype)


def check_degrees(degrees: Sequence[int] | None, num_heads: int, max_degree: int) -> tuple[int, ...]:
    """The highest power of every head as a tuple (default ``K`` for all); a tuple is checked once and cached."""
    if degrees is None:
        return (max_degree,) * num_heads
    if isinstance(degrees, tuple) and all(type(d) is int for d in degrees):  # layers pass the same tuple every call
        return _checked_degrees(degrees, num_heads, max_degree)
    return _checked_degrees.__wrapped__(degrees, num_heads, max_degree)


@_pure_cache(maxsize=256)
def _checked_degrees(degrees: Sequence[int], num_heads: int, max_degree: int) -> tuple[int, ...]:
    # a set has no head order, a mapping iterates its keys; a 0-d tensor is Iterable to isinstance but not to list()
    if (isinstance(degrees, (str, bytes, AbstractSet, Mapping)) or not isinstance(degrees, Iterable)
            or (isinstance(degrees, Tensor) and degrees.dim() == 0)):
        raise TypeError(f"degrees must be a sequence of ints, one per head, or None; got {degrees!r}")
    items = list(degrees)
    try:  # ints, numpy ints and integer 0-d tensors; 1.5 or True is an error, not truncated
        if any(isinstance(d, bool) or (isinstance(d, Tensor) and d.dtype == torch.bool) for d in items):
            raise TypeError
        degrees = [operator.index(d) for d in items]
    except TypeError:
        raise TypeError(f"degrees must be a sequence of ints, one per head; got {items!r}") from None
    if len(degrees) != num_heads:
        raise ValueError(f"degrees must list one integer per head (H={num_heads}), got {len(degrees)}")
    if any(d < 0 or d > max_degree for d in degrees):
        raise ValueError(f"every degree must lie in [0, K={max_degree}], got {degrees}")
    return tuple(degrees)


def check_scale(scale: float | None, head_dim: int) -> float:
    if head_dim < 1:
        raise ValueError(f"q and k must have a head dimension C >= 1, got C={head_dim}")
    if scale is None:
        return head_dim ** -0.5
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool):  # numpy reals too
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not (scale == scale) or scale in (float("inf"), float("-inf")):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def check_attn_mask(attn_mask: object, shape: tuple[int, int, int, int], dtype: torch.dtype) -> Tensor:
    """``attn_mask`` validated against the scores' ``shape = (B, H, N, M)`` and made 4-dimensional.

    Bool (True = attend) stays bool; a float mask (added to the scores) is cast to ``dtype``.
    """
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask must be a tensor or None, got {type(attn_mask).__name__}")
    _check_strided("attn_mask", attn_mask, "pass attn_mask.to_dense()")  # else "reshape is not implemented for sparse"
    B, H, N, M = shape
    if attn_mask.dim() > 4 or attn_mask.dim() < 2:
        raise ValueError(
            f"attn_mask must be broadcastable to (B, H, N, M) = {(B, H, N, M)}, got shape {tuple(attn_mask.shape)}"
        )
    try:  # broadcastable *to* the scores: it may not widen them, (2, 1) against N = M = 1 included
        ok = torch.broadcast_shapes(attn_mask.shape, (B, H, N, M)) == (B, H, N, M)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"attn_mask must be broadcastable to (B, H, N, M) = {(B, H, N, M)}, got shape {tuple(attn_mask.shape)}"
        ) from None
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(f"attn_mask must be bool (True = attend) or floating point, got {attn_mask.dtype}")
    if attn_mask.is_floating_point():
        attn_mask = _cast_float_mask(attn_mask, dtype)
        if checks_values(attn_mask) and bool((attn_mask.isnan() | (attn_mask == float("inf"))).any()):
            raise ValueError(f"a float attn_mask is added to the scores: its entries must be finite or -inf "
                             f"(-inf = do not attend), got NaN or +inf in {dtype}")
    return attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))


def _cast_float_mask(attn_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A float mask in ``dtype`` with its finite entries kept finite: an entry beyond ``dtype``'s range (``-1e30``,
    ``finfo(float32).min`` for float16 inputs) is clamped to the range instead of overflowing to ``-inf`` (which would
    turn a row of finite biases into a fully masked zero row, where SDPA attends uniformly) or ``+inf``."""
    low = attn_mask.to(dtype)
    if attn_mask.dtype != dtype and torch.finfo(attn_mask.dtype).max > torch.finfo(dtype).max:
        info = torch.finfo(dtype)
        low = torch.where(attn_mask.isfinite(), attn_mask.clamp(info.min, info.max).to(dtype), low)
    return low


def check_dropout(dropout_p: object, name: str = "dropout_p") -> float:
    """``dropout_p`` as a float in ``[0, 1)`` (numpy reals too), else a ValueError naming it ``name``."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{name} must lie in [0, 1), got {dropout_p!r}")
    return float(dropout_p)


#: back-end names of the dense and the sparse engine (public as ``ops.dense.DENSE_BACKENDS`` and
#: ``ops.sparse.SPARSE_BACKENDS``; here so that each engine names the other's without importing it)
DENSE_BACKENDS: tuple[str, ...] = ("auto", "sdpa", "matrix", "triton")
SPARSE_BACKENDS: tuple[str, ...] = ("auto", "csr", "native", "torch_scatter")


def _backend_hint(backend: object, valid: Sequence[str], other: Sequence[str], other_kind: str) -> str:
    """`` (did you mean ...?)`` for a misspelt back-end name (``"Matrix"``, ``"nativ"``), or a note that it names a
    back-end of the other kind (``other_kind``: how that kind is called); ``""`` otherwise."""
    if not isinstance(backend, str):
        return ""
    name = backend.strip().lower().replace("-", "_")
    if name in other and name not in valid:
        return f" ({backend!r} is a back-end of {other_kind})"
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_layout(coeffs: object, degrees: Sequence[int] | None, num_heads: int, like: Tensor
                 ) -> tuple[Tensor | tuple[tuple[float, ...], ...], tuple[int, ...]]:
    """The coefficients and per-head degrees of one call of the dense or sparse engine, validated.

    Coefficients given as Python numbers stay static (``H`` rows of floats, see
    :func:`~diffusionformer.ops.engine.static_coefficients`); a tensor becomes ``(H, K+1)`` on
    ``like``'s device. ``degrees`` defaults to ``K`` for every head.
    """
    static = static_coefficients(coeffs, num_heads)
    if static is None:
        checked = check_coefficients(coeffs, num_heads, like)
        return checked, check_degrees(degrees, num_heads, checked.shape[1] - 1)
    return static, check_degrees(degrees, num_heads, len(static[0]) - 1)


def _head_output(op: object, call: str, y: object, like: Tensor, like_name: str) -> Tensor:
    """``y``, what ``op``'s ``call`` returned for its heads, refused naming the operator unless a floating tensor of
    the shape of ``like`` (else the layer's ``index_add`` fails with torch's message, which names no operator, or
    casts integers silently)."""
    if not isinstance(y, Tensor) or y.shape != like.shape or not y.is_floating_point():
        got = f"{tuple(y.shape)} {y.dtype}" if isinstance(y, Tensor) else type(y).__name__
        raise ValueError(f"{type(op).__name__}.{call} must return the output of its heads, a floating tensor of "
                         f"the shape of {like_name} {tuple(like.shape)}, got {got}")
    return y


def _matrix_output(op: object, apply: Any, P: Tensor, v: Tensor) -> Tensor:
    """``apply(P, v)`` (an operator's ``apply_matrix`` or ``apply_causal_matrix``), checked by :func:`_head_output` and
    refused unless in the dtype of ``v`` (the harness's law): float64 for float32 ``v`` failed in the layer's
    ``index_add`` with torch's "same scalar type", naming no operator, and was cast back silently by cached decoding."""
    call = f"{apply.__name__}(P, v)"
    y = _head_output(op, call, apply(P, v), v, "v")
    if y.dtype != v.dtype:
        raise ValueError(f"{type(op).__name__}.{call} must return the output of its heads in the dtype of v "
                         f"({v.dtype}), got {y.dtype}: cast it back (y.to(v.dtype))")
    return y
