"""Mutation audit (sitting 50) of the code paths that only run under ``torch.distributed`` with world_size > 1:
train/distributed.py (contexts, reductions, the agreement of every rank on a step only some take, sharding),
train/trainer.py (rank seeds, batch generator, no_sync under accumulation, logged means, buffer broadcast, per-rank
RNG states in checkpoints, rank-0 writes, non-finite agreement), experiments/runner.py and cli.py under torchrun
(rank-0 lock, writes, logs and prints, the manifest's world size) and experiments/tasks.py's graph sharding. No GPU.
The multi-process checks run 2 fresh Gloo ranks (``launch_gloo_ranks``, no fork); the others play one rank in this
process against a real ``HashStore`` or with the process group stood in. The references: the batch generator's draws
redone here (rank 0's shard), each rank's recorded writes, the run folder's files (inode and bytes) before and after.

57 hand mutants (distributed.py 16, trainer.py 22, runner.py 15, tasks.py 2, cli.py 2), each run one at a time
against the multi-process tests (tests/train/test_train_ddp.py, test_edge_probes_ddp_numerics_46.py,
test_edge_probes_distributed_second.py, _third.py, test_edge_probes_dino_center_46.py, the two DDP tests of
tests/reliability/test_mutation_kills_sitting46.py; runner and cli mutants: tests/experiments/
test_edge_probes_torchrun_resume_46.py), the survivors then against the single-process tests that name the code
(tests/train/test_mutation_kills_optim_checkpoint*.py, test_edge_probes_train_fourth.py, _fifth.py,
tests/reliability/test_mutation_kills_sitting47_experiments_train.py, tests/train/test_train_audit.py,
tests/experiments/test_mutation_kills_tasks_minibatch_second_pass.py): 35 killed by earlier tests (5 of them only by
the single-process ones: the agreement's key without its call count, ``owns_group=False`` from init_distributed,
rank 0 re-seeding a resumed one-process checkpoint, strided graph shards, graph shards without the divisibility
check), 15 survivors killed here (distributed.py
1, trainer.py 3, runner.py 9, cli.py 2), 7 equivalent (below). No survivor showed a bug of the library: each was a
documented rule no test pinned (rank 0 alone writes and prints, rank 0's BatchNorm statistics are kept, a failure on
any rank stops every rank, a folder at the lock stops the run).

Equivalent mutants:

* distributed.py ``_raise_on_every_rank`` ``if rank != ctx.rank and store.check([key])`` -> ``if
  store.check([key])``: a rank posts under its own key only with an error, which it then re-raises before the others'
  causes are used; without one its key is absent (the keys are fresh for every call).
* trainer.py ``_save`` ``self.ctx.barrier()`` before the write dropped: every rank has just called
  ``all_gather_object`` of the RNG states (a collective that returns only once every rank has called it), and the
  write is followed by ``_on_every_rank``'s two barriers.
* trainer.py ``_fit`` the two ``ctx.barrier()`` around ``_resume_payload`` dropped: rank 1 writes nothing to the
  out_dir, and rank 0's first write that rank 1's look could see (a log record, a checkpoint) comes after the
  ``DistributedDataParallel`` constructor, a collective every rank reaches only after its look; the resumed logs'
  truncation before it does not touch the checkpoint the other ranks read.
* trainer.py ``_sync_buffers`` ``if self._ddp is None or not self._ddp.broadcast_buffers`` -> ``if self._ddp is
  None``: the trainer builds its DDP wrapper with the default ``broadcast_buffers=True``, and only that one.
* runner.py ``_one_run`` ``if not distributed or _rank_zero(): _release_lock(rdir)`` -> always: ``release_lock``
  removes the lock only when this process (pid, host, start time) holds it, and rank 1 never claimed it.
* runner.py ``_train_one`` ``{"progress": progress and _rank_zero()}`` -> ``{"progress": progress}``: the trainer
  shows its bar only where ``cfg.progress and ctx.is_main``, and ``progress`` is no part of a run's identity.
* runner.py ``run_experiment`` ``if i == 0 and _rank_zero(): out.mkdir(parents=True, exist_ok=True)`` -> ``if i ==
  0:``: rank 1 creates (or finds) the same comparison folder rank 0 creates, ``exist_ok``, and writes nothing in it.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from diffusionformer.train import distributed
from diffusionformer.train.distributed import DistContext
from experiments_tiny_configs import play_torchrun_rank  # tests/experiments is on sys.path (this folder's conftest)

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]


_WRITES_WORKER = textwrap.dedent('''
    import datetime, json, math, os, sys
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    import diffusionformer.train.trainer as trainer_module
    from diffusionformer.train import NonFiniteLossError, Trainer, TrainConfig

    torch.set_num_threads(1)
    RANK = int(os.environ["RANK"])
    OUT = sys.argv[1]
    writes = []
    saved, written = trainer_module.save_checkpoint, trainer_module.write_json_atomic


    def save_recorded(path, payload):
        writes.append(["checkpoint", os.path.relpath(path, OUT), payload["step"]])
        return saved(path, payload)


    def write_recorded(path, data):
        writes.append(["json", os.path.relpath(path, OUT), data.get("status")])
        return written(path, data)


    trainer_module.save_checkpoint, trainer_module.write_json_atomic = save_recorded, write_recorded


    class Task:
        def __init__(self, nan_at=None):
            self.nan_at = nan_at

        def train_batch(self, step, generator, batch_size):
            x = torch.randn(batch_size, 3, generator=generator)
            return {"x": x, "y": x.sum(1, keepdim=True), "step": step}

        def loss(self, model, batch):
            loss = F.mse_loss(model(batch["x"]), batch["y"])
            return (loss + math.nan if batch["step"] == self.nan_at else loss), {}

        def evaluate(self, model, max_batches):
            return {"loss": 0.0}


    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    cfg = dict(batch_size=8, lr=1e-2, min_lr=1e-3, warmup_steps=1, eval_interval=0, log_interval=1,
               checkpoint_interval=2, seed=3, device="cpu", progress=False)
    # 1. BatchNorm (momentum 1: its running statistics are the last forward's shard's) in front of a linear layer
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm1d(3, momentum=1.0), nn.Linear(3, 1))
    Trainer(model, Task(), TrainConfig(max_steps=3, **cfg), os.path.join(OUT, "bn")).fit()
    torch.save({k: v for k, v in model.state_dict().items() if "running" in k}, os.path.join(OUT, f"bn{RANK}.pt"))
    # 2. a NaN loss at update 2 on every rank: the run stops, rank 0 records why
    try:
        Trainer(nn.Linear(3, 1), Task(nan_at=2), TrainConfig(max_steps=4, **cfg), os.path.join(OUT, "nan")).fit()
    except NonFiniteLossError as err:
        writes.append(["stopped", err.step])
    with open(os.path.join(OUT, f"writes{RANK}.json"), "w") as f:
        json.dump(writes, f)
    sys.stdout.flush()
    os._exit(0)
''')


@pytest.fixture(scope="module")
def writes_run(tmp_path_factory):
    """One 2-rank Gloo launch of ``_WRITES_WORKER``: its out folder and each rank's recorded writes."""
    tmp = tmp_path_factory.mktemp("ddp50")
    script = tmp / "worker.py"
    script.write_text(_WRITES_WORKER)
    out = tmp / "out"
    out.mkdir()
    _launcher()(script, [str(out)], tmp)
    return out, [json.loads((out / f"writes{r}.json").read_text()) for r in range(2)]


