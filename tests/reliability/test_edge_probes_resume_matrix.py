"""Exact resume across the task kinds x features matrix (edge probes).

Already covered elsewhere (grep tests for ``resume``): the tiny regression MLP with dropout, NumPy/Python jitter,
a log window cut by the checkpoint and ``max_steps``-then-continue (``tests/train/test_train_resume.py``); fp16
scaler state (``test_train_accum.py``); ViT on digits killed mid-step through the runner, with a stale lock
(``test_edge_probes_runner.py``); DINO killed inside ``loss`` after the EMA update (``test_ssl_runner.py``);
neighbour-sampled GCN killed mid-run (``test_experiments_minibatch.py``); SIGKILL of a trainer subprocess
(``test_edge_probes_train_third.py``); checkpoint/model-record/config refusals.

Probed here (the gaps): every task adapter (character GPT text, associative recall, ViT with crop/flip augmentation,
label smoothing, drop path and dropout, the graph transformer on nodes with a learned diffusion time, GCN and GIN
(BatchNorm buffers) on nodes, the graph transformer and GIN on sets of graphs, neighbour-sampled mini-batches with
sampled evaluation, DINO with multi-crop views and its teacher EMA / centre / temperature schedules), with gradient
accumulation where the task allows it, warm-up + cosine to ``min_lr``, both weight-decay groups, killed inside an
update, inside an evaluation (mid-interval, and at a checkpoint step), right before and right after a checkpoint
write (the final one included: killed before ``summary.json``), and through the runner (``select_by``, ``reach``,
``learned_operators.json``, the ``RunResult``). Compared bitwise: every parameter and buffer, the optimizer, RNG and
log-window state of the final checkpoint, every ``metrics.jsonl`` (and ``metrics.csv``) record but its wall-clock
fields, and the summary. No divergence was found.
"""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest
import torch
from torch_geometric.data import Data

import diffusionformer.train.trainer as trainer_mod
from diffusionformer.data import load_dataset
from diffusionformer.data.base import GraphSetData
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.experiments.tasks import NodeTask, build_task
from diffusionformer.models import create_model
from diffusionformer.testing import interrupt_on_call
from diffusionformer.train import TrainConfig, Trainer, load_checkpoint, read_metrics

_WALL = ("elapsed", "time")


class _Kill(Exception):
    """Stands for the process dying at the chosen point."""


class _Killing:
    """A task that dies when update ``at_step`` draws its batch, or inside its ``at_eval``-th evaluation."""

    def __init__(self, task, at_step=None, at_eval=None):
        self._task, self._at_step, self._at_eval, self._evals = task, at_step, at_eval, 0

    def __getattr__(self, name):  # shard_batch, splits_into_micro_batches
        return getattr(self._task, name)

    def train_batch(self, step, generator, batch_size):
        if step == self._at_step:
            raise _Kill(f"update {step}")
        return self._task.train_batch(step, generator, batch_size)

    def loss(self, model, batch):
        return self._task.loss(model, batch)

    def evaluate(self, model, max_batches):
        self._evals += 1
        if self._evals == self._at_eval:
            raise _Kill(f"evaluation {self._evals}")
        return self._task.evaluate(model, max_batches)


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    graphs = []
    for i in range(24):  # rings of 4..8 nodes, two classes
        n = 4 + i % 5
        src = torch.arange(n)
        dst = (src + 1) % n
        edges = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], 1)
        graphs.append(Data(x=torch.randn(n, 3, generator=g), edge_index=edges, y=torch.tensor([i % 2])))
    idx = torch.arange(24)
    return {"digits": load_dataset("digits", seed=0), "karate": load_dataset("karate", seed=0),
            "recall": load_dataset("assoc-recall", seed=0), "text": load_dataset("pydoc-chars", seed=0),
            "sets": GraphSetData("rings", graphs, idx[:16], idx[16:20], idx[20:], 2, 3)}


