"""Mutation kills (sitting 53d) for the modules the mutation-kill tests audit least by size: ``ops/engine.py``
(the diffusion engine's loop, head helpers and affine pass) and ``analysis/capture.py`` (layer capture by hooks).
Each "Pin:" test checks behaviour against an independent expectation (hand-computed values, a float64 reference,
the documented contract), so that a mutant of the condition or constant it names fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from diffusionformer.analysis import LayerRecorder, capture_dataset, pad_by_batch
from diffusionformer.ops import engine


class _Block(nn.Module):
    """A block ``x -> 2 x + 1`` (no attention): states are hand-computable."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x + 1


class _Stack(nn.Module):
    def __init__(self, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


# ---------------------------------------------------------------------------------------------- capture.py
def test_pin_layers_negative_indices_reach_the_embeddings_and_are_sorted_once() -> None:
    """Pin: ``layers`` counts negatives from the end over ``0..L``, so ``-(L + 1)`` is the embeddings (mutant: the
    lower bound ``-L`` refused it); the recorded layers are sorted and deduplicated (mutant: kept as given)."""
    model = _Stack(3)  # L = 3: layers 0..3
    assert LayerRecorder(model, layers=[-4]).layers == [0]
    assert LayerRecorder(model, layers=[3, -1, 0, 2, 0]).layers == [0, 2, 3]
    x = torch.zeros(1, 2, 1)
    with LayerRecorder(model, layers=[-4, 2]) as rec:
        model(x)
    assert sorted(rec.states) == [0, 2] and torch.equal(rec.states[2], torch.full((1, 2, 1), 3.0))  # 0 -> 1 -> 3
    with pytest.raises(ValueError, match="got -5"):
        LayerRecorder(model, layers=[-5])


def test_pin_pad_by_batch_refuses_negative_graph_ids_with_a_value_error() -> None:
    """Pin: graph ids below 0 are a ValueError naming the ids found (mutant: only the upper bound checked, torch's
    bincount raised a RuntimeError about negative values instead)."""
    with pytest.raises(ValueError, match=r"graph ids in \[0, 1\).*got ids in \[-1, 0\]"):
        pad_by_batch(torch.ones(2, 1), torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"got ids in \[-1, 1\]"):
        pad_by_batch(torch.ones(3, 1), torch.tensor([-1, 0, 1]), 2)


def test_pin_pad_by_batch_refuses_ids_at_or_above_num_graphs_and_negative_counts() -> None:
    """Pin: with ``num_graphs=G`` an id equal to ``G`` is outside ``[0, G)``, a ValueError (mutant: ``> G``, two
    rows came back for ``G = 1``); a negative ``num_graphs`` is refused as such, also without nodes (mutant: the
    sign check dropped, an error about ids or torch's bincount instead)."""
    with pytest.raises(ValueError, match=r"graph ids in \[0, 1\) \(num_graphs=1\), got ids in \[0, 1\]"):
        pad_by_batch(torch.ones(2, 1), torch.tensor([0, 1]), 1)
    for N in (0, 2):
        with pytest.raises(ValueError, match="num_graphs must be a non-negative int or None, got -1"):
            pad_by_batch(torch.ones(N, 1), torch.zeros(N, dtype=torch.long), -1)
    padded, mask = pad_by_batch(torch.ones(0, 1), torch.zeros(0, dtype=torch.long), 2)  # two graphs, no node
    assert padded.shape == (2, 0, 1) and mask.shape == (2, 0)


class _Mixer(_Stack):
    """``model(x, m)``: tokens mixed by a shared ``(T, T)`` matrix (or per sequence ``(B, T)`` row weights)."""

    def forward(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if m.ndim == 1:  # one weight per position, shared by the sequences
            return super().forward(x * m[:, None])
        x = m @ x if m.shape[0] == m.shape[1] == x.shape[1] else x * m.unsqueeze(-1)
        return super().forward(x)


def test_pin_shared_square_tensor_is_not_cut_and_a_per_sequence_one_is() -> None:
    """Pin: a tuple batch ``(x, m)`` with a shared ``(T, T)`` matrix and ``T == B`` runs whole and its first
    sequences are kept, equal to ``m @ x`` of those (mutant: never ambiguous, ``m`` cut to ``(k, T)``: wrong states);
    a per-sequence ``(B, T)`` tensor with ``T != B`` is cut before the run, as documented (mutant: ambiguous
    whenever a tensor leads with ``B``, the model ran the whole batch); the outputs of a batch run whole are cut
    like its states (mutant: all kept)."""
    torch.manual_seed(0)
    x, m = torch.randn(3, 3, 1, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
    cap = capture_dataset(_Mixer(1), [((x, m), None)], max_examples=2, keep_outputs=True)
    torch.testing.assert_close(cap.states[0], (m @ x)[:2], rtol=0, atol=0)
    torch.testing.assert_close(cap.outputs, 2 * (m @ x)[:2] + 1, rtol=0, atol=0)  # outputs cut to the kept ones
    torch.testing.assert_close(cap.states[1], 2 * (m @ x)[:2] + 1, rtol=0, atol=0)
    seen: list[int] = []

    def forward(model: nn.Module, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        seen.append(inputs[0].shape[0])
        return model(*inputs)

    x, w = torch.randn(3, 4, 1, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    cap = capture_dataset(_Mixer(1), [((x, w), None)], max_examples=2, forward=forward)
    assert seen == [2]
    torch.testing.assert_close(cap.states[1], 2 * (x * w.unsqueeze(-1))[:2] + 1, rtol=0, atol=0)


def test_pin_cut_batch_passes_tensors_of_another_leading_size_whole_and_lists_hold_labels() -> None:
    """Pin: a batch cut to fit cuts only the tensors that lead with its batch size; a shared ``(T,)`` weight with
    ``T != B`` is passed whole (mutant: every tensor cut, the weight lost positions); a 2-list ``[inputs, labels]``
    is ``(inputs, labels)`` as a 2-tuple is (mutant: only tuples split, the list read as ``model(*[x, y])``)."""
    x, w = torch.arange(12.0).reshape(3, 4, 1), torch.tensor([1.0, 0.0, -1.0, 2.0])
    cap = capture_dataset(_Mixer(1), [((x, w), None)], max_examples=2)
    torch.testing.assert_close(cap.states[1], 2 * (x * w[:, None])[:2] + 1, rtol=0, atol=0)
    y = torch.tensor([7, 8, 9])
    cap = capture_dataset(_Stack(2), [[x, y]], max_examples=3)
    assert cap.labels.tolist() == [7, 8, 9] and cap.states[2].shape == (3, 4, 1)


# ----------------------------------------------------------------------------------------------- engine.py
class _Matrix(engine.Backend):
    """``P`` given as ``(B, H, N, N)``; ``trim`` drops the last token of the result (a wrong back-end)."""

    name = "matrix-test"

    def __init__(self, P: torch.Tensor, trim: bool = False) -> None:
        self.P, self.trim = P, trim

    def propagate(self, x: torch.Tensor, heads: tuple[int, ...]) -> torch.Tensor:
        y = engine.select(self.P, heads, 1) @ x
        return y[..., :-1, :] if self.trim else y


def test_pin_backend_returning_a_wrong_shape_is_refused_by_name() -> None:
    """Pin: a back-end whose ``propagate`` returns another shape than ``x`` is a ValueError naming it and both shapes,
    in the loop and in the affine pass (mutant: only the type checked; the sums broadcast or failed in torch)."""
    P, v = torch.full((1, 2, 3, 3), 1 / 3), torch.ones(1, 2, 3, 1)
    bad = _Matrix(P, trim=True)
    with pytest.raises(ValueError, match=r"'matrix-test'.*shape of x \(1, 2, 3, 1\), got \(1, 2, 2, 1\)"):
        engine.polynomial(bad, v, torch.tensor([[0.0, 1.0], [1.0, -1.0]]), (1, 1))
    with pytest.raises(ValueError, match=r"'matrix-test'.*got \(1, 2, 2, 1\)"):
        engine.affine(bad, v, (0.0, 1.0), (1.0, -1.0))


def test_pin_graph_batch_attributes_reach_only_a_model_configured_for_them() -> None:
    """Pin: ``edge_attr`` / ``pe`` of a Batch are passed only to a model whose config sets ``edge_dim`` / ``pe``; a
    graph transformer without them captures the batch as if they were absent (mutant: passed whenever present, the
    model refused them: "edge_attr: expected None")."""
    from torch_geometric.data import Batch, Data

    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, task="graph", dim=8,
                                                             depth=2, num_heads=2))
    ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    x = torch.randn(3, 3)
    rich = Batch.from_data_list([Data(x=x, edge_index=ei, edge_attr=torch.randn(4, 2), pe=torch.randn(3, 4))])
    plain = Batch.from_data_list([Data(x=x, edge_index=ei)])
    a, b = capture_dataset(model, [rich]), capture_dataset(model, [plain])
    assert a.layers == [0, 1, 2]
    for layer in a.layers:
        torch.testing.assert_close(a.states[layer], b.states[layer], rtol=0, atol=0)


def test_pin_coefficient_blocks_merge_steps_with_the_same_heads() -> None:
    """Pin: steps ``0..K`` sharing their heads form one block (hand-computed for degrees (1, 3, 3): steps 0-1 all
    heads, steps 2-3 heads 1 and 2; mutant: one block per step)."""
    assert engine._coefficient_blocks((1, 3, 3), (0, 1, 2), 3) == ((0, 2, (0, 1, 2)), (2, 2, (1, 2)))
    assert engine._coefficient_blocks((2, 2), (0, 1), 2) == ((0, 3, (0, 1)),)


def test_pin_edge_feature_block_called_with_a_bare_edge_index_records_its_attention() -> None:
    """Pin: a graph block with edge features called with a bare ``edge_index`` tensor as ``graph`` (documented: "an
    AttentionGraph, or a bare edge_index") records the same ``P`` as when called with the model's AttentionGraph,
    each node's incoming weights summing to 1 (mutant: the tensor kept as ``graph``, ``graph.edge_index`` raised)."""
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, task="node", dim=8,
                                                             depth=1, num_heads=2, edge_dim=2)).eval()
    ei = torch.tensor([[0, 1, 1, 2, 2, 0], [1, 0, 2, 1, 0, 2]])
    calls: list[tuple] = []
    handle = model.blocks[0].register_forward_pre_hook(lambda m, a, k: calls.append((a, k)), with_kwargs=True)
    with torch.no_grad(), LayerRecorder(model, attentions=True) as rec:
        model(torch.randn(3, 3), ei, edge_attr=torch.randn(6, 2))
    handle.remove()
    (h, graph, batch, edge_attr), kwargs = calls[0]
    with torch.no_grad(), LayerRecorder(model, attentions=True) as bare:
        model.blocks[0](h, graph.edge_index, batch, edge_attr, **kwargs)
    P, edges = bare.attentions[0].attn_weights, bare.attentions[0].edge_index
    torch.testing.assert_close(P, rec.attentions[0].attn_weights, rtol=0, atol=0)
    sums = torch.zeros(3, 2, dtype=P.dtype).index_add_(0, edges[1], P)
    torch.testing.assert_close(sums, torch.ones(3, 2, dtype=P.dtype))


class _InPlace(nn.Module):
    """A block that updates its input in place: ``x <- 2 x + 1``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2).add_(1)


def test_pin_states_are_copies_when_blocks_update_their_input_in_place() -> None:
    """Pin: each recorded state is the tokens as the block saw them, although the next block overwrites them in
    place: ``x, 2x + 1, 4x + 3`` (mutants: the embeddings' or a block output's copy dropped, every state the last)."""
    model = _Stack(2)
    model.blocks = nn.ModuleList([_InPlace(), _InPlace()])
    x = torch.tensor([[[1.0], [-2.0]]])
    with torch.no_grad():
        cap = capture_dataset(model, [x.clone()])
    assert [cap.states[layer].flatten().tolist() for layer in (0, 1, 2)] == [[1.0, -2.0], [3.0, -3.0], [7.0, -5.0]]


class _CausalBlock(nn.Module):
    """A user's pre-norm block whose forward names ``is_causal`` (a dense shorthand of the attention)."""

    def __init__(self) -> None:
        super().__init__()
        from diffusionformer.nn import DiffusionAttention

        self.norm1, self.attn = nn.LayerNorm(8), DiffusionAttention(8, 2)

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        return x + self.attn(self.norm1(x), is_causal=is_causal)


def test_pin_recomputed_attention_keeps_a_user_blocks_is_causal() -> None:
    """Pin: a block called with ``is_causal=True`` has its ``P`` recomputed causally: nothing above the diagonal and
    rows summing to 1 (mutant: ``is_causal`` not forwarded, the recorded ``P`` attended future tokens)."""
    torch.manual_seed(0)
    model = _Stack(1)
    model.blocks = nn.ModuleList([_CausalBlock()])
    with torch.no_grad(), LayerRecorder(model, attentions=True) as rec:
        model.blocks[0](torch.randn(2, 5, 8), is_causal=True)
    P = rec.attentions[0].attn_weights
    assert P.shape == (2, 2, 5, 5) and bool((P.triu(1) == 0).all()) and bool((P.diagonal(dim1=-2, dim2=-1) > 0).all())
    torch.testing.assert_close(P.sum(-1), torch.ones(2, 2, 5))


def test_pin_recording_attentions_leaves_a_training_pass_with_dropout_unchanged() -> None:
    """Pin: recomputing ``P`` draws no random numbers, so a training pass with attention dropout gives the bits it
    gives without a recorder (documented in the module; mutant: the generator not restored, the dropout masks moved)."""
    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.3)).train()
    ids = torch.randint(0, 11, (2, 8))
    torch.manual_seed(1)
    want = gpt(ids)
    torch.manual_seed(1)
    with LayerRecorder(gpt, attentions=True) as rec:
        got = gpt(ids)
    assert sorted(rec.attentions) == [0, 1]
    logits = lambda out: out[0] if isinstance(out, tuple) else out  # noqa: E731
    torch.testing.assert_close(logits(got), logits(want), rtol=0, atol=0)


