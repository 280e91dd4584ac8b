"""Segment reductions over an index vector (the sparse back-end's primitives).

These follow PyTorch Geometric's conventions (``index`` gives the output row of every
input row) but run on native PyTorch (``index_add_`` / ``scatter_reduce_``). When
`torch-scatter <https://github.com/rusty1s/pytorch_scatter>`_ is installed its kernels are
used for CUDA tensors; on CPU the native kernels measured as fast or faster (see the
performance page), so they are used there regardless.
"""

from __future__ import annotations

import numbers
from typing import Any, Literal

import torch
from torch import Tensor

from diffusionformer.config import _value_type
from diffusionformer.ops._checks import _backend_hint, _check_strided, check_index_range

ScatterBackend = Literal["auto", "native", "torch_scatter"]

# the optional accelerator, used for CUDA tensors when present: imported on first need (a CUDA tensor,
# backend="torch_scatter", HAS_TORCH_SCATTER read), not at `import diffusionformer`: a compiled extension a CPU
# process never uses; False until tried, then the module or None
_torch_scatter: Any = False


def _scatter_module() -> Any:
    """torch_scatter, or ``None`` where it is not installed or does not import (imported once, on first call)."""
    global _torch_scatter
    if _torch_scatter is False:
        try:
            import torch_scatter  # type: ignore[import-not-found]
        except Exception:  # pragma: no cover - depends on the environment
            torch_scatter = None
        _torch_scatter = torch_scatter
    return _torch_scatter


_LAZY = ("HAS_TORCH_SCATTER",)  # module attributes computed on first read (PEP 562)


def __getattr__(name: str) -> Any:
    if name == "HAS_TORCH_SCATTER":  # whether torch-scatter is installed and imports (reading it imports it)
        return _scatter_module() is not None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [*_LAZY, "scatter_sum", "scatter_max", "segment_softmax"]


def _use_torch_scatter(src: Tensor, backend: ScatterBackend) -> bool:
    if backend == "native":
        return False
    if backend == "torch_scatter":
        if _scatter_module() is None:
            raise ValueError(
                "backend='torch_scatter' was requested but torch-scatter is not installed; "
                "install it with `pip install \"diffusionformer[scatter]\"` or use backend='native'"
            )
        return True
    if backend != "auto":
        hint = _backend_hint(backend, ("auto", "native", "torch_scatter"), (), "")
        raise ValueError(f"scatter backend must be 'auto', 'native' or 'torch_scatter', got {backend!r}{hint}")
    return src.is_cuda and _scatter_module() is not None


def _check_index(src: Tensor, index: Tensor, dim_size: int, size_name: str = "dim_size") -> int:
    """The checks of every reduction; returns ``dim_size`` as a Python int (numpy ints too). ``size_name`` is the
    caller's name of the size argument (``segment_softmax`` calls it ``num_nodes``), used in the messages."""
    if not isinstance(src, Tensor) or src.dim() == 0:
        got = tuple(src.shape) if isinstance(src, Tensor) else type(src).__name__
        raise TypeError(f"src must be a tensor of shape (E, *) (at least 1-D), got {got}")
    if not isinstance(index, Tensor):
        raise TypeError(f"index must be an integer tensor of shape (E,), got {type(index).__name__}")
    _check_strided("src", src, "pass src.to_dense()")
    _check_strided("index", index, "pass index.to_dense()")
    if index.dim() != 1:
        raise ValueError(f"index must be 1-D of shape (E,), got shape {tuple(index.shape)}")
    if index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"index must be an integer tensor (int64 or int32), got {index.dtype}")
    if src.shape[0] != index.shape[0]:
        raise ValueError(
            f"src and index disagree on the number of rows: src has {src.shape[0]}, index has {index.shape[0]}"
        )
    if index.device != src.device:
        raise ValueError(f"index must be on the device of src ({src.device}), got {index.device}")
    if isinstance(dim_size, torch.SymInt):  # a traced size (torch.export without dynamo): left symbolic
        if dim_size < 0:
            raise ValueError(f"{size_name} must be non-negative, got {dim_size}")
        return dim_size  # type: ignore[return-value]
    if isinstance(dim_size, bool) or not isinstance(dim_size, numbers.Integral):
        raise TypeError(f"{size_name} must be an int, got {_value_type(dim_size)} ({dim_size!r})")
    if dim_size < 0:
        raise ValueError(f"{size_name} must be non-negative, got {dim_size}")
    dim_size = int(dim_size)
    check_index_range("index", index, size_name, dim_size)  # CPU eager only, as check_edge_index
    return dim_size


