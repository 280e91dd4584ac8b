"""Neighbour-sampled mini-batch node training in the runner: exactness, end to end, exact resume, config errors."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch_geometric.data import Data

from diffusionformer.data.base import NodeData
from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_batch, neighbor_loader
from diffusionformer.experiments import load_experiment_config, run_experiment
from diffusionformer.experiments.minibatch import (MiniBatchConfig, NodeMiniBatchTask, check_num_neighbors,
                                                   propagation_hops, resolve_num_neighbors)
from diffusionformer.experiments.runner import _run_identity, run_dir
from diffusionformer.experiments.tasks import NodeTask
from diffusionformer.experiments.validate import validate_experiment
from diffusionformer.models import GCN, DiffusionGraphTransformer, GCNConfig, GraphTransformerConfig


def planetoid_like(N: int = 1000, F: int = 6, C: int = 3, seed: int = 0) -> NodeData:
    """A sparse graph with a long diameter (a ring with chords to +-1 and +-3 and a few random ones), Planetoid masks."""
    g = torch.Generator().manual_seed(seed)
    i = torch.arange(N)
    src = torch.cat([i, i, (i + 3) % N, (i + 1) % N, torch.randint(0, N, (4,), generator=g)])
    dst = torch.cat([(i + 1) % N, (i + 3) % N, i, i, torch.randint(0, N, (4,), generator=g)])
    keep = src != dst
    edge_index = torch.stack([src[keep], dst[keep]])
    perm = torch.randperm(N, generator=g)
    masks = [torch.zeros(N, dtype=torch.bool) for _ in range(3)]
    for m, idx in zip(masks, (perm[:15], perm[15:45], perm[45:])):
        m[idx] = True
    data = Data(x=torch.randn(N, F, generator=g), edge_index=edge_index, y=torch.randint(0, C, (N,), generator=g),
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
    return NodeData("ring", data, num_classes=C, num_features=F)


def _loss_and_grads(model, task, batch):
    model.zero_grad()
    loss, _ = task.loss(model, batch)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _graph_transformer(heads: str, F: int = 6, C: int = 3) -> DiffusionGraphTransformer:
    torch.manual_seed(0)
    cfg = GraphTransformerConfig(in_channels=F, num_classes=C, dim=8, depth=2, num_heads=2, heads=heads)
    return DiffusionGraphTransformer(cfg).double()


MODELS = {
    "attention": (lambda: _graph_transformer("attention:2"), 2),
    "heat-2-steps": (lambda: _graph_transformer("attention:1,heat(t=0.5, steps=2):1"), 4),
    "grand-nl-rk4": (lambda: _graph_transformer("laplacian:1,grand-nl(t=1.0, steps=1, method='rk4'):1"), 8),
    "differential": (lambda: _graph_transformer("differential(head_dim=4, depth=0):2"), 2),
    "gcn": (lambda: GCN(GCNConfig(in_channels=6, num_classes=3, hidden=8, num_layers=2, dropout=0.0)).double(), 3),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_one_minibatch_step_with_all_neighbours_and_all_training_nodes_is_the_full_batch_step(name):
    make, R = MODELS[name]
    data = planetoid_like()
    data.data.x = data.data.x.double()
    model = make()
    assert propagation_hops(model) == R
    full_loss, full_grads = _loss_and_grads(model, NodeTask(data), data.data)
    n_train = int(data.data.train_mask.sum())
    task = NodeMiniBatchTask(data, [-1] * R, batch_size=n_train)
    batch = task.train_batch(0, torch.Generator().manual_seed(3), n_train)
    assert batch.batch_size == n_train and batch.num_nodes < data.data.num_nodes  # a proper subgraph
    assert sorted(batch.n_id[:n_train].tolist()) == sorted(data.data.train_mask.nonzero().view(-1).tolist())
    # the seeds' outputs on the sampled subgraph are their full-graph outputs (float64)
    seeds = batch.n_id[:n_train]
    with torch.no_grad():
        full_logits = model(data.data.x, data.data.edge_index)
        torch.testing.assert_close(model(batch.x, batch.edge_index)[:n_train], full_logits[seeds], rtol=1e-12, atol=1e-12)
    # so the loss and every gradient are the full-batch ones (both tasks take the cross-entropy of
    # float32 logits, over the training nodes in another order: float32 tolerances)
    loss, grads = _loss_and_grads(model, task, batch)
    torch.testing.assert_close(loss, full_loss, rtol=1e-6, atol=1e-7)
    assert set(grads) == set(full_grads) and len(grads) == len(list(model.parameters()))
    for key in grads:
        torch.testing.assert_close(grads[key], full_grads[key], rtol=1e-5, atol=1e-7, msg=key)
    # one hop fewer than R: the seeds' outputs are no longer the full-graph ones
    short = NodeMiniBatchTask(data, [-1] * (R - 1), batch_size=n_train)
    sb = short.train_batch(0, torch.Generator().manual_seed(3), n_train)
    with torch.no_grad():
        gap = (model(sb.x, sb.edge_index)[:n_train] - full_logits[sb.n_id[:n_train]]).abs().max().item()
    assert gap > 1e-12


def test_neighbor_batch_is_the_neighbor_loader_batch():
    """One draw of the sampler as neighbor_batch lays it out equals NeighborLoader's batch of the same draw."""
    data = planetoid_like().data
    seeds = torch.tensor([5, 17, 40, 99])
    loader = neighbor_loader(data, [3, 2], batch_size=4, input_nodes=seeds, force_torch=True,
                             generator=torch.Generator().manual_seed(11))
    (ref,) = list(loader)
    sampler = TorchNeighborSampler(data, [3, 2])
    got = neighbor_batch(data, sampler, seeds, torch.Generator().manual_seed(11))
    assert got.batch_size == ref.batch_size == 4
    for key in ("n_id", "e_id", "edge_index", "x", "y", "train_mask"):
        assert torch.equal(getattr(got, key), getattr(ref, key)), key
    assert torch.equal(got.n_id[:4], seeds)
    # the edges are the graph's own (local ids map back through n_id to the original edge_index)
    assert torch.equal(got.n_id[got.edge_index], data.edge_index[:, got.e_id])


