"""Reductions over tokens, nodes, targets and micro-batches when part of the input is padding (probe 46e).

After the ViT mean pool was found averaging padded patch tokens, every reduction of the package over tokens,
nodes, positions, batch rows or seeds was checked for counting only the real elements, and for a count-weighted
mean where one is promised, against an independent reference (the unpadded inputs one by one, or float64 sums).

Found and fixed (tests whose docstring starts with "Bug:"):

- ``SequenceLMTask.loss``: the loss is additive over micro-batches (the targets' summed cross-entropy over
  ``rows x`` the split's mean targets per row), but its ``acc`` metric was each micro-batch's own token accuracy:
  the Trainer's mean over ``grad_accum_steps`` micro-batches weighed each micro-batch's targets alike (not the
  whole batch's accuracy), and a micro-batch (or batch) without targets gave NaN, which made the whole log
  window's ``acc`` NaN (``null`` in ``metrics.jsonl``) while its loss is 0.

Pinned (they hold): see the ``test_pins_`` docstrings.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from diffusionformer.data import SequenceTaskData
from diffusionformer.experiments.tasks import SequenceLMTask
from diffusionformer.models import DiffusionGPT, GPTConfig


def _gpt(vocab: int) -> DiffusionGPT:
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=vocab, block_size=6, n_layer=1, n_head=2, n_embd=8)).double()


def _varying() -> SequenceTaskData:
    """Four training rows with 1, 3, 0 and 2 targets (6 in all: 1.5 per row)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 7, (4, 6), generator=g)
    y = torch.full((4, 6), -100)
    for row, cols in enumerate([[5], [1, 3, 5], [], [2, 5]]):
        y[row, cols] = torch.randint(0, 7, (len(cols),), generator=g)
    return SequenceTaskData("varying", x, y, x[:1], y[:1], x[:1], y[:1], 7)


class _Fixed(torch.nn.Module):
    """A GPT stand-in returning fixed logits (and a differentiable zero loss)."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits
        self.w = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None):  # noqa: ARG002
        rows = self.logits[: x.shape[0]] if x.shape[0] <= self.logits.shape[0] else self.logits
        return rows, self.w * 0 + 1.0


def _hits(logits: torch.Tensor, y: torch.Tensor) -> int:
    """Correct targets, by hand (numpy-free explicit loop)."""
    n = 0
    for b in range(y.shape[0]):
        for t in range(y.shape[1]):
            if int(y[b, t]) != -100 and int(logits[b, t].argmax()) == int(y[b, t]):
                n += 1
    return n


def test_bug_sequence_task_accuracy_of_micro_batches_adds_up_and_a_batch_without_targets_is_not_nan() -> None:
    """Bug: ``SequenceLMTask.loss`` reported ``acc`` as each micro-batch's own token accuracy, so the Trainer's
    micro-batch mean under ``grad_accum_steps`` (rows 0-1 with 4 targets, rows 2-3 with 2) was not the whole
    batch's accuracy (the loss beside it is), and a micro-batch without targets (row 2) gave ``acc`` NaN: the log
    window's mean ``acc`` was NaN (``null``) although its loss is 0. ``acc`` is now the correct targets over the
    loss's count (rows x mean targets per row): the whole batch's token accuracy, additive over micro-batches,
    0 without targets. Reference: hits counted by hand."""
    data = _varying()
    x, y = data.x_train, data.y_train
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 6, 7, generator=g, dtype=torch.float64)
    for b, t in [(0, 5), (1, 1), (3, 2)]:  # three hits, spread over both halves
        logits[b, t, int(y[b, t])] += 10.0
    task = SequenceLMTask(data)
    whole = float(task.loss(_Fixed(logits), (x, y))[1]["acc"])
    assert whole == pytest.approx(_hits(logits, y) / 6, abs=1e-7)  # 6 targets in the 4 rows
    halves = [float(task.loss(_Fixed(logits[i:i + 2]), (x[i:i + 2], y[i:i + 2]))[1]["acc"]) for i in (0, 2)]
    assert (halves[0] + halves[1]) / 2 == pytest.approx(whole, abs=1e-7)
    none = task.loss(_Fixed(logits[2:3]), (x[2:3], y[2:3]))[1]["acc"]
    assert math.isfinite(float(none)) and float(none) == 0.0
    # a real model, end to end: the same hits over the same count
    model = _gpt(7)
    with torch.no_grad():
        out = model(x)[0]
    assert float(task.loss(model, (x, y))[1]["acc"]) == pytest.approx(_hits(out, y) / 6, abs=1e-7)


def test_pins_sequence_task_accuracy_of_nan_logits_is_nan_and_equal_counts_keep_the_token_accuracy() -> None:
    """Pins: NaN logits at a target give ``acc`` NaN (no prediction, as the other tasks), and with as many
    targets in every row (the bundled recall data) ``acc`` is exactly the batch's token accuracy."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 5, (3, 4), generator=g)
    y = torch.full((3, 4), -100)
    y[:, 3] = torch.randint(0, 5, (3,), generator=g)
    y[:, 1] = torch.randint(0, 5, (3,), generator=g)
    data = SequenceTaskData("even", x, y, x, y, x, y, 5)
    logits = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    task = SequenceLMTask(data)
    for rows in (slice(0, 3), slice(0, 1), slice(1, 3)):
        acc = float(task.loss(_Fixed(logits[rows]), (x[rows], y[rows]))[1]["acc"])
        want = _hits(logits[rows], y[rows]) / int((y[rows] != -100).sum())
        assert acc == pytest.approx(want, abs=1e-7)
    bad = logits.clone()
    bad[1, 3, 0] = math.nan
    assert math.isnan(float(task.loss(_Fixed(bad), (x, y))[1]["acc"]))
    bad = logits.clone()
    bad[1, 2, 0] = math.nan  # at an ignored position: no target reads it
    assert math.isfinite(float(task.loss(_Fixed(bad), (x, y))[1]["acc"]))


