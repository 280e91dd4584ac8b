"""A checkpoint written before a model-config field existed resumes: the model that wrote it ran as the field's
default does (``recompute`` and ``mlp`` were added after runs were made)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.train import TrainConfig, Trainer


class _Tokens:
    def train_batch(self, step, generator, batch_size):
        idx = torch.randint(0, 11, (batch_size, 9), generator=generator)
        return {"idx": idx[:, :-1], "targets": idx[:, 1:]}

    def loss(self, model, batch):
        logits = model(batch["idx"])
        logits = logits[0] if isinstance(logits, tuple) else logits
        return F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten()), {}

    def evaluate(self, model, max_batches):
        return {"loss": 0.0}


def _cfg(steps):
    return TrainConfig(max_steps=steps, batch_size=4, lr=1e-3, warmup_steps=0, eval_interval=steps, log_interval=1,
                       checkpoint_interval=1, lr_decay_steps=4, device="cpu", progress=False)


def _gpt(**kw):
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16, **kw))


def _as_before_the_fields(out):
    payload = torch.load(out / "checkpoint.pt", weights_only=True)
    for field in ("recompute", "mlp"):
        del payload["model_record"]["config"][field]
    torch.save(payload, out / "checkpoint.pt")


def test_bug_a_checkpoint_that_predates_a_field_resumes(tmp_path):
    """Bug: resuming a run whose checkpoint predates ``recompute`` (or ``mlp``) was refused, "written by a different
    model (config mlp: checkpoint None, now 'gelu'; config recompute: checkpoint None, now False)": an interrupted
    run could not be taken up after an upgrade."""
    Trainer(_gpt(), _Tokens(), _cfg(2), tmp_path).fit()
    _as_before_the_fields(tmp_path)
    Trainer(_gpt(), _Tokens(), _cfg(4), tmp_path, resume=True).fit()
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 4


def test_a_checkpoint_that_predates_a_field_is_not_a_model_that_sets_it(tmp_path):
    """The model that wrote it ran at the default: a model with ``recompute=True`` is another (the record says so)."""
    Trainer(_gpt(), _Tokens(), _cfg(2), tmp_path).fit()
    _as_before_the_fields(tmp_path)
    with pytest.raises(ValueError, match=r"config recompute: checkpoint False, now True"):
        Trainer(_gpt(recompute=True), _Tokens(), _cfg(4), tmp_path, resume=True).fit()
