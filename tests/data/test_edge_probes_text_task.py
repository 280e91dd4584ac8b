"""Edge probes of the character corpora and the text LM task against independent references.

References: nanoGPT's ``get_batch`` (offsets ``torch.randint(len(data) - block_size)``), an explicit float64
cross-entropy from ``log_softmax``, and the raw file bytes read back with NumPy.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from diffusionformer.data.base import TextData
from diffusionformer.data.text import char_text_data, load_tinyshakespeare
from diffusionformer.experiments.tasks import _EVAL_SEED, TextLMTask, heldout_batches
from diffusionformer.models import DiffusionGPT, GPTConfig


def _toy(n: int = 300, train_fraction: float = 0.9) -> TextData:
    return char_text_data("toy", "".join(chr(97 + (i * i) % 7) for i in range(n)), train_fraction=train_fraction)


def _gpt(vocab: int, block: int) -> DiffusionGPT:
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=vocab, block_size=block, n_layer=1, n_head=2, n_embd=16)).double().eval()


def _nanogpt_get_batch(data: np.ndarray, batch_size: int, block_size: int, g: torch.Generator):
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=g)
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


def test_a_split_of_exactly_block_plus_one_tokens_gives_its_single_window():
    data = _toy(300)  # val: 30 tokens
    task = TextLMTask(data, block_size=29, eval_batch_size=3, eval_batches=2)
    x, y = data.get_batch("val", 3, 29, torch.Generator().manual_seed(0))
    assert (x == data.val[:-1]).all() and (y == data.val[1:]).all()
    with pytest.raises(ValueError, match=r"block_size=30 for a 'val' split of 30 tokens"):
        TextLMTask(data, block_size=30).train_batch(0, torch.Generator().manual_seed(0), 2)
    out = task.evaluate(_gpt(data.vocab_size, 29), 2)
    assert math.isfinite(out["val_loss"]) and math.isfinite(out["train_loss"])


def test_evaluation_equals_a_float64_nanogpt_estimate_loss_and_repeats_exactly():
    data = _toy(500)
    model = _gpt(data.vocab_size, 8)
    task = TextLMTask(data, block_size=8, eval_batch_size=5, eval_batches=3)
    first, second = task.evaluate(model, None), task.evaluate(model, None)
    assert first == second  # the same windows on every call, whatever the global RNG did between
    torch.manual_seed(123)
    assert task.evaluate(model, None) == first
    for split in ("train", "val"):
        g = torch.Generator().manual_seed(_EVAL_SEED)
        arr = getattr(data, split).numpy().astype(np.uint16)  # nanoGPT keeps its tokens as uint16
        losses = []
        for _ in range(3):
            x, y = _nanogpt_get_batch(arr, 5, 8, g)
            with torch.no_grad():
                logp = torch.log_softmax(model(x)[0].double(), dim=-1)
            losses.append(float(-logp.gather(-1, y[..., None]).mean()))
        assert math.isclose(first[f"{split}_loss"], sum(losses) / 3, rel_tol=1e-12)


def test_tinyshakespeare_with_unicode_and_a_bom_reads_like_numpy_bytes(tmp_path):
    text = "\ufeffWhat, ho! Æ\U0001F600\nnay\r\nπ" * 20
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_bytes(text.encode("utf-8"))
    data = load_tinyshakespeare(root=tmp_path, verify=False)
    raw = np.fromfile(tmp_path / "tinyshakespeare" / "input.txt", dtype=np.uint8).tobytes().decode("utf-8")
    raw = raw.replace("\r\n", "\n")  # Python's text mode, as nanoGPT's open(..., 'r')
    assert data.decode(torch.cat([data.train, data.val])) == raw
    assert data.itos == sorted(set(raw))
    with pytest.raises(ValueError, match="not in the 'tinyshakespeare' vocabulary"):
        data.encode("\u00e9")  # a character outside the corpus


@pytest.mark.parametrize("payload", [b"\xff\xfe\x00a", "abc\u00e9".encode("utf-8")[:-1]])
def test_a_corrupt_or_truncated_corpus_is_named(tmp_path, payload):
    from diffusionformer.data.paths import CorruptDataError

    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_bytes(payload)
    with pytest.raises(CorruptDataError, match="input.txt"):
        load_tinyshakespeare(root=tmp_path, verify=False)


def test_bug_heldout_text_names_a_model_without_a_block_size():
    """Bug: ``heldout_batches`` of text data for a model without ``config.block_size`` (any model may take the
    text adapter) died in ``AttributeError: 'Linear' object has no attribute 'config'`` while ``build_task`` for
    the same pair said the text task needs a GPT model."""
    data = _toy(300)
    with pytest.raises(ValueError, match=r"a text task needs a GPT model \(with config.block_size\)"):
        heldout_batches(data, torch.nn.Linear(1, 1), "val", 4, 2)
    batches, info = heldout_batches(data, _gpt(data.vocab_size, 8), "val", 5, 2)
    assert [tuple(b[0].shape) for b in batches] == [(2, 8), (2, 8), (1, 8)] and info["split"] == "val"


@pytest.mark.parametrize("vocab_size", [2.0, True])
def test_bug_text_data_vocab_size_not_an_int(vocab_size):
    """Bug: TextData took ``vocab_size=2.0`` (equal to ``len(itos)``) or ``True`` (with one character) and handed it
    on to the model's config, which failed there; it is now refused naming ``vocab_size``."""
    itos = ["a"] if vocab_size is True else ["a", "b"]
    with pytest.raises(TypeError, match=r"vocab_size must be an int, got"):
        TextData("toy", torch.tensor([0, 0, 0]), torch.tensor([0, 0]), vocab_size, itos)
    data = TextData("toy", torch.tensor([0, 0, 0]), torch.tensor([0, 0]), np.int64(len(itos)), itos)
    assert type(data.vocab_size) is int


