"""Edge probes of decoding, third round: RoPE (1-D and axial 2-D) against explicit float64 rotation matrices, with
integer and narrow angles; the KV cache of a layer with 2-D rotary positions against its full forward; and the
tokens ``generate`` can draw against a float64 reference of the filtered distribution (ties at the k-th logit,
``p = 1``, ``k >= V``, ``-inf`` logits, temperature extremes, logits near the dtype's range)."""

from __future__ import annotations

import math

import pytest
import torch

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache, attend_cached
from diffusionformer.nn.rotary import RotaryEmbedding2D, apply_rotary

_NINF = float("-inf")


def _rotate_reference(x: torch.Tensor, angles: list[list[float]]) -> torch.Tensor:
    """RoFormer's rotation written out: pair ``i`` of token ``n`` times the 2x2 matrix of ``angles[n][i]``."""
    out = torch.empty_like(x, dtype=torch.float64)
    for n, row in enumerate(angles):
        for i, a in enumerate(row):
            R = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=torch.float64)
            out[..., n, :, 2 * i : 2 * i + 2] = x[..., n, :, 2 * i : 2 * i + 2].double() @ R.T
    return out


def test_rope_2d_and_its_cached_layer_equal_explicit_rotation_matrices():
    C, base = 8, 100.0
    x = torch.randn(2, 5, 3, C, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([[0, 0], [1, 2], [3, -1], [7, 5], [100, 9]])
    th = [base ** (-2 * j / (C // 2)) for j in range(C // 4)]  # each half: the 1-D frequencies of dim C/2
    angles = [[float(r) * t for t in th] + [float(c) * t for t in th] for r, c in pos.tolist()]
    torch.testing.assert_close(RotaryEmbedding2D(C, base)(x, pos), _rotate_reference(x, angles), rtol=0, atol=1e-13)
    grid = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1]])
    for spec in ("attention:2,heat:2", "differential:2,neutreno:1,value-residual:1", "heat-exact:2,attention:2"):
        torch.manual_seed(0)
        layer = DiffusionAttention(16, 4, spec, causal=True, rotary=RotaryEmbedding2D(4)).double().eval()
        h = torch.randn(2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            full = layer(h, positions=grid)
            cache = LayerKVCache()
            rows = [attend_cached(layer, h[:, :2], cache, grid[:2])]
            rows += [attend_cached(layer, h[:, i : i + 1], cache, grid[i : i + 1]) for i in range(2, 6)]
            torch.testing.assert_close(torch.cat(rows, dim=1), full, rtol=0, atol=1e-12, msg=spec)
            with pytest.raises(ValueError, match="explicit \\(N, 2\\) positions"):  # no default grid for a new token
                attend_cached(layer, h[:, :1], cache)


def test_bug_apply_rotary_rotates_float64_x_with_integer_or_float32_angles_in_float64():
    """Bug: ``apply_rotary`` took ``cos`` and ``sin`` in the angles' own dtype, float32 for integer angles
    (torch's default dtype) and for float32 ones, then cast them to the dtype of ``x``: a float64 ``x`` came back
    rotated to ~6e-8 of RoFormer's matrices, not float64's ~1e-16."""
    x = torch.randn(2, 4, 2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ints = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, -12]])
    ref = _rotate_reference(x, ints.double().tolist())
    for angles in (ints, ints.float(), ints.to(torch.int32)):
        torch.testing.assert_close(apply_rotary(x, angles), ref, rtol=0, atol=1e-14, msg=str(angles.dtype))
    assert apply_rotary(x.half(), ints).dtype == torch.float16  # a narrow x keeps its dtype


class _FixedLogits(DiffusionGPT):
    """A GPT whose next-token logits are ``self.row`` at every position (the sampler alone under test)."""

    row: torch.Tensor

    def forward(self, idx, targets=None, **kw):  # noqa: ARG002
        B, T = idx.shape
        return self.row.expand(B, T, -1).clone(), None


def _counts(row: list[float], dtype: torch.dtype = torch.float32, n: int = 4000, **kw) -> list[int]:
    model = _FixedLogits(GPTConfig(vocab_size=len(row), block_size=4, n_layer=1, n_head=1, n_embd=4))
    model.row = torch.tensor(row, dtype=torch.float64).to(dtype)
    idx = torch.zeros(n, 1, dtype=torch.long)
    out = model.generate(idx, 1, generator=torch.Generator().manual_seed(0), **kw)[:, -1]
    return torch.bincount(out, minlength=len(row)).tolist()


def _support(row: list[float], temperature: float, top_k: int | None, top_p: float | None) -> set[int]:
    """The tokens of positive probability, from the float64 definitions: top-k keeps the logits >= the k-th largest
    (ties kept); top-p keeps token (r) iff the mass of the better-ranked tokens is < p (ties in probability counted
    with the better ranks: every tied token has the same mass before it when its ties are broken in its favour)."""
    keep = {i for i, v in enumerate(row) if v != _NINF}
    if top_k is not None:
        kth = sorted(row, reverse=True)[min(top_k, len(row)) - 1]
        keep = {i for i in keep if row[i] >= kth}
    m = max(row[i] for i in keep)
    w = {i: math.exp((row[i] - m) / temperature) for i in keep}  # 0 below float64's range: never drawn
    keep = {i for i in keep if w[i] > 0}
    if top_p is not None and top_p < 1:
        z = sum(w.values())
        keep = {i for i in keep if sum(w[j] for j in keep if w[j] > w[i]) / z < top_p}
    return keep


@pytest.mark.parametrize("kw", [
    {"top_k": 2}, {"top_k": 1}, {"top_k": 10}, {"top_p": 1.0}, {"top_k": 3, "top_p": 0.6},
    {"temperature": 0.5, "top_p": 0.5}, {"temperature": 1e-300}, {"temperature": 1e-3, "top_p": 0.9},
])
def test_generate_draws_only_the_tokens_of_the_filtered_float64_distribution(kw):
    row = [1.0, 2.0, 2.0, 0.0, _NINF, -0.5]  # a tie at the top (the k-th for k=2), a removed token
    counts = _counts(row, **kw)
    want = _support(row, kw.get("temperature", 1.0), kw.get("top_k"), kw.get("top_p"))
    assert {i for i, c in enumerate(counts) if c} == want, (counts, want)


def test_generate_with_an_infinite_temperature_samples_uniformly_among_the_kept_tokens():
    counts = _counts([1.0, 2.0, 2.0, 0.0, _NINF], temperature=float("inf"), top_k=3)
    assert counts[3] == counts[4] == 0 and min(counts[:3]) > 1200  # ~1333 each of 4000


@pytest.mark.parametrize("dtype,big", [(torch.float32, 3e38), (torch.float64, 1e308)])
def test_bug_generate_scales_logits_near_the_dtypes_range_before_shifting_them(dtype, big):
    """Bug: generate shifted the logits by their row maximum before it divided them by the temperature: logits of
    opposite signs near the dtype's range (``-big``, ``big``) differed by ``-inf``, so at ``temperature=big`` the
    first token, of probability ``softmax([-1, 1, 0])[0] = 0.09``, was never drawn (0 of 4000 draws)."""
    counts = _counts([-big, big, 0.0], dtype=dtype, temperature=big)
    p = torch.softmax(torch.tensor([-1.0, 1.0, 0.0], dtype=torch.float64), dim=0)  # 0.090, 0.665, 0.245
    for c, q in zip(counts, p.tolist()):
        assert abs(c / 4000 - q) < 0.03, (counts, p)
