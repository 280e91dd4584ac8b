"""Node classification graphs from PyG: Zachary's karate club and the Planetoid citation graphs.

* ``"karate"``: ``torch_geometric.datasets.KarateClub`` (Zachary 1977; 34 nodes, 156 directed
  edges, 4 communities from modularity-based clustering, one-hot identity features). PyG
  labels one node per class; we draw a seeded split instead: ``num_train_per_class`` random
  nodes per class (default 2, so 8) for train, and the other 26 nodes shuffled and halved
  into val (13) and test (13).
* ``"cora"``, ``"citeseer"``: Planetoid (Yang, Cohen & Salakhutdinov, ICML 2016) with its
  public split (Cora 140/500/1,000 of 2,708 nodes, 7 classes; CiteSeer 120/500/1,000 of
  3,327 nodes, 6 classes). The raw files ``<root>/planetoid/<Name>/raw/ind.<name>.*`` are
  checked and read in place, the way ``torch_geometric.io.read_planetoid_data`` reads them
  (same nodes, edges, features and masks) but with a restricted unpickler: the ``ind.*``
  files are Python pickles, and a plain ``pickle.load`` of a doctored one would run any code
  it names. Only NumPy arrays, SciPy CSR matrices, lists and the ``defaultdict`` of the
  graph are rebuilt; any other global, a truncated file or a wrong type is a
  :class:`~diffusionformer.data.CorruptDataError` naming the file. Nothing is cached.
"""

from __future__ import annotations

import functools
import io
import numbers
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._imports import _import_pyg
from ._optional import import_optional
from ._unpickle import _NUMPY_GLOBALS, _plain
from .base import NodeData, _check_flags
from .checksums import _check_unchanged, sha256_file, verify_file
from .paths import CorruptDataError, require_files
from .registry import register_dataset
from .splits import index_to_mask, per_class_split

__all__ = ["load_karate", "load_planetoid", "load_cora", "load_citeseer", "read_planetoid"]

PLANETOID_FILES = ["x", "tx", "allx", "y", "ty", "ally", "graph", "test.index"]


@register_dataset("karate", kind="node")
def load_karate(*, seed: int = 0, num_train_per_class: int = 2) -> NodeData:
    """Zachary's karate club (PyG ``KarateClub``), 4 classes, seeded few-label split.

    Args:
        seed: seed of the split.
        num_train_per_class: labelled training nodes per class.
    """
    _import_pyg()
    from torch_geometric.datasets import KarateClub

    data = KarateClub()[0]
    train_idx, val_idx, test_idx = per_class_split(data.y, num_train_per_class, 0.5, seed)
    N = data.num_nodes
    data.train_mask = index_to_mask(train_idx, N)
    data.val_mask = index_to_mask(val_idx, N)
    data.test_mask = index_to_mask(test_idx, N)
    return NodeData(
        name="karate",
        data=data,
        num_classes=int(data.y.max()) + 1,
        num_features=data.num_features,
        meta={
            "source": "torch_geometric.datasets.KarateClub (Zachary 1977)",
            "licence": "public research data, bundled in PyG (MIT)",
            "split": f"{num_train_per_class} train nodes per class, rest halved into val/test "
            f"(seed={seed})",
            "sizes": {"train": len(train_idx), "val": len(val_idx), "test": len(test_idx)},
        },
    )


def load_planetoid(name: str, *, root: Path | None, verify: bool = True, normalize_features: bool = True) -> NodeData:
    """A Planetoid graph (``"Cora"``, ``"CiteSeer"``, ...) with the public split.

    Args:
        name: PyG's spelling of the dataset name.
        root: data root holding ``planetoid/<name>/raw/ind.<name lower>.*``.
        verify: check the raw files' SHA256 against the staged ones.
        normalize_features: divide every node's bag-of-words row by its sum (PyG's
            ``NormalizeFeatures``, as in the reference GCN example); rows of zeros stay zero.

    Raises:
        CorruptDataError: a file over 1 GiB (refused before it is hashed or read), one that
            :func:`read_planetoid` refuses, or (with ``verify``) one rewritten between its hash and its read;
            ``ChecksumError`` (with ``verify``): a file whose SHA256 is not the staged one's.
    """
    _check_flags("load_planetoid", verify=verify, normalize_features=normalize_features)
    key = name.lower()
    rels = [f"planetoid/{name}/raw/ind.{key}.{part}" for part in PLANETOID_FILES]
    paths = require_files(key, root, rels)
    for path in paths:  # before the hashes: a sparse file of a terabyte was hashed for many minutes, then refused
        _check_file_size(path)
    digests = [sha256_file(path) for path in paths] if verify else []  # (verify_file reuses these hashes)
    if verify:
        for path, rel in zip(paths, rels):
            verify_file(path, rel)
    data = read_planetoid(paths[0].parent, key)
    for path, digest in zip(paths, digests):  # a file rewritten after its hash: what was read was never checked
        _check_unchanged(path, digest)
    num_classes = int(data.y.max()) + 1
    if normalize_features:
        data.x = data.x / data.x.sum(dim=1, keepdim=True).clamp_min(1.0)
    return NodeData(
        name=key,
        data=data,
        num_classes=num_classes,
        num_features=int(data.x.size(1)),
        meta={
            "source": "Planetoid (Yang, Cohen & Salakhutdinov 2016), kimiyoung/planetoid",
            "licence": "MIT (kimiyoung/planetoid)",
            "split": "public Planetoid split",
            "sizes": {s: int(getattr(data, f"{s}_mask").sum()) for s in ("train", "val", "test")},
            "read_from": str(paths[0].parent),
            "features": "row-normalised (sum 1)" if normalize_features else "raw binary bag of words",
        },
    )


