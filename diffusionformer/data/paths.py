"""Where data is read from (the data root) and where derived files go (the cache).

* Data root: the ``root`` argument, else the environment variable ``DIFFUSIONFORMER_DATA``,
  else none. It is only ever read: loaders never write into it.
* Cache: ``DIFFUSIONFORMER_CACHE``, else ``~/.cache/diffusionformer``. Copies of raw folders
  (PyG writes ``processed/`` beside ``raw/``), unzipped archives and decoded arrays live here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from diffusionformer._files import file_kind, load_error_text, new_file_mode, weights_only_refusal, zip_damage
from diffusionformer._warnings import user_stacklevel

__all__ = [
    "DATA_ENV",
    "CACHE_ENV",
    "DataRootError",
    "CorruptDataError",
    "ChecksumError",
    "resolve_root",
    "cache_dir",
    "require_files",
    "copy_into_cache",
    "save_cached",
    "load_cached",
    "drop_unsafe_processed",
]

DATA_ENV = "DIFFUSIONFORMER_DATA"
CACHE_ENV = "DIFFUSIONFORMER_CACHE"

_HOW_TO_SET = (
    f"Pass load_dataset(..., root='/path/to/data') or set the environment variable "
    f"{DATA_ENV}=/path/to/data (on the project machines the staged root is ../shared/data "
    f"relative to the repository). No files are downloaded."
)


class DataRootError(FileNotFoundError):
    """A dataset needs files from the data root, and the root or the files are missing."""


class CorruptDataError(ValueError):
    """A data file exists but its content is not what its format promises."""


class ChecksumError(CorruptDataError):
    """A known data file's SHA256 differs from the recorded one (corrupt or a different file)."""


def resolve_root(root: str | os.PathLike[str] | None = None) -> Path | None:
    """The data root: ``root`` if given, else ``$DIFFUSIONFORMER_DATA``, else ``None``.

    Args:
        root: explicit data root.

    Examples:
        >>> str(resolve_root("/data"))
        '/data'
    """
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get(DATA_ENV)
    return Path(env).expanduser() if env else None


def cache_dir(*parts: str) -> Path:
    """A writable cache folder, ``$DIFFUSIONFORMER_CACHE/<parts>`` (created on demand).

    Falls back to ``~/.cache/diffusionformer`` when the variable is unset.
    """
    env = os.environ.get(CACHE_ENV)
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "diffusionformer"
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def require_files(
    dataset: str,
    root: Path | None,
    relpaths: Iterable[str],
    *,
    layout: str | None = None,
) -> list[Path]:
    """Paths of ``relpaths`` under ``root``; raise :class:`DataRootError` if any is missing.

    Args:
        dataset: the registry name, for the message.
        root: the resolved data root (``None`` if there is none).
        relpaths: files expected under the root, in the standard layout.
        layout: an optional extra sentence describing alternatives.
    """
    relpaths = list(relpaths)
    expected = "\n".join(f"  <root>/{rel}" for rel in relpaths)
    extra = f"\n{layout}" if layout else ""
    if root is None:
        raise DataRootError(
            f"dataset {dataset!r} reads files from a data root, and none was given. "
            f"Expected files (standard layout):\n{expected}{extra}\n{_HOW_TO_SET}"
        )
    root = Path(root)  # a str root (a loader called directly) as the Path it names
    paths = [root / rel for rel in relpaths]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        # a folder or FIFO of the expected name was listed as missing, though `ls` shows it there
        listed = "\n".join(f"  {p}" + (f" ({file_kind(p.stat().st_mode)}, not a file)" if p.exists() else "")
                           for p in missing)
        # a root that is a file or does not exist was "missing file(s) under" it, as if it were a folder lacking them
        why = ("" if root.is_dir() else " (it does not exist)" if not root.exists() else " (it is a file, not a folder)"
               if root.is_file() else f" (it is {file_kind(root.stat().st_mode)}, not a folder)")
        raise DataRootError(
            f"dataset {dataset!r}: missing file(s) under the data root {str(root)!r}{why}:\n{listed}\n"
            f"Expected files (standard layout):\n{expected}{extra}\n{_HOW_TO_SET}"
        )
    return paths


