r"""A public property harness: every registered operator is held to the same laws.

:func:`assert_operator` checks one operator against explicit float64 references and the
structural properties that hold for any function of a row-stochastic ``P``:

* dense ``"sdpa"`` and ``"matrix"`` back-ends, and a polynomial's ``apply_matrix``, equal
  :math:`\sum_k c_k P^k v` built from explicit matrix powers (or the operator's own
  ``apply_matrix`` for non-polynomials, and a context operator's own dense path for one the
  library has no formula for, both on a float64 copy);
* the sparse back-end equals the dense one on the complete and the causal graph, and the
  reference on a random graph with a node without in-edges (a zero row of ``P``);
* node-permutation equivariance and edge-order invariance, and independence of the rest of the batch;
* outputs in the input dtype;
* trainable parameters all reach a polynomial's coefficients (a matrix operator's ``apply_matrix``) through
  autograd (else they never train);
* causality: under a causal mask, no output depends on a later position, for every ``K``;
* ``build_operator(op.spec())`` given the operator's state dict computes what the operator computes (its
  :meth:`~diffusionformer.operators.DiffusionOperator.spec_kwargs` name every architecture argument);
* shift law: since ``P 1 = 1``, :math:`f(P)(v + 1 a^\top) = f(P) v + (\sum_k c_k) 1 a^\top`
  (so a Laplacian head, with coefficients summing to 0, ignores a constant shift).

Operators you register are covered by the project's registry-wide test for free; call
:func:`assert_operator` in your own tests too.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor

from diffusionformer.graph._checks import check_int
from diffusionformer.operators import (AttnScaleOperator, DiffusionOperator, DifferentialOperator, ExactPPROperator,
                                      NeuTRENOOperator, NonlinearDiffusionOperator, ValueResidualOperator,
                                      build_operator)
from diffusionformer.operators.base import _checked_degree, _registered_class
from diffusionformer.ops.dense import attention_matrix, diffuse
from diffusionformer.ops.reference import dense_attention_reference, polynomial_reference
from diffusionformer.ops.reference_rivals import rival_reference
from diffusionformer.ops.rivals import RivalContext
from diffusionformer.ops.sparse import diffuse_sparse
from diffusionformer.testing.graphs import causal_edge_index, complete_edge_index, dense_allowed_from_edges, random_qkv

__all__ = ["apply_operator_dense", "apply_operator_sparse", "assert_operator"]


def apply_operator_dense(
    op: DiffusionOperator, q: Tensor, k: Tensor, v: Tensor, *, backend: str = "auto", is_causal: bool = False,
    attn_mask: Tensor | None = None,
) -> Tensor:
    """Run one operator on all heads of dense ``(B, H, N, C)`` inputs through the engine (context
    operators through a :class:`~diffusionformer.ops.rivals.RivalContext` without layer state)."""
    H = q.shape[1]
    if op.uses_context:
        return op.apply_context(RivalContext.dense(q, k, v, attn_mask=attn_mask, is_causal=is_causal))
    if op.is_polynomial:
        return diffuse(q, k, v, op.head_coefficients(H), backend=backend, is_causal=is_causal, attn_mask=attn_mask)
    P = attention_matrix(q, k, is_causal=is_causal, attn_mask=attn_mask)
    return (op.apply_causal_matrix if is_causal else op.apply_matrix)(P, v)


def _seed(seed: int, offset: int) -> int:
    """``seed + offset`` as ``manual_seed`` reads it (modulo 2**64): ``seed + 1`` overflowed for seed 2**64 - 1."""
    return (seed + offset) % 2**64


def apply_operator_sparse(op: DiffusionOperator, q: Tensor, k: Tensor, v: Tensor, edge_index: Tensor) -> Tensor:
    """Run one operator on node inputs ``(N, H, C)`` over ``edge_index``."""
    if not op.supports_sparse:
        raise ValueError(f"operator {op.name!r} does not support the sparse back-end")
    if op.uses_context:
        return op.apply_context(RivalContext.sparse(q, k, v, edge_index))[0].transpose(0, 1)
    return diffuse_sparse(q, k, v, edge_index, op.head_coefficients(q.shape[1]))


#: the operators with an explicit float64 formula in :func:`~diffusionformer.ops.reference_rivals.rival_reference`
_RIVALS = (ExactPPROperator, AttnScaleOperator, NeuTRENOOperator, ValueResidualOperator, DifferentialOperator,
           NonlinearDiffusionOperator)


#: the methods that say how a non-polynomial operator is applied: a subclass that redefines one is another operator
_APPLY_HOOKS = ("apply_matrix", "apply_causal_matrix", "apply_context")


def _has_rival_formula(op: DiffusionOperator) -> bool:
    """Whether ``op`` is applied as one of :data:`_RIVALS` (it or a subclass that keeps its ``apply_*`` methods).

    A subclass that redefines how it is applied (``ExactPPROperator`` with another ``apply_matrix``) was held to its
    parent's formula: its correct output failed the check (and an inconsistent causal hook was judged by the
    parent's formula, not by the subclass's own ``apply_matrix``); it gets its own float64 path as reference.
    """
    base = next((r for r in _RIVALS if isinstance(op, r)), None)
    return base is not None and all(getattr(type(op), hook) is getattr(base, hook) for hook in _APPLY_HOOKS)


def _reference(op: DiffusionOperator, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> Tensor:
    if _has_rival_formula(op):
        return rival_reference(op, q, k, v, allowed)
    # the operator's own float64 path is the reference of what has no explicit formula; on a copy: casting `op`
    # itself would run the rest of a float32 check in float64 (and change the caller's operator)
    if op.uses_context:  # a context operator of the caller's: its dense path on a float64 copy
        ctx = RivalContext.dense(q.double(), k.double(), v.double(), attn_mask=allowed)
        return copy.deepcopy(op).double().apply_context(ctx)
    P = dense_attention_reference(q, k, allowed=allowed)
    if op.is_polynomial:
        return polynomial_reference(P, v, op.head_coefficients(q.shape[1]).detach().double())
    return copy.deepcopy(op).double().apply_matrix(P, v.double())


def _check_learned_parameters_reach(op: DiffusionOperator, q: Tensor, k: Tensor, v: Tensor, name: str) -> None:
    """Fail an operator whose trainable parameters do not all reach what the layer uses of it through autograd:
    a polynomial's :meth:`coefficients`, a matrix operator's :meth:`apply_matrix` output (context operators, whose
    parameters may serve only with a layer state, are left to their own tests).

    One computed from ``.item()``, ``.detach()`` or not from the parameter at all passed every law here, and its
    head never trained (no gradient, no error).
    """
    learned = [(n, p) for n, p in op.named_parameters() if p.requires_grad]
    if not learned or op.uses_context:
        return
    with torch.enable_grad():  # also when the caller runs the check under torch.no_grad()
        if op.is_polynomial:
            used, what = op.head_coefficients(q.shape[1]), "coefficients()"
        else:
            used, what = op.apply_matrix(attention_matrix(q, k), v), "apply_matrix()"
        weights = torch.randn(used.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        grads = (torch.autograd.grad((used.double() * weights).sum(), [p for _, p in learned], allow_unused=True)
                 if used.requires_grad else [None] * len(learned))
    missing = [n for (n, _), g in zip(learned, grads) if g is None]
    if missing:
        raise AssertionError(f"{name}: {what} does not depend differentiably on the learned parameters {missing} "
                             f"(computed from .item() or .detach(), or not from them at all): the layer uses the "
                             f"operator through {what} alone, so they would never train")


def _check_spec_rebuilds(op: DiffusionOperator, q: Tensor, k: Tensor, v: Tensor, out: Tensor, head_dim: int,
                         name: str, atol: float, rtol: float) -> None:
    """``build_operator(op.spec())`` with ``op``'s state computes ``out`` as ``op`` does (a spec that dropped an
    architecture argument, such as a ``spec_kwargs()`` left at its default, rebuilt another operator silently)."""
    # a class never registered has no spec (``<unregistered ...>`` rebuilds nothing); a generated wrapper of a
    # registered one (``parametrize``'s) writes its parent's spec, whose state dict has other keys
    if _registered_class(type(op)) is not type(op):
        return
    hint = "spec_kwargs() must return the constructor arguments (besides num_heads) that rebuild it"
    # whatever the operator's own code raises is a failed law like the others (a constructor's KeyError, or its bare
    # assert, came out as the harness's verdict naming neither the spec nor the law)
    try:
        spec = op.spec()
    except Exception as err:
        raise AssertionError(f"{name}: spec() raised {type(err).__name__}: {err}; {hint}") from None
    try:
        rebuilt = build_operator(spec, num_heads=op.num_heads)
        rebuilt.bind(head_dim=head_dim)
        rebuilt = rebuilt.to(device=q.device, dtype=q.dtype)  # the harness runs on the inputs' device too
        rebuilt.load_state_dict(op.state_dict())
    except Exception as err:
        raise AssertionError(f"{name}: spec() {spec!r} does not rebuild it ({type(err).__name__}: {err}); "
                             f"{hint}") from None
    _close(apply_operator_dense(rebuilt, q, k, v), out, f"{name}: spec() {spec!r} rebuilds another operator; {hint}",
           atol, rtol)


def _close(a: Tensor, b: Tensor, what: str, atol: float, rtol: float, dtype: torch.dtype | None = None) -> None:
    if dtype is not None and a.dtype != dtype:  # the comparison in float64 below would hide it
        raise AssertionError(f"{what}: output dtype is {a.dtype}, expected the input dtype {dtype}")
    a, b = a.double(), b.double()
    if a.shape != b.shape:
        raise AssertionError(f"{what}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")
    if not torch.allclose(a, b, atol=atol, rtol=rtol):
        err = (a - b).abs().max().item()
        raise AssertionError(f"{what}: max abs difference {err:.3e} exceeds atol={atol}, rtol={rtol}")


def assert_operator(
    spec: Any,
    *,
    num_heads: int = 2,
    num_nodes: int = 7,
    head_dim: int = 4,
    batch: int = 2,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    atol: float | None = None,
    rtol: float | None = None,
    **kwargs: Any,
) -> None:
    """Check an operator (name, class or instance) against references and the laws above.

    Raises ``AssertionError`` naming the first law that fails.

    Args:
        spec: operator spec for :func:`~diffusionformer.operators.build_operator`.
        num_heads, num_nodes, head_dim, batch: sizes of the random test problem.
        dtype: float64 (tight tolerances) or float32; another floating dtype needs ``atol`` and ``rtol``.
        seed: seed of the random inputs.
        atol, rtol: tolerances (defaults depend on ``dtype``).
        **kwargs: operator arguments (``num_heads`` is set for you).

    Examples:
        >>> assert_operator("laplacian")
        >>> assert_operator("heat", t=0.7, steps=6)
    """
    # sizes of the test problem: 0 crashed deep inside (``amax(): Expected reduction dim``, ``ZeroDivisionError``),
    # a bool was named ``N`` by random_qkv
    batch, num_nodes, head_dim = (check_int(arg, value, 1) for arg, value in
                                  (("batch", batch), ("num_nodes", num_nodes), ("head_dim", head_dim)))
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:  # a string was read as a device by .to()
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if dtype not in (torch.float64, torch.float32) and (atol is None or rtol is None):
        # float32's defaults failed every operator in half precision with "max abs difference ... exceeds"
        raise ValueError(f"dtype={dtype}: default tolerances exist for torch.float64 and torch.float32 only; "
                         f"pass atol and rtol")
    if isinstance(spec, DiffusionOperator):
        if kwargs:  # they would not reach the operator: the instance's own arguments would be tested
            raise TypeError(f"cannot pass operator arguments {sorted(kwargs)} together with an operator instance")
        op = copy.deepcopy(spec)  # bound and cast below: the caller's operator stays as it is
        H = op.num_heads if op.num_heads > 1 else num_heads
    else:
        op = build_operator(spec, num_heads=num_heads, **kwargs)
        H = num_heads
    op.bind(head_dim=head_dim)
    op = op.to(dtype)
    tol_a = atol if atol is not None else (1e-10 if dtype == torch.float64 else 2e-5)
    tol_r = rtol if rtol is not None else (1e-8 if dtype == torch.float64 else 1e-4)
    B, N, C = batch, num_nodes, head_dim
    q, k, v = random_qkv(B, H, N, C, dtype=dtype, seed=seed)
    # an unregistered subclass's own class name, not the parent's name it inherits (its failures read 'laplacian: ...')
    name = op.name if _registered_class(type(op)) is not None else type(op).__name__

    if op.is_polynomial:
        if op.uses_context:  # the layer refuses it
            raise AssertionError(f"{name}: declares capability flags (uses_context) but is_polynomial=True")
        try:
            degree = _checked_degree(op)  # the layer refuses degree = 1.0, True, -1
        except ValueError as err:
            raise AssertionError(f"{name}: {err}") from None
        try:  # the operator's fault, a failed law like the others (not the caller's ValueError or TypeError)
            raw = op.coefficients()  # head_coefficients() refuses non-finite ones too, as a layer does: a law here
            if isinstance(raw, torch.Tensor) and not raw.is_complex() and not torch.isfinite(raw.detach()).all():
                raise AssertionError(f"{name}: coefficients are not finite")
            c = op.head_coefficients(H)
        except (TypeError, ValueError) as err:
            raise AssertionError(f"{name}: coefficients() cannot serve {H} heads: {err}") from None
        if c.shape != (H, degree + 1):
            raise AssertionError(f"{name}: coefficients have shape {tuple(c.shape)}, expected ({H}, {degree + 1})")
        static = op.static_coefficients()
        if static is not None:
            # the layer reads one flat row of floats, shared by the operator's heads: a nested (1, K+1) or (G, K+1)
            # tuple made it raise ``float() argument must be ... not 'tuple'``
            try:
                s = torch.tensor(static, dtype=torch.float64)
            except (TypeError, ValueError, RuntimeError) as err:
                raise AssertionError(f"{name}: static_coefficients() must be a tuple of floats, got {static!r} "
                                     f"({err})") from None
            if s.shape != (degree + 1,):
                raise AssertionError(f"{name}: static_coefficients() has shape {tuple(s.shape)}, coefficients() "
                                     f"{tuple(c.shape)}; expected a flat tuple of degree + 1 = {degree + 1} floats")
            if not torch.allclose(c.detach().double(), s.expand_as(c), atol=1e-6):
                raise AssertionError(f"{name}: static_coefficients() disagrees with coefficients()")

    _check_learned_parameters_reach(op, q, k, v, name)

    # 1. dense back-ends against the explicit float64 reference (complete and causal).
    causal_allowed = torch.ones(N, N, dtype=torch.bool).tril()
    for is_causal, allowed in ((False, None), (True, causal_allowed)):
        ref = _reference(op, q, k, v, allowed)
        backends = ("sdpa", "matrix") if op.is_polynomial else ("matrix",)
        for backend in backends:
            out = apply_operator_dense(op, q, k, v, backend=backend, is_causal=is_causal)
            _close(out, ref, f"{name}: dense backend={backend!r} causal={is_causal} vs float64 reference", tol_a, tol_r,
                   dtype)
        if op.is_polynomial:  # its f(P) on a materialised P (attention maps) is the polynomial too
            hook = "apply_causal_matrix" if is_causal else "apply_matrix"
            out = getattr(op, hook)(attention_matrix(q, k, is_causal=is_causal), v)
            _close(out, ref, f"{name}: {hook}(P, v) causal={is_causal} vs float64 reference of coefficients()",
                   tol_a, tol_r, dtype)

    # 2. shift law: f(P)(v + 1 a^T) = f(P) v + (sum_k c_k) 1 a^T.
    if op.is_polynomial:
        a = torch.randn(1, 1, 1, C, dtype=dtype, generator=torch.Generator().manual_seed(_seed(seed, 1)))
        total = op.head_coefficients(H).detach().sum(-1).to(dtype).view(1, H, 1, 1)
        lhs = apply_operator_dense(op, q, k, v + a)
        rhs = apply_operator_dense(op, q, k, v) + total * a
        _close(lhs, rhs, f"{name}: shift law f(P)(v + 1a^T) = f(P)v + sum(c) 1a^T", tol_a * 10, tol_r)

    # 3. causality: perturbing positions > i never changes output i.
    for cut in (1, N // 2, N - 1):
        v2, k2, q2 = v.clone(), k.clone(), q.clone()
        v2[:, :, cut:] += 1.0
        k2[:, :, cut:] -= 0.5
        q2[:, :, cut:] += 0.3
        o1 = apply_operator_dense(op, q, k, v, is_causal=True)
        o2 = apply_operator_dense(op, q2, k2, v2, is_causal=True)
        _close(o1[:, :, :cut], o2[:, :, :cut], f"{name}: causal output before position {cut} saw the future", tol_a, tol_r)

    # 4. permutation equivariance (dense).
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(_seed(seed, 2)))
    o = apply_operator_dense(op, q, k, v)
    op_perm = apply_operator_dense(op, q[:, :, perm], k[:, :, perm], v[:, :, perm])
    _close(op_perm, o[:, :, perm], f"{name}: dense output is not permutation-equivariant", tol_a, tol_r)

    # 4b. batch independence: each element's output is the element's alone (a non-polynomial's reference is its own
    # apply_matrix or dense path on the whole batch, so mixing rows across the batch passed every law above)
    for b in range(B):
        alone = apply_operator_dense(op, q[b:b + 1], k[b:b + 1], v[b:b + 1])
        _close(alone, o[b:b + 1], f"{name}: output of batch element {b} depends on the other batch elements",
               tol_a, tol_r)

    # 4c. the spec rebuilds the operator: heads_spec(), the layer's repr and a checkpoint's model record write it
    _check_spec_rebuilds(op, q, k, v, o, head_dim, name, tol_a, tol_r)

    if not op.supports_sparse:
        qn, kn, vn = (t[0].transpose(0, 1) for t in (q, k, v))
        try:
            apply_operator_sparse(op, qn, kn, vn, complete_edge_index(N))
        except ValueError:
            return
        raise AssertionError(f"{name}: declares supports_sparse=False but the sparse back-end did not refuse it")

    if not op.is_polynomial and not op.uses_context:
        # the sparse back-end runs its coefficients(), optional for a function of a materialised P: one without them
        # crashed here with NotImplementedError instead of failing the declaration (the layer refuses it on edges)
        try:
            op.head_coefficients(H)
        except NotImplementedError:
            raise AssertionError(f"{name}: declares supports_sparse=True but is neither polynomial nor a context "
                                 f"operator and has no coefficients(); the layer refuses it on edges: set "
                                 f"supports_sparse = False") from None

    # 5. sparse equals dense on the complete and the causal graph (batch element 0).
    qn, kn, vn = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))  # (N, H, C)
    for edge_index, is_causal in ((complete_edge_index(N), False), (causal_edge_index(N), True)):
        dense_out = apply_operator_dense(op, q[:1], k[:1], v[:1], is_causal=is_causal)[0].transpose(0, 1)
        sparse_out = apply_operator_sparse(op, qn, kn, vn, edge_index)
        _close(sparse_out, dense_out, f"{name}: sparse vs dense (causal={is_causal})", tol_a, tol_r, dtype)

    # 6. a general sparse graph against the explicit reference; edge-order invariance; permutation.
    g = torch.Generator().manual_seed(_seed(seed, 3))
    edges = complete_edge_index(N)
    edges = edges[:, torch.rand(edges.shape[1], generator=g) < 0.5]
    edges = edges[:, edges[1] != N // 2]  # a node without in-edges: its row of P is zero
    allowed = dense_allowed_from_edges(edges, N)
    ref = _reference(op, qn.transpose(0, 1)[None], kn.transpose(0, 1)[None], vn.transpose(0, 1)[None], allowed)[0].transpose(0, 1)
    out = apply_operator_sparse(op, qn, kn, vn, edges)
    _close(out, ref, f"{name}: sparse on a random graph vs float64 reference (nodes without in-edges: zero row)", tol_a, tol_r)
    shuffled = edges[:, torch.randperm(edges.shape[1], generator=g)]
    _close(apply_operator_sparse(op, qn, kn, vn, shuffled), out, f"{name}: sparse output depends on edge order", tol_a, tol_r)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(N)
    permuted_edges = inv[edges]
    out_p = apply_operator_sparse(op, qn[perm], kn[perm], vn[perm], permuted_edges)
    _close(out_p, out[perm], f"{name}: sparse output is not permutation-equivariant", tol_a, tol_r)
