"""A language-modelling researcher's walk: a tiny ``DiffusionGPT`` trained by the runner on ``pydoc-chars``, read back
with ``load_run``, decoded with the run's recorded vocabulary and sampled as nanoGPT users do, against independent
references (a plain nanoGPT decoding loop, a float64 cross-entropy over the seeded evaluation windows)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from diffusionformer.data import load_dataset
from diffusionformer.data.text import char_text_data
from diffusionformer.experiments import load_experiment_config
from diffusionformer.experiments.reload import load_run
from diffusionformer.experiments.runner import run_dir, run_experiment
from diffusionformer.models import top_p_filter


def _nanogpt_greedy(model, idx, n):
    """nanoGPT's ``generate`` at temperature -> 0: crop to ``block_size``, take the argmax, append."""
    for _ in range(n):
        logits = model(idx[:, -model.config.block_size:])[0][:, -1]
        idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], 1)
    return idx


def test_pins_a_runner_trained_gpt_reloads_decodes_and_scores_as_by_hand(tmp_path):
    """Mixed heads with RoPE, 3 steps: the reloaded model's greedy text (KV cache or not, past ``block_size``)
    equals nanoGPT's loop, seeded sampling is the same with and without the cache, and the runner's train/val losses
    equal a float64 cross-entropy of the loaded model over the same seeded windows (1234, eval_batch_size x
    eval_steps)."""
    cfg = load_experiment_config({
        "name": "lm", "seeds": [0], "operators": [{"name": "mix", "heads": "laplacian:1,heat(steps=2):1"}],
        "tasks": [{"name": "t", "dataset": "pydoc-chars", "model": "gpt-char-tiny", "metric": "val_loss",
                   "eval_batch_size": 5, "model_overrides": {"n_layer": 1, "n_head": 2, "n_embd": 16,
                                                             "block_size": 8, "rope": True},
                   "train": {"max_steps": 3, "batch_size": 4, "lr": 3e-2, "eval_steps": 2}}]})
    run_experiment(cfg, tmp_path, progress=False, log=lambda *_: None)
    rdir = run_dir(tmp_path / "lm", "t", "mix", 0)
    run = load_run(rdir)
    model, itos = run.model, run.preprocessing["itos"]
    stoi = {ch: i for i, ch in enumerate(itos)}
    prompt = torch.tensor([[stoi[ch] for ch in "def f(x):\n"]])  # 10 tokens > block_size 8
    ref = _nanogpt_greedy(model, prompt, 12)
    assert torch.equal(model.generate(prompt, 12, temperature=0), ref)
    assert torch.equal(model.generate(prompt, 12, temperature=0, use_cache=True), ref)
    assert "".join(itos[i] for i in ref[0].tolist()).startswith("def f(x):\n")
    sampled = [model.generate(prompt, 12, temperature=0.8, top_k=5, top_p=0.9, use_cache=cache,
                              generator=torch.Generator().manual_seed(1)) for cache in (False, True)]
    assert torch.equal(*sampled) and not model.training

    record = json.loads((rdir / "run_config.json").read_text())
    data = load_dataset(record["dataset"], seed=record["data_seed"], **record["dataset_options"])
    assert list(data.itos) == itos
    scored = load_run(rdir).model.double()
    for split in ("train", "val"):
        g = torch.Generator().manual_seed(1234)
        losses = []
        for _ in range(2):
            x, y = data.get_batch(split, 5, 8, g)
            losses.append(F.cross_entropy(scored(x)[0].flatten(0, 1), y.flatten()).item())
        assert run.summary["eval"]["metrics"][f"{split}_loss"] == pytest.approx(sum(losses) / 2, rel=1e-6)


def test_bug_top_p_of_one_returns_a_new_tensor():
    """Bug: ``top_p_filter(logits, 1.0)`` handed back the caller's tensor itself (every other ``p``, and
    ``top_k_filter``, return a new one): banning a token in the filtered logits in place (``out[:, bad] = -inf``, as
    a repetition penalty does) also changed the logits the caller kept, for ``p = 1`` only."""
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    kept = logits.clone()
    for p in (0.9, 1.0):
        out = top_p_filter(logits, p)
        out[:, 0] = float("-inf")
        assert torch.equal(logits, kept), p


@pytest.mark.parametrize("ids", [torch.tensor([1.0, 2.0]), np.array([0.0, 1.0]), [1.0]],
                         ids=["float-tensor", "numpy-float", "float-list"])
def test_bug_decode_of_float_ids_says_they_are_floats(ids):
    """Bug: ``decode`` of float ids that all lie in the vocabulary (a float tensor of sampled ids) said "expects
    token ids in [0, 3), got [1.0, 2.0]", as if they were out of range; it now says they are floats."""
    data = char_text_data("toy", "abcabcabca")
    with pytest.raises(ValueError, match=r"got \[.*\] \(float(64)? ids: expected integers"):
        data.decode(ids)
    assert data.decode(torch.as_tensor(ids).long()) == "".join(data.itos[int(i)] for i in ids)
