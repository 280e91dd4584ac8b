"""Character-level text data against nanoGPT's ``shakespeare_char`` pipeline (Karpathy, nanoGPT).

The references below re-state nanoGPT's code independently: ``data/shakespeare_char/prepare.py``
(``chars = sorted(set(data))``, ``n = len(data)``, train ``data[:int(n*0.9)]``, val the rest,
``uint16`` ids), ``train.py``'s ``get_batch`` (``ix = torch.randint(len(data) - block_size,
(batch_size,))``, ``x = data[i:i+block]``, ``y = data[i+1:i+1+block]``) and ``estimate_loss``
(the mean of ``eval_iters`` batch losses per split).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from diffusionformer.data import load_dataset
from diffusionformer.data.text import char_text_data
from diffusionformer.experiments.tasks import TextLMTask


def _nanogpt_prepare(data: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """nanoGPT ``data/shakespeare_char/prepare.py``: vocabulary, train and val ids (uint16)."""
    chars = sorted(list(set(data)))
    stoi = {ch: i for i, ch in enumerate(chars)}
    n = len(data)
    train_data = data[: int(n * 0.9)]
    val_data = data[int(n * 0.9):]
    train_ids = np.array([stoi[c] for c in train_data], dtype=np.uint16)
    val_ids = np.array([stoi[c] for c in val_data], dtype=np.uint16)
    return chars, train_ids, val_ids


def _nanogpt_get_batch(data: np.ndarray, batch_size: int, block_size: int, generator: torch.Generator | None):
    """nanoGPT ``train.py``'s ``get_batch`` (CPU branch), with an explicit generator."""
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


class _Bigram(nn.Module):
    """A bigram language model with nanoGPT's ``(logits, loss)`` interface."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.table = nn.Parameter(torch.randn(vocab, vocab, generator=g))

    def forward(self, idx, targets=None):
        logits = self.table[idx]
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


# --- the staged corpus -----------------------------------------------------------------------


def test_tinyshakespeare_equals_nanogpt_prepare(real_root: Path):
    """Same 65-symbol vocabulary, same ids and the same split point as nanoGPT's prepare.py."""
    path = real_root / "tinyshakespeare" / "input.txt"
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    chars, train_ids, val_ids = _nanogpt_prepare(text)
    data = load_dataset("tinyshakespeare", root=real_root)
    assert data.vocab_size == len(chars) == 65 and data.itos == chars
    assert data.stoi == {ch: i for i, ch in enumerate(chars)}
    assert (data.train.numel(), data.val.numel()) == (len(train_ids), len(val_ids)) == (1_003_854, 111_540)
    assert int(len(text) * 0.9) == data.meta["sizes"]["train"]
    assert torch.equal(data.train, torch.from_numpy(train_ids.astype(np.int64)))
    assert torch.equal(data.val, torch.from_numpy(val_ids.astype(np.int64)))
    assert data.decode(data.val[:20]) == text[1_003_854 : 1_003_874]


def test_tinyshakespeare_windows_equal_nanogpt_get_batch(real_root: Path):
    """Same generator draws -> the same (x, y) windows on both staged splits, the split ends included."""
    data = load_dataset("tinyshakespeare", root=real_root, verify=False)
    _, train_ids, val_ids = _nanogpt_prepare(data.decode(torch.cat([data.train, data.val])))
    for split, ids in (("train", train_ids), ("val", val_ids)):
        for block in (8, 256):
            x, y = data.get_batch(split, 32, block, torch.Generator().manual_seed(7))
            rx, ry = _nanogpt_get_batch(ids, 32, block, torch.Generator().manual_seed(7))
            assert torch.equal(x, rx) and torch.equal(y, ry), (split, block)


