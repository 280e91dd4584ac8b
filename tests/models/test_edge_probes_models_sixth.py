"""Edge probes of the GPT model, its sequence-LM task and the layer state (sixth pass).

Probed and found right (no test added, the behaviour is pinned elsewhere or was checked against a reference here):
rotary embeddings against a float64 complex-multiplication reference (head dims 2, 6, 10, positions past any cache,
negative and large offsets); DropPath in train and eval with p = 0, p = 1 refused (also when set later); LayerScale;
greedy and sampled ``generate`` (top_k above the vocabulary, top_p = 1, past block_size, with and without the KV cache)
against an explicit loop.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data.base import SequenceTaskData
from diffusionformer.experiments.tasks import SequenceLMTask
from diffusionformer.models.gpt import DiffusionGPT, GPTConfig
from diffusionformer.nn import Block, LayerState


def _gpt(**kw):
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=7, block_size=6, n_layer=1, n_head=2, n_embd=8, **kw))


def test_bug_sequence_task_refuses_minus_100_targets_under_another_ignore_index():
    """Bug: with ``ignore_index=-1`` a target of ``-100`` (which ``F.cross_entropy(..., ignore_index=-1)`` refuses as
    out of bounds) was counted as a target by ``SequenceLMTask`` (loss scale, accuracy, evaluation count) while the
    model's loss and the evaluation's ``cross_entropy`` skipped it: a silently wrong loss and accuracy."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 7, (4, 6), generator=g)
    y = torch.randint(0, 7, (4, 6), generator=g)
    y[:, :3] = -1
    y[0, 4] = -100
    with pytest.raises(IndexError):
        torch.nn.functional.cross_entropy(torch.zeros(24, 7), y.flatten(), ignore_index=-1)  # the reference refuses it
    # the container refuses such targets itself now; a batch handed to the task directly is still checked
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 7\) \(vocab_size\) or ignore_index \(-1\)"):
        SequenceTaskData("s", x, y, x, y, x, y, 7, ignore_index=-1)
    good = y.clone()
    good[0, 4] = 2
    task = SequenceLMTask(SequenceTaskData("s", x, good, x, good, x, good, 7, ignore_index=-1))
    model = _gpt()
    with pytest.raises(ValueError, match=r"targets hold -100, a negative id.*ignore_index=-1"):
        task.loss(model, (x, y))
    y[0, 4] = 2  # valid targets: the -1 positions are skipped, the loss is the reference's over the rest
    task = SequenceLMTask(SequenceTaskData("s", x, y, x, y, x, y, 7, ignore_index=-1))
    loss, metrics = task.loss(model, (x, y))
    reference = torch.nn.functional.cross_entropy(model(x)[0].flatten(0, 1), y.flatten(), ignore_index=-1)
    torch.testing.assert_close(loss, reference)


@pytest.mark.parametrize("call", ["forward", "forward_cached", "generate"])
def test_bug_gpt_block_size_changed_after_building_is_named(call):
    """Bug: ``model.config.block_size`` raised after the model was built (the config is a plain dataclass) let
    longer inputs past the length check, which then failed with a bare ``IndexError: index out of range in self``
    inside the position embedding."""
    model = _gpt().eval()
    model.config.block_size = 10
    idx = torch.randint(0, 7, (1, 8))
    calls = {"forward": lambda: model(idx), "forward_cached": lambda: model.forward_cached(idx, model.new_cache()),
             "generate": lambda: model.generate(idx[:, :2], 7)}
    with pytest.raises(ValueError, match=r"config\.block_size=10 exceeds the 6 position embeddings"):
        calls[call]()


def test_gpt_block_size_lowered_or_rope_still_works():
    """A smaller block_size crops the context (within the embeddings); a rotary model has no position table."""
    model = _gpt().eval()
    model.config.block_size = 4
    assert model.generate(torch.randint(0, 7, (1, 2)), 5, temperature=0.0).shape == (1, 7)
    rope = _gpt(rope=True).eval()
    rope.config.block_size = 10
    assert rope(torch.randint(0, 7, (1, 8)))[0].shape == (1, 8, 7)


@pytest.mark.parametrize("kwargs, match", [
    ({"depth": 1.5}, r"LayerState\.depth: expected a non-negative int, got 1\.5"),
    ({"depth": -1}, r"LayerState\.depth.*got -1"),
    ({"depth": True}, r"LayerState\.depth.*got True"),
    ({"depth": "2"}, r"LayerState\.depth.*got '2'"),
    ({"first_values": [1.0]}, r"LayerState\.first_values.*got list"),
    ({"first_values": torch.ones(3)}, r"LayerState\.first_values.*shape \(3,\)"),
    ({"first_values": torch.ones(1, 2, 3, 4, dtype=torch.long)}, r"LayerState\.first_values.*torch\.int64"),
])
def test_bug_layer_state_built_by_hand_is_checked(kwargs, match):
    """Bug: a ``LayerState`` built by hand was taken as given: ``depth=1.5`` was truncated to layer 1 by differential
    attention, ``True`` read as 1, and a string depth or a list of first values failed inside the layer with a bare
    ``TypeError`` (``can only concatenate str``, ``list indices must be integers``)."""
    with pytest.raises(ValueError, match=match):
        LayerState(**kwargs)


def test_layer_state_by_hand_valid_values_still_work():
    import numpy as np

    state = LayerState(depth=np.int64(2))
    assert type(state.depth) is int and state.depth == 2
    torch.manual_seed(0)
    block = Block(8, 2, heads="differential:2")
    out = block(torch.randn(1, 3, 8), state=LayerState(first_values=torch.randn(1, 2, 3, 4), depth=1))
    assert out.shape == (1, 3, 8) and bool(out.isfinite().all())
