"""The run store's locks: one worker per run, claimed atomically.

A run being trained holds ``<run>/.lock``, a small JSON file
``{"pid": ..., "host": ..., "start": ..., "machine": ...}``
(``start``: the holder's start time in clock ticks since boot, field 22 of ``/proc/<pid>/stat``; left out where
there is no ``/proc``; ``machine``: the holder's machine id, ``/etc/machine-id``, left out where there is none: two
nodes of one short host name, on clusters sharing a file system, are told apart by it).
Claiming it must be atomic: two workers that start on the same run at the same instant must
never both train it. The lock is therefore never visible half written:

1. the claimant writes its record to a private temporary file beside the lock
   (``.lock.<pid>.<random>.tmp``), and
2. ``os.link`` s it to ``.lock``; the link fails with ``FileExistsError`` when any lock is
   there, so of several claimants exactly one wins. On a file system without hard links (FAT, exFAT, some
   network and FUSE mounts) ``.lock`` is created exclusively instead (``O_EXCL``: one claimant wins there too)
   and then written: read while still empty it counts as held, as an unreadable lock below.

A claimant killed before it removed its temporary leaves it behind; the next claim of the run removes such
leftovers once they are older than :data:`UNREADABLE_GRACE_S` and their writer is dead (or they are unreadable).

What a present lock means:

- readable, with a process that runs on this host (or any process on another host, whose
  liveness cannot be checked from here; a lock of this host's name but another machine id is another host's): **held**;
- readable, with a process id that no longer runs on this host (no process, or a zombie: a killed
  worker not yet reaped by the ``run --workers`` parent), or that runs but started at another time
  than the lock records (the holder died and its id was given to a new process): **stale**; it is
  taken over (a lock without ``start``, as older versions wrote, is judged by its process id alone);
- unreadable (empty, not JSON, a link to a missing file): **held** while it is younger than :data:`UNREADABLE_GRACE_S`
  (a lock written by an older, non-atomic version of this code that is still being filled),
  stale after that (junk left by a crash or another tool).

Taking over a stale lock is itself a race (two workers may both see the same dead holder),
so a takeover is done under a second lock, ``.lock.break``, claimed the same way: the
winner re-reads ``.lock``, checks that it is still the same stale file, removes it and links
its own; a worker that loses the ``.lock.break`` race reports the run as held and moves on.
A ``.lock.break`` left by a worker killed in the middle of a takeover (a window of a few
system calls) is removed once it is older than :data:`UNREADABLE_GRACE_S`. Removing it is a
read-then-unlink, so the whole takeover also runs under an exclusive ``flock`` of the run's folder
(where ``fcntl`` is there): else of three workers at one abandoned ``.lock.break``, one could
remove the ``.lock.break`` that a second had just linked, and both would take the run over.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob
import json
import os
import platform
import re
import secrets
import stat
import time
from pathlib import Path

from diffusionformer._files import folder_lock

__all__ = ["LOCK_NAME", "UNREADABLE_GRACE_S", "acquire_lock", "live_holder", "read_lock", "release_lock"]

LOCK_NAME = ".lock"
#: seconds during which an unreadable lock (or a takeover's ``.lock.break``) counts as held
UNREADABLE_GRACE_S = 60.0

_BREAK_NAME = LOCK_NAME + ".break"
_UNREADABLE = (-1, "", None, None)  # sentinel holder of a lock file that exists but cannot be parsed
_MAX_LOCK_BYTES = 4096  # a lock is a JSON record of a pid, a host name, a start time, a machine id: longer is junk

_Holder = tuple[int, str, int | None, str | None]  # (pid, host, start time or None, machine id or None) of a record


def _me() -> tuple[int, str]:
    return os.getpid(), platform.node()


@functools.lru_cache(maxsize=1)
def _machine_id() -> str | None:
    """This machine's id (``/etc/machine-id``, else ``/var/lib/dbus/machine-id``), None where there is none; read
    once per process (``status`` asks for every run)."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path, encoding="ascii") as f:
                text = f.read(64).strip()
        except (OSError, ValueError):
            continue
        if text:
            return text
    return None


