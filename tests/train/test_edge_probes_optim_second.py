"""Edge-case probes (second pass) of the optimiser, the learning-rate schedule and the trainer's fp16 loss scaling.

Probed and found right (not repeated here): tied and frozen parameters in ``param_groups`` (once, first name; frozen
left out), the nanoGPT decay rule, warm-up 0 / warm-up = decay steps / steps past the decay, numpy and non-finite
rates, resume mid-warm-up, RNG capture/restore, the GradScaler state across a resume, gradient accumulation.
"""

from __future__ import annotations

import pytest

from diffusionformer.train import Trainer, cosine_lr
from train_tiny_tasks import RegressionTask, TinyMLP, fp16_supported, tiny_config


@pytest.mark.parametrize("bad", [{"lr": -1e-3}, {"min_lr": -1e-4}, {"lr": -1e-3, "min_lr": -1e-2}])
def test_bug_cosine_lr_refuses_negative_rates(bad):
    """Bug: cosine_lr(..., lr=-1e-3) returned -1e-3 (and a negative min_lr the negative floor) without a word: set on
    an optimizer's groups (which torch's constructors refuse with "Invalid learning rate") it made every update a
    gradient ascent step."""
    kwargs = {**dict(lr=1e-3, min_lr=1e-4, warmup_steps=2, decay_steps=5), **bad}
    name = next(iter(bad))
    with pytest.raises(ValueError, match=rf"cosine_lr: expected {name} a finite float >= 0, got -"):
        cosine_lr(3, **kwargs)
    assert cosine_lr(0, lr=0.0, min_lr=0.0, warmup_steps=0, decay_steps=1) == 0.0  # zero is still a rate


@pytest.mark.skipif(not fp16_supported(), reason="this torch build has no fp16 CPU autocast")
def test_bug_fp16_amp_with_half_parameters_is_named(tmp_path):
    """Bug: amp="fp16" with a model in float16 (``model.half()``) failed at the first update with GradScaler's bare
    "ValueError: Attempting to unscale FP16 gradients.", naming neither amp nor the parameters."""
    model = TinyMLP(dropout=0.0).half()
    cfg = tiny_config(amp="fp16", max_steps=2, eval_interval=0, checkpoint_interval=0)
    with pytest.raises(ValueError, match=r"amp='fp16'.*float16 parameters \['fc1.weight', 'fc1.bias', 'norm.weight'\] "
                                         r"\.\.\.: build the model in float32, or use amp='off'"):
        Trainer(model, RegressionTask(global_rng=False), cfg, out_dir=tmp_path / "run").fit()
    # a float32 model under the same config trains
    Trainer(TinyMLP(dropout=0.0), RegressionTask(global_rng=False), cfg, out_dir=tmp_path / "ok").fit()
