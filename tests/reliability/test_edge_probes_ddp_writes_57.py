"""Edge probes of the experiment runner's own rank-0 writes under torchrun (helper 57v).

The experiments tutorial says that under torchrun, if a write fails on rank 0 (a full disk say), every rank stops at
once naming rank 0 and the cause. The trainer's writes were agreed on (``train.distributed._on_every_rank``), but the
runner's own (``manifest.json``, a run's ``run_config.json`` and ``learned_operators.json``, ``results.json``,
``results.md``, the plots) were written by rank 0 alone with nothing said to the others: rank 0 raised, and the
other ranks failed at their next collective with Gloo's bare "Connection reset by peer", or, after the last run,
exited 0 as if the comparison had been written.

Each check launches 2 fresh Gloo ranks (``launch_gloo_ranks``, no fork) running a tiny ``run_experiment`` (2 updates
of a width-8 ViT on digits); each rank records what it raised and how long it took.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "tests" / "train") not in sys.path:  # the 2-rank helpers of the trainer tests
    sys.path.insert(0, str(REPO / "tests" / "train"))

from train_tiny_tasks import RUN_EXPERIMENT_RECORD, launch_gloo_ranks  # noqa: E402

_WORKER = '''
import json, os, sys, time
from pathlib import Path

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments import runner

out, scenario = Path(sys.argv[1]), sys.argv[2]
rank = int(os.environ["RANK"])
raw = {"name": "w57", "seeds": [0], "operators": [{"name": "attention"}], "tasks": [
    {"name": "digits", "dataset": "digits", "model": "vit-digits",
     "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
     "train": {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
               "log_interval": 1, "checkpoint_interval": 2, "device": "cpu"}}]}
cfg = load_experiment_config(raw, [])
results = out / "results"
if scenario == "manifest" and rank == 0:  # a folder where rank 0 writes the comparison's manifest.json
    (results / "w57" / "manifest.json").mkdir(parents=True)
if scenario == "tables" and rank == 0:  # a full disk when rank 0 writes the tables after the last run
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")
    runner._write_outputs = full_disk
if scenario == "resume" and rank == 1:  # rank 1 alone cannot restore its state from the checkpoint
    from diffusionformer.train import trainer

    def damaged(*args, **kwargs):
        raise ValueError("a damaged random-generator state")
    trainer.restore_rng_state = damaged
''' + RUN_EXPERIMENT_RECORD


def _run_ranks(tmp_path: Path, scenario: str, made: bool = False) -> tuple[list[dict], float]:
    """Each rank's record of ``scenario`` (what it raised, its log, its runs' status, its seconds) and the launch's
    wall time; ``made``: ``tmp_path/out`` is there already (with the results of a run made before)."""
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    out = tmp_path / "out"
    out.mkdir(exist_ok=made)
    t0 = time.perf_counter()
    launch_gloo_ranks(script, [str(out), scenario], tmp_path, timeout=60.0)  # a hang fails here (the ranks are killed)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)], time.perf_counter() - t0


@pytest.mark.slow
@pytest.mark.parametrize("scenario, cause", [
    ("manifest", "IsADirectoryError"),  # before anything trains: rank 1 met rank 0's exit at its lock broadcast
    ("tables", "No space left on device"),  # after the last run: rank 1 exited as if all was written
])
def test_bug_a_failed_runner_write_on_rank_0_stops_every_rank_naming_rank_0(tmp_path, scenario, cause):
    (rank0, rank1), seconds = _run_ranks(tmp_path, scenario)
    assert rank0["error"] is not None and cause in rank0["error"], rank0
    assert rank1["error"] is not None, rank1  # it exited as if the comparison had been written
    assert "failed on rank 0" in rank1["error"] and cause in rank1["error"], rank1  # not "Connection reset by peer"
    assert seconds < 60


def test_runner_writes_in_one_process_take_no_collective(tmp_path, monkeypatch):
    """One process (no group joined): the runner's writes are made as before, with no agreement (the runner calls no
    ``_on_every_rank``: no barrier, no store)."""
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments import runner as runner_mod

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(runner_mod, "_on_every_rank", lambda *a, **k: pytest.fail("an agreement in one process"),
                        raising=False)
    monkeypatch.setattr(runner_mod, "_write_outputs", lambda out, *a: (out / "results.json").write_text("[]"))
    raw = {"name": "one57", "seeds": [0], "operators": [{"name": "attention"}], "tasks": [
        {"name": "digits", "dataset": "digits", "model": "vit-digits",
         "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
         "train": {"max_steps": 1, "batch_size": 8, "warmup_steps": 0, "device": "cpu"}}]}
    runner_mod.run_experiment(load_experiment_config(raw, []), tmp_path, progress=False, log=lambda m: None)
    out = tmp_path / "one57"
    assert (out / "manifest.json").is_file() and (out / "results.json").is_file()
    assert (runner_mod.run_dir(out, "digits", "attention", 0) / runner_mod.RUN_CONFIG_NAME).is_file()


@pytest.mark.slow
def test_bug_a_checkpoint_rank_1_alone_cannot_resume_fails_that_run_on_every_rank(tmp_path):
    """A run interrupted after its checkpoint (here: its summary removed) is resumed by 2 ranks, and rank 1 alone
    cannot restore its own random-generator state (a CheckpointError there): rank 1 failed that run and went on while
    rank 0 went on resuming it, their collectives out of step, and the job hung until the process-group timeout (30
    minutes; killed here at 60 s). Every rank now fails that run alone, as one process does, rank 0 saying it was
    rank 1's state, and the comparison goes on."""
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments import runner as runner_mod

    raw = {"name": "w57", "seeds": [0], "operators": [{"name": "attention"}], "tasks": [
        {"name": "digits", "dataset": "digits", "model": "vit-digits",
         "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
         "train": {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
                   "log_interval": 1, "checkpoint_interval": 2, "device": "cpu"}}]}  # the worker's config
    results = tmp_path / "out" / "results"
    runner_mod.run_experiment(load_experiment_config(raw, []), results, progress=False, log=lambda m: None)
    (runner_mod.run_dir(results / "w57", "digits", "attention", 0) / "summary.json").unlink()
    (rank0, rank1), seconds = _run_ranks(tmp_path, "resume", made=True)
    assert rank0["error"] is None and rank1["error"] is None, (rank0, rank1)
    for record in (rank0, rank1):
        assert len(record["status"]) == 1 and record["status"][0].startswith("failed: "), record
    assert "a damaged random-generator state" in rank1["status"][0]
    assert any("not resumed" in m and "failed on rank 1" in m and "a damaged random-generator state" in m
               for m in rank0["log"]), rank0["log"]
    assert rank1["log"] == []  # rank 0 alone says so
    assert seconds < 60
