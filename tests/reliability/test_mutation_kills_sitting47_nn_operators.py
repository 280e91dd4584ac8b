"""Mutation audit (sitting 47) of nn/rotary.py, nn/edge_features.py, models/_graph_pe.py, operators/attnscale.py,
operators/neutreno.py and operators/grand.py: tests that kill mutants the earlier tests left alive (each docstring names
the mutant). No GPU is used.

74 mutants (rotary.py 13, edge_features.py 15, _graph_pe.py 15, attnscale.py 10, neutreno.py 8, grand.py 13):
66 killed by earlier tests, 7 survivors killed here (rotary.py 3, _graph_pe.py 4), 1 equivalent:

* grand.py ``apply_context`` ``if self.t == 0.0: return ctx.v`` dropped: with ``t = 0`` the step is ``tau = 0``, and
  ``state + 0 * field(state)`` (Euler, and each RK4 stage) is ``state`` exactly for finite inputs, its gradient the
  identity; only the attention calls the early return saves differ (the adaptive path, ``odeint`` over ``[0, 0]``,
  needs torchdiffeq, which is not installed here).
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.nn.rotary import RotaryEmbedding, RotaryEmbedding2D, apply_rotary


@pytest.mark.parametrize("cls", [RotaryEmbedding, RotaryEmbedding2D])
def test_kills_rotary_accepts_head_dim_zero(cls):
    """kills: nn/rotary.py ``_check_dim`` ``or head_dim < multiple`` -> ``or head_dim < 0`` (``head_dim=0`` is a
    multiple of 2 and 4: a RoPE of no channels was built, against the "positive multiple" the error promises)."""
    with pytest.raises(ValueError, match="positive multiple .* got 0"):
        cls(0)


def test_kills_apply_rotary_broadcasts_one_row_of_angles_over_every_token():
    """kills: nn/rotary.py ``_apply_rotary`` ``or angles.shape[0] != x.shape[-3]`` dropped (angles of one position,
    ``(1, C/2)``, broadcast over the N tokens: every token rotated by the first position's angles, silently)."""
    x = torch.randn(2, 3, 1, 4)
    with pytest.raises(ValueError, match=r"expected angles of shape \(N, C/2\) = \(3, 2\), got \(1, 2\)"):
        apply_rotary(x, torch.zeros(1, 2))


@pytest.mark.parametrize("angle_dtype", [torch.float32, torch.int64])
def test_kills_apply_rotary_takes_cos_sin_in_the_angles_narrow_dtype(angle_dtype):
    """kills: nn/rotary.py ``_apply_rotary`` ``wide = (torch.promote_types(angles.dtype, x.dtype) if`` ->
    ``wide = (angles.dtype if`` (float32 or integer angles had their cos and sin taken in float32: a float64 ``x``
    rotated to ~1e-7 only). Checked against the rotation written out in float64."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 6, dtype=torch.float64)
    angles = (torch.rand(5, 3) * 2000 - 1000).to(angle_dtype)
    a64 = angles.double()
    c, s = a64.cos()[:, None, :], a64.sin()[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    want = torch.empty_like(x)
    want[..., 0::2], want[..., 1::2] = x0 * c - x1 * s, x0 * s + x1 * c
    torch.testing.assert_close(apply_rotary(x, angles), want, rtol=0, atol=1e-12)


def _weighted_graph(N: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An undirected connected graph (a path plus random chords) with random positive weights: no eigenvalue and no
    largest eigenvector entry ties, so the canonical PE is unique."""
    g = torch.Generator().manual_seed(seed)
    a = torch.arange(N - 1)
    s = torch.cat([a, torch.randint(0, N, (N,), generator=g)])
    d = torch.cat([a + 1, torch.randint(0, N, (N,), generator=g)])
    keep = s != d
    pairs = torch.unique(torch.stack([torch.minimum(s[keep], d[keep]), torch.maximum(s[keep], d[keep])]), dim=1)
    w = torch.rand(pairs.shape[1], generator=g, dtype=torch.float64) + 0.5
    return torch.cat([pairs, pairs.flip(0)], dim=1), torch.cat([w, w])


def _reference_laplacian_pe(edge_index: torch.Tensor, w: torch.Tensor, N: int, k: int) -> torch.Tensor:
    """The k eigenvectors of I - D^-1/2 A D^-1/2 after the trivial one, in float64, each signed so that its first
    entry of largest magnitude is positive (the transform's documented convention)."""
    A = torch.zeros(N, N, dtype=torch.float64).index_put_((edge_index[0], edge_index[1]), w, accumulate=True)
    d = A.sum(1).rsqrt()
    U = torch.linalg.eigh(torch.eye(N, dtype=torch.float64) - d[:, None] * A * d[None, :]).eigenvectors[:, 1:k + 1]
    return U * U.gather(0, U.abs().argmax(0, keepdim=True)).sign()


@pytest.mark.parametrize("N,k", [(7, 4), (100, 99)])
def test_kills_laplacian_pe_signs_and_the_small_graph_path(N, k):
    """kills: models/_graph_pe.py ``_canonical_signs`` ``torch.where(pivot < 0, -1.0, 1.0)`` -> ``pivot > 0`` (every
    eigenvector signed against the convention) and ``pe.gather(0, pe.abs().argmax(0, keepdim=True))`` -> ``pe[:1]``
    (signed by the first node, not the first entry of largest magnitude; one column of the 7-node graph differs), and
    ``_LaplacianPE.forward`` ``if N > self.k + 1:`` -> ``if N > self.k:`` (a graph of N = k + 1 >= 100 nodes went to
    ARPACK with k + 1 = N eigenvectors: scipy's "k >= N" TypeError). Checked against float64 ``eigh``."""
    from torch_geometric.data import Data

    from diffusionformer.models import GraphTransformerConfig, positional_encoding_transform

    edge_index, w = _weighted_graph(N, 0)
    pe = positional_encoding_transform(GraphTransformerConfig(in_channels=1, pe="laplacian", pe_dim=k))(
        Data(edge_index=edge_index, edge_weight=w.float(), num_nodes=N)).pe
    assert pe.shape == (N, k)
    torch.testing.assert_close(pe.double(), _reference_laplacian_pe(edge_index, w, N, k), rtol=0, atol=1e-4)


def test_kills_pe_edge_weight_complex_is_a_type_error():
    """kills: models/_graph_pe.py ``_check_pe_edge_weight`` ``if w.is_complex(): raise TypeError`` dropped (a complex
    ``edge_weight`` reached ``w < 0``: torch's bare RuntimeError instead of the TypeError naming the dtype)."""
    from torch_geometric.data import Data

    from diffusionformer.models import GraphTransformerConfig, positional_encoding_transform

    edge_index = torch.tensor([[0, 1], [1, 0]])
    data = Data(edge_index=edge_index, edge_weight=torch.ones(2, dtype=torch.complex64), num_nodes=2)
    for pe in ("laplacian", "random_walk"):
        with pytest.raises(TypeError, match="real weights, got dtype torch.complex64"):
            positional_encoding_transform(GraphTransformerConfig(in_channels=1, pe=pe, pe_dim=2))(data)
