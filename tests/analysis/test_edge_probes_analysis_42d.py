"""Edge probes of diffusionformer.analysis: key-padded dense captures, blocks that update their input in place,
metrics that left their range by rounding."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from diffusionformer.analysis import LayerRecorder, capture_dataset, layer_reports
from diffusionformer.graph import AttentionGraph
from diffusionformer.nn import Block


class _PaddedModel(nn.Module):
    """A user's dense model: two ``Block``s called with a key padding mask, as a keyword or as a dense graph."""

    def __init__(self, as_graph: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.as_graph = as_graph
        self.emb = nn.Linear(3, 8)
        self.blocks = nn.ModuleList([Block(8, 2), Block(8, 2)])

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        z = self.emb(x)
        for block in self.blocks:
            if self.as_graph:
                z = block(z, AttentionGraph.dense(z.shape[1], batch_size=z.shape[0], key_padding_mask=pad))
            else:
                z = block(z, key_padding_mask=pad)
        return z[:, 0]


def _reference_states(model: _PaddedModel, x: Tensor, lengths: list[int]) -> list[list[Tensor]]:
    """Per sequence, its ``n`` real tokens alone (no padding at all) through every layer, float64."""
    out = []
    with torch.no_grad():
        for b, n in enumerate(lengths):
            z = model.emb(x[b : b + 1, :n])
            states = [z[0].double()]
            for block in model.blocks:
                z = block(z)
                states.append(z[0].double())
            out.append(states)
    return out


def _softmax_attention(block: Block, x: Tensor) -> Tensor:
    """``P_h = softmax(q_h k_h^T / sqrt(C))`` of one unpadded sequence ``(n, D)``, float64, ``(H, n, n)``."""
    with torch.no_grad():
        q, k, _ = block.attn.qkv(block.norm1(x.float())).double().unflatten(-1, (3, 2, 4)).unbind(-3)  # (n, H, C)
    return (torch.einsum("ihc,jhc->hij", q, k) / 2.0).softmax(dim=-1)


@pytest.mark.parametrize("as_graph", [False, True])
def test_bug_capture_of_dense_blocks_with_a_key_padding_mask_leaves_the_padding_out(as_graph: bool) -> None:
    """Bug: a dense model whose blocks got a ``key_padding_mask`` (``block(x, key_padding_mask=pad)``, or a dense
    ``AttentionGraph`` with one), captured with ``forward=``, gave ``capture.mask = None``: the padded tokens counted
    as real ones in every metric of ``layer_reports`` (within-sequence variance 2.06 for 1.25 on layer 0), though the
    recorder sees the mask in the block's call; per-token labels at the padding were kept as real targets."""
    model = _PaddedModel(as_graph).eval()
    x = torch.randn(3, 5, 3, generator=torch.Generator().manual_seed(1))
    lengths = [5, 3, 2]
    pad = torch.arange(5)[None] >= torch.tensor(lengths)[:, None]  # right padding, True = padding
    targets = torch.randint(0, 4, (3, 5), generator=torch.Generator().manual_seed(5))  # ids at the padding too
    cap = capture_dataset(model, [((x, pad), targets)], forward=lambda m, b: m(*b), attentions=True)
    assert cap.mask is not None and torch.equal(cap.mask, ~pad)
    assert cap.lengths().tolist() == lengths
    assert torch.equal(cap.labels, targets.masked_fill(pad, -100))  # -100 at padding, as documented
    reference = _reference_states(model, x, lengths)
    reports = layer_reports(cap)
    for layer in range(3):
        for b, n in enumerate(lengths):  # the real tokens are those of the sequence alone
            torch.testing.assert_close(cap.states[layer][b, :n].double(), reference[b][layer], rtol=1e-5, atol=1e-5)
        seqs = [reference[b][layer] for b in range(3)]
        within = sum(float((s - s.mean(dim=0)).pow(2).sum() / s.shape[0]) for s in seqs) / 3
        units = [s / s.norm(dim=-1, keepdim=True) for s in seqs]
        cosine = sum(float((u @ u.T).sum() - u.shape[0]) / (u.shape[0] * (u.shape[0] - 1)) for u in units) / 3
        m = reports[layer].metrics
        assert m["within_variance"] == pytest.approx(within, rel=1e-5)
        assert m["mean_cosine"] == pytest.approx(cosine, rel=1e-5, abs=1e-6)
        if layer >= 1:  # E = 1/2 sum P_ij ||x_i - x_j||^2 / ||X||^2 on the head-averaged softmax of the block
            energies = []
            for b, n in enumerate(lengths):
                P = _softmax_attention(model.blocks[layer - 1], reference[b][layer - 1]).mean(dim=0)
                Y = seqs[b]
                energies.append(float(0.5 * (P * torch.cdist(Y, Y).pow(2)).sum() / Y.pow(2).sum()))
            assert m["dirichlet_attention"] == pytest.approx(sum(energies) / 3, rel=1e-4)


def test_bug_capture_refuses_a_key_padding_mask_that_pads_before_real_tokens() -> None:
    """Bug: a left-padded dense batch (padding first, as for decoding) was captured as unpadded tokens (the padding
    measured as real tokens); its mask is no prefix, which a capture cannot hold, so it is refused by name."""
    model = _PaddedModel().eval()
    x = torch.randn(2, 4, 3)
    pad = torch.tensor([[True, False, False, False], [False, False, False, False]])
    with pytest.raises(ValueError, match=r"key_padding_mask pads a sequence before a real token.*pad on the right"):
        capture_dataset(model, [((x, pad), None)], forward=lambda m, b: m(*b))


class _InPlaceBlock(nn.Module):
    """A plain block that updates its input in place (fine under ``no_grad``, as in ``capture_dataset``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        x += self.lin(x)
        return x


class _InPlaceModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Linear(3, 4)
        self.blocks = nn.ModuleList([_InPlaceBlock(), _InPlaceBlock()])

    def forward(self, x: Tensor) -> Tensor:
        z = self.emb(x)
        for block in self.blocks:
            z = block(z)
        return z


def test_bug_recorded_states_survive_a_block_that_updates_its_input_in_place() -> None:
    """Bug: the recorder kept ``x.detach()`` (a view of the block's own tensor), so a block updating its input in
    place (``x += f(x)``) rewrote the earlier records: every layer of the capture held the last block's output."""
    model = _InPlaceModel().eval()
    x = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():  # out of place, in float64
        e = model.emb.double()
        z0 = e(x.double())
        z1 = z0 + model.blocks[0].lin.double()(z0)
        z2 = z1 + model.blocks[1].lin.double()(z1)
    model.float()
    cap = capture_dataset(model, [x])
    for layer, expected in enumerate([z0, z1, z2]):
        torch.testing.assert_close(cap.states[layer].double(), expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad(), LayerRecorder(model) as rec:
        model(x)
    for layer, expected in enumerate([z0, z1, z2]):
        torch.testing.assert_close(rec.states[layer].double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bug_token_metrics_stay_in_their_range_under_rounding(dtype: torch.dtype) -> None:
    """Bug: metrics left their documented range by rounding: ``mean_pairwise_cosine`` of identical tokens was
    ``1 + 5e-7`` (float32; ``1 + 7e-16`` in float64) and of two opposite tokens ``-1 - 1 ulp``, ``high_frequency_ratio`` and ``variance_ratio`` of centred
    tokens ``1 + 1 ulp``, and the Dirichlet energy on a non-negative ``P`` of tokens constant on the clusters ``P``
    joins ``-3e-16``, not 0. The references are the exact values (1, 1, 1 and 0), computed in float64."""
    from diffusionformer.analysis.metrics import (dirichlet_energy, high_frequency_ratio, mean_pairwise_cosine,
                                                  variance_ratio)

    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        T, D = int(torch.randint(2, 40, (1,), generator=g)), int(torch.randint(1, 30, (1,), generator=g))
        v = torch.randn(D, generator=g, dtype=torch.float64) * 10 ** float(torch.empty(1).uniform_(-3, 3, generator=g))
        identical = v.expand(1, T, D).to(dtype).clone()
        cos = mean_pairwise_cosine(identical)
        assert float(cos) <= 1.0 and float(cos) == pytest.approx(1.0, abs=1e-5)
        Xc = torch.randn(3, T, D, generator=g, dtype=torch.float64)
        Xc = (Xc - Xc.mean(dim=(0, 1), keepdim=True)).to(dtype)  # batch mean 0
        Xs = (Xc[:1] - Xc[:1].mean(dim=1, keepdim=True))  # sequence mean 0: all signal is high-frequency
        assert float(high_frequency_ratio(Xs)) <= 1.0
        assert float(variance_ratio(Xs.expand(3, T, D)).max()) <= 1.0
        assert float(variance_ratio(Xs.expand(3, T, D), reduction="pooled")) <= 1.0
    for _ in range(60):
        lab = torch.randint(0, 3, (12,), generator=g)
        centres = torch.randn(3, 6, generator=g, dtype=torch.float64) * 100
        X = centres[lab].unsqueeze(0).to(dtype)
        P = torch.rand(12, 12, generator=g, dtype=torch.float64) * (lab[:, None] == lab[None]).double()
        P = (P / P.sum(dim=-1, keepdim=True)).to(dtype)  # joins equal tokens only: E = 0 exactly
        assert float(dirichlet_energy(X, P)) >= 0.0 and float(dirichlet_energy(X, P, normalized=False)) >= 0.0
        assert float(dirichlet_energy(X, P)) == pytest.approx(0.0, abs=1e-6)
    for _ in range(20):  # two opposite tokens: cosine -1, its lower bound -1/(T-1) (was -1 - 1 ulp)
        v = torch.randn(int(torch.randint(1, 20, (1,), generator=g)), generator=g, dtype=torch.float64)
        cos = float(mean_pairwise_cosine(torch.stack([v, -v]).unsqueeze(0).to(dtype)))
        assert cos >= -1.0 and cos == pytest.approx(-1.0)
    # a signed P keeps its signed energy (its negative value is no rounding): P = -I off the diagonal of 2 tokens
    signed = torch.tensor([[0.0, -1.0], [-1.0, 0.0]], dtype=dtype)
    X2 = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=dtype)
    assert float(dirichlet_energy(X2, signed, normalized=False)) == pytest.approx(-2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bug_effective_rank_of_a_flat_spectrum_is_at_most_its_length(dtype: torch.dtype) -> None:
    """Bug: ``effective_rank`` documents the range ``[1, R]``, but a flat spectrum of ``R = 6`` singular values gave
    ``6.0000014`` (float32; ``R + 5e-15`` in float64 for ``R = 12``): ``exp`` of the rounded entropy ``log R``."""
    from diffusionformer.analysis.spectral import effective_rank

    for R in range(1, 200):
        r = float(effective_rank(torch.full((R,), 0.7, dtype=dtype)))
        assert 1.0 <= r <= R and r == pytest.approx(R, rel=1e-5)
    assert float(effective_rank(torch.tensor([5.0, 0.0, 0.0], dtype=dtype))) == 1.0
    assert float(effective_rank(torch.zeros(3, dtype=dtype))) == 0.0
    # Roy & Vetterli: exp(-sum p log p), p = s / sum s, in float64
    s = torch.tensor([3.0, 2.0, 1.0, 0.5], dtype=torch.float64)
    p = s / s.sum()
    assert float(effective_rank(s.to(dtype))) == pytest.approx(float(torch.exp(-(p * p.log()).sum())), rel=1e-6)


def test_bug_layer_reports_of_collapsed_tokens_stay_in_range() -> None:
    """Bug: ``layer_reports`` of sequences whose tokens have collapsed to one vector (deep layers) reported
    ``mean_cosine = 1.0000000000000002`` (over its bound 1) in float64, and the pooled ``variance_ratio`` of
    sequences centred on one mean ``1 + 1 ulp``."""
    from diffusionformer.analysis import LayerCapture

    over = []
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        X = torch.randn(4, 1, 7, generator=g).expand(4, 9, 7).clone()
        cos = layer_reports(LayerCapture({0: X}))[0].metrics["mean_cosine"]
        assert cos == pytest.approx(1.0)
        Xc = torch.randn(4, 9, 7, generator=g, dtype=torch.float64)
        Xc = (Xc - Xc.mean(dim=1, keepdim=True)).float()  # every sequence mean 0: within = total
        ratio = layer_reports(LayerCapture({0: Xc}))[0].metrics["variance_ratio"]
        assert ratio == pytest.approx(1.0)
        over += [v for v in (cos, ratio) if v > 1.0]
    assert not over


class _NamedMaskBlock(nn.Module):
    """A user's pre-norm block naming the attention's padding mask as a parameter (no ``**kwargs``)."""

    def __init__(self) -> None:
        super().__init__()
        from diffusionformer.nn import DiffusionAttention

        self.norm1 = nn.LayerNorm(8)
        self.attn = DiffusionAttention(8, 2)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        return x + self.attn(self.norm1(x), key_padding_mask=key_padding_mask)


class _NamedMaskModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([_NamedMaskBlock(), _NamedMaskBlock()])

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x, key_padding_mask=pad)
        return x


def test_bug_recomputed_attention_keeps_a_key_padding_mask_named_by_the_block() -> None:
    """Bug: a block whose forward names ``key_padding_mask`` as a parameter (``forward(self, x,
    key_padding_mask=None)``, no ``**kwargs``) had it dropped from the recomputed attention: ``attentions`` put
    weight 0.37 on the padded keys, and the capture kept no mask. Reference: the masked softmax in float64."""
    model = _NamedMaskModel().eval()
    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(4))
    pad = torch.tensor([[False, False, False, False], [False, False, True, True]])
    cap = capture_dataset(model, [((x, pad), None)], forward=lambda m, b: m(*b), attentions=True)
    assert cap.mask is not None and torch.equal(cap.mask, ~pad)
    block = model.blocks[0]
    with torch.no_grad():
        q, k, _ = block.attn.qkv(block.norm1(x)).double().unflatten(-1, (3, 2, 4)).unbind(-3)  # (B, T, H, C)
    scores = (torch.einsum("bihc,bjhc->bhij", q, k) / 2.0).masked_fill(pad[:, None, None, :], float("-inf"))
    torch.testing.assert_close(cap.attentions[0].double(), scores.softmax(dim=-1), rtol=1e-5, atol=1e-6)


def test_bug_anova_fractions_are_at_most_one() -> None:
    """Bug: ``AnovaSplit.fractions`` of sequences that are each one constant token (all the scatter between
    classes, one class per sequence) gave a between-class fraction ``1 + 4e-16``: the three parts are non-negative
    and sum to ``total`` exactly (the reference: 0, 0, 1)."""
    from diffusionformer.analysis.metrics import anova_decomposition

    g = torch.Generator().manual_seed(0)
    fractions = []
    for _ in range(100):
        T, D = int(torch.randint(1, 8, (1,), generator=g)), int(torch.randint(1, 6, (1,), generator=g))
        X = torch.randn(6, 1, D, generator=g).expand(6, T, D).clone()
        f = anova_decomposition(X, torch.arange(6)).fractions
        assert f[0] == 0.0 and f[1] == 0.0 and f[2] == pytest.approx(1.0)
        fractions += f
    assert max(fractions) <= 1.0
