"""Typed, validated configuration of the training loop."""

from __future__ import annotations

import dataclasses
import math
import numbers
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from diffusionformer.config import _choice_hint, _device_hint, _raise_collected, _value_type

__all__ = ["TrainConfig", "resolve_device", "resolve_amp"]

_DECAY_RULES = ("default", "nanogpt")
_MAX_RUN_SEED = 2**32 - 1  # the largest seed: NumPy's seed_everything takes [0, 2**32)
_AMP_CHOICES = ("auto", "bf16", "fp16", "off")
# other spellings of an amp value (--precision's "fp32" among them): spelling alone points "fp32" at "fp16"
_AMP_ALIASES = {"fp32": "off", "float32": "off", "none": "off", "no": "off", "bfloat16": "bf16", "float16": "fp16",
                "half": "fp16"}
_LOGGER_CHOICES = ("jsonl", "csv", "tensorboard")  # = loggers.LOGGER_CHOICES (no import cycle)
# other trainers' names of a field (nanoGPT, timm/DINO, Hugging Face, Lightning), which spelling alone hinted wrongly
# ("max_lr" -> 'min_lr', "total_steps" -> 'eval_steps', "weight_decay_rate" -> 'weight_decay_rule') or not at all
_KEY_ALIASES = {"learning_rate": "lr", "max_lr": "lr", "peak_lr": "lr", "base_lr": "lr", "min_learning_rate": "min_lr",
                "total_steps": "max_steps", "weight_decay_rate": "weight_decay", "wd": "weight_decay",
                "clip_grad": "grad_clip", "clip_grad_norm": "grad_clip", "max_grad_norm": "grad_clip",
                "accumulate_grad_batches": "grad_accum_steps"}


def _type_name(value: Any) -> str:
    return _value_type(value)  # numpy.bool, not the contradictory "expected bool, got bool"


def _check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    # bool is a subclass of int; a flag passed for a count is a user error, not a 0/1. Any other
    # integral number (a numpy int from a sweep grid) is read as the Python int it equals.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"TrainConfig.{name}: expected int, got {_type_name(value)} ({value!r})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"TrainConfig.{name}: expected an int >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"TrainConfig.{name}: expected an int <= {maximum}, got {value}")
    return value