def test_sampled_evaluation_with_all_neighbours_equals_full_evaluation():
    data = planetoid_like()
    data.data.x = data.data.x.double()
    model = _graph_transformer("attention:1,heat(t=0.5, steps=2):1").eval()
    full = NodeMiniBatchTask(data, [-1] * 4, batch_size=8).evaluate(model, None)
    sampled = NodeMiniBatchTask(data, [-1] * 4, batch_size=8, eval="sampled", eval_batch_size=7).evaluate(model, None)
    assert full.keys() == sampled.keys() == {"loss", "val_loss", "val_acc", "test_loss", "test_acc"}
    for key in full:
        assert sampled[key] == pytest.approx(full[key], rel=1e-6), key  # float32 logits, other summation order
    assert full == NodeTask(data).evaluate(model, None)
    # a small fan-out approximates; the same draws every time
    few = NodeMiniBatchTask(data, [1, 1], batch_size=8, eval="sampled", eval_batch_size=7)
    first = few.evaluate(model, None)
    assert first == few.evaluate(model, None) and first["val_loss"] != pytest.approx(full["val_loss"], rel=1e-9)
    capped = few.evaluate(model, 1)  # one batch of 7 seeds per split
    assert capped["val_loss"] != first["val_loss"]


def test_seeds_are_distinct_training_nodes_and_at_most_all_of_them():
    data = planetoid_like()
    train = set(data.data.train_mask.nonzero().view(-1).tolist())
    g = torch.Generator().manual_seed(0)
    seeds = NodeMiniBatchTask(data, [2], batch_size=6).seeds(g)
    assert len(seeds) == 6 and len(set(seeds.tolist())) == 6 and set(seeds.tolist()) <= train
    assert set(NodeMiniBatchTask(data, [2], batch_size=1000).seeds(g).tolist()) == train


