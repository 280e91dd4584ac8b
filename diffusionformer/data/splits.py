"""Seeded splits and per-channel normalisation, shared by the loaders.

Every function takes an explicit seed or ``torch.Generator`` and never touches torch's or
NumPy's global random state, so a dataset's splits depend on ``seed`` alone.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from torch import Tensor

from .base import _as_count

__all__ = [
    "generator",
    "split_sizes",
    "random_split",
    "stratified_split",
    "stratified_kfold_split",
    "require_heldout",
    "per_class_split",
    "index_to_mask",
    "carve_val",
    "seeded_subset",
    "normalize_channels",
]


_MAX_SEED = 2**64 - 1  # the largest seed a torch.Generator takes


def generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed`` (an int in ``[0, 2**64 - 1]``, numpy ints too; bools are refused).

    Examples:
        >>> torch.randint(10, (3,), generator=generator(0)).tolist() == torch.randint(
        ...     10, (3,), generator=generator(0)).tolist()
        True
    """
    return torch.Generator().manual_seed(_check_seed(seed))


def _check_seed(seed: object) -> int:
    """``seed`` as a Python int in ``[0, 2**64 - 1]`` (numpy ints too), else a TypeError/ValueError naming it."""
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    seed = int(seed)
    if not 0 <= seed <= _MAX_SEED:  # torch reads -1 as 2**64 - 1 (the same split) and fails beyond with "Overflow"
        raise ValueError(f"seed must be an int in [0, 2**64 - 1] (a torch generator seed), got {seed}")
    return seed


def _require_generator(generator: object, owner: str) -> None:
    """Refuse a ``generator`` that is not a ``torch.Generator`` (``None`` passes: torch's global one),
    before torch reports it as "received an invalid combination of arguments"."""
    if generator is not None and not isinstance(generator, torch.Generator):
        hint = " (for a seed, pass torch.Generator().manual_seed(seed))" if isinstance(generator, numbers.Integral) else ""
        raise TypeError(f"{owner}: generator must be a torch.Generator, got {type(generator).__name__}{hint}")


def _class_labels(labels: object, owner: str) -> Tensor:
    """``labels`` checked as a 1-D integer (or bool) tensor of class labels, on the CPU."""
    if not isinstance(labels, Tensor):
        raise TypeError(f"{owner}: labels must be a 1-D integer tensor, got {type(labels).__name__} "
                        f"(convert with torch.as_tensor)")
    if labels.dim() != 1:
        raise ValueError(f"labels must be 1-D, got shape {tuple(labels.shape)}")
    if labels.is_floating_point() or labels.is_complex():  # NaN labels match no class: items would be lost
        raise TypeError(f"{owner}: labels must be integer class labels, got dtype {labels.dtype}")
    return labels.cpu()


def split_sizes(n: int, val_fraction: float, test_fraction: float) -> tuple[int, int, int]:
    r"""Sizes ``(n_train, n_val, n_test)``, ``n_val = floor(f_val n + 1/2)``, same for test.

    Halves round up (not to even, as Python's ``round`` would).

    Args:
        n: number of items.
        val_fraction, test_fraction: fractions in ``[0, 1)`` with a sum below 1.

    Examples:
        >>> split_sizes(100, 0.1, 0.2)
        (70, 10, 20)
    """
    n = _as_count("n", n)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    for label, f in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if isinstance(f, bool) or not isinstance(f, numbers.Real):  # "0.1": a bare '<=' TypeError, False: 0.0
            raise ValueError(f"{label} must be in [0, 1) (a number), got {f!r}")
        if not 0.0 <= f < 1.0:
            raise ValueError(f"{label} must be in [0, 1), got {f}")
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(
            f"val_fraction + test_fraction must be < 1, got {val_fraction} + {test_fraction}"
        )
    n_val, n_test = math.floor(val_fraction * n + 0.5), math.floor(test_fraction * n + 0.5)
    return n - n_val - n_test, n_val, n_test


def random_split(
    n: int, val_fraction: float, test_fraction: float, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    r"""A seeded random partition of ``range(n)`` into train/val/test indices.

    A permutation :math:`\pi` of ``range(n)`` is drawn; train takes its first ``n_train``
    entries, val the next ``n_val`` and test the last ``n_test`` (see :func:`split_sizes`).

    Shapes:
        - outputs: ``(n_train,)``, ``(n_val,)``, ``(n_test,)`` int64

    Examples:
        >>> tr, va, te = random_split(10, 0.2, 0.2, seed=0)
        >>> len(tr), len(va), len(te), sorted(torch.cat([tr, va, te]).tolist()) == list(range(10))
        (6, 2, 2, True)
    """
    n_train, n_val, _ = split_sizes(n, val_fraction, test_fraction)
    perm = torch.randperm(n, generator=generator(seed))
    return perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val :]


