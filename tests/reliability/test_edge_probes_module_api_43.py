"""Edge probes: diffusionformer's modules under the standard PyTorch module API (parametrize, prune, dtype
conversion, state dicts, averaged copies, hooks)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize, prune
from torch.nn.utils.parametrizations import spectral_norm, weight_norm

from diffusionformer.models import DiffusionGPT, GPTConfig, create_model
from diffusionformer.nn import DiffusionAttention


def _cfg(**kw) -> GPTConfig:
    return GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=16, **kw)


def _idx() -> torch.Tensor:
    return torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(3))


def _reference_logits(model: DiffusionGPT, idx: torch.Tensor) -> torch.Tensor:
    """The logits from plain torch: the model's own hidden states through an explicit ``x @ W_head^T``."""
    x = model._embed(idx)
    for block in model.blocks:
        x = block(x)
    return model.norm(x) @ model.lm_head.weight.to(x.dtype).T


def test_bug_gpt_weight_norm_on_tied_embedding_survives_dtype_conversion() -> None:
    """Bug: ``weight_norm(model.tok_emb)`` (torch.nn.utils.parametrizations) on a tied DiffusionGPT made every later
    ``model.double()`` / ``.to(...)`` raise "TypeError: cannot assign 'torch.DoubleTensor' as parameter 'weight'":
    the model's ``_apply`` re-tied the head to ``tok_emb.weight``, which under parametrize is a computed tensor."""
    torch.manual_seed(0)
    m = DiffusionGPT(_cfg())
    weight_norm(m.tok_emb, dim=0)
    idx = _idx()
    want = m(idx)[0].double()
    m64 = copy.deepcopy(m).double()
    assert parametrize.is_parametrized(m64.tok_emb, "weight")
    assert m64.tok_emb.weight.dtype == torch.float64 and m64.lm_head.weight.dtype == torch.float64
    got = m64(idx)[0]
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got, _reference_logits(m64, idx), atol=1e-12, rtol=0)


def test_bug_gpt_pruned_embedding_survives_dtype_conversion() -> None:
    """Bug: ``prune.l1_unstructured(model.tok_emb, "weight", ...)`` on a tied DiffusionGPT made ``model.double()`` raise
    "TypeError: cannot assign 'torch.FloatTensor' as parameter 'weight'" (the pruned weight is a plain tensor that
    ``_apply`` tried to assign to the head as its parameter)."""
    torch.manual_seed(0)
    m = DiffusionGPT(_cfg())
    prune.l1_unstructured(m.tok_emb, "weight", amount=0.5)
    m.double()
    idx = _idx()
    logits = m(idx)[0]  # the pre-hook recomputes weight = weight_orig * weight_mask, in float64 now
    assert logits.dtype == torch.float64
    assert m.tok_emb.weight.dtype == torch.float64
    assert int((m.tok_emb.weight == 0).sum()) >= m.tok_emb.weight.numel() // 2
    emb = m.tok_emb.weight_orig * m.tok_emb.weight_mask
    torch.testing.assert_close(m._embed(idx), emb[idx] + m.pos_emb.weight[: idx.shape[1]], atol=0, rtol=0)


def test_bug_gpt_parametrized_embedding_loads_its_own_state_dict() -> None:
    """Bug: with a parametrization on ``tok_emb.weight``, ``model.load_state_dict(model.state_dict())`` raised
    TypeError in the tie post-hook (``_retie_head`` assigned the computed weight as the head's parameter)."""
    torch.manual_seed(0)

    class Double(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return 2 * w

    src = DiffusionGPT(_cfg())
    parametrize.register_parametrization(src.tok_emb, "weight", Double())
    dst = DiffusionGPT(_cfg())
    parametrize.register_parametrization(dst.tok_emb, "weight", Double())
    result = dst.load_state_dict(src.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    idx = _idx()
    torch.testing.assert_close(dst(idx)[0], src(idx)[0], atol=0, rtol=0)
    torch.testing.assert_close(dst.tok_emb.weight, 2 * dst.tok_emb.parametrizations.weight.original, atol=0, rtol=0)


_EDGES = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 0, 4, 5, 3]])  # two triangles: graphs {0, 1, 2} and {3, 4, 5}
_BATCH = torch.tensor([0, 0, 0, 1, 1, 1])


