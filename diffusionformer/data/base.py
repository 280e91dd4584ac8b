"""Typed containers that every dataset loader returns.

One dataclass per task family, so that a runner can dispatch on ``data.kind``:

=================  =====================  =============================================
class              ``kind``               consumer
=================  =====================  =============================================
ClassificationData ``"image"``            ViT: ``x`` is ``(N, C, H, W)`` float32
ClassificationData ``"sequence"``         sequence classifier: ``x`` is ``(N, T, F)``
TextData           ``"text"``             causal GPT: 1-D int64 token streams
SequenceTaskData   ``"sequence_lm"``      causal GPT with ``ignore_index`` targets
NodeData           ``"node"``             graph transformer, node classification
GraphSetData       ``"graph"``            graph transformer, graph classification
=================  =====================  =============================================

Every container carries ``name``, ``kind`` and ``meta`` (source, licence note, split sizes).
"""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import Tensor

from diffusionformer.config import _check_flag, _choice_hint, _value_type

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torch_geometric.data import Data

__all__ = [
    "IGNORE_INDEX",
    "SPLITS",
    "ClassificationData",
    "TextData",
    "SequenceTaskData",
    "NodeData",
    "GraphSetData",
    "TaskData",
]

#: Target value that ``torch.nn.functional.cross_entropy`` skips by default.
IGNORE_INDEX = -100

#: Split names, in the order every container stores them.
SPLITS = ("train", "val", "test")


def _check_split(split: str, allowed: Sequence[str] = SPLITS) -> str:
    if split not in allowed:
        raise ValueError(f"split must be one of {list(allowed)}, got {split!r}{_choice_hint(split, allowed)}")
    return split


def _check_flags(where: str, **flags: Any) -> None:
    """Every value of ``flags`` a Python bool, else a ``TypeError`` ``"<where>: <name> must be a bool, got ..."``
    naming the full type: ``bool("no")`` is True, and a numpy bool is refused as every flag of the package is
    (named ``numpy.bool``). The loaders call it first, before any file is read."""
    for name, value in flags.items():
        _check_flag(value, f"{where}: {name}")


def _is_bool(value: Any) -> bool:
    """A Python bool or a bool tensor (``tensor(True)`` reads as 1 to ``operator.index``): never a count."""
    return isinstance(value, bool) or (isinstance(value, Tensor) and value.dtype == torch.bool)


def _as_count(name: str, value: Any) -> int:
    """``value`` as a Python int (NumPy and 0-d tensor ints too); anything else, bool included,
    is a ``TypeError`` naming ``name``."""
    try:
        if _is_bool(value):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None


def _check_ids(what: str, ids: Tensor, n: int, name: str, extra: str = "") -> None:
    """Refuse ``ids`` outside ``[0, n)`` with a ``ValueError`` naming ``what``, ``name`` and the range found."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise ValueError(f"{what} must lie in [0, {n}) ({name}){extra}, got range [{int(ids.min())}, "
                         f"{int(ids.max())}]")


class _TensorSplits:
    """``x_<split>`` / ``y_<split>`` tensor pairs shared by the supervised containers."""

    def split(self, split: str) -> tuple[Tensor, Tensor]:
        """Return ``(x, y)`` of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""
        _check_split(split)
        return getattr(self, f"x_{split}"), getattr(self, f"y_{split}")

    def _sizes(self) -> str:
        return ", ".join(f"{s}={self.split(s)[0].shape[0]}" for s in SPLITS)


