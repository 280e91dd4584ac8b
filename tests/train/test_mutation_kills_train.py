"""Tests written by a mutation-testing audit of ``diffusionformer/train``: each kills a mutant that the
existing suite let through, checked against an independent reference (a hand-written training loop,
``random``/``numpy`` themselves, hand-computed values). Each docstring names the mutant it kills."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from train_tiny_tasks import CorruptingEval, InfGradAt, RegressionTask, TinyMLP, fp16_supported, tiny_config

from diffusionformer.train import (
    NonFiniteLossError,
    Trainer,
    capture_rng_state,
    cosine_lr,
    load_checkpoint,
    param_groups,
    read_metrics,
    restore_rng_state,
    save_checkpoint,
    seed_everything,
)

CPU = torch.device("cpu")


def _reference_loop(cfg, task: RegressionTask, model: nn.Module) -> None:
    """Hand-written AdamW loop: what ``Trainer.fit`` must do with one micro-batch and no dropout."""
    generator = torch.Generator().manual_seed(cfg.seed)
    groups = param_groups(model, cfg.weight_decay, cfg.weight_decay_rule)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    params = [p for g in groups for p in g["params"]]
    for step in range(cfg.max_steps):
        lr = cosine_lr(step, lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps,
                       decay_steps=cfg.decay_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = task.train_batch(step, generator, cfg.batch_size)
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(batch["x"]), batch["y"]).backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()


def test_trainer_matches_a_hand_written_adamw_loop_with_the_schedule_on_every_group(tmp_path):
    """Kills T7 (lr set on the first param group only) and T8 (lr never set: constant peak lr);
    also pins warm-up/cosine, clipping and both weight-decay groups against a manual loop."""
    cfg = tiny_config(max_steps=8, warmup_steps=2, min_lr=1e-3, lr=3e-2, weight_decay=0.5, grad_clip=1.0,
                      eval_interval=0, checkpoint_interval=0, log_interval=8)
    seed_everything(0)
    trained = TinyMLP(dropout=0.0)
    seed_everything(0)
    reference = TinyMLP(dropout=0.0)
    Trainer(trained, RegressionTask(global_rng=False), cfg, tmp_path).fit()
    _reference_loop(cfg, RegressionTask(global_rng=False), reference)
    for (name, p), q in zip(trained.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7, msg=name)


def test_an_infinite_gradient_with_clipping_is_caught_at_its_own_update(tmp_path):
    """Kills T6 (with grad_clip > 0 the non-finite clipped norm no longer flags the update: the
    error is then reported one update late, from the NaN loss that the poisoned weights give)."""
    cfg = tiny_config(max_steps=8, grad_clip=1.0, log_interval=4, eval_interval=0, checkpoint_interval=4)
    with pytest.raises(NonFiniteLossError) as info:
        Trainer(TinyMLP(), InfGradAt(5, global_rng=False), cfg, tmp_path).fit()
    assert info.value.step == 5 and info.value.last_checkpoint_step == 4


def test_python_and_numpy_cached_gaussians_are_captured_and_restored():
    """Kills R1 (Python's cached ``random.gauss`` value dropped) and R2 (NumPy's cached Gaussian
    dropped): after a restore the next Gaussian draws must repeat exactly."""
    random.seed(1)
    np.random.seed(1)
    random.gauss(0.0, 1.0)  # leaves the second Box-Muller value cached
    np.random.standard_normal()  # likewise in NumPy's legacy generator
    state = capture_rng_state(CPU)
    first = (random.gauss(0.0, 1.0), float(np.random.standard_normal()))
    restore_rng_state(state, CPU)
    assert (random.gauss(0.0, 1.0), float(np.random.standard_normal())) == first


def test_batch_generator_is_seeded_with_config_seed(tmp_path):
    """Kills T17 (batch generator seeded with a constant instead of ``config.seed``): the first
    batch must be the one drawn from ``torch.Generator().manual_seed(seed)``."""
    seen: list[torch.Tensor] = []

    class Probe(RegressionTask):
        def train_batch(self, step, generator, batch_size):
            batch = super().train_batch(step, generator, batch_size)
            seen.append(batch["x"].clone())
            return batch

    Trainer(TinyMLP(), Probe(global_rng=False), tiny_config(max_steps=1, warmup_steps=0, seed=7), tmp_path).fit()
    expected = torch.randn(8, 4, generator=torch.Generator().manual_seed(7))
    assert torch.equal(seen[0], expected)


@pytest.mark.parametrize(
    "change",
    [dict(weight_decay=0.2), dict(grad_clip=0.5), dict(betas=(0.8, 0.95)), dict(warmup_steps=1),
     dict(min_lr=2e-3), dict(batch_size=4), dict(grad_accum_steps=2), dict(weight_decay_rule="nanogpt")],
)
def test_resume_refuses_every_field_that_changes_the_updates(tmp_path, change):
    """Kills T18 (``weight_decay``/``grad_clip`` wrongly listed in RESUMABLE_FIELDS, so a resume
    silently continues with other hyper-parameters)."""
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=2, lr_decay_steps=10), tmp_path).fit()
    field = next(iter(change))
    with pytest.raises(ValueError, match=rf"{field}: checkpoint"):
        Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=4, lr_decay_steps=10, **change), tmp_path,
                resume=True).fit()


def test_elapsed_time_accumulates_across_a_resume(tmp_path):
    """Kills T19 (``elapsed`` restarts from 0 after a resume instead of adding to the checkpoint's)."""
    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=2, lr_decay_steps=10), tmp_path).fit()
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    ckpt["elapsed"] = 1000.0
    save_checkpoint(tmp_path / "checkpoint.pt", ckpt)
    summary = Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=3, lr_decay_steps=10), tmp_path,
                      resume=True).fit()
    assert summary["elapsed"] >= 1000.0  # the checkpoint's time plus this run's (no bound on wall-clock time)
    assert all(r["elapsed"] >= 1000.0 for r in read_metrics(tmp_path) if r["step"] == 3)


