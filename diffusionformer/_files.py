"""File modes shared by every writer that goes through a temporary file (run files, checkpoints, data caches), the
words for a path that is not a regular file, the leftovers of a killed writer's temporary, the CRC check of a
``torch.save`` file, the zip entries a data archive may hold, what a ``torch.load(weights_only=True)``
refusal names, and the folder lock that processes writing one folder take turns by."""

from __future__ import annotations

import contextlib
import glob
import os
import pickle
import pickletools
import re
import stat
import zipfile
from pathlib import Path
from typing import Iterator


def file_kind(mode: int) -> str:
    """What a path of ``st_mode`` ``mode`` is, in words, for an error about a run file that is not a regular file:
    ``"a folder"``, ``"a FIFO"``, ``"a device"``, ``"a socket"``, else ``"not a regular file"``.

    Examples:
        >>> file_kind(stat.S_IFIFO), file_kind(stat.S_IFDIR)
        ('a FIFO', 'a folder')
    """
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "not a regular file")


def new_file_mode() -> int:
    """The mode ``open()`` gives a new file (``0o666`` less the umask), for a temporary from
    :func:`tempfile.mkstemp` (always ``0o600``) that replaces a file others may read: checkpoints, run logs
    and cached data stay readable by whoever may read their folder, and a private umask keeps them private.
    The umask is read from ``/proc`` (setting it to read it back would race with other threads); ``0o644``
    where that is not available."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o644


def set_new_file_mode(fd: int) -> None:
    """Give the open temporary ``fd`` the mode of :func:`new_file_mode` (where ``os.fchmod`` exists)."""
    if hasattr(os, "fchmod"):
        os.fchmod(fd, new_file_mode())


def leftover_temps(path: str | os.PathLike[str]) -> Iterator[Path]:
    """The temporaries ``tempfile.mkstemp``/``mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=...)`` made for
    ``path`` (a writer killed before its cleanup leaves them): exactly their 8 random characters, so those of
    ``NAME.best`` beside ``NAME`` are not ``NAME``'s (``.NAME.*.tmp`` matched them, in-flight ones too)."""
    path = Path(path)
    return path.parent.glob(f".{glob.escape(path.name)}.{'[a-z0-9_]' * 8}.tmp")


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive ``flock`` of ``folder`` itself (no file is added to it) while the block runs: processes writing
    one folder take turns. Released by the kernel when a holder is killed; a no-op where ``fcntl`` is missing
    (Windows) or the folder cannot be locked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        fd = os.open(Path(folder), os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):  # a file system without locks: written unlocked, as before
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def zip_damage(path: str | os.PathLike[str]) -> str | None:
    """What is wrong with the first member of the zip archive ``path`` (``torch.save``'s format: checkpoints, the
    data cache's arrays) that fails its
    CRC-32 or whose entry cannot be read ("its entry NAME fails its CRC-32 check ..."), or that is compressed with
    bzip2 or LZMA (:func:`zip_method_refusal`: ``torch.save`` writes neither, and zipfile inflates them whole), else
    ``None``.
    ``torch.load`` does not check the CRCs, so a flipped bit in tensor data would load as different numbers; nor
    the name length or compression method of an entry, so a flipped bit there loaded another entry's bytes (or
    bytes shifted past the header) as this tensor. Members stored with CRC 0
    (``torch.serialization.set_crc32_options(False)``) are not checked; a file that is not a readable zip is left
    to ``torch.load`` to judge."""
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.CRC == 0:
                    continue
                if refused := zip_method_refusal(info):  # torch.save writes none: else inflated whole (a bomb)
                    return refused
                try:
                    with archive.open(info) as member:
                        while member.read(1 << 24):
                            pass
                except zipfile.BadZipFile as err:
                    if "CRC" in str(err):
                        return (f"its entry {info.filename!r} fails its CRC-32 check (bytes changed after it was "
                                "written)")
                    return f"its entry {info.filename!r} cannot be read ({err})"
                except OSError:  # a read error of the disk, not of the bytes: torch.load says what is wrong
                    return None
                except Exception as err:  # a damaged name length (UnicodeDecodeError), method (zlib.error, ...)
                    return f"its entry {info.filename!r} cannot be read ({type(err).__name__}: {err})"
    except Exception:  # not a zip (a legacy or damaged file), unreadable: torch.load says what is wrong
        return None
    return None


