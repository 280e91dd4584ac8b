"""Review 60h of the day's commits: LayerRecorder's pass-scoped call count (89c3886) outside a call of the model
(``forward_cached``) and for blocks that are not shared; NumPy seeds of the node loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch_geometric.data import Data

from diffusionformer.analysis import LayerRecorder
from diffusionformer.data.neighbors import neighbor_loader
from diffusionformer.models import DiffusionGPT, GPTConfig


def _gpt(cls: type = DiffusionGPT, n_layer: int = 1) -> DiffusionGPT:
    torch.manual_seed(0)
    return cls(GPTConfig(vocab_size=11, block_size=8, n_layer=n_layer, n_head=2, n_embd=16)).eval()


def _stack(model: DiffusionGPT, ids: torch.Tensor, cache: list | None = None) -> list[torch.Tensor]:
    """X^(0..L) of ``model.blocks`` run on ``ids`` by hand (a KV-cached pass with ``cache``)."""
    with torch.no_grad():
        x = model._embed(ids) if cache is None else model._embed(ids, 0)
        states = [x]
        for i, block in enumerate(model.blocks):
            x = block(x) if cache is None else block(x, cache=cache[i])
            states.append(x)
    return states


def _assert_states(rec: LayerRecorder, expected: list[torch.Tensor]) -> None:
    assert sorted(rec.states) == list(range(len(expected)))
    for layer, x in enumerate(expected):
        torch.testing.assert_close(rec.states[layer], x, msg=f"layer {layer}")


def test_bug_a_kv_cached_pass_after_the_recorders_own_refusal_is_recorded_at_each_position():
    """Bug: outside a call of the model (``forward_cached``, ``generate(use_cache=True)``) the calls of a shared block
    cycle through its positions, so the recorder's own refusal of ``attentions=True`` on a cached step (raised at the
    block's first call, already counted) shifted every later cached pass: position 0 recorded the second call, and
    every layer held another depth's tokens, silently. A block call that raises there now ends the count."""
    model = _gpt()
    model.blocks = nn.ModuleList([model.blocks[0]] * 2)  # one block applied at every depth
    ids = torch.randint(0, 11, (2, 8))
    expected = _stack(model, ids, model.new_cache())
    with LayerRecorder(model, attentions=True) as rec:
        with pytest.raises(ValueError, match="KV-cached"):
            model.forward_cached(ids, model.new_cache())
        rec.compute_attentions = False  # the switch between passes
        with torch.no_grad():
            model.forward_cached(ids, model.new_cache())
        _assert_states(rec, expected)
        with torch.no_grad():
            model.forward_cached(ids, model.new_cache())  # and the next cached pass too
        _assert_states(rec, expected)



class _Once(Exception):
    pass


def test_bug_a_block_call_that_raised_and_was_retried_in_the_pass_keeps_the_positions():
    """Bug: a call of a shared block that raised was counted, so a model that catches the error and calls the block
    again (a fallback path) had the retry taken as the next position's call: every later layer shifted by one."""

    class Retrying(DiffusionGPT):
        def forward(self, idx: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            x = self._embed(idx)
            for block in self.blocks:
                try:
                    y = block(x)
                except _Once:
                    y = block(x)
                x = y
            return x

    model = _gpt(Retrying)
    model.blocks = nn.ModuleList([model.blocks[0]] * 3)
    ids = torch.randint(0, 11, (2, 8))
    raised = []

    def fail_once(*_):
        if not raised:
            raised.append(True)
            raise _Once

    with LayerRecorder(model) as rec, torch.no_grad():
        handle = model.blocks[0].register_forward_pre_hook(fail_once)
        model(ids)
        handle.remove()
    assert raised
    _assert_states(rec, _stack(model, ids))

class _TwoInputs(DiffusionGPT):
    """A model that runs its stack on two inputs in one call (two views of a siamese or contrastive model)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:  # type: ignore[override]
        outs = []
        for ids in (a, b):
            x = self._embed(ids)
            for block in self.blocks:
                x = block(x)
            outs.append(x)
        return outs


def test_bug_a_model_running_its_blocks_twice_in_one_call_records_one_input_at_every_layer():
    """Bug: inside a call of the model, calls of a shared block past its last position were ignored, but a block at
    one position recorded every call: a model that runs the stack twice in one call (blocks ``[a, b, a]``) had layers
    0, 1 and 3 of its first input and layer 2 of its second, silently. Every block keeps its first run now."""
    model = _gpt(_TwoInputs, n_layer=2)
    model.blocks = nn.ModuleList([model.blocks[0], model.blocks[1], model.blocks[0]])
    a, b = torch.randint(0, 11, (2, 8)), torch.randint(0, 11, (2, 8))
    with LayerRecorder(model) as rec, torch.no_grad():
        model(a, b)
    _assert_states(rec, _stack(model, a))


def test_bug_an_unshared_block_called_again_after_the_blocks_is_not_recorded_as_position_0():
    """Bug: the count that keeps a refinement call (``self.blocks[0]`` once more after the loop) out of position 0
    was kept for shared blocks only (89c3886): in a model without shared blocks the extra call still overwrote
    states[0] and states[1] with its input and output (X^(L) and blocks[0](X^(L)))."""

    class Refined(DiffusionGPT):
        def forward(self, idx: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            x = self._embed(idx)
            for block in self.blocks:
                x = block(x)
            return self.blocks[0](x)

    model = _gpt(Refined, n_layer=2)
    ids = torch.randint(0, 11, (2, 8))
    with LayerRecorder(model, attentions=True) as ref, torch.no_grad():
        DiffusionGPT.forward(model, ids)  # the plain pass: no refinement call
    with LayerRecorder(model, attentions=True) as rec, torch.no_grad():
        model(ids)
    _assert_states(rec, _stack(model, ids))
    torch.testing.assert_close(rec.attentions[0].attn_weights, ref.attentions[0].attn_weights)
    assert all(len(b._forward_hooks) == len(b._forward_pre_hooks) == 0 for b in model.blocks)
    assert not model._forward_hooks and not model._forward_pre_hooks


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_bug_unsigned_numpy_seeds_build_the_node_loader(dtype):
    """Bug: ``_seeds_as_tensor`` handed a NumPy array of unsigned ids to torch as it was (89c3886 kept its dtype), and
    torch implements no reduction for uint16/32/64: ``neighbor_loader(..., input_nodes=np.arange(3, dtype=np.uint32))``
    failed with ``NotImplementedError: "min_all" not implemented for 'UInt32'``. Unsigned ids are read as int64."""
    data = Data(x=torch.randn(6, 3), edge_index=torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]]),
                y=torch.zeros(6, dtype=torch.long))
    loader = neighbor_loader(data, [2], batch_size=2, input_nodes=np.array([0, 2, 4], dtype=dtype), force_torch=True)
    assert [batch.n_id[:batch.batch_size].tolist() for batch in loader] == [[0, 2], [4]]
    with pytest.raises(ValueError, match="must lie in"):  # an id past the graph still refused by its value
        neighbor_loader(data, [2], batch_size=2, input_nodes=np.array([0, 6], dtype=dtype), force_torch=True)
