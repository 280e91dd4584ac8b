"""Task adapters: a dataset + model family as a :class:`diffusionformer.train.Task`.

Which adapter serves a run is looked up, not branched on: :func:`register_task_adapter` (or the
:func:`task_adapter` decorator) keys a :class:`TaskAdapter` by (model config class, data container
class), and :func:`unregister_task_adapter` removes it; the runner (:func:`model_overrides_for_data`,
:func:`build_task`) and the analysis (:func:`heldout_batches`, :func:`find_adapter`) read the registry.

Every adapter draws its training batches from the trainer's seeded generator (so a resumed
run is bit-identical) and evaluates deterministically on fixed held-out data.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffusionformer._imports import _import_pyg
from diffusionformer.config import _check_flag, _choice_hint, _value_type, config_from_dict
from diffusionformer.data.base import (IGNORE_INDEX, SPLITS, ClassificationData, GraphSetData, NodeData, SequenceTaskData,
                                       TextData)
from diffusionformer.data.ssl import SSLConfig
from diffusionformer.experiments._metrics import _num_correct, _wide, _zero_sum
from diffusionformer.experiments._metrics import accuracy as _accuracy
from diffusionformer.experiments._metrics import full_graph_metrics
from diffusionformer.models import DINOConfig, GCNConfig, GINConfig, GPTConfig, GraphTransformerConfig, ViTConfig
from diffusionformer.ops._checks import checks_values

__all__ = ["TaskAdapter", "build_task", "find_adapter", "heldout_batches", "model_overrides_for_data",
           "register_task_adapter", "task_adapter", "unregister_task_adapter"]

_EVAL_SEED = 1234  # fixed windows for text evaluation: every run is scored on the same text
_TEXT_EVAL_BATCH = 64  # windows per text evaluation batch when the config sets none (nanoGPT's batch_size)


AUGMENT_KEYS = ("crop_padding", "flip")


def _default_eval_batch_size(text: bool) -> int:
    """What an unset ``eval_batch_size`` resolves to (:func:`build_task`): 64 windows for text, 512 otherwise."""
    return _TEXT_EVAL_BATCH if text else 512


def _positive_int(name: str, value: Any) -> int:
    """``value`` as a Python int >= 1 (NumPy ints too); a bool, a float or less than 1 is refused naming ``name``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be a positive int, got {value!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return n


def _split_scores(task: Any, model: nn.Module) -> dict[str, float]:
    """The validation and test splits' ``(loss, accuracy)`` from ``task._score``, as the log's keys."""
    val_loss, val_acc = task._score(model, task.data.x_val, task.data.y_val)
    test_loss, test_acc = task._score(model, task.data.x_test, task.data.y_test)
    return {"loss": val_loss, "val_acc": val_acc, "test_loss": test_loss, "test_acc": test_acc}


def _crop_padding_problem(pad: int, height: int, width: int) -> str | None:
    """What is wrong with a ``crop_padding`` of ``pad`` on ``height x width`` images, ``None`` where nothing is: a
    padding of a whole side draws crops that hold padding alone (a blank image under a label), and a huge one passed
    every check, then failed at the first step (torch's "Overflow when unpacking long long", or an allocation of the
    padded batch), naming no key. Shared by the config's validation and :class:`ClassificationTask`."""
    if pad and pad >= min(height, width):
        return (f"crop_padding = {pad} is not smaller than the images ({height}x{width}): a random crop of the padded "
                f"image could hold padding alone; use at most {min(height, width) - 1}")
    return None


class ClassificationTask:
    r"""Images ``(N, C, H, W)`` or signals ``(N, T, F)`` with one label each.

    Training batches are drawn with replacement; with ``augment`` (images only) each is
    augmented by :func:`~diffusionformer.data.augment.random_crop_flip` from the same
    generator. The training loss is the cross-entropy with label smoothing :math:`\varepsilon`
    (Szegedy et al., CVPR 2016): :math:`(1 - \varepsilon)\,(-\log p_y) + \varepsilon\,
    \mathrm{mean}_c(-\log p_c)`; evaluation losses are plain cross-entropy.

    Args:
        data: the dataset.
        eval_batch_size: batch size of evaluation passes.
        augment: ``{"crop_padding": p, "flip": bool}`` (both optional; ``None``/empty: none); ``p`` is smaller
            than the images' sides.
        label_smoothing: :math:`\varepsilon \in [0, 1)`.
    """

    def __init__(self, data: ClassificationData, eval_batch_size: int = 512, *,
                 augment: Mapping[str, Any] | None = None, label_smoothing: float = 0.0) -> None:
        self.data = data
        self.eval_batch_size = _positive_int("eval_batch_size", eval_batch_size)
        if augment is not None and not isinstance(augment, Mapping):  # True or ["flip"]: a bare error of dict()
            raise TypeError(f"augment must be a dict {{'crop_padding': int, 'flip': bool}} or None, got "
                            f"{_value_type(augment)} ({augment!r})")
        augment = dict(augment or {})
        unknown = sorted(set(augment) - set(AUGMENT_KEYS))
        if unknown:
            raise ValueError(f"augment: unknown key(s) {unknown}{_choice_hint(unknown[0], AUGMENT_KEYS)}; "
                             f"expected some of {list(AUGMENT_KEYS)}")
        pad, flip = augment.get("crop_padding", 0), augment.get("flip", False)
        if isinstance(pad, bool) or not isinstance(pad, numbers.Integral) or pad < 0:  # int(1.5) would pad 1, silently
            raise ValueError(f"augment: crop_padding must be an int >= 0, got {_value_type(pad)} ({pad!r})")
        _check_flag(flip, "augment: flip")
        if augment and data.x_train.dim() != 4:
            raise ValueError(f"augment needs images (N, C, H, W), got training data of shape {tuple(data.x_train.shape)}")
        problem = _crop_padding_problem(pad, *data.x_train.shape[-2:]) if augment else None
        if problem:  # as the config's check: else 2**63 failed at the first batch in torch
            raise ValueError(f"augment: {problem}")
        self.augment = augment
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, numbers.Real) \
                or not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be a float in [0, 1), got {label_smoothing!r}")
        self.label_smoothing = float(label_smoothing)

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> tuple[Tensor, Tensor]:
        n = self.data.x_train.shape[0]
        idx = torch.randint(0, n, (batch_size,), generator=generator)
        x = self.data.x_train[idx]
        if self.augment:
            from diffusionformer.data.augment import random_crop_flip

            x = random_crop_flip(x, generator, padding=int(self.augment.get("crop_padding", 0)),
                                 flip=self.augment.get("flip", False))
        return x, self.data.y_train[idx]

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, Any]]:
        x, y = batch
        logits = model(x)
        loss = F.cross_entropy(_wide(logits), y, label_smoothing=self.label_smoothing)
        return loss, {"acc": _accuracy(logits.detach(), y)}

    @torch.no_grad()
    def _score(self, model: nn.Module, x: Tensor, y: Tensor) -> tuple[float, float]:
        device = next(model.parameters()).device
        # summed in float64 on the device and read once (as a Python float's sum: the same bits on CPU)
        loss_sum, correct = _zero_sum(device), _zero_sum(device)
        for i in range(0, x.shape[0], self.eval_batch_size):
            xb, yb = x[i : i + self.eval_batch_size].to(device), y[i : i + self.eval_batch_size].to(device)
            logits = _wide(model(xb))
            loss_sum += F.cross_entropy(logits, yb, reduction="sum").to(torch.float64)
            correct += _num_correct(logits, yb)
        if x.shape[0] == 0:  # an empty split has no loss or accuracy (not a perfect 0.0 loss)
            return math.nan, math.nan
        return loss_sum.item() / x.shape[0], correct.item() / x.shape[0]

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        return _split_scores(self, model)


