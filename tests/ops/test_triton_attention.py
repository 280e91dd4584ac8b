"""Triton kernels (affine and polynomial attention) against explicit float64 softmax matrices.

Forward and backward (q, k, v and the coefficients), causal and key-padded (including rows with
no admissible key), several blocks with ragged edges (N = 37 with 16-wide blocks, C = 12 padded
to 16), float32 / float16 / bfloat16. Sizes are tiny: on CPU every kernel runs in the Triton
interpreter (seconds per test).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from diffusionformer.ops.triton import affine_attention, polynomial_attention

# conftest.py of this folder sets TRITON_INTERPRET=1 when there is no CUDA device; the
# triton_kernels fixture makes sure the kernels are interpreted then
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install 'triton>=3.6'; Linux wheels only)",
)


def reference(q: Tensor, k: Tensor, v: Tensor, coeffs: Tensor, is_causal: bool, pad: Tensor | None) -> Tensor:
    """sum_k c[h, k] P^k v with the explicit float64 softmax matrix (zero rows where no key is admissible)."""
    q, k, v, coeffs = (t.double() for t in (q, k, v, coeffs))
    B, H, N, C = q.shape
    scores = q @ k.transpose(-2, -1) / C**0.5
    keep = torch.ones(B, 1, N, N, dtype=torch.bool, device=q.device)
    if is_causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    if pad is not None:
        keep = keep & ~pad[:, None, None, :]
    e = torch.exp(scores - scores.amax(-1, keepdim=True)) * keep
    P = e / e.sum(-1, keepdim=True).clamp_min(1e-300)
    out, y = coeffs[:, 0].view(1, H, 1, 1) * v, v
    for j in range(1, coeffs.shape[1]):
        y = P @ y
        out = out + coeffs[:, j].view(1, H, 1, 1) * y
    return out


def make(B=2, H=2, N=37, C=12, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, C, generator=g).to(device=DEVICE, dtype=dtype).requires_grad_() for _ in range(3)]


def padding(B: int, N: int) -> Tensor:
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[0, N - 7:] = True  # trailing padding
    pad[-1, :3] = True  # leading padding: with is_causal rows 0..2 have no key at all
    return pad.to(DEVICE)


def check(fn, q, k, v, coeffs, is_causal, pad, atol):
    out = fn()
    assert out.shape == q.shape and out.dtype == q.dtype
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    got = torch.autograd.grad(out, (q, k, v, coeffs), g)
    ref = reference(q, k, v, coeffs, is_causal, pad)
    want = torch.autograd.grad(ref, (q, k, v, coeffs), g.double())
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=atol)
    for name, a, b in zip(("dq", "dk", "dv", "dcoeffs"), got, want):
        torch.testing.assert_close(a.double(), b.double(), atol=atol * (1 + b.abs().max().item()), rtol=atol,
                                   msg=lambda m, n=name: f"{n}: {m}")


@requires_triton
@pytest.mark.usefixtures("triton_kernels")
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
def test_affine_attention_matches_float64_forward_and_backward(is_causal, padded):
    q, k, v = make()
    c0 = torch.tensor([0.7, 1.0], device=DEVICE, requires_grad=True)
    c1 = torch.tensor([-1.3, -1.0], device=DEVICE, requires_grad=True)
    pad = padding(2, 37) if padded else None
    out = affine_attention(q, k, v, c0, c1, is_causal=is_causal, key_padding_mask=pad)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    got = torch.autograd.grad(out, (q, k, v, c0, c1), g)
    ref = reference(q, k, v, torch.stack([c0, c1], 1), is_causal, pad)
    want = torch.autograd.grad(ref, (q, k, v, c0, c1), g.double())
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    for name, a, b in zip(("dq", "dk", "dv", "dc0", "dc1"), got, want):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-4, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


@requires_triton
@pytest.mark.usefixtures("triton_kernels")
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
def test_polynomial_attention_matches_float64_forward_and_backward(is_causal, padded):
    q, k, v = make(B=2, H=2, N=29)
    coeffs = torch.tensor([[0.3, 0.5, -0.2, 0.4], [1.0, -0.7, 0.25, 0.1]], device=DEVICE, requires_grad=True)
    pad = padding(2, 29) if padded else None
    fn = lambda: polynomial_attention(q, k, v, coeffs, is_causal=is_causal, key_padding_mask=pad)  # noqa: E731
    check(fn, q, k, v, coeffs, is_causal, pad, atol=1e-4)


@requires_triton
@pytest.mark.usefixtures("triton_kernels")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_matches_float64_of_the_rounded_inputs(dtype):
    q, k, v = make(B=1, H=2, N=21, C=16, dtype=dtype)
    coeffs = torch.tensor([[1.0, -1.0, 0.0], [0.2, 0.5, 0.3]], device=DEVICE, requires_grad=True)
    pad = padding(1, 21)
    fn = lambda: polynomial_attention(q, k, v, coeffs, is_causal=True, key_padding_mask=pad)  # noqa: E731
    check(fn, q, k, v, coeffs, True, pad, atol=3e-2 if dtype == torch.bfloat16 else 5e-3)


@requires_triton
@pytest.mark.usefixtures("triton_kernels")
def test_attention_and_laplacian_coefficients_agree_with_sdpa():
    # an independent reference: PyTorch's own SDPA
    q, k, v = make(N=40, C=8)
    with torch.no_grad():
        att = affine_attention(q, k, v, 0.0, 1.0, is_causal=True)
        lap = affine_attention(q, k, v, 1.0, -1.0, is_causal=True)
        sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(att, sdpa, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lap, v - sdpa, atol=1e-5, rtol=1e-5)
        # rows of I - P sum to zero: a Laplacian head ignores a constant shift of the values
        shifted = affine_attention(q, k, v + 3.0, 1.0, -1.0, is_causal=True)
        torch.testing.assert_close(shifted, lap, atol=1e-5, rtol=1e-5)


@requires_triton
@pytest.mark.usefixtures("triton_kernels")
def test_inference_path_and_strided_inputs_match_the_training_path():
    # no grad: only two step buffers are kept; q, k, v as strided views of one packed qkv tensor
    B, H, N, C = 2, 3, 33, 8
    qkv = torch.randn(B, N, 3, H, C, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, N, C), not contiguous
    assert not q.is_contiguous()
    coeffs = torch.rand(H, 4, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    with torch.no_grad():
        fast = polynomial_attention(q, k, v, coeffs, is_causal=True)
    vg = v.contiguous().requires_grad_()
    slow = polynomial_attention(q.contiguous(), k.contiguous(), vg, coeffs, is_causal=True)
    torch.testing.assert_close(fast, slow.detach(), atol=1e-6, rtol=1e-6)
    # stored as (B, N, H, C) like SDPA's output, so merging the heads is a free view
    assert fast.transpose(1, 2).is_contiguous()
    torch.testing.assert_close(fast.double(), reference(q, k, v, coeffs, True, None), atol=1e-5, rtol=1e-5)
    # the output gradient is read with its strides: here that of a merged-heads (B, N, H * C) view
    g = torch.randn(B, N, H * C, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    (dv,) = torch.autograd.grad(slow.transpose(1, 2).reshape(B, N, H * C), vg, g)
    vd = vg.detach().double().requires_grad_()
    ref = reference(q, k, vd, coeffs, True, None).transpose(1, 2).reshape(B, N, H * C)
    (want,) = torch.autograd.grad(ref, vd, g.double())
    torch.testing.assert_close(dv.double(), want, atol=1e-5, rtol=1e-5)


@requires_triton
@pytest.mark.usefixtures("triton_kernels")
def test_learned_heat_time_gets_its_gradient_through_the_coefficients():
    # heat(t, K=6): c_k = e^-t t^k / k!; d out / d t flows through polynomial_attention's dcoeffs
    q, k, v = make(B=1, H=2, N=18, C=8)
    t = torch.tensor([0.5, 1.5], device=DEVICE, requires_grad=True)
    ks = torch.arange(7, device=DEVICE, dtype=torch.float32)
    coeffs = torch.exp(-t[:, None]) * t[:, None] ** ks / torch.exp(torch.lgamma(ks + 1))
    out = polynomial_attention(q, k, v, coeffs)
    (dt,) = torch.autograd.grad(out.square().sum(), t)
    tt = t.detach().double().requires_grad_()
    ref = reference(q.detach(), k.detach(), v.detach(),
                    torch.exp(-tt[:, None]) * tt[:, None] ** ks.double() / torch.exp(torch.lgamma(ks.double() + 1)),
                    False, None)
    (want,) = torch.autograd.grad(ref.square().sum(), tt)
    torch.testing.assert_close(dt.double(), want, atol=1e-4, rtol=1e-4)


@requires_triton
@pytest.mark.usefixtures("triton_kernels")
def test_zero_steps_and_input_errors():
    q, k, v = make(B=1, H=2, N=5, C=4)
    with torch.no_grad():
        torch.testing.assert_close(polynomial_attention(q, k, v, torch.tensor([2.0])), 2 * v)
    with pytest.raises(ValueError, match=r"same shape \(B, H, N, C\)"):
        affine_attention(q, k[:, :, :4], v, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"shape \(H,\) = \(2,\), got \(3,\)"):
        affine_attention(q, k, v, torch.zeros(3), 1.0)
    with pytest.raises(TypeError, match="bool tensor"):
        affine_attention(q, k, v, 0.0, 1.0, key_padding_mask=torch.zeros(1, 5))
    with pytest.raises(ValueError, match=r"\(B, N\) = \(1, 5\)"):
        affine_attention(q, k, v, 0.0, 1.0, key_padding_mask=torch.zeros(1, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        affine_attention(q.double(), k.double(), v.double(), 0.0, 1.0)
    with pytest.raises(ValueError, match="H=2 heads"):
        polynomial_attention(q, k, v, torch.zeros(3, 2))


def test_library_imports_and_reports_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import diffusionformer, diffusionformer.ops.triton as t\n"
        "assert not t.is_available()\n"
        "import torch\n"
        "x = torch.zeros(1, 1, 2, 4)\n"
        "try:\n    t.affine_attention(x, x, x, 0.0, 1.0)\n"
        "except ImportError as e:\n    print('ImportError:', e)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "needs the 'triton' package" in res.stdout


@requires_triton
@pytest.mark.skipif(DEVICE == "cuda", reason="checks the error for CPU tensors without the interpreter")
def test_cpu_tensors_without_the_interpreter_get_a_clear_error():
    code = (
        "import os; os.environ['TRITON_INTERPRET'] = '0'\n"
        "import torch, diffusionformer.ops.triton as t\n"
        "x = torch.zeros(1, 1, 2, 4)\n"
        "try:\n    t.affine_attention(x, x, x, 0.0, 1.0)\n"
        "except RuntimeError as e:\n    print('RuntimeError:', e)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "TRITON_INTERPRET=1" in res.stdout


COMPILE_SCRIPT = r"""
import os
os.environ["TRITON_INTERPRET"] = "0"
from diffusionformer.ops.triton import _kernels as K
from diffusionformer.ops.triton._aot import compile_kernel

