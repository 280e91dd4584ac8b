"""Tests written in a second mutation-testing audit of the layer capture, the token-geometry report, the
spectral views and their figures (``analysis/capture.py``, ``report.py``, ``spectral.py``, ``plots.py``).

The first pass is in ``test_mutation_kills_analysis.py`` and ``test_mutation_kills_spectral_capture.py``;
these tests kill fresh mutants that the whole suite (those two files included) let through. Each test's
docstring names the mutant it kills (file and mutation) and checks the code against an independent
reference: attention weights and spectra written out in float64 (explicit softmax, numpy SVD, numpy
least squares), hand-worked values, hand-written figures' numbers, or the documented contract (hook
registration and removal, shapes, masks, error types and messages). Mutants judged equivalent are
listed, with the reason, at the end of the file. CPU only, deterministic (seeded generators), no files.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from diffusionformer.analysis import LayerCapture, LayerRecorder, capture_dataset, layer_reports
from diffusionformer.analysis import report as R
from diffusionformer.models import DiffusionGraphTransformer, DiffusionViT, GraphTransformerConfig, ViTConfig
from diffusionformer.nn import Block


def _no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.fixture
def vit() -> DiffusionViT:
    torch.manual_seed(0)
    return DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=8, depth=2, num_heads=2))


def _images(n: int, seed: int = 0) -> Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def _graph_model(depth: int = 2) -> DiffusionGraphTransformer:
    torch.manual_seed(0)
    return DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, task="graph", dim=8,
                                                            depth=depth, num_heads=2))


def _ring(n: int, seed: int):  # type: ignore[no-untyped-def]
    """One PyG ``Data``: a ring of ``n`` nodes (both directions), 3 random features per node."""
    from torch_geometric.data import Data

    ring = torch.arange(n)
    ei = torch.stack([ring, (ring + 1) % n])
    return Data(x=torch.randn(n, 3, generator=torch.Generator().manual_seed(seed)),
                edge_index=torch.cat([ei, ei.flip(0)], dim=1))


# ============================================================================ capture.py: models and hooks
def test_blocks_must_be_a_module_list() -> None:
    """kills: capture.py _blocks accepting any non-empty `blocks` (a plain list of modules, whose hooks the
    recorder would register on modules that are not part of the model's state)"""

    class Listed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = [nn.Linear(4, 4)]

        def forward(self, x: Tensor) -> Tensor:
            return self.blocks[0](x)

    with pytest.raises(TypeError, match=r"non-empty nn.ModuleList `model.blocks`.*got Listed with list"):
        LayerRecorder(Listed())
    with pytest.raises(TypeError, match=r"got Linear with no attribute `blocks`"):
        LayerRecorder(nn.Linear(2, 2))


class _MaskedBlocks(nn.Module):
    """Two dense ``Block``s called as ``block(x, key_padding_mask=pad)``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([Block(8, 2), Block(8, 2)])

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x, key_padding_mask=pad)
        return x


def _masked_softmax_reference(block: Block, x: Tensor, pad: Tensor) -> Tensor:
    """``P_h = softmax(q_h k_h^T / sqrt(C))`` with padded keys at ``-inf``, in float64, per head."""
    H, C = 2, 4
    with torch.no_grad():
        q, k, _ = block.attn.qkv(block.norm1(x)).double().unflatten(-1, (3, H, C)).unbind(-3)  # (B, T, H, C)
    scores = torch.einsum("bihc,bjhc->bhij", q, k) / math.sqrt(C)
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    return scores.softmax(dim=-1)


def test_recomputed_attention_keeps_the_blocks_key_padding_mask() -> None:
    """kills: capture.py _split_block_call dropping the block's **kwargs (key_padding_mask) from the attention
    it recomputes (padded keys then get attention weight)"""
    model = _MaskedBlocks().eval()
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    pad = torch.tensor([[False, False, False, True, True], [False, False, False, False, True]])
    with LayerRecorder(model, attentions=True) as rec:
        model(x, pad)
    expected = _masked_softmax_reference(model.blocks[0], x, pad)
    P = rec.attentions[0].attn_weights.double()
    torch.testing.assert_close(P, expected, rtol=1e-5, atol=1e-6)
    assert P[0, :, :, 3:].eq(0).all() and P[1, :, :, 4].eq(0).all()
    assert _no_hooks(model)


def test_a_single_data_graph_counts_as_one_graph() -> None:
    """kills: capture.py _num_graphs counting a PyG Data without `num_graphs` as 0 graphs (the batch skipped and
    the capture refused as empty)"""
    data = _ring(4, seed=0)
    cap = capture_dataset(_graph_model(), [data])
    assert cap.num_examples == 1 and cap.states[2].shape == (1, 4, 8) and cap.mask is None
    model = _graph_model().eval()
    with torch.no_grad():
        torch.testing.assert_close(cap.states[0][0], model.embed(data.x))  # X^(0): the embedded nodes


def test_the_recompute_switch_and_reentry_of_a_recorder(vit: DiffusionViT) -> None:
    """kills: capture.py LayerRecorder pre-hook ignoring `compute_attentions` (attention recomputed while
    switched off); and __enter__ without clear() (a reused recorder shows the previous pass's tokens)"""
    vit.eval()
    x = _images(2)
    rec = LayerRecorder(vit, attentions=True)
    with rec:
        vit(x)
    assert sorted(rec.states) == [0, 1, 2] and sorted(rec.attentions) == [0, 1]
    with rec:  # entered again: nothing of the last pass is left before the next forward
        assert rec.states == {} and rec.attentions == {} and rec.batch is None
        rec.compute_attentions = False
        vit(x)
    assert sorted(rec.states) == [0, 1, 2] and rec.attentions == {}
    assert _no_hooks(vit)


def test_recorded_states_are_detached_from_the_graph(vit: DiffusionViT) -> None:
    """kills: capture.py post-hook storing the block output without .detach() (states keep the autograd graph)"""
    vit.eval()
    with LayerRecorder(vit) as rec:
        out = vit(_images(2))
    assert out.requires_grad
    assert all(not s.requires_grad and s.grad_fn is None for s in rec.states.values())


def _count_recomputations(model: nn.Module) -> list[int]:
    """Counts, per block, the attention calls made with ``return_intermediates=True`` (the recorder's)."""
    counts = [0] * len(model.blocks)
    for i, block in enumerate(model.blocks):
        def pre(module: nn.Module, args: tuple, kwargs: dict, i: int = i) -> None:
            counts[i] += bool(kwargs.get("return_intermediates"))
        block.attn.register_forward_pre_hook(pre, with_kwargs=True)
    return counts


def test_attention_is_recomputed_only_while_it_is_kept(vit: DiffusionViT) -> None:
    """kills: capture.py _Collector.add not switching the recomputation off once max_attention_examples are kept;
    and capture_dataset not switching it off for max_attention_examples=0 (the memory/time bound of the docs)"""
    counts = _count_recomputations(vit)
    batches = [_images(2, seed) for seed in range(3)]
    cap = capture_dataset(vit, batches, attentions=True, max_attention_examples=2)
    assert counts == [1, 1] and cap.num_attention_examples == 2 and cap.attentions[0].shape == (2, 2, 5, 5)
    counts[:] = [0, 0]
    cap = capture_dataset(vit, batches, attentions=True, max_attention_examples=0)
    assert counts == [0, 0] and cap.attentions is None and cap.num_attention_examples == 0
    counts[:] = [0, 0]
    cap = capture_dataset(vit, batches, attentions=True, max_attention_examples=3)  # 2 of batch 0, 1 of batch 1
    assert counts == [2, 2] and cap.attentions[1].shape == (3, 2, 5, 5)


def test_layer_capture_views_of_the_layers() -> None:
    """kills: capture.py LayerCapture.hidden_states including X^(0); `embeddings` falling back to another layer
    when layer 0 was not captured; and lengths() of an unpadded capture not in torch.long"""
    X0, X1, X2 = (torch.full((2, 3, 1), float(v)) for v in (0, 1, 2))
    cap = LayerCapture({2: X2, 0: X0, 1: X1})
    assert cap.layers == [0, 1, 2] and cap.embeddings is X0
    assert [h[0, 0, 0].item() for h in cap.hidden_states] == [1.0, 2.0]
    later = LayerCapture({1: X1, 2: X2})
    assert later.embeddings is None and len(later.hidden_states) == 2
    lengths = cap.lengths()
    assert lengths.dtype == torch.long and lengths.tolist() == [3, 3]


def test_drop_prefix_cuts_both_sides_of_the_attention_and_keeps_the_rest() -> None:
    """kills: capture.py LayerCapture.drop_prefix cutting only the query rows of the attention maps; not
    recording `dropped_prefix` in `extra`; and dropping the model outputs"""
    X = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)
    P = torch.arange(2 * 1 * 4 * 4, dtype=torch.float32).reshape(2, 1, 4, 4)
    outputs = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    cap = LayerCapture({0: X}, attentions={0: P}, outputs=outputs, extra={"num_attention_examples": 2, "model": "M"})
    cut = cap.drop_prefix(1)
    assert cut.attentions[0].shape == (2, 1, 3, 3)
    assert cut.attentions[0][0, 0].tolist() == [[5.0, 6.0, 7.0], [9.0, 10.0, 11.0], [13.0, 14.0, 15.0]]
    assert cut.extra == {"num_attention_examples": 2, "model": "M", "dropped_prefix": 1}
    assert cut.outputs is outputs and cut.num_attention_examples == 2
    assert cut.states[0][:, :, 0].tolist() == [[1.0, 2.0, 3.0], [5.0, 6.0, 7.0]]


def test_per_node_labels_are_padded_with_ignore_index() -> None:
    """kills: capture.py _collect_labels padding per-node labels with 0 (a real class) instead of -100"""
    from torch_geometric.data import Batch

    b = Batch.from_data_list([_ring(3, 1), _ring(2, 2)])
    cap = capture_dataset(_graph_model(), [(b, torch.tensor([4, 5, 6, 7, 8]))])
    assert cap.labels.tolist() == [[4, 5, 6], [7, 8, -100]]
    assert cap.mask.tolist() == [[True, True, True], [True, True, False]]


def test_keep_outputs_needs_a_tensor_output(vit: DiffusionViT) -> None:
    """kills: capture.py _Collector.add without the tensor check of the kept output (a dict output crashes in
    .detach with an AttributeError)"""
    with pytest.raises(TypeError, match="keep_outputs needs a tensor output, got dict"):
        capture_dataset(vit, [_images(2)], keep_outputs=True, forward=lambda m, x: {"logits": m(x)})
    assert _no_hooks(vit)
    cap = capture_dataset(vit, [_images(2)], forward=lambda m, x: {"logits": m(x)})  # not kept: any output
    assert cap.outputs is None


def test_a_short_first_batch_is_padded_to_the_longest_later_one() -> None:
    """kills: capture.py _Collector.finish taking T from the first batch (a longer later batch then fails to
    concatenate, or is cropped)"""
    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=8))
    g = torch.Generator().manual_seed(5)
    short, long = torch.randint(0, 11, (1, 3), generator=g), torch.randint(0, 11, (2, 5), generator=g)
    cap = capture_dataset(gpt, [short, long], attentions=True)
    assert cap.states[1].shape == (3, 5, 8) and cap.attentions[0].shape == (3, 2, 5, 5)
    assert cap.mask.tolist() == [[True] * 3 + [False] * 2, [True] * 5, [True] * 5]
    assert cap.lengths().tolist() == [3, 5, 5]


