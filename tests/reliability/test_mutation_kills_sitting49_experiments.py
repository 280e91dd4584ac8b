"""Mutation audit (sitting 49) of experiments/analyze.py, experiments/tasks.py, experiments/runner.py,
experiments/publish.py, experiments/validate.py and experiments/_metrics.py: tests that kill mutants the earlier
tests left alive (each docstring names the mutant). No GPU is used; the studies are written by hand, or trained for
one step. References: hand-counted accuracies, float64 cross-entropies, files written by hand.

62 mutants (analyze.py 15, tasks.py 8, runner.py 8, publish.py 13, validate.py 10, _metrics.py 8): 45 killed by
earlier tests, 12 survivors killed here (analyze.py 3, tasks.py 2, runner.py 3, publish.py 2, validate.py 1,
_metrics.py 1), 5 equivalent. No survivor was a bug of the library: each is a gap of the tests.

Equivalent survivors:

* analyze.py ``_remove_stale_plots`` ``or "/" in task or "\\" in task`` dropped: a config refuses such task names,
  and a hostile name from an earlier ``metrics.json`` is still caught by ``path.parent != pdir`` (``a/b`` puts the
  figure in a subfolder; on Windows ``\\`` too); on POSIX a ``\\`` is an ordinary character of a file in the folder.
* analyze.py ``_write_plots`` ``~torch.isnan(c).any(dim=-1)`` -> ``.all(dim=-1)``: ``coefficients()`` rows are all
  NaN (a non-polynomial head) or hold none (a shorter polynomial is padded with 0), so both keep the same heads.
* analyze.py ``for key in ("tasks", "skipped_tasks")`` -> ``("tasks",)``: a skipped task was in the config of the
  analysis that skipped it, which removed its figures then; no figure of it is left for a later analysis to remove.
* validate.py ``_check_task_names`` ``_hint(unknown[0], names) if isinstance(unknown[0], str) else ""`` ->
  ``_hint(str(unknown[0]), names)``: the same ValueError naming the value; only a "did you mean" could be added for
  a non-string name (``1`` for a task named ``"1"``), no wrong answer.
* publish.py ``_stored_runs`` ``and r.final[r.metric] is None`` dropped: ``results.json`` as the runner writes it has
  a completed run's ``value`` null exactly where its final metric is null (JSON has no NaN), so a completed row with
  ``value`` null and its metric in ``final`` always has that metric null.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

from diffusionformer.experiments import analyze as A
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.results import _data_identity, run_dir

TRAIN = {"max_steps": 4, "batch_size": 16, "eval_interval": 4, "checkpoint_interval": 4, "warmup_steps": 0}


def _study(name: str = "s", model: str = "vit-digits", **task: Any) -> dict[str, Any]:
    """A one-task, one-setting, one-seed comparison on digits as a plain dict (what a TOML file parses to)."""
    return {"name": name, "seeds": [0],
            "tasks": [{"name": "digits", "dataset": "digits", "model": model,
                       "model_overrides": {"dim": 16, "depth": 2, "num_heads": 2}, "train": TRAIN, **task}],
            "operators": [{"name": "attention"}]}


# ----------------------------------------------------------------------------- analyze.py
def test_kills_analyze_run_of_another_model_preset_accepted(tmp_path):
    """kills: experiments/analyze.py ``_check_run_data`` ``for k in (*_DATA_KEYS, "model")`` -> ``for k in
    _DATA_KEYS`` (a run trained with another model preset than the task now names, e.g. after the config's
    ``model`` was edited, was measured and filed under the task as if of the new preset: the docstring promises it
    is refused). The same data and another preset: refused naming both presets; the same preset: taken."""
    config = load_experiment_config(_study())
    task = config.tasks[0]
    rdir = run_dir(tmp_path, task.name, "attention", 0)
    rdir.mkdir(parents=True)
    (rdir / "run_config.json").write_text(json.dumps({**_data_identity(task, 0), "model": "gpt-char-tiny"}))
    with pytest.raises(ValueError, match=r"another model than task 'digits'.*model: 'gpt-char-tiny' then 'vit-digits'"):
        A._check_run_data(rdir, task, 0)
    (rdir / "run_config.json").write_text(json.dumps({**_data_identity(task, 0), "model": "vit-digits"}))
    A._check_run_data(rdir, task, 0)  # the run's own preset and data: nothing to refuse


def test_kills_analyze_run_whose_summary_is_not_completed_is_unfinished(tmp_path):
    """kills: experiments/analyze.py ``_run_state`` ``record.get("status") == "completed"`` dropped (a run stopped by
    a non-finite loss, whose ``summary.json`` says ``failed: ...`` and whose checkpoint holds the last good weights,
    was measured as a finished run and filed beside the completed seeds, instead of skipped as unfinished)."""
    rdir = tmp_path / "seed0"
    assert A._run_state(rdir) == "missing"
    rdir.mkdir()
    assert A._run_state(rdir) == "unfinished"
    (rdir / "checkpoint.pt").write_bytes(b"weights")
    for status in ("failed: non-finite loss at step 3", "running", None):
        (rdir / "summary.json").write_text(json.dumps({"status": status, "step": 3}))
        assert A._run_state(rdir) == "unfinished", status
    (rdir / "summary.json").write_text(json.dumps({"status": "completed", "step": 4}))
    assert A._run_state(rdir) == "completed"
    (rdir / "checkpoint.pt").unlink()
    assert A._run_state(rdir) == "weightless"


# ----------------------------------------------------------------------------- runner.py
def _heat_vit(t: float) -> torch.nn.Module:
    from diffusionformer.models import get_preset, model_config

    cfg = model_config("vit-digits", dim=8, depth=1, num_heads=2, heads=f"attention:1,heat(t={t}, learnable=True):1")
    return get_preset("vit-digits").model_cls(cfg)


def test_kills_runner_restore_learned_from_a_checkpoint_of_another_step(tmp_path):
    """kills: experiments/runner.py ``_restore_learned`` ``if payload.get("step") != step: return`` dropped (a
    finished run's missing ``learned_operators.json`` was rewritten from a checkpoint of another step than its
    summary's, e.g. an earlier one copied back: the tables then reported learned diffusion times the final model
    does not have). Checkpoint at step 2, summary at step 4: nothing written; at step 2: the checkpoint's values."""
    from diffusionformer.experiments.runner import _restore_learned
    from diffusionformer.models import learned_operator_parameters
    from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT

    saved = _heat_vit(0.9)  # the checkpoint's weights: t = 0.9
    torch.save({"format": CHECKPOINT_FORMAT, "step": 2, "model": saved.state_dict(), "optimizer": {}, "rng": {},
                "config": {}}, tmp_path / "checkpoint.pt")
    logs: list[str] = []
    model = _heat_vit(0.5)
    _restore_learned(tmp_path, model, 4, logs.append)  # the summary's final step is 4: not these weights
    assert not (tmp_path / "learned_operators.json").exists() and logs == []
    assert learned_operator_parameters(model)["blocks.0.attn.operators.1.t"].item() == pytest.approx(0.5)
    _restore_learned(tmp_path, model, 2, logs.append)
    want = {k: [float(x) for x in v.detach().flatten()] for k, v in learned_operator_parameters(saved).items()}
    assert json.loads((tmp_path / "learned_operators.json").read_text()) == want
    assert want["blocks.0.attn.operators.1.t"] == [pytest.approx(0.9)] and len(logs) == 1


