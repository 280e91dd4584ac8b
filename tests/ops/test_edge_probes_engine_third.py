"""Edge-case probes, third pass: the propagation engine (``ops/engine.py``), the dense and sparse back-ends
(``dense.py``, ``csr.py``, ``sparse.py``, ``scatter.py``), the uniform map, the recomputation and the checks, through
the public functional API.

Found and fixed (each pinned by a "Bug:" test below):

* second-order gradients (``create_graph=True``: gradient penalties, meta-learning) through the default sparse
  back-end ``"csr"``, and so through every sparse ``DiffusionAttention`` (which always takes ``"auto"``), failed
  with torch's "sparse_sampled_addmm(): functions with out=... arguments don't support automatic
  differentiation": the CSR autograd functions' backward passes used ``out=`` kernels that record no graph;
* ``propagate_dense`` did not check the device of ``x`` (``diffuse`` checks ``v``): a ``x`` on another device
  failed inside SDPA with a message about "value", an argument the function does not have;
* ``choose_dense_backend`` (public) read any truthy ``is_causal`` (``"no"``, a numpy bool) as True and a
  ``torch.device("cuda")`` given as ``device_type`` as "not cuda", silently applying the CPU rule;
* static coefficient rows given as a tuple of tuples were validated through a cache that compares keys by value,
  and ``True == 1.0``: ``((False, True),)`` was refused on a fresh call but accepted (as ``(0.0, 1.0)``) once an
  equal tuple of floats had been seen, so the check depended on the call history.

Probed and found working (checked here or by the earlier rounds' files): every dense back-end against explicit
float64 softmax matrices (bool and float masks with whole rows masked, causal, per-head degrees), float64
``gradcheck`` on every path (float masks that require grad included), ``nn.MultiheadAttention`` with padding and
``N != M``, float16 / bfloat16 and non-contiguous or stride-0 inputs, batch size, heads, tokens and value width 0,
the sparse back-ends against an explicit ``P`` built from the edge list (isolated nodes, duplicates, self loops,
unsorted and int32 ``edge_index``, no edges), dropout (the same bits under one seed, the mean of many draws is the
output without dropout, finite gradients with rows without keys), and the recomputation (the same bits as without
it for GQA, float masks, rows without keys, non-consecutive head groups, float64 and bfloat16).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import diffusionformer.functional as DF
import diffusionformer.ops.csr as csr_mod
import diffusionformer.ops.sparse as sparse_mod
from diffusionformer import DiffusionAttention
from diffusionformer.ops._checks import check_layout
from diffusionformer.ops.sparse import diffuse_sparse_with_weights

f64 = torch.float64
N, H, C = 7, 2, 3
#: unsorted, a self loop (1 -> 1), a duplicate (3 -> 2 twice), node 5 without in-edges
EDGES = torch.tensor([[4, 0, 1, 1, 2, 3, 3, 0, 5, 6, 6], [0, 1, 1, 2, 0, 2, 2, 1, 4, 4, 3]])


def _rand(*shape, seed, dtype=f64, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=f64).to(dtype).requires_grad_(requires_grad)


# ---------------------------------------------------------------------------- bugs
@pytest.mark.parametrize("edges", [EDGES, EDGES.int()], ids=["int64", "int32"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_bug_csr_second_order_gradients(edges, is_causal):
    """Bug: ``torch.autograd.grad(..., create_graph=True)`` through ``diffuse_sparse`` on the default ``"csr"``
    back-end failed with "sparse_sampled_addmm(): functions with out=... arguments don't support automatic
    differentiation": the backward passes of the CSR autograd functions (scores, softmax, propagation) ran ``out=``
    kernels. Under ``create_graph`` they now compute the same sums with differentiable gathers and scatters."""
    q, k, v = (_rand(N, H, C, seed=s, requires_grad=True) for s in (1, 2, 3))
    c = torch.tensor([[0.5, 0.3, 0.2], [1.0, -1.0, 0.4]], dtype=f64, requires_grad=True)
    assert gradgradcheck(lambda q, k, v, c: diffuse_sparse_with_weights(q, k, v, edges, c, is_causal=is_causal),
                         (q, k, v, c))
    assert gradgradcheck(lambda q, k, v: DF.diffuse_sparse(q, k, v, edges, [1.0, -1.0], is_causal=is_causal),
                         (q, k, v))
    assert gradgradcheck(lambda q, k: DF.edge_attention(q, k, edges), (q, k))
    w = torch.rand(edges.shape[1], H, dtype=f64, generator=torch.Generator().manual_seed(4)).requires_grad_()
    assert gradgradcheck(lambda w, x: DF.propagate_sparse(w, x, edges), (w, v))
    assert gradgradcheck(lambda q, k, v: DF.diffuse_sparse(q, k, v, edges[:, :0], [0.5, 0.3, 0.2]), (q, k, v))


def test_bug_csr_gradient_penalty_of_a_sparse_layer_equals_the_native_backend(monkeypatch):
    """Bug: a gradient penalty (``create_graph=True``) on a sparse ``DiffusionAttention`` failed inside
    ``sparse_sampled_addmm``; the layer always takes ``backend="auto"`` (CSR), so no argument avoided it. Its
    second-order gradients now equal those of the gather-scatter back-end; first-order gradients keep the kernels'
    bits."""
    torch.manual_seed(0)
    layer = DiffusionAttention(6, 2, "attention:1,heat(t=1.0, steps=3):1").double()
    x = _rand(N, 6, seed=5, requires_grad=True)

    def penalty_grads():
        layer.zero_grad(set_to_none=True)
        (g,) = torch.autograd.grad(layer(x, edge_index=EDGES).square().sum(), x, create_graph=True)
        g.square().sum().backward()
        return [p.grad.clone() for p in layer.parameters()]

    got = penalty_grads()
    monkeypatch.setattr(sparse_mod, "_use_csr", lambda backend: False)
    want = penalty_grads()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_bug_propagate_dense_names_x_on_another_device():
    """Bug: ``propagate_dense(q, k, x_on_meta)`` failed inside SDPA with "Expected query, key, and value to have the
    same device type ... value.device: meta", naming an argument the function does not have."""
    q, k, x = (_rand(1, 2, 4, 3, seed=s, dtype=torch.float32) for s in (1, 2, 3))
    with pytest.raises(ValueError, match=r"x must be on the device of q \(cpu\), got meta"):
        DF.propagate_dense(q, k, x.to("meta"))


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"is_causal": np.bool_(False)}, TypeError, r"is_causal must be a bool, got numpy\.bool"),
    ({"is_causal": "no"}, TypeError, r"is_causal must be a bool, got str \('no'\)"),
    ({"device_type": torch.device("cuda")}, TypeError, r"device_type must be a device type string.*got torch\.device"),
    ({"max_degree": 2.5}, TypeError, r"max_degree must be a non-negative int, got float \(2\.5\)"),
    ({"num_queries": "128"}, TypeError, r"num_queries must be a non-negative int, got str"),
    ({"num_keys": -1}, ValueError, r"num_keys must be a non-negative int, got -1"),
])
def test_bug_choose_dense_backend_checks_its_arguments(kwargs, exc, match):
    """Bug: ``choose_dense_backend(128, 128, 2, is_causal="no")`` applied the causal limits (a truthy string; a
    numpy bool passed too, against the flag policy), ``device_type=torch.device("cuda")`` silently took the CPU rule
    (it is not equal to ``"cuda"``), ``max_degree=2.5`` picked ``"matrix"`` and strings failed with "'<=' not
    supported between instances of 'str' and 'int'"."""
    args = {"num_queries": 128, "num_keys": 128, "max_degree": 2}
    args.update(kwargs)
    n, m, d = args.pop("num_queries"), args.pop("num_keys"), args.pop("max_degree")
    with pytest.raises(exc, match=match):
        DF.choose_dense_backend(n, m, d, **args)