def _launcher():
    """``launch_gloo_ranks`` of tests/train/train_tiny_tasks.py (loaded by path: tests/train is not on this folder's
    path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_tiny_tasks_50", REPO / "tests" / "train" / "train_tiny_tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.launch_gloo_ranks


@pytest.mark.slow
def test_kills_only_rank_0_writes_checkpoints_and_summaries(writes_run):
    """kills (one 2-rank Gloo launch, the trainer's writers wrapped to record each call):

    * train/trainer.py ``_fit`` ``_on_every_rank(..., lambda: write_json_atomic(self.summary_path, summary),
      here=ctx.is_main)`` -> ``here=True`` (every rank wrote summary.json, racing over one file);
    * ``_fail_non_finite`` ``if self.ctx.is_main: write_json_atomic(...)`` -> ``if True:`` (every rank wrote the
      "non_finite" summary).

    The class docstring: "only rank 0 writes files". Also pinned here, by a record of each call rather than by a race
    (tests/train/test_train_ddp.py killed both): ``_save``'s ``here=self.ctx.is_main`` -> ``here=True`` (every rank
    wrote checkpoint.pt, each with its own ``rng``) and ``open_loggers(..., active=ctx.is_main)`` -> ``active=True``
    (every rank appended each record to metrics.jsonl)."""
    out, (rank0, rank1) = writes_run
    assert rank1 == [["stopped", 2]], rank1
    assert rank0 == [["checkpoint", "bn/checkpoint.pt", 2], ["checkpoint", "bn/checkpoint.pt", 3],
                     ["json", "bn/summary.json", "completed"], ["checkpoint", "nan/checkpoint.pt", 2],
                     ["json", "nan/summary.json", "non_finite"], ["stopped", 2]], rank0
    records = [json.loads(line) for line in (out / "bn" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["split"]) for r in records] == [(1, "train"), (2, "train"), (3, "train"), (3, "eval")]


@pytest.mark.slow
def test_kills_batchnorm_statistics_kept_are_rank_0s_shard(writes_run):
    """kills: train/trainer.py ``_sync_buffers`` ``torch.distributed.broadcast(flat, 0)`` -> ``broadcast(flat,
    self.ctx.world_size - 1)`` (every rank, and the checkpoint, kept the last rank's running statistics, not rank
    0's as the class docstring says: "rank 0's running statistics are kept (every rank evaluates with them)"). With
    BatchNorm's momentum 1 the running mean is the mean of the last forward's input: rank 0's shard of the last global
    batch, rows 0..3 of 8, drawn here from the trainer's batch generator (seeded with ``seed``)."""
    out, _ = writes_run
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        x = torch.randn(8, 3, generator=g)
    want = x[:4].mean(0)
    kept = torch.load(out / "bn" / "checkpoint.pt", weights_only=False)["model"]["0.running_mean"]
    torch.testing.assert_close(kept, want, rtol=0, atol=1e-6)
    for r in range(2):
        assert torch.equal(torch.load(out / f"bn{r}.pt", weights_only=True)["0.running_mean"], kept)


def _files(rdir: Path) -> dict[str, tuple[int, bytes]]:
    """Each file of a run folder: its inode (an atomic rewrite makes a new one) and bytes."""
    return {p.name: (p.stat().st_ino, p.read_bytes()) for p in sorted(rdir.iterdir()) if p.is_file()}


def test_kills_runner_rank_1_of_torchrun_writes_removes_and_prints_nothing(tmp_path, monkeypatch, capsys):
    """kills (this process plays rank 1 of a 2-process torchrun job, ``RANK=1``, ``WORLD_SIZE=2``, through
    ``python -m diffusionformer.experiments run``; the process group and the trainer, which need rank 0, are
    stand-ins). Rank 0 alone prints and writes (``train.distributed._rank_zero``: "the one that prints and writes"):

    * experiments/runner.py ``_train_one`` ``if not resume and rdir.exists() and _rank_zero():`` -> without
      ``_rank_zero()`` (with --restart every rank emptied the run folder: rank 1, a little late, removed the
      run_config.json rank 0 had just written, or failed on a file rank 0 had removed first);
    * ``if _rank_zero(): rdir.mkdir(...); write_json_atomic(rdir / RUN_CONFIG_NAME, identity)`` -> ``if True:`` (every
      rank rewrote run_config.json);
    * ``if _rank_zero(): learned = _learned(model) ...`` -> ``if True:`` (every rank rewrote learned_operators.json);
    * ``if _rank_zero(): _restore_learned(...)`` -> ``if True:`` (every rank rewrote a finished run's missing
      learned_operators.json from its checkpoint);
    * ``if _rank_zero() and len(sizes) > 1:`` -> ``if len(sizes) > 1:`` (every rank logged the note on a run resumed
      under another number of processes);
    * ``run_experiment`` ``if not done_before and not recorded and _rank_zero():`` -> without ``_rank_zero()`` (every
      rank rewrote manifest.json); ``if _rank_zero() and result is not None and not done_before:`` -> without
      ``_rank_zero()``, and the last ``if _rank_zero(): _write_outputs(...)`` -> ``if True:`` (every rank rewrote the
      tables and plots);
    * experiments/cli.py ``_size_threads`` ``if _rank_zero(): print(plan.describe(), ...)`` -> ``if True:`` and
      ``main``'s ``if _rank_zero(): _print(); _print(format_table(...))`` -> ``if True:`` (every rank printed the
      thread plan and the results table).

    The run is trained for real by one process first (2 updates of a width-8 ViT on digits, a learnable heat head)."""
    from test_experiments_runner import _to_toml  # tests/experiments is on sys.path (this folder's conftest)

    from diffusionformer.experiments import cli, threads
    from diffusionformer.experiments import runner as runner_mod
    from diffusionformer.experiments.results import run_dir

    raw = {"name": "r50", "seeds": [0], "operators": [
        {"name": "heat", "heads": "attention:1,heat(t=0.5, learnable=True, steps=2):1"}], "tasks": [
        {"name": "digits", "dataset": "digits", "model": "vit-digits",
         "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
         "train": {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
                   "log_interval": 1, "checkpoint_interval": 2, "device": "cpu"}}]}
    toml = tmp_path / "r50.toml"
    toml.write_text(_to_toml(raw))
    outputs: list = []
    monkeypatch.setattr(runner_mod, "_write_outputs", lambda *a, **k: outputs.append(a[0]))  # no tables: fast
    monkeypatch.setattr(threads, "apply_threads", lambda plan: None)  # this test process keeps its thread count
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    run = ["run", str(toml), "--out", str(tmp_path), "--no-progress"]
    assert cli.main(run) == 0
    rdir = run_dir(tmp_path / "r50", "digits", "heat", 0)
    assert (rdir / "learned_operators.json").is_file() and outputs
    capsys.readouterr()
    (rdir / "old.txt").write_text("a file of the run before the restart")
    before = _files(rdir), _files(tmp_path / "r50")

    class Rank1Trainer:  # rank 1's trainer writes nothing (rank 0's writes the summary, here already on disk)
        def __init__(self, model, adapter, config, out_dir, resume=True):
            pass

        def fit(self):
            summary = json.loads((rdir / "summary.json").read_text())
            return {**summary, "world_sizes": [1, 2], "resumed_from": 2}  # as rank 0's after a resume by 2 ranks

    play_torchrun_rank(monkeypatch, 1, Rank1Trainer)
    outputs.clear()
    cli.main([*run, "--restart"])
    assert (_files(rdir), _files(tmp_path / "r50")) == before
    (rdir / "learned_operators.json").unlink()  # a run killed between its summary and this file
    cli.main(run)
    assert not (rdir / "learned_operators.json").exists()
    assert outputs == [] and capsys.readouterr() == ("", "")


def test_kills_runner_a_folder_at_the_lock_stops_rank_0_of_torchrun(tmp_path, monkeypatch):
    """kills: experiments/runner.py ``_one_run`` ``if isinstance(holder, OSError): raise holder`` -> ``pass`` (under
    torchrun a folder where a run's lock goes was taken for another process holding the run: rank 0 and, from its
    broadcast, every rank skipped the run without training it, logging "skipped: ... is training it", instead of
    stopping with the error naming the folder, as one process does). This process plays rank 0; the broadcast is a
    stand-in that leaves rank 0's value."""

    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments import runner as runner_mod
    from diffusionformer.experiments.results import run_dir
    from diffusionformer.experiments.store import LOCK_NAME

    raw = {"name": "l50", "seeds": [0], "operators": [{"name": "attention"}], "tasks": [
        {"name": "digits", "dataset": "digits", "model": "vit-digits",
         "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
         "train": {"max_steps": 2, "batch_size": 8, "warmup_steps": 0, "device": "cpu"}}]}
    cfg = load_experiment_config(raw, [])
    (run_dir(tmp_path / "l50", "digits", "attention", 0) / LOCK_NAME).mkdir(parents=True)
    play_torchrun_rank(monkeypatch, 0, lambda *a, **k: pytest.fail("trained"))
    logged: list = []
    with pytest.raises(IsADirectoryError, match=r"\.lock is a folder, not a lock file"):
        runner_mod.run_experiment(cfg, tmp_path, progress=False, log=logged.append)
    assert logged == []


def test_kills_a_failure_on_rank_1_alone_stops_rank_0(monkeypatch):
    """kills: train/distributed.py ``_raise_on_every_rank`` ``store.set(keys[ctx.rank], ...)`` -> ``store.set(keys[0],
    ...)`` (a failing rank posted its cause under rank 0's key, which rank 0 does not read: a step that failed on rank
    1 alone, a logger's write there, left rank 0 going on to its next collective, where it waited until the
    process-group timeout). Two ranks of one group are played in this process against a real ``HashStore`` (the
    group's store), in the order they call; the barriers are no-ops (rank 1 posts before rank 0 reads)."""
    store = dist.HashStore()
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: store)
    monkeypatch.setattr(distributed, "_agreements", iter([4, 4]))  # rank 1's, rank 0's: the same count
    monkeypatch.setattr(DistContext, "barrier", lambda self: None)
    with pytest.raises(ValueError, match="bad row"):
        distributed._raise_on_every_rank(DistContext(1, 2, 1, CPU), ValueError("bad row"), "writing the train record")
    with pytest.raises(RuntimeError, match=r"^writing the train record failed on rank 1 \(ValueError: bad row\); "
                                           r"rank 0 stops too"):
        distributed._raise_on_every_rank(DistContext(0, 2, 0, CPU), None, "writing the train record")