def _as_float(value: numbers.Real, what: str, expected: str, got: str) -> float:
    """``float(value)``, or a ValueError "``what``: expected ``expected``, got ``got`` beyond the float range" for an
    int (or Fraction) beyond it: float() raises a bare "int too large to convert to float" instead of giving inf."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{what}: expected {expected}, got {got} beyond the float range (|x| > 1.8e308)") from None


def _check_float(name: str, value: Any, minimum: float, *, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"TrainConfig.{name}: expected float, got {_type_name(value)} ({value!r})")
    value = _as_float(value, f"TrainConfig.{name}", "a finite float", _type_name(value))
    if not math.isfinite(value):
        raise ValueError(f"TrainConfig.{name}: expected a finite float, got {value}")
    if value < minimum or (strict and value == minimum):
        op = ">" if strict else ">="
        raise ValueError(f"TrainConfig.{name}: expected a float {op} {minimum}, got {value}")
    return value


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"TrainConfig.{name}: expected bool, got {_type_name(value)} ({value!r})")


def _check_betas(value: Any) -> tuple[float, float]:
    pair = value
    if hasattr(pair, "__array__") and getattr(pair, "ndim", None) == 1:  # a sweep's numpy pair (or a tensor)
        pair = tuple(pair.tolist())
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"TrainConfig.betas: expected a pair (beta1, beta2), got {_type_name(value)} ({value!r})")
    betas = tuple(_check_float(f"betas[{i}]", b, 0.0) for i, b in enumerate(pair))
    for i, b in enumerate(betas):
        if b >= 1.0:
            raise ValueError(f"TrainConfig.betas[{i}]: expected a float in [0, 1), got {b}")
    return betas


def _check_device_field(device: Any) -> None:
    if not isinstance(device, str):
        raise TypeError(f"TrainConfig.device: expected str, got {_type_name(device)} ({device!r})")
    if device != "auto":
        kind = _torch_device(device).type
        if kind not in ("cpu", "cuda"):  # 'meta', 'mps', ...: the trainer runs on CPU and CUDA only
            raise ValueError(f"TrainConfig.device: expected 'auto', 'cpu' or 'cuda[:N]', got {device!r}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...], aliases: Mapping[str, str] | None) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"TrainConfig.{name}: expected one of {choices}, got {value!r}"
                         f"{_choice_hint(value, choices, aliases)}")


def _check_loggers(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (tuple, list)) or not all(isinstance(n, str) for n in value):
        raise TypeError(
            f"TrainConfig.loggers: expected a list of names from {_LOGGER_CHOICES}, got "
            f"{_type_name(value)} ({value!r})"
        )
    loggers = tuple(value)
    unknown = [n for n in loggers if n not in _LOGGER_CHOICES]
    if unknown or len(set(loggers)) != len(loggers) or "jsonl" not in loggers:
        raise ValueError(
            f"TrainConfig.loggers: expected distinct names from {_LOGGER_CHOICES} including "
            f"'jsonl' (metrics.jsonl is what resume and the experiment runner read), got {list(loggers)}"
            f"{_choice_hint(unknown[0], _LOGGER_CHOICES) if unknown else ''}"
        )
    return loggers


@dataclass(frozen=True)
class TrainConfig:
    r"""Hyper-parameters of :class:`~diffusionformer.train.Trainer`.

    The optimiser is AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization",
    ICLR 2019) with the learning rate of update ``s`` (0-based) given by
    :func:`~diffusionformer.train.cosine_lr`: a linear warm-up over ``warmup_steps`` to ``lr``,
    then a cosine decay to ``min_lr`` at ``lr_decay_steps``, then constant ``min_lr``
    (Loshchilov & Hutter, "SGDR", ICLR 2017; the nanoGPT recipe).

    Every field is checked on construction: a wrong type raises ``TypeError`` and a value out
    of range raises ``ValueError``, both naming the field, what was expected and what came.
    Counts take any integral number and rates any real one (a NumPy number from a sweep grid
    is stored as the Python ``int``/``float`` it equals); a ``bool`` is never a number here.
    Use :meth:`from_dict` for configs read from TOML/JSON: it also rejects unknown keys.

    Args:
        max_steps: number of optimiser updates of the whole run (``>= 1``).
        batch_size: global batch size handed to ``task.train_batch`` (``>= 1``, at most ``sys.maxsize``: a tensor
            size; split across ranks under DDP, so the effective batch does not depend on the number of processes).
        grad_accum_steps: micro-batches per update (``>= 1``). Each rank's share of the batch is
            split into this many equal micro-batches (``task.shard_batch`` or
            :func:`~diffusionformer.train.shard_batch`); each micro-batch's loss is scaled by
            ``1 / grad_accum_steps`` and back-propagated, and one optimiser step follows, so the
            update equals the one on the whole batch while only a micro-batch is in memory.
            Under DDP the gradient all-reduce runs on the last micro-batch only (``no_sync``).
        lr: peak learning rate (``> 0``).
        min_lr: learning rate at the end of the cosine decay (``0 <= min_lr <= lr``).
        weight_decay: decoupled weight decay of the matrices (see
            :func:`~diffusionformer.train.param_groups`); biases and norm weights are never
            decayed, embeddings only under ``weight_decay_rule = "nanogpt"``.
        betas: AdamW ``(beta1, beta2)``, each in ``[0, 1)``; a list or a 1-D numpy array is accepted.
        warmup_steps: updates of linear warm-up (``0`` = none).
        lr_decay_steps: update at which the cosine reaches ``min_lr``; ``None`` = ``max_steps``.
            Set it explicitly if a run may later be extended with a larger ``max_steps``.
        grad_clip: maximum global L2 norm of the gradients (``0`` = no clipping).
        eval_interval: evaluate every this many updates and always after the last one
            (``0`` = only after the last one).
        eval_steps: passed to ``task.evaluate`` as ``max_batches`` (``None`` = full evaluation).
            A cap the task may use: the bundled text, DINO and neighbour-sampled node tasks do
            (text windows, k-NN batches, sampled batches); classification, sequence, full-batch
            node and graph tasks always score the whole split.
        log_interval: write a train record (mean over the window) every this many updates.
        checkpoint_interval: save a checkpoint every this many updates and always after the
            last one (``0`` = only after the last one).
        seed: seeds Python, NumPy, torch (CPU and CUDA) and the batch generator (``[0, 2**32)``).
        device: ``"auto"`` (CUDA when available, else CPU) or a ``torch.device`` string.
        amp: ``"auto"`` (bf16 autocast on CUDA, off elsewhere), ``"bf16"``, ``"fp16"`` or
            ``"off"``. ``"fp16"`` autocasts to float16 and scales the loss with
            :class:`torch.amp.GradScaler` (Micikevicius et al., "Mixed Precision Training", ICLR
            2018): an update whose gradients overflow is skipped and the scale halved, so a
            non-finite gradient norm is not an error under fp16 (a non-finite loss still is, and so is a
            scale halved to 0 by about 165 skips in a row, from which no later update can recover);
            a log window holding such a skipped update logs ``grad_norm`` as ``null`` (its mean
            is inf), and every fp16 train record counts the skipped updates of its window in the
            int metric ``skipped_updates`` (0 when none; absent without fp16, and from older logs:
            read it with ``.get``); a window cut by a checkpoint goes on counting after a resume.
            The scaler's state is checkpointed. bf16 needs no scaler. Autocast leaves
            float64 alone: for a float64 model ``"auto"`` is off and ``"bf16"``/``"fp16"`` are refused.
        compile: wrap the model in ``torch.compile``.
        progress: show a tqdm progress bar (only on rank 0, and only on a terminal).
        weight_decay_rule: which tensors ``weight_decay`` applies to (see
            :func:`~diffusionformer.train.param_groups`): ``"default"`` every tensor with
            ``dim >= 2`` except embeddings and ``no_weight_decay()`` names; ``"nanogpt"`` every
            tensor with ``dim >= 2``, embeddings included (nanoGPT's ``configure_optimizers``).
        loggers: metrics writers of the run directory, a subset of ``("jsonl", "csv",
            "tensorboard")`` that includes ``"jsonl"`` (``metrics.jsonl`` is what resume and the
            experiment runner read); ``"csv"`` adds ``metrics.csv``, ``"tensorboard"`` event files
            under ``tensorboard/`` (needs the optional ``tensorboard`` package). See
            :mod:`diffusionformer.train.loggers`. A list is accepted.

    Examples:
        >>> cfg = TrainConfig.from_dict({"max_steps": 100, "lr": 1e-3, "betas": [0.9, 0.99]})
        >>> cfg.betas, cfg.decay_steps
        ((0.9, 0.99), 100)
        >>> TrainConfig.from_dict({"max_step": 100})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: unknown TrainConfig key 'max_step' (did you mean 'max_steps'?); valid keys: ...
    """

    max_steps: int = 1000
    batch_size: int = 32
    grad_accum_steps: int = 1  # micro-batches per update
    lr: float = 3e-4
    min_lr: float = 0.0
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 0
    lr_decay_steps: int | None = None  # None = max_steps
    grad_clip: float = 1.0  # 0 = off
    eval_interval: int = 200  # 0 = only at the end
    eval_steps: int | None = None  # None = full evaluation
    log_interval: int = 10
    checkpoint_interval: int = 1000  # 0 = only at the end
    seed: int = 0
    device: str = "auto"
    amp: str = "auto"
    compile: bool = False
    progress: bool = True
    weight_decay_rule: str = "default"
    loggers: tuple[str, ...] = ("jsonl",)  # subset of ("jsonl", "csv", "tensorboard")

    def __post_init__(self) -> None:
        errors: list[Exception] = []

        def check(fn: Any, *args: Any, **kwargs: Any) -> Any:  # every field's problem, not the first alone
            try:
                return fn(*args, **kwargs)
            except (TypeError, ValueError) as exc:
                errors.append(exc)
                return None

        # a batch size is a tensor size: past sys.maxsize it passed, and the first step failed in torch ("Overflow
        # when unpacking long long", with its C++ backtrace), naming no field
        ints = {name: check(_check_int, name, getattr(self, name), 1, sys.maxsize if name == "batch_size" else None)
                for name in ("max_steps", "batch_size", "grad_accum_steps")}
        batch, accum = ints["batch_size"], ints["grad_accum_steps"]  # None: that field had a problem
        if None not in (batch, accum) and batch % accum:
            errors.append(ValueError(f"TrainConfig.batch_size: expected a multiple of grad_accum_steps "
                                     f"({self.grad_accum_steps}, equal micro-batches), got {self.batch_size}"))
        lr = check(_check_float, "lr", self.lr, 0.0, strict=True)
        min_lr = check(_check_float, "min_lr", self.min_lr, 0.0)
        if None not in (lr, min_lr) and min_lr > lr:
            errors.append(ValueError(f"TrainConfig.min_lr: expected a float <= lr ({lr}), got {min_lr}"))
        weight_decay = check(_check_float, "weight_decay", self.weight_decay, 0.0)
        grad_clip = check(_check_float, "grad_clip", self.grad_clip, 0.0)
        betas = check(_check_betas, self.betas)
        ints["warmup_steps"] = check(_check_int, "warmup_steps", self.warmup_steps, 0)
        if self.lr_decay_steps is not None:
            ints["lr_decay_steps"] = check(_check_int, "lr_decay_steps", self.lr_decay_steps, 1)
        decay = ints["max_steps"] if self.lr_decay_steps is None else ints["lr_decay_steps"]
        if None not in (decay, ints["warmup_steps"]) and decay < ints["warmup_steps"]:
            if self.lr_decay_steps is None:  # the field set is max_steps: name it, and what to change
                errors.append(ValueError(
                    f"TrainConfig.max_steps: expected max_steps >= warmup_steps ({self.warmup_steps}) while "
                    f"lr_decay_steps is unset (the schedule decays over max_steps), got {decay}; lower "
                    "warmup_steps or set lr_decay_steps (the run then stops inside its warm-up)"
                ))
            else:
                errors.append(ValueError(
                    "TrainConfig.lr_decay_steps: expected lr_decay_steps (None = max_steps) >= "
                    f"warmup_steps ({self.warmup_steps}), got {decay}"
                ))
        ints["eval_interval"] = check(_check_int, "eval_interval", self.eval_interval, 0)
        if self.eval_steps is not None:
            ints["eval_steps"] = check(_check_int, "eval_steps", self.eval_steps, 1)
        ints["log_interval"] = check(_check_int, "log_interval", self.log_interval, 1)
        ints["checkpoint_interval"] = check(_check_int, "checkpoint_interval", self.checkpoint_interval, 0)
        ints["seed"] = check(_check_int, "seed", self.seed, 0, _MAX_RUN_SEED)
        check(_check_device_field, self.device)
        check(_check_choice, "amp", self.amp, _AMP_CHOICES, _AMP_ALIASES)
        check(_check_choice, "weight_decay_rule", self.weight_decay_rule, _DECAY_RULES, None)
        check(_check_bool, "compile", self.compile)
        check(_check_bool, "progress", self.progress)
        loggers = check(_check_loggers, self.loggers)
        _raise_collected(errors, "TrainConfig")
        # Normalise numeric types so that equal configs compare and serialise equal.
        for name, value in ints.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "lr", lr)
        object.__setattr__(self, "min_lr", min_lr)
        object.__setattr__(self, "weight_decay", weight_decay)
        object.__setattr__(self, "grad_clip", grad_clip)
        object.__setattr__(self, "betas", betas)
        # a numpy str (a sweep grid's np.array(["bf16", "off"])) is the str it equals: to_dict goes into every
        # checkpoint, and torch.load(weights_only=True) refuses numpy scalars (the run could never resume)
        for name in ("device", "amp", "weight_decay_rule"):
            object.__setattr__(self, name, str(getattr(self, name)))
        object.__setattr__(self, "loggers", tuple(str(n) for n in loggers))

    @property
    def decay_steps(self) -> int:
        """The resolved ``lr_decay_steps`` (``max_steps`` when unset)."""
        return self.max_steps if self.lr_decay_steps is None else self.lr_decay_steps

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build a config from a mapping (a TOML table, a JSON object), rejecting unknown keys.

        Args:
            data: field name -> value; missing fields take their defaults.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"TrainConfig.from_dict: expected a mapping, got {_type_name(data)}")
        names = [f.name for f in dataclasses.fields(cls)]
        errors: list[Exception] = []  # every unknown key and every problem of the known ones, not the first alone
        for key in data:
            if key not in names:
                errors.append(ValueError(  # "LR" -> 'lr', "learning_rate" -> 'lr'
                    f"unknown TrainConfig key {key!r}{_choice_hint(str(key), names, _KEY_ALIASES)}; valid keys: "
                    f"{', '.join(names)}"
                ))
        try:
            config = cls(**{k: v for k, v in data.items() if k in names})
        except (TypeError, ValueError) as exc:
            errors.append(exc)
        _raise_collected(errors, "TrainConfig")
        return config

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict (JSON- and ``torch.load(weights_only=True)``-safe) that round-trips
        through :meth:`from_dict`."""
        out = dataclasses.asdict(self)
        out["betas"] = list(self.betas)
        out["loggers"] = list(self.loggers)
        return out


def _torch_device(spec: str) -> torch.device:
    """``torch.device(spec)``; a string torch cannot read (``"cdua"``) is a ValueError naming ``TrainConfig.device``
    with a "did you mean" among ``'auto'``, ``'cpu'`` and ``'cuda'``, not torch's RuntimeError listing every device type."""
    try:
        return torch.device(spec)
    except TypeError as err:  # None, 1.5: torch's "device() received an invalid combination of arguments"
        raise TypeError(f"TrainConfig.device: expected 'auto' or a torch device string such as 'cpu', 'cuda' or "
                        f"'cuda:1', got {_type_name(spec)} ({spec!r})") from err
    except (RuntimeError, ValueError) as err:
        # the package's device hint: "CPU" -> 'cpu', "CUDA:1" -> 'cuda:1', "gpu" -> 'cuda' (not 'cpu'), "tpu" -> none
        raise ValueError(
            f"TrainConfig.device: expected 'auto' or a torch device string such as 'cpu', "
            f"'cuda' or 'cuda:1', got {spec!r}{_device_hint(spec, ('auto', 'cpu', 'cuda'))}"
        ) from err


def _check_device(where: str, device: Any) -> None:
    """A ``TypeError`` naming ``where`` unless ``device`` is a ``torch.device`` (else a bare AttributeError on
    ``device.type`` deep inside; a string goes through :func:`resolve_device` first)."""
    if not isinstance(device, torch.device):
        raise TypeError(f"{where}: expected device to be a torch.device (resolve_device turns a string into one), "
                        f"got {_type_name(device)} ({device!r})")


def resolve_device(spec: str, local_rank: int | None = None) -> torch.device:
    """Turn ``TrainConfig.device`` into a ``torch.device``.

    ``"auto"`` is CUDA when available, else CPU. Under multi-process training
    (``local_rank`` given), a bare ``"cuda"``/``"auto"`` on CUDA means ``cuda:<local_rank>``.

    Args:
        spec: ``"auto"`` or a torch device string.
        local_rank: this process's index on its node, or ``None`` in a single process.

    Examples:
        >>> resolve_device("cpu", local_rank=1)
        device(type='cpu')
    """
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    device = _torch_device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"TrainConfig.device: expected an available device, got {spec!r} but "
                "torch.cuda.is_available() is False (use 'auto' or 'cpu')"
            )
        if device.index is None:
            index = local_rank if local_rank is not None else torch.cuda.current_device()
            device = torch.device("cuda", index)
    return device


def resolve_amp(spec: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``TrainConfig.amp`` on ``device`` (``None`` = no autocast).

    Args:
        spec: ``"auto"`` (bf16 on CUDA only), ``"bf16"``, ``"fp16"`` or ``"off"``.
        device: the training device.

    Examples:
        >>> resolve_amp("auto", torch.device("cpu")) is None
        True
        >>> resolve_amp("bf16", torch.device("cpu"))
        torch.bfloat16
        >>> resolve_amp("fp16", torch.device("cpu"))
        torch.float16
    """
    _check_device("resolve_amp", device)  # else resolve_amp("auto", "cuda") is a bare AttributeError on device.type
    if spec == "off":
        return None
    if spec == "bf16":
        return torch.bfloat16
    if spec == "fp16":
        return torch.float16
    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    raise ValueError(f"TrainConfig.amp: expected one of {_AMP_CHOICES}, got {spec!r}{_choice_hint(spec, _AMP_CHOICES, _AMP_ALIASES)}")
