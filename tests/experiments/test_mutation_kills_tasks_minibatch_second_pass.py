"""Tests written in a second mutation-testing audit of the task adapters (``experiments/tasks.py``),
neighbour-sampled node training (``experiments/minibatch.py``), the task protocol
(``train/task.py``) and the process-group helpers (``train/distributed.py``).

Each test kills a mutant of the library code that the first audits' tests
(``tests/models/test_mutation_kills_dino_tasks.py``, ``tests/experiments/test_mutation_kills_config_cli.py``,
``tests/train/test_mutation_kills_optim_checkpoint.py``, ...) and the rest of the suite let through; its
docstring names it (file, mutant id of this audit and the mutation). The references are independent of
the code under test: cross-entropies written out in float64 with ``math`` (log-sum-exp minus the true
logit, label smoothing as ``(1 - eps) nll + eps mean_c(-log p_c)``), accuracies counted by hand over the
unpadded targets, hand-listed shards and batch sizes, and stand-ins for the ``torch.distributed`` calls
that record what they were given (single process only: no process group is ever created). Mutants judged
equivalent are listed, with the reason, at the end of the file. CPU only, deterministic, no network.
"""

from __future__ import annotations

import math
import warnings
from collections import namedtuple
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch_geometric.data import Data

from diffusionformer.data.base import ClassificationData, GraphSetData, NodeData, SequenceTaskData, TextData
from diffusionformer.experiments import tasks as T
from diffusionformer.experiments.minibatch import (MiniBatchConfig, NodeMiniBatchTask, check_num_neighbors,
                                                   operator_hops, propagation_hops, resolve_num_neighbors)
from diffusionformer.models import GCN, GIN, DiffusionGraphTransformer, GCNConfig, GINConfig, GraphTransformerConfig
from diffusionformer.models import GPTConfig, ViTConfig
from diffusionformer.train import DistContext, Task, check_task, dist_env, init_distributed, shard_batch

# the namespace init_distributed reads resolve_device from: a doctest run of distributed.py collected
# before this file puts a second copy of the module in sys.modules, so patching the module fails
_INIT_GLOBALS = init_distributed.__globals__

CPU = torch.device("cpu")


# ---------------------------------------------------------------------------- references by hand
def _nll(row: list[float], label: int) -> float:
    """-log softmax(row)[label] in float64: log-sum-exp minus the true logit."""
    m = max(row)
    return m + math.log(sum(math.exp(v - m) for v in row)) - row[label]


def _mean_nll(rows: list[list[float]], labels: list[int]) -> float:
    return sum(_nll(r, c) for r, c in zip(rows, labels)) / len(rows)


def _hits(rows: list[list[float]], labels: list[int]) -> int:
    """Rows whose arg-max is the label, counted by hand (ties do not occur in these tests)."""
    return sum(max(range(len(r)), key=r.__getitem__) == c for r, c in zip(rows, labels))


class _Table(nn.Module):
    """Logits read from a fixed table: row ``i`` of the output is ``table[int(x[i, 0, ...])]``."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x.reshape(x.shape[0], -1)[:, 0].long()] + 0 * self.w


def _images(ids: list[int], labels: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (N, 1, 2, 2) whose every pixel is the row's id in the logit table."""
    x = torch.tensor(ids, dtype=torch.float32).view(-1, 1, 1, 1).expand(-1, 1, 2, 2).contiguous()
    return x, torch.tensor(labels)


def _image_data(train=([0, 1, 2], [0, 1, 2]), val=([0, 1, 2, 3, 4], [0, 2, 2, 1, 0]),
                test=([5, 6, 7], [1, 1, 0])) -> ClassificationData:
    return ClassificationData("toy", "image", *_images(*train), *_images(*val), *_images(*test), num_classes=3,
                              input_shape=(1, 2, 2))


_TABLE = torch.tensor([[2.0, 0.5, -1.0], [0.1, 0.3, 0.2], [1.5, -0.5, 1.4], [0.0, 2.0, 0.5], [-1.0, 0.0, 3.0],
                       [0.2, 0.9, 0.1], [1.0, 0.0, 0.4], [0.3, -0.2, 0.8]])


# ---------------------------------------------------------------------------- tasks.py: ClassificationTask
def test_classification_task_refuses_an_unknown_augment_key():
    """kills: tasks.py T1 the ``if unknown: raise`` of ClassificationTask dropped (``{"rotate": 15}`` was
    accepted and silently ignored: the run trained without the augmentation it asked for)"""
    with pytest.raises(ValueError, match=r"augment: unknown key\(s\) \['rotate'\]; expected some of \['crop_padding', 'flip'\]"):
        T.ClassificationTask(_image_data(), augment={"rotate": 15, "flip": True})


def test_classification_task_refuses_augmenting_signals():
    """kills: tasks.py T2 the image-only check of ``augment`` dropped (a signal batch (N, T, F) would reach
    the image crop and flip, which read its axes as channels, height and width)"""
    x = torch.zeros(4, 5, 2)
    y = torch.zeros(4, dtype=torch.long)
    data = ClassificationData("sig", "sequence", x, y, x, y, x, y, num_classes=2, input_shape=(5, 2))
    with pytest.raises(ValueError, match=r"augment needs images \(N, C, H, W\), got training data of shape \(4, 5, 2\)"):
        T.ClassificationTask(data, augment={"flip": True})
    assert T.ClassificationTask(data).augment == {}


@pytest.mark.parametrize("value", [True, 1.0, 1])
def test_classification_task_refuses_label_smoothing_true_or_one(value):
    """kills: tasks.py T3 (``isinstance(label_smoothing, bool)`` dropped: ``True`` read as 1) and T4
    (``< 1.0`` -> ``<= 1.0``: eps = 1 makes the target uniform, so nothing is learnt)"""
    with pytest.raises(ValueError, match=rf"label_smoothing must be a float in \[0, 1\), got {value!r}"):
        T.ClassificationTask(_image_data(), label_smoothing=value)


def test_classification_training_batches_reach_the_last_example():
    """kills: tasks.py T5 ``randint(0, n)`` -> ``randint(0, n - 1)`` in ClassificationTask.train_batch (the
    last training example was never drawn)"""
    task = T.ClassificationTask(_image_data())
    x, y = task.train_batch(0, torch.Generator().manual_seed(0), 200)
    assert set(x[:, 0, 0, 0].long().tolist()) == {0, 1, 2} and torch.equal(x[:, 0, 0, 0].long(), y)


def test_classification_training_loss_is_label_smoothed_cross_entropy_by_hand():
    """kills: tasks.py T6 ``label_smoothing`` not passed to the training loss, and T59 the training
    accuracy taken against other labels; reference: ``(1 - eps)(-log p_y) + eps mean_c(-log p_c)`` in
    float64 and the arg-max hits counted by hand"""
    eps = 0.2
    task = T.ClassificationTask(_image_data(), label_smoothing=eps)
    ids, labels = [0, 3, 4, 2, 1], [0, 0, 2, 2, 1]
    loss, metrics = task.loss(_Table(_TABLE), _images(ids, labels))
    rows = [_TABLE[i].double().tolist() for i in ids]
    ref = sum((1 - eps) * _nll(r, c) + eps * sum(_nll(r, k) for k in range(3)) / 3 for r, c in zip(rows, labels)) / 5
    assert float(loss.detach()) == pytest.approx(ref, rel=1e-6)
    assert float(metrics["acc"]) == pytest.approx(_hits(rows, labels) / 5) == pytest.approx(3 / 5)


