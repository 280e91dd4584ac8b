"""Edge-case probes (sitting 42) of training in reduced precision on the CPU: models cast to float16/bfloat16
without autocast (AdamW without float32 master weights, the gradient norm of half gradients) and the fp16
GradScaler's skipped updates against torch's documented semantics (a skipped update is not applied, the schedule
still advances, AdamW's own step count does not).

Probed and found right (not repeated here): bf16 autocast losses and metrics summed in float32, evaluation under
autocast, gradient accumulation under autocast, the scaler state across a resume (tests/train/test_train_accum.py).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook

from diffusionformer.train import NonFiniteLossError, Trainer, cosine_lr, read_metrics
from diffusionformer.train.optim import param_groups
from train_tiny_tasks import InfGradAt, RegressionTask, TinyMLP, fp16_supported, tiny_config


class _CastTask(RegressionTask):
    """The regression task with its inputs cast to the model's dtype (a model cast with ``.half()``/``.bfloat16()``)
    and the loss in float32."""

    def loss(self, model, batch):
        dtype = next(model.parameters()).dtype
        pred = model(batch["x"].to(dtype)).float()
        return F.mse_loss(pred, batch["y"]), {"mae": (pred - batch["y"]).abs().mean()}

    def evaluate(self, model, max_batches):
        dtype = next(model.parameters()).dtype
        return {"loss": F.mse_loss(model(self.x_eval.to(dtype)).float(), self.y_eval).item()}


class _StepGrads:
    """The gradients handed to every ``optimizer.step`` (after clipping), captured with a global pre-hook."""

    def __enter__(self):
        self.grads: list[list[torch.Tensor]] = []
        self.states: list[torch.optim.Optimizer] = []

        def hook(optimizer, args, kwargs):
            self.grads.append([p.grad.detach().clone() for g in optimizer.param_groups for p in g["params"]
                               if p.grad is not None])
            self.states.append(optimizer)

        self._handle = register_optimizer_step_pre_hook(hook)
        return self

    def __exit__(self, *exc):
        self._handle.remove()


def _norm64(grads: list[torch.Tensor]) -> float:
    return float(torch.linalg.vector_norm(torch.cat([g.double().flatten() for g in grads])))


def test_bug_float16_parameters_are_refused_before_adamw_writes_inf_into_them(tmp_path):
    """Bug: a model cast with ``.half()`` trained with amp="off" (or "bf16") was accepted; AdamW (no float32 master
    weights) updated it in float16, where its eps 1e-8 rounds to 0 and the second moment of a small gradient
    underflows, so the first update wrote inf/NaN into the weights and the run stopped one step later with
    "non-finite training loss or gradient norm at step 1", blaming the loss of a healthy batch."""
    # the cause, in torch alone: one AdamW step of float16 weights with ordinary gradients
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    p.grad = torch.tensor([1e-3, 0.0, 1e-5], dtype=torch.float16)
    torch.optim.AdamW([p], lr=1e-3).step()
    assert not torch.isfinite(p).any()

    for amp in ("off", "bf16"):
        model = TinyMLP(dropout=0.0).half()
        cfg = tiny_config(amp=amp, max_steps=3, eval_interval=0, checkpoint_interval=0)
        with pytest.raises(ValueError, match=r"AdamW cannot update float16 parameters \['fc1.weight', 'fc1.bias', "
                                             r"'norm.weight'\] \.\.\. .*use amp='fp16'"):
            Trainer(model, _CastTask(global_rng=False), cfg, tmp_path / amp).fit()
        assert not (tmp_path / amp / "checkpoint.pt").exists()
    # frozen float16 parameters are not updated: accepted
    model = TinyMLP(dropout=0.0)
    model.fc1.half().requires_grad_(False)

    class Mixed(_CastTask):
        def loss(self, model, batch):
            h = model.fc1(batch["x"].half()).float()
            pred = model.fc2(model.norm(F.gelu(h)))
            return F.mse_loss(pred, batch["y"]), {}

    cfg = tiny_config(amp="off", max_steps=2, eval_interval=0, checkpoint_interval=0)
    task = Mixed(global_rng=False)
    task.evaluate = lambda m, n: {}
    assert Trainer(model, task, cfg, tmp_path / "frozen").fit()["status"] == "completed"


def test_bug_bfloat16_gradient_norm_is_computed_in_float32(tmp_path):
    """Bug: for a model cast with ``.bfloat16()`` the logged ``grad_norm`` and the clipping used
    ``clip_grad_norm_``'s norm in bfloat16 (each tensor's norm and their norm rounded to 8 bits): the logged norm was
    off by up to 2**-8 relative from the float64 norm of the same gradients (2.546875 for 2.5486) and the clipped
    gradients' norm exceeded ``grad_clip`` (0.6%)."""
    torch.manual_seed(0)
    m0 = TinyMLP(in_dim=4, hidden=64, dropout=0.0).bfloat16()
    cfg = dict(max_steps=3, log_interval=1, eval_interval=0, checkpoint_interval=0, warmup_steps=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the bf16 master-weight warning (its own test)
        with _StepGrads() as seen:
            Trainer(copy.deepcopy(m0), _CastTask(global_rng=False), tiny_config(grad_clip=1e6, **cfg),
                    tmp_path / "free").fit()
        logged = [r["metrics"]["grad_norm"] for r in read_metrics(tmp_path / "free") if r["split"] == "train"]
        assert len(logged) == len(seen.grads) == 3
        for norm, grads in zip(logged, seen.grads):
            assert grads[0].dtype == torch.bfloat16
            assert norm == pytest.approx(_norm64(grads), rel=1e-6)

        clip = 0.05
        with _StepGrads() as seen:
            Trainer(copy.deepcopy(m0), _CastTask(global_rng=False), tiny_config(grad_clip=clip, **cfg),
                    tmp_path / "clipped").fit()
    for grads in seen.grads:  # each clipped to grad_clip, up to the bf16 rounding of the scaled elements
        assert _norm64(grads) == pytest.approx(clip, rel=1e-3)


def test_bug_bfloat16_parameters_warn_that_small_updates_are_rounded_away(tmp_path):
    """Bug: a model cast with ``.bfloat16()`` trained without a word while AdamW (no float32 master weights) rounded
    every update below half a bfloat16 spacing away: at the default lr 3e-4 a LayerNorm gain of 1 (spacing 2**-7)
    never moved and most weights stayed put, weight decay had no effect; now the trainer warns, naming the fix
    (float32 weights with amp='bf16')."""
    torch.manual_seed(0)
    model = TinyMLP(dropout=0.0).bfloat16()
    gain = model.norm.weight.detach().clone()
    cfg = tiny_config(amp="off", lr=3e-4, min_lr=3e-5, max_steps=4, eval_interval=0, checkpoint_interval=0)
    with pytest.warns(UserWarning, match=r"bfloat16 parameters \['fc1.weight', 'fc1.bias', 'norm.weight'\] \.\.\. "
                                         r"are updated in bfloat16 .*use amp='bf16'") as record:
        Trainer(model, _CastTask(global_rng=False), cfg, tmp_path / "bf16").fit()
    assert record[0].filename == __file__  # points at the caller
    assert torch.equal(model.norm.weight, gain)  # what the warning is about: 4 updates of ~3e-4 rounded away
    # float32 weights under bf16 autocast (the advice): no warning, and the gain moves
    torch.manual_seed(0)
    model = TinyMLP(dropout=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        Trainer(model, _CastTask(global_rng=False), tiny_config(**{**cfg.to_dict(), "amp": "bf16"}),
                tmp_path / "amp").fit()
    assert not torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))