# ----------------------------------------------------------------------------- through the runner
def node_config(minibatch=None, **extra):
    task = {
        "name": "nodes", "dataset": "csbm", "model": "graph-node-small",
        "dataset_options": {"num_nodes": 120, "avg_degree": 4.0},
        "model_overrides": {"dim": 16, "depth": 2, "num_heads": 2},
        "train": {"max_steps": 6, "lr": 3e-3, "warmup_steps": 0, "eval_interval": 3, "log_interval": 1,
                  "checkpoint_interval": 2},
    }
    if minibatch is not None:
        task["minibatch"] = minibatch
    cfg = {"name": "mb", "seeds": [0], "tasks": [task],
           "operators": [{"name": "attention"}, {"name": "heat", "heads": "attention:1,heat(t=0.5, steps=2):1"}]}
    cfg.update(extra)
    return cfg


def test_a_tiny_minibatch_run_end_to_end(tmp_path):
    cfg = load_experiment_config(node_config({"batch_size": 16, "num_neighbors": 4, "eval": "sampled"}))
    results = run_experiment(cfg, tmp_path / "mb", progress=False)
    assert [r.status for r in results] == ["completed", "completed"]
    full = run_experiment(load_experiment_config(node_config()), tmp_path / "full", progress=False)
    for r, f in zip(results, full):
        assert 0.0 <= r.value <= 1.0
        ident = json.loads((run_dir(tmp_path / "mb" / "mb", "nodes", r.operator, 0) / "run_config.json").read_text())
        assert ident["minibatch"] == {"batch_size": 16, "num_neighbors": 4, "eval": "sampled"}
        train = [json.loads(line) for line in
                 (run_dir(tmp_path / "mb" / "mb", "nodes", r.operator, 0) / "metrics.jsonl").read_text().splitlines()]
        losses = [rec["loss"] for rec in train if rec["split"] == "train"]
        full_losses = [json.loads(line)["loss"] for line in
                       (run_dir(tmp_path / "full" / "mb", "nodes", f.operator, 0) / "metrics.jsonl").read_text().splitlines()
                       if json.loads(line)["split"] == "train"]
        assert len(losses) == len(full_losses) == 6 and losses != full_losses  # trained on other batches


def test_killed_minibatch_run_resumes_to_the_same_weights(tmp_path):
    from diffusionformer.testing import assert_same_checkpoint_weights, interrupt_on_call

    cfg = load_experiment_config(node_config({"batch_size": 8, "num_neighbors": [3, 2]}), ["operators=attention"])
    run_experiment(cfg, tmp_path / "clean", progress=False)
    with interrupt_on_call(NodeMiniBatchTask, "loss", 4), pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "killed", progress=False)
    rdir = run_dir(tmp_path / "killed" / "mb", "nodes", "attention", 0)
    assert (rdir / "checkpoint.pt").is_file() and not (rdir / "summary.json").exists()
    assert torch.load(rdir / "checkpoint.pt", weights_only=True)["step"] == 2  # resumes mid-run, from step 2
    run_experiment(cfg, tmp_path / "killed", progress=False)
    clean = run_dir(tmp_path / "clean" / "mb", "nodes", "attention", 0)
    assert_same_checkpoint_weights(clean / "checkpoint.pt", rdir / "checkpoint.pt")
    assert (clean / "metrics.jsonl").read_text().count("train") == (rdir / "metrics.jsonl").read_text().count("train")