def _preset_case(name: str) -> tuple[nn.Module, nn.Module, tuple]:
    """A preset model in eval mode, the module that first reads its input, and float64 inputs."""
    torch.manual_seed(0)
    m = create_model(name).eval()
    if name == "vit-digits":
        return m, m.patch_embed, (torch.randn(2, 1, 8, 8, dtype=torch.float64),)
    x = torch.randn(6, m.config.in_channels, dtype=torch.float64)
    first = {"gcn-2layer": lambda: m.convs[0].lin, "gin-graph": lambda: m.heads[0],
             "graph-node-small": lambda: m.embed}[name]()
    return m, first, ((x, _EDGES, _BATCH) if name == "gin-graph" else (x, _EDGES))


@pytest.mark.parametrize("name", ["gcn-2layer", "gin-graph", "graph-node-small", "vit-digits"])
def test_bug_pruned_input_layer_follows_dtype_conversion(name: str) -> None:
    """Bug: with ``torch.nn.utils.prune`` on the layer that reads the input (GCN's first conv, GIN's first head, the graph
    transformer's embedding, ViT's patch embedding), ``model.double()`` then a float64 call raised "mat1 and mat2 must
    have the same dtype": the model cast its input to ``layer.weight.dtype``, which under prune is a plain tensor left
    in float32 until the layer's own pre-hook recomputes it, after the cast."""
    m, first, inputs = _preset_case(name)
    ref, ref_first, _ = _preset_case(name)  # the same weights (same seed)
    for module in (first, ref_first):
        prune.l1_unstructured(module, "weight", amount=0.3)
    prune.remove(ref_first, "weight")
    m.double()
    ref.double()  # the same weights, pruned into a plain parameter
    got = m(*inputs)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, ref(*inputs), atol=1e-12, rtol=0)


def _spectral_cases() -> list[str]:
    return ["attention-learned", "gpt-embedding", "gcn-2layer", "gin-graph", "graph-node-small"]


@pytest.mark.parametrize("case", _spectral_cases())
def test_bug_spectral_norm_advances_once_per_forward(case: str) -> None:
    """Bug: the layers read a parametrized weight for its device or dtype (``DiffusionAttention`` with learned heads:
    ``qkv.weight`` in ``_coefficients``; ``DiffusionGPT``: ``tok_emb.weight`` in the idx check; GCN, GIN, graph
    transformer: the first layer's weight to cast ``x``): every read ran the parametrization, so
    ``spectral_norm`` in training mode took two or three power-iteration steps per forward instead of torch's one,
    and the weight used differed from that of the same ``nn.Linear``/``nn.Embedding`` called once."""
    torch.manual_seed(0)
    if case == "attention-learned":
        model: nn.Module = DiffusionAttention(16, 4, heads="heat(t=0.5, learnable=True):2,attention:2")
        target, inputs = model.qkv, (torch.randn(2, 5, 16),)
    elif case == "gpt-embedding":
        model = DiffusionGPT(_cfg(tie_weights=False))
        target, inputs = model.tok_emb, (_idx(),)
    else:
        model, target, inputs = _preset_case(case)
        inputs = tuple(t.float() if t.is_floating_point() else t for t in inputs)
    spectral_norm(target)
    ref = copy.deepcopy(target).train()  # the same parametrized module, alone: one weight computation per call
    model.train()
    model(*inputs)
    width = ref.parametrizations.weight.original.shape[1]
    ref(torch.zeros(1, dtype=torch.long) if isinstance(ref, nn.Embedding) else torch.zeros(1, width))
    sn, sn_ref = target.parametrizations.weight[0], ref.parametrizations.weight[0]
    torch.testing.assert_close(sn._u, sn_ref._u, atol=0, rtol=0)
    torch.testing.assert_close(sn._v, sn_ref._v, atol=0, rtol=0)



def test_bug_dino_update_teacher_names_a_student_parametrized_after_construction():
    """Bug: ``weight_norm`` on the student's head after ``DINO`` was built renamed the parameter
    (``...parametrizations.weight.original0``), and ``update_teacher`` died in a bare ``KeyError`` after
    updating the teacher's earlier entries (half an EMA step); it now refuses before touching the teacher."""
    torch.manual_seed(0)
    model = create_model("dino-digits", depth=1)
    with torch.no_grad():
        for p in model.student.parameters():
            p.add_(1.0)  # student != teacher: an EMA step would move every teacher entry
    before = {k: v.clone() for k, v in model.teacher.named_buffers()}
    linear = [m for m in model.student.head.modules() if isinstance(m, nn.Linear)][-1]
    weight_norm(linear)
    with pytest.raises(ValueError, match="update_teacher: the student no longer has the parameters"):
        model.update_teacher(0.5)
    for k, v in model.teacher.named_buffers():
        assert torch.equal(v, before[k]), k
