"""Tiny hand-built graphs and inputs for tests (PyG edge convention: row 0 source, row 1 target)."""

from __future__ import annotations

import torch
from torch import Tensor

from diffusionformer.config import _check_flag
from diffusionformer.graph._checks import check_int
from diffusionformer.ops.sparse import check_edge_index

__all__ = ["causal_edge_index", "complete_edge_index", "random_qkv", "dense_allowed_from_edges", "reference_qkv"]


def complete_edge_index(num_nodes: int, *, self_loops: bool = True, device: torch.device | str | None = None) -> Tensor:
    """Every ordered pair ``(j, i)`` (with ``j == i`` when ``self_loops``).

    Examples:
        >>> complete_edge_index(2)
        tensor([[0, 1, 0, 1],
                [0, 0, 1, 1]])
    """
    num_nodes = check_int("num_nodes", num_nodes, 0)
    _check_flag(self_loops, "self_loops")
    i, j = torch.meshgrid(torch.arange(num_nodes, device=device), torch.arange(num_nodes, device=device), indexing="ij")
    keep = torch.ones_like(i, dtype=torch.bool) if self_loops else i != j
    return torch.stack([j[keep], i[keep]])


def causal_edge_index(num_nodes: int, *, device: torch.device | str | None = None) -> Tensor:
    """Edges ``j -> i`` for ``j <= i``: the sparse form of a causal mask.

    Examples:
        >>> causal_edge_index(2)
        tensor([[0, 0, 1],
                [0, 1, 1]])
    """
    e = complete_edge_index(num_nodes, device=device)
    return e[:, e[0] <= e[1]]


def dense_allowed_from_edges(edge_index: Tensor, num_nodes: int) -> Tensor:
    """``(N, N)`` bool matrix, True at ``[i, j]`` when the edge ``j -> i`` exists.

    Examples:
        >>> dense_allowed_from_edges(torch.tensor([[0], [1]]), 2)
        tensor([[False, False],
                [ True, False]])
    """
    num_nodes = check_int("num_nodes", num_nodes, 0)
    edge_index = check_edge_index(edge_index, num_nodes)
    allowed = torch.zeros(num_nodes, num_nodes, dtype=torch.bool, device=edge_index.device)
    allowed[edge_index[1], edge_index[0]] = True
    return allowed


def random_qkv(
    B: int = 2, H: int = 3, N: int = 6, C: int = 4, *, dtype: torch.dtype = torch.float64, seed: int = 0,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded Gaussian ``q, k, v`` of shape ``(B, H, N, C)``.

    Examples:
        >>> [t.shape for t in random_qkv(1, 2, 3, 4)][0]
        torch.Size([1, 2, 3, 4])
    """
    B, H, N, C = (check_int(name, value, 0) for name, value in (("B", B), ("H", H), ("N", N), ("C", C)))
    seed = check_int("seed", seed, -(2**63))  # numpy ints too (manual_seed refused them: "an integer is required")
    if seed >= 2**64:  # manual_seed's own error ("Overflow when unpacking long long") named no argument
        raise ValueError(f"seed must be < 2**64, got {seed}")
    if not isinstance(dtype, torch.dtype) or not (dtype.is_floating_point or dtype.is_complex):
        raise TypeError(f"dtype must be a floating or complex torch.dtype (Gaussian samples), got {dtype!r}")
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, C, generator=g, dtype=dtype).to(device) for _ in range(3))  # type: ignore[return-value]


def reference_qkv(layer: torch.nn.Module, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""``q``, ``k``, ``v`` of a :class:`~diffusionformer.nn.DiffusionAttention` computed by hand from its weights.

    :math:`[q\,|\,k\,|\,v] = x W^\top + b` with ``W``, ``b`` the layer's ``qkv`` projection, split
    into ``H`` query heads and ``G`` key/value heads of width ``C``; query head ``h`` reads
    key/value head ``h G / H`` (grouped-query attention), so ``k`` and ``v`` are returned with
    ``H`` heads. No q/k norm or rotary embedding is applied: references add their own.

    Args:
        layer: the attention layer (its ``qkv``, ``num_heads``, ``num_kv_heads``, ``head_dim``).
        x: the layer's input.

    Shapes:
        ``x``: ``(B, N, D)`` -> three ``(B, N, H, C)``.

    Examples:
        >>> from diffusionformer.nn import DiffusionAttention
        >>> layer = DiffusionAttention(8, 4, num_kv_heads=2)
        >>> [tuple(t.shape) for t in reference_qkv(layer, torch.zeros(1, 3, 8))]
        [(1, 3, 4, 2), (1, 3, 4, 2), (1, 3, 4, 2)]
    """
    if not isinstance(x, Tensor) or x.dim() != 3:  # an unbatched (N, D) input failed as "not enough values to unpack"
        raise ValueError(f"reference_qkv: x must be a (B, N, D) tensor, got "
                         f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    B, N, D = x.shape
    H, C, G = layer.num_heads, layer.head_dim, layer.num_kv_heads
    W, b = layer.qkv.weight, layer.qkv.bias
    qkv = x @ W.T if b is None else x @ W.T + b
    q = qkv[..., : H * C].reshape(B, N, H, C)
    k = qkv[..., H * C : (H + G) * C].reshape(B, N, G, C)
    v = qkv[..., (H + G) * C :].reshape(B, N, G, C)
    k = torch.stack([k[:, :, h * G // H] for h in range(H)], dim=2)  # query head h uses kv head h // (H/G)
    v = torch.stack([v[:, :, h * G // H] for h in range(H)], dim=2)
    return q, k, v