def test_tinyshakespeare_train_chars_keeps_nanogpt_vocab_and_val(real_root: Path):
    full = load_dataset("tinyshakespeare", root=real_root, verify=False)
    cut = load_dataset("tinyshakespeare", root=real_root, verify=False, train_chars=20_000)
    assert cut.itos == full.itos and torch.equal(cut.val, full.val)
    assert torch.equal(cut.train, full.train[:20_000])


# --- corpora without the data root --------------------------------------------------------


def test_pydoc_chars_equals_nanogpt_prepare():
    from pydoc_data.topics import topics

    text = "".join(topics[key] for key in sorted(topics))
    chars, train_ids, val_ids = _nanogpt_prepare(text)
    data = load_dataset("pydoc-chars")
    assert data.itos == chars and data.vocab_size == len(chars)
    assert max(len(chars), 1) < 2**16  # nanoGPT's uint16 ids hold it
    assert torch.equal(data.train, torch.from_numpy(train_ids.astype(np.int64)))
    assert torch.equal(data.val, torch.from_numpy(val_ids.astype(np.int64)))


@pytest.mark.parametrize("n", [2, 3, 9, 10, 11, 19, 29, 1001])
def test_split_point_equals_int_n_times_0_9(n):
    """``int(0.9 * n)`` here, ``int(n * 0.9)`` in nanoGPT: the same float product at every length."""
    text = "".join(chr(97 + (i * 7) % 26) for i in range(n))
    if int(n * 0.9) == 0:
        with pytest.raises(ValueError, match="train split"):
            char_text_data("toy", text)
        return
    chars, train_ids, val_ids = _nanogpt_prepare(text)
    data = char_text_data("toy", text)
    assert data.itos == chars
    assert data.train.tolist() == train_ids.tolist() and data.val.tolist() == val_ids.tolist()


def test_vocab_includes_characters_seen_only_in_val():
    """As nanoGPT, the vocabulary is the whole corpus's: a character only in val still has an id."""
    text = "aaaaaaaaaz"
    data = char_text_data("toy", text)
    assert data.itos == ["a", "z"] and data.val.tolist() == [1] and set(data.train.tolist()) == {0}


# --- window sampling ------------------------------------------------------------------------


def _toy() -> tuple:
    text = "".join(chr(65 + (i * 11) % 40) for i in range(300))
    data = char_text_data("toy", text)
    _, train_ids, val_ids = _nanogpt_prepare(text)
    return data, train_ids, val_ids


@pytest.mark.parametrize("block", [1, 5, 29])
def test_get_batch_windows_equal_nanogpt_same_generator(block):
    data, train_ids, val_ids = _toy()
    for split, ids in (("train", train_ids), ("val", val_ids)):
        g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        for _ in range(3):  # consecutive draws stay in step
            x, y = data.get_batch(split, 16, block, g1)
            rx, ry = _nanogpt_get_batch(ids, 16, block, g2)
            assert torch.equal(x, rx) and torch.equal(y, ry)
        assert torch.equal(g1.get_state(), g2.get_state())  # no extra draw


def test_get_batch_global_generator_equals_nanogpt():
    """``generator=None``: torch's global generator, as nanoGPT's bare ``torch.randint``."""
    data, train_ids, _ = _toy()
    torch.manual_seed(11)
    x, y = data.get_batch("train", 8, 12)
    torch.manual_seed(11)
    rx, ry = _nanogpt_get_batch(train_ids, 8, 12, None)
    assert torch.equal(x, rx) and torch.equal(y, ry)


def test_get_batch_reaches_the_last_token_and_no_further():
    """The largest offset is ``L - T - 1``: its target window ends on the split's last token."""
    data, _, val_ids = _toy()
    L = data.val.numel()
    block = L - 2  # offsets 0 and 1 only
    x, y = data.get_batch("val", 256, block, torch.Generator().manual_seed(0))
    starts = {int((data.val.unfold(0, block, 1) == row).all(1).nonzero()[0]) for row in x}
    assert starts == {0, 1}
    last = x[:, 0] == data.val[1]
    assert torch.equal(y[last][0], data.val[2:])
    # the longest window: one offset, the whole split
    x, y = data.get_batch("val", 4, L - 1, torch.Generator().manual_seed(0))
    assert torch.equal(x, data.val[:-1].expand(4, -1)) and torch.equal(y, data.val[1:].expand(4, -1))
    with pytest.raises(ValueError, match="block_size"):
        data.get_batch("val", 4, L, torch.Generator().manual_seed(0))


