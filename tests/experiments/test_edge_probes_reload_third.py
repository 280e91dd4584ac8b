"""Edge probes of ``load_run``: a folder above the run directories, a run file that is not a file, and a summary
of another step than the checkpoint's."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from diffusionformer import load_run


def test_bug_load_run_of_an_experiment_or_task_folder_names_the_run_directories_below(tmp_path, run_folder):
    """Bug: ``load_run`` on an experiment's output folder or a task's folder (one level too high) said only "is
    <folder> a run directory?", leaving the user to find the ``runs/<task>/<operator>/seed<k>`` layout."""
    rdir, _ = run_folder(tmp_path / "exp" / "runs" / "digits" / "heat" / "seed0", dim=8)
    for above in (tmp_path, tmp_path / "exp", tmp_path / "exp" / "runs", tmp_path / "exp" / "runs" / "digits",
                  tmp_path / "exp" / "runs" / "digits" / "heat"):
        with pytest.raises(FileNotFoundError, match="did you mean a run directory below it") as info:
            load_run(above)
        assert str(rdir) in str(info.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"a run directory\?$"):
        load_run(empty)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_bug_load_run_names_a_run_config_that_is_a_fifo_or_a_folder(tmp_path, run_folder):
    """Bug: a FIFO or a folder in ``run_config.json``'s place was reported as "got none" (written when a run
    starts), sending the user looking for a file that is there."""
    rdir, _ = run_folder(tmp_path / "run", dim=8)
    ident = rdir / "run_config.json"
    ident.unlink()
    os.mkfifo(ident)
    with pytest.raises(FileNotFoundError, match="to be a file, got a FIFO"):
        load_run(rdir)
    ident.unlink()
    ident.mkdir()
    with pytest.raises(FileNotFoundError, match="to be a file, got a folder"):
        load_run(rdir)


def test_bug_load_run_warns_of_a_summary_of_another_step_than_the_checkpoint(tmp_path, run_folder):
    """Bug: a completed ``summary.json`` of step 100 beside a checkpoint of step 3 (one copied in from another run,
    or an older one put back) came back as ``run.summary`` without a word, its ``eval`` read as that of
    ``run.model``; the runner itself never pairs them."""
    summary = {"status": "completed", "step": 100, "eval": {"step": 100, "metrics": {"val_acc": 0.9}}}
    rdir, model = run_folder(tmp_path / "run", dim=8, summary=summary)
    with pytest.warns(UserWarning, match=r"reports step 100 \('completed'\), but the checkpoint .* holds step 3"):
        run = load_run(rdir)
    assert run.step == 3 and run.summary == summary  # still returned: the weights are good
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(run.model(x), model(x))

    # a stopped run names the step of its last good checkpoint
    (rdir / "summary.json").write_text(json.dumps({"status": "non_finite", "bad_step": 9, "last_checkpoint_step": 8}))
    with pytest.warns(UserWarning, match=r"reports step 8 \('non_finite'\)"):
        load_run(rdir)
    # summaries that agree with the checkpoint, or carry no step, load silently
    for agreeing in ({"status": "completed", "step": 3}, {"status": "non_finite", "last_checkpoint_step": 3},
                     {"status": "failed: stopped"}, {"status": "completed", "step": True}):
        (rdir / "summary.json").write_text(json.dumps(agreeing))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert load_run(rdir).summary == agreeing