def _unwrap_dino(model: nn.Module) -> Any:
    """The :class:`~diffusionformer.models.DINO` inside a DDP or ``torch.compile`` wrapper."""
    from diffusionformer.analysis.capture import _innermost
    from diffusionformer.models.dino import DINO

    inner = _innermost(model)
    if isinstance(inner, DINO):
        return inner
    raise TypeError(f"DINOTask expects a DINO model (possibly wrapped by DDP or torch.compile), got {type(model).__name__}")


def _mean_over_ranks(rows: Tensor) -> Tensor:
    """The mean of ``rows`` ``(N, K)`` over every process's rows (in one process: ``rows.mean(0)``). The trainer
    averages a metric over the ranks, which is the whole batch's value only for a mean over rows: a function of the
    batch mean (an entropy) taken of each rank's shard and then averaged is not that of the whole batch's mean."""
    from diffusionformer.models.dino import _rows_over_ranks

    total, count = _rows_over_ranks(rows)  # a collective: DINOTask.loss runs on every rank, as update_center's
    return (total / count).to(rows.dtype)


class DINOTask:
    r"""Self-supervised DINO on images, scored by k-NN accuracy of frozen teacher features.

    Update ``s``: the batch holds ``B`` training images and their augmentation parameters
    (:class:`~diffusionformer.data.augment.MultiCropAugment`, drawn from the trainer's
    generator, so a resumed run is bit-identical); :meth:`loss` first moves the teacher
    towards the student left by update ``s - 1`` (EMA with ``config.momentum_at(s - 1)``; none
    at ``s = 0``), builds the views on the device, runs the teacher on the 2 global views and
    the student on all views, and returns :func:`~diffusionformer.models.dino_loss` with
    ``tau_t = config.teacher_temp_at(s)``; then it updates the centre. The EMA update that
    would follow the last update ``S - 1`` is not made (the task has no hook after the optimiser
    step): the teacher of the final evaluation makes ``S - 1`` EMA moves, DINO's ``S``. The missed
    move, with momentum ``momentum_at(S - 1)``, is small once the schedule is long: for ``S`` equal
    to ``schedule_steps`` its weight ``1 - momentum`` is ``(1 - base)(1 - cos(pi / S)) / 2``, about
    1e-10 for ``base = 0.996`` and ``S = 10,000``; in a run of a few steps it is not.

    The views and the k-NN evaluation follow ``ssl`` (:class:`~diffusionformer.data.ssl.SSLConfig`,
    or a dict of its fields; ``None``: the model's ``task_config``, which
    :func:`~diffusionformer.models.create_model` sets to its preset's, else the defaults).

    Training metrics: ``teacher_entropy`` (mean entropy of the teacher's targets, nats),
    ``teacher_mean_entropy`` (entropy of their batch mean, over every process's batch under DDP: near 0 when every
    image goes to the same prototype, i.e. collapse; ``log K`` when prototypes are used evenly), ``momentum``
    (the schedule's value after this update) and ``teacher_temp``. :meth:`evaluate` returns
    ``knn_val_acc`` and ``knn_test_acc`` (:func:`~diffusionformer.models.knn_classify` with the
    training split as the bank; ``max_batches`` caps the batches of every split) and ``loss``,
    the DINO loss of up to ``eval_batch_size`` validation images on fixed seeded views, taken at
    the final teacher temperature ``config.teacher_temp`` (not the warm-up value of the current
    step, so the score depends on the weights only) against the current centre, which it does
    not move. A split with nothing to score gives NaN (an empty training split: both
    accuracies; an empty validation split: ``knn_val_acc`` and ``loss``), and so do non-finite
    features (a diverged model: both accuracies).
    """

    #: the teacher and the centre move at every loss call, so micro-batches would not add up to
    #: the full batch's update (grad_accum_steps is refused by the Trainer)
    splits_into_micro_batches = False

    def __init__(self, data: ClassificationData, model: nn.Module, eval_batch_size: int = 512, *,
                 ssl: SSLConfig | Mapping[str, Any] | None = None) -> None:
        if not (isinstance(data, ClassificationData) and data.kind == "image"):
            raise ValueError(f"DINOTask needs image data (ClassificationData of kind 'image'), got "
                             f"{getattr(data, 'name', '?')!r} of kind {getattr(data, 'kind', '?')!r}")
        dino = _unwrap_dino(model)
        self.data = data
        self.config = dino.config
        if ssl is None:  # the model's (create_model gives its preset's), else the defaults
            ssl = getattr(dino, "task_config", None) or SSLConfig()
        elif isinstance(ssl, Mapping):
            ssl = config_from_dict(SSLConfig, ssl, where="DINOTask ssl")
        elif not isinstance(ssl, SSLConfig):
            raise TypeError(f"ssl must be an SSLConfig, a dict of its fields or None, got {type(ssl).__name__}")
        self.ssl = ssl
        self.augment = ssl.augmentation()
        self.eval_batch_size = _positive_int("eval_batch_size", eval_batch_size)

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> dict[str, Any]:
        x = self.data.x_train
        idx = torch.randint(0, x.shape[0], (batch_size,), generator=generator)
        params = self.augment.sample(batch_size, tuple(x.shape[1:]), generator)
        return {"images": x[idx], "step": step, **params}

    def _views(self, batch: dict[str, Any]) -> Tensor:
        params = {k: v for k, v in batch.items() if k not in ("images", "step")}
        return self.augment.apply(batch["images"], params)  # (V, B, C, H, W)

    def _logits(self, model: nn.Module, dino: Any, views: Tensor) -> tuple[Tensor, Tensor]:
        V, B = views.shape[:2]
        teacher = _wide(dino(views[:2].flatten(0, 1), output="teacher")).view(2, B, -1)
        student = _wide(model(views.flatten(0, 1), output="student")).view(V, B, -1)
        return student, teacher

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Any]]:
        from diffusionformer.models.dino import center_sharpen, dino_loss

        dino = _unwrap_dino(model)
        cfg, step = self.config, int(batch["step"])
        if step > 0:
            dino.update_teacher(cfg.momentum_at(step - 1))
        student, teacher = self._logits(model, dino, self._views(batch))
        temp = cfg.teacher_temp_at(step)
        loss = dino_loss(student, teacher, dino.center, cfg.student_temp, temp)
        with torch.no_grad():
            p = center_sharpen(teacher, dino.center, temp)
            entropy = -(p * p.clamp_min(1e-12).log()).sum(-1).mean()
            mean_p = _mean_over_ranks(p.flatten(0, 1))
            mean_entropy = -(mean_p * mean_p.clamp_min(1e-12).log()).sum()
        dino.update_center(teacher)
        return loss, {"teacher_entropy": entropy, "teacher_mean_entropy": mean_entropy,
                      "momentum": cfg.momentum_at(step), "teacher_temp": temp}

    def _features(self, dino: Any, x: Tensor, max_batches: int | None, device: torch.device) -> Tensor:
        n = x.shape[0] if max_batches is None else min(x.shape[0], max_batches * self.eval_batch_size)
        feats = [_wide(dino(x[i : i + self.eval_batch_size].to(device)))
                 for i in range(0, n, self.eval_batch_size)]
        return torch.cat(feats) if feats else torch.zeros(0, self.config.dim, device=device)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        from diffusionformer.models.dino import dino_loss, knn_classify

        dino = _unwrap_dino(model)
        cfg = self.config
        device = dino.center.device
        bank = self._features(dino, self.data.x_train, max_batches, device)
        bank_y = self.data.y_train[: bank.shape[0]].to(device)
        out: dict[str, float] = {}
        bank_finite = bool(torch.isfinite(bank).all())  # one sync per evaluation
        for split in ("val", "test"):
            x, y = self.data.split(split)
            feats = self._features(dino, x, max_batches, device)
            if bank.shape[0] == 0 or feats.shape[0] == 0:
                out[f"knn_{split}_acc"] = float("nan")  # an empty split has no accuracy
                continue
            if not (bank_finite and bool(torch.isfinite(feats).all())):
                # a diverged model: NaN features vote for class 0 (or a NaN neighbour's class), which read as an
                # accuracy equal to that class's share; no accuracy, as NaN logits have none in the other tasks
                out[f"knn_{split}_acc"] = float("nan")
                continue
            pred = knn_classify(bank, bank_y, feats, self.data.num_classes, k=self.ssl.knn_k,
                                temperature=self.ssl.knn_temperature)
            out[f"knn_{split}_acc"] = (pred == y[: pred.shape[0]].to(device)).float().mean().item()
        x_val = self.data.x_val[: self.eval_batch_size]
        if x_val.shape[0] > 0:
            g = torch.Generator().manual_seed(_EVAL_SEED)
            params = self.augment.sample(x_val.shape[0], tuple(x_val.shape[1:]), g)
            batch = {"images": x_val.to(device), **{k: v.to(device) for k, v in params.items()}}
            student, teacher = self._logits(dino, dino, self._views(batch))
            out["loss"] = dino_loss(student, teacher, dino.center, cfg.student_temp, cfg.teacher_temp).item()
        else:
            out["loss"] = float("nan")  # no validation image to score, as in the other tasks
        return out