def test_nanogpt_rule_decays_embeddings_and_leaves_out_frozen_parameters():
    """Kills O5 (the nanoGPT rule keeps ``requires_grad=False`` tensors in the decayed group, so
    AdamW would decay frozen weights)."""
    model = nn.ModuleDict({"wte": nn.Embedding(5, 4), "proj": nn.Linear(4, 4), "frozen": nn.Linear(4, 4),
                           "norm": nn.LayerNorm(4)})
    model["frozen"].requires_grad_(False)
    groups = {g["weight_decay"]: g["names"] for g in param_groups(model, 0.1, rule="nanogpt")}
    assert groups == {0.1: ["wte.weight", "proj.weight"], 0.0: ["proj.bias", "norm.weight", "norm.bias"]}


def test_non_finite_parameters_are_never_checkpointed(tmp_path):
    """Kills T23 (the finite-parameters check before saving removed): weights that became
    non-finite without a non-finite loss or gradient must not replace the last good checkpoint."""
    cfg = tiny_config(max_steps=6, eval_interval=2, checkpoint_interval=2, log_interval=2)
    with pytest.raises(NonFiniteLossError, match="non-finite parameters after step 4") as info:
        Trainer(TinyMLP(), CorruptingEval(global_rng=False), cfg, tmp_path).fit()
    assert info.value.last_checkpoint_step == 2
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    assert ckpt["step"] == 2 and all(torch.isfinite(t).all() for t in ckpt["model"].values())


class _SmallLoss(RegressionTask):
    """Loss scaled by 1e-3 so the fp16 gradients times the initial scale 2**16 do not overflow."""

    def loss(self, model, batch):
        loss, metrics = super().loss(model, batch)
        return loss * 1e-3, metrics


@pytest.mark.skipif(not fp16_supported(), reason="this torch build has no fp16 CPU autocast")
def test_fp16_clips_the_unscaled_gradients(tmp_path):
    """Kills T4 (clipping applied before ``GradScaler.unscale_``): the logged norm and the clipped
    ``.grad`` must be those of the true gradients, as in the same update in float32."""
    norms = {}
    for amp in ("off", "fp16"):
        seed_everything(0)
        model = TinyMLP(dropout=0.0)
        cfg = tiny_config(max_steps=1, warmup_steps=0, grad_clip=1e-4, amp=amp)
        Trainer(model, _SmallLoss(global_rng=False), cfg, tmp_path / amp).fit()
        (record,) = [r for r in read_metrics(tmp_path / amp) if r["split"] == "train"]
        after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
        norms[amp] = record["metrics"]["grad_norm"]
        assert after == pytest.approx(1e-4, rel=1e-3)  # clipped to grad_clip in true units
    assert norms["off"] > 1e-3  # clipping was active
    assert norms["fp16"] == pytest.approx(norms["off"], rel=1e-2)


def test_evaluation_runs_under_the_training_autocast(tmp_path):
    """Kills T27 (``task.evaluate`` run without the bf16 autocast the updates use)."""
    dtypes: list[torch.dtype] = []

    class Probe(RegressionTask):
        def evaluate(self, model, max_batches):
            dtypes.append(model(self.x_eval).dtype)
            return {"loss": 0.0}

    cfg = tiny_config(max_steps=2, amp="bf16", eval_interval=1)
    Trainer(TinyMLP(), Probe(global_rng=False), cfg, tmp_path).fit()
    assert dtypes == [torch.bfloat16, torch.bfloat16]