def test_the_identity_of_a_full_batch_run_is_unchanged_and_minibatch_joins_it_when_set(tmp_path):
    from diffusionformer.experiments.config import TaskConfig
    from diffusionformer.models import create_model
    from diffusionformer.train import TrainConfig

    model = create_model("graph-node-small")
    plain = _run_identity(TaskConfig("t", "csbm", "graph-node-small"), model, TrainConfig(max_steps=5))
    assert "minibatch" not in plain
    sampled = _run_identity(TaskConfig("t", "csbm", "graph-node-small", minibatch={"batch_size": 4, "num_neighbors": [2]}),
                            model, TrainConfig(max_steps=5))
    assert sampled["minibatch"] == {"batch_size": 4, "num_neighbors": [2], "eval": "full"}
    # eval_batch_size too: an evaluation on the whole graph reads none (a full-batch run's data is not known here)
    assert {k: v for k, v in sampled.items() if k != "minibatch"} == {k: v for k, v in plain.items()
                                                                      if k != "eval_batch_size"}
    # a full-batch run is not resumed as a mini-batch one (and the reverse)
    raw = node_config()
    raw["tasks"][0]["train"]["max_steps"] = 2
    raw["operators"] = raw["operators"][:1]
    run_experiment(load_experiment_config(raw), tmp_path, progress=False)
    raw["tasks"][0]["minibatch"] = {"batch_size": 4, "num_neighbors": 2}
    with pytest.raises(ValueError, match="made with a different minibatch"):
        run_experiment(load_experiment_config(raw), tmp_path, progress=False)


# ----------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("minibatch,err,match", [
    ({"batch_size": 0, "num_neighbors": [2]}, ValueError, r"minibatch.batch_size must be a positive int, got 0"),
    ({"batch_size": "8", "num_neighbors": [2]}, TypeError, r"minibatch.batch_size: expected int \| None, got str"),
    ({"batch_size": True, "num_neighbors": [2]}, TypeError, r"minibatch.batch_size: expected int \| None, got bool"),
    ({"batch_size": 8, "num_neighbors": []}, ValueError, r"num_neighbors must be a positive int or -1.*got \[\]"),
    ({"batch_size": 8, "num_neighbors": [0, 2]}, ValueError, r"num_neighbors must be a positive int or -1.*\[0, 2\]"),
    ({"batch_size": 8, "num_neighbors": -2}, ValueError, r"num_neighbors must be a positive int or -1.*got -2"),
    ({"batch_size": 8, "num_neighbors": 2.5}, TypeError, r"minibatch.num_neighbors: expected .*got float"),
    ({"batch_size": 8, "num_neighbors": [2], "eval": "partial"}, ValueError, r"expected one of \['full', 'sampled'\]"),
    ({"batch_size": 8, "fanout": [2]}, ValueError, r"unknown key 'fanout'"),
    ({"batch_size": 8}, ValueError, r"minibatch needs num_neighbors"),
    ({"num_neighbors": [2]}, ValueError, r"minibatch needs batch_size"),
])
def test_bad_minibatch_tables_fail_when_the_config_loads(minibatch, err, match):
    with pytest.raises(err, match=r"task 'nodes' minibatch"):
        load_experiment_config(node_config(minibatch))
    with pytest.raises(err, match=match):
        load_experiment_config(node_config(minibatch))


def test_grad_accumulation_is_refused_with_minibatch():
    raw = node_config({"batch_size": 8, "num_neighbors": 2})
    raw["tasks"][0]["train"]["grad_accum_steps"] = 2
    with pytest.raises(ValueError, match="grad_accum_steps cannot split; got grad_accum_steps = 2"):
        load_experiment_config(raw)