def test_bug_text_data_streams_that_are_not_tensors():
    """Bug: a list as a token stream died in ``AttributeError: 'list' object has no attribute 'dtype'``."""
    with pytest.raises(ValueError, match=r"train: expected a 1-D int64 tensor, got list"):
        TextData("toy", [0, 1, 0], torch.tensor([1, 0]), 2, ["a", "b"])


@pytest.mark.parametrize("itos", [["", "a"], ["ab", "c"]])
def test_bug_text_data_itos_entries_of_one_character(itos):
    """Bug: TextData accepted an empty or a multi-character vocabulary entry: ``decode`` of ids [0, 1, 0] with
    ``itos=["", "a"]`` gave ``"a"`` (two tokens vanished) and with ``["ab", "c"]`` text that ``encode`` refused,
    so decode then encode did not give the tokens back."""
    with pytest.raises(ValueError, match=r"itos must hold distinct strings of one character each"):
        TextData("toy", torch.tensor([0, 1, 0]), torch.tensor([1, 0]), 2, itos)


def test_bug_get_batch_copies_to_the_cpu_blocking(monkeypatch):
    """Bug: ``TextData.get_batch(device=...)`` copied with ``non_blocking=True`` to any device: tokens held on a GPU
    copied to ``device="cpu"`` could be read before the copy landed (torch only synchronises copies towards an
    accelerator). Observed through the ``non_blocking`` each ``Tensor.to`` receives (no GPU here)."""
    import torch

    from diffusionformer.data.base import TextData

    data = TextData("toy", torch.arange(20) % 3, torch.arange(10) % 3, 3, ["a", "b", "c"])
    seen = []
    real_to = torch.Tensor.to

    def spying_to(self, *args, **kwargs):
        if args and isinstance(args[0], (str, torch.device)):
            seen.append((torch.device(args[0]).type, kwargs.get("non_blocking", False)))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spying_to)
    data.get_batch("train", 2, 4, generator=torch.Generator().manual_seed(0), device="cpu")
    monkeypatch.undo()
    assert ("cpu", True) not in seen, seen
    assert ("cpu", False) in seen, seen
