"""Edge probes of the token graphs, ninth pass: sparse builders on the meta device, unsigned index dtypes."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.graph import AttentionGraph, causal, complete, from_edge_index, grid, sliding_window


@pytest.mark.parametrize("build", [
    lambda: complete(3, layout="sparse", device="meta"),
    lambda: causal(3, layout="sparse", device="meta"),
    lambda: sliding_window(3, 1, layout="sparse", device="meta"),
    lambda: sliding_window(3, 1, layout="sparse", key_padding_mask=torch.zeros(1, 3, dtype=torch.bool, device="meta")),
    lambda: grid(2, 2, layout="sparse", device="meta"),
])
def test_bug_sparse_builders_on_meta_are_a_clear_error(build) -> None:
    """Bug: a sparse builder on the meta device raised torch.nonzero's NotImplementedError ('register_meta ...')
    from the edge enumeration, or (complete) told the caller to pass checked=False, which the builders do not take."""
    with pytest.raises(ValueError, match="device is meta, but layout='sparse'.*layout='dense'"):
        build()


def test_sparse_builders_on_meta_dense_layout_still_builds() -> None:
    """The dense layout reads no values: it stays available on the meta device."""
    assert grid(2, 2, device="meta").allowed.device.type == "meta"
    assert sliding_window(3, 1, device="meta").window == 1


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_bug_unsigned_index_dtypes_are_integers(dtype: torch.dtype) -> None:
    """Bug: an edge_index or batch of dtype uint16/uint32/uint64 was refused with the contradictory 'must be an
    integer tensor ..., got dtype torch.uint32' (uint8 was accepted, and to_networkx and knn's batch took them)."""
    ei = torch.tensor([[0, 1], [1, 2]], dtype=dtype)
    g = AttentionGraph.sparse(ei, batch=torch.zeros(3, dtype=dtype))
    ref = AttentionGraph.sparse(ei.long(), batch=torch.zeros(3, dtype=torch.long))
    assert g.edge_index.dtype == torch.long and g.batch.dtype == torch.long
    assert torch.equal(g.dense_allowed(), ref.dense_allowed())
    assert from_edge_index(ei, 3, self_loops=True).edge_index.tolist() == [[0, 1, 0, 1, 2], [1, 2, 0, 1, 2]]
    with pytest.raises(TypeError, match="edge_index must be an integer tensor.*float32"):
        AttentionGraph.sparse(ei.float())
    with pytest.raises(TypeError, match="edge_index must be an integer tensor.*bool"):
        AttentionGraph.sparse(ei.bool())