def test_capture_extra_names_the_model_and_counts(vit: DiffusionViT) -> None:
    """kills: capture.py _Collector.finish not recording the model's class name in `extra`"""
    cap = capture_dataset(vit, [_images(2), _images(2, 1)], attentions=True, max_attention_examples=3)
    assert cap.extra == {"num_batches": 2, "model": "DiffusionViT", "num_attention_examples": 3}


def test_capture_limits_are_checked(vit: DiffusionViT) -> None:
    """kills: capture.py _check_capture_limits accepting max_examples=0; and refusing max_attention_examples=0"""
    with pytest.raises(ValueError, match="max_examples must be a positive int, got 0"):
        capture_dataset(vit, [_images(2)], max_examples=0)
    with pytest.raises(ValueError, match="max_attention_examples must be a non-negative int, got -1"):
        capture_dataset(vit, [_images(2)], max_attention_examples=-1)
    assert capture_dataset(vit, [_images(2)], attentions=True, max_attention_examples=0).attentions is None


def test_capture_restores_training_mode_after_an_error(vit: DiffusionViT) -> None:
    """kills: capture.py capture_dataset restoring the model's training mode on success only (an error in the
    forward leaves the model in eval mode)"""
    def boom(model: nn.Module, x: Tensor) -> Tensor:
        model(x)
        raise RuntimeError("boom")

    vit.train()
    with pytest.raises(RuntimeError, match="boom"):
        capture_dataset(vit, [_images(2)], forward=boom)
    assert vit.training and all(m.training for m in vit.modules()) and _no_hooks(vit)


