"""The protocol between the training loop and a task (data + loss + evaluation)."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

__all__ = ["Task", "check_task"]

_REQUIRED = ("train_batch", "loss", "evaluate")


@runtime_checkable
class Task(Protocol):
    r"""What :class:`~diffusionformer.train.Trainer` needs from an experiment.

    The trainer minimises :math:`\mathbb{E}_{b}\,\ell(\theta; b)` with batches
    :math:`b_s = \texttt{train\_batch}(s, g)` drawn from a seeded ``torch.Generator`` ``g``
    whose state is checkpointed: a batch must be a deterministic function of ``step`` and the
    draws it makes from ``generator`` (draw the randomness from ``generator``, never from an
    unseeded source or a data-loader worker), which is what makes a resumed run bit-identical.

    Required methods:

    * ``train_batch(step: int, generator: torch.Generator, batch_size: int) -> batch``:
      the *global* batch for update ``step`` (0-based), on the CPU or any device. A batch is a
      tensor or a (nested) ``dict``/``list``/``tuple`` of tensors and plain values, or any
      object with ``.to(device)`` (e.g. a PyG ``Data``); the trainer moves it to the device.
      Full-batch tasks (node classification) may ignore ``batch_size``.
    * ``loss(model: nn.Module, batch) -> (loss, metrics)``: a scalar loss tensor averaged over
      the batch (so that DDP's gradient average over equal shards equals the global mean) and
      a ``dict[str, float | scalar tensor]`` of extra training metrics (e.g. accuracy; NumPy
      scalars are numbers too), logged as window means (averaged over ranks: use the same keys on
      every rank). The names ``"loss"``, when ``grad_clip > 0`` ``"grad_norm"`` and under
      ``amp="fp16"`` ``"skipped_updates"`` are the trainer's own and are refused. Call
      ``model(...)`` (not ``model.module``) so DDP can sync gradients.
      Runs under bf16 autocast when enabled.
    * ``evaluate(model: nn.Module, max_batches: int | None) -> dict[str, float]``: held-out
      metrics of the *unwrapped* model, called in ``eval()`` mode under ``torch.no_grad()``;
      ``max_batches`` is ``TrainConfig.eval_steps`` (``None`` = the full split, or the task's own
      count where a split has no end: :class:`~diffusionformer.experiments.tasks.TextLMTask`'s random
      windows). A ``"loss"`` key is also reported as the record's ``loss``. Every rank calls it
      with identical weights; random draws inside it do not advance the training generators.

    Optional method:

    * ``shard_batch(batch, rank: int, world_size: int) -> batch``: this rank's part of the
      global batch under DDP. Default: :func:`~diffusionformer.train.shard_batch` (contiguous
      equal slices of dim 0 of every tensor). A full-graph task can return the batch unchanged
      (each rank then computes the same loss and the averaged gradient is the single-process one).

    Optional attribute:

    * ``splits_into_micro_batches`` (default ``True``): ``False`` when ``grad_accum_steps`` micro-batches
      cannot add up to the whole batch's update (a full-graph task, or a loss with side effects per
      call such as DINO's teacher EMA); the Trainer then refuses ``grad_accum_steps > 1``.
    """

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> Any: ...

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, Mapping[str, Any]]: ...

    def evaluate(self, model: nn.Module, max_batches: int | None) -> Mapping[str, Any]: ...


def check_task(task: object) -> None:
    """Raise ``TypeError`` naming the missing methods if ``task`` does not follow :class:`Task`, or naming the class
    when ``task`` is a class whose methods need an instance (``MyTask`` given for ``MyTask()``).

    Args:
        task: the object passed to the trainer.

    Examples:
        >>> check_task(object())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: task: expected an object with callable ... got object missing train_batch, loss, evaluate
    """
    if isinstance(task, type):  # its methods would take the step for ``self``; static or class methods do not
        unbound = [name for name in _REQUIRED if _binds_an_instance(task, name)]
        if unbound:
            cls = task.__name__
            raise TypeError(f"task: expected an object following diffusionformer.train.Task, got the class {cls} "
                            f"itself (instance methods: {', '.join(unbound)}): pass {cls}(...)")
    missing = [name for name in _REQUIRED if not callable(getattr(task, name, None))]
    if missing:
        raise TypeError(
            f"task: expected an object with callable {', '.join(_REQUIRED)} (see "
            f"diffusionformer.train.Task), got {type(task).__name__} missing {', '.join(missing)}"
        )
    shard = getattr(task, "shard_batch", None)
    if shard is not None and not callable(shard):
        raise TypeError(f"task.shard_batch: expected a callable, got {type(shard).__name__}")


def _binds_an_instance(cls: type, name: str) -> bool:
    """Whether ``cls.<name>`` is a method of its instances: found where an instance looks (``cls``'s MRO, not its
    metaclass, whose methods are the class's own), a descriptor that binds the instance (a function, a
    ``functools.partialmethod`` or ``lru_cache``, a method of a C type), not a static, class or bound method."""
    raw = next((vars(k)[name] for k in cls.__mro__ if name in vars(k)), None)
    return hasattr(type(raw), "__get__") and not isinstance(raw, (staticmethod, classmethod, types.MethodType))