def _kind(name, d):
    """``(model, task)`` of one task kind, built the same way every call (the caller seeds torch)."""
    k = d["karate"]
    if name == "gpt-text":
        m = create_model("gpt-char-tiny", n_layer=1, n_embd=16, n_head=2, block_size=16,
                         vocab_size=d["text"].vocab_size, dropout=0.1)
        return m, build_task(d["text"], m)
    if name == "assoc-recall":
        m = create_model("gpt-recall", n_layer=1, n_embd=16, n_head=2, vocab_size=d["recall"].vocab_size,
                         block_size=d["recall"].x_train.shape[1], dropout=0.1)
        return m, build_task(d["recall"], m)
    if name == "vit-augment":
        m = create_model("vit-digits", dim=16, depth=1, num_heads=2, dropout=0.1, drop_path=0.1)
        return m, build_task(d["digits"], m, eval_batch_size=64, augment={"crop_padding": 1, "flip": True},
                             label_smoothing=0.1)
    if name == "graph-node-learned":
        m = create_model("graph-node-small", dim=16, depth=2, num_heads=2, in_channels=k.num_features,
                         num_classes=k.num_classes, heads="attention:1,heat(learnable=True, steps=2):1")
        return m, build_task(k, m)
    if name == "gcn-node":
        m = create_model("gcn-2layer", in_channels=k.num_features, num_classes=k.num_classes)
        return m, build_task(k, m)
    if name == "gin-node":
        m = create_model("gin-graph", task="node", hidden=8, num_layers=3, in_channels=k.num_features,
                         num_classes=k.num_classes)
        return m, build_task(k, m)
    if name == "graph-set":
        m = create_model("graph-graph-small", dim=16, depth=2, num_heads=2, in_channels=3, num_classes=2)
        return m, build_task(d["sets"], m)
    if name == "gin-set":
        m = create_model("gin-graph", hidden=8, num_layers=3, in_channels=3, num_classes=2)
        return m, build_task(d["sets"], m)
    if name == "minibatch":
        m = create_model("gcn-2layer", num_layers=1, in_channels=k.num_features, num_classes=k.num_classes)
        return m, build_task(k, m, eval_batch_size=8,
                             minibatch={"batch_size": 8, "num_neighbors": [3, 2], "eval": "sampled"})
    assert name == "dino"
    m = create_model("dino-digits", dim=16, depth=1, num_heads=2, out_dim=16, head_hidden=16, head_bottleneck=8,
                     schedule_steps=6, warmup_teacher_temp_steps=3)
    return m, build_task(d["digits"], m, eval_batch_size=64)


def _config(**kw):
    # evaluations at 2, 4, 6; logs at 3, 6 (the checkpoint at 4 cuts a log window); warm-up then cosine to min_lr
    base = dict(max_steps=6, batch_size=8, lr=3e-3, min_lr=3e-4, warmup_steps=2, lr_decay_steps=6, weight_decay=0.1,
                eval_interval=2, log_interval=3, checkpoint_interval=4, progress=False, seed=0, device="cpu")
    return TrainConfig(**{**base, **kw})


def _fit(kind, d, out, config, *, resume=False, model_seed=0, **kill):
    torch.manual_seed(model_seed)
    model, task = _kind(kind, d)
    trainer = Trainer(model, _Killing(task, **kill), config, out, resume=resume)
    try:
        trainer.fit()
    except _Kill:
        pass
    return trainer


def _same(a, b, where):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert a == b or (a != a and b != b), (where, a, b)  # NaN == NaN here


def _timeless(record):
    return None if record is None else {k: v for k, v in record.items() if k not in _WALL}


def _csv_rows(path):
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if k not in _WALL} for row in csv.DictReader(f)]


def _assert_same_run(ref: Trainer, res: Trainer) -> None:
    _same(ref.model.state_dict(), res.model.state_dict(), "model")
    a, b = load_checkpoint(ref.checkpoint_path), load_checkpoint(res.checkpoint_path)
    for key in ("step", "model", "optimizer", "rng", "window", "scaler"):
        _same(a[key], b[key], f"checkpoint.{key}")
    for key in ("last_train", "last_eval"):
        _same(_timeless(a[key]), _timeless(b[key]), f"checkpoint.{key}")
    _same([_timeless(r) for r in read_metrics(ref.metrics_path)], [_timeless(r) for r in read_metrics(res.metrics_path)],
          "metrics.jsonl")
    if (ref.out_dir / "metrics.csv").exists():
        assert _csv_rows(ref.out_dir / "metrics.csv") == _csv_rows(res.out_dir / "metrics.csv")
    s1, s2 = (json.loads(t.summary_path.read_text()) for t in (ref, res))
    for s in (s1, s2):
        for key in ("elapsed", "resumed_from", "checkpoint"):
            s.pop(key)
        s["train"], s["eval"] = _timeless(s["train"]), _timeless(s["eval"])
    _same(s1, s2, "summary")


