"""Mutation audit of sitting 57's new library code (fd64b15..7abac78): tests that kill the hand-made mutants the
existing tests let survive, each against an expectation written down independently of the code (the docstrings,
the design notes, hand-computed values).

98 mutants (gaps' config quantities and legend, the trainer's thread/version history and idle-resume rule, the
eval_batch_size identity, runner._check_identity, format_status, the harness's spec law, polynomial init recording,
graph devices, GraphBlock, MultiCropAugment, ViT rollout, compare's censored method): 65 killed by the sitting-57
tests, 7 by older ones, 24 by this file. Left: trainer's ``threads = ... if device.type == "cpu" else None`` ->
always the count (a GPU segment only; no device here), and results' ``size is not None and`` dropped from
_normalized_identity (equivalent: a None size of an unknown dataset stays None). No library bug found.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import diffusionformer.train.trainer as trainer_mod
from diffusionformer.experiments import gaps
from diffusionformer.experiments.config import ExperimentConfig, OperatorSetting, TaskConfig
from diffusionformer.experiments.runner import run_dir
from diffusionformer.models import DiffusionViT, ViTConfig, register_model
from diffusionformer.testing import interrupt_on_call
from diffusionformer.train import Trainer
from experiments_tiny_configs import write_gap_run

_spec = importlib.util.spec_from_file_location("_tiny_tasks_m57", Path(__file__).resolve().parents[1] / "train"
                                               / "train_tiny_tasks.py")
_TINY = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_TINY)

OPS = [OperatorSetting("attention"), OperatorSetting("lap", laplacian_heads=1)]


def _config(*tasks: TaskConfig, quantities=("final", "selected"), primary=("lap",)) -> ExperimentConfig:
    return ExperimentConfig("g", list(tasks), OPS, seeds=[0, 1, 2], primary=list(primary),
                            primary_quantities=list(quantities))


# ----------------------------------------------------------------------------------------------- gaps: the notes


def test_a_text_tasks_loss_is_its_val_loss_so_no_note():
    # TextLMTask.evaluate names its val loss "loss": the config's final (and selected) quantity is final_val / best_val
    text = TaskConfig("t", "pydoc-chars", "gpt-char-tiny", metric="loss", select_by="loss")
    assert gaps._config_quantities(_config(text)) == (("final_val", "best_val"), [])


def test_a_final_metric_other_than_the_val_loss_is_noted():
    acc = TaskConfig("d", "digits", "vit-digits", metric="val_acc")
    quantities, notes = gaps._config_quantities(_config(acc, quantities=("final",)))
    assert quantities == ("final_val",)
    assert len(notes) == 1 and notes[0].startswith("task 'd': the config's final quantity is its final val_acc")


def test_a_select_by_other_than_the_val_loss_is_noted_for_the_selected_quantity_only():
    # the val loss at the best val_acc is not the best val loss: noted for "selected", not for "final"
    task = TaskConfig("d", "digits", "vit-digits", metric="val_loss", select_by="val_acc")
    quantities, notes = gaps._config_quantities(_config(task))
    assert quantities == ("final_val", "best_val")
    assert len(notes) == 1 and "selected quantity is its val_loss at the best val_acc" in notes[0]


def test_a_task_without_select_by_gets_no_selected_note():
    # "selected" is primary (task a has select_by); task b has none: no selected contrast, so no note about one
    a = TaskConfig("a", "pydoc-chars", "gpt-char-tiny", metric="val_loss", select_by="val_loss")
    b = TaskConfig("b", "digits", "vit-digits", metric="val_acc")
    _, notes = gaps._config_quantities(_config(a, b))
    assert len(notes) == 1 and notes[0].startswith("task 'b': the config's final quantity")


def test_no_primary_contrast_has_no_quantities():
    # documented: () where the config names no primary contrast (primary_table then has no table)
    task = TaskConfig("d", "digits", "vit-digits", metric="val_acc")
    assert gaps._config_quantities(_config(task, primary=())) == ((), [])


def _finished(root, task: str, settings=("attention", "lap")) -> None:
    """Finished runs of three seeds of ``task`` under ``root/g`` with train and val losses at steps 100 and 200."""
    for i, op in enumerate(settings):
        for seed in range(3):
            write_gap_run(run_dir(root / "g", task, op, seed),
                          [(100 * s, 1.0 + 0.1 * seed, 2.0 - 0.1 * i + 0.03 * seed * s) for s in (1, 2)])


def test_gaps_notes_only_the_primary_tasks_with_rows(tmp_path, capsys):
    # task u (val_acc: another quantity than the gap table's) has no finished run: no primary cell, so no note
    cfg = tmp_path / "g.toml"
    cfg.write_text('name = "g"\nseeds = [0, 1, 2]\nprimary = ["lap"]\nprimary_quantities = ["final"]\n'
                   '[[tasks]]\nname = "t"\ndataset = "pydoc-chars"\nmodel = "gpt-char-tiny"\nmetric = "val_loss"\n'
                   '[[tasks]]\nname = "u"\ndataset = "digits"\nmodel = "vit-digits"\nmetric = "val_acc"\n'
                   '[[operators]]\nname = "attention"\n[[operators]]\nname = "lap"\nlaplacian_heads = 1\n')
    _finished(tmp_path, "t")
    assert gaps.main([str(cfg), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "### Primary contrasts: final val loss" in out.out
    assert out.err == ""


def test_an_unknown_primary_quantity_is_refused_before_reading_the_runs(tmp_path, capsys):
    # a usage error (exit 2, with a did-you-mean) whatever the results root holds, not "no finished runs" (exit 1)
    cfg = tmp_path / "g.toml"
    cfg.write_text('name = "g"\nseeds = [0, 1, 2]\nprimary = ["lap"]\n[[tasks]]\nname = "t"\ndataset = "pydoc-chars"\n'
                   'model = "gpt-char-tiny"\nmetric = "val_loss"\n[[operators]]\nname = "attention"\n'
                   '[[operators]]\nname = "lap"\nlaplacian_heads = 1\n')
    assert gaps.main([str(cfg), "--out", str(tmp_path), "--primary", "final_vall"]) == 2
    err = capsys.readouterr().err
    assert "final_vall" in err and "final_val" in err.replace("final_vall", "")


# ------------------------------------------------------------------------------------ trainer: the idle-resume rule


def _fit(root, max_steps, threads, resume, eval_interval, checkpoint_interval=2):
    return _TINY.fit_on_threads(root, threads, resume, max_steps=max_steps, lr_decay_steps=4,
                                eval_interval=eval_interval, log_interval=1, checkpoint_interval=checkpoint_interval)


def _resumed_at_two(root, monkeypatch, eval_interval):
    """A run of 4 steps killed after its checkpoint of step 2 (1 thread), resumed with max_steps=2 under 2 threads
    and another torch version; its summary."""
    with interrupt_on_call(trainer_mod, "save_checkpoint", 1, after=True), pytest.raises(KeyboardInterrupt):
        _fit(root, 4, 1, False, eval_interval)
    monkeypatch.setattr(torch, "__version__", str(torch.__version__) + "+other")
    return _fit(root, 2, 2, True, eval_interval)


def test_a_resume_at_max_steps_that_evaluates_there_counts_its_threads_and_torch(tmp_path, monkeypatch):
    # not evaluated at step 2 (eval_interval 4): the resume makes the evaluation due at its last update under this
    # count and torch, so it is not idle and both are recorded
    if torch.cuda.is_available():
        pytest.skip("trained on the GPU: the CPU thread count is not recorded")
    version = str(torch.__version__)
    summary = _resumed_at_two(tmp_path, monkeypatch, eval_interval=4)
    assert summary["resumed_from"] == 2 and summary["eval"]["step"] == 2  # evaluated at step 2 by this resume
    assert summary["torch_threads"] == [1, 2] and summary["torch_versions"] == [version, version + "+other"]


def test_an_idle_resume_at_max_steps_adds_no_torch_version(tmp_path, monkeypatch):
    # evaluated at step 2 (eval_interval 2): the resume only logs the cut window; no torch of it made a number
    if torch.cuda.is_available():
        pytest.skip("trained on the GPU: the CPU thread count is not recorded")
    version = str(torch.__version__)
    summary = _resumed_at_two(tmp_path, monkeypatch, eval_interval=2)
    assert summary["resumed_from"] == 2
    assert summary["torch_threads"] == [1] and summary["torch_versions"] == [version]


def test_a_resume_at_max_steps_whose_last_evaluation_is_earlier_evaluates_there(tmp_path):
    # the checkpoint of step 3 holds the evaluation of step 2: the one due at step 3 is still to make
    with interrupt_on_call(trainer_mod, "save_checkpoint", 1, after=True), pytest.raises(KeyboardInterrupt):
        _fit(tmp_path, 4, 1, False, eval_interval=2, checkpoint_interval=3)
    summary = _fit(tmp_path, 3, 1, True, eval_interval=2, checkpoint_interval=3)
    assert summary["resumed_from"] == 3 and summary["eval"]["step"] == 3


def test_counts_since_appends_a_change_back_and_keeps_only_entries_of_its_kind():
    from diffusionformer.train.trainer import _counts_since

    assert _counts_since([1, 2], 1) == [1, 2, 1]  # back to an earlier count: another change
    assert _counts_since([1, 2], 2) == [1, 2]  # the same count again: no change
    assert _counts_since([1], None) == [1] and _counts_since(None, 4) == [4]
    assert _counts_since(["2", 3, True, 2.0], 4) == [3, 4]  # only ints (not bools) of a hand-edited list
    assert _counts_since([1, "2.1"], "2.2", str) == ["2.1", "2.2"]


def test_a_missing_checkpoint_path_given_to_resume_is_not_called_a_folder_in_place_of_the_checkpoint(tmp_path):
    # resume=<path>: the caller's own file, absent (a typo): the FileNotFoundError of load_checkpoint, not the
    # comparison's CheckpointError with its advice to move a folder away
    from diffusionformer.train import CheckpointError

    cfg = _TINY.tiny_config(max_steps=2)
    with pytest.raises(FileNotFoundError) as err:
        Trainer(_TINY.TinyMLP(dropout=0.0), _TINY.RegressionTask(global_rng=False), cfg, tmp_path / "out",
                resume=tmp_path / "nowhere.pt").fit()
    assert not isinstance(err.value, CheckpointError) and "move it away" not in str(err.value)


# ------------------------------------------------------------------------------ results: eval_batch_size identity


def test_an_unregistered_dataset_has_no_known_default_eval_batch_size():
    from diffusionformer.experiments.results import _default_eval_batch, _task_identity

    assert _default_eval_batch("digits") == 512 and _default_eval_batch("tinyshakespeare") == 64
    assert _default_eval_batch("no-such-dataset") is None  # documented: unknown, not a guess of 512
    task = TaskConfig("t", "no-such-dataset", "vit-digits", eval_batch_size=512)
    assert _task_identity(task, 0)["eval_batch_size"] == 512


def test_an_entry_recorded_by_one_side_only_is_left_out_of_both_whichever_side():
    from diffusionformer.experiments.results import _comparable

    old, new = {"dataset": "digits"}, {"dataset": "digits", "eval_batch_size": 256}
    assert _comparable(old, new) == (old, old) and _comparable(new, old) == (old, old)
    assert _comparable(new, old, now=True) == (old, old)  # a task that does not use it now
    assert _comparable(new, {**new, "eval_batch_size": None}) == (new, {**new, "eval_batch_size": None})


# ------------------------------------------------------------------------------------ runner: the identity recorded

_TRAIN = {"max_steps": 4, "batch_size": 8, "warmup_steps": 0, "eval_interval": 2, "log_interval": 1,
          "checkpoint_interval": 2, "lr_decay_steps": 4}


def _digits(**task):
    from diffusionformer.experiments import load_experiment_config

    return load_experiment_config({
        "name": "m57", "seeds": [0], "operators": [{"name": "attention"}],
        "tasks": [{"name": "digits", "dataset": "digits", "model": "vit-digits",
                   "model_overrides": {"dim": 8, "depth": 1, "num_heads": 2}, "train": _TRAIN, **task}]})


def test_a_legacy_run_stopped_before_its_first_checkpoint_is_recorded_whole_when_trained_again(tmp_path):
    # nothing of it is continued: trained from step 0 under this config, its size is known and recorded
    from diffusionformer.experiments.results import run_status
    from diffusionformer.experiments.runner import run_experiment

    with interrupt_on_call(trainer_mod.Trainer, "_update", 1), pytest.raises(KeyboardInterrupt):
        run_experiment(_digits(eval_batch_size=1024), tmp_path, progress=False, log=[].append)
    path = run_dir(tmp_path / "m57", "digits", "attention", 0) / "run_config.json"
    assert not (path.parent / "checkpoint.pt").exists()
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "eval_batch_size"}))
    [result] = run_experiment(_digits(eval_batch_size=8), tmp_path, progress=False, log=[].append)
    assert result.status == "completed" and json.loads(path.read_text())["eval_batch_size"] == 8
    assert run_status(_digits(eval_batch_size=1024), tmp_path)[0]["changed"] == "eval_batch_size (8 then 1024)"


class _UserViT(DiffusionViT):
    """A user's ViT (its class joins the run's identity)."""


def test_a_resumed_run_recorded_without_its_model_class_gets_it_recorded(tmp_path, preset_name):
    # only an entry of _RECORDED_SINCE (eval_batch_size) stays out of a resumed run's record; the model class of a
    # run recorded by an earlier release is this run's (its checkpoint's class check guards the resume)
    from diffusionformer.experiments.runner import run_experiment

    register_model(preset_name, _UserViT, ViTConfig, dim=8, depth=1, num_heads=2)
    config = _digits(model=preset_name, model_overrides={})
    with interrupt_on_call(trainer_mod.Trainer, "_update", 3), pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path, progress=False, log=[].append)
    path = run_dir(tmp_path / "m57", "digits", "attention", 0) / "run_config.json"
    recorded = json.loads(path.read_text())
    assert recorded["model_class"].endswith("._UserViT")
    path.write_text(json.dumps({k: v for k, v in recorded.items() if k != "model_class"}))
    [result] = run_experiment(config, tmp_path, progress=False, log=[].append)
    assert result.status == "completed" and json.loads(path.read_text()) == recorded


# ------------------------------------------------------------------- format_status, polynomial init recording


def test_status_says_a_checkpoint_at_max_steps_is_resumed_not_failed():
    # a checkpoint of step max_steps (a run killed before its summary) is this run's last: `run` finishes it
    from diffusionformer.experiments.tables import format_status

    row = {"task": "t", "operator": "attention", "seed": 0, "state": "interrupted", "step": 5, "resumes_from": 4,
           "max_steps": 4, "elapsed": None, "holder": None, "other_host": False, "changed": None}
    text = format_status([row])
    assert "(resumes from step 4)" in text and "beyond max_steps" not in text
    beyond = format_status([{**row, "step": 6, "resumes_from": 5}])
    assert "its checkpoint is of step 5, beyond max_steps" in beyond and "resumes from" not in beyond


def test_a_polynomial_from_a_trained_operator_records_one_row_where_every_head_starts_alike():
    # documented: the spec records the coefficients it started from, one row when every head has the same
    from diffusionformer.operators import build_operator

    heat = build_operator("heat", t=0.7, steps=2, learnable=True)
    with torch.no_grad():
        heat.t.fill_(2.0)
    poly = build_operator("polynomial", steps=2, init=heat, num_heads=2)
    init = poly.spec_kwargs()["init"]
    assert len(init) == 3 and all(isinstance(c, float) for c in init)  # one row: every head the same
    torch.testing.assert_close(poly.theta, torch.tensor([init, init], dtype=poly.theta.dtype), rtol=0, atol=0)
    per_head = build_operator("heat", t=0.7, steps=2, learnable=True, num_heads=2)
    with torch.no_grad():
        per_head.t.copy_(torch.tensor([2.0, 1.0], dtype=per_head.t.dtype))
    init = build_operator("polynomial", steps=2, init=per_head, num_heads=2).spec_kwargs()["init"]
    assert len(init) == 2 and init[0] != init[1]  # a row per head where they differ


def test_the_set_advice_for_an_eval_batch_size_recorded_unset_is_the_datasets_default():
    # unset resolves to 64 windows for text, 512 otherwise (build_task): the --set that records as unset
    from diffusionformer.experiments.results import _Change, _set_of

    assert _set_of("t", _Change("eval_batch_size", None, 8), "tinyshakespeare") == "--set tasks.t.eval_batch_size=64"
    assert _set_of("d", _Change("eval_batch_size", None, 8), "digits") == "--set tasks.d.eval_batch_size=512"
    assert _set_of("d", _Change("eval_batch_size", 256, None), "digits") == "--set tasks.d.eval_batch_size=256"


@pytest.mark.parametrize("edge_dim", [None, 3])
def test_graph_block_of_no_node_gives_no_output_row(edge_dim):
    # an empty node set (a bare edge_index of no edge) maps to no output row, with or without edge features
    from diffusionformer.models import GraphBlock

    block = GraphBlock(8, 2, edge_dim=edge_dim)
    kwargs = {} if edge_dim is None else {"edge_attr": torch.zeros(0, 3)}
    assert block(torch.zeros(0, 8), torch.zeros(2, 0, dtype=torch.long), **kwargs).shape == (0, 8)