def test_pin_nested_with_of_one_recorder_keeps_its_hooks_until_the_outer_exit() -> None:
    """Pin: a recorder entered again inside its own ``with`` keeps recording after the inner block ends, and leaves
    no hook after the outer one (mutants: re-entry or the inner exit not counted, the inner exit removed the hooks)."""
    model, x = _Stack(2), torch.ones(1, 2, 1)
    rec = LayerRecorder(model)
    with rec:
        with rec:
            model(x)
        rec.clear()
        model(2 * x)
        assert sorted(rec.states) == [0, 1, 2] and rec.states[2].flatten().tolist() == [11.0, 11.0]  # 2 -> 5 -> 11
    assert all(not b._forward_hooks and not b._forward_pre_hooks for b in model.blocks)


class _Pooled(_Stack):
    """Per-sequence outputs ``(B, C)``: here ``C = T``, the token sums of the last state."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).sum(-1)


def test_pin_drop_prefix_keeps_per_sequence_outputs_whose_width_equals_t() -> None:
    """Pin: ``drop_prefix`` cuts per-token outputs ``(B, T, V)`` but keeps per-sequence ones ``(B, C)`` whole, also
    when ``C == T`` (documented; mutant: any output with a second dimension of ``T`` cut)."""
    x = torch.arange(6.0).reshape(2, 3, 1)
    cap = capture_dataset(_Pooled(1), [x], keep_outputs=True).drop_prefix(1)
    assert cap.outputs.tolist() == [[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]] and cap.states[1].shape == (2, 2, 1)


def test_pin_sequence_coefficients_need_one_head() -> None:
    """Pin: coefficients given as a Python sequence with ``H = 0`` heads are refused as such (mutant: the ``H >= 1``
    check dropped, a misleading "rows must all have K+1 entries, got lengths []")."""
    with pytest.raises(ValueError, match=r"need inputs with H >= 1 heads, got H=0"):
        engine.static_coefficients([1.0, -1.0], 0)


def test_pin_per_token_labels_uint8_padded_with_minus_100_and_cut_by_drop_prefix() -> None:
    """Pin: integer labels are kept as int64, so per-token uint8 labels of batches of different lengths pad with
    ``-100`` (mutant: kept as uint8, the padding failed or wrapped); ``drop_prefix(k)`` drops the first ``k`` labels
    of each sequence with its tokens (mutant: labels kept whole, one too many per sequence)."""
    a, b = torch.zeros(1, 3, 1), torch.zeros(1, 2, 1)
    la, lb = torch.tensor([[1, 2, 3]], dtype=torch.uint8), torch.tensor([[4, 5]], dtype=torch.uint8)
    cap = capture_dataset(_Stack(1), [(a, la), (b, lb)])
    assert cap.labels.dtype == torch.int64 and cap.labels.tolist() == [[1, 2, 3], [4, 5, -100]]
    cap = capture_dataset(_Stack(1), [(a, la)]).drop_prefix(1)
    assert cap.labels.tolist() == [[2, 3]] and cap.states[1].shape == (1, 2, 1)


class _PadBlock(nn.Module):
    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return 2 * x + 1


class _PadStack(nn.Module):
    """``model(x, pad)``: blocks called with ``key_padding_mask=pad`` (True = padding)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_PadBlock()])

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return self.blocks[0](x, key_padding_mask=pad)


