"""Reusable, model- and task-agnostic training engine.

``Trainer(model, task, TrainConfig(...), out_dir).fit()`` runs AdamW with warm-up + cosine
schedule, gradient clipping, periodic evaluation, bf16 autocast on CUDA, optional
``torch.compile``, JSON-lines metrics (plus CSV / TensorBoard on request), gradient
accumulation, an fp16 GradScaler, atomic bit-exact-resumable checkpoints and, under
``torchrun``, DistributedDataParallel. The task supplies batches, the loss and evaluation
(see :class:`Task`).
"""

from __future__ import annotations

from .batch import to_device
from .checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from .config import TrainConfig, resolve_amp, resolve_device
from .distributed import DistContext, dist_env, init_distributed, shard_batch
from .errors import CheckpointError, NonFiniteLossError
from .loggers import CSVLog, TensorBoardLog, open_loggers, read_metrics_csv
from .metrics import METRICS_NAME, MetricsLog, read_metrics
from .optim import build_optimizer, param_groups
from .rng import capture_rng_state, preserve_rng_state, restore_rng_state, seed_everything
from .schedule import cosine_lr
from .task import Task, check_task
from .trainer import RESUMABLE_FIELDS, SUMMARY_NAME, Trainer, train

__all__ = [
    "CHECKPOINT_NAME",
    "METRICS_NAME",
    "RESUMABLE_FIELDS",
    "SUMMARY_NAME",
    "CSVLog",
    "CheckpointError",
    "DistContext",
    "MetricsLog",
    "NonFiniteLossError",
    "Task",
    "TensorBoardLog",
    "TrainConfig",
    "Trainer",
    "build_optimizer",
    "capture_rng_state",
    "check_task",
    "cosine_lr",
    "dist_env",
    "init_distributed",
    "load_checkpoint",
    "open_loggers",
    "param_groups",
    "preserve_rng_state",
    "read_metrics",
    "read_metrics_csv",
    "resolve_amp",
    "resolve_device",
    "restore_rng_state",
    "save_checkpoint",
    "seed_everything",
    "shard_batch",
    "to_device",
    "train",
]