@dataclass(repr=False)
class ClassificationData(_TensorSplits):
    r"""Supervised classification data ``(x_i, y_i)``, ``y_i \in \{0, ..., num_classes - 1\}``.

    Images (``kind="image"``) are ``(N, C, H, W)`` float32, first scaled to ``[0, 1]`` and then
    normalised per channel, ``x <- (x - mean_c) / std_c``, with ``mean``/``std`` measured on the
    training split and stored here (``None`` when ``normalize=False`` was asked). Sequences
    (``kind="sequence"``) are ``(N, T, F)`` float32.

    Args:
        name: registry name of the dataset.
        kind: ``"image"`` or ``"sequence"``.
        x_train, y_train, x_val, y_val, x_test, y_test: the three splits.
        num_classes: number of classes.
        input_shape: per-example shape, ``(C, H, W)`` or ``(T, F)``.
        mean, std: per-channel statistics used for normalisation (images), else ``None``.
        class_names: human-readable class names, when the source has them.
        meta: source, licence note, split sizes and how the splits were made; for images ``meta["scale"]``, the
            number raw pixels were divided by (a run records it with ``mean``/``std`` in ``preprocessing.json``,
            :attr:`~diffusionformer.experiments.LoadedRun.preprocessing`; without it the recorded scale is ``None``).

    Shapes:
        - x: ``(N, *input_shape)`` float32
        - y: ``(N,)`` int64
    """

    name: str
    kind: str
    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    class_names: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a float 3.0 or a bool True passed and reached the model's head size
        self.num_classes = _as_count("num_classes", self.num_classes)
        if self.kind not in ("image", "sequence"):
            raise ValueError(f"kind must be 'image' or 'sequence', got {self.kind!r}{_choice_hint(self.kind, ('image', 'sequence'))}")
        expected_dims = 3 if self.kind == "image" else 2
        if len(self.input_shape) != expected_dims:
            raise ValueError(
                f"input_shape for kind {self.kind!r} must have {expected_dims} dims, "
                f"got {self.input_shape}"
            )
        for split in SPLITS:
            x, y = self.split(split)
            if x.dtype != torch.float32 or y.dtype != torch.int64:
                raise ValueError(
                    f"{split}: expected float32 x and int64 y, got {x.dtype} and {y.dtype}"
                )
            if tuple(x.shape[1:]) != tuple(self.input_shape) or y.dim() != 1 or x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"{split}: expected x of shape (N, {', '.join(map(str, self.input_shape))}) "
                    f"and y of shape (N,), got {tuple(x.shape)} and {tuple(y.shape)}"
                )
            # a label beyond the classes failed at the loss (a device-side assert on a GPU), a negative one too
            _check_ids(f"{split}: labels", y, self.num_classes, "num_classes")

    def __repr__(self) -> str:
        return (
            f"ClassificationData(name={self.name!r}, kind={self.kind!r}, {self._sizes()}, "
            f"input_shape={self.input_shape}, num_classes={self.num_classes})"
        )