def test_classification_evaluation_by_hand_over_several_batches():
    """kills: tasks.py T7 (per-batch mean cross-entropies summed and divided by N), T8 (``correct +=``
    -> ``correct =``: only the last batch's hits counted), T9 (accuracy divided by N - 1) and T10 (the
    test metrics computed on the validation split); reference: float64 cross-entropy and hits by hand,
    5 validation rows in batches of 2, 3 test rows"""
    data = _image_data()
    got = T.ClassificationTask(data, eval_batch_size=2).evaluate(_Table(_TABLE), None)
    for split, loss_key, acc_key in (("val", "loss", "val_acc"), ("test", "test_loss", "test_acc")):
        x, y = data.split(split)
        rows = [_TABLE[int(i)].double().tolist() for i in x[:, 0, 0, 0]]
        assert got[loss_key] == pytest.approx(_mean_nll(rows, y.tolist()), rel=1e-6)
        assert got[acc_key] == pytest.approx(_hits(rows, y.tolist()) / len(rows))
    assert (got["val_acc"], got["test_acc"]) == (pytest.approx(2 / 5), pytest.approx(1 / 3))


# ---------------------------------------------------------------------------- tasks.py: DINOTask
def _tiny_dino():
    from diffusionformer.models import DINO, DINOConfig

    torch.manual_seed(0)
    return DINO(DINOConfig(input_size=(8, 8), in_channels=1, patch_size=4, dim=8, depth=1, num_heads=2, pool="mean",
                           out_dim=6, head_hidden=8, head_bottleneck=4, schedule_steps=4))


def _dino_images(n: int = 12) -> ClassificationData:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    return ClassificationData("toy", "image", x, y, x[:8].clone(), y[:8], x[4:].clone(), y[4:], num_classes=3,
                              input_shape=(1, 8, 8))


class _Wrap(nn.Module):
    """A DDP-like wrapper (``.module``) or a ``torch.compile``-like one (``._orig_mod``)."""

    def __init__(self, inner: nn.Module, attr: str) -> None:
        super().__init__()
        setattr(self, attr, inner)


def test_dino_task_unwraps_ddp_around_a_compiled_model():
    """kills: the ``_orig_mod`` step dropped from the unwrapping _unwrap_dino calls (analysis.capture._innermost: a
    compiled DINO refused, as was DDP around ``torch.compile`` around DINO)"""
    dino = _tiny_dino()
    for model in (_Wrap(dino, "_orig_mod"), _Wrap(_Wrap(dino, "_orig_mod"), "module")):
        assert T._unwrap_dino(model) is dino
        assert T.DINOTask(_dino_images(), model).config is dino.config


def test_dino_task_refuses_a_model_that_is_not_dino_with_a_type_error():
    """kills: tasks.py T13 the error of _unwrap_dino turned into a ValueError (documented: a wrong model
    is a TypeError, wrong data a ValueError)"""
    with pytest.raises(TypeError, match=r"DINOTask expects a DINO model .* got Linear"):
        T.DINOTask(_dino_images(), nn.Linear(2, 2))


def test_dino_task_refuses_signal_data_and_a_bad_ssl():
    """kills: tasks.py T14 the ``kind == "image"`` check dropped (signals (N, T, F) reached the image
    augmentations) and T15 the ``TypeError`` for an ``ssl`` that is neither SSLConfig, dict nor None"""
    x = torch.zeros(4, 5, 2)
    y = torch.zeros(4, dtype=torch.long)
    sig = ClassificationData("sig", "sequence", x, y, x, y, x, y, num_classes=2, input_shape=(5, 2))
    with pytest.raises(ValueError, match=r"DINOTask needs image data .* got 'sig' of kind 'sequence'"):
        T.DINOTask(sig, _tiny_dino())
    with pytest.raises(TypeError, match=r"ssl must be an SSLConfig, a dict of its fields or None, got list"):
        T.DINOTask(_dino_images(), _tiny_dino(), ssl=[("knn_k", 3)])


def test_dino_evaluation_features_are_capped_at_max_batches_of_eval_batch_size():
    """kills: tasks.py T17 ``min(n, max_batches * eval_batch_size)`` -> ``min(n, max_batches)`` (a capped
    evaluation of 2 batches of 3 read one batch of 3 per split, not 6 images); reference: the rows the model saw"""
    model = _tiny_dino().eval()
    rows: list[int] = []
    model.register_forward_hook(lambda mod, args, kwargs, out: rows.append(args[0].shape[0])
                                if kwargs.get("output", "features") == "features" else None, with_kwargs=True)
    out = T.DINOTask(_dino_images(), model, eval_batch_size=3).evaluate(model, max_batches=2)
    assert rows == [3, 3] * 3  # the bank (train: 12 images), val (8), test (8): two batches of 3 each
    assert set(out) == {"knn_val_acc", "knn_test_acc", "loss"}


def test_dino_evaluation_without_a_bank_reports_nan_accuracies():
    """kills: tasks.py T16 ``bank empty or split empty`` -> ``and`` (an empty training split, the k-NN bank,
    with non-empty validation images made knn_classify raise instead of giving the documented NaN)"""
    model = _tiny_dino().eval()
    full = _dino_images()
    data = ClassificationData("toy", "image", full.x_train[:0], full.y_train[:0], full.x_val, full.y_val,
                              full.x_test, full.y_test, num_classes=3, input_shape=(1, 8, 8))
    out = T.DINOTask(data, model, eval_batch_size=4).evaluate(model, None)
    assert math.isnan(out["knn_val_acc"]) and math.isnan(out["knn_test_acc"]) and math.isfinite(out["loss"])


def test_dino_evaluation_loss_does_not_depend_on_the_warmup_temperature():
    """kills: tasks.py T18 the evaluation loss taken at ``teacher_temp_at(0)`` (the warm-up start) instead of
    the final ``teacher_temp``: a held-out score of the weights must not change with the schedule's start;
    two models with the same weights and warm-ups from 0.02 and 0.06 (none) score the same"""
    from diffusionformer.models import DINO, DINOConfig

    losses = []
    for warm in (0.02, 0.06):
        torch.manual_seed(0)
        model = DINO(DINOConfig(input_size=(8, 8), in_channels=1, patch_size=4, dim=8, depth=1, num_heads=2,
                                pool="mean", out_dim=6, head_hidden=8, head_bottleneck=4, schedule_steps=4,
                                teacher_temp=0.06, warmup_teacher_temp=warm, warmup_teacher_temp_steps=4)).eval()
        losses.append(T.DINOTask(_dino_images(), model, eval_batch_size=4).evaluate(model, 1)["loss"])
    assert losses[0] == losses[1]