def scatter_sum(src: Tensor, index: Tensor, dim_size: int, *, backend: ScatterBackend = "auto") -> Tensor:
    r"""Sum rows of ``src`` into ``dim_size`` buckets: :math:`out_i = \sum_{e: index_e = i} src_e`.

    Args:
        src: values, first dimension indexed by ``index``.
        index: bucket of every row of ``src``; values in ``[0, dim_size)``.
        dim_size: number of output rows (empty buckets are zero).
        backend: ``"auto"`` (torch-scatter for CUDA tensors when installed, else native),
            ``"native"`` or ``"torch_scatter"``.

    Shapes:
        ``src``: ``(E, *)``, ``index``: ``(E,)`` -> ``(dim_size, *)``.

    Examples:
        >>> scatter_sum(torch.tensor([1., 2., 3.]), torch.tensor([0, 2, 0]), 3)
        tensor([4., 0., 2.])
    """
    dim_size = _check_index(src, index, dim_size)
    index = index.long()
    if _use_torch_scatter(src, backend):
        return _scatter_module().scatter_add(src, index, dim=0, dim_size=dim_size)
    out = src.new_zeros((dim_size,) + tuple(src.shape[1:]))
    return out.index_add_(0, index, src)


def scatter_max(src: Tensor, index: Tensor, dim_size: int, *, backend: ScatterBackend = "auto") -> Tensor:
    r"""Row-wise maximum per bucket: :math:`out_i = \max_{e: index_e = i} src_e`; empty buckets are 0.

    The result is meant for numerical stabilisation and is returned without gradient history.

    Args:
        src: values, first dimension indexed by ``index``.
        index: bucket of every row; values in ``[0, dim_size)``.
        dim_size: number of output rows.
        backend: see :func:`scatter_sum`.

    Shapes:
        ``src``: ``(E, *)``, ``index``: ``(E,)`` -> ``(dim_size, *)``.

    Examples:
        >>> scatter_max(torch.tensor([1., 5., 3.]), torch.tensor([0, 0, 2]), 3)
        tensor([5., 0., 3.])
    """
    dim_size = _check_index(src, index, dim_size)
    index = index.long()
    src = src.detach()
    if _use_torch_scatter(src, backend):
        return _scatter_module().scatter_max(src, index, dim=0, dim_size=dim_size)[0]
    out = src.new_zeros((dim_size,) + tuple(src.shape[1:]))
    expanded = index.view((-1,) + (1,) * (src.dim() - 1)).expand_as(src)
    return out.scatter_reduce_(0, expanded, src, reduce="amax", include_self=False)


def segment_softmax(
    src: Tensor, index: Tensor, num_nodes: int, *, backend: ScatterBackend = "auto"
) -> Tensor:
    r"""Softmax of edge scores over each target's incoming edges.

    .. math::
        \alpha_e = \frac{\exp(s_e - m_{i})}{\sum_{e': index_{e'} = i} \exp(s_{e'} - m_{i})},
        \qquad i = index_e,\; m_i = \max_{e': index_{e'} = i} s_{e'}

    as PyG's :func:`torch_geometric.utils.softmax`. The maximum is detached (softmax is
    shift-invariant, so the gradient is exact). Scores of ``-inf`` get weight 0; a target
    whose every score is ``-inf`` gets all-zero weights rather than NaN. The computation is
    done in float32 at least, and the result returned in the input dtype.

    Args:
        src: edge scores.
        index: target node of every edge (``edge_index[1]`` in PyG convention).
        num_nodes: number of target nodes.
        backend: see :func:`scatter_sum`.

    Shapes:
        ``src``: ``(E, *)`` (e.g. ``(E, H)``), ``index``: ``(E,)`` -> ``(E, *)``.

    Examples:
        >>> w = segment_softmax(torch.tensor([0., 0., 1.]), torch.tensor([1, 1, 0]), 2)
        >>> w
        tensor([0.5000, 0.5000, 1.0000])
    """
    num_nodes = _check_index(src, index, num_nodes, "num_nodes")
    if not src.is_floating_point():  # an integer softmax would be truncated to 0 and 1
        raise TypeError(f"src must be floating-point scores, got {src.dtype}")
    index = index.long()
    dtype = src.dtype
    work = src.float() if dtype in (torch.float16, torch.bfloat16) else src
    m = scatter_max(work, index, num_nodes, backend=backend)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = (work - m.index_select(0, index)).exp()
    denom = scatter_sum(e, index, num_nodes, backend=backend)
    # only an empty (or all -inf) segment's 0 is replaced: a NaN sum must stay NaN, not leave exp(s_e) unnormalised
    denom = torch.where(denom != 0, denom, torch.ones_like(denom))
    return (e / denom.index_select(0, index)).to(dtype)
