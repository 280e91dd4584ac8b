r"""The diffusion engine: :math:`\sum_{k=0}^{K} c_{h,k} P_h^k v_h`, written once, over interchangeable back-ends.

Every head operator of the package is a polynomial (or truncated series) in its
row-stochastic attention matrix ``P``, so one loop computes all of them:

.. math::
    \text{out} = c_0 v + \sum_{k=1}^{K} c_k\, x_k, \qquad x_0 = v,\; x_k = P\, x_{k-1},

restricted at step ``k`` to the heads whose degree is at least ``k`` (a layer with ``G``
of ``H`` heads taking ``K`` steps propagates ``H + (K - 1) G`` head-signals, not ``K H``).
:func:`polynomial` is that loop. It knows nothing about how ``P`` is stored: a
:class:`Backend` supplies ``propagate(x, heads) = P[heads] x``. The back-ends of the
package are

* ``SdpaBackend`` (:mod:`~diffusionformer.ops.dense`): ``P`` recomputed by the fused SDPA
  kernel at every step; signals ``(B, H, N, C)``;
* ``MatrixBackend`` (:mod:`~diffusionformer.ops.dense`): ``P`` materialised once,
  ``(B, H, N, M)``; signals ``(B, H, N, C)``;
* ``CsrBackend`` (:mod:`~diffusionformer.ops.sparse`): one CSR matrix per head; signals
  head-major ``(H, N, C)``;
* ``NativeBackend`` (:mod:`~diffusionformer.ops.sparse`): ``(E, H)`` edge weights,
  gather-multiply-scatter; signals node-major ``(N, H, C)``;
* ``TritonBackend`` (:mod:`~diffusionformer.ops.triton.backend`): ``P`` recomputed inside the
  Triton kernels; besides ``propagate`` and the fused ``affine``, its ``diffuse`` runs a whole
  layer as one affine launch plus one launch per power for all K-step heads; signals
  ``(B, H, N, C)``;

and rival operators plug in the same way.

Layering
--------
The public entry points (:func:`diffusionformer.functional.diffuse`,
:func:`~diffusionformer.functional.diffuse_sparse`) validate their inputs once (shapes,
dtypes, masks, ``edge_index`` bounds: the only host synchronisations), build a back-end and
call the unchecked engine below. The entry point also picks the path:

* coefficients given as Python numbers are *static* (:func:`static_coefficients`); when
  they are of degree ``<= 1`` the layer costs one propagation of every head and the
  combination ``c_0 v + c_1 P v`` (:func:`affine`), done in place at inference;
* otherwise the general loop :func:`polynomial`.

Writing a back-end
------------------
Subclass :class:`Backend` and implement :meth:`Backend.propagate`::

    class MyBackend(Backend):
        name = "mine"
        head_axis = 1                  # heads are dim 1 of the signals it propagates

        def __init__(self, weights):   # whatever describes P, computed once per call
            self.weights = weights

        def propagate(self, x, heads):  # x holds exactly the heads ``heads`` (a tuple of ints)
            return my_kernel(select(self.weights, heads, 0), x)

Optional: set ``fused_affine = True`` and implement :meth:`Backend.affine` (one pass for
``c_0 v + c_1 P v``), and :meth:`Backend.weights` (the materialised ``P`` for
``need_weights``). Head subsets are tuples of head indices in increasing order; take
them with :func:`select` (views for runs of consecutive heads, concatenations otherwise,
never index tensors built on the host).

Capability flags
----------------
Back-ends (class attributes of :class:`Backend`):

* ``head_axis``: the dimension of the head axis in the signals ``x`` (dense ``(B, H, N, C)``:
  1; head-major ``(H, N, C)``: 0; node-major ``(N, H, C)``: 1);
* ``recomputes_scores``: ``P`` is recomputed at every step (the fused SDPA kernel), so a
  step costs a softmax; the ``auto`` rule of :func:`~diffusionformer.ops.dense.choose_dense_backend`
  weighs this against materialising ``P``;
* ``fused_affine``: :meth:`Backend.affine` is a single fused pass.

Operators (class attributes of :class:`~diffusionformer.operators.DiffusionOperator`:
``is_polynomial`` and ``supports_sparse`` are ``True`` by default, the last four ``False``; an
operator that sets one of those four declares what it needs beyond one ``P`` and its
coefficients, and the layer resolves it instead of special-casing the operator):

* ``is_polynomial``: ``False`` when :meth:`~diffusionformer.operators.DiffusionOperator.coefficients`
  does not describe the operator exactly (it then implements ``apply_matrix`` on a
  materialised ``P``; dense only);
* ``supports_sparse``: the sparse back-ends can run it;
* ``needs_second_map``: the operator combines two score maps (differential attention);
* ``needs_layer_state``: the operator reads state of another layer (NeuTRENO's first-layer
  values);
* ``reprojects_each_step``: the signal is re-projected between steps (nonlinear diffusion),
  so the steps are not powers of one linear ``P``;
* ``needs_uniform_map``: the operator uses the uniform average over the admissible keys
  (AttnScale's ``DC`` part).

An operator with any of the last four flags sets ``is_polynomial = False`` and implements
``apply_context(ctx)``; the layer builds the :class:`~diffusionformer.ops.rivals.RivalContext`
in one dispatch (:func:`~diffusionformer.ops.rivals.apply_context_groups`), whose
``attend(q, k, x)`` runs on the public functional API (:func:`~diffusionformer.ops.dense.propagate_dense`
dense, :func:`~diffusionformer.ops.sparse.diffuse_sparse` sparse).

Examples:
    >>> import torch
    >>> P = torch.tensor([[[[0.5, 0.5], [0.0, 1.0]]]])       # (B, H, N, N)
    >>> v = torch.tensor([[[[2.0], [4.0]]]])                 # (B, H, N, C)
    >>> c = torch.tensor([[1.0, -1.0]])                      # (H, K+1): the Laplacian I - P
    >>> polynomial(_MatrixDemo(P), v, c, (1,)).flatten().tolist()
    [-1.0, 0.0]
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from functools import lru_cache, wraps
from typing import Any, Callable, ClassVar, Sequence, TypeVar

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from diffusionformer.ops.recompute import _batched_grad, _in_eager_transform

__all__ = [
    "Backend",
    "active_heads",
    "affine",
    "affine_coefficients",
    "affine_runs",
    "all_heads",
    "combine_affine",
    "head_runs",
    "merge_heads",
    "polynomial",
    "positions",
    "select",
    "split_heads",
    "static_coefficients",
    "static_tensor",
    "work_dtype",
]

# A subset of heads: increasing head indices.
Heads = tuple[int, ...]

#: ``(start, stop, c0, c1)``: heads ``start .. stop - 1`` output ``c0 v + c1 P v``.
AffineRun = tuple[int, int, float, float]


_F = TypeVar("_F", bound=Callable[..., Any])


def _cache(maxsize: int, uncached: Callable[[], bool]) -> Callable[[_F], _F]:
    """``lru_cache(maxsize)`` whose function runs unwrapped while ``uncached()``; ``__wrapped__``, ``cache_info``
    and ``cache_clear`` are those of the ``lru_cache``."""

    def wrap(fn: _F) -> _F:
        cached = lru_cache(maxsize=maxsize)(fn)

        @wraps(fn)
        def call(*args: Any) -> Any:
            return fn(*args) if uncached() else cached(*args)

        call.cache_info, call.cache_clear = cached.cache_info, cached.cache_clear  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return wrap


def _dynamo_traces() -> bool:
    """Dynamo traces the wrapped function whatever the wrapper, and warned "Dynamo detected a call to a
    `functools.lru_cache`-wrapped function" at each call site and compile (an error under ``-W error``)."""
    return torch.compiler.is_dynamo_compiling()


