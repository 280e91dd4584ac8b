"""The training loss of sparse-target sequence tasks (``SequenceLMTask``) under gradient accumulation.

Found and fixed (tests whose docstring starts with "Bug:"): the loss was the model's token mean over each
micro-batch's targets, and the Trainer averages micro-batch losses; with rows of varying target counts the
update was not the whole batch's (each micro-batch's targets weighed alike), and a micro-batch without targets
made a NaN loss, which stopped the run as "non-finite". The loss is now the targets' summed cross-entropy over
``rows x`` the training split's mean targets per row: additive over micro-batches and processes, and exactly the
token mean when every row has as many targets (the bundled recall data).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from diffusionformer.data import SequenceTaskData
from diffusionformer.data.recall import load_assoc_recall
from diffusionformer.experiments.tasks import SequenceLMTask
from diffusionformer.models import DiffusionGPT, GPTConfig


def _model(vocab: int) -> DiffusionGPT:
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


def _grads(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    return [g.clone() for g in torch.autograd.grad(loss, list(model.parameters()), allow_unused=False)]


def test_bug_micro_batches_of_varying_target_counts_add_up_to_the_whole_batch() -> None:
    """Bug: two micro-batches of 4 and 2 targets weighed alike: their mean loss (a/4 + b/2) / 2 differed from the
    whole batch's token mean (a + b)/6, so grad_accum_steps changed the update. Now the micro-batch mean is the
    whole batch's, and both equal the targets' cross-entropy sum over rows x 1.5 (float64 reference)."""
    data = _varying()
    task, model = SequenceLMTask(data), _model(7)
    x, y = data.x_train, data.y_train
    whole, _ = task.loss(model, (x, y))
    logits = model(x)[0]
    reference = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum") / (4 * 1.5)
    torch.testing.assert_close(whole, reference, rtol=1e-13, atol=0.0)
    halves = [task.loss(model, (x[i:i + 2], y[i:i + 2]))[0] for i in (0, 2)]
    torch.testing.assert_close((halves[0] + halves[1]) / 2, whole, rtol=1e-13, atol=0.0)
    for got, want in zip(_grads(model, (halves[0] + halves[1]) / 2), _grads(model, whole)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)


def test_bug_a_micro_batch_without_targets_has_loss_zero_and_zero_gradients() -> None:
    """Bug: a micro-batch whose rows hold no target (the third row of the data) gave the token mean over nothing,
    NaN, which the Trainer stopped as a non-finite loss. Its loss is 0 now, with finite, zero gradients."""
    data = _varying()
    task, model = SequenceLMTask(data), _model(7)
    loss, _ = task.loss(model, (data.x_train[2:3], data.y_train[2:3]))
    assert loss.item() == 0.0
    assert all(bool((g == 0).all()) for g in _grads(model, loss))


def test_constant_target_counts_keep_the_models_token_mean_exactly() -> None:
    """The bundled recall data has as many targets in every row: the factor is exactly 1, so the loss is the
    model's token mean bit for bit (published recall runs train as before)."""
    data = load_assoc_recall(seed=0, num_examples=64, num_pairs=2, vocab_size=16, num_queries=2)
    task, model = SequenceLMTask(data), _model(data.vocab_size)
    x, y = data.x_train[:5], data.y_train[:5]
    assert torch.equal(task.loss(model, (x, y))[0], model(x, y)[1])
