"""Mutation audit 61l of the day's new library code: tests that kill hand-made mutants the day's tests left alive,
each against an independent expectation (a float64 reference, the documented rule), not the code's own output."""

from __future__ import annotations

import json

import pytest
import torch

from diffusionformer.data.text import char_text_data
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.reload import load_run
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.models import DiffusionGPT, GPTConfig, top_p_filter
from diffusionformer.models.dino import knn_classify
from diffusionformer.train.errors import CheckpointError


def _float64_knn(bank, bank_y, queries, num_classes, k, T):
    """DINO's kNN vote in float64 of each row divided by its own norm (rows at 1e-20 are no smaller here)."""
    bank = bank.double() / bank.double().norm(dim=1, keepdim=True)
    queries = queries.double() / queries.double().norm(dim=1, keepdim=True)
    sim, idx = (queries @ bank.T).topk(k, dim=1)
    votes = torch.zeros(queries.shape[0], num_classes, dtype=torch.float64)
    votes.scatter_add_(1, bank_y[idx], torch.exp(sim / T))
    return votes.argmax(1)


def test_knn_classify_scales_each_row_alone_of_rows_far_apart_in_size():
    """Features of one bank (and one query chunk) 1e40 apart in size (float32 rows at 1e20 and 1e-20): a cosine does
    not depend on a row's size, so each row is scaled by its own power of two. One power for the whole bank (or
    chunk), that of its largest row, underflowed the small rows to 0 (cosine 0 with every query)."""
    torch.manual_seed(0)
    bank, queries = torch.randn(40, 6), torch.randn(16, 6)
    labels = torch.randint(0, 4, (40,))
    sizes = torch.where(torch.arange(40) % 2 == 0, 1e20, 1e-20)[:, None]
    qsizes = torch.where(torch.arange(16) % 2 == 0, 1e-20, 1e20)[:, None]
    expected = _float64_knn(bank, labels, queries, 4, 5, 0.07)
    got = knn_classify(bank * sizes, labels, queries * qsizes, 4, k=5)
    assert torch.equal(got, expected)


def test_top_p_of_one_keeps_a_token_whose_probability_is_below_float64_rounding():
    """``p = 1`` keeps every token (documented): the mass before the last, 1 - 2e-22 exactly, is 1.0 in float64, so
    the rule ``sum_{s<r} pi_(s) < p`` taken in float dropped it (its logit -inf)."""
    logits = torch.tensor([[0.0, -50.0, -3.0]])
    assert torch.equal(top_p_filter(logits, 1.0), logits)
    assert torch.equal(top_p_filter(logits.double(), 1), logits.double())