def test_get_batch_offsets_cover_every_start():
    data, _, _ = _toy()
    L, block = data.train.numel(), 260
    x, _ = data.get_batch("train", 2000, block, torch.Generator().manual_seed(0))
    starts = {int((data.train.unfold(0, block, 1) == row).all(1).nonzero()[0]) for row in x}
    assert starts == set(range(L - block))


# --- evaluation -------------------------------------------------------------------------------


def test_evaluate_equals_estimate_loss_style_mean():
    """Mean of ``eval_batches`` batch losses per split, each split drawn from the fixed seed afresh."""
    from diffusionformer.experiments.tasks import _EVAL_SEED

    data, train_ids, val_ids = _toy()
    model = _Bigram(data.vocab_size)
    task = TextLMTask(data, block_size=16, eval_batch_size=8, eval_batches=5)
    out = task.evaluate(model, None)
    ref = {}
    for split, ids in (("train", train_ids), ("val", val_ids)):
        g = torch.Generator().manual_seed(_EVAL_SEED)
        losses = torch.zeros(5, dtype=torch.float64)
        for k in range(5):
            X, Y = _nanogpt_get_batch(ids, 8, 16, g)
            losses[k] = model(X, Y)[1].item()
        ref[split] = float(losses.mean())
    assert out["train_loss"] == pytest.approx(ref["train"], rel=1e-12)
    assert out["val_loss"] == pytest.approx(ref["val"], rel=1e-12)
    assert out["loss"] == out["val_loss"]
    assert out["gap_loss"] == pytest.approx(ref["val"] - ref["train"], rel=1e-12)
    # max_batches (TrainConfig.eval_steps) overrides eval_batches; two calls give the same numbers
    assert task.evaluate(model, 2) != out and task.evaluate(model, None) == out


# --- bugs -------------------------------------------------------------------------------------


def test_bug_text_task_block_longer_than_val_refused_before_training():
    """Bug: a block_size the val split cannot hold (e.g. a corpus with a short val tail) was accepted;
    training ran until the first evaluation (with eval_interval=0: the whole run) and only then failed."""
    data, _, _ = _toy()  # 270 train, 30 val tokens
    task = TextLMTask(data, block_size=30)
    with pytest.raises(ValueError, match=r"block_size=30 for a 'val' split of 30 tokens"):
        task.train_batch(0, torch.Generator().manual_seed(0), 4)
    with pytest.raises(ValueError, match="block_size"):
        TextLMTask(data, block_size=0)
    with pytest.raises(TypeError, match="block_size"):
        TextLMTask(data, block_size=8.0)
    ok = TextLMTask(data, block_size=29)
    assert ok.train_batch(0, torch.Generator().manual_seed(0), 4)[0].shape == (4, 29)
    assert ok.evaluate(_Bigram(data.vocab_size), 1)["val_loss"] > 0


@pytest.mark.parametrize("bad", [0, -1])
def test_bug_text_task_evaluate_refuses_non_positive_max_batches(bad):
    """Bug: ``evaluate(model, -1)`` scored no window and reported train/val loss -0.0 (a perfect model);
    ``evaluate(model, 0)`` silently scored ``eval_batches`` batches instead of refusing."""
    data, _, _ = _toy()
    task = TextLMTask(data, block_size=8, eval_batch_size=4, eval_batches=3)
    with pytest.raises(ValueError, match=rf"max_batches must be a positive int, got {bad}"):
        task.evaluate(_Bigram(data.vocab_size), bad)
