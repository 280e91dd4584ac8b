"""Mutation audit (helper 56g) of train/config.py, train/schedule.py, train/checkpoint.py, train/distributed.py (the
parts one process reaches) and data/text.py: tests that kill the mutants the suite let survive, and the bugs they
showed (a blank ``LOCAL_RANK`` refused in one process; a config field with a ``default_factory`` that a checkpoint
predates not read at its default).

Equivalent, left alive: ``_check_betas`` testing ``hasattr(pair, "tolist")`` for ``"__array__"`` (NumPy arrays and
tensors have both); ``_torch_device`` catching ``RuntimeError`` alone (this torch raises no ValueError for a device
string); ``{**config, **filled}`` for ``{**filled, **config}`` (``filled`` holds only keys ``config`` lacks);
``dist_env`` without ``world_size < 1`` (no rank satisfies ``0 <= rank < world_size`` then).
"""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch

from diffusionformer.data.paths import CorruptDataError
from diffusionformer.data.text import char_text_data, load_tinyshakespeare
from diffusionformer.train import TrainConfig, cosine_lr, resolve_device
from diffusionformer.train.checkpoint import _predated_fields_at_default, model_record, model_record_differences
from diffusionformer.train.distributed import DistContext, _on_every_rank, dist_env, init_distributed


