"""A fingerprint of the data in ``preprocessing.json`` (61i): a resume, and ``analyze``, told data that changed within
what 61f recorded.

61f made a resume and ``analyze`` refuse a run whose data is now prepared otherwise than its ``preprocessing.json``
records, but the record held only the vocabulary of a text task and only the ``kind`` of a graph task.

Found and fixed (``test_bug_...``): a text corpus changed within its vocabulary (pydoc topics of another Python
patch release, a user's text file edited) and a user's graph file with an edited edge resumed without a word,
training on with the new data and rewriting the record as if the whole run had been made on it. The record now
holds a cheap fingerprint (``reload._data_fingerprint``: each text split's token count and hash; a graph's sizes and
hashes of its features, sorted edges, labels and split masks; a graph set's size and split indices), compared as
61f compares the rest. A record of an older version, without these entries, resumes as before.
"""

from __future__ import annotations

import json

import pytest
import torch

from diffusionformer.data import NodeData, register_dataset, unregister_dataset
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.reload import _data_preprocessing, _preprocessing_changes
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.testing import interrupt_on_call
from diffusionformer.testing.faults import assert_same_checkpoint_weights
from diffusionformer.train.trainer import Trainer
from experiments_tiny_configs import tiny_text_lm_config

_FINGERPRINT = {"text": ("train_tokens", "train_sha256", "val_tokens", "val_sha256"),
                "node": ("num_nodes", "num_edges", "x_shape", "x_sha256", "edge_index_sha256", "y_sha256",
                         "train_mask_sha256", "val_mask_sha256", "test_mask_sha256")}


def _quiet(_):
    return None


def _killed(cfg, out, call=4):
    """Run ``cfg`` in ``out`` and kill it in update ``call`` (its checkpoint of step 2 kept)."""
    with pytest.raises(KeyboardInterrupt), interrupt_on_call(Trainer, "_update", call):
        run_experiment(cfg, out, progress=False, log=_quiet)


_TRAIN = {"max_steps": 6, "lr": 1e-2, "eval_interval": 3, "checkpoint_interval": 2, "log_interval": 2}


def _text_cfg():
    return tiny_text_lm_config()


def _reordered_pydoc_text(monkeypatch):
    """The pydoc topics as another patch release might ship them: the first topic's text (of the train split)
    reversed: the same characters, so the same vocabulary and token counts, another corpus."""
    import pydoc_data.topics as topics_module

    topics = dict(topics_module.topics)
    first = sorted(topics)[0]
    assert topics[first] != topics[first][::-1]
    topics[first] = topics[first][::-1]
    monkeypatch.setattr(topics_module, "topics", topics)


# ------------------------------------------------------------------------------------------------ a user's graph
def _graph_file(path, *, edges=None, masks=None):
    """A user's node-classification graph as a file: 30 nodes, 4 features, 2 classes, undirected random edges, and
    the split masks (18 / 6 / 6 nodes)."""
    g = torch.Generator().manual_seed(0)
    if edges is None:
        src, dst = torch.randint(0, 30, (2, 60), generator=g)
        edges = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    if masks is None:
        masks = torch.zeros(3, 30, dtype=torch.bool)
        masks[0, :18], masks[1, 18:24], masks[2, 24:] = True, True, True
    g = torch.Generator().manual_seed(1)
    torch.save((torch.randn(30, 4, generator=g), edges, torch.randint(0, 2, (30,), generator=g), masks), path)
    return path


