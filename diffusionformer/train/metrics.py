"""The metrics log: one JSON object per line in ``<out_dir>/metrics.jsonl``."""

from __future__ import annotations

import codecs
import contextlib
import json
import math
import numbers
import os
import stat
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from diffusionformer._files import file_kind, set_new_file_mode
from diffusionformer._warnings import user_stacklevel
from diffusionformer.config import _check_flag

__all__ = ["METRICS_NAME", "MetricsLog", "read_metrics", "write_json_atomic", "write_text_atomic"]

METRICS_NAME = "metrics.jsonl"


def _plain(value: Any) -> Any:
    """JSON-safe copy of a record: non-finite floats become ``None`` (strict JSON has no NaN), NumPy
    numbers the Python ``int``/``float`` they equal."""
    if isinstance(value, Mapping):
        plain = {str(k): _plain(v) for k, v in value.items()}
        if len(plain) != len(value):  # else all but one of the values of keys 1 and "1" were dropped without a word
            raise ValueError(f"expected keys that differ as strings (JSON object keys), got {sorted(map(repr, value))}")
        return plain
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.bool_):  # not a numbers.Real; json: "Object of type bool is not JSON serializable"
        return bool(value)
    if not isinstance(value, (bool, int, float)) and isinstance(value, numbers.Real):
        # np.float32 / np.int64 (numbers, but not to json: "Object of type float32 is not JSON serializable")
        value = int(value) if isinstance(value, numbers.Integral) else float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@contextlib.contextmanager
def _atomic_file(path: str | os.PathLike[str], newline: str | None = None) -> Iterator[TextIO]:
    """A UTF-8 text file that replaces ``path`` (``os.replace``) only once written and synced;
    on any failure the previous file stays whole and no temporary is left behind. ``newline``
    as for :func:`open` (``""`` for the csv module)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) as f:
            set_new_file_mode(f.fileno())
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _cut_back(f: TextIO, path: Path, size: int) -> None:
    """After a failed append (a full disk, an interrupt): close ``f`` and cut ``path`` back to ``size``, its length
    before the append, so that the file ends on a whole line and a later append does not run on from a partial one
    (a JSON line two records long, or a CSV row whose cells mix two records)."""
    with contextlib.suppress(OSError):
        f.close()  # its flush may still write part of the rest: cut after it
    with contextlib.suppress(OSError):
        os.truncate(path, size)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) via a temporary file beside ``path`` and ``os.replace``.

    A write that fails half-way (a full disk, an interrupt) leaves the previous file whole
    and no temporary behind.
    """
    with _atomic_file(path) as f:
        f.write(text)


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON via a temporary file and ``os.replace``.

    Args:
        path: destination file.
        obj: JSON-serialisable value (non-finite floats are written as ``null``).
    """
    with _atomic_file(path) as f:
        json.dump(_plain(obj), f, indent=2, allow_nan=False)
        f.write("\n")


def _check_regular_file(path: Path, what: str, *, resume: bool = True) -> None:
    """Refuse a FIFO, a device, a socket or a folder at ``path`` (a run log that exists): reading a FIFO would wait
    for a writer for ever, a device (``/dev/zero``) fill the memory, and the rewrite would replace it. ``resume``:
    the check is the trainer's on resume (else a reader's: nothing is rewritten)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise ValueError(f"{what}: expected {path} to be a regular file (the run's log{', read on resume' * resume}), "
                         f"got {file_kind(mode)}; remove it (or move it away){' and resume again' * resume}")


