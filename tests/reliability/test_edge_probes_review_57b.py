"""Review of 1e93cdd (per-run ``torch_threads``, the idle-resume rule, status's CRC check) and 0d0f083 (the censored
k-fold reach contrast labelled Nadeau-Bengio).

Verified sound and not repeated here: ``--workers 2`` trains each run whole under one count (no note), and a resume
under the same ``$OMP_NUM_THREADS`` with another ``--workers`` keeps the count (``$OMP_NUM_THREADS`` wins); a GPU or
MPS segment records no count; the summary's readers (status, publish, analyze, tables, RunResult) read it with
``.get``, so summaries without ``torch_threads`` read as before; ``status`` reads a legacy (non-zip) checkpoint's
step, and checks the CRC of interrupted runs' checkpoints only (about 20 ms per cached 50 MB file, as ``run``'s load);
0d0f083's method label reaches no table or legend (only ``Contrast.diff.method`` of :func:`contrasts`).

Found: the run notes named the last resume's step as the one resumed under another count or number; a resume at
``max_steps`` that only logs the window a longer run's checkpoint cut was recorded as trained under its count; and
every checkpoint entry read (a model record too) went through the CRC check meant for status's resume step.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import diffusionformer.train.trainer as trainer_mod
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.models import DiffusionViT, ViTConfig, register_model
from diffusionformer.testing import interrupt_on_call


def _module(name, path):
    """The test helper module at ``path`` (tests/train is not on this folder's path; tests load by path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TINY = _module("_tiny_tasks_57b", Path(__file__).resolve().parents[1] / "train" / "train_tiny_tasks.py")
# the sitting-57 audit's comparison of one tiny ViT task (_run: seeds trained under a torch thread count) and its
# _flip_a_tensor_byte (the checkpoint's CRC-32 fails; its pickle, the step and model record, still loads)
_REPRO = _module("_repro_57_of_57b", Path(__file__).with_name("test_edge_probes_repro_57.py"))
_run, _flip_a_tensor_byte, _TRAIN = _REPRO._run, _REPRO._flip_a_tensor_byte, _REPRO._TRAIN


def test_bug_the_thread_note_names_no_step_the_count_did_not_change_at(tmp_path):
    """Bug: a run killed at step 2 under 1 thread, resumed under 2 and killed after its final checkpoint, then
    finished (the summary only) under 2, was noted as "resumed from step 4 under another count": its last resume,
    which trained nothing under the same count; the count changed at step 2. The note no longer claims a step it
    cannot know (the summary keeps the last resume's only); as the process note."""
    if torch.cuda.is_available():
        pytest.skip("trained on the GPU: the CPU thread count does not decide the numbers")
    with interrupt_on_call(trainer_mod.Trainer, "_update", 3), pytest.raises(KeyboardInterrupt):
        _run(tmp_path, [0], threads=1)
    with interrupt_on_call(trainer_mod, "save_checkpoint", 1, after=True), pytest.raises(KeyboardInterrupt):
        _run(tmp_path, [0], threads=2)
    said: list[str] = []
    _run(tmp_path, [0], threads=2, said=said)
    summary = json.loads((run_dir(tmp_path / "audit", "digits", "attention", 0) / "summary.json").read_text())
    assert summary["resumed_from"] == 4 and summary["torch_threads"] == [1, 2]
    notes = [s for s in said if "torch thread(s) on the CPU" in s]
    assert len(notes) == 1 and "1 then 2 torch thread" in notes[0]
    assert "from step 4" not in notes[0]


def test_bug_a_resume_at_max_steps_that_only_logs_the_cut_window_adds_no_thread_count(tmp_path):
    """Bug: a longer run's checkpoint of step 2 (evaluated there, its log window cut) resumed with ``max_steps=2``
    only logs that window (sums over counts, the same under any thread count) and checkpoints again: it trains and
    evaluates nothing, yet was recorded as trained under "1 then 2" threads, so ``run`` would call its numbers those
    of no uninterrupted run. Such a resume is idle too (as one that only writes the summary)."""
    def fit(max_steps, threads, resume):
        return _TINY.fit_on_threads(tmp_path, threads, resume, max_steps=max_steps, lr_decay_steps=4,
                                    eval_interval=2, log_interval=4, checkpoint_interval=2)

    with interrupt_on_call(trainer_mod, "save_checkpoint", 1, after=True), pytest.raises(KeyboardInterrupt):
        fit(4, 1, False)
    summary = fit(2, 2, True)
    assert summary["resumed_from"] == 2 and summary["train"]["step"] == 2  # the cut window was logged
    assert summary["torch_threads"] == [1] and summary["world_sizes"] == [1]
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["torch_threads"] == [1]


def test_bug_the_process_note_names_no_step_the_number_did_not_change_at(tmp_path):
    """Bug: as the thread note, a run trained by 2 processes to step 2, resumed by 1 and killed after its final
    checkpoint, then finished (the summary only) by 1, was noted as "resumed from step 4 under another number"."""
    with interrupt_on_call(trainer_mod.Trainer, "_update", 3), pytest.raises(KeyboardInterrupt):
        _run(tmp_path, [0], threads=torch.get_num_threads())
    path = run_dir(tmp_path / "audit", "digits", "attention", 0) / "checkpoint.pt"
    payload = torch.load(path, weights_only=True)  # relabelled as torchrun's (a one-process run's checkpoint)
    torch.save({**payload, "world_size": 2, "world_sizes": [2], "rank_rng": [payload["rng"]] * 2}, path)
    with interrupt_on_call(trainer_mod, "save_checkpoint", 1, after=True), pytest.raises(KeyboardInterrupt):
        _run(tmp_path, [0], threads=torch.get_num_threads())
    said: list[str] = []
    _run(tmp_path, [0], threads=torch.get_num_threads(), said=said)
    summary = json.loads((path.parent / "summary.json").read_text())
    assert summary["resumed_from"] == 4 and summary["world_sizes"] == [2, 1]
    notes = [s for s in said if "process(es)" in s]
    assert len(notes) == 1 and "2 then 1 process(es)" in notes[0] and "from step 4" not in notes[0]


class _FirstViT(DiffusionViT):
    """A user's ViT."""


class _SecondViT(DiffusionViT):
    """Another user's ViT under the same preset name and config."""


def test_bug_a_finished_run_with_a_damaged_tensor_is_still_told_by_its_checkpoints_class(tmp_path, preset_name):
    """Bug: since ``status`` checks a checkpoint's CRCs before reading its step, every read of a checkpoint entry did:
    a finished run recorded before ``model_class`` joined the identity, whose checkpoint has one flipped tensor byte,
    lost the class its model record names, so a preset registered again with another class was the same run (``run``
    would skip it, reporting the first class's results; ``status`` said unchanged). Its record loads: it still tells
    the class (reading it reads the pickle only, not every tensor's bytes); the step ``status`` resumes from does
    not (see test_edge_probes_repro_57.py)."""
    from diffusionformer.experiments import run_status
    from diffusionformer.models import registry as MR

    cfg = {"name": "swap", "seeds": [0], "operators": [{"name": "attention"}],
           "tasks": [{"name": "t", "dataset": "digits", "model": preset_name, "train": _TRAIN}]}
    register_model(preset_name, _FirstViT, ViTConfig, dim=8, depth=1, num_heads=2)
    run_experiment(load_experiment_config(cfg), tmp_path, progress=False, log=lambda s: None)
    MR._PRESETS.pop(preset_name)
    register_model(preset_name, _SecondViT, ViTConfig, dim=8, depth=1, num_heads=2)
    rdir = run_dir(tmp_path / "swap", "t", "attention", 0)
    stored = json.loads((rdir / "run_config.json").read_text())
    del stored["model_class"]  # as a release before model_class joined the identity wrote it
    (rdir / "run_config.json").write_text(json.dumps(stored))
    _flip_a_tensor_byte(rdir / "checkpoint.pt")
    row = run_status(load_experiment_config(cfg), tmp_path)[0]
    assert row["state"] == "completed" and "._FirstViT then " in (row["changed"] or "")
    with pytest.raises(ValueError, match=r"different model_class \(\S+\._FirstViT then \S+\._SecondViT\)"):
        run_experiment(load_experiment_config(cfg), tmp_path, progress=False, log=lambda s: None)
