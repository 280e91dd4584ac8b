"""Tests written in a mutation-testing audit of the spectral views and the layer capture (spectral.py, capture.py).

Each test kills a mutant of the library code that the rest of the suite let through (the
docstring of each test names it) and checks the code against an independent reference:
hand-worked values, explicit float64 matrices, the LAPACK eigenvalues of block-diagonal
matrices, the models' own intermediates, or the documented contract (argument checks, shapes,
masks, hook removal, model mode). CPU only, deterministic (seeded generators).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from diffusionformer.analysis import (
    LayerCapture,
    LayerRecorder,
    capture_dataset,
    eigenvalues_of,
    frequency_response,
    pad_by_batch,
    pca_token_rgb,
)
from diffusionformer.models import DiffusionGPT, DiffusionViT, GPTConfig, ViTConfig


def no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.fixture
def vit() -> DiffusionViT:
    torch.manual_seed(0)
    return DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=8, depth=2, num_heads=2))


@pytest.fixture
def gpt() -> DiffusionGPT:
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8))


def _images(n: int, seed: int = 0) -> Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------- spectral: argument checks
def test_frequency_response_refuses_an_empty_polynomial() -> None:
    """kills: frequency_response without the `coeffs.shape[-1] == 0` check (an IndexError from Horner's rule)"""
    with pytest.raises(ValueError, match=r"coeffs must be a tensor of shape \(K\+1,\) or \(G, K\+1\), got \(0,\)"):
        frequency_response(torch.zeros(0), torch.zeros(3))
    with pytest.raises(ValueError, match=r"got \(2, 0\)"):
        frequency_response(torch.zeros(2, 0), torch.zeros(3))


def test_pca_token_rgb_refuses_a_grid_of_three_sides() -> None:
    """kills: pca_token_rgb accepting len(grid_hw) >= 2 (a 3-tuple fails later with an unpacking error)"""
    X = torch.randn(1, 6, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"grid_hw must be a pair of positive ints \(h, w\), got \(2, 3, 1\)"):
        pca_token_rgb(X, (2, 3, 1))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- spectral: eigenvalue order
def _rotation(a: float) -> Tensor:
    return torch.tensor([[0.0, -a], [a, 0.0]], dtype=torch.float64)  # eigenvalues +-i a, real part exactly 0


def test_eigenvalues_with_equal_real_parts_are_ordered_by_decreasing_imaginary_part() -> None:
    """kills: eigenvalues_of without the tie-break by imaginary part; and with it ascending"""
    one = torch.ones(1, 1, dtype=torch.float64)
    # block diagonal: LAPACK returns each conjugate pair (+ first) block by block, i.e. 1, 3, 2 here
    P = torch.block_diag(_rotation(1.0), 0.5 * one, _rotation(3.0), _rotation(2.0), 0.5 * one)
    lam = eigenvalues_of(P)
    expected = [0.5, 0.5, 3j, 2j, 1j, -1j, -2j, -3j]  # real part descending, then imaginary part descending
    assert lam.dtype == torch.complex128
    torch.testing.assert_close(lam, torch.tensor(expected, dtype=torch.complex128), rtol=0, atol=1e-12)
    # batched: each matrix sorted on its own
    both = eigenvalues_of(torch.stack([P, -P]))
    torch.testing.assert_close(both[0], lam)
    expected_neg = [3j, 2j, 1j, -1j, -2j, -3j, -0.5, -0.5]  # -P: the real eigenvalues flip sign and go last
    torch.testing.assert_close(both[1], torch.tensor(expected_neg, dtype=torch.complex128), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- capture: argument checks
class _Blocks(nn.Module):
    """A model whose forward runs each of ``blocks`` in turn (any module list)."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_model_with_no_blocks_is_refused() -> None:
    """kills: _blocks without the `len(blocks) == 0` check (an empty ModuleList accepted)"""
    with pytest.raises(TypeError, match=r"non-empty nn.ModuleList `model.blocks`.*_Blocks with ModuleList"):
        LayerRecorder(_Blocks([]))


def test_layers_must_name_at_least_one_layer(vit: DiffusionViT) -> None:
    """kills: _check_layers without the `if not out` check (layers=[] records nothing)"""
    with pytest.raises(ValueError, match=r"layers must name at least one layer in \[0, 2\], got none"):
        LayerRecorder(vit, layers=[])


def test_layers_refuse_bools_and_accept_one_int(vit: DiffusionViT) -> None:
    """kills: _check_layers without the bool check (True read as layer 1); and without wrapping a bare int"""
    with pytest.raises(ValueError, match=r"layers must hold residual-stream indices.*got True"):
        LayerRecorder(vit, layers=[True])  # type: ignore[list-item]
    assert LayerRecorder(vit, layers=2).layers == [2]
    assert LayerRecorder(vit, layers=-1).layers == [2]
    x = _images(2)
    cap = capture_dataset(vit, [x], layers=1)
    vit.eval()
    with torch.no_grad():
        _, ref = vit.forward_tokens(x, return_intermediates=True)
    assert cap.layers == [1] and torch.equal(cap.states[1], ref.hidden_states[0])


def test_attentions_flag_must_be_a_bool(vit: DiffusionViT) -> None:
    """kills: LayerRecorder without the bool check of `attentions` (attentions=1 accepted as True)"""
    with pytest.raises(TypeError, match="attentions must be a bool, got int"):
        LayerRecorder(vit, attentions=1)  # type: ignore[arg-type]


def test_attentions_need_blocks_with_attn_and_norm1() -> None:
    """kills: LayerRecorder without the check that each recorded block has `attn` and `norm1`"""
    model = _Blocks([nn.Linear(4, 4), nn.Linear(4, 4)])
    with pytest.raises(TypeError, match=r"attentions=True needs blocks with `attn`.*block 0 is a Linear"):
        LayerRecorder(model, attentions=True)
    LayerRecorder(model)  # the states alone need no attention


def test_a_block_returning_a_tuple_is_a_clear_error() -> None:
    """kills: the post-hook without the tensor check of the block output (an AttributeError from .detach)"""

    class Pair(nn.Module):
        def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
            return x, x

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([Pair()])

        def forward(self, x: Tensor) -> Tensor:
            return self.blocks[0](x)[0]

    model = Model()
    with pytest.raises(TypeError, match="block 0 returned tuple; capture expects a tensor"):
        capture_dataset(model, [torch.zeros(2, 3, 4)])
    assert no_hooks(model)


def test_a_forward_that_skips_the_blocks_is_a_clear_error(vit: DiffusionViT) -> None:
    """kills: _Collector.add without the check of missing layers (a KeyError on the first absent state)"""
    with pytest.raises(RuntimeError, match=r"layers \[0, 1, 2\] were not recorded: did the forward call run"):
        capture_dataset(vit, [_images(2)], forward=lambda model, x: x)
    assert no_hooks(vit)


def test_batches_must_all_carry_labels_or_none(vit: DiffusionViT) -> None:
    """kills: _Collector.finish without the mixed-labels check (a TypeError from torch.cat on None)"""
    batches = [(_images(2, 1), torch.tensor([0, 1])), (_images(2, 2), None)]
    with pytest.raises(ValueError, match="either every batch carries labels or none does"):
        capture_dataset(vit, batches)


def test_a_batch_of_three_is_inputs_not_inputs_and_labels(vit: DiffusionViT) -> None:
    """kills: _split_item reading any tuple of length >= 2 as (inputs, labels) (a 3-tuple fails to unpack)"""
    x = _images(3)
    cap = capture_dataset(vit, [(x, x, x)], forward=lambda model, inputs: model(inputs[0]))
    assert cap.labels is None and cap.num_examples == 3


# ---------------------------------------------------------------------------- capture: pad_by_batch
def test_pad_by_batch_without_batch_is_one_full_graph() -> None:
    """kills: pad_by_batch(x, None) returning an all-False mask"""
    x = torch.arange(6.0).reshape(3, 2)
    padded, mask = pad_by_batch(x, None)
    assert torch.equal(padded, x.unsqueeze(0))
    assert mask.dtype == torch.bool and mask.tolist() == [[True, True, True]]


def test_pad_by_batch_refuses_a_float_batch() -> None:
    """kills: pad_by_batch without the floating-point check of `batch` (a bincount RuntimeError)"""
    with pytest.raises(ValueError, match=r"batch must be an integer tensor of shape \(3,\)"):
        pad_by_batch(torch.zeros(3, 1), torch.tensor([0.0, 0.0, 1.0]))


# ---------------------------------------------------------------------------- capture: recording
def test_embeddings_are_recorded_only_when_asked(vit: DiffusionViT) -> None:
    """kills: the block-0 pre-hook storing X^(0) whatever `layers` says"""
    with LayerRecorder(vit, layers=[2]) as rec:
        vit(_images(2))
    assert sorted(rec.states) == [2]


def test_hooks_registered_before_a_failed_registration_are_removed(vit: DiffusionViT,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """kills: LayerRecorder.__enter__ without the clean-up of the hooks it registered before an error"""

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no hooks here")

    monkeypatch.setattr(vit.blocks[1], "register_forward_hook", refuse)
    with pytest.raises(RuntimeError, match="no hooks here"):
        with LayerRecorder(vit):
            pass  # pragma: no cover
    assert no_hooks(vit)  # block 0's pre-hook and forward hook are gone


def test_capture_runs_the_model_in_eval_mode_without_grad(vit: DiffusionViT) -> None:
    """kills: capture_dataset without model.eval(); and without torch.no_grad()"""
    seen: list[tuple[bool, bool]] = []

    def forward(model: nn.Module, x: Tensor) -> Tensor:
        seen.append((any(m.training for m in model.modules()), torch.is_grad_enabled()))
        return model(x)

    vit.train()
    capture_dataset(vit, [_images(2), _images(2, 1)], forward=forward)
    assert seen == [(False, False), (False, False)]
    assert vit.training and torch.is_grad_enabled()


def test_an_empty_batch_is_skipped(vit: DiffusionViT) -> None:
    """kills: capture_dataset without the `n == 0` skip (an empty batch reaches the model)"""
    x = _images(2)
    cap = capture_dataset(vit, [x[:0], (x, torch.tensor([3, 4]))])
    assert cap.num_examples == 2 and cap.extra["num_batches"] == 1
    assert cap.labels.tolist() == [3, 4]


def test_tuple_model_outputs_keep_their_first_tensor(gpt: DiffusionGPT) -> None:
    """kills: _Collector.add keeping the raw output (GPT returns (logits, loss): a TypeError)"""
    idx = torch.randint(0, 11, (3, 6), generator=torch.Generator().manual_seed(1))
    cap = capture_dataset(gpt, [idx], keep_outputs=True)
    gpt.eval()
    with torch.no_grad():
        logits, _ = gpt(idx)
    assert torch.equal(cap.outputs, logits)


def test_dense_sequences_of_different_lengths_are_padded_and_masked(gpt: DiffusionGPT) -> None:
    """kills: _Collector.finish padding the mask with True; labels with 0 instead of -100; attention maps on one
    side only; and _pad_seq padding the last dim instead of `dim`"""
    g = torch.Generator().manual_seed(2)
    long, short = torch.randint(0, 11, (2, 6), generator=g), torch.randint(0, 11, (3, 4), generator=g)
    batches = [(long, torch.roll(long, -1, 1)), (short, torch.roll(short, -1, 1))]
    cap = capture_dataset(gpt, batches, attentions=True)
    assert cap.mask.tolist() == [[True] * 6] * 2 + [[True] * 4 + [False] * 2] * 3
    assert cap.lengths().tolist() == [6, 6, 4, 4, 4]
    assert cap.labels[2:, 4:].eq(-100).all() and torch.equal(cap.labels[2:, :4], torch.roll(short, -1, 1))
    gpt.eval()
    with torch.no_grad():
        _, _, ref = gpt(short, return_intermediates=True)
    assert cap.states[2].shape == (5, 6, 8)
    assert torch.equal(cap.states[2][2:, :4], ref.hidden_states[1]) and cap.states[2][2:, 4:].eq(0).all()
    for P in cap.attentions.values():
        assert P.shape == (5, 2, 6, 6)
        torch.testing.assert_close(P[2:, :, :4].sum(-1), torch.ones(3, 2, 4))  # rows of real tokens sum to 1
        assert P[2:, :, 4:].eq(0).all() and P[2:, :, :, 4:].eq(0).all()  # padding neither attends nor is attended


# ---------------------------------------------------------------------------- capture: LayerCapture
def test_num_attention_examples_is_zero_without_attentions() -> None:
    """kills: LayerCapture.num_attention_examples reading `extra` when no attention was kept"""
    X = torch.zeros(3, 2, 4)
    assert LayerCapture({0: X}, extra={"num_attention_examples": 3}).num_attention_examples == 0
    P = torch.full((3, 1, 2, 2), 0.5)
    assert LayerCapture({0: X}, attentions={0: P}, extra={"num_attention_examples": 3}).num_attention_examples == 3


def test_drop_prefix_zero_returns_the_capture_itself_even_when_padded() -> None:
    """kills: drop_prefix without the `k == 0` shortcut (a padded capture refused, `extra` changed)"""
    X = torch.arange(12.0).reshape(2, 3, 2)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    cap = LayerCapture({0: X}, mask=mask)
    assert cap.drop_prefix(0) is cap
    with pytest.raises(ValueError, match="drop_prefix needs dense, unpadded tokens"):
        cap.drop_prefix(1)  # and any real cut of a padded capture is refused


# ---------------------------------------------------------------------------- capture: graph blocks called directly
class _GraphModel(nn.Module):
    """Two GraphBlocks called as ``block(x, graph)``: no ``batch`` argument, ``graph`` as given."""

    def __init__(self) -> None:
        super().__init__()
        from diffusionformer.models.graph_transformer import GraphBlock

        torch.manual_seed(0)
        self.blocks = nn.ModuleList([GraphBlock(4, 2), GraphBlock(4, 2)])

    def forward(self, x: Tensor, graph: object) -> Tensor:
        for block in self.blocks:
            x = block(x, graph)
        return x


def _edge_softmax_reference(model: _GraphModel, x: Tensor, edge_index: Tensor) -> Tensor:
    """``P_ij = softmax_{j -> i}(q_i . k_j / sqrt(C))`` of block 0, per head, in float64 with explicit loops."""
    block = model.blocks[0]
    H, C = 2, 2
    with torch.no_grad():
        q, k, _ = block.attn.qkv(block.norm1(x)).double().unflatten(-1, (3, H, C)).unbind(-3)  # (N, H, C) each
    src, dst = edge_index
    scores = (q[dst] * k[src]).sum(-1) / C**0.5  # (E, H)
    out = torch.empty_like(scores)
    for i in dst.unique().tolist():
        incoming = dst == i
        out[incoming] = scores[incoming].softmax(dim=0)
    return out


def test_graph_blocks_called_with_a_graph_or_a_bare_edge_index() -> None:
    """kills: _split_block_call passing a bare edge_index `graph` as `graph=` (not `edge_index=`) to the
    attention; and not reading `batch` from an AttentionGraph when the block gets no `batch` argument"""
    from diffusionformer.graph import AttentionGraph

    model = _GraphModel().eval()
    edge_index = torch.tensor([[0, 1, 1, 2, 0, 2, 3, 4, 3, 4], [1, 0, 2, 1, 2, 0, 4, 3, 3, 4]])
    batch = torch.tensor([0, 0, 0, 1, 1])
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    expected = _edge_softmax_reference(model, x, edge_index)
    with LayerRecorder(model, attentions=True) as rec:
        model(x, edge_index)
    assert rec.batch is None and torch.equal(rec.attentions[0].edge_index, edge_index)
    torch.testing.assert_close(rec.attentions[0].attn_weights.double(), expected, rtol=1e-5, atol=1e-6)
    with LayerRecorder(model, attentions=True) as rec:
        model(x, AttentionGraph.sparse(edge_index, 5, batch=batch))
    assert torch.equal(rec.batch, batch)
    torch.testing.assert_close(rec.attentions[0].attn_weights.double(), expected, rtol=1e-5, atol=1e-6)
    assert no_hooks(model)


# ---------------------------------------------------------------------------- defects
def test_labels_of_the_wrong_length_are_refused(vit: DiffusionViT) -> None:
    """Bug: capture_dataset kept labels whose length differed from their batch's, so two such batches
    (2 labels for 3 images, then 4 for 3) gave a capture of 6 examples whose labels are silently shifted."""
    x = _images(3)
    with pytest.raises(ValueError, match=r"labels of batch 0 must have shape \(3,\).*got \(2,\)"):
        capture_dataset(vit, [(x, torch.tensor([0, 1]))])
    with pytest.raises(ValueError, match=r"labels of batch 1 must have shape \(3,\).*got \(4,\)"):
        capture_dataset(vit, [(x, torch.tensor([0, 1, 2])), (x, torch.tensor([0, 1, 1, 0]))])
    with pytest.raises(ValueError, match=r"labels of batch 0 must have shape \(3,\).*got \(\)"):
        capture_dataset(vit, [(x, torch.tensor(1))])
    # a batch cut to fit max_examples cuts its labels too, and right-sized labels pass
    cap = capture_dataset(vit, [(x, torch.tensor([5, 6, 7]))] * 2, max_examples=4)
    assert cap.labels.tolist() == [5, 6, 7, 5]


def test_per_token_labels_must_match_the_sequence_length(gpt: DiffusionGPT) -> None:
    """Bug: per-token labels (B, T') of a batch of length T < T' were silently cropped to T columns
    (a negative pad), and (B, T') with T' < T silently padded with -100."""
    idx = torch.randint(0, 11, (2, 4), generator=torch.Generator().manual_seed(3))
    for width in (6, 3):
        with pytest.raises(ValueError, match=rf"labels of batch 0 must have shape \(2,\) or \(2, 4\).*got \(2, {width}\)"):
            capture_dataset(gpt, [(idx, torch.zeros(2, width, dtype=torch.long))])
    cap = capture_dataset(gpt, [(idx, torch.roll(idx, -1, 1))])
    assert torch.equal(cap.labels, torch.roll(idx, -1, 1))


def test_graph_labels_must_be_one_per_graph_or_one_per_node() -> None:
    """Bug: graph labels that were neither one per graph nor one per node were kept as they came."""
    from torch_geometric.data import Batch, Data

    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, task="graph", dim=8,
                                                             depth=1, num_heads=2))
    g = torch.Generator().manual_seed(4)
    ring = torch.tensor([[0, 1, 2, 1, 2, 0], [1, 2, 0, 0, 1, 2]])
    b = Batch.from_data_list([Data(x=torch.randn(3, 3, generator=g), edge_index=ring) for _ in range(2)])
    with pytest.raises(ValueError, match=r"labels of batch 0 must have shape \(2,\).*one per node \(6,\).*got \(4,\)"):
        capture_dataset(model, [(b, torch.arange(4))])
    assert capture_dataset(model, [(b, torch.tensor([1, 0]))]).labels.tolist() == [1, 0]
    per_node = capture_dataset(model, [(b, torch.arange(6))]).labels
    assert per_node.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_drop_prefix_must_leave_a_token() -> None:
    """Bug: drop_prefix(k) with k >= T returned empty sequences (an obscure 'must be non-empty' error later)."""
    X = torch.arange(12.0).reshape(2, 3, 2)
    cap = LayerCapture({0: X})
    assert torch.equal(cap.drop_prefix(2).states[0], X[:, 2:])
    for k in (3, 5):
        with pytest.raises(ValueError, match=rf"k must leave at least one token: k < T = 3, got {k}"):
            cap.drop_prefix(k)