common = dict(CAUSAL=True, HAS_PAD=True, MASK_KIND=0, UPCAST=False, IEEE=False, DROPOUT=False, BLOCK_C=64)
fwd = dict(STORE_Y=True, BLOCK_M=64, BLOCK_N=64)
cases = [(K._first_step, fwd), (K._next_step, fwd),
         (K._transposed_step, dict(HAS_IN=True, BLOCK_M=32, BLOCK_N=64)),
         (K._bwd_dkdv, dict(BLOCK_M=32, BLOCK_N=64)),
         (K._bwd_dq, dict(BLOCK_M=64, BLOCK_N=32))]
# without key padding the kernels also have an unmasked stage (causal or not)
for causal in (True, False):
    cases += [(K._first_step, dict(fwd, HAS_PAD=False, CAUSAL=causal)),
              (K._next_step, dict(fwd, HAS_PAD=False, CAUSAL=causal))]
cases += [(fn, dict(extra, HAS_PAD=False)) for fn, extra in cases[2:5]]
# dropout on P: every kernel with its Philox masks (causal and padded), and the mask writer
cases += [(fn, dict(extra, DROPOUT=True)) for fn, extra in cases[:5]]
# a general attn_mask: bool (1) and float (2), causal and unpadded (every block masked)
cases += [(fn, dict(extra, MASK_KIND=kind, HAS_PAD=False)) for kind in (1, 2) for fn, extra in cases[:5]]
cases.append((K._dropout_scales, dict(BLOCK_M=32, BLOCK_N=32)))
for fn, extra in cases:
    k = compile_kernel(fn, dict(common, **extra))
    assert k.asm.get("cubin"), fn.__name__
    print("compiled", fn.__name__)