# ---------------------------------------------------------------------------- tasks.py: TextLMTask
class _WindowLoss(nn.Module):
    """A language model whose loss is the mean target token id of the window (a function of the window)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        return None, y.double().mean()


def test_text_evaluation_scores_train_and_val_on_the_same_windows():
    """kills: tasks.py T19 one generator for both splits (val windows drawn after the train ones, not the
    same offsets: documented "the same number of windows of each split, drawn from one fixed seed"); with
    identical train and val text the two losses and the gap must then be exactly equal and 0"""
    tokens = torch.tensor([(7 * i) % 11 for i in range(60)])
    data = TextData("t", tokens, tokens.clone(), 11, [chr(97 + i) for i in range(11)])
    out = T.TextLMTask(data, block_size=4, eval_batch_size=3, eval_batches=2).evaluate(_WindowLoss(), None)
    assert out["train_loss"] == out["val_loss"] == out["loss"] and out["gap_loss"] == 0.0


def test_text_evaluation_loss_is_the_validation_loss():
    """kills: tasks.py T20 ``loss = train_loss`` (the record's loss, which picks the best checkpoint, read
    the training windows); reference: val text all token 1, train text all token 0"""
    data = TextData("t", torch.zeros(40, dtype=torch.long), torch.ones(40, dtype=torch.long), 2, ["a", "b"])
    out = T.TextLMTask(data, block_size=4, eval_batch_size=2, eval_batches=2).evaluate(_WindowLoss(), None)
    assert (out["train_loss"], out["val_loss"], out["loss"], out["gap_loss"]) == (0.0, 1.0, 1.0, 1.0)


def test_a_text_task_needs_a_model_with_a_block_size():
    """kills: tasks.py T58 the ``block_size is None`` refusal of _text_task dropped (a TextLMTask with
    ``block_size=None`` failed at its first batch with an unrelated error)"""
    data = TextData("t", torch.zeros(40, dtype=torch.long), torch.ones(40, dtype=torch.long), 2, ["a", "b"])
    with pytest.raises(ValueError, match=r"a text task needs a GPT model \(with config.block_size\)"):
        T.build_task(data, nn.Linear(2, 2))


# ---------------------------------------------------------------------------- tasks.py: SequenceLMTask
class _SeqTable(nn.Module):
    """Causal LM stand-in: logits ``table[x]`` per position (vocabulary 4), as ``(logits, loss)``."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> Any:
        return self.table[x] + 0 * self.w, None


_SEQ_TABLE = torch.tensor([[1.0, 0.0, -1.0, 0.5], [0.2, 1.2, 0.0, -0.3], [0.0, 0.3, 2.0, 0.1], [-0.5, 0.4, 0.6, 0.0]])


def _seq_data() -> SequenceTaskData:
    # val: 3 sequences with 2, 0 and 1 targets; test: 2 sequences with 1 and 3 targets (-100 = padding)
    xv = torch.tensor([[0, 1, 2], [3, 3, 3], [2, 0, 1]])
    yv = torch.tensor([[0, -100, 1], [-100, -100, -100], [-100, 3, -100]])
    xt = torch.tensor([[1, 2, 3], [0, 3, 2]])
    yt = torch.tensor([[-100, 2, -100], [3, 2, 2]])
    xtr = torch.tensor([[0, 1, 2], [1, 2, 3], [3, 2, 1]])
    return SequenceTaskData("seq", xtr, xtr.clone(), xv, yv, xt, yt, vocab_size=4)


def test_sequence_evaluation_averages_over_the_unpadded_targets_by_hand():
    """kills: tasks.py T22 (the loss divided by the number of sequences, not of targets), T23 (the ``-100``
    padding counted in the denominator), T24 (the accuracy scored on every position, padding included),
    T25 (per-batch mean losses summed) and T26 (the test metrics computed on the validation split);
    reference: float64 cross-entropy over the target positions and hits counted by hand, batches of 2"""
    data = _seq_data()
    got = T.SequenceLMTask(data, eval_batch_size=2).evaluate(_SeqTable(_SEQ_TABLE), None)
    for split, loss_key, acc_key in (("val", "loss", "val_acc"), ("test", "test_loss", "test_acc")):
        x, y = data.split(split)
        pairs = [(x[i, t].item(), y[i, t].item()) for i in range(x.shape[0]) for t in range(3) if y[i, t] != -100]
        rows = [_SEQ_TABLE[tok].double().tolist() for tok, _ in pairs]
        labels = [c for _, c in pairs]
        assert got[loss_key] == pytest.approx(_mean_nll(rows, labels), rel=1e-6)
        assert got[acc_key] == pytest.approx(_hits(rows, labels) / len(labels))
    assert (got["val_acc"], got["test_acc"]) == (pytest.approx(1 / 3), pytest.approx(3 / 4))


def test_sequence_accuracy_skips_a_non_negative_ignore_index():
    """kills: tasks.py T24 the evaluation accuracy scored on every position (with the default ``-100`` the
    padding never matches an arg-max, but a dataset whose ``ignore_index`` is a token id, here 3, had its
    padding positions counted as hits); reference: hits counted by hand on the 2 real targets"""
    x = torch.tensor([[3, 3, 0], [1, 3, 2]])  # the table predicts 3 at token 3: a "hit" on padding
    y = torch.tensor([[3, 3, 0], [1, 3, 3]])
    data = SequenceTaskData("seq", x, y, x, y, x, y, vocab_size=4, ignore_index=3)
    table = _SEQ_TABLE.clone()
    table[3] = torch.tensor([0.0, 0.2, 0.1, 1.0])  # arg-max 3
    got = T.SequenceLMTask(data, eval_batch_size=1).evaluate(_SeqTable(table), None)
    rows, labels = [table[0].double().tolist(), table[1].double().tolist()], [0, 1]
    assert got["val_acc"] == pytest.approx(_hits(rows, labels) / 2) == pytest.approx(1.0)
    assert got["loss"] == pytest.approx(_mean_nll(rows, labels), rel=1e-6)


def test_sequence_training_batches_reach_the_last_sequence():
    """kills: tasks.py T21 ``randint(0, n)`` -> ``randint(0, n - 1)`` in SequenceLMTask.train_batch"""
    x, _ = T.SequenceLMTask(_seq_data()).train_batch(0, torch.Generator().manual_seed(0), 100)
    assert {tuple(r) for r in x.tolist()} == {(0, 1, 2), (1, 2, 3), (3, 2, 1)}


# ---------------------------------------------------------------------------- tasks.py: NodeTask
def _ring(N: int = 12, F: int = 2, C: int = 3, train=range(0, 4), val=range(4, 11), test=range(11, 12)) -> NodeData:
    g = torch.Generator().manual_seed(1)
    i = torch.arange(N)
    edge_index = torch.stack([torch.cat([i, (i + 1) % N]), torch.cat([(i + 1) % N, i])])
    masks = []
    for idx in (train, val, test):
        m = torch.zeros(N, dtype=torch.bool)
        m[list(idx)] = True
        masks.append(m)
    data = Data(x=torch.randn(N, F, generator=g), edge_index=edge_index, y=torch.randint(0, C, (N,), generator=g),
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
    return NodeData("ring", data, num_classes=C, num_features=F)


class _NodeLinear(nn.Module):
    """A model that reads each node's own features only (its outputs do not depend on the sampled edges)."""

    def __init__(self, F: int = 2, C: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(F, C)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.lin(x)

    def rows(self, x: torch.Tensor) -> list[list[float]]:
        """The logits of the nodes of ``x`` in float64, written out as ``x W^T + b``."""
        with torch.no_grad():
            return (x.double() @ self.lin.weight.double().T + self.lin.bias.double()).tolist()


def test_node_task_training_accuracy_counts_the_training_nodes_only():
    """kills: tasks.py T27 NodeTask's training accuracy over every node instead of the ``train_mask`` ones;
    reference: the arg-max hits of the 4 training nodes counted by hand"""
    data = _ring()
    model = _NodeLinear()
    d = data.data
    _, metrics = T.NodeTask(data).loss(model, d)
    rows = model.rows(d.x)
    train = d.train_mask.nonzero().view(-1).tolist()
    assert float(metrics["acc"]) == pytest.approx(_hits([rows[i] for i in train], [int(d.y[i]) for i in train]) / 4)
    assert float(metrics["acc"]) != pytest.approx(_hits(rows, d.y.tolist()) / 12)


def test_full_graph_tasks_give_every_rank_the_whole_graph_and_refuse_micro_batches():
    """kills: tasks.py T28 NodeTask.shard_batch dropped (the default sharding cut the graph's node rows
    apart) and T29 ``splits_into_micro_batches = True`` (grad_accum_steps would repeat the whole graph);
    minibatch.py M31 NodeMiniBatchTask.shard_batch dropped (the sampled subgraph cut apart)"""
    data = _ring()
    assert T.NodeTask(data).shard_batch(data.data, 1, 2) is data.data
    assert T.NodeTask.splits_into_micro_batches is False
    task = NodeMiniBatchTask(data, [2], 3)
    batch = task.train_batch(0, torch.Generator().manual_seed(0), 3)
    assert task.shard_batch(batch, 1, 4) is batch


# ---------------------------------------------------------------------------- tasks.py: GraphClassificationTask
def _graphs(labels=(0, 1, 1, 2, 2, 2, 1)) -> GraphSetData:
    graphs = []
    for n, c in enumerate(labels):
        x = torch.full((2, 1), float(n))
        graphs.append(Data(x=x, edge_index=torch.tensor([[0, 1], [1, 0]]), y=torch.tensor([c])))
    return GraphSetData("g", graphs, torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5, 6]), torch.tensor([1, 3]),
                        num_classes=3, num_features=1)