def test_generate_samples_inside_the_nucleus_for_top_p_just_below_one():
    """``generate(top_p=0.97)`` samples only tokens of the nucleus that ``top_p_filter`` keeps of the model's logits
    at each step (it skips the filter for ``p = 1`` only): 2048 draws of a near-uniform model, ~3% of whose
    tokens are outside the nucleus at each step."""
    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16,
                                   heads="attention:2")).double().eval()
    prompt = torch.randint(0, 64, (256, 2))
    out = model.generate(prompt, 8, temperature=1.0, top_p=0.97, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for t in range(2, out.shape[1]):
            kept = top_p_filter(model(out[:, :t])[0][:, -1], 0.97)
            assert kept.isfinite().all(dim=1).logical_not().all()  # each step's nucleus leaves tokens out
            assert kept.gather(1, out[:, t : t + 1]).isfinite().all(), t


@pytest.mark.parametrize("bad", [True, 3, 7, -1], ids=["bool", "vocab-size", "past", "negative"])
def test_decode_names_the_refused_id_right_after_the_twenty_shown(bad):
    """A sequence of 21 ids whose 21st (position 20, the first not shown) is refused names it; so does one of 30
    whose 26th is: ``True`` (a bool is no token id), the vocabulary size 3 (ids are in [0, 3)), 7, -1."""
    data = char_text_data("toy", "abcabcabca")
    for ids, at in (([0, 1, 2] * 6 + [0, 1] + [bad], 20), ([0, 1, 2] * 8 + [0, bad] + [1, 2, 0, 1], 25)):
        with pytest.raises(ValueError, match=rf"\({len(ids)} ids; {bad!r} at position {at}\)"):
            data.decode(ids)


def _gpt_rope_config(seeds=(0,), lr=1e-3):
    """A tiny GPT with RoPE at base 100 (GPT's own is 10000), 2 steps."""
    return load_experiment_config({"name": "tiny", "seeds": list(seeds), "operators": [
        {"name": "rope", "model_overrides": {"rope_base": 100.0}}], "tasks": [
        {"name": "t", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss",
         "model_overrides": {"n_embd": 8, "n_layer": 1, "n_head": 2, "block_size": 16, "rope": True},
         "train": {"max_steps": 2, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2, "lr": lr}}]})


def test_load_run_refuses_a_run_config_whose_recorded_rope_base_the_checkpoint_contradicts(tmp_path):
    """A ``run_config.json`` that records ``rope_base`` is the record to check, never replaced by the checkpoint's:
    a GPT run at 100 whose file was edited to 10000 (the other base the runner once left out) is refused naming the
    field, not loaded silently at the checkpoint's 100."""
    run_experiment(_gpt_rope_config(), tmp_path, progress=False, log=lambda s: None)
    path = run_dir(tmp_path / "tiny", "t", "rope", 0) / "run_config.json"
    identity = json.loads(path.read_text(encoding="utf-8"))
    assert identity["model_config"]["rope_base"] == 100.0
    identity["model_config"]["rope_base"] = 10000.0
    path.write_text(json.dumps(identity), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"rope_base: checkpoint 100\.0, now 10000\.0"):
        load_run(path.parent)


def test_finished_runs_read_an_old_run_in_results_at_its_checkpoints_rope_base(tmp_path):
    """``finished_runs`` and the ``results.json`` of ``run``: an old seed (its ``run_config.json`` written before
    41b9968, ``rope_base`` left out) that ``run`` skipped and returned among its results, beside a new seed of the
    same config on disk: both are kept, the old one's identity read at its checkpoint's base 100 (read as it is, the
    new seed was left out, warned "made with a different model_config (rope_base: 'unset' then 100.0)")."""
    import warnings

    from diffusionformer.experiments.results import finished_runs

    run_experiment(_gpt_rope_config(), tmp_path, progress=False, log=lambda s: None)
    path = run_dir(tmp_path / "tiny", "t", "rope", 0) / "run_config.json"
    identity = json.loads(path.read_text(encoding="utf-8"))
    identity["model_config"].pop("rope_base")
    path.write_text(json.dumps(identity), encoding="utf-8")
    run_experiment(_gpt_rope_config(seeds=(1,)), tmp_path, progress=False, log=lambda s: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        old = run_experiment(_gpt_rope_config(seeds=(0,)), tmp_path, progress=False, log=lambda s: None)
        assert [(r.seed, r.status) for r in old] == [(0, "completed")]
        merged = finished_runs(tmp_path / "tiny", _gpt_rope_config(seeds=(0, 1)), old)
    assert [(r.seed, r.status) for r in merged] == [(0, "completed"), (1, "completed")]
    runs = json.loads((tmp_path / "tiny" / "results.json").read_text(encoding="utf-8"))["runs"]
    assert sorted(r["seed"] for r in runs) == [0, 1]  # the run of seed 0 kept seed 1's row (outputs)


def test_a_restart_on_changed_data_trains_and_records_the_new_preprocessing(tmp_path, monkeypatch):
    """The remedy the refusal of a resume names, ``--restart`` (``resume=False``), is not refused in turn: a killed
    text run whose corpus changed within its vocabulary (one character replaced, as another Python's pydoc topics)
    trains again from step 0 on the new data and records its vocabulary."""
    import pydoc_data.topics as topics_module

    from diffusionformer.testing import interrupt_on_call
    from diffusionformer.train.trainer import Trainer

    cfg = load_experiment_config({
        "name": "lm", "seeds": [0], "operators": [{"name": "attention"}],
        "tasks": [{"name": "t", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss",
                   "eval_batch_size": 4, "model_overrides": {"n_layer": 1, "n_head": 2, "n_embd": 8, "block_size": 8},
                   "train": {"max_steps": 4, "batch_size": 4, "eval_steps": 1, "eval_interval": 2,
                             "checkpoint_interval": 2}}]})
    with pytest.raises(KeyboardInterrupt), interrupt_on_call(Trainer, "_update", 4):
        run_experiment(cfg, tmp_path, progress=False, log=lambda s: None)
    rdir = run_dir(tmp_path / "lm", "t", "attention", 0)
    assert (rdir / "checkpoint.pt").is_file()  # a run to continue
    topics = topics_module.topics
    chars = set("".join(topics.values()))
    new = next(c for c in "\u00e9\u00e8\u00ea\u00eb\u00ff" if c not in chars)
    monkeypatch.setattr(topics_module, "topics", {k: v.replace("~", new) for k, v in topics.items()})
    [row] = run_experiment(cfg, tmp_path, progress=False, log=lambda s: None, resume=False)
    assert row.status == "completed"
    itos = json.loads((rdir / "preprocessing.json").read_text(encoding="utf-8"))["itos"]
    assert new in itos and "~" not in itos


def test_preprocessing_changes_in_words_as_documented():
    """``_preprocessing_changes`` as its docstring has it: a vocabulary by its sizes and first three differing ids
    (then "..."), recorded value first; floats one up to float64 rounding of their sums (relative 1e-9, and a mean of
    0 against 1e-17), lists of another length differ even where one is the other's start; an entry the record lacks
    is no change, one the data lacks now is."""
    from diffusionformer.experiments.reload import _preprocessing_changes as changes

    itos = list("abcdef")
    assert changes({"itos": itos}, {"itos": list("axyzef")}) == "itos (id 1: 'b' then 'x', id 2: 'c' then 'y', " \
                                                                 "id 3: 'd' then 'z')"
    assert changes({"itos": itos}, {"itos": list("axyzwf")}) == "itos (id 1: 'b' then 'x', id 2: 'c' then 'y', " \
                                                                 "id 3: 'd' then 'z', ...)"
    assert changes({"itos": itos}, {"itos": itos + ["g"]}) == "itos (6 characters then 7)"
    assert changes({"itos": itos}, {"itos": list("xbcdefg")}) == "itos (6 characters then 7, id 0: 'a' then 'x')"
    mean = [0.4914, 0.4822, 0.0]
    assert changes({"mean": mean, "scale": 255.0}, {"mean": [0.4914 * (1 + 1e-12), 0.4822, 1e-17], "scale": 255}) == ""
    assert changes({"mean": mean}, {"mean": [0.4914 * (1 + 1e-6), 0.4822, 0.0]}).startswith("mean ([0.4914")
    assert changes({"mean": mean}, {"mean": [0.0, 1e-9, 1e-11]}) != ""  # a mean of 0 is no wildcard
    assert changes({"scale": None, "std": 0.25}, {"scale": 255.0, "std": "0.25"}) == \
        "scale (None then 255.0), std (0.25 then '0.25')"  # a float against another type: no number to be close to
    assert changes({"x_shape": [3, 2]}, {"x_shape": [3, 2, 1]}) == "x_shape ([3, 2] then [3, 2, 1])"
    assert changes({"kind": "text"}, {"kind": "text", "train_tokens": 5, "train_sha256": "ab"}) == ""
    assert changes({"kind": "text", "train_tokens": 5}, {"kind": "text"}) == "train_tokens (5 then None)"
    assert changes({"train_sha256": "ab", "train_tokens": 5}, {"train_sha256": "ac", "train_tokens": 6}) == \
        "train_sha256 ('ab' then 'ac'), train_tokens (5 then 6)"


def test_tensor_sha256_is_the_sha256_of_the_little_endian_elements():
    """``_tensor_sha256`` against ``hashlib`` of the elements' bytes as NumPy writes them little-endian, row-major:
    ints, floats, bools; a sparse or transposed tensor as its dense contiguous copy; bfloat16 (no NumPy dtype) by its
    16-bit patterns."""
    import hashlib

    import numpy as np

    from diffusionformer.experiments.reload import _tensor_sha256

    def ref(array):
        return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]

    ints = torch.tensor([[1, -2, 3], [4, 5, 2**40]])
    assert _tensor_sha256(ints) == ref(np.array(ints.tolist(), dtype="<i8"))
    assert _tensor_sha256(ints.t()) == ref(np.array(ints.t().tolist(), dtype="<i8"))
    x = torch.tensor([0.5, -1.25, 3.0e38])
    assert _tensor_sha256(x) == ref(np.array(x.tolist(), dtype="<f4"))
    assert _tensor_sha256(x.double()) == ref(np.array(x.tolist(), dtype="<f8"))
    mask = torch.tensor([True, False, True])
    assert _tensor_sha256(mask) == ref(np.array([1, 0, 1], dtype="u1"))
    dense = torch.tensor([[0.0, 2.0], [1.5, 0.0]])
    assert _tensor_sha256(dense.to_sparse()) == _tensor_sha256(dense) == ref(np.array(dense.tolist(), dtype="<f4"))
    half = torch.tensor([1.0, 2.0, -0.5], dtype=torch.bfloat16)
    assert _tensor_sha256(half) == ref(np.array(half.view(torch.int16).tolist(), dtype="<i2"))


def test_graph_fingerprint_tells_every_other_edge_set_apart():
    """A graph's ``edge_index_sha256`` is one for the same edges in any order and differs for any other set of
    edges: one edge moved ((0, 2) -> (1, 1): the same sum of its ends) or the largest edge changed ((2, 2) -> (2, 1)),
    each of which a resume would otherwise take for the graph it was trained on."""
    from types import SimpleNamespace

    from diffusionformer.experiments.reload import _data_fingerprint

    def fingerprint(edges):
        graph = SimpleNamespace(num_nodes=3, edge_index=torch.tensor(edges).t())
        return _data_fingerprint(SimpleNamespace(kind="node", data=graph))

    base = fingerprint([[0, 2], [2, 0], [0, 1], [2, 2]])
    assert base == fingerprint([[2, 2], [0, 1], [2, 0], [0, 2]])
    assert base["num_nodes"] == 3 and base["num_edges"] == 4
    for other in ([[1, 1], [2, 0], [0, 1], [2, 2]], [[0, 2], [2, 0], [0, 1], [2, 1]], [[0, 2], [2, 0], [1, 0], [2, 2]]):
        assert fingerprint(other)["edge_index_sha256"] != base["edge_index_sha256"], other


def test_graph_set_fingerprint_names_its_size_and_each_splits_indices():
    """For a set of graphs: ``num_graphs``, a hash of the graphs (61n) and a hash of each split's indices, the test
    split's too (a graph moved from validation to test changes what a run is measured on)."""
    from types import SimpleNamespace

    from diffusionformer.experiments.reload import _data_fingerprint

    def fingerprint(n, train, val, test):
        return _data_fingerprint(SimpleNamespace(kind="graph", dataset=[None] * n, train_idx=torch.tensor(train),
                                                 val_idx=torch.tensor(val), test_idx=torch.tensor(test)))

    base = fingerprint(6, [0, 1, 2], [3], [4, 5])
    assert base["num_graphs"] == 6 and fingerprint(7, [0, 1, 2], [3], [4, 5])["num_graphs"] == 7
    assert set(base) == {"num_graphs", "graphs_sha256", "train_idx_sha256", "val_idx_sha256", "test_idx_sha256"}
    assert fingerprint(6, [0, 1, 2], [3], [4, 5]) == base
    moved = fingerprint(6, [0, 1, 2], [3], [5, 4])
    assert moved["test_idx_sha256"] != base["test_idx_sha256"] and moved["val_idx_sha256"] == base["val_idx_sha256"]


def test_add_to_toctree_names_an_index_that_is_not_utf8(tmp_path):
    """``add_to_toctree`` (public) reads the index as ``publish`` does: one not UTF-8 is named, and left as it was."""
    from diffusionformer.experiments.publish import add_to_toctree

    index = tmp_path / "index.md"
    index.write_bytes(b"# Results\n\n```{toctree}\n\xff\n```\n")
    with pytest.raises(ValueError, match=r"index\.md: not UTF-8 text .*save it as UTF-8"):
        add_to_toctree(index, "new")
    assert index.read_bytes() == b"# Results\n\n```{toctree}\n\xff\n```\n"


def test_gaps_unfinished_runs_are_named_by_str_names_and_int_seeds_only(tmp_path):
    """``gaps._unfinished``: the runs of ``results.json`` that did not complete, by task, setting and seed; a row of
    seed ``true`` names no run (it is no seed: as a set member it equals seed 1, whose run completed)."""
    from diffusionformer.experiments.gaps import _unfinished

    rows = [{"task": "t", "operator": "lap", "seed": 0, "status": "failed: boom"},
            {"task": "t", "operator": "lap", "seed": 1, "status": "completed"},
            {"task": "t", "operator": "lap", "seed": True, "status": "failed: boom"},
            {"task": "t", "operator": "att", "seed": 2, "status": "non_finite"}]
    (tmp_path / "results.json").write_text(json.dumps({"runs": rows}), encoding="utf-8")
    assert _unfinished(tmp_path) == {("t", "lap", 0), ("t", "att", 2)}


def test_results_json_drops_the_row_of_another_definition_of_a_retrained_task_and_setting(tmp_path):
    """A run of seed 0 retrained with another ``lr`` (``resume=False``) rewrites ``results.json`` without the row of
    seed 1 made with the former ``lr`` (averaged with the new runs, it would mix two experiments under one name),
    and keeps it where seed 0 was retrained with the same definition."""
    def seeds_listed():
        runs = json.loads((tmp_path / "tiny" / "results.json").read_text(encoding="utf-8"))["runs"]
        return sorted(r["seed"] for r in runs)

    run_experiment(_gpt_rope_config(seeds=(0, 1)), tmp_path, progress=False, log=lambda s: None)
    assert seeds_listed() == [0, 1]
    run_experiment(_gpt_rope_config(), tmp_path, progress=False, log=lambda s: None, resume=False)
    assert seeds_listed() == [0, 1]
    run_experiment(_gpt_rope_config(lr=2e-3), tmp_path, progress=False, log=lambda s: None, resume=False)
    assert seeds_listed() == [0]


def test_eval_batch_size_bounds_are_one_and_sys_maxsize_both_included():
    """``eval_batch_size`` is a positive int of at most ``sys.maxsize`` (a tensor size): 1 and ``sys.maxsize`` are
    taken, 0 refused."""
    import sys

    from diffusionformer.experiments import TaskConfig

    for size in (1, sys.maxsize):
        assert TaskConfig("t", "digits", "vit-digits", eval_batch_size=size).eval_batch_size == size
    with pytest.raises(ValueError, match=r"eval_batch_size must be positive, an int at most \d+ .*got 0$"):
        TaskConfig("t", "digits", "vit-digits", eval_batch_size=0)


@pytest.mark.parametrize("reach, words", [
    ("val_acc = 100", "so no run can reach it (a percentage? As a fraction: 1)"),
    ("val_acc = 150", "so no run can reach it"),
    ("test_acc = 90", "so no run can reach it (a percentage? As a fraction: 0.9)"),
])
def test_reach_of_an_accuracy_names_a_percentage_up_to_100_only(tmp_path, capsys, reach, words):
    """A threshold in (1, 100] may be a percentage (100 too: "all of them"), and the hint gives its fraction; one
    above 100 is no percentage and gets no hint; every accuracy key is bounded, ``test_acc`` too."""
    from diffusionformer.experiments.cli import main
    from experiments_tiny_configs import TINY_DIGITS_USER_TOML

    path = tmp_path / "c.toml"
    path.write_text(TINY_DIGITS_USER_TOML.replace('metric = "test_acc"', f'metric = "test_acc"\nreach = {{ {reach} }}',
                                                  1), encoding="utf-8")
    assert main(["show", str(path)]) == 2
    out = capsys.readouterr()
    key, threshold = reach.split(" = ")
    line = f"reach {{{key} = {threshold}}}: {key} is an accuracy, a fraction in [0, 1], {words}"
    assert line + "\n" in out.out + out.err, out  # the whole line: no hint after it where none is due


def test_show_warns_of_no_laplacian_head_only_for_a_setting_that_asks_for_some(tmp_path, capsys, recwarn):
    """The baseline ``attention`` setting (no ``laplacian_heads``) has no Laplacian head by design: ``show`` of a
    comparison whose ``lap`` setting gets one warns of neither setting."""
    from diffusionformer.experiments.cli import main
    from experiments_tiny_configs import TINY_DIGITS_USER_TOML

    path = tmp_path / "c.toml"
    path.write_text(TINY_DIGITS_USER_TOML, encoding="utf-8")
    assert main(["show", str(path)]) == 0, capsys.readouterr()
    assert not [str(w.message) for w in recwarn if "Laplacian head" in str(w.message)]


def test_reach_of_an_unknown_key_is_named_once_as_unknown(tmp_path, capsys):
    """A reach key that is no evaluation key (``vall_acc``) is named as such, and not also called an accuracy."""
    from diffusionformer.experiments.cli import main
    from experiments_tiny_configs import TINY_DIGITS_USER_TOML

    path = tmp_path / "c.toml"
    reach = 'metric = "test_acc"\nreach = { vall_acc = 90 }'
    path.write_text(TINY_DIGITS_USER_TOML.replace('metric = "test_acc"', reach, 1), encoding="utf-8")
    assert main(["show", str(path)]) == 2
    out = capsys.readouterr()
    assert "'vall_acc' is not an evaluation key" in out.out + out.err and "is an accuracy" not in out.out + out.err