def test_an_iterable_without_batches_is_refused(vit: DiffusionViT) -> None:
    """kills: capture.py capture_dataset without the `count == 0` check (an empty or all-empty `batches` crashes
    later in finish() with an IndexError)"""
    for batches in ([], [_images(0)]):
        with pytest.raises(ValueError, match="capture_dataset got no examples: `batches` was empty"):
            capture_dataset(vit, batches)


def test_float64_models_are_captured_in_float64(vit: DiffusionViT) -> None:
    """kills: capture.py _Collector.add casting a float64 model's states (and attention maps) to float32 (since
    sitting 52 the docs say: CPU, float32, float64 for a float64 model, whose collapse below float32's resolution
    is what it is run in float64 to see); a bf16 model's are float32."""
    vit.double()
    x = _images(2).double()
    cap = capture_dataset(vit, [x], attentions=True)
    assert all(s.dtype == torch.float64 for s in cap.states.values())
    assert all(P.dtype == torch.float64 for P in cap.attentions.values())
    with torch.no_grad():
        _, ref = vit.eval().forward_tokens(x, return_intermediates=True)
    torch.testing.assert_close(cap.states[2], ref.hidden_states[1], rtol=0, atol=0)
    cap = capture_dataset(vit.bfloat16(), [x.bfloat16()], attentions=True)
    assert all(s.dtype == torch.float32 for s in cap.states.values())
    assert all(P.dtype == torch.float32 for P in cap.attentions.values())


# ============================================================================ report.py
def _energy_reference(X: np.ndarray, P: np.ndarray) -> float:
    """``E = 1/2 sum_ij P_ij ||x_i - x_j||^2 / sum_i ||x_i||^2`` of one sequence, with explicit loops."""
    T = X.shape[0]
    e = sum(0.5 * P[i, j] * float(((X[i] - X[j]) ** 2).sum()) for i in range(T) for j in range(T))
    return e / float((X**2).sum())