class TextLMTask:
    r"""Character-level language modelling on random windows (nanoGPT style).

    :meth:`evaluate` gives ``train_loss`` and ``val_loss`` (mean cross-entropy over the same
    number of windows of each split, drawn from one fixed seed, as nanoGPT's
    ``estimate_loss``), ``loss = val_loss`` and the generalisation gap
    ``gap_loss = val_loss - train_loss``. It draws ``eval_batches`` batches of
    ``eval_batch_size`` windows per split, ``max_batches`` (``TrainConfig.eval_steps``) where given: a
    split has no "full" evaluation here (``eval_steps=None`` means ``eval_batches``, as nanoGPT's
    ``eval_iters``).
    """

    def __init__(self, data: TextData, block_size: int, eval_batch_size: int = _TEXT_EVAL_BATCH, eval_batches: int = 20) -> None:
        self.data = data
        self.block_size = _positive_int("block_size", block_size)
        self.eval_batch_size = _positive_int("eval_batch_size", eval_batch_size)
        self.eval_batches = _positive_int("eval_batches", eval_batches)

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> tuple[Tensor, Tensor]:
        n_val = self.data.val.shape[0]
        if self.block_size >= n_val:  # else training ran until the first evaluation, which failed there
            raise ValueError(f"TextLMTask: block_size must be smaller than the 'val' split's length (a window and its "
                             f"next token), got block_size={self.block_size} for a 'val' split of {n_val} tokens")
        return self.data.get_batch("train", batch_size, self.block_size, generator)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, Any]]:
        x, y = batch
        _, loss = model(x, y)
        return loss, {}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        device = next(model.parameters()).device
        out: dict[str, float] = {}
        # max_batches=0 fell back to eval_batches and a negative count scored no window: a loss of -0.0
        batches = self.eval_batches if max_batches is None else _positive_int("max_batches", max_batches)
        for split in ("train", "val"):
            g = torch.Generator().manual_seed(_EVAL_SEED)
            total = _zero_sum(device)  # read once per split, not once per batch
            for _ in range(batches):
                x, y = self.data.get_batch(split, self.eval_batch_size, self.block_size, g)
                total += model(x.to(device), y.to(device))[1].detach().to(torch.float64)
            out[f"{split}_loss"] = total.item() / batches
        out["loss"] = out["val_loss"]
        # over-fitting: both losses come from the same protocol (same batch count, size and seed)
        out["gap_loss"] = out["val_loss"] - out["train_loss"]
        return out


