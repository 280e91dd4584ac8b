"""Writers of SMALL files in the benchmark formats, to test the readers without the real data."""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    """IDX encoding of ``array`` (uint8 by default): magic, big-endian sizes, big-endian values."""
    dtype = {0x08: ">u1", 0x0C: ">i4", 0x0D: ">f4"}[type_code]
    header = struct.pack(">I", (type_code << 8) | array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array, dtype=dtype).tobytes()


def write_idx_gz(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(idx_bytes(array)))
    return path


def write_mnist_layout(
    root: Path, n_train: int = 40, n_test: int = 20, *, official: bool = False, seed: int = 0
) -> dict[str, np.ndarray]:
    """A tiny MNIST in the staged layout (train images rebuilt) or the official one."""
    rng = np.random.default_rng(seed)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_labels": (np.arange(n_train) % 10).astype(np.uint8),
        "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_labels": (np.arange(n_test) % 10).astype(np.uint8),
    }
    raw = root / "mnist" / "MNIST" / "raw"
    write_idx_gz(raw / "train-labels-idx1-ubyte.gz", arrays["train_labels"])
    write_idx_gz(raw / "t10k-images-idx3-ubyte.gz", arrays["test_images"])
    write_idx_gz(raw / "t10k-labels-idx1-ubyte.gz", arrays["test_labels"])
    if official:
        write_idx_gz(raw / "train-images-idx3-ubyte.gz", arrays["train_images"])
    else:
        write_idx_gz(
            root / "mnist_train_reconstructed" / "train-images-idx3-ubyte.gz",
            arrays["train_images"],
        )
    return arrays


CLASS_COLOURS = {"cat": (220, 30, 30), "airplane": (30, 30, 220), "dog": (30, 200, 30)}


def jpeg_bytes(colour: tuple[int, int, int], size: int = 32) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def write_stored_zip(path: Path, entries) -> Path:
    """A stored zip of ``(name, bytes or text)`` entries, in the order given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in entries:
            zf.writestr(name, data)
    return path


def write_image_zip(path: Path, split: str, per_class: int = 3) -> Path:
    """``<split>/<class>/NNNN.jpg`` solid-colour JPEGs, classes listed out of sorted order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, colour in CLASS_COLOURS.items():
            for i in range(per_class):
                zf.writestr(f"{split}/{name}/{i:04d}.jpg", jpeg_bytes(colour))
        zf.writestr(f"{split}/README.txt", "not an image")  # ignored: wrong depth
    return path


def write_cifar_batches(folder: Path, per_batch: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    """Official-format python batches (pickled dicts with bytes keys), tiny."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = list(rng.integers(0, 10, per_batch).tolist())
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"x"}, f, protocol=2)
        out[name] = data
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer"]
    names += [b"dog", b"frog", b"horse", b"ship", b"truck"]
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": names, b"num_vis": 3072}, f, protocol=2)
    return out


def write_tu_zip(
    path: Path, name: str, graphs_per_class: int = 10, *, node_labels: bool = True
) -> Path:
    """A TU archive with paths ``<name>//<name>_*.txt`` (as the official zips), two classes.

    Class 0 graphs are triangles, class 1 graphs are 4-node paths.
    """
    edges, indicator, glabels, nlabels = [], [], [], []
    node = 1
    for g in range(2 * graphs_per_class):
        label = g % 2
        n = 3 if label == 0 else 4
        ids = list(range(node, node + n))
        pairs = [(0, 1), (1, 2), (2, 0)] if label == 0 else [(0, 1), (1, 2), (2, 3)]
        for a, b in pairs:
            edges += [(ids[a], ids[b]), (ids[b], ids[a])]
        indicator += [g + 1] * n
        nlabels += [(k + label) % 3 for k in range(n)]
        glabels.append(1 if label == 0 else -1)
        node += n
    files = {
        f"{name}_A.txt": "\n".join(f"{a}, {b}" for a, b in edges),
        f"{name}_graph_indicator.txt": "\n".join(map(str, indicator)),
        f"{name}_graph_labels.txt": "\n".join(map(str, glabels)),
    }
    if node_labels:
        files[f"{name}_node_labels.txt"] = "\n".join(map(str, nlabels))
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for fname, text in files.items():
            zf.writestr(f"{name}//{fname}", text + "\n")
        zf.writestr(f"{name}//README.txt", "tiny generated TU dataset\n")
    return path


def write_planetoid_layout(root: Path, name: str = "Cora", *, num_train: int = 14, num_test: int = 20,
                           num_features: int = 9, num_classes: int = 3, gap: bool = False, seed: int = 0) -> Path:
    """A tiny, valid Planetoid ``raw`` folder under ``root/planetoid/<name>/raw`` in the original
    format: Python-2-protocol pickles of SciPy CSR features, one-hot label arrays and a
    ``defaultdict(list)`` graph, and ``test.index`` as text. ``allx`` covers ``num_train + 500 +
    extra`` nodes (the public split takes 500 validation nodes after the training ones); with
    ``gap`` the test indices skip one node (CiteSeer's isolated nodes)."""
    import collections

    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    num_all = num_train + 500 + 6
    span = num_test + 1 if gap else num_test
    test_index = num_all + rng.permutation(span)[:num_test]
    N = num_all + span

    def onehot(n: int) -> np.ndarray:
        return np.eye(num_classes, dtype=np.int32)[rng.integers(0, num_classes, n)]

    def feats(n: int) -> sp.csr_matrix:
        return sp.csr_matrix((rng.random((n, num_features)) < 0.3).astype(np.float32))

    ally = onehot(num_all)
    graph = collections.defaultdict(list)
    for _ in range(3 * N):
        i, j = (int(v) for v in rng.integers(0, N, 2))
        graph[i].append(j)
        graph[j].append(i)
    allx = feats(num_all)
    parts = {"x": allx[:num_train], "y": ally[:num_train], "allx": allx, "ally": ally,
             "tx": feats(num_test), "ty": onehot(num_test), "graph": graph}
    raw = root / "planetoid" / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for part, obj in parts.items():
        (raw / f"ind.{name.lower()}.{part}").write_bytes(pickle.dumps(obj, protocol=2))
    (raw / f"ind.{name.lower()}.test.index").write_text("".join(f"{int(i)}\n" for i in test_index))
    return raw