@functools.lru_cache(maxsize=1)
def _csr_class() -> type:
    """What ``csr_matrix`` names in a Planetoid pickle: a subclass whose class attributes cannot be set. The file's
    NEWOBJ makes an instance and BUILD fills the instance's ``__dict__``; a BUILD on the global itself set attributes
    of SciPy's own class (``csr_matrix.x = ...``), for the whole process."""
    from scipy.sparse import csr_matrix

    class _Frozen(type(csr_matrix)):  # type: ignore[misc]
        def __setattr__(cls, name: str, value: Any) -> None:
            if cls.__dict__.get("_sealed"):  # ABCMeta sets its own attributes while the class is made
                raise pickle.UnpicklingError(f"setting attribute {name!r} of scipy.sparse.csr_matrix is not "
                                             "allowed (the class is shared by every file read)")
            super().__setattr__(name, value)

    cls = _Frozen("csr_matrix", (csr_matrix,), {"__module__": __name__})
    cls._sealed = True
    return cls


class _PlanetoidUnpickler(pickle.Unpickler):
    """Rebuilds what Planetoid's ``ind.*`` pickles hold (Python 2 protocol): NumPy arrays,
    SciPy CSR matrices, lists and a ``defaultdict(list)``; any other global is refused."""

    _ALLOWED = {("collections", "defaultdict"), ("__builtin__", "list"), ("builtins", "list")}
    _CSR = {("scipy.sparse.csr", "csr_matrix"), ("scipy.sparse._csr", "csr_matrix"), ("scipy.sparse", "csr_matrix")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._CSR:
            return _csr_class()
        if (module, name) in _NUMPY_GLOBALS:  # arrays of booleans and numbers, from the bytes the file holds
            return _NUMPY_GLOBALS[module, name]
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a Planetoid file")
        return super().find_class(module, name)


# bytes of one ind.* file, read whole: far above the largest (PubMed's allx, about 40 MB), far below what a sparse
# file of a terabyte would fill memory with
_MAX_FILE_BYTES = 2**30


def _check_file_size(path: Path) -> None:
    """Refuse an ``ind.*`` file over :data:`_MAX_FILE_BYTES` before it is read whole: a sparse file of 10 GB (no
    disk space) filled 10 GB of memory with its zeros."""
    size = path.stat().st_size
    if size > _MAX_FILE_BYTES:
        raise CorruptDataError(f"corrupt Planetoid file {str(path)!r}: {size} B, more than any Planetoid file "
                               f"({_MAX_FILE_BYTES} B at most)")


def _unpickle_planetoid(path: Path) -> Any:
    _check_file_size(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return _plain(_PlanetoidUnpickler(io.BytesIO(path.read_bytes()), encoding="latin1").load())
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            LookupError, ImportError, MemoryError, OverflowError, UnicodeDecodeError) as err:
        # LookupError: KeyError, and ``_codecs.encode`` asked for an unknown codec
        raise CorruptDataError(f"corrupt Planetoid file {str(path)!r}: {type(err).__name__}: {err}") from None


# entries of a dense matrix built from the files: far above the largest Planetoid graph (CiteSeer's
# 3,327 x 3,703 features, 12.3M), far below what a doctored 500-byte sparse header could ask for
_MAX_DENSE_ENTRIES = 2**28


def _check_dense_size(path: Path, shape: tuple[int, ...], what: str) -> None:
    """Refuse a matrix whose dense form would take more than :data:`_MAX_DENSE_ENTRIES` entries."""
    entries = 1
    for n in shape:
        entries *= max(int(n), 0)
    if entries > _MAX_DENSE_ENTRIES:
        raise CorruptDataError(
            f"corrupt Planetoid file {str(path)!r}: {what} declares a {' x '.join(map(str, shape))} matrix "
            f"({entries} entries, {entries * 4 / 2**30:.1f} GiB as float32), more than any Planetoid "
            f"dataset (at most {_MAX_DENSE_ENTRIES} entries)")


def _planetoid_matrix(path: Path) -> Tensor:
    """A feature or one-hot label matrix (dense array or SciPy sparse) as a float tensor."""
    obj = _unpickle_planetoid(path)
    if hasattr(obj, "toarray") and hasattr(obj, "shape"):
        shape = obj.shape
        if not (isinstance(shape, tuple) and len(shape) == 2 and all(isinstance(n, numbers.Integral) for n in shape)):
            raise CorruptDataError(f"corrupt Planetoid file {str(path)!r}: a sparse matrix of shape {shape!r}")
        _check_dense_size(path, shape, "its sparse matrix")  # toarray() would allocate it all
        try:  # SciPy's toarray() trusts indptr and indices: out of range, it reads and writes past its buffers
            obj.check_format(full_check=True)
            obj = obj.toarray()
        except (ValueError, TypeError, IndexError, MemoryError, AttributeError) as err:  # AttributeError: no indptr
            raise CorruptDataError(f"corrupt Planetoid file {str(path)!r}: {type(err).__name__}: {err}") from None
    if not isinstance(obj, np.ndarray) or obj.ndim != 2 or obj.dtype.kind not in "biuf":
        what = f"{obj.dtype} array of shape {obj.shape}" if isinstance(obj, np.ndarray) else type(obj).__name__
        raise CorruptDataError(f"corrupt Planetoid file {str(path)!r}: expected a 2-D numeric matrix, got {what}")
    out = torch.from_numpy(np.asarray(obj, dtype=np.float32))
    if not bool(out.isfinite().all()):  # NaN features trained to NaN; a NaN label row read as class 0
        bad = (~out.isfinite()).nonzero()[0].tolist()
        raise CorruptDataError(f"corrupt Planetoid file {str(path)!r}: expected finite values, got "
                               f"{out[bad[0], bad[1]].item()} at row {bad[0]}, column {bad[1]}")
    return out


def _planetoid_graph(path: Path) -> dict[int, list[int]]:
    obj = _unpickle_planetoid(path)
    ok = isinstance(obj, dict) and all(
        isinstance(k, int) and isinstance(v, list) and all(isinstance(j, int) for j in v) for k, v in obj.items()
    )
    if not ok:
        raise CorruptDataError(f"corrupt Planetoid file {str(path)!r}: expected a dict of node -> list of neighbours, "
                               f"got {type(obj).__name__}")
    return obj


def _planetoid_index(path: Path) -> Tensor:
    _check_file_size(path)
    try:
        values = [int(line) for line in path.read_text().split()]
    except (ValueError, UnicodeDecodeError) as err:
        raise CorruptDataError(f"corrupt Planetoid file {str(path)!r}: expected one node index per line ({err})") from None
    if not values:
        raise CorruptDataError(f"corrupt Planetoid file {str(path)!r}: no node indices")
    if big := next((v for v in values if not -2**63 <= v < 2**63), None):  # torch.tensor: a bare ValueError
        raise CorruptDataError(f"corrupt Planetoid file {str(path)!r}: node index {big} does not fit in 64 bits")
    return torch.tensor(values, dtype=torch.long)


def read_planetoid(folder: str | Path, prefix: str) -> Any:
    """Read ``folder/ind.<prefix>.*`` into a PyG ``Data`` with the public split, without running code.

    The same result as ``torch_geometric.io.read_planetoid_data(folder, prefix)`` (features
    ``allx`` then ``tx`` reordered by ``test.index``; CiteSeer's isolated test nodes get zero
    rows; self-loops and duplicate edges removed), but the pickles are read by a restricted
    unpickler and checked for shape before use.

    Args:
        folder: the ``raw`` folder.
        prefix: ``"cora"``, ``"citeseer"`` or ``"pubmed"`` (NELL is not supported).

    Raises:
        CorruptDataError: (a ``ValueError``) a file that is truncated, not a Planetoid pickle,
            names a global other than the allowed array types, or has inconsistent sizes.
        ImportError: scipy (which reads the feature matrices) is not installed.
    """
    _import_pyg()
    from torch_geometric.data import Data
    from torch_geometric.io.planetoid import edge_index_from_dict
    from torch_geometric.utils import index_to_mask

    folder, prefix = Path(folder), prefix.lower()
    if prefix.startswith("nell"):
        raise ValueError("NELL is not supported by read_planetoid")
    # the feature matrices are pickled scipy CSR matrices; scipy is a dependency neither of this package nor of PyG:
    # without it, an ImportError naming it here, not every intact file called corrupt by the unpickler
    import_optional("scipy.sparse", package="scipy", dataset=prefix)
    f = {part: folder / f"ind.{prefix}.{part}" for part in PLANETOID_FILES}
    x, tx, allx, y, ty, ally = (_planetoid_matrix(f[p]) for p in ("x", "tx", "allx", "y", "ty", "ally"))
    graph = _planetoid_graph(f["graph"])
    test_index = _planetoid_index(f["test.index"])
    sizes = {p: tuple(t.shape) for p, t in zip(("x", "tx", "allx", "y", "ty", "ally"), (x, tx, allx, y, ty, ally))}
    feats, labels = {tx.size(1), allx.size(1), x.size(1)}, {ty.size(1), ally.size(1), y.size(1)}
    if len(feats) != 1 or len(labels) != 1 or allx.size(0) != ally.size(0) or tx.size(0) != ty.size(0) \
            or tx.size(0) != test_index.numel() or y.size(0) + 500 > ally.size(0):
        raise CorruptDataError(f"corrupt Planetoid files in {str(folder)!r} ({prefix}): inconsistent sizes {sizes} "
                               f"with {test_index.numel()} test indices")
    sorted_test_index = test_index.sort()[0]
    if prefix == "citeseer":  # isolated test nodes: zero rows where test.index has gaps
        lo = int(test_index.min())
        _check_dense_size(f["test.index"], (int(test_index.max()) - lo + 1, tx.size(1)), "its index range")
        tx_ext = torch.zeros(int(test_index.max()) - lo + 1, tx.size(1), dtype=tx.dtype)
        tx_ext[sorted_test_index - lo] = tx
        ty_ext = torch.zeros(tx_ext.size(0), ty.size(1), dtype=ty.dtype)
        ty_ext[sorted_test_index - lo] = ty
        tx, ty = tx_ext, ty_ext
    x = torch.cat([allx, tx], dim=0)
    N = x.size(0)
    node_ids = [*graph, *(j for v in graph.values() for j in v)]
    if int(test_index.min()) < 0 or int(test_index.max()) >= N or any(not 0 <= i < N for i in node_ids):
        raise CorruptDataError(f"corrupt Planetoid files in {str(folder)!r} ({prefix}): a node index is outside [0, {N})")
    if int(test_index.min()) < allx.size(0) or test_index.unique().numel() != test_index.numel():
        # a test node among allx's (train and val) nodes overwrote its features and sat in two masks; a repeated
        # one dropped a test row
        raise CorruptDataError(
            f"corrupt Planetoid file {str(f['test.index'])!r}: the test nodes must be distinct and follow the "
            f"{allx.size(0)} nodes of allx, got {test_index.numel() - test_index.unique().numel()} repeated and "
            f"a smallest index of {int(test_index.min())}")
    x[test_index] = x[sorted_test_index]
    y_all = torch.cat([ally, ty], dim=0).max(dim=1)[1]
    y_all[test_index] = y_all[sorted_test_index]
    data = Data(x=x, edge_index=edge_index_from_dict(graph, num_nodes=N), y=y_all)
    data.train_mask = index_to_mask(torch.arange(y.size(0)), size=N)
    data.val_mask = index_to_mask(torch.arange(y.size(0), y.size(0) + 500), size=N)
    data.test_mask = index_to_mask(test_index, size=N)
    return data


@register_dataset("cora", kind="node", needs_root=True)
def load_cora(*, root: Path | None, seed: int = 0, verify: bool = True, normalize_features: bool = True) -> NodeData:
    """Cora citation graph, public split (140/500/1,000), 1,433 features, 7 classes.

    Args:
        root: data root.
        seed: unused (the public split is fixed); accepted for a uniform interface.
        verify: check the raw files' SHA256.
        normalize_features: row-normalise the features (PyG's ``NormalizeFeatures``).
    """
    _check_flags("load_cora", verify=verify, normalize_features=normalize_features)
    return load_planetoid("Cora", root=root, verify=verify, normalize_features=normalize_features)


@register_dataset("citeseer", kind="node", needs_root=True)
def load_citeseer(*, root: Path | None, seed: int = 0, verify: bool = True, normalize_features: bool = True) -> NodeData:
    """CiteSeer citation graph, public split (120/500/1,000), 3,703 features, 6 classes.

    Args:
        root: data root.
        seed: unused (the public split is fixed); accepted for a uniform interface.
        verify: check the raw files' SHA256.
        normalize_features: row-normalise the features (PyG's ``NormalizeFeatures``).
    """
    _check_flags("load_citeseer", verify=verify, normalize_features=normalize_features)
    return load_planetoid("CiteSeer", root=root, verify=verify, normalize_features=normalize_features)