def stratified_split(
    labels: Tensor, val_fraction: float, test_fraction: float, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    r"""A seeded split that keeps each class's share in every part.

    For each class ``c`` with :math:`n_c` items, :func:`split_sizes` of :math:`n_c` random
    items go to val and test (halves rounded up) and the rest to train. Each part is returned
    in a seeded random order (not grouped by class).

    Args:
        labels: integer class labels.
        val_fraction, test_fraction: fractions in ``[0, 1)`` with a sum below 1.
        seed: the split's seed.

    Shapes:
        - labels: ``(N,)``
        - outputs: three int64 index tensors that partition ``range(N)``

    Examples:
        >>> y = torch.tensor([0] * 10 + [1] * 10)
        >>> tr, va, te = stratified_split(y, 0.2, 0.2, seed=0)
        >>> y[va].bincount().tolist(), y[te].bincount().tolist(), len(tr)
        ([2, 2], [2, 2], 12)
    """
    labels = _class_labels(labels, "stratified_split")
    split_sizes(labels.numel(), val_fraction, test_fraction)  # validates the fractions
    g = generator(seed)
    parts: list[list[Tensor]] = [[], [], []]
    for c in torch.unique(labels).tolist():
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(idx.numel(), generator=g)]
        n_tr, n_va, _ = split_sizes(idx.numel(), val_fraction, test_fraction)
        parts[0].append(idx[:n_tr])
        parts[1].append(idx[n_tr : n_tr + n_va])
        parts[2].append(idx[n_tr + n_va :])
    out = []
    for chunks in parts:
        idx = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.long)
        out.append(idx[torch.randperm(idx.numel(), generator=g)])
    return out[0], out[1], out[2]


def require_heldout(
    dataset: str, splits: tuple[Tensor | int, Tensor | int, Tensor | int], val_fraction: float, test_fraction: float
) -> None:
    """Refuse split fractions that leave the val or the test part empty.

    Every evaluation averages over the val and test examples, so an empty part would only fail
    at a run's first evaluation, after steps have trained; a loader calls this right after
    splitting instead.

    Args:
        dataset: the dataset's name, for the message.
        splits: ``(train_idx, val_idx, test_idx)``, or the three parts' sizes.
        val_fraction, test_fraction: the options that sized the val and test parts.

    Raises:
        ValueError: naming the option whose part is empty.

    Examples:
        >>> y = torch.tensor([0] * 10 + [1] * 10)
        >>> require_heldout("toy", stratified_split(y, 0.2, 0.2, seed=0), 0.2, 0.2)
        >>> no_val = stratified_split(y, 0.0, 0.2, seed=0)
        >>> require_heldout("toy", no_val, 0.0, 0.2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: toy: val_fraction=0.0 leaves the val split empty (0 of 20 examples); ...
    """
    sizes = [idx if isinstance(idx, int) else idx.numel() for idx in splits]
    n = sum(sizes)
    for option, fraction, part, size in (
        ("val_fraction", val_fraction, "val", sizes[1]),
        ("test_fraction", test_fraction, "test", sizes[2]),
    ):
        if size == 0:
            raise ValueError(
                f"{dataset}: {option}={fraction} leaves the {part} split empty "
                f"(0 of {n} examples); evaluation needs at least one {part} example, so use a "
                f"larger {option}"
            )


def _require_carved_val(dataset: str, val_idx: Tensor, n: int, val_size: int | None) -> None:
    """Refuse a :func:`carve_val` that left the val part empty (the loaders with ``val_size``;
    :func:`require_heldout` is the same rule for those with ``val_fraction``)."""
    if not len(val_idx):  # evaluation needs a val example: refuse now, not after training
        raise ValueError(
            f"{dataset}: val_size={val_size} leaves the val split empty (0 of {n} training "
            f"images; None holds out min(5000, n // 10)); evaluation needs at least one val example, "
            f"so use a larger val_size or limit_train"
        )