def test_pin_key_padding_on_the_right_is_the_mask_and_on_the_left_refused() -> None:
    """Pin: a ``key_padding_mask`` padding each sequence on the right gives ``mask = ~padding`` and ``-100`` labels
    there; padding before a real token is a ValueError (mutant: the order test reversed, right padding refused)."""
    x = torch.zeros(2, 3, 1)
    pad = torch.tensor([[False, False, True], [False, False, False]])
    run = lambda m, b: m(*b)  # noqa: E731
    cap = capture_dataset(_PadStack(), [((x, pad), torch.tensor([[1, 2, 3], [4, 5, 6]]))], forward=run)
    assert cap.mask.tolist() == [[True, True, False], [True, True, True]]
    assert cap.labels.tolist() == [[1, 2, -100], [4, 5, 6]] and cap.lengths().tolist() == [2, 3]
    with pytest.raises(ValueError, match="pads a sequence before a real token"):
        capture_dataset(_PadStack(), [((x, pad.flip(1)), None)], forward=run)


def test_pin_graph_attention_edges_of_later_batches_index_the_concatenated_nodes() -> None:
    """Pin: the ``(2, E)`` attention edges of graphs captured from separate batches index the valid tokens of all
    kept graphs in row-major order, as one batch of the same graphs does (PyG's own offsets); a second 3-node ring
    after a 3-node ring indexes nodes 3..5 (mutant: the offset of earlier batches' nodes dropped)."""
    from torch_geometric.data import Batch, Data

    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=2, num_classes=2, task="graph", dim=8,
                                                             depth=1, num_heads=2))
    ring = torch.tensor([[0, 1, 2, 1, 2, 0], [1, 2, 0, 0, 1, 2]])
    g1, g2 = Data(x=torch.randn(3, 2), edge_index=ring), Data(x=torch.randn(3, 2), edge_index=ring)
    two = capture_dataset(model, [Batch.from_data_list([g1]), Batch.from_data_list([g2])], attentions=True)
    one = capture_dataset(model, [Batch.from_data_list([g1, g2])], attentions=True)
    e2, e1 = two.attention_edges[0], one.attention_edges[0]
    assert set(e2[:, e2.shape[1] // 2:].flatten().tolist()) == {3, 4, 5}  # the second batch's edges
    w2 = dict(zip(map(tuple, e2.t().tolist()), two.attentions[0].tolist()))
    w1 = dict(zip(map(tuple, e1.t().tolist()), one.attentions[0].tolist()))
    assert w2.keys() == w1.keys() and all(w2[e] == pytest.approx(w1[e], abs=1e-6) for e in w1)


def test_pin_half_precision_affine_on_cpu_multiplies_the_values_in_float32() -> None:
    """Pin: on the CPU a float16 combination ``c0 v + c1 y`` with a coefficient not exact in float16 takes ``c0 v``
    in float32 (documented: "Scalars multiply in float32 even for half-precision tensors"): with
    ``c0 = 1 + 2^-10 + 1e-5``, ``v = 1``, ``y = 2`` the sum rounds once, up to ``3 + 2^-9`` as the exact value does
    (mutant: ``c0 v`` rounded to float16 first, ``1 + 2^-10``, and the tie ``3 + 2^-10`` rounded to even, 3)."""
    c0 = 1.0 + 2.0**-10 + 1e-5
    y, v = torch.full((1, 1, 1, 1), 2.0, dtype=torch.float16), torch.ones(1, 1, 1, 1, dtype=torch.float16)
    want = 3.0 + 2.0**-9  # the float16 nearest to 3 + 2^-10 + 1e-5 (its grid step is 2^-9 on [2, 4))
    assert float(np.float16(c0 + 2.0)) == want
    assert engine.combine_affine(y.clone(), v, [(0, 1, c0, 1.0)]).item() == want  # in place (no history)
    assert engine.combine_affine(y.clone().requires_grad_(), v, [(0, 1, c0, 1.0)]).item() == want  # AffineHeads


def test_pin_two_graphs_whose_blocks_got_no_batch_vector_are_told_apart_by_the_batch() -> None:
    """Pin: blocks called without a batch vector (``forward=lambda m, b: m(b.x, b.edge_index)``) on a Batch of two
    graphs give two padded rows, cut by the Batch's own ids (mutant: only from three graphs on, the two graphs were
    one row of all five nodes)."""
    from torch_geometric.data import Batch, Data

    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=2, num_classes=2, task="node", dim=8,
                                                             depth=1, num_heads=2))
    ring3, pair = torch.tensor([[0, 1, 2], [1, 2, 0]]), torch.tensor([[0, 1], [1, 0]])
    x = torch.randn(5, 2)
    b = Batch.from_data_list([Data(x=x[:3], edge_index=ring3), Data(x=x[3:], edge_index=pair)])
    cap = capture_dataset(model, [b], forward=lambda m, g: m(g.x, g.edge_index))
    assert cap.states[1].shape == (2, 3, 8) and cap.mask.tolist() == [[True, True, True], [True, True, False]]
    torch.testing.assert_close(cap.states[0][1, :2], model.embed(x[3:]).detach(), rtol=0, atol=0)