def test_dirichlet_attention_is_on_the_head_average_of_the_block_below() -> None:
    """kills: report.py _dirichlet_attention reading block `layer` (not `layer - 1`); using head 0 instead of
    the head average; and not returning None when no attention example was kept (A = 0)"""
    g = torch.Generator().manual_seed(3)
    X = {layer: torch.randn(3, 4, 2, generator=g, dtype=torch.float64) for layer in (0, 1, 2)}
    att = {i: torch.rand(2, 2, 4, 4, generator=g, dtype=torch.float64) for i in (0, 1)}  # A = 2 of B = 3, H = 2
    att = {i: P / P.sum(-1, keepdim=True) for i, P in att.items()}
    cap = LayerCapture(X, attentions=att, extra={"num_attention_examples": 2})
    reports = layer_reports(cap)
    assert reports[0].metrics["dirichlet_attention"] is None  # the embeddings: no block below
    for layer in (1, 2):
        P = att[layer - 1].mean(dim=1).numpy()
        x = X[layer].numpy()
        expected = np.mean([_energy_reference(x[b], P[b]) for b in range(2)])
        assert reports[layer].metrics["dirichlet_attention"] == pytest.approx(expected, rel=1e-9)
    no_count = LayerCapture(X, attentions=att)  # attention maps without `num_attention_examples`: A = 0
    assert all(r.metrics["dirichlet_attention"] is None for r in layer_reports(no_count))


def test_sparse_dirichlet_attention_averages_heads_and_graphs() -> None:
    """kills: report.py _dirichlet_attention (sparse) using head 0's edge weights; and summing the energies of
    the graphs instead of averaging them"""
    X = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]], [[3.0, 1.0], [1.0, 1.0], [0.0, 0.0]]],
                     dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, False]])
    edges = torch.tensor([[0, 1, 2, 3], [1, 0, 3, 2]])  # node rows of states[mask]: 0, 1 | 2, 3
    w = torch.tensor([[0.2, 0.6], [1.0, 0.0], [0.5, 0.5], [0.3, 0.1]], dtype=torch.float64)  # (E, H)
    cap = LayerCapture({1: X}, mask=mask, attentions={0: w}, attention_edges={0: edges},
                       extra={"num_attention_examples": 2})
    wbar = w.mean(dim=1).tolist()  # 0.4, 0.5, 0.5, 0.2
    # graph 0: x0=(1,0), x1=(0,2): ||x0-x1||^2 = 5, ||X||^2 = 5; graph 1: (3,1),(1,1): 4, ||X||^2 = 12
    e0 = 0.5 * (wbar[0] + wbar[1]) * 5 / 5
    e1 = 0.5 * (wbar[2] + wbar[3]) * 4 / 12
    assert layer_reports(cap)[0].metrics["dirichlet_attention"] == pytest.approx((e0 + e1) / 2, rel=1e-12)



def test_sparse_dirichlet_attention_of_graphs_of_unequal_size() -> None:
    """kills: report.py _dirichlet_attention (sparse) numbering the graphs of the nodes backwards
    (`repeat_interleave(lengths[:A]).flip(0)`): with graphs of 3 and 1 nodes, node 0 would fall in graph 1"""
    X = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], [[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]]],
                     dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    edges = torch.tensor([[0, 1, 1, 2, 3], [1, 0, 2, 1, 3]])  # node rows of states[mask]: 0, 1, 2 | 3
    w = torch.tensor([[0.2, 0.6], [1.0, 0.0], [0.5, 0.5], [0.3, 0.1], [0.9, 0.7]], dtype=torch.float64)
    cap = LayerCapture({1: X}, mask=mask, attentions={0: w}, attention_edges={0: edges},
                       extra={"num_attention_examples": 2})
    wbar = w.mean(dim=1).tolist()  # 0.4, 0.5, 0.5, 0.2, 0.8
    # graph 0: ||x0-x1||^2 = 5, ||x1-x2||^2 = 2, ||X||^2 = 1 + 4 + 2 = 7; graph 1: a self-loop only -> 0
    e0 = 0.5 * ((wbar[0] + wbar[1]) * 5 + (wbar[2] + wbar[3]) * 2) / 7
    assert layer_reports(cap)[0].metrics["dirichlet_attention"] == pytest.approx((e0 + 0.0) / 2, rel=1e-12)


def test_spectrum_summaries_of_a_two_dimensional_token_space() -> None:
    """kills: report.py _spectrum_summary asking energy_top_k for k = 3 when fewer than 3 singular values exist;
    and fitting a power law to a rank-2 spectrum (2 points: needs r >= 3)"""
    g = torch.Generator().manual_seed(4)
    X = torch.randn(2, 5, 2, generator=g, dtype=torch.float64)
    m = layer_reports(LayerCapture({0: X}))[0].metrics
    x = X.numpy()
    s = np.linalg.svd((x - x.mean(axis=1, keepdims=True)).reshape(-1, 2), compute_uv=False)
    assert m["energy_top3"] == pytest.approx(1.0, rel=1e-12)  # all energy in <= 3 directions
    assert m["stable_rank"] == pytest.approx((s**2).sum() / s[0] ** 2, rel=1e-9)
    assert m["power_law_alpha"] is None