class _GraphTable(nn.Module):
    """Graph logits ``table[graph id]``, the id read from the features of the graph's first node."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        first = torch.zeros(int(batch.max()) + 1, dtype=torch.long).scatter_reduce(
            0, batch, torch.arange(batch.numel()), "amin", include_self=False)
        return self.table[x[first, 0].long()] + 0 * self.w


def test_graph_classification_evaluation_by_hand():
    """kills: tasks.py T33 (per-batch mean losses summed and divided by the graph count), T34 (``correct =``:
    only the last batch's hits) and T35 (``loss = test_loss``); reference: float64 cross-entropy and hits
    by hand over 3 validation graphs (batches of 2) and 2 test graphs"""
    data = _graphs()
    got = T.GraphClassificationTask(data, eval_batch_size=2).evaluate(_GraphTable(_TABLE), None)
    labels = [0, 1, 1, 2, 2, 2, 1]
    for split, ids in (("val", [4, 5, 6]), ("test", [1, 3])):
        rows = [_TABLE[i].double().tolist() for i in ids]
        ys = [labels[i] for i in ids]
        assert got[f"{split}_loss"] == pytest.approx(_mean_nll(rows, ys), rel=1e-6)
        assert got[f"{split}_acc"] == pytest.approx(_hits(rows, ys) / len(ys))
    assert got["loss"] == got["val_loss"] != got["test_loss"]
    assert (got["val_acc"], got["test_acc"]) == (pytest.approx(1 / 3), pytest.approx(1 / 2))  # a hit in the 1st batch


def test_an_empty_split_scores_nan_not_a_perfect_zero_loss():
    """Bug: a split with nothing to score had loss 0.0 and accuracy 0.0 in ``SequenceLMTask`` (every
    target ``ignore_index``) and ``GraphClassificationTask`` (no graphs), a "perfect" loss that a
    ``select_by: loss`` would pick, and ``ClassificationTask`` divided by zero. Now NaN, as
    ``DINOTask`` and ``NodeMiniBatchTask`` report; the other split keeps its by-hand values."""
    data = _seq_data()
    xv, yv = data.split("val")
    empty_val = SequenceTaskData("seq", data.x_train, data.y_train, xv, torch.full_like(yv, -100),
                                 *data.split("test"), vocab_size=4)
    got = T.SequenceLMTask(empty_val, eval_batch_size=2).evaluate(_SeqTable(_SEQ_TABLE), None)
    assert math.isnan(got["loss"]) and math.isnan(got["val_acc"]) and got["test_acc"] == pytest.approx(3 / 4)
    g = _graphs()
    no_test = GraphSetData("g", g.dataset, torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5, 6]),
                           torch.tensor([], dtype=torch.long), num_classes=3, num_features=1)
    got = T.GraphClassificationTask(no_test, eval_batch_size=2).evaluate(_GraphTable(_TABLE), None)
    assert math.isnan(got["test_loss"]) and math.isnan(got["test_acc"]) and got["val_acc"] == pytest.approx(1 / 3)
    xv, yv = _images([0, 1, 2, 3, 4], [0, 2, 2, 1, 0])
    img = ClassificationData("toy", "image", *_images([0, 1, 2], [0, 1, 2]), xv, yv, xv[:0], yv[:0], num_classes=3,
                             input_shape=(1, 2, 2))
    got = T.ClassificationTask(img).evaluate(_Table(_TABLE), None)
    assert math.isnan(got["test_loss"]) and math.isnan(got["test_acc"])
    rows = [_TABLE[i].double().tolist() for i in (0, 1, 2, 3, 4)]
    assert got["loss"] == pytest.approx(_mean_nll(rows, [0, 2, 2, 1, 0]), rel=1e-6)


def test_graph_batches_shard_into_equal_contiguous_parts_or_are_refused():
    """kills: tasks.py T30 the equal-parts check dropped (7 graphs over 2 ranks: a graph silently dropped)
    and T31 strided shards (rank 1 of 2 took graphs 1 and 3, not 2 and 3); T32 ``randint(0, n - 1)`` in
    train_batch (the last training graph never drawn)"""
    task = T.GraphClassificationTask(_graphs())
    batch = task.train_batch(0, torch.Generator().manual_seed(0), 60)
    ids = batch.x[batch.ptr[:-1], 0].long().tolist()
    assert set(ids) == {0, 1, 2, 3}
    from torch_geometric.data import Batch

    four = Batch.from_data_list([task.graphs["train"][i] for i in range(4)])
    assert task.shard_batch(four, 1, 2).x[:, 0].tolist() == [2.0, 2.0, 3.0, 3.0]
    three = Batch.from_data_list([task.graphs["train"][i] for i in range(3)])
    with pytest.raises(ValueError, match=r"a batch of 3 graphs does not split into 2 equal parts"):
        task.shard_batch(three, 0, 2)


def test_graph_task_evaluation_batches_are_capped_at_256_graphs():
    """kills: tasks.py T57 the graph-set adapter passing ``eval_batch_size`` uncapped (a run's default 512
    graphs per evaluation batch, documented cap 256)"""
    data = _graphs()
    assert T.build_task(data, nn.Linear(1, 1), eval_batch_size=512).eval_batch_size == 256
    assert T.build_task(data, nn.Linear(1, 1), eval_batch_size=8).eval_batch_size == 8


# ---------------------------------------------------------------------------- tasks.py: the adapter registry
def test_register_task_adapter_refuses_a_non_adapter_and_a_non_class_data_key(task_adapters):
    """kills: tasks.py T36 the ``TaskAdapter`` type check dropped (a dict registered, then every lookup
    failed with an AttributeError) and T37 the data key's class check dropped (a string key registered)"""

    class Fresh:
        pass

    before = dict(task_adapters)
    with pytest.raises(TypeError, match=r"adapter must be a TaskAdapter, got dict"):
        T.register_task_adapter(None, Fresh, {"task": None})
    with pytest.raises(TypeError, match=r"task adapters are keyed by classes .* got \(None, 'nodes'\)"):
        T.register_task_adapter(None, ("nodes",), T.TaskAdapter(task=lambda d, m, b: None))
    assert dict(task_adapters) == before


def test_find_adapter_refuses_an_unknown_hook_by_name():
    """kills: tasks.py T38 the unknown-hook check dropped (``"taks"`` raised a bare AttributeError)"""
    with pytest.raises(ValueError, match=r"unknown adapter hook 'taks' \(did you mean 'task'\?\); expected one of \['analysed', 'heldout'"):
        T.find_adapter(None, ClassificationData, "taks")


def test_find_adapter_skips_an_adapter_without_the_hook(task_adapters):
    """kills: tasks.py T39 ``getattr(adapter, hook) is not None`` dropped (a family adapter that only gives
    overrides hid the task of any model's adapter)"""

    class FreshConfig:
        pass

    mine = T.register_task_adapter(FreshConfig, ClassificationData, T.TaskAdapter(overrides=lambda d: {}))
    assert T.find_adapter(FreshConfig, ClassificationData, "overrides") is mine
    assert T.find_adapter(FreshConfig, ClassificationData, "task") is T.find_adapter(None, ClassificationData, "task")


def test_model_family_is_none_without_a_config_and_the_error_names_the_family():
    """kills: tasks.py T40 model_family returning ``type(None)`` for a model without ``config`` and T41 the
    ``Config`` suffix kept in the "does not fit" message ("a ViTConfig model")"""
    assert T.model_family(nn.Linear(1, 1)) is None
    data = TextData("t", torch.zeros(10, dtype=torch.long), torch.zeros(10, dtype=torch.long), 1, ["a"])
    with pytest.raises(ValueError, match=r"dataset 't' of kind 'text' does not fit a ViT model; pick a preset"):
        T.model_overrides_for_data(data, ViTConfig)


def test_build_task_and_heldout_batches_refuse_unknown_data_with_a_type_error():
    """kills: tasks.py T42 (build_task's ``adapter is None`` refusal dropped: an AttributeError on None) and
    T47 (heldout_batches returning no batches for unknown data, silently)"""
    with pytest.raises(TypeError, match=r"no task adapter for str"):
        T.build_task("digits", nn.Linear(1, 1))
    with pytest.raises(TypeError, match=r"no held-out data for str"):
        T.heldout_batches("digits", nn.Linear(1, 1), "val", 4, 2)


@pytest.mark.parametrize("option", [{"augment": {"flip": True}}, {"label_smoothing": 0.1}])
def test_build_task_refuses_minibatch_with_augment_or_label_smoothing(option):
    """kills: tasks.py T43 (``or augment`` dropped) and T44 (``or label_smoothing`` dropped) from the
    minibatch refusal of build_task: the option was silently ignored by the node task"""
    with pytest.raises(ValueError, match=r"minibatch applies to node classification \(NodeData\) only"):
        T.build_task(_ring(), _NodeLinear(), minibatch={"batch_size": 2, "num_neighbors": [2]}, **option)


def test_build_task_refuses_ssl_for_a_model_that_is_not_dino():
    """kills: tasks.py T45 the ``ssl`` refusal for models other than DINO dropped (DINOTask then refused the
    model with a message about DINO wrappers, not about the ``ssl`` option)"""
    with pytest.raises(ValueError, match=r"ssl applies to DINO models only, not to Linear"):
        T.build_task(_dino_images(), nn.Linear(1, 1), ssl={"knn_k": 3})


def test_build_task_refuses_label_smoothing_on_text():
    """kills: tasks.py T46 the supervised-classification check reduced to ``_is_dino(model)`` (text data
    with label_smoothing reached its adapter, whose task takes no such option: a bare TypeError)"""
    data = TextData("t", torch.zeros(40, dtype=torch.long), torch.ones(40, dtype=torch.long), 2, ["a", "b"])
    with pytest.raises(ValueError, match=r"supervised classification only, not to TextData with Linear"):
        T.build_task(data, nn.Linear(1, 1), label_smoothing=0.1)


# ---------------------------------------------------------------------------- tasks.py: held-out batches
def test_heldout_labelled_batches_keep_every_example():
    """kills: tasks.py T48 the batches of _heldout_labelled over ``range(0, n - 1, batch_size)`` (with 5
    examples in batches of 2 the last example was dropped)"""
    batches, info = T.heldout_batches(_image_data(), nn.Linear(1, 1), "val", 5, 2)
    assert [b[0].shape[0] for b in batches] == [2, 2, 1]
    assert sorted(torch.cat([b[0] for b in batches])[:, 0, 0, 0].long().tolist()) == [0, 1, 2, 3, 4]
    assert info["examples"] == "seeded random subset of 5"


def test_heldout_text_windows_are_max_examples_validation_windows():
    """kills: tasks.py T49 (every batch of full ``batch_size``: 6 windows for ``max_examples = 5``) and T50
    (the windows read from the training text); val text all token 1, train text all token 0"""

    class _GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = GPTConfig(vocab_size=2, block_size=4, n_layer=1, n_head=1, n_embd=4)

    data = TextData("t", torch.zeros(40, dtype=torch.long), torch.ones(40, dtype=torch.long), 2, ["a", "b"])
    batches, info = T.heldout_batches(data, _GPT(), "val", 5, 2)
    assert [b[0].shape for b in batches] == [(2, 4), (2, 4), (1, 4)]
    assert all(bool((x == 1).all()) and bool((y == 1).all()) for x, y in batches) and info["split"] == "val"


def test_heldout_node_labels_are_those_of_the_split_only():
    """kills: tasks.py T51 the held-out node labels masked with ``train_mask`` whatever the split (the
    analysis of the test nodes scored the training nodes)"""
    data = _ring()
    (batch,), info = T.heldout_batches(data, nn.Linear(1, 1), "test", 100, 100)
    y = data.data.y
    assert batch[1].tolist() == [-100] * 11 + [int(y[11])] and info["labels"] == "node class (test nodes)"


def test_heldout_graphs_stop_at_max_examples():
    """kills: tasks.py T52 ``[:max_examples]`` dropped in _heldout_graphs (all 3 validation graphs read for 2)"""
    batches, _ = T.heldout_batches(_graphs(), nn.Linear(1, 1), "val", 2, 8)
    assert len(batches) == 1 and batches[0][1].tolist() == [2, 2] and batches[0][0].num_graphs == 2


def test_vit_overrides_of_signals_and_dino_refusal_of_signals():
    """kills: tasks.py T53 the signal branch of _vit_sizes reading (T, F) as an image's (C, H) and T54
    _dino_sizes accepting signals"""
    x = torch.zeros(2, 5, 3)
    y = torch.zeros(2, dtype=torch.long)
    sig = ClassificationData("sig", "sequence", x, y, x, y, x, y, num_classes=4, input_shape=(5, 3))
    assert T.model_overrides_for_data(sig, ViTConfig) == {"in_channels": 3, "input_size": (5,), "num_classes": 4}
    from diffusionformer.models import DINOConfig

    with pytest.raises(ValueError, match=r"dataset 'sig' of kind 'sequence' does not fit a DINO model"):
        T.model_overrides_for_data(sig, DINOConfig)


def test_as_metrics_keeps_numbers_and_the_metrics_own_loss():
    """kills: tasks.py T55 (non-numeric metrics kept: a string or a None in a table of means) and T56 (the
    record's ``loss`` overwriting the ``loss`` the metrics give)"""
    record = {"loss": 9.0, "metrics": {"loss": 1.5, "val_acc": 0.5, "note": "x", "bad": None, "n": 3}}
    assert T.as_metrics(record) == {"loss": 1.5, "val_acc": 0.5, "n": 3}
    assert T.as_metrics({"loss": 2.0, "metrics": {"acc": 1.0}}) == {"acc": 1.0, "loss": 2.0}
    assert T.as_metrics(None) == {} == T.as_metrics({})


# ---------------------------------------------------------------------------- minibatch.py: MiniBatchConfig
def test_minibatch_config_names_the_missing_field():
    """kills: minibatch.py M1 the ``missing`` list fixed to ``batch_size`` (a table without num_neighbors
    was told it lacks batch_size)"""
    with pytest.raises(ValueError, match=r"^minibatch needs num_neighbors, e\.g\."):
        MiniBatchConfig(batch_size=4)
    with pytest.raises(ValueError, match=r"^minibatch needs batch_size and num_neighbors, e\.g\."):
        MiniBatchConfig()


@pytest.mark.parametrize("fields, match", [
    (dict(batch_size=True, num_neighbors=[2]), r"minibatch.batch_size must be a positive int, got True"),
    (dict(batch_size=0, num_neighbors=[2]), r"minibatch.batch_size must be a positive int, got 0"),
    (dict(batch_size=2, num_neighbors=[2, 0]), r"minibatch.num_neighbors must be a positive int or -1 .* got \[2, 0\]"),
    (dict(batch_size=2, num_neighbors=[]), r"minibatch.num_neighbors .* got \[\]"),
    (dict(batch_size=2, num_neighbors=[True]), r"minibatch.num_neighbors .* got \[True\]"),
    (dict(batch_size=2, num_neighbors=[2], eval="exact"), r"minibatch.eval must be one of \['full', 'sampled'\], got 'exact'"),
])
def test_minibatch_config_range_checks(fields, match):
    """kills: minibatch.py M2 (bool batch_size), M3 (``< 1`` -> ``< 0``: batch_size 0), M4 (0 neighbours
    accepted), M5 (an empty list accepted), M6 (a bool in num_neighbors accepted) and M7 (an unknown eval)"""
    with pytest.raises(ValueError, match=match):
        MiniBatchConfig(**fields)


def test_minibatch_from_dict_prefixes_errors_with_where():
    """kills: minibatch.py M8 (``where`` put before the whole text: "tasks[0].minibatch: minibatch.batch_size
    ...") and M42 (the rewrite applied to a message that already starts with ``where``)"""
    with pytest.raises(ValueError, match=r"^tasks\[0\]\.minibatch\.batch_size must be a positive int, got 0$"):
        MiniBatchConfig.from_dict({"batch_size": 0, "num_neighbors": [2]}, where="tasks[0].minibatch")
    with pytest.raises(ValueError, match=r"^tasks\[0\]\.minibatch\.eval: expected one of \['full', 'sampled'\], got 'x'$"):
        MiniBatchConfig.from_dict({"batch_size": 1, "num_neighbors": [2], "eval": "x"}, where="tasks[0].minibatch")


# ---------------------------------------------------------------------------- minibatch.py: hops
def test_operator_hops_of_unknown_and_solver_operators():
    """kills: minibatch.py M9 (every non-polynomial operator counted as one hop: ``ppr-exact``, a full
    resolvent, would be sampled with one hop) and M10 (grand-nl's solver stages ignored: rk4 with one
    step re-attends 4 times)"""
    from diffusionformer.operators import build_operator

    assert operator_hops(build_operator("ppr-exact")) is None
    assert operator_hops(build_operator("grand-nl", t=1.0, steps=1, method="rk4")) == 4
    assert operator_hops(build_operator("attnscale")) == 1


def _gt(heads: str, depth: int = 2, **kw) -> DiffusionGraphTransformer:
    torch.manual_seed(0)
    return DiffusionGraphTransformer(GraphTransformerConfig(in_channels=2, num_classes=3, dim=8, depth=depth,
                                                            num_heads=2, heads=heads, **kw))


def test_propagation_hops_by_hand():
    """kills: minibatch.py M11 (global attention counted as local hops), M12 (``any`` -> ``all``: one
    unknown head of two ignored), M13 (``max`` -> ``sum`` over a layer's heads), M14 (GCN ``num_layers``
    without the normalisation hop), M15 (GIN ``num_layers`` instead of its ``num_layers - 1`` convolutions)
    and M16 (a DDP wrapper not looked through); reference: R = sum over layers of the largest head degree"""
    assert propagation_hops(_gt("attention:1,heat(steps=3):1")) == 6  # 2 layers x max(1, 3)
    assert propagation_hops(_gt("attention:1,ppr-exact:1")) is None
    assert propagation_hops(_gt("attention:2", global_attention=True)) is None
    assert propagation_hops(GCN(GCNConfig(in_channels=2, num_classes=3, hidden=4, num_layers=2))) == 3
    assert propagation_hops(GIN(GINConfig(in_channels=2, num_classes=3, hidden=4, num_layers=3))) == 2
    assert propagation_hops(_Wrap(_gt("attention:1,heat(steps=3):1"), "module")) == 6


def test_check_and_resolve_num_neighbors_at_the_boundaries():
    """kills: minibatch.py M17 (an int accepted for a model of unknown R), M18 (``L > R`` -> ``L > R + 1``:
    one hop too many accepted), M19 (``L < R`` -> ``L < R - 1``: one hop short not warned), M20 (an int not
    repeated R times) and M21 (resolve_num_neighbors not raising the problem)"""
    assert check_num_neighbors(MiniBatchConfig(2, 5), None)[0].startswith("num_neighbors is one int")
    problem, _ = check_num_neighbors(MiniBatchConfig(2, [5, 5, 5]), 2)
    assert problem.startswith("num_neighbors samples 3 hops but the model propagates R = 2")
    _, warning = check_num_neighbors(MiniBatchConfig(2, [5]), 2)
    assert warning.startswith("num_neighbors samples 1 hop(s) but the model propagates R = 2")
    assert check_num_neighbors(MiniBatchConfig(2, [5, 5]), 2) == (None, None)
    assert resolve_num_neighbors(MiniBatchConfig(2, 4), 3) == [4, 4, 4]
    with pytest.raises(ValueError, match=r"num_neighbors samples 3 hops but the model propagates R = 2"):
        resolve_num_neighbors(MiniBatchConfig(2, [5, 5, 5]), 2)


# ---------------------------------------------------------------------------- minibatch.py: NodeMiniBatchTask
def test_node_minibatch_task_refuses_bad_arguments():
    """kills: minibatch.py M22 (NodeData check dropped), M23 (bool batch_size), M24 (unknown eval) and M25
    (a graph without training nodes accepted: every update drew no seed and the loss was NaN)"""
    data = _ring()
    with pytest.raises(TypeError, match=r"NodeMiniBatchTask: expected NodeData, got Data"):
        NodeMiniBatchTask(data.data, [2], 2)
    with pytest.raises(ValueError, match=r"NodeMiniBatchTask: batch_size must be a positive int, got True"):
        NodeMiniBatchTask(data, [2], True)
    with pytest.raises(ValueError, match=r"NodeMiniBatchTask: eval must be one of \['full', 'sampled'\], got 'exact'"):
        NodeMiniBatchTask(data, [2], 2, eval="exact")
    data.data.train_mask = torch.zeros(12, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"NodeMiniBatchTask: dataset 'ring' has no training nodes"):
        NodeMiniBatchTask(data, [2], 2)


def test_for_model_warns_and_passes_eval_and_eval_batch_size():
    """kills: minibatch.py M26 (the fewer-hops warning not emitted), M27 (``eval`` not passed: always
    "full") and M28 (``eval_batch_size`` not passed: always 512)"""
    model = GCN(GCNConfig(in_channels=2, num_classes=3, hidden=4, num_layers=2))
    with pytest.warns(UserWarning, match=r"num_neighbors samples 1 hop\(s\) but the model propagates R = 3"):
        task = NodeMiniBatchTask.for_model(_ring(), model, {"batch_size": 2, "num_neighbors": [3], "eval": "sampled"},
                                           eval_batch_size=5)
    assert (task.eval, task.eval_batch_size, task.num_neighbors) == ("sampled", 5, [3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert NodeMiniBatchTask.for_model(_ring(), model, MiniBatchConfig(2, 2)).num_neighbors == [2, 2, 2]


def test_minibatch_loss_and_accuracy_are_over_the_seeds_only():
    """kills: minibatch.py M32 (the loss taken over every sampled node, neighbours included: ``B =
    num_nodes``), M41 (the accuracy against other labels) and M30 (seeds drawn as positions ``0..n_train-1``
    instead of the training nodes' ids); reference: float64 cross-entropy and hits of the seed nodes by
    hand, with a model that reads each node's own features, over 6 draws"""
    data = _ring(train=[5, 7, 9, 11], val=range(0, 5), test=[6, 8, 10])
    model = _NodeLinear()
    task = NodeMiniBatchTask(data, [2, 2], 3)
    rows_all = model.rows(data.data.x)
    for seed in range(6):
        batch = task.train_batch(0, torch.Generator().manual_seed(seed), 3)
        seeds = batch.n_id[:3].tolist()
        assert batch.num_nodes > 3 and len(set(seeds)) == 3 and set(seeds) <= {5, 7, 9, 11}
        loss, metrics = task.loss(model, batch)
        rows, ys = [rows_all[i] for i in seeds], [int(data.data.y[i]) for i in seeds]
        assert float(loss.detach()) == pytest.approx(_mean_nll(rows, ys), rel=1e-6)
        assert float(metrics["acc"]) == pytest.approx(_hits(rows, ys) / 3)


def test_sampled_evaluation_by_hand_over_batches_of_seeds():
    """kills: minibatch.py M35 (``count += 1``: the sums divided by the number of batches), M37 (``loss =
    test_loss``), M38 (per-batch mean losses summed) and M39 (``correct =``: the last batch's hits only);
    reference: 7 validation nodes in batches of 3 and 1 test node, float64 cross-entropy and hits by hand
    (the model reads each node's own features, so sampling does not change its outputs)"""
    data = _ring()
    model = _NodeLinear()
    got = NodeMiniBatchTask(data, [1], 2, eval="sampled", eval_batch_size=3).evaluate(model, None)
    rows = model.rows(data.data.x)
    y = data.data.y.tolist()
    for split, nodes in (("val", range(4, 11)), ("test", [11])):
        assert got[f"{split}_loss"] == pytest.approx(_mean_nll([rows[i] for i in nodes], [y[i] for i in nodes]), rel=1e-6)
        assert got[f"{split}_acc"] == pytest.approx(_hits([rows[i] for i in nodes], [y[i] for i in nodes]) / len(nodes))
    assert got["loss"] == got["val_loss"] != got["test_loss"]


def test_sampled_evaluation_honours_max_batches_and_full_evaluation_ignores_it():
    """kills: minibatch.py M33 (``b >= max_batches`` -> ``b > max_batches``: one batch too many), M36 (a
    split with no evaluated node reported as loss 0.0 instead of nan) and M40 (``eval == "full"`` inverted);
    reference: the first 3 validation nodes by hand for ``max_batches = 1``, all 7 in the full evaluation"""
    data = _ring()
    model = _NodeLinear()
    rows = model.rows(data.data.x)
    y = data.data.y.tolist()
    sampled = NodeMiniBatchTask(data, [1], 2, eval="sampled", eval_batch_size=3)
    got = sampled.evaluate(model, 1)
    assert got["val_loss"] == pytest.approx(_mean_nll(rows[4:7], y[4:7]), rel=1e-6)
    none = sampled.evaluate(model, 0)
    assert all(math.isnan(none[k]) for k in ("val_loss", "val_acc", "test_loss", "test_acc", "loss"))
    full = NodeMiniBatchTask(data, [1], 2, eval_batch_size=3).evaluate(model, 1)
    assert full["val_loss"] == pytest.approx(_mean_nll(rows[4:11], y[4:11]), rel=1e-6)


def test_sampled_evaluation_draws_both_splits_from_one_generator_seeded_once():
    """kills: minibatch.py M34 the generator re-seeded for each split (documented: one generator seeded
    afresh at every evaluation, so the test split's neighbourhoods follow the validation split's);
    reference: the batches drawn here from one generator seeded 1234, val first, scored by hand"""
    from diffusionformer.data.neighbors import TorchNeighborSampler, neighbor_batch
    from diffusionformer.experiments.minibatch import _EVAL_SEED

    data = _ring(N=30, train=range(0, 4), val=range(4, 10), test=range(10, 30))
    d = data.data
    torch.manual_seed(0)
    model = GCN(GCNConfig(in_channels=2, num_classes=3, hidden=4, num_layers=1, dropout=0.0)).eval()
    task = NodeMiniBatchTask(data, [1, 1], 2, eval="sampled", eval_batch_size=4)
    got = task.evaluate(model, None)
    sampler = TorchNeighborSampler(d, [1, 1])
    g = torch.Generator().manual_seed(_EVAL_SEED)
    out = {}
    for split, nodes in (("val", list(range(4, 10))), ("test", list(range(10, 30)))):
        rows, ys = [], []
        for i in range(0, len(nodes), 4):
            b = neighbor_batch(d, sampler, torch.tensor(nodes[i:i + 4]), g)
            with torch.no_grad():
                rows += model(b.x, b.edge_index)[: b.batch_size].double().tolist()
            ys += b.y[: b.batch_size].tolist()
        out[split] = _mean_nll(rows, ys)
    assert got["val_loss"] == pytest.approx(out["val"], rel=1e-5)
    assert got["test_loss"] == pytest.approx(out["test"], rel=1e-5)


# ---------------------------------------------------------------------------- train/task.py
class _Good:
    def train_batch(self, step, generator, batch_size):
        return None

    def loss(self, model, batch):
        return None

    def evaluate(self, model, max_batches):
        return {}


def test_check_task_names_only_the_missing_or_non_callable_methods():
    """kills: task.py K1 (``callable`` -> ``hasattr``: a ``loss`` attribute that is a number accepted), K3
    (the message listing every required method instead of the missing ones) and K5 (``evaluate`` left out
    of the required methods)"""

    class NoEval(_Good):
        evaluate = None

    class NumberLoss(_Good):
        loss = 0.5

    with pytest.raises(TypeError, match=r"got NoEval missing evaluate$"):
        check_task(NoEval())
    with pytest.raises(TypeError, match=r"got NumberLoss missing loss$"):
        check_task(NumberLoss())
    check_task(_Good())


def test_check_task_refuses_a_shard_batch_that_is_not_callable_and_the_protocol_is_runtime_checkable():
    """kills: task.py K2 (a non-callable ``shard_batch`` accepted: the trainer called it under DDP) and K4
    (``@runtime_checkable`` dropped: ``isinstance(task, Task)`` raised TypeError)"""

    class BadShard(_Good):
        shard_batch = "rows"

    with pytest.raises(TypeError, match=r"task.shard_batch: expected a callable, got str"):
        check_task(BadShard())
    assert isinstance(_Good(), Task) and not isinstance(object(), Task)


# ---------------------------------------------------------------------------- train/distributed.py
_DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def clean_env(monkeypatch):
    for var in _DIST_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_dist_env_refuses_rank_equal_to_world_size(clean_env):
    """kills: distributed.py D2 ``rank < world_size`` -> ``rank <= world_size`` (``RANK=2 WORLD_SIZE=2``, a
    third process in a world of two, was accepted)"""
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("RANK", "2")
    with pytest.raises(ValueError, match=r"expected 0 <= RANK < WORLD_SIZE, got RANK=2 WORLD_SIZE=2"):
        dist_env()
    clean_env.setenv("RANK", "1")
    assert dist_env() == (1, 2, 1)


def test_dist_env_of_two_processes_is_distributed(clean_env):
    """kills: distributed.py D3 ``world_size == 1`` -> ``world_size <= 2`` (two processes run as one)"""
    for k, v in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        clean_env.setenv(k, v)
    assert dist_env() == (0, 2, 0)
    clean_env.setenv("WORLD_SIZE", "1")
    assert dist_env() is None


def test_dist_env_rewords_a_non_integer_world_size(clean_env):
    """kills: distributed.py D4 ``ValueError`` left out of the except clause (``WORLD_SIZE=two`` raised
    ``invalid literal for int()`` without naming the torchrun variables)"""
    clean_env.setenv("WORLD_SIZE", "two")
    clean_env.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"expected integer RANK, WORLD_SIZE and LOCAL_RANK .* WORLD_SIZE='two'"):
        dist_env()


def test_single_process_context_needs_no_process_group():
    """kills: distributed.py D5 (``is_distributed`` true for one process), D6 (barrier not a no-op), D7
    (``all_reduce_min`` calling the collective) and D8 (``all_reduce_mean`` calling it) in a single process
    without a process group (each mutant raises: no default group)"""
    assert not dist.is_initialized()
    ctx = DistContext(0, 1, 0, CPU)
    t = torch.tensor([1.0, -2.0])
    assert not ctx.is_distributed
    ctx.barrier()
    assert ctx.all_reduce_min(t) is t and ctx.all_reduce_mean(t) is t


def test_all_reduce_mean_divides_by_the_world_size(monkeypatch):
    """kills: distributed.py D9 the sum divided by ``world_size - 1``; reference: 4 ranks of which the
    stand-in collective adds the 3 others' values, mean by hand"""
    others = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 0.0]), torch.tensor([-4.0, 6.0])]

    def fake_all_reduce(tensor, op=None):
        for o in others:
            tensor.add_(o)

    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    got = DistContext(0, 4, 0, CPU).all_reduce_mean(torch.tensor([4.0, 4.0]))
    assert got.tolist() == [(4 + 1 + 3 - 4) / 4, (4 + 2 + 0 + 6) / 4]


