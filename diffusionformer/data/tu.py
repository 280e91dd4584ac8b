"""Graph classification benchmarks of the TU collection (Morris et al., "TUDataset: A
collection of benchmark datasets for learning with graphs", 2020).

Read from the official zips ``<root>/tudataset/<NAME>.zip`` (entries ``<NAME>/<NAME>_A.txt``,
``_graph_indicator``, ``_graph_labels``, optional ``_node_labels``, ...). The zip is checked,
unzipped with its inner folder flattened into ``$DIFFUSIONFORMER_CACHE/tudataset/<NAME>/raw/``
and read by ``torch_geometric.datasets.TUDataset``, which writes ``processed/`` there.

Edge labels become PyG's one-hot ``edge_attr`` (MUTAG, PTC_MR; continuous edge attributes are not
read). PyG merges duplicate lines of ``_A.txt`` and sums their labels' one-hot rows, so an archive
with edge labels that lists an edge twice is refused (``CorruptDataError`` naming both lines);
duplicate edges without labels (IMDB-BINARY and IMDB-MULTI list every edge twice) are merged
into one edge, and self-loops are dropped, as PyG does.

Node features (option ``node_features``):

* ``"auto"`` (default): PyG's features (one-hot node labels; with ``use_node_attr`` also the
  continuous attributes) when the dataset has any, else the one-hot node degree
  (``OneHotDegree(max_degree)``, ``max_degree`` measured over the whole dataset, as in GIN,
  Xu et al. 2019). IMDB-BINARY and IMDB-MULTI have no node features and get degrees;
* ``"degree"``: always the one-hot degree (appended to existing features);
* ``"constant"``: a single feature 1.0 for every node (replacing existing features).

Split: seeded stratified 80/10/10 over graphs (each class keeps its share in every part);
with ``fold`` set, fold ``fold`` of a seeded stratified ``num_folds``-fold partition is the
test part and the other folds are split into train and val (``val_fraction`` of each class):
k-fold cross-validation with an inner holdout for model selection
(:func:`~diffusionformer.data.splits.stratified_kfold_split`). In an experiment config, a
task's ``folds = K`` sets both from the run's seed.
"""

from __future__ import annotations

import math
import numbers
import shutil
import tempfile
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any

import torch

from .._files import folder_lock, zip_method_refusal
from .._imports import _import_pyg
from .._warnings import user_stacklevel
from .base import GraphSetData, _check_flags
from .checksums import _check_size, _check_unchanged, sha256_file, verify_file
from .paths import CorruptDataError, cache_dir, drop_unsafe_processed, require_files
from .registry import register_dataset
from .splits import require_heldout, stratified_kfold_split, stratified_split

__all__ = ["TU_DATASETS", "extract_tu_zip", "load_tu"]

#: registry name -> the TU name (zip stem and file prefix).
TU_DATASETS = {
    "mutag": "MUTAG",
    "proteins": "PROTEINS",
    "enzymes": "ENZYMES",
    "nci1": "NCI1",
    "nci109": "NCI109",
    "imdb-binary": "IMDB-BINARY",
    "imdb-multi": "IMDB-MULTI",
    "ptc_mr": "PTC_MR",
}
_MARKER = ".source_sha256"
# uncompressed bytes of one archive's entries: 200x the largest here (IMDB-MULTI, 4.8 MB)
_MAX_UNZIPPED = 2**30


