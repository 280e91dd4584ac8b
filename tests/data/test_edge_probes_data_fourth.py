"""Edge-case probes of the file loaders, fourth pass: hostile or corrupt files under a data root (pickles that
declare memory they do not hold, TU tables whose ids PyG indexes unchecked, image zips, IDX headers, Planetoid
test indices), and loaded tensors against an independent reading of the same bytes.

Found and fixed (tests whose docstring starts with "Bug:"):

* CIFAR batches and Planetoid ``ind.*`` files: the allow-listed ``_reconstruct``/``ndarray``/``dtype`` let a pickle
  build an object array from a short list (NumPy read past it: a segmentation fault), allocate any declared shape
  (uninitialised memory as features, or gigabytes from a 200-byte file), and ``_codecs.encode(b, "hex")`` nested
  doubled a string at each level (``_unpickle.py``, used by cifar10.py and planetoid.py).
* TU zips: PyG indexes the tables unchecked: a node id of 0 wrapped to the last node, an id past the end or across
  graphs became an edge of another graph, nodes out of graph order were sliced into the wrong graphs, a graph id or
  node label of 10**9 allocated gigabytes, a missing last newline dropped the last edge (tu.py).
* Image zips: a ".jpg" entry was decoded as whatever Pillow recognised (EPS goes to Ghostscript, BMP/TIFF/...
  loaded), an entry declaring gigabytes was inflated whole, and many entries of a large first image gave a bare
  ``MemoryError`` naming no file (cifar10.py).
* MNIST: IDX images of 10 x 10 loaded as MNIST (docs: 28 x 28); an IDX header of 70 dimensions was a bare NumPy
  ``ValueError`` naming no file (mnist.py, idx.py).
* Planetoid: a repeated test index, or one among allx's nodes (a node in the train and the test mask, its features
  overwritten), loaded silently (planetoid.py).
"""

from __future__ import annotations

import codecs
import gzip
import io
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from diffusionformer.data import CorruptDataError, load_dataset
from diffusionformer.data.cifar10 import read_cifar_batch, read_image_zip
from diffusionformer.data.idx import parse_idx
from diffusionformer.data.planetoid import read_planetoid

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # NumPy 1
    from numpy.core.multiarray import _reconstruct

REPO = Path(__file__).resolve().parents[2]


class _Call:
    """Pickles as ``f(*args)`` (with ``state`` for BUILD when given): a hand-made hostile pickle."""

    def __init__(self, f, args, state=None):
        self.f, self.args, self.state = f, args, state

    def __reduce__(self):
        return (self.f, self.args) if self.state is None else (self.f, self.args, self.state)


# ------------------------------------------------------------------------------------------------ pickles


def test_bug_an_object_array_from_a_short_list_is_refused_not_a_segfault(tmp_path):
    """Bug: a CIFAR batch (or Planetoid file) whose array state says ``dtype('O')``, shape ``(5,)`` and gives a
    list of 2 made NumPy read past the list: the process died with a segmentation fault (run in a child here)."""
    obj = _Call(_reconstruct, (np.ndarray, (0,), b"b"), (1, (5,), np.dtype("O"), False, [1, 2]))
    (tmp_path / "data_batch_1").write_bytes(pickle.dumps({b"data": obj, b"labels": [0]}, protocol=2))
    (tmp_path / "ind.cora.x").write_bytes(pickle.dumps(obj, protocol=2))
    code = (
        "import sys\n"
        "from diffusionformer.data.cifar10 import read_cifar_batch\n"
        "from diffusionformer.data.planetoid import _planetoid_matrix\n"
        "from pathlib import Path\n"
        "for read, name in ((read_cifar_batch, 'data_batch_1'), (_planetoid_matrix, 'ind.cora.x')):\n"
        "    try:\n"
        "        read(Path(sys.argv[1]) / name)\n"
        "    except Exception as err:\n"
        "        print(type(err).__name__, err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, f"the reader crashed (rc {out.returncode}): {out.stderr[-500:]}"
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("CorruptDataError") for line in lines), out.stdout
    assert all("dtype('O') is not allowed" in line for line in lines), out.stdout


