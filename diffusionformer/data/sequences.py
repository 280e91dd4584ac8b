"""Sequence classification: MNIST-1D (Greydanus & Kobak, "Scaling down deep learning with
MNIST-1D", ICML 2024; the ``mnist1d`` package).

Each example is one of ten 1-D digit templates, padded, translated, sheared, scaled and
noised, then resampled to 40 points. The package's ``make_dataset`` builds 5,000 examples
with its own fixed seed (42) and splits them 4,000 train / 1,000 test. We carve a seeded
validation set from the 4,000 (default 10%: 3,600/400/1,000) and return ``x`` as
``(N, 40, 1)``: a length-40 sequence of one feature, already standardised by the package.
"""

from __future__ import annotations

import numbers
import random

import numpy as np
import torch

from ._optional import import_optional
from .base import ClassificationData, _as_count
from .registry import register_dataset
from .splits import random_split

__all__ = ["load_mnist1d"]

#: Most examples :func:`load_mnist1d` generates (over an hour of the package's generator, 3 GB of float64).
_MAX_SAMPLES = 10**7


@register_dataset("mnist1d", kind="sequence")
def load_mnist1d(
    *,
    seed: int = 0,
    val_fraction: float = 0.1,
    num_samples: int = 5000,
) -> ClassificationData:
    """MNIST-1D from ``mnist1d.data.make_dataset`` (no network), as ``(N, 40, 1)`` sequences.

    ``make_dataset`` reseeds Python's and NumPy's global generators; their states are saved
    before the call and restored after it, so loading leaves global randomness untouched.

    Args:
        seed: seed of the train/val carve (the examples themselves use the package's seed).
        val_fraction: share of the package's training split moved to val.
        num_samples: total examples to generate, in ``[20, 10**7]`` (the package's default 5,000; 80% train);
            the package makes ``num_samples // 10`` per class, so a count that is no multiple of ten is rounded
            down to one.

    Shapes:
        - x: ``(N, 40, 1)`` float32; y: ``(N,)`` int64, 10 classes.
    """
    num_samples = _as_count("num_samples", num_samples)
    if num_samples < 20:
        raise ValueError(f"num_samples must be >= 20 (two per class), got {num_samples}")
    if num_samples > _MAX_SAMPLES:  # the package draws one example at a time in Python: 10**13 ran until memory ran out
        raise ValueError(
            f"num_samples must be at most {_MAX_SAMPLES:,} (mnist1d makes a few thousand examples a second, "
            f"one at a time in Python), got {num_samples:,}"
        )
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real):  # "0.1": a bare '<=' error
        raise ValueError(f"val_fraction must be in [0, 1) (a number), got {val_fraction!r}")
    mdata = import_optional("mnist1d.data", package="mnist1d", dataset="mnist1d")
    args = mdata.get_dataset_args()
    args.num_samples = int(num_samples)
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        raw = mdata.make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    x_all = torch.as_tensor(np.asarray(raw["x"], dtype=np.float32)).unsqueeze(-1)
    y_all = torch.as_tensor(np.asarray(raw["y"], dtype=np.int64))
    x_test = torch.as_tensor(np.asarray(raw["x_test"], dtype=np.float32)).unsqueeze(-1)
    y_test = torch.as_tensor(np.asarray(raw["y_test"], dtype=np.int64))
    train_idx, val_idx, _ = random_split(len(y_all), val_fraction, 0.0, seed)
    if not len(val_idx):  # require_heldout counted the package's test examples too: "0 of 20" for 16 carved from
        raise ValueError(
            f"mnist1d: val_fraction={val_fraction} leaves the val split empty (0 of the package's {len(y_all)} "
            f"training examples); evaluation needs at least one val example, so use a larger val_fraction"
        )
    if not len(train_idx):  # else the first training step's torch.randint(0, 0) ("expects 'from' to be less than 'to'")
        raise ValueError(
            f"mnist1d: val_fraction={val_fraction} leaves the train split empty (all {len(val_idx)} of the package's "
            f"training examples held out for val); use more samples or a smaller val_fraction"
        )
    T, F = x_all.shape[1:]
    return ClassificationData(
        name="mnist1d",
        kind="sequence",
        x_train=x_all[train_idx],
        y_train=y_all[train_idx],
        x_val=x_all[val_idx],
        y_val=y_all[val_idx],
        x_test=x_test,
        y_test=y_test,
        num_classes=10,
        input_shape=(int(T), int(F)),
        meta={
            "source": "mnist1d.data.make_dataset(get_dataset_args()), generated locally",
            "licence": "mnist1d package: Apache-2.0",
            "generator_seed": args.seed,
            "split": f"package train/test 80/20; val = seeded {float(val_fraction):g} of train "  # a Fraction: no 'g' < 3.12
            f"(seed={seed})",
            "sizes": {"train": len(train_idx), "val": len(val_idx), "test": len(y_test)},
        },
    )