def test_power_law_alpha_ignores_the_numerically_zero_tail() -> None:
    """kills: report.py _spectrum_summary fitting all min(N, D) singular values (the round-off tail of a
    rank-deficient spectrum included) instead of the r above 1e-6 * s_1"""
    g = torch.Generator().manual_seed(5)
    T, D = 5, 6  # one sequence: centred rank T - 1 = 4, a fifth singular value at round-off level
    X = torch.randn(1, T, D, generator=g, dtype=torch.float64)
    report = layer_reports(LayerCapture({0: X}))[0]
    x = X[0].numpy()
    s = np.linalg.svd(x - x.mean(axis=0), compute_uv=False)
    assert s[4] < 1e-12 * s[0]
    slope = np.polyfit(np.log(np.arange(1, 5)), np.log(s[:4] ** 2), 1)[0]
    assert report.metrics["power_law_alpha"] == pytest.approx(-slope, rel=1e-9)


def test_length_one_sequences_count_in_the_per_sequence_means() -> None:
    """kills: report.py _mean_per_sequence keeping sequences longer than min_len (not at least min_len): a
    one-token sequence's within-variance (0) dropped from the mean; and mean_cosine with min_len=1 (a single
    token's 'pairwise cosine' counted)"""
    X = torch.tensor([[[1.0, 0.0], [3.0, 0.0]], [[5.0, 5.0], [0.0, 0.0]]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    m = layer_reports(LayerCapture({0: X}, mask=mask))[0].metrics
    # sequence 0: tokens (1,0),(3,0): mean (2,0), (1/T)||C X||^2 = (1 + 1)/2 = 1; sequence 1: one token -> 0
    assert m["within_variance"] == pytest.approx(0.5, rel=1e-12)
    assert m["mean_cosine"] == pytest.approx(1.0, rel=1e-12)  # only sequence 0 has a pair: cos = 1


def test_variance_ratio_of_identical_tokens_is_zero() -> None:
    """kills: report.py _variance_ratio returning 1 (not 0) when the total variance is 0"""
    X = torch.full((2, 3, 2), 1.5, dtype=torch.float64)
    m = layer_reports(LayerCapture({0: X}))[0].metrics
    assert m["variance_ratio"] == 0.0 and m["within_variance"] == 0.0


def test_probe_thresholds_of_the_report() -> None:
    """kills: report.py _seq_probe_acc probing fewer than 4 sequences; _token_probe_acc probing fewer than 4
    tokens; and _probe running the probe on a single class (linear_probe_accuracy then raises)"""
    g = torch.Generator().manual_seed(6)
    X = torch.randn(3, 2, 2, generator=g, dtype=torch.float64)
    for seed in range(8):  # whatever the split, 3 sequences are too few to probe
        m = layer_reports(LayerCapture({0: X}, labels=torch.tensor([0, 1, 0])), probe_seed=seed)[0].metrics
        assert m["seq_probe_acc"] is None and m["nc1"] is not None
    tok = torch.tensor([[0, 1], [-100, -100], [-100, 1]])  # 3 labelled tokens
    assert layer_reports(LayerCapture({0: X}, labels=tok))[0].metrics["token_probe_acc"] is None
    one_class = torch.tensor([[1, 1], [1, 1], [1, -100]])
    m = layer_reports(LayerCapture({0: X}, labels=one_class))[0].metrics
    assert m["token_probe_acc"] is None and m["token_nc1"] is None


def test_token_nc1_drops_classes_with_a_single_token() -> None:
    """kills: report.py _token_nc1 calling next_token_nc1 with min_count=1 (a class of one token kept); and
    counting the classes for the None test with min_count=1"""
    X = torch.tensor([[[0.0, 0.0], [2.0, 0.0], [0.0, 4.0]], [[0.0, 6.0], [9.0, 9.0], [1.0, 0.0]]],
                     dtype=torch.float64)
    y = torch.tensor([[0, 0, 1], [1, 2, -100]])  # class 2 has one token: dropped
    H = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 4.0], [0.0, 6.0]], dtype=torch.float64)
    c = torch.tensor([0, 0, 1, 1])
    # NC1 = tr(S_W S_B^+) / C by hand: class means (1,0), (0,5); S_W = diag(1, 1) / 2; S_B rank 1 along (1,-5)
    mu = H.mean(0)
    means = torch.stack([H[c == k].mean(0) for k in (0, 1)])
    S_W = sum(torch.outer(h - means[k], h - means[k]) for h, k in zip(H, c.tolist())) / 4
    S_B = sum(torch.outer(m_ - mu, m_ - mu) for m_ in means) / 2
    expected = float(torch.trace(S_W @ torch.linalg.pinv(S_B)) / 2)
    assert layer_reports(LayerCapture({0: X}, labels=y))[0].metrics["token_nc1"] == pytest.approx(expected, rel=1e-9)
    lone = torch.tensor([[0, 0, 1], [-100, 2, -100]])  # classes of >= 2 tokens: only class 0
    assert layer_reports(LayerCapture({0: X}, labels=lone))[0].metrics["token_nc1"] is None


