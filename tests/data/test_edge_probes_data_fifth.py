"""Edge probes of the data modules, fifth pass: text windows, splits, associative recall, CSBM statistics,
and hostile TU / Planetoid raw files (the ``test_bug_*`` tests pin bugs fixed in this pass)."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from diffusionformer.data import CACHE_ENV, CorruptDataError, load_dataset
from diffusionformer.data.base import IGNORE_INDEX
from diffusionformer.data.csbm import csbm_graph
from diffusionformer.data.planetoid import read_planetoid
from diffusionformer.data.recall import make_assoc_recall
from diffusionformer.data.splits import random_split, stratified_kfold_split, stratified_split
from diffusionformer.data.text import char_text_data, read_text


# ---------------------------------------------------------------- text: windows and round trips


def test_text_windows_match_a_hand_computation_at_every_offset():
    """x = s[i:i+T], y = s[i+1:i+T+1] for every drawn offset, the last window included, and T = L - 1 fits."""
    data = char_text_data("toy", "abcdefghij" * 2, train_fraction=0.5)  # train = a..j (10 tokens)
    s = data.train.tolist()
    L = len(s)
    for T in (1, 3, L - 1):
        x, y = data.get_batch("train", 400, T, torch.Generator().manual_seed(T))
        starts = set()
        for xr, yr in zip(x.tolist(), y.tolist()):
            i = s.index(xr[0])
            starts.add(i)
            assert xr == s[i : i + T] and yr == s[i + 1 : i + T + 1]
        assert starts == set(range(L - T))  # every window, the last (i = L - T - 1) included
    with pytest.raises(ValueError, match="block_size"):
        data.get_batch("train", 1, L, torch.Generator().manual_seed(0))  # no target for the last token


def test_text_round_trips_non_ascii_characters(tmp_path):
    text = "naïve café — 東京 😀\tα\u0301β\x00end\n" * 3
    data = char_text_data("toy", text)
    assert data.decode(data.encode(text)) == text
    assert data.decode(torch.cat([data.train, data.val])) == text
    path = tmp_path / "input.txt"
    path.write_bytes(text.encode("utf-8"))
    assert read_text(path) == text
    path.write_bytes(b"ok\xff\xfe")
    with pytest.raises(CorruptDataError, match="input.txt"):
        read_text(path)


# ---------------------------------------------------------------- splits


@pytest.mark.parametrize("n,fv,ft", [(1, 0.0, 0.0), (7, 0.25, 0.25), (101, 0.1, 0.3), (10, 0.05, 0.05)])
def test_random_split_partitions_deterministically_and_differs_across_seeds(n, fv, ft):
    tr, va, te = random_split(n, fv, ft, seed=3)
    assert sorted(torch.cat([tr, va, te]).tolist()) == list(range(n))
    assert (len(va), len(te)) == (int(np.floor(fv * n + 0.5)), int(np.floor(ft * n + 0.5)))
    again = random_split(n, fv, ft, seed=3)
    assert all(torch.equal(a, b) for a, b in zip((tr, va, te), again))
    if n > 5:
        assert not torch.equal(torch.cat([tr, va, te]), torch.cat(random_split(n, fv, ft, seed=4)))


def test_stratified_and_kfold_splits_partition_and_keep_class_shares():
    y = torch.tensor([0] * 13 + [1] * 7 + [5] * 20)
    tr, va, te = stratified_split(y, 0.2, 0.3, seed=1)
    assert sorted(torch.cat([tr, va, te]).tolist()) == list(range(40))
    for c, n in ((0, 13), (1, 7), (5, 20)):
        assert int((y[va] == c).sum()) == int(np.floor(0.2 * n + 0.5))
        assert int((y[te] == c).sum()) == int(np.floor(0.3 * n + 0.5))
    tests = [stratified_kfold_split(y, 4, k, 0.25, seed=2) for k in range(4)]
    assert sorted(torch.cat([t[2] for t in tests]).tolist()) == list(range(40))
    for tr, va, te in tests:
        assert sorted(torch.cat([tr, va, te]).tolist()) == list(range(40))
        assert max(len(t[2]) for t in tests) - min(len(t[2]) for t in tests) <= 1
    other = stratified_kfold_split(y, 4, 0, 0.25, seed=3)[2]
    assert not torch.equal(tests[0][2].sort().values, other.sort().values)


# ---------------------------------------------------------------- associative recall


@pytest.mark.parametrize("P,V,Q", [(1, 4, 1), (3, 7, 2), (8, 64, 8), (5, 11, 1)])
def test_assoc_recall_answers_match_a_brute_force_lookup(P, V, Q):
    x, y = make_assoc_recall(200, P, V, torch.Generator().manual_seed(P + V), num_queries=Q)
    assert x.shape == y.shape == (200, 2 * P + Q)
    K = V // 2
    for xr, yr in zip(x.tolist(), y.tolist()):
        keys, values, queries = xr[0 : 2 * P : 2], xr[1 : 2 * P : 2], xr[2 * P :]
        assert len(set(keys)) == P and all(0 <= k < K for k in keys)
        assert all(K <= v < V for v in values)
        assert len(set(queries)) == Q
        table = dict(zip(keys, values))
        assert yr[: 2 * P] == [IGNORE_INDEX] * (2 * P)
        assert yr[2 * P :] == [table[q] for q in queries]


# ---------------------------------------------------------------- CSBM statistics


@pytest.mark.parametrize("h", [0.0, 0.3, 0.8, 1.0])
def test_csbm_degree_and_homophily_are_the_stated_ones(h):
    N, C, d = 600, 3, 8.0
    x, ei, y = csbm_graph(N, C, d, h, 6, 2.0, torch.Generator().manual_seed(11))
    M = round(N * d / 2)
    assert ei.shape == (2, 2 * M)
    assert not bool((ei[0] == ei[1]).any())
    keys = ei[0] * N + ei[1]
    assert keys.unique().numel() == keys.numel()  # no duplicate edges
    assert torch.equal(torch.sort(ei[1] * N + ei[0]).values, torch.sort(keys).values)  # symmetric
    measured = float((y[ei[0]] == y[ei[1]]).double().mean())
    sd = (h * (1 - h) / M) ** 0.5
    assert abs(measured - h) <= 5 * sd + 1e-12
    assert abs(2 * M / N - d) < 1e-9 and torch.bincount(y, minlength=C).tolist() == [200] * 3
    means = torch.stack([x[y == c].double().mean(0) for c in range(C)])
    dist = torch.cdist(means, means)
    assert torch.allclose(dist[~torch.eye(C, dtype=torch.bool)], torch.full((C * (C - 1),), 2.0, dtype=torch.float64),
                          atol=0.5)


# ---------------------------------------------------------------- TU: hostile raw files


def _tu_zip(path: Path, files: dict[str, str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for part, text in files.items():
            zf.writestr(f"MUTAG//MUTAG_{part}.txt", text)
    return path


def _tu_files(graphs: int = 10, edgeless: tuple[int, ...] = ()) -> dict[str, str]:
    """``graphs`` two-node graphs (1-based ids); those in ``edgeless`` have no edge."""
    edges = "".join(f"{2 * g - 1}, {2 * g}\n{2 * g}, {2 * g - 1}\n" for g in range(1, graphs + 1) if g not in edgeless)
    return {
        "A": edges,
        "graph_indicator": "".join(f"{g}\n{g}\n" for g in range(1, graphs + 1)),
        "graph_labels": "".join(f"{1 if g % 2 else -1}\n" for g in range(graphs)),
        "node_labels": "".join(f"{i % 3}\n" for i in range(2 * graphs)),
    }


def _with_node_attributes(files: dict[str, str], lines: list[str]) -> dict[str, str]:
    return {**files, "node_attributes": "".join(f"{line}\n" for line in lines)}


@pytest.mark.parametrize("lines,why", [
    (["nan"] + ["0.5"] * 19, "finite"),
    (["0.5"] * 19 + ["inf"], "finite"),
    (["abc"] + ["0.5"] * 19, "numbers"),
    (["0.5, 1.0"] * 19 + ["0.5"], "2 value"),
])
def test_bug_tu_node_attributes_are_checked(tmp_path, monkeypatch, lines, why):
    """Bug: the node and edge attribute tables were only counted, never parsed: NaN or inf attributes became node
    features without a word (use_node_attr=True), and a word or a short line failed inside PyG with a bare
    "could not convert string to float" / "expected sequence of length" that named no file."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    _tu_zip(tmp_path / "tudataset" / "MUTAG.zip", _with_node_attributes(_tu_files(), lines))
    with pytest.raises(CorruptDataError, match=rf"MUTAG\.zip.*MUTAG_node_attributes\.txt.*{why}"):
        load_dataset("mutag", root=tmp_path, verify=False, use_node_attr=True)


