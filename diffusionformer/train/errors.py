"""Exceptions raised by the training engine."""

from __future__ import annotations

__all__ = ["NonFiniteLossError", "CheckpointError"]


class NonFiniteLossError(RuntimeError):
    """The training loss (or, at a checkpoint, a parameter) became NaN or infinite.

    Raised at the first log/eval/checkpoint boundary after it happened, before anything is
    saved, so the last checkpoint on disk holds finite parameters.

    Attributes:
        step: 0-based index of the first bad update (the ``step`` that was passed to
            ``task.train_batch``).
        last_checkpoint_step: number of updates in the last good checkpoint (``None`` if the
            run has none).
    """

    def __init__(self, message: str, *, step: int, last_checkpoint_step: int | None) -> None:
        super().__init__(message)
        self.step = step
        self.last_checkpoint_step = last_checkpoint_step


class CheckpointError(RuntimeError):
    """A checkpoint file is unreadable, truncated, corrupt or not a training checkpoint.

    The file is left untouched.
    """

    #: what ``torch.load(weights_only=True)`` refused in a whole file (``_files.weights_only_refusal``, set by
    #: ``load_checkpoint``), for the runner's and the command line's advice; ``None`` otherwise
    _weights_only_refusal: str | None = None


class _NotACheckpointFile(CheckpointError, FileNotFoundError):
    """A folder (a FIFO, a device) where a run's checkpoint goes: a CheckpointError, so that a comparison fails that
    run alone, and the FileNotFoundError that ``load_checkpoint`` raises for it."""


class _CheckpointBeyondBudget(CheckpointError, ValueError):
    """A checkpoint of a step beyond ``max_steps`` (a longer run's): a CheckpointError, so that a comparison fails
    that run alone, and the ValueError the trainer raised for it."""
