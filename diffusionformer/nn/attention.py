r"""``DiffusionAttention``: multi-head attention whose heads are diffusion operators."""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffusionformer._imports import _import_pyg
from diffusionformer.config import _check_flag
from diffusionformer.functional import DENSE_BACKENDS, diffuse_sparse_with_weights
from diffusionformer.graph.core import AttentionGraph
from diffusionformer.nn._factory import _cast_part, _check_factory, _on_device
from diffusionformer.nn._skip import is_noop
from diffusionformer.nn._weights import _reset_children, _stored_weight
from diffusionformer.nn.heads import HeadGroup, parse_heads
from diffusionformer.operators import DiffusionOperator
from diffusionformer.operators.base import _checked_degree, _label
from diffusionformer.ops import dense as _dense
from diffusionformer.ops import rivals as _rivals
from diffusionformer.ops._checks import (_SPARSE_ADJACENCY_FIX, _backend_hint, _check_is_causal, _check_strided,
                                         _matrix_output, _on_device_of_x, check_degrees, check_dropout, check_layout)
from diffusionformer.ops.engine import (AffineRun, affine_coefficients, affine_runs, combine_affine,
                                        static_coefficients, static_tensor)
from diffusionformer.ops.recompute import recompute_saved, wants_recompute
from diffusionformer.ops.sparse import SPARSE_BACKENDS

__all__ = ["AttentionIntermediates", "DiffusionAttention", "set_recompute"]

#: held while a layer remakes its plan (:meth:`DiffusionAttention._check_plan`); reentrant: a plan may bind operators
_PLAN_LOCK = threading.RLock()


@dataclass
class AttentionIntermediates:
    """What a :class:`DiffusionAttention` call can return besides its output.

    Attributes:
        attn_weights: ``P`` per head: ``(B, H, N, N)`` dense, or ``(E, H)`` per edge (sparse).
        coefficients: weights on ``P^0 .. P^K`` per head, ``(H, K+1)``; rows of non-polynomial
            heads (``heat-exact``) are NaN.
        edge_index: the edges ``attn_weights`` refers to (sparse calls; after the causal filter).
        backend: ``"sdpa"``, ``"matrix"`` or ``"sparse"``.
    """

    attn_weights: Tensor | None
    coefficients: Tensor
    edge_index: Tensor | None
    backend: str