def _other_host(holder: _Holder) -> bool:
    """Whether a lock's record is another host's: another host name, or this host's name on a machine of another id
    (a node of the same short name on another cluster sharing the file system: its process ids are not ours to
    check). A record without a machine id (older versions, machines without one) is judged by its host name."""
    if holder[1] != platform.node():
        return True
    mine = _machine_id()
    return holder[3] is not None and mine is not None and holder[3] != mine


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` from field 3 (the state) on, None where it cannot be read (no ``/proc``, no
    such process). The command name (field 2) is in parentheses and may hold spaces and ")": the fields after the
    last ")" start at field 3."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            text = f.read()
        return text[text.rindex(b")") + 1:].split()
    except (OSError, ValueError):
        return None


def _start_time(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (field 22 of ``/proc/<pid>/stat``), None where it
    cannot be read (no ``/proc``, no such process). With the pid it names one process: a pid is reused, the pair is
    not."""
    fields = _stat_fields(pid)
    try:
        return None if fields is None else int(fields[19])  # field 22 is the 20th from field 3
    except (ValueError, IndexError):
        return None


def _zombie(pid: int) -> bool:
    """Whether process ``pid`` has exited and waits to be reaped (state ``Z``, field 3 of ``/proc/<pid>/stat``): a
    worker killed while ``run --workers`` waits for an earlier one stays so, and holds no run. False where it cannot
    be read, and for a main thread that exited while other threads of its process still run (also shown ``Z``)."""
    fields = _stat_fields(pid)
    if not fields or fields[0] not in (b"Z", b"X"):
        return False
    try:
        return len(os.listdir(f"/proc/{int(pid)}/task")) <= 1
    except OSError:
        return False


def _windows_pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs, on Windows: ``OpenProcess`` and ``GetExitCodeProcess`` (``STILL_ACTIVE``)."""
    import ctypes

    if not 0 < pid < 2**32:
        return False
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return ctypes.get_last_error() == 5  # ERROR_ACCESS_DENIED: it exists, another user's
    try:
        code = ctypes.c_ulong()
        return not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)) or code.value == 259  # STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


def _pid_alive(pid: int) -> bool:
    if os.name == "nt":  # there os.kill(pid, 0) is TerminateProcess(pid, 0): it would kill the holder it asks after
        return _windows_pid_alive(pid)
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: beyond pid_t, no process has it
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    return not _zombie(pid)  # a killed process not yet reaped answers signal 0, but runs no more


def _parse(text: bytes) -> _Holder | None:
    """``(pid, host, start, machine)`` of a lock's JSON text; None unless it is an object with an int ``pid`` and a
    string ``host`` (as :func:`acquire_lock` writes them): a ``true``, ``12.7``, ``"12"`` or ``Infinity`` pid or a
    ``null`` host is junk, not process 1, 12 or a process on host ``"None"`` that would hold the run for ever.
    ``start`` is None when the lock has none (older versions wrote none) or it is not an int (a start time that
    cannot be compared: the lock is judged by its pid, as one without); ``machine`` None when it has none or not a
    string."""
    try:
        holder = json.loads(text)  # bytes that are not UTF-8 raise UnicodeDecodeError, a ValueError
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested deeper than Python's recursion limit
        return None
    pid, host = (holder.get("pid"), holder.get("host")) if isinstance(holder, dict) else (None, None)
    if type(pid) is not int or not isinstance(host, str):
        return None
    start, machine = holder.get("start"), holder.get("machine")
    return pid, host, (start if type(start) is int else None), (machine if isinstance(machine, str) else None)


def read_lock(rdir: str | os.PathLike[str]) -> tuple[int, str] | None:
    """``(pid, host)`` recorded in ``rdir/.lock``; None when there is none or it cannot be read.

    Args:
        rdir: a run's folder.
    """
    holder, _ = _state(Path(rdir) / LOCK_NAME)
    return None if holder is None or holder == _UNREADABLE else holder[:2]


def _state(path: Path) -> tuple[_Holder | None, os.stat_result | None]:
    """``(holder, stat)`` of the lock file at ``path``: ``(None, None)`` when absent,
    ``(_UNREADABLE, stat)`` when it exists but cannot be parsed. A FIFO or a device in its place (or a file
    larger than any lock) is not read, which would block for ever or fill the memory: it is unreadable junk."""
    try:  # O_NONBLOCK: opening a FIFO for reading would wait for a writer
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | getattr(os, "O_NONBLOCK", 0))) as f:
            st = os.fstat(f.fileno())
            text = f.read(_MAX_LOCK_BYTES + 1) if stat.S_ISREG(st.st_mode) else b""
    except IsADirectoryError:  # a folder is no lock: acquire_lock refuses it by name
        return None, None
    except FileNotFoundError:
        if not path.is_symlink():
            return None, None
        text = b""  # a link to a missing file: there, so no lock can be linked in its place, but junk
    except OSError:
        text = b""
    if not text or len(text) > _MAX_LOCK_BYTES:  # a FIFO, a device, empty, or longer than any lock: junk
        try:
            return _UNREADABLE, path.stat()
        except OSError:
            try:  # a link to a missing file or a loop of links: judged by the link's own age
                return _UNREADABLE, path.lstat()
            except OSError:
                return None, None
    holder = _parse(text)
    return (_UNREADABLE if holder is None else holder), st


def _is_stale(holder: _Holder, st: os.stat_result) -> bool:
    if holder == _UNREADABLE:
        return time.time() - st.st_mtime > UNREADABLE_GRACE_S
    pid, _, start, _ = holder
    if _other_host(holder):
        return False
    if pid <= 0 or not _pid_alive(pid):
        return True
    # the pid runs, but perhaps a process that got the dead holder's id: its start time tells them apart
    now = _start_time(pid) if start is not None else None
    return now is not None and now != start


def live_holder(rdir: str | os.PathLike[str]) -> tuple[int, str] | None:
    """``(pid, host)`` of the process holding ``rdir/.lock``, or None when the lock is absent or stale.

    A lock that cannot be read and is younger than :data:`UNREADABLE_GRACE_S` counts as held
    and is reported as ``(-1, "")``. Locks held from another host count as live.

    Args:
        rdir: a run's folder.
    """
    holder, st = _state(Path(rdir) / LOCK_NAME)
    if holder is None or st is None or _is_stale(holder, st):
        return None
    return holder[:2]


#: the files a run's trainer writes as it trains (its log every ``log_interval`` updates, its checkpoint every
#: ``checkpoint_interval``), and its lock (written at the claim): their newest change is its last sign of life
_SIGNS_OF_LIFE = ("metrics.jsonl", "metrics.csv", "checkpoint.pt", "summary.json", LOCK_NAME)


def _ago(seconds: float) -> str:
    """``seconds`` as "3 h 5 min", "42 s", "2 d 3 h"."""
    s = int(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if s >= size:
            rest = (s % size) // sub_size
            return f"{s // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{s} s"


def _foreign_lock_note(rdir: str | os.PathLike[str]) -> str | None:
    """For a run held by a lock of another host (whose process cannot be checked from here, so it holds for ever when
    that node failed): how long ago the run last showed a sign of life (the newest change of its log, checkpoint or
    lock), e.g. ``"nodeA is another host; the run last showed a sign of life 3 h 5 min ago"``; None for a lock of this
    host, an unreadable one, or none. The lock is never taken over automatically (a slow node would train the run
    twice): :func:`_foreign_lock_advice` says what to do."""
    rdir = Path(rdir)
    holder, _ = _state(rdir / LOCK_NAME)
    if holder is None or holder == _UNREADABLE or not _other_host(holder):
        return None
    newest = None
    for name in _SIGNS_OF_LIFE:
        with contextlib.suppress(OSError):
            mtime = (rdir / name).stat().st_mtime
            newest = mtime if newest is None else max(newest, mtime)
    which = f"{holder[1]} is another host" + (" (another machine of this host's name)" if holder[1] == platform.node()
                                              else "")
    if newest is None:
        return which
    age = time.time() - newest
    when = (f"{_ago(age)} ago" if age >= 0 else
            f"at a time {_ago(-age)} ahead of this host's clock (the hosts' clocks differ)")
    return f"{which}; the run last showed a sign of life {when}"


def _foreign_lock_advice(rdir: str | os.PathLike[str]) -> str:
    """What to do about a lock of another host whose node is gone (see :func:`_foreign_lock_note`)."""
    holder, _ = _state(Path(rdir) / LOCK_NAME)
    host = holder[1] if holder not in (None, _UNREADABLE) else "that host"
    return (f"if {host} no longer trains it (a failed node, a job killed without clean-up, a host renamed, a node "
            f"given a new machine id at a reboot), remove {Path(rdir) / LOCK_NAME} and run again: the run resumes from "
            f"its checkpoint; never while {host} may still train it (the run would be trained twice)")


def _describe(holder: _Holder, path: Path) -> str:
    if holder == _UNREADABLE:
        return f"a process that is still writing {path}"
    return f"process {holder[0]} on {holder[1]}"


def _link_exclusive(src: Path, dst: Path) -> bool:
    """Make ``dst`` a hard link to ``src``; False when ``dst`` exists."""
    try:
        os.link(src, dst)
    except FileExistsError:
        return False
    except OSError as err:  # a file system without hard links (FAT, exFAT, some network and FUSE mounts)
        if err.errno not in _NO_HARD_LINKS:
            raise
        try:  # created exclusively, then written: read while empty it counts as held (a process still writing it)
            fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(src.read_bytes())
            f.flush()
            os.fsync(f.fileno())
    return True


_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL}


def acquire_lock(rdir: str | os.PathLike[str]) -> str | None:
    """Claim ``rdir/.lock`` for this process, atomically.

    Args:
        rdir: a run's folder (created if missing).

    Returns:
        None when this process holds the lock now (or held it already); else a description
        of the holder, e.g. ``"process 4242 on node-3"``.

    Raises:
        IsADirectoryError: a folder sits where the lock file goes (or, with a stale lock, where its takeover's
            ``.lock.break`` goes).
    """
    rdir = Path(rdir)
    rdir.mkdir(parents=True, exist_ok=True)
    path, me = rdir / LOCK_NAME, _me()
    if path.is_dir():  # else reported as held by a process "still writing" it, then a bare IsADirectoryError
        raise IsADirectoryError(f"{path} is a folder, not a lock file (a run's lock is a small JSON file that this "
                                "library writes and removes): remove the folder and run again")
    tmp = rdir / f"{LOCK_NAME}.{me[0]}.{secrets.token_hex(6)}.tmp"
    start, machine = _start_time(me[0]), _machine_id()
    try:  # a write that fails (a full disk) leaves no temporary behind either: a new name on every try
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"pid": me[0], "host": me[1], **({} if start is None else {"start": start}),
                       **({} if machine is None else {"machine": machine})}, f)
            f.flush()
            os.fsync(f.fileno())
        for _ in range(3):
            if _link_exclusive(tmp, path):
                _sweep_claims(rdir)
                return None
            holder, st = _state(path)
            if holder is None or st is None:  # released between our link and our read: try again
                continue
            # ours (not a dead process's that had our pid, nor another machine's of our host name and pid)
            if holder[:2] == me and not _other_host(holder) and not _is_stale(holder, st):
                return None
            if not _is_stale(holder, st):
                return _describe(holder, path)
            taken = _take_over(rdir, tmp, st)
            if taken:
                _sweep_claims(rdir)
            if taken is not None:
                return None if taken else _taker(rdir, holder)
        return f"a process that keeps re-creating {path}"
    finally:
        tmp.unlink(missing_ok=True)


def _taker(rdir: Path, stale: _Holder) -> str:
    """Who holds the run after a takeover of its stale lock (of ``stale``) was lost: the live holder of the lock
    that replaced it, else the worker taking it over now (``.lock.break`` is a link to its claim, its record), not
    the dead holder of the stale lock."""
    for path in (rdir / LOCK_NAME, rdir / _BREAK_NAME):
        holder, st = _state(path)
        if holder is not None and holder != _UNREADABLE and st is not None and not _is_stale(holder, st):
            return _describe(holder, path)
    of = "" if stale == _UNREADABLE else f" of {_describe(stale, rdir / LOCK_NAME)}"
    return f"a process taking over the stale lock {rdir / LOCK_NAME}{of}"


_CLAIM = re.compile(re.escape(LOCK_NAME) + r"\.[0-9]+\.[0-9a-f]{12}\.tmp")
#: seconds after which a claim temporary of another host (whose writer cannot be checked from here) is left over
_CLAIM_LEFTOVER_S = 10 * UNREADABLE_GRACE_S


def _sweep_claims(rdir: Path) -> None:
    """Remove the claim temporaries (``.lock.<pid>.<random>.tmp``) that claimants killed before their cleanup left in
    ``rdir``: older than :data:`UNREADABLE_GRACE_S` and unreadable (killed while writing it) or of a dead process of
    this host (which links it nowhere any more); of another host once older than ``_CLAIM_LEFTOVER_S``. A claim in
    flight, of a live process, is never removed (its ``os.link`` would fail)."""
    now = time.time()
    for tmp in rdir.glob(glob.escape(LOCK_NAME) + ".*.tmp"):
        if not _CLAIM.fullmatch(tmp.name):
            continue
        holder, st = _state(tmp)
        if holder is None or st is None or stat.S_ISDIR(st.st_mode):
            continue
        age = now - st.st_mtime
        other_host = holder != _UNREADABLE and _other_host(holder)
        if age > (_CLAIM_LEFTOVER_S if other_host else UNREADABLE_GRACE_S) and (other_host or _is_stale(holder, st)):
            with contextlib.suppress(OSError):
                tmp.unlink()


def _take_over(rdir: Path, tmp: Path, stale: os.stat_result) -> bool | None:
    """Replace the stale lock (``stale`` is its stat) by ours under ``.lock.break``.

    Returns True when we hold the lock now, False when someone else does (or is taking it
    over), None when the stale lock went away meanwhile (the caller tries again).
    """
    with folder_lock(rdir):  # workers taking over one run take turns (the stale .lock.break removal below races else)
        return _take_over_locked(rdir, tmp, stale)


def _take_over_locked(rdir: Path, tmp: Path, stale: os.stat_result) -> bool | None:
    path, brk = rdir / LOCK_NAME, rdir / _BREAK_NAME
    if not _link_exclusive(tmp, brk):
        if brk.is_dir() and not brk.is_symlink():  # else reported as held by the dead holder, then a bare unlink error
            raise IsADirectoryError(f"{brk} is a folder, not a lock file (a stale lock's takeover claims it for a few "
                                    "system calls): remove the folder and run again")
        try:
            if time.time() - brk.stat().st_mtime > UNREADABLE_GRACE_S:  # left by a killed worker
                brk.unlink(missing_ok=True)
                return None
        except FileNotFoundError:
            return None
        return False
    try:
        holder, st = _state(path)
        if holder is None or st is None:
            return None
        if (st.st_ino, st.st_dev) != (stale.st_ino, stale.st_dev) or not _is_stale(holder, st):
            return False  # another worker replaced it: it is live
        path.unlink()
        return _link_exclusive(tmp, path)  # False: a fresh claimant linked first; it holds the lock
    finally:
        brk.unlink(missing_ok=True)


def release_lock(rdir: str | os.PathLike[str]) -> None:
    """Remove ``rdir/.lock`` if this process holds it (else leave it alone, a lock of a dead process that had this
    process's id included: its recorded start time is another).

    Args:
        rdir: a run's folder.
    """
    if _own_lock(rdir):
        (Path(rdir) / LOCK_NAME).unlink(missing_ok=True)


def _own_lock(rdir: str | os.PathLike[str]) -> bool:
    """Whether ``rdir/.lock`` is this process's: its pid and host, not a lock of another machine of this host's name
    that had our pid, nor of a dead process whose id this process got (its recorded start time is another: a takeover
    may be replacing it right now, and unlinking after that would remove the new holder's lock)."""
    holder, _ = _state(Path(rdir) / LOCK_NAME)
    return (holder is not None and holder[:2] == _me() and holder[2] in (None, _start_time(os.getpid()))
            and not _other_host(holder))