def test_anova_fractions_are_in_their_documented_order_and_of_real_tokens_only() -> None:
    """kills: report.py registering anova_between_sequence_fraction with the between-class share; and measuring
    the ANOVA on a padded capture with the padding counted as tokens (since sitting 52 the real tokens' split)"""
    X = torch.tensor([[[0.0], [2.0]], [[4.0], [4.0]], [[10.0], [12.0]], [[10.0], [10.0]]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1])
    m = layer_reports(LayerCapture({0: X}, labels=y))[0].metrics
    # grand mean 6.5; within: 1+1+0+0+1+1+0+0 = 4; sequence means 1, 4, 11, 10 vs class means 2.5, 10.5:
    # between sequences 2 * (1.5^2 + 1.5^2 + 0.5^2 + 0.5^2) = 10; between classes 4 * (4^2 + 4^2) = 128
    total = 4 + 10 + 128
    assert m["anova_within_fraction"] == pytest.approx(4 / total, rel=1e-12)
    assert m["anova_between_sequence_fraction"] == pytest.approx(10 / total, rel=1e-12)
    assert m["anova_between_class_fraction"] == pytest.approx(128 / total, rel=1e-12)
    padded = layer_reports(LayerCapture({0: X}, mask=torch.tensor([[True, True]] * 3 + [[True, False]]), labels=y))
    # the last sequence holds one real token (10): tokens 0 2 4 4 10 12 10, grand mean 6, total 128; within
    # 2 + 0 + 2 + 0 = 4; sequence means 1, 4, 11, 10 vs class means 2.5 (4 tokens) and 32/3 (3 tokens): between
    # sequences 2 (1.5^2) + 2 (1.5^2) + 2 (1/3)^2 + (2/3)^2 = 9 + 2/3; between classes 4 (3.5^2) + 3 (14/3)^2
    # = 49 + 196/3
    within, between_seq, between_class = 4, 9 + 2 / 3, 49 + 196 / 3
    total = within + between_seq + between_class
    assert total == pytest.approx(128, rel=1e-12)
    assert padded[0].metrics["anova_within_fraction"] == pytest.approx(within / total, rel=1e-12)
    assert padded[0].metrics["anova_between_sequence_fraction"] == pytest.approx(between_seq / total, rel=1e-12)
    assert padded[0].metrics["anova_between_class_fraction"] == pytest.approx(between_class / total, rel=1e-12)


