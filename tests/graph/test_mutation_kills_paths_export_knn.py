"""Tests written in a mutation-testing audit of the data root and cache helpers
(``data/paths.py``: the root and cache folders, the missing-file message, the copies into the cache,
the cached arrays and the check of PyG's ``processed/`` folder), the export of attention graphs to
networkx and their drawing (``graph/export.py``) and the k-nearest-neighbour graphs
(``graph/knn.py``).

Each test kills a mutant of the library code that the rest of the suite let through (its docstring
names it: file and mutation) and checks the code against an independent reference: files, folders,
modes and mtimes set by hand, messages written out by hand, a pickle that only loads with
``weights_only=False``, edge lists and weights written by hand, a pure-Python top-k reference, the
arguments handed to a stand-in ``networkx.draw_networkx``, and a numpy brute-force neighbour search.
Mutants judged equivalent are listed, with the reason, at the end of the file. Two tests, whose docstrings
start with "Bug:", pin defects fixed here: ``knn`` took a float ``batch`` and truncated it, and with a
negative graph id in ``batch`` it failed inside PyG with an index error that named neither ``batch`` nor
the value.
CPU only, deterministic, no network; files only under ``tmp_path``.
"""

from __future__ import annotations

import fractions
import os
import stat
import warnings

import networkx as nx
import numpy as np
import pytest
import torch

from diffusionformer.data.paths import (CACHE_ENV, DATA_ENV, ChecksumError, CorruptDataError, DataRootError, cache_dir,
                                        copy_into_cache, drop_unsafe_processed, load_cached, require_files,
                                        resolve_root, save_cached)
from diffusionformer.graph import draw_attention_graph, grid_layout, knn, to_networkx
from diffusionformer.nn import AttentionIntermediates

# ---------------------------------------------------------------------------- paths.py: roots and folders
def test_roots_and_cache_expand_the_home_folder(monkeypatch, tmp_path):
    """kills: paths.py ``resolve_root`` without ``expanduser`` on the argument and on ``$DIFFUSIONFORMER_DATA``,
    ``if env`` -> ``if env is not None`` (an empty variable became the data root ``.``), and ``cache_dir``
    without ``expanduser`` on ``$DIFFUSIONFORMER_CACHE``"""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(DATA_ENV, raising=False)
    assert resolve_root("~/data") == tmp_path / "data"
    monkeypatch.setenv(DATA_ENV, "~/env-data")
    assert resolve_root() == tmp_path / "env-data"
    monkeypatch.setenv(DATA_ENV, "")
    assert resolve_root() is None
    monkeypatch.setenv(CACHE_ENV, "~/c")
    assert cache_dir("a") == tmp_path / "c" / "a"
    assert (tmp_path / "c" / "a").is_dir()


def test_the_error_classes_can_be_caught_by_their_documented_bases():
    """kills: paths.py ``ChecksumError(CorruptDataError)`` -> ``ChecksumError(ValueError)`` and
    ``DataRootError(FileNotFoundError)`` -> ``DataRootError(OSError)``"""
    assert issubclass(ChecksumError, CorruptDataError) and issubclass(CorruptDataError, ValueError)
    assert issubclass(DataRootError, FileNotFoundError)


def test_require_files_takes_any_iterable_and_names_only_the_missing(tmp_path):
    """kills: paths.py ``require_files`` without ``relpaths = list(relpaths)`` (a generator was used up by the
    message, so ``[]`` came back), listing every path instead of only the missing ones, and the message of
    missing files without the hint on how to set the root"""
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"b")
    got = require_files("demo", tmp_path, (rel for rel in ["a.txt", "sub/b.bin"]))
    assert got == [tmp_path / "a.txt", tmp_path / "sub" / "b.bin"]
    with pytest.raises(DataRootError) as info:
        require_files("demo", tmp_path, (rel for rel in ["a.txt", "gone.txt"]), layout="Or: <root>/alt.txt")
    msg = str(info.value)
    assert f"dataset 'demo': missing file(s) under the data root {str(tmp_path)!r}:\n  {tmp_path / 'gone.txt'}\n" in msg
    assert f"  {tmp_path / 'a.txt'}" not in msg  # present: not listed as missing
    assert "Expected files (standard layout):\n  <root>/a.txt\n  <root>/gone.txt\nOr: <root>/alt.txt\n" in msg
    assert msg.endswith("No files are downloaded.") and f"{DATA_ENV}=/path/to/data" in msg


