"""The training loop: AdamW, warm-up + cosine schedule, clipping, evaluation, checkpoints, DDP."""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import time
import warnings
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from .batch import to_device
from .checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    load_checkpoint,
    model_record,
    _predated_fields_at_default,
    model_record_differences,
    save_checkpoint,
)
from .config import TrainConfig, _as_float, _type_name, resolve_amp
from .distributed import DistContext, _on_every_rank, _raise_on_every_rank, init_distributed, shard_batch
from .errors import CheckpointError, NonFiniteLossError, _CheckpointBeyondBudget, _NotACheckpointFile
from .loggers import CSV_NAME, TENSORBOARD_DIR, open_loggers
from .metrics import METRICS_NAME, write_json_atomic
from .optim import build_optimizer
from .rng import capture_rng_state, preserve_rng_state, restore_rng_state, seed_everything
from .schedule import cosine_lr
from .task import Task, check_task

__all__ = ["Trainer", "train", "SUMMARY_NAME", "RESUMABLE_FIELDS"]

SUMMARY_NAME = "summary.json"

#: Config fields that may differ between a checkpoint and the run that resumes it: they do not
#: change the sequence of updates, up to floating-point rounding for ``device`` and ``compile``
#: (``lr_decay_steps`` is compared after resolving ``None``). ``amp`` is not among them: bf16
#: autocast changes every update, so a run resumes in the precision it started with (compared after
#: resolving ``"auto"`` on each run's device: an ``"auto"`` run started in bf16 on CUDA is not continued
#: in float32 on the CPU).
RESUMABLE_FIELDS = frozenset(
    {"max_steps", "lr_decay_steps", "eval_interval", "eval_steps", "log_interval",
     "checkpoint_interval", "device", "compile", "progress", "loggers"}
)

#: the resolved autocast dtype (:func:`resolve_amp`) -> the name the summary and the checkpoint record
_AMP_NAMES = {None: "off", torch.bfloat16: "bf16", torch.float16: "fp16"}
# the train log's count of the updates of a window the fp16 GradScaler skipped (a metric of every fp16 train record)
_SKIPPED = "skipped_updates"

_NO_BAD_STEP = 2**62  # "no non-finite step yet" in the on-device running minimum


def _log_value(value: torch.Tensor) -> torch.Tensor:
    """A loss or metric as the train log window sums it: float64 stays float64 and an integer count is summed in
    float64 (a finite float64 loss beyond float32's range was logged as inf, every float64 value and any count above
    2**24 rounded to float32); anything else in float32."""
    wide = value.dtype == torch.float64 or not (value.is_floating_point() or value.is_complex() or
                                                value.dtype == torch.bool)
    return value.double() if wide else value.float()


_HALF = (torch.float16, torch.bfloat16)


