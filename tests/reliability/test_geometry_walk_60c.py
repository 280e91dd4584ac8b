"""A researcher's walk through the token-geometry analysis (task 60c): capture of ViT/GPT/graph models, every metric
against a float64 formula written here from its definition, and the edge cases of the capture."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffusionformer.analysis import LayerRecorder, capture_dataset, dirichlet_energy, layer_reports
from diffusionformer.models import DiffusionGPT, GPTConfig


def _gpt(**kw) -> DiffusionGPT:
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=3, n_head=2, n_embd=16, **kw))


def _dirichlet_reference(X: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """``1/2 sum_ij P_ij ||x_i - x_j||^2 / ||X||_F^2`` of one sequence, in float64, by pairwise differences."""
    X, P = X.double(), P.double()
    d2 = (X[:, None, :] - X[None, :, :]).pow(2).sum(-1)
    return 0.5 * (P * d2).sum() / X.pow(2).sum()


@pytest.mark.parametrize("order", [(0, 0, 0), (0, 1, 0)])
def test_bug_capture_of_blocks_shared_across_depth_records_each_position(order):
    """Bug: a model whose ``blocks`` hold one module at several positions (weights shared across depth, as in ALBERT or
    a universal transformer) got every hook of every position on that module, so each call of it overwrote every
    layer: capture_dataset returned the last call's tokens as layers 0..L (the embeddings were X^(L-1)) and the last
    call's attention for every block, silently; now each position records its own call."""
    model = _gpt()
    model.blocks = nn.ModuleList([model.blocks[i] for i in order])  # block 0 applied at two or three depths
    ids = torch.randint(0, 11, (2, 8))
    with torch.no_grad():
        _, _, inter = model(ids, return_intermediates=True)
    cap = capture_dataset(model, [ids], attentions=True)
    torch.testing.assert_close(cap.states[0], inter.embeddings)
    for layer, hidden in enumerate(inter.hidden_states, start=1):
        torch.testing.assert_close(cap.states[layer], hidden)
    # each block's P is the one it diffused over: recomputed from that block's own input
    for i, block in enumerate(model.blocks):
        with torch.no_grad():
            _, own = block.attn(block.norm1(cap.states[i]), return_intermediates=True)
        torch.testing.assert_close(cap.attentions[i], own.attn_weights)
    # and the attention-graph Dirichlet energy of layer l is that of X^(l) on block l-1's P
    reports = layer_reports(cap)
    for layer in (1, 2, 3):
        P = cap.attentions[layer - 1].double().mean(dim=1)
        expected = torch.stack([_dirichlet_reference(cap.states[layer][b], P[b]) for b in range(2)]).mean()
        assert abs(reports[layer].metrics["dirichlet_attention"] - float(expected)) < 1e-10
    # a recorder over several passes in one `with` block records each pass's positions alike
    with LayerRecorder(model, layers=[0, 1, 3]) as recorder:
        for _ in range(2):
            model(ids)
            torch.testing.assert_close(recorder.states[0], inter.embeddings)
            torch.testing.assert_close(recorder.states[1], inter.hidden_states[0])
            torch.testing.assert_close(recorder.states[3], inter.hidden_states[2])
    assert all(not b._forward_hooks and not b._forward_pre_hooks for b in model.blocks)


def test_dirichlet_energy_matches_pairwise_reference_on_captured_attention():
    """The dense path (degrees minus ``tr(X^T P X)``) against pairwise differences, on a causal GPT's own P."""
    model = _gpt()
    cap = capture_dataset(model, [torch.randint(0, 11, (3, 8))], attentions=True)
    X, P = cap.states[2], cap.attentions[1].mean(dim=1)
    got = dirichlet_energy(X, P)
    expected = torch.stack([_dirichlet_reference(X[b], P[b]) for b in range(3)])
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-7)