class SequenceLMTask:
    """Causal LM with sparse targets (``-100`` elsewhere), e.g. associative recall."""

    def __init__(self, data: SequenceTaskData, eval_batch_size: int = 512) -> None:
        self.data = data
        self.eval_batch_size = _positive_int("eval_batch_size", eval_batch_size)
        self._per_row: float | None = None

    def _check_targets(self, y: Tensor) -> None:
        """A negative target other than ``ignore_index`` (``-100`` in data whose ``ignore_index`` is ``-1``) was
        counted as a target, of the loss scale, the accuracy and the evaluation's count, while the model's loss
        and the evaluation's cross-entropy skipped it; read on CPU in eager mode only (no host sync)."""
        if checks_values(y):
            bad = (y < 0) & (y != self.data.ignore_index)
            if bool(bad.any()):
                raise ValueError(f"SequenceLMTask: targets hold {int(y[bad][0])}, a negative id that is not the "
                                 f"data's ignore_index={self.data.ignore_index}; expected token ids >= 0 or ignore_index")

    def _targets_per_row(self) -> float:
        """The training split's mean number of targets per row (1.0 when it has none: every loss is then 0)."""
        if self._per_row is None:
            targets = int((self.data.y_train != self.data.ignore_index).sum())
            self._per_row = targets / self.data.y_train.shape[0] if targets else 1.0
        return self._per_row

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> tuple[Tensor, Tensor]:
        idx = torch.randint(0, self.data.x_train.shape[0], (batch_size,), generator=generator)
        return self.data.x_train[idx], self.data.y_train[idx]

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, Any]]:
        """The targets' summed cross-entropy over ``rows x`` the training split's mean targets per row.

        A sum over a fixed count adds up over micro-batches (``grad_accum_steps``) and processes: their
        mean is the whole batch's. The model's token mean did so only when every row had as many targets
        (the bundled recall data: there the factor is exactly 1 and the loss is the token mean); with
        rows of varying counts each micro-batch's targets weighed alike, and one without targets made a
        NaN loss (a "non-finite loss" stop). A batch without targets has loss 0 and zero gradients.
        The ``acc`` metric is weighed alike, the correct targets over the same count: the token accuracy when
        every row has as many targets, and its micro-batch mean is the whole batch's (the mean of micro-batch
        accuracies weighed each micro-batch's targets alike, and one without targets made the log window's
        ``acc`` NaN); a micro-batch with more targets than its rows' average may score above 1, as its loss
        weighs more.
        """
        x, y = batch
        self._check_targets(y)
        mask = y != self.data.ignore_index
        # the model ignores -100 (IGNORE_INDEX): the data's own ignore_index was scored as a target (0: token 0)
        logits, loss = model(x, y if self.data.ignore_index == IGNORE_INDEX else y.masked_fill(~mask, IGNORE_INDEX))
        count = mask.sum()
        expected = x.shape[0] * self._targets_per_row()  # the targets of the batch's rows on average
        scaled = loss * (count.to(loss.dtype) / expected)
        # where, not a product with 0: the token mean over no target is NaN, its gradient through where is 0
        loss = torch.where(count > 0, scaled, torch.zeros((), dtype=scaled.dtype, device=scaled.device))
        # over the loss's count: additive over micro-batches, 0 without targets
        return loss, {"acc": _accuracy(logits.detach()[mask], y[mask], over=expected)}

    @torch.no_grad()
    def _score(self, model: nn.Module, x: Tensor, y: Tensor) -> tuple[float, float]:
        device = next(model.parameters()).device
        loss_sum, correct = _zero_sum(device), _zero_sum(device)
        count = torch.zeros((), dtype=torch.int64, device=device)
        for i in range(0, x.shape[0], self.eval_batch_size):
            xb, yb = x[i : i + self.eval_batch_size].to(device), y[i : i + self.eval_batch_size].to(device)
            self._check_targets(yb)
            logits = _wide(model(xb)[0])
            mask = yb != self.data.ignore_index
            loss_sum += F.cross_entropy(logits[mask], yb[mask], reduction="sum").to(torch.float64)
            correct += _num_correct(logits[mask], yb[mask])
            count += mask.sum()
        n = int(count.item())
        if n == 0:  # no target to score (all ignore_index): no loss, not a perfect 0.0
            return math.nan, math.nan
        return loss_sum.item() / n, correct.item() / n

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        return _split_scores(self, model)


class NodeTask:
    """Full-batch node classification on one graph (the same batch on every rank under DDP)."""

    #: every micro-batch would be the whole graph again (grad_accum_steps is refused by the Trainer)
    splits_into_micro_batches = False

    def __init__(self, data: NodeData) -> None:
        self.data = data

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> Any:
        return self.data.data

    def shard_batch(self, batch: Any, rank: int, world_size: int) -> Any:
        return batch

    def loss(self, model: nn.Module, batch: Any) -> tuple[Tensor, dict[str, Any]]:
        logits = model(batch.x, batch.edge_index)
        m = batch.train_mask
        return F.cross_entropy(_wide(logits[m]), batch.y[m]), {"acc": _accuracy(logits.detach()[m], batch.y[m])}

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        return full_graph_metrics(model, self.data)


def _graph_logits(model: nn.Module, batch: Any) -> Tensor:
    """``model``'s logits of the graphs of ``batch``, with ``num_graphs`` where its forward takes it: a trailing
    graph without nodes has no id in ``batch.batch``, and a readout sized ``batch.max() + 1`` gave it no row."""
    from diffusionformer.analysis.capture import _default_forward  # the one call of a graph model on a PyG batch

    return _default_forward(model, batch)