def test_joining_an_existing_group_on_cuda_makes_its_device_current(clean_env, monkeypatch):
    """kills: distributed.py D10 ``torch.cuda.set_device`` dropped when the caller made the group (NCCL
    collectives of every process then ran on GPU 0); stand-ins record the calls, no GPU needed"""
    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setitem(_INIT_GLOBALS, "resolve_device", lambda spec, local_rank=None: torch.device("cuda", local_rank))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(d))
    clean_env.setenv("LOCAL_RANK", "1")
    assert init_distributed("cuda") == DistContext(1, 2, 1, torch.device("cuda", 1), owns_group=False)
    assert calls == [torch.device("cuda", 1)]


def test_init_distributed_without_torch_distributed_says_so(clean_env, monkeypatch):
    """kills: distributed.py D11 the ``dist.is_available()`` check dropped (a torch build without
    torch.distributed failed inside init_process_group instead of with a message saying why)"""
    monkeypatch.setattr(dist, "is_available", lambda: False)
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match=r"WORLD_SIZE > 1 but this torch build has no torch.distributed"):
        init_distributed("cpu")


def test_single_process_init_resolves_the_device_asked_for(clean_env, monkeypatch):
    """kills: distributed.py D12 the single-process branch resolving ``"auto"`` whatever was asked"""
    asked = []
    monkeypatch.setitem(_INIT_GLOBALS, "resolve_device", lambda spec, local_rank=None: asked.append(spec) or CPU)
    assert init_distributed("cpu") == DistContext(0, 1, 0, CPU)
    assert asked == ["cpu"]


