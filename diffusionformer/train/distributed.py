"""Multi-process data-parallel training on ``torch.distributed`` (launched by ``torchrun``).

``torchrun --nproc_per_node=N script.py`` starts N processes with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set. :func:`init_distributed` reads them,
binds each process to its device (``cuda:LOCAL_RANK`` on GPU) and joins the process group
(NCCL on CUDA, Gloo on CPU). Each rank takes an equal contiguous slice of the global batch
(:func:`shard_batch`) and ``DistributedDataParallel`` averages the gradients, so the update
equals the single-process update on the whole batch (for a loss that is a mean over samples; not with BatchNorm,
which normalises each rank's shard by its own statistics, nor with dropout, whose masks each rank draws from
its own stream).
"""

from __future__ import annotations

import itertools
import numbers
import os
from collections import UserDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.utils.rnn import PackedSequence

from .batch import _rebuild_mapping
from .config import resolve_device

__all__ = ["DistContext", "dist_env", "init_distributed", "shard_batch"]


def dist_env() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` from the ``torchrun`` environment, or ``None``.

    ``None`` when ``WORLD_SIZE`` is unset, blank or ``1`` (a single process, where a blank ``RANK`` or
    ``LOCAL_RANK`` is unset too). A ``WORLD_SIZE`` that is no integer or below 1 is a ``ValueError``, as the
    experiment runner reads it.

    Examples:
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}):
        ...     dist_env()
        (1, 2, 1)
        >>> with mock.patch.dict(os.environ, {"RANK": "0", "WORLD_SIZE": "1"}):
        ...     dist_env() is None
        True
    """
    world = os.environ.get("WORLD_SIZE")
    try:
        world_size = _env_world_size()
        if world_size is None:  # blank as unset: one process, as the runner and _rank_zero read it
            return None
        raw_rank, raw_local = os.environ.get("RANK"), os.environ.get("LOCAL_RANK")
        # one process without a RANK (unset or blank) is rank 0, as _rank_zero reads it; a blank LOCAL_RANK there is
        # unset too (it was refused, though the one process never reads it)
        rank = 0 if world_size == 1 and (raw_rank is None or not raw_rank.strip()) else int(os.environ["RANK"])
        local_rank = rank if _local_rank_unset(raw_local, world_size) else int(raw_local)
    except (KeyError, ValueError) as err:
        raise ValueError(
            "distributed environment: expected integer RANK, WORLD_SIZE and LOCAL_RANK (as set by "
            f"torchrun), got RANK={os.environ.get('RANK')!r} WORLD_SIZE={world!r} "
            f"LOCAL_RANK={os.environ.get('LOCAL_RANK')!r}"
        ) from err
    if not 0 <= rank < world_size:  # (a WORLD_SIZE below 1 too, which the runner refuses alike)
        raise ValueError(
            f"distributed environment: expected 0 <= RANK < WORLD_SIZE, got RANK={rank} "
            f"WORLD_SIZE={world_size}"
        )
    if local_rank < 0:  # it picks the CUDA device: cuda:-1 would fail far from here
        raise ValueError(f"distributed environment: expected LOCAL_RANK >= 0, got LOCAL_RANK={local_rank}")
    return None if world_size == 1 else (rank, world_size, local_rank)


def _env_world_size() -> int | None:
    """torchrun's ``WORLD_SIZE`` as an int, ``None`` where unset or blank (one process): the one parser of
    :func:`dist_env`, :func:`_rank_zero` and the experiment runner. A value that is no integer is a ``ValueError``
    naming it (each caller words or ignores it); one below 1 is returned, for the caller to refuse."""
    raw = os.environ.get("WORLD_SIZE")
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"WORLD_SIZE: expected an integer number of processes (as torchrun sets it), "
                         f"got {raw!r}") from None


def _local_rank_unset(raw: str | None, world_size: int) -> bool:
    """Whether a ``LOCAL_RANK`` of ``raw`` counts as unset (the rank stands for it): unset, or blank in a one-process
    run, which never reads it (:func:`dist_env` and :func:`init_distributed` with a caller's group agree)."""
    return raw is None or (world_size == 1 and not raw.strip())


def _rank_zero() -> bool:
    """Whether this process is the one that prints and writes: no ``torchrun`` group, or its rank 0. An unset or
    blank ``RANK`` is rank 0; a malformed one counts as rank 0 too (:func:`dist_env` names the variable when a
    multi-process run reads it). A ``WORLD_SIZE`` unset, blank or at most 1 is one process, as :func:`dist_env`
    reads it, whatever ``RANK`` a stray environment holds (else the runner wrote none of the results that process
    trained: the trainer writes as its rank 0); one below 1 or malformed, which :func:`dist_env` and the runner
    refuse, counts as one process too (this never raises: it picks the process that prints that error)."""
    try:
        world = _env_world_size()
        if world is None or world <= 1:
            return True
        return int(os.environ.get("RANK", "").strip() or 0) == 0
    except ValueError:
        return True


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in a (possibly single-process) data-parallel run.

    Args:
        rank: global rank (0 is the one that writes files).
        world_size: number of processes.
        local_rank: index on this node (selects the GPU).
        device: this process's training device.
        owns_group: whether :func:`init_distributed` created the process group (and
            :meth:`shutdown` should destroy it).
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes metrics, checkpoints and the summary."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """More than one process."""
        return self.world_size > 1

    def barrier(self) -> None:
        """Wait for every rank (no-op in a single process)."""
        if not self.is_distributed:
            return
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def all_reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mean of ``tensor`` over ranks (a new tensor; identity in a single process).

        Shapes:
            tensor: any shape, identical on every rank.
        """
        if not self.is_distributed:
            return tensor
        out = tensor.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)  # Gloo has no AVG
        return out / self.world_size

    def all_reduce_min(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise minimum of ``tensor`` over ranks (a new tensor)."""
        if not self.is_distributed:
            return tensor
        out = tensor.clone()
        dist.all_reduce(out, op=dist.ReduceOp.MIN)
        return out

    def shutdown(self) -> None:
        """Destroy the process group if this context created it."""
        if self.owns_group and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _on_every_rank(ctx: DistContext, what: str, fn: Callable[[], Any], *, here: bool = True) -> None:
    """``fn()`` where ``here`` (rank 0 alone writes the logs, checkpoints and summary), then
    :func:`_raise_on_every_rank` with what it raised: if it failed on any rank, every rank stops at once. A
    collective: every rank calls it, in the same order."""
    error: Exception | None = None
    if here:
        try:
            fn()
        except Exception as err:
            error = err
    _raise_on_every_rank(ctx, error, what)


def _raise_on_every_rank(ctx: DistContext, error: Exception | None, what: str,
                         same_kind: type[Exception] | None = None) -> None:
    """Agree across ranks on a step only some ranks take (rank 0 alone opens the loggers and writes checkpoints): the
    failing rank re-raises its ``error``, every other rank a RuntimeError naming that rank and its cause, at once
    (else they wait for it at their next collective, until the process-group timeout). A collective: every rank calls
    it, with ``error=None`` where the step went well. Where every failing rank's error is a ``same_kind`` (a
    :class:`~diffusionformer.train.CheckpointError`: a run that fails alone), the others raise that class, not a
    RuntimeError, so that every rank takes the same way on; where one's is not, a rank of a ``same_kind`` error
    raises that RuntimeError too (from its own).

    A failing rank posts its cause under a fresh key of the group's store, then every rank meets at a barrier and
    looks for the keys. No tensor collective: Gloo's worker threads may free a finished one's Python-owned tensors
    late, and the process group a DDP module has used outlives ``destroy_process_group``, so one that ran just before
    the interpreter exits can abort it ("terminate called without an active exception")."""
    if not ctx.is_distributed:
        if error is not None:
            raise error
        return
    store = dist.distributed_c10d._get_default_store()
    call = next(_agreements)  # the same count on every rank: each calls this in the same order
    keys = [f"diffusionformer/failed/{call}/{rank}" for rank in range(ctx.world_size)]
    if error is not None:
        store.set(keys[ctx.rank], f"{type(error).__name__}: {error}")
        if same_kind is not None and isinstance(error, same_kind):
            store.set(f"{keys[ctx.rank]}/same_kind", "1")
    ctx.barrier()  # every cause is posted before any rank looks
    causes = {rank: store.get(key).decode(errors="replace") for rank, key in enumerate(keys)
              if rank != ctx.rank and store.check([key])}
    # the failing ranks whose error is no same_kind: one stops every rank (else a rank of a same_kind error went on
    # to its next collective while that one stopped); read before the last meeting, as the causes
    apart = sorted(causes) if same_kind is None else [
        rank for rank in sorted(causes) if not store.check([f"{keys[rank]}/same_kind"])]
    # meet once more so that no rank leaves before the others have read the store (rank 0 may host it): after a run's
    # last agreement (its summary) rank 0's script can end while another rank still reads, which then met
    # "DistNetworkError: Connection reset by peer" and failed a run that went well
    ctx.barrier()
    if error is None and not causes:
        return
    alike = same_kind is not None and isinstance(error, same_kind)
    if error is not None and not (alike and apart):
        raise error
    if not apart:  # every failing rank's error a same_kind: this rank fails that step too, and goes on as they do
        rank = min(causes)
        failed = same_kind(f"{what} failed on rank {rank} ({causes[rank]}); rank {ctx.rank} fails it too")
        failed._failed_on_rank = rank  # type: ignore[attr-defined]  # this rank's step went well (its advice)
        raise failed
    rank = apart[0]
    raise RuntimeError(f"{what} failed on rank {rank} ({causes[rank]}); rank {ctx.rank} stops too rather than wait "
                       "for it at the next collective") from error


_agreements = itertools.count()


def init_distributed(device: str = "auto") -> DistContext:
    """Resolve the device and, under ``torchrun``, join the process group.

    * No ``WORLD_SIZE`` (or ``1``), no existing group: a single process on ``device``.
    * A group already initialised by the caller: it is used as is (and not destroyed later).
    * Otherwise ``dist.init_process_group`` with NCCL when the device is CUDA
      (``cuda:LOCAL_RANK``, made current) and Gloo otherwise; rendezvous through
      ``MASTER_ADDR``/``MASTER_PORT`` (the ``env://`` method).

    Args:
        device: ``TrainConfig.device`` (``"auto"``, ``"cpu"``, ``"cuda"``, ...).
    """
    if dist.is_available() and dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
        raw = os.environ.get("LOCAL_RANK")
        try:  # else int()'s bare "invalid literal for int() with base 10: 'x'"
            local_rank = rank if _local_rank_unset(raw, world_size) else int(raw)
        except ValueError:
            local_rank = -1
        if local_rank < 0:  # it picks the CUDA device: cuda:-1 would fail far from here
            raise ValueError(f"distributed environment: expected LOCAL_RANK an int >= 0 (as set by torchrun), "
                             f"got LOCAL_RANK={raw!r}")
        dev = resolve_device(device, local_rank if world_size > 1 else None)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        return DistContext(rank, world_size, local_rank, dev, owns_group=False)
    env = dist_env()
    if env is None:
        return DistContext(0, 1, 0, resolve_device(device), owns_group=False)
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    rank, world_size, local_rank = env
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        dist.init_process_group(backend="nccl", device_id=dev)
    else:
        dist.init_process_group(backend="gloo")
    return DistContext(rank, world_size, local_rank, dev, owns_group=True)


def shard_batch(batch: Any, rank: int, world_size: int) -> Any:
    """This rank's contiguous, equal slice of dim 0 of every tensor in a nested batch.

    Rank ``r`` of ``W`` gets rows ``[r B / W, (r + 1) B / W)``; 0-dim tensors and non-tensor
    leaves are shared unchanged. Every other tensor must have the batch dimension first (one ``B``
    for all; an ``edge_index`` ``(2, E)`` beside ``(N, D)`` features is refused: such a batch needs
    the task's own ``shard_batch``; so are targets flattened to ``(B*T,)`` beside ``(B, T)`` inputs:
    keep them ``(B, T)``). With equal shards, the mean of the per-rank mean losses is the
    global mean loss, so DDP's averaged gradient equals the single-process gradient.

    Args:
        batch: tensor or nested ``dict``/``list``/``tuple`` of tensors and plain values (a ``dict``
            subclass or ``UserDict`` keeps its type, other mappings become a ``dict``).
        rank: this process's rank (``0 <= rank < world_size``).
        world_size: number of processes; must divide every tensor's dim 0.

    Shapes:
        every tensor: ``(B, ...) -> (B / world_size, ...)``.

    Examples:
        >>> shard_batch({"x": torch.arange(6), "n": 3}, rank=1, world_size=3)
        {'x': tensor([2, 3]), 'n': 3}
    """
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # numpy ints too, read as ints
            raise TypeError(f"shard_batch: expected {name} an int, got {type(value).__name__} ({value!r})")
    rank, world_size = int(rank), int(world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"shard_batch: expected 0 <= rank < world_size, got rank={rank} world_size={world_size}")
    if world_size == 1:
        return batch
    shapes: dict[str, tuple[int, ...]] = {}
    _tensor_shapes(batch, "batch", shapes)
    if len({shape[0] for shape in shapes.values() if shape[0]}) > 1:  # (an empty tensor splits into empty ones)
        # else an edge_index (2, E) or a per-class weight (C,) beside (B, ...) tensors was cut into rows silently
        listed = ", ".join(f"{path} {shape}" for path, shape in list(shapes.items())[:6])
        raise ValueError(f"shard_batch: expected every tensor of the batch to have the batch dimension first, got "
                         f"different first sizes: {listed}; give the task a shard_batch(batch, rank, world_size) "
                         "method that splits such a batch, reshape flattened per-token targets (B*T,) to (B, T), "
                         "or pass shared values as 0-dim tensors or plain values")
    return _shard(batch, rank, world_size)


def _tensor_shapes(batch: Any, path: str, out: dict[str, tuple[int, ...]]) -> None:
    """The shapes of the tensors (not 0-dim) of a nested batch, by their path (``batch['x'][0]``), as
    :func:`shard_batch` walks it."""
    if isinstance(batch, torch.Tensor):
        if batch.dim():
            out[path] = tuple(batch.shape)
    elif isinstance(batch, Mapping):  # (a UserDict is one)
        for k, v in batch.items():
            _tensor_shapes(v, f"{path}[{k!r}]", out)
    elif isinstance(batch, (list, tuple)) and not isinstance(batch, PackedSequence):
        for i, v in enumerate(batch):
            _tensor_shapes(v, f"{path}[{i}]", out)


def _shard(batch: Any, rank: int, world_size: int) -> Any:
    """:func:`shard_batch` once its arguments and the batch's first sizes are checked."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            return batch
        B = batch.shape[0]
        if B % world_size != 0:
            raise ValueError(
                f"shard_batch: expected the batch dimension divisible by world_size={world_size}, "
                f"got a tensor of shape {tuple(batch.shape)} (set batch_size to a multiple of the "
                "number of processes, or give the task a shard_batch method)"
            )
        size = B // world_size
        return batch[rank * size : (rank + 1) * size]
    if isinstance(batch, Mapping):
        parts = {k: _shard(v, rank, world_size) for k, v in batch.items()}
        # a dict subclass or UserDict keeps its type (an OrderedDict, a batch with attribute access), as in to_device
        return _rebuild_mapping(batch, parts) if isinstance(batch, (dict, UserDict)) else parts
    if isinstance(batch, PackedSequence):  # its rows are time steps of every sequence: sliced, they are garbage
        raise TypeError(
            "shard_batch: expected tensors, dict/list/tuple containers or plain values, got a PackedSequence "
            "(dim 0 of its data is time steps, not samples); give the task a shard_batch(batch, rank, world_size) "
            "method that splits the sequences before packing"
        )
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_shard(v, rank, world_size) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_shard(v, rank, world_size) for v in batch)
    # NumPy scalars too (np.float32, np.int64, np.bool_): shared like the Python numbers they stand for
    if batch is None or isinstance(batch, (bool, int, float, str, bytes, numbers.Number, np.generic)):
        return batch
    raise TypeError(
        f"shard_batch: expected tensors, dict/list/tuple containers or plain values, got "
        f"{type(batch).__name__}; give the task a shard_batch(batch, rank, world_size) method"
    )
