"""``GPT.generate(generator=...)``: a generator on another device than the model is refused before any token is
drawn. No second device is needed to test it: a ``torch.Generator`` subclass reports another device."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.models import DiffusionGPT, GPTConfig


class _ElsewhereGenerator(torch.Generator):
    """A CPU generator that reports the device of a CUDA one (``torch.Generator(device="cuda")`` needs a GPU)."""

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0)


def _model() -> DiffusionGPT:
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))


@pytest.mark.parametrize("use_cache", [False, True])
def test_bug_generator_on_another_device_is_refused_by_name(use_cache):
    """Bug: a CPU generator with a CUDA model (or the reverse) failed inside torch.multinomial at the first draw,
    "Expected a 'cuda' device type for generator but found 'cpu'", naming neither argument."""
    with pytest.raises(ValueError, match=r"generator is on cuda:0 and the model on cpu: .*torch\.Generator\(device='cpu'\)"):
        _model().generate(torch.zeros(1, 2, dtype=torch.long), 3, generator=_ElsewhereGenerator(), use_cache=use_cache)


def test_greedy_decoding_never_draws_so_any_generator_passes():
    model = _model()
    prompt = torch.zeros(1, 2, dtype=torch.long)
    assert torch.equal(model.generate(prompt, 3, temperature=0, generator=_ElsewhereGenerator()),
                       model.generate(prompt, 3, temperature=0))


def test_a_generator_on_the_models_device_samples_reproducibly():
    model, prompt = _model(), torch.zeros(2, 2, dtype=torch.long)
    a = model.generate(prompt, 4, generator=torch.Generator().manual_seed(3))
    b = model.generate(prompt, 4, generator=torch.Generator(device="cpu").manual_seed(3))
    assert torch.equal(a, b)
