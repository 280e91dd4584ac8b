"""Sitting 53 mutation audit of the late-morning code (helper 53s): pins for what the commits' own tests left free
(the cached prompt's blocks after a filled cache, the block size's floor, degree-0 heads forming no row of ``P``,
DropPath's keep probability under vmap, the CPU-only mask conversion, ``_ppr_table``'s exactness bound, the Triton
back-end's transform clause, the meta-coefficients error's trigger), each checked against an expectation computed
independently."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.func import grad, vmap
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from diffusionformer.models import DiffusionGPT, GPTConfig
from diffusionformer.nn import DropPath
from diffusionformer.nn import kv_cache as _kv
from diffusionformer.operators.ppr import _ppr_table
from diffusionformer.ops import dense as _dense


class _Shapes(TorchDispatchMode):
    """Records the shape of every strided tensor an operation returns."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        self.seen += [tuple(t.shape) for t in tree_flatten(out)[0]
                      if isinstance(t, torch.Tensor) and t.layout == torch.strided]
        return out


def _gpt(heads: str, T: int) -> DiffusionGPT:
    torch.manual_seed(4)
    return DiffusionGPT(GPTConfig(vocab_size=11, block_size=T, n_layer=1, n_head=2, n_embd=16,
                                  heads=heads)).double().eval()


@pytest.mark.parametrize("heads", ["heat(t=1.0, steps=3):2", "attention:1,ppr(alpha=0.3, steps=2):1"])
def test_pin_cached_prompt_blocks_after_a_filled_cache(monkeypatch, heads):
    """Pin: a multi-token chunk after earlier ones (``start > 0``: a prompt fed in two pieces) forms its rows of
    ``P`` a block at a time at the rows ``start + a .. start + b`` of the powers (with and without autograd
    recording); logits and gradients equal the uncached forward's (float64)."""
    T, n1 = 36, 12
    monkeypatch.setattr(_kv, "_ROWS_OF_P", 2 * 2 * T * 4)  # 4 rows of P per block at T = 36: chunk 2 is multi-block
    m = _gpt(heads, T)
    idx = torch.randint(0, 11, (2, T))
    with torch.no_grad():
        full = m(idx)[0]
        cache = m.new_cache()
        a = m.forward_cached(idx[:, :n1], cache)
        b = m.forward_cached(idx[:, n1:], cache)
    torch.testing.assert_close(torch.cat([a, b], 1), full, rtol=0, atol=1e-12)
    # autograd recording (the out-of-place slice_scatter) with start > 0: the second chunk's gradient
    layer = m.blocks[0].attn
    x = torch.randn(2, T, 16, dtype=torch.float64)
    x2 = x[:, n1:].clone().requires_grad_()
    c = _kv.LayerKVCache()
    with torch.no_grad():
        _kv.attend_cached(layer, x[:, :n1], c)
    w = torch.randn(2, T - n1, 16, dtype=torch.float64)
    gc = torch.autograd.grad((_kv.attend_cached(layer, x2, c) * w).sum(), x2)[0]
    x2f = x[:, n1:].clone().requires_grad_()
    gf = torch.autograd.grad((layer(torch.cat([x[:, :n1], x2f], 1))[:, n1:] * w).sum(), x2f)[0]
    torch.testing.assert_close(gc, gf, rtol=0, atol=1e-12)


def test_pin_cached_prompt_block_floor_is_one_row(monkeypatch):
    """Pin: where one row of ``P`` already exceeds ``_ROWS_OF_P`` the prompt is formed one row at a time (the
    floor of the block size is 1, not more), with the uncached forward's logits."""
    T = 10
    monkeypatch.setattr(_kv, "_ROWS_OF_P", 1)
    m = _gpt("heat(t=1.0, steps=2):2", T)
    idx = torch.randint(0, 11, (1, T))
    with torch.no_grad():
        full = m(idx)[0]
        with _Shapes() as rec:
            got = m.forward_cached(idx, m.new_cache())
    torch.testing.assert_close(got, full, rtol=0, atol=1e-12)
    # (B, H, rows, T); the keys, transposed, are (B, H, C, T) with C = 8
    rows = {s[-2] for s in rec.seen if len(s) == 4 and s[:2] == (1, 2) and s[-1] == T} - {8}
    assert rows == {1}, rows


def test_pin_drop_path_keep_probability_under_vmap():
    """Pin: under ``vmap(randomness="different")`` DropPath keeps a sample with probability ``1 - p`` and scales it
    by ``1 / (1 - p)`` (p = 0.2: 4000 draws, the kept fraction within 5 sigma of 0.8)."""
    torch.manual_seed(0)
    drop = DropPath(0.2).train()
    x = torch.ones(8, 3, 4)
    out = vmap(lambda _: drop(x), randomness="different")(torch.arange(500))
    vals = out[:, :, 0, 0]
    assert set(vals.unique().tolist()) <= {0.0, 1.25} and (out == vals[:, :, None, None]).all()
    frac = (vals > 0).double().mean().item()
    assert abs(frac - 0.8) < 5 * (0.8 * 0.2 / 4000) ** 0.5, frac


