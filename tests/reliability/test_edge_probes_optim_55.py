"""Edge probes of an optimiser / schedule power user (sitting 55): the training API's AdamW groups, the learning-rate
schedule and resuming a run whose trained parameters changed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from diffusionformer.train import TrainConfig, Trainer, cosine_lr


class _Regression:
    """``y = x w`` on batches drawn from the trainer's generator."""

    def __init__(self) -> None:
        self.w = torch.randn(4, 2, generator=torch.Generator().manual_seed(0))

    def train_batch(self, step, generator, batch_size):
        x = torch.randn(batch_size, 4, generator=generator)
        return {"x": x, "y": x @ self.w}

    def loss(self, model, batch):
        return F.mse_loss(model(batch["x"]), batch["y"]), {}

    def evaluate(self, model, max_batches):
        return {"loss": 0.0}


def _mlp(freeze_vectors: bool = False) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    if freeze_vectors:  # every bias and norm weight: param_groups then drops the empty no-decay group
        for p in model.parameters():
            p.requires_grad_(p.dim() >= 2)
    return model


def _config(max_steps: int) -> TrainConfig:
    return TrainConfig(max_steps=max_steps, lr_decay_steps=6, batch_size=8, lr=1e-2, warmup_steps=1, eval_interval=0,
                       log_interval=1, checkpoint_interval=2, seed=0, device="cpu", progress=False)


@pytest.mark.parametrize("freeze", ["0.weight", "1.bias"])
def test_bug_resume_after_freezing_a_parameter_names_it(tmp_path, freeze):
    """Bug: resuming a run with one more (or one fewer) frozen parameter than the run that wrote the checkpoint (the
    usual fine-tuning change) failed with ``CheckpointError: ... got one that does not fit: ValueError: loaded state
    dict contains a parameter group that doesn't match the size of optimizer's group``: it named neither the
    parameter nor the change, and read as a damaged file. The trainer's own check, which names the parameters trained
    only in the checkpoint, ran only when the groups kept their sizes (two swapped parameters of the same count)."""
    Trainer(_mlp(), _Regression(), _config(2), tmp_path).fit()
    model = _mlp()
    model.get_parameter(freeze).requires_grad_(False)
    before = (tmp_path / "checkpoint.pt").read_bytes()
    with pytest.raises(ValueError, match=rf"optimised other parameters \(trained only in the checkpoint: "
                                         rf"\['{freeze}'\]; trained only now: \[\]\); freeze"):
        Trainer(model, _Regression(), _config(4), tmp_path, resume=True).fit()
    assert (tmp_path / "checkpoint.pt").read_bytes() == before


def test_bug_resume_after_unfreezing_a_parameter_names_it(tmp_path):
    """As above, the other way: a parameter the checkpoint's run kept frozen is trained now."""
    model = _mlp()
    model[2].weight.requires_grad_(False)
    Trainer(model, _Regression(), _config(2), tmp_path).fit()
    with pytest.raises(ValueError, match=r"trained only in the checkpoint: \[\]; trained only now: \['2.weight'\]"):
        Trainer(_mlp(), _Regression(), _config(4), tmp_path, resume=True).fit()


def test_resume_with_the_same_frozen_parameters_still_continues(tmp_path):
    """The check above refuses only a change: the same frozen parameter resumes."""
    model = _mlp()
    model[0].bias.requires_grad_(False)
    Trainer(model, _Regression(), _config(2), tmp_path).fit()
    model = _mlp()
    model[0].bias.requires_grad_(False)
    assert Trainer(model, _Regression(), _config(4), tmp_path, resume=True).fit()["step"] == 4


@pytest.mark.parametrize("name", ["lr", "min_lr"])
@pytest.mark.parametrize("bad", [True, "3e-4", None])
def test_bug_cosine_lr_names_a_rate_that_is_no_number(name, bad):
    """Bug: ``cosine_lr`` took ``lr=True`` as a peak rate of 1.0 (the package refuses a bool as a number everywhere
    else, ``TrainConfig.lr`` included), and a string or ``None`` raised ``math.isfinite``'s bare "must be real
    number, not str" naming neither the function nor the argument."""
    kwargs = {"lr": 1e-3, "min_lr": 0.0, name: bad}
    with pytest.raises(TypeError, match=rf"cosine_lr: expected {name} a float >= 0, got "):
        cosine_lr(0, warmup_steps=1, decay_steps=3, **kwargs)


