"""Atomic checkpoint files that load with ``torch.load(..., weights_only=True)``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from diffusionformer._files import (file_kind, leftover_temps, load_error_text, refusal_kind, set_new_file_mode,
                                    weights_only_refusal, zip_damage)

from .errors import CheckpointError

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_NAME", "save_checkpoint", "load_checkpoint", "model_record",
           "model_record_differences"]

CHECKPOINT_FORMAT = "diffusionformer.train/1"
CHECKPOINT_NAME = "checkpoint.pt"
_REQUIRED = ("format", "step", "model", "optimizer", "rng", "config")


def _fsync_dir(directory: Path) -> None:
    # Make the rename itself durable; not every platform/filesystem allows opening a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(path: str | os.PathLike[str], payload: Mapping[str, Any]) -> Path:
    """Write ``payload`` to ``path`` atomically: a crash leaves either the old file or the new.

    The payload is written to a temporary file in the same directory, flushed and
    ``fsync``-ed, then moved over ``path`` with ``os.replace`` (atomic on POSIX and Windows);
    on any error the temporary file is removed and ``path`` is untouched. Temporary files of
    ``path`` left by a hard kill of an earlier save are removed once this one has landed.

    Args:
        path: destination file.
        payload: tensors, state dicts and plain Python values.

    Returns:
        The destination path.

    Examples:
        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = save_checkpoint(pathlib.Path(d) / "x.pt", {"w": torch.ones(2)})
        ...     sorted(q.name for q in p.parent.iterdir()), torch.load(p)["w"].tolist()
        (['x.pt'], [1.0, 1.0])
    """
    if not isinstance(payload, Mapping):  # else "'NoneType' object is not iterable" from dict(payload), after mkdir
        raise TypeError(f"save_checkpoint: expected payload to be a mapping (a dict of state), "
                        f"got {type(payload).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            set_new_file_mode(f.fileno())  # mkstemp's 0600 would hide the checkpoint from the run folder's readers
            torch.save(dict(payload), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)
    # a hard kill (SIGKILL, power loss) skips the cleanup above: its checkpoint-sized temporary file stays, one per
    # kill; this save of the same path supersedes it (one writer per path: the trainer saves on rank 0 only)
    for stale in leftover_temps(path):  # not NAME.best's, which may be in flight beside it
        with contextlib.suppress(OSError):
            stale.unlink()
    return path


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a training checkpoint with ``weights_only=True`` onto the CPU and check its layout.

    Args:
        path: a file written by the trainer (:func:`save_checkpoint` of the trainer payload).

    Raises:
        FileNotFoundError: ``path`` does not exist, or is not a regular file (a folder, a FIFO, a link to a
            missing file).
        CheckpointError: the file is truncated/corrupt, holds objects that ``weights_only``
            refuses, lacks the trainer's keys, or may not be read (then it is not called
            damaged). The file is never modified.
    """
    path = Path(path)
    if not path.is_file():
        # a FIFO or a device is there, not missing: "missing" sent the user looking for a file that is in place
        # a link to a missing file (a disk not mounted) or a loop of links is there too: `ls` lists it
        what = ("a symbolic link to a missing file (or a loop of links)" if path.is_symlink() and not path.exists()
                else "missing" if not path.exists() else "a directory" if path.is_dir()
                else file_kind(path.stat().st_mode))
        raise FileNotFoundError(f"load_checkpoint: expected a checkpoint file, got {what} {path}")
    damage = zip_damage(path)
    if damage is not None:
        raise CheckpointError(
            f"checkpoint {path} ({path.stat().st_size} bytes) is corrupt: {damage}; it was left untouched. Delete "
            "it (or resume from another copy) to continue."
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except PermissionError as err:  # no sign of damage: the advice below would lose a good file
        raise CheckpointError(
            f"checkpoint {path} cannot be read by this process ({err}); the file itself may be intact "
            "and was left untouched: give this user read access to it to continue."
        ) from err
    except pickle.UnpicklingError as err:
        refused = weights_only_refusal(err, path)
        if refused is None:  # damaged pickle bytes
            raise _unreadable(path, err) from err
        # a whole, well-formed file naming a type weights_only does not allow (e.g. a NumPy array returned by
        # a module's get_extra_state): not damage, so no advice to delete it
        error = CheckpointError(
            f"checkpoint {path} is unreadable: it holds objects that torch.load(weights_only=True) refuses "
            f"({refused}); not damage: there is no need to delete it, and it was left untouched. "
            f"{_refusal_advice(refused)}"
        )
        # what was refused, for the runner's and the command line's advice (runner._not_resumed_advice): read
        # here, where the file is at hand (an opcode counts as a refusal only in a zip whose CRCs passed)
        error._weights_only_refusal = refused
        raise error from err
    except Exception as err:  # torch's unpickler raises struct.error, IndexError, KeyError... on damaged bytes
        raise _unreadable(path, err) from err
    if not isinstance(payload, dict):
        raise CheckpointError(
            f"checkpoint {path}: expected a dict with keys {list(_REQUIRED)}, got "
            f"{type(payload).__name__}"
        )
    missing = [k for k in _REQUIRED if k not in payload]
    if missing:
        raise CheckpointError(
            f"checkpoint {path}: expected a training checkpoint with keys {list(_REQUIRED)}, "
            f"missing {missing}"
        )
    if payload["format"] != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"checkpoint {path}: expected format {CHECKPOINT_FORMAT!r}, got {payload['format']!r}"
        )
    step = payload["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"checkpoint {path}: expected an int step >= 0, got {step!r}")
    for key in ("model", "config"):  # a state dict and a TrainConfig table (else a bare TypeError far from the file)
        if not isinstance(payload[key], dict):
            raise CheckpointError(f"checkpoint {path}: expected {key!r} to be a dict, got {type(payload[key]).__name__}")
    bad = [k for k in payload["model"] if not isinstance(k, str)][:1]  # else load_state_dict's bare AttributeError
    if bad:
        raise CheckpointError(f"checkpoint {path}: expected 'model' to be a state dict (parameter names as keys), "
                              f"got the key {bad[0]!r} ({type(bad[0]).__name__})")
    return payload


def _refusal_advice(refused: str) -> str:
    """What to do about a whole checkpoint holding ``refused`` (:func:`~diffusionformer._files.weights_only_refusal`):
    an allow-list reaches a type, not a pickle protocol nor a global of a module torch blocks (``os``, ``sys``)."""
    kind = refusal_kind(refused)
    if kind == "protocol":
        return "Load it only if you trust its source, and save it again with torch.save's default pickle protocol."
    if kind == "blocked":
        return ("torch.load(weights_only=True) loads no global of a blocked module, whatever is allowed, and the "
                "trainer saves none: load it only if you trust its source.")
    return ("Load it only if you trust its source (torch.serialization.add_safe_globals allows a type); a module's "
            "get_extra_state should return tensors and plain Python values.")


def _unreadable(path: Path, err: BaseException) -> CheckpointError:
    size = path.stat().st_size
    return CheckpointError(
        f"checkpoint {path} ({size} bytes) is unreadable: truncated, corrupt, or holding "
        f"objects that torch.load(weights_only=True) refuses; it was left untouched. Delete it "
        f"(or resume from another copy) to continue. Cause: {load_error_text(err)}"
    )


def model_record(model: torch.nn.Module) -> dict[str, Any]:
    """What identifies a model beyond its tensor shapes, as plain JSON-like values.

    ``class`` (module and qualified name), ``config`` (``model.config`` when it is a
    dataclass, else ``None``) and ``heads``: the head layout of every submodule that has a
    ``heads_spec()`` (each diffusion attention layer), by module name. Two models with
    the same shapes but different operators (all attention vs Laplacian heads) differ here.

    Args:
        model: any module (train/ knows no model class; the fields are read by duck typing).

    Examples:
        >>> model_record(torch.nn.Linear(2, 3))
        {'class': 'torch.nn.modules.linear.Linear', 'config': None, 'heads': {}}
    """
    cfg = getattr(model, "config", None)
    config = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type) else None
    heads = {name: m.heads_spec() for name, m in model.named_modules() if callable(getattr(m, "heads_spec", None))}
    record = {"class": f"{type(model).__module__}.{type(model).__qualname__}", "config": config, "heads": heads}
    return json.loads(json.dumps(record, default=str))  # plain types: weights_only-safe, comparable after a reload


