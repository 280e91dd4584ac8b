"""Review of sitting 47's changes: the call sites of ``_stored_weight`` that the ``owner=`` change missed.

``_stored_weight(module, owner=...)`` reads a replaced module's device and dtype from the model holding it when
the module holds no floating-point tensor (a quantized embedding, a parameter-free patchifier or projection);
the GPT input check, the ViT input cast and the GCN input cast still read the module alone and raised a
TypeError where the twin call sites (GPT.generate, the graph transformer, GIN) ran.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from diffusionformer.models import GCN, DiffusionGPT, DiffusionViT, GCNConfig, GPTConfig, ViTConfig
from tests.reliability.test_edge_probes_user_conventions_47 import _g, _quantize_dynamic


def test_gpt_with_quantized_embeddings_runs():
    """Bug: after ``quantize_dynamic(model, {nn.Embedding: float_qparams_weight_only_qconfig, ...})`` (torch's
    documented embedding quantization) ``DiffusionGPT.forward`` raised "TypeError: Embedding has no tensor 'weight'"
    at its idx-device check, which read ``tok_emb`` alone, while ``generate``'s generator check read the model's
    device (``owner=``) and passed, then failed in the same forward. Now both run."""
    q = _quantize_dynamic()
    from torch.ao.quantization import default_dynamic_qconfig, float_qparams_weight_only_qconfig

    torch.manual_seed(0)
    model = DiffusionGPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16,
                                   tie_weights=False)).eval()
    idx = torch.randint(0, 16, (2, 5), generator=_g())
    ref, _ = model(idx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation
        quantized = q(model, {nn.Embedding: float_qparams_weight_only_qconfig, nn.Linear: default_dynamic_qconfig})
        logits, _ = quantized(idx)
        out = quantized.generate(idx, 2, generator=_g(1))
    assert logits.shape == ref.shape and torch.allclose(logits, ref, atol=0.2)
    assert out.shape == (2, 7)


def test_vit_with_a_parameter_free_patch_embedding_runs():
    """Bug: a ViT whose ``patch_embed`` was replaced by a parameter-free patchifier (``nn.PixelUnshuffle(p)``
    where ``in_channels * p * p == dim``) raised "TypeError: PixelUnshuffle has no tensor 'weight'" at the input
    cast; the graph transformer's and GIN's casts read the model's dtype there. Now float64 images are cast to
    the model's float32, as with the convolution."""
    torch.manual_seed(0)
    model = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, in_channels=1, dim=16, depth=1, num_heads=2,
                                   num_classes=3)).eval()
    model.patch_embed = nn.PixelUnshuffle(4)
    x = torch.randn(2, 1, 8, 8, generator=_g()).double()
    out = model(x)
    assert out.shape == (2, 3) and out.dtype == torch.float32
    assert torch.equal(out, model(x.float()))


def test_gcn_with_a_parameter_free_first_projection_runs():
    """Bug: a GCN whose first convolution's ``lin`` was replaced by ``nn.Identity()`` (a fixed first propagation,
    SGC's) raised "TypeError: Identity has no tensor 'weight'" at the input cast, where GIN's reads the model's
    dtype (``owner=``). Now float64 features are cast to the model's float32."""
    pytest.importorskip("torch_geometric")
    torch.manual_seed(0)
    model = GCN(GCNConfig(in_channels=8, hidden=8, num_classes=3, dropout=0.0)).eval()
    model.convs[0].lin = nn.Identity()
    x = torch.randn(5, 8, generator=_g()).double()
    edges = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])
    out = model(x, edges)
    assert out.shape == (5, 3) and out.dtype == torch.float32
    assert torch.equal(out, model(x.float(), edges))


@pytest.mark.parametrize("kind", ["gelu", "swiglu"])
def test_make_mlp_refuses_a_ratio_that_gives_no_width(kind):
    """Bug: ``make_mlp(kind, 4, 0.1)`` (``int(dim * mlp_ratio) == 0``) raised "Mlp: hidden_dim must be a positive
    int or None, got 0" for ``"gelu"`` (an argument make_mlp does not take) and built a width-1 gated MLP for
    ``"swiglu"``, where ``Block(4, 1, mlp_ratio=0.1, mlp_layer=kind)`` and the configs refuse the ratio. Now both
    refuse it naming ``mlp_ratio``; a ratio giving width 1 still builds (the gated one at least 1 wide)."""
    from diffusionformer.nn import make_mlp

    with pytest.raises(ValueError, match=r"make_mlp: mlp_ratio=0.1 gives an MLP width .* = 0 for dim=4"):
        make_mlp(kind, 4, 0.1)
    assert make_mlp(kind, 4, 0.25).fc2.in_features == 1