@pytest.mark.skipif(not fp16_supported(), reason="this torch build has no fp16 CPU autocast")
def test_pins_fp16_skipped_update_is_not_applied_and_the_schedule_still_advances(tmp_path):
    """Pins torch's GradScaler semantics: an update with an infinite gradient (step 2, and the overflows of the first
    scales) is skipped (the optimizer's step never runs: AdamW's step count counts only the applied updates), the
    scale is halved once per skip, the learning-rate schedule still advances (the logged lr of every update is
    ``cosine_lr(step)``, as a scheduler stepped every iteration), and each skipped update's record logs
    ``grad_norm`` null (clipping on, log_interval 1): the log counts the skips honestly."""
    torch.manual_seed(0)
    model = TinyMLP(dropout=0.0)
    cfg = tiny_config(amp="fp16", max_steps=5, log_interval=1, eval_interval=0, checkpoint_interval=0)
    with _StepGrads() as seen:
        Trainer(model, InfGradAt(bad=2, global_rng=False), cfg, tmp_path).fit()
    train = [r for r in read_metrics(tmp_path) if r["split"] == "train"]
    skipped = [r["metrics"]["grad_norm"] is None for r in train]
    assert skipped[2] and not all(skipped)  # the infinite gradient, besides the overflows of the first scales
    # every skipped update logged, every other one applied, the scale halved once per skip (growth_interval 2000)
    assert len(seen.grads) == skipped.count(False)
    assert {float(s["step"]) for s in seen.states[-1].state.values()} == {float(skipped.count(False))}
    payload = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert payload["scaler"]["scale"] == 2.0 ** (16 - skipped.count(True))
    assert [r["lr"] for r in train] == [cosine_lr(s, lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps,
                                                  decay_steps=cfg.decay_steps) for s in range(5)]