def test_shard_batch_leaves_scalars_tuples_and_single_process_batches_alone():
    """kills: distributed.py D13 (0-dim tensors sliced: IndexError), D14 (the ``world_size == 1`` shortcut
    dropped: a custom batch object refused in a single process), D15 (a tuple rebuilt as a list) and D18
    (an unknown leaf returned instead of a TypeError naming the fix)"""
    scale = torch.tensor(0.5)
    got = shard_batch((torch.arange(4), scale), 1, 2)
    assert type(got) is tuple and got[0].tolist() == [2, 3] and got[1] is scale
    custom = object()
    assert shard_batch(custom, 0, 1) is custom
    Pair = namedtuple("Pair", "a b")
    assert shard_batch(Pair(torch.arange(2), 1), 0, 2) == Pair(torch.tensor([0]), 1)
    with pytest.raises(TypeError, match=r"shard_batch: expected tensors, .* got object; give the task a shard_batch"):
        shard_batch({"x": torch.arange(2), "o": custom}, 0, 2)


def test_shard_batch_refuses_unequal_shards_and_cuts_contiguous_rows():
    """kills: distributed.py D16 (``B % W`` -> ``B < W``: 6 rows over 4 ranks cut into unequal shards, so the
    mean of the per-rank means is not the global mean) and D17 (strided shards instead of contiguous rows)"""
    with pytest.raises(ValueError, match=r"batch dimension divisible by world_size=4, got a tensor of shape \(6,\)"):
        shard_batch(torch.arange(6), 0, 4)
    assert [shard_batch(torch.arange(8), r, 2).tolist() for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


# ---------------------------------------------------------------------------- equivalent mutants
# tasks.py T3 (``isinstance(label_smoothing, bool) or`` dropped from ClassificationTask's check): ``True``
#   is still refused by the range check (``True < 1.0`` is false), and ``False`` is accepted as ``0.0``
#   either way (``float(False) == 0.0``): the same tasks are built and the same errors raised.
# distributed.py D1 (``world_size < 1 or`` dropped from dist_env's range check): with ``world_size < 1``
#   the remaining ``0 <= rank < world_size`` is false for every rank, so the same ValueError is raised.


def test_dino_evaluation_without_validation_images_reports_a_nan_loss():
    """Bug: ``DINOTask.evaluate`` left ``loss`` out when the validation split was empty, while every other
    task reports NaN for a split with nothing to score (a ``select_by: loss`` run then had no key to read)."""
    model = _tiny_dino().eval()
    full = _dino_images()
    data = ClassificationData("toy", "image", full.x_train, full.y_train, full.x_val[:0], full.y_val[:0],
                              full.x_test, full.y_test, num_classes=3, input_shape=(1, 8, 8))
    out = T.DINOTask(data, model, eval_batch_size=4).evaluate(model, None)
    assert set(out) == {"knn_val_acc", "knn_test_acc", "loss"}
    assert math.isnan(out["knn_val_acc"]) and math.isnan(out["loss"]) and 0.0 <= out["knn_test_acc"] <= 1.0
