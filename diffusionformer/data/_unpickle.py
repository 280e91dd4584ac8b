"""The NumPy globals that the restricted unpicklers of data files (CIFAR batches, Planetoid ``ind.*``) may use.

A pickle calls the globals it names with arguments of its choosing, so handing ``numpy.ndarray`` or
``_reconstruct`` themselves to a doctored file lets it allocate any declared shape (uninitialised memory, or
gigabytes from a 200-byte file), build object arrays from a short list (NumPy then reads past it: a
segmentation fault) or from raw bytes (read as pointers), and ``_codecs.encode(b, "hex")`` nested doubles a
byte string at each level. The stand-ins here accept exactly what NumPy and Python 3 write: every array starts
empty (``_reconstruct(ndarray, (0,), b"b")``) and is filled by its state, whose dtype must be a plain boolean,
number or fixed-width string and whose data must be the raw bytes of the declared size; ``_codecs.encode`` only
turns a ``str`` into ``latin1`` bytes. Anything else is a ``pickle.UnpicklingError``.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

try:  # NumPy 2
    from numpy._core.multiarray import scalar as _numpy_scalar
except ImportError:  # pragma: no cover - NumPy 1
    from numpy.core.multiarray import scalar as _numpy_scalar


def _plain_dtype(dtype: Any, what: str) -> np.dtype:
    """A fresh copy of a boolean, numeric or fixed-width string ``dtype`` (a pickled dtype's state may carry
    object fields, which NumPy would read as pointers)."""
    if not isinstance(dtype, np.dtype) or dtype.kind not in "biufSU":
        raise pickle.UnpicklingError(
            f"{what} of dtype {dtype!r} is not allowed (only booleans, numbers and fixed-width strings)")
    if not dtype.itemsize:  # NumPy writes no 0-wide strings: 10**18 of them fit in 0 bytes of data
        raise pickle.UnpicklingError(f"{what} of dtype {dtype!r} is not allowed (strings of width 0)")
    return np.dtype(dtype.str)


def _check_code_points(dtype: np.dtype, data: bytes, what: str) -> None:
    """Refuse unicode data (``dtype`` of kind ``U``) holding code points beyond U+10FFFF: NumPy turns them into
    ``str`` objects that Python cannot handle (``SystemError``, or a broken string handed on)."""
    if dtype.kind == "U":
        codes = np.frombuffer(data, dtype=dtype.str[0] + "u4", count=len(data) // 4)
        if codes.size and int(codes.max()) > 0x10FFFF:
            raise pickle.UnpicklingError(f"{what} of dtype {dtype!r} holds the code point {int(codes.max()):#x}, "
                                         f"beyond U+10FFFF")


def _refuse_build(what: str) -> None:
    raise pickle.UnpicklingError(f"setting attributes of {what} is not allowed (it is shared by every file read)")


class _NdarrayName:
    """What ``numpy.ndarray`` names in a restricted pickle: only the first argument of ``_reconstruct``."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise pickle.UnpicklingError("calling numpy.ndarray is not allowed (arrays are rebuilt by _reconstruct)")

    def __setstate__(self, state: Any) -> None:  # a pickle's BUILD on the global itself
        _refuse_build("numpy.ndarray")


class _Function:
    """A function as a restricted pickle names it: calling it calls the function, and the pickle's BUILD (which
    would set ``__defaults__``, ``__qualname__`` or any attribute of the module's function, for every later file)
    is refused."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def __setstate__(self, state: Any) -> None:
        _refuse_build(self._fn.__name__)


_NDARRAY = _NdarrayName()


class _CheckedArray(np.ndarray):
    """The empty array that :func:`_reconstruct` returns; its ``__setstate__`` (the pickle's BUILD) checks the
    dtype and the data before NumPy's. :func:`_plain` turns it into a plain ``ndarray`` after loading."""

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) in (4, 5)):
            raise pickle.UnpicklingError(f"an array state must be a tuple of 4 or 5 items, got {type(state).__name__}")
        version, (shape, dtype, fortran, data) = (state[0] if len(state) == 5 else 1), state[-4:]
        dtype = _plain_dtype(dtype, "an array")
        if isinstance(data, str):  # Python 2's str, read with encoding="latin1"
            data = data.encode("latin1")
        if not isinstance(data, bytes):
            raise pickle.UnpicklingError(f"array data must be raw bytes, got {type(data).__name__}")
        _check_code_points(dtype, data, "an array")
        super().__setstate__((version, shape, dtype, fortran, data))  # NumPy checks the size against the shape