def stratified_kfold_split(
    labels: Tensor, num_folds: int, fold: int, val_fraction: float, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Fold ``fold`` of a seeded stratified ``num_folds``-fold partition, with an inner val split.

    The items of each class are shuffled (seeded) and dealt to the folds in turn, continuing
    from class to class, so every fold holds :math:`\lfloor n_c / K \rfloor` or
    :math:`\lceil n_c / K \rceil` items of each class ``c`` and fold sizes differ by at most
    one. Fold ``fold`` is the test part; the other folds are split by
    :func:`stratified_split` (seed ``seed``, no test share) into train and val, so model
    selection never sees the test fold: the protocol of Errica et al., "A fair comparison of
    graph neural networks for graph classification" (ICLR 2020), with a holdout inner split.
    The ``num_folds`` test parts of one seed partition ``range(N)``.

    Args:
        labels: integer class labels.
        num_folds: number of folds ``K >= 2``.
        fold: which fold is the test part, ``0 <= fold < K``.
        val_fraction: share of each class of the remaining folds that goes to val, in ``[0, 1)``.
        seed: the partition's seed (the same seed gives the same folds for every ``fold``).

    Shapes:
        - labels: ``(N,)``
        - outputs: three int64 index tensors ``train, val, test`` that partition ``range(N)``

    Examples:
        >>> y = torch.tensor([0] * 10 + [1] * 20)
        >>> tests = [stratified_kfold_split(y, 5, k, 0.2, seed=0)[2] for k in range(5)]
        >>> sorted(torch.cat(tests).tolist()) == list(range(30)), [y[t].bincount().tolist() for t in tests][0]
        (True, [2, 4])
        >>> tr, va, te = stratified_kfold_split(y, 5, 0, 0.2, seed=0)
        >>> len(tr), len(va), len(te)
        (19, 5, 6)
    """
    labels = _class_labels(labels, "stratified_kfold_split")
    if not isinstance(num_folds, numbers.Integral) or isinstance(num_folds, bool) or num_folds < 2:
        raise ValueError(f"num_folds must be an int >= 2, got {num_folds!r}")
    if not isinstance(fold, numbers.Integral) or isinstance(fold, bool) or not 0 <= fold < num_folds:
        raise ValueError(f"fold must be an int in [0, {num_folds}), got {fold!r}")
    num_folds, fold = int(num_folds), int(fold)
    if labels.numel() < num_folds:
        raise ValueError(f"{num_folds} folds need at least {num_folds} items, got {labels.numel()}")
    split_sizes(labels.numel(), val_fraction, 0.0)  # validates the fraction
    g = generator(seed)
    assignment = torch.empty(labels.numel(), dtype=torch.long)
    offset = 0
    for c in torch.unique(labels).tolist():
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(idx.numel(), generator=g)]
        assignment[idx] = (torch.arange(idx.numel()) + offset) % num_folds
        offset += idx.numel()
    test = (assignment == fold).nonzero().flatten()
    rest = (assignment != fold).nonzero().flatten()
    test = test[torch.randperm(test.numel(), generator=g)]
    tr, va, _ = stratified_split(labels[rest], val_fraction, 0.0, seed)
    return rest[tr], rest[va], test


def per_class_split(
    labels: Tensor, num_train_per_class: int, val_fraction_of_rest: float, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Semi-supervised node split: ``k`` labelled nodes per class, the rest into val/test.

    For each class, ``num_train_per_class`` random nodes go to train (all of the class when it
    has fewer). The remaining nodes are shuffled; the first ``floor(f n_rest + 1/2)`` go to
    val, the others to test.

    Shapes:
        - labels: ``(N,)``
        - outputs: three int64 index tensors that partition ``range(N)``

    Examples:
        >>> y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
        >>> tr, va, te = per_class_split(y, 1, 0.5, seed=0)
        >>> y[tr].tolist().count(0), y[tr].tolist().count(1), len(va), len(te)
        (1, 1, 3, 3)
    """
    labels = _class_labels(labels, "per_class_split")
    num_train_per_class = _as_count("num_train_per_class", num_train_per_class)
    if num_train_per_class < 1:
        raise ValueError(f"num_train_per_class must be >= 1, got {num_train_per_class}")
    if isinstance(val_fraction_of_rest, bool) or not isinstance(val_fraction_of_rest, numbers.Real):  # True: 1.0
        raise ValueError(f"val fraction must be in [0, 1] (a number), got {val_fraction_of_rest!r}")
    if not 0.0 <= val_fraction_of_rest <= 1.0:
        raise ValueError(f"val fraction must be in [0, 1], got {val_fraction_of_rest}")
    if not labels.numel():
        raise ValueError("per_class_split: labels is empty (no nodes to split)")
    g = generator(seed)
    train = []
    for c in torch.unique(labels).tolist():
        idx = (labels == c).nonzero().flatten()
        train.append(idx[torch.randperm(idx.numel(), generator=g)[:num_train_per_class]])
    train_idx = torch.cat(train)
    rest = torch.ones(labels.numel(), dtype=torch.bool)
    rest[train_idx] = False
    rest_idx = rest.nonzero().flatten()
    rest_idx = rest_idx[torch.randperm(rest_idx.numel(), generator=g)]
    n_val = math.floor(val_fraction_of_rest * rest_idx.numel() + 0.5)
    return train_idx, rest_idx[:n_val], rest_idx[n_val:]


def carve_val(n: int, val_size: int | None, seed: int) -> tuple[Tensor, Tensor]:
    r"""Split ``range(n)`` into train and a held-out val set of ``val_size`` random items.

    A seeded permutation :math:`\pi` of ``range(n)``; val is its last ``val_size`` entries and
    train the others (in permuted order). ``val_size=None`` means ``min(5000, n // 10)``.

    Examples:
        >>> tr, va = carve_val(10, 3, seed=0)
        >>> len(tr), len(va), sorted(torch.cat([tr, va]).tolist()) == list(range(10))
        (7, 3, True)
    """
    n = _as_count("n", n)  # a float or bool n reached torch.randperm's "invalid combination of arguments"
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if val_size is None:
        val_size = min(5000, n // 10)
    val_size = _as_count("val_size", val_size)
    if not 0 <= val_size < n:
        raise ValueError(f"val_size must be in [0, {n}) for {n} training examples, got {val_size}")
    perm = torch.randperm(n, generator=generator(seed))
    return perm[: n - val_size], perm[n - val_size :]


def _check_limit(name: str, limit: Any) -> int | None:
    """A subset size option (``limit_train``, ``limit_test``): ``None`` or an int >= 1, checked under its own name
    (the loaders check theirs before reading any file)."""
    if limit is None:
        return None
    limit = _as_count(name, limit)
    if limit < 1:
        raise ValueError(f"{name} must be >= 1 or None, got {limit}")
    return limit


def seeded_subset(n: int, limit: int | None, seed: int) -> Tensor:
    """Sorted indices of ``limit`` items of ``range(n)`` drawn without replacement with ``seed``;
    all of ``range(n)`` when ``limit`` is None or >= n.

    Examples:
        >>> seeded_subset(5, None, seed=0).tolist()
        [0, 1, 2, 3, 4]
        >>> len(seeded_subset(100, 7, seed=0))
        7
    """
    n = _as_count("n", n)  # a float n with limit None was arange(n): float "indices", one more than n for 10.5
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    limit = _check_limit("limit", limit)
    if limit is None or limit >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=generator(seed))[:limit].sort().values


def index_to_mask(index: Tensor, size: int) -> Tensor:
    """Boolean mask of length ``size`` that is True at ``index``.

    Examples:
        >>> index_to_mask(torch.tensor([0, 2]), 4).tolist()
        [True, False, True, False]
    """
    if index.numel() and not index.dtype.is_floating_point and index.dtype != torch.bool and int(index.min()) < 0:
        # a negative index wrapped around: index -1 marked the last item
        raise ValueError(f"index_to_mask: index values must lie in [0, {size}), got {int(index.min())}")
    mask = torch.zeros(size, dtype=torch.bool, device=index.device)
    mask[index] = True
    return mask


def _refuse_shared_memory(tensors: tuple[Tensor, ...]) -> None:
    """Refuse tensors whose memory overlaps (a view of ``x_train`` among ``others``, or one tensor twice): the
    in-place normalisation would standardise those pixels twice. Conservative: spans of elements that interleave
    are refused too."""
    spans = []
    for t in tensors:
        if t.numel() == 0:
            continue
        extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1  # elements from the first to the last
        spans.append((t.device, t.data_ptr(), t.data_ptr() + extent * t.element_size()))
    names = ["x_train"] + [f"others[{i}]" for i in range(len(tensors) - 1)]
    names = [n for n, t in zip(names, tensors) if t.numel() > 0]
    for i in range(len(spans)):
        for j in range(i):
            if spans[i][0] == spans[j][0] and spans[i][1] < spans[j][2] and spans[j][1] < spans[i][2]:
                raise ValueError(f"normalize_channels: {names[i]} shares memory with {names[j]} (a view of it, or "
                                 f"the same tensor): normalising in place would standardise those pixels twice; "
                                 f"pass a copy (.clone())")


def _in_place_refusal(t: Tensor) -> str | None:
    """Why ``t.sub_`` would fail (an expanded view, a leaf that requires grad, an inference tensor), else None."""
    if t.requires_grad and t.is_leaf and torch.is_grad_enabled():
        return "it requires grad (a leaf cannot be modified in place)"
    if t.is_inference() and not torch.is_inference_mode_enabled():
        return "it is an inference tensor (not modifiable in place outside torch.inference_mode)"
    dims = sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1)
    extent = 0  # elements spanned by the smaller-stride dimensions
    for s, n in dims:
        if s <= extent:
            return "its elements share memory (an expanded or overlapping view)"
        extent += (n - 1) * s
    return None