def test_bug_a_declared_array_shape_allocates_nothing(tmp_path):
    """Bug: ``_reconstruct(ndarray, (2, 3072), "B")`` with no state (or ``ndarray((3, 3072), uint8)`` called
    directly) loaded as a CIFAR batch of uninitialised memory from a 176-byte file (10**6 rows: 3 GB, touched by the
    copy); a Planetoid feature matrix built so held heap garbage (values like -2.7e23)."""
    cases = {
        "reconstruct": _Call(_reconstruct, (np.ndarray, (2, 3072), b"B")),
        "ndarray": _Call(np.ndarray, ((2, 3072), np.dtype("u1"))),
    }
    for name, data in cases.items():
        path = tmp_path / f"batch_{name}"
        path.write_bytes(pickle.dumps({b"data": data, b"labels": [0, 1]}, protocol=2))
        with pytest.raises(CorruptDataError, match=r"corrupt CIFAR batch .*(_reconstruct\(ndarray, \(2, 3072\), "
                                                   r"\.\.\.\)|calling numpy\.ndarray) is not allowed"):
            read_cifar_batch(path)


def test_bug_a_doubling_codec_chain_is_refused(tmp_path, writers):
    """Bug: the allowed ``_codecs.encode`` took any codec: ``encode(b, "hex")`` nested 20 times turned one byte of a
    300-byte file into 1 MB (36 times: 64 GB); only ``encode(str, "latin1")``, what Python 3 writes, is allowed."""
    obj = b"\x00"
    for _ in range(20):
        obj = _Call(codecs.encode, (obj, "hex"))
    raw = pickle.dumps(obj, protocol=2)
    assert len(raw) < 400
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": obj, b"labels": [0]}, protocol=2))
    with pytest.raises(CorruptDataError, match=r"_codecs\.encode\(bytes, 'hex'\) is not allowed"):
        read_cifar_batch(path)
    raw_dir = writers.write_planetoid_layout(tmp_path)
    (raw_dir / "ind.cora.x").write_bytes(raw)
    with pytest.raises(CorruptDataError, match=r"ind\.cora\.x'.*_codecs\.encode\(bytes, 'hex'\) is not allowed"):
        read_planetoid(raw_dir, "cora")


def test_real_format_pickles_still_load_and_match_the_arrays(tmp_path, writers):
    """Protocol 2 (Python 3 bytes via ``_codecs.encode``) and 4: arrays and numpy scalars come back equal (the
    shared Planetoid writer's CSR matrices and one-hot arrays load too)."""
    data = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    for protocol in (2, 4):
        path = tmp_path / f"b{protocol}"
        path.write_bytes(pickle.dumps({b"data": data, b"labels": np.array([3, np.int64(7)])}, protocol=protocol))
        images, labels = read_cifar_batch(path)
        assert torch.equal(images, torch.from_numpy(data.reshape(2, 3, 32, 32))) and labels.tolist() == [3, 7]
    raw = writers.write_planetoid_layout(tmp_path / "p")
    d = read_planetoid(raw, "cora")
    assert d.num_nodes == 540 and int(d.test_mask.sum()) == 20


# ------------------------------------------------------------------------------------------------ TU tables


def _tu_root(tmp_path, writers, edit=None, **kwargs):
    """A data root with ``tudataset/MUTAG.zip`` from the shared writer, its tables edited by ``edit(tables)``."""
    path = writers.write_tu_zip(tmp_path / "tudataset" / "MUTAG.zip", "MUTAG", **kwargs)
    with zipfile.ZipFile(path) as zf:
        tables = {n: zf.read(n).decode() for n in zf.namelist()}
    if edit is not None:
        edit(tables)
    with zipfile.ZipFile(path, "w") as zf:
        for n, text in tables.items():
            zf.writestr(n, text)
    return tmp_path


def _lines(tables, part, change):
    key = f"MUTAG//MUTAG_{part}.txt"
    lines = tables[key].strip().split("\n")
    change(lines)
    tables[key] = "\n".join(lines) + "\n"


def _set(i, value):
    def change(lines):
        lines[i] = value
    return change