def test_pin_additive_mask_only_for_cpu_bool_masks():
    """Pin: ``_additive_cpu_mask`` converts a bool mask of CPU tensors to 0 / -inf in the dtype the kernel computes
    in (bfloat16 under CPU autocast), and leaves a mask of other devices (CUDA kernels convert their own way; meta
    here) and float masks as they are (the same object)."""
    m = torch.tensor([[True, False], [False, True]])
    q = torch.zeros(1, 1, 2, 4)
    got = _dense._additive_cpu_mask(m, q)
    assert got.dtype == torch.float32 and torch.equal(got, torch.tensor([[0.0, -torch.inf], [-torch.inf, 0.0]]))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _dense._additive_cpu_mask(m, q).dtype == torch.bfloat16
    meta_mask = m.to("meta")
    assert _dense._additive_cpu_mask(meta_mask, q.to("meta")) is meta_mask
    f = torch.zeros(2, 2)
    assert _dense._additive_cpu_mask(f, q) is f and _dense._additive_cpu_mask(None, q) is None


def test_pin_ppr_table_dtype_at_the_exactness_bound():
    """Pin: ``_ppr_table`` keeps ``k = 0 .. K`` in the coefficients' dtype exactly while that dtype holds every
    integer up to K (bfloat16: 256, float16: 2048) and switches to float32 one past it; integer dtypes stay."""
    cpu = torch.device("cpu")
    for dtype, top in ((torch.bfloat16, 256), (torch.float16, 2048)):
        assert torch.arange(top + 1, dtype=torch.float64).to(dtype).to(torch.float64).equal(
            torch.arange(top + 1, dtype=torch.float64))  # the bound is exact for this dtype
        k, last = _ppr_table(top, cpu, dtype)
        assert k.dtype == dtype and last.sum() == 1 and last[-1]
        k, last = _ppr_table(top + 1, cpu, dtype)
        assert k.dtype == torch.float32 and last.sum() == 1 and last[-1] and k[-1] == top + 1
    k, last = _ppr_table(3, cpu, torch.int64)
    assert k.dtype == torch.int64 and k.tolist() == [0, 1, 2, 3] and last.tolist() == [False] * 3 + [True]


def test_pin_kernel_backend_check_names_a_torch_func_transform():
    """Pin: ``triton_unsupported`` (no kernel launched) names a running ``grad``/``vmap`` transform, and nothing
    outside it, for tensors the kernels otherwise accept."""
    pytest.importorskip("triton")
    from diffusionformer.ops.triton.backend import triton_unsupported

    q = torch.randn(1, 2, 5, 8)
    if triton_unsupported(q, q, q, None, False) is not None:
        pytest.skip(f"the Triton back-end does not run here: {triton_unsupported(q, q, q, None, False)}")
    seen = []

    def probe(z):  # noqa: ANN001, ANN202
        seen.append(triton_unsupported(q, q, q, None, False))
        return z.sum()

    grad(probe)(torch.ones(3))
    vmap(probe)(torch.ones(2, 3))
    assert len(seen) == 2 and all(s is not None and "torch.func transform" in s for s in seen), seen


def test_pin_layer_wholly_on_meta_runs_and_half_on_meta_names_the_caches():
    """Pin: the meta-coefficients error fires only for weights off meta: a layer built wholly on meta (a dry run
    for shapes) called on a meta input gives a meta output of the input's shape, while the same layer called with
    CPU parameters alone names the operators' meta caches."""
    from torch.func import functional_call

    from diffusionformer.nn import DiffusionAttention

    torch.manual_seed(0)
    cpu = DiffusionAttention(16, 4, "heat(t=0.5, steps=3):2,ppr(steps=3):1,polynomial(basis='chebyshev'):1").double()
    meta = copy.deepcopy(cpu).to("meta")
    y = meta(torch.randn(2, 5, 16, device="meta", dtype=torch.float64))
    assert y.is_meta and y.shape == (2, 5, 16)
    match = r"operator 'heat'.*meta device.*on cpu \(its buffers 't', '_c' are on meta\)"
    with pytest.raises(ValueError, match=match):
        functional_call(meta, dict(cpu.named_parameters()), (torch.randn(2, 5, 16, dtype=torch.float64),))


def test_pin_degree_zero_heads_form_no_row_of_p_when_cached():
    """Pin: heads of degree 0 (``K = 0``: the output is ``c_0 v``) decode through the KV cache without forming a
    row of ``P`` (no ``(B, H, n, T)`` tensor), with the uncached forward's logits."""
    T = 12
    m = _gpt("heat(t=0.1, steps=0, tol=1.0):2", T)
    assert m.blocks[0].attn._coefficients().shape == (2, 1)
    idx = torch.randint(0, 11, (2, T))
    with torch.no_grad():
        full = m(idx)[0]
        with _Shapes() as rec:
            got = m.forward_cached(idx, m.new_cache())
    torch.testing.assert_close(got, full, rtol=0, atol=1e-12)
    assert not [s for s in rec.seen if len(s) == 4 and s[:2] == (2, 2) and s[-2:] == (T, T)], "a row block of P"
