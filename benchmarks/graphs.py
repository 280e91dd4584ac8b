"""Graphs for the sparse benchmarks: random, 2-D grid (king + knight moves) and 1-D windows."""

from __future__ import annotations

import math

import torch
from torch import Tensor

# king and knight moves: 8 + 8 = 16 neighbours for an interior node of the grid
GRID_OFFSETS = [(dx, dy) for dx in range(-2, 3) for dy in range(-2, 3) if 1 <= dx * dx + dy * dy <= 5 and dx * dx + dy * dy != 4]


def random_graph(num_nodes: int, avg_degree: int = 16, seed: int = 0, device: str = "cpu") -> Tensor:
    """``num_nodes * avg_degree`` edges with uniformly random endpoints (PyG ``edge_index``)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_nodes, (2, num_nodes * avg_degree), generator=g).to(device)


def grid_graph(num_nodes: int, device: str = "cpu") -> tuple[Tensor, int]:
    """Square lattice of ``side = round(sqrt(num_nodes))`` with king and knight moves (degree 16 inside).

    Returns ``(edge_index, N)`` with ``N = side ** 2``; edges are listed by offset (not sorted).
    """
    side = int(round(math.sqrt(num_nodes)))
    r = torch.arange(side)
    yy, xx = torch.meshgrid(r, r, indexing="ij")
    src, dst = [], []
    for dx, dy in GRID_OFFSETS:
        ok = (xx + dx >= 0) & (xx + dx < side) & (yy + dy >= 0) & (yy + dy < side)
        s = (yy * side + xx)[ok]
        src.append(s)
        dst.append(((yy + dy) * side + (xx + dx))[ok])
    return torch.stack([torch.cat(src), torch.cat(dst)]).to(device), side * side


def grid_mask(side: int, device: str = "cpu") -> Tensor:
    """Dense bool mask ``(N, N)`` (True = attend) of :func:`grid_graph` plus self-loops, ``N = side ** 2``."""
    N = side * side
    edge_index, _ = grid_graph(N, device)
    mask = torch.eye(N, dtype=torch.bool, device=device)
    mask[edge_index[1], edge_index[0]] = True
    return mask


def window_graph(num_nodes: int, radius: int, device: str = "cpu") -> Tensor:
    """1-D sliding window: ``i`` attends to ``j`` with ``|i - j| <= radius`` (self-loops included)."""
    i = torch.arange(num_nodes, device=device)
    offsets = torch.arange(-radius, radius + 1, device=device)
    j = i[:, None] + offsets[None, :]
    ok = (j >= 0) & (j < num_nodes)
    dst = i[:, None].expand_as(j)[ok]
    return torch.stack([j[ok], dst])


def window_mask(num_nodes: int, radius: int, device: str = "cpu") -> Tensor:
    """Dense bool mask ``(N, N)`` of :func:`window_graph`."""
    i = torch.arange(num_nodes, device=device)
    return (i[:, None] - i[None, :]).abs() <= radius