def test_pin_affine_heads_batched_gradients_weight_each_head_by_its_coefficients() -> None:
    """Pin: with ``is_grads_batched=True`` (the out-of-place backward) the gradient of ``c0 v + c1 y`` on a run's
    heads is ``c0 g`` for ``v`` and ``c1 g`` for ``y``, and ``0`` / ``g`` on the other heads (hand-derived, float64
    reference; mutants: a gap of one head before a run skipped, or the gap's ``v`` gradient ``g`` instead of 0)."""
    torch.manual_seed(0)
    y = torch.randn(2, 3, 1, requires_grad=True)  # (N, H, C): heads 0 and 2 are no run
    v = torch.randn(2, 3, 1, requires_grad=True)
    out = engine.combine_affine(y, v, [(1, 2, 0.1, 0.3)])  # 0.1, 0.3: not exact in float32, the AffineHeads path
    g = torch.randn(4, 2, 3, 1)
    dy, dv = torch.autograd.grad(out, (y, v), g, is_grads_batched=True)
    scale_y = torch.tensor([1.0, 0.3, 1.0], dtype=torch.float64).view(3, 1)
    scale_v = torch.tensor([0.0, 0.1, 0.0], dtype=torch.float64).view(3, 1)
    torch.testing.assert_close(dy.double(), g.double() * scale_y)
    torch.testing.assert_close(dv.double(), g.double() * scale_v)