def test_choose_dense_backend_still_takes_numpy_ints_and_other_device_types():
    assert DF.choose_dense_backend(np.int64(64), 64, np.int32(4)) == "matrix"
    assert DF.choose_dense_backend(1024, 1024, 4, device_type="cuda") == "matrix"
    assert DF.choose_dense_backend(64, 64, 4, device_type="mps") == "matrix"  # any other type: the CPU limits


def test_bug_static_rows_of_bools_are_refused_whatever_was_seen_before():
    """Bug: ``diffuse(q, k, v, ((False, True), (False, True)))`` raised "coeffs given as rows (H, K+1) must hold
    numbers" on a fresh call, but after one call with ``((0.0, 1.0), (0.0, 1.0))`` the cache of validated rows (keys
    compared by value, ``True == 1.0``) returned that call's rows: the bools were accepted as coefficients."""
    q = _rand(1, 2, 3, 4, seed=1, dtype=torch.float32)
    DF.diffuse(q, q, q, ((0.0, 1.0), (0.0, 1.0)))
    for rows in (((False, True), (False, True)), ((np.False_, np.True_), (np.False_, np.True_))):
        with pytest.raises(TypeError, match=r"coeffs given as rows \(H, K\+1\) must hold numbers"):
            DF.diffuse(q, q, q, rows)
    # integer rows are numbers: accepted on either path
    assert torch.equal(DF.diffuse(q, q, q, ((0, 1), (0, 1))), DF.diffuse(q, q, q, ((0.0, 1.0), (0.0, 1.0))))


