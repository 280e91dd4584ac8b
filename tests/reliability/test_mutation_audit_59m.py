"""Mutation audit 59m of the library lines changed since d9aca18 (hostile data 2, compile walk, reviews 59a/59e/59i,
vision walk): tests that kill the mutants the new tests let live, each against an expectation worked out by hand
(the docstrings' words, sizes counted by hand), not against the code's own output.
"""

from __future__ import annotations

import pytest


# ---------------------------------------------------------------------------- data/checksums._check_size
@pytest.mark.parametrize("over", [0, 1])
def test_a_corpus_of_exactly_its_cap_loads_and_one_byte_more_is_refused(tmp_path, monkeypatch, over):
    """``_check_size`` refuses a file that holds *more* than its cap: a corpus of exactly the cap is read, one byte
    more is refused unhashed, naming the file and both sizes (a ``>=`` or a ``cap + 1`` passes the terabyte tests)."""
    import diffusionformer.data.text as text
    from diffusionformer.data import CorruptDataError

    path = tmp_path / "tinyshakespeare" / "input.txt"
    path.parent.mkdir()
    body = "to be or not to be\n" * 5 + "x" * over  # 95 or 96 B, counted by hand
    path.write_text(body, encoding="utf-8")
    monkeypatch.setattr(text, "_MAX_CORPUS_BYTES", 95)
    if over:
        with pytest.raises(CorruptDataError, match=r"input\.txt' holds 96 B, more than .*\(95 B at most\)"):
            text.load_tinyshakespeare(root=tmp_path, verify=False)
    else:
        data = text.load_tinyshakespeare(root=tmp_path, verify=False)
        assert len(data.train) + len(data.val) == 95



# ---------------------------------------------------------------------------- experiments/runner._TRAINING_HERE
def _one_operator_config():
    from experiments_tiny_configs import tiny_digits_config  # tests/experiments, on the path (conftest.py)

    return tiny_digits_config(1)


@pytest.mark.parametrize("resume", [True, False])
def test_a_run_whose_training_failed_is_trained_by_the_next_call_of_the_process(tmp_path, monkeypatch, resume):
    """A run whose training raised (its lock released on the way out) is no call's any more: the next call of this
    process (a notebook's retry) trains it, resuming or restarting, rather than skipping or refusing it as one
    "another call of run_experiment in this process" trains."""
    from diffusionformer.experiments import runner
    from diffusionformer.experiments.results import run_dir
    from diffusionformer.experiments.store import LOCK_NAME

    config = _one_operator_config()
    with monkeypatch.context() as patch:
        def failing(*args, **kwargs):
            raise RuntimeError("out of memory (simulated)")

        patch.setattr(runner, "_train_one", failing)
        with pytest.raises(RuntimeError, match="simulated"):
            runner.run_experiment(config, tmp_path, progress=False, log=lambda m: None)
    assert not (run_dir(tmp_path / "tiny", "digits", "attention", 0) / LOCK_NAME).exists()
    said: list[str] = []
    results = runner.run_experiment(config, tmp_path, resume=resume, progress=False, log=said.append)
    assert [(r.operator, r.status) for r in results] == [("attention", "completed")], said
    assert not [m for m in said if "another call" in m], said


def test_a_process_restarts_a_run_it_completed_twice_in_a_row(tmp_path):
    """Two ``resume=False`` calls one after the other in one process each train the run: the first call's run is
    no call's once it returned (no "another call of run_experiment" refusal of the second)."""
    from diffusionformer.experiments import runner

    config = _one_operator_config()
    for _ in range(2):
        results = runner.run_experiment(config, tmp_path, resume=False, progress=False, log=lambda m: None)
        assert [(r.operator, r.status) for r in results] == [("attention", "completed")]


def test_restart_inside_a_run_this_process_trains_is_refused_under_a_relative_out_root(tmp_path, monkeypatch):
    """The runs a call trains are known by their resolved folder: a nested ``resume=False`` call (or one in another
    thread) given the same relative ``out_root`` (the CLI's ``--out runs``) is refused, not told the lock is one an
    earlier call left in place and let discard the run being trained."""
    from diffusionformer.experiments import runner

    monkeypatch.chdir(tmp_path)
    config, train_one = _one_operator_config(), runner._train_one
    refusals: list[str] = []

    def nested(*args, **kwargs):
        monkeypatch.setattr(runner, "_train_one", train_one)  # once
        with pytest.raises(ValueError, match="nothing was discarded") as refusal:
            runner.run_experiment(config, "runs", resume=False, progress=False, log=lambda m: None)
        refusals.append(str(refusal.value))
        return train_one(*args, **kwargs)

    monkeypatch.setattr(runner, "_train_one", nested)
    results = runner.run_experiment(config, "runs", progress=False, log=lambda m: None)
    assert [(r.operator, r.status) for r in results] == [("attention", "completed")]
    assert len(refusals) == 1 and "another call of run_experiment trains it" in refusals[0], refusals