"""


@requires_triton
@pytest.mark.slow
def test_kernels_compile_for_a_gpu_target_without_a_gpu():
    # the interpreter does not type-check like the compiler: build every kernel (bf16; causal and
    # padded, causal and unpadded, and the forward kernels non-causal and unpadded; with dropout on P,
    # with bool and float attn_masks, and the mask writer) down to an sm_90 cubin with triton's bundled toolchain; no device is needed
    res = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], capture_output=True, text=True, timeout=600)
    if res.returncode != 0 and "ptxas" in res.stderr and "not found" in res.stderr.lower():
        pytest.skip("triton's ptxas is not available on this machine")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("compiled") == 28


_DEFAULT_GEOMETRY_DROPOUT: list = []


@requires_triton
@pytest.mark.usefixtures("triton_kernels")
@pytest.mark.parametrize(
    "blocks",
    [dict(fwd_m=16, fwd_n=16, bwd_m=16, bwd_n=16), dict(fwd_m=16, fwd_n=64, bwd_m=64, bwd_n=16),
     dict(fwd_m=64, fwd_n=32, bwd_m=32, bwd_n=32)],
    ids=["16-16-16-16", "16-64-64-16", "64-32-32-32"],
)
def test_any_block_geometry_matches_float64_and_draws_the_same_dropout_masks(blocks, monkeypatch):
    # the launch geometry is a setting (ops.triton._launch.BLOCKS on CUDA, INTERPRETER_BLOCKS here, which
    # benchmarks/bench_triton_blocks.py sweeps): the kernels must be exact for every block shape, and the
    # dropout masks must not depend on it (they are keyed by the entry, not by the block)
    from diffusionformer.ops.triton import _launch

    q, k, v = make(B=2, H=2, N=37, C=12)
    coeffs = torch.tensor([[0.3, 0.5, -0.2, 0.4], [1.0, -0.7, 0.25, 0.1]], device=DEVICE, requires_grad=True)
    pad = padding(2, 37)
    seed = torch.tensor([31337], dtype=torch.int64, device=DEVICE)
    kw = dict(is_causal=True, key_padding_mask=pad)
    if not _DEFAULT_GEOMETRY_DROPOUT:
        # the default geometry's output and gradients on these inputs (the same in every parametrization:
        # computed once, before this test sets its blocks; the interpreter takes seconds for it)
        dropped_default = polynomial_attention(q, k, v, coeffs, dropout_p=0.2, seed=seed, **kw)
        g_default = torch.autograd.grad(dropped_default.sum(), (q, k, v, coeffs))
        _DEFAULT_GEOMETRY_DROPOUT.extend([dropped_default.detach(), [g.detach() for g in g_default]])
    dropped_default, g_default = _DEFAULT_GEOMETRY_DROPOUT
    table = _launch.INTERPRETER_BLOCKS if DEVICE == "cpu" else _launch.BLOCKS
    for key, size in blocks.items():
        monkeypatch.setitem(table, key, size)
    L = _launch._Launch(_launch._kernels_module(), q, True, None, 1.0)
    assert (L.fwd_m, L.fwd_n, L.bwd_m, L.bwd_n) == tuple(blocks[n] for n in ("fwd_m", "fwd_n", "bwd_m", "bwd_n"))
    check(lambda: polynomial_attention(q, k, v, coeffs, **kw), q, k, v, coeffs, True, pad, atol=1e-4)
    dropped = polynomial_attention(q, k, v, coeffs, dropout_p=0.2, seed=seed, **kw)
    torch.testing.assert_close(dropped, dropped_default, atol=1e-5, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(dropped.sum(), (q, k, v, coeffs)), g_default):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_cuda_geometry_reads_blocks_with_its_defaults_and_checks_them(monkeypatch):
    # the compiled launches' geometry (a CPU run never launches them; ptx_counts.py compiles with it)
    from diffusionformer.ops.triton import _launch

    base = dict(fwd_m=128, fwd_n=64, bwd_m=32, bwd_n=16, num_warps=None, num_stages=3)
    monkeypatch.setattr(_launch, "BLOCKS", base)
    assert _launch.cuda_geometry(64) == ((128, 64, 32, 16), {"num_warps": 4, "num_stages": 3})
    assert _launch.cuda_geometry(128)[1] == {"num_warps": 8, "num_stages": 3}  # wider heads: 8 warps unless set
    monkeypatch.setattr(_launch, "BLOCKS", dict(base, num_warps=2, num_stages=None))
    assert _launch.cuda_geometry(128)[1] == {"num_warps": 2, "num_stages": 2}
    # the backward's warps and stages: its own entries when set, else the forward's
    assert _launch.cuda_geometry(64, backward=True)[1] == {"num_warps": 2, "num_stages": 2}
    monkeypatch.setattr(_launch, "BLOCKS", dict(base, bwd_num_warps=8, bwd_num_stages=4))
    assert _launch.cuda_geometry(64)[1] == {"num_warps": 4, "num_stages": 3}
    assert _launch.cuda_geometry(64, backward=True) == ((128, 64, 32, 16), {"num_warps": 8, "num_stages": 4})
    for key, bad, match in (("num_warps", 0, "a positive int or None"), ("num_stages", True, "a positive int or None"),
                            ("bwd_num_warps", 2.0, "a positive int or None"), ("bwd_num_stages", -1, "a positive int or None"),
                            ("fwd_n", 48, "a power of two >= 16")):
        monkeypatch.setattr(_launch, "BLOCKS", dict(base, **{key: bad}))
        with pytest.raises(ValueError, match=rf"BLOCKS\['{key}'\] must be {match}, got {bad!r}"):
            _launch.cuda_geometry(64)


def test_backward_kernels_launch_with_the_backward_warps_and_stages():
    # the launches of one call, recorded by stand-in kernels (CPU tensors; nothing runs): the forward's
    # take L.warps, the backward's L.bwd_warps, so a sweep of one leaves the other as it was
    from diffusionformer.ops.triton import _launch

    launches: list[tuple[str, dict]] = []

    class Kernel:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((self.name, kw))

    kernels = type("Kernels", (), {n: Kernel(n) for n in ("_first_step", "_next_step", "_transposed_step",
                                                           "_bwd_dkdv", "_bwd_dq")})()
    B, H, N, C, K = 1, 2, 8, 4, 3
    q = k = v = g = torch.zeros(B, H, N, C)
    L = object.__new__(_launch._Launch)
    L.B, L.H, L.N, L.C, L.block_c = B, H, N, C, 16
    L.fwd_m = L.fwd_n = L.bwd_m = L.bwd_n = 16
    L.warps, L.bwd_warps = {"num_warps": 4, "num_stages": 2}, {"num_warps": 8, "num_stages": 3}
    L.flags, L.pad, L.seed, L.mask, L.mask_strides = {}, torch.zeros(1), torch.zeros(1), torch.zeros(1), (0, 0, 0, 0)
    L.stride_pb, L.qk_scale, L.sm_scale, L.drop_p, L.inv_keep = N, 1.0, 1.0, 0, 1.0
    L.grid = lambda block: (1,)
    coeffs = torch.zeros(H, K + 1)
    _, lse, ys = _launch._forward(kernels, L, q, k, v, coeffs, True)
    _launch._backward(kernels, L, q, k, v, coeffs, lse, ys, g)
    names = [n for n, _ in launches]
    assert names == ["_first_step"] + ["_next_step"] * (K - 1) + ["_transposed_step"] * K + ["_bwd_dkdv", "_bwd_dq"]
    for name, kw in launches:
        want = L.warps if name in ("_first_step", "_next_step") else L.bwd_warps
        assert {key: kw[key] for key in want} == want, name


@requires_triton
@pytest.mark.usefixtures("triton_kernels")
def test_bad_block_geometry_is_a_clear_error(monkeypatch):
    from diffusionformer.ops.triton import _launch

    table, name = (_launch.INTERPRETER_BLOCKS, "INTERPRETER_BLOCKS") if DEVICE == "cpu" else (_launch.BLOCKS, "BLOCKS")
    q, k, v = make(B=1, H=1, N=8, C=4)
    for bad in (24, 8, "64"):
        monkeypatch.setitem(table, "bwd_n", bad)
        with pytest.raises(ValueError, match=rf"{name}\['bwd_n'\] must be a power of two >= 16, got {bad!r}"):
            affine_attention(q, k, v, 0.0, 1.0)