def _killed_and_resumed(kind, d, tmp_path, config, name, **kill):
    out = tmp_path / name
    _fit(kind, d, out, config, **kill)
    assert not (out / "summary.json").exists()
    # another initialisation: the weights must come from the checkpoint (none yet: the run restarts from step 0,
    # and the runner builds the model after seeding, as here)
    seed = 99 if (out / "checkpoint.pt").exists() else 0
    return _fit(kind, d, out, config, resume=True, model_seed=seed)


KINDS = [("gpt-text", 2), ("assoc-recall", 2), ("vit-augment", 2), ("graph-node-learned", 1), ("gcn-node", 1),
         ("gin-node", 1), ("graph-set", 2), ("gin-set", 2), ("minibatch", 1), ("dino", 1)]
# (1 where the task cannot split an update: the full-graph node tasks, DINO, and the neighbour-sampled task, whose
# one subgraph the Trainer refuses to compute grad_accum_steps times)


@pytest.mark.parametrize(("kind", "accum"), KINDS, ids=[k for k, _ in KINDS])
def test_every_task_kind_killed_in_an_update_or_an_evaluation_resumes_bit_exactly(tmp_path, data, kind, accum):
    """Killed in update 5 (after the checkpoint of step 4, a log window half full), in the evaluation of step 6
    (the final one, its train record already logged), in the evaluation of step 4 (it comes before that step's
    checkpoint: none yet) and in update 3: each resumed run equals the uninterrupted one bit for bit."""
    config = _config(grad_accum_steps=accum)
    ref = _fit(kind, data, tmp_path / "ref", config)
    assert ref.summary["step"] == 6
    for name, kill, start in (("update5", dict(at_step=5), 4), ("eval-at-6", dict(at_eval=3), 4),
                              ("eval-at-4", dict(at_eval=2), None), ("update3", dict(at_step=3), None)):
        res = _killed_and_resumed(kind, data, tmp_path, config, name, **kill)
        assert res.summary["resumed_from"] == start, name
        _assert_same_run(ref, res)


@pytest.mark.parametrize("kind", ["dino", "gin-node", "vit-augment"])
@pytest.mark.parametrize(("when", "step"), [("before", 4), ("after", 4), ("before", 6), ("after", 6)])
def test_a_kill_right_before_or_after_a_checkpoint_write_resumes_bit_exactly(tmp_path, data, monkeypatch, kind,
                                                                             when, step):
    """Before the write the run goes back to the previous checkpoint (step 2); after it, to this one; after the
    final write (step 6) the summary is still missing and the resume only writes it, with the uninterrupted run's
    last train and eval records. With the CSV logger too."""
    config = _config(checkpoint_interval=2, loggers=("jsonl", "csv"))
    ref = _fit(kind, data, tmp_path / "ref", config)
    real = trainer_mod.save_checkpoint

    def dying(path, payload):
        if when == "before" and payload["step"] == step:
            raise _Kill("before the write")
        out = real(path, payload)
        if when == "after" and payload["step"] == step:
            raise _Kill("after the write")
        return out

    with monkeypatch.context() as m:
        m.setattr(trainer_mod, "save_checkpoint", dying)
        _fit(kind, data, tmp_path / "killed", config)
    assert not (tmp_path / "killed" / "summary.json").exists()
    res = _fit(kind, data, tmp_path / "killed", config, resume=True, model_seed=99)
    assert res.summary["resumed_from"] == (step if when == "after" else step - 2)
    _assert_same_run(ref, res)