_TU_CASES = {
    # node id 0 (PyG: -1, the last node), past the end, across graphs
    "id-zero": ("A", _set(0, "0, 1"), r"line 1 of MUTAG_A\.txt is the edge \(0, 1\): node ids must lie in \[1, 70\]"),
    "id-past-end": ("A", _set(-1, "1, 71"), r"line 120 of MUTAG_A\.txt is the edge \(1, 71\)"),
    "across-graphs": ("A", _set(0, "1, 5"), r"line 1 of MUTAG_A\.txt joins node 1 of graph 1 to node 5 of graph 2"),
    # nodes out of graph order (PyG slices by counts), a gap of ids (bincount of 10**7), labels one short / long
    "out-of-order": ("graph_indicator", lambda l: l.__setitem__(slice(0, 6), [l[5], *l[1:5], l[0]]),
                     r"line 1 of MUTAG_graph_indicator\.txt gives graph 2 first"),
    "graph-id-gap": ("graph_indicator", _set(-1, str(10**7)),
                     r"line 70 of MUTAG_graph_indicator\.txt gives graph 10000000 after graph 20"),
    "labels-long": ("graph_labels", lambda l: l.append("1"), r"MUTAG_graph_labels\.txt has 21 lines for the 20 graphs"),
    "node-labels-short": ("node_labels", lambda l: l.pop(), r"MUTAG_node_labels\.txt has 69 lines, expected one per "),
    "node-label-huge": ("node_labels", _set(-1, str(10**5)),
                        r"labels of MUTAG_node_labels\.txt span 100001 values: their one-hot matrix would have 70 x"),
}


@pytest.mark.parametrize("case", list(_TU_CASES))
def test_bug_tu_tables_that_pyg_would_index_unchecked_are_named(tmp_path, writers, monkeypatch, case):
    """Bug: PyG's ``read_tu_data`` indexes with the tables' values unchecked: node id 0 became an edge to the last
    node, an id past the end or into another graph an edge of another graph (or beyond its own), nodes listed out
    of graph order were cut into the wrong graphs (edge ids -3), an extra graph label was dropped, all silently; a
    short table was a bare "start (66) + length (4) exceeds dimension size"; a graph id of 10**9 allocated an 8 GB
    count and a node label of 10**8 a 28 GB one-hot matrix. (The one-hot cap is lowered here to keep it small.)"""
    from diffusionformer.data import tu

    monkeypatch.setattr(tu, "_MAX_ONE_HOT", 10**6, raising=False)
    part, change, message = _TU_CASES[case]
    root = _tu_root(tmp_path, writers, lambda tables: _lines(tables, part, change))
    with pytest.raises(CorruptDataError, match=r"MUTAG\.zip'.*" + message):
        load_dataset("mutag", root=root, verify=False)


def test_bug_a_tu_table_without_its_last_newline_keeps_its_last_line(tmp_path, writers):
    """Bug: PyG reads ``text.split("\\n")[:-1]``: an ``_A.txt`` without a final newline lost its last edge without a
    word. Reference: the edges of the last graph read from the zip by hand."""
    def strip(tables):
        tables["MUTAG//MUTAG_A.txt"] = tables["MUTAG//MUTAG_A.txt"].rstrip("\n")

    data = load_dataset("mutag", root=_tu_root(tmp_path, writers, strip), verify=False)
    with zipfile.ZipFile(tmp_path / "tudataset" / "MUTAG.zip") as zf:
        edges = [tuple(int(v) for v in line.split(",")) for line in zf.read("MUTAG//MUTAG_A.txt").decode().split("\n")]
        indicator = [int(v) for v in zf.read("MUTAG//MUTAG_graph_indicator.txt").decode().split()]
    last = indicator[-1]
    first_node = indicator.index(last) + 1
    want = sorted((a - first_node, b - first_node) for a, b in edges if indicator[a - 1] == last)
    g = data.dataset[len(data.dataset) - 1]
    assert sorted(map(tuple, g.edge_index.t().tolist())) == want and len(want) == 6


def test_tu_graphs_match_an_independent_reading_of_the_zip(tmp_path, writers):
    """Every graph's edges, node count and label against the zip's tables read by hand (labels ranked as PyG)."""
    data = load_dataset("mutag", root=_tu_root(tmp_path, writers), verify=False, node_features="constant")
    with zipfile.ZipFile(tmp_path / "tudataset" / "MUTAG.zip") as zf:
        def read(part):
            return zf.read(f"MUTAG//MUTAG_{part}.txt").decode().split("\n")[:-1]
        edges = [tuple(int(v) for v in line.split(",")) for line in read("A")]
        indicator = [int(v) for v in read("graph_indicator")]
        labels = [int(v) for v in read("graph_labels")]
    ranks = {v: i for i, v in enumerate(sorted(set(labels)))}
    for gid in range(1, max(indicator) + 1):
        nodes = [i + 1 for i, g in enumerate(indicator) if g == gid]
        want = sorted((a - nodes[0], b - nodes[0]) for a, b in edges if indicator[a - 1] == gid)
        g = data.dataset[gid - 1]
        assert g.num_nodes == len(nodes) and sorted(map(tuple, g.edge_index.t().tolist())) == want
        assert int(g.y) == ranks[labels[gid - 1]]