def copy_into_cache(files: Iterable[Path], dest: Path) -> Path:
    """Copy ``files`` into the folder ``dest`` (created), skipping copies that are up to date.

    A file is copied to a temporary name first and then renamed, so that a reader in another
    process never sees half a file.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for src in files:
        target = dest / src.name
        st = src.stat()
        if target.is_file() and target.stat().st_size == st.st_size:
            if target.stat().st_mtime_ns == st.st_mtime_ns:
                continue
        fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{src.name}.")
        os.close(fd)
        try:  # a source that cannot be copied (a folder, a FIFO, unreadable) leaves no temporary file behind
            shutil.copyfile(src, tmp)
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.chmod(tmp, new_file_mode())  # mkstemp makes 0600: the copy gets the mode open() would give
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return dest


def save_cached(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary file beside ``path``, then rename (atomic for readers)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.chmod(tmp, new_file_mode())  # mkstemp makes 0600: the array gets the mode open() would give
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_cached(path: Path, fits: Callable[[Any], bool] | None = None, what: str = "") -> Any | None:
    """``torch.load`` (tensors only) a file written by :func:`save_cached`; ``None`` if absent,
    unreadable, failing the CRC-32 of an entry (bytes changed since it was written), or loaded but refused by ``fits`` (it is then rebuilt, with a ``UserWarning``
    naming the file and the error, or ``what`` it should have held).

    Args:
        path: the cache file.
        fits: whether the loaded object is what the caller saved there (``None``: anything).
        what: the expected content, for the warning when ``fits`` refuses it.
    """
    if not path.is_file():
        return None
    damage = zip_damage(path)  # torch.load checks no CRC: a flipped bit of an array loaded as other pixels
    if damage is not None:
        warnings.warn(f"cached file refused and rebuilt: {path}: {damage}", UserWarning, stacklevel=user_stacklevel())
        return None
    try:
        cached = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a damaged or doctored cache file is rebuilt, never trusted
        warnings.warn(f"cached file refused and rebuilt: {path}: {_load_failure(err, path)}", UserWarning,
                      stacklevel=user_stacklevel())
        return None
    if fits is not None and not fits(cached):  # loads, but is not what was saved there
        warnings.warn(f"cached file refused and rebuilt: {path}: not {what}", UserWarning,
                      stacklevel=user_stacklevel())
        return None
    return cached


def drop_unsafe_processed(folder: Path) -> list[str]:
    """Remove ``folder`` (PyG's ``processed/`` in the cache) unless every ``*.pt`` in it loads
    with ``torch.load(weights_only=True)``; PyG then rebuilds it from ``raw/``.

    PyG's own loader retries a file that ``weights_only=True`` refuses with
    ``weights_only=False``, which would run whatever code a doctored file names; calling this
    first means PyG only ever reads files that load as plain tensors and registered PyG
    containers. A damaged file (a killed processing step, a truncated copy, an entry failing its
    CRC-32) is rebuilt too.

    Args:
        folder: the ``processed`` folder (absent: nothing to do; a file in its place is removed).

    Returns:
        ``"<file>: <error>"`` for each refused file (empty when nothing was removed); each is
        also reported as a ``UserWarning``.
    """
    if not folder.is_dir():
        if not os.path.lexists(folder):
            return []
        # a file (or a dangling link) in its place: PyG's makedirs failed with a bare FileExistsError on every load
        why = f"{folder}: {'a file' if folder.is_file() else 'not a folder'} where PyG keeps its processed files"
        folder.unlink()
        warnings.warn(f"cached file refused and rebuilt from the raw files: {why}", UserWarning,
                      stacklevel=user_stacklevel())
        return [why]
    refused = []
    for path in sorted(folder.glob("*.pt")):
        damage = zip_damage(path)  # torch.load checks no CRC: a flipped bit of the graphs loaded as other features
        if damage is not None:
            refused.append(f"{path}: {damage}")
            continue
        try:
            torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # any failure: the file is not trusted, the folder is rebuilt
            refused.append(f"{path}: {_load_failure(err, path)}")
    if refused:
        shutil.rmtree(folder, ignore_errors=True)
        for why in refused:
            warnings.warn(f"cached file refused and rebuilt from the raw files: {why}", UserWarning,
                          stacklevel=user_stacklevel())
    return refused


def _load_failure(err: BaseException, path: Path) -> str:
    """Why ``torch.load(path, weights_only=True)`` failed, in one line: the item a whole file holds that
    ``weights_only`` refuses (torch's first line is the same generic text for every refusal), else
    :func:`~diffusionformer._files.load_error_text`."""
    refused = weights_only_refusal(err, path)
    if refused is not None:
        return f"{type(err).__name__}: holds what torch.load(weights_only=True) refuses: {refused}"
    return load_error_text(err)
