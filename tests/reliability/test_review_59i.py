"""Review 59i of 1dde5b0, f442f96 and eac16af: the findings, each failing before its fix.

- f442f96: the Laplacian PE counted the components of a graph by its edges whatever their weight: an edge of
  weight 0 (which the PE's ``edge_weight`` check takes) joins nothing in the Laplacian, so a graph held together by
  one had the eigenvalue 0 twice but was counted connected, and went to ARPACK, which missed the second eigenvector.
- eac16af: a call of ``run_experiment`` beside (a thread) or inside (a nested call) one of the same process training
  a run trained it too, released the lock under the first and took the run out of ``runner._TRAINING_HERE``; a
  refused ``resume=False`` logged that it took this process's own lock back; ``WORLD_SIZE=1`` beside a stray ``RANK``
  that the trainer refuses was refused only once the run's lock and config were written.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch


# ---------------------------------------------------------------------------- f442f96: the PE's component count
def test_laplacian_pe_counts_no_component_joined_by_an_edge_of_weight_zero():
    pytest.importorskip("torch_geometric")
    pytest.importorskip("scipy")
    from torch_geometric.data import Data
    from torch_geometric.utils import get_laplacian, to_dense_adj, to_undirected

    from diffusionformer.models import GraphTransformerConfig, positional_encoding_transform

    src = torch.arange(59)
    paths = to_undirected(torch.cat([torch.stack([src, src + 1]), torch.stack([src[:49], src[:49] + 1]) + 60], 1))
    bridge = torch.tensor([[59, 60], [60, 59]])  # between the two paths (60 and 50 nodes), of weight 0
    edge_index, weight = torch.cat([paths, bridge], 1), torch.cat([torch.ones(paths.shape[1]), torch.zeros(2)])
    k, n = 4, 110
    transform = positional_encoding_transform(GraphTransformerConfig(in_channels=1, pe="laplacian", pe_dim=k))
    pe = transform(Data(edge_index=edge_index, edge_weight=weight, num_nodes=n)).pe.double()
    ei, w = get_laplacian(edge_index, weight, normalization="sym", num_nodes=n)
    L = to_dense_adj(ei, edge_attr=w, max_num_nodes=n)[0].double()  # (N, N)
    rayleigh = torch.stack([pe[:, c] @ L @ pe[:, c] for c in range(k)])
    torch.testing.assert_close(rayleigh, torch.linalg.eigvalsh(L)[1 : k + 1], atol=1e-5, rtol=0)
    # the same Laplacian as the graph without the bridge: the same PE
    alone = transform(Data(edge_index=paths, edge_weight=torch.ones(paths.shape[1]), num_nodes=n)).pe
    torch.testing.assert_close(pe.float(), alone, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------- eac16af: runs this process trains
def _tiny_config():
    from experiments_tiny_configs import tiny_digits_config  # tests/experiments, on the path (conftest.py)

    return tiny_digits_config(1)


def test_a_nested_call_does_not_train_the_run_its_outer_call_trains(tmp_path, monkeypatch):
    """Bug: a call of ``run_experiment`` inside (or beside, in another thread) a call of the same process that trains
    a run took that run's lock as its own: it trained the run a second time under the first, released the lock (the
    first went on training with none) and took it out of ``runner._TRAINING_HERE`` (a set), so a ``resume=False``
    call then discarded the run being trained, where eac16af refuses it. The run is skipped, as one another process
    holds."""
    from diffusionformer.experiments import runner
    from diffusionformer.experiments.results import run_dir
    from diffusionformer.experiments.store import LOCK_NAME

    config, train_one = _tiny_config(), runner._train_one
    lock = run_dir(tmp_path / "tiny", "digits", "attention", 0) / LOCK_NAME
    seen: dict[str, object] = {}

    def nested(*args, **kwargs):
        monkeypatch.setattr(runner, "_train_one", train_one)  # once
        said: list[str] = []
        seen["results"] = runner.run_experiment(config, tmp_path, progress=False, log=said.append)
        seen["said"], seen["locked"] = said, lock.exists()
        with pytest.raises(ValueError, match="nothing was discarded") as refusal:
            runner.run_experiment(config, tmp_path, resume=False, progress=False, log=lambda m: None)
        seen["refusal"] = str(refusal.value)
        return train_one(*args, **kwargs)

    monkeypatch.setattr(runner, "_train_one", nested)
    results = runner.run_experiment(config, tmp_path, progress=False, log=lambda m: None)
    assert [(r.operator, r.status) for r in results] == [("attention", "completed")]
    assert seen["results"] == [] and seen["locked"]  # not trained twice; the outer call's lock kept
    assert [m for m in seen["said"] if "skipped" in m and "another call of run_experiment" in m]
    assert str(lock) in seen["refusal"]
    assert not lock.exists()


def test_a_refused_restart_does_not_say_it_takes_back_this_process_lock(tmp_path, monkeypatch):
    """Bug: ``resume=False`` beside a lock this process left in place (its release failed) and a run another process
    trains logged "... this process's own lock ...: taken back, the run is restarted", then refused the call
    ("nothing was discarded"): the log said of a run what the call did not do. It is said where the call goes on."""
    import json
    import os

    from diffusionformer.experiments import runner
    from diffusionformer.experiments.results import run_dir
    from diffusionformer.experiments.store import LOCK_NAME

    from experiments_tiny_configs import leave_own_lock_in_place  # tests/experiments, on the path (conftest.py)

    config = _tiny_config()
    own = leave_own_lock_in_place(monkeypatch, config, tmp_path).parent
    assert own == run_dir(tmp_path / "tiny", "digits", "attention", 0)
    assert json.loads((own / LOCK_NAME).read_text())["pid"] == os.getpid()
    live_holder = runner._live_holder
    monkeypatch.setattr(runner, "_live_holder", lambda rdir: live_holder(rdir) if rdir == own else (4242, "nodeB"))
    with_seed = dataclasses.replace(config, seeds=(0, 1))  # seed 1: held by process 4242 on nodeB
    said: list[str] = []
    with pytest.raises(ValueError, match=r"process 4242 on nodeB.*nothing was discarded"):
        runner.run_experiment(with_seed, tmp_path, resume=False, progress=False, log=said.append)
    assert not [m for m in said if "taken back" in m], said
    said.clear()
    monkeypatch.setattr(runner, "_live_holder", live_holder)
    runner.run_experiment(config, tmp_path, resume=False, progress=False, log=said.append)
    assert [m for m in said if str(own / LOCK_NAME) in m and "taken back" in m]


# ---------------------------------------------------------------------------- eac16af: one reading of the environment
@pytest.mark.parametrize("rank", ["1", "junk"])
def test_a_one_process_environment_the_trainer_refuses_is_refused_before_anything_is_written(rank, tmp_path):
    """Bug (as eac16af's WORLD_SIZE=0): ``WORLD_SIZE=1`` beside a stray ``RANK=1`` (or a malformed one) was one
    process to the runner, refused by the trainer's ``dist_env`` ("expected 0 <= RANK < WORLD_SIZE") once the
    manifest, the run's lock and its ``run_config.json`` were written."""
    import os
    from unittest import mock

    from diffusionformer.experiments import runner

    with mock.patch.dict(os.environ, {"WORLD_SIZE": "1", "RANK": rank}):
        os.environ.pop("LOCAL_RANK", None)
        with pytest.raises(ValueError, match=rf"distributed environment: .*RANK={rank if rank == '1' else repr(rank)}"):
            runner.run_experiment(_tiny_config(), tmp_path, progress=False, log=lambda m: None)
    assert not (tmp_path / "tiny").exists()