# ------------------------------------------------------------------------------------------------ image zips


def _image(fmt: str, size: int = 32) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), (200, 10, 10)).save(buf, format=fmt)
    return buf.getvalue()


_EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 32 32\nnewpath 0 0 moveto 32 32 lineto stroke\nshowpage\n"


@pytest.mark.parametrize("content", [_EPS, "BMP", "TIFF"], ids=["eps", "bmp", "tiff"])
def test_bug_a_jpg_entry_is_decoded_as_jpeg_or_png_only(tmp_path, writers, content):
    """Bug: Pillow picks the decoder from the content, not the name: a ``0.jpg`` holding EPS was handed to
    Ghostscript (run when installed; "Unable to locate Ghostscript" here) and BMP or TIFF entries loaded."""
    raw = content if isinstance(content, bytes) else _image(content)
    path = writers.write_stored_zip(tmp_path / "train.zip", [("train/cat/0.jpg", raw)])
    with pytest.raises(CorruptDataError, match=r"cannot decode 'train/cat/0\.jpg' as JPEG or PNG: not such an image"):
        read_image_zip(path, "train")


def test_bug_an_image_entry_declaring_more_than_the_cap_is_not_inflated(tmp_path, monkeypatch):
    """Bug: ``zf.read`` inflated an entry whole: a small zip of a deflated multi-GB "0.jpg" (deflate packs zeros about
    1000:1) filled memory before Pillow said "cannot identify". The cap is lowered here to keep the file small."""
    from diffusionformer.data import cifar10

    assert cifar10._MAX_IMAGE_BYTES >= 2**28
    monkeypatch.setattr(cifar10, "_MAX_IMAGE_BYTES", 10_000, raising=False)
    path = tmp_path / "train.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("train/cat/0.jpg", bytes(20_000))
    assert path.stat().st_size < 1000
    with pytest.raises(CorruptDataError, match=r"'train/cat/0\.jpg' declares 20000 B uncompressed, more than any image"):
        read_image_zip(path, "train")


def test_bug_many_entries_of_a_large_first_image_name_the_zip(tmp_path, writers):
    """Bug: a 6000 x 6000 PNG (120 kB) followed by 19,999 one-byte entries made ``np.empty`` ask for 1.96 TiB: a
    bare ``MemoryError`` naming no file."""
    entries = [("train/cat/00000.png", _image("PNG", 6000))]
    entries += [(f"train/cat/{i:05d}.png", b"x") for i in range(1, 20_000)]
    path = writers.write_stored_zip(tmp_path / "train.zip", entries)
    with pytest.raises(CorruptDataError, match=r"train\.zip'.*20000 images of 'train/cat/00000\.png''s size \(6000 x "
                                               r"6000\) do not fit in memory"):
        read_image_zip(path, "train")


# ------------------------------------------------------------------------------------------------ MNIST / IDX


def test_bug_mnist_images_of_another_size_name_the_file(tmp_path, writers):
    """Bug: IDX image files of 10 x 10 loaded as MNIST (``input_shape`` (1, 10, 10); the docs say 28 x 28); a test
    file of 10 x 10 beside 28 x 28 training images failed in the container naming no file."""
    arrays = writers.write_mnist_layout(tmp_path)
    raw = tmp_path / "mnist" / "MNIST" / "raw"
    writers.write_idx_gz(raw / "t10k-images-idx3-ubyte.gz", arrays["test_images"][:, :10, :10].copy())
    with pytest.raises(CorruptDataError, match=r"mnist: '.*t10k-images-idx3-ubyte\.gz' holds images of shape "
                                               r"\(20, 10, 10\), expected \(N, 28, 28\)"):
        load_dataset("mnist", root=tmp_path, verify=False)


