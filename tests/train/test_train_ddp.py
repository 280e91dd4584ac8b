from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_tiny_tasks import DIST_VARS, RegressionTask, TinyMLP, ddp_config, free_port

from diffusionformer.train import (
    DistContext,
    Trainer,
    dist_env,
    load_checkpoint,
    read_metrics,
    seed_everything,
    shard_batch,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def test_shard_batch_slices_match_the_global_batch():
    batch = {"x": torch.arange(12).reshape(6, 2), "pair": (torch.arange(6), "tag"), "scale": torch.tensor(2.0)}
    shards = [shard_batch(batch, r, 3) for r in range(3)]
    assert torch.equal(torch.cat([s["x"] for s in shards]), batch["x"])
    assert torch.equal(shards[1]["pair"][0], torch.tensor([2, 3])) and shards[1]["pair"][1] == "tag"
    assert all(s["scale"] is batch["scale"] for s in shards)
    assert shard_batch(batch, 0, 1) is batch


def test_shard_batch_errors():
    with pytest.raises(ValueError, match=r"divisible by world_size=4, got a tensor of shape \(6, 2\)"):
        shard_batch(torch.zeros(6, 2), 0, 4)
    with pytest.raises(TypeError, match="got object; give the task a shard_batch"):
        shard_batch([object()], 0, 2)


def test_single_process_context(monkeypatch):
    for var in DIST_VARS:
        monkeypatch.delenv(var, raising=False)
    assert dist_env() is None
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="expected 0 <= RANK < WORLD_SIZE, got RANK=2 WORLD_SIZE=2"):
        dist_env()
    ctx = DistContext(0, 1, 0, torch.device("cpu"))
    t = torch.ones(2)
    assert ctx.is_main and not ctx.is_distributed and ctx.all_reduce_mean(t) is t


@pytest.mark.slow
@pytest.mark.parametrize("accum", [1, 2])
def test_two_process_ddp_matches_single_process(tmp_path, accum):
    out = tmp_path / "ddp"
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(HERE / "train_ddp_worker.py"),
           str(out), str(accum)]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"

    seed_everything(0)
    single = TinyMLP(dropout=0.0)
    Trainer(single, RegressionTask(global_rng=False), ddp_config(grad_accum_steps=accum),
            tmp_path / "single").fit()

    ddp_weights = load_checkpoint(out / "checkpoint.pt")["model"]
    replica = torch.load(out / "replica_rank1.pt", weights_only=True)
    initial = TinyMLP(dropout=0.0).state_dict()
    for name, tensor in single.state_dict().items():
        torch.testing.assert_close(ddp_weights[name], tensor, atol=1e-5, rtol=0)
        assert torch.equal(replica[name], ddp_weights[name]), name  # DDP kept replicas identical
    assert not torch.allclose(ddp_weights["fc1.weight"], initial["fc1.weight"])  # it did train

    ddp_log, single_log = read_metrics(out), read_metrics(tmp_path / "single")
    assert [(r["step"], r["split"]) for r in ddp_log] == [(r["step"], r["split"]) for r in single_log]
    for a, b in zip(ddp_log, single_log):  # only rank 0 wrote, and the losses agree
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "metrics.jsonl", "replica_rank1.pt",
                                                    "summary.json"]
