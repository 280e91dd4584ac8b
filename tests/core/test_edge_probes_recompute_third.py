"""Edge probes: recomputation and attention dropout (``ops.recompute``, ``DiffusionAttention(recompute=True)``)
and the random numbers a recomputed forward draws (``analysis.capture``'s recomputed attention maps)."""

from __future__ import annotations

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.analysis.capture import LayerRecorder
from diffusionformer.models import DiffusionGPT, GPTConfig


def test_bug_layer_recorder_attentions_change_the_training_pass():
    """Bug: ``LayerRecorder(attentions=True)`` recomputed each block's attention in its pre-hook with the model's
    attention dropout active (a training pass), drawing from the global generator: every dropout mask the model
    drew afterwards was another, so recording a training pass changed its output and its gradients."""
    torch.manual_seed(0)
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.3,
                                 laplacian_heads=1)).train()
    idx = torch.randint(0, 11, (3, 8))

    def run(record: bool) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(1)
        if record:
            with LayerRecorder(gpt, attentions=True) as rec:
                out = gpt(idx)
            assert set(rec.attentions) == {0, 1}
        else:
            out = gpt(idx)
        logits = out[0] if isinstance(out, tuple) else out
        return logits.detach(), torch.get_rng_state()

    (a, sa), (b, sb) = run(False), run(True)
    assert torch.equal(a, b)
    assert torch.equal(sa, sb)


@pytest.mark.parametrize("heads", ["attention:3,laplacian:3", "attention:4,heat(t=1.0, steps=4):2",
                                   "heat(t=0.5, learnable=True):6"])
def test_recompute_draws_the_same_random_numbers_as_the_plain_layer(heads):
    # the replay in the backward pass draws none: the generator ends where the plain layer leaves it
    torch.manual_seed(0)
    layer = DiffusionAttention(24, 6, heads, causal=True, bias=False, backend="sdpa", dropout=0.25).train()
    x = torch.randn(2, 7, 24, requires_grad=True)

    def run(recompute: bool) -> list[torch.Tensor]:
        layer.recompute = recompute
        layer.zero_grad(set_to_none=True)
        x.grad = None
        torch.manual_seed(3)
        y = layer(x)
        (y**2).sum().backward()
        return [y.detach(), x.grad, torch.get_rng_state()] + [p.grad for p in layer.parameters()]

    for a, b in zip(run(True), run(False)):
        assert torch.equal(a, b)



class _Scale(torch.nn.Module):
    """An output projection that saves ``z`` for an elementwise product (which autocast leaves in float32)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z * self.w


@pytest.mark.parametrize("heads", ["attention:4,heat(t=1.0, steps=4):2", "laplacian:3,ppr(alpha=0.2, steps=3):3"])
def test_bug_a_backward_under_autocast_rebuilds_the_forward_z(heads):
    """Bug: the split path's recipe read autocast's dtype when it ran: a float32 forward whose backward ran inside
    ``torch.autocast`` rebuilt the K-step heads' half of ``z`` rounded through bfloat16, not the forward's ``z``
    (recompute_saved's recipe must rebuild it bit for bit; a projection consuming ``z`` outside autocast's casts,
    here an elementwise scale, got another gradient)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(24, 6, heads, causal=True, bias=False, backend="sdpa").train()
    layer.out_proj = _Scale(24)
    x = torch.randn(2, 7, 24, requires_grad=True)

    def run(recompute: bool) -> list[torch.Tensor]:
        layer.recompute = recompute
        layer.zero_grad(set_to_none=True)
        x.grad = None
        y = layer(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            (y**2).sum().backward()
        return [x.grad] + [p.grad for p in layer.parameters()]

    for a, b in zip(run(True), run(False)):
        assert torch.equal(a, b)
