"""Edge probes (sitting 42): ``torch.utils.checkpoint`` over layers that read a :class:`LayerState`.

Reference: the same float64 model without checkpointing (outputs and every gradient, bit for bit).
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint as cp

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.nn import DiffusionAttention
from diffusionformer.ops.rivals import LayerState

# the last: a plain first layer (its calls are not recorded) before layers that read its values
SPECS = ["differential:2,neutreno:2", "value-residual:2,attention:2", "differential:4",
         ["attention:4", "neutreno:2,attention:2", "value-residual:4"]]


def _gpt(spec: str) -> DiffusionGPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=17, block_size=16, n_layer=3, n_head=4, n_embd=32, heads=spec)
    return DiffusionGPT(cfg).double()


def _loss_and_grads(model: torch.nn.Module, idx: torch.Tensor, reentrant: bool | None):
    model.zero_grad(set_to_none=True)
    if reentrant is not None:
        for block in model.blocks:
            f = block.forward
            # (reentrant checkpointing takes no keyword arguments: the block's state= goes in a closure)
            block.forward = (lambda f: lambda *a, **k: cp.checkpoint(lambda *b: f(*b, **k), *a,
                                                                     use_reentrant=reentrant))(f)
    try:
        logits = model(idx)[0]
        logits.pow(2).sum().backward()
    finally:
        for block in model.blocks:
            block.__dict__.pop("forward", None)
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_bug_checkpointed_blocks_with_layer_state_heads_get_the_gradients_of_the_plain_model(spec, reentrant):
    """Bug: ``torch.utils.checkpoint`` around GPT blocks with NeuTRENO, value-residual or differential heads gave
    the plain model's outputs but other gradients (up to 24 off in float64): the recomputation inside the backward
    pass entered the pass's ``LayerState`` again, whose depth and first-layer values had moved on (layer 0 read
    its own values as v0, every layer a depth past the model's)."""
    model = _gpt(spec)
    idx = torch.randint(0, 17, (2, 16), generator=torch.Generator().manual_seed(1))
    plain_out, plain = _loss_and_grads(model, idx, None)
    if reentrant and ("neutreno" in str(spec) or "value-residual" in str(spec)):
        # reentrant checkpointing runs the first pass without autograd: the first layer's values those heads read
        # have no graph, so their gradient cannot be had; refused rather than lost
        with pytest.raises(RuntimeError, match="use use_reentrant=False"):
            _loss_and_grads(model, idx, reentrant)
        return
    out, grads = _loss_and_grads(model, idx, reentrant)
    assert torch.equal(out, plain_out)
    assert grads.keys() == plain.keys()
    for name in plain:
        torch.testing.assert_close(grads[name], plain[name], rtol=0, atol=1e-12, msg=name)


def test_bug_checkpointed_layer_called_twice_in_one_pass_refuses_to_guess():
    """Bug (companion): a layer with a state-reading head called twice in one pass (shared weights) under
    checkpointing has two first calls to replay; it raises rather than pick one."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, "differential:2").double()
    x = torch.randn(1, 5, 16, dtype=torch.float64, requires_grad=True)

    def twice(x):
        state = LayerState()
        h = cp.checkpoint(layer, x, state=state, use_reentrant=False)
        return cp.checkpoint(layer, h, state=state, use_reentrant=False)

    y = twice(x)
    with pytest.raises(RuntimeError, match="called more than once in one forward pass"):
        y.sum().backward()
    # without checkpointing the same pass runs, the second call one layer deeper
    state = LayerState()
    layer(layer(x, state=state), state=state).sum().backward()
    assert state.depth == 2


def test_pins_a_copied_state_keeps_its_own_record_of_calls():
    """A ``copy.copy`` of a state (the analysis recomputes P with one) records its calls apart from the original,
    so a layer recomputed from the copy is not taken for a second call of the original's."""
    import copy

    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, "neutreno:2").double()
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    state = LayerState()
    layer(x, state=copy.copy(state))
    assert state._calls == () and state.depth == 0
    layer(x, state=state)
    assert len(state._calls) == 1 and state.depth == 1