def test_pin_a_non_bool_key_padding_argument_is_not_read_as_padding() -> None:
    """Pin: only a ``(B, T)`` bool ``key_padding_mask`` marks padding (documented "True = padding"); a user's block
    taking a float one (its own convention, not the attention's) is captured unpadded (mutant: any 2-d tensor read,
    ``~`` of a float tensor raised)."""
    x, pad = torch.zeros(2, 3, 1), torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    cap = capture_dataset(_PadStack(), [((x, pad), None)], forward=lambda m, b: m(*b))
    assert cap.mask is None and cap.lengths().tolist() == [3, 3]


def test_pin_recording_attentions_leaves_the_layer_state_unchanged() -> None:
    """Pin: recomputing ``P`` of blocks whose heads read the pass's ``LayerState`` (differential attention's depth
    schedule, NeuTRENO's first-layer values) copies the state, so a pass recorded with attentions gives the outputs
    of the pass without a recorder (mutant: the state shared, each recomputation advanced its depth)."""
    from diffusionformer.models import DiffusionGPT, GPTConfig

    torch.manual_seed(0)
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=3, n_head=2, n_embd=16,
                                 heads="differential:1,neutreno:1")).eval()
    ids = torch.randint(0, 11, (2, 8))
    with torch.no_grad():
        want = gpt(ids)
        with LayerRecorder(gpt, attentions=True) as rec:
            got = gpt(ids)
    assert sorted(rec.attentions) == [0, 1, 2]
    logits = lambda out: out[0] if isinstance(out, tuple) else out  # noqa: E731
    torch.testing.assert_close(logits(got), logits(want), rtol=0, atol=0)


