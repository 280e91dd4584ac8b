"""Edge probes of the sampling filters (top-k, top-p), DiffusionGPT.generate and the model registry,
against independent references: nanoGPT's top-k, Hugging Face's TopPLogitsWarper and nanoGPT's
sampling loop, written out here in float64."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

from diffusionformer.models.gpt import GPTConfig
from diffusionformer.models.sampling import top_k_filter, top_p_filter


def _nanogpt_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """nanoGPT's generate: ``v, _ = torch.topk(logits, min(k, V)); logits[logits < v[:, [-1]]] = -inf``."""
    v, _ = torch.topk(logits, min(k, logits.size(-1)))
    out = logits.clone()
    out[out < v[..., [-1]]] = -math.inf
    return out


def _hf_top_p_kept(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Hugging Face's TopPLogitsWarper in float64: sorted ascending, tokens whose cumulative probability is
    ``<= 1 - p`` removed, the most likely one always kept. Returns the kept mask."""
    sorted_logits, order = torch.sort(logits.double(), descending=False)
    remove = sorted_logits.softmax(-1).cumsum(-1) <= 1 - p
    remove[..., -1] = False
    return ~remove.scatter(-1, order, remove)


def test_filters_match_nanogpt_and_hugging_face_on_random_rows():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        V = int(torch.randint(1, 40, (1,), generator=g))
        ties = torch.randint(-3, 3, (3, V), generator=g).double()  # many ties at the k-th logit
        k = int(torch.randint(1, 50, (1,), generator=g))  # k > V too
        assert torch.equal(top_k_filter(ties, k), _nanogpt_top_k(ties, k))
        logits = torch.randn(2, 3, V, generator=g, dtype=torch.float64) * 3  # (B, T, V)
        p = float(torch.rand(1, generator=g)) * 0.998 + 0.001
        assert torch.equal(top_p_filter(logits, p).isfinite(), _hf_top_p_kept(logits, p))
        assert torch.equal(top_p_filter(logits[0, 0], p).isfinite(), _hf_top_p_kept(logits[0, 0], p))  # (V,)


def test_filters_leave_the_callers_logits_and_read_non_contiguous_ones():
    logits = torch.randn(7, 4, generator=torch.Generator().manual_seed(1)).t()  # non-contiguous (4, 7)
    before = logits.clone()
    assert torch.equal(top_k_filter(logits, 3), _nanogpt_top_k(logits.contiguous(), 3))
    assert torch.equal(top_p_filter(logits, 0.6).isfinite(), _hf_top_p_kept(logits, 0.6))
    assert torch.equal(logits, before)


def test_bug_top_p_filter_reads_a_fraction_as_the_float_it_equals():
    """Bug: ``top_p_filter`` accepted any ``numbers.Real`` p in (0, 1] (a ``Fraction`` too) and then compared the
    tensor of probability masses with it: ``TypeError: '>=' not supported between instances of 'Tensor' and
    'Fraction'`` (``generate`` cast its ``top_p`` to float first, the public filter did not)."""
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    assert torch.equal(top_p_filter(logits, Fraction(3, 4)), top_p_filter(logits, 0.75))
    assert top_p_filter(logits, Fraction(3, 4)).isfinite().tolist() == [[True, True, False]]


def test_generate_equals_nanogpts_sampling_loop_with_cropping_and_a_generator():
    from diffusionformer.models.registry import create_model

    torch.manual_seed(0)
    model = create_model("gpt-char-tiny", block_size=8, n_layer=1).double()
    idx = torch.randint(0, 65, (2, 11))  # longer than block_size: cropped as nanoGPT crops
    model.train()
    out = model.generate(idx, 6, temperature=0.8, top_k=10, top_p=0.9, generator=torch.Generator().manual_seed(3))
    assert model.training  # the caller's mode is restored
    g, x = torch.Generator().manual_seed(3), idx.clone()
    model.eval()
    with torch.no_grad():
        for _ in range(6):
            logits = _nanogpt_top_k(model(x[:, -8:])[0][:, -1, :] / 0.8, 10)
            logits = logits.masked_fill(~_hf_top_p_kept(logits, 0.9), -math.inf)
            x = torch.cat([x, torch.multinomial(F.softmax(logits, -1), 1, generator=g)], dim=1)
    assert torch.equal(out, x)


@pytest.fixture
def presets(monkeypatch):
    from diffusionformer.models import registry

    monkeypatch.setattr(registry, "_PRESETS", dict(registry._PRESETS))
    return registry


def test_bug_register_model_refuses_a_model_cls_that_cannot_be_called(presets):
    """Bug: ``register_model("x", 3, GPTConfig, ...)`` registered the preset (its defaults were validated, the
    model class was not); ``create_model("x")`` then failed with a bare "'int' object is not callable"."""
    with pytest.raises(TypeError, match=r"preset 'gpt-probe': model_cls must be a model class .*got int 3"):
        presets.register_model("gpt-probe", 3, GPTConfig, vocab_size=8)
    assert "gpt-probe" not in presets.list_models()
