"""A reproducibility auditor's walk through the runner (edge probes, sitting 57).

Verified sound and not repeated here (see the tests named): one config run into two result roots gives the same
weights and logs (test_edge_probes_reproducibility_54.py); kills through ``run`` right after a checkpoint, between
a log write and a checkpoint, in an evaluation, in the last update, with a half-written log line
(test_edge_probes_resume_matrix.py covers the trainer side of each); ``--workers 2`` trains each run once and keeps
every row; truncated, bit-flipped, empty or foreign checkpoints fail their run alone with advice, loaded with
``weights_only``.

Found: a run resumed under another torch thread count was recorded nowhere as such (the comparison's manifest
lists the counts, and ``run`` said nothing once the comparison had seen the new count); a resume that only writes
the summary after the final checkpoint was recorded as trained by another number of processes; ``status`` called a
checkpoint that ``run`` refuses as corrupt (a CRC mismatch) resumable; and the runner's "not resumed" line doubled
the full stop of a checkpoint error that ends in one.

Found, not fixed: a task's ``eval_batch_size`` is no part of a run's identity, though it decides what a text task's
evaluation measures (its windows), a DINO task's validation loss (its images) and a sampled node evaluation's
neighbourhoods: ``run --set tasks.T.eval_batch_size=N`` reads finished runs back as the changed config's, and a
resumed run mixes two protocols in its log.
"""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

import diffusionformer.train.trainer as trainer_mod
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import run_status
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.experiments.tables import format_status
from diffusionformer.testing import interrupt_on_call

_TRAIN = {"max_steps": 4, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
          "checkpoint_interval": 2}


def _config(seeds):
    return load_experiment_config({
        "name": "audit", "seeds": list(seeds), "operators": [{"name": "attention"}],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2}, "train": _TRAIN}]})


def _run(root, seeds, threads, said=None):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return run_experiment(_config(seeds), root, progress=False, log=(said if said is not None else []).append)
    finally:
        torch.set_num_threads(before)


def test_bug_a_run_resumed_under_another_thread_count_is_recorded_and_noted(tmp_path):
    """Bug: a run killed after its checkpoint of step 2 under 1 torch thread and resumed under 2 ends with the
    numbers of no uninterrupted run (a CPU reduction split over other threads rounds otherwise), yet its summary and
    checkpoint recorded no thread count, and where the comparison had already trained under 2 threads (another
    seed's invocation) ``run`` said nothing at all: the manifest's counts cover the comparison, not the run. Now the
    trainer keeps every CPU thread count of the run (``torch_threads`` of its checkpoint and summary, as
    ``world_sizes``) and ``run`` notes a run trained under several, naming it."""
    if torch.cuda.is_available():
        pytest.skip("trained on the GPU: the CPU thread count does not decide the numbers")
    with interrupt_on_call(trainer_mod.Trainer, "_update", 3), pytest.raises(KeyboardInterrupt):
        _run(tmp_path, [0], threads=1)
    _run(tmp_path, [1], threads=2)  # the comparison has now seen 2 threads: its own note stays silent below
    said: list[str] = []
    _run(tmp_path, [0], threads=2, said=said)
    rdir = run_dir(tmp_path / "audit", "digits", "attention", 0)
    summary = json.loads((rdir / "summary.json").read_text())
    assert summary["resumed_from"] == 2 and summary["torch_threads"] == [1, 2]
    notes = [s for s in said if "thread" in s]
    assert len(notes) == 1 and "[digits / attention / seed 0]" in notes[0] and "1 then 2 torch thread" in notes[0]
    # the seed trained whole under one count: one count, no note
    whole = json.loads((run_dir(tmp_path / "audit", "digits", "attention", 1) / "summary.json").read_text())
    assert whole["torch_threads"] == [2] and whole["resumed_from"] is None