def _parse_lines(path: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    with open(path, "rb") as f:
        lines = f.read().removeprefix(codecs.BOM_UTF8).splitlines()  # an editor's byte order mark is not a record
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            # Bytes that are not UTF-8 make a malformed line, like broken JSON: the rest is kept.
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):  # RecursionError: "[[[[..." nested deep
            # A run killed mid-write leaves a partial last line; anything else is worth a warning.
            if number != len(lines):
                warnings.warn(f"{path}:{number}: skipping a malformed metrics line", stacklevel=user_stacklevel())
            continue
        if _is_record(record):
            records.append(record)
        else:
            warnings.warn(f"{path}:{number}: skipping a line that is not a metrics record (an integer 'step' from 0 "
                          "to 2**63 - 1, a 'split' name and a 'metrics' mapping)", stacklevel=user_stacklevel())
    return records


def _is_record(record: Any) -> bool:
    """Whether a parsed line has the fields every reader of the log relies on."""
    if not isinstance(record, dict):
        return False
    step = record.get("step")
    # a step no trainer writes (negative, past int64: a flipped digit) made the plots' step axis an object array
    return (isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2**63
            and isinstance(record.get("split"), str) and isinstance(record.get("metrics", {}), dict))


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a metrics log (a file or a run directory) into a list of records.

    Each record is ``{"step", "split", "loss", "lr", "metrics", "elapsed", "time"}``: ``step``
    is the number of updates done, ``split`` is ``"train"`` (means over the log window) or
    ``"eval"`` (the task's ``evaluate`` output, ``loss`` copied from its ``"loss"`` key),
    ``elapsed`` the training seconds so far (accumulated across resumes), ``time`` a Unix time.
    A truncated last line (a killed run) is skipped; any other line that is not JSON, not UTF-8
    or not such a record (an integer ``step`` from 0 to ``2**63 - 1``, a ``split`` name, a ``metrics`` mapping) is
    skipped with a warning naming the file and line.

    Args:
        path: ``metrics.jsonl`` or the directory that holds it.

    Raises:
        FileNotFoundError: no such file.
        ValueError: ``path`` is a FIFO, a device or a socket (reading one would wait or fill the memory).
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_NAME
    _check_regular_file(path, "read_metrics", resume=False)  # a FIFO: else a wait for a writer for ever
    return _parse_lines(path)


class MetricsLog:
    """Append-only JSON-lines writer; inactive (writes nothing) on non-zero ranks.

    Args:
        path: the ``metrics.jsonl`` file.
        active: whether this process writes (rank 0 only under DDP).
    """

    def __init__(self, path: str | os.PathLike[str], *, active: bool = True) -> None:
        self.path = Path(path)
        self.active = _check_flag(active, "MetricsLog: active")
        self._file: TextIO | None = None

    def truncate(self, max_step: int) -> int:
        """Drop records with ``step > max_step`` (and a partial last line); return how many.

        Used on resume so that the steps replayed after a checkpoint are not logged twice.

        Args:
            max_step: the step of the checkpoint the run resumes from (``0`` = from scratch).
        """
        if not self.active or not self.path.exists():
            return 0
        _check_regular_file(self.path, "MetricsLog.truncate")
        self.close()
        records = _parse_lines(self.path)
        kept = [r for r in records if r["step"] <= max_step]  # every record has an integer step (_is_record)
        with _atomic_file(self.path) as f:
            for r in kept:  # a NaN / Infinity literal (read by json.loads) is written back as null
                f.write(json.dumps(_plain(r), allow_nan=False) + "\n")
        return len(records) - len(kept)

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one record as a JSON line and flush it.

        A write that fails (a full disk) leaves the file as it was before and raises.

        Args:
            record: a JSON-serialisable mapping (non-finite floats are written as ``null``).
        """
        if not self.active:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        line = json.dumps(_plain(record), allow_nan=False) + "\n"
        end = os.fstat(self._file.fileno()).st_size  # every append flushes: the end of a whole line
        try:
            self._file.write(line)
            self._file.flush()
        except BaseException:
            file, self._file = self._file, None
            _cut_back(file, self.path, end)
            raise

    def close(self) -> None:
        """Close the underlying file (appending reopens it)."""
        if self._file is not None:
            self._file.close()
            self._file = None