def _tensors_traced() -> bool:
    """:func:`_dynamo_traces`, or a torch dispatch mode active, or :func:`torch.jit.trace` recording, or an eager
    ``torch.func`` transform running (:func:`~diffusionformer.ops.recompute._in_eager_transform`: under nested
    transforms, ``hessian`` or ``grad(grad(f))``, the tensors built are wrapped at the inner level; cached, every later
    ``grad`` or ``jvp`` of the process failed on them with torch's "INTERNAL ASSERT FAILED ... escaped?")."""
    return torch.jit.is_tracing() or _dynamo_traces() or is_in_torch_dispatch_mode() or _in_eager_transform()


def _tensor_cache(maxsize: int) -> Callable[[_F], _F]:
    """``lru_cache(maxsize)`` for functions that build tensors, bypassed while tensors are traced or transformed
    (:func:`_tensors_traced`: a dispatch mode, :func:`torch.jit.trace`, dynamo, an eager ``torch.func`` transform).

    Under :class:`~torch._subclasses.fake_tensor.FakeTensorMode` (a dry run, ``make_fx``) the function
    builds a fake tensor: cached, every later real call would get it (and a fake call a real tensor cached
    before), both refused by torch for ever after. Under such a mode the function runs uncached, also
    while :func:`torch.export.export` traces without dynamo (``strict=False``, where
    :func:`torch.compiler.is_compiling` is true too), and while :func:`torch.jit.trace` records (a cache hit
    is a constant there and a miss the operations that build it, so two traces differed). While dynamo
    traces, the function is called unwrapped (dynamo would trace it through the cache anyway, with a warning),
    and so while a ``torch.func`` transform runs (a tensor built under ``hessian`` belongs to its levels).
    """
    return _cache(maxsize, _tensors_traced)


def _pure_cache(maxsize: int) -> Callable[[_F], _F]:
    """``lru_cache(maxsize)`` for the pure helpers of the forward pass (head runs, plans, checked degrees), called
    unwrapped while dynamo traces (:func:`_dynamo_traces`)."""
    return _cache(maxsize, _dynamo_traces)