def normalize_channels(
    x_train: Tensor, *others: Tensor, chunk_size: int = 4096
) -> tuple[tuple[float, ...], tuple[float, ...], list[Tensor]]:
    r"""Per-channel standardisation with training statistics: ``x <- (x - mean_c) / std_c``.

    ``mean_c`` and ``std_c`` (population std, accumulated in float64 over chunks of examples)
    are measured over ``x_train``'s examples and pixels of channel ``c``; a channel with zero
    spread keeps ``std_c = 1``. The tensors are modified **in place** (they are usually
    large and freshly made by a loader) and returned.

    Args:
        x_train: floating-point training images, the source of the statistics.
        others: further image tensors (val, test) normalised with the same numbers.
        chunk_size: examples per chunk while accumulating the statistics.

    Shapes:
        - x_train, others: ``(N, C, H, W)``

    Returns:
        ``(mean, std, [x_train, *others])``.

    Examples:
        >>> x = torch.tensor([0.0, 1.0]).view(2, 1, 1, 1)
        >>> mean, std, (xn,) = normalize_channels(x)
        >>> mean, std, xn.flatten().tolist()
        ((0.5,), (0.5,), [-1.0, 1.0])
    """
    if x_train.dim() != 4 or not x_train.is_floating_point():
        raise ValueError(
            f"expected float images of shape (N, C, H, W), got {x_train.dtype} "
            f"{tuple(x_train.shape)}"
        )
    chunk_size = _as_count("chunk_size", chunk_size)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    N, C, H, W = x_train.shape
    for i, t in enumerate(others):  # checked before anything is modified in place
        if not isinstance(t, Tensor) or t.dim() != 4 or t.shape[1] != C or not t.is_floating_point():
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"normalize_channels: others[{i}] must be float images (N, {C}, H, W) "
                             f"like x_train, got {got}")
    for name, t in zip(["x_train"] + [f"others[{i}]" for i in range(len(others))], (x_train, *others)):
        why = _in_place_refusal(t)  # else x_train was already standardised when a later sub_ failed
        if why is not None:
            raise ValueError(f"normalize_channels: {name} cannot be normalised in place: {why}; pass a copy "
                             f"(.clone()); nothing was modified")
    _refuse_shared_memory((x_train, *others))
    if N * H * W == 0:  # else mean 0 and std 1 were returned as its statistics, and others were left as they were
        raise ValueError(f"normalize_channels: x_train holds no pixel (shape {tuple(x_train.shape)}), so it has no "
                         "statistics to standardise with; nothing was modified")
    count = N * H * W
    total = torch.zeros(C, dtype=torch.float64, device=x_train.device)
    for chunk in x_train.split(chunk_size):
        total += chunk.sum(dim=(0, 2, 3), dtype=torch.float64)
    mean = total / count
    sq = torch.zeros(C, dtype=torch.float64, device=x_train.device)
    m = mean.to(x_train.dtype).view(1, C, 1, 1)
    for chunk in x_train.split(chunk_size):
        sq += (chunk - m).square().sum(dim=(0, 2, 3), dtype=torch.float64)
    std = (sq / count).sqrt()
    if not bool(torch.isfinite(mean).all() and torch.isfinite(std).all()):
        raise ValueError(
            f"normalize_channels: x_train has non-finite statistics (mean {mean.tolist()}, std "
            f"{std.tolist()}): it holds NaN or inf pixels, or values too large for {x_train.dtype}; "
            f"nothing was modified")
    std = torch.where(std > 0, std, torch.ones_like(std))
    s = std.to(x_train.dtype).view(1, C, 1, 1)
    out = [t.sub_(m).div_(s) for t in (x_train, *others)]
    return tuple(mean.tolist()), tuple(std.tolist()), out