def test_pins_bf16_accumulated_gradient_is_the_float64_gradient_of_the_whole_batch(tmp_path):
    """Pins: under bf16 autocast, 4 micro-batches of 2 rows back-propagate ``loss / 4`` into float32 gradients whose
    sum is the gradient of the whole batch's mean loss: within bf16 rounding of the float64 gradient of the same
    batch and weights, as the one-batch (``grad_accum_steps=1``) bf16 run's is."""
    torch.manual_seed(0)
    m0 = TinyMLP(in_dim=4, hidden=32, dropout=0.0)
    task = _CastTask(global_rng=False)
    got = {}
    for accum in (1, 4):
        cfg = tiny_config(amp="bf16", max_steps=1, warmup_steps=0, grad_accum_steps=accum, grad_clip=1e6,
                          eval_interval=0)
        with _StepGrads() as seen:
            Trainer(copy.deepcopy(m0), task, cfg, tmp_path / str(accum)).fit()
        got[accum] = torch.cat([g.flatten() for g in seen.grads[0]]).double()
        assert seen.grads[0][0].dtype == torch.float32

    ref_model = copy.deepcopy(m0).double()
    batch = task.train_batch(0, torch.Generator().manual_seed(cfg.seed), cfg.batch_size)
    F.mse_loss(ref_model(batch["x"].double()), batch["y"].double()).backward()
    by_name = dict(ref_model.named_parameters())
    # the trainer's parameter order: param_groups (decayed matrices first)
    order = [n for g in param_groups(ref_model, cfg.weight_decay) for n in g["names"]]
    ref = torch.cat([by_name[n].grad.flatten() for n in order])
    for accum in (1, 4):
        err = float(torch.linalg.vector_norm(got[accum] - ref) / torch.linalg.vector_norm(ref))
        assert err < 1e-2, (accum, err)
    assert float(torch.linalg.vector_norm(got[4] - got[1]) / torch.linalg.vector_norm(ref)) < 1e-2


class _InfGradAlways(InfGradAt):
    """An infinite gradient (and a finite loss) at every update: non-finite at any loss scale."""

    def loss(self, model, batch):
        self.bad = self.step
        return super().loss(model, batch)


@pytest.mark.skipif(not fp16_supported(), reason="this torch build has no fp16 CPU autocast")
def test_bug_fp16_scale_halved_to_zero_stops_the_run(tmp_path):
    """Bug: under amp="fp16" (grad_clip=0) a gradient that is infinite at every update (at any scale) had every
    update skipped: the scale was halved to 0.0 after 165 skips, from which no update can ever be applied again, and
    the run of 200 updates ended "completed" with its logged losses and untouched weights, with no trace of a skip
    in the log; the same task in float32 stops at step 0 with NonFiniteLossError. Now a scale of 0 is a non-finite
    step: the run stops there and keeps the last good checkpoint."""
    cfg = tiny_config(amp="fp16", grad_clip=0.0, max_steps=200, warmup_steps=0, log_interval=50, eval_interval=0,
                      checkpoint_interval=100)
    with pytest.raises(NonFiniteLossError, match=r"at step 165 .*checkpoint .* \(step 100\) was kept") as err:
        Trainer(TinyMLP(dropout=0.0), _InfGradAlways(bad=0, global_rng=False), cfg, tmp_path / "fp16").fit()
    assert err.value.step == 165
    payload = torch.load(tmp_path / "fp16" / "checkpoint.pt", weights_only=True)
    assert payload["step"] == 100 and payload["scaler"]["scale"] == 2.0 ** (16 - 100)  # every update skipped
    # the float32 run of the same task
    with pytest.raises(NonFiniteLossError, match=r"at step 0 "):
        Trainer(TinyMLP(dropout=0.0), _InfGradAlways(bad=0, global_rng=False),
                tiny_config(**{**cfg.to_dict(), "amp": "off"}), tmp_path / "fp32").fit()
