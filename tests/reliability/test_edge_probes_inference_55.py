"""Edge probes (helper 55a): an inference server's use of the models (generation, caches, dtypes, masks, reloads).

Each test names the bug it caught; the probes that found none (cached == uncached generation for every registered
operator, batch invariance, bf16/float16, strict and ``weights_only`` reloads, padded / empty / one-token inputs,
sparse graphs with isolated nodes) are covered by the existing suites.
"""

from __future__ import annotations

import copy

import torch

from diffusionformer.models import DiffusionGPT, GPTConfig


def _inference_tensors(module: torch.nn.Module) -> list[str]:
    return [n for n, t in (*module.named_parameters(), *module.named_buffers()) if t.is_inference()]


def test_bug_crop_block_size_under_inference_mode_leaves_a_loadable_trainable_position_embedding():
    """Bug: ``DiffusionGPT.crop_block_size`` made the cropped position embedding a new parameter; called under
    ``torch.inference_mode()`` (a served model cut to a shorter context) it was an inference tensor, so the next
    ``load_state_dict`` outside inference mode (the cropped checkpoint) failed with "Inplace update to inference
    tensor outside InferenceMode is not allowed", and so did an optimiser step. Now the weight is a normal
    parameter, and the model loads and trains as one cropped outside inference mode (float64, exact)."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=16)
    served = DiffusionGPT(config).double()
    fresh = copy.deepcopy(served)
    with torch.inference_mode():
        served.crop_block_size(4)
    fresh.crop_block_size(4)
    assert _inference_tensors(served) == []
    state = copy.deepcopy(fresh.state_dict())
    served.load_state_dict(state)  # raised
    idx = torch.randint(0, 13, (2, 4))
    for model in (served, fresh):
        model(idx, idx)[1].backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()  # raised for the served model
    for name, value in fresh.state_dict().items():
        assert torch.equal(served.state_dict()[name], value), name