def test_all_reduce_mean_and_min_over_two_ranks(monkeypatch):
    """Kills D2 (``all_reduce_mean`` returns the sum over ranks, not the mean). The collective is
    replaced by a stand-in that adds (or takes the minimum with) the other rank's tensor, so the
    reference is the plain mean/minimum of the two ranks' values."""
    import torch.distributed as dist

    from diffusionformer.train import DistContext

    other = torch.tensor([3.0, -1.0, 10.0])

    def fake_all_reduce(tensor, op=dist.ReduceOp.SUM):
        if op == dist.ReduceOp.MIN:
            torch.minimum(tensor, other, out=tensor)
        else:
            assert op == dist.ReduceOp.SUM
            tensor.add_(other)

    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    ctx = DistContext(0, 2, 0, CPU)
    mine = torch.tensor([1.0, 1.0, 2.0])
    assert torch.equal(ctx.all_reduce_mean(mine), (mine + other) / 2)
    assert torch.equal(ctx.all_reduce_min(mine), torch.minimum(mine, other))
    assert torch.equal(mine, torch.tensor([1.0, 1.0, 2.0]))  # the input is left alone


def test_a_checkpoint_with_a_negative_step_is_refused(tmp_path):
    """Kills C1 (``load_checkpoint`` accepts ``step = -1``: the off-by-one bound ``step < -1``)."""
    from diffusionformer.train import CheckpointError
    from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT

    path = tmp_path / "checkpoint.pt"
    base = {"format": CHECKPOINT_FORMAT, "model": {}, "optimizer": {}, "rng": {}, "config": {}}
    save_checkpoint(path, {**base, "step": 0})
    assert load_checkpoint(path)["step"] == 0
    for bad in (-1, True, 1.0):
        save_checkpoint(path, {**base, "step": bad})
        with pytest.raises(CheckpointError, match=r"expected an int step >= 0"):
            load_checkpoint(path)


def test_resume_refuses_a_checkpoint_of_a_model_with_the_same_shapes_but_another_class(tmp_path):
    """Kills T28 (the model-record comparison on resume disabled: a checkpoint of another model
    class with identical tensor shapes is then loaded silently)."""

    class OtherMLP(TinyMLP):
        pass

    Trainer(TinyMLP(), RegressionTask(), tiny_config(max_steps=2, lr_decay_steps=10), tmp_path).fit()
    with pytest.raises(ValueError, match=r"different model \(class: checkpoint .*TinyMLP, now .*OtherMLP"):
        Trainer(OtherMLP(), RegressionTask(), tiny_config(max_steps=4, lr_decay_steps=10), tmp_path,
                resume=True).fit()


@pytest.mark.skipif(not fp16_supported(), reason="this torch build has no fp16 CPU autocast")
def test_fp16_a_non_finite_loss_is_still_an_error(tmp_path):
    """Kills T29 (the non-finite-loss flag dropped: under fp16 the scaler then skips the NaN
    update as if it were a gradient overflow and the run goes on)."""
    cfg = tiny_config(max_steps=6, amp="fp16", log_interval=1, checkpoint_interval=2, eval_interval=0)
    with pytest.raises(NonFiniteLossError) as info:
        Trainer(TinyMLP(), _SmallLoss(nan_at=3, global_rng=False), cfg, tmp_path).fit()
    assert info.value.step == 3 and info.value.last_checkpoint_step == 2


def test_eval_interval_zero_evaluates_only_after_the_last_update(tmp_path):
    """Kills T30 (``eval_interval = 0`` treated as "every update")."""
    task = RegressionTask()
    Trainer(TinyMLP(), task, tiny_config(max_steps=4, eval_interval=0), tmp_path).fit()
    assert len(task.eval_calls) == 1
    assert [r["step"] for r in read_metrics(tmp_path) if r["split"] == "eval"] == [4]


def test_accumulated_metric_is_the_mean_over_the_micro_batches_that_report_it(tmp_path):
    """Kills T32 (an accumulated metric divided by ``grad_accum_steps`` instead of by how many
    micro-batches reported it): a metric only the first of two micro-batches reports is logged
    as its own value, as the log window does across updates."""

    class Sometimes(RegressionTask):
        calls = 0

        def loss(self, model, batch):
            loss, metrics = super().loss(model, batch)
            Sometimes.calls += 1
            return loss, ({"first": 4.0} if Sometimes.calls % 2 == 1 else {})

    cfg = tiny_config(max_steps=2, grad_accum_steps=2, log_interval=1, eval_interval=0)
    Trainer(TinyMLP(), Sometimes(global_rng=False), cfg, tmp_path).fit()
    logged = [r["metrics"]["first"] for r in read_metrics(tmp_path) if r["split"] == "train"]
    assert logged == [4.0, 4.0]
