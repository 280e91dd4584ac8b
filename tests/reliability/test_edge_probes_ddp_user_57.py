"""Edge probes of a user training with torchrun / DDP on CPU (Gloo) through the trainer and the experiment runner
(helper 57r, round 2).

Verified sound and not repeated here (2 Gloo ranks through ``launch_gloo_ranks``, tiny regression task, float32): a
2-rank run ends within 3e-8 of one process on the global batch, its eval records equal one process's bit for bit
and every rank's summary holds the same numbers; a 1-process run killed after its checkpoint and resumed by 2 ranks,
and a 2-rank one resumed by 1 process, list ``world_sizes`` ``[1, 2]`` / ``[2, 1]`` with one ``torch_threads`` and
``torch_versions`` entry each, written by rank 0 alone; an idle resume (of a finished run, by the other number of
processes) rewrites neither checkpoint nor log and adds no count; a resume at ``max_steps`` of a longer run's
checkpoint that cut a log window (evaluated there) logs that window once and adds no count; every (step, split)
record is logged once.

Found: a single process (``WORLD_SIZE`` unset or blank) whose environment holds a stray ``RANK`` other than 0 trained
its runs (the trainer reads it as one process, rank 0) while the experiment runner took it for a non-zero rank of
a torchrun job and wrote none of the comparison's files (no ``run_config.json``, manifest, results or table); under
torchrun every rank printed the runner's "stopped: non-finite ...", "not resumed: ..." and "summary.json is
unreadable" lines; ``batch_size=6, grad_accum_steps=2`` on 2 ranks failed at the first update telling the user to
make batch_size a multiple of the number of processes (it is one) rather than of processes x grad_accum_steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.train import DistContext, Trainer, shard_batch
from diffusionformer.train.distributed import _rank_zero, dist_env

TRAIN_TESTS = str(Path(__file__).resolve().parents[1] / "train")  # the trainer tests' tiny model and task
if TRAIN_TESTS not in sys.path:
    sys.path.insert(0, TRAIN_TESTS)
from train_tiny_tasks import RegressionTask, TinyMLP, ddp_config  # noqa: E402
from experiments_tiny_configs import play_torchrun_rank  # noqa: E402  (tests/experiments: conftest)

TINY = {
    "name": "tiny",
    "seeds": [0],
    "tasks": [{
        "name": "digits", "dataset": "digits", "model": "vit-digits",
        "model_overrides": {"dim": 16, "depth": 1, "num_heads": 2},
        "train": {"max_steps": 2, "batch_size": 16, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
                  "log_interval": 2, "checkpoint_interval": 2},
    }],
    "operators": [{"name": "attention"}],
}


@pytest.mark.parametrize("world", [None, "", " ", "1"])
def test_bug_a_stray_rank_in_one_process_is_rank_zero_as_the_trainer_reads_it(monkeypatch, world):
    """A ``RANK`` left in the environment (another job's, a shell's) of one process: ``dist_env`` reads no group (the
    trainer then writes as rank 0), and so must ``_rank_zero`` (it said "not rank 0" for ``RANK=1``)."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "1")
    if world is not None:
        monkeypatch.setenv("WORLD_SIZE", world)
    if world != "1":  # (WORLD_SIZE=1 with RANK=1 is refused by dist_env, naming both)
        assert dist_env() is None
    assert _rank_zero()


def test_bug_runner_of_one_process_with_a_stray_rank_writes_the_comparison(tmp_path, monkeypatch):
    """The user-facing symptom: ``run`` with ``RANK=1`` and no ``WORLD_SIZE`` trained the run (its checkpoint and log
    were written by the trainer) but left no ``run_config.json``, ``manifest.json``, ``results.json`` or table."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "1")
    results = run_experiment(load_experiment_config(TINY), tmp_path, progress=False)
    assert [r.status for r in results] == ["completed"]
    out = tmp_path / "tiny"
    for name in ("manifest.json", "results.json", "results.md"):
        assert (out / name).is_file(), name
    assert (run_dir(out, "digits", "attention", 0) / "run_config.json").is_file()


@pytest.mark.parametrize("case", ["non_finite", "checkpoint", "unreadable_summary"])
def test_bug_rank_1_of_torchrun_logs_no_run_message(tmp_path, monkeypatch, case):
    """This process plays rank 1 of a 2-process torchrun job (the process group and rank 0's trainer are stand-ins):
    every rank reaches the runner's "stopped: non-finite ..." and "not resumed: ..." lines (the trainer raises on
    every rank alike) and its "summary.json is unreadable" line, so each was printed once per process, where the
    runner's other notes are rank 0's alone."""

    from diffusionformer.experiments import runner as runner_mod
    from diffusionformer.train import CheckpointError, NonFiniteLossError

    rdir = run_dir(tmp_path / "tiny", "digits", "attention", 0)
    if case == "unreadable_summary":
        rdir.mkdir(parents=True)
        (rdir / "summary.json").write_text("{ half written")

    class Rank1Trainer:
        def __init__(self, model, adapter, config, out_dir, resume=True):
            pass

        def fit(self):
            if case == "non_finite":
                raise NonFiniteLossError("non-finite training loss at step 1; training stopped", step=1,
                                         last_checkpoint_step=None)
            if case == "checkpoint":
                raise CheckpointError(f"checkpoint {rdir / 'checkpoint.pt'}: expected a mapping")
            return {"status": "completed", "step": 2, "world_sizes": [2], "torch_threads": [1],
                    "torch_versions": ["x"], "eval": None, "train": None}

    play_torchrun_rank(monkeypatch, 1, Rank1Trainer)
    monkeypatch.setattr(runner_mod, "_result_from_files", lambda task, setting, seed, rdir, summary: None)
    logged: list[str] = []
    run_experiment(load_experiment_config(TINY), tmp_path, progress=False, log=logged.append)
    assert logged == []


def test_bug_accumulation_under_ddp_names_processes_times_micro_batches():
    """``batch_size=6, grad_accum_steps=2`` passes the config's check (a multiple of 2) and splits over 2 ranks, but
    each rank's 3 rows do not split into 2 micro-batches: the error said the batch of ``task.train_batch`` (6 rows,
    which does split) must be divisible by 2 and, from ``shard_batch``, to "set batch_size to a multiple of the number
    of processes" (6 is one). It now names this rank's share and the multiple needed, processes x grad_accum_steps.
    (Checked on 2 Gloo ranks; here rank 0's update runs on a stand-in context.)"""
    trainer = Trainer(TinyMLP(dropout=0.0), RegressionTask(global_rng=False),
                      ddp_config(batch_size=6, grad_accum_steps=2), "unused")
    trainer.ctx = DistContext(0, 2, 0, torch.device("cpu"))
    half = shard_batch({"x": torch.zeros(6, 4)}, 0, 2)
    with pytest.raises(ValueError, match=r"this rank's share \(1/2\) of the batch of task\.train_batch\(step=0, "
                                         r"\.\.\.\) to split into 2 equal micro-batches: set batch_size to a multiple "
                                         r"of 4 \(2 processes x grad_accum_steps=2\), got 6"):
        trainer._micro_batch(shard_batch, half, 0, 0)
    trainer.ctx = DistContext(0, 1, 0, torch.device("cpu"))  # one process: as before
    with pytest.raises(ValueError, match=r"grad_accum_steps=2: expected the batch of task\.train_batch\(step=0, "
                                         r"\.\.\.\) to split into 2 equal micro-batches \(dim 0 divisible by 2\)"):
        trainer._micro_batch(shard_batch, {"x": torch.zeros(3, 4)}, 0, 0)
