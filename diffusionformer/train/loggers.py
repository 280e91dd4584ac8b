"""Metrics writers beside ``metrics.jsonl``: a CSV table and TensorBoard event files.

``TrainConfig.loggers`` picks them (``["jsonl", "csv", "tensorboard"]``). Every writer gets
the same records as the JSON-lines log, ``{"step", "split", "loss", "lr", "metrics",
"elapsed", "time"}``, and the same :meth:`truncate` on resume, so a resumed run never shows
the steps replayed after its checkpoint twice. ``metrics.jsonl`` stays the record the
experiment runner and :func:`~diffusionformer.train.read_metrics` read; it is always on, and on
resume the CSV table is written again from it (``loggers`` may change on a resume: a table switched
on then, or off for a while, holds every record of the run, its own row of a record whose JSON line is damaged
kept, but not of the log's last line a kill cut short, whatever the order of ``loggers``; a table off at a resume is
cut back to the checkpoint all the same; TensorBoard only the steps it logged).

TensorBoard is optional: ``"tensorboard"`` needs the ``tensorboard`` package (not a
dependency of this library) and fails with a clear ``ModuleNotFoundError`` before training
starts when it is missing.
"""

from __future__ import annotations

import bisect
import codecs
import csv
import difflib
import json
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from diffusionformer.config import _check_flag

from .metrics import METRICS_NAME, MetricsLog, _atomic_file, _check_regular_file, _cut_back, read_metrics

__all__ = [
    "CSV_NAME",
    "LOGGER_CHOICES",
    "TENSORBOARD_DIR",
    "CSVLog",
    "LogGroup",
    "MetricsWriter",
    "TensorBoardLog",
    "open_loggers",
    "read_metrics_csv",
]

CSV_NAME = "metrics.csv"
TENSORBOARD_DIR = "tensorboard"
LOGGER_CHOICES = ("jsonl", "csv", "tensorboard")

#: Fixed leading columns of ``metrics.csv``; a metric ``m`` of a record is the column ``metrics.m``.
CSV_BASE_COLUMNS = ("step", "split", "loss", "lr", "elapsed", "time")
_PREFIX = "metrics."


class MetricsWriter(Protocol):
    """What the trainer needs of a writer: append a record, cut back on resume, close."""

    def append(self, record: Mapping[str, Any]) -> None: ...

    def truncate(self, max_step: int) -> int: ...

    def close(self) -> None: ...


def _cell(value: Any) -> str:
    """A CSV cell: ``repr`` of a float (round-trips exactly), empty for None and non-finite."""
    if value is None:
        return ""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral)):
        value = float(value)  # a NumPy float: str(np.float32("nan")) is "nan", and "0.1" is not float(np.float32(0.1))
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    return str(value)


def _metric_cell(value: Any) -> str:
    """A metric's CSV cell: a number as :func:`_cell` writes it; anything else (a bool, a string)
    empty, as the TensorBoard log skips it, so that :func:`read_metrics_csv` can read the table
    back (the JSONL log keeps every value)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return ""
    # a NumPy int as the int it equals (the JSON-lines log writes it so): float() rounded np.int64(2**53 + 1)
    return _cell(int(value) if isinstance(value, numbers.Integral) else float(value))


def _parse_number(text: str) -> float | None:
    return None if text == "" else float(text)


def _sound_row(row: Mapping[str | None, Any]) -> bool:
    """Whether a row read back from ``metrics.csv`` is one the writer could have made: a decimal step, one cell
    per column (a damaged byte read as a comma adds one: its cells no longer sit under their columns, and
    csv.DictWriter refuses the overflow, key None) and a number or nothing in every number column. A damaged byte
    read as an opening quote makes one cell of the rest of the file: a row cut short, or a number column that is
    not a number."""
    # '²' is a digit but not a decimal: int() refuses it
    if None in row or None in row.values() or not (row.get("step") or "").isdecimal():
        return False
    try:
        for column, text in row.items():
            if column in CSV_BASE_COLUMNS[2:] or str(column).startswith(_PREFIX):  # the number columns
                _parse_number(text)
    except ValueError:
        return False
    return True


def _torn_line(path: Path) -> tuple[bytes | None, bytes] | None:
    """The whole line before the last line of the file at ``path`` (``None``: none) and that last line, where it is
    cut short (its last byte no line end: a write killed half-way), else ``None``; the file is read whole only then."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return None
        f.seek(-1, os.SEEK_END)
        if f.read(1) in (b"\n", b"\r"):
            return None
        f.seek(0)
        lines = f.read().removeprefix(codecs.BOM_UTF8).splitlines()
        return (lines[-2] if len(lines) > 1 else None), lines[-1]


