"""A long-sequence user's walk (T = 2048 .. 16384 on CPU, few heads, small width): what each dense and sparse path
materialises, checked here at small sizes by counting the tensors the operations return
(a ``TorchDispatchMode``) and the tensors autograd keeps (``saved_tensors_hooks``), against the documented
formulas, plus the outputs against independent float64 references.

Measured at T = 16384, B = 1, H = 2, width 32 (probe, CPU, one thread), before / after the fixes below:
``sliding_window(T, 64)``'s dense ``(T, T)`` band mask peaked at 4.25 GiB (two int64 ``(T, T)`` temporaries) / 256 MiB;
a prompt of T tokens through the KV cache (``forward_cached``) held three ``(B, H, T, T)`` float32 tensors
(6 GiB) / 74 MiB, where the uncached forward holds 30 MiB; a heat(K=4) layer on a windowed dense graph kept K
float32 copies of the ``(T, T)`` mask for its backward pass (4 GiB) / one (1 GiB).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from diffusionformer.graph import sliding_window
from diffusionformer.graph._structure import structural_mask
from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn import kv_cache as _kv


class _Outputs(TorchDispatchMode):
    """Records ``(op, shape, bytes)`` of every tensor an operation returns (views included)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                self.seen.append((str(func), tuple(t.shape), t.numel() * t.element_size()))
        return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [0, 3, 40, 10**30])
def test_band_mask_is_one_bool_matrix(causal, window):
    """Bug: the dense layout's band mask (``structural_mask``, behind ``sliding_window(N, w)`` and every windowed
    dense graph) was built from an ``(N, N)`` int64 matrix of ``i - j`` and its absolute value: 16 bytes per pair
    of temporaries for a 1-byte mask, 4 GiB at N = 16384 for a 256 MiB mask. Now built in place from the
    diagonals of one bool matrix; the relation is unchanged (checked against the definition)."""
    N = 96
    with _Outputs() as rec:
        m = structural_mask(N, causal, window, torch.device("cpu"))
    assert max(b for _, _, b in rec.seen) <= N * N, rec.seen  # nothing wider than the bool mask itself
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    want = ((j <= i) | (not causal)) & ((i - j).abs() <= min(window, N))
    assert m.dtype == torch.bool and torch.equal(m, want)


def test_kstep_heads_keep_one_float_mask_for_backward():
    """Bug: on the fused kernel (``backend="sdpa"``, and ``"auto"`` at long T) a ``K``-step head on a masked dense
    graph (sliding window, padding, any bool ``attn_mask``) called SDPA ``K`` times with the bool mask; the kernel
    converts it to a float mask on every call and keeps each copy for the backward pass: ``K`` float32 ``(T, T)``
    masks (4 GiB for K = 4, T = 16384) beside the 1-byte mask. The mask is now converted once per layer call (CPU
    tensors, as the kernel converts it: the same bits)."""
    torch.manual_seed(0)
    N, H, C = 64, 2, 8
    g = sliding_window(N, 5, causal=True)
    x = torch.randn(1, N, H * C, requires_grad=True)
    for heads in ("heat(t=1.0, steps=4):2", "attention:1,heat(t=1.0, steps=4):1"):
        attn = DiffusionAttention(H * C, H, heads=heads, backend="sdpa")
        kept: dict[int, torch.dtype] = {}

        def pack(t):  # noqa: ANN001, ANN202
            if t.is_floating_point() and t.shape[-2:] == (N, N):
                kept[t.untyped_storage().data_ptr()] = t.dtype
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = attn(x, g)
        assert len(kept) == 1, (heads, kept)  # one float mask shared by the K calls
        # the same values as the materialised-P back-end on the same graph
        ref = DiffusionAttention(H * C, H, heads=heads, backend="matrix")
        ref.load_state_dict(attn.state_dict())
        torch.testing.assert_close(y, ref(x, g), rtol=1e-5, atol=1e-6)
        y.sum().backward()
        assert torch.isfinite(x.grad).all()


def test_bool_mask_conversion_is_bitwise_the_kernels():
    """The mask converted once gives the bits of the kernel's own conversion (float32, float64, bf16 autocast, a
    fully padded sequence, per-head masks)."""
    from diffusionformer.ops import dense as _dense

    torch.manual_seed(1)
    B, H, N, C = 2, 2, 20, 8
    am = torch.rand(B, H, N, N) > 0.4
    am[..., 3, :] = False  # a query without keys
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[1] = True
    for dtype, autocast in ((torch.float32, False), (torch.float64, False), (torch.float32, True)):
        attn = DiffusionAttention(H * C, H, heads="attention:1,heat(t=1.0, steps=3):1", backend="sdpa").to(dtype)
        x = torch.randn(B, N, H * C, dtype=dtype, requires_grad=True)
        got = []
        for convert in (_dense._additive_cpu_mask, lambda m, q: m):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(_dense, "_additive_cpu_mask", convert)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    y = attn(x, attn_mask=am, key_padding_mask=kpm)
                got.append((y, torch.autograd.grad(y.float().square().sum(), x)[0]))
        assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])


def test_cached_prompt_forms_p_a_block_of_rows_at_a_time(monkeypatch):
    """Bug: a prompt of ``n`` tokens through the KV cache (``forward_cached``, the first step of
    ``generate(use_cache=True)``, and every step once its window slides) formed the ``(B, H, n, T)`` scores, their
    masked copy and ``P`` at once: 6 GiB per layer for a 16384-token prompt with 2 heads, where the uncached forward
    (fused kernel) holds no ``(T, T)`` tensor. Now ``P`` is formed a block of rows at a time (at most
    ``_ROWS_OF_P`` entries), each block's powers from the rows the earlier blocks gave; the logits equal the
    uncached forward's (float64), token by token too."""
    monkeypatch.setattr(_kv, "_ROWS_OF_P", 2 * 2 * 40 * 5, raising=False)  # 5 rows of P per block at T = 40
    torch.manual_seed(2)
    T = 48
    for heads in ("attention:2", "heat(t=1.0, steps=4):2", "attention:1,ppr(alpha=0.2, steps=3):1"):
        m = DiffusionGPT(GPTConfig(vocab_size=13, block_size=T, n_layer=2, n_head=2, n_embd=16,
                                   heads=heads)).double().eval()
        idx = torch.randint(0, 13, (2, T))
        with torch.no_grad():
            full = m(idx)[0]
            cache = m.new_cache()
            with _Outputs() as rec:
                prompt = m.forward_cached(idx[:, :T - 8], cache)
            steps = [m.forward_cached(idx[:, i : i + 1], cache) for i in range(T - 8, T)]
        # rows of P (or its scores) of at most 5 queries at once: no (B, H, n, T) tensor (the keys, transposed, are
        # (B, H, C, T) with C = 8)
        assert max(s[-2] for _, s, _ in rec.seen if len(s) == 4 and s[-1] == T - 8 and s[-2] != 8) <= 5, heads
        got = torch.cat([prompt, *steps], dim=1)
        torch.testing.assert_close(got, full, rtol=0, atol=1e-12)
    # and with autograd recording (the blocks' rows are not written in place into tensors the products keep)
    x = torch.randn(2, T, 16, dtype=torch.float64, requires_grad=True)
    layer = m.blocks[0].attn
    gc = torch.autograd.grad(_kv.attend_cached(layer, x, _kv.LayerKVCache()).sum(), x)[0]
    gf = torch.autograd.grad(layer(x).sum(), x)[0]
    torch.testing.assert_close(gc, gf, rtol=0, atol=1e-12)