class GraphClassificationTask:
    """Graph classification over mini-batches of PyG graphs."""

    def __init__(self, data: GraphSetData, eval_batch_size: int = 256) -> None:
        self.data = data
        self.eval_batch_size = _positive_int("eval_batch_size", eval_batch_size)
        self.graphs = {s: list(data.split(s)) for s in ("train", "val", "test")}

    def train_batch(self, step: int, generator: torch.Generator, batch_size: int) -> Any:
        _import_pyg()
        from torch_geometric.data import Batch

        graphs = self.graphs["train"]
        idx = torch.randint(0, len(graphs), (batch_size,), generator=generator).tolist()
        return Batch.from_data_list([graphs[i] for i in idx])

    def shard_batch(self, batch: Any, rank: int, world_size: int) -> Any:
        _import_pyg()
        from torch_geometric.data import Batch

        graphs = batch.to_data_list()
        if len(graphs) % world_size:  # equal parts, or graphs would be dropped
            raise ValueError(f"shard_batch: a batch of {len(graphs)} graphs does not split into {world_size} equal "
                             "parts (processes x grad_accum_steps); set batch_size to a multiple of that")
        per = len(graphs) // world_size
        return Batch.from_data_list(graphs[rank * per : (rank + 1) * per])

    def loss(self, model: nn.Module, batch: Any) -> tuple[Tensor, dict[str, Any]]:
        logits = _graph_logits(model, batch)
        y = batch.y.view(-1)
        return F.cross_entropy(_wide(logits), y), {"acc": _accuracy(logits.detach(), y)}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, float]:
        _import_pyg()
        from torch_geometric.data import Batch

        device = next(model.parameters()).device
        out = {}
        for split in ("val", "test"):
            graphs = self.graphs[split]
            loss_sum, correct = _zero_sum(device), _zero_sum(device)
            for i in range(0, len(graphs), self.eval_batch_size):
                b = Batch.from_data_list(graphs[i : i + self.eval_batch_size]).to(device)
                logits = _wide(_graph_logits(model, b))
                y = b.y.view(-1)
                loss_sum += F.cross_entropy(logits, y, reduction="sum").to(torch.float64)
                correct += _num_correct(logits, y)
            n = len(graphs)  # an empty split has no loss or accuracy (not a perfect 0.0 loss)
            out[f"{split}_loss"] = loss_sum.item() / n if n else math.nan
            out[f"{split}_acc"] = correct.item() / n if n else math.nan
        out["loss"] = out["val_loss"]
        return out


# ----------------------------------------------------------------------------- adapters
@dataclass(frozen=True)
class TaskAdapter:
    """What the runner and the analysis need for one model family on one kind of data.

    Each hook is optional; :func:`find_adapter` picks, for a hook, the adapter registered for
    the model's config class and the nearest class of the data container, else the one
    registered for any model (``family=None``) and that data. A new model family registers one
    adapter with its :attr:`overrides` and inherits the task and the held-out data of its data.
    The hooks are checked when the adapter is made (``TypeError`` for one that is not callable,
    a ``predictions`` that is not a bool or a ``note`` that is not a str).

    Attributes:
        overrides: ``data -> {config field: value}``, what the model takes from the data
            (input shape, classes, vocabulary); may raise ``ValueError`` when the data does not fit.
        task: ``(data, model, eval_batch_size) -> Task``, the :class:`~diffusionformer.train.Task`
            the trainer drives.
        heldout: ``(data, model, split, max_examples, batch_size) -> (batches, info)``, the
            held-out batches :func:`~diffusionformer.analysis.capture_dataset` reads and a
            description of them.
        analysed: ``model -> network`` whose tokens the analysis reads (e.g. DINO's teacher backbone).
        predictions: whether the analysed network predicts one class per sequence (its outputs
            are kept and scored).
        note: a line the analysis adds to its ``info`` (what network was analysed, and why).
    """

    overrides: Callable[[Any], dict[str, Any]] | None = None
    task: Callable[[Any, nn.Module, int], Any] | None = None
    heldout: Callable[[Any, nn.Module, str, int, int], tuple[list[Any], dict[str, Any]]] | None = None
    analysed: Callable[[nn.Module], nn.Module] | None = None
    predictions: bool | None = None
    note: str | None = None

    def __post_init__(self) -> None:
        # else stored, and the run failed deep inside training or the analysis ("'int' object is not callable")
        for hook in ("overrides", "task", "heldout", "analysed"):
            value = getattr(self, hook)
            if value is not None and not callable(value):
                raise TypeError(f"TaskAdapter: {hook} must be a function or None, got {_value_type(value)} ({value!r})")
        if self.predictions is not None:
            _check_flag(self.predictions, "TaskAdapter: predictions")  # "no" was truthy: its outputs scored
        if self.note is not None and not isinstance(self.note, str):
            raise TypeError(f"TaskAdapter: note must be a str or None, got {_value_type(self.note)} ({self.note!r})")


_ADAPTERS: dict[tuple[type | None, type], TaskAdapter] = {}


def _adapter_keys(family: type | Sequence[type] | None, data: type | Sequence[type],
                  caller: str) -> list[tuple[type | None, type]]:
    """The (family, data) pairs that ``family`` and ``data`` name, checked: :func:`register_task_adapter`'s and
    :func:`unregister_task_adapter`'s forms (a class or a sequence of classes; ``None`` family: any model)."""
    def classes(given: Any) -> list[Any]:  # a str is one (wrong) key, not its characters ('V' for "ViTConfig")
        return list(given) if isinstance(given, Iterable) and not isinstance(given, (str, bytes, type)) else [given]

    families, datas = classes(family), classes(data)
    for name, given in (("family", families), ("data", datas)):
        if not given:  # else nothing was registered and the adapter returned as if it were
            raise ValueError(f"{caller}: {name} names no class (an empty sequence); give a class or "
                             f"a sequence of classes{' (None: any model)' if name == 'family' else ''}")
    keys = [(f, d) for f in families for d in datas]
    for f, d in keys:
        if not (f is None or isinstance(f, type)) or not isinstance(d, type):
            raise TypeError(f"task adapters are keyed by classes (model config, data container), got ({f!r}, {d!r})")
        if isinstance(f, type) and issubclass(f, nn.Module):  # else registered, and never found: runs look up
            # type(model.config); "does not fit a ... model" followed
            raise TypeError(f"task adapters are keyed by the model's config class (type(model.config), e.g. "
                            f"ViTConfig), not by the model class; got {f.__name__}")
    return list(dict.fromkeys(keys))  # (A, A) named twice is one pair


def _class_name(cls: type | None) -> str:
    return getattr(cls, "__name__", repr(cls))


def _pair_name(key: tuple[type | None, type]) -> str:
    return f"({_class_name(key[0])}, {_class_name(key[1])})"


