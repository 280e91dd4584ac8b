"""Fifth edge-case probe of the sparse (edge-list) engine: dry runs without values (meta and fake tensors).

The dense engine runs on meta tensors and under :class:`~torch._subclasses.fake_tensor.FakeTensorMode` (shape
inference of a deferred-init model, a dry run); the sparse engine's default back-end did not. References: the
shapes and dtypes of the same call on real tensors, and the gather-scatter back-end, which has meta kernels.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from diffusionformer.nn import DiffusionAttention
from diffusionformer.ops.sparse import diffuse_sparse, diffuse_sparse_with_weights, edge_attention, propagate_sparse

N, H, C = 5, 2, 3
EDGES = [[3, 0, 1, 1, 4], [1, 1, 2, 2, 0]]  # unsorted, a duplicate, a forward edge (3 -> 1) and node 3 without inputs


def _calls(q, ei, coeffs, backend, is_causal):
    out, w = diffuse_sparse_with_weights(q, q, q, ei, coeffs, backend=backend, is_causal=is_causal)
    return (out, w, diffuse_sparse(q, q, q, ei, coeffs, backend=backend, is_causal=is_causal),
            edge_attention(q, q, ei, backend=backend), propagate_sparse(w, q, ei, backend=backend))


def _shapes(ts):
    return [(tuple(t.shape), t.dtype) for t in ts]


@pytest.mark.parametrize("coeffs", [[0.5, 1.0], [0.5, 1.0, -0.25]])
def test_bug_default_sparse_backend_runs_on_meta_and_fake_tensors(coeffs):
    """Bug: ``backend='auto'`` took the CSR kernels for meta and fake inputs: on meta ``NotImplementedError: Could not
    run 'aten::sparse_sampled_addmm.out' ... 'SparseCsrMeta'``, under ``FakeTensorMode`` a
    ``DataDependentOutputException`` from the layout's sortedness test (it reads the edges), while the dense engine
    and the gather-scatter back-end both run such dry runs. It now takes the gather-scatter path there."""
    ei = torch.tensor(EDGES)
    want = _shapes(_calls(torch.zeros(N, H, C), ei, coeffs, "auto", False))
    assert _shapes(_calls(torch.zeros(N, H, C, device="meta"), ei.to("meta"), coeffs, "auto", False)) == want
    with FakeTensorMode():
        got = _calls(torch.zeros(N, H, C), torch.tensor(EDGES), coeffs, "auto", False)
    assert all(isinstance(t, FakeTensor) for t in got) and _shapes(got) == want
    with torch.device("meta"):
        layer = DiffusionAttention(H * C, H)
    y = layer(torch.zeros(N, H * C, device="meta"), edge_index=ei.to("meta"))
    assert y.is_meta and y.shape == (N, H * C)


@pytest.mark.parametrize("backend", ["auto", "native"])
def test_bug_causal_sparse_call_runs_on_meta_and_fake_edges(backend):
    """Bug: ``is_causal=True`` dropped the forward edges by a boolean index, a data-dependent shape that a meta or fake
    ``edge_index`` cannot give (``DynamicOutputShapeException: aten.nonzero`` under ``FakeTensorMode``), even on the
    gather-scatter back-end. Such an ``edge_index`` now takes the mask path, as on CUDA and under torch.compile."""
    ei = torch.tensor(EDGES)
    want = _shapes(_calls(torch.zeros(N, H, C), ei, [0.5, 1.0], backend, True))
    assert _shapes(_calls(torch.zeros(N, H, C, device="meta"), ei.to("meta"), [0.5, 1.0], backend, True)) == want
    with FakeTensorMode():
        got = _calls(torch.zeros(N, H, C), torch.tensor(EDGES), torch.ones(H, 3), backend, True)
    assert _shapes(got) == want


def test_bug_explicit_csr_backend_on_meta_or_fake_tensors_is_a_clear_error():
    """Bug: ``backend='csr'`` on meta tensors failed inside the sparse kernels (``NotImplementedError`` naming
    ``SparseCsrMeta``), and under ``FakeTensorMode`` with a ``DataDependentOutputException``; now a ValueError that
    names the back-end and the alternatives."""
    q, ei = torch.zeros(N, H, C, device="meta"), torch.tensor(EDGES, device="meta")
    w = torch.zeros(len(EDGES[0]), H, device="meta")
    for call in (lambda: diffuse_sparse(q, q, q, ei, [0.5, 1.0], backend="csr"),
                 lambda: edge_attention(q, q, ei, backend="csr"),
                 lambda: propagate_sparse(w, q, ei, backend="csr")):
        with pytest.raises(ValueError, match=r"^backend='csr' cannot run on meta tensors .*'auto' or 'native'"):
            call()
    with FakeTensorMode():
        q, ei = torch.zeros(N, H, C), torch.tensor(EDGES)
        with pytest.raises(ValueError, match=r"^backend='csr' cannot run on fake tensors"):
            diffuse_sparse(q, q, q, ei, [0.5, 1.0], backend="csr")


def test_real_tensors_keep_the_csr_path_and_its_values():
    """The dry-run routing leaves real CPU inputs on the CSR kernels, whose values equal the gather-scatter path."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(N, H, C, generator=g, dtype=torch.float64) for _ in range(3))
    ei = torch.tensor(EDGES)
    for causal in (False, True):
        auto = diffuse_sparse_with_weights(q, k, v, ei, [0.5, 1.0, -0.25], is_causal=causal)
        native = diffuse_sparse_with_weights(q, k, v, ei, [0.5, 1.0, -0.25], is_causal=causal, backend="native")
        for a, b in zip(auto, native):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-14)
