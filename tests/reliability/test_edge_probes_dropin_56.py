"""Edge probes of a user swapping ``nn.MultiheadAttention`` (and PyG's ``TransformerConv``) for
:class:`~diffusionformer.nn.DiffusionAttention` in an existing model (sitting 56)."""

import pytest
import torch
from torch import nn

from diffusionformer import DiffusionAttention


def test_from_multihead_attention_keeps_the_module_in_eval_mode():
    """Bug: a layer converted from an ``eval()`` MultiheadAttention with dropout came back in training mode, so a
    model converted after ``model.eval()`` dropped attention entries at inference (random outputs, not the
    module's function as the quickstart promises)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True, dtype=torch.float64).eval()
    layer = DiffusionAttention.from_multihead_attention(mha, heads="attention:1,laplacian:1")
    assert not layer.training and not any(m.training for m in layer.modules())
    plain = DiffusionAttention.from_multihead_attention(mha)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(plain(x), mha(x, x, x, need_weights=False)[0], rtol=1e-12, atol=1e-12)
    assert torch.equal(layer(x), layer(x))
    assert DiffusionAttention.from_multihead_attention(mha.train()).training  # a training module stays training


def test_from_transformer_conv_keeps_the_module_in_eval_mode():
    """Bug: as above, for ``from_transformer_conv`` of an ``eval()`` convolution with attention dropout."""
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import TransformerConv

    torch.manual_seed(0)
    conv = TransformerConv(8, 4, heads=2, root_weight=False, dropout=0.5).eval()
    layer = DiffusionAttention.from_transformer_conv(conv)
    assert not layer.training and not any(m.training for m in layer.modules())
    x, edge_index = torch.randn(5, 8), torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2]])
    torch.testing.assert_close(layer(x, edge_index=edge_index), conv(x, edge_index), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, named", [
    ({"kdim": 4, "vdim": 4}, "kdim=4, vdim=4, embed_dim=8"),
    ({"vdim": 6}, "kdim=8, vdim=6, embed_dim=8"),
    ({"add_bias_kv": True}, "add_bias_kv=True"),
    ({"add_zero_attn": True, "add_bias_kv": True}, "add_bias_kv=True; add_zero_attn=True"),
])
def test_from_multihead_attention_refusal_names_the_settings_that_came(kwargs, named):
    """Bug: a MultiheadAttention that cannot convert was refused with the list of every condition
    (``kdim == vdim == embed_dim, no bias_k/bias_v, no add_zero_attn``) but not which of them the module broke."""
    mha = nn.MultiheadAttention(8, 2, batch_first=True, **kwargs)
    with pytest.raises(ValueError, match=r"only MultiheadAttention with .*, got " + named + "$"):
        DiffusionAttention.from_multihead_attention(mha)