def _unregister_call(keys: list[tuple[type | None, type]]) -> str:
    """The ``unregister_task_adapter(...)`` call(s) that remove exactly the pairs ``keys``, as a user writes them:
    one call when they are all pairs of some families and data classes, else one call a pair."""
    def names(classes: list[Any]) -> str:
        return _class_name(classes[0]) if len(classes) == 1 else f"({', '.join(map(_class_name, classes))})"

    families = list(dict.fromkeys(f for f, _ in keys))
    datas = list(dict.fromkeys(d for _, d in keys))
    if len(keys) == len(families) * len(datas):  # keys hold no pair twice, so this is their full product
        return f"unregister_task_adapter({names(families)}, {names(datas)})"
    return " and ".join(f"unregister_task_adapter({_class_name(f)}, {_class_name(d)})" for f, d in keys)


def register_task_adapter(family: type | Sequence[type] | None, data: type | Sequence[type], adapter: TaskAdapter) -> TaskAdapter:
    """Register ``adapter`` for every (model config class in ``family``, data container class in ``data``).

    Args:
        family: the model config dataclass(es) (e.g. ``ViTConfig``), or ``None`` for any model.
        data: the data container class(es) (e.g. ``ClassificationData``); ``object`` matches any data.
        adapter: the hooks.

    Raises:
        TypeError: if ``adapter`` is not a :class:`TaskAdapter`, a key is not a class, or ``family`` is a model
            class (``nn.Module``) rather than its config class.
        ValueError: if a pair already has an adapter (nothing is registered then; the message names the
            :func:`unregister_task_adapter` call that frees the pairs), or ``family`` or ``data`` is an empty
            sequence.
    """
    if not isinstance(adapter, TaskAdapter):
        raise TypeError(f"adapter must be a TaskAdapter, got {type(adapter).__name__}")
    keys = _adapter_keys(family, data, "register_task_adapter")
    taken = [key for key in keys if key in _ADAPTERS]
    if taken:  # a notebook cell run twice registers the pairs again: say how to replace them
        which = (f"a task adapter for {_pair_name(taken[0])} is" if len(taken) == 1 else
                 f"task adapters for {', '.join(map(_pair_name, taken))} are")
        them = "it" if len(taken) == 1 else "them"
        raise ValueError(f"{which} already registered; to replace {them} (an adapter defined again), call "
                         f"{_unregister_call(taken)} first")
    for key in keys:
        _ADAPTERS[key] = adapter
    return adapter


def unregister_task_adapter(family: type | Sequence[type] | None,
                            data: type | Sequence[type]) -> dict[tuple[type | None, type], TaskAdapter]:
    """Remove the adapters of every (model config class in ``family``, data container class in ``data``) and return
    them (for tests and interactive work: a notebook cell that registers an adapter, run again). The forms of
    ``family`` and ``data`` are :func:`register_task_adapter`'s; a built-in adapter may be removed too.

    Args:
        family: the model config dataclass(es), or ``None`` for the adapters of any model.
        data: the data container class(es).

    Returns:
        ``{(family, data): adapter}`` for each pair removed (register them again with :func:`register_task_adapter`).

    Raises:
        KeyError: a pair has no adapter (named in the message); nothing is removed then.
        TypeError, ValueError: ``family`` or ``data`` as :func:`register_task_adapter` refuses them.

    Examples:
        >>> from diffusionformer.data.base import TextData
        >>> from diffusionformer.models import ViTConfig
        >>> @task_adapter(ViTConfig, TextData)
        ... def _vit_on_text(data):
        ...     return {"num_classes": data.vocab_size}
        >>> unregister_task_adapter(ViTConfig, TextData)[ViTConfig, TextData].overrides is _vit_on_text
        True
        >>> find_adapter(ViTConfig, TextData, "overrides", any_model=False) is None
        True
    """
    keys = _adapter_keys(family, data, "unregister_task_adapter")
    missing = [key for key in keys if key not in _ADAPTERS]
    if missing:
        known = sorted(_pair_name(k) for k in _ADAPTERS if any(k[0] is f for f, _ in missing))
        have = (f"; the pairs registered for {' or '.join(dict.fromkeys(_class_name(f) for f, _ in missing))}: "
                f"{', '.join(known)}" if known else "")
        raise KeyError(f"no task adapter is registered for {', '.join(map(_pair_name, missing))}{have}; nothing was "
                       "removed")
    return {key: _ADAPTERS.pop(key) for key in keys}


def task_adapter(family: type | Sequence[type] | None, data: type | Sequence[type], **hooks: Any) -> Callable[[Callable[[Any], dict[str, Any]]], Callable[[Any], dict[str, Any]]]:
    """Decorator: register the decorated ``data -> overrides`` function (and ``hooks``) as an adapter.

    A new model family on text needs only what it takes from the data; the language-model task
    and the held-out windows come from the adapter registered for any model on
    :class:`~diffusionformer.data.base.TextData`::

        @task_adapter(MambaConfig, TextData)
        def _mamba_sizes(data):
            return {"vocab_size": data.vocab_size}

    Other hooks (``task=``, ``heldout=``, ``analysed=``, ``predictions=``, ``note=``) are passed as keywords.
    Registered pairs are refused as by :func:`register_task_adapter`; :func:`unregister_task_adapter` with the same
    ``family`` and ``data`` removes them (a notebook cell run again).
    """
    def register(fn: Callable[[Any], dict[str, Any]]) -> Callable[[Any], dict[str, Any]]:
        register_task_adapter(family, data, TaskAdapter(overrides=fn, **hooks))
        return fn

    return register


def find_adapter(family: type | None, data: Any, hook: str, *, any_model: bool = True) -> TaskAdapter | None:
    """The adapter that supplies ``hook`` for a model of config class ``family`` on ``data``.

    Adapters of ``family`` come first (nearest data class first), then, with ``any_model``,
    those registered for any model. ``data`` is a container or its class. ``None`` when none has the hook.

    Examples:
        >>> from diffusionformer.data.base import TextData
        >>> from diffusionformer.models import GPTConfig, ViTConfig
        >>> find_adapter(GPTConfig, TextData, "task") is find_adapter(None, TextData, "task")  # any model's
        True
        >>> find_adapter(ViTConfig, TextData, "overrides", any_model=False) is None  # a ViT does not fit text
        True
    """
    if not isinstance(hook, str):  # else a bare "unhashable type" for a list
        raise TypeError(f"hook must be the name of an adapter hook (a str), got {_value_type(hook)} ({hook!r})")
    if hook not in TaskAdapter.__dataclass_fields__:
        raise ValueError(f"unknown adapter hook {hook!r}{_choice_hint(hook, TaskAdapter.__dataclass_fields__)}; "
                         f"expected one of {sorted(TaskAdapter.__dataclass_fields__)}")
    if not (family is None or isinstance(family, type)):  # a config instance was "unhashable", a name found nothing
        raise TypeError(f"family must be a model config class (e.g. ViTConfig) or None, got {_value_type(family)} "
                        f"({family!r})")
    if data is None:  # NoneType's adapters: none, silently
        raise TypeError("data must be a data container or its class, got None")
    mro = (data if isinstance(data, type) else type(data)).__mro__
    for fam in ((family, None) if any_model and family is not None else (family,)):
        for cls in mro:
            adapter = _ADAPTERS.get((fam, cls))
            if adapter is not None and getattr(adapter, hook) is not None:
                return adapter
    return None