def test_bug_tu_edge_attributes_are_checked(tmp_path, monkeypatch):
    """Bug: NaN edge attributes of a TU archive were accepted without a word (only their line count was checked)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    files = _tu_files()
    files["edge_attributes"] = "nan\n" + "1.0\n" * 19
    _tu_zip(tmp_path / "tudataset" / "MUTAG.zip", files)
    with pytest.raises(CorruptDataError, match=r"line 1 of MUTAG_edge_attributes\.txt.*finite"):
        load_dataset("mutag", root=tmp_path, verify=False)


def test_tu_finite_attributes_still_load(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    attrs = [f"{0.25 * i}, -{i}" for i in range(20)]
    _tu_zip(tmp_path / "tudataset" / "MUTAG.zip", _with_node_attributes(_tu_files(), attrs))
    d = load_dataset("mutag", root=tmp_path, verify=False, use_node_attr=True)
    assert d.dataset[1].x[:, :2].tolist() == [[0.5, -2.0], [0.75, -3.0]]


@pytest.mark.parametrize("edgeless", [(10,), (8, 9, 10), (2, 3, 4, 5, 6, 7, 8, 9, 10)])
def test_bug_tu_trailing_graphs_without_edges_are_refused(tmp_path, monkeypatch, edgeless):
    """Bug: PyG's TU reader counts the graphs by their edges, so graphs without edges at the end of the archive
    were silently dropped: a 10-graph archive loaded as 9 (or 1) graphs, its splits still indexing 10 labels."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    _tu_zip(tmp_path / "tudataset" / "MUTAG.zip", _tu_files(edgeless=edgeless))
    with pytest.raises(CorruptDataError, match=r"MUTAG\.zip.*graph 10, the last.*no edges"):
        load_dataset("mutag", root=tmp_path, verify=False)


