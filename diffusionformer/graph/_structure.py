r"""Structural masks and edge lists of sequence graphs (causal, sliding window), shared by the layouts.

Two independent constructions of the same relation
:math:`i \leftarrow j \iff (\text{not causal} \lor j \le i) \land (w = \infty \lor |i - j| \le w)`:

* :func:`structural_mask` builds the ``(N, N)`` bool matrix from its diagonals, in place (dense layout);
* :func:`structural_edges` enumerates the ``(2, E)`` edges ``(j, i)`` from the offsets
  ``i - j`` in ``O(N w)`` memory (sparse layout), target-major and sorted by source.

The dense-against-sparse tests compare the two, so neither is derived from the other.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["replicate_edges", "structural_edges", "structural_keep", "structural_mask"]


def structural_mask(N: int, causal: bool, window: int | None, device: torch.device) -> Tensor | None:
    """``(N, N)`` bool, True where query ``i`` may attend to key ``j``; None when every pair is allowed."""
    if not causal and window is None:
        return None
    # built in place on the one (N, N) bool tensor (1 byte per pair): the band from its diagonals, not from an
    # (N, N) int64 matrix of i - j and its absolute value (16 bytes per pair: 4 GiB for N = 16384); the window is
    # clamped to N (a window past int64 would overflow the diagonal offset)
    keep = torch.ones(N, N, dtype=torch.bool, device=device)
    if causal:
        keep.tril_()
    if window is not None:
        w = min(window, N)
        keep.triu_(-w)  # j >= i - w
        if not causal:
            keep.tril_(w)  # j <= i + w
    return keep


def structural_keep(i: Tensor, j: Tensor, causal: bool, window: int | None) -> Tensor:
    """Bool per pair ``(i, j)``: whether the structural relation allows ``j -> i``."""
    keep = torch.ones_like(i, dtype=torch.bool)
    if causal:
        keep = keep & (j <= i)
    if window is not None:
        keep = keep & ((i - j).abs() <= min(window, torch.iinfo(torch.int64).max))  # |i - j| fits: exact
    return keep


def structural_edges(N: int, causal: bool, window: int | None, device: torch.device) -> Tensor:
    """``(2, E)`` edges ``(j, i)`` of one sequence, grouped by target ``i`` and sorted by source ``j``."""
    if window is None:
        i, j = torch.meshgrid(torch.arange(N, device=device), torch.arange(N, device=device), indexing="ij")
        i, j = i.reshape(-1), j.reshape(-1)
        if causal:
            keep = j <= i
            i, j = i[keep], j[keep]
        return torch.stack([j, i])
    w = min(window, max(N - 1, 0))
    offsets = torch.arange(-w, 1 if causal else w + 1, device=device)  # j - i
    i = torch.arange(N, device=device).repeat_interleave(offsets.numel())
    j = i + offsets.repeat(N)
    keep = (j >= 0) & (j < N)
    return torch.stack([j[keep], i[keep]])


def replicate_edges(edges: Tensor, B: int, N: int) -> Tensor:
    """Block-diagonal copy of one sequence's ``(2, E0)`` edges over ``B`` sequences of ``N`` nodes: ``(2, B * E0)``."""
    if B == 1:
        return edges
    shift = (torch.arange(B, device=edges.device) * N).repeat_interleave(edges.shape[1])  # (B * E0,)
    return edges.repeat(1, B) + shift