def model_family(model: nn.Module) -> type | None:
    """The config class of ``model`` (``type(model.config)``), the key of its adapters; ``None`` without one."""
    config = getattr(model, "config", None)
    return None if config is None else type(config)


def model_overrides_for_data(data: Any, family: type) -> dict[str, Any]:
    """Config values a model must take from the data (input shape, classes, vocabulary)."""
    adapter = find_adapter(family, data, "overrides", any_model=False)
    if adapter is None:
        if not any(f is family for f, _ in _ADAPTERS):  # a user's config class (a subclass of a library one too:
            # adapters are keyed by the exact class): "pick a preset of the matching family" sent them to the presets
            raise ValueError(
                f"no task adapter is registered for model config class {family.__qualname__}, so no dataset fits its "
                f"model; register what the model takes from the data, e.g. @task_adapter({family.__name__}, "
                f"{type(data).__name__}) on a function returning config values (adapters are keyed by the exact "
                "config class, not its bases)")
        raise ValueError(
            f"dataset {getattr(data, 'name', '?')!r} of kind {getattr(data, 'kind', '?')!r} does not fit a "
            f"{family.__name__.replace('Config', '')} model; pick a preset of the matching family"
        )
    overrides = adapter.overrides(data)  # type: ignore[misc]
    if not isinstance(overrides, Mapping):  # else a bare "'NoneType' object is not a mapping" while building the model
        raise TypeError(f"the task adapter's overrides for {family.__name__} on {type(data).__name__} "
                        f"({getattr(adapter.overrides, '__qualname__', adapter.overrides)}) must return a dict of "
                        f"config values, got {_value_type(overrides)} ({overrides!r})")
    return dict(overrides)


def build_task(data: Any, model: nn.Module, *, eval_batch_size: int | None = None,
               augment: Mapping[str, Any] | None = None, label_smoothing: float = 0.0,
               ssl: SSLConfig | Mapping[str, Any] | None = None, minibatch: Mapping[str, Any] | None = None) -> Any:
    """The :class:`~diffusionformer.train.Task` adapter for ``data`` and ``model``.

    ``augment`` and ``label_smoothing`` apply to supervised classification only (see
    :class:`ClassificationTask`); ``ssl`` (views and k-NN evaluation) to DINO only (see
    :class:`DINOTask`); ``minibatch`` (neighbour-sampled training) to node classification only
    (see :class:`~diffusionformer.experiments.minibatch.NodeMiniBatchTask`); other adapters refuse them.
    ``eval_batch_size=None`` takes the data's default: 64 windows for text (nanoGPT's), 512 otherwise.
    """
    if eval_batch_size is None:
        eval_batch_size = _default_eval_batch_size(isinstance(data, TextData))
    eval_batch_size = _positive_int("eval_batch_size", eval_batch_size)
    adapter = find_adapter(model_family(model), data, "task")
    if adapter is None:
        raise TypeError(f"no task adapter for {type(data).__name__}")
    if minibatch:
        if not isinstance(data, NodeData) or augment or label_smoothing or ssl is not None:
            raise ValueError(f"minibatch applies to node classification (NodeData) only, without augment, "
                             f"label_smoothing or ssl; got {type(data).__name__}")
        from diffusionformer.experiments.minibatch import NodeMiniBatchTask

        return NodeMiniBatchTask.for_model(data, model, minibatch, eval_batch_size)
    if ssl is not None:
        if not _is_dino(model):
            raise ValueError(f"ssl applies to DINO models only, not to {type(model).__name__}")
        if augment or label_smoothing:  # DINOTask has neither: they were dropped without a word
            raise ValueError(f"augment and label_smoothing apply to supervised classification only, not to the "
                             f"self-supervised DINO task (ssl given); got augment={augment!r}, "
                             f"label_smoothing={label_smoothing!r}")
        return DINOTask(data, model, eval_batch_size, ssl=ssl)
    options = {k: v for k, v in (("augment", augment), ("label_smoothing", label_smoothing)) if v}
    if options:
        if not (isinstance(data, ClassificationData) and not _is_dino(model)):
            raise ValueError(f"augment and label_smoothing apply to supervised classification only, "
                             f"not to {type(data).__name__} with {type(model).__name__}")
        return adapter.task(data, model, eval_batch_size, **options)  # type: ignore[misc]
    return adapter.task(data, model, eval_batch_size)  # type: ignore[misc]


def heldout_batches(data: Any, model: nn.Module, split: str, max_examples: int, batch_size: int) -> tuple[list[Any], dict[str, Any]]:
    """Batches of held-out data for :func:`~diffusionformer.analysis.capture_dataset` and a description of them."""
    max_examples = _positive_int("max_examples", max_examples)
    batch_size = _positive_int("batch_size", batch_size)
    if not isinstance(split, str) or split not in SPLITS:  # else node data: an AttributeError; text: val windows
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}{_choice_hint(split, SPLITS)}")
    adapter = find_adapter(model_family(model), data, "heldout")
    if adapter is None:
        raise TypeError(f"no held-out data for {type(data).__name__}")
    return adapter.heldout(data, model, split, max_examples, batch_size)  # type: ignore[misc]


_HELDOUT_SEED = 1234  # the same held-out examples for every run
_TEXT_SEED = 1234  # the same held-out windows for every run


