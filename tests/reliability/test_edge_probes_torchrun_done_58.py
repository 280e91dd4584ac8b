"""Edge probes of the experiment runner's per-run decisions under torchrun (helper 58a).

Found: each rank decided from its own reading of the results folder whether a run was finished (``done_before``,
before the run's lock: the manifest's and the tables' agreements hang on it) and whether to read it back or train it
(its ``summary.json``, under the lock). A worker sharing the comparison (a second ``run``, which the runner's locks
allow) that finished the run between two ranks' reads split them (as does a rank whose node sees the folder
otherwise): one rank skipped an agreement the other waited in, or trained the run alone, and the job hung until the
process-group timeout (30 minutes; killed here at 60 s) or failed on Gloo's "Connection closed by peer". The
decision is now rank 0's, broadcast to every rank (``runner._rank_zero_reads``, which the lock's claim already used).
And rank 0 released a run's lock alone: where that failed (a folder made read-only, say) rank 0 stopped with a bare
``PermissionError`` and the other ranks went on to their next collective, unaware; the release is now agreed, every
rank stops naming rank 0, and the error says that the lock is left in place and what becomes of it.

The races are simulated deterministically: the reader of one rank is patched to see the state before (or after) the
other worker's last write. Each check launches 2 fresh Gloo ranks (``launch_gloo_ranks``, no fork) running a tiny
``run_experiment`` (2 updates of a width-8 ViT on digits); each rank records what it raised, its log and its runs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

TRAIN_TESTS = str(Path(__file__).resolve().parents[1] / "train")  # the 2-rank launcher of the trainer tests
if TRAIN_TESTS not in sys.path:
    sys.path.insert(0, TRAIN_TESTS)
from train_tiny_tasks import RUN_EXPERIMENT_RECORD, launch_gloo_ranks  # noqa: E402

RAW = {"name": "w58", "seeds": [0], "operators": [{"name": "attention"}], "tasks": [
    {"name": "digits", "dataset": "digits", "model": "vit-digits",
     "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2},
     "train": {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "warmup_steps": 0, "eval_interval": 2,
               "log_interval": 1, "checkpoint_interval": 2, "device": "cpu"}}]}

_WORKER = '''
import json, os, sys, time
from pathlib import Path

from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments import runner

out, scenario, raw = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
rank = int(os.environ["RANK"])
cfg = load_experiment_config(raw, [])
results = out / "results"
if scenario == "done" and rank == 0:  # rank 0 looked before the other worker wrote the run's final summary
    seen = []
    real = runner._completed

    def before_the_worker_finished(rdir):
        seen.append(rdir)
        return False if len(seen) == 1 else real(rdir)
    runner._completed = before_the_worker_finished
if scenario == "summary" and rank == 1:  # rank 1 could not read the summary (another node's view)
    real_read = runner.read_json_dict
    runner.read_json_dict = lambda path: None if path.name == "summary.json" else real_read(path)
if scenario == "release" and rank == 0:  # the run's folder made read-only: the lock cannot be removed
    def read_only(rdir):
        raise PermissionError(13, "Permission denied", str(rdir / runner.LOCK_NAME))
    runner._release_lock = read_only
''' + RUN_EXPERIMENT_RECORD


def _finished_run(tmp_path: Path) -> Path:
    """The comparison's one run, trained to the end by one process (the other worker); its folder."""
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments import runner as runner_mod

    results = tmp_path / "out" / "results"
    runner_mod.run_experiment(load_experiment_config(RAW, []), results, progress=False, log=lambda m: None)
    return runner_mod.run_dir(results / "w58", "digits", "attention", 0)


def _run_ranks(tmp_path: Path, scenario: str) -> tuple[list[dict], float]:
    """Each rank's record of ``scenario`` and the launch's wall time (a hang fails in the launch: killed at 60 s)."""
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    launch_gloo_ranks(script, [str(out), scenario, json.dumps(RAW)], tmp_path, timeout=60.0)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)], time.perf_counter() - t0