def test_pin_combine_affine_inplace_false_leaves_p_v_untouched() -> None:
    """Pin: ``inplace=False`` never overwrites ``y = P v`` although there is no autograd history, and
    ``inplace=True`` updates it (documented; mutant: the flag read backwards, ``inplace=False`` wrote into ``y``), for
    exact coefficients (the column path) and inexact ones (the run-by-run path): ``c0 v + c1 y`` by hand."""
    v = torch.tensor([[[1.0], [2.0]], [[3.0], [4.0]]])  # (N, H, C) = (2, 2, 1)
    for c0, c1 in ((1.0, -1.0), (0.1, 0.3)):
        y = torch.tensor([[[5.0], [6.0]], [[7.0], [8.0]]])
        want = torch.tensor([[[5.0], [c0 * 2 + c1 * 6]], [[7.0], [c0 * 4 + c1 * 8]]])  # head 1 only
        out = engine.combine_affine(y, v, [(1, 2, c0, c1)], inplace=False)
        torch.testing.assert_close(out, want)
        assert y.flatten().tolist() == [5.0, 6.0, 7.0, 8.0] and out.data_ptr() != y.data_ptr()
        out = engine.combine_affine(y, v, [(1, 2, c0, c1)], inplace=True)
        torch.testing.assert_close(y, want)
        assert out.data_ptr() == y.data_ptr()


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_pin_combine_affine_under_jit_trace_leaves_its_inputs_and_checks() -> None:
    """Pin: while ``torch.jit.trace`` records, the column path runs out of place: the inputs are left as they are and
    the trace's own check (a second run on the same inputs) passes, giving ``v - y`` on the Laplacian head (mutant:
    ``out=y`` while tracing, ``y`` overwritten and the check's second run disagreed)."""
    y, v = torch.tensor([[[5.0], [6.0]]]), torch.tensor([[[1.0], [2.0]]])  # (N, H, C) = (1, 2, 1)
    traced = torch.jit.trace(lambda a, b: engine.combine_affine(a, b, [(1, 2, 1.0, -1.0)]), (y, v))
    assert y.flatten().tolist() == [5.0, 6.0]
    assert traced(y, v).flatten().tolist() == [5.0, -4.0] and y.flatten().tolist() == [5.0, 6.0]


def test_pin_combine_affine_under_vmap_multiplies_half_values_in_float32() -> None:
    """Pin: inside a ``torch.func`` transform, inexact coefficients multiply float16 values in float32 too (as
    documented): ``(1 + 2^-10 + 1e-5) * 1 + 1 * 2`` rounds once to ``3 + 2^-9`` (mutant: the coefficients cast to
    float16, the tie ``3 + 2^-10`` rounded to even, 3)."""
    c0 = 1.0 + 2.0**-10 + 1e-5
    y, v = torch.full((3, 1, 1, 1), 2.0, dtype=torch.float16), torch.ones(3, 1, 1, 1, dtype=torch.float16)
    out = torch.func.vmap(lambda a, b: engine.combine_affine(a, b, [(0, 1, c0, 1.0)]))(y, v)
    assert out.dtype == torch.float16 and out.flatten().tolist() == [3.0 + 2.0**-9] * 3


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_pin_affine_heads_backward_under_compile_weights_v_by_c0() -> None:
    """Pin: compiled (``aot_eager``), the backward of ``c0 v + c1 y`` with inexact coefficients gives ``v`` the
    gradient ``c0 g`` on the run's heads and 0 elsewhere, ``y`` the gradient ``c1 g`` there and ``g`` elsewhere
    (hand-derived; mutant: the compiled branch of the backward weighted ``v`` by ``c1``)."""
    torch.manual_seed(0)
    y, v = torch.randn(2, 3, 1, requires_grad=True), torch.randn(2, 3, 1, requires_grad=True)
    f = torch.compile(lambda a, b: engine.combine_affine(a, b, [(1, 2, 0.1, 0.3)]), backend="aot_eager",
                      fullgraph=True)
    g = torch.randn(2, 3, 1)
    dy, dv = torch.autograd.grad(f(y, v), (y, v), g)
    torch.testing.assert_close(dv, g * torch.tensor([0.0, 0.1, 0.0]).view(3, 1))
    torch.testing.assert_close(dy, g * torch.tensor([1.0, 0.3, 1.0]).view(3, 1))


class _Recording(_Matrix):
    def propagate(self, x: torch.Tensor, heads: tuple[int, ...]) -> torch.Tensor:
        self.last = super().propagate(x, heads)
        return self.last


class _FirstToken(engine.Backend):
    """Every token attends token 0 only, gathered (as a sparse back-end does): other values never reach ``P v``."""

    def propagate(self, x: torch.Tensor, heads: tuple[int, ...]) -> torch.Tensor:
        return x.narrow(2, 0, 1).expand(x.shape).clone()


