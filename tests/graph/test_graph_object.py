"""AttentionGraph: the masks it hands the layer, its conversions and its repr."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from diffusionformer import DiffusionAttention
from diffusionformer.graph import AttentionGraph, causal, complete, grid, sliding_window


def test_complete_graph_needs_no_mask() -> None:
    assert complete(5).attention_kwargs(torch.zeros(3, 5, 8)) == {}


def test_plain_causal_graph_uses_the_fused_causal_flag() -> None:
    kw = causal(4).attention_kwargs(torch.zeros(2, 4, 8))
    assert kw == {"is_causal": True}
    # a causal window still needs an explicit mask
    kw = sliding_window(4, 1, causal=True).attention_kwargs(torch.zeros(2, 4, 8))
    assert set(kw) == {"attn_mask"} and kw["attn_mask"].shape == (4, 4)
    assert torch.equal(kw["attn_mask"], torch.ones(4, 4, dtype=torch.bool).tril() & torch.ones(4, 4, dtype=torch.bool).triu(-1))


def test_padding_only_gives_a_key_padding_mask() -> None:
    kpm = torch.tensor([[False, True]])
    kw = complete(2, key_padding_mask=kpm).attention_kwargs(torch.zeros(1, 2, 8))
    assert set(kw) == {"key_padding_mask"} and torch.equal(kw["key_padding_mask"], kpm)


def test_window_and_per_sequence_masks_have_broadcastable_shapes() -> None:
    assert sliding_window(6, 1).attention_kwargs(torch.zeros(2, 6, 8))["attn_mask"].shape == (6, 6)
    assert grid(2, 3).attention_kwargs(torch.zeros(2, 6, 8))["attn_mask"].shape == (6, 6)
    allowed = torch.ones(2, 3, 3, dtype=torch.bool)
    kw = AttentionGraph.dense(3, causal=True, allowed=allowed).attention_kwargs(torch.zeros(2, 3, 8))
    assert kw["attn_mask"].shape == (2, 1, 3, 3)
    assert torch.equal(kw["attn_mask"][1, 0], torch.ones(3, 3, dtype=torch.bool).tril())


def test_sparse_graph_gives_edge_index() -> None:
    g = causal(3, layout="sparse")
    kw = g.attention_kwargs(torch.zeros(3, 8))
    assert set(kw) == {"edge_index"} and torch.equal(kw["edge_index"], g.edge_index)


def test_dense_graph_without_batch_size_serves_any_batch() -> None:
    g = sliding_window(5, 1)
    assert g.batch_size is None
    layer = DiffusionAttention(8, 2, heads="laplacian")
    for B in (1, 3):
        assert layer(torch.randn(B, 5, 8), graph=g).shape == (B, 5, 8)
    assert g.dense_allowed().shape == (1, 5, 5)
    assert g.dense_allowed(4).shape == (4, 5, 5)
    assert g.to_sparse(batch_size=2).num_nodes == 10


def test_batch_size_is_inferred_from_the_masks() -> None:
    assert complete(3, key_padding_mask=torch.zeros(4, 3, dtype=torch.bool)).batch_size == 4
    assert AttentionGraph.dense(3, allowed=torch.ones(2, 3, 3, dtype=torch.bool)).batch_size == 2
    with pytest.raises(ValueError, match="disagrees"):
        complete(3, 2).dense_allowed(batch_size=3)


def test_layer_output_matches_explicit_masks() -> None:
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads="attention:1,heat(t=1.0, steps=4):1").double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    kpm = torch.tensor([[False] * 5, [False, False, False, True, True]])
    g = sliding_window(5, 1, causal=True, key_padding_mask=kpm)
    band = torch.ones(5, 5, dtype=torch.bool).tril() & torch.ones(5, 5, dtype=torch.bool).triu(-1)
    expected = layer(x, attn_mask=band, key_padding_mask=kpm)
    torch.testing.assert_close(layer(x, graph=g), expected, atol=1e-12, rtol=0)


def test_round_trip_dense_sparse_dense_keeps_the_allowed_matrix() -> None:
    kpm = torch.tensor([[False, False, False, True], [False, False, False, False]])
    g = sliding_window(4, 1, causal=True, key_padding_mask=kpm)
    s = g.to_sparse()
    assert s.batch_size == 2 and s.num_nodes == 8
    assert torch.equal(s.batch, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))
    # padding token 3 of sequence 0 is an isolated node
    assert not ((s.edge_index == 3).any())
    assert torch.equal(s.to_dense().dense_allowed(), g.dense_allowed())
    assert torch.equal(s.dense_allowed(), g.dense_allowed())


def test_to_dense_groups_nodes_as_to_dense_batch() -> None:
    from torch_geometric.utils import to_dense_batch

    edge_index = torch.tensor([[0, 2, 3, 4, 5], [1, 2, 4, 3, 3]])
    batch = torch.tensor([0, 0, 1, 1, 1, 1])
    d = AttentionGraph.sparse(edge_index, batch=batch).to_dense()
    assert d.batch_size == 2 and d.seq_len == 4
    _, real = to_dense_batch(torch.zeros(6, 1), batch)
    assert torch.equal(d.key_padding_mask, ~real)
    expected = torch.zeros(2, 4, 4, dtype=torch.bool)
    # graph 0: nodes 0, 1 at positions 0, 1; graph 1: nodes 2..5 at positions 0..3
    for b, i, j in [(0, 1, 0), (1, 0, 0), (1, 2, 1), (1, 1, 2), (1, 1, 3)]:
        expected[b, i, j] = True
    assert torch.equal(d.dense_allowed(), expected)


def test_to_dense_of_an_unbatched_graph_is_one_sequence() -> None:
    d = AttentionGraph.sparse(torch.tensor([[0], [1]]), 3).to_dense()
    assert d.batch_size == 1 and d.allowed.shape == (3, 3) and d.key_padding_mask is None


def test_repr() -> None:
    assert repr(causal(4)) == "AttentionGraph(dense, N=4, causal=True)"
    assert repr(sliding_window(4, 2, batch_size=3)) == "AttentionGraph(dense, B=3, N=4, window=2)"
    assert repr(grid(2, 2, batch_size=2, layout="sparse")) == "AttentionGraph(sparse, num_nodes=8, E=32, graphs=2)"
    assert repr(AttentionGraph.sparse(torch.tensor([[0], [1]]), batch=torch.tensor([0, 0]))) == (
        "AttentionGraph(sparse, num_nodes=2, E=1, batch=True)"
    )


def test_graph_is_immutable_and_replace_revalidates() -> None:
    g = causal(4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.causal = False  # type: ignore[misc]
    padded = dataclasses.replace(g, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    assert padded.batch_size == 2
    with pytest.raises(ValueError, match="key_padding_mask must have shape"):
        dataclasses.replace(g, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))


def test_to_device_keeps_the_graph() -> None:
    g = grid(2, 2, layout="sparse").to("cpu")
    assert g.device == torch.device("cpu") and g.num_nodes == 4
    assert complete(3).device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_masks_are_built_on_the_input_device() -> None:  # pragma: no cover - GPU only
    x = torch.zeros(2, 4, 8, device="cuda")
    for g in (causal(4), sliding_window(4, 1), grid(2, 2),
              complete(4, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))):
        tensors = [t for t in g.attention_kwargs(x).values() if isinstance(t, torch.Tensor)]  # not is_causal=True
        assert tensors or g.attention_kwargs(x) == {"is_causal": True}
        for t in tensors:
            assert t.device.type == "cuda"
    assert causal(4, layout="sparse").attention_kwargs(x[0]).get("edge_index").device.type == "cuda"
    kpm = torch.tensor([[False, False, False, True]] * 2, device="cuda")
    g = sliding_window(4, 1, key_padding_mask=kpm)
    assert g.device.type == "cuda"
    s = g.to_sparse()
    assert s.edge_index.device.type == "cuda"
    assert torch.equal(s.to_dense().dense_allowed(), g.dense_allowed())
    from diffusionformer.graph import knn, to_networkx

    assert knn(torch.randn(2, 5, 3, device="cuda"), 2).edge_index.device.type == "cuda"
    layer = DiffusionAttention(8, 2).cuda()
    _, inter = layer(torch.randn(8, 8, device="cuda"), graph=s, return_intermediates=True)
    assert to_networkx(inter, top_k=1).number_of_edges() == 6  # one in-edge per real token
