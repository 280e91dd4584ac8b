"""Edge-case probes of the token-geometry analysis (seventh pass): sparse operators, autograd of the recorder."""

from __future__ import annotations

import pytest
import torch

from diffusionformer.analysis.capture import LayerRecorder
from diffusionformer.analysis.metrics import dirichlet_energy, within_sequence_variance
from diffusionformer.analysis.spectral import effective_rank, eigenvalues_of
from diffusionformer.models import DiffusionGPT, GPTConfig


def test_bug_sparse_operators_and_tokens_are_refused_by_name() -> None:
    """Bug: a sparse P (a graph operator built with ``to_sparse()``) given to ``eigenvalues_of`` or as the dense ``P`` of
    ``dirichlet_energy``, or sparse tokens, failed with a bare ``NotImplementedError`` ("Could not run 'aten::ne.Scalar'
    ... SparseCPU") from inside the input checks, naming no argument; now a TypeError names it and says what to pass."""
    g = torch.Generator().manual_seed(0)
    P = torch.rand(4, 4, generator=g)
    X = torch.randn(1, 4, 3, generator=g)
    with pytest.raises(TypeError, match=r"P must be a dense \(strided\) tensor, got layout torch.sparse_coo"):
        eigenvalues_of(P.to_sparse())
    with pytest.raises(TypeError, match=r"P must be a dense .*edge_index"):
        dirichlet_energy(X, P.to_sparse())
    with pytest.raises(TypeError, match=r"X must be a dense .*X.to_dense\(\)"):
        within_sequence_variance(X.to_sparse())
    with pytest.raises(TypeError, match=r"s must be a dense"):
        effective_rank(torch.rand(5, generator=g).to_sparse())
    # the dense operator, and the sparse graph given as edges, are still measured (and agree)
    lam = eigenvalues_of(P)
    assert lam.shape == (4,) and abs(complex(lam.sum()) - float(P.double().trace())) < 1e-12
    S = P.to_sparse().coalesce()
    dense = dirichlet_energy(X, P, normalized=False)
    edges = dirichlet_energy(X[0], edge_index=S.indices().flip(0), edge_weight=S.values(), normalized=False)
    assert torch.allclose(dense, edges, rtol=1e-5)


def test_bug_layer_recorder_keeps_no_autograd_graph_of_the_recomputed_attention() -> None:
    """Bug: a LayerRecorder used with gradients on (a training step) recomputed each block's attention with autograd,
    so ``rec.attentions[i].attn_weights`` held an autograd graph (q, k, the normed input) alive until the next pass,
    unlike the detached ``states``; now the read-out is recomputed under ``no_grad`` (same values)."""
    torch.manual_seed(0)
    gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8)).eval()
    ids = torch.randint(0, 11, (2, 6))
    with LayerRecorder(gpt, attentions=True) as rec:
        out = gpt(ids)
    logits = out[0] if isinstance(out, (tuple, list)) else out
    assert logits.requires_grad  # the model's own pass still builds its graph
    for i in (0, 1):
        w = rec.attentions[i].attn_weights
        assert not w.requires_grad and w.grad_fn is None
        assert not rec.states[i + 1].requires_grad
    with torch.no_grad(), LayerRecorder(gpt, attentions=True) as ref:
        gpt(ids)
    for i in (0, 1):
        assert torch.equal(rec.attentions[i].attn_weights, ref.attentions[i].attn_weights)
