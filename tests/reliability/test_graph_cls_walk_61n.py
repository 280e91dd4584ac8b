"""A graph-classification researcher's walk (61n): TU datasets compared by k-fold cross-validation through the
runner, a run killed and resumed, then ``status``, ``summary``, ``analyze`` and ``load_run``.

Checked and found as documented (no test here): a GIN / GCN / graph-transformer comparison on MUTAG in 3 folds
killed mid-run and resumed equals the uninterrupted one (results, logs, ``preprocessing.json``, weights); ``status``,
``summary`` and ``analyze`` read it; a model of ``load_run`` scored by hand on its fold's test split (PyG's
``DataLoader``) gives the recorded last ``test_acc``; the folds of MUTAG, PROTEINS, ENZYMES, NCI1, IMDB-MULTI and
PTC_MR (2, 3 and 10 folds, two seeds) partition the graphs, are the same for the same seed and hold per class
``floor`` or ``ceil`` of ``n_c / K`` graphs, as scikit-learn's ``StratifiedKFold`` (the same multisets of per-class
counts but for ENZYMES in 3 folds, where both deal the extra graph of a class to other folds); the mean, sum and
max readouts of the three models equal a hand per-graph reduction; a graph's logits (float64, eval mode) are those of
the graph alone when batched with others, with global attention too, and with an empty graph or isolated nodes in
the batch.

Found and fixed (``test_bug_...``): the 61i fingerprint of a graph set held only its size and split indices, which
depend on the labels alone: a TU archive (``verify = false``) or a user's graph file with a node label or feature
edited resumed a killed k-fold run on the other graphs without a word, rewriting its ``preprocessing.json``. The
record now holds a hash of the graphs (``graphs_sha256``); an unchanged k-fold run still resumes.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from diffusionformer.data import GraphSetData, register_dataset, unregister_dataset
from diffusionformer.data.splits import stratified_kfold_split
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.testing import interrupt_on_call
from diffusionformer.train.trainer import Trainer

_REPO = Path(__file__).resolve().parents[2]
#: the staged benchmark root ($DIFFUSIONFORMER_DATA, or ../shared/data)
STAGED = next((p for p in (Path(os.environ.get("DIFFUSIONFORMER_DATA") or _REPO / "nowhere"), _REPO.parent / "shared"
                           / "data") if (p / "SHA256SUMS").is_file()), _REPO / "nowhere")

_TRAIN = {"max_steps": 6, "batch_size": 8, "eval_interval": 3, "checkpoint_interval": 2, "log_interval": 2}
_GT = {"dim": 8, "depth": 1, "num_heads": 2}


def _quiet(_):
    return None


def _cfg(dataset: str, options: dict) -> object:
    return load_experiment_config({
        "name": "cv", "seeds": [0, 1], "operators": [{"name": "attention"}],
        "tasks": [{"name": "g", "dataset": dataset, "model": "graph-graph-small", "folds": 2,
                   "dataset_options": options, "model_overrides": _GT, "train": _TRAIN}]})


def _killed_in_seed1(cfg, out: Path) -> Path:
    """Run ``cfg`` (two folds) in ``out``, killed in seed 1's update 4 (its checkpoint of step 2 kept)."""
    with pytest.raises(KeyboardInterrupt), interrupt_on_call(Trainer, "_update", 6 + 4):
        run_experiment(cfg, out, progress=False, log=_quiet)
    rdir = run_dir(out / "cv", "g", "attention", 1)
    assert (rdir / "checkpoint.pt").is_file() and not (rdir / "summary.json").exists()
    return rdir


def _refused_then_resumed(cfg, out: Path, rdir: Path, change, restore) -> None:
    """``change`` the data: the resume is refused naming ``graphs_sha256`` (the split indices are the same), the
    record kept; ``restore`` it: the run resumes to the end."""
    before = (rdir / "preprocessing.json").read_text()
    change()
    with pytest.raises(ValueError, match=r"(?s)prepared otherwise.*\(graphs_sha256 \('[0-9a-f]{16}' then "
                                         r"'[0-9a-f]{16}'\): .*--restart") as refusal:
        run_experiment(cfg, out, progress=False, log=_quiet)
    assert "idx_sha256" not in str(refusal.value) and "num_graphs" not in str(refusal.value)
    assert (rdir / "preprocessing.json").read_text() == before
    assert not (rdir / "summary.json").exists()
    restore()  # the same data again: an unchanged k-fold run resumes
    run_experiment(cfg, out, progress=False, log=_quiet)
    assert json.loads((rdir / "summary.json").read_text())["status"] == "completed"
    assert (rdir / "preprocessing.json").read_text() == before