class DiffusionAttention(nn.Module):
    r"""Multi-head attention where head ``h`` applies a diffusion operator :math:`f_h(P_h)`.

    .. math::
        \mathrm{out} = \big[f_1(P_1) V_1 \;\|\; \dots \;\|\; f_H(P_H) V_H\big] W_O + b_O,
        \qquad P_h = \operatorname{softmax}\!\Big(\frac{Q_h K_h^\top}{\sqrt{C}} + \text{mask}\Big),

    with :math:`f_h(P) = \sum_k c_{h,k} P^k` given by the head's operator: ``P`` for
    attention, ``I - P`` for the Laplacian heads of Zhang & Papyan (arXiv 2602.09297),
    truncated heat kernels, personalised PageRank, learned polynomials
    (:mod:`diffusionformer.operators`). The layer projects and calls the functional API
    (:func:`~diffusionformer.functional.diffuse`, :func:`~diffusionformer.functional.diffuse_sparse`),
    which picks the path: heads with fixed coefficients on ``P^0`` and ``P^1`` share one
    fused :func:`~torch.nn.functional.scaled_dot_product_attention` call; heads that need
    ``K`` steps are propagated further, alone; heads whose :math:`f` is not a polynomial
    (``heat-exact``, ``ppr-exact``) get ``P`` materialised for themselves only. What the layer
    derives from its operators is computed once (and again when ``operators`` is changed), and
    when every head is a fixed ``a I + b P`` on a complete or causal graph the layer runs that
    fused path itself, without re-checking the ``q``, ``k``, ``v`` it projected: an
    all-attention layer then costs the calls of nanoGPT's attention.

    The token graph is one argument, an :class:`~diffusionformer.graph.AttentionGraph`
    (``attn(x, graph)``); ``key_padding_mask=``, ``attn_mask=``, ``is_causal=`` and
    ``edge_index=`` are shorthands that build one.

    The projections match :class:`torch.nn.MultiheadAttention` (``qkv.weight`` =
    ``in_proj_weight``: q | k | v, each split into heads ``0 .. H-1``) and PyG's
    :class:`~torch_geometric.nn.conv.TransformerConv` (``lin_query | lin_key | lin_value``),
    see :meth:`from_multihead_attention` and :meth:`from_transformer_conv`. Non-learned
    operators add no parameters.

    Args:
        dim: model width ``D``.
        num_heads: ``H``; must divide ``D``.
        heads: head operators: ``None`` (all attention), ``"attention:6,laplacian:2"`` (in
            that order), ``"heat(t=0.5, learnable=True):2,attention:6"``, or a list with one
            operator (name, class or instance) per head. See :func:`~diffusionformer.nn.heads.parse_heads`.
        causal: position ``i`` never sees ``j > i`` (dense: causal mask; sparse: edges with
            source > target are dropped).
        qk_norm: LayerNorm on queries and keys per head (Dehghani et al., 2023).
        bias: biases in the projections and in the ``qk_norm`` LayerNorms.
        dropout: dropout on the attention probabilities at every propagation step (training only).
        backend: dense back-end, ``"auto"``, ``"sdpa"`` or ``"matrix"`` (see
            :func:`~diffusionformer.ops.dense.choose_dense_backend`).
        num_kv_heads: key/value heads ``H_kv`` (must divide ``H``; ``None`` = ``H``). Fewer
            than ``H`` is grouped-query attention (Ainslie et al., EMNLP 2023; ``1`` = multi-query,
            Shazeer 2019): query head ``h`` uses key/value head ``h // (H / H_kv)``. The ``qkv``
            projection is then ``D -> D + 2 H_kv C``.
        rotary: a :class:`~diffusionformer.nn.rotary.RotaryEmbedding` (or 2-D) applied to
            ``q`` and ``k`` after the projection (and ``qk_norm``), so every head's ``P`` is
            built from rotated scores; ``forward(positions=...)`` gives the positions.
        recompute: while training, form the heads' combined output again in the backward pass
            instead of keeping it for the output projection's (:mod:`diffusionformer.ops.recompute`):
            one activation of width ``D`` less per layer whose heads are not all plain attention,
            for the combination's element-wise operations once more. Off by default (autograd's
            usual trade); a settable attribute (:func:`~diffusionformer.nn.set_recompute` sets it
            on every layer of a model).
        device: where the parameters and buffers are created (torch's factory argument, as
            :class:`torch.nn.MultiheadAttention`'s): the projections and norms get it, the head
            operators are built under ``with torch.device(device)``; ``"meta"`` allocates nothing
            (:func:`torch.nn.utils.skip_init`, deferred initialisation: ``to_empty`` then
            :meth:`reset_parameters`). Operator instances given in ``heads`` and ``rotary`` are
            moved there, in place, as ``layer.to(device)`` would move them.
        dtype: floating-point dtype of the parameters: the projections and norms are initialised
            in it (as :class:`torch.nn.Linear`); the head operators are built in the default dtype
            and cast, when ``dtype`` is another, as ``layer.to(dtype)`` casts them (fixed constants
            and coefficient caches stay float64 or float32, never half; learned values are rounded
            from the default dtype). Given operator instances are cast as well.

    Shapes:
        - dense: ``x`` ``(B, N, D)``, ``key_padding_mask`` ``(B, N)`` bool (True = padding),
          ``attn_mask`` broadcastable to ``(B, H, N, N)`` -> ``(B, N, D)``;
        - sparse: ``x`` ``(N, D)``, ``edge_index`` ``(2, E)`` -> ``(N, D)``.

    Examples:
        >>> attn = DiffusionAttention(16, 4, heads="attention:2,laplacian:2")
        >>> attn(torch.randn(2, 5, 16)).shape
        torch.Size([2, 5, 16])
        >>> attn(torch.randn(5, 16), edge_index=torch.tensor([[0, 1, 2], [1, 2, 0]])).shape
        torch.Size([5, 16])
        >>> from diffusionformer.graph import sliding_window
        >>> attn(torch.randn(2, 5, 16), sliding_window(5, 1)).shape
        torch.Size([2, 5, 16])
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        heads: Any = None,
        *,
        causal: bool = False,
        qk_norm: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        backend: str = "auto",
        num_kv_heads: int | None = None,
        rotary: nn.Module | None = None,
        recompute: bool = False,
        device: torch.device | str | int | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        device, dtype = _check_factory(device, dtype, "DiffusionAttention")
        for name, value in (("dim", dim), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        dim, num_heads = int(dim), int(num_heads)  # numpy ints from a sweep: Python ints from here on
        if dim % num_heads != 0:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        for name, flag in (("causal", causal), ("qk_norm", qk_norm), ("bias", bias), ("recompute", recompute)):
            _check_flag(flag, name)  # "no" would read as True; a numpy bool is refused as every flag
        dropout = check_dropout(dropout, "dropout")
        if backend not in DENSE_BACKENDS:
            raise ValueError(f"backend must be one of {DENSE_BACKENDS}, got {backend!r}" + _backend_hint(
                backend, DENSE_BACKENDS, SPARSE_BACKENDS, "sparse graphs"))
        self.recompute = recompute
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.causal = causal
        self.dropout = float(dropout)
        self.backend = backend
        # ---- modern parts (GQA, RoPE, KV cache): see nn/rotary.py and nn/kv_cache.py
        kv = num_heads if num_kv_heads is None else num_kv_heads
        if isinstance(kv, bool) or not isinstance(kv, numbers.Integral) or kv < 1 or num_heads % kv:
            raise ValueError(f"num_kv_heads: expected a positive int dividing num_heads={num_heads}, got {num_kv_heads!r}")
        kv = int(kv)
        if rotary is not None and getattr(rotary, "head_dim", None) != dim // num_heads:
            raise ValueError(f"rotary: expected a rotary embedding with head_dim={dim // num_heads}, got {rotary!r}")
        self.num_kv_heads = kv
        self.rotary = rotary if rotary is None else _cast_part(rotary, device, dtype, given=True)
        factory = {"device": device, "dtype": dtype}
        self.qkv = nn.Linear(dim, dim + 2 * kv * (dim // num_heads), bias=bias, **factory)
        # ---- end modern parts
        self.out_proj = nn.Linear(dim, dim, bias=bias, **factory)
        # the q/k LayerNorms follow ``bias`` (bias=False: nanoGPT's LayerNorm without bias)
        self.q_norm = nn.LayerNorm(self.head_dim, bias=bias, **factory) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, bias=bias, **factory) if qk_norm else nn.Identity()

        with _on_device(device):  # the operators' parameters and caches (no factory arguments of their own)
            groups = parse_heads(heads, num_heads)
            entries = (heads,) if isinstance(heads, DiffusionOperator) else heads if (
                isinstance(heads, Sequence) and not isinstance(heads, (str, bytes, bytearray))) else ()
            given = {id(h) for h in entries if isinstance(h, DiffusionOperator)}
            for g in groups:  # then in dtype as .to(dtype) makes them; given instances moved as well
                _cast_part(g.operator, device, dtype, given=id(g.operator) in given)
            self.operators = nn.ModuleList([g.operator for g in groups])
            self._groups: list[tuple[int, int]] = [(g.start, g.count) for g in groups]
            self._scale = self.head_dim**-0.5
            self._refresh_plan()  # parameters made by an operator's bind follow qkv's device and dtype
        if self.dropout > 0.0:  # operators that cannot take dropout on P say so now
            for op in self.operators:
                op.check_attention_dropout(self.dropout)
        self.register_load_state_dict_post_hook(_materialise_operator_caches)

    # ------------------------------------------------------------------ per-layer plan
    def _refresh_plan(self) -> None:
        """:meth:`_make_plan`, marked as running: binding an operator may list the layer's parameters (the device and
        dtype of a parameter-free ``qkv`` are the layer's), which must not plan again
        (:meth:`_bind_replaced_operators`)."""
        self.__dict__["_planning"] = True
        try:
            self._make_plan()
        finally:
            self.__dict__["_planning"] = False

    def _make_plan(self) -> None:
        """Derive everything a call needs from the operators, once (again when ``operators`` changed).

        Sets ``_polynomial``, ``max_degree``, ``_degrees`` (per head), ``_static_coefficients``
        (Python floats, validated here once, or ``None``), and the flags of :meth:`forward`:
        ``_has_context`` (context operators, resolved by ``ops.rivals.apply_context_groups``), ``_reads_first_values``
        (operators that read the first layer's values from a ``LayerState``),
        ``_need_weights`` (non-polynomial heads that apply a matrix to ``P``; ``_matrix_groups``: their
        ``(operator, start, count)``, ``_matrix_heads``: their head indices), ``_sparse_unsupported``
        (the first operator without a sparse back-end, as a message names it) and ``_affine_runs`` (``None``, or
        the runs of :func:`~diffusionformer.ops.engine.affine_runs` when every head is a fixed ``a I + b P``: the
        layer's fused path). ``_plan_key`` records the operators this plan was made for.
        """
        ops = tuple(self.operators)
        if len(ops) != len(self._groups):
            raise ValueError(f"operators: expected {len(self._groups)} operators, one per head group "
                             f"{self._groups} (start, count), got {len(ops)}")
        for op, (_, count) in zip(ops, self._groups):
            if not isinstance(op, DiffusionOperator):
                raise TypeError(f"operators: expected DiffusionOperator modules, got {type(op).__name__}")
            if op.num_heads not in (1, count):
                raise ValueError(f"operators: operator {_label(op)} has num_heads={op.num_heads} but covers {count} "
                                 "heads")
            # operators whose parameters depend on the head width (differential attention) get it here;
            # their capability flags (second map, layer state, re-projection, uniform map) are resolved in
            # forward by the one context dispatch (diffusionformer.ops.rivals.apply_context_groups)
            before = {id(t) for t in op.parameters()}
            # outside inference mode: an operator first bound by a call under torch.inference_mode got inference
            # tensors as parameters, which no later training step could use
            with torch.inference_mode(False):
                op.bind(head_dim=self.head_dim)
                if any(id(t) not in before for t in op.parameters()):
                    # parameters made by bind (differential attention's): on the layer's device and in its dtype, as
                    # if they had been there when the layer was cast (a float64 or CUDA layer got float32 CPU ones)
                    weight = _stored_weight(self.qkv, owner=self)
                    op.to(device=weight.device, dtype=weight.dtype)
            if op.needs_second_map and getattr(self, "rotary", None) is not None and self.head_dim % 4:
                # the two maps split each head's q and k into halves; RoPE rotates channel pairs (2i, 2i+1), so with
                # head_dim = 2 (mod 4) one pair straddles the halves and no map's scores depend on n - m alone
                raise ValueError(
                    f"operator {_label(op)} splits each head's queries and keys into two halves of width "
                    f"{self.head_dim // 2}, and the rotary embedding rotates channel pairs (2i, 2i+1): with "
                    f"head_dim={self.head_dim} a pair straddles the halves and the scores lose RoPE's relative "
                    "positions; use a head_dim divisible by 4")
            if op.uses_context and op.is_polynomial:
                flags = [f for f in ("needs_second_map", "needs_layer_state", "reprojects_each_step", "needs_uniform_map")
                         if getattr(op, f)]
                raise ValueError(
                    f"operator {_label(op)} declares {', '.join(flags)} but is_polynomial=True: an operator with "
                    "capability flags is applied through apply_context(ctx) and must set is_polynomial = False"
                )
        counts = [c for _, c in self._groups]
        self._polynomial = [op.is_polynomial for op in ops]
        self.max_degree = max((0, *(_checked_degree(op) for op in ops if op.is_polynomial)))  # not default=: dynamo refuses it
        degrees: list[int] = []
        for op, count in zip(ops, counts):
            degrees += [op.degree if op.is_polynomial else 0] * count
        self._degrees = tuple(degrees)
        # Fixed coefficients (attention, Laplacian, fixed heat/PPR) are handed to the functional
        # API as Python floats: static coefficients let it take the fused path (one attention
        # call and an in-place combination for degree <= 1) without reading a device tensor.
        static = [_static_row(op) for op in ops]
        self._static_coefficients: tuple[tuple[float, ...], ...] | None = None
        if all(s is not None for s in static) and all(self._polynomial):
            rows: list[tuple[float, ...]] = []
            for s, count in zip(static, counts):
                assert s is not None
                rows += [s + (0.0,) * (self.max_degree + 1 - len(s))] * count
            self._static_coefficients = tuple(rows)
            # validated here, once: every call hands the same tuples to the engine
            static_coefficients(self._static_coefficients, self.num_heads)
            check_degrees(self._degrees, self.num_heads, self.max_degree)
        self._has_context = any(op.uses_context for op in ops)
        self._reads_first_values = any(op.needs_layer_state for op in ops)  # NeuTRENO's v0, ResFormer's V_1
        self._need_weights = any(not op.is_polynomial and not op.uses_context for op in ops)
        # the heads that apply a matrix function to a materialised P (heat-exact, ppr-exact): only these build P
        self._matrix_groups: tuple[tuple[DiffusionOperator, int, int], ...] = tuple(
            (op, s, c) for op, (s, c) in zip(ops, self._groups) if not op.is_polynomial and not op.uses_context)
        self._matrix_heads: tuple[int, ...] = tuple(h for _, s, c in self._matrix_groups for h in range(s, s + c))
        # a function of a materialised P (neither polynomial nor context) needs a dense P whatever supports_sparse
        # says: on edges its heads would receive the engine's 0
        self._sparse_unsupported = next((_label(op) for op in ops if not op.supports_sparse or (
            not op.is_polynomial and not op.uses_context)), None)
        self._affine_runs: tuple[AffineRun, ...] | None = None
        if self._static_coefficients is not None and self.max_degree <= 1:
            c0, c1 = affine_coefficients(self._static_coefficients, self._degrees)
            self._affine_runs = affine_runs(c0, c1)
        # With learned coefficients somewhere: the heads whose operator is a fixed c0 I + c1 P (attention,
        # Laplacian) and the heads that receive 0 from the engine (non-polynomial) take the affine path in the
        # input dtype; only the others run the float32 loop (ops.dense._split_paths)
        self._affine_heads: tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]] | None = None
        if self._static_coefficients is None:
            heads: list[int] = []
            c0s: list[float] = []
            c1s: list[float] = []
            for op, (start, count), st in zip(ops, self._groups, static):
                if not op.is_polynomial:
                    row = (0.0, 0.0)
                elif st is not None and op.degree <= 1:
                    row = (st[0], st[1] if op.degree == 1 else 0.0)
                else:
                    continue
                heads += range(start, start + count)
                c0s += [row[0]] * count
                c1s += [row[1]] * count
            if heads and len(heads) < self.num_heads:
                static_coefficients(tuple(zip(c0s, c1s)), len(heads))  # finite: validated once
                self._affine_heads = (tuple(heads), tuple(c0s), tuple(c1s))
        self._coefficient_segments = _coefficient_segments(ops, self._groups, static, self.max_degree)
        self._plan_key = ops

    def _check_plan(self) -> None:
        """Refresh the plan when the operators were replaced (``layer.operators[i] = op``) since it was made.

        One thread refreshes; the others wait for its plan (eval calls of one layer from several threads): each
        refreshing at once, one call ran while another had bound only half an operator (differential attention's
        ``head_dim`` set, its ``lambda_*`` not yet made: an AttributeError) or had reset a plan attribute to ``None``.
        """
        if tuple(self._modules["operators"]._modules.values()) != self._plan_key:
            if torch.compiler.is_compiling():  # dynamo traces no lock (nor another thread): a graph break otherwise
                self._refresh_plan()
                return
            with _PLAN_LOCK:
                if tuple(self._modules["operators"]._modules.values()) != self._plan_key:
                    self._refresh_plan()

    def _bind_replaced_operators(self) -> None:
        """:meth:`_check_plan` before the layer's modules, parameters or state are listed (``parameters()``,
        ``state_dict()``, ``load_state_dict()``, of the layer or of a model holding it): an operator put into
        ``layer.operators`` that makes its parameters when bound (differential attention's ``lambda_*`` and
        ``subln``) had none until the next call, so an optimizer built from ``model.parameters()`` before it never
        trained them, ``state_dict()`` left them out and loading the layer's own state dict raised "Unexpected
        key(s)". Operators the layer cannot run are left to :meth:`forward` (and ``heads_spec``), which raise the
        layer's error: listing a model's modules (``print``, ``parameters()``) does not."""
        if self.__dict__.get("_planning") or "_plan_key" not in self.__dict__ or "operators" not in self._modules:
            return  # inside __init__, or listed by the plan being made
        if tuple(self._modules["operators"]._modules.values()) == self._plan_key:
            return
        try:
            self.__dict__["_planning"] = True  # a parameter-free qkv: the layer's own tensors are listed
            try:
                device = _stored_weight(self.qkv, owner=self).device
            finally:
                self.__dict__["_planning"] = False
            with torch.device(device):  # the layer's, whatever device context the listing runs under
                self._check_plan()
        except Exception:  # noqa: BLE001 - reported by the next call, with the layer's message
            pass

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if "_coefficient_segments" not in self.__dict__:
            # pickled whole (torch.save(model)) before the plan had it: its operators are the plan's, so nothing
            # remade it and a layer with learned and fixed operators raised AttributeError; remade at the next call
            self.__dict__["_plan_key"] = None

    def named_modules(self, memo: set[nn.Module] | None = None, prefix: str = "",  # type: ignore[override]
                      remove_duplicate: bool = True):
        # every listing of parameters, buffers and modules goes through here (a parent's recursion included)
        self._bind_replaced_operators()
        return super().named_modules(memo, prefix, remove_duplicate)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        self._bind_replaced_operators()  # called before the children's state is written
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
        self._bind_replaced_operators()  # called before the children are loaded
        super()._load_from_state_dict(state_dict, prefix, *args)

    def reset_parameters(self) -> None:
        """Initialise the layer's parameters again, in place, as its constructor did: the projections (and
        ``qk_norm``'s LayerNorms) by their own ``reset_parameters``, then every operator's learned parameters
        (:meth:`~diffusionformer.operators.DiffusionOperator.reset_parameters`), in the order the constructor
        drew them: under one seed the values of a layer built anew. Parameters keep their identity (an
        optimizer holding them goes on).
        """
        _reset_children(self, type(self).__name__)

    # ------------------------------------------------------------------ construction helpers
    @property
    def head_groups(self) -> list[HeadGroup]:
        """The operator of each run of heads, in head order."""
        return [HeadGroup(op, s, c) for op, (s, c) in zip(self.operators, self._groups)]

    @property
    def head_operator_names(self) -> list[str]:
        """One operator name per head."""
        names: list[str] = []
        for op, (_, count) in zip(self.operators, self._groups):
            names += [op.name] * count
        return names

    @classmethod
    def from_multihead_attention(cls, mha: nn.MultiheadAttention, heads: Any = None, **kwargs: Any) -> "DiffusionAttention":
        """A layer with the weights of a :class:`torch.nn.MultiheadAttention` (its self-attention ``mha(x, x, x)``).

        The layer comes in the module's mode (``mha.training``: an ``eval()`` module gives a layer that drops no
        attention entries, and whose dropout is checked against its heads, as ``ppr-exact``'s ``dropout < alpha``,
        only once it trains) and takes ``(B, N, D)`` inputs, as a ``batch_first`` module; for
        ``batch_first=False`` (inputs ``(N, B, D)``), whose weights are the same, call it on ``x.transpose(0, 1)``.
        Its parameters are copies that require gradients whatever the module's (``requires_grad_(False)`` the
        layer to keep a frozen module frozen).

        Examples:
            >>> mha = nn.MultiheadAttention(8, 2, batch_first=True)
            >>> attn = DiffusionAttention.from_multihead_attention(mha)
            >>> x = torch.randn(1, 3, 8)
            >>> torch.allclose(attn(x), mha(x, x, x, need_weights=False)[0], atol=1e-6)
            True
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"expected nn.MultiheadAttention, got {type(mha).__name__}")
        came = [f"kdim={mha.kdim}, vdim={mha.vdim}, embed_dim={mha.embed_dim}"] * (not mha._qkv_same_embed_dim)
        came += ["add_bias_kv=True"] * (mha.bias_k is not None) + ["add_zero_attn=True"] * bool(mha.add_zero_attn)
        if came:  # the layer attends over one x with q | k | v from one projection: no extra key or value
            raise ValueError("only MultiheadAttention with kdim == vdim == embed_dim, no bias_k/bias_v, "
                             "no add_zero_attn converts (the layer is self-attention on one input), "
                             f"got {'; '.join(came)}")
        _check_copied_kwargs(kwargs, "from_multihead_attention", "nn.MultiheadAttention", mha.num_heads)
        bias = mha.in_proj_bias is not None
        p = mha.dropout if mha.training else 0.0  # an eval() module's dropout: checked once the layer trains
        layer = cls(mha.embed_dim, mha.num_heads, heads, bias=bias, dropout=p, **kwargs)
        layer.dropout = float(mha.dropout)  # (ppr-exact refuses dropout >= alpha, which does not apply in eval)
        layer = layer.to(mha.in_proj_weight.device, mha.in_proj_weight.dtype)
        with torch.no_grad():
            layer.qkv.weight.copy_(mha.in_proj_weight)
            layer.out_proj.weight.copy_(mha.out_proj.weight)
            if bias:
                layer.qkv.bias.copy_(mha.in_proj_bias)
                layer.out_proj.bias.copy_(mha.out_proj.bias)
        return layer.train(mha.training)  # a layer built anew trains: an eval() module's dropout stayed on

    @classmethod
    def from_transformer_conv(cls, conv: nn.Module, heads: Any = None, **kwargs: Any) -> "DiffusionAttention":
        """A layer with the weights of PyG's ``TransformerConv(D, C, heads=H, root_weight=False)``.

        ``TransformerConv`` has no output projection: the returned layer's ``out_proj`` is the
        identity, so its output equals the convolution's concatenated heads (``concat=False``,
        the mean of the heads, converts with one head, where it is that head). The layer comes in
        the convolution's mode (``conv.training``), as :meth:`from_multihead_attention`'s, and its
        parameters require gradients whatever the convolution's.
        """
        _import_pyg()
        from torch_geometric.nn import TransformerConv

        if not isinstance(conv, TransformerConv):
            raise TypeError(f"expected torch_geometric.nn.TransformerConv, got {type(conv).__name__}")
        came = [f"{name}={value!r}" for name, value, maps in (
            # concat=False averages the heads: over one head, the head itself
            ("concat", conv.concat or conv.heads == 1, True), ("root_weight", conv.root_weight, False),
            ("beta", conv.beta, False), ("edge_dim", conv.edge_dim, None)) if value != maps]
        if came:  # the settings named, as from_multihead_attention names what does not convert
            raise ValueError("only TransformerConv(concat=True, root_weight=False, beta=False, edge_dim=None) maps to "
                             f"DiffusionAttention (concat=False too with heads=1), got {', '.join(came)}")
        H, C = conv.heads, conv.out_channels
        D = H * C
        for lin in (conv.lin_query, conv.lin_key, conv.lin_value):
            # a lazy conv (in_channels=-1) has no weights yet; a bipartite one ((in_src, in_dst)) may differ per side
            if isinstance(lin.weight, nn.parameter.UninitializedParameter):
                raise ValueError(f"TransformerConv in_channels={conv.in_channels!r} is lazy: its weights are not "
                                 "initialised yet (run the conv once, or give in_channels)")
            if lin.weight.shape[1] != D:
                raise ValueError(f"TransformerConv in_channels={conv.in_channels!r} must equal heads*out_channels "
                                 f"({D}) for the queries, keys and values alike (one x feeds all three)")
        _check_copied_kwargs(kwargs, "from_transformer_conv", "TransformerConv", H)
        bias = conv.lin_query.bias is not None
        p = conv.dropout if conv.training else 0.0  # as in from_multihead_attention
        layer = cls(D, H, heads, bias=bias, dropout=p, **kwargs)
        layer.dropout = float(conv.dropout)
        layer = layer.to(conv.lin_query.weight.device, conv.lin_query.weight.dtype)
        with torch.no_grad():
            layer.qkv.weight.copy_(torch.cat([conv.lin_query.weight, conv.lin_key.weight, conv.lin_value.weight]))
            layer.out_proj.weight.copy_(torch.eye(D))
            if bias:
                layer.qkv.bias.copy_(torch.cat([conv.lin_query.bias, conv.lin_key.bias, conv.lin_value.bias]))
                layer.out_proj.bias.zero_()
        return layer.train(conv.training)

    # ------------------------------------------------------------------ coefficients
    def coefficients(self) -> Tensor:
        """Weights on ``P^0 .. P^K`` of every head, ``(H, K+1)`` (NaN rows for non-polynomial heads)."""
        self._check_plan()
        c = self._coefficients(nan_for_nonpolynomial=True)
        # one segment: the layer's cached tensor (engine.static_tensor), or an operator's own coefficients() (its
        # parameter or buffer, when neither cast nor padded), which the caller may write to: a copy
        return c.clone() if len(self._coefficient_segments) == 1 else c

    def _coefficients(self, nan_for_nonpolynomial: bool = False) -> Tensor:
        K = self.max_degree
        parts = []
        # its device and dtype (a parametrized weight is not computed for them; a quantized qkv gives the layer's)
        ref = _stored_weight(self.qkv, owner=self)
        work = torch.float64 if ref.dtype == torch.float64 else torch.float32
        for segment in self._coefficient_segments:
            if isinstance(segment, _StaticRows):
                # fixed operators' rows (zeros or NaN for non-polynomial heads) from their Python floats: one tensor
                # per run of groups, built once per device and dtype (engine.static_tensor), not cast, padded and
                # concatenated per operator at every call
                if not ref.is_meta:
                    for op in segment.ops:  # as when their coefficients() were read: a meta base of functional_call
                        if op.is_polynomial and any(b.is_meta for b in op._buffers.values() if b is not None):
                            raise _meta_caches_error(op, ref)
                parts.append(static_tensor(segment.nan if nan_for_nonpolynomial else segment.zero, ref.device, work))
                continue
            op, start, count = segment
            c = op.head_coefficients(count)
            if c.is_meta and not ref.is_meta:
                raise _meta_caches_error(op, ref)
            if c.shape[1] > op.degree + 1:  # F.pad below would drop P^(K+1).. silently
                raise ValueError(f"{type(op).__name__}.coefficients() must have degree + 1 = {op.degree + 1} "
                                 f"columns, got shape {tuple(c.shape)}")
            planned = self._degrees[start]
            if c.shape[1] > planned + 1:
                # the operator's degree grew in place (a user's `op.steps = 4` and a longer parameter) since the
                # plan: F.pad below dropped the powers past the layer's degree, or the engine those past the
                # heads' planned degree, silently
                raise ValueError(
                    f"{type(op).__name__}.coefficients() has degree {c.shape[1] - 1}, but the layer planned its "
                    f"heads {list(range(start, start + count))} for degree {planned}, the operator's degree when "
                    "the layer took it; an operator's degree is fixed while it serves a layer: put a new operator "
                    "in (layer.operators[i] = op), which the layer plans for anew")
            c = c.to(device=ref.device, dtype=work)
            parts.append(F.pad(c, (0, K - c.shape[1] + 1)) if c.shape[1] <= K else c)
        # one part: a learned operator's rows (its coefficients() itself when neither cast nor padded), or the cached
        # tensor of an all-fixed layer (coefficients() copies either)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        x: Tensor,
        graph: AttentionGraph | Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        edge_index: Tensor | None = None,
        is_causal: bool = False,
        return_intermediates: bool = False,
        state: _rivals.LayerState | None = None,
        positions: Tensor | None = None,
        cache: Any = None,
    ) -> Tensor | tuple[Tensor, AttentionIntermediates]:
        """Apply the layer over the token graph ``graph`` (dense or sparse).

        The graph is the one structural argument: ``attn(x, graph)``. The keyword arguments
        ``key_padding_mask``, ``attn_mask``, ``is_causal`` (dense) and ``edge_index`` (sparse)
        are shorthands that build the graph (:meth:`graph_from_arguments`); without any of
        them the graph is complete (causal for a ``causal=True`` layer).

        Args:
            x: tokens ``(B, N, D)`` (dense) or nodes ``(N, D)`` (sparse).
            graph: an :class:`~diffusionformer.graph.AttentionGraph` (or any object with an
                ``attention_kwargs(x)`` method returning some of ``key_padding_mask``,
                ``attn_mask``, ``edge_index``, ``is_causal``), or an integer ``(2, E)`` tensor read
                as ``edge_index`` (PyG's ``conv(x, edge_index)``, so the layer works in
                :class:`torch_geometric.nn.Sequential` and loops over PyG convolutions); exclusive
                with the shorthands.
            key_padding_mask: ``(B, N)`` bool, True marks padding (dense only). A fully padded
                sequence gives finite output.
            attn_mask: extra dense mask with SDPA semantics (bool True = attend, or additive float).
            edge_index: ``(2, E)`` edges ``(source j, target i)`` for the sparse back-end.
            is_causal: position ``i`` attends to ``j <= i`` only (dense; the layer's ``causal``
                flag applies in any case).
            return_intermediates: also return :class:`AttentionIntermediates` (materialises ``P``).
            state: a :class:`~diffusionformer.ops.rivals.LayerState` shared by the layers of one
                model call: the first layer leaves its values there for operators that need them
                (NeuTRENO, value residuals) and each layer learns its depth.
            positions: token positions for ``rotary`` (``(N,)``, or ``(N, 2)`` for 2-D RoPE);
                ``None`` = ``0 .. N-1`` (1-D), or continuing after the cache. A layer without
                ``rotary`` refuses them (``ValueError``) rather than ignore them.
            cache: a :class:`~diffusionformer.nn.kv_cache.LayerKVCache` for incremental causal
                decoding: ``x`` holds the new tokens only, the cache the earlier ones (dense,
                causal layers; it is updated in place; no graph or masks; ``state`` as above).

        Returns:
            the output, or ``(output, intermediates)`` when ``return_intermediates``.

        A call that raises leaves ``state`` as it found it (the depth and the first layer's values), so the state
        of a model call that failed in a layer can be used again. A call that recomputes this layer's call
        inside the backward pass (:func:`torch.utils.checkpoint`) sees the state as that call found it (see
        :class:`~diffusionformer.ops.rivals.LayerState`).
        """
        if state is not None and not isinstance(state, _rivals.LayerState):
            raise TypeError(f"state must be a LayerState or None, got {type(state).__name__}")
        if state is None:
            return self._forward_routed(x, graph, key_padding_mask, attn_mask, edge_index, is_causal,
                                        return_intermediates, None, positions, cache)
        # reentrant checkpointing recomputing the layer that recorded the first values without autograd, values a layer
        # outside the checkpoint read with autograd on: their gradient was lost (_lost_first_values_gradient)
        if state._first_owner is self and torch.is_grad_enabled() and state._first_read and state._first_grad is False \
                and torch._C._current_graph_task_id() != -1:
            raise _lost_first_values_gradient()
        # the layer enters the state (depth + 1, and the first layer's values) before the checks and computations
        # that may raise: a failed call moved the state on, and the next layer read a depth one too far
        # layers whose operators read the state (depth, first values) record their calls in eager mode (a compiled
        # graph recomputes a checkpoint itself), so that a recomputation sees what the first call saw; the others
        # keep their host time (a recomputed plain layer moves the state on, which no recorded layer reads)
        eager = not torch.compiler.is_compiling()
        track = self._has_context and eager
        replay = state._recomputing(self) if track else None
        if replay is not None:  # torch.utils.checkpoint recomputing this layer: as its first call, state unmoved
            return self._forward_routed(x, graph, key_padding_mask, attn_mask, edge_index, is_causal,
                                        return_intermediates, replay, positions, cache)
        depth, first_values = state.depth, state.first_values
        try:
            out = self._forward_routed(x, graph, key_padding_mask, attn_mask, edge_index, is_causal,
                                       return_intermediates, state, positions, cache)
        except BaseException:
            state.depth, state.first_values = depth, first_values
            raise
        if track:
            state._calls = (*state._calls, (self, depth, first_values, torch.is_grad_enabled()))
        if not eager:  # a compiled graph recomputes a checkpoint itself
            return out
        if first_values is None:
            if state.first_values is not None:  # this call recorded them: its layer and grad mode, for the check above
                state._first_owner, state._first_grad = self, torch.is_grad_enabled()
        elif self._reads_first_values and torch.is_grad_enabled():
            state._first_read = True
        return out

    def _forward_routed(
        self, x: Tensor, graph: AttentionGraph | Tensor | None, key_padding_mask: Tensor | None, attn_mask: Tensor | None,
        edge_index: Tensor | None, is_causal: bool, return_intermediates: bool, state: _rivals.LayerState | None,
        positions: Tensor | None, cache: Any,
    ) -> Tensor | tuple[Tensor, AttentionIntermediates]:
        """:meth:`forward`'s routing to the dense, sparse, affine or cached path (``state``'s type checked there)."""
        if tuple(self._modules["operators"]._modules.values()) != self._plan_key:  # _check_plan's test, inlined
            self._check_plan()
        if not isinstance(x, Tensor):
            raise _not_a_tensor(x, "")
        # a nested (jagged) batch failed inside torch ("unsupported: NestedIntNode", "No viable backend")
        _check_strided("x", x, "pass x.to_dense()")
        if not x.is_floating_point():
            raise TypeError(f"x must be floating point, got {x.dtype}")
        if x.shape[-1:] != (self.dim,):
            raise ValueError(f"x must have last dimension dim={self.dim}, got shape {tuple(x.shape)}")
        if positions is not None and self.rotary is None:
            raise ValueError("positions= places the tokens for a rotary embedding, and this layer has none "
                             "(build it with rotary=RotaryEmbedding(...)); positions would be ignored")
        if cache is not None:
            from diffusionformer.nn.kv_cache import attend_cached

            if (graph is not None or key_padding_mask is not None or attn_mask is not None or edge_index is not None
                    or is_causal or return_intermediates):
                raise ValueError("cache= runs causal decoding on dense tokens; it takes no graph, masks or "
                                 "return_intermediates")
            return attend_cached(self, x, cache, positions, state)
        if isinstance(graph, Tensor):  # PyG's conv(x, edge_index): the tensor is the edge_index shorthand
            if key_padding_mask is not None or attn_mask is not None or edge_index is not None or is_causal:
                raise ValueError("a tensor given as graph is read as edge_index: pass it, or the shorthands "
                                 "key_padding_mask/attn_mask/edge_index/is_causal, not both")
            # a torch.sparse adjacency first: its float values were refused as "a mask goes by attn_mask="
            _check_strided("edge_index", graph, _SPARSE_ADJACENCY_FIX)
            if graph.is_floating_point() or graph.is_complex() or graph.dtype == torch.bool:
                raise TypeError(f"a tensor given as graph is read as edge_index, (2, E) integer node indices "
                                f"(PyG's conv(x, edge_index)), got dtype {graph.dtype}; a mask goes by attn_mask= "
                                "or key_padding_mask=")
            if x.dim() != 2:  # else "sparse input x must have shape (N, D)", not saying the tensor was read as edges
                raise ValueError(f"a tensor given as graph is read as edge_index, (2, E) node indices for nodes x of "
                                 f"shape (N, D), got x of shape {tuple(x.shape)} and a graph tensor of shape "
                                 f"{tuple(graph.shape)}; a dense mask goes by attn_mask= or key_padding_mask=")
            graph, edge_index = None, graph
        if graph is None:
            if key_padding_mask is None and attn_mask is None and edge_index is None and not is_causal:
                # the complete graph (causal when the layer is): nothing to build or to mask
                if not return_intermediates and x.dim() == 3 and self._fused_affine_path(x):
                    # what _forward_dense would decide, without its frame
                    return self._forward_affine(x, self.causal, self._call_dropout(), state, positions)
                return self._forward_dense(x, None, None, return_intermediates, state=state, positions=positions)
            if edge_index is None and x.dim() == 3 and 0 in x.shape[:2]:
                # no sequences (or no tokens): an AttentionGraph needs B, N >= 1, yet the call without the shorthands
                # runs; the masks are checked as for any other x (by _forward_dense)
                _check_is_causal(is_causal)
                # the masks on x's device, as the graph hands them over (attention_kwargs) for B, N >= 1
                key_padding_mask = _on_device_of_x(key_padding_mask, "key_padding_mask", x)
                attn_mask = _on_device_of_x(attn_mask, "attn_mask", x)
                return self._forward_dense(x, key_padding_mask, attn_mask, return_intermediates, is_causal, state,
                                           positions)
            if (edge_index is not None and x.dim() == 2 and x.shape[0] == 0 and key_padding_mask is None
                    and attn_mask is None and is_causal is False):
                # no node: an AttentionGraph needs num_nodes >= 1 ("num_nodes must be >= 1", an argument the call
                # never gave), yet the kernel maps no node to none, as the dense path above does no token; it checks
                # edge_index (integer, (2, E), every edge out of range when N = 0)
                return self._forward_sparse(x, edge_index, return_intermediates, state, positions)
            graph = self.graph_from_arguments(x, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                                              edge_index=edge_index, is_causal=is_causal)
        elif key_padding_mask is not None or attn_mask is not None or edge_index is not None or is_causal:
            raise ValueError("pass either graph= or key_padding_mask/attn_mask/edge_index/is_causal, not both")
        if not hasattr(graph, "attention_kwargs"):
            raise TypeError(f"graph must be an AttentionGraph, got {type(graph).__name__}")
        given = graph.attention_kwargs(x)
        unknown = set(given) - {"key_padding_mask", "attn_mask", "edge_index", "is_causal"}
        if unknown:
            raise TypeError(f"graph.attention_kwargs returned unknown keys {sorted(unknown)}")
        if given.get("edge_index") is not None:
            return self._forward_sparse(x, given["edge_index"], return_intermediates, state, positions)
        return self._forward_dense(x, given.get("key_padding_mask"), given.get("attn_mask"), return_intermediates,
                                   bool(given.get("is_causal", False)), state, positions)

    def graph_from_arguments(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        edge_index: Tensor | None = None,
        is_causal: bool = False,
    ) -> AttentionGraph:
        """The :class:`~diffusionformer.graph.AttentionGraph` that :meth:`forward`'s shorthands describe.

        ``edge_index`` gives a sparse graph over the ``N`` rows of ``x`` (its bounds are
        checked once, by the kernel: ``checked=False``); otherwise a dense graph over
        ``x``'s ``B`` sequences of ``N`` tokens.

        Examples:
            >>> attn = DiffusionAttention(8, 2)
            >>> attn.graph_from_arguments(torch.zeros(2, 3, 8), is_causal=True)
            AttentionGraph(dense, B=2, N=3, causal=True)
            >>> attn.graph_from_arguments(torch.zeros(3, 8), edge_index=torch.tensor([[0, 1], [1, 2]]))
            AttentionGraph(sparse, num_nodes=3, E=2, checked=False)
        """
        _check_is_causal(is_causal)
        if edge_index is not None:
            if key_padding_mask is not None or attn_mask is not None or is_causal:
                raise ValueError("key_padding_mask/attn_mask/is_causal apply to dense inputs; the sparse graph is "
                                 "given by edge_index (use DiffusionAttention(causal=True) for causal edges)")
            if x.dim() != 2:
                raise ValueError(f"sparse input x must have shape (N, D), got {tuple(x.shape)}")
            return AttentionGraph.sparse(edge_index, x.shape[0], checked=False)
        if x.dim() != 3:
            raise ValueError(f"dense input x must have shape (B, N, D), got {tuple(x.shape)}; pass edge_index for (N, D) node inputs")
        return AttentionGraph.dense(x.shape[1], batch_size=x.shape[0], key_padding_mask=key_padding_mask,
                                    causal=is_causal, attn_mask=attn_mask)

    def _project(self, x: Tensor, positions: Tensor | None = None, expand: bool = True,
                 transform: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """``q``, ``k``, ``v`` ``(..., N, H|H_kv, C)``: the projection, then (``transform``) q/k norm and rotary;
        ``expand`` repeats the key/value heads over their query groups (GQA)."""
        H, C, G = self.num_heads, self.head_dim, self.num_kv_heads
        m = self._modules
        qkv = m["qkv"](x)
        # one split size when H_kv = H (aten ``split``, as nanoGPT), else the three sizes
        q, k, v = qkv.split(H * C, dim=-1) if G == H else qkv.split([H * C, G * C, G * C], dim=-1)
        if x.dim() == 3:  # (B, N, D), the layers' usual input: the sizes spelled out (fewer Python operations)
            B, N, _ = x.shape
            q, k, v = q.view(B, N, H, C), k.view(B, N, G, C), v.view(B, N, G, C)
        else:
            lead = x.shape[:-1]
            q, k, v = q.view(*lead, H, C), k.view(*lead, G, C), v.view(*lead, G, C)  # (..., N, H|G, C)
        if transform and not (self.rotary is None and is_noop(m["q_norm"]) and is_noop(m["k_norm"])):
            q, k = self._transform_qk(q, k, positions)
        if expand and G != H:  # grouped-query attention: query head h reads key/value head h // (H / G)
            k, v = k.repeat_interleave(H // G, dim=-2), v.repeat_interleave(H // G, dim=-2)
        return q, k, v

    def _transform_qk(self, q: Tensor, k: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The layer's q/k norm, then its rotary embedding; ``q``, ``k`` ``(..., N, heads, C)``.

        Without ``qk_norm`` the norms are hook-free ``nn.Identity`` modules and are skipped
        (:func:`~diffusionformer.nn._skip.is_noop`)."""
        q_norm, k_norm = self._modules["q_norm"], self._modules["k_norm"]
        if not is_noop(q_norm):
            q = q_norm(q)
        if not is_noop(k_norm):
            k = k_norm(k)
        if self.rotary is not None:
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        return q, k

    def _dense_mask(self, x: Tensor, key_padding_mask: Tensor | None, attn_mask: Tensor | None) -> Tensor | None:
        """``attn_mask`` with the key padding folded in (validated once, by :func:`~diffusionformer.functional.diffuse`)."""
        B, N, _ = x.shape
        mask = attn_mask
        if attn_mask is not None:  # type and dtype checked before the padding is folded in (shape: by diffuse)
            if not isinstance(attn_mask, Tensor):
                raise TypeError(f"attn_mask must be a tensor or None, got {type(attn_mask).__name__}")
            if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
                raise TypeError(f"attn_mask must be bool (True = attend) or floating point, got {attn_mask.dtype}")
            _check_mask_shape(attn_mask, (B, self.num_heads, N, N))  # the shape given, before the padding widens it
        if key_padding_mask is not None:
            if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
                raise TypeError("key_padding_mask must be a bool tensor (True = padding), got "
                                + (str(key_padding_mask.dtype) if isinstance(key_padding_mask, Tensor)
                                   else type(key_padding_mask).__name__))
            if key_padding_mask.shape != (B, N):
                raise ValueError(f"key_padding_mask must have shape (B, N) = {(B, N)}, got {tuple(key_padding_mask.shape)}")
            keep = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, N)
            if mask is None:
                mask = keep
            elif not isinstance(mask, Tensor):
                raise TypeError(f"attn_mask must be a tensor or None, got {type(mask).__name__}")
            else:
                try:
                    mask = mask & keep if mask.dtype == torch.bool else mask.masked_fill(~keep, float("-inf"))
                except RuntimeError:
                    raise ValueError(
                        f"attn_mask must be broadcastable to (B, H, N, M) = {(B, self.num_heads, N, N)}, "
                        f"got shape {tuple(mask.shape)}"
                    ) from None
        return mask

    def _call_coefficients(self, need_weights: bool) -> Tensor | tuple[tuple[float, ...], ...]:
        """Static coefficients as Python floats when the layer has them, else the ``(H, K+1)`` tensor."""
        if self._static_coefficients is not None and not need_weights:
            return self._static_coefficients
        return self._coefficients()

    def _forward_dense(
        self, x: Tensor, key_padding_mask: Tensor | None, attn_mask: Tensor | None, return_intermediates: bool,
        causal: bool = False, state: _rivals.LayerState | None = None, positions: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, AttentionIntermediates]:
        if x.dim() != 3:
            raise ValueError(f"dense input x must have shape (B, N, D), got {tuple(x.shape)}; pass edge_index for (N, D) node inputs")
        B, N, D = x.shape
        dropout_p = self._call_dropout()
        is_causal = self.causal or causal
        if key_padding_mask is None and attn_mask is None and not return_intermediates and self._fused_affine_path(x):
            return self._forward_affine(x, is_causal, dropout_p, state, positions)
        mask = None if key_padding_mask is None and attn_mask is None else self._dense_mask(x, key_padding_mask, attn_mask)
        q, k, v = self._project(x, positions)  # (B, N, H, C)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, N, C)
        entered = state.enter(v) if state is not None else (0, None)
        if self.backend not in DENSE_BACKENDS:  # a settable attribute, checked as the functional API would
            raise ValueError(f"backend must be one of {DENSE_BACKENDS}, got {self.backend!r}"
                             + _backend_hint(self.backend, DENSE_BACKENDS, (), ""))
        # Heads with a non-polynomial f(P) (heat-exact, ppr-exact) need P; context operators build their own maps.
        # The polynomial heads take the engine's path (fused SDPA, or "auto"'s choice); the non-polynomial heads have
        # degree 0 and zero coefficients there (they receive 0) and P is materialised for them alone, below. All
        # heads share one P when it is returned or when the layer's back-end materialises it anyway ("matrix").
        need_weights = return_intermediates or (self._need_weights and self.backend == "matrix")
        coeffs = self._call_coefficients(need_weights)
        if not isinstance(coeffs, tuple):  # learned coefficients: validated every call (finite on CPU)
            coeffs, _ = check_layout(coeffs, self._degrees, self.num_heads, v)
        # q, k, v, the static coefficients and the degrees are the layer's own (checked once); the mask is checked there.
        # While training, the engine hands back how to form `out` again from what the attention calls keep, so that
        # the output projection need not keep it (diffusionformer.ops.recompute); heads that change `out` after the
        # engine (non-polynomial, context operators) keep it as usual.
        rebuild: list | None = ([] if self.recompute and v.requires_grad and not (self._matrix_groups or self._has_context)
                                and wants_recompute() else None)
        out, P = _dense._diffuse_checked(q, k, v, coeffs, mask, is_causal, self._scale, self.backend, self._degrees,
                                         dropout_p, need_weights, self._affine_heads, rebuild)
        if self._matrix_groups:
            # the full P (B, H, N, N), or (B, H', N, N) for the H' non-polynomial heads alone, in head order
            Pm = P if P is not None else _dense._attention_matrix_heads(q, k, self._matrix_heads, mask, is_causal,
                                                                         self._scale, working_dtype=True)
            at = 0
            for op, s, c in self._matrix_groups:
                Pg = Pm.narrow(1, s if P is not None else at, c)  # float32 for half inputs (the working dtype)
                at += c
                if not op._takes_float32_P:  # else in the input dtype, as attention_matrix returns it
                    Pg = Pg.to(v.dtype)
                if dropout_p > 0.0:  # drawn per group, as before: (B, c, N, N) each
                    op.check_attention_dropout(dropout_p)  # dropout is a settable attribute
                    Pg = F.dropout(Pg, p=dropout_p)
                apply = op.apply_causal_matrix if is_causal else op.apply_matrix  # causal: P lower triangular
                y = _matrix_output(op, apply, Pg, v[:, s : s + c])
                out = out.index_add(1, torch.arange(s, s + c, device=out.device), y)
        if self._has_context:  # operators with capabilities (rivals: second map, layer state, re-projection, uniform map)
            out = _rivals.apply_context_groups(self, out, x, q, k, v, entered=entered, mask=mask, is_causal=is_causal,
                                               dropout_p=dropout_p, positions=positions)
        if rebuild:
            with recompute_saved(out, rebuild[0]):
                y = self.out_proj(out.transpose(1, 2).reshape(B, N, D))  # (B, N, H, C) -> (B, N, D)
        else:
            y = self.out_proj(out.transpose(1, 2).reshape(B, N, D))
        if return_intermediates:
            return y, AttentionIntermediates(P.to(v.dtype), self.coefficients().detach(), None, "matrix")
        return y

    def _call_dropout(self) -> float:
        """Dropout on ``P`` for this call: the attribute in training (settable, so checked when it applies, as
        the functional API would), else 0."""
        dropout_p = self.dropout if self.training else 0.0
        return check_dropout(dropout_p, "dropout") if dropout_p else dropout_p

    def _fused_affine_path(self, x: Tensor) -> bool:
        """Whether a call on the complete (or causal) graph takes :meth:`_forward_affine`: every head is a fixed
        ``a I + b P`` and the back-end is the fused kernel (not ``"matrix"``, ``"triton"``, or ``"auto"`` that
        would try Triton on a CUDA tensor)."""
        backend = self.backend
        return self._affine_runs is not None and (
            backend == "sdpa" or (backend == "auto" and not (_dense.TRITON_IN_AUTO and x.is_cuda)))

    def _forward_affine(self, x: Tensor, is_causal: bool, dropout_p: float, state: _rivals.LayerState | None,
                        positions: Tensor | None) -> Tensor:
        r"""The layer when every head is a fixed :math:`a_h I + b_h P` and the graph is complete (or causal).

        The computation of :func:`~diffusionformer.functional.diffuse`'s affine path (one
        :func:`~torch.nn.functional.scaled_dot_product_attention` call for all heads, then
        :math:`a_h v_h + b_h (P v)_h` by :func:`~diffusionformer.ops.engine.combine_affine` on the heads
        that are not plain attention) without the call's checks: ``q``, ``k``, ``v`` are the layer's
        own projections and the coefficients were validated when the plan was made. The combination
        runs token-major, on the layout the output projection reads, so plain attention costs the
        operations of nanoGPT's attention and nothing else.
        """
        B, N, D = x.shape
        q, k, v = self._project(x, positions)  # (B, N, H, C), key/value heads repeated for GQA
        vt = v.transpose(1, 2)  # (B, H, N, C)
        if state is not None:
            state.enter(vt)
        # (torch's fused kernel; P formed explicitly only for dropout inside torch.vmap: see ops.dense._fused)
        y = _dense._fused(q.transpose(1, 2), k.transpose(1, 2), vt, None, is_causal, self._scale, dropout_p,
                          None).transpose(1, 2)  # (B, N, H, C)
        runs = self._affine_runs
        if not runs:
            return self.out_proj(y.reshape(B, N, D))
        # heads that are not plain attention: a v + b P v; with `recompute`, not kept for the projection's backward
        # but formed again from P v and v (which the attention call keeps anyway; see diffusionformer.ops.recompute)
        v = v if v.dtype == y.dtype else v.to(y.dtype)
        z = combine_affine(y, v, runs)
        if z is y or not self.recompute:  # no autograd history (combined in place), or z kept as autograd would
            return self.out_proj(z.reshape(B, N, D))
        with recompute_saved(z, lambda: combine_affine(y, v, runs, inplace=False)):  # the same operations again
            return self.out_proj(z.reshape(B, N, D))

    def _forward_sparse(self, x: Tensor, edge_index: Tensor, return_intermediates: bool,
                        state: _rivals.LayerState | None = None,
                        positions: Tensor | None = None) -> Tensor | tuple[Tensor, AttentionIntermediates]:
        if x.dim() != 2:
            raise ValueError(f"sparse input x must have shape (N, D), got {tuple(x.shape)}")
        if self._sparse_unsupported is not None:
            raise ValueError(
                f"operator {self._sparse_unsupported} does not support the sparse back-end (it needs a dense P); "
                "use a dense input or a polynomial operator such as 'heat'"
            )
        N, D = x.shape
        q, k, v = self._project(x, positions)  # (N, H, C)
        entered = state.enter(v.transpose(0, 1).unsqueeze(0)) if state is not None else (0, None)
        dropout_p = self._call_dropout()  # the attribute checked by its own name, as on the dense path
        out, alpha = diffuse_sparse_with_weights(
            q, k, v, edge_index, self._call_coefficients(False), num_nodes=N, scale=self._scale,
            degrees=self._degrees, dropout_p=dropout_p, backend="auto",
            is_causal=self.causal, need_weights=return_intermediates,
        )
        if self._has_context:
            out = _rivals.apply_context_groups(self, out, x, q, k, v, entered=entered, edge_index=edge_index,
                                               is_causal=self.causal, dropout_p=dropout_p, positions=positions)
        y = self.out_proj(out.reshape(N, D))
        if return_intermediates:
            assert alpha is not None
            if self.causal:  # the edges the layer attended over
                keep = edge_index[0] <= edge_index[1]
                edge_index, alpha = edge_index[:, keep], alpha[keep]
            return y, AttentionIntermediates(alpha, self.coefficients().detach(), edge_index, "sparse")
        return y

    def extra_repr(self) -> str:
        kv = f", num_kv_heads={self.num_kv_heads}" if self.num_kv_heads != self.num_heads else ""
        try:
            heads = repr(self.heads_spec())
        except (TypeError, ValueError) as exc:  # operators replaced by invalid ones: print(model) must still work
            heads = f"<invalid: {exc}>"
        return (
            f"dim={self.dim}, num_heads={self.num_heads}{kv}, heads={heads}, causal={self.causal}, "
            f"backend={self.backend!r}"
        )

    def heads_spec(self) -> str:
        """The head layout as a spec string that rebuilds the layer's operators, e.g.
        ``'attention:6,heat(t=0.5, steps=4, method='taylor', learnable=True):2'`` (learned values
        live in the state dict). One operator instance with state shared by several heads is
        written with ``num_heads=1``, so the rebuilt layer's state dict has its shapes. One instance given to
        heads that are not adjacent (``[op, "attention", op]``) is written once per run of heads: the rebuilt layer
        holds one operator per run, equal after ``load_state_dict`` but no longer tied (a spec string names no
        instance; keep the module itself, or ``torch.save`` it, to keep the tie). An operator of a
        class never registered is written ``<unregistered module.Class>`` (:meth:`DiffusionOperator.spec
        <diffusionformer.operators.DiffusionOperator.spec>`): named, not rebuildable.

        Raises:
            TypeError, ValueError: ``operators`` was changed into something the layer cannot run (as
                :meth:`forward` raises), instead of a spec that does not describe it.
        """
        self._check_plan()  # a non-operator module had no .spec() (AttributeError); a missing operator was left out
        return ",".join(f"{_group_spec(op, count)}:{count}" for op, (_, count) in zip(self.operators, self._groups))


@dataclass(frozen=True)
class _StaticRows:
    """The rows of a run of consecutive head groups whose coefficients are constants in a layer's plan: fixed
    operators' ``static_coefficients()`` padded to the layer's ``K + 1`` columns, and non-polynomial heads' rows
    (``zero``: what the engine receives for them; ``nan``: what :meth:`DiffusionAttention.coefficients` shows), with
    the ``ops`` they came from."""

    ops: tuple[DiffusionOperator, ...]
    zero: tuple[tuple[float, ...], ...]
    nan: tuple[tuple[float, ...], ...]


def _coefficient_segments(ops: Sequence[DiffusionOperator], groups: Sequence[tuple[int, int]],
                          static: Sequence[tuple[float, ...] | None], K: int
                          ) -> tuple[_StaticRows | tuple[DiffusionOperator, int, int], ...]:
    """How a layer builds its ``(H, K+1)`` coefficients, in head order: :class:`_StaticRows` for each run of groups
    with constant rows (``static``: their ``_static_row``), ``(op, start, count)`` for each learned operator."""
    segments: list[_StaticRows | tuple[DiffusionOperator, int, int]] = []
    for op, (start, count), row in zip(ops, groups, static):
        if op.is_polynomial and row is None:
            segments.append((op, start, count))
            continue
        zero = (row + (0.0,) * (K + 1 - len(row)) if row is not None else (0.0,) * (K + 1),) * count
        nan = zero if row is not None else ((math.nan,) * (K + 1),) * count
        last = segments[-1] if segments else None
        if isinstance(last, _StaticRows):
            segments[-1] = _StaticRows(last.ops + (op,), last.zero + zero, last.nan + nan)
        else:
            segments.append(_StaticRows((op,), zero, nan))
    return tuple(segments)


def _static_row(op: DiffusionOperator) -> tuple[float, ...] | None:
    """A polynomial operator's ``static_coefficients()`` as floats, padded with zeros to ``degree + 1`` entries
    (``None`` when it has none, or is no polynomial). The layer trusts them in place of ``coefficients()``, so they
    are refused naming the operator when they are not finite numbers (else the engine's "coeffs must be finite",
    naming none, or float()'s "could not convert") or too many (the engine would drop ``P^(K+1)..`` silently); a
    degree-1 head beside learned heads read ``c_1`` of a shorter tuple: an IndexError."""
    s = op.static_coefficients() if op.is_polynomial else None
    if s is None:
        return None
    try:  # one-element tensors as their numbers (a tensor of them: float() took them, so they stay accepted)
        items = () if isinstance(s, (str, bytes)) else tuple(
            c.item() if isinstance(c, Tensor) and c.numel() == 1 else c for c in s)
    except TypeError:  # a number, not a tuple
        items = ()
    # numbers only, as the functional API takes static rows: float() read True as 1.0, "1" (or each character of "01")
    # as a number and a NumPy complex as its real part; a nested ((c0, c1),) or a string fails it too
    if not items or not all(isinstance(c, numbers.Real) and not isinstance(c, bool) for c in items):
        raise TypeError(f"operator {_label(op)}: static_coefficients() must return a flat tuple of degree + 1 numbers "
                        f"(c_0, ..., c_K), got {s!r}")
    row = tuple(float(c) for c in items)
    if not all(math.isfinite(c) for c in row):
        raise ValueError(f"operator {_label(op)}: static_coefficients() must return finite numbers (coeffs must be "
                         f"finite), got {s!r}")
    if len(row) > op.degree + 1:
        raise ValueError(f"{type(op).__name__}.static_coefficients() must have degree + 1 = {op.degree + 1} entries, "
                         f"got {len(row)}")
    return row + (0.0,) * (op.degree + 1 - len(row))


def _lost_first_values_gradient() -> RuntimeError:
    """The error of a layer recomputed inside the backward pass with autograd on (reentrant checkpointing) whose
    first call recorded the first layer's values without autograd, values that a layer outside the checkpoint read
    with autograd on: the gradient through them (NeuTRENO's ``v0``, ResFormer's ``V_1``) never reached this layer,
    nor the layers and embeddings before it, and the step's gradients were wrong without a word."""
    return RuntimeError(
        "LayerState: this layer's values, which the later layers read (NeuTRENO, value residuals), were recorded "
        "without autograd by reentrant checkpointing (torch.utils.checkpoint(..., use_reentrant=True)), and a layer "
        "outside the checkpoint read them with autograd on: the gradient through them would be lost; use "
        "use_reentrant=False")


def _not_a_tensor(x: Any, where: str) -> TypeError:
    """The error for a layer's or block's ``x`` that is no tensor; PyG's bipartite pair ``(x_src, x_dst)`` (which
    :func:`torch_geometric.nn.to_hetero` passes for an edge type between two node types) named: "x must be a
    tensor, got tuple" (or a norm's error about a tuple) said nothing of it; nor "got dict" of a ``HeteroData``'s
    ``x_dict``."""
    if isinstance(x, tuple) and len(x) == 2 and all(isinstance(t, Tensor) for t in x):
        return TypeError(f"{where}x must be a tensor, got a pair of tensors (PyG's bipartite (x_src, x_dst), e.g. "
                         "from torch_geometric.nn.to_hetero): the layer diffuses over one node set, P being square; "
                         "merge the node types with data.to_homogeneous()")
    if isinstance(x, dict):  # a HeteroData's x_dict: "got dict" named neither it nor the way out
        return TypeError(f"{where}x must be a tensor, got {_node_types_text(x)}: the layer diffuses over one node "
                         "set; merge the node and edge types with data.to_homogeneous()")
    return TypeError(f"{where}x must be a tensor, got {type(x).__name__}")


def _node_types_text(x: dict) -> str:
    """A HeteroData's ``x_dict`` in an error: ``"a dict of node types ('a', 'b'), as a HeteroData's x_dict"``
    (four names at most, then ``...``), for the layers' and the models' refusals alike."""
    return (f"a dict of node types ({', '.join(map(repr, list(x)[:4]))}{', ...' if len(x) > 4 else ''}), as a "
            "HeteroData's x_dict")


def _meta_caches_error(op: nn.Module, weight: Tensor) -> ValueError:
    """The coefficients of ``op`` on the meta device for weights on ``weight.device``: a layer moved to meta (the
    base of a ``torch.func`` ensemble) called through :func:`torch.func.functional_call` with its state dict's tensors,
    which hold none of the operators' non-persistent caches (else torch's bare "Cannot copy out of meta tensor")."""
    names = [n for n, b in op.named_buffers() if b.is_meta]
    caches = f" (its buffers {', '.join(map(repr, names))} are on meta)" if names else ""
    return ValueError(
        f"the coefficients of operator {_label(op)} are on the meta device but the layer's weights are on "
        f"{weight.device}{caches}: "
        "a layer moved to meta and called through torch.func.functional_call needs every buffer, the operators' "
        "non-persistent caches included, which no state_dict() holds; pass dict(model.named_buffers()) (or the "
        "buffers of torch.func.stack_module_state) with the parameters, or load the state with "
        "load_state_dict(..., assign=True), which rebuilds them")


def _materialise_operator_caches(layer: nn.Module, incompatible_keys: Any) -> None:
    """After ``load_state_dict``: the operators' caches (fixed coefficients, in no state dict) that a layer built
    under ``with torch.device("meta")`` kept on meta through ``assign=True``, rebuilt on the device of its weights
    (an attention or Laplacian head has no state of its own to tell the device), in their precision (float64
    weights assigned to a float32 layer)."""
    weight = _stored_weight(layer.qkv, owner=layer)
    if not weight.is_meta:
        for op in layer.operators:
            op._materialise_caches(weight.device, weight.dtype)


def _check_copied_kwargs(kwargs: dict[str, Any], method: str, source: str, num_heads: int) -> None:
    """The settings a ``from_*`` constructor copies from its module are not keyword arguments as well (else Python's
    "got multiple values for keyword argument 'bias'"; ``device=``/``dtype=`` were dropped silently, the layer being
    moved to the module's weights), and ``num_kv_heads``, if given, is the module's ``num_heads`` (it has a key and
    a value per head: else a bare shape error from copying its weights into a smaller ``qkv``)."""
    if kwargs.get("num_kv_heads") not in (None, num_heads):
        raise ValueError(f"num_kv_heads={kwargs['num_kv_heads']!r}: {source} has a key and a value per head, so the "
                         f"layer takes num_kv_heads=None or num_heads={num_heads}")
    taken = [name for name in ("dim", "num_heads", "bias", "dropout", "device", "dtype") if name in kwargs]
    if taken:
        raise TypeError(f"{method}: {', '.join(taken)} {'is' if len(taken) == 1 else 'are'} copied from the {source} and "
                        f"cannot be given too, got {', '.join(f'{n}={kwargs[n]!r}' for n in taken)}"
                        + (" (dropout is a settable attribute: layer.dropout = p)" if "dropout" in taken else "")
                        + (" (the layer takes its weights' device and dtype: call .to() on the result)"
                           if "device" in taken or "dtype" in taken else ""))


def _check_mask_shape(attn_mask: Tensor, shape: tuple[int, int, int, int]) -> None:
    """``attn_mask`` broadcastable to the scores' ``shape = (B, H, N, M)`` (a ValueError naming the shape given), with
    a hint for :class:`torch.nn.MultiheadAttention`'s ``(B * H, N, M)`` layout."""
    B, H, N, M = shape
    try:
        ok = 2 <= attn_mask.dim() <= 4 and torch.broadcast_shapes(attn_mask.shape, shape) == shape
    except RuntimeError:
        ok = False
    if not ok:
        hint = ""
        if attn_mask.dim() == 3 and tuple(attn_mask.shape) == (B * H, N, M):
            hint = (f"; nn.MultiheadAttention's (B * H, N, M) layout is attn_mask.view({B}, {H}, {N}, {M}) here "
                    "(bool True = attend: the negation of MultiheadAttention's bool mask)")
        raise ValueError(f"attn_mask must be broadcastable to (B, H, N, M) = {shape}, got shape "
                         f"{tuple(attn_mask.shape)}{hint}")


def _group_spec(op: DiffusionOperator, count: int) -> str:
    """``op.spec()``, with ``num_heads=1`` added when ``op`` is one instance with state shared by ``count`` heads
    (built from a string, a group has one parameter set per head: ``num_heads=count``)."""
    spec = op.spec()
    if op.num_heads == count or not op.state_dict():
        return spec
    if spec.endswith("()"):
        return f"{spec[:-1]}num_heads=1)"
    return f"{spec[:-1]}, num_heads=1)" if spec.endswith(")") else f"{spec}(num_heads=1)"


def set_recompute(module: nn.Module, enabled: bool = True) -> int:
    """Set :class:`DiffusionAttention`'s ``recompute`` on every such layer of ``module``; returns how many.

    With it, each layer forms its heads' combined output again in the backward pass instead of
    keeping it (:mod:`diffusionformer.ops.recompute`): less memory, a little more work.

    Args:
        module: a model or layer; every :class:`DiffusionAttention` among its modules is set.
        enabled: the value of ``recompute`` (a bool).

    Examples:
        >>> from diffusionformer.models import DiffusionGPT, GPTConfig
        >>> from diffusionformer.nn import set_recompute  # the package's (a doctest run may load a second copy of this file)
        >>> set_recompute(DiffusionGPT(GPTConfig(vocab_size=10, n_layer=2, laplacian_heads=2)))
        2
    """
    if not isinstance(module, nn.Module):  # else "'list' object has no attribute 'modules'"
        raise TypeError(f"set_recompute: expected module to be an nn.Module, got {type(module).__name__}")
    _check_flag(enabled, "enabled")
    layers = [m for m in module.modules() if isinstance(m, DiffusionAttention)]
    for m in layers:
        m.recompute = enabled
    return len(layers)