def _grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm of ``grads``: torch's ``get_total_norm``, except that half-precision gradients are normed in
    float32 (torch norms each tensor, and the norms, in the gradients' dtype: a float16 norm past 65504 overflowed to
    inf, a bfloat16 one was off by up to 2**-8 relative, and so was the clipping)."""
    if not any(g.dtype in _HALF for g in grads):
        return torch.nn.utils.get_total_norm(grads, foreach=True)
    norms = [torch.linalg.vector_norm(g, dtype=torch.promote_types(g.dtype, torch.float32)) for g in grads]
    return torch.linalg.vector_norm(torch.stack(norms))


def _clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm)`` with the total norm of :func:`_grad_norm`."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads or not any(g.dtype in _HALF for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    total = _grad_norm(grads)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def _device_name(device: torch.device) -> str | None:
    """The GPU model a run trains on (``torch.cuda.get_device_name``: ``"NVIDIA H100 80GB HBM3"``), recorded in its
    summary beside ``device`` (``"cuda:0"`` names no model: runs of one comparison trained by GPU calls on an H100 and
    on an H200 read as one device); ``None`` on another device than CUDA.

    Examples:
        >>> _device_name(torch.device("cpu")) is None
        True
    """
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def _model_amp(spec: str, device: torch.device, model: nn.Module) -> torch.dtype | None:
    """The autocast dtype of ``TrainConfig.amp`` for ``model`` on ``device``: :func:`resolve_amp`, except that autocast
    leaves float64 alone, so a model whose floating-point parameters are all float64 trains without it: ``"auto"``
    resolves to off (recorded so), an explicit ``"bf16"``/``"fp16"`` is refused (the run would record a precision
    it never ran in)."""
    amp = resolve_amp(spec, device)
    if amp is None:
        return None
    floats = [p.dtype for p in model.parameters() if p.is_floating_point()]
    if floats and all(dtype == torch.float64 for dtype in floats):
        if spec == "auto":
            return None
        raise ValueError(f"Trainer: amp={spec!r} has no effect on a float64 model (autocast leaves float64 "
                         "alone): use amp='off' (or 'auto'), or build the model in float32")
    return amp


@contextlib.contextmanager
def _entries_fit(path: Any, expected: str) -> Any:
    """Turn an error raised while loading checkpoint entries into a :class:`CheckpointError` naming the file:
    "checkpoint PATH: expected EXPECTED: <error type>: <error>"."""
    try:
        yield
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
        raise CheckpointError(f"checkpoint {path}: expected {expected}: {type(err).__name__}: {err}") from err


def _check_optimizer_state_shapes(optimizer: torch.optim.Optimizer) -> None:
    """A ValueError when a loaded AdamW moment is not a tensor of its parameter's shape: ``load_state_dict`` checks
    only the number of parameters, and the first update would fail with a bare RuntimeError far from the file."""
    for group in optimizer.param_groups:
        names = group.get("names") or [None] * len(group["params"])
        for name, p in zip(names, group["params"]):
            for key, value in optimizer.state.get(p, {}).items():
                if key != "step" and not (isinstance(value, torch.Tensor) and value.shape == p.shape):
                    got = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else _type_name(value)
                    raise ValueError(f"optimizer state {key!r} of parameter {name or tuple(p.shape)} to be a tensor "
                                     f"of its shape {tuple(p.shape)}, got {got}")


def _refuse_untrainable_state(what: str) -> None:
    """Refuse to train under ``torch.inference_mode()`` or at the default device ``meta``: the loss recorded no graph
    under the first, and ``what`` failed at its first step with "task.loss: expected a loss that requires grad
    (computed from the model)", which blamed the task; under the second, torch's "Cannot copy out of meta tensor"
    (the trainer), or an IndexError of the data (the runner), named neither."""
    if torch.is_inference_mode_enabled():
        raise RuntimeError(f"{what}: expected to be called outside torch.inference_mode(), got a call inside it: "
                           "training needs autograd, which inference mode turns off (tensors made there cannot be "
                           "trained either); call it outside the inference_mode block")
    _refuse_meta_default_device(what, "made while training")


def _refuse_meta_default_device(what: str, made: str) -> None:
    """Refuse to run ``what`` at the default device ``meta``, whose tensors (those ``made`` there) hold no values."""
    if torch.get_default_device().type == "meta":
        raise RuntimeError(f"{what}: expected a default device that holds data, got 'meta' (a "
                           "torch.set_default_device('meta') or a `with torch.device('meta'):` block): the tensors "
                           f"{made} would have no values; call it at the default device 'cpu' (or a CUDA device)")


class Trainer:
    r"""Minimise a task's loss with AdamW, resumable bit-exactly, on 1 or N processes.

    Update ``s = 0, 1, ..., max_steps - 1`` draws the global batch
    ``b_s = task.train_batch(s, g, batch_size)`` from a seeded, checkpointed generator ``g``,
    takes this rank's shard, splits it into ``grad_accum_steps`` equal micro-batches ``m`` and
    for each computes ``loss, metrics = task.loss(model, m)`` (bf16 autocast on CUDA; fp16 with
    a :class:`torch.amp.GradScaler` when ``amp="fp16"``) and back-propagates
    ``loss / grad_accum_steps``; then it clips the global gradient norm to ``grad_clip`` and takes an AdamW
    step (Loshchilov & Hutter, ICLR 2019) with learning rate :func:`cosine_lr` ``(s)`` and weight
    decay on matrices only (:func:`param_groups`). "Step ``k``" in logs and checkpoints means
    ``k`` updates done.

    Every ``log_interval`` updates a train record (window means; under fp16 also the window's count of skipped
    updates, ``skipped_updates``) goes to
    ``<out_dir>/metrics.jsonl`` (and to ``metrics.csv`` / TensorBoard when ``loggers`` asks); every ``eval_interval`` updates ``task.evaluate`` runs (without
    advancing the training RNGs); every ``checkpoint_interval`` updates
    ``<out_dir>/checkpoint.pt`` is replaced atomically with model, optimizer, step, all RNG
    states (Python, NumPy, torch CPU/CUDA, batch generator) and config. The last update always
    logs, evaluates and checkpoints, then ``<out_dir>/summary.json`` is written.

    A non-finite loss or gradient norm raises :class:`NonFiniteLossError` at the next of these
    boundaries, before anything is saved, so the checkpoint on disk stays the last good one.
    With ``resume=True`` a run restarts from ``checkpoint.pt`` (or from scratch if there is
    none), the metrics log is cut back to the checkpoint's step, and the run ends with the
    same weights, bit for bit, as one that was never interrupted.

    Under ``torchrun`` the process group is joined (:func:`init_distributed`), the model is
    wrapped in ``DistributedDataParallel``, each rank trains on its slice of the global batch
    and only rank 0 writes files. Every rank draws from global generators of its own (dropout, drop-path; rank 0's
    are seeded with ``seed``, as one process's, and every rank's are checkpointed, so a resume by as many processes
    continues each stream), while the batch generator is the same on every rank. So a task that gives every rank the
    whole batch (a full-batch node task) averages the gradients of independent dropout draws, not one process's.
    BatchNorm normalises each rank's shard (and micro-batch) by its own statistics (no ``SyncBatchNorm``), so such a
    model's update is not the whole batch's; rank 0's running statistics are kept (every rank evaluates with them).
    Every trainable parameter must get a gradient at every update (DDP averages them over the ranks; under
    ``grad_accum_steps`` from the last micro-batch, the one DDP averages): one the loss never uses (an auxiliary head)
    is refused before the first update, naming it (freeze it); a train metric
    that ``task.loss`` returns on some ranks only is logged as its mean over those ranks.

    Args:
        model: the module to train; moved to the device. Build it after
            :func:`seed_everything` for a reproducible initialisation. A ``torch.compile``
            wrapper trains as given; checkpoints, resume and evaluation use the model inside it.
            Its parameters are updated in their own dtype (there is no float32 master copy): trainable float16
            parameters are refused (AdamW writes inf/NaN into them) and bfloat16 ones warn (small updates are
            rounded away); train float32 weights under ``amp="fp16"``/``"bf16"`` instead.
        task: an object following :class:`Task`.
        config: the :class:`TrainConfig`.
        out_dir: run directory (created if needed).
        resume: ``False`` (``out_dir`` must not hold a run), ``True`` (continue from
            ``<out_dir>/checkpoint.pt`` if it exists) or the path of a checkpoint to continue from.
    """

    def __init__(
        self,
        model: nn.Module,
        task: Task,
        config: TrainConfig,
        out_dir: str | os.PathLike[str],
        *,
        resume: bool | str | os.PathLike[str] = False,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"Trainer: expected model to be an nn.Module, got {type(model).__name__}")
        check_task(task)
        if not isinstance(config, TrainConfig):
            raise TypeError(
                f"Trainer: expected config to be a TrainConfig, got {type(config).__name__} "
                "(use TrainConfig.from_dict for mappings)"
            )
        if not isinstance(resume, (bool, str, os.PathLike)):
            raise TypeError(
                f"Trainer: expected resume to be a bool or a path, got {_type_name(resume)} ({resume!r})"
            )
        if not isinstance(out_dir, (str, os.PathLike)):  # else Path's "expected str, bytes or os.PathLike object"
            raise TypeError(f"Trainer: expected out_dir to be a path (str or os.PathLike), got "
                            f"{_type_name(out_dir)} ({out_dir!r})")
        if config.grad_accum_steps > 1 and not getattr(task, "splits_into_micro_batches", True):
            raise ValueError(
                f"Trainer: grad_accum_steps={config.grad_accum_steps}, but {type(task).__name__} cannot split an "
                "update into micro-batches (its splits_into_micro_batches is False); use grad_accum_steps=1"
            )
        # a torch.compile wrapper trains as given, but its state dict names every entry "_orig_mod.<name>" and its
        # record names the wrapper's class: checkpoints, resume and evaluation take the model inside it
        inner = getattr(model, "_orig_mod", None)
        self.model = inner if isinstance(inner, nn.Module) else model
        self._given_model = model
        self.task = task
        self.config = config
        self.out_dir = Path(out_dir)
        self.resume = resume
        self.checkpoint_path = self.out_dir / CHECKPOINT_NAME
        self.metrics_path = self.out_dir / METRICS_NAME
        self.summary_path = self.out_dir / SUMMARY_NAME
        self.optimizer: torch.optim.Optimizer | None = None
        self.step = 0
        self.summary: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model={type(self.model).__name__}, task={type(self.task).__name__}, "
            f"out_dir={str(self.out_dir)!r}, max_steps={self.config.max_steps}, step={self.step})"
        )

    # ------------------------------------------------------------------ public
    def fit(self) -> dict[str, Any]:
        """Train to ``config.max_steps`` and return the summary (also in ``summary.json``).

        Training runs with gradients enabled whatever the caller's grad mode (a notebook's earlier
        ``torch.set_grad_enabled(False)``), as evaluation runs under ``torch.no_grad()`` whatever it is; the caller's
        Python, NumPy and torch generators, which training seeds with ``config.seed`` and draws from, are put back
        on return (torch's CPU generator and the training device's; other CUDA devices' are left reseeded).

        Raises:
            RuntimeError: called under ``torch.inference_mode()``, or at the default device ``meta``.
        """
        _refuse_untrainable_state("Trainer.fit")
        ctx = init_distributed(self.config.device)
        self.ctx = ctx
        self._pbar: tqdm | None = None
        log = None
        try:
            error: Exception | None = None
            try:  # rank 0 alone opens files: a failure there (tensorboard missing, a read-only folder) stops every rank
                log = open_loggers(self.config.loggers, self.out_dir, active=ctx.is_main)
            except Exception as err:
                error = err
            _raise_on_every_rank(ctx, error, "opening the loggers")
        except BaseException:
            if log is not None:
                log.close()
            ctx.shutdown()
            raise
        self._log = log
        try:
            # a training call trains: the caller's grad mode is its own again on return (it is thread-local), and
            # so are its generators (the run seeds them with config.seed)
            with preserve_rng_state(ctx.device), torch.enable_grad():
                return self._fit(ctx)
        finally:
            try:
                if self._pbar is not None:
                    self._pbar.close()
                self._log.close()
            finally:  # a logger whose close raised (a full disk) left the process group up
                ctx.shutdown()

    # ------------------------------------------------------------------ setup
    def _resume_payload(self) -> dict[str, Any] | None:
        if self.resume is False:
            existing = [p.name for p in (self.checkpoint_path, self.metrics_path, self.summary_path,
                                         self.out_dir / CSV_NAME, self.out_dir / TENSORBOARD_DIR)
                        if p.exists()]
            if existing:
                raise FileExistsError(
                    f"Trainer: expected an empty run directory (or resume=True), got {self.out_dir} "
                    f"holding {existing}"
                )
            return None
        if self.resume is True:
            path = self.checkpoint_path
            if not path.exists():
                if path.is_symlink():  # else trained from step 0, its log cut and the link replaced, without a word
                    raise CheckpointError(f"checkpoint {path} is a symbolic link to a missing file (or a loop of "
                                          "links): make its target readable (a disk not mounted?) to resume, or "
                                          "delete the link to train from step 0")
                return None
        else:
            path = Path(self.resume)
        try:
            payload = load_checkpoint(path)
        except FileNotFoundError as err:
            if self.resume is not True:
                raise
            # a folder (a FIFO) where the run's checkpoint goes: that run fails alone in a comparison (it stopped all)
            raise _NotACheckpointFile(f"{err}: move it away to train from step 0") from err
        payload["_path"] = str(path)
        return payload

    def _check_resumable(self, payload: Mapping[str, Any]) -> None:
        path = payload["_path"]
        try:
            saved = TrainConfig.from_dict(payload["config"])
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"checkpoint {path}: its config is invalid: {err}") from err
        now = self.config
        # the precision the checkpoint's updates ran in ("amp" resolved on its device; absent in older checkpoints,
        # whose amp is compared as written)
        saved_amp = payload.get("amp")
        if saved_amp is not None and saved_amp not in _AMP_NAMES.values():
            raise CheckpointError(f"checkpoint {path}: expected the precision the trainer saves, one of "
                                  f"{sorted(_AMP_NAMES.values())}, got amp={saved_amp!r}")
        diffs = [
            f"{name}: checkpoint {getattr(saved, name)!r}, now {getattr(now, name)!r}"
            for name in now.to_dict()
            if name not in RESUMABLE_FIELDS and (name != "amp" or saved_amp is None)
            and getattr(saved, name) != getattr(now, name)
        ]
        now_amp = _AMP_NAMES[_model_amp(now.amp, self.ctx.device, self.model)]
        if saved_amp is not None and saved_amp != now_amp:
            diffs.append(
                f"amp (resolved on the run's device): checkpoint {saved_amp!r} (amp={saved.amp!r}), now {now_amp!r} "
                f"(amp={now.amp!r} on {self.ctx.device}); set amp={saved_amp!r} to continue in the checkpoint's "
                "precision"
            )
        if saved.decay_steps != now.decay_steps:
            diffs.append(
                f"lr_decay_steps (resolved; None = max_steps): checkpoint {saved.decay_steps}, "
                f"now {now.decay_steps}"
            )
        if diffs:
            raise ValueError(
                f"resume: expected a config that continues the run in {path}, got differences that "
                f"change the updates: {'; '.join(diffs)}. Use the saved values (set lr_decay_steps "
                "explicitly to extend max_steps) or start a new out_dir."
            )
        if payload["step"] > now.max_steps:  # a longer run's: that run fails alone in a comparison
            raise _CheckpointBeyondBudget(
                f"resume: expected max_steps >= the checkpoint's step {payload['step']}, got {now.max_steps} (a "
                f"longer run's checkpoint, {path}): set max_steps to at least {payload['step']} to continue it"
            )
        saved_model = payload.get("model_record")
        if saved_model is None:
            warnings.warn(f"checkpoint {path} predates model records: resuming without checking that it was "
                          "written by a model of this class, config and head layout", UserWarning, stacklevel=4)
            return
        now_record = model_record(self.model)
        if not (isinstance(saved_model, Mapping)
                and all(isinstance(saved_model.get(k) or {}, Mapping) for k in ("config", "heads"))):
            raise CheckpointError(f"checkpoint {path}: expected a model record as the trainer saves (a mapping with "
                                  f"'class', 'config' and 'heads' mappings), got {_type_name(saved_model)} "
                                  f"({repr(saved_model)[:200]})")
        model_diffs = model_record_differences(_predated_fields_at_default(saved_model, self.model), now_record)
        if model_diffs:
            raise ValueError(
                f"resume: checkpoint {path} was written by a different model ({'; '.join(model_diffs)}); "
                "build the model the checkpoint was trained with, or start a new out_dir"
            )

    def _load_state(
        self, payload: Mapping[str, Any], optimizer: torch.optim.Optimizer, device: torch.device,
        generator: torch.Generator,
    ) -> None:
        path = payload["_path"]
        self._check_same_training_state(payload, optimizer)
        # load_state_dict takes every group entry from the file, the kernel flags too: a CUDA run's fused=True would
        # run torch's fused CPU kernel on a CPU resume, a CPU run's None the loop on CUDA; keep build_optimizer's choice
        kernels = [{k: g[k] for k in ("fused", "foreach") if k in g} for g in optimizer.param_groups]
        with _entries_fit(path, "the state of this model and optimizer, got one that does not fit"):
            self.model.load_state_dict(payload["model"])
            optimizer.load_state_dict(payload["optimizer"])
            _check_optimizer_state_shapes(optimizer)
        for group, kernel in zip(optimizer.param_groups, kernels):
            group.update(kernel)
            if group.get("fused") or group.get("capturable"):  # load_state_dict placed the steps by the file's flags
                for p in group["params"]:
                    state = optimizer.state.get(p, {})
                    if isinstance(state.get("step"), torch.Tensor):  # the fused kernel's: float32 on the device
                        state["step"] = state["step"].to(dtype=torch.float32, device=p.device)
        # _save never writes non-finite parameters: a checkpoint holding some is not a "last good" one to resume from
        bad = [name for name, p in self.model.named_parameters() if not bool(torch.isfinite(p).all())]
        if bad:
            raise CheckpointError(f"checkpoint {path}: expected finite parameters (the trainer saves no others), got "
                                  f"NaN or inf in {bad[:3]}{' ...' if len(bad) > 3 else ''}")
        ranks = payload.get("rank_rng")
        own = self.ctx.is_distributed and isinstance(ranks, list) and len(ranks) == self.ctx.world_size
        with _entries_fit(path, "the random-generator states the trainer saves, got ones that do not fit"):
            restore_rng_state(ranks[self.ctx.rank] if own else payload["rng"], device, generator)
        if self.ctx.rank and not own:  # written by another number of processes: rank 0's, then a stream of our own
            seed_everything(_rank_seed((self.config.seed + int(payload["step"])) % 2**32, self.ctx.rank))

    def _check_same_training_state(self, payload: Mapping[str, Any], optimizer: torch.optim.Optimizer) -> None:
        """Refuse a checkpoint whose tensors load, but into another run: ``load_state_dict`` casts a float64 state
        into a float32 model, and hands the Adam moments of one parameter to another of the same size when the
        frozen parameters changed (it matches parameters by position, and only counts them), both without a word; and
        name the parameters frozen or unfrozen since where the counts differ (its "parameter group that doesn't match
        the size of optimizer's group" names none)."""
        path = payload["_path"]
        saved_optimizer = payload["optimizer"]
        groups = saved_optimizer.get("param_groups") if isinstance(saved_optimizer, Mapping) else None
        if isinstance(groups, list) and all(isinstance(g, Mapping) and isinstance(g.get("names"), list)
                                            and isinstance(g.get("params"), list) for g in groups):
            saved = [list(g["names"]) for g in groups]
            now = [list(g["names"]) for g in optimizer.param_groups]
            # a parameter frozen or trained since (other sizes, which load_state_dict refuses without naming it; or
            # another number of groups where it emptied or filled one, param_groups dropping an empty group) or two
            # swapped of one count (whose moments it would hand over by position); another number of groups whose
            # entries do not hold every saved moment is a damaged file that does not fit
            state, ids = saved_optimizer.get("state"), {i for g in groups for i in g["params"] if isinstance(i, int)}
            whole = isinstance(state, Mapping) and set(state) <= ids
            if saved != now and (len(saved) == len(now) or whole):
                saved_names, now_names = {str(n) for g in saved for n in g}, {str(n) for g in now for n in g}
                only_saved, only_now = sorted(saved_names - now_names), sorted(now_names - saved_names)
                what = (f"trained only in the checkpoint: {only_saved[:4]}; trained only now: {only_now[:4]}"
                        if only_saved or only_now else f"decay groups: checkpoint {saved}, now {now}")
                raise ValueError(
                    f"resume: checkpoint {path} was written by a run that optimised other parameters ({what}); "
                    "freeze (requires_grad_(False)) the parameters the checkpoint was trained with, or start a new "
                    "out_dir"
                )
        state = self.model.state_dict()
        dtypes = [f"{name}: checkpoint {value.dtype}, now {state[name].dtype}"
                  for name, value in payload["model"].items()
                  if isinstance(value, torch.Tensor) and isinstance(state.get(name), torch.Tensor)
                  and value.dtype != state[name].dtype]
        if dtypes:
            raise ValueError(
                f"resume: checkpoint {path} was written by a model of other dtypes ({'; '.join(dtypes[:3])}"
                f"{' ...' if len(dtypes) > 3 else ''}); load_state_dict would cast them and the run would not continue "
                "the one that wrote it: build the model in the checkpoint's dtype, or start a new out_dir"
            )

    # ------------------------------------------------------------------ loop
    def _fit(self, ctx: DistContext) -> dict[str, Any]:
        cfg, device = self.config, ctx.device
        if self.out_dir.exists() and not self.out_dir.is_dir():  # else mkdir's bare "File exists"
            raise NotADirectoryError(f"Trainer: expected out_dir to be a directory (or a path to create), got the "
                                     f"file {self.out_dir}")
        if ctx.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        ctx.barrier()
        error: Exception | None = None
        payload = None
        try:
            payload = self._resume_payload()
        except Exception as err:
            error = err
        # every rank has looked at out_dir before rank 0 writes to it; a checkpoint that one rank alone cannot read
        # stops every rank (that run alone where it is a CheckpointError), not rank 0 at its next collective
        _raise_on_every_rank(ctx, error, f"reading the checkpoint {self.checkpoint_path}", CheckpointError)

        model = self.model.to(device)
        # each rank its own stream of the global generators (dropout, drop-path): with one seed for all, row i of
        # every rank's shard drew rank 0's row-i masks. Rank 0 keeps cfg.seed (one process draws as before); the
        # batch generator is the same on every rank (one global batch, then sharded)
        seed_everything(_rank_seed(cfg.seed, ctx.rank))
        generator = torch.Generator(device="cpu")
        generator.manual_seed(cfg.seed)
        optimizer = build_optimizer(model, cfg, device)
        self.optimizer = self._optimizer = optimizer
        start, elapsed0 = 0, 0.0
        self._last: dict[str, dict[str, Any] | None] = {"train": None, "eval": None}
        # Running sums of the current log window: name -> [sum tensor, count].
        self._window: dict[str, list[Any]] = {}
        # the names and counts of a window a checkpoint cut, as resumed (the same on every rank), until it is logged
        self._carried: dict[str, int] = {}
        self._last_checkpoint_step: int | None = None
        self._last_checkpoint_path = self.checkpoint_path
        self._world_sizes = [ctx.world_size]  # the numbers of processes that trained this run, oldest first
        # the torch thread counts that trained it on the CPU, oldest first (a CPU reduction split over other threads
        # rounds otherwise; a GPU's kernels do not depend on them): none recorded for a segment on another device
        threads = torch.get_num_threads() if device.type == "cpu" else None
        self._thread_counts = _counts_since([], threads)
        version = str(torch.__version__)  # another torch's kernels round otherwise: its numbers are another run's
        self._torch_versions = [version]
        if payload is not None:
            self._check_resumable(payload)
            try:  # each rank restores its own random-generator states: rank 1's may not load where rank 0's did
                self._load_state(payload, optimizer, device, generator)
            except Exception as err:
                error = err
            _raise_on_every_rank(ctx, error, f"resuming from the checkpoint {payload['_path']}", CheckpointError)
            start = payload["step"]
            with _entries_fit(payload["_path"], "the run time, last metrics and log window the trainer saves, "
                                                "got ones that do not fit"):
                elapsed0 = float(payload.get("elapsed", 0.0))
                self._last = {"train": payload.get("last_train"), "eval": payload.get("last_eval")}
                if not all(v is None or isinstance(v, Mapping) for v in self._last.values()):
                    raise TypeError(f"last_train/last_eval must be mappings, got {self._last!r}")
                self._window = {}
                for name, entry in payload.get("window", {}).items():
                    total, count = entry
                    if not (isinstance(total, torch.Tensor) and total.dim() == 0 and total.is_floating_point()
                            and isinstance(count, int) and not isinstance(count, bool) and count >= 1):
                        # else a torch.stack error at the next log, or a window mean divided by a count of 0
                        raise ValueError(f"window[{name!r}] must be [a 0-d float tensor, a count >= 1], got {entry!r}")
                    self._window[str(name)] = [total.to(device), count]
                self._carried = {k: entry[1] for k, entry in self._window.items()}
            self._last_checkpoint_step = start
            self._last_checkpoint_path = Path(payload["_path"])
            # a resume with only the summary (or the log record of the window the checkpoint cut: sums over counts)
            # left trains and evaluates nothing: its processes and threads are no part of the run's numbers
            idle = start == cfg.max_steps and self._evaluated_at(start)
            # resume=<path>: another folder's, until we save
            self._world_sizes = _history(payload, "world_size", None if idle else ctx.world_size)
            self._thread_counts = _counts_since(payload.get("torch_threads"), None if idle else threads)  # none: older
            self._torch_versions = _history(payload, "torch_version", None if idle else version, str)
        if self.resume is not False:
            # rewrites the logs on rank 0 only
            _on_every_rank(ctx, f"cutting the logs back to the resumed step {start}", lambda: self._log.truncate(start))
        self.step = start

        train_model: nn.Module = self._given_model  # the model, or the torch.compile wrapper it was given in
        self._ddp: DistributedDataParallel | None = None
        if ctx.is_distributed:
            train_model = self._ddp = DistributedDataParallel(
                train_model, device_ids=[device.index] if device.type == "cuda" else None
            )
        if cfg.compile:
            train_model = torch.compile(train_model)
        self._train_model = train_model
        self._generator = generator
        self._amp = _model_amp(cfg.amp, device, model)
        self._scaler: torch.amp.GradScaler | None = None
        half = [n for n, p in model.named_parameters() if p.requires_grad and p.dtype == torch.float16]
        if half and self._amp != torch.float16:  # else inf/NaN weights after the first update, reported as a loss
            raise ValueError(
                f"Trainer: AdamW cannot update float16 parameters {half[:3]}{' ...' if len(half) > 3 else ''} (there "
                "are no float32 master weights: its eps 1e-8 rounds to 0 in float16 and the second moment of a small "
                "gradient underflows to 0, so the first update writes inf or NaN into them): build the model in "
                "float32 and use amp='fp16' (float16 compute, float32 weights)"
            )
        bf16 = [n for n, p in model.named_parameters() if p.requires_grad and p.dtype == torch.bfloat16]
        if bf16:
            warnings.warn(
                f"Trainer: bfloat16 parameters {bf16[:3]}{' ...' if len(bf16) > 3 else ''} are updated in bfloat16 "
                "(no float32 master weights): an AdamW step or weight decay smaller than half a bfloat16 spacing of a "
                "weight (about |w| 2**-9; lr < 0.004 for a norm gain of 1) is rounded away and the weight does not "
                "move; build the model in float32 and use amp='bf16' (bfloat16 compute, float32 weights)",
                UserWarning, stacklevel=3,
            )
        if self._amp == torch.float16:
            if half:  # else GradScaler.unscale_'s bare "Attempting to unscale FP16 gradients." at the first update
                raise ValueError(
                    f"Trainer: amp='fp16' scales the loss for float32 parameters (autocast runs them in float16), got "
                    f"float16 parameters {half[:3]}{' ...' if len(half) > 3 else ''}: build the model in float32, "
                    "or use amp='off'"
                )
            self._scaler = torch.amp.GradScaler(device.type)
            if payload is not None and payload.get("scaler"):
                with _entries_fit(payload["_path"], "the fp16 loss-scaler state the trainer saves, got one that "
                                                    "does not fit"):
                    self._scaler.load_state_dict(payload["scaler"])
        self._params = [p for group in optimizer.param_groups for p in group["params"]]

        self._t0, self._elapsed0 = time.perf_counter(), elapsed0
        # Under an open outer bar (the experiment runner's runs) tqdm places this one below it
        # and removes it when the run ends (leave=None); alone it stays on screen.
        self._pbar = tqdm(
            total=cfg.max_steps, initial=start, dynamic_ncols=True, desc="train", unit="step", leave=None,
            disable=True if not (cfg.progress and ctx.is_main) else None,
        )
        self._postfix: dict[str, str] = {}
        # First non-finite update so far, kept on the device: no host sync per update.
        first_bad = torch.full((), _NO_BAD_STEP, dtype=torch.long, device=device)
        train_model.train()
        for step in range(start, cfg.max_steps):
            lr = self._lr(step)
            loss, metrics, bad = self._update(step, lr)
            first_bad = torch.where(bad & (first_bad == _NO_BAD_STEP), step, first_bad)
            self._accumulate(self._window, loss, metrics, device)

            done = step + 1
            self.step = done
            self._pbar.update(1)
            final = done == cfg.max_steps
            log = done % cfg.log_interval == 0 or final
            evaluate = (cfg.eval_interval > 0 and done % cfg.eval_interval == 0) or final
            save = (cfg.checkpoint_interval > 0 and done % cfg.checkpoint_interval == 0) or final
            if log or evaluate or save:
                self._raise_if_bad(first_bad)  # before anything is logged or saved
            if log:
                self._log_train(self._window, done, lr)
                self._window, self._carried = {}, {}
            if evaluate:
                self._evaluate(done, lr)
            if save:
                self._save(done)

        if payload is not None and start == cfg.max_steps:
            self._finish_resumed_at_the_end(start)

        summary = {
            "status": "completed",
            "step": cfg.max_steps,
            "resumed_from": start if payload is not None else None,
            "train": self._last["train"],
            "eval": self._last["eval"],
            "elapsed": self._elapsed(),
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "world_size": ctx.world_size,
            # more than one where a resume ran under another number of processes than the steps before it
            "world_sizes": list(self._world_sizes),
            # more than one where a resume on the CPU ran under another torch thread count than the steps before it
            "torch_threads": list(self._thread_counts),
            # more than one where a resume ran under another torch version than the steps before it
            "torch_versions": list(self._torch_versions),
            "device": str(device),
            "device_name": _device_name(device),  # the GPU model (None on CPU): "cuda:0" names none
            "amp": _AMP_NAMES[self._amp],
            "config": cfg.to_dict(),
            # where the final weights are: another folder's after resume=<path> with nothing left to do
            "checkpoint": str(self._last_checkpoint_path),
        }
        # else rank 0 fails the run while the others report it completed
        _on_every_rank(ctx, f"writing the summary {self.summary_path}",
                       lambda: write_json_atomic(self.summary_path, summary), here=ctx.is_main)
        self.summary = summary
        return summary

    def _lr(self, step: int) -> float:
        """The learning rate of update ``step`` (0-based), from the config's schedule."""
        cfg = self.config
        return cosine_lr(step, lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps, decay_steps=cfg.decay_steps)

    def _finish_resumed_at_the_end(self, done: int) -> None:
        """A checkpoint resumed with ``max_steps`` equal to its step (a longer run's intermediate one): its last
        update is this run's last, whose log record (of the window the checkpoint cut) and evaluation, due at the
        last update, the run that wrote it had not made; make them, and checkpoint, as the last update does."""
        evaluated = self._evaluated_at(done)
        if not self._window and evaluated:  # the checkpoint of a run that ended here, or of a boundary of all three
            return
        lr = self._lr(done - 1)  # the learning rate of that last update
        if self._window:
            self._log_train(self._window, done, lr)
            self._window, self._carried = {}, {}
        if not evaluated:
            self._evaluate(done, lr)
        self._save(done)

    def _evaluated_at(self, done: int) -> bool:
        """Whether the last evaluation (of the resumed checkpoint, or made since) is of step ``done``."""
        last_eval = self._last["eval"]
        return isinstance(last_eval, Mapping) and last_eval.get("step") == done

    def _update(self, step: int, lr: float) -> tuple[torch.Tensor, dict[str, Any], torch.Tensor]:
        """One optimiser update over ``grad_accum_steps`` micro-batches; returns the detached loss
        (mean over the micro-batches), the metrics (means) and a non-finite flag."""
        cfg, ctx, optimizer = self.config, self.ctx, self._optimizer
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = self.task.train_batch(step, self._generator, cfg.batch_size)
        shard = getattr(self.task, "shard_batch", None)
        split = shard if shard is not None else shard_batch
        if ctx.is_distributed:
            batch = split(batch, ctx.rank, ctx.world_size)
        A = cfg.grad_accum_steps
        optimizer.zero_grad(set_to_none=True)
        loss_sum: torch.Tensor | None = None
        # judged in the loss's own dtype (a float64 loss past float32's range is finite), before the log's cast
        loss_bad: torch.Tensor | None = None
        window: dict[str, list[Any]] = {}
        before: list[Any] | None = None  # under accumulation, the gradients before the last micro-batch's backward
        for micro in range(A):
            part = self._micro_batch(split, batch, micro, step) if A > 1 else batch
            part = to_device(part, ctx.device)
            # DDP all-reduces the gradients on the last micro-batch only.
            sync = self._ddp is None or micro == A - 1
            if self._ddp is not None and sync and A > 1:
                before = [(p.grad, p.grad._version) if p.grad is not None else None for p in self._params]
            with (contextlib.nullcontext() if sync else self._ddp.no_sync()):
                with self._autocast():
                    loss, metrics = self._check_loss(self.task.loss(self._train_model, part), step)
                reserved = [k for k in ("loss", "grad_norm", _SKIPPED) if k in metrics
                            and (k == "loss" or (k == "grad_norm" and cfg.grad_clip > 0)
                                 or (k == _SKIPPED and self._scaler is not None))]
                if reserved:  # else mixed into the logged loss (or dropped), overwritten by the clipped norm or count
                    raise ValueError(
                        f"task.loss metrics: expected names other than {reserved} (the trainer logs the returned "
                        f"loss, the gradient norm and the fp16 skip count under them), got keys "
                        f"{sorted(map(str, metrics))} at step {step}"
                    )
                scaled = loss / A if A > 1 else loss
                if self._scaler is not None:
                    scaled = self._scaler.scale(scaled)
                scaled.backward()
            micro_bad = ~torch.isfinite(loss.detach())
            loss_bad = micro_bad if loss_bad is None else loss_bad | micro_bad
            loss = _log_value(loss.detach())
            loss_sum = loss if loss_sum is None else loss_sum + loss
            if A > 1:
                self._accumulate(window, loss, metrics, ctx.device)
        assert loss_sum is not None and loss_bad is not None
        if self._ddp is not None:
            self._refuse_parameters_without_gradient(step, before)
        if A > 1:
            loss = loss_sum / A
            metrics = {k: v[0] / v[1] for k, v in window.items() if k != "loss"}
        bad = loss_bad
        if self._scaler is not None:
            self._scaler.unscale_(optimizer)  # clip the true gradients
        if cfg.grad_clip > 0:
            grad_norm = _clip_grad_norm(self._params, cfg.grad_clip)
            metrics["grad_norm"] = grad_norm
            if self._scaler is None:  # under fp16 an overflow skips the step instead
                bad = bad | ~torch.isfinite(grad_norm)
        elif self._scaler is None:  # no clipping: the norm only flags a non-finite gradient at its own update
            grads = [p.grad for p in self._params if p.grad is not None]
            if grads:
                bad = bad | ~torch.isfinite(_grad_norm(grads))
        if self._scaler is not None:
            before = getattr(self._scaler, "_scale", None)
            before = before.clone() if isinstance(before, torch.Tensor) else None
            self._scaler.step(optimizer)
            self._scaler.update()
            scale = getattr(self._scaler, "_scale", None)  # on the device: no host sync
            if isinstance(scale, torch.Tensor):  # halved to 0 (~165 skips in a row): every later update is skipped
                bad = bad | (scale.reshape(()) == 0)
                if before is not None:  # a skip halves the scale; an applied update keeps or doubles it
                    metrics[_SKIPPED] = (scale.reshape(()) < before.reshape(())).long()  # summed in float64
        else:
            optimizer.step()
        return loss, metrics, bad

    def _refuse_parameters_without_gradient(self, step: int, before: list[Any] | None = None) -> None:
        """Under DDP, a ValueError naming the trainable parameters the update left without a gradient (a head the task
        never calls), before the optimiser step. ``DistributedDataParallel`` (built without
        ``find_unused_parameters``) all-reduces a bucket of gradients only once every parameter in it has one: the
        others were never averaged, so each rank stepped on its own shard's gradient (replicas no longer equal, a run
        of one update finished so without a word), and the next forward raised torch's advice to pass an argument
        the Trainer does not take. One process trains such a model (AdamW skips a parameter without a gradient).
        ``before``: under gradient accumulation, each parameter's (gradient, its version) before the last
        micro-batch's backward, the only one DDP averages (the others ran under ``no_sync``): a gradient the earlier
        micro-batches left that this backward did not add to (the same tensor, unchanged) was not averaged either."""
        if before is None and all(p.grad is not None for p in self._params):  # the common case costs a loop
            return

        def untouched(p: torch.Tensor, was: Any) -> bool:  # no gradient from the backward DDP averages
            return p.grad is None or (was is not None and p.grad is was[0] and p.grad._version == was[1])
        # (a parameter frozen since the optimiser was built has no gradient and is no update's concern)
        without = {id(p) for p, was in zip(self._params, before or [None] * len(self._params))
                   if p.requires_grad and untouched(p, was)}
        if not without:
            return
        missing = [name for name, p in self.model.named_parameters() if id(p) in without] or ["(unnamed)"]
        raise ValueError(
            f"Trainer: under DistributedDataParallel ({self.ctx.world_size} processes) every trainable parameter must "
            f"get a gradient at every update (its gradients are averaged over the ranks), got none for "
            f"{missing[:6]}{' ...' if len(missing) > 6 else ''} at step {step} on rank {self.ctx.rank} (task.loss did "
            f"not use them{' in the last of the update micro-batches, whose backward DDP averages' if before else ''})"
            ": freeze them (requires_grad_(False)) or leave them out of the model, or use them in "
            "task.loss"
        )

    def _micro_batch(self, split: Any, batch: Any, micro: int, step: int) -> Any:
        A = self.config.grad_accum_steps
        try:
            return split(batch, micro, A)
        except (ValueError, TypeError) as err:  # shard_batch's message speaks of processes, not micro-batches
            W = self.ctx.world_size
            if W > 1:  # the batch splits over the processes (it passed), each share not into A: name the product
                # (a task's own shard_batch split it: no advice to give it one)
                own = "" if split is not shard_batch else " (or give the task a shard_batch method)"
                raise type(err)(
                    f"grad_accum_steps={A} under {W} processes: expected this rank's share (1/{W}) of the batch of "
                    f"task.train_batch(step={step}, ...) to split into {A} equal micro-batches: set batch_size to a "
                    f"multiple of {W * A} ({W} processes x grad_accum_steps={A}), got {self.config.batch_size}{own}; "
                    f"got an error splitting it: {err}"
                ) from err
            raise type(err)(
                f"grad_accum_steps={A}: expected the batch of task.train_batch(step={step}, ...) to split into {A} "
                f"equal micro-batches (dim 0 divisible by {A}), got an error splitting it: {err}"
            ) from err

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self._amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self._amp)

    def _elapsed(self) -> float:
        return self._elapsed0 + (time.perf_counter() - self._t0)

    @staticmethod
    def _check_loss(out: Any, step: int) -> tuple[torch.Tensor, dict[str, Any]]:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(
                f"task.loss: expected a (loss, metrics) tuple, got {type(out).__name__} at step {step}"
            )
        loss, metrics = out
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
            got = (f"tensor of shape {tuple(loss.shape)} and dtype {loss.dtype}"
                   if isinstance(loss, torch.Tensor) else type(loss).__name__)
            raise TypeError(f"task.loss: expected a scalar floating loss tensor, got {got} at step {step}")
        if not loss.requires_grad:
            raise ValueError(
                f"task.loss: expected a loss that requires grad (computed from the model), got one "
                f"that does not at step {step}"
            )
        if not isinstance(metrics, Mapping):
            raise TypeError(
                f"task.loss: expected a metrics dict, got {type(metrics).__name__} at step {step}"
            )
        return loss.reshape(()), dict(metrics)

    @staticmethod
    def _accumulate(
        window: dict[str, list[Any]], loss: torch.Tensor, metrics: Mapping[str, Any], device: torch.device
    ) -> None:
        items = [("loss", loss)] + [(str(k), v) for k, v in metrics.items()]
        names = [name for name, _ in items]
        if len(set(names)) != len(names):  # else their values were averaged into one entry of the log
            raise ValueError(f"task.loss metrics: expected names that differ as strings (the log's keys), got keys "
                             f"{sorted(map(repr, metrics))} naming {sorted({n for n in names if names.count(n) > 1})} "
                             "more than once")
        for name, value in items:
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise TypeError(
                        f"task.loss metrics[{name!r}]: expected a scalar, got shape {tuple(value.shape)}"
                    )
                value = _log_value(value.detach()).reshape(()).to(device)
            elif isinstance(value, numbers.Real) and not isinstance(value, bool):  # numpy scalars too
                value = torch.tensor(_as_float(value, f"task.loss metrics[{name!r}]", "a float or scalar tensor",
                                               "an int"), dtype=torch.float64, device=device)  # a double, kept one
            else:
                raise TypeError(
                    f"task.loss metrics[{name!r}]: expected a float or scalar tensor, got "
                    f"{_type_name(value)}"
                )
            if name in window:
                window[name][0] = window[name][0] + value
                window[name][1] += 1
            else:
                window[name] = [value, 1]

    def _raise_if_bad(self, first_bad: torch.Tensor) -> None:
        bad = int(self.ctx.all_reduce_min(first_bad).item())  # the only per-boundary host sync
        if bad == _NO_BAD_STEP:
            return
        self._fail_non_finite(
            bad, f"non-finite training loss or gradient norm at step {bad} (the update on "
            f"task.train_batch(step={bad}, ...))"
        )

    def _fail_non_finite(self, step: int, what: str) -> None:
        last = self._last_checkpoint_step
        kept = (f"the last good checkpoint {self._last_checkpoint_path} (step {last}) was kept"
                if last is not None else "no checkpoint had been written")
        message = f"{what}; training stopped and {kept}."
        if self.ctx.is_main:
            write_json_atomic(self.summary_path, {
                "status": "non_finite", "error": message, "bad_step": step,
                "last_checkpoint_step": last, "train": self._last["train"], "eval": self._last["eval"],
                "elapsed": self._elapsed(), "config": self.config.to_dict(),
            })
        raise NonFiniteLossError(message, step=step, last_checkpoint_step=last)

    def _record(self, split: str, done: int, lr: float, loss: float | None,
                metrics: dict[str, float]) -> dict[str, Any]:
        record = {"step": done, "split": split, "loss": loss, "lr": lr, "metrics": metrics,
                  "elapsed": self._elapsed(), "time": time.time()}
        # writes on rank 0 only (a full disk there stops every rank, not just rank 0)
        _on_every_rank(self.ctx, f"writing the {split} record of step {done} to the loggers",
                       lambda: self._log.append(record))
        self._last[split] = record
        return record

    def _log_train(self, window: dict[str, list[Any]], done: int, lr: float) -> None:
        # the fp16 skip count is the window's sum (the same on every rank: the scalers see the same gradients); a
        # task's own metric of that name (allowed without fp16) is a mean as any other
        count = _SKIPPED if self._scaler is not None else None
        means = {k: window[k][0] / (1 if k == count else window[k][1]) for k in window}
        # each value's mean over the ranks that report it (a metric task.loss returns on some shards only)
        reduced, _ = _mean_over_reporting_ranks(self.ctx, {k: [v] for k, v in means.items()}, self._carried_only())
        names = sorted(k for k in reduced if k != "loss")
        values = torch.stack([reduced[k][0] for k in ["loss", *names]]).tolist()  # one host sync
        metrics = dict(zip(names, values[1:]))
        if count in metrics:
            metrics[count] = int(round(metrics[count]))
        self._record("train", done, lr, values[0], metrics)
        if self._pbar is not None:
            self._postfix.update(loss=f"{values[0]:.4g}", lr=f"{lr:.3g}")
            self._pbar.set_postfix(self._postfix, refresh=False)

    def _sync_buffers(self) -> None:
        """Give every rank rank 0's buffers (a collective). DDP broadcasts them at each forward, then every rank
        updates its own (BatchNorm running statistics from its shard): else the other ranks evaluated, and were left
        after ``fit``, with statistics that are not the checkpoint's (rank 0's). Training is unchanged: the next
        forward broadcasts rank 0's anyway."""
        if self._ddp is None or not self._ddp.broadcast_buffers:
            return
        for buffer in self.model.buffers():
            flat = buffer.data if buffer.is_contiguous() else buffer.data.contiguous()  # (Gloo sends contiguous ones)
            torch.distributed.broadcast(flat, 0)
            if flat is not buffer.data:
                buffer.data.copy_(flat)

    def _evaluate(self, done: int, lr: float) -> None:
        self._sync_buffers()
        self._train_model.eval()
        try:
            with preserve_rng_state(self.ctx.device), torch.no_grad(), self._autocast():
                out = self.task.evaluate(self.model, self.config.eval_steps)
        finally:
            self._train_model.train()
        if not isinstance(out, Mapping):
            raise TypeError(f"task.evaluate: expected a dict of metrics, got {type(out).__name__}")
        metrics: dict[str, float] = {}
        for name, value in out.items():
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy scalars pass
                raise TypeError(
                    f"task.evaluate()[{name!r}]: expected a float or scalar tensor, got "
                    f"{_type_name(value)}"
                )
            if str(name) in metrics:  # else the later value replaced the earlier one in the log
                raise ValueError(f"task.evaluate(): expected names that differ as strings (the log's keys), got keys "
                                 f"{sorted(map(repr, out))} naming {str(name)!r} more than once")
            metrics[str(name)] = _as_float(value, f"task.evaluate()[{name!r}]", "a float or scalar tensor", "an int")
        loss = metrics.get("loss")
        self._record("eval", done, lr, loss, metrics)
        if self._pbar is not None and loss is not None and math.isfinite(loss):
            self._postfix["eval_loss"] = f"{loss:.4g}"
            self._pbar.set_postfix(self._postfix, refresh=False)

    def _window_of_all_ranks(self) -> dict[str, list[Any]]:
        """The log window to checkpoint: each sum averaged over ranks (a collective: every rank calls it), with its
        count, the same on every rank. Every rank loads it on resume; as the log averages the ranks' window means, the
        record whose window the checkpoint cut is then the uninterrupted run's (rank 0's sums alone would stand in
        for every rank's). A metric only some ranks report is saved as their mean, which every rank then holds (the
        ranks that add to it since make its mean, see :meth:`_carried_only`): its resumed record equals the
        uninterrupted one's where the reporting ranks' window means and counts agree, else is near it."""
        entries = {k: [total.detach(), torch.tensor(count, device=total.device)]
                   for k, (total, count) in self._window.items()}
        # (a name some ranks lack: over the others)
        reduced, dtypes = _mean_over_reporting_ranks(self.ctx, entries, self._carried_only())
        # each sum in its own dtype (the reduction took the widest): a resumed window adds up as the uninterrupted one
        return {k: [total.cpu().to(dtypes[k][0], copy=True), max(1, round(count.item()))]
                for k, (total, count) in reduced.items()}

    def _carried_only(self) -> set[str]:
        """The names of the log window that this rank holds only as the resumed checkpoint's (every rank loaded that
        mean over the ranks reporting the name): no update since added to them here. Such a rank did not report the
        name (a metric of rank 1's shards only), so it is left out of the name's mean over the ranks, where another
        rank added to it: else the carried part was counted once more per such rank (a window of 0, 1, 2, 3 that a
        checkpoint cut after 0, 1 was logged 1.0, not 1.5, beside one rank that held it alone)."""
        return {k for k, count in self._carried.items() if k in self._window and self._window[k][1] == count}

    def _save(self, done: int) -> None:
        finite = torch.stack([torch.isfinite(p).all() for p in self.model.parameters()]).all()
        if not bool(finite):  # identical on every rank: DDP keeps the replicas equal
            self._fail_non_finite(done - 1, f"non-finite parameters after step {done}")
        rng = capture_rng_state(self.ctx.device, self._generator)
        ranks = None
        if self.ctx.is_distributed:
            ranks = [None] * self.ctx.world_size
            torch.distributed.all_gather_object(ranks, rng)
        payload = {
            "format": CHECKPOINT_FORMAT,
            "step": done,
            "model": self.model.state_dict(),
            "optimizer": self._optimizer.state_dict(),
            # fp16 loss scale and growth tracker (empty without fp16)
            "scaler": self._scaler.state_dict() if self._scaler is not None else {},
            "amp": _AMP_NAMES[self._amp],  # the precision of the updates: cfg.amp="auto" resolves per device
            "rng": rng,
            # every rank's (their global generators differ): a resume by as many processes continues each stream
            "rank_rng": ranks,
            "config": self.config.to_dict(),
            "model_record": model_record(self.model),
            "elapsed": self._elapsed(),
            "last_train": self._last["train"],
            "last_eval": self._last["eval"],
            # a log window cut by the checkpoint continues after a resume (on every rank: the mean over ranks)
            "window": self._window_of_all_ranks(),
            "world_size": self.ctx.world_size,
            "world_sizes": list(self._world_sizes),
            "torch_threads": list(self._thread_counts),
            "torch_version": str(torch.__version__),
            "torch_versions": list(self._torch_versions),
        }
        self.ctx.barrier()
        # a full disk, a read-only folder: every rank stops, not just rank 0
        _on_every_rank(self.ctx, f"writing checkpoint {self.checkpoint_path} (step {done})",
                       lambda: save_checkpoint(self.checkpoint_path, payload), here=self.ctx.is_main)
        self._last_checkpoint_step = done
        self._last_checkpoint_path = self.checkpoint_path


def _mean_over_reporting_ranks(
    ctx: DistContext, values: dict[str, list[torch.Tensor]], carried: Collection[str] = ()
) -> tuple[dict[str, list[torch.Tensor]], dict[str, list[torch.dtype]]]:
    """Each 0-dim tensor of ``values`` (name -> tensors) averaged over the ranks that have the name, under the names of
    every rank, and each one's dtype (the widest of the ranks'); the means are in the widest dtype of them all (a
    stack's). A collective: every rank calls it, in the same order. The names are agreed first: task.loss may return
    a metric on some shards only (a class's accuracy where the shard holds the class), and a reduction of each rank's
    own names paired unlike values (the mean of two metrics, logged under one of their names) or tensors of unlike
    sizes (which aborted the process). ``carried``: names of ``values`` this rank holds only as every rank does (a
    resumed log window's, the same on every rank): this rank does not report them, unless no rank does (then each
    is that carried value). In one process: ``values`` as given."""
    if not ctx.is_distributed:
        return values, {k: [t.dtype for t in ts] for k, ts in values.items()}
    mine = {k: [str(t.dtype).removeprefix("torch.") for t in ts] for k, ts in values.items()}
    gathered: list[Any] = [None] * ctx.world_size
    torch.distributed.all_gather_object(gathered, mine)
    dtypes: dict[str, list[torch.dtype]] = {}
    for rank_values in gathered:
        for k, names in rank_values.items():
            these = [getattr(torch, n) for n in names]
            dtypes[k] = these if k not in dtypes else [torch.promote_types(a, b) for a, b in zip(dtypes[k], these)]
    names = sorted(dtypes)
    if not names:
        return {}, {}
    reports = {k for k in values if k not in carried}
    flat = [t.to(dtype).reshape(()) if k in reports else torch.zeros((), dtype=dtype, device=ctx.device)
            for k in names for t, dtype in zip(values.get(k) or [None] * len(dtypes[k]), dtypes[k])]
    stacked = torch.stack(flat)  # the widest dtype, the same on every rank (the dtypes are agreed)
    reporting = torch.tensor([float(k in reports) for k in names], dtype=stacked.dtype, device=ctx.device)
    total = torch.cat([stacked, reporting])
    torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM)  # Gloo has no AVG
    sums, counts = total[: len(flat)], total[len(flat):]
    out: dict[str, list[torch.Tensor]] = {}
    i = 0
    for j, k in enumerate(names):
        out[k] = [sums[i + n] / counts[j] for n in range(len(dtypes[k]))]
        if k in values and k not in reports:  # no host sync: the carried value where no rank added to it
            out[k] = [torch.where(counts[j] > 0, mean, t.to(mean.dtype).reshape(()))
                      for mean, t in zip(out[k], values[k])]
        i += len(dtypes[k])
    return out, dtypes