def test_pins_sequence_task_evaluation_is_token_weighted_over_uneven_batches() -> None:
    """Pins: ``SequenceLMTask`` evaluation over batches of 2 rows (the last one shorter, rows of 1, 3, 0 and 2
    targets) is the token mean over all targets, not a mean of batch means (float64 reference)."""
    data = _varying()
    task = SequenceLMTask(data, eval_batch_size=3)
    model = _gpt(7).eval()
    x, y = data.x_train, data.y_train
    with torch.no_grad():
        logits = model(x)[0]
    mask = y != -100
    loss, acc = task._score(model, x, y)
    want = F.cross_entropy(logits[mask], y[mask], reduction="sum").item() / 6
    assert loss == pytest.approx(want, rel=1e-12)
    assert acc == pytest.approx(_hits(logits, y) / 6, abs=1e-12)


class _PaddedToy(torch.nn.Module):
    """Two dense blocks taking a ``key_padding_mask`` (a ``blocks`` list, as ``capture_dataset`` reads)."""

    def __init__(self) -> None:
        super().__init__()
        from diffusionformer.nn.block import Block

        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList([Block(8, 2, heads="attention:1,heat(t=0.5):1") for _ in range(2)])

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) if key_padding_mask is None else block(x, key_padding_mask=key_padding_mask)
        return x