class _TorchAttentionBlock(nn.Module):
    """A pre-norm block of a user's own model, around torch's nn.MultiheadAttention."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        return x + self.attn(h, h, h, need_weights=False)[0]


class _TorchAttentionModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_TorchAttentionBlock(), _TorchAttentionBlock()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_bug_attentions_of_blocks_without_a_diffusion_attention_name_the_attention():
    """Bug: capture_dataset(..., attentions=True) of blocks whose ``attn`` is another attention (torch's
    nn.MultiheadAttention) passed the check of the blocks (any module named ``attn``) and failed inside the hook with
    "MultiheadAttention.forward() got an unexpected keyword argument 'return_intermediates'", an argument the caller
    never passed; now the TypeError of the check, which says a DiffusionAttention is needed. The states alone are
    captured as before, and a torch.compile'd DiffusionAttention still counts as one."""
    model = _TorchAttentionModel()
    x = torch.randn(2, 5, 8)
    with pytest.raises(TypeError, match=r"DiffusionAttention.*block 0 is a _TorchAttentionBlock whose attn is a "
                                        r"MultiheadAttention"):
        capture_dataset(model, [x], attentions=True)
    assert all(not b._forward_hooks and not b._forward_pre_hooks for b in model.blocks)
    assert capture_dataset(model, [x]).states[2].shape == (2, 5, 8)
    gpt = _gpt()
    gpt.blocks[1].attn = torch.compile(gpt.blocks[1].attn)
    ids = torch.randint(0, 11, (2, 8))
    reference = capture_dataset(_gpt(), [ids], attentions=True)
    cap = capture_dataset(gpt, [ids], attentions=True)
    torch.testing.assert_close(cap.attentions[1], reference.attentions[1])


def test_bug_pad_by_batch_without_batch_refuses_another_number_of_graphs():
    """Bug: pad_by_batch(x, None, num_graphs=3) (the node states of three graphs, with the batch vector of a single
    Data, which is None) returned one padded "graph" of all the nodes and ignored num_graphs without a word (as
    dirichlet_energy refuses num_graphs without batch); now a ValueError. One graph, or no count, is unchanged."""
    from diffusionformer.analysis import pad_by_batch

    x = torch.randn(5, 2)
    with pytest.raises(ValueError, match="batch=None means one graph, but num_graphs=3"):
        pad_by_batch(x, None, num_graphs=3)
    for n in (None, 1):
        padded, mask = pad_by_batch(x, None, n)
        assert padded.shape == (1, 5, 2) and bool(mask.all())


def test_bug_layer_reports_refuses_head_averaged_attention_maps():
    """Bug: a LayerCapture built by hand with head-averaged attention maps ``(A, T, T)`` (not ``(A, H, T, T)`` as
    documented) had them averaged again, over their queries, by dirichlet_attention: for ``A == T`` a wrong energy
    without a word (the mean of the rows of P read as a shared P), otherwise "P must have shape (T, T) ..., got
    (A, T)" about a P the caller never passed; now a ValueError naming capture.attentions and the expected shape.
    Maps of more sequences than ``num_attention_examples`` (the attentions of a capture cut by hand) failed the same
    way; the first ``A`` are measured now."""
    from diffusionformer.analysis import LayerCapture

    torch.manual_seed(0)
    X = torch.randn(4, 4, 3, dtype=torch.float64)
    P = torch.softmax(torch.randn(4, 4, 4, dtype=torch.float64), dim=-1)  # (A, T, T), A == T == 4
    with pytest.raises(ValueError, match=r"capture\.attentions\[0\] must hold one map per head .*\(4, H, 4, 4\), "
                                         r"got \(4, 4, 4\)"):
        layer_reports(LayerCapture({0: X, 1: X + 0.5}, attentions={0: P}, extra={"num_attention_examples": 4}))
    # the documented layout (one head) measures the energy of X^(1) on P
    report = layer_reports(LayerCapture({0: X, 1: X + 0.5}, attentions={0: P[:, None]},
                                        extra={"num_attention_examples": 4}))[1]
    expected = torch.stack([_dirichlet_reference(X[b] + 0.5, P[b]) for b in range(4)]).mean()
    assert abs(report.metrics["dirichlet_attention"] - float(expected)) < 1e-12
    # maps of more sequences than num_attention_examples: the first A are measured (the rest failed as a P of the
    # wrong shape)
    report = layer_reports(LayerCapture({0: X, 1: X + 0.5}, attentions={0: P[:, None]},
                                        extra={"num_attention_examples": 2}))[1]
    expected = torch.stack([_dirichlet_reference(X[b] + 0.5, P[b]) for b in range(2)]).mean()
    assert abs(report.metrics["dirichlet_attention"] - float(expected)) < 1e-12