def _row_to_record(row: Mapping[str, str]) -> dict[str, Any]:
    record: dict[str, Any] = {
        "step": int(row["step"]),
        "split": row["split"],
        "loss": _parse_number(row["loss"]),
        "lr": _parse_number(row["lr"]),
        "metrics": {},
        "elapsed": _parse_number(row["elapsed"]),
        "time": _parse_number(row["time"]),
    }
    if None in row:  # csv.DictReader files the cells beyond the header under the key None
        raise ValueError(f"{len(row[None])} more cell(s) than the header's {len(row) - 1} columns")
    for column, text in row.items():
        if column.startswith(_PREFIX) and text != "":
            record["metrics"][column[len(_PREFIX):]] = float(text)
    return record


def read_metrics_csv(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read ``metrics.csv`` (a file or a run directory) into records shaped like
    :func:`~diffusionformer.train.read_metrics`'s.

    The table has one row per record: ``step, split, loss, lr, elapsed, time`` and one column
    ``metrics.<name>`` per metric seen so far; a metric a record lacks is an empty cell and is
    left out of that record's ``metrics`` (so train and eval rows share one table). Empty
    cells of the fixed columns read as ``None`` (the JSON-lines log writes ``null`` there).

    Args:
        path: ``metrics.csv`` or the directory that holds it.

    Raises:
        ValueError: a row that is not a metrics row, or bytes that are not UTF-8 (the message
            names the file, and the line of a bad row); ``path`` is a FIFO, a device or a socket.
    """
    path = Path(path)
    if path.is_dir():
        path = path / CSV_NAME
    _check_regular_file(path, "read_metrics_csv", resume=False)  # a FIFO: else a wait for a writer for ever
    records = []
    # utf-8-sig: a table saved again by a spreadsheet (Excel's "CSV UTF-8") starts with a byte-order mark, which
    # made the first column "\ufeffstep": every row "not a metrics row"
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        try:
            for row in reader:
                records.append(_row_to_record(row))
        except UnicodeDecodeError:
            raise ValueError(f"{path}: not UTF-8 text; the metrics.jsonl beside it holds the same "
                             "records (diffusionformer.train.read_metrics)") from None
        except (KeyError, TypeError, ValueError, csv.Error) as e:  # csv.Error: an unclosed quote past csv's field limit
            raise ValueError(f"{path}:{reader.line_num}: not a metrics row ({type(e).__name__}: {e}); the "
                             "metrics.jsonl beside it holds the same records") from None
    return records


class CSVLog:
    """Wide CSV table of the metrics records (``<out_dir>/metrics.csv``), for spreadsheets and
    ``pandas.read_csv``.

    The header holds the fixed columns and one ``metrics.<name>`` column per metric, sorted.
    When a record brings a metric not seen before, the file is rewritten once with the wider
    header (atomically); otherwise a row is appended and flushed.

    Args:
        path: the CSV file.
        active: whether this process writes (rank 0 only under DDP).
    """

    def __init__(self, path: str | os.PathLike[str], *, active: bool = True) -> None:
        self.path = Path(path)
        self.active = _check_flag(active, "CSVLog: active")
        self._columns: list[str] | None = None

    def _read(self) -> tuple[list[str] | None, list[dict[str, str]], bool]:
        """The header (``None`` when the file is missing or empty), the rows, and whether they run to the end of
        the file (``False``: the rows before one the csv module cannot read)."""
        if not self.path.exists():
            return None, [], True
        # A damaged byte must not stop a resume: it reads as U+FFFD, and a row it spoils is dropped by
        # ``truncate``. One read as an opening quote runs on to the end of the file, as one cell: past csv's field
        # limit (128 KiB) a csv.Error, and the rows read before it are the table.
        # utf-8-sig: a byte-order mark (a spreadsheet's save) made the first column "\ufeffstep", and a resume dropped
        # every row as unsound and appended under a header naming "step" twice
        with open(self.path, newline="", encoding="utf-8-sig", errors="replace") as f:
            reader = csv.DictReader(f)
            fieldnames: Sequence[str] | None = None
            rows: list[dict[str, str]] = []
            to_the_end = True
            try:
                fieldnames = reader.fieldnames
                for row in reader:
                    rows.append(row)
            except csv.Error:
                to_the_end = False
            return (list(fieldnames) if fieldnames else None), rows, to_the_end

    def _rewrite(self, columns: list[str], rows: Sequence[Mapping[str, str]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _atomic_file(self.path, newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(rows)
        self._columns = columns

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one record as a row (rewriting the header first if it brings new metrics).

        Args:
            record: ``{"step", "split", "loss", "lr", "metrics", "elapsed", "time"}``.
        """
        if not self.active:
            return
        row = _csv_row(record)
        if self._columns is None:
            columns, rows, _ = self._read()
            if columns is None:  # no file, or an empty one: write the header first
                self._rewrite(list(CSV_BASE_COLUMNS), rows)
            self._columns = columns or list(CSV_BASE_COLUMNS)
        else:
            rows = None
        missing = [c for c in row if c not in self._columns]
        if missing:
            if rows is None:
                _, rows, _ = self._read()
            metric_columns = sorted({c for c in self._columns if c.startswith(_PREFIX)} | set(missing))
            self._rewrite(list(CSV_BASE_COLUMNS) + metric_columns, rows)
        f = open(self.path, "a", newline="", encoding="utf-8")
        end = os.fstat(f.fileno()).st_size
        try:
            csv.DictWriter(f, fieldnames=self._columns, restval="").writerow(row)
            f.close()
        except BaseException:  # a full disk: no partial row for the next one to run on from
            _cut_back(f, self.path, end)
            raise

    def truncate(self, max_step: int) -> int:
        """Drop rows with ``step > max_step``; return how many (see :meth:`MetricsLog.truncate`)."""
        if not self.active or not self.path.exists():
            return 0
        _check_regular_file(self.path, "CSVLog.truncate")
        columns, rows, to_the_end = self._read()
        # a last row cut short by a kill (no line end) is dropped whatever its step, as MetricsLog does
        torn = to_the_end and rows and _torn_line(self.path) is not None
        whole = rows[:-1] if torn else rows
        # a row a damaged byte spoiled (_sound_row) is dropped whatever its step: an unclosed quote hid the rows
        # after the checkpoint's step in one cell, and the resumed run logged them twice
        kept = [r for r in whole if _sound_row(r) and int(r["step"]) <= max_step]
        self._rewrite(columns or list(CSV_BASE_COLUMNS), kept)
        return len(rows) - len(kept)

    def _drop_unlogged_last(self, last: Sequence[Mapping[str | None, str]], records: Sequence[Mapping[str, Any]],
                            torn: tuple[bytes | None, bytes]) -> None:
        """Drop ``row``, the last of ``last`` (the table's last two rows before a resume's cut), where it is the row of
        the log's last line (``torn``: :func:`_torn_line`'s, the line before it and that line): still the table's
        last, of a step and split that ``records`` (the log's, cut back) lack and that the torn line begins with as far
        as it goes (``{"step": 4, "split": "train"``), the row before it the record of the log's line before the torn
        one (none for none). Else it is the row of a damaged line before it, the only copy of its record: a torn
        ``{"step": 1`` matches step 10's row too, and a table listed after the log holds no row of the torn line."""
        columns, rows, _ = self._read()
        row = last[-1]
        if not rows or rows[-1] != row or (int(row["step"]), row["split"]) in {(r["step"], r["split"])
                                                                               for r in records}:
            return
        previous, line = torn
        try:  # json.loads: a damaged line raises ValueError (UnicodeDecodeError too) or RecursionError
            before = None if previous is None else json.loads(previous)
        except (ValueError, RecursionError):
            return
        if previous is None:
            in_step = len(last) == 1
        else:  # the row before: as read (a damaged one is no record's), so compared as text
            in_step = len(last) == 2 and isinstance(before, dict) and (
                str(before.get("step")), before.get("split")) == (last[0]["step"], last[0]["split"])
        if not in_step:
            return
        head = json.dumps({"step": int(row["step"]), "split": row["split"]})[:-1].encode()
        if head[:len(line)] == line[:len(head)]:
            self._rewrite(columns or list(CSV_BASE_COLUMNS), rows[:-1])

    def _refill(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Make the table hold ``records`` (the JSON-lines log's, cut back on resume): ``loggers``
        may change on a resume, and a table switched on then held only the rows written since (a gap where it was
        off). Rows as :meth:`append` writes them, so the table is the one an uninterrupted run writes; a row of its own
        that the log lacks is kept."""
        if not self.active or not (records or self.path.exists()):
            return
        rows = [_csv_row(r) for r in records]
        # a row the log lacks (its line damaged, dropped with a warning) is kept: the table's whole copy of that record
        # was the only one left (called after truncate: every row sound, none past the step; a table off at a resume
        # is cut back there too, LogGroup.truncate, so no row of a killed segment the log cut is left). It goes before
        # the row that followed it in the table, or before the log's first row of a later step if that comes first.
        logged = {(int(row["step"]), row["split"]): i for i, row in enumerate(rows)}
        steps = [int(row["step"]) for row in rows]
        table = self._read()[1]
        extras: list[tuple[int, dict[str, str]]] = []
        at = len(rows)  # the position of the next row (from the end) that the log holds
        for row in reversed(table):
            key = (int(row["step"]), row["split"])
            if key in logged:
                at = logged[key]
            else:
                cells = {k: v for k, v in row.items() if k in CSV_BASE_COLUMNS or (k.startswith(_PREFIX) and v)}
                extras.append((min(at, bisect.bisect_right(steps, key[0])), cells))
        for at, cells in sorted(extras, key=lambda e: e[0], reverse=True):  # from the end (the table's order kept)
            rows.insert(at, cells)
        metric_columns = sorted({c for row in rows for c in row if c.startswith(_PREFIX)})
        self._rewrite(list(CSV_BASE_COLUMNS) + metric_columns, rows)

    def close(self) -> None:
        """Nothing to close: every append opens, writes and closes the file."""


def _csv_row(record: Mapping[str, Any]) -> dict[str, str]:
    """The cells of ``record`` in ``metrics.csv``: the fixed columns, then ``metrics.<name>`` per metric."""
    row = {name: _cell(record.get(name)) for name in CSV_BASE_COLUMNS}
    for name, value in dict(record.get("metrics") or {}).items():
        row[_PREFIX + str(name)] = _metric_cell(value)
    return row


class TensorBoardLog:
    """TensorBoard scalars ``<split>/loss``, ``<split>/lr`` and ``<split>/<metric>`` at
    ``global_step = step`` in ``<out_dir>/tensorboard/`` (a metric named ``lr``: ``<split>/metrics.lr``).

    Needs the optional ``tensorboard`` package (through :mod:`torch.utils.tensorboard`). On
    resume, :meth:`truncate` makes the writer purge events after the checkpoint's step
    (``SummaryWriter(purge_step=max_step + 1)``).

    Args:
        log_dir: the event-file directory.
        active: whether this process writes (rank 0 only under DDP).

    Raises:
        ModuleNotFoundError: when ``active`` and ``tensorboard`` is not installed.
    """

    def __init__(self, log_dir: str | os.PathLike[str], *, active: bool = True) -> None:
        self.log_dir = Path(log_dir)
        self.active = _check_flag(active, "TensorBoardLog: active")
        self._purge_step: int | None = None
        self._writer: Any = None
        self._writer_cls: Any = None
        if active:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ModuleNotFoundError(
                    "TrainConfig.loggers: expected the 'tensorboard' package for the 'tensorboard' "
                    f"logger, got an import error ({err}); install it (pip install tensorboard) or "
                    "drop 'tensorboard' from loggers"
                ) from err
            self._writer_cls = SummaryWriter

    def _open(self) -> Any:
        if self._writer is None:
            self._writer = self._writer_cls(log_dir=str(self.log_dir), purge_step=self._purge_step)
            # purged once: a writer reopened after close() would drop the steps this run logged since the truncate
            self._purge_step = None
        return self._writer

    def append(self, record: Mapping[str, Any]) -> None:
        """Write the record's finite scalars and flush."""
        if not self.active:
            return
        writer = self._open()
        split, step = str(record["split"]), int(record["step"])
        values = {"loss": record.get("loss"), "lr": record.get("lr")}
        # a task metric named "lr" under its own tag (as metrics.csv's column ``metrics.lr``): one tag for two
        # series overwrote the learning rate with the metric at every step
        values.update({(f"metrics.{k}" if k == "lr" else str(k)): v
                       for k, v in dict(record.get("metrics") or {}).items() if k != "loss"})
        for name, value in values.items():
            # numbers.Real: NumPy scalars too, as the jsonl and csv logs write them
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                continue
            try:
                value = float(value)
            except OverflowError:  # an int beyond the float range (the jsonl and csv logs keep it): no scalar holds it
                continue
            if math.isfinite(value):
                writer.add_scalar(f"{split}/{name}", value, global_step=step)
        writer.flush()

    def truncate(self, max_step: int) -> int:
        """Purge events with ``step > max_step`` when the writer opens; returns 0 (unknown count)."""
        if self.active:
            self.close()
            self._purge_step = max_step + 1
        return 0

    def close(self) -> None:
        """Close the event file (appending reopens it)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class LogGroup:
    """Several writers behind the interface of one (:class:`MetricsLog`'s)."""

    def __init__(self, writers: Sequence[MetricsWriter]) -> None:
        alone = callable(getattr(writers, "truncate", None)) and callable(getattr(writers, "close", None))
        if alone or isinstance(writers, (str, bytes)) or not isinstance(writers, Iterable):  # a writer, or a name
            raise TypeError(f"LogGroup: expected a sequence of metrics writers, got {type(writers).__name__} "
                            f"({writers!r})")
        self.writers = list(writers)  # a generator once
        for writer in self.writers:  # else a writer lacking one method failed at its first record, deep in training
            missing = [m for m in ("append", "truncate", "close") if not callable(getattr(writer, m, None))]
            if missing:
                raise TypeError(f"LogGroup: a metrics writer needs append, truncate and close methods "
                                f"(MetricsWriter); {type(writer).__name__} ({writer!r}) lacks {', '.join(missing)}")

    def append(self, record: Mapping[str, Any]) -> None:
        for writer in self.writers:
            writer.append(record)

    def truncate(self, max_step: int) -> int:
        """Truncate every writer, then write every CSV table again from the JSON-lines log, cut back (a table
        switched on at a resume, or off for a while, holds every record of the run); the run's ``metrics.csv`` beside
        the log, off at this resume, is cut back to ``max_step`` all the same. Returns the count of the
        JSON-lines log where there is one (whatever the order of ``loggers``), else of the first writer."""
        logs = [w for w in self.writers if isinstance(w, MetricsLog) and w.active and w.path.is_file()]
        tables = [w for w in self.writers if isinstance(w, CSVLog)]
        # the run's table, off at this resume, is cut back too (else it kept the killed segment's rows past the
        # checkpoint, and a later resume with it on could not tell them from the rows of damaged log lines, the only
        # copy of those records)
        off = [CSVLog(logs[0].path.parent / CSV_NAME)] if logs and not tables and (
            logs[0].path.parent / CSV_NAME).is_file() else []
        # a log whose last line a kill cut short: a table listed before the log in ``loggers`` got that record's whole
        # row first, as its last; kept, it read as a damaged line's (the only copy of a record), and the table held a
        # record the log did not, as one listed after the log never does
        torn = _torn_line(logs[0].path) if logs else None
        last = ({id(t): t._read()[1][-2:] for t in tables + off if t.active and t.path.is_file()}
                if torn is not None else {})
        counts = [writer.truncate(max_step) for writer in self.writers]
        for table in off:
            table.truncate(max_step)
        records = read_metrics(logs[0].path) if logs and (tables or last) else []
        for table in tables + off:
            if last.get(id(table)):
                table._drop_unlogged_last(last[id(table)], records, torn)
        if logs and tables:  # a CSV switched on, or off for a while, since the run began: its rows are the log's
            for table in tables:
                table._refill(records)
        jsonl = [c for writer, c in zip(self.writers, counts) if isinstance(writer, MetricsLog)]
        return (jsonl or counts or [0])[0]

    def close(self) -> None:
        """Close every writer, even when one fails (its error is raised once all are closed): a TensorBoard
        writer whose close raised left the files of the writers after it open."""
        error: BaseException | None = None
        for writer in self.writers:
            try:
                writer.close()
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error


def open_loggers(names: Sequence[str], out_dir: str | os.PathLike[str], *, active: bool = True) -> LogGroup:
    """The writers named in ``TrainConfig.loggers`` for a run directory.

    Args:
        names: a subset of :data:`LOGGER_CHOICES`; ``"jsonl"`` writes ``metrics.jsonl``,
            ``"csv"`` :data:`CSV_NAME`, ``"tensorboard"`` event files under :data:`TENSORBOARD_DIR`.
        out_dir: the run directory.
        active: whether this process writes (rank 0 only under DDP).

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     log = open_loggers(["jsonl", "csv"], d)
        ...     log.append({"step": 1, "split": "train", "loss": 0.5, "lr": 0.1, "metrics": {"acc": 1.0},
        ...                 "elapsed": 2.0, "time": 3.0})
        ...     log.close()
        ...     read_metrics_csv(d)[0]["metrics"], sorted(p.name for p in Path(d).iterdir())
        ({'acc': 1.0}, ['metrics.csv', 'metrics.jsonl'])
    """
    _check_flag(active, "open_loggers: active")
    if isinstance(names, str):  # else read letter by letter: "got 'j'"
        raise TypeError(f"loggers: expected a list of names from {LOGGER_CHOICES}, got the str {names!r}")
    try:
        names = list(names)
    except TypeError:  # None, 3: a bare "'NoneType' object is not iterable" naming no argument
        raise TypeError(f"loggers: expected a list of names from {LOGGER_CHOICES}, got {type(names).__name__} "
                        f"({names!r})") from None
    repeated = sorted({n for n in names if names.count(n) > 1}, key=str)
    if repeated:  # two writers of one file: every record written twice
        raise ValueError(f"loggers: expected distinct names, got {repeated} more than once in {names}")
    out_dir = Path(out_dir)
    writers: list[MetricsWriter] = []
    for name in names:
        if name == "jsonl":
            writers.append(MetricsLog(out_dir / METRICS_NAME, active=active))
        elif name == "csv":
            writers.append(CSVLog(out_dir / CSV_NAME, active=active))
        elif name == "tensorboard":
            writers.append(TensorBoardLog(out_dir / TENSORBOARD_DIR, active=active))
        else:
            close = difflib.get_close_matches(str(name).lower(), LOGGER_CHOICES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"loggers: expected names from {LOGGER_CHOICES}, got {name!r}{hint}")
    return LogGroup(writers)