# ---------------------------------------------------------------------------- dtypes and heads
def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums over powers (and materialised ``P``) are computed in: float32 for half precision.

    Examples:
        >>> work_dtype(torch.bfloat16), work_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@_pure_cache(maxsize=64)
def all_heads(num_heads: int) -> Heads:
    """``(0, 1, ..., H - 1)``."""
    return tuple(range(num_heads))


def _as_tuple(seq: Sequence[Any]) -> tuple:
    """``seq`` as a tuple, for the helpers cached by value (a list is not hashable)."""
    return seq if type(seq) is tuple else tuple(seq)


def head_runs(heads: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Maximal runs ``((start, stop), ...)`` of consecutive heads in ``heads`` (a tuple or a list).

    Examples:
        >>> head_runs((0, 1, 2, 5, 6))
        ((0, 3), (5, 7))
        >>> head_runs([3, 4])
        ((3, 5),)
    """
    return _head_runs(_as_tuple(heads))


@_pure_cache(maxsize=1024)
def _head_runs(heads: Heads) -> tuple[tuple[int, int], ...]:
    runs: list[tuple[int, int]] = []
    for h in heads:
        if runs and runs[-1][1] == h:
            runs[-1] = (runs[-1][0], h + 1)
        else:
            runs.append((h, h + 1))
    return tuple(runs)


def positions(sub: Sequence[int], of: Sequence[int]) -> Heads:
    """Positions in ``of`` of the heads ``sub`` (a subset): how a tensor laid out over ``of`` is restricted to ``sub``.

    Tuples or lists.

    Examples:
        >>> positions((2, 5), (0, 2, 3, 5))
        (1, 3)
        >>> positions([2], [0, 2])
        (1,)
    """
    return _positions(_as_tuple(sub), _as_tuple(of))


@_pure_cache(maxsize=1024)
def _positions(sub: Heads, of: Heads) -> Heads:
    where = {h: i for i, h in enumerate(of)}
    return tuple(where[h] for h in sub)


def active_heads(degrees: Sequence[int], step: int, among: Heads | None = None) -> Heads:
    """The heads (of ``among``, default all) whose degree is at least ``step``.

    Examples:
        >>> active_heads([1, 3, 0, 2], 2)
        (1, 3)
    """
    heads = range(len(degrees)) if among is None else among
    return tuple(h for h in heads if degrees[h] >= step)


def select(t: Tensor, heads: Heads, dim: int) -> Tensor:
    """The heads ``heads`` of ``t`` along ``dim``: a view for a run of consecutive heads, else one concatenation.

    Index tensors are never used: one built from a Python list is a host-to-device copy in
    the forward pass.

    Examples:
        >>> select(torch.arange(5), (1, 2, 4), 0).tolist()
        [1, 2, 4]
    """
    if len(heads) == t.shape[dim]:  # increasing heads of a tensor that holds that many: all of them
        return t
    runs = head_runs(heads)
    if len(runs) == 1:
        a, b = runs[0]
        return t.narrow(dim, a, b - a)
    return torch.cat([t.narrow(dim, a, b - a) for a, b in runs], dim=dim)


def split_heads(t: Tensor, a: Heads, b: Heads, dim: int) -> tuple[Tensor, Tensor]:
    """The heads ``a`` and ``b`` (a partition of ``t``'s heads along ``dim``): one split when each is one run.

    One ``split`` has one concatenation as its gradient; two :func:`select` narrows would each
    give a zero-filled gradient of the whole of ``t`` (``slice_backward``) and an addition. A
    4-dimensional tensor stored token-major (``(B, N, H, C)`` seen as ``(B, H, N, C)``, as the
    layers' projections are) is split in that layout when ``dim`` is 1, so that the gradient is
    token-major too: the projection's ``view`` then takes it as it is (split head-major, the
    concatenation is head-major and the ``view`` copies the gradient once more).

    Args:
        t: a tensor with one entry per head along ``dim``.
        a, b: increasing heads (positions along ``dim``) that together are every head once.
        dim: the head axis.

    Shapes:
        ``t``: ``(..., H, ...)`` with ``H`` at ``dim`` -> ``t``'s shape with ``len(a)`` and ``len(b)`` heads.

    Examples:
        >>> [p.tolist() for p in split_heads(torch.arange(4), (2, 3), (0, 1), 0)]
        [[2, 3], [0, 1]]
    """
    if len(head_runs(a)) == 1 and len(head_runs(b)) == 1:
        first, second = (a, b) if a[0] == 0 else (b, a)
        if dim == 1 and t.dim() == 4 and t.stride(1) < t.stride(2):  # token-major storage
            pieces = [p.transpose(1, 2) for p in torch.split(t.transpose(1, 2), [len(first), len(second)], dim=2)]
        else:
            pieces = torch.split(t, [len(first), len(second)], dim=dim)
        return (pieces[0], pieces[1]) if a[0] == 0 else (pieces[1], pieces[0])
    return select(t, a, dim), select(t, b, dim)


# ---------------------------------------------------------------------------- back-ends
class Backend(ABC):
    """How ``P`` is applied to a signal: the one thing a back-end of the engine supplies.

    A back-end is built once per call from whatever describes ``P`` (queries and keys for the
    fused kernel, a materialised matrix, CSR edge weights) and then asked for
    :meth:`propagate` on head subsets, once per power of ``P``.

    Attributes:
        name: short name (reported in intermediates and errors).
        head_axis: dimension of the head axis in the signals ``x`` (see the module docstring).
        recomputes_scores: ``P`` is recomputed at every step (fused kernels).
        fused_affine: :meth:`affine` is one fused pass (otherwise :func:`affine` composes it
            from :meth:`propagate` and :func:`combine_affine`).
    """

    name: ClassVar[str] = ""
    head_axis: ClassVar[int] = 1
    recomputes_scores: ClassVar[bool] = False
    fused_affine: ClassVar[bool] = False

    @abstractmethod
    def propagate(self, x: Tensor, heads: Heads) -> Tensor:
        """``P[heads] x``: one diffusion step for the heads ``heads``; ``x`` holds exactly those heads."""

    def affine(self, v: Tensor, c0: Sequence[float], c1: Sequence[float]) -> Tensor:
        """``c0[h] v_h + c1[h] (P v)_h`` for every head in one pass (only when ``fused_affine``)."""
        raise NotImplementedError(f"back-end {self.name!r} has no fused affine pass")

    def weights(self) -> Tensor:
        """The attention weights ``P`` (for ``need_weights``)."""
        raise NotImplementedError(f"back-end {self.name!r} does not materialise P")


class _MatrixDemo(Backend):
    """A minimal back-end for the module's doctest: ``P`` given as a ``(B, H, N, N)`` tensor."""

    name = "demo"

    def __init__(self, P: Tensor) -> None:
        self.P = P

    def propagate(self, x: Tensor, heads: Heads) -> Tensor:
        return select(self.P, heads, 1) @ x


# ---------------------------------------------------------------------------- the loop
def polynomial(
    backend: Backend,
    v: Tensor,
    coeffs: Tensor,
    degrees: Sequence[int],
    *,
    heads: Heads | None = None,
    out: Tensor | None = None,
) -> Tensor:
    r"""The engine's one loop: ``out + sum_{k>=1} c_k P^k v`` over ``heads`` (unchecked).

    Step ``k`` propagates only the heads of ``heads`` whose degree is at least ``k``; the
    running power is restricted to them (a subset of the previous step's heads) before the
    call. Inputs are not validated: the public entry points do that once.

    Args:
        backend: applies ``P`` (see :class:`Backend`).
        v: values, heads along ``backend.head_axis``.
        coeffs: ``(H, K+1)`` weights on ``P^0 .. P^K`` in the working dtype.
        degrees: highest power used by each of the ``H`` heads (``<= K``).
        heads: the heads to propagate (default all); the others only receive ``c_0 v``
            (when ``out`` is ``None``) or are left as they are.
        out: the accumulator to add to, all ``H`` heads (default ``c_0 v``); not modified.

    Shapes:
        ``v``: ``(..., H, ...)`` with ``H`` at ``backend.head_axis``; ``coeffs``: ``(H, K+1)``
        -> the shape of ``v`` (in the dtype of ``coeffs * v``).
    """
    dim = backend.head_axis
    H = v.shape[dim]
    shape = [1] * v.dim()
    shape[dim] = H
    c = coeffs.t().reshape([coeffs.shape[1]] + shape)  # (K+1, ..., H, ...): c[k] broadcasts against v
    heads = all_heads(H) if heads is None else heads
    K = max((0, *(degrees[h] for h in heads)))  # not max(..., default=): dynamo refuses it
    # the coefficients of every step, restricted to that step's heads: one narrow, head selection and unbind
    # per run of steps with the same heads (autograd then records a few operations, not a few per step)
    cs: list[Tensor] = []
    for s0, n, act in _coefficient_blocks(tuple(degrees), heads, K):
        block = c if n == c.shape[0] else c.narrow(0, s0, n)
        cs.extend(select(block, act, dim + 1).unbind(0))
    if out is None:
        out = v * cs[0]
    # Out of place, so that autograd records one multiply-add per step (an in-place update of a view of
    # the accumulator records a copy of the whole accumulator per step). ``acc`` holds the heads ``held``;
    # heads that stop propagating are set aside in ``done`` and put back in head order at the end.
    acc, held, done = out, all_heads(H), []
    cur, prev = v, all_heads(H)
    for step in range(1, K + 1):
        act = active_heads(degrees, step, heads)
        if act != held:  # the heads that stop here are set aside: one split, whose gradient is one concatenation
            rest = tuple(h for h in held if h not in act)
            finished, acc = split_heads(acc, _positions(rest, held), _positions(act, held), dim)
            done.append((rest, finished))
            held = act
        if act != prev:
            cur = select(cur, _positions(act, prev), dim)
        cur = _propagated(backend, cur, act)
        acc = torch.addcmul(acc, cs[step], cur)
        prev = act
    if not done:
        return acc
    done.append((held, acc))
    return merge_heads(done, dim)


def _propagated(backend: Backend, x: Tensor, heads: Heads) -> Tensor:
    """``backend.propagate(x, heads)``, refused unless it is a tensor of the shape of ``x`` (``P`` is square):
    the sums would broadcast a wrong shape silently. A shape comparison, no synchronisation."""
    return _shaped_as(backend, "propagate(x, heads) must return P x", backend.propagate(x, heads), x)


def _shaped_as(backend: Backend, what: str, y: object, x: Tensor) -> Tensor:
    """``y``, what ``backend`` returned for ``x``, refused with ``what`` unless a tensor of the shape of ``x``."""
    if not isinstance(y, Tensor) or y.shape != x.shape:
        got = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
        raise ValueError(f"back-end {backend.name or type(backend).__name__!r}: {what}, of the shape of x "
                         f"{tuple(x.shape)}, got {got}")
    return y


@_pure_cache(maxsize=1024)
def _coefficient_blocks(degrees: tuple[int, ...], heads: Heads, K: int) -> tuple[tuple[int, int, Heads], ...]:
    """``(first step, steps, heads)`` runs of steps ``0 .. K`` that share their heads (step 0: every head).

    Examples:
        >>> _coefficient_blocks((1, 3, 3), (0, 1, 2), 3)
        ((0, 2, (0, 1, 2)), (2, 2, (1, 2)))
    """
    blocks: list[tuple[int, int, Heads]] = [(0, 1, all_heads(len(degrees)))]
    for step in range(1, K + 1):
        act = active_heads(degrees, step, heads)
        s0, n, prev = blocks[-1]
        blocks[-1:] = [(s0, n + 1, prev)] if act == prev else [blocks[-1], (step, 1, act)]
    return tuple(blocks)


def merge_heads(parts: Sequence[tuple[Heads, Tensor]], dim: int) -> Tensor:
    """The tensors of ``parts`` (each over its heads; the heads partition ``0 .. H-1``) in head order.

    One concatenation, token-major (heads second to last, then moved back to ``dim``): the
    layout the layers' output projections read, so merging heads costs no copy there.

    Examples:
        >>> a, b = torch.tensor([[0.0, 2.0]]), torch.tensor([[1.0]])
        >>> merge_heads([((0, 2), a), ((1,), b)], dim=1).tolist()
        [[0.0, 1.0, 2.0]]
    """
    pieces = []
    for i, a, n in _merge_plan(tuple(h for h, _ in parts)):
        t = parts[i][1].movedim(dim, -2)
        pieces.append(t if n == t.shape[-2] else t.narrow(-2, a, n))  # a whole part: no slice for autograd to undo
    return torch.cat(pieces, dim=-2).movedim(-2, dim)


@_pure_cache(maxsize=1024)
def _merge_plan(parts: tuple[Heads, ...]) -> tuple[tuple[int, int, int], ...]:
    """``(part, start, length)`` slices that put the heads of ``parts`` (a partition) back in head order.

    Examples:
        >>> _merge_plan(((2, 3), (0, 1)))
        ((1, 0, 2), (0, 0, 2))
        >>> _merge_plan(((1,), (0, 2, 3)))
        ((1, 0, 1), (0, 0, 1), (1, 1, 2))
    """
    where = {h: (i, j) for i, part in enumerate(parts) for j, h in enumerate(part)}
    plan: list[tuple[int, int, int]] = []
    for h in sorted(where):
        i, j = where[h]
        if plan and plan[-1][0] == i and plan[-1][1] + plan[-1][2] == j:
            plan[-1] = (i, plan[-1][1], plan[-1][2] + 1)
        else:
            plan.append((i, j, 1))
    return tuple(plan)


# ---------------------------------------------------------------------------- the affine pass
def static_coefficients(coeffs: object, num_heads: int) -> tuple[tuple[float, ...], ...] | None:
    """Coefficients given as Python (or numpy) numbers, as ``H`` rows of floats; ``None`` for a tensor.

    Static coefficients are constants the engine may specialise on without reading a device
    tensor (the affine path of degree-1 heads). ``(K+1,)`` sequences are shared by all heads.

    Raises:
        ValueError: ragged rows, a wrong number of rows, no column, or non-finite values.

    Examples:
        >>> static_coefficients([1.0, -1.0], 2)
        ((1.0, -1.0), (1.0, -1.0))
        >>> static_coefficients(torch.tensor([1.0, -1.0]), 2) is None
        True
    """
    if not isinstance(coeffs, (list, tuple)):
        return None
    if isinstance(coeffs, tuple) and all(type(r) is float or (type(r) is tuple and all(type(c) is float for c in r))
                                         for r in coeffs):
        # layers pass the same tuple every call: validate it once. Floats only: the cache compares keys by value,
        # and True == 1.0 (numpy bools too), so a tuple of bools would be given the rows of an equal tuple of floats
        return _static_rows(coeffs, num_heads)
    return _static_rows.__wrapped__(coeffs, num_heads)


@_pure_cache(maxsize=256)
def _static_rows(coeffs: Sequence[Any], num_heads: int) -> tuple[tuple[float, ...], ...]:
    if coeffs and all(isinstance(r, (list, tuple)) for r in coeffs):
        if not all(isinstance(c, numbers.Real) and not isinstance(c, bool) for r in coeffs for c in r):
            raise TypeError(f"coeffs given as rows (H, K+1) must hold numbers, got {coeffs!r}")
        rows = tuple(tuple(float(c) for c in r) for r in coeffs)
        if len(rows) == 1:  # one row for every head, as a (1, K+1) tensor is
            rows *= num_heads
    elif all(isinstance(c, numbers.Real) and not isinstance(c, bool) for c in coeffs):
        rows = (tuple(float(c) for c in coeffs),) * num_heads
    else:
        raise TypeError(f"coeffs given as a sequence must hold numbers (K+1,) or rows of numbers (H, K+1), got {coeffs!r}")
    if len(rows) != num_heads:
        raise ValueError(
            f"coeffs has {len(rows)} rows but the inputs have H={num_heads} heads; "
            f"expected shape ({num_heads}, K+1), (1, K+1) or (K+1,)"
        )
    if not rows:
        raise ValueError("coeffs given as a sequence need inputs with H >= 1 heads, got H=0 "
                         "(coefficients given as a tensor of shape (K+1,) take H=0: an empty output)")
    width = {len(r) for r in rows}
    if len(width) != 1:
        raise ValueError(f"coeffs rows must all have K+1 entries, got lengths {sorted(width)}")
    if width == {0}:
        raise ValueError("coeffs must have at least one column (the coefficient of P^0)")
    if not all(math.isfinite(c) for r in rows for c in r):
        raise ValueError(f"coeffs must be finite, got {[list(r) for r in rows]}")
    return rows


@_tensor_cache(maxsize=256)
def static_tensor(rows: tuple[tuple[float, ...], ...], device: torch.device, dtype: torch.dtype) -> Tensor:
    """Static coefficient rows as an ``(H, K+1)`` tensor on ``device``, built once per ``(rows, device, dtype)``.

    Copying a new host tensor to an accelerator at every call would be a blocking copy (a host
    synchronisation) in the hot path; the cached tensor is only read. It is created outside
    inference mode, so a layer first called under :func:`torch.inference_mode` still trains.

    Examples:
        >>> static_tensor(((0.0, 1.0), (1.0, -1.0)), torch.device("cpu"), torch.float32)
        tensor([[ 0.,  1.],
                [ 1., -1.]])
    """
    with torch.inference_mode(False):
        # made on the CPU by name (under `with torch.device("meta")` a default-device tensor had no values to copy),
        # cast there: a float64 tensor cannot be made on every device (MPS)
        return torch.tensor(rows, dtype=torch.float64, device="cpu").to(device=device, dtype=dtype)


def affine_coefficients(rows: tuple[tuple[float, ...], ...], degrees: tuple[int, ...]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(c0, c1)`` per head from static rows of degree ``<= 1`` (``c1 = 0`` for heads of degree 0).

    Examples:
        >>> affine_coefficients(((0.0, 1.0), (1.0, -1.0)), (1, 0))
        ((0.0, 1.0), (1.0, 0.0))
    """
    return _affine_coefficients(rows, tuple(degrees))


@_pure_cache(maxsize=256)
def _affine_coefficients(rows: tuple[tuple[float, ...], ...], degrees: tuple[int, ...]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    return tuple(r[0] for r in rows), tuple(r[1] if d >= 1 else 0.0 for r, d in zip(rows, degrees))


def affine_runs(c0: Sequence[float], c1: Sequence[float]) -> tuple[AffineRun, ...]:
    """Runs of consecutive heads with equal ``(c0, c1)`` that are not plain attention ``(0, 1)`` (tuples or lists).

    Examples:
        >>> affine_runs((0.0, 1.0, 1.0, 0.0), (1.0, -1.0, -1.0, 1.0))
        ((1, 3, 1.0, -1.0),)
        >>> affine_runs([1.0], [-1.0])
        ((0, 1, 1.0, -1.0),)
    """
    return _affine_runs(_as_tuple(c0), _as_tuple(c1))


@_pure_cache(maxsize=256)
def _affine_runs(c0: tuple[float, ...], c1: tuple[float, ...]) -> tuple[AffineRun, ...]:
    runs: list[AffineRun] = []
    for h, (a, b) in enumerate(zip(c0, c1)):
        if (a, b) == (0.0, 1.0):
            continue
        if runs and runs[-1][1] == h and runs[-1][2:] == (a, b):
            runs[-1] = (runs[-1][0], h + 1, a, b)
        else:
            runs.append((h, h + 1, a, b))
    return tuple(runs)


def _apply_runs(out: Tensor, v: Tensor, runs: Sequence[AffineRun]) -> None:
    for start, stop, c0, c1 in runs:
        ys, vs = out.narrow(-2, start, stop - start), v.narrow(-2, start, stop - start)
        if c0 == 1.0 and c1 == -1.0 and not torch.compiler.is_compiling():  # Laplacian: (I - P) v, one pass
            torch.sub(vs, ys, out=ys)  # dynamo refuses out= on a strided view; the compiler fuses the two passes below
        elif ys.dtype in (torch.float16, torch.bfloat16) and ys.device.type == "cpu":  # CPU kernels round alpha=
            # to the tensor's dtype (CUDA's keep it in float32): c0 v in float32, as combine_affine documents
            ys.mul_(c1).add_(vs.float().mul_(c0))
        else:
            ys.mul_(c1).add_(vs, alpha=c0)


class AffineHeads(torch.autograd.Function):
    """``out = y`` except on the runs, where ``out = c0 v + c1 y``; the coefficients are Python floats.

    Touches every element once in each direction (the fused kernel keeps ``y`` for its
    backward pass, so ``y`` itself cannot be overwritten while training).

    Shapes:
        ``y``, ``v``: ``(..., N, H, C)`` -> ``(..., N, H, C)``.
    """

    @staticmethod
    def forward(ctx: Any, y: Tensor, v: Tensor, runs: tuple[AffineRun, ...]) -> Tensor:
        ctx.runs = runs
        out = y.clone(memory_format=torch.contiguous_format)
        _apply_runs(out, v, runs)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        dy = dv = None
        if _batched_grad(grad):  # is_grads_batched=True: out-of-place operations (vmap batches no out= or in-place view)
            return _affine_heads_backward_stock(grad, ctx.runs, ctx.needs_input_grad)
        if ctx.needs_input_grad[0]:
            dy = grad.clone(memory_format=torch.contiguous_format)
            for start, stop, _, c1 in ctx.runs:
                dy[..., start:stop, :].mul_(c1)
        if ctx.needs_input_grad[1]:
            dv = torch.zeros_like(grad, memory_format=torch.contiguous_format)
            compiling = torch.compiler.is_compiling()
            for start, stop, c0, _ in ctx.runs:
                if compiling:  # dynamo refuses out= on a strided view
                    dv[..., start:stop, :] = grad[..., start:stop, :] * c0
                else:
                    torch.mul(grad[..., start:stop, :], c0, out=dv[..., start:stop, :])
        return dy, dv, None


def _affine_heads_backward_stock(grad: Tensor, runs: tuple[AffineRun, ...],
                                 needs: tuple[bool, ...]) -> tuple[Tensor | None, Tensor | None, None]:
    """:meth:`AffineHeads.backward` by out-of-place operations on head slices: the same products of ``grad`` by the
    float scalars, then one concatenation along the head axis."""
    H = grad.shape[-2]
    ys: list[Tensor] = []
    vs: list[Tensor] = []
    at = 0
    for start, stop, c0, c1 in (*runs, (H, H, 0.0, 1.0)):
        if start > at:  # heads of no run: out = y
            gap = grad.narrow(-2, at, start - at)
            ys.append(gap)
            vs.append(torch.zeros_like(gap))
        if stop > start:
            g = grad.narrow(-2, start, stop - start)
            ys.append(g * c1)
            vs.append(g * c0)
        at = stop
    return (torch.cat(ys, -2) if needs[0] else None), (torch.cat(vs, -2) if needs[1] else None), None


def combine_affine(y: Tensor, v: Tensor, runs: Sequence[AffineRun], *, inplace: bool | None = None) -> Tensor:
    r"""``c0 v + c1 y`` on the heads of ``runs`` and ``y`` elsewhere (``y = P v`` per head), token-major.

    Without autograd history ``y`` is updated in place (and returned); otherwise through
    :class:`AffineHeads`. Scalars multiply in float32 even for half-precision tensors.

    Args:
        y: the propagated values ``P v``.
        v: the values.
        runs: ``(start, stop, c0, c1)`` per run of non-attention heads (:func:`affine_runs`).
        inplace: ``False`` leaves ``y`` untouched even without autograd history (the operations,
            and so the bits, of a call with history); default: in place exactly when there is none.

    Shapes:
        ``y``, ``v``: ``(..., N, H, C)`` -> ``(..., N, H, C)``.

    Examples:
        >>> y = torch.ones(1, 1, 2, 1); v = torch.full((1, 1, 2, 1), 3.0)
        >>> combine_affine(y, v, [(1, 2, 1.0, -1.0)]).flatten().tolist()  # head 1 is Laplacian
        [1.0, 2.0]
    """
    runs = tuple(runs)
    grad = y.requires_grad or v.requires_grad
    copy = grad if inplace is None else not inplace
    # a torch.func transform (vmap, grad, jacrev, ...): out= kernels have no batching rule (and a batched tensor
    # says requires_grad=False whatever autograd records), and every transform refuses AffineHeads (an
    # autograd.Function without setup_context): stock out-of-place operations only; so under forward-mode AD (dual
    # tensors refuse out= kernels, and AffineHeads has no jvp), which _in_eager_transform counts too
    transformed = _in_eager_transform()
    columns = _head_columns(runs, y.shape[-2], y.device, y.dtype)
    if columns is not None:  # stock autograd ops: 2 kernels each way and no Python in the backward pass
        c0, c1 = columns
        # dynamo refuses out= on a strided view; torch.jit.trace checks a trace by tracing again without grad
        if copy or transformed or torch.compiler.is_compiling() or torch.jit.is_tracing():
            return torch.addcmul(v * c0, y, c1)
        return torch.addcmul(v * c0, y, c1, out=y)  # the same operation, in place: inference equals training
    if transformed:  # coefficients not exact in y's dtype: multiplied in float32 (at least), as documented
        work = work_dtype(y.dtype)
        c0, c1 = _head_columns(runs, y.shape[-2], y.device, work, False)
        return torch.addcmul(v.to(work) * c0, y.to(work), c1).to(y.dtype)
    if not copy:
        _apply_runs(y, v, runs)
        return y
    return AffineHeads.apply(y, v, runs)


@_tensor_cache(maxsize=256)
def _head_columns(runs: tuple[AffineRun, ...], num_heads: int, device: torch.device,
                  dtype: torch.dtype, exact: bool = True) -> tuple[Tensor, Tensor] | None:
    """``c0``, ``c1`` of every head as ``(H, 1)`` columns in ``dtype`` (built once), or ``None``.

    ``exact=False`` (for :func:`combine_affine` inside a ``torch.func`` transform) rounds every coefficient to
    ``dtype`` instead of returning ``None``.

    ``None`` when a coefficient is not exact in ``dtype`` (then :class:`AffineHeads` multiplies
    by the float32 scalars, as documented). Attention ``(0, 1)``, the Laplacian ``(1, -1)`` and
    any dyadic coefficients are exact in every floating dtype, so ``v * c0 + y * c1`` gives the
    bits of the run-by-run combination (one rounding per element), except where a product
    ``v * c0`` falls below the dtype's smallest normal number: that product is rounded once more
    (float16 values near ``2**-14``, a last-bit difference).
    """
    bits = _SIGNIFICAND_BITS.get(dtype)
    if bits is None and exact:
        return None
    c0, c1 = [0.0] * num_heads, [1.0] * num_heads
    for start, stop, a, b in runs:
        if stop > num_heads or (exact and not (_exact(a, *bits) and _exact(b, *bits))):
            return None
        c0[start:stop] = [a] * (stop - start)
        c1[start:stop] = [b] * (stop - start)
    with torch.inference_mode(False):
        cast = torch.tensor([c0, c1], dtype=torch.float64, device="cpu").to(device=device, dtype=dtype).unsqueeze(-1)
    return cast[0], cast[1]


#: significand bits (with the implicit one) and the smallest and largest binary exponents of normal numbers
_SIGNIFICAND_BITS = {torch.float64: (53, -1021, 1024), torch.float32: (24, -125, 128),
                     torch.bfloat16: (8, -125, 128), torch.float16: (11, -13, 16)}


def _exact(x: float, significand: int, min_exp: int, max_exp: int) -> bool:
    """Whether ``x`` is a normal number (or zero) of a binary format with these parameters (pure Python).

    Examples:
        >>> _exact(-1.0, 8, -125, 128), _exact(0.5, 8, -125, 128), _exact(0.1, 8, -125, 128)
        (True, True, False)
    """
    if x == 0.0:
        return True
    m, e = math.frexp(x)  # x = m 2^e, 0.5 <= |m| < 1
    return min_exp <= e <= max_exp and (m * 2.0**significand).is_integer()


def affine(backend: Backend, v: Tensor, c0: Sequence[float], c1: Sequence[float], *,
           inplace: bool | None = None) -> Tensor:
    """``c0[h] v_h + c1[h] (P v)_h`` for every head: one propagation and an in-place combination (unchecked).

    Plain attention heads (``c0, c1 = 0, 1``) return ``P v`` untouched; the back-end's own
    :meth:`Backend.affine` is used when it declares ``fused_affine``. The combination runs
    token-major (``(..., N, H, C)``), the layout the layers reshape to ``(..., N, D)``.

    ``inplace`` is that of :func:`combine_affine` (``False``: never overwrite ``P v``).

    Shapes:
        ``v``: heads along ``backend.head_axis``; ``c0``, ``c1``: ``H`` floats -> the shape of ``v``.
    """
    if backend.fused_affine:  # checked as propagate is: a wrong shape broadcast or failed in the layer's reshape
        return _shaped_as(backend, "affine(v, c0, c1) must return c0 v + c1 P v", backend.affine(v, c0, c1), v)
    dim = backend.head_axis
    y = _propagated(backend, v, all_heads(v.shape[dim]))
    runs = affine_runs(c0, c1)
    if not runs:
        return y
    if v.dtype != y.dtype:
        v = v.to(y.dtype)
    return combine_affine(y.movedim(dim, -2), v.movedim(dim, -2), runs, inplace=inplace).movedim(-2, dim)
