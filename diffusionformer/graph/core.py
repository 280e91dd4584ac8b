r"""``AttentionGraph``: the graph a :class:`~diffusionformer.nn.DiffusionAttention` layer attends over.

A head's attention matrix is a random walk on a graph of tokens,

.. math::
    P_{ij} = \frac{\mathbb{1}[A_{ij}] \exp(q_i \cdot k_j / \sqrt{C})}
                  {\sum_{j'} \mathbb{1}[A_{ij'}] \exp(q_i \cdot k_{j'} / \sqrt{C})},

where :math:`A_{ij}` (True = query ``i`` may attend to key ``j``, i.e. the edge ``j -> i``)
is what this module describes, in one of two layouts that the two back-ends consume:

* **dense**: ``B`` sequences of ``N`` tokens; ``A`` is the conjunction of an optional key
  padding mask, a causal flag, a local window and an explicit allowed matrix;
* **sparse**: an ``edge_index`` in PyTorch Geometric convention (row 0 source ``j``, row 1
  target ``i``) over ``num_nodes`` nodes, optionally split into graphs by a ``batch`` vector.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import Tensor

from diffusionformer.config import _check_flag
from diffusionformer.graph._checks import LAYOUTS, _plain_ids, check_int, check_layout, check_within_graphs
from diffusionformer.graph._structure import (
    replicate_edges,
    structural_edges,
    structural_keep,
    structural_mask,
)
from diffusionformer.ops._checks import (_SPARSE_ADJACENCY_FIX, _check_strided, _on_device_of_x, check_index_range,
                                         checks_values)

__all__ = ["LAYOUTS", "AttentionGraph", "Layout"]

Layout = Literal["dense", "sparse"]


def _edge_index_shape_error(shape: tuple[int, ...]) -> ValueError:
    """The ValueError for an ``edge_index`` that is not ``(2, E)``, with a hint for a list of ``(E, 2)`` pairs."""
    hint = ": a list of (source, target) pairs of shape (E, 2) becomes one with edge_index.t()" if (
        len(shape) == 2 and shape[1] == 2) else ""
    return ValueError(f"edge_index must have shape (2, E), got {shape}{hint}")


def _check_bool_tensor(name: str, t: object, layout: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a bool tensor of shape {layout}, got {type(t).__name__}")
    _check_strided(name, t, f"pass {name}.to_dense()")
    if t.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor of shape {layout}, got dtype {t.dtype}")
    return t


def _check_index_tensor(name: str, t: object, layout: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be an integer tensor of shape {layout}, got {type(t).__name__}")
    _check_strided(name, t, _SPARSE_ADJACENCY_FIX if name == "edge_index" else f"pass {name}.to_dense()")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:  # uint16/32/64 are integers too
        raise TypeError(f"{name} must be an integer tensor of shape {layout}, got dtype {t.dtype}")
    t = _plain_ids(t)  # a PyG EdgeIndex / Index: the graph holds its plain ids
    out = t.long()
    if t.dtype == torch.uint64 and bool((out < 0).any()):  # ids of 2**63 and above wrapped to negative ones
        raise ValueError(f"{name} holds uint64 ids of 2**63 or more (past int64), up to "
                         f"{int(out[out < 0].max()) + 2**64}; node ids must lie in [0, num_nodes)")
    return out


@dataclass(frozen=True, eq=False, repr=False)
class AttentionGraph:
    r"""The token graph of one attention layer, dense or sparse (immutable; build with the classmethods).

    **Dense layout** (``B`` sequences of ``N`` tokens). Query ``i`` of sequence ``b`` may
    attend to key ``j`` iff

    .. math::
        A_{bij} = \lnot\,\mathrm{pad}_{bj} \;\land\; (\lnot\,\mathrm{causal} \lor j \le i)
        \;\land\; \big(w = \varnothing \lor |i - j| \le w\big) \;\land\; \mathrm{allowed}_{(b)ij},

    so a causal window is ``j in [i - w, i]``. :meth:`attention_kwargs` hands the layer the
    cheapest masks that express this (none for a complete graph, ``(N, N)`` for causal,
    window or a shared ``allowed``, ``(B, 1, N, N)`` for a per-sequence ``allowed``), built on
    ``x``'s device. Padded *queries* still produce (meaningless) outputs in the dense
    back-end; the graph itself gives them no in-edges (see :meth:`dense_allowed`).

    **Sparse layout**. Edge ``e`` carries ``x[edge_index[0, e]]`` (source ``j``) to
    ``edge_index[1, e]`` (target ``i``); ``batch[n]`` is the graph of node ``n``. Nodes of
    different graphs are never connected (checked). Duplicate edges count twice in the sparse
    softmax and once in :meth:`to_dense`.

    **Conversions** (same graph, other layout):

    * :meth:`to_sparse`: block-diagonal edges over the ``B * N`` flattened tokens (token
      ``(b, i)`` is node ``b * N + i``, so ``x.reshape(B * N, D)`` is the matching input);
      padding tokens stay as isolated nodes: padded keys are never attended and padded
      queries have no in-edges;
    * :meth:`to_dense`: nodes grouped by ``batch`` into ``(B, N_max)`` with a key padding mask
      for the short graphs and an explicit ``(B, N_max, N_max)`` allowed mask (use
      :func:`torch_geometric.utils.to_dense_batch` for the features);
    * :meth:`dense_allowed`: the explicit ``(B, N, N)`` matrix ``A`` for either layout.

    Attributes:
        layout: ``"dense"`` or ``"sparse"``.
        seq_len: ``N`` (dense).
        batch_size: ``B`` (dense; ``None`` = any batch size) or the number of graphs
            (sparse; optional, inferred from ``batch``).
        key_padding_mask: ``(B, N)`` bool, True = padding (dense).
        causal: ``i`` never attends to ``j > i`` (dense).
        window: attend to ``|i - j| <= window`` (``j in [i - window, i]`` when causal) (dense).
        allowed: ``(N, N)`` or ``(B, N, N)`` bool, True = ``i`` may attend to ``j`` (dense).
        attn_mask: an extra mask with :func:`~torch.nn.functional.scaled_dot_product_attention`
            semantics (bool True = attend, or additive float), broadcastable to
            ``(B, H, N, N)`` (dense). It may weight keys or differ per head, so it has no sparse
            form: it is handed to the kernel as is (and checked there) and the conversions
            refuse it.
        checked: whether the sparse ``edge_index`` was checked at construction (bounds,
            block-diagonal batches: host synchronisations). ``False`` defers those checks to each
            call, in eager mode on CPU (:meth:`attention_kwargs` checks the batches, the kernel
            :func:`~diffusionformer.functional.diffuse_sparse` the bounds), which is how
            :class:`~diffusionformer.nn.DiffusionAttention` wraps a bare ``edge_index``.
        edge_index: ``(2, E)`` long, row 0 source ``j``, row 1 target ``i`` (sparse).
        num_nodes: total number of nodes (sparse).
        batch: ``(num_nodes,)`` long graph assignment (sparse).

    Shapes:
        - dense: ``x`` ``(B, N, D)``; ``attention_kwargs`` gives ``attn_mask`` broadcastable
          to ``(B, 1, N, N)`` and ``key_padding_mask`` ``(B, N)``;
        - sparse: ``x`` ``(num_nodes, D)``; ``attention_kwargs`` gives ``edge_index`` ``(2, E)``.

    Examples:
        >>> g = AttentionGraph.dense(3, causal=True, window=1)
        >>> g
        AttentionGraph(dense, N=3, causal=True, window=1)
        >>> g.dense_allowed()[0].int()
        tensor([[1, 0, 0],
                [1, 1, 0],
                [0, 1, 1]], dtype=torch.int32)
        >>> g.to_sparse().edge_index
        tensor([[0, 0, 1, 1, 2],
                [0, 1, 1, 2, 2]])
    """

    layout: str
    seq_len: int | None = None
    batch_size: int | None = None
    key_padding_mask: Tensor | None = None
    causal: bool = False
    window: int | None = None
    allowed: Tensor | None = None
    edge_index: Tensor | None = None
    num_nodes: int | None = None
    batch: Tensor | None = None
    attn_mask: Tensor | None = None
    checked: bool = True

    # ------------------------------------------------------------------ construction
    @classmethod
    def dense(
        cls,
        seq_len: int,
        *,
        batch_size: int | None = None,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        window: int | None = None,
        allowed: Tensor | None = None,
        attn_mask: Tensor | None = None,
    ) -> "AttentionGraph":
        """A dense graph over ``B`` sequences of ``seq_len`` tokens (see the class docstring).

        Examples:
            >>> AttentionGraph.dense(4, key_padding_mask=torch.tensor([[False, False, True, True]]))
            AttentionGraph(dense, B=1, N=4, padding=True)
        """
        return cls(
            "dense", seq_len=seq_len, batch_size=batch_size, key_padding_mask=key_padding_mask,
            causal=causal, window=window, allowed=allowed, attn_mask=attn_mask,
        )

    @classmethod
    def sparse(
        cls,
        edge_index: Tensor,
        num_nodes: int | None = None,
        *,
        batch: Tensor | None = None,
        batch_size: int | None = None,
        checked: bool = True,
    ) -> "AttentionGraph":
        """A sparse graph; ``num_nodes`` defaults to ``batch.numel()`` or ``edge_index.max() + 1``.

        ``checked=False`` (``num_nodes`` required) keeps only the shape and dtype checks and
        leaves the bounds to the kernel, which checks them once per call.

        Examples:
            >>> AttentionGraph.sparse(torch.tensor([[0, 1], [1, 0]]))
            AttentionGraph(sparse, num_nodes=2, E=2)
        """
        return cls("sparse", edge_index=edge_index, num_nodes=num_nodes, batch=batch, batch_size=batch_size,
                   checked=checked)

    def __post_init__(self) -> None:
        check_layout(self.layout)
        if self.layout == "dense":
            self._validate_dense()
        else:
            self._validate_sparse()
        devices = {t.device for t in (self.key_padding_mask, self.allowed, self.edge_index, self.batch, self.attn_mask)
                   if t is not None}
        if len(devices) > 1:
            raise ValueError(f"all tensors of an AttentionGraph must be on one device, got {sorted(map(str, devices))}")

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _validate_dense(self) -> None:
        _check_flag(self.checked, "checked")
        if not self.checked:
            raise ValueError("checked=False applies to sparse graphs (it defers the edge_index bounds check)")
        for name in ("edge_index", "num_nodes", "batch"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} belongs to the sparse layout; a dense AttentionGraph takes seq_len, "
                                 "batch_size, key_padding_mask, causal, window and allowed")
        if self.seq_len is None:
            raise ValueError("a dense AttentionGraph needs seq_len (N)")
        N = check_int("seq_len", self.seq_len, 1)
        self._set("seq_len", N)  # a numpy int as the Python int it equals
        B = None if self.batch_size is None else check_int("batch_size", self.batch_size, 1)
        _check_flag(self.causal, "causal")
        if self.window is not None:
            self._set("window", check_int("window", self.window, 0))
        if self.key_padding_mask is not None:
            kpm = _check_bool_tensor("key_padding_mask", self.key_padding_mask, "(B, N)")
            if kpm.dim() != 2 or kpm.shape[1] != N or (B is not None and kpm.shape[0] != B):
                raise ValueError(
                    f"key_padding_mask must have shape (B, N) = ({'B' if B is None else B}, {N}), got {tuple(kpm.shape)}"
                )
            if kpm.shape[0] == 0:  # B = 0 taken from the mask, where batch_size=0 is refused
                raise ValueError(f"key_padding_mask must have B >= 1 sequences, got shape {tuple(kpm.shape)}")
            B = kpm.shape[0]
        if self.allowed is not None:
            a = _check_bool_tensor("allowed", self.allowed, "(N, N) or (B, N, N)")
            ok = a.shape[-2:] == (N, N) and (a.dim() == 2 or (a.dim() == 3 and (B is None or a.shape[0] == B)))
            if not ok:
                want = f"({N}, {N}) or ({'B' if B is None else B}, {N}, {N})"
                raise ValueError(f"allowed must have shape {want}, got {tuple(a.shape)}")
            if a.dim() == 3:
                if a.shape[0] == 0:  # B = 0 taken from the matrix, where batch_size=0 is refused
                    raise ValueError(f"allowed must have B >= 1 sequences, got shape {tuple(a.shape)}")
                B = a.shape[0]
        if self.attn_mask is not None:
            m = self.attn_mask
            if not isinstance(m, Tensor):
                raise TypeError(f"attn_mask must be a tensor or None, got {type(m).__name__}")
            _check_strided("attn_mask", m, "pass attn_mask.to_dense()")
            if m.dtype != torch.bool and not m.is_floating_point():
                raise TypeError(f"attn_mask must be bool (True = attend) or floating point, got {m.dtype}")
            lead_ok = B is None or m.dim() < 4 or m.shape[0] in (1, B)
            if not 2 <= m.dim() <= 4 or any(s not in (1, N) for s in m.shape[-2:]) or not lead_ok:
                raise ValueError(f"attn_mask must be broadcastable to (B, H, N, N) with N={N}"
                                 f"{'' if B is None else f', B={B}'}, got shape {tuple(m.shape)}")
        self._set("batch_size", B)

    def _validate_sparse(self) -> None:
        for name in ("seq_len", "key_padding_mask", "window", "allowed", "attn_mask"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} belongs to the dense layout; a sparse AttentionGraph takes edge_index, "
                                 "num_nodes, batch and batch_size")
        if _check_flag(self.causal, "causal"):
            raise ValueError("causal belongs to the dense layout; a sparse graph is causal by its edges "
                             "(or use DiffusionAttention(causal=True))")
        if self.edge_index is None:
            raise ValueError("a sparse AttentionGraph needs edge_index of shape (2, E)")
        e = _check_index_tensor("edge_index", self.edge_index, "(2, E)")
        if e.dim() != 2 or e.shape[0] != 2:
            raise _edge_index_shape_error(tuple(e.shape))
        batch = None
        if self.batch is not None:
            batch = _check_index_tensor("batch", self.batch, "(num_nodes,)")
            if batch.dim() != 1:
                raise ValueError(f"batch must have shape (num_nodes,), got {tuple(batch.shape)}")
        _check_flag(self.checked, "checked")
        G = None if self.batch_size is None else check_int("batch_size", self.batch_size, 1)
        if batch is None and G not in (None, 1):
            raise ValueError(f"batch_size={G} graphs needs a batch vector assigning nodes to graphs")
        if not self.checked:
            if self.num_nodes is None:
                raise ValueError("an unchecked sparse AttentionGraph (checked=False) needs num_nodes")
            if batch is not None and batch.numel() != self.num_nodes:
                raise ValueError(f"batch must have shape (num_nodes,) = ({self.num_nodes},), got {tuple(batch.shape)}")
            self._set("edge_index", e)
            self._set("num_nodes", check_int("num_nodes", self.num_nodes, 1))
            self._set("batch", batch)
            self._set("batch_size", G)
            return
        meta = [name for name, t in (("edge_index", e), ("batch", batch)) if t is not None and t.device.type == "meta"]
        if meta:  # else an unclear Tensor.item() error from the bounds check below
            raise ValueError(f"{meta[0]} is on the meta device, which has no values to check: build the graph with "
                             "checked=False (and num_nodes), or on a real device")
        N = self.num_nodes
        if N is None:
            if batch is not None:
                N = batch.numel()
            elif e.numel() > 0:
                N = int(e.max()) + 1
            else:
                raise ValueError("num_nodes is required for a graph without edges")
        N = check_int("num_nodes", N, 1)
        if e.numel() > 0:
            lo, hi = int(e.min()), int(e.max())
            if lo < 0 or hi >= N:
                raise ValueError(f"edge_index values must lie in [0, num_nodes={N}), got range [{lo}, {hi}]")
        if batch is not None:
            if batch.numel() != N:
                raise ValueError(f"batch must have shape (num_nodes,) = ({N},), got {tuple(batch.shape)}")
            lo, hi = int(batch.min()), int(batch.max())
            if lo < 0 or (G is not None and hi >= G):
                raise ValueError(f"batch values must lie in [0, batch_size={G}), got range [{lo}, {hi}]")
            check_within_graphs(e, batch)
        self._set("edge_index", e)
        self._set("num_nodes", N)
        self._set("batch", batch)
        self._set("batch_size", G)

    # ------------------------------------------------------------------ properties
    @property
    def is_dense(self) -> bool:
        return self.layout == "dense"

    @property
    def is_sparse(self) -> bool:
        return self.layout == "sparse"

    @property
    def device(self) -> torch.device:
        """Device of the graph's tensors (CPU when it has none)."""
        for t in (self.key_padding_mask, self.allowed, self.edge_index, self.batch, self.attn_mask):
            if t is not None:
                return t.device
        return torch.device("cpu")

    def to(self, device: torch.device | str) -> "AttentionGraph":
        """The same graph with its tensors on ``device``."""
        move = {
            name: getattr(self, name).to(device)
            for name in ("key_padding_mask", "allowed", "edge_index", "batch", "attn_mask")
            if getattr(self, name) is not None
        }
        return replace(self, **move)

    def __repr__(self) -> str:
        if self.is_dense:
            parts = ([] if self.batch_size is None else [f"B={self.batch_size}"]) + [f"N={self.seq_len}"]
            if self.causal:
                parts.append("causal=True")
            if self.window is not None:
                parts.append(f"window={self.window}")
            if self.key_padding_mask is not None:
                parts.append("padding=True")
            if self.allowed is not None:
                parts.append(f"allowed={tuple(self.allowed.shape)}")
            if self.attn_mask is not None:
                parts.append(f"attn_mask={tuple(self.attn_mask.shape)}")
        else:
            assert self.edge_index is not None  # validated
            parts = [f"num_nodes={self.num_nodes}", f"E={self.edge_index.shape[1]}"]
            if self.batch_size is not None:
                parts.append(f"graphs={self.batch_size}")
            elif self.batch is not None:
                parts.append("batch=True")
            if not self.checked:
                parts.append("checked=False")
        return f"AttentionGraph({self.layout}, {', '.join(parts)})"

    # ------------------------------------------------------------------ layer interface
    def attention_kwargs(self, x: Tensor) -> dict[str, Any]:
        """Keyword arguments for :meth:`DiffusionAttention.forward <diffusionformer.nn.DiffusionAttention.forward>`.

        Dense: ``attn_mask`` (bool, True = attend; ``(N, N)`` or ``(B, 1, N, N)``) and
        ``key_padding_mask`` (``(B, N)``), each only when needed, or ``is_causal=True`` for a
        plain causal graph (the fused kernel's own causal mask, no ``N x N`` tensor); sparse:
        ``edge_index``.

        Args:
            x: the layer input, ``(B, N, D)`` (dense) or ``(num_nodes, D)`` (sparse).

        Raises:
            ValueError: when ``x``'s shape does not match the graph, or a tensor of the graph is on the meta device
                (no values to move to ``x``'s) while ``x`` is not.

        Examples:
            >>> AttentionGraph.dense(2, causal=True).attention_kwargs(torch.zeros(5, 2, 8))
            {'is_causal': True}
            >>> AttentionGraph.dense(3, window=1).attention_kwargs(torch.zeros(5, 3, 8))
            {'attn_mask': tensor([[ True,  True, False],
                    [ True,  True,  True],
                    [False,  True,  True]])}
        """
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a tensor, got {type(x).__name__}")
        if self.is_sparse:
            assert self.edge_index is not None
            if x.dim() != 2 or x.shape[0] != self.num_nodes:
                raise ValueError(f"this sparse AttentionGraph expects x of shape (num_nodes={self.num_nodes}, D), "
                                 f"got {tuple(x.shape)}")
            if not self.checked and self.batch is not None and checks_values(self.edge_index):
                # the block-diagonal check deferred at construction, which the kernel (edges only) cannot run; where
                # values are read (eager CPU), as the kernel's bounds check, which must come first
                check_index_range("edge_index", self.edge_index, "num_nodes", self.num_nodes)
                check_within_graphs(self.edge_index, self.batch)
            return {"edge_index": _on_device_of_x(self.edge_index, "edge_index", x)}
        N, B = self.seq_len, self.batch_size
        if x.dim() != 3 or x.shape[1] != N or (B is not None and x.shape[0] != B):
            # one token more than the graph's: most often a ViT's class token on a graph of its patches alone (not
            # on a causal graph: a GPT's block_size + 1 tokens, its inputs not shifted from the targets)
            extra = (f" (one token more than N={N}: a class token? build the graph with it, e.g. "
                     "grid(h, w, cls_token=True) prepends one)"
                     if x.dim() == 3 and x.shape[1] == N + 1 and not self.causal else "")
            raise ValueError(f"this dense AttentionGraph expects x of shape ({'B' if B is None else B}, N={N}, D), "
                             f"got {tuple(x.shape)}{extra}")
        out: dict[str, Any] = {}
        assert N is not None
        extra = _on_device_of_x(self.attn_mask, "attn_mask", x)
        if self.causal and self.window is None and self.allowed is None:
            # plain causal graph: let the fused kernel apply its own causal mask (no N x N tensor)
            out["is_causal"] = True
            if extra is not None:
                out["attn_mask"] = extra
            if self.key_padding_mask is not None:
                out["key_padding_mask"] = _on_device_of_x(self.key_padding_mask, "key_padding_mask", x)
            return out
        mask = structural_mask(N, self.causal, self.window, x.device)
        if self.allowed is not None:
            a = _on_device_of_x(self.allowed, "allowed", x)
            a = a if a.dim() == 2 else a[:, None]  # (N, N) or (B, 1, N, N)
            mask = a if mask is None else a & mask
        if extra is not None:  # the structural mask (bool) and the caller's SDPA mask, both applied
            if mask is None:
                mask = extra
            elif extra.dtype == torch.bool:
                mask = extra & mask
            else:
                mask = extra.masked_fill(~mask, float("-inf"))
        if mask is not None:
            out["attn_mask"] = mask
        if self.key_padding_mask is not None:
            out["key_padding_mask"] = _on_device_of_x(self.key_padding_mask, "key_padding_mask", x)
        return out

    # ------------------------------------------------------------------ conversions
    def _refuse_attn_mask(self, what: str) -> None:
        if self.attn_mask is not None:
            raise ValueError(f"{what}: this graph has an SDPA attn_mask (float weights or per-head masks have no "
                             "boolean adjacency); describe the graph with allowed= instead")

    def _resolve_batch_size(self, batch_size: int | None) -> int:
        if batch_size is not None:
            batch_size = check_int("batch_size", batch_size, 1)
        if self.batch_size is not None:
            if batch_size is not None and batch_size != self.batch_size:
                raise ValueError(f"batch_size={batch_size} disagrees with the graph's batch_size={self.batch_size}")
            return self.batch_size
        return 1 if batch_size is None else batch_size

    def dense_allowed(self, batch_size: int | None = None) -> Tensor:
        """The explicit ``(B, N, N)`` bool matrix ``A`` (True at ``[b, i, j]`` when ``j -> i`` is an edge).

        Padding tokens have all-False rows and columns. Sparse graphs are laid out as by
        :meth:`to_dense` (``B = 1`` without a ``batch`` vector).

        Args:
            batch_size: ``B`` for a dense graph built for any batch size (default 1).

        Examples:
            >>> AttentionGraph.sparse(torch.tensor([[0], [1]]), 2).dense_allowed().int()
            tensor([[[0, 0],
                     [1, 0]]], dtype=torch.int32)
        """
        if self.is_sparse:  # batch_size checked against the graph's number of graphs, as for a dense graph
            return self.to_dense().dense_allowed(batch_size)
        self._refuse_attn_mask("dense_allowed")
        B, N = self._resolve_batch_size(batch_size), self.seq_len
        assert N is not None
        dev = self.device
        A = structural_mask(N, self.causal, self.window, dev)
        if A is None:
            A = torch.ones(N, N, dtype=torch.bool, device=dev)
        if self.allowed is not None:
            A = A & self.allowed
        A = A.expand(B, N, N)
        if self.key_padding_mask is not None:
            real = ~self.key_padding_mask
            A = A & real[:, :, None] & real[:, None, :]
        return A.contiguous()

    def to_sparse(self, batch_size: int | None = None) -> "AttentionGraph":
        """The same graph as block-diagonal edges over the ``B * N`` flattened tokens.

        Token ``(b, i)`` becomes node ``b * N + i`` (so ``x.reshape(B * N, D)`` is the input);
        padding tokens remain as isolated nodes (no in- or out-edges). Edges are grouped by
        target. A sparse graph is returned as is (``batch_size``, if given, must be its number of graphs).

        Args:
            batch_size: ``B`` for a dense graph built for any batch size (default 1).

        Examples:
            >>> AttentionGraph.dense(2, batch_size=2).to_sparse().edge_index
            tensor([[0, 1, 0, 1, 2, 3, 2, 3],
                    [0, 0, 1, 1, 2, 2, 3, 3]])
        """
        if self.is_sparse:
            if batch_size is not None:  # checked against the graph's number of graphs, as by dense_allowed
                graphs = self.batch_size if self.batch_size is not None else (
                    1 if self.batch is None else int(self.batch.max()) + 1)
                if check_int("batch_size", batch_size, 1) != graphs:
                    raise ValueError(f"batch_size={batch_size} disagrees with the graph's batch_size={graphs}")
            return self
        self._refuse_attn_mask("to_sparse")
        B, N = self._resolve_batch_size(batch_size), self.seq_len
        assert N is not None
        dev = self.device
        if self.allowed is None:
            edges = replicate_edges(structural_edges(N, self.causal, self.window, dev), B, N)
        elif self.allowed.dim() == 2:
            i, j = self.allowed.nonzero(as_tuple=True)
            keep = structural_keep(i, j, self.causal, self.window)
            edges = replicate_edges(torch.stack([j[keep], i[keep]]), B, N)
        else:
            b, i, j = self.dense_allowed().nonzero(as_tuple=True)
            edges = torch.stack([b * N + j, b * N + i])
        if self.key_padding_mask is not None:
            real = ~self.key_padding_mask.reshape(-1)  # (B * N,)
            edges = edges[:, real[edges[0]] & real[edges[1]]]
        batch = torch.arange(B, device=dev).repeat_interleave(N)
        return AttentionGraph.sparse(edges, B * N, batch=batch, batch_size=B)

    def to_dense(self) -> "AttentionGraph":
        """The same graph as padded sequences: ``(B, N_max)`` with key padding and an explicit allowed mask.

        Nodes must be grouped by graph (a sorted ``batch``, as in a PyG ``Batch``); node ``n``
        of graph ``b`` becomes position ``n - ptr[b]``, matching
        :func:`torch_geometric.utils.to_dense_batch`. Nodes of different graphs never attend to
        each other. Without ``batch`` all nodes form one sequence (``B = 1``, ``allowed``
        ``(N, N)``). A dense graph is returned as is.

        Examples:
            >>> g = AttentionGraph.sparse(torch.tensor([[1, 2], [0, 2]]), batch=torch.tensor([0, 0, 1]))
            >>> d = g.to_dense()
            >>> d
            AttentionGraph(dense, B=2, N=2, padding=True, allowed=(2, 2, 2))
            >>> d.key_padding_mask
            tensor([[False, False],
                    [False,  True]])
        """
        if self.is_dense:
            return self
        e, N_tot, batch = self.edge_index, self.num_nodes, self.batch
        assert e is not None and N_tot is not None
        if not self.checked:  # the checks deferred at construction: bounds, batch ids, block-diagonal batches
            return replace(self, checked=True).to_dense()
        dev = e.device
        if batch is None:
            allowed = torch.zeros(N_tot, N_tot, dtype=torch.bool, device=dev)
            allowed[e[1], e[0]] = True
            return AttentionGraph.dense(N_tot, batch_size=1, allowed=allowed)
        if batch.numel() > 1 and bool((batch[1:] < batch[:-1]).any()):
            raise ValueError("to_dense needs the nodes grouped by graph (a non-decreasing batch vector, "
                             "as in a PyG Batch); sort the nodes by batch first")
        B = self.batch_size if self.batch_size is not None else int(batch.max()) + 1
        counts = torch.bincount(batch, minlength=B)  # (B,)
        ptr = torch.cumsum(counts, 0) - counts
        pos = torch.arange(N_tot, device=dev) - ptr[batch]  # position of each node in its graph
        N = int(counts.max())
        allowed = torch.zeros(B, N, N, dtype=torch.bool, device=dev)
        allowed[batch[e[1]], pos[e[1]], pos[e[0]]] = True
        kpm = torch.arange(N, device=dev)[None, :] >= counts[:, None]  # (B, N)
        return AttentionGraph.dense(N, batch_size=B, allowed=allowed,
                                    key_padding_mask=kpm if bool(kpm.any()) else None)
