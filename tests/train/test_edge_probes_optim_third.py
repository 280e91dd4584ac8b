"""Edge-case probes (third pass) of the optimiser construction and of how a resume restores the optimizer.

Probed and found right (not repeated here): ``param_groups`` order (``named_parameters``, no set/dict iteration), a
renamed/added/re-frozen parameter on resume (refused by the strict model load or the group-name check), the per-step
``lr`` of every group, ``lr_decay_steps=None`` with a longer ``max_steps`` on resume (refused), ``warmup_steps >
max_steps`` (refused), ``betas`` reaching AdamW, the decay of learned operator parameters by shape (as documented).
"""

from __future__ import annotations

import torch

from diffusionformer.train import Trainer, build_optimizer, load_checkpoint, save_checkpoint
from train_tiny_tasks import RegressionTask, TinyMLP, tiny_config


def _model() -> TinyMLP:
    torch.manual_seed(0)
    return TinyMLP(dropout=0.0)


def test_bug_resume_keeps_the_kernel_build_optimizer_chose(tmp_path):
    """Bug: a resume loaded the checkpoint's optimizer ``param_groups`` wholesale, the kernel flags included: a run
    written on CUDA (``fused=True``) and continued on the CPU ran torch's fused CPU AdamW instead of the default
    ``build_optimizer`` documents there (and a CPU checkpoint continued on CUDA lost the fused kernel), so the
    continued updates differed in rounding from the ones an optimizer built for the device makes."""
    cfg = tiny_config(max_steps=4, checkpoint_interval=2, eval_interval=0, log_interval=2)
    Trainer(_model(), RegressionTask(global_rng=False), cfg, tmp_path / "ref").fit()
    Trainer(_model(), RegressionTask(global_rng=False), tiny_config(
        max_steps=2, lr_decay_steps=4, checkpoint_interval=2, eval_interval=0, log_interval=2), tmp_path / "run").fit()
    path = tmp_path / "run" / "checkpoint.pt"
    payload = load_checkpoint(path)
    for group in payload["optimizer"]["param_groups"]:  # as a CUDA run writes it
        group["fused"] = True
    save_checkpoint(path, payload)
    trainer = Trainer(_model(), RegressionTask(global_rng=False), cfg, tmp_path / "run", resume=True)
    trainer.fit()
    built = build_optimizer(_model(), cfg, torch.device("cpu"))
    assert [(g["fused"], g["foreach"]) for g in trainer.optimizer.param_groups] == [
        (g["fused"], g["foreach"]) for g in built.param_groups]
    ref = load_checkpoint(tmp_path / "ref" / "checkpoint.pt")["model"]
    got = load_checkpoint(path)["model"]
    assert all(torch.equal(ref[k], got[k]) for k in ref)  # bit-exact with the uninterrupted CPU run
