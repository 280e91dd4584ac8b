"""Edge-case probes of the files the library reads back: checkpoints (``train.checkpoint``, the trainer's resume),
run locks (``experiments.store``) and runs reloaded for analysis (``experiments.reload``).

Probed: ``torch.load`` calls (all ``weights_only=True``, in the package, ``benchmarks/`` and ``experiments/``);
checkpoints truncated, empty, a folder, a link to a missing file or a loop of links, from another model class /
config / head layout, with NaN weights, with optimizer state of other shapes; locks holding junk, deeply nested
JSON, dead or reused pids, links to missing files, workers racing; ``run_config.json`` edited by hand.

Found and fixed (tests whose docstring starts with "Bug:"):

- ``experiments.store``: a lock holding ``[[[[...`` nested deeper than the recursion limit raised a bare
  ``RecursionError`` from ``read_lock``/``live_holder``/``acquire_lock``; a lock that is a link to a missing file
  (or a loop of links) read as "no lock" while no claim could ever be linked in its place: the run was reported
  held by "a process that keeps re-creating" it for ever.
- ``Trainer(resume=True)``: a ``checkpoint.pt`` that is a link to a missing file (a disk not mounted) trained the
  run from step 0 without a word, cutting its metrics log and replacing the link; ``load_checkpoint`` called such
  a link "missing". An AdamW moment of another shape than its parameter loaded, and the first update failed with a
  bare RuntimeError naming no file.
- ``load_run``: weights of a model with another head layout (a hand-edited ``run_config.json``, same shapes) loaded
  into the edited model without a word; NaN weights (which the trainer never saves, and refuses to resume from)
  loaded silently.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import pytest
import torch

from diffusionformer.experiments import store
from diffusionformer.experiments.reload import load_run
from diffusionformer.train import CheckpointError, Trainer, load_checkpoint, save_checkpoint
from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT

TRAIN_TESTS = str(Path(__file__).resolve().parents[1] / "train")  # the trainer tests' tiny model and task
if TRAIN_TESTS not in sys.path:
    sys.path.insert(0, TRAIN_TESTS)
from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t), follow_symlinks=False)


# --- experiments.store ----------------------------------------------------------------------------------------------


def test_bug_a_lock_nested_past_the_recursion_limit_is_junk(tmp_path):
    """Bug: a lock file holding ``[[[[...`` (4000 deep, under the 4 KiB a lock may have) raised a bare
    ``RecursionError`` from ``read_lock``, ``live_holder`` and ``acquire_lock`` (``run`` and ``status`` crashed on
    that run); it is now unreadable junk like any other: held while young, taken over once old."""
    lock = tmp_path / store.LOCK_NAME
    lock.write_text("[" * 4000)
    assert store.read_lock(tmp_path) is None
    assert store.live_holder(tmp_path) == (-1, "")
    assert "still writing" in store.acquire_lock(tmp_path)
    _age(lock, 2 * store.UNREADABLE_GRACE_S)
    assert store.live_holder(tmp_path) is None
    assert store.acquire_lock(tmp_path) is None
    assert store.read_lock(tmp_path) == (os.getpid(), platform.node())


@pytest.mark.parametrize("kind", ["dangling", "loop"])
def test_bug_a_lock_that_is_a_broken_link_is_junk_not_a_run_blocked_for_ever(tmp_path, kind):
    """Bug: a ``.lock`` that is a link to a missing file (or a loop of links) read as "no lock" (``live_holder`` None)
    while ``os.link`` could never put a claim in its place: ``acquire_lock`` answered "a process that keeps
    re-creating .lock" on every run, for ever. It is now unreadable junk judged by the link's own age: held while
    young, then replaced by a real lock."""
    lock = tmp_path / store.LOCK_NAME
    os.symlink(tmp_path / "gone" if kind == "dangling" else lock, lock)
    assert store.live_holder(tmp_path) == (-1, "")
    assert "still writing" in store.acquire_lock(tmp_path)
    _age(lock, 2 * store.UNREADABLE_GRACE_S)
    assert store.live_holder(tmp_path) is None
    assert store.acquire_lock(tmp_path) is None
    assert not lock.is_symlink() and store.read_lock(tmp_path) == (os.getpid(), platform.node())
    store.release_lock(tmp_path)
    assert not os.path.lexists(lock)


# --- checkpoints and the trainer's resume ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dangling", "loop"])
def test_bug_load_checkpoint_names_a_broken_link_not_a_missing_file(tmp_path, kind):
    """Bug: ``load_checkpoint`` of a link to a missing file (or a loop of links) said "got missing", sending the user
    to look for a file that ``ls`` lists."""
    path = tmp_path / "checkpoint.pt"
    os.symlink(tmp_path / "gone.pt" if kind == "dangling" else path, path)
    with pytest.raises(FileNotFoundError, match="symbolic link to a missing file"):
        load_checkpoint(path)


def test_bug_resume_true_refuses_a_checkpoint_link_to_a_missing_file(tmp_path):
    """Bug: ``Trainer(resume=True)`` whose ``checkpoint.pt`` is a link to a missing file (its disk not mounted) took
    it for "no checkpoint yet": it trained from step 0, cut ``metrics.jsonl`` to nothing and replaced the link by
    a new file, without a word. It is now a CheckpointError (the runner's "not resumed" for that run)."""
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=2), tmp_path).fit()
    log = (tmp_path / "metrics.jsonl").read_text()
    (tmp_path / "checkpoint.pt").rename(tmp_path / "elsewhere.pt")
    os.symlink(tmp_path / "unmounted" / "checkpoint.pt", tmp_path / "checkpoint.pt")
    task = RegressionTask()
    with pytest.raises(CheckpointError, match="symbolic link to a missing file"):
        Trainer(TinyMLP(), task, tiny_config(max_steps=2), tmp_path, resume=True).fit()
    assert task.steps_seen == [] and (tmp_path / "metrics.jsonl").read_text() == log
    assert (tmp_path / "checkpoint.pt").is_symlink()


def test_bug_resume_refuses_optimizer_moments_of_other_shapes(tmp_path):
    """Bug: a checkpoint whose AdamW ``exp_avg`` has another shape than its parameter (same count of parameters)
    loaded, and the first update failed with a bare ``RuntimeError: The size of tensor a (64) must match ...``
    naming no file. It is now a CheckpointError naming the file, the entry and the parameter."""
    cfg = tiny_config(max_steps=2, lr_decay_steps=4)
    Trainer(TinyMLP(), RegressionTask(), cfg, tmp_path).fit()
    path = tmp_path / "checkpoint.pt"
    payload = torch.load(path, weights_only=True)
    state = payload["optimizer"]["state"][0]
    state["exp_avg"] = state["exp_avg"].reshape(1, -1)
    save_checkpoint(path, payload)
    task = RegressionTask()
    with pytest.raises(CheckpointError, match=r"exp_avg.*fc1\.weight.*\(16, 4\), got shape \(1, 64\)"):
        Trainer(TinyMLP(), task, tiny_config(max_steps=4, lr_decay_steps=4), tmp_path, resume=True).fit()
    assert task.steps_seen == []


@pytest.mark.parametrize("cut", [0, 1, 100, -100, -1])
def test_truncated_or_empty_checkpoints_are_checkpoint_errors_pins(tmp_path, cut):
    """Pins: a checkpoint cut anywhere (or empty) is a CheckpointError naming the file, left as it is."""
    whole = save_checkpoint(tmp_path / "whole.pt", {"format": CHECKPOINT_FORMAT, "step": 1, "model": {},
                                                    "optimizer": {}, "rng": {}, "config": {}}).read_bytes()
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(whole[:cut] if cut else b"")
    with pytest.raises(CheckpointError, match="checkpoint.pt"):
        load_checkpoint(path)
    assert path.read_bytes() == (whole[:cut] if cut else b"")


def test_no_torch_load_without_weights_only_in_the_code():
    """Pins: every ``torch.load`` call of the package, benchmarks and experiment scripts passes weights_only=True."""
    calls = []
    for folder in ("diffusionformer", "benchmarks", "experiments"):
        for file in (REPO / folder).rglob("*.py"):
            text = file.read_text(encoding="utf-8")
            i = text.find("torch.load(")
            while i >= 0:
                line = text[text.rfind("\n", 0, i) + 1:text.find("\n", i)]
                if not line.lstrip().startswith(("#", ">>>", "...")) and "``" not in line:
                    calls.append((file, text[i:text.find(")", i) + 1]))
                i = text.find("torch.load(", i + 1)
    assert calls and all("weights_only=True" in call for _, call in calls), calls


# --- experiments.reload ---------------------------------------------------------------------------------------------


def test_bug_load_run_refuses_a_run_config_edited_to_another_head_layout(tmp_path, run_folder):
    """Bug: after ``run_config.json``'s ``heads`` was edited from ``attention:1,laplacian:1`` to ``attention:2``
    (same parameter shapes), ``load_run`` loaded the Laplacian-trained weights into an all-attention model without a
    word. The checkpoint's model record (written by the trainer, checked by its resume) is now compared."""
    rdir, _ = run_folder(tmp_path / "run")
    run = load_run(rdir)
    assert run.config.heads == "attention:1,laplacian:1" and run.step == 3
    ident = json.loads((rdir / "run_config.json").read_text())
    ident["model_config"]["heads"] = "attention:2"
    (rdir / "run_config.json").write_text(json.dumps(ident))
    with pytest.raises(CheckpointError, match=r"different model .*heads.*'attention:1,laplacian:1', now "
                                              r"'attention:2'.*run_config.json edited"):
        load_run(rdir)


def test_load_run_ignores_config_fields_the_checkpoint_record_predates(tmp_path, run_folder):
    """Pins: a record without a config field added later (its default then) and one without a record still load."""
    rdir, _ = run_folder(tmp_path / "run")
    payload = torch.load(rdir / "checkpoint.pt", weights_only=True)
    del payload["model_record"]["config"]["rope_base"]
    save_checkpoint(rdir / "checkpoint.pt", payload)
    assert load_run(rdir).step == 3
    del payload["model_record"]
    save_checkpoint(rdir / "checkpoint.pt", payload)
    assert load_run(rdir).step == 3


def test_bug_load_run_refuses_nan_weights(tmp_path, run_folder):
    """Bug: a checkpoint with NaN weights (which the trainer never saves and refuses to resume from) loaded into
    ``load_run``'s model without a word, and every output was NaN."""
    rdir, _ = run_folder(tmp_path / "run")
    payload = torch.load(rdir / "checkpoint.pt", weights_only=True)
    payload["model"]["cls_token"] = torch.full_like(payload["model"]["cls_token"], float("nan"))
    save_checkpoint(rdir / "checkpoint.pt", payload)
    with pytest.raises(CheckpointError, match=r"NaN or inf in \['cls_token'\]"):
        load_run(rdir)


def test_bug_load_run_names_a_checkpoint_link_to_a_missing_file(tmp_path, run_folder):
    """Bug: ``load_run`` of a run whose ``checkpoint.pt`` links to a missing file said "got none (the run has not
    saved a step yet)"."""
    rdir, _ = run_folder(tmp_path / "run")
    (rdir / "checkpoint.pt").rename(tmp_path / "moved.pt")
    os.symlink(tmp_path / "gone.pt", rdir / "checkpoint.pt")
    with pytest.raises(FileNotFoundError, match="symbolic link to a missing file"):
        load_run(rdir)