#: the compression methods of zip entries that zipfile inflates in pieces of the size asked for; it inflates the
#: bytes of a bzip2 or LZMA entry read (4 KiB at least) whole, whatever size the entry declares
_BOUNDED_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
_ZIP_METHOD_NAMES = {zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "LZMA"}


def zip_method_refusal(info: zipfile.ZipInfo) -> str | None:
    """Why the entry ``info`` of a data archive is not read (its compression method is neither stored nor deflated),
    else ``None``: zipfile inflates a bzip2 or LZMA entry without a bound, so one of 300 bytes declaring 100 B
    filled 400 MB of memory (a few kilobytes: all of it) before its size or CRC was checked.

    Examples:
        >>> zip_method_refusal(zipfile.ZipInfo("a.txt")) is None
        True
    """
    if info.compress_type in _BOUNDED_ZIP_METHODS:
        return None
    method = _ZIP_METHOD_NAMES.get(info.compress_type, "an unsupported method")
    return (f"its entry {info.filename!r} is compressed with {method} (zip method {info.compress_type}); only stored "
            f"or deflated entries are read")


# the lines of torch's weights-only unpickler (torch/_weights_only_unpickler.py) that refuse what a well-formed file
# holds, rather than bytes it cannot parse
_REFUSALS = (
    re.compile(r"Unsupported global: GLOBAL \S+"),
    re.compile(r"Trying to load unsupported GLOBAL \S+ whose module \S+ is blocked"),
    re.compile(r"Can only (?:create new object for|build) .* but got .*"),
    re.compile(r"\S+ (?:and \S+ )?must be imported to load .*"),
    re.compile(r"Unsupported class \S+"),  # older torch versions' wording
)


def weights_only_refusal(err: BaseException, path: str | os.PathLike[str] | None = None) -> str | None:
    """What a whole file held that ``torch.load(weights_only=True)`` refused, from its error ``err`` (``Unsupported
    global: GLOBAL numpy._core.multiarray._reconstruct``, a blocked module, a pickle opcode it does not read), or
    ``None`` when ``err`` is not such a refusal (damaged bytes: "String is too long", a bad persistent id, ...).

    torch wraps every unpickler error in one generic "Weights only load failed" message, so the first line says
    nothing: the line naming the refused item is found by its shape. An unsupported opcode is a refusal (a file
    written with ``pickle_protocol`` 0, 1, 4 or 5) only where ``path`` is a zip archive, whose CRCs the caller
    checked with :func:`zip_damage`; in a legacy (non-zip) file it may be a damaged byte."""
    if not isinstance(err, pickle.UnpicklingError):
        return None
    text = _without_escapes(err)
    for pattern in _REFUSALS:
        found = pattern.search(text)
        if found:
            return found.group(0).rstrip(".")
    operand = re.search(r"Unsupported operand (\d+)", text)
    if operand is None or path is None or not _is_zip(path):
        return None
    code = int(operand.group(1))
    op = pickletools.code2op.get(chr(code)) if code < 256 else None
    name = f" ({op.name}, pickle protocol {op.proto})" if op is not None else ""
    return (f"Unsupported operand {code}{name}: a pickle protocol torch.load(weights_only=True) does not read; "
            "torch.save's default protocol 2 is read")


def refusal_kind(refused: str) -> str:
    """What a :func:`weights_only_refusal` text refuses, for the advice that follows: ``"protocol"`` (a pickle
    opcode: save the file again with torch.save's default protocol), ``"blocked"`` (a global of a module torch
    blocks, such as ``os``: no allow-list reaches it) or ``"type"`` (a global that
    ``torch.serialization.add_safe_globals`` can allow)."""
    if refused.startswith("Unsupported operand"):
        return "protocol"
    return "blocked" if " is blocked" in refused else "type"


def load_error_text(err: BaseException) -> str:
    """``"TypeName: the line that says what went wrong"`` of a ``torch.load`` error: for the weights-only
    unpickler's errors, the unpickler's own line (torch puts the same generic lines about the ``weights_only``
    default before it, with terminal escapes), else the error's first line."""
    text = _without_escapes(err)
    _, marker, rest = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in (rest if marker else text).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def _without_escapes(err: BaseException) -> str:
    """``str(err)`` without terminal escape codes (torch's weights-only message sets bold text)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", str(err))


def _is_zip(path: str | os.PathLike[str]) -> bool:
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False
