"""Fourth edge-case probe of the sparse (edge-list) engine: no bug found; these pin the probed behaviour.

References: the graph as a dense float64 matrix (scores masked to the edges, softmax per target row,
duplicate edges counted once each, as in PyG), and the gather-scatter back-end.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.ops.sparse import diffuse_sparse, edge_attention

BACKENDS = ["csr", "native"]


def _dense_reference(q, k, v, edge_index, coeffs):
    """sum_k c_k P^k v with P the per-target softmax over the edge list (multi-edges add their mass), float64."""
    q, k, v = q.double(), k.double(), v.double()
    N, H, C = q.shape
    count = torch.zeros(N, N, dtype=torch.float64)
    for j, i in edge_index.t().tolist():
        count[i, j] += 1
    out = torch.zeros(N, H, v.shape[-1], dtype=torch.float64)
    for h in range(H):
        s = q[:, h] @ k[:, h].T * C**-0.5
        e = count * torch.exp(s - s.max())
        den = e.sum(1, keepdim=True)
        P = torch.where(den > 0, e / den.clamp_min(1e-300), torch.zeros_like(e))
        x, acc = v[:, h], torch.zeros_like(v[:, h])
        for c in coeffs:
            acc, x = acc + c * x, P @ x
        out[:, h] = acc
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_stride_zero_and_transposed_edge_index_match_the_dense_reference(backend):
    torch.manual_seed(0)
    N, H, C = 6, 2, 3
    q, k, v = torch.randn(N, H, C), torch.randn(N, H, C), torch.randn(N, H, C)
    # a broadcast (stride-0) edge list: five copies of the edge 1 -> 2
    expanded = torch.tensor([[1], [2]]).expand(2, 5)
    w = edge_attention(q, k, expanded, backend=backend)
    torch.testing.assert_close(w, torch.full((5, H), 0.2))
    # unsorted, duplicates, self-loops, an isolated node, given as a transposed (non-contiguous) int32 view
    edges = torch.tensor([[3, 0, 0, 2, 5, 1, 1, 4, 2], [0, 0, 0, 1, 1, 4, 4, 4, 2]])
    strided = edges.t().contiguous().int().t()
    assert not strided.is_contiguous()
    out = diffuse_sparse(q, k, v, strided, [0.3, 0.5, 0.2], backend=backend)
    torch.testing.assert_close(out.double(), _dense_reference(q, k, v, edges, [0.3, 0.5, 0.2]), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("coeffs", [[0.5, 0.5], [1.0, 0.0], [0.0, 1.0], [1.0], [0.2, 0.3, 0.5]])
def test_inputs_are_not_written_to_when_head_major_views_alias_them(backend, coeffs):
    """With one head or one node the head-major copy of v can share v's storage; the in-place combination
    must not reach the caller's tensors."""
    torch.manual_seed(1)
    for N, H in ((1, 1), (5, 1), (1, 3)):
        q, k, v = torch.randn(N, H, 4), torch.randn(N, H, 4), torch.randn(N, H, 4)
        before = [t.clone() for t in (q, k, v)]
        edges = torch.tensor([[0, N - 1], [N - 1, 0]])
        out = diffuse_sparse(q, k, v, edges, coeffs, backend=backend)
        out.add_(1.0)
        for t, t0 in zip((q, k, v), before):
            assert torch.equal(t, t0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_nodes_and_zero_value_channels(backend):
    empty = torch.zeros(2, 0, dtype=torch.long)
    out = diffuse_sparse(torch.randn(0, 2, 3), torch.randn(0, 2, 3), torch.randn(0, 2, 3), empty, [0.0, 1.0, 1.0],
                         backend=backend)
    assert out.shape == (0, 2, 3)
    edges = torch.tensor([[0, 1, 2], [1, 2, 0]])
    out = diffuse_sparse(torch.randn(3, 2, 3), torch.randn(3, 2, 3), torch.randn(3, 2, 0), edges, [0.0, 1.0, 1.0],
                         backend=backend)
    assert out.shape == (3, 2, 0)
