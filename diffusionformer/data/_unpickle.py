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
    return np.dtype(dtype.str)


class _NdarrayName:
    """What ``numpy.ndarray`` names in a restricted pickle: only the first argument of ``_reconstruct``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise pickle.UnpicklingError("calling numpy.ndarray is not allowed (arrays are rebuilt by _reconstruct)")


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
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.multiarray", "scalar"): _scalar,
    ("numpy._core.multiarray", "scalar"): _scalar,
    ("_codecs", "encode"): _encode,  # bytes in protocol-2 pickles written by Python 3
}


def _plain(obj: Any) -> Any:
    """``obj`` with every :class:`_CheckedArray` inside (dict values, list items, attributes) a plain ``ndarray``."""
    if isinstance(obj, _CheckedArray):
        return obj.view(np.ndarray)
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(value, (_CheckedArray, dict, list)):
                obj[key] = _plain(value)
        return obj
    if isinstance(obj, list):
        return [_plain(v) for v in obj] if any(isinstance(v, (_CheckedArray, dict, list)) for v in obj) else obj
    if hasattr(obj, "__dict__") and not isinstance(obj, type):  # a SciPy sparse matrix: its arrays are attributes
        for key, value in vars(obj).items():
            if isinstance(value, _CheckedArray):
                setattr(obj, key, value.view(np.ndarray))
    return obj
