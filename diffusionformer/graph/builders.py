r"""Builders for the token graphs of sequences and images: complete, causal, sliding window, grid.

Each returns an :class:`~diffusionformer.graph.AttentionGraph` in the layout asked for.
The dense layout of a sequence builder is lazy (flags, no ``N x N`` tensor); its sparse
layout enumerates the edges directly (``O(B N w)`` for a window, ``O(B h w r^2)`` for a grid).
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

import torch
from torch import Tensor

from diffusionformer.config import _check_flag, _choice_hint, _device_argument
from diffusionformer.graph._checks import check_int, check_layout
from diffusionformer.graph._structure import replicate_edges, structural_edges
from diffusionformer.graph.core import AttentionGraph

__all__ = ["GRID_METRICS", "causal", "complete", "grid", "sliding_window"]

GRID_METRICS: tuple[str, ...] = ("chebyshev", "manhattan", "euclidean")


def _check_sparse_device(dev: torch.device) -> None:
    """ValueError for the meta device in the sparse layout, whose edges are enumerated by value (else a
    NotImplementedError from torch.nonzero, or a hint at a ``checked=False`` that the builders do not take)."""
    if dev.type == "meta":
        raise ValueError("device is meta, but layout='sparse' enumerates the edges, which needs their values: build "
                         "the graph on a real device, or use layout='dense'")


def _sequence_graph(
    N: int,
    *,
    causal: bool,
    window: int | None,
    self_loops: bool,
    batch_size: int | None,
    key_padding_mask: Tensor | None,
    layout: str,
    device: torch.device | str | None,
) -> AttentionGraph:
    N = check_int("N", N, 1)
    check_layout(layout)
    _check_flag(self_loops, "self_loops")
    if key_padding_mask is not None and not isinstance(key_padding_mask, Tensor):  # before .to / .device
        raise TypeError("key_padding_mask must be a bool tensor of shape (B, N), got "
                        f"{type(key_padding_mask).__name__}")
    if device is not None:  # else "cdua" is torch's RuntimeError listing every device type it knows
        device = _device_argument("device", device)
    if key_padding_mask is not None and device is not None:
        key_padding_mask = key_padding_mask.to(device)
    dev = torch.device(device) if device is not None else (
        key_padding_mask.device if key_padding_mask is not None else torch.device("cpu")
    )
    allowed = None if self_loops else ~torch.eye(N, dtype=torch.bool, device=dev)
    g = AttentionGraph.dense(N, batch_size=batch_size, key_padding_mask=key_padding_mask, causal=causal,
                             window=window, allowed=allowed)
    if layout == "dense":
        return g
    _check_sparse_device(dev)
    B = g.batch_size if g.batch_size is not None else 1
    edges = structural_edges(N, causal, window, dev)  # one sequence
    if not self_loops:
        edges = edges[:, edges[0] != edges[1]]
    edges = replicate_edges(edges, B, N)
    if key_padding_mask is not None:
        real = ~key_padding_mask.reshape(-1)
        edges = edges[:, real[edges[0]] & real[edges[1]]]
    batch = torch.arange(B, device=dev).repeat_interleave(N)
    return AttentionGraph.sparse(edges, B * N, batch=batch, batch_size=B)


def complete(
    N: int,
    batch_size: int | None = None,
    *,
    self_loops: bool = True,
    key_padding_mask: Tensor | None = None,
    layout: str = "dense",
    device: torch.device | str | None = None,
) -> AttentionGraph:
    r"""Full attention: every token attends to every (non-padding) token, :math:`A_{ij} = 1`.

    Args:
        N: sequence length.
        batch_size: ``B``; ``None`` lets a dense graph serve any batch size (sparse: 1).
        self_loops: keep ``i -> i`` (without them ``P`` has a zero diagonal).
        key_padding_mask: ``(B, N)`` bool, True = padding.
        layout: ``"dense"`` (no mask at all when ``self_loops`` and no padding) or ``"sparse"``
            (``B N^2`` edges).
        device: where the graph's tensors live.

    Examples:
        >>> complete(3)
        AttentionGraph(dense, N=3)
        >>> complete(2, self_loops=False, layout="sparse").edge_index
        tensor([[1, 0],
                [0, 1]])
    """
    return _sequence_graph(N, causal=False, window=None, self_loops=self_loops, batch_size=batch_size,
                           key_padding_mask=key_padding_mask, layout=layout, device=device)


def causal(
    N: int,
    batch_size: int | None = None,
    *,
    key_padding_mask: Tensor | None = None,
    layout: str = "dense",
    device: torch.device | str | None = None,
) -> AttentionGraph:
    r"""Causal (autoregressive) attention: :math:`A_{ij} = \mathbb{1}[j \le i]`.

    Args:
        N: sequence length.
        batch_size: ``B``; ``None`` lets a dense graph serve any batch size (sparse: 1).
        key_padding_mask: ``(B, N)`` bool, True = padding.
        layout: ``"dense"`` (an ``(N, N)`` causal mask on ``x``'s device) or ``"sparse"``.
        device: where the graph's tensors live.

    Examples:
        >>> causal(3).dense_allowed()[0].int()
        tensor([[1, 0, 0],
                [1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
        >>> causal(3, layout="sparse").edge_index
        tensor([[0, 0, 1, 0, 1, 2],
                [0, 1, 1, 2, 2, 2]])
    """
    return _sequence_graph(N, causal=True, window=None, self_loops=True, batch_size=batch_size,
                           key_padding_mask=key_padding_mask, layout=layout, device=device)


def sliding_window(
    N: int,
    window: int,
    *,
    causal: bool = False,
    batch_size: int | None = None,
    key_padding_mask: Tensor | None = None,
    layout: str = "dense",
    device: torch.device | str | None = None,
) -> AttentionGraph:
    r"""Local attention: :math:`A_{ij} = \mathbb{1}[|i - j| \le w]`, or :math:`j \in [i - w, i]` when causal.

    Longformer / Mistral-style sliding windows (Beltagy et al., 2020); ``window=0`` keeps only
    the self loop.

    Args:
        N: sequence length.
        window: ``w >= 0``.
        causal: one-sided window.
        batch_size: ``B``; ``None`` lets a dense graph serve any batch size (sparse: 1).
        key_padding_mask: ``(B, N)`` bool, True = padding.
        layout: ``"dense"`` (an ``(N, N)`` band mask) or ``"sparse"`` (``O(B N w)`` edges).
        device: where the graph's tensors live.

    Examples:
        >>> sliding_window(4, 1).dense_allowed()[0].int()
        tensor([[1, 1, 0, 0],
                [1, 1, 1, 0],
                [0, 1, 1, 1],
                [0, 0, 1, 1]], dtype=torch.int32)
        >>> sliding_window(3, 1, causal=True, layout="sparse").edge_index
        tensor([[0, 0, 1, 1, 2],
                [0, 1, 1, 2, 2]])
    """
    window = check_int("window", window, 0)
    return _sequence_graph(N, causal=causal, window=window, self_loops=True, batch_size=batch_size,
                           key_padding_mask=key_padding_mask, layout=layout, device=device)


def _check_grid(h: int, w: int, radius: float, metric: str) -> tuple[int, int, int]:
    """``(h, w, bound)`` as Python ints, with ``radius`` and ``metric`` checked: ``bound`` is the largest integer
    distance (squared for the Euclidean metric) within ``radius``, exact, so that both layouts compare integers (a
    float32 comparison took ``radius=0.99999999`` for 1, and an int64 ``radius**2`` wrapped around)."""
    h, w = check_int("h", h, 1), check_int("w", w, 1)
    if isinstance(radius, bool) or not isinstance(radius, numbers.Real):
        raise TypeError(f"radius must be a number, got {type(radius).__name__}")
    if not radius >= 0 or (not isinstance(radius, numbers.Integral) and math.isinf(radius)):
        raise ValueError(f"radius must be finite and >= 0, got {radius}")
    if metric not in GRID_METRICS:
        raise ValueError(f"metric must be one of {GRID_METRICS}, got {metric!r}{_choice_hint(metric, GRID_METRICS)}")
    r = float(min(radius, h + w))  # no two patches are h + w apart: a larger radius joins no more pairs
    return h, w, math.floor(Fraction(r) ** 2) if metric == "euclidean" else math.floor(r)


def _within(dy: Tensor, dx: Tensor, bound: int, metric: str) -> Tensor:
    dy, dx = dy.abs(), dx.abs()
    if metric == "chebyshev":
        return torch.maximum(dy, dx) <= bound
    if metric == "manhattan":
        return dy + dx <= bound
    return dy * dy + dx * dx <= bound


def grid(
    h: int,
    w: int,
    radius: float = 1,
    *,
    metric: str = "chebyshev",
    self_loops: bool = True,
    cls_token: bool = False,
    batch_size: int | None = None,
    layout: str = "dense",
    device: torch.device | str | None = None,
) -> AttentionGraph:
    r"""Neighbourhoods of an ``h x w`` grid of patch tokens: :math:`A_{ij} = \mathbb{1}[d(p_i, p_j) \le r]`.

    Patch ``n`` sits at ``p_n = (n // w, n % w)`` (row-major, as ViT flattens patches) and
    ``d`` is the Chebyshev (``max(|dy|, |dx|)``: ``r = 1`` is the 8-neighbourhood plus self),
    Manhattan (``|dy| + |dx|``: ``r = 1`` is the 4-neighbourhood plus self) or Euclidean
    distance. With ``cls_token`` a class token is prepended as token 0 (patches become tokens
    ``1 .. h w``) and connected to every patch in both directions (with a self loop when
    ``self_loops``), as a global token in ViT.

    Args:
        h, w: grid height and width.
        radius: ``r >= 0`` (may be fractional for the Euclidean metric).
        metric: ``"chebyshev"``, ``"manhattan"`` or ``"euclidean"``.
        self_loops: keep ``i -> i``.
        cls_token: prepend a class token connected to all tokens.
        batch_size: ``B``; ``None`` lets a dense graph serve any batch size (sparse: 1).
        layout: ``"dense"`` (an explicit ``(N, N)`` allowed mask, ``N = h w (+1)``) or
            ``"sparse"`` (edges from the neighbourhood offsets).
        device: where the graph's tensors live.

    Examples:
        >>> grid(2, 2, cls_token=True)
        AttentionGraph(dense, N=5, allowed=(5, 5))
        >>> grid(1, 3, metric="manhattan", self_loops=False).dense_allowed()[0].int()
        tensor([[0, 1, 0],
                [1, 0, 1],
                [0, 1, 0]], dtype=torch.int32)
        >>> grid(1, 3, self_loops=False, layout="sparse").edge_index
        tensor([[1, 0, 2, 1],
                [0, 1, 1, 2]])
    """
    h, w, bound = _check_grid(h, w, radius, metric)
    check_layout(layout)
    _check_flag(self_loops, "self_loops")
    _check_flag(cls_token, "cls_token")
    # (_device_argument: else "cdua" is torch's RuntimeError listing every device type it knows)
    dev = _device_argument("device", device) if device is not None else torch.device("cpu")
    P = h * w
    off = 1 if cls_token else 0
    N = P + off
    if layout == "dense":
        n = torch.arange(P, device=dev)
        y, x = n // w, n % w
        A = _within(y[:, None] - y[None, :], x[:, None] - x[None, :], bound, metric)  # (P, P)
        if not self_loops:
            A = A & ~torch.eye(P, dtype=torch.bool, device=dev)
        if cls_token:
            full = torch.ones(N, N, dtype=torch.bool, device=dev)
            full[1:, 1:] = A
            full[0, 0] = self_loops
            A = full
        return AttentionGraph.dense(N, batch_size=batch_size, allowed=A)

    _check_sparse_device(dev)
    r = math.isqrt(bound) if metric == "euclidean" else bound
    ry, rx = min(r, h - 1), min(r, w - 1)  # offsets that leave the grid join no pair: radius=1e5 costs no more than h, w
    dy, dx = torch.meshgrid(torch.arange(-ry, ry + 1, device=dev), torch.arange(-rx, rx + 1, device=dev), indexing="ij")
    keep = _within(dy, dx, bound, metric)
    if not self_loops:
        keep = keep & ~((dy == 0) & (dx == 0))
    dy, dx = dy[keep], dx[keep]  # offsets source - target, row-major order
    n = torch.arange(P, device=dev)
    ty, tx = (n // w).repeat_interleave(dy.numel()), (n % w).repeat_interleave(dx.numel())
    sy, sx = ty + dy.repeat(P), tx + dx.repeat(P)
    inside = (sy >= 0) & (sy < h) & (sx >= 0) & (sx < w)
    edges = torch.stack([sy * w + sx, ty * w + tx])[:, inside] + off  # grouped by target
    if cls_token:
        patches = torch.arange(1, N, device=dev)
        zeros = torch.zeros_like(patches)
        parts = [torch.stack([patches, zeros]), torch.stack([zeros, patches]), edges]  # cls <- all, cls -> all
        if self_loops:
            parts.insert(0, torch.zeros(2, 1, dtype=torch.long, device=dev))
        edges = torch.cat(parts, dim=1)
    B = 1 if batch_size is None else check_int("batch_size", batch_size, 1)
    batch = torch.arange(B, device=dev).repeat_interleave(N)
    return AttentionGraph.sparse(replicate_edges(edges, B, N), B * N, batch=batch, batch_size=B)
