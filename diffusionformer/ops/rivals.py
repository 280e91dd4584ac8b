r"""What the rival operators need beyond one polynomial in ``P``: a context and a layer state.

Most heads of this library are polynomials :math:`\sum_k c_k P^k` and run through the
polynomial engine. The published rivals are not:

* differential attention forms **two** score maps from split queries and keys;
* NeuTRENO and value residuals read the **first layer's values** ``v0``;
* nonlinear diffusion (GRAND-nl) **re-attends** at every step from the evolving state;
* AttnScale needs the **uniform average** over the admissible keys (its ``DC`` part).

An operator declares these needs with capability flags
(:attr:`~diffusionformer.operators.DiffusionOperator.needs_second_map`, ...). The layer then
builds a :class:`RivalContext` for the operator's heads and calls
:meth:`~diffusionformer.operators.DiffusionOperator.apply_context`. The context hides the
back-end: :meth:`RivalContext.attend` is ``softmax(q k^T s + mask) x`` with any ``q``, ``k``,
``x`` on the dense (SDPA) or the sparse (edge softmax) path, so every rival written against it
runs on both. Tensors handed to operators are head-major, ``(B, G, N, C)`` (``B = 1`` for a
sparse graph).

:class:`LayerState` is the small object that carries the first layer's values and the depth
of the current layer through a model's forward pass (models create one per call).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from diffusionformer.ops._checks import _check_is_causal, _head_output, check_tensor
from diffusionformer.ops.dense import attention_matrix, normalise_mask, propagate_dense
from diffusionformer.ops.sparse import diffuse_sparse
from diffusionformer.ops.uniform_map import uniform_mean

__all__ = ["LayerState", "RivalContext", "apply_context_groups", "uniform_average"]


@dataclass
class LayerState:
    """State shared by the :class:`~diffusionformer.nn.DiffusionAttention` layers of one forward pass.

    The first layer called with a state records its values ``v`` (all heads, head-major
    ``(B, H, N, C)``); later layers read them (NeuTRENO's ``v0``, ResFormer's ``V_1``).
    ``depth`` counts the layers called so far, so the ``l``-th layer (0-based) sees
    ``depth == l`` (differential attention's ``lambda_init`` schedule).

    A layer that reads the state, called again with it while autograd runs a backward pass, is a
    recomputation (:func:`torch.utils.checkpoint`): it sees what its first call saw, and the state
    does not move on (else it read a depth past the model's and the first layer's values for its
    own, and its gradients were wrong while its outputs were right). Three cases raise instead: a
    layer called more than once in one pass (shared weights), whose calls cannot be told apart
    there, reentrant checkpointing of a layer that reads the first layer's values, which that
    mode computed without autograd (their gradient would be lost), and reentrant checkpointing of
    the first layer when a layer outside the checkpoint read its values with autograd on: the
    checkpoint recorded them without autograd, and the gradient through them would be lost too.

    Examples:
        >>> s = LayerState()
        >>> s.enter(torch.ones(1, 2, 3, 4))
        (0, None)
        >>> depth, v0 = s.enter(torch.zeros(1, 2, 3, 4)); depth, v0.sum().item()
        (1, 24.0)
    """

    first_values: Tensor | None = None
    depth: int = 0
    #: ``(layer, depth, first_values, grad mode)`` of every call of a layer that reads the state (eager mode), for
    #: recomputations; a tuple rebound on each call, so that a ``copy.copy`` of the state keeps its own record
    _calls: tuple = field(default=(), init=False, repr=False, compare=False)
    #: the layer whose call recorded ``first_values`` and whether autograd was on in that call (``None``: given by
    #: hand, or none yet), and whether a layer that reads them did so with autograd on (DiffusionAttention.forward)
    _first_owner: Any = field(default=None, init=False, repr=False, compare=False)
    _first_grad: bool | None = field(default=None, init=False, repr=False, compare=False)
    _first_read: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # a state built by hand was taken as given: a float depth was truncated (1.5 read as layer 1), a bool read
        # as 0 or 1, a string or a list of values failed later in a bare TypeError inside a layer
        depth = self.depth
        if isinstance(depth, bool) or not isinstance(depth, numbers.Integral) or depth < 0:
            raise ValueError(f"LayerState.depth: expected a non-negative int, got {depth!r}")
        self.depth = int(depth)
        v0 = self.first_values
        if v0 is not None and (not isinstance(v0, Tensor) or v0.dim() != 4 or not v0.is_floating_point()):
            got = f"shape {tuple(v0.shape)}, dtype {v0.dtype}" if isinstance(v0, Tensor) else type(v0).__name__
            raise ValueError(f"LayerState.first_values: expected None or floating-point values (B, H, N, C), got {got}")

    def _recomputing(self, layer: nn.Module) -> "LayerState | None":
        """The state as ``layer``'s first call found it, when this call recomputes that one inside a backward pass
        (``torch.utils.checkpoint``); else ``None``."""
        if not self._calls or torch._C._current_graph_task_id() == -1:  # not inside a backward pass
            return None
        seen = [(depth, v0, grad) for m, depth, v0, grad in self._calls if m is layer]
        if not seen:
            return None
        if len(seen) > 1:
            raise RuntimeError(
                "LayerState: a layer called more than once in one forward pass (shared weights) is recomputed "
                "inside the backward pass (torch.utils.checkpoint), and its calls cannot be told apart there; "
                "checkpoint a part of the model that calls each layer once, or pass state=None to that layer"
            )
        depth, v0, grad = seen[0]
        if v0 is not None and not grad and torch.is_grad_enabled() and any(
                getattr(op, "needs_layer_state", False) for op in getattr(layer, "operators", ())):
            # reentrant checkpointing ran the first call without autograd: the first layer's values it kept have no
            # graph, and the gradient through them (NeuTRENO's v0, ResFormer's V_1) would be lost without a word
            raise RuntimeError(
                "LayerState: this layer reads the first layer's values, which reentrant checkpointing "
                "(torch.utils.checkpoint(..., use_reentrant=True)) computed without autograd, so their gradient "
                "would be lost; use use_reentrant=False"
            )
        return LayerState(first_values=v0, depth=depth)

    def enter(self, v: Tensor) -> tuple[int, Tensor | None]:
        """Register a layer with values ``v`` ``(B, H, N, C)``: its depth and the first layer's
        values (``None`` for the first layer itself)."""
        depth = self.depth
        self.depth += 1
        if self.first_values is None:
            self.first_values = v
            return depth, None
        return depth, self.first_values


def uniform_average(x: Tensor, allowed: Tensor | None) -> Tensor:
    r"""The direct-current part :math:`DC\,x`: each row averages ``x`` over its admissible keys.

    With ``allowed`` ``None`` every key counts (:math:`DC = \frac{1}{N} 1 1^\top`); a row with
    no admissible key is zero (like ``P``). This is the explicit float-mask form used in
    references; layers use :meth:`RivalContext.uniform` (a reduction over keys for the masks
    known from the call's structure, else the attention kernels).

    Shapes:
        ``x``: ``(B, G, N, C)``; ``allowed``: bool broadcastable to ``(B, G, N, N)`` -> ``(B, G, N, C)``.

    Examples:
        >>> x = torch.tensor([[[[1.], [3.]]]])
        >>> uniform_average(x, torch.ones(2, 2, dtype=torch.bool).tril()).flatten().tolist()
        [1.0, 2.0]
    """
    N = x.shape[-2]
    if allowed is None:
        return x.mean(dim=-2, keepdim=True).expand_as(x)
    w = allowed.to(x.dtype).expand(*x.shape[:-2], N, N)
    count = w.sum(-1, keepdim=True)
    return (w @ x) / count.clamp_min(1.0)


class RivalContext:
    r"""What a context operator sees of its layer, for its ``G`` heads.

    Attributes:
        q, k, v: queries, keys (after the layer's q/k norm) and values, ``(B, G, N, C)``.
        q_raw, k_raw: queries and keys before the layer's q/k norm and rotary embedding (equal
            to ``q``, ``k`` without either); operators that evolve them (GRAND-nl) re-apply
            :meth:`normalise_qk`.
        scale: the layer's score scale ``1 / sqrt(C)``.
        v0: the first layer's values for these heads ``(B, G, N, C)`` (in ``v``'s dtype), or ``None`` when this
            layer is the first (or no state was given).
        depth: the index of this layer in the model (0 without a state).
        dropout_p: dropout on attention probabilities (training only; 0 in eval).

    Use :meth:`dense` or :meth:`sparse` to build one.
    """

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, *, scale: float, v0: Tensor | None = None, depth: int = 0,
                 dropout_p: float = 0.0, q_raw: Tensor | None = None, k_raw: Tensor | None = None,
                 normalise_qk: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None) -> None:
        self.q, self.k, self.v = q, k, v
        self.q_raw = q if q_raw is None else q_raw
        self.k_raw = k if k_raw is None else k_raw
        self._normalise_qk = normalise_qk
        self.scale = float(scale)
        if v0 is not None and v0.shape != v.shape:
            raise ValueError(
                f"the first layer's values have shape {tuple(v0.shape)}, this layer's heads {tuple(v.shape)}; "
                "layers sharing a LayerState need the same batch, length, heads and head width"
            )
        if v0 is not None and v0.dtype != v.dtype:  # a first layer run in another precision: this layer's dtype
            v0 = v0.to(v.dtype)
        self.v0 = v0
        self.depth = int(depth)
        self.dropout_p = float(dropout_p)
        self._mode = ""
        self._mask: Tensor | None = None
        self._is_causal = False
        self._edge_index: Tensor | None = None
        self._uniform_plan: tuple[Tensor | None, bool] | None = None  # (key mask, is_causal): DC x without attention
        # dense attend() through a materialised P (the layer's backend="matrix"): stock operations that have a double
        # backward, which torch's fused CPU attention kernels lack
        self._materialise = False
        # the layer's q, k, v projection biases of these heads, ``(G, C)`` each, for operators that evolve q, k, v
        # (GRAND-nl) where a row of P may not sum to 1 (set by apply_context_groups; None: no bias, or not needed)
        self._qkv_bias: tuple[Tensor, Tensor, Tensor] | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def dense(cls, q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False,
              scale: float | None = None, **kwargs: Any) -> "RivalContext":
        """A dense context; ``attn_mask`` bool (True = attend) or additive, broadcastable to ``(B, G, N, N)``."""
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_tensor(name, t, 4, "(B, G, N, C)")
        B, G, N, C = q.shape
        M = k.shape[2]
        causal_call = is_causal
        mask, is_causal = normalise_mask(attn_mask, is_causal, (B, G, N, M), q.device, q.dtype)
        ctx = cls(q, k, v, scale=C**-0.5 if scale is None else scale, **kwargs)
        ctx._mode, ctx._mask, ctx._is_causal = "dense", mask, is_causal
        # the uniform map's admissible keys from the call's structure alone (never from mask values):
        # no mask, causal, a bool mask over keys only (key padding), or causal and key padding
        if N == M and (attn_mask is None or (attn_mask.dtype == torch.bool and attn_mask.dim() >= 2
                                             and attn_mask.shape[-2] == 1 and attn_mask.shape[-1] == M)):
            keys = None if attn_mask is None else attn_mask.reshape((1,) * (4 - attn_mask.dim()) + attn_mask.shape)
            ctx._uniform_plan = (keys, bool(causal_call))
        return ctx

    @classmethod
    def sparse(cls, q: Tensor, k: Tensor, v: Tensor, edge_index: Tensor, *, is_causal: bool = False,
               scale: float | None = None, **kwargs: Any) -> "RivalContext":
        """A sparse context from node-major ``(N, G, C)`` inputs and ``edge_index`` ``(2, E)``
        (``(source j, target i)``); tensors are stored head-major ``(1, G, N, C)``. With
        ``is_causal`` the edges whose source comes after their target are ignored (as in
        :func:`~diffusionformer.ops.sparse.diffuse_sparse`)."""
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_tensor(name, t, 3, "(N, G, C)")
        _check_is_causal(is_causal)
        C = q.shape[-1]

        def hm(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.transpose(0, 1).unsqueeze(0)

        for key in ("q_raw", "k_raw"):
            if kwargs.get(key) is not None:
                kwargs[key] = hm(kwargs[key])
        if kwargs.get("v0") is not None and kwargs["v0"].dim() == 3:
            kwargs["v0"] = hm(kwargs["v0"])
        ctx = cls(hm(q), hm(k), hm(v), scale=C**-0.5 if scale is None else scale, **kwargs)  # type: ignore[arg-type]
        ctx._mode, ctx._edge_index, ctx._is_causal = "sparse", edge_index, bool(is_causal)
        return ctx

    @property
    def is_sparse(self) -> bool:
        return self._mode == "sparse"

    # ------------------------------------------------------------------ kernels
    def normalise_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """The layer's q/k norm (identity when it has none)."""
        return (q, k) if self._normalise_qk is None else self._normalise_qk(q, k)

    def attend(self, q: Tensor, k: Tensor, x: Tensor, scale: float | None = None) -> Tensor:
        r""":math:`\operatorname{softmax}(q k^\top s + \text{mask})\, x` on this context's graph.

        Rows without an admissible key give zero. Dropout ``dropout_p`` applies to the
        probabilities.

        Shapes:
            ``q``, ``k``: ``(B, G, N, C')``; ``x``: ``(B, G, N, C_x)`` -> ``(B, G, N, C_x)``.
        """
        s = self.scale if scale is None else float(scale)
        if self._mode == "dense" and self._materialise:  # P materialised, as the layer's own heads (backend="matrix")
            P = attention_matrix(q, k, attn_mask=self._mask, is_causal=self._is_causal, scale=s)
            if self.dropout_p > 0.0:
                P = F.dropout(P, p=self.dropout_p)
            return torch.matmul(P, x)
        if self._mode == "dense":  # one fused attention call (rows without keys pinned to 0 there)
            # SDPA's fused CPU kernels need one width for q, k and x, else it takes the unfused math
            # path (4x slower for differential's half-width scores at N = 1024). Zero columns change
            # no score q k^T (the scale is explicit), so pad the narrower side; padding q, k more
            # than 2x (GRAND-nl's 3x wider state) only pays from about 512 keys on (docs/performance.md)
            Cq, Cx = q.shape[-1], x.shape[-1]
            if Cq != Cx and (Cq > Cx or 2 * Cq >= Cx or k.shape[-2] >= 512):
                w = max(Cq, Cx)
                q, k, x = F.pad(q, (0, w - Cq)), F.pad(k, (0, w - Cq)), F.pad(x, (0, w - Cx))
            out = propagate_dense(q, k, x, attn_mask=self._mask, is_causal=self._is_causal, scale=s,
                                  dropout_p=self.dropout_p)
            return out[..., :Cx]
        assert self._edge_index is not None
        nm = [t[0].transpose(0, 1) for t in (q, k, x)]  # (N, G, .)
        # static coefficients (0, 1): one edge softmax and one propagation, P x
        out = diffuse_sparse(nm[0], nm[1], nm[2], self._edge_index, [0.0, 1.0], num_nodes=nm[0].shape[0], scale=s,
                             dropout_p=self.dropout_p, is_causal=self._is_causal)
        return out.transpose(0, 1).unsqueeze(0)

    def propagate(self, x: Tensor) -> Tensor:
        """``P x`` with the layer's own ``P`` (its ``q``, ``k``, ``scale``)."""
        return self.attend(self.q, self.k, x)

    def uniform(self, x: Tensor) -> Tensor:
        r"""``DC x``: the average of ``x`` over each row's admissible keys (zero scores, no dropout).

        A dense context whose mask is none, causal, a bool mask over keys only (key padding) or
        causal and key padding takes :func:`~diffusionformer.ops.uniform_map.uniform_mean`
        (a mean, cumulative mean or masked mean, ``O(N)``); any other mask, and the sparse
        back-end, a zero-score attention call.
        """
        if self._uniform_plan is not None:
            keys, causal = self._uniform_plan
            return uniform_mean(x, keys, is_causal=causal)
        width = x.shape[-1] if self._mode == "dense" else 1  # dense: x's width keeps SDPA's fused kernel
        drop, self.dropout_p = self.dropout_p, 0.0
        try:
            return self.attend(self.q.new_zeros(*self.q.shape[:-1], width), self.k.new_zeros(*self.k.shape[:-1], width),
                               x, scale=1.0)
        finally:
            self.dropout_p = drop

    def attention_matrix(self) -> Tensor:
        """The layer's ``P`` for these heads, ``(B, G, N, N)`` (dense contexts only)."""
        if self._mode != "dense":
            raise ValueError("attention_matrix() needs a dense context; this operator is dense-only")
        P = attention_matrix(self.q, self.k, attn_mask=self._mask, is_causal=self._is_causal, scale=self.scale)
        if self.dropout_p > 0.0:
            P = torch.nn.functional.dropout(P, p=self.dropout_p)
        return P


def _slice_heads(mask: Tensor | None, s: int, c: int, H: int) -> Tensor | None:
    """The heads ``s .. s + c - 1`` of a mask broadcastable to ``(B, H, N, M)``: its head axis is the third from
    the end (``(H, N, M)`` masks too, not only ``(B, H, N, M)``)."""
    if mask is None or mask.dim() < 3:
        return mask
    axis = mask.dim() - 3
    if mask.shape[axis] == 1:
        return mask
    if mask.shape[axis] != H:
        raise ValueError(f"attn_mask has {mask.shape[axis]} heads, the layer {H}")
    return mask.narrow(axis, s, c)


def _head_biases(layer: nn.Module, s: int, c: int) -> tuple[Tensor, Tensor, Tensor] | None:
    r"""The biases of ``layer.qkv`` for the query, key and value heads ``s .. s + c - 1``, ``(c, C)`` each (key/value
    heads expanded over their query groups, as the layer's ``k``, ``v``), or ``None`` without a bias.

    An operator that evolves the projected ``q, k, v`` of a model-space state :math:`\dot X = (P - I) X` (GRAND-nl)
    relies on :math:`(P - I)\,1 b^\top = 0`: true for a row-stochastic ``P``, not for a row without keys (zero) or
    a row rescaled by attention dropout. Evolving ``q - b_q``, ``k - b_k``, ``v - b_v`` (the linear parts) is exact
    for every ``P``."""
    bias = getattr(getattr(layer, "qkv", None), "bias", None)
    if callable(bias) and not isinstance(bias, Tensor):  # a quantized Linear's bias() method (quantize_dynamic)
        bias = bias()
    if bias is None:
        return None
    H, C = layer.num_heads, layer.head_dim
    G = getattr(layer, "num_kv_heads", H)
    bq, bk, bv = bias.split([H * C, G * C, G * C])
    bq, bk, bv = bq.view(H, C), bk.view(G, C), bv.view(G, C)
    if G != H:
        bk, bv = bk.repeat_interleave(H // G, dim=0), bv.repeat_interleave(H // G, dim=0)
    return bq[s : s + c], bk[s : s + c], bv[s : s + c]


def _context_output(op: nn.Module, ctx: RivalContext) -> Tensor:
    """``op.apply_context(ctx)``, checked by :func:`~diffusionformer.ops._checks._head_output`."""
    return _head_output(op, "apply_context(ctx)", op.apply_context(ctx), ctx.v, "ctx.v")


def apply_context_groups(
    layer: nn.Module, out: Tensor, x: Tensor, q: Tensor, k: Tensor, v: Tensor, *, entered: tuple[int, Tensor | None],
    mask: Tensor | None = None, is_causal: bool = False, edge_index: Tensor | None = None, dropout_p: float = 0.0,
    positions: Tensor | None = None,
) -> Tensor:
    """Add the output of every context operator of ``layer`` to ``out`` (their rows of ``out`` are zero).

    The one place where :class:`~diffusionformer.nn.DiffusionAttention` hands heads to
    operators that declare capabilities; the layer itself has no per-operator cases.
    ``entered`` is what :meth:`LayerState.enter` returned for this layer (``(0, None)``
    without a state); ``positions`` are the layer's rotary positions (re-applied, with its
    q/k norm, by operators that evolve ``q`` and ``k``).

    Shapes:
        dense: ``x`` ``(B, N, D)``, ``q``/``k``/``v``/``out`` ``(B, H, N, C)``;
        sparse: ``x`` ``(N, D)``, ``q``/``k``/``v``/``out`` ``(N, H, C)``.
    """
    sparse = edge_index is not None
    H = layer.num_heads
    head_axis = 1
    depth, v0_all = entered
    groups = [(op, s, c) for op, (s, c) in zip(layer.operators, layer._groups) if op.uses_context]
    if not groups:
        return out
    # the layer's q/k transform (norm, then rotary): operators that evolve q and k re-apply it
    has_norm = not isinstance(layer.q_norm, nn.Identity) or getattr(layer, "rotary", None) is not None
    raw = None
    for op, s, c in groups:
        q_raw = k_raw = None
        if op.reprojects_each_step and has_norm:
            if raw is None:
                raw = layer._project(x, positions, transform=False)  # (..., N, H, C), key/value heads expanded
            q_raw, k_raw = raw[0][..., s : s + c, :], raw[1][..., s : s + c, :]  # (..., N, G, C)
            if not sparse:
                q_raw, k_raw = q_raw.transpose(1, 2), k_raw.transpose(1, 2)
        v0 = None if v0_all is None else v0_all[:, s : s + c]

        def norm(qq: Tensor, kk: Tensor) -> tuple[Tensor, Tensor]:
            # head-major (B, G, N, C) -> the layer's node-major (B, N, G, C) and back
            qq, kk = layer._transform_qk(qq.transpose(-3, -2), kk.transpose(-3, -2), positions)
            return qq.transpose(-3, -2), kk.transpose(-3, -2)

        kwargs = dict(scale=layer.head_dim**-0.5, v0=v0, depth=depth, dropout_p=dropout_p, q_raw=q_raw, k_raw=k_raw,
                      normalise_qk=norm if has_norm else None)
        sl = slice(s, s + c)
        if sparse:
            ctx = RivalContext.sparse(q[:, sl], k[:, sl], v[:, sl], edge_index, is_causal=is_causal, **kwargs)
        else:
            ctx = RivalContext.dense(q[:, sl], k[:, sl], v[:, sl], attn_mask=_slice_heads(mask, s, c, H),
                                     is_causal=is_causal, **kwargs)
            ctx._materialise = getattr(layer, "backend", "auto") == "matrix"  # the layer's back-end, as its other heads
        if op.reprojects_each_step and (sparse or dropout_p > 0.0 or ctx._uniform_plan is None):
            # a row of P may not sum to 1 here (a node without incoming edges, a mask row without keys, the rescaled
            # rows of attention dropout): the projections' biases no longer follow (P - I), see _head_biases
            ctx._qkv_bias = _head_biases(layer, s, c)
        y = _context_output(op, ctx)
        if sparse:
            y = y[0].transpose(0, 1)  # (N, G, C)
        out = out.index_add(head_axis, torch.arange(s, s + c, device=out.device), y.to(out.dtype))
    return out