def test_bug_an_idx_header_of_too_many_dimensions_names_the_file():
    """Bug: an IDX header of 70 dimensions (all of size 1) was NumPy's bare "maximum supported dimension" ValueError,
    not a ``CorruptDataError`` naming the file."""
    raw = bytes([0, 0, 8, 70]) + struct.pack(">70I", *[1] * 70) + b"\x07"
    with pytest.raises(CorruptDataError, match=r"^images\.idx: IDX header declares 70 dimensions"):
        parse_idx(raw, source="images.idx")


@pytest.mark.parametrize("code,fmt", [(0x09, "b"), (0x0B, "h"), (0x0C, "i"), (0x0D, "f"), (0x0E, "d")])
def test_idx_values_match_struct(code, fmt):
    """Every IDX type against ``struct`` big-endian unpacking of the same bytes (sign, NaN and inf included)."""
    values = [-3, 0, 5, 100] if fmt in "bhi" else [-1.5, float("nan"), float("inf"), 3.25]
    raw = bytes([0, 0, code, 2]) + struct.pack(">2I", 2, 2) + struct.pack(f">4{fmt}", *values)
    got = parse_idx(raw).flatten().tolist()
    want = list(struct.unpack(f">4{fmt}", raw[12:]))
    assert np.array_equal(np.array(got), np.array(want), equal_nan=True)


def test_real_mnist_test_images_match_a_numpy_reading(real_root):
    """The staged t10k images and labels against ``gzip`` + ``np.frombuffer`` of the same file."""
    from diffusionformer.data.idx import read_idx

    path = real_root / "mnist" / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz"
    raw = gzip.decompress(path.read_bytes())
    n, h, w = struct.unpack(">3I", raw[4:16])
    want = np.frombuffer(raw, np.uint8, offset=16).reshape(n, h, w)
    assert (n, h, w) == (10000, 28, 28) and np.array_equal(read_idx(path).numpy(), want)


# ------------------------------------------------------------------------------------------------ Planetoid


@pytest.mark.parametrize("case", ["repeated", "among-allx"])
def test_bug_planetoid_test_indices_must_be_new_distinct_nodes(tmp_path, writers, case):
    """Bug: a ``test.index`` naming node 5 (one of allx's training nodes) put it in the train and the test mask
    with a test row's features; a repeated index dropped a test row (19 test nodes); both loaded silently."""
    raw = writers.write_planetoid_layout(tmp_path)
    path = raw / "ind.cora.test.index"
    lines = path.read_text().split()
    lines[0] = lines[1] if case == "repeated" else "5"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptDataError, match=r"ind\.cora\.test\.index'.*test nodes must be distinct and follow the "
                                               r"520 nodes of allx"):
        read_planetoid(raw, "cora")


def test_bug_an_empty_mnist_training_file_is_named(tmp_path, writers):
    """Bug: MNIST files with no training examples (an empty IDX pair) failed in the split with "val_size must be in
    [0, 0)", naming no file; the loader now names the training files. (No test examples still load.)"""
    from diffusionformer.data import load_dataset
    from diffusionformer.data.paths import CorruptDataError

    writers.write_mnist_layout(tmp_path, n_train=0, n_test=3)
    with pytest.raises(CorruptDataError, match=r"mnist: '.*train-images.*' and '.*train-labels.*' hold no training"):
        load_dataset("mnist", root=tmp_path, verify=False, val_size=0)


@pytest.mark.parametrize("text", ["", "x"])
def test_bug_a_near_empty_tinyshakespeare_file_is_named(tmp_path, text):
    """Bug: an empty (or one-character) ``tinyshakespeare/input.txt`` read with ``verify=False`` failed with "text
    must have at least 2 characters", naming no file; it is now a CorruptDataError naming the path."""
    from diffusionformer.data import load_dataset
    from diffusionformer.data.paths import CorruptDataError

    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text(text)
    with pytest.raises(CorruptDataError, match=rf"tinyshakespeare: '.*input\.txt' holds {len(text)} character"):
        load_dataset("tinyshakespeare", root=tmp_path, verify=False)
    (tmp_path / "tinyshakespeare" / "input.txt").write_text("ab" * 10)
    assert load_dataset("tinyshakespeare", root=tmp_path, verify=False).vocab_size == 2