def _heldout_labelled(data: Any, model: nn.Module, split: str, max_examples: int, batch_size: int) -> tuple[list[Any], dict[str, Any]]:
    from diffusionformer.data.splits import seeded_subset

    x, y = data.split(split)
    # a seeded random subset, not the first rows: a split stored in class order (a registered loader's; the
    # CIFAR-10 JPEG archives list theirs class folder by class folder, which load_cifar10 shuffles) gave one class
    keep = seeded_subset(x.shape[0], max_examples, _HELDOUT_SEED)
    x, y = x[keep], y[keep]
    if isinstance(data, SequenceTaskData) and data.ignore_index != IGNORE_INDEX:  # the analysis reads -100 as none
        y = y.masked_fill(y == data.ignore_index, IGNORE_INDEX)
    batches = [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, keep.numel(), batch_size)]
    labels = "class per sequence" if isinstance(data, ClassificationData) else "target token per position (-100 = none)"
    return batches, {"split": split, "labels": labels, "examples": f"seeded random subset of {keep.numel()}"}


def _heldout_text(data: TextData, model: nn.Module, split: str, max_examples: int, batch_size: int) -> tuple[list[Any], dict[str, Any]]:
    block = _positive_int("block_size", _text_block(model))  # no config: an AttributeError on 'config'
    g = torch.Generator().manual_seed(_TEXT_SEED)
    source = "train" if split == "train" else "val"  # text has no test split: its held-out text is val
    batches = []
    for start in range(0, max_examples, batch_size):
        batches.append(data.get_batch(source, min(batch_size, max_examples - start), block, g))
    return batches, {"split": source, "labels": "next token", "windows": f"seeded random windows of {block} tokens"}


def _heldout_nodes(data: NodeData, model: nn.Module, split: str, max_examples: int, batch_size: int) -> tuple[list[Any], dict[str, Any]]:
    from diffusionformer.analysis.capture import IGNORE_INDEX

    d = data.data
    labels = d.y.masked_fill(~getattr(d, f"{split}_mask"), IGNORE_INDEX)
    return [(d, labels)], {"split": split, "labels": f"node class ({split} nodes)"}


def _heldout_graphs(data: GraphSetData, model: nn.Module, split: str, max_examples: int, batch_size: int) -> tuple[list[Any], dict[str, Any]]:
    _import_pyg()
    from torch_geometric.data import Batch

    graphs = list(data.split(split))[:max_examples]
    batches = []
    for i in range(0, len(graphs), batch_size):
        b = Batch.from_data_list(graphs[i : i + batch_size])
        batches.append((b, b.y.view(-1)))
    return batches, {"split": split, "labels": "class per graph"}


def _text_block(model: nn.Module) -> Any:
    block = getattr(getattr(model, "config", None), "block_size", None)
    if block is None:
        raise ValueError("a text task needs a GPT model (with config.block_size)")
    return block


def _text_task(data: TextData, model: nn.Module, eval_batch_size: int) -> TextLMTask:
    return TextLMTask(data, _text_block(model), eval_batch_size)


# any model: the task and the held-out data follow the data container
register_task_adapter(None, ClassificationData, TaskAdapter(
    task=lambda data, model, ebs, **options: ClassificationTask(data, ebs, **options), heldout=_heldout_labelled,
    predictions=True))
register_task_adapter(None, TextData, TaskAdapter(task=_text_task, heldout=_heldout_text, predictions=False))
register_task_adapter(None, SequenceTaskData, TaskAdapter(
    task=lambda data, model, ebs: SequenceLMTask(data, ebs), heldout=_heldout_labelled, predictions=False))
register_task_adapter(None, NodeData, TaskAdapter(task=lambda data, model, ebs: NodeTask(data), heldout=_heldout_nodes,
                                                  predictions=False))
register_task_adapter(None, GraphSetData, TaskAdapter(
    task=lambda data, model, ebs: GraphClassificationTask(data, min(ebs, 256)), heldout=_heldout_graphs, predictions=True))


# the model families: what each takes from the data it fits
@task_adapter(ViTConfig, ClassificationData)
def _vit_sizes(data: ClassificationData) -> dict[str, Any]:
    shape = tuple(data.input_shape)
    if data.kind == "image":
        return {"in_channels": shape[0], "input_size": shape[1:], "num_classes": data.num_classes}
    return {"in_channels": shape[1], "input_size": shape[:1], "num_classes": data.num_classes}


@task_adapter(GPTConfig, (TextData, SequenceTaskData))
def _gpt_sizes(data: TextData | SequenceTaskData) -> dict[str, Any]:
    return {"vocab_size": data.vocab_size}


@task_adapter((GraphTransformerConfig, GCNConfig, GINConfig), NodeData)
def _graph_node_sizes(data: NodeData) -> dict[str, Any]:
    return {"in_channels": data.num_features, "num_classes": data.num_classes, "task": "node"}


@task_adapter((GraphTransformerConfig, GCNConfig, GINConfig), GraphSetData)
def _graph_set_sizes(data: GraphSetData) -> dict[str, Any]:
    return {"in_channels": data.num_features, "num_classes": data.num_classes, "task": "graph"}


# DINO: any data reaches it (and is refused unless it is images); its task is self-supervised, and
# the analysis reads its teacher backbone, which has no classifier
@task_adapter(DINOConfig, object, task=lambda data, model, ebs: DINOTask(data, model, ebs),
              analysed=lambda model: model.backbone, predictions=False,
              note="DINO teacher backbone (no classifier: no predictions)")
def _dino_sizes(data: Any) -> dict[str, Any]:
    if isinstance(data, ClassificationData) and data.kind == "image":
        return {"in_channels": data.input_shape[0], "input_size": tuple(data.input_shape[1:])}
    raise ValueError(
        f"dataset {getattr(data, 'name', '?')!r} of kind {getattr(data, 'kind', '?')!r} does not fit a DINO "
        "model: self-supervised DINO needs image data (e.g. digits, mnist, mnist-mini, cifar10)"
    )


def _is_dino(model: nn.Module) -> bool:
    from diffusionformer.models.dino import DINO

    return isinstance(model, DINO)


def as_metrics(record: Mapping[str, Any] | None) -> dict[str, float]:
    """Flatten an eval record of ``metrics.jsonl`` into ``{name: value}``."""
    if not record:
        return {}
    metrics = record.get("metrics")

    def number(v: Any) -> bool:  # a hand-edited true is not accuracy 1.0
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    out = {k: v for k, v in metrics.items() if number(v)} if isinstance(metrics, Mapping) else {}
    if number(record.get("loss")):
        out.setdefault("loss", record["loss"])
    return out