def _predated_fields_at_default(saved: Mapping[str, Any], model: torch.nn.Module) -> Mapping[str, Any]:
    """``saved`` (a :func:`model_record`) with the config fields it predates, those of ``model.config``'s dataclass
    that it lacks, at their defaults: the model that wrote it had no such field, so it ran as the default does (a
    checkpoint from before ``recompute`` or ``mlp`` existed was refused on resume, "config mlp: checkpoint None")."""
    cfg, config = getattr(model, "config", None), saved.get("config")
    if not (dataclasses.is_dataclass(cfg) and not isinstance(cfg, type) and isinstance(config, Mapping)):
        return saved
    defaults = {}
    for f in dataclasses.fields(cfg):
        if f.name not in config and f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.name not in config and f.default_factory is not dataclasses.MISSING:  # a list default: a default too
            defaults[f.name] = f.default_factory()
    # as model_record writes values: dataclasses.asdict's dicts of nested dataclass defaults (a str of them was
    # another config), then JSON's plain types
    record = dataclasses.asdict(dataclasses.make_dataclass("_Defaults", list(defaults))(**defaults))
    filled = json.loads(json.dumps(record, default=str))
    return {**saved, "config": {**filled, **config}}


def model_record_differences(saved: Mapping[str, Any], now: Mapping[str, Any], limit: int = 6) -> list[str]:
    """Human-readable differences between two :func:`model_record` values (at most ``limit``)."""
    diffs = []
    if saved.get("class") != now.get("class"):
        diffs.append(f"class: checkpoint {saved.get('class')}, now {now.get('class')}")
    from diffusionformer.nn.block import _names_as_read  # norm, mlp and heads as read: "RMSNorm" is "rmsnorm"

    a, b = saved.get("config") or {}, now.get("config") or {}
    read_a, read_b = _names_as_read(a), _names_as_read(b)
    diffs += [f"config {k}: checkpoint {a.get(k)!r}, now {b.get(k)!r}" for k in sorted(set(a) | set(b))
              if read_a.get(k) != read_b.get(k)]
    ha, hb = saved.get("heads") or {}, now.get("heads") or {}
    diffs += [f"heads of {k}: checkpoint {ha.get(k)!r}, now {hb.get(k)!r}" for k in sorted(set(ha) | set(hb)) if ha.get(k) != hb.get(k)]
    return diffs[:limit] + ([f"... and {len(diffs) - limit} more"] if len(diffs) > limit else [])
