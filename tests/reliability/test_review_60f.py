"""Review 60f of the day's commits: the shared-block call counter of LayerRecorder, the node loader's seeds and the
full-graph metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch_geometric.data import Data

from diffusionformer.analysis import LayerRecorder
from diffusionformer.data.neighbors import neighbor_loader
from diffusionformer.models import DiffusionGPT, GPTConfig


class _CheckpointedGPT(DiffusionGPT):
    """A user's GPT whose forward checkpoints each block (activation checkpointing in training)."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        x = self._embed(idx)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return x


def _shared_gpt(cls: type = DiffusionGPT, depth: int = 3) -> DiffusionGPT:
    torch.manual_seed(0)
    model = cls(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
    model.blocks = nn.ModuleList([model.blocks[0]] * depth)  # one block applied at every depth
    return model.eval()


def _reference(model: DiffusionGPT, ids: torch.Tensor):
    with torch.no_grad():
        _, _, inter = DiffusionGPT.forward(model, ids, return_intermediates=True)
    return [inter.embeddings, *inter.hidden_states]


class _Stop(Exception):
    pass


def test_bug_shared_block_positions_after_a_pass_that_raised():
    """Bug: the calls of a block shared across depth were counted over the whole ``with`` block, so a pass that raised
    after the block's first call (an error in the block, the recorder's own refusal of a KV-cached step) shifted every
    later pass: position 0 recorded the second call (states[0] held X^(1)), silently; each pass now counts from 0."""
    model = _shared_gpt(depth=2)
    ids = torch.randint(0, 11, (2, 8))
    expected = _reference(model, ids)
    with LayerRecorder(model) as rec:
        handle = model.blocks[0].register_forward_hook(lambda *_: (_ for _ in ()).throw(_Stop()))
        with pytest.raises(_Stop):
            model(ids)
        handle.remove()
        model(ids)
        for layer in range(3):
            torch.testing.assert_close(rec.states[layer], expected[layer])
    assert not model._forward_pre_hooks and not model._forward_hooks  # the pass hooks leave with the recorder


def test_bug_shared_block_positions_after_a_pass_that_exited_early():
    """Bug: a model that leaves its loop early (adaptive depth) called its shared block fewer times than it has
    positions, so the next full pass began mid-count and recorded its calls at the wrong depths."""

    class EarlyExit(DiffusionGPT):
        depth: int | None = None

        def forward(self, idx: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            x = self._embed(idx)
            for block in list(self.blocks)[:self.depth]:
                x = block(x)
            return x

    model = _shared_gpt(EarlyExit)
    ids = torch.randint(0, 11, (2, 8))
    expected = _reference(model, ids)
    with LayerRecorder(model) as rec:
        model.depth = 1
        model(ids)
        model.depth = None
        model(ids)
        for layer in range(4):
            torch.testing.assert_close(rec.states[layer], expected[layer])


def test_bug_shared_block_called_again_after_the_blocks_is_not_recorded_as_position_0():
    """Bug: a model that calls its shared block once more after ``model.blocks`` (a refinement step) had that call
    taken as position 0's: states[0] and states[1] held the extra call's input and output."""

    class Refined(DiffusionGPT):
        def forward(self, idx: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            x = self._embed(idx)
            for block in self.blocks:
                x = block(x)
            return self.blocks[0](x)

    model = _shared_gpt(Refined, depth=2)
    ids = torch.randint(0, 11, (2, 8))
    expected = _reference(model, ids)
    with LayerRecorder(model, attentions=True) as rec:
        model(ids)
    for layer in range(3):
        torch.testing.assert_close(rec.states[layer], expected[layer])


def test_bug_checkpoint_recomputation_in_backward_does_not_overwrite_shared_positions():
    """Bug: activation checkpointing recomputes each block inside the backward pass, last block first; those calls
    were counted as more forward calls, so position 0 recorded the recomputation of the last position (states[0] and
    attentions[0] of another depth after ``loss.backward()``). A backward pass is not recorded now."""
    model = _shared_gpt(_CheckpointedGPT)
    ids = torch.randint(0, 11, (2, 8))
    expected = _reference(model, ids)
    with LayerRecorder(model, attentions=True) as rec:
        out = model(ids)
        before = {i: inter.attn_weights.clone() for i, inter in rec.attentions.items()}
        out.sum().backward()
    for layer in range(4):
        torch.testing.assert_close(rec.states[layer], expected[layer])
    for i, weights in before.items():
        torch.testing.assert_close(rec.attentions[i].attn_weights, weights)


def _graph(n: int = 8) -> Data:
    torch.manual_seed(0)
    return Data(x=torch.randn(n, 3), edge_index=torch.randint(0, n, (2, 3 * n)), num_nodes=n)


def _seeds_of(loader) -> list[int]:
    return [i for batch in loader for i in batch.n_id[:batch.batch_size].tolist()]


@pytest.mark.parametrize("make", [
    lambda: np.arange(8)[::-1][:5],  # seeds by descending degree: np.argsort(deg)[::-1]
    lambda: np.arange(8)[::-1][:5].astype(">i8"),  # a big-endian array (read from a file written elsewhere)
    lambda: np.array(list(range(7, 2, -1)), dtype=object),  # ids from a pandas object column
])
def test_bug_numpy_input_nodes_reversed_big_endian_or_object_build_the_loader(make):
    """Bug: numpy ``input_nodes`` were converted with ``torch.tensor``, which refuses a reversed view ("At least one
    stride in the given numpy array is negative") and a big-endian array, and passed an object array on to PyG,
    which failed ("can't convert np.ndarray of type numpy.object_"): the loader was not built for valid node ids."""
    loader = neighbor_loader(_graph(), [2], batch_size=2, input_nodes=make(), force_torch=True)
    assert _seeds_of(loader) == [7, 6, 5, 4, 3]


@pytest.mark.parametrize("seed", [np.int64(3), 3])
def test_bug_a_single_number_as_input_nodes_is_refused_by_its_shape(seed):
    """Bug: a number for ``input_nodes`` failed inside PyG with "Dimension specified as 0 but tensor has no
    dimensions"; now the loader's own error says what shape it expects."""
    with pytest.raises(ValueError, match=r"expected input_nodes of shape \(B,\).*got shape \(\)"):
        neighbor_loader(_graph(), [2], batch_size=2, input_nodes=seed, force_torch=True)


def test_bug_a_heterogeneous_pair_for_a_homogeneous_graph_is_refused_clearly():
    """Bug: ``input_nodes=("paper", ids)`` (PyG's form for a HeteroData) with a homogeneous Data failed inside PyG
    with "too many dimensions 'str'"."""
    with pytest.raises(ValueError, match=r"\(node type, ids\) pair of a HeteroData.*homogeneous Data"):
        neighbor_loader(_graph(), [2], batch_size=2, input_nodes=("paper", torch.tensor([1, 2])), force_torch=True)