def test_kills_runner_torch_note_on_a_first_invocation(tmp_path):
    """kills: experiments/runner.py ``if torches and record["torch"] not in torches:`` -> ``if record["torch"] not in
    torches:`` (the first ``run`` of a comparison, with no earlier invocation, logged "note: earlier runs of s were
    trained with torch , these with torch X"). A later invocation under another torch (its manifest rewritten as a
    GPU call's would leave it) still gets the note naming both versions."""
    from diffusionformer.experiments import run_experiment

    small = _study(model_overrides={"dim": 8, "depth": 1, "num_heads": 2},
                   train={**TRAIN, "max_steps": 1, "batch_size": 4, "eval_interval": 1, "checkpoint_interval": 1})
    logs: list[str] = []
    run_experiment(load_experiment_config(small), tmp_path, progress=False, log=logs.append)
    assert not [m for m in logs if "note:" in m], logs
    manifest = tmp_path / "s" / "manifest.json"
    record = json.loads(manifest.read_text())
    record["torch"], record["torch_versions"] = "2.0.0+other", ["2.0.0+other"]
    manifest.write_text(json.dumps(record))
    logs.clear()
    run_experiment(load_experiment_config({**small, "seeds": [0, 1]}), tmp_path, progress=False, log=logs.append)
    notes = [m for m in logs if "note:" in m]
    assert len(notes) == 1 and f"torch 2.0.0+other, these with torch {torch.__version__}" in notes[0], logs