# ------------------------------------------------------------------------------------------ a user's graph set
def _graph_set_file(path: Path, *, edit: bool = False) -> None:
    """A user's graph set as a file: 24 graphs of 3 to 6 nodes (a path each), 3 features, 2 classes."""
    g = torch.Generator().manual_seed(0)
    graphs = []
    for i in range(24):
        n = 3 + i % 4
        line = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
        graphs.append((torch.randn(n, 3, generator=g), torch.cat([line, line.flip(0)], 1), i % 2))
    if edit:  # one feature of graph 5 changed: the same labels, so the same split indices
        graphs[5][0][0, 0] += 1.0
    torch.save(graphs, path)


@pytest.fixture
def user_graph_set(tmp_path):
    """A user's graph-classification dataset (the documented extension point) read from a file, k-fold ready."""
    from torch_geometric.data import Data

    @register_dataset("walk61n-graphs", kind="graph")
    def load(*, seed: int = 0, path: str = "", fold: int = 0, num_folds: int = 2) -> GraphSetData:
        graphs = [Data(x=x, edge_index=e, y=torch.tensor([y])) for x, e, y in torch.load(path)]
        labels = torch.tensor([int(d.y) for d in graphs])
        train, val, test = stratified_kfold_split(labels, num_folds, fold, 0.25, seed)
        return GraphSetData("walk61n-graphs", graphs, train, val, test, num_classes=2, num_features=3)
    path = tmp_path / "graphs.pt"
    _graph_set_file(path)
    yield path
    unregister_dataset("walk61n-graphs")


def test_bug_a_k_fold_resume_on_a_graph_set_with_an_edited_feature_is_refused(tmp_path, user_graph_set):
    """Bug: a user's graph set (a list of ``Data``) in two folds, seed 1 killed, one node feature of one graph
    edited in the file, resumed: it trained on the edited graphs and rewrote ``preprocessing.json``, whose graph
    fingerprint (size, split indices) was unchanged. Now refused naming ``graphs_sha256``; restored, it resumes."""
    cfg = _cfg("walk61n-graphs", {"path": str(user_graph_set)})
    out = tmp_path / "out"
    rdir = _killed_in_seed1(cfg, out)
    _refused_then_resumed(cfg, out, rdir, lambda: _graph_set_file(user_graph_set, edit=True),
                          lambda: _graph_set_file(user_graph_set))


@pytest.mark.skipif(not (STAGED / "tudataset" / "MUTAG.zip").is_file(),
                    reason="the staged TU zips (../shared/data/tudataset) are absent")
def test_bug_a_k_fold_mutag_resume_on_an_archive_with_an_edited_node_label_is_refused(tmp_path, cache, monkeypatch):
    """Bug: MUTAG in two folds from a copied archive (``verify = false``: a user's own copy), seed 1 killed, the
    first node's label edited in ``MUTAG_node_labels.txt`` (so another one-hot feature; the graph labels, and so the
    folds, unchanged), resumed: it went on training on the other graph without a word. Now refused naming
    ``graphs_sha256`` (the PyG storage is hashed as collated); the original archive back, it resumes."""
    root = tmp_path / "data"
    (root / "tudataset").mkdir(parents=True)
    archive = root / "tudataset" / "MUTAG.zip"
    shutil.copy(STAGED / "tudataset" / "MUTAG.zip", archive)
    original = archive.read_bytes()

    def edit_node_label():
        with zipfile.ZipFile(archive) as zf:
            entries = {info.filename: zf.read(info) for info in zf.infolist()}
        name = next(n for n in entries if n.endswith("MUTAG_node_labels.txt"))
        first, rest = entries[name].split(b"\n", 1)
        entries[name] = (b"1" if first.strip() == b"0" else b"0") + b"\n" + rest
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
            for n, data in entries.items():
                zf.writestr(n, data)

    cfg = _cfg("mutag", {"verify": False})
    out = tmp_path / "out"
    monkeypatch.setenv("DIFFUSIONFORMER_DATA", str(root))
    rdir = _killed_in_seed1(cfg, out)
    _refused_then_resumed(cfg, out, rdir, edit_node_label, lambda: archive.write_bytes(original))
