"""Edge probes of diffusionformer.analysis: capture of KV-cached GPT decoding."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.analysis import LayerCapture, LayerRecorder
from diffusionformer.models import DiffusionGPT, GPTConfig


def _gpt() -> DiffusionGPT:
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16)).eval()


def test_bug_layer_recorder_attentions_of_a_kv_cached_step_say_what_is_unsupported():
    """Bug: LayerRecorder(attentions=True) around ``forward_cached`` (or ``generate(use_cache=True)``) re-ran the
    attention with the block's ``cache=`` and ``return_intermediates=True``, and the cached path refused it with
    "cache= runs causal decoding on dense tokens; it takes no graph, masks or return_intermediates": an error about
    an argument the user never passed. It now names the recorder's limitation and the way out; the cache is left
    as it was and every hook is removed."""
    gpt = _gpt()
    idx = torch.randint(0, 11, (2, 6))
    cache = gpt.new_cache()
    with torch.no_grad():
        gpt.forward_cached(idx[:, :4], cache)
        with pytest.raises(ValueError, match=r"attentions=False.*uncached forward"):
            with LayerRecorder(gpt, attentions=True):
                gpt.forward_cached(idx[:, 4:], cache)
        assert [c.length for c in cache] == [4, 4]  # the refused step appended nothing
        assert all(not b._forward_hooks and not b._forward_pre_hooks for b in gpt.blocks)
        # the cache still decodes exactly, and states alone are recorded on a cached step
        with LayerRecorder(gpt, attentions=False) as rec:
            out = gpt.forward_cached(idx[:, 4:], cache)
        full = gpt(idx)
    full = full[0] if isinstance(full, tuple) else full
    torch.testing.assert_close(out, full[:, 4:], rtol=1e-5, atol=1e-5)
    assert rec.states[2].shape == (2, 2, 16)


def _graph(n: int, seed: int):
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(seed)
    return Data(x=torch.randn(n, 5, generator=g, dtype=torch.float64),
                edge_index=torch.randint(0, n, (2, 3 * n), generator=g), y=torch.tensor([seed % 2]))


@pytest.mark.parametrize("heads", ["attention", "laplacian", "heat", "ppr", "polynomial"])
def test_pins_sparse_attention_of_batched_graphs_rebuilds_every_block_output_in_float64(heads):
    """Pin: for a graph transformer over batched graphs, the captured per-edge ``P`` (``attentions``,
    ``attention_edges``, spanning two batches and cut at ``max_attention_examples``) with the layer's
    coefficients rebuilds each block's output at the nodes of the kept graphs through an explicit
    float64 dense ``f(P) V = sum_k c_k P^k V`` per head: the recorded ``P`` is the one the block diffused over."""
    from torch_geometric.data import Batch

    from diffusionformer.analysis import capture_dataset
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(
        in_channels=5, num_classes=2, task="graph", dim=8, depth=2, num_heads=2, heads=heads)).double().eval()
    batches = [Batch.from_data_list([_graph(4, 1), _graph(1, 2)]), Batch.from_data_list([_graph(6, 3), _graph(3, 4)])]
    cap = capture_dataset(model, [(b, b.y) for b in batches], attentions=True, max_attention_examples=3)
    assert cap.num_attention_examples == 3
    n_kept = int(cap.lengths()[:3].sum())  # 4 + 1 + 6 nodes
    H, hd = 2, 4
    for i, block in enumerate(model.blocks):
        with torch.no_grad():
            x = cap.states[i][cap.mask].double()  # float32 in the capture: rebuilt from those rounded values
            y_true = cap.states[i + 1][cap.mask].double()[:n_kept]
            ei, P = cap.attention_edges[i], cap.attentions[i].double()
            assert int(ei.max()) < n_kept and bool((ei[0] != ei[1]).sum() > 0)
            coeffs = block.attn(block.norm1(x[:1]), edge_index=torch.zeros(2, 1, dtype=torch.long),
                                return_intermediates=True)[1].coefficients.double()
            h = block.norm1(x)[:n_kept]
            v = block.attn.qkv(h)[:, 2 * 8:]
            outs = []
            for head in range(H):
                dense = torch.zeros(n_kept, n_kept, dtype=torch.float64)
                dense.index_put_((ei[1], ei[0]), P[:, head], accumulate=True)  # P[i, j] of edge j -> i
                vh = v[:, head * hd:(head + 1) * hd]
                acc, power = torch.zeros_like(vh), vh
                for k in range(coeffs.shape[1]):
                    acc, power = acc + coeffs[head, k] * power, dense @ power
                outs.append(acc)
            z = x[:n_kept] + block.attn.out_proj(torch.cat(outs, -1))
            y_ref = z + block.mlp(block.norm2(z))
        torch.testing.assert_close(y_ref, y_true, rtol=1e-5, atol=1e-5)


def test_bug_drop_prefix_cuts_per_token_outputs_with_the_tokens_and_labels():
    """Bug: ``LayerCapture.drop_prefix(k)`` cut the states, the per-token labels and the attention maps of a GPT
    capture to ``T - k`` tokens but kept the per-token outputs ``(B, T, V)`` whole, so ``outputs.argmax(-1)`` no
    longer lined up with ``labels`` (a ``(B, T)`` against ``(B, T - k)`` comparison, or silently shifted rows after
    a reshape). Per-token outputs are now cut like the tokens; per-sequence outputs ``(B, C)`` stay as they are."""
    from diffusionformer.analysis import capture_dataset

    gpt = _gpt()
    idx = torch.randint(0, 11, (3, 6))
    targets = torch.randint(0, 11, (3, 6))
    cap = capture_dataset(gpt, [(idx, targets)], keep_outputs=True, attentions=True)
    with torch.no_grad():
        logits = gpt(idx)[0]
    cut = cap.drop_prefix(2)
    assert cut.labels.shape == (3, 4) and cut.states[2].shape == (3, 4, 16)
    assert cut.outputs.shape == (3, 4, 11)
    torch.testing.assert_close(cut.outputs, logits[:, 2:])
    assert (cut.outputs.argmax(-1) == cut.labels).shape == (3, 4)  # comparable, token by token
    # per-sequence outputs (B, C) hold no tokens, even where C == T: kept as they are
    seq = LayerCapture({0: torch.zeros(2, 4, 1)}, outputs=torch.ones(2, 4))
    assert seq.drop_prefix(1).outputs is seq.outputs


def test_bug_capture_of_a_forward_without_batch_pads_each_graph_of_the_batch():
    """Bug: with ``forward=lambda m, b: m(b.x, b.edge_index)`` (a node model called without ``batch``: the same node
    states, as no edge joins two graphs) the blocks saw no batch vector, and ``capture_dataset`` stored the 3 graphs
    of the Batch as ONE padded "sequence" of all 12 nodes while it counted (and took labels for) 3 graphs: states
    ``(1, 12, D)`` beside labels ``(3,)``, every per-graph metric mixing graphs, and ``max_examples=2`` merged two
    graphs into one row. The graphs are now cut by the Batch's own batch vector, as the model's default call does."""
    from torch_geometric.data import Batch, Data

    from diffusionformer.analysis import capture_dataset
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, task="node", dim=8,
                                                             num_heads=2)).eval()
    g = torch.Generator().manual_seed(3)
    graphs = [Data(x=torch.randn(n, 3, generator=g), edge_index=torch.randint(0, n, (2, 2 * n), generator=g))
              for n in (3, 4, 5)]
    b = Batch.from_data_list(graphs)
    labels = torch.tensor([0, 1, 0])
    ref = capture_dataset(model, [(b, labels)], attentions=True)  # model(b.x, b.edge_index, b.batch)
    got = capture_dataset(model, [(b, labels)], attentions=True, forward=lambda m, d: m(d.x, d.edge_index))
    assert got.states[2].shape == ref.states[2].shape == (3, 5, 8)
    torch.testing.assert_close(got.mask, ref.mask)
    for layer in ref.layers:
        torch.testing.assert_close(got.states[layer], ref.states[layer])
    torch.testing.assert_close(got.attention_edges[1], ref.attention_edges[1])
    assert got.labels.tolist() == [0, 1, 0]
    cut = capture_dataset(model, [b], forward=lambda m, d: m(d.x, d.edge_index), max_examples=2)
    assert cut.states[0].shape == (2, 4, 8) and cut.lengths().tolist() == [3, 4]


@pytest.mark.parametrize("order", [(3, 0, 2), (0, 3, 2), (3, 2, 0)])
def test_bug_capture_of_a_batch_whose_graphs_have_no_nodes(order):
    """Bug: a batch whose graphs all have no nodes (a ``batch_size=1`` loader over a data set holding an empty
    graph) made ``capture_dataset`` fail with "layers [0, 1, 2] were not recorded: did the forward call run
    model.blocks?": the model maps zero nodes without running its blocks (it still gives the empty graph's logits).
    The same graph inside a larger batch was captured as a row of length 0; it now is in its own batch too, and the
    capture equals that of one batch of all the graphs (states, mask, labels, outputs, sparse attention)."""
    from torch_geometric.data import Batch, Data

    from diffusionformer.analysis import capture_dataset, layer_reports
    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, task="graph", dim=8,
                                                             num_heads=2)).eval()
    g = torch.Generator().manual_seed(5)
    graphs = [Data(x=torch.randn(n, 3, generator=g), edge_index=torch.randint(0, max(n, 1), (2, 2 * n), generator=g))
              for n in order]
    labels = torch.tensor([0, 1, 1])
    one = Batch.from_data_list(graphs)
    ref = capture_dataset(model, [(one, labels)], keep_outputs=True, attentions=True)
    singles = [(Batch.from_data_list([d]), labels[i:i + 1]) for i, d in enumerate(graphs)]
    got = capture_dataset(model, singles, keep_outputs=True, attentions=True)
    assert got.lengths().tolist() == list(order)
    torch.testing.assert_close(got.mask, ref.mask)
    for layer in ref.layers:
        torch.testing.assert_close(got.states[layer], ref.states[layer])
    assert got.labels.tolist() == [0, 1, 1]
    torch.testing.assert_close(got.outputs, ref.outputs)
    assert got.num_attention_examples == ref.num_attention_examples == 3
    def weighted_edges(cap, i):  # the edges in (target, source) order, with their weights
        ei = cap.attention_edges[i]
        by = torch.argsort(ei[1] * 1000 + ei[0], stable=True)
        return ei[:, by], cap.attentions[i][by]

    for i in ref.attentions:  # the same weighted edges (each call's graph orders them its own way)
        torch.testing.assert_close(weighted_edges(got, i), weighted_edges(ref, i))
    # the same metrics up to float32 rounding: a graph's states computed alone and inside a batch may round apart
    # (the states above agree within assert_close's float32 tolerance; bit equality held on some CPUs only)
    for a, b in zip(layer_reports(got), layer_reports(ref), strict=True):
        assert a.metrics.keys() == b.metrics.keys()
        for key in b.metrics:
            want = b.metrics[key]
            assert a.metrics[key] == (want if want is None else pytest.approx(want, rel=1e-5, abs=1e-6)), key
    empty_first = [singles[order.index(0)]] + [s for s in singles if s[0].num_nodes]
    first_empty = capture_dataset(model, empty_first, attentions=True, max_attention_examples=1)
    assert first_empty.attentions is None and first_empty.num_attention_examples == 0  # its one example has no edge
    empty = [s for s in singles if s[0].num_nodes == 0]
    with pytest.raises(ValueError, match="without any node"):
        capture_dataset(model, empty * 2, attentions=True)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_bug_pad_by_batch_takes_graph_ids_of_every_integer_dtype(dtype):
    """Bug: ``pad_by_batch`` accepts any integer ``batch`` (it refuses float, complex and bool ids by name), but
    indexed with it as is: uint8 ids were read as a (deprecated) boolean mask ("The shape of the mask [5] at index 0
    does not match ...") and int8/int16 ids were refused by indexing ("tensors used as indices must be long, int,
    byte or bool"). Ids of every integer dtype now pad as their int64 values do (PyG's ``to_dense_batch`` as the
    reference)."""
    from torch_geometric.utils import to_dense_batch

    from diffusionformer.analysis.capture import pad_by_batch

    x = torch.arange(10.0).reshape(5, 2)
    ids = torch.tensor([0, 0, 1, 3, 3])
    ref, ref_mask = to_dense_batch(x, ids, batch_size=4)
    padded, mask = pad_by_batch(x, ids.to(dtype))
    torch.testing.assert_close(padded, ref)
    assert torch.equal(mask, ref_mask)
    padded, mask = pad_by_batch(x, ids.to(dtype), num_graphs=5)
    assert padded.shape == (5, 2, 2) and mask.sum(dim=1).tolist() == [2, 1, 0, 2, 0]