def test_pin_affine_of_plain_attention_heads_returns_p_v_itself() -> None:
    """Pin: when every head is plain attention ``(c0, c1) = (0, 1)`` the affine pass returns the back-end's ``P v``
    itself, untouched (documented; mutant: the early return dropped, ``0 v + 1 P v`` recomputed: a new tensor with
    grad, and ``0 * inf`` a NaN for an infinite value the attention gives no weight)."""
    P = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])  # (1, 1, 2, 2)
    v = torch.tensor([[[[2.0], [4.0]]]], requires_grad=True)
    backend = _Recording(P)
    out = engine.affine(backend, v, (0.0,), (1.0,))
    assert out is backend.last and out.flatten().tolist() == [2.0, 3.0]
    out = engine.affine(_FirstToken(), torch.tensor([[[[2.0], [float("inf")]]]]), (0.0,), (1.0,))
    assert out.flatten().tolist() == [2.0, 2.0]


def test_pin_zero_is_an_exact_coefficient_in_every_dtype() -> None:
    """Pin: a zero coefficient is exact in every floating dtype (documented with dyadic ones), so a run ``(0, 2)``
    takes the stock column path with autograd, not the Python ``AffineHeads`` (mutant: 0 counted inexact)."""
    for dtype, bits in engine._SIGNIFICAND_BITS.items():
        assert engine._exact(0.0, *bits) and engine._exact(-0.0, *bits), dtype
        assert engine._head_columns(((0, 1, 0.0, 2.0),), 1, torch.device("cpu"), dtype) is not None
    y, v = torch.ones(1, 1, 1, requires_grad=True), torch.full((1, 1, 1), 5.0)
    out = engine.combine_affine(y, v, [(0, 1, 0.0, 2.0)])
    assert out.item() == 2.0 and "AffineHeads" not in type(out.grad_fn).__name__


def test_pin_exact_coefficients_are_normal_numbers_of_the_dtype() -> None:
    """Pin: ``_exact`` accepts the smallest normal number of a dtype and refuses the subnormal below it (documented:
    "a normal number (or zero)"): ``2^-126`` / ``2^-127`` for float32, ``2^-1022`` / ``2^-1023`` for float64 (mutant:
    float32's smallest exponent one lower, a subnormal coefficient counted exact)."""
    for dtype, low in ((torch.float32, -126), (torch.float64, -1022), (torch.float16, -14), (torch.bfloat16, -126)):
        bits = engine._SIGNIFICAND_BITS[dtype]
        assert engine._exact(2.0**low, *bits) and not engine._exact(2.0**(low - 1), *bits), dtype
        assert torch.tensor(2.0**low, dtype=dtype).item() == 2.0**low  # the reference: representable in the dtype


class _GraphStack(nn.Module):
    """A graph model without a ``num_graphs`` parameter: blocks on node rows ``(N, D)``."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block()])

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor | None = None) -> torch.Tensor:
        return self.blocks[0](x)


def test_pin_num_graphs_is_passed_only_to_a_forward_that_takes_it() -> None:
    """Pin: a graph model whose forward has no ``num_graphs`` parameter is called without it, and its nodes padded
    per graph (mutant: always passed, a TypeError)."""
    from torch_geometric.data import Batch, Data

    pair = torch.tensor([[0, 1], [1, 0]])
    b = Batch.from_data_list([Data(x=torch.ones(2, 1), edge_index=pair), Data(x=torch.zeros(1, 1),
                                                                              edge_index=torch.zeros(2, 0).long())])
    cap = capture_dataset(_GraphStack(), [b])
    assert cap.states[1][..., 0].tolist() == [[3.0, 3.0], [1.0, 0.0]] and cap.lengths().tolist() == [2, 1]


class _Optional(_Stack):
    def forward(self, x: torch.Tensor, scale: float | None = None) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x if scale is None else x * scale)


def test_pin_tuple_inputs_with_a_none_and_list_inputs_run_on_the_device() -> None:
    """Pin: with ``device=...`` a ``None`` in a tuple batch is passed as it is (mutant: ``None.to``); inputs given as a
    list ``[x, w]`` count the sequences of ``x`` as a tuple's do (mutant: only tuples, a TypeError)."""
    x = torch.zeros(2, 3, 1)
    cap = capture_dataset(_Optional(1), [((x, None), None)], device="cpu")
    assert cap.states[1].flatten().tolist() == [1.0] * 6
    w = torch.tensor([1.0, 0.0, 2.0])
    cap = capture_dataset(_Mixer(1), [([x + 1, w], None)], device="cpu")
    assert cap.states[1][0, :, 0].tolist() == [3.0, 1.0, 5.0]


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_pin_blocks_compiled_one_by_one_and_a_wrapped_compiled_model_are_seen_through() -> None:
    """Pin: a block compiled on its own (its forward takes ``*args, **kwargs``) is read by the wrapped block's
    signature (mutant: the wrapper's, the tuple ``args`` taken for the tokens); a model compiled inside a wrapper
    with ``.module`` runs unwrapped and is named by its own class (mutant: one level unwrapped only)."""
    model = _Stack(2)
    model.blocks = nn.ModuleList([torch.compile(_Block(), backend="eager"), _Block()])
    cap = capture_dataset(model, [torch.zeros(1, 2, 1)])
    assert cap.states[2].flatten().tolist() == [3.0, 3.0]

    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.module = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.module(x)

    cap = capture_dataset(Wrapper(torch.compile(_Stack(1), backend="eager")), [torch.zeros(1, 2, 1)])
    assert cap.extra["model"] == "_Stack" and cap.states[1].flatten().tolist() == [1.0, 1.0]