@pytest.mark.parametrize("kind", ["dino", "gin-set", "minibatch"])
def test_no_clip_nanogpt_decay_and_capped_evaluations_resume_bit_exactly(tmp_path, data, kind):
    """grad_clip=0 (the non-finite check by the total norm), the nanoGPT decay rule, eval_steps=1, logs at every
    update, evaluations (3, 6) off the checkpoints (5), and a kill in the evaluation of step 6 (the final one)."""
    config = _config(grad_clip=0.0, weight_decay_rule="nanogpt", eval_steps=1, eval_interval=3, log_interval=1,
                     checkpoint_interval=5, max_steps=7, lr_decay_steps=7)
    ref = _fit(kind, data, tmp_path / "ref", config)
    for name, kill in (("update6", dict(at_step=6)), ("eval-at-6", dict(at_eval=2))):
        _assert_same_run(ref, _killed_and_resumed(kind, data, tmp_path, config, name, **kill))


def test_max_steps_then_continue_gives_the_same_weights_for_dino(tmp_path, data):
    """A finished 4-step run continued to 6 (lr_decay_steps fixed) ends with the uninterrupted run's weights,
    teacher, centre, optimizer and RNG states (its log differs by design: the last update of the 4-step run logged
    and evaluated)."""
    config = _config()
    ref = _fit("dino", data, tmp_path / "ref", config)
    _fit("dino", data, tmp_path / "cut", dataclasses.replace(config, max_steps=4))
    res = _fit("dino", data, tmp_path / "cut", config, resume=True, model_seed=99)
    _same(ref.model.state_dict(), res.model.state_dict(), "model")
    a, b = load_checkpoint(ref.checkpoint_path), load_checkpoint(res.checkpoint_path)
    _same(a["optimizer"], b["optimizer"], "optimizer")
    _same(a["rng"], b["rng"], "rng")


@pytest.mark.parametrize(("method", "call"), [("loss", 6), ("evaluate", 3)])
def test_a_runner_run_with_select_by_reach_and_a_learned_operator_resumes_to_the_same_result(tmp_path, method, call):
    """Through run_experiment: the graph transformer on karate with a learned diffusion time, select_by and
    reach, killed in update 5 or in the final evaluation (step 6): the RunResult (final, selected and reach values,
    learned operators) but its wall time, learned_operators.json, the log and the weights equal the clean run's."""
    train = {"max_steps": 6, "batch_size": 8, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2, "eval_interval": 2,
             "log_interval": 3, "checkpoint_interval": 4}
    raw = {"name": "p", "seeds": [0], "operators": [{"name": "heat", "heads": "attention:1,heat(learnable=True, steps=2):1"}],
           "tasks": [{"name": "node", "dataset": "karate", "model": "graph-node-small", "select_by": "val_loss",
                      "reach": {"test_acc": 0.1}, "model_overrides": {"dim": 16, "depth": 2, "num_heads": 2},
                      "train": train}]}
    cfg = load_experiment_config(raw)
    quiet = lambda _: None  # noqa: E731
    clean = run_experiment(cfg, tmp_path / "clean", progress=False, log=quiet)
    with interrupt_on_call(NodeTask, method, call), pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "killed", progress=False, log=quiet)
    resumed = run_experiment(cfg, tmp_path / "killed", progress=False, log=quiet)
    a, b = dataclasses.asdict(clean[0]), dataclasses.asdict(resumed[0])
    assert a.pop("elapsed") is not None and b.pop("elapsed") is not None
    assert a == b and a["status"] == "completed" and a["learned"] and a["reach_step"] == 2
    assert a["selected_step"] == 2 and a["selected_value"] == a["final"]["test_acc"]  # the best val_loss: step 2
    ra, rb = (run_dir(tmp_path / d / "p", "node", "heat", 0) for d in ("clean", "killed"))
    assert json.loads((rb / "summary.json").read_text())["resumed_from"] == 4
    assert (ra / "learned_operators.json").read_text() == (rb / "learned_operators.json").read_text()
    assert [_timeless(r) for r in read_metrics(ra)] == [_timeless(r) for r in read_metrics(rb)]
    _same(load_checkpoint(ra / "checkpoint.pt")["model"], load_checkpoint(rb / "checkpoint.pt")["model"], "model")