# ---------------------------------------------------------------------------- paths.py: copies and cached arrays
def test_copy_into_cache_recopies_a_file_of_another_size_with_the_same_mtime(tmp_path):
    """kills: paths.py ``copy_into_cache`` ``st_size == st.st_size`` -> ``!=`` (a cached copy of another size
    but the same mtime was kept)"""
    src = tmp_path / "raw" / "x.bin"
    src.parent.mkdir()
    src.write_bytes(b"new content, longer")
    dest = tmp_path / "cache"
    dest.mkdir()
    (dest / "x.bin").write_bytes(b"old")
    st = src.stat()
    os.utime(dest / "x.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
    copy_into_cache([src], dest)
    assert (dest / "x.bin").read_bytes() == b"new content, longer"


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_bug_cached_data_gets_the_mode_open_would_give(tmp_path, umask):
    """Bug: the cache copies and cached arrays were set to a fixed ``0o644`` whatever the umask, so a private
    umask (``077``) still left cached data readable by everyone, and a group umask (``002``) did not let the
    group write it, while the run files and checkpoints followed the umask. All now get the mode a plain
    ``open()`` gives: the reference file below."""
    src = tmp_path / "x.bin"
    src.write_bytes(b"abc")
    old = os.umask(umask)
    try:
        reference = tmp_path / "reference"
        reference.write_text("x")
        copy_into_cache([src], tmp_path / "cache")
        save_cached({"x": torch.arange(2)}, tmp_path / "cache" / "arr.pt")
    finally:
        os.umask(old)
    expected = stat.S_IMODE(reference.stat().st_mode)
    assert expected == 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "cache" / "x.bin").stat().st_mode) == expected
    assert stat.S_IMODE((tmp_path / "cache" / "arr.pt").stat().st_mode) == expected


def test_copy_into_cache_keeps_an_up_to_date_copy_and_copies_metadata(tmp_path):
    """kills: paths.py ``copy_into_cache`` ``continue`` -> ``pass`` (an up-to-date copy, same size and mtime,
    was copied again), dropping ``os.utime`` (the copy's mtime differed from the source, so every call copied
    again), dropping ``os.chmod(tmp, new_file_mode())`` (copies stayed 0600) and ``return dest`` -> ``None``"""
    src = tmp_path / "raw" / "x.bin"
    src.parent.mkdir()
    src.write_bytes(b"abc")
    os.utime(src, ns=(1_000_000_000_000_000_000, 1_500_000_000_123_456_789))
    dest = tmp_path / "cache" / "copy"
    assert copy_into_cache([src], dest) == dest
    target = dest / "x.bin"
    assert target.read_bytes() == b"abc"
    assert target.stat().st_mtime_ns == 1_500_000_000_123_456_789
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()
    assert [p.name for p in dest.iterdir()] == ["x.bin"]  # no temporary left
    # a copy of the same size and mtime counts as up to date: it is not rewritten
    target.write_bytes(b"xyz")
    os.utime(target, ns=(1_000_000_000_000_000_000, 1_500_000_000_123_456_789))
    copy_into_cache([src], dest)
    assert target.read_bytes() == b"xyz"