def test_kills_runner_sibling_check_reads_finished_seeds_only(tmp_path):
    """kills: experiments/runner.py ``_check_sibling_identity`` ``if other == rdir or not _completed(other)`` -> ``if
    other == rdir`` (an unfinished sibling seed of another definition, e.g. one killed before ``--set
    train.lr=...`` was changed back, refused this run, though its rows never reach the table and ``run``
    retrains it; the docstring: "finished sibling seeds"). Once that sibling is completed, the run is refused."""
    from diffusionformer.experiments.runner import _check_sibling_identity

    config = load_experiment_config(_study())
    task, setting = config.tasks[0], config.operators[0]
    mine = {"dataset": "digits", "model": "vit-digits", "train": {"lr": 0.001, "seed": 0}}
    rdir = run_dir(tmp_path, task.name, setting.name, 0)
    other = run_dir(tmp_path, task.name, setting.name, 1)
    other.mkdir(parents=True)
    (other / "run_config.json").write_text(json.dumps({**mine, "train": {"lr": 0.5, "seed": 1}}))
    (other / "summary.json").write_text(json.dumps({"status": "failed: non-finite loss", "step": 1}))
    _check_sibling_identity(rdir, mine, task, setting)  # unfinished: not compared
    (other / "summary.json").write_text(json.dumps({"status": "completed", "step": 4}))
    with pytest.raises(ValueError, match=r"seed1 holds a finished run .*lr: 0\.5 then 0\.001"):
        _check_sibling_identity(rdir, mine, task, setting)


# ----------------------------------------------------------------------------- _metrics.py
def test_kills_metrics_accuracy_over_a_fixed_count():
    """kills: experiments/_metrics.py ``accuracy`` ``hits.mean() if over is None else hits.sum() / over`` ->
    ``hits.mean()`` (a sequence task's micro-batch ``acc`` was its own token mean, not its correct targets over the
    loss's fixed count, so micro-batches of different target counts no longer added up to the batch's accuracy).
    Hand-counted: micro-batch A has 3 targets, 2 correct; B has 1 target, correct; over the batch's 2 targets per
    micro-batch on average their sum is 3 / 4 correct, the token accuracy of the whole batch."""
    from diffusionformer.experiments._metrics import accuracy

    eye = torch.eye(3)
    a = accuracy(eye[[0, 1, 2]], torch.tensor([0, 1, 0]), over=2.0)  # 2 of 3 right, over 2
    b = accuracy(eye[[2]], torch.tensor([2]), over=2.0)  # 1 of 1 right, over 2
    assert a.item() == 1.0 and b.item() == 0.5
    assert (a + b).item() / 2 == 3 / 4  # the mean of the micro-batches' values: the batch's token accuracy
    empty = accuracy(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), over=2.0)  # no target: 0, not NaN
    assert empty.item() == 0.0
    assert accuracy(eye[[0, 1, 2]], torch.tensor([0, 1, 0])).item() == pytest.approx(2 / 3)  # without over: the mean