# ---------------------------------------------------------------------------- experiments/validate._data_for_sizes
def _digits_with_mnist_preset() -> dict:
    """digits (8x8 images) on the 28x28 ``vit-mnist`` preset with 8x8 patches: they divide the data's images, not
    the preset's stand-in size (as test_vision_walk_59)."""
    return {"name": "sizes59m", "seeds": [0],
            "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-mnist",
                       "model_overrides": {"patch_size": 8, "dim": 8, "depth": 1, "num_heads": 2},
                       "train": {"max_steps": 1, "batch_size": 4}}],
            "operators": [{"name": "attention"}]}


def test_validate_without_data_stores_the_data_it_loaded_for_sizes_in_loaded():
    """``loaded``: "a dataset loaded here is stored there, so a caller can reuse it". Without ``load_data`` the data
    loaded to judge a model that does not build from the preset's sizes is one such dataset: 1797 digits."""
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.validate import validate_experiment

    seen: dict = {}
    assert validate_experiment(load_experiment_config(_digits_with_mnist_preset()), load_data=False, loaded=seen) == []
    assert list(seen) == ["digits"]
    data = seen["digits"]
    assert len(data.y_train) + len(data.y_val) + len(data.y_test) == 1797  # sklearn's digits, counted once
    assert data.input_shape == (1, 8, 8)


# ---------------------------------------------------------------------------- models/_graph_pe: the dense solver's cap
def test_laplacian_pe_of_a_disconnected_graph_of_2000_nodes_is_the_dense_solvers():
    """positional_encoding_transform: "up to 2000 nodes such a graph [of several components] goes to the dense
    solver". 20 paths of 100 nodes (2000 nodes, the eigenvalue 0 twenty times): the PE's 8 columns are eigenvectors
    of the 8 smallest non-trivial eigenvalues to float64 rounding (ARPACK, one node fewer in the cap: 5e-4 off)."""
    pytest.importorskip("torch_geometric")
    pytest.importorskip("scipy")
    import torch
    from torch_geometric.data import Data
    from torch_geometric.utils import get_laplacian, to_dense_adj, to_undirected

    from diffusionformer.models import GraphTransformerConfig, positional_encoding_transform

    src = torch.arange(99)
    path = torch.stack([src, src + 1])  # (2, 99): 100 nodes
    edge_index = to_undirected(torch.cat([path + 100 * c for c in range(20)], 1), num_nodes=2000)
    k, n = 8, 2000
    cfg = GraphTransformerConfig(in_channels=1, pe="laplacian", pe_dim=k)
    pe = positional_encoding_transform(cfg)(Data(edge_index=edge_index, num_nodes=n)).pe.double()  # (N, k)
    ei, w = get_laplacian(edge_index, normalization="sym", num_nodes=n)
    L = to_dense_adj(ei, edge_attr=w, max_num_nodes=n)[0].double()  # (N, N)
    rayleigh = torch.einsum("nc,nm,mc->c", pe, L, pe)
    assert torch.allclose(rayleigh, torch.zeros(k, dtype=torch.float64), atol=1e-6)  # 19 more zeros than k columns
    torch.testing.assert_close(pe.T @ pe, torch.eye(k, dtype=torch.float64), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------- models/gpt.forward_cached: the lengths
def test_forward_cached_refuses_layer_caches_whose_first_is_the_shortest():
    """The layer caches must hold the same number of tokens, whichever is short: a first layer's cache replaced by a
    new one (0 tokens) beside a second holding 3 is refused, naming ``[0, 3]`` (read as ``start = 0``, the second
    layer's new token sat at position 0 beside 3 cached ones)."""
    import torch

    from diffusionformer.models import DiffusionGPT, GPTConfig
    from diffusionformer.nn.kv_cache import LayerKVCache

    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16)).eval()
    cache = model.new_cache()
    model.forward_cached(torch.tensor([[1, 2, 3]]), cache)
    cache[0] = LayerKVCache()
    with pytest.raises(ValueError, match=r"same number of tokens, got lengths \[0, 3\]"):
        model.forward_cached(torch.tensor([[4]]), cache)


def test_a_run_skipped_as_another_process_trains_it_is_trained_once_that_process_let_go(tmp_path, monkeypatch):
    """A run skipped because another process holds its lock is not this process's: once that process let go, the next
    call of this process trains it (rather than skipping it as one "another call of run_experiment" trains)."""
    from diffusionformer.experiments import runner

    config = _one_operator_config()
    with monkeypatch.context() as patch:
        patch.setattr(runner, "_acquire_lock", lambda rdir: "process 4242 on nodeB")
        said: list[str] = []
        assert runner.run_experiment(config, tmp_path, progress=False, log=said.append) == []
        assert [m for m in said if "skipped: process 4242 on nodeB" in m], said
    said = []
    results = runner.run_experiment(config, tmp_path, progress=False, log=said.append)
    assert [(r.operator, r.status) for r in results] == [("attention", "completed")], said