def test_save_cached_file_is_readable_by_others_and_loads_back(tmp_path):
    """kills: paths.py ``save_cached`` dropping ``os.chmod(tmp, new_file_mode())`` (cached arrays stayed 0600)"""
    path = tmp_path / "deep" / "arr.pt"
    save_cached({"x": torch.arange(3)}, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()
    assert [p.name for p in path.parent.iterdir()] == ["arr.pt"]
    assert torch.equal(load_cached(path)["x"], torch.tensor([0, 1, 2]))


def test_load_cached_of_an_absent_file_is_none_without_a_warning(tmp_path):
    """kills: paths.py ``load_cached`` without ``if not path.is_file(): return None`` (an absent file, the
    normal first run, warned that a cached file was refused)"""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_cached(tmp_path / "absent.pt") is None


def test_load_cached_refuses_a_doctored_file_with_a_one_line_user_warning(tmp_path):
    """kills: paths.py ``load_cached`` ``weights_only=True`` -> ``False`` (a pickle naming an arbitrary class
    loaded), ``except Exception`` -> ``except RuntimeError`` (the UnpicklingError escaped), ``return None`` ->
    ``raise``, ``UserWarning`` -> ``RuntimeWarning``, the path left out of the warning and the whole multi-line
    error in it (only its first line belongs there)"""
    path = tmp_path / "doctored.pt"
    torch.save({"x": fractions.Fraction(1, 3)}, path)  # loads only with weights_only=False
    with pytest.warns(UserWarning) as rec:
        assert load_cached(path) is None
    (w,) = [r for r in rec if "cached file refused" in str(r.message)]
    text = str(w.message)
    assert text == (f"cached file refused and rebuilt: {path}: UnpicklingError: holds what "
                    "torch.load(weights_only=True) refuses: Unsupported global: GLOBAL fractions.Fraction")
    assert "\n" not in text
    assert path.exists()  # load_cached refuses, it does not delete


def _good_and_doctored(folder):
    folder.mkdir(parents=True)
    torch.save({"x": torch.ones(2)}, folder / "data.pt")
    torch.save(fractions.Fraction(1, 3), folder / "pre_transform.pt")


def test_drop_unsafe_processed_removes_a_folder_with_a_doctored_file(tmp_path):
    """kills: paths.py ``drop_unsafe_processed`` ``weights_only=True`` -> ``False``, ``except Exception`` ->
    ``except RuntimeError``, ``if refused`` -> ``if not refused``, dropping ``shutil.rmtree``, ``return
    refused`` -> ``return []`` and dropping the warnings"""
    folder = tmp_path / "processed"
    _good_and_doctored(folder)
    with pytest.warns(UserWarning) as rec:
        refused = drop_unsafe_processed(folder)
    assert len(refused) == 1
    assert refused[0] == (f"{folder / 'pre_transform.pt'}: UnpicklingError: holds what torch.load(weights_only=True) "
                          "refuses: Unsupported global: GLOBAL fractions.Fraction")
    assert not folder.exists()
    msgs = [str(r.message) for r in rec if "refused and rebuilt from the raw files" in str(r.message)]
    assert msgs == [f"cached file refused and rebuilt from the raw files: {refused[0]}"]


def test_drop_unsafe_processed_keeps_a_safe_folder_and_ignores_other_files(tmp_path):
    """kills: paths.py ``drop_unsafe_processed`` ``glob("*.pt")`` -> ``glob("*")`` (a non-``.pt`` file, which
    PyG never loads, got the folder removed) and ``if refused`` -> ``if not refused`` (a safe folder removed)"""
    folder = tmp_path / "processed"
    folder.mkdir()
    torch.save({"x": torch.ones(2)}, folder / "data.pt")
    (folder / "README.txt").write_text("not a tensor file")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert drop_unsafe_processed(folder) == []
    assert sorted(p.name for p in folder.iterdir()) == ["README.txt", "data.pt"]
    assert drop_unsafe_processed(tmp_path / "absent") == []


# ---------------------------------------------------------------------------- export.py: to_networkx
def _edges(G):
    return sorted(G.edges(data="weight"))


def _inter(weights, edge_index):
    """Hand-built intermediates of a sparse call (one polynomial head)."""
    return AttentionIntermediates(attn_weights=weights, coefficients=torch.zeros(1, 2), edge_index=edge_index,
                                  backend="sparse")


def test_explicit_weights_win_over_the_intermediates_own():
    """kills: export.py ``_resolve_source`` taking the intermediates' ``attn_weights`` even when ``weights``
    is passed (``if weights is None`` -> ``if True``)"""
    ei = torch.tensor([[0, 1], [1, 0]])
    inter = _inter(torch.tensor([0.25, 0.75], dtype=torch.float64), ei)
    assert _edges(to_networkx(inter)) == [(0, 1, 0.25), (1, 0, 0.75)]
    mine = torch.tensor([0.5, 0.125], dtype=torch.float64)
    assert _edges(to_networkx(inter, mine)) == [(0, 1, 0.5), (1, 0, 0.125)]


def test_intermediates_without_weights_are_refused():
    """kills: export.py ``_resolve_source`` dropping the "the intermediates carry no attention weights" raise
    (an unweighted graph came back instead)"""
    inter = _inter(None, torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match=r"the intermediates carry no attention weights"):
        to_networkx(inter)


def test_edge_index_one_past_the_dense_weights_is_refused_clearly():
    """kills: export.py ``_edge_weights`` ``int(edge_index.max()) >= B * N`` -> ``> B * N`` (node ``B * N``
    then indexed past the weights: IndexError instead of the ValueError naming the shapes)"""
    P = torch.full((1, 1, 2, 2), 0.5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"edge_index refers to node 2 but dense weights \(1, 1, 2, 2\) "
                                         r"describe B \* N = 2 nodes"):
        to_networkx(torch.tensor([[0], [2]]), P)
    # one below the bound is fine: the weight of target 1 on source 0 is P[0, :, 1, 0]
    P[0, 0, 1, 0] = 0.75
    assert _edges(to_networkx(torch.tensor([[0], [1]]), P)) == [(0, 1, 0.75)]


def _top_k_reference(src, dst, w, k):
    """Hand reference of ``top_k``: per target, the ``k`` heaviest in-edges, ties to the earlier edge."""
    keep = set()
    for t in set(dst):
        idx = [e for e in range(len(dst)) if dst[e] == t]
        idx.sort(key=lambda e: (-w[e], e))
        keep.update(idx[:k])
    return sorted((src[e], dst[e], w[e]) for e in keep)


def test_top_k_ties_go_to_the_earlier_edge_in_a_long_list():
    """kills: export.py ``_top_k_per_target`` first ``argsort(-w, stable=True)`` -> ``stable=False`` (with
    more than a few dozen equal weights the unstable sort keeps later edges, not the earlier ones)"""
    n = 300
    ei = torch.tensor([list(range(1, n + 1)), [0] * n])
    w = torch.full((n,), 0.5, dtype=torch.float64)
    G = to_networkx(ei, w, top_k=3, num_nodes=n + 1)
    assert _edges(G) == [(1, 0, 0.5), (2, 0, 0.5), (3, 0, 0.5)]


def test_top_k_per_target_on_many_edges_matches_a_hand_reference():
    """kills: export.py ``_top_k_per_target`` second ``argsort(dst[order], stable=True)`` -> ``stable=False``
    (the grouping by target loses the heaviest-first order, so arbitrary edges are kept)"""
    gen = torch.Generator().manual_seed(0)
    E, N = 400, 8
    dst = torch.randint(0, N, (E,), generator=gen).tolist()
    src = [N + e for e in range(E)]  # one source per edge: no duplicate edge collapses
    w = [float(v) / 8 for v in torch.randint(0, 8, (E,), generator=gen).tolist()]  # many ties
    G = to_networkx(torch.tensor([src, dst]), torch.tensor(w, dtype=torch.float64), top_k=2, num_nodes=N + E)
    assert _edges(G) == _top_k_reference(src, dst, w, 2)


def test_weights_must_be_a_tensor():
    """kills: export.py ``to_networkx`` dropping the ``weights`` type check (a list then failed with an
    AttributeError deep inside)"""
    with pytest.raises(TypeError, match=r"weights must be a tensor or None, got list"):
        to_networkx(torch.tensor([[0], [1]]), [0.5])


def test_edge_index_must_have_two_rows():
    """kills: export.py ``to_networkx`` shape check ``edge_index.shape[0] != 2`` dropped (a (3, E) index then
    failed on unpacking, with no word of the expected shape)"""
    with pytest.raises(ValueError, match=r"edge_index must have shape \(2, E\), got \(3, 2\)"):
        to_networkx(torch.tensor([[0, 1], [1, 2], [2, 0]]))
    with pytest.raises(ValueError, match=r"edge_index must have shape \(2, E\), got \(3, 2\)"):
        to_networkx(torch.tensor([[0, 1], [1, 2], [2, 0]]), torch.ones(2))


def test_threshold_compares_the_float64_weight():
    """kills: export.py ``to_networkx`` dropping ``.double()`` (a float32 weight 0.2 is stored as
    0.20000000298..., strictly above the threshold 0.2, yet a float32 comparison rounds 0.2 to the same
    float32 and drops the edge)"""
    w32 = torch.tensor([0.2, 0.1], dtype=torch.float32)
    G = to_networkx(torch.tensor([[0, 1], [1, 0]]), w32, threshold=0.2)
    stored = float(np.float32(0.2))  # 0.20000000298023224
    assert stored > 0.2
    assert _edges(G) == [(0, 1, stored)]


def test_negative_node_ids_are_refused():
    """kills: export.py ``to_networkx`` range check without ``int(edge_index.min()) < 0`` (node -1 was added
    to the graph)"""
    with pytest.raises(ValueError, match=r"edge_index values must lie in \[0, num_nodes=3\), got range \[-1, 2\]"):
        to_networkx(torch.tensor([[-1, 0], [2, 1]]), num_nodes=3)


def test_threshold_and_top_k_must_both_pass():
    """kills: export.py ``to_networkx`` ``keep &= _top_k_per_target(...)`` -> ``keep = ...`` (the top-k
    filter replaced the threshold filter instead of adding to it)"""
    ei = torch.tensor([[1, 2, 0, 2], [0, 0, 1, 1]])
    w = torch.tensor([0.75, 0.25, 0.375, 0.5], dtype=torch.float64)
    # top-1 per target: 1->0 (0.75) and 2->1 (0.5); threshold 0.6 keeps only 1->0
    assert _edges(to_networkx(ei, w, top_k=1)) == [(1, 0, 0.75), (2, 1, 0.5)]
    assert _edges(to_networkx(ei, w, top_k=1, threshold=0.6)) == [(1, 0, 0.75)]


# ---------------------------------------------------------------------------- export.py: drawing helpers
def test_grid_layout_rows_go_down():
    """kills: export.py ``grid_layout`` ``-(n // w)`` -> ``n // w`` (row 1 drawn above row 0) and
    ``check_int("h", h, 1)`` -> minimum 0 (an empty grid came back as ``{}``)"""
    assert grid_layout(2, 3) == {0: (0.0, 0.0), 1: (1.0, 0.0), 2: (2.0, 0.0),
                                 3: (0.0, -1.0), 4: (1.0, -1.0), 5: (2.0, -1.0)}
    assert grid_layout(2, 1, cls_token=True) == {0: (-1.5, 0.0), 1: (0.0, 0.0), 2: (0.0, -1.0)}
    with pytest.raises(ValueError, match=r"h must be >= 1, got 0"):
        grid_layout(0, 2)
    with pytest.raises(ValueError, match=r"w must be >= 1, got 0"):
        grid_layout(2, 0)


def _record_draw(monkeypatch):
    """Replace ``networkx.draw_networkx`` by a recorder of its keyword arguments."""
    calls = []
    monkeypatch.setattr(nx, "draw_networkx", lambda G, **kw: calls.append(kw))
    return calls


def test_draw_widths_and_colours_follow_the_weights(monkeypatch):
    """kills: export.py ``draw_attention_graph`` with constant widths (``0.5 + 2.5 * |w| / max|w|`` dropped),
    ``edge_color="k"`` for a weighted graph, and ``ax.set_axis_off()`` dropped"""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    calls = _record_draw(monkeypatch)
    G = nx.DiGraph()
    G.add_weighted_edges_from([(0, 1, 0.5), (1, 2, 2.0), (2, 0, -1.0)])
    ax = draw_attention_graph(G, ax=Figure().add_subplot(), pos=grid_layout(1, 3))
    (kw,) = calls
    assert kw["width"] == [0.5 + 2.5 * 0.25, 3.0, 0.5 + 2.5 * 0.5]
    assert kw["edge_color"] == [0.5, 2.0, -1.0]
    assert kw["pos"] == {0: (0.0, 0.0), 1: (1.0, 0.0), 2: (2.0, 0.0)}
    assert kw["arrows"] is True and kw["node_size"] == 120.0 and kw["with_labels"] is True
    assert ax.axison is False


def test_draw_unweighted_and_zero_weight_graphs(monkeypatch):
    """kills: export.py ``draw_attention_graph`` an edge without ``weight`` counting as 0 (``d.get("weight",
    1.0)`` -> ``0.0``: widths 0.5 instead of 3) and ``max(...) or 1.0`` -> ``max(...)`` (all-zero weights:
    ZeroDivisionError)"""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    calls = _record_draw(monkeypatch)
    draw_attention_graph(nx.DiGraph([(0, 1), (1, 0)]), ax=Figure().add_subplot(), pos=grid_layout(1, 2))
    assert calls[-1]["width"] == [3.0, 3.0] and calls[-1]["edge_color"] == [1.0, 1.0]
    Z = nx.DiGraph()
    Z.add_weighted_edges_from([(0, 1, 0.0), (1, 0, 0.0)])
    draw_attention_graph(Z, ax=Figure().add_subplot(), pos=grid_layout(1, 2))
    assert calls[-1]["width"] == [0.5, 0.5]
    draw_attention_graph(nx.DiGraph(), ax=Figure().add_subplot(), pos={})
    assert calls[-1]["width"] == [] and calls[-1]["edge_color"] == "k"


def test_draw_default_layout_is_the_seeded_spring_layout(monkeypatch):
    """kills: export.py ``draw_attention_graph`` ``nx.spring_layout(G, seed=0)`` -> unseeded (two drawings
    of one graph differed)"""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    calls = _record_draw(monkeypatch)
    G = nx.DiGraph([(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)])
    draw_attention_graph(G, ax=Figure().add_subplot())
    expected = nx.spring_layout(G, seed=0)
    got = calls[-1]["pos"]
    assert sorted(got) == [0, 1, 2, 3]
    for n in G.nodes:
        assert np.allclose(got[n], expected[n])


# ---------------------------------------------------------------------------- knn.py
def _knn_reference(x, k, batch=None, self_loops=False):
    """numpy brute force: for each target ``i`` (ascending), its ``k`` nearest ``j != i`` of the same graph,
    nearest first (``self_loops``: ``i`` itself first)."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    batch = np.zeros(n, dtype=int) if batch is None else np.asarray(batch)
    src, dst = [], []
    for i in range(n):
        cand = [j for j in range(n) if j != i and batch[j] == batch[i]]
        d = [float(np.sqrt(((x[i] - x[j]) ** 2).sum())) for j in cand]
        nearest = [cand[t] for t in np.argsort(d, kind="stable")[:k]]
        for j in ([i] if self_loops else []) + nearest:
            src.append(j)
            dst.append(i)
    return [src, dst]


def test_knn_unsorted_batch_gives_edges_grouped_by_target_nearest_first():
    """kills: knn.py the final regrouping ``edges = [src[keep][order], tgt[order]]`` -> unsorted (edges came in
    graph order, not by target) and ``argsort(tgt, stable=True)`` -> ``stable=False`` (the nearest-first order
    within a target was lost)"""
    gen = torch.Generator().manual_seed(0)
    n = 120
    x = torch.rand(n, 3, generator=gen, dtype=torch.float64)  # distinct distances: no ties
    batch = torch.randint(0, 3, (n,), generator=gen)
    g = knn(x, 4, batch=batch)
    assert g.edge_index.tolist() == _knn_reference(x, 4, batch.tolist())
    small = knn(torch.tensor([[0.0], [10.0], [1.0], [12.0], [3.0]]), 1, batch=torch.tensor([0, 1, 0, 1, 0]))
    assert small.edge_index.tolist() == [[2, 3, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_knn_shuffled_batch_of_equal_graphs_matches_each_graph_alone_ties_included():
    """kills: knn.py ``argsort(graph_batch, stable=True)`` -> ``stable=False`` (the nodes of a graph lost their
    order inside the padded batch, so tied neighbours were picked differently than for the graph alone)"""
    gen = torch.Generator().manual_seed(0)
    n = 300
    x = torch.randint(0, 3, (n, 2), generator=gen).double()  # many equal points: many ties
    batch = torch.tensor([0] * (n // 2) + [1] * (n // 2))[torch.randperm(n, generator=gen)]
    ei = knn(x, 5, batch=batch).edge_index
    for b in range(2):
        idx = (batch == b).nonzero().flatten()
        alone = idx[knn(x[idx], 5).edge_index]  # the graph on its own, node ids mapped back
        assert torch.equal(ei[:, batch[ei[1]] == b], alone)


def test_knn_self_loop_comes_first_in_each_target():
    """kills: knn.py ``src = cat([node, src])`` -> ``cat([src, node])`` (the self loop, at distance 0, listed
    last instead of first: the sparse layout is nearest first)"""
    x = torch.tensor([[0.0], [1.0], [3.0], [7.0]])
    assert knn(x, 1, self_loops=True).edge_index.tolist() == [[0, 1, 1, 0, 2, 1, 3, 2], [0, 0, 1, 1, 2, 2, 3, 3]]
    gen = torch.Generator().manual_seed(1)
    xb = torch.rand(9, 2, generator=gen, dtype=torch.float64)
    b = torch.tensor([1, 0, 1, 0, 1, 0, 1, 0, 0])
    assert knn(xb, 2, batch=b, self_loops=True).edge_index.tolist() == _knn_reference(xb, 2, b.tolist(), True)


def test_knn_tolerates_an_empty_graph_in_the_batch():
    """kills: knn.py ``counts[counts > 0].min()`` -> ``counts.min()`` (an empty graph in the middle of the batch
    made every k too large)"""
    x = torch.tensor([[0.0], [1.0], [5.0], [20.0], [22.0], [27.0]])
    batch = torch.tensor([0, 0, 0, 2, 2, 2])  # graph 1 has no nodes
    g = knn(x, 2, batch=batch)
    assert g.edge_index.tolist() == [[1, 2, 0, 2, 1, 0, 4, 5, 3, 5, 4, 3], [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]]
    assert g.batch_size == 3
    with pytest.raises(ValueError, match=r"got k=3, smallest graph has N=3 nodes"):
        knn(x, 3, batch=batch)


def test_knn_records_the_number_of_graphs():
    """kills: knn.py ``batch_size=None if graph_batch is None else G`` -> ``None`` (the graph count was lost)"""
    assert knn(torch.rand(2, 4, 3, generator=torch.Generator().manual_seed(0)), 1).batch_size == 2
    assert knn(torch.rand(5, 3, generator=torch.Generator().manual_seed(0)), 1,
               batch=torch.tensor([0, 0, 1, 1, 1])).batch_size == 2
    assert knn(torch.rand(5, 3, generator=torch.Generator().manual_seed(0)), 1).batch_size is None


def test_knn_argument_checks():
    """kills: knn.py dropping the ``self_loops`` bool check, the ``batch`` length check (a short batch then
    produced a wrong graph or an unrelated error) and ``check_layout`` (an unknown layout silently gave a
    dense graph)"""
    x = torch.rand(4, 2, generator=torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match=r"self_loops must be a bool, got int"):
        knn(x, 1, self_loops=1)
    with pytest.raises(ValueError, match=r"batch must be an integer tensor of shape \(N,\) = \(4,\), got \(3,\)"):
        knn(x, 1, batch=torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match=r"batch must be an integer tensor of shape \(N,\) = \(4,\), got list"):
        knn(x, 1, batch=[0, 0, 1, 1])
    with pytest.raises(ValueError, match=r"layout must be one of \('dense', 'sparse'\), got 'csr'"):
        knn(x, 1, layout="csr")


def test_knn_refuses_a_negative_graph_id():
    """Bug: knn.py ``knn`` with a ``batch`` holding a negative graph id failed deep inside PyG's
    ``to_dense_batch`` with "RuntimeError: index -1 is out of bounds for dimension 0 with size 1", which names
    neither ``batch`` nor the bad value; it now raises a ValueError naming the range of ``batch``."""
    x = torch.rand(4, 2, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"batch values must be >= 0 \(the graph of each node\), got range \[-1, 0\]"):
        knn(x, 1, batch=torch.tensor([-1, -1, 0, 0]))
    assert knn(x, 1, batch=torch.tensor([1, 1, 0, 0])).edge_index.tolist() == [[1, 0, 3, 2], [0, 1, 2, 3]]


# ---------------------------------------------------------------------------- equivalent mutants
# Mutants applied in this audit: 141 (47 in data/paths.py, 59 in graph/export.py, 35 in graph/knn.py); 90 were
# killed by the suite before this file, 45 by this file. The 6 left are equivalent: no input tells them from
# the code.
# - paths.py ``drop_unsafe_processed`` without ``if not folder.is_dir(): return []``: ``Path.glob`` of an
#   absent folder, or of a plain file, yields nothing, so ``refused`` is empty and ``[]`` comes back all the same.
# - export.py ``to_networkx`` without ``edge_index = edge_index.long()``: every integer dtype (int32, int16,
#   uint8) indexes the weights and the top-k grouping alike and ``tolist`` gives the same Python ints; only a
#   floating-point edge_index, which is not a documented input, would differ.
# - export.py ``to_networkx`` dropping ``raise ValueError("no edges: ...")``: unreachable. ``edge_index`` is
#   ``None`` there only for intermediates without one, and then ``weights`` is either ``None`` (refused earlier:
#   "the intermediates carry no attention weights"), dense (which builds an edge_index) or per-edge (refused
#   in ``_edge_weights``: "need an edge_index").
# - knn.py ``if graph_batch is not None and x.dim() == 2`` -> ``if graph_batch is not None``: for a 3-D ``x``
#   the targets already come in ascending node order (slot ``(b, i)`` is node ``b * N + i``, repeated ``k``
#   times), so the stable regrouping by target is the identity.
# - knn.py dropping ``x = x.detach()``: the graph holds only integer node ids, which never carry autograd.
# - knn.py ``dst = cat([node, dst])`` -> ``cat([dst, node])``: every entry of row ``i`` of ``dst`` is node ``i``,
#   so the order of the concatenation does not change it.


def test_bug_knn_refuses_a_batch_that_is_not_integer():
    """Bug: ``knn`` said "batch must be an integer tensor" but took a float batch and truncated it with
    ``.long()``, so graph ids 0.5 and 0.7 became one graph 0 without a word. Float, complex and bool batches are
    now refused, naming the dtype; any integer dtype is still accepted."""
    x = torch.arange(8, dtype=torch.float32).view(4, 2)
    for dtype in (torch.float32, torch.float64, torch.bool):
        with pytest.raises(ValueError, match=rf"batch must be an integer tensor \(the graph of each node\), got dtype {dtype}"):
            knn(x, 1, batch=torch.tensor([0, 0, 1, 1]).to(dtype))
    ref = knn(x, 1, batch=torch.tensor([0, 0, 1, 1]))
    for dtype in (torch.int32, torch.int16, torch.uint8):
        got = knn(x, 1, batch=torch.tensor([0, 0, 1, 1], dtype=dtype))
        assert torch.equal(got.edge_index, ref.edge_index)