@pytest.mark.parametrize("blank", ["", "  "])
def test_bug_one_process_with_a_blank_local_rank_runs(blank):
    """A single process (``WORLD_SIZE=1``) whose launcher left ``LOCAL_RANK`` blank was refused ("expected integer
    RANK, WORLD_SIZE and LOCAL_RANK"), though a blank ``RANK`` there is rank 0: blank is unset, as for ``RANK``."""
    env = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": blank}
    with mock.patch.dict("os.environ", env):
        assert dist_env() is None
        ctx = init_distributed("cpu")
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.owns_group) == (0, 1, 0, False)
    # several processes still need every variable: a blank LOCAL_RANK there is named
    with mock.patch.dict("os.environ", {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": blank}):
        with pytest.raises(ValueError, match="LOCAL_RANK="):
            dist_env()


@dataclasses.dataclass
class _TaggedConfig:
    width: int = 4
    tags: list = dataclasses.field(default_factory=lambda: ["base"])  # a field added after a run was saved


class _Tagged(torch.nn.Module):
    def __init__(self, config: _TaggedConfig) -> None:
        super().__init__()
        self.config = config
        self.lin = torch.nn.Linear(config.width, 1)


def test_bug_a_checkpoint_that_predates_a_default_factory_field_reads_as_that_default():
    """A model config's field with a ``default_factory`` (a list default) that the checkpoint's record predates is
    at its default, like a plain ``default``: it was left out, and resuming a run of the same model was refused
    ("config tags: checkpoint None, now ['base']")."""
    model = _Tagged(_TaggedConfig())
    saved = model_record(model)
    del saved["config"]["tags"]
    assert model_record_differences(_predated_fields_at_default(saved, model), model_record(model)) == []
    other = _Tagged(_TaggedConfig(tags=["other"]))  # a model that set it is another
    assert model_record_differences(_predated_fields_at_default(saved, other), model_record(other)) == [
        "config tags: checkpoint ['base'], now ['other']"]


def test_a_config_that_is_a_dataclass_type_fills_nothing():
    """kills: train/checkpoint.py ``_predated_fields_at_default`` without ``not isinstance(cfg, type)`` (a model whose
    ``config`` is the dataclass itself, not an instance, which model_record reads as no config, had the class's
    defaults filled into a record it does not describe)."""
    model = _Tagged(_TaggedConfig())
    model.config = _TaggedConfig
    saved = {"class": "M", "config": {"width": 4}, "heads": {}}
    assert _predated_fields_at_default(saved, model) == saved


def test_min_lr_equal_to_lr_is_a_constant_rate():
    """kills: train/config.py ``min_lr > lr`` -> ``min_lr >= lr`` (the documented ``min_lr <= lr`` bound: a
    constant rate, min_lr = lr, was refused)."""
    cfg = TrainConfig(lr=1e-3, min_lr=1e-3, max_steps=10)
    assert {cosine_lr(s, lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=0, decay_steps=cfg.decay_steps)
            for s in range(12)} == {1e-3}
    with pytest.raises(ValueError, match=r"TrainConfig\.min_lr: expected a float <= lr \(0\.001\), got 0\.002"):
        TrainConfig(lr=1e-3, min_lr=2e-3)


def test_lr_decay_steps_of_zero_is_refused():
    """kills: train/config.py ``lr_decay_steps`` checked ``>= 0`` instead of ``>= 1`` (0 was taken)."""
    with pytest.raises(ValueError, match=r"TrainConfig\.lr_decay_steps: expected an int >= 1, got 0"):
        TrainConfig(lr_decay_steps=0)
    assert TrainConfig(lr_decay_steps=1).decay_steps == 1


def test_a_bare_cuda_device_is_the_current_one_or_the_local_ranks(monkeypatch):
    """kills: train/config.py ``resolve_device`` taking device 0 for a bare ``"cuda"`` in one process (not
    ``torch.cuda.current_device()``, which the user may have set). Stand-ins: no GPU is needed."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert resolve_device("cuda") == torch.device("cuda", 3)
    assert resolve_device("auto", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda:2", local_rank=1) == torch.device("cuda", 2)


def test_an_error_of_one_process_is_raised_not_swallowed():
    """kills: train/distributed.py ``_raise_on_every_rank`` returning at once in one process (a failed checkpoint
    write or logger open, run through ``_on_every_rank``, was dropped and the run went on without it)."""
    ctx = DistContext(0, 1, 0, torch.device("cpu"))

    def save():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _on_every_rank(ctx, "the checkpoint", save)
    calls = []
    _on_every_rank(ctx, "the checkpoint", lambda: calls.append(1))
    _on_every_rank(ctx, "the checkpoint", lambda: calls.append(2), here=False)  # another rank's step: not run here
    assert calls == [1]


def _shakespeare(root, text):
    (root / "tinyshakespeare").mkdir()
    (root / "tinyshakespeare" / "input.txt").write_text(text, encoding="utf-8")
    return root


def test_a_one_character_corpus_file_is_named(tmp_path):
    """kills: data/text.py ``load_tinyshakespeare`` without its own length check (``verify=False``: a file of one
    character failed in char_text_data with "text must have at least 2 characters", naming no file)."""
    root = _shakespeare(tmp_path, "x")
    with pytest.raises(CorruptDataError, match=r"input\.txt' holds 1 character\(s\), expected a corpus"):
        load_tinyshakespeare(root=root, verify=False)


def test_a_bytearray_text_gets_the_decode_hint():
    """kills: data/text.py ``char_text_data``'s hint for ``(bytes, bytearray)`` narrowed to ``bytes``."""
    with pytest.raises(TypeError, match=r"text must be a str, got bytearray \(decode it first"):
        char_text_data("toy", bytearray(b"abcabc"))


def test_a_cut_train_split_keeps_the_split_note_and_adds_the_cut(tmp_path):
    """kills: data/text.py ``load_tinyshakespeare`` ``meta["split"] += ...`` -> ``= ...`` (the note of the 90/10
    split was lost once ``train_chars`` cut the train part)."""
    root = _shakespeare(tmp_path, "abcdefghij" * 3)
    data = load_tinyshakespeare(root=root, verify=False, train_chars=5)
    assert data.meta["split"] == "first 90% train, rest val; train cut to its first 5 characters"
    assert data.meta["sizes"] == {"train": 5, "val": 3} and data.train.tolist() == [0, 1, 2, 3, 4]
