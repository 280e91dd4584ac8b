"""Seeding and capture/restore of every random number generator a training step may use.

States are stored as tensors and plain Python types so that checkpoints load with
``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import numbers
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from .config import _check_device

__all__ = ["seed_everything", "capture_rng_state", "restore_rng_state", "preserve_rng_state"]


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and all CUDA devices).

    Call it before building the model so that its initialisation is reproducible.

    Args:
        seed: an int in ``[0, 2**32)``.

    Examples:
        >>> seed_everything(3); a = torch.rand(2)
        >>> seed_everything(3); torch.equal(a, torch.rand(2))
        True
    """
    # any integral number (a NumPy int from a sweep grid, as TrainConfig.seed takes) is the int it equals
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**32:
        raise ValueError(f"seed_everything: expected an int in [0, 2**32), got {seed!r}")
    seed = int(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def capture_rng_state(device: torch.device, generator: torch.Generator | None = None) -> dict[str, Any]:
    """Snapshot Python, NumPy, torch CPU, torch CUDA (of ``device``) and ``generator`` states.

    Args:
        device: the training device; its CUDA generator is captured when it is a CUDA device.
        generator: the batch generator, if any.

    Returns:
        A dict of tensors, ints, floats and ``None`` (safe for ``weights_only=True``).

    Examples:
        >>> s = capture_rng_state(torch.device("cpu")); a = torch.rand(2)
        >>> restore_rng_state(s, torch.device("cpu")); torch.equal(a, torch.rand(2))
        True
    """
    _check_device("capture_rng_state", device)
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        # on the CPU whatever the caller's default device: at torch.set_default_device('meta') the state was a meta
        # tensor, which restore_rng_state could not read back ("Cannot copy out of meta tensor; no data!")
        "python": {"version": int(version), "state": torch.tensor(internal, dtype=torch.int64, device="cpu"),
                   "gauss": None if gauss is None else float(gauss)},
        "numpy": {"name": str(name), "keys": torch.from_numpy(keys.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "generator": generator.get_state() if generator is not None else None,
    }
    return state


def restore_rng_state(
    state: dict[str, Any], device: torch.device, generator: torch.Generator | None = None
) -> None:
    """Restore the states written by :func:`capture_rng_state`.

    Args:
        state: the captured states.
        device: the training device (its CUDA generator is restored when one was captured).
        generator: the batch generator to restore, if any.

    Raises:
        ValueError: ``state`` is not one :func:`capture_rng_state` writes (an entry missing, or one that does not
            fit, such as a torch state of another size); every generator is then left as it was.
    """
    missing = [k for k in ("python", "numpy", "torch") if not isinstance(state, dict) or k not in state]
    if missing:  # else a bare KeyError 'python'
        raise ValueError(f"restore_rng_state: expected a state from capture_rng_state, got "
                         f"{type(state).__name__ if not isinstance(state, dict) else 'a dict'} without {missing}")
    _check_device("restore_rng_state", device)
    if generator is not None and state.get("generator") is None:  # before any generator is set: none half-restored
        raise ValueError("restore_rng_state: expected a saved batch-generator state, got None")
    # a state that does not fit (a torch state of another size or version) failed after the generators before it
    # were set: the caller got the error with its Python and NumPy generators already rewound. Put them back.
    previous = capture_rng_state(device, generator)
    try:
        _set_rng_state(state, device, generator)
    except Exception as err:
        _set_rng_state(previous, device, generator)
        if isinstance(err, (RuntimeError, ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError)):
            raise ValueError(f"restore_rng_state: expected the states capture_rng_state writes, got one that does "
                             f"not fit ({type(err).__name__}: {err})") from err
        raise


def _set_rng_state(state: dict[str, Any], device: torch.device, generator: torch.Generator | None) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    npst = state["numpy"]
    np.random.set_state(
        (npst["name"], npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"],
         npst["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    if generator is not None:
        generator.set_state(state["generator"])


@contextlib.contextmanager
def preserve_rng_state(device: torch.device) -> Iterator[None]:
    """Run a block (e.g. evaluation) without advancing the global random generators.

    Python, NumPy, torch CPU and (on CUDA) the device's generator are restored on exit, so how
    often one evaluates does not change the training trajectory.

    Args:
        device: the training device.

    Examples:
        >>> before = torch.get_rng_state()
        >>> with preserve_rng_state(torch.device("cpu")):
        ...     _ = torch.rand(3)
        >>> torch.equal(before, torch.get_rng_state())
        True
    """
    state = capture_rng_state(device)
    try:
        yield
    finally:
        restore_rng_state(state, device)


def _device_in_use() -> torch.device:
    """The device whose generator :func:`preserve_rng_state` keeps for a caller that trains or builds models on any
    device: the current CUDA device once CUDA is initialised, else the CPU (reading a CUDA generator before would
    initialise CUDA in a process that may not use it; reading another device's makes a CUDA context on it)."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_initialized() else torch.device("cpu")