def test_kills_analyze_cache_with_a_foreign_learned_entry_gets_the_run_parameters(tmp_path):
    """kills: experiments/analyze.py ``_cached`` ``not isinstance(blob.get("learned"), dict)`` -> ``blob.get("learned")
    is None`` (a cache whose ``learned`` entry is not a dict, e.g. a list from another writer, was served as is and
    never given the run's parameters: once the checkpoint is gone, ``_weightless_cache`` refuses it and the run is
    lost to the analysis). The result is served, and the cache rewritten with the parameters."""
    path = tmp_path / "analysis_cache.pt"
    key = {"version": A.ANALYSIS_VERSION, "step": 4}
    result = {"layers": [{"layer": 0}], "info": {}}
    torch.save({"key": key, "result": result, "learned": [1.0, 2.0]}, path)
    learned = {"blocks.0.attn.operators.0.t": [0.5]}
    assert A._cached(path, key, learned) == result
    assert torch.load(path, weights_only=True)["learned"] == learned


# ----------------------------------------------------------------------------- tasks.py
class _TableLM(torch.nn.Module):
    """A language model whose logits are a fixed table row per input token; ``model(x, y)`` -> ``(logits, loss)``
    with the token-mean cross-entropy over targets other than -100, as the GPT's."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> Any:
        logits = self.table[x]
        loss = None if y is None else torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)
        return logits, loss


def test_kills_sequence_task_training_split_without_targets():
    """kills: experiments/tasks.py ``SequenceLMTask._targets_per_row`` ``... if targets else 1.0`` -> ``else 0.0``
    (a training split without targets, documented as "1.0 when it has none: every loss is then 0", made the loss
    scale count / 0: a batch with targets got an infinite loss and one without a NaN ``acc``). Reference: the
    float64 token-mean cross-entropy of the batch's 3 targets over its 3 rows (scale 3 / (3 x 1.0) = 1)."""
    from diffusionformer.data.base import SequenceTaskData
    from diffusionformer.experiments.tasks import SequenceLMTask

    table = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.5], [0.3, 0.2, 1.5]])
    x = torch.tensor([[0, 1], [2, 0], [1, 2]])
    none = torch.full_like(x, -100)  # the training split: no target at all
    y = torch.tensor([[0, -100], [-100, 1], [2, -100]])
    data = SequenceTaskData("seq", x, none, x, y, x, y, vocab_size=3)
    task = SequenceLMTask(data)
    loss, metrics = task.loss(_TableLM(table), (x, y))
    rows = torch.log_softmax(table.double()[torch.tensor([0, 0, 1])], -1)
    want = -(rows[0, 0] + rows[1, 1] + rows[2, 2]) / 3  # tokens 0, 0, 1 with targets 0, 1, 2
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    assert metrics["acc"].item() == pytest.approx(1 / 3)  # token 0 -> 0 right; 0 -> 1 and 1 -> 2 wrong
    model = _TableLM(table)
    loss, metrics = task.loss(model, (x, none))  # a batch without targets: loss 0, acc 0, zero gradients
    loss.backward()
    assert loss.item() == 0.0 and metrics["acc"].item() == 0.0
    assert torch.equal(model.table.grad, torch.zeros_like(table))


