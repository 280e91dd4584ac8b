"""Three known gaps, closed (59e).

- ``GraphBlock.forward`` with a sparse ``AttentionGraph`` that carries its own ``batch`` and a different ``batch``
  argument used both without a word: the graph's for the local attention, the argument's for the global one (the
  nodes of one graph attended over edges of another split). A mismatch is a ``ValueError`` where values are read.
- ``run_experiment(resume=False)`` after a run whose lock release failed (the lock left in place), in the same
  process (a notebook), refused the run as "being trained by another process": its own pid's lock.
- ``WORLD_SIZE=0`` or ``-2`` was one process to the runner (``_world_size``), an error to ``dist_env`` only once
  the first run's trainer joined the group (after the manifest and the run's lock were written).
"""

from __future__ import annotations

import dataclasses
import json
import os
from unittest import mock

import pytest
import torch

from experiments_tiny_configs import leave_own_lock_in_place, tiny_digits_config
from diffusionformer.experiments import runner
from diffusionformer.experiments.results import run_dir
from diffusionformer.experiments.store import LOCK_NAME
from diffusionformer.graph import AttentionGraph
from diffusionformer.models import graph_transformer
from diffusionformer.models.graph_transformer import GraphBlock
from diffusionformer.train.distributed import _rank_zero, dist_env


# ---------------------------------------------------------------------------- GraphBlock: the graph's batch and batch
def _two_graphs() -> tuple[torch.Tensor, AttentionGraph]:
    """Nodes 0-2 (graph 0) and 3-4 (graph 1), edges within each graph."""
    torch.manual_seed(0)
    edges = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 0, 4, 3]])
    return torch.randn(5, 8), AttentionGraph.sparse(edges, 5, batch=torch.tensor([0, 0, 0, 1, 1]))


@pytest.mark.parametrize("global_attention", [True, False])
def test_bug_graph_block_refuses_a_batch_other_than_its_graphs(global_attention):
    x, graph = _two_graphs()
    block = GraphBlock(8, 2, global_attention=global_attention)
    with pytest.raises(ValueError, match=r"GraphBlock: batch .* the graph's own batch"):
        block(x, graph, torch.tensor([0, 0, 1, 1, 1]))  # sorted and in range: the global attention took it
    with pytest.raises(ValueError, match=r"GraphBlock: batch .* the graph's own batch"):
        block(x, graph, torch.tensor([0, 0, 0, 0, 0]))  # one graph to the global attention, two to the local


def test_graph_block_takes_its_graphs_batch_as_the_same_or_an_equal_tensor():
    x, graph = _two_graphs()
    block = GraphBlock(8, 2, global_attention=True).eval()
    expected = block(x, graph)  # the graph's batch
    for batch in (graph.batch, graph.batch.clone(), graph.batch.int()):
        torch.testing.assert_close(block(x, graph, batch), expected, rtol=0, atol=0)


def test_graph_block_batch_mismatch_is_checked_only_where_values_are_read(monkeypatch):
    # on an accelerator or under torch.compile no host read: the check is skipped (as the ids' other checks)
    x, graph = _two_graphs()
    block = GraphBlock(8, 2, global_attention=True)
    monkeypatch.setattr(graph_transformer, "checks_values", lambda t: False)
    assert block(x, graph, torch.tensor([0, 0, 1, 1, 1])).shape == (5, 8)


# ---------------------------------------------------------------------------- runner: this process's own lock
def _config():
    return tiny_digits_config()


def test_bug_restart_in_the_process_whose_lock_release_failed_reclaims_its_lock(tmp_path, monkeypatch):
    config = _config()
    lock = leave_own_lock_in_place(monkeypatch, config, tmp_path)
    assert lock == run_dir(tmp_path / "tiny", "digits", "attention", 0) / LOCK_NAME
    assert json.loads(lock.read_text())["pid"] == os.getpid()  # this process's lock, left in place
    said: list[str] = []
    results = runner.run_experiment(config, tmp_path, resume=False, progress=False, log=said.append)
    assert [(r.operator, r.status) for r in results] == [("attention", "completed"), ("lap", "completed")]
    assert [m for m in said if str(lock) in m and "this process's own lock" in m]  # said, not silent
    assert not lock.exists()


def test_restart_inside_a_run_this_process_trains_is_still_refused(tmp_path, monkeypatch):
    # (another thread of the process, or a nested call): its run is not discarded under it
    config = _config()
    train_one = runner._train_one
    refusals: list[str] = []

    def nested(*args, **kwargs):
        monkeypatch.setattr(runner, "_train_one", train_one)  # once (a nested call that went on came here again)
        try:
            runner.run_experiment(config, tmp_path, resume=False, progress=False, log=lambda m: None)
        except ValueError as exc:
            refusals.append(str(exc))
        return train_one(*args, **kwargs)

    monkeypatch.setattr(runner, "_train_one", nested)
    runner.run_experiment(dataclasses.replace(config, operators=config.operators[:1]), tmp_path, progress=False,
                          log=lambda m: None)
    lock = run_dir(tmp_path / "tiny", "digits", "attention", 0) / LOCK_NAME
    assert len(refusals) == 1 and str(lock) in refusals[0] and "this process" in refusals[0]
    assert "nothing was discarded" in refusals[0]


# ---------------------------------------------------------------------------- WORLD_SIZE: one reading
@pytest.mark.parametrize("world", ["0", "-2", " 0 "])
def test_bug_world_size_below_one_is_refused_by_the_runner_as_by_dist_env(world, tmp_path):
    with mock.patch.dict(os.environ, {"WORLD_SIZE": world, "RANK": "0"}):
        os.environ.pop("LOCAL_RANK", None)
        with pytest.raises(ValueError, match="WORLD_SIZE"):
            dist_env()
        with pytest.raises(ValueError, match=rf"WORLD_SIZE: expected .* at least 1.*got {world.strip()!r}"):
            runner._world_size()
        with pytest.raises(ValueError, match="WORLD_SIZE"):  # before anything is written or trained
            runner.run_experiment(_config(), tmp_path, progress=False, log=lambda m: None)
        assert _rank_zero()  # (never raises: it decides who prints the error)
    assert not (tmp_path / "tiny").exists()


@pytest.mark.parametrize("world, size", [(None, 1), ("", 1), (" ", 1), ("1", 1), (" 3 ", 3)])
def test_world_size_the_runner_and_dist_env_read_alike(world, size):
    env = {"RANK": "0", "LOCAL_RANK": "0"} | ({} if world is None else {"WORLD_SIZE": world})
    with mock.patch.dict(os.environ, env):
        if world is None:
            os.environ.pop("WORLD_SIZE", None)
        read = dist_env()
        assert runner._world_size() == size == (1 if read is None else read[1])


@pytest.mark.parametrize("world", ["two", "2.0"])
def test_a_malformed_world_size_is_named_by_the_runner_and_dist_env(world):
    with mock.patch.dict(os.environ, {"WORLD_SIZE": world, "RANK": "0"}):
        with pytest.raises(ValueError, match=f"WORLD_SIZE={world!r}"):
            dist_env()
        with pytest.raises(ValueError, match=rf"WORLD_SIZE: expected an integer number of processes .*got {world!r}"):
            runner._world_size()
        assert _rank_zero()