def test_bug_tu_last_graph_with_only_a_self_loop_is_refused(tmp_path, monkeypatch):
    """Bug: a last graph whose only edge is a self-loop (which PyG drops) was silently lost like an edgeless one."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    files = _tu_files(edgeless=(10,))
    files["A"] += "19, 19\n"
    _tu_zip(tmp_path / "tudataset" / "MUTAG.zip", files)
    with pytest.raises(CorruptDataError, match="graph 10, the last"):
        load_dataset("mutag", root=tmp_path, verify=False)


def test_bug_tu_single_edge_table_is_refused(tmp_path, monkeypatch):
    """Bug: an A table of one line made PyG's reader squeeze it to a vector and fail with a bare IndexError
    ("Dimension out of range") naming no file."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    files = {"A": "3, 4\n", "graph_indicator": "1\n1\n2\n2\n", "graph_labels": "1\n-1\n"}  # in the last graph
    _tu_zip(tmp_path / "tudataset" / "MUTAG.zip", files)
    with pytest.raises(CorruptDataError, match=r"MUTAG_A\.txt lists a single edge"):
        load_dataset("mutag", root=tmp_path, verify=False)


def test_tu_edgeless_graphs_in_the_middle_still_load(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    files = _tu_files(edgeless=(3, 4))
    del files["node_labels"]
    _tu_zip(tmp_path / "tudataset" / "MUTAG.zip", files)
    d = load_dataset("mutag", root=tmp_path, verify=False)
    assert len(d.dataset) == 10
    assert [g.num_edges for g in d.dataset] == [2, 2, 0, 0, 2, 2, 2, 2, 2, 2]
    assert [g.num_nodes for g in d.dataset] == [2] * 10


def test_bug_tu_graph_attributes_do_not_replace_the_class_labels(tmp_path, monkeypatch):
    """Bug: an archive with a graph_attributes table (regression values) made PyG take them as the targets in
    place of graph_labels, and the split then failed with "labels must be integer class labels" naming no file."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    files = _tu_files()
    files["graph_attributes"] = "".join(f"{0.1 * g}\n" for g in range(10))
    _tu_zip(tmp_path / "tudataset" / "MUTAG.zip", files)
    d = load_dataset("mutag", root=tmp_path, verify=False)
    assert [int(g.y) for g in d.dataset] == [0, 1] * 5  # graph_labels -1, 1, ... remapped to 0, 1


# ---------------------------------------------------------------- Planetoid: non-finite values


@pytest.mark.parametrize("part,dense", [("allx", False), ("tx", False), ("ally", True), ("ty", True)])
def test_bug_planetoid_non_finite_values_are_refused(tmp_path, writers, part, dense):
    """Bug: NaN or inf in a Planetoid feature or label matrix was read without a word: NaN features reached the
    model, and a NaN label row became class 0 (its argmax)."""
    import scipy.sparse as sp

    raw = writers.write_planetoid_layout(tmp_path)
    path = raw / f"ind.cora.{part}"
    obj = pickle.loads(path.read_bytes())
    a = (obj.toarray() if hasattr(obj, "toarray") else obj).astype(np.float32)
    a[3, 1] = np.nan if part != "tx" else np.inf
    path.write_bytes(pickle.dumps(a if dense else sp.csr_matrix(a), protocol=2))
    with pytest.raises(CorruptDataError, match=rf"ind\.cora\.{part}'.*finite.*row 3, column 1"):
        read_planetoid(raw, "cora")


def test_planetoid_reader_matches_pyg_on_the_tiny_layout(tmp_path, writers):
    """Our restricted reader and PyG's pickle-based ``read_planetoid_data`` agree on a tiny layout."""
    from torch_geometric.io import read_planetoid_data

    raw = writers.write_planetoid_layout(tmp_path, "CiteSeer", gap=True)
    ours = read_planetoid(raw, "citeseer")
    theirs = read_planetoid_data(str(raw), "citeseer")
    for key in ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(ours, key), getattr(theirs, key)), key
