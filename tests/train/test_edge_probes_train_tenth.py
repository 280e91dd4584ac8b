"""Edge-case probes (tenth pass) of the training loop's numerics, single process.

An fp16 run with a GradScaler on the CPU, gradient accumulation and active clipping against a hand-written loop
(torch.amp.GradScaler, clip_grad_norm_ after unscale_, torch.optim.AdamW over param_groups, cosine_lr): same
weights, same scale, and the logged train loss is the plain mean over the log window of the updates' micro-batch
means (batch-weighted, as the Trainer docstring says: ``loss / grad_accum_steps`` per equal micro-batch).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from diffusionformer.train import Trainer
from diffusionformer.train.optim import param_groups
from diffusionformer.train.schedule import cosine_lr
from train_tiny_tasks import RegressionTask, TinyMLP, fp16_supported, tiny_config


@pytest.mark.skipif(not fp16_supported(), reason="this torch build has no fp16 CPU autocast")
def test_fp16_accumulated_clipped_run_matches_a_hand_written_scaler_loop(tmp_path):
    torch.manual_seed(0)
    m0 = TinyMLP(dropout=0.0)
    task = RegressionTask(global_rng=False, target_scale=1e-3)
    cfg = tiny_config(amp="fp16", max_steps=6, grad_accum_steps=2, grad_clip=1e-4, log_interval=3,
                      eval_interval=0, checkpoint_interval=0)
    model = copy.deepcopy(m0)
    summary = Trainer(model, task, cfg, tmp_path / "run").fit()

    ref = copy.deepcopy(m0)
    opt = torch.optim.AdamW(param_groups(ref, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas)
    scaler = torch.amp.GradScaler("cpu")
    gen = torch.Generator().manual_seed(cfg.seed)
    losses = []
    for step in range(cfg.max_steps):
        lr = cosine_lr(step, lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps,
                       decay_steps=cfg.decay_steps)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = task.train_batch(step, gen, cfg.batch_size)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i in range(2):
            x, y = batch["x"][4 * i:4 * i + 4], batch["y"][4 * i:4 * i + 4]
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.mse_loss(ref(x).float(), y)
            scaler.scale(loss / 2).backward()
            total += loss.item() / 2
        losses.append(total)
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], cfg.grad_clip)
        scaler.step(opt)
        scaler.update()

    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=name)
    payload = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert payload["scaler"]["scale"] == scaler.get_scale()
    assert summary["train"]["step"] == 6
    assert summary["train"]["lr"] == cosine_lr(5, lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps,
                                               decay_steps=cfg.decay_steps)
    assert summary["train"]["loss"] == pytest.approx(sum(losses[3:]) / 3, rel=1e-6)
    assert summary["eval"]["step"] == 6  # the last update always evaluates