@pytest.mark.parametrize("per_token", [False, True])
def test_pins_layer_reports_of_a_key_padded_batch_are_those_of_its_sequences_one_by_one(per_token: bool) -> None:
    """Pins: every token-geometry metric of ``layer_reports`` (smoothing, Dirichlet energy on the attention
    graph, the spectrum, NC and probes of sequence means, token NC1 and probe) on one batch of sequences of
    lengths 3, 5, 2, 5, 4, 1, 5, 3 right-padded under a ``key_padding_mask`` equals the same metric on the
    sequences captured one by one without padding (the padded tokens count nowhere)."""
    from diffusionformer.analysis.capture import capture_dataset
    from diffusionformer.analysis.report import layer_reports

    model = _PaddedToy().eval()
    g = torch.Generator().manual_seed(1)
    lens = [3, 5, 2, 5, 4, 1, 5, 3]
    x = torch.randn(len(lens), 5, 8, generator=g)
    pad = torch.arange(5) >= torch.tensor(lens).unsqueeze(1)
    x = x.masked_fill(pad.unsqueeze(-1), 7.0)  # loud padding: any use of it shows
    labels = torch.randint(0, 3, (len(lens), 5), generator=g) if per_token else torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    padded = capture_dataset(model, [((x, pad), labels)], attentions=True,
                             forward=lambda m, inp: m(inp[0], key_padding_mask=inp[1]))
    single = capture_dataset(model, [((x[i:i + 1, :n],), labels[i:i + 1, :n] if per_token else labels[i:i + 1])
                                     for i, n in enumerate(lens)], attentions=True)
    assert torch.equal(padded.mask, single.mask)
    for a, b in zip(layer_reports(padded), layer_reports(single), strict=True):
        assert a.metrics.keys() == b.metrics.keys()
        measured = [k for k, v in b.metrics.items() if v is not None]
        assert ("dirichlet_attention" in measured) == (a.layer >= 1)  # layer 0 (embeddings) has no attention
        assert ("token_nc1" if per_token else "nc1") in measured
        for key in a.metrics:
            if b.metrics[key] is None:
                assert a.metrics[key] is None, key
            else:
                assert a.metrics[key] == pytest.approx(b.metrics[key], rel=1e-4, abs=1e-6), key
        torch.testing.assert_close(a.singular_values, b.singular_values, rtol=1e-4, atol=1e-5)
        # and against numpy on the real tokens of each sequence alone (float64)
        seqs = [single.states[a.layer][i, :n].double().numpy() for i, n in enumerate(lens)]
        within = [((s_ - s_.mean(0)) ** 2).sum() / len(s_) for s_ in seqs]
        assert a.metrics["within_variance"] == pytest.approx(np.mean(within), rel=1e-6)
        real = np.concatenate(seqs)
        total = ((real - real.mean(0)) ** 2).sum()
        assert a.metrics["variance_ratio"] == pytest.approx(sum(w * len(s_) for w, s_ in zip(within, seqs)) / total,
                                                            rel=1e-6)
        centred = np.concatenate([s_ - s_.mean(0) for s_ in seqs])
        np.testing.assert_allclose(a.singular_values.numpy(), np.linalg.svd(centred, compute_uv=False), rtol=1e-6,
                                   atol=1e-6)
        cosines = []
        for s_ in seqs:
            if len(s_) >= 2:
                u = s_ / np.linalg.norm(s_, axis=1, keepdims=True)
                g = u @ u.T
                cosines.append((g.sum() - np.trace(g)) / (len(s_) * (len(s_) - 1)))
        assert a.metrics["mean_cosine"] == pytest.approx(np.mean(cosines), rel=1e-6)


def test_bug_trainer_logs_a_finite_sequence_accuracy_under_grad_accum_equal_to_the_whole_batch(tmp_path) -> None:
    """Bug: through the Trainer, ``grad_accum_steps=4`` over rows of 1, 3, 2 and 0 targets logged the train
    record's ``acc`` as ``null`` (the last micro-batch has no target: NaN), while one whole batch logged the
    token accuracy; the two records now agree (loss and acc), as the update does."""
    from diffusionformer.train import TrainConfig, Trainer, read_metrics

    data = _varying()
    order = torch.tensor([0, 1, 3, 2])

    class _Whole(SequenceLMTask):
        def train_batch(self, step, generator, batch_size):  # noqa: ARG002
            return data.x_train[order], data.y_train[order]

    records = []
    for accum in (1, 4):
        cfg = TrainConfig(max_steps=1, batch_size=4, grad_accum_steps=accum, lr=1e-3, log_interval=1, eval_interval=0,
                          checkpoint_interval=0, device="cpu", amp="off", progress=False, grad_clip=0.0)
        Trainer(_gpt(7), _Whole(data), cfg, tmp_path / f"accum{accum}").fit()
        records.append(next(r for r in read_metrics(tmp_path / f"accum{accum}") if r["split"] == "train"))
    whole, accumulated = records
    assert whole["metrics"]["acc"] is not None and accumulated["metrics"]["acc"] is not None
    assert accumulated["metrics"]["acc"] == pytest.approx(whole["metrics"]["acc"], abs=1e-6)
    assert accumulated["loss"] == pytest.approx(whole["loss"], rel=1e-6)