def _history(payload: Mapping[str, Any], key: str, now: Any, kind: type = int) -> list[Any]:
    """What trained a resumed run, oldest first: the checkpoint's list ``<key>s`` (``world_sizes``: the numbers of
    processes; ``torch_versions``, ``kind=str``), or its ``key`` in one written before the list (none where neither
    is recorded), then ``now`` where it differs from the last (``None``: this resume trains nothing)."""
    earlier = payload.get(f"{key}s")
    return _counts_since(earlier if isinstance(earlier, list) else [payload.get(key)], now, kind)


def _counts_since(earlier: Any, now: Any, kind: type = int) -> list[Any]:
    """A run's counts (of processes, of threads) or, ``kind=str``, versions, oldest first: the entries of ``kind`` of
    the checkpoint's list ``earlier`` (none where it is not a list), then ``now`` where it differs from the last
    (``None``: nothing to add)."""
    counts = ([n for n in earlier if isinstance(n, kind) and not isinstance(n, bool)] if isinstance(earlier, list)
              else [])
    return counts + [now] if now is not None and (not counts or counts[-1] != now) else counts


def _rank_seed(seed: int, rank: int) -> int:
    """The seed of ``rank``'s global generators: ``seed`` on rank 0, spread by a large odd constant on the others
    (``seed + rank`` would give seed 1's rank 0 the stream of seed 0's rank 1)."""
    return (seed + 0x9E3779B9 * rank) % 2**32


def train(
    model: nn.Module,
    task: Task,
    config: TrainConfig,
    out_dir: str | os.PathLike[str],
    *,
    resume: bool | str | os.PathLike[str] = False,
) -> dict[str, Any]:
    """Functional form of ``Trainer(model, task, config, out_dir, resume=resume).fit()``.

    Args:
        model: the module to train (updated in place).
        task: an object following :class:`Task`.
        config: the :class:`TrainConfig`.
        out_dir: run directory.
        resume: see :class:`Trainer`.

    Returns:
        The run summary (also written to ``<out_dir>/summary.json``).
    """
    return Trainer(model, task, config, out_dir, resume=resume).fit()