@dataclass(repr=False)
class TextData:
    r"""A character-level corpus as two token streams for next-token prediction.

    The model is trained on :math:`p(s_{t+1} \mid s_{\le t})`; :meth:`get_batch` samples
    windows as nanoGPT does (Karpathy, ``nanoGPT/train.py``): ``x = s[i : i + T]`` and
    ``y = s[i + 1 : i + T + 1]``.

    Args:
        name: registry name of the dataset.
        train, val: 1-D int64 token streams.
        vocab_size: number of distinct tokens, ``len(itos)``.
        itos: token id -> character.
        kind: always ``"text"``.
        meta: source, licence note, sizes.

    Shapes:
        - train, val: ``(L,)`` int64

    Examples:
        >>> import torch
        >>> text = "hello world"
        >>> itos = sorted(set(text))
        >>> data = TextData("toy", torch.tensor([itos.index(c) for c in text]),
        ...                 torch.tensor([0]), len(itos), itos)
        >>> data.decode(data.encode("hello"))
        'hello'
        >>> x, y = data.get_batch("train", 2, 4, torch.Generator().manual_seed(0))
        >>> bool((x[:, 1:] == y[:, :-1]).all())
        True
    """

    name: str
    train: Tensor
    val: Tensor
    vocab_size: int
    itos: list[str]
    kind: str = "text"
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a float 3.0 or a bool True (with one character) passed the length check and reached the model's config
        self.vocab_size = _as_count("vocab_size", self.vocab_size)
        if self.vocab_size != len(self.itos):
            raise ValueError(f"vocab_size ({self.vocab_size}) != len(itos) ({len(self.itos)})")
        for split in ("train", "val"):
            t = getattr(self, split)
            if not isinstance(t, Tensor):  # a list: "'list' object has no attribute 'dtype'"
                raise ValueError(f"{split}: expected a 1-D int64 tensor, got {type(t).__name__}")
            if t.dtype != torch.int64 or t.dim() != 1:
                raise ValueError(
                    f"{split}: expected a 1-D int64 tensor, got {t.dtype} of shape {tuple(t.shape)}"
                )
            # an id beyond the vocabulary failed at the model's embedding (a device-side assert on a GPU)
            if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.vocab_size):
                raise ValueError(f"{split}: token ids must lie in [0, {self.vocab_size}) (vocab_size), got range "
                                 f"[{int(t.min())}, {int(t.max())}]")
        if any(not isinstance(ch, str) or len(ch) != 1 for ch in self.itos) or len(set(self.itos)) != len(self.itos):
            # a repeated character encoded to its last id only: the ids trained on its first one never came back;
            # an empty or a longer string decoded to text that encode refused or read back as other ids
            raise ValueError(f"itos must hold distinct strings of one character each (one per token id), got "
                             f"{self.itos[:20]!r}"
                             + ("..." if len(self.itos) > 20 else ""))
        self._stoi = {ch: i for i, ch in enumerate(self.itos)}

    @property
    def stoi(self) -> dict[str, int]:
        """Character -> token id."""
        return dict(self._stoi)

    def encode(self, text: str) -> Tensor:
        """Map a string to a 1-D int64 tensor of token ids.

        Raises:
            ValueError: if ``text`` holds a character outside the vocabulary.
            TypeError: if ``text`` is not a ``str`` (``bytes`` included).
        """
        if not isinstance(text, str):  # bytes gave "character 104 is not in the vocabulary", an int a bare TypeError
            hint = " (decode it first, e.g. text.decode('utf-8'))" if isinstance(text, (bytes, bytearray)) else ""
            raise TypeError(f"encode expects a str, got {type(text).__name__}{hint}")
        try:
            ids = [self._stoi[ch] for ch in text]
        except KeyError as err:
            raise ValueError(
                f"character {err.args[0]!r} is not in the {self.name!r} vocabulary "
                f"of {self.vocab_size} characters"
            ) from None
        return torch.tensor(ids, dtype=torch.int64)

    def decode(self, ids: Tensor | Sequence[int]) -> str:
        """Map token ids (a 1-D tensor or a list of ints) back to a string."""
        if isinstance(ids, Tensor):
            if ids.dim() != 1:
                raise ValueError(f"decode expects a 1-D tensor, got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        elif getattr(ids, "ndim", 1) != 1:  # a (1, T) NumPy array: numpy's "truth value ... is ambiguous"
            raise ValueError(f"decode expects a 1-D sequence of token ids, got shape {tuple(ids.shape)}")
        try:
            ids = list(ids)
        except TypeError:
            raise TypeError(f"decode expects a 1-D tensor or a sequence of ints, got {type(ids).__name__}") from None
        try:
            if any(isinstance(i, bool) for i in ids):  # True would read as token 1
                raise TypeError
            if any(i < 0 for i in ids):  # Python would index from the end of itos
                raise IndexError
            return "".join(self.itos[i] for i in ids)
        except (IndexError, TypeError):
            # float ids (a float tensor's) are in range yet no index: say what they are, not "expects ids in [0, V)"
            real = next((type(i).__name__ for i in ids
                         if isinstance(i, numbers.Real) and not isinstance(i, numbers.Integral)), None)

            def token_id(i: object) -> bool:  # as indexing itos takes it (an int, a NumPy int, an int 0-d tensor)
                try:
                    return not isinstance(i, bool) and 0 <= operator.index(i) < self.vocab_size
                except TypeError:
                    return False

            # the ids shown are the first 20: the one refused is named where it is not among them (a generation's)
            at = next((j for j, i in enumerate(ids) if not token_id(i)), 0) if len(ids) > 20 else 0
            raise ValueError(
                f"decode expects token ids in [0, {self.vocab_size}), got {ids[:20]}"
                + (f"... ({len(ids)} ids; {ids[at]!r} at position {at})" if at >= 20
                   else f"... ({len(ids)} ids)" if len(ids) > 20 else "")
                + (f" ({real} ids: expected integers, e.g. ids.long())" if real else "")
            ) from None

    def get_batch(
        self,
        split: str,
        batch_size: int,
        block_size: int,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Sample ``batch_size`` random windows of length ``block_size`` from ``split``.

        Offsets ``i ~ U{0, ..., L - T - 1}`` are drawn with ``generator`` (a CPU
        ``torch.Generator``; ``None`` uses torch's global generator), so a seeded generator
        gives the same batches on every run.

        Args:
            split: ``"train"`` or ``"val"``.
            batch_size: ``B``.
            block_size: context length ``T``; must be smaller than the split's length.
            generator: source of randomness.
            device: where to put the batch (default: where the tokens live).

        Shapes:
            - x, y: ``(B, T)`` int64, with ``y[:, t] = x[:, t + 1]`` for ``t < T - 1``.
        """
        _check_split(split, ("train", "val"))
        data: Tensor = getattr(self, split)
        L = data.shape[0]
        batch_size, block_size = _as_count("batch_size", batch_size), _as_count("block_size", block_size)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if L < 2:
            raise ValueError(f"the {split!r} split has {L} token(s): a window needs at least 2 (an input and "
                             f"its next token), so no block_size fits; use a longer text")
        if not 1 <= block_size < L:
            raise ValueError(
                f"block_size must be in [1, {L - 1}] for the {split!r} split of length {L}, "
                f"got {block_size}"
            )
        if generator is not None and (not isinstance(generator, torch.Generator) or generator.device.type != "cpu"):
            # else torch's "randint() received an invalid combination of arguments" (splits' _require_generator
            # says the same, but splits imports this module)
            got = (f"a {generator.device.type} torch.Generator" if isinstance(generator, torch.Generator)
                   else _value_type(generator))
            raise TypeError(f"TextData.get_batch: generator must be a CPU torch.Generator or None, got {got}"
                            + (" (for a seed, pass torch.Generator().manual_seed(seed))"
                               if isinstance(generator, numbers.Integral) else ""))
        ix = torch.randint(L - block_size, (batch_size,), generator=generator)
        window = ix.to(data.device)[:, None] + torch.arange(block_size + 1, device=data.device)
        chunk = data[window]  # (B, T + 1)
        x, y = chunk[:, :-1], chunk[:, 1:]
        if device is not None:
            # non-blocking only towards an accelerator: a copy to the CPU could be read before it has landed
            overlap = torch.device(device).type != "cpu"
            x, y = x.to(device, non_blocking=overlap), y.to(device, non_blocking=overlap)
        return x, y

    def __repr__(self) -> str:
        return (
            f"TextData(name={self.name!r}, train={self.train.shape[0]}, val={self.val.shape[0]}, "
            f"vocab_size={self.vocab_size})"
        )


@dataclass(repr=False)
class SequenceTaskData(_TensorSplits):
    r"""A token-level sequence task for causal language models with sparse supervision.

    ``x`` holds the input tokens; ``y[n, t]`` is the token the model should predict after
    reading ``x[n, : t + 1]``, or :data:`IGNORE_INDEX` (``-100``) where nothing is asked,
    so ``F.cross_entropy(logits.flatten(0, 1), y.flatten())`` scores only the answers.

    Args:
        name: registry name of the dataset.
        x_train, y_train, x_val, y_val, x_test, y_test: inputs and targets of each split.
        vocab_size: number of input tokens.
        kind: always ``"sequence_lm"``.
        ignore_index: the target value that marks unsupervised positions.
        meta: generator options, sizes.

    Shapes:
        - x, y: ``(N, T)`` int64
    """

    name: str
    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor
    vocab_size: int
    kind: str = "sequence_lm"
    ignore_index: int = IGNORE_INDEX
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a float 3.0 or a bool True passed (TextData refuses them) and reached the model's config
        self.vocab_size = _as_count("vocab_size", self.vocab_size)
        self.ignore_index = _as_count("ignore_index", self.ignore_index)
        for split in SPLITS:
            x, y = self.split(split)
            if not (isinstance(x, Tensor) and isinstance(y, Tensor)):
                raise ValueError(f"{split}: expected int64 tensors, got {type(x).__name__} and {type(y).__name__}")
            if (x.dtype != torch.int64 or y.dtype != torch.int64 or x.shape != y.shape or x.dim() != 2
                    or x.shape[1] != self.x_train.shape[1]):
                raise ValueError(
                    f"{split}: expected int64 inputs and targets of the same shape (N, T), T the train split's, "
                    f"got {x.dtype} {tuple(x.shape)} and {y.dtype} {tuple(y.shape)}"
                )
            # ids beyond the vocabulary failed at the model's embedding or loss (a device-side assert on a GPU)
            _check_ids(f"{split}: input tokens", x, self.vocab_size, "vocab_size")
            _check_ids(f"{split}: targets", y[y != self.ignore_index], self.vocab_size, "vocab_size",
                       f" or ignore_index ({self.ignore_index})")

    @property
    def seq_len(self) -> int:
        """Sequence length ``T``."""
        return int(self.x_train.shape[1])

    def __repr__(self) -> str:
        return (
            f"SequenceTaskData(name={self.name!r}, {self._sizes()}, seq_len={self.seq_len}, "
            f"vocab_size={self.vocab_size})"
        )


@dataclass(repr=False)
class NodeData:
    r"""Node classification on one graph :math:`G = (V, E)`, features :math:`X \in R^{N \times D}`.

    Args:
        name: registry name of the dataset.
        data: a PyG ``Data`` with ``x`` ``(N, D)`` floating point (float32 for a float32 model),
            ``edge_index`` ``(2, E)`` int64, ``y`` ``(N,)`` int64 and boolean
            ``train_mask``/``val_mask``/``test_mask`` ``(N,)``, each selecting at least one node.
        num_classes: number of node classes.
        num_features: ``D``.
        kind: always ``"node"``.
        meta: source, licence note, split sizes.
    """

    name: str
    data: Data
    num_classes: int
    num_features: int
    kind: str = "node"
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        d = self.data
        for key in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask"):
            if getattr(d, key, None) is None:
                raise ValueError(f"NodeData needs data.{key}; the given Data has none")
        self.num_features = _as_count("num_features", self.num_features)
        if tuple(d.x.shape) != (d.num_nodes, self.num_features):
            raise ValueError(
                f"expected x of shape ({d.num_nodes}, {self.num_features}), got {tuple(d.x.shape)}"
            )
        if not d.x.is_floating_point():  # int or bool (one-hot) features failed in the model's first layer, mid-run
            raise ValueError(f"expected x to be a floating-point tensor (float32 for a float32 model), got {d.x.dtype};"
                             f" convert it with data.x = data.x.float()")
        N = d.num_nodes
        self.num_classes = _as_count("num_classes", self.num_classes)
        ei = d.edge_index
        if ei.dtype != torch.int64 or ei.dim() != 2 or ei.shape[0] != 2:
            raise ValueError(f"expected edge_index to be an int64 tensor of shape (2, E), got {ei.dtype} of shape "
                             f"{tuple(ei.shape)}")
        # an edge to node N or beyond gathered another graph's memory or failed in a scatter (a GPU assert)
        _check_ids("edge_index: node ids", ei, N, "num_nodes")
        if d.y.dim() < 1 or d.y.shape[0] != N:
            raise ValueError(f"expected y with one row per node ({N}), got shape {tuple(d.y.shape)}")
        if d.y.dtype != torch.int64 or d.y.dim() != 1:  # (N, 1), float or int32 labels failed in the task's loss
            raise ValueError(f"expected y to be an int64 tensor of shape ({N},) (one class per node), got {d.y.dtype} "
                             f"of shape {tuple(d.y.shape)}")
        for split in SPLITS:
            mask = getattr(d, f"{split}_mask")
            if mask.dtype != torch.bool or tuple(mask.shape) != (N,):
                raise ValueError(
                    f"expected {split}_mask to be a bool tensor of shape ({N},), got {mask.dtype} of shape "
                    f"{tuple(mask.shape)}"
                )
            if not bool(mask.any()):  # a loss and an accuracy over no nodes are NaN, not a result
                raise ValueError(f"{self.name}: {split}_mask selects no node; training and evaluation need at "
                                 f"least one {split} node")
        # a label beyond the classes failed at the loss or the first evaluation (a device-side assert on a GPU)
        _check_ids("y: labels of the train/val/test nodes", d.y[d.train_mask | d.val_mask | d.test_mask],
                   self.num_classes, "num_classes")

    def __repr__(self) -> str:
        d = self.data
        sizes = ", ".join(f"{s}={int(getattr(d, f'{s}_mask').sum())}" for s in SPLITS)
        return (
            f"NodeData(name={self.name!r}, num_nodes={d.num_nodes}, num_edges={d.num_edges}, "
            f"num_features={self.num_features}, num_classes={self.num_classes}, {sizes})"
        )


@dataclass(repr=False)
class GraphSetData:
    r"""Graph classification: a set of graphs :math:`G_n` with one label each.

    Args:
        name: registry name of the dataset.
        dataset: a PyG dataset (or a list) of ``Data`` objects, each with floating-point ``x`` ``(N_n, D)``,
            ``edge_index`` and ``y`` ``(1,)``.
        train_idx, val_idx, test_idx: int64 indices into ``dataset``.
        num_classes: number of graph classes.
        num_features: node feature size ``D``.
        kind: always ``"graph"``.
        meta: source, licence note, split sizes, feature recipe.

    Construction refuses (``ValueError``; ``TypeError`` for a size that is not an int) split indices that are not
    1-D int64 within ``dataset`` or repeat a graph, and a listed graph whose ``x`` is not floating point
    ``(N_n, num_features)`` or whose ``y`` is not one int64 label in ``[0, num_classes)`` (graphs no split lists are
    not read).
    """

    name: str
    dataset: Any
    train_idx: Tensor
    val_idx: Tensor
    test_idx: Tensor
    num_classes: int
    num_features: int
    kind: str = "graph"
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a float 2.0 or a bool True passed and reached the model's head and input sizes
        self.num_classes = _as_count("num_classes", self.num_classes)
        self.num_features = _as_count("num_features", self.num_features)
        G = len(self.dataset)
        used: set[int] = set()
        for split in SPLITS:
            idx = getattr(self, f"{split}_idx")
            if not isinstance(idx, Tensor) or idx.dtype != torch.int64 or idx.dim() != 1:
                # a float tensor failed at split() with "list indices must be integers", a list had no numel
                got = f"{idx.dtype} of shape {tuple(idx.shape)}" if isinstance(idx, Tensor) else type(idx).__name__
                raise ValueError(f"{split}_idx must be a 1-D int64 tensor, got {got}")
            # a negative index picked a graph from the end without a word, one past the end failed at split()
            _check_ids(f"{split}_idx: graph ids", idx, G, "len(dataset)")
            if idx.unique().numel() != idx.numel():  # a repeated graph was scored (and trained on) twice
                raise ValueError(f"{split}_idx lists a graph more than once: {idx.tolist()[:20]}")
            used.update(idx.tolist())
        for i in sorted(used):
            self._check_graph(i, self.dataset[i])

    def _check_graph(self, i: int, g: Any) -> None:
        """Graph ``i`` has floating-point ``x`` ``(N_i, num_features)`` and one int64 label in ``[0, num_classes)``: a
        wider or an integer ``x`` failed in the model's first layer mid-run, a label beyond the classes at the loss
        (a GPU assert)."""
        x, y = getattr(g, "x", None), getattr(g, "y", None)
        if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[1] != self.num_features:
            got = f"shape {tuple(x.shape)}" if isinstance(x, Tensor) else repr(x)
            raise ValueError(f"graph {i}: expected x of shape (num_nodes, {self.num_features}) (num_features), "
                             f"got {got}")
        if not x.is_floating_point():  # int or bool (one-hot) features failed in the model's first layer, mid-run
            raise ValueError(f"graph {i}: expected x to be a floating-point tensor (float32 for a float32 model), got "
                             f"{x.dtype}; convert the features with .float()")
        if not isinstance(y, Tensor) or y.dtype != torch.int64 or y.numel() != 1:
            got = f"{y.dtype} of shape {tuple(y.shape)}" if isinstance(y, Tensor) else repr(y)
            raise ValueError(f"graph {i}: expected y to be one int64 class label, got {got}")
        _check_ids(f"graph {i}: label", y, self.num_classes, "num_classes")

    def split(self, split: str) -> Any:
        """The graphs of ``split`` (a PyG dataset view, or a list when ``dataset`` is a list)."""
        _check_split(split)
        idx: Tensor = getattr(self, f"{split}_idx")
        if isinstance(self.dataset, list):
            return [self.dataset[i] for i in idx.tolist()]
        return self.dataset[idx]

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s}={getattr(self, f'{s}_idx').numel()}" for s in SPLITS)
        return (
            f"GraphSetData(name={self.name!r}, num_graphs={len(self.dataset)}, "
            f"num_features={self.num_features}, num_classes={self.num_classes}, {sizes})"
        )


TaskData = ClassificationData | TextData | SequenceTaskData | NodeData | GraphSetData