def test_a_resume_with_only_the_summary_left_adds_no_thread_count(tmp_path):
    """Killed right after its final checkpoint (before ``summary.json``), the run trained every step under 1 thread:
    resumed under 2, which only writes the summary, it records 1 alone and ``run`` notes nothing."""
    if torch.cuda.is_available():
        pytest.skip("trained on the GPU: the CPU thread count does not decide the numbers")
    with interrupt_on_call(trainer_mod, "save_checkpoint", 2, after=True), pytest.raises(KeyboardInterrupt):
        _run(tmp_path, [0], threads=1)
    said: list[str] = []
    _run(tmp_path, [0], threads=2, said=said)
    summary = json.loads((run_dir(tmp_path / "audit", "digits", "attention", 0) / "summary.json").read_text())
    assert summary["resumed_from"] == 4 and summary["torch_threads"] == [1]
    assert not [s for s in said if "torch thread(s) on the CPU" in s]


def test_bug_a_resume_with_only_the_summary_left_is_no_resume_under_another_number_of_processes(tmp_path):
    """Bug: the final checkpoint of a run trained by 2 processes (torchrun), its summary not yet written, finished by
    one process (which only writes the summary: every update, log record and evaluation was the 2 processes') was
    recorded as trained "by 2 then 1 process(es)", and ``run`` noted that its numbers were those of no uninterrupted
    run, though they were the 2-process run's. (The checkpoint is a one-process run's, relabelled as torchrun's.)"""
    with interrupt_on_call(trainer_mod, "save_checkpoint", 2, after=True), pytest.raises(KeyboardInterrupt):
        _run(tmp_path, [0], threads=torch.get_num_threads())
    path = run_dir(tmp_path / "audit", "digits", "attention", 0) / "checkpoint.pt"
    payload = torch.load(path, weights_only=True)
    torch.save({**payload, "world_size": 2, "world_sizes": [2], "rank_rng": [payload["rng"]] * 2}, path)
    said: list[str] = []
    _run(tmp_path, [0], threads=torch.get_num_threads(), said=said)
    summary = json.loads((path.parent / "summary.json").read_text())
    assert summary["resumed_from"] == 4 and summary["world_sizes"] == [2]
    assert not [s for s in said if "process(es)" in s]


def _flip_a_tensor_byte(path):
    """Flips a byte inside the first tensor's bytes of the checkpoint ``path``: its CRC-32 no longer matches (the
    pickle, and the step it holds, still load)."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size > 8)
    raw = bytearray(path.read_bytes())
    head = info.header_offset  # the local header: its name and extra field (torch's alignment padding) lengths
    start = head + 30 + int.from_bytes(raw[head + 26:head + 28], "little") + int.from_bytes(raw[head + 28:head + 30],
                                                                                             "little")
    raw[start + 4] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_bug_the_not_resumed_line_ends_a_checkpoint_error_with_one_full_stop(tmp_path):
    """Bug: ``run``'s line for a checkpoint that does not load joined the error and its advice with ". ", and the
    error of a damaged file ends in a full stop itself: "... Delete it (or resume from another copy) to continue..
    Delete ..."."""
    _run(tmp_path, [0], threads=torch.get_num_threads())
    rdir = run_dir(tmp_path / "audit", "digits", "attention", 0)
    (rdir / "summary.json").unlink()
    _flip_a_tensor_byte(rdir / "checkpoint.pt")
    said: list[str] = []
    results = _run(tmp_path, [0], threads=torch.get_num_threads(), said=said)
    assert results[0].status.startswith("failed")
    line = next(s for s in said if "not resumed" in s)
    assert "is corrupt" in line and ".." not in line and "to continue. Delete" in line


def test_bug_status_calls_a_checkpoint_that_run_refuses_as_corrupt_unreadable(tmp_path):
    """Bug: ``status`` read an interrupted run's step from its checkpoint without the CRC check ``run`` makes, so a
    checkpoint with a flipped byte in its tensors (which ``run`` refuses as corrupt, failing the run each time) was
    an interrupted run that "resumes from step 4" with no training left, not one whose checkpoint is unreadable."""
    _run(tmp_path, [0], threads=torch.get_num_threads())
    rdir = run_dir(tmp_path / "audit", "digits", "attention", 0)
    (rdir / "summary.json").unlink()
    row = run_status(_config([0]), tmp_path)[0]
    assert row["state"] == "interrupted" and row["resumes_from"] == 4  # whole: it resumes at its last step
    _flip_a_tensor_byte(rdir / "checkpoint.pt")
    row = run_status(_config([0]), tmp_path)[0]
    assert row["state"] == "interrupted" and row["resumes_from"] is None
    assert "(its checkpoint is unreadable)" in format_status([row])