def _reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    """``numpy.core.multiarray._reconstruct`` as NumPy's pickles call it: an empty array, filled by its state."""
    if subtype is not _NDARRAY or shape != (0,):
        raise pickle.UnpicklingError(
            f"_reconstruct({'ndarray' if subtype is _NDARRAY else type(subtype).__name__}, {shape!r}, ...) is not "
            f"allowed: NumPy's pickles start every array as _reconstruct(ndarray, (0,), ...) and give its content "
            f"in its state")
    return np.ndarray.__new__(_CheckedArray, (0,), np.uint8)


def _scalar(dtype: Any, data: Any = b"") -> Any:
    """``numpy.core.multiarray.scalar`` for boolean, numeric and fixed-width string dtypes only."""
    dtype = _plain_dtype(dtype, "a scalar")
    if isinstance(data, str):
        data = data.encode("latin1")
    if not isinstance(data, bytes):
        raise pickle.UnpicklingError(f"scalar data must be raw bytes, got {type(data).__name__}")
    _check_code_points(dtype, data, "a scalar")
    return _numpy_scalar(dtype, data)


def _encode(obj: Any, encoding: Any = "utf-8", errors: Any = "strict") -> bytes:
    """``_codecs.encode`` as Python 3 writes bytes at protocol 2: ``encode(str, "latin1")``."""
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise pickle.UnpicklingError(
            f"_codecs.encode({type(obj).__name__}, {encoding!r}) is not allowed (only a str to latin1 bytes)")
    return obj.encode("latin1")


#: ``(module, name)`` -> what the restricted unpicklers hand out for it
_NUMPY_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "_reconstruct"): _Function(_reconstruct),
    ("numpy._core.multiarray", "_reconstruct"): _Function(_reconstruct),
    ("numpy.core.multiarray", "scalar"): _Function(_scalar),
    ("numpy._core.multiarray", "scalar"): _Function(_scalar),
    ("_codecs", "encode"): _Function(_encode),  # bytes in protocol-2 pickles written by Python 3
}


def _plain(obj: Any) -> Any:
    """``obj`` with every :class:`_CheckedArray` inside (dict values, list items, attributes) a plain ``ndarray``.

    Lists and dicts are changed in place and each is visited once: a pickle may reference one list from many
    places (``[L, L]`` nested 60 deep is 2**60 paths, from a few hundred bytes) or put a list inside itself.
    Nesting deeper than the interpreter's recursion limit is a ``pickle.UnpicklingError``.
    """
    try:
        return _plain_in_place(obj, set())
    except RecursionError:
        raise pickle.UnpicklingError("lists or dicts nested too deep to be data") from None


def _plain_in_place(obj: Any, seen: set[int]) -> Any:
    if isinstance(obj, _CheckedArray):
        return obj.view(np.ndarray)
    if isinstance(obj, (dict, list)):
        if id(obj) not in seen:
            seen.add(id(obj))
            for key, value in (obj.items() if isinstance(obj, dict) else enumerate(obj)):
                if isinstance(value, (_CheckedArray, dict, list)):
                    obj[key] = _plain_in_place(value, seen)
        return obj
    if hasattr(obj, "__dict__") and not isinstance(obj, type):  # a SciPy sparse matrix: its arrays are attributes
        for key, value in vars(obj).items():
            if isinstance(value, _CheckedArray):
                setattr(obj, key, value.view(np.ndarray))
    return obj