@pytest.fixture
def user_graph(tmp_path):
    """A user's graph dataset (the documented extension point) read from a file."""
    from torch_geometric.data import Data

    @register_dataset("fingerprint61i-graph", kind="node")
    def load(*, seed: int = 0, path: str = "") -> object:
        x, edge_index, y, masks = torch.load(path)
        graph = Data(x=x, edge_index=edge_index, y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
        return NodeData("fingerprint61i-graph", graph, num_classes=2, num_features=4)
    yield _graph_file(tmp_path / "graph.pt")
    unregister_dataset("fingerprint61i-graph")


def _graph_cfg(path):
    return load_experiment_config({
        "name": "g", "seeds": [0], "operators": [{"name": "attention"}],
        "tasks": [{"name": "n", "dataset": "fingerprint61i-graph", "dataset_options": {"path": str(path)},
                   "model": "graph-node-small", "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
                   "train": _TRAIN}]})


# ------------------------------------------------------------------------------------------------------ bugs
def test_bug_a_text_resume_on_a_corpus_changed_within_its_vocabulary_is_refused_naming_the_split(tmp_path,
                                                                                                 monkeypatch):
    """Bug: a text run killed and resumed under a Python whose pydoc topics hold other text with the same characters
    (so the same vocabulary, which is all 61f compared) went on training on the other corpus, its record rewritten.
    Now refused, naming the train split's hash (the counts and the val split are the same) and keeping the record."""
    cfg = _text_cfg()
    _killed(cfg, tmp_path)
    rdir = run_dir(tmp_path / "lm", "t", "attention", 0)
    before = (rdir / "preprocessing.json").read_text()
    _reordered_pydoc_text(monkeypatch)
    with pytest.raises(ValueError, match=r"(?s)prepared otherwise.*\(train_sha256 \('[0-9a-f]{16}' then "
                                         r"'[0-9a-f]{16}'\): .*preprocessing\.json.*--restart") as refusal:
        run_experiment(cfg, tmp_path, progress=False, log=_quiet)
    assert not any(k in str(refusal.value) for k in ("itos", "val_sha256", "_tokens"))
    assert (rdir / "preprocessing.json").read_text() == before
    assert not (rdir / "summary.json").exists()


def test_bug_a_graph_resume_with_an_edited_edge_or_another_split_is_refused_naming_it(tmp_path, user_graph):
    """Bug: a graph run killed, one edge of its data file moved to other nodes (or its split masks changed: the same
    name and options, so the same ``run_config.json``), resumed: it went on training on the other graph, as its
    record held only ``kind: "node"``. Now refused, naming the edges' (or the mask's) hash."""
    cfg = _graph_cfg(user_graph)
    _killed(cfg, tmp_path)
    rdir = run_dir(tmp_path / "g", "n", "attention", 0)
    before = (rdir / "preprocessing.json").read_text()
    x, edges, y, masks = torch.load(user_graph)
    edited = edges.clone()
    edited[:, 0] = torch.tensor([edges[0, 0], (edges[1, 0] + 1) % 30])  # still 120 edges
    _graph_file(user_graph, edges=edited)
    with pytest.raises(ValueError, match=r"(?s)prepared otherwise.*\(edge_index_sha256 \('[0-9a-f]{16}' then "
                                         r"'[0-9a-f]{16}'\): .*--restart") as refusal:
        run_experiment(cfg, tmp_path, progress=False, log=_quiet)
    assert "num_edges" not in str(refusal.value)
    other_split = masks.clone()
    other_split[0, 17], other_split[1, 17] = False, True  # node 17 moved from train to val
    _graph_file(user_graph, masks=other_split)
    with pytest.raises(ValueError, match=r"this data's \(train_mask_sha256 \('\w{16}' then '\w{16}'\), "
                                         r"val_mask_sha256 \('\w{16}' then '\w{16}'\): "):
        run_experiment(cfg, tmp_path, progress=False, log=_quiet)
    assert (rdir / "preprocessing.json").read_text() == before
    assert not (rdir / "summary.json").exists()


def test_bug_analyze_refuses_a_text_run_whose_corpus_changed_within_its_vocabulary(tmp_path, monkeypatch):
    """Bug: ``analyze`` measured a finished run on a corpus changed within its vocabulary without a word."""
    from diffusionformer.experiments import analyze_experiment

    cfg = _text_cfg()
    run_experiment(cfg, tmp_path, progress=False, log=_quiet)
    kwargs = dict(max_examples=4, max_attention_examples=2, progress=False, plots=False)
    analyze_experiment(cfg, tmp_path, **kwargs)  # the same data: measured
    _reordered_pydoc_text(monkeypatch)
    with pytest.raises(ValueError, match=r"(?s)run .*seed0.*prepared otherwise.*train_sha256 \("):
        analyze_experiment(cfg, tmp_path, **kwargs)


# ------------------------------------------------------------------------------------------------------ pins
@pytest.mark.parametrize("kind", ["text", "node"])
def test_pins_a_resume_on_unchanged_data_is_bitwise_the_uninterrupted_run_and_keeps_its_fingerprint(tmp_path,
                                                                                                 user_graph, kind):
    cfg, name, task = (_text_cfg(), "lm", "t") if kind == "text" else (_graph_cfg(user_graph), "g", "n")
    run_experiment(cfg, tmp_path / "clean", progress=False, log=_quiet)
    _killed(cfg, tmp_path / "killed")
    clean, killed = (run_dir(tmp_path / o / name, task, "attention", 0) for o in ("clean", "killed"))
    before = (killed / "preprocessing.json").read_text()
    assert set(_FINGERPRINT[kind]) <= set(json.loads(before))
    run_experiment(cfg, tmp_path / "killed", progress=False, log=_quiet)
    assert json.loads((killed / "summary.json").read_text())["resumed_from"] == 2
    for key in ("model", "optimizer", "rng"):
        assert_same_checkpoint_weights(clean / "checkpoint.pt", killed / "checkpoint.pt", key)
    assert (killed / "preprocessing.json").read_text() == before == (clean / "preprocessing.json").read_text()


def test_pins_a_record_of_an_older_version_without_the_fingerprint_resumes_and_gets_it(tmp_path):
    """Forward compatibility: a run started by 61f's version (``kind`` and ``itos`` only) resumes on the same data,
    an entry the record lacks being no change; the resumed run's record holds the fingerprint."""
    cfg = _text_cfg()
    _killed(cfg, tmp_path)
    rdir = run_dir(tmp_path / "lm", "t", "attention", 0)
    record = json.loads((rdir / "preprocessing.json").read_text())
    (rdir / "preprocessing.json").write_text(json.dumps({k: record[k] for k in ("kind", "itos")}))
    run_experiment(cfg, tmp_path, progress=False, log=_quiet)
    assert json.loads((rdir / "summary.json").read_text())["resumed_from"] == 2
    assert json.loads((rdir / "preprocessing.json").read_text()) == record


def test_pins_a_graph_with_its_edges_in_another_order_is_the_same_data_and_every_entry_is_compared(user_graph):
    """Edges are hashed in sorted order (the same edges in another order are the same graph to the model), each
    split's mask and the labels and features on their own; a tensor hashes by its values, not its storage."""
    from diffusionformer.data import load_dataset
    from diffusionformer.experiments.reload import _tensor_sha256

    record = _data_preprocessing(load_dataset("fingerprint61i-graph", path=str(user_graph)))
    assert set(record) == {"kind", *_FINGERPRINT["node"]} and record["x_shape"] == [30, 4]
    assert record["num_nodes"] == 30 and record["num_edges"] == 120
    x, edges, y, masks = torch.load(user_graph)
    _graph_file(user_graph, edges=edges[:, torch.randperm(120, generator=torch.Generator().manual_seed(0))])
    assert _preprocessing_changes(record, _data_preprocessing(load_dataset("fingerprint61i-graph",
                                                                           path=str(user_graph)))) == ""
    _graph_file(user_graph, edges=edges[:, 1:])
    changes = _preprocessing_changes(record, _data_preprocessing(load_dataset("fingerprint61i-graph",
                                                                              path=str(user_graph))))
    assert changes.startswith("edge_index_sha256 (") and ", num_edges (120 then 119)" in changes
    t = torch.arange(12.0).reshape(3, 4)
    assert _tensor_sha256(t.t().contiguous().t()) == _tensor_sha256(t) != _tensor_sha256(t.double())
    assert _tensor_sha256(t.to_sparse()) == _tensor_sha256(t) != _tensor_sha256(t.bfloat16())