@pytest.mark.slow
@pytest.mark.parametrize("scenario", [
    "done",  # before the lock: rank 0 alone called the manifest's and the tables' agreements (the job hung)
    # under the lock: rank 1 alone resumed the run from its checkpoint while rank 0 read it back and ended (rank 1
    # failed with Gloo's "Connection closed by peer"; with runs after it, the ranks' collectives went out of step)
    "summary",
])
def test_bug_a_run_finished_between_two_ranks_reads_takes_one_way_on_every_rank(tmp_path, scenario):
    rdir = _finished_run(tmp_path)
    files = {p.name: p.stat().st_mtime_ns for p in rdir.iterdir()}
    (rank0, rank1), seconds = _run_ranks(tmp_path, scenario)  # it hung: the launch failed at its timeout
    assert rank0["error"] is None and rank1["error"] is None, (rank0, rank1)
    assert rank0["status"] == rank1["status"] == ["completed"], (rank0, rank1)
    assert {p.name: p.stat().st_mtime_ns for p in rdir.iterdir()} == files  # read back, not trained again
    assert rank1["log"] == []
    assert seconds < 60


@pytest.mark.slow
def test_bug_a_failed_lock_release_on_rank_0_stops_every_rank_saying_the_lock_is_left(tmp_path):
    """Rank 0 could not remove the lock of the run it had just trained: it stopped alone, with a bare
    ``PermissionError``, while rank 1 went on to the tables' agreement, where it met rank 0's exit (Gloo's "Connection
    reset by peer"). Every rank now stops naming rank 0, and each says the lock is left in place."""
    (rank0, rank1), seconds = _run_ranks(tmp_path, "release")
    lock = "w58/runs/digits/attention/seed0/.lock"
    assert rank0["error"] is not None and rank0["error"].startswith("PermissionError: "), rank0
    assert rank1["error"] is not None and "releasing the lock" in rank1["error"], rank1
    assert "failed on rank 0" in rank1["error"] and "PermissionError" in rank1["error"], rank1
    for record in (rank0, rank1):
        assert lock in record["error"] and "is left in place" in record["error"], record
        assert "once this process (under torchrun: this job) has exited takes it over" in record["error"], record
    assert (tmp_path / "out" / "results" / lock).is_file()  # as the message says
    assert seconds < 60


def test_failed_lock_release_in_one_process_keeps_its_error_type_and_says_the_lock_is_left(tmp_path, monkeypatch):
    """One process: the release is no agreement (no collective, no broadcast: the decisions are its own reads, as
    before); a failed one raises the same ``PermissionError``, now saying what becomes of the lock."""
    import torch.distributed as tdist

    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments import runner as runner_mod

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(runner_mod, "_on_every_rank", lambda *a, **k: pytest.fail("an agreement in one process"))
    monkeypatch.setattr(tdist, "broadcast_object_list", lambda *a, **k: pytest.fail("a broadcast in one process"))
    monkeypatch.setattr(runner_mod, "_write_outputs", lambda out, *a: None)
    cfg = load_experiment_config({**RAW, "tasks": [{**RAW["tasks"][0], "train": {**RAW["tasks"][0]["train"],
                                                                                   "max_steps": 1}}]}, [])
    runner_mod.run_experiment(cfg, tmp_path, progress=False, log=lambda m: None)  # trains: every decision read
    runner_mod.run_experiment(cfg, tmp_path, progress=False, log=lambda m: None)  # reads it back
    rdir = runner_mod.run_dir(tmp_path / "w58", "digits", "attention", 0)
    assert not (rdir / runner_mod.LOCK_NAME).exists()

    def read_only(path):
        raise PermissionError(13, "Permission denied", str(path / runner_mod.LOCK_NAME))
    monkeypatch.setattr(runner_mod, "_release_lock", read_only)
    with pytest.raises(PermissionError, match=r"Permission denied.*\.lock'; the run's lock .*\.lock is left in "
                                              r"place: a run started on this host once this process"):
        runner_mod.run_experiment(cfg, tmp_path, progress=False, log=lambda m: None)