def test_pin_drop_prefix_refuses_a_graph_capture_with_attention_edges_even_unpadded() -> None:
    """Pin: a graph capture whose graphs all have the same size has no mask, but its sparse attention edges index
    nodes and cannot drop tokens: a ValueError (mutant: only a mask refused, edges left pointing at dropped nodes)."""
    from torch_geometric.data import Batch, Data

    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=2, num_classes=2, task="graph", dim=8,
                                                             depth=1, num_heads=2))
    pair = torch.tensor([[0, 1], [1, 0]])
    b = Batch.from_data_list([Data(x=torch.randn(2, 2), edge_index=pair), Data(x=torch.randn(2, 2), edge_index=pair)])
    cap = capture_dataset(model, [b], attentions=True)
    assert cap.mask is None and cap.attention_edges
    with pytest.raises(ValueError, match="drop_prefix needs dense, unpadded tokens"):
        cap.drop_prefix(1)


def test_pin_capture_argument_and_input_errors_name_the_problem() -> None:
    """Pin: a LayerCapture without layers has no sequences (a ValueError, mutant: an IndexError); ``keep_outputs``
    must be a bool (mutant: "no" accepted, outputs kept); a model run on the meta device is refused (mutant: torch's
    "Cannot copy out of meta tensor"); batches that all hold 0 sequences are counted in the error (mutant: the count
    dropped, read as an empty iterable)."""
    from diffusionformer.analysis import LayerCapture

    with pytest.raises(ValueError, match="holds no layers"):
        LayerCapture(states={}).num_examples
    with pytest.raises((TypeError, ValueError), match="keep_outputs"):
        capture_dataset(_Stack(1), [torch.zeros(1, 2, 1)], keep_outputs="no")
    with pytest.raises(ValueError, match="ran on the meta device"):
        capture_dataset(_Stack(1), [torch.zeros(1, 2, 1, device="meta")])
    with pytest.raises(ValueError, match=r"its 2 batch\(es\) all held 0 sequences"):
        capture_dataset(_Stack(1), [torch.zeros(0, 2, 1)] * 2)


def test_pin_per_node_labels_of_a_trailing_empty_graph_are_padding_and_2d_ones_refused() -> None:
    """Pin: per-node labels of a Batch whose last graph has no node are padded per graph with ``-100`` over all its
    rows (mutant: the label mask padded to ``batch.max() + 1`` graphs, broadcast, the empty graph's row read as
    label 0); per-node labels of shape ``(N, 2)`` are refused (mutant: padded as if one per node)."""
    from torch_geometric.data import Batch, Data

    ring = torch.tensor([[0, 1, 2], [1, 2, 0]])
    b = Batch.from_data_list([Data(x=torch.ones(3, 1), edge_index=ring, y=torch.tensor([4, 5, 6])),
                              Data(x=torch.zeros(0, 1), edge_index=torch.zeros(2, 0).long(),
                                   y=torch.zeros(0).long())])
    cap = capture_dataset(_GraphStack(), [(b, b.y)])
    assert cap.labels.tolist() == [[4, 5, 6], [-100, -100, -100]] and cap.lengths().tolist() == [3, 0]
    with pytest.raises(ValueError, match=r"labels of batch 0 must have shape \(2,\).*got \(3, 2\)"):
        capture_dataset(_GraphStack(), [(b, torch.zeros(3, 2).long())])


def test_pin_affine_heads_output_is_token_major_contiguous_for_a_head_major_input() -> None:
    """Pin: ``AffineHeads`` returns a contiguous token-major ``(..., N, H, C)`` tensor even when ``y`` is a head-major
    tensor seen token-major, so the layers' ``view(..., N, H * C)`` needs no copy (documented layout; mutant: the
    clone kept ``y``'s strides and the view failed); values ``c0 v + c1 y`` by a float64 reference."""
    torch.manual_seed(0)
    y = torch.randn(1, 2, 3, 4).movedim(1, -2).requires_grad_()  # (B, N, H, C) over head-major storage
    v = torch.randn(1, 3, 2, 4)
    out = engine.combine_affine(y, v, [(0, 1, 0.1, 0.3)])
    assert out.is_contiguous()
    want = y.detach().double().clone()
    want[..., 0, :] = 0.1 * v[..., 0, :].double() + 0.3 * y.detach()[..., 0, :].double()
    torch.testing.assert_close(out.view(1, 3, 8).double(), want.reshape(1, 3, 8))