def extract_tu_zip(zip_path: Path, name: str, raw_dir: Path, digest: str) -> Path:
    """Unzip ``<name>/<name>_*.txt`` entries flat into ``raw_dir`` (skipped if done for ``digest``).

    Files are written to a temporary folder and moved into place, and ``raw_dir`` records
    the zip's SHA256, so a changed zip is re-extracted and a half-done extraction is redone;
    it records the extracted tables' SHA256 too, so a table changed or removed since (PyG
    reads them unchecked) is extracted again, with a ``UserWarning``.

    Raises:
        FileNotFoundError: ``zip_path`` does not exist.
        CorruptDataError: not a zip (a folder included), no ``<name>_A.txt``/``<name>_graph_indicator.txt``/
            ``<name>_graph_labels.txt`` inside, an empty ``<name>_A.txt``, two entries of one name (in
            different folders), an entry compressed with bzip2 or LZMA (zipfile inflates them without a
            bound), or tables that do not fit together (see :func:`_check_tu_tables`; an edge
            listed twice when the edges carry labels included).
    """
    marker = raw_dir / _MARKER
    if marker.is_file():
        # a damaged marker (not UTF-8: a bare UnicodeDecodeError) names no digest: extracted again
        recorded, _, tables = marker.read_text(encoding="utf-8", errors="replace").partition("\n")
        if recorded.strip() == digest:
            if tables == _tables_listing(raw_dir):
                return raw_dir
            if tables:  # a marker of an older version lists no tables: extracted again, without a word
                # PyG reads raw/ unchecked whenever processed/ is rebuilt: an edited table was loaded as is, a
                # removed one made PyG try to download the dataset
                warnings.warn(f"cached file refused and rebuilt: {str(raw_dir)!r}: the tables extracted from "
                              f"{str(zip_path)!r} changed or were removed since", UserWarning,
                              stacklevel=user_stacklevel())
    raw_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=raw_dir.parent, prefix=".extract-"))
    try:
        try:
            with zipfile.ZipFile(zip_path) as zf:
                wanted = []
                for info in zf.infolist():
                    base = info.filename.rstrip("/").split("/")[-1]
                    if info.is_dir() or not base.startswith(f"{name}_"):
                        continue  # skip folders, README.txt and anything unexpected
                    if base == f"{name}_graph_attributes.txt":  # PyG would take these regression values as the
                        continue  # targets in place of graph_labels: float "labels" no classification split takes
                    wanted.append((info, base))
                seen: dict[str, str] = {}
                for info, base in wanted:  # flattened by name: a second MUTAG_A.txt (another folder) overwrote the first
                    if base in seen:
                        raise CorruptDataError(f"corrupt zip archive {str(zip_path)!r}: two entries named {base} "
                                               f"({seen[base]!r} and {info.filename!r}); a TU archive holds one each")
                    seen[base] = info.filename
                declared = sum(info.file_size for info, _ in wanted)
                if declared > _MAX_UNZIPPED:  # a small zip of a huge deflated file: refused before writing
                    raise CorruptDataError(
                        f"corrupt zip archive {str(zip_path)!r}: its {name}_* entries declare {declared} B "
                        f"uncompressed, more than any TU dataset ({_MAX_UNZIPPED} B at most)")
                for info, _ in wanted:  # zipfile inflates a bzip2 or LZMA entry whole, whatever size it declares
                    if refused := zip_method_refusal(info):
                        raise CorruptDataError(f"corrupt zip archive {str(zip_path)!r}: {refused}")
                for info, base in wanted:  # streamed: never a whole entry in memory
                    with zf.open(info) as src, open(tmp / base, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
        except (FileNotFoundError, PermissionError, CorruptDataError):
            # a missing or unreadable path (or an unwritable cache), not a damaged archive; or refused above already
            raise
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, OSError, RuntimeError,
                ValueError) as err:
            # zlib.error/EOFError: a damaged or cut deflate stream; NotImplementedError: an
            # unknown compression method or zip version; RuntimeError: an encrypted entry; ValueError: an entry
            # name flagged UTF-8 that is not (UnicodeDecodeError), a header offset before the archive's start
            raise CorruptDataError(f"corrupt zip archive {str(zip_path)!r}: {err}") from None
        required = [f"{name}_A.txt", f"{name}_graph_indicator.txt", f"{name}_graph_labels.txt"]
        missing = [f for f in required if not (tmp / f).is_file()]
        if missing:
            raise CorruptDataError(
                f"{str(zip_path)!r} is not a TU dataset archive for {name}: missing "
                f"{', '.join(missing)} (expected entries {name}/{name}_A.txt, ...)"
            )
        if not (tmp / f"{name}_A.txt").read_bytes().strip():  # PyG fails on it with an IndexError
            raise CorruptDataError(
                f"{str(zip_path)!r}: {name}_A.txt is empty (a TU dataset lists its edges there)"
            )
        _check_tu_tables(tmp, name, zip_path)
        for old in raw_dir.iterdir():
            if old.is_file():
                old.unlink()
        # processed/ from another version of the zip is stale: removed before the marker is written, so a run
        # killed in between redoes the extraction rather than keep the old graphs
        processed = raw_dir.parent / "processed"
        if processed.is_dir():
            shutil.rmtree(processed)
        for f in tmp.iterdir():
            f.replace(raw_dir / f.name)
        marker.write_text(f"{digest}\n{_tables_listing(raw_dir)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return raw_dir


def _tables_listing(raw_dir: Path) -> str:
    """``"<sha256> <name>"`` lines of the files in ``raw_dir`` but the marker, sorted: what the marker records
    after an extraction, and what must still be there for the extraction to be reused."""
    return "".join(f"{sha256_file(f)} {f.name}\n" for f in sorted(raw_dir.iterdir())
                   if f.name != _MARKER and f.is_file())


# entries of a one-hot label matrix PyG builds from a label column (nodes x label span); the largest here is
# NCI1's 122,747 x 37 = 4.5M
_MAX_ONE_HOT = 2**28


def _tu_lines(path: Path, zip_path: Path) -> list[str]:
    """The lines of an extracted TU table, a missing last newline added to the file (PyG's reader drops the
    text after the last newline: the last edge or label would be lost without a word)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CorruptDataError(f"{str(zip_path)!r}: {path.name} is not text ({err})") from None
    if text and not text.endswith("\n"):
        text += "\n"
        path.write_text(text, encoding="utf-8")
    return text.split("\n")[:-1]


def _tu_ints(path: Path, zip_path: Path, columns: int | None = 1) -> list[list[int]]:
    """The rows of integers of an extracted TU table (``columns`` per row, or the first row's count)."""
    return _tu_rows(path, zip_path, int, columns)


def _tu_floats(path: Path, zip_path: Path) -> None:
    """Check the rows of an extracted attribute table: finite numbers separated by commas, as many on every line
    (PyG reads them unchecked: a word failed with a bare "could not convert string to float", a short line with
    "expected sequence of length", and NaN or inf became features without a word)."""
    _tu_rows(path, zip_path, float, None)


def _tu_rows(path: Path, zip_path: Path, kind: type, columns: int | None) -> list[list[Any]]:
    """The rows of ``kind`` (``int``: integers; ``float``: finite numbers) of an extracted TU table, ``columns``
    per row (or the first row's count); a line that does not fit is named."""
    what = "integers" if kind is int else "numbers"
    rows = []
    for i, line in enumerate(_tu_lines(path, zip_path), 1):
        try:
            row = [kind(v) for v in line.split(",")]
        except ValueError:
            raise CorruptDataError(f"{str(zip_path)!r}: line {i} of {path.name} is {line!r}, expected {what} "
                                   f"separated by commas") from None
        columns = len(row) if columns is None else columns
        if len(row) != columns:
            raise CorruptDataError(f"{str(zip_path)!r}: line {i} of {path.name} is {line!r}, expected {columns} "
                                   f"value(s) like the other lines")
        if kind is int and not all(-2**63 <= v < 2**63 for v in row):  # PyG's torch.tensor: a bare "Overflow"
            raise CorruptDataError(f"{str(zip_path)!r}: line {i} of {path.name} is {line!r}, expected integers "
                                   f"of 64 bits")
        if kind is float and not all(math.isfinite(v) for v in row):
            raise CorruptDataError(f"{str(zip_path)!r}: line {i} of {path.name} is {line!r}, expected finite "
                                   f"numbers (no NaN or inf)")
        rows.append(row)
    return rows


def _check_tu_tables(folder: Path, name: str, zip_path: Path) -> None:
    """Check the extracted tables before PyG reads them: PyG indexes with their values unchecked, so a node
    id of 0 wrapped to the last node, an id past the end or across graphs became an edge of another graph (or
    an index beyond its graph), nodes listed out of graph order were sliced into the wrong graphs, a graph id
    of 10**9 allocated a count per id, and a node label of 10**9 a one-hot matrix of that width.

    Raises:
        CorruptDataError: naming the archive, the table and the line; also an edge listed twice in ``_A.txt``
            when the edges carry labels (PyG would sum them).
    """
    def table(part: str) -> Path:
        return folder / f"{name}_{part}.txt"

    indicator = [r[0] for r in _tu_ints(table("graph_indicator"), zip_path)]
    N = len(indicator)
    for i, (prev, g) in enumerate(zip([0, *indicator], indicator), 1):
        if g not in (prev, prev + 1) or g < 1:
            after = f"after graph {prev}" if i > 1 else "first"
            raise CorruptDataError(
                f"{str(zip_path)!r}: line {i} of {name}_graph_indicator.txt gives graph {g} {after}: the nodes of a "
                f"graph must be listed together and graphs numbered 1, 2, ... without gaps")
    G = indicator[-1] if indicator else 0
    labels = _tu_ints(table("graph_labels"), zip_path)
    if len(labels) != G:
        raise CorruptDataError(f"{str(zip_path)!r}: {name}_graph_labels.txt has {len(labels)} lines for the {G} "
                               f"graphs of {name}_graph_indicator.txt")
    edges = _tu_ints(table("A"), zip_path, 2)
    for i, (a, b) in enumerate(edges, 1):
        if not (1 <= a <= N and 1 <= b <= N):
            raise CorruptDataError(f"{str(zip_path)!r}: line {i} of {name}_A.txt is the edge ({a}, {b}): node ids "
                                   f"must lie in [1, {N}] (the lines of {name}_graph_indicator.txt)")
        if indicator[a - 1] != indicator[b - 1]:
            raise CorruptDataError(f"{str(zip_path)!r}: line {i} of {name}_A.txt joins node {a} of graph "
                                   f"{indicator[a - 1]} to node {b} of graph {indicator[b - 1]}")
    if len(edges) == 1:  # PyG reads a one-line table as a vector: an IndexError from its reader
        raise CorruptDataError(f"{str(zip_path)!r}: {name}_A.txt lists a single edge; a TU dataset lists every "
                               f"edge in both directions, (a, b) and (b, a)")
    if G and not any(indicator[a - 1] == G and a != b for a, b in edges):
        # PyG counts the graphs by their edges (self-loops dropped): trailing graphs without any were lost without
        # a word, and the labels no longer matched the graphs
        raise CorruptDataError(f"{str(zip_path)!r}: graph {G}, the last of {name}_graph_indicator.txt, has no edges "
                               f"in {name}_A.txt (self-loops aside); PyG's TU reader would silently drop it")
    for part, rows in (("node", N), ("edge", len(edges))):
        if table(f"{part}_labels").is_file():
            values = _tu_ints(table(f"{part}_labels"), zip_path, None)
            if len(values) != rows:
                raise CorruptDataError(f"{str(zip_path)!r}: {name}_{part}_labels.txt has {len(values)} lines, "
                                       f"expected one per {part} ({rows})")
            width = sum(max(col) - min(col) + 1 for col in zip(*values))  # PyG one-hot encodes each column
            if rows * width > _MAX_ONE_HOT:
                raise CorruptDataError(
                    f"{str(zip_path)!r}: the labels of {name}_{part}_labels.txt span {width} values: their one-hot "
                    f"matrix would have {rows} x {width} entries, more than any TU dataset (at most {_MAX_ONE_HOT})")
        if table(f"{part}_attributes").is_file():
            count = len(_tu_lines(table(f"{part}_attributes"), zip_path))
            if count != rows:
                raise CorruptDataError(f"{str(zip_path)!r}: {name}_{part}_attributes.txt has {count} lines, "
                                       f"expected one per {part} ({rows})")
            _tu_floats(table(f"{part}_attributes"), zip_path)
    if table("edge_labels").is_file():
        _check_duplicate_labelled_edges(edges, name, zip_path)


def _check_duplicate_labelled_edges(edges: list[list[int]], name: str, zip_path: Path) -> None:
    """No edge listed twice in ``<name>_A.txt`` of a dataset with edge labels: PyG's reader merges duplicate
    edges and sums their labels' one-hot rows, so a label became a 2 (or two-hot) in ``edge_attr`` without a word.
    Self-loops are dropped by PyG with their labels, and duplicate edges without labels (IMDB-BINARY and IMDB-MULTI
    list every edge twice; continuous edge attributes are not read, ``use_edge_attr=False``) are merged
    harmlessly: both are left to PyG."""
    first: dict[tuple[int, int], int] = {}
    for i, (a, b) in enumerate(edges, 1):
        if a == b:
            continue
        j = first.setdefault((a, b), i)
        if j != i:
            raise CorruptDataError(
                f"{str(zip_path)!r}: lines {j} and {i} of {name}_A.txt both give the edge ({a}, {b}), and the edges "
                f"are labelled ({name}_edge_labels.txt): PyG's TU reader merges duplicate edges and sums their "
                f"one-hot labels (a label becomes 2 or two-hot); list every edge once per direction")


def load_tu(
    key: str,
    *,
    root: Path | None,
    seed: int,
    node_features: str = "auto",
    use_node_attr: bool = False,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    fold: int | None = None,
    num_folds: int = 10,
    verify: bool = True,
) -> GraphSetData:
    """A TU graph-classification dataset with a seeded stratified split (see the module doc).

    Args:
        key: registry name, a key of :data:`TU_DATASETS`.
        root: data root holding ``tudataset/<NAME>.zip``.
        seed: seed of the split.
        node_features: ``"auto"``, ``"degree"`` or ``"constant"``.
        use_node_attr: also use continuous node attributes (PROTEINS, ENZYMES have some).
        val_fraction, test_fraction: shares of each class in val and test (with ``fold``:
            ``val_fraction`` of the training folds goes to val; ``test_fraction`` is unused).
        fold: the test fold of a ``num_folds``-fold cross-validation (default: no folds, the
            80/10/10 split).
        num_folds: number of folds when ``fold`` is given (an int ``>= 2``, checked either way).
        verify: check the zip's SHA256 against the staged one.
    """
    _check_flags("load_tu", use_node_attr=use_node_attr, verify=verify)
    # checked whether or not ``fold`` is given (else a bad count passed silently without one), and before the zip
    if isinstance(num_folds, bool) or not isinstance(num_folds, numbers.Integral) or num_folds < 2:
        raise ValueError(f"num_folds must be an int >= 2, got {num_folds!r}")
    _import_pyg()
    from torch_geometric import transforms as T
    from torch_geometric.datasets import TUDataset
    from torch_geometric.utils import degree

    if node_features not in ("auto", "degree", "constant"):
        raise ValueError(
            f"node_features must be 'auto', 'degree' or 'constant', got {node_features!r}"
        )
    name = TU_DATASETS[key]
    rel = f"tudataset/{name}.zip"
    (zip_path,) = require_files(key, root, [rel])
    _check_size(zip_path, _MAX_UNZIPPED, "any TU archive")  # hashed whole below, verify or not
    digest = verify_file(zip_path, rel) if verify else sha256_file(zip_path)
    work = cache_dir("tudataset")
    # loaders of one dataset (the runner's workers, threads) take turns: one unzipped the tables while another's PyG
    # read them (a table deleted under it: PyG tried to download the dataset) or wrote processed/ while another read it
    with folder_lock(cache_dir("tudataset", name)):
        extract_tu_zip(zip_path, name, work / name / "raw", digest)
        try:  # the zip rewritten between its hash and its extraction: the marker named its tables by the old hash
            _check_unchanged(zip_path, digest)
        except CorruptDataError:
            (work / name / "raw" / _MARKER).unlink(missing_ok=True)  # extracted again next time
            raise
        drop_unsafe_processed(work / name / "processed")  # PyG would retry a refused file unsafely
        dataset = TUDataset(str(work), name, use_node_attr=use_node_attr)  # processed (if need be) and read whole

    had_features = dataset.num_node_features > 0
    recipe = "dataset features"
    if node_features == "constant":
        dataset.transform = T.Constant(1.0, cat=False)
        recipe = "constant 1.0"
    elif node_features == "degree" or dataset.num_node_features == 0:
        max_degree = 0
        for i in range(len(dataset)):
            g = dataset.get(i)
            if g.num_edges:
                deg = degree(g.edge_index[0], g.num_nodes, dtype=torch.long)
                max_degree = max(max_degree, int(deg.max()))
        dataset.transform = T.OneHotDegree(max_degree)
        recipe = f"one-hot degree (max_degree={max_degree})"
        if had_features:
            recipe = f"dataset features + {recipe}"

    labels = dataset.y.view(-1)
    if fold is None:
        train_idx, val_idx, test_idx = stratified_split(labels, val_fraction, test_fraction, seed)
        require_heldout(key, (train_idx, val_idx, test_idx), val_fraction, test_fraction)
        split = f"stratified, seed={seed}, val={val_fraction}, test={test_fraction}"
    else:
        train_idx, val_idx, test_idx = stratified_kfold_split(labels, num_folds, fold, val_fraction, seed)
        require_heldout(key, (train_idx, val_idx, test_idx), val_fraction, test_fraction)
        split = f"stratified {num_folds}-fold, test fold {fold}, seed={seed}, val={val_fraction} of the other folds"
    return GraphSetData(
        name=key,
        dataset=dataset,
        train_idx=train_idx,
        val_idx=val_idx,
        test_idx=test_idx,
        num_classes=int(labels.max()) + 1,
        num_features=dataset.num_node_features,
        meta={
            "source": f"TU Dortmund graph collection, {name}.zip",
            "licence": "no single licence; cite the original source of each TU dataset",
            "node_features": recipe,
            "split": split,
            "sizes": {"train": len(train_idx), "val": len(val_idx), "test": len(test_idx)},
            "processed_in": str(work / name),
        },
    )


def _register(key: str, name: str) -> None:
    def loader(
        *,
        root: Path | None,
        seed: int = 0,
        node_features: str = "auto",
        use_node_attr: bool = False,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        fold: int | None = None,
        num_folds: int = 10,
        verify: bool = True,
    ) -> GraphSetData:
        _check_flags(loader.__name__, use_node_attr=use_node_attr, verify=verify)
        return load_tu(
            key,
            root=root,
            seed=seed,
            node_features=node_features,
            use_node_attr=use_node_attr,
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            fold=fold,
            num_folds=num_folds,
            verify=verify,
        )

    loader.__name__ = f"load_{key.replace('-', '_')}"
    loader.__doc__ = (
        f"TU dataset {name} from <root>/tudataset/{name}.zip; options as in :func:`load_tu`."
    )
    register_dataset(key, kind="graph", needs_root=True)(loader)


for _key, _name in TU_DATASETS.items():
    _register(_key, _name)
