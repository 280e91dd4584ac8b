"""The text task's evaluation: train and val loss on one protocol, and their gap."""

from __future__ import annotations

import math

import torch

from diffusionformer.data.text import char_text_data
from diffusionformer.experiments.tasks import TextLMTask
from diffusionformer.models import DiffusionGPT, GPTConfig


def test_gap_is_val_minus_train_on_the_same_windows_as_an_explicit_float64_loop():
    text = "".join(chr(97 + (i * i) % 7) for i in range(3000))
    data = char_text_data("toy", text)
    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=data.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=16)).double()
    task = TextLMTask(data, block_size=8, eval_batch_size=4, eval_batches=3)
    out = task.evaluate(model, None)
    from diffusionformer.experiments.tasks import _EVAL_SEED

    ref = {}
    model.eval()
    for split in ("train", "val"):  # reference: the windows drawn again, cross-entropy from log-softmax
        g = torch.Generator().manual_seed(_EVAL_SEED)
        losses = []
        for _ in range(3):
            x, y = data.get_batch(split, 4, 8, g)
            with torch.no_grad():
                logp = torch.log_softmax(model(x)[0], dim=-1)
            losses.append(-logp.gather(-1, y.unsqueeze(-1)).mean().item())
        ref[split] = sum(losses) / 3
    assert math.isclose(out["train_loss"], ref["train"], rel_tol=1e-9)
    assert math.isclose(out["val_loss"], ref["val"], rel_tol=1e-9)
    assert math.isclose(out["gap_loss"], ref["val"] - ref["train"], rel_tol=1e-9, abs_tol=1e-12)
    assert out["loss"] == out["val_loss"]


def test_bug_text_task_honours_the_configs_eval_batch_size():
    """Bug: the text adapter built ``TextLMTask(data, block)`` whatever ``eval_batch_size`` the config set, so a
    config's evaluation batch was silently 64 windows; unset, it stays 64 (nanoGPT's, the published numbers)."""
    from diffusionformer.experiments.config import TaskConfig
    from diffusionformer.experiments.tasks import ClassificationTask, build_task
    from diffusionformer.data import load_dataset

    text = "".join(chr(97 + (i * i) % 7) for i in range(3000))
    data = char_text_data("toy", text)
    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=data.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=16)).double()
    assert TaskConfig(name="t", dataset="tinyshakespeare", model="gpt-tiny").eval_batch_size is None
    assert build_task(data, model).eval_batch_size == 64
    task = build_task(data, model, eval_batch_size=8)
    assert task.eval_batch_size == 8
    out = task.evaluate(model, 2)
    ref = TextLMTask(data, block_size=8, eval_batch_size=8).evaluate(model, 2)
    assert out == ref and out != TextLMTask(data, block_size=8).evaluate(model, 2)
    digits = load_dataset("digits")
    assert isinstance(build_task(digits, torch.nn.Linear(1, 1)), ClassificationTask)
    assert build_task(digits, torch.nn.Linear(1, 1)).eval_batch_size == 512