@pytest.mark.parametrize("key, field", [
    ("max_lr", "lr"), ("peak_lr", "lr"), ("learning_rate", "lr"), ("min_learning_rate", "min_lr"),
    ("total_steps", "max_steps"), ("weight_decay_rate", "weight_decay"), ("wd", "weight_decay"),
    ("clip_grad", "grad_clip"), ("max_grad_norm", "grad_clip"), ("accumulate_grad_batches", "grad_accum_steps"),
])
def test_bug_a_training_key_of_another_library_points_at_its_field(key, field):
    """Bug: ``TrainConfig.from_dict`` hinted by spelling alone, so the names other trainers give these settings (the
    peak rate of a schedule, nanoGPT's ``learning_rate``, timm's and DINO's ``clip_grad``, the Hugging Face
    ``max_grad_norm``, Lightning's ``accumulate_grad_batches``) got no hint, or the wrong one: ``max_lr`` was told
    "did you mean 'min_lr'?" (the opposite end of the schedule), ``total_steps`` 'eval_steps' and
    ``weight_decay_rate`` 'weight_decay_rule'."""
    with pytest.raises(ValueError, match=rf"unknown TrainConfig key '{key}' \(did you mean '{field}'\?\)"):
        TrainConfig.from_dict({key: 1})


@pytest.mark.parametrize("key, field", [("LR", "lr"), ("max_step", "max_steps"), ("warmup_iters", "warmup_steps"),
                                        ("gradient_accumulation_steps", "grad_accum_steps"), ("beta1", "betas")])
def test_spelling_hints_are_kept(key, field):
    with pytest.raises(ValueError, match=rf"unknown TrainConfig key '{key}' \(did you mean '{field}'\?\)"):
        TrainConfig.from_dict({key: 1})


@pytest.mark.parametrize("name, value", [("warmup_steps", 2.5), ("decay_steps", 5.5), ("warmup_steps", float("inf")),
                                         ("decay_steps", float("inf"))])
def test_bug_cosine_lr_refuses_a_warmup_or_decay_of_no_whole_updates(name, value):
    """Bug: ``cosine_lr`` refused a step of 1.5 updates (a whole number was checked for ``step`` only) but took
    ``warmup_steps=2.5`` (a warm-up whose peak falls on no update: 0.29, 0.57, 0.86 of ``lr``, then the cosine) and
    ``warmup_steps=decay_steps=inf`` (a learning rate of 0 at every update), without a word; its message for the
    type of these arguments already says "an int"."""
    kwargs = {"warmup_steps": 2, "decay_steps": 6, name: value}
    if kwargs["warmup_steps"] > kwargs["decay_steps"]:
        kwargs["decay_steps"] = value
    with pytest.raises(ValueError, match=rf"cosine_lr: expected {name} a whole number of updates, got {value}"):
        cosine_lr(0, lr=1.0, min_lr=0.0, **kwargs)
    assert cosine_lr(3, lr=1.0, min_lr=0.0, warmup_steps=2.0, decay_steps=6.0) == cosine_lr(
        3, lr=1.0, min_lr=0.0, warmup_steps=2, decay_steps=6)  # whole numbers of any type keep their value


# found by the review of the commit above (helper 55g)
@pytest.mark.parametrize("frozen_before", [True, False])
def test_bug_resume_after_freezing_a_whole_decay_group_names_the_parameters(tmp_path, frozen_before):
    """Bug: the resume check of c1b11ba names the parameters frozen or unfrozen since only when the optimizer keeps
    its number of groups. Freezing (or unfreezing) every bias and norm weight, a usual fine-tuning change, empties
    (or fills) the no-decay group, which ``param_groups`` drops: 1 group against 2, and the resume failed with
    ``CheckpointError: ... does not fit: ValueError: loaded state dict has a different number of parameter groups``,
    naming no parameter and reading as a damaged file."""
    Trainer(_mlp(freeze_vectors=frozen_before), _Regression(), _config(2), tmp_path).fit()
    before = (tmp_path / "checkpoint.pt").read_bytes()
    vectors = r"\['0.bias', '1.bias', '1.weight', '2.bias'\]"
    match = (rf"trained only in the checkpoint: \[\]; trained only now: {vectors}" if frozen_before else
             rf"trained only in the checkpoint: {vectors}; trained only now: \[\]")
    with pytest.raises(ValueError, match=match):
        Trainer(_mlp(freeze_vectors=not frozen_before), _Regression(), _config(4), tmp_path, resume=True).fit()
    assert (tmp_path / "checkpoint.pt").read_bytes() == before