def test_nc2_metrics_read_their_own_attributes() -> None:
    """kills: report.py registering nc2_equinorm with the collapse's equiangularity"""
    from diffusionformer.analysis import neural_collapse

    g = torch.Generator().manual_seed(7)
    X = torch.randn(6, 2, 3, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    m = layer_reports(LayerCapture({0: X}, labels=y))[0].metrics
    means = X.mean(dim=1)
    centres = torch.stack([means[y == k].mean(0) for k in range(3)]) - means.mean(0)
    norms = centres.norm(dim=1)
    assert m["nc2_equinorm"] == pytest.approx(float(norms.std(unbiased=False) / norms.mean()), rel=1e-9)  # CV of the norms
    nc = neural_collapse(means, y)
    assert m["nc2_equiangularity"] == pytest.approx(nc.equiangularity, rel=1e-12)


def test_report_types_and_dtypes() -> None:
    """kills: report.py layer_reports raising ValueError (not TypeError) for a non-capture; returning the
    singular values in float64 (LayerReport keeps them in float32, like the capture)"""
    with pytest.raises(TypeError, match="capture must be a LayerCapture, got dict"):
        layer_reports({0: torch.zeros(1, 2, 2)})  # type: ignore[arg-type]
    X = torch.randn(3, 4, 2, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    assert layer_reports(LayerCapture({0: X}))[0].singular_values.dtype == torch.float32



def test_an_empty_graph_has_a_zero_mean_and_is_never_handed_to_a_metric() -> None:
    """kills: report.py _sequence_means dividing by the raw token count (an empty graph's mean 0/0 = NaN, not
    the zero the LayerView documents and _sequences relies on); and _groups without the `n == 0` skip (an empty
    (b, 0, D) block handed to a per-sequence metric function)"""
    X = torch.tensor([[[1.0, 2.0], [3.0, 6.0], [9.0, 9.0]], [[7.0, 7.0], [7.0, 7.0], [7.0, 7.0]],
                      [[4.0, 0.0], [9.0, 9.0], [9.0, 9.0]]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, False]])  # graph 1 is empty
    cap = LayerCapture({0: X}, mask=mask)
    v = R.LayerView(cap, 0, cap.lengths(), None, None, None, 0)
    assert v.lengths.tolist() == [2, 0, 1]
    assert v.means.tolist() == [[2.0, 4.0], [0.0, 0.0], [4.0, 0.0]]  # hand-worked; the empty graph's mean is 0
    seen: list[tuple[int, ...]] = []

    def length(g: Tensor) -> Tensor:
        seen.append(tuple(g.shape))
        return torch.full((g.shape[0],), float(g.shape[1]), dtype=torch.float64)

    # min_len=0 lets every non-empty length through; the empty graph is still not a sequence to measure
    assert v.per_sequence(length, min_len=0) == pytest.approx(1.5, rel=1e-12)  # lengths 2 and 1
    assert sorted(seen) == [(1, 1, 2), (1, 2, 2)]



def test_unregister_metric_returns_the_metric_it_removed() -> None:
    """kills: report.py unregister_metric dropping the metric without returning it (its docstring: "remove
    metric ``key`` ... and return it"; the returned Metric lets a caller put a built-in back)"""

    def first_norm(v: R.LayerView) -> float:
        return float(v.tokens[0].norm())

    R.register_metric("test_first_norm", group="smoothing", label="norm of token 0", logy=True)(first_norm)
    try:
        assert "test_first_norm" in [m.key for m in R.list_metrics("smoothing")]
    finally:
        removed = R.unregister_metric("test_first_norm")
    assert isinstance(removed, R.Metric)
    assert (removed.key, removed.fn, removed.group, removed.label, removed.logy) == (
        "test_first_norm", first_norm, "smoothing", "norm of token 0", True)
    assert "test_first_norm" not in [m.key for m in R.list_metrics()]
    X = torch.tensor([[[3.0, 4.0]]], dtype=torch.float64)
    assert "test_first_norm" not in layer_reports(LayerCapture({0: X}))[0].metrics


# ============================================================================ spectral.py
def test_spectrum_summaries_of_unsorted_values_and_negative_ones() -> None:
    """kills: spectral.py _check_spectrum tolerating slightly negative values; and stable_rank dividing by the
    first value instead of the largest (the docs: any order)"""
    from diffusionformer.analysis.spectral import effective_rank, stable_rank

    with pytest.raises(ValueError, match=r"s must hold non-negative singular values, got min -0.0001"):
        effective_rank(torch.tensor([1.0, -1e-4], dtype=torch.float64))
    s = torch.tensor([1.0, 3.0, 2.0], dtype=torch.float64)
    assert stable_rank(s).item() == pytest.approx(14 / 9, rel=1e-12)


def test_power_law_exponent_on_a_trimmed_range() -> None:
    """kills: spectral.py power_law_exponent ranking the trimmed values 1..n (not start..stop); and slicing one
    value past `stop`"""
    from diffusionformer.analysis.spectral import power_law_exponent

    g = np.random.default_rng(0)
    s = np.sort(g.uniform(0.1, 2.0, size=9))[::-1].copy()
    for start, stop in ((3, 7), (2, 5), (1, 4)):
        ranks = np.arange(start, stop + 1)
        slope = np.polyfit(np.log(ranks), np.log(s[start - 1 : stop] ** 2), 1)[0]
        got = power_law_exponent(torch.from_numpy(s), start=start, stop=stop).item()
        assert got == pytest.approx(-slope, rel=1e-10)


def test_pca_map_of_a_non_square_grid_is_row_major() -> None:
    """kills: spectral.py pca_token_rgb reshaping the patch grid as (w, h) and transposing it back (column-major
    tokens for h != w)"""
    from diffusionformer.analysis import pca_token_rgb

    t = torch.arange(6.0, dtype=torch.float64).reshape(1, 6, 1) * torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    rgb = pca_token_rgb(t, (2, 3))
    assert rgb.shape == (1, 3, 2, 3)
    np.testing.assert_allclose(rgb[0, 0].numpy(), np.arange(6.0).reshape(2, 3) / 5, atol=1e-12)


def test_frequency_response_at_complex_points_and_eigenvalue_precision() -> None:
    """kills: spectral.py frequency_response ignoring complex `lambdas` (real coefficients: evaluated in float64,
    the imaginary parts dropped); the (L,) check of `lambdas`; and eigenvalues_of computing in float32 for float32 P"""
    from diffusionformer.analysis import eigenvalues_of, frequency_response

    lam = torch.tensor([1j, 0.5 + 0.5j], dtype=torch.complex128)
    f = frequency_response(torch.tensor([1.0, -1.0, 2.0]), lam)  # 1 - z + 2 z^2
    expected = np.array([1 - z + 2 * z * z for z in (1j, 0.5 + 0.5j)])
    assert f.dtype == torch.complex128
    np.testing.assert_allclose(f.numpy(), expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"lambdas must be a tensor of shape \(L,\), got \(2, 2\)"):
        frequency_response(torch.tensor([0.0, 1.0]), torch.zeros(2, 2))
    P = torch.tensor([[0.9, 0.1], [0.3, 0.7]], dtype=torch.float32)
    lam = eigenvalues_of(P)
    assert lam.dtype == torch.complex128
    ref = np.sort(np.linalg.eigvals(P.double().numpy()))[::-1]
    np.testing.assert_allclose(lam.real.numpy(), ref, rtol=0, atol=1e-15)


# ============================================================================ plots.py
def test_plots_draw_what_they_are_given() -> None:
    """kills: plots.py _to_image transposing colour images (permute(2, 1, 0)) or scaling by the maximum only;
    titles on every row; per-head lines of plot_frequency_response all labelled with the operator's name;
    the zero line of the response dropped; plot_metric_by_depth points at x = 1..L; a log axis for an all-zero
    metric; plot_spectra keeping zeros, normalising by the sum, not sorting, a linear x axis, or the
    normalised y label when not normalised"""
    pytest.importorskip("matplotlib")
    from diffusionformer.analysis import (plot_frequency_response, plot_metric_by_depth, plot_pca_token_maps,
                                          plot_spectra)

    img = torch.arange(2 * 3 * 2 * 4, dtype=torch.float32).reshape(2, 3, 2, 4) + 10.0  # non-square, offset
    maps = {"m": torch.rand(2, 3, 2, 2, generator=torch.Generator().manual_seed(0))}
    fig = plot_pca_token_maps(img, maps, max_images=2)
    shown = np.asarray(fig.axes[0].images[0].get_array())
    x = img[0].permute(1, 2, 0).double().numpy()
    np.testing.assert_allclose(shown, (x - x.min()) / (x.max() - x.min()), atol=1e-12)
    assert [ax.get_title() for ax in fig.axes] == ["input", "m", "", ""]

    ax = plot_frequency_response({"op": torch.tensor([[0.0, 1.0], [1.0, -1.0]])}, num_points=3)
    assert ax.get_legend_handles_labels()[1] == ["op[0]", "op[1]"]
    assert ax.lines[1].get_ydata().tolist() == [2.0, 1.0, 0.0]
    assert len(ax.lines) == 3 and list(ax.lines[2].get_ydata()) == [0.0, 0.0]  # the zero line

    ax = plot_metric_by_depth({"a": [0.0, 0.0], "b": [0.0, 0.0]}, "v", logy=True)
    assert ax.get_yscale() == "linear" and ax.lines[0].get_xdata().tolist() == [0, 1]
    assert ax.get_xlabel() == "layer"
    ax = plot_metric_by_depth({"a": [1.0, 2.0], "b": [0.0, 0.0]}, "v", logy=True)  # one positive setting suffices
    assert ax.get_yscale() == "log"

    ax = plot_spectra({"s": torch.tensor([1.0, 0.0, 4.0, 2.0])})
    assert ax.lines[0].get_ydata().tolist() == [1.0, 0.5, 0.25] and ax.lines[0].get_xdata().tolist() == [1, 2, 3]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    ax = plot_spectra({"s": torch.tensor([1.0, 4.0])}, normalize=False)
    assert ax.lines[0].get_ydata().tolist() == [4.0, 1.0] and ax.get_ylabel() == "$s_i$"
    with pytest.raises(ValueError, match=r"spectra\['s'\] must have shape \(R,\), got \(2, 2\)"):
        plot_spectra({"s": torch.ones(2, 2)})


# ============================================================================ equivalent mutants
# capture.py _Collector.add: `self.num_nodes += int(mask.sum())` -> `int(mask[:a].sum())`. The node offset is
#   read only when a later batch appends sparse edges, i.e. when that batch has a > 0, which needs
#   num_attention < max_attention after this batch, i.e. a == n here; then mask[:a] is the whole mask.
# capture.py _collect_labels: `raise TypeError("labels must be a tensor ...")` -> ValueError. Unreachable from
#   capture_dataset: _split_item refuses non-tensor labels first (TypeError, tested) and _head only slices tensors.
# spectral.py pca_token_rgb: `q = min(3, D)` -> `3 if D >= 3 else D - 0`: the same integer for every D.
# spectral.py frequency_response: `lambdas.to(device, dtype)` -> `lambdas.to(device)`: Horner's `f * lam + c`
#   promotes lam (float32/float64/int, or complex) to the float64/complex128 of `c` exactly, with the same values.
# plots.py _to_image: `x = x[0]` inserted before the "1 or 3 channels" ValueError: the same error is raised.
# report.py _probe: `_num_classes(y) < 2` -> `< 1`. With one class, linear_probe_accuracy raises its "at least 2
#   classes in training" ValueError, which _probe maps to None: the same None (tested above), only later.
# capture.py _Collector.add (sparse attention): `keep = (ei[1] < kept_nodes) & (ei[0] < kept_nodes)` ->
#   `keep = ei[1] < kept_nodes`. The batch vector is sorted (pad_by_batch refuses an unsorted one) so the
#   nodes of the first `a` graphs are exactly the indices < kept_nodes, and a batch's attention graph is
#   block-diagonal: AttentionGraph.sparse refuses an edge_index whose source and target lie in different
#   graphs ("edge_index connects nodes of different graphs", checked by the graph model's forward in eager
#   mode on CPU; on an accelerator such an edge_index is documented as invalid and left unchecked). For every
#   valid batch an edge whose target is < kept_nodes has its source < kept_nodes too: the same edges are kept.