def test_kills_dino_evaluation_with_a_non_finite_bank():
    """kills: experiments/tasks.py ``DINOTask.evaluate`` ``not (bank_finite and ...)`` -> ``not bool(torch.isfinite(
    feats).all())`` (a diverged model whose training features, the k-NN bank, are NaN while the held-out ones are
    finite was given a k-NN accuracy: NaN neighbours vote for one class, an accuracy equal to that class's share,
    where every task reports NaN for a model with no prediction). The same model on finite data scores in [0, 1]."""
    from diffusionformer.data.base import ClassificationData
    from diffusionformer.experiments.tasks import DINOTask
    from diffusionformer.models import DINO, DINOConfig

    torch.manual_seed(0)
    model = DINO(DINOConfig(input_size=(8, 8), in_channels=1, patch_size=4, dim=8, depth=1, num_heads=2, pool="mean",
                            out_dim=6, head_hidden=8, head_bottleneck=4, schedule_steps=4)).eval()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 1, 8, 8, generator=g), torch.tensor([0, 1, 2] * 4)

    def data(x_train: torch.Tensor) -> ClassificationData:
        return ClassificationData("toy", "image", x_train, y, x[:6], y[:6], x[6:], y[6:], num_classes=3,
                                  input_shape=(1, 8, 8))

    finite = DINOTask(data(x), model, eval_batch_size=4).evaluate(model, None)
    assert 0.0 <= finite["knn_val_acc"] <= 1.0 and 0.0 <= finite["knn_test_acc"] <= 1.0
    poisoned = x.clone()
    poisoned[0] = math.nan  # one training image: its bank row is NaN, the held-out features stay finite
    out = DINOTask(data(poisoned), model, eval_batch_size=4).evaluate(model, None)
    assert math.isnan(out["knn_val_acc"]) and math.isnan(out["knn_test_acc"])


# ----------------------------------------------------------------------------- validate.py
@pytest.mark.parametrize("kind", [1, None, ("image",)])
def test_kills_validate_evaluation_keys_of_a_non_string_kind(kind):
    """kills: experiments/validate.py ``evaluation_keys`` ``_hint(dataset_kind, ...) if isinstance(dataset_kind, str)
    else ""`` -> ``_hint(dataset_kind, ...)`` (a non-string kind, e.g. ``spec.kind`` of a hand-registered dataset
    left ``None``, died in difflib with a bare TypeError instead of the documented ValueError naming the value and
    the kinds). A misspelt string still gets its "did you mean"."""
    from diffusionformer.experiments.validate import evaluation_keys

    with pytest.raises(ValueError, match=r"dataset_kind must be one of \['graph', 'image', .*got " + repr(kind)
                       .replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        evaluation_keys(kind, "vit-digits")
    with pytest.raises(ValueError, match=r"got 'imgae' \(did you mean 'image'\?\)"):
        evaluation_keys("imgae", "vit-digits")


# ----------------------------------------------------------------------------- publish.py
def test_kills_publish_machine_line_of_one_process():
    """kills: experiments/publish.py ``_processes_text`` ``if sizes and sizes[0] > 1 else ""`` -> ``if sizes else
    ""`` (a comparison trained by plain single-process ``run`` invocations, ``world_sizes = [1]`` in its manifest,
    was published as "processes per run: 1 (torchrun, DDP)": the docstring's ``""`` where every run was trained by
    one process)."""
    from diffusionformer.experiments.publish import _processes_text

    assert _processes_text({"world_sizes": [1]}) == ""
    assert _processes_text({}) == "" and _processes_text({"world_sizes": None}) == ""
    assert _processes_text({"world_sizes": [4]}) == "; processes per run: 4 (torchrun, DDP)"
    assert _processes_text({"world_sizes": [1, 2]}).startswith("; processes per run: 1, 2 (runs of this comparison")


def test_kills_publish_unfinished_warning_marks_the_runs_left_out():
    """kills: experiments/publish.py ``_warn_unfinished`` ``(", ..." if len(left) > 6 else "")`` -> ``len(left) >
    7`` (with 7 unfinished runs the warning named 6 of them and no ``...``, reading as the whole list). Hand-counted:
    7 seeds, none finished: "7 of 7", seeds 0-5 named, then ``...``; 6 seeds: all named, no ``...``."""
    from diffusionformer.experiments.publish import _warn_unfinished

    for seeds, tail in ((7, "'digits' / 'attention' seed 5, ...)"), (6, "'digits' / 'attention' seed 5)")):
        config = load_experiment_config({**_study(), "seeds": list(range(seeds))})
        with pytest.warns(RuntimeWarning) as caught:
            _warn_unfinished(config, [])
        text = str(caught[0].message)
        assert f"{seeds} of {seeds} runs of 's' not finished (" in text and tail in text, text
        assert "seed 6" not in text