# ---------------------------------------------------------------------------- working edge cases
def test_sparse_edge_mask_path_equals_filtering_the_edges():
    """The mask path of ``is_causal`` (taken on CUDA and under ``torch.compile``, where filtering would synchronise)
    gives the bits of the filtered path on CPU, weights included, and exact gradients."""
    q, k, v = (_rand(N, H, C, seed=s, requires_grad=True) for s in (1, 2, 3))
    keep = EDGES[0] <= EDGES[1]
    for backend in ("csr", "native"):
        for rows in ([0.0, 1.0], [1.0, -1.0], [0.5, 0.3, 0.2]):
            want, w_want = diffuse_sparse_with_weights(q, k, v, EDGES, rows, backend=backend, is_causal=True)
            c, d = check_layout(rows, None, H, v)
            got, w_got = sparse_mod._diffuse_sparse(q, k, v, EDGES, c, N, C**-0.5, d, 0.0, backend, True, keep)
            assert torch.equal(got, want) and torch.equal(w_got, w_want)
        assert gradcheck(lambda q, k, v: sparse_mod._diffuse_sparse(q, k, v, EDGES, c, N, C**-0.5, d, 0.0, backend,
                                                                    False, keep)[0], (q, k, v))


def test_an_always_sorted_layout_equals_the_presorted_one(monkeypatch):
    """Off CPU the edges are always sorted (the sortedness test would synchronise): a presorted input gives the same
    bits and gradients either way."""
    q, k, v = (_rand(N, H, C, seed=s, requires_grad=True) for s in (1, 2, 3))
    edges = EDGES[:, torch.argsort(EDGES[1] * N + EDGES[0])]

    def run():
        out, w = diffuse_sparse_with_weights(q, k, v, edges, [0.5, 0.3, 0.2])
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        return (out, w) + grads

    want = run()
    monkeypatch.setattr(csr_mod, "_is_sorted", lambda key: False)
    for a, b in zip(run(), want):
        assert torch.equal(a, b)


def test_dense_causal_with_more_keys_than_queries_matches_explicit_matrices():
    """``propagate_dense`` / ``attention_matrix`` with ``N != M``: causal is top-left aligned (SDPA's convention) and
    combines with a mask that leaves a query without keys (a zero row)."""
    q = _rand(2, 2, 5, 3, seed=1)
    k, x = _rand(2, 2, 7, 3, seed=2), _rand(2, 2, 7, 4, seed=3)
    allowed = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    allowed[0, :, 2, :3] = False  # causal leaves keys 0..2 to query 2: none left
    keep = allowed & torch.ones(5, 7, dtype=torch.bool).tril()
    s = (q @ k.transpose(-1, -2) * 3**-0.5).masked_fill(~keep, float("-inf"))
    P = torch.softmax(s, dim=-1).nan_to_num(0.0)
    assert P[0, :, 2].abs().max() == 0
    torch.testing.assert_close(DF.attention_matrix(q, k, attn_mask=allowed, is_causal=True), P, rtol=0, atol=1e-14)
    torch.testing.assert_close(DF.propagate_dense(q, k, x, attn_mask=allowed, is_causal=True), P @ x,
                               rtol=0, atol=1e-14)


@pytest.mark.parametrize("backend", ["sdpa", "matrix"])
def test_dense_dropout_is_seeded_and_keeps_rows_without_keys_at_c0_v(backend):
    q, k, v = (_rand(2, 2, 5, 4, seed=s, dtype=torch.float32, requires_grad=True) for s in (1, 2, 3))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[:, :, 1] = False
    outs = []
    for _ in range(2):
        torch.manual_seed(7)
        outs.append(DF.diffuse(q, k, v, [0.5, 0.3, 0.2], attn_mask=mask, backend=backend, dropout_p=0.3))
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[0][:, :, 1], 0.5 * v[:, :, 1].detach())
    grads = torch.autograd.grad(outs[0].square().sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