def test_hops_are_checked_against_every_setting_before_anything_trains(tmp_path):
    # 2 hops: exact for attention (R = 2), fewer than the heat setting's R = 4 (a warning)
    cfg = load_experiment_config(node_config({"batch_size": 8, "num_neighbors": [-1, -1]}))
    with pytest.warns(UserWarning, match=r"setting 'heat': minibatch.num_neighbors samples 2 hop\(s\) but the model "
                                         r"propagates R = 4: seed outputs are approximations"):
        assert validate_experiment(cfg) == []
    # 3 hops: more than attention's R = 2 (a problem), fewer than heat's (a warning)
    cfg = load_experiment_config(node_config({"batch_size": 8, "num_neighbors": [5, 5, 5]}))
    with pytest.warns(UserWarning, match="setting 'heat'"):
        problems = validate_experiment(cfg)
    assert problems == ["task 'nodes' / setting 'attention': minibatch.num_neighbors samples 3 hops but the model "
                        "propagates R = 2: hops beyond R reach nodes no seed's output depends on; give 2 entries, "
                        "or one int for every hop"]
    with pytest.raises(ValueError, match="nothing was trained"), pytest.warns(UserWarning):
        run_experiment(cfg, tmp_path, progress=False)
    assert not (tmp_path / "mb").exists()
    # one int: R entries for each setting, no warning
    cfg = load_experiment_config(node_config({"batch_size": 8, "num_neighbors": 5}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert validate_experiment(cfg) == []


def test_minibatch_on_other_data_and_unknown_hops_are_problems():
    raw = node_config({"batch_size": 8, "num_neighbors": 2})
    raw["tasks"][0].update(dataset="digits", model="vit-digits", dataset_options={}, model_overrides={})
    problems = validate_experiment(load_experiment_config(raw))
    assert any("minibatch (neighbour-sampled training) applies to node tasks, and dataset 'digits' is of kind "
               "'image'" in p for p in problems), problems
    raw = node_config({"batch_size": 8, "num_neighbors": 2})
    raw["tasks"][0]["model_overrides"]["global_attention"] = True
    problems = validate_experiment(load_experiment_config(raw), load_data=False)
    assert len(problems) == 2 and all("R is unknown or unbounded; give a list" in p for p in problems)
    raw["tasks"][0]["minibatch"]["num_neighbors"] = [2, 2]
    with pytest.warns(UserWarning, match="unknown or unbounded"):
        assert validate_experiment(load_experiment_config(raw), load_data=False) == []


def test_resolve_and_check_num_neighbors():
    cfg = MiniBatchConfig(batch_size=4, num_neighbors=3)
    assert resolve_num_neighbors(cfg, 4) == [3, 3, 3, 3]
    with pytest.raises(ValueError, match="R is unknown"):
        resolve_num_neighbors(cfg, None)
    lst = MiniBatchConfig(batch_size=4, num_neighbors=[5, -1])
    assert resolve_num_neighbors(lst, 2) == [5, -1] and check_num_neighbors(lst, 2) == (None, None)
    assert check_num_neighbors(lst, 1)[0] is not None and check_num_neighbors(lst, 3)[1] is not None
    data = planetoid_like()
    model = _graph_transformer("attention:1,heat(t=0.5, steps=2):1").float()
    with pytest.warns(UserWarning, match="R = 4"):
        task = NodeMiniBatchTask.for_model(data, model, {"batch_size": 4, "num_neighbors": [2, 2]})
    assert task.num_neighbors == [2, 2]
    assert NodeMiniBatchTask.for_model(data, model, {"batch_size": 4, "num_neighbors": 2}).num_neighbors == [2] * 4


def test_trainer_refuses_grad_accum_steps_for_a_minibatch_task(tmp_path):
    """Bug: ``NodeMiniBatchTask`` left ``splits_into_micro_batches`` at its default, so a library ``Trainer`` with
    ``grad_accum_steps = 2`` computed the one sampled subgraph twice per update (its ``shard_batch`` returns the
    batch whole): the same gradient at twice the work, where the experiments' config refuses it. Now refused up
    front as for the full-graph task."""
    from diffusionformer.train import TrainConfig, Trainer

    task = NodeMiniBatchTask(planetoid_like(N=60), [2], batch_size=4)
    model = GCN(GCNConfig(in_channels=6, hidden=8, num_classes=3, num_layers=1))
    cfg = TrainConfig(max_steps=1, batch_size=4, grad_accum_steps=2, device="cpu", progress=False, eval_interval=0)
    with pytest.raises(ValueError, match=r"grad_accum_steps=2, but NodeMiniBatchTask cannot split an update"):
        Trainer(model, task, cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
