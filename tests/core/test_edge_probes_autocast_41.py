"""Edge probes (41): mixed precision on the CPU across the public paths.

Probed against float64 (the same modules converted with ``.double()``) and against torch's own layers
(:func:`torch.nn.functional.scaled_dot_product_attention` and :class:`torch.nn.MultiheadAttention` under
``torch.autocast("cpu")``): ``diffuse`` / ``diffuse_sparse`` (every back-end), ``DiffusionAttention`` dense and
sparse with every registered operator (rivals included) under bf16 and fp16 autocast and as ``.bfloat16()``
modules, with q/k norm and rotary; GPT, ViT and graph transformer presets (tiny sizes; edge features, global
attention, positional encodings); the KV-cache decode path (chunked prefill and single steps, RoPE, GQA,
64-step PPR series) under autocast; gradients (dtype of every parameter's gradient) and float64 leaks (a
dispatch mode recording every float64 result: only the operators' fixed float64 constants appear).

All of that is fine: outputs stay within ~1e-2 (relative to the largest output) of float64, dense and sparse
layers return the autocast dtype (the sparse kernel computes in float32, the output projection casts), every
gradient has its parameter's dtype.

Found and fixed (tests whose docstring starts with "Bug:"):

* ``diffuse`` / ``diffuse_with_weights`` / ``propagate_dense`` under an enabled autocast refused ``q``, ``k``, ``v`` of different
  dtypes (``TypeError: q and k must have the same dtype``) that ``F.scaled_dot_product_attention`` -- whose
  output dtype ``diffuse`` documents to follow -- accepts and casts to the autocast dtype (a bf16 ``v`` from a
  ``Linear`` beside float32 ``q``, ``k`` from a rotary embedding with float32 tables, the usual case).
* Under float16 autocast with float32 inputs, a float ``attn_mask`` with finite biases beyond float16's range
  (``-1e9``, documented to be clamped so that a row of them still attends) was clamped to float32's range only:
  autocast's float16 scores (materialised ``P``) and SDPA's float16 mask made them ``-inf``, so ``"matrix"`` /
  ``"auto"`` returned NaN and ``"sdpa"`` zero or wrong rows (also through ``DiffusionAttention``). The mask is
  now clamped to the autocast dtype's range and the materialised scores take the mask in float32.

Documented: ``diffuse_sparse`` is not an autocast operation (float32 inputs under autocast give a float32
output, as PyG's scatter kernels; the layer's output projection casts); its docstring now says so with a
doctest, pinned below.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as TF

import diffusionformer.functional as F
from diffusionformer import DiffusionAttention

F64, BF16, FP16 = torch.float64, torch.bfloat16, torch.float16


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def _qkv(B=2, H=2, N=7, C=4):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, N, C, generator=g) for _ in range(3))


@pytest.mark.parametrize("low", [BF16, FP16])
@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
@pytest.mark.parametrize("coeffs", [[0.0, 1.0], [1.0, -1.0], [0.5, 0.3, 0.2], "tensor"])
@pytest.mark.parametrize("which", ["q", "v", "qk"])
def test_bug_diffuse_under_autocast_takes_mixed_input_dtypes_as_sdpa_does(low, backend, coeffs, which):
    """Bug: under ``torch.autocast`` ``diffuse`` raised ``TypeError`` ("q and k must have the same dtype" /
    "v must have the dtype of q") for inputs in the autocast dtype beside float32 ones, which
    ``F.scaled_dot_product_attention`` takes (autocast casts all three); the output is now SDPA's dtype and
    within the low precision's tolerance of a float64 reference."""
    q, k, v = _qkv()
    c = torch.tensor([0.5, 0.3, 0.2]) if coeffs == "tensor" else coeffs
    want = F.diffuse(q.double(), k.double(), v.double(), c if coeffs != "tensor" else c.double(), is_causal=True)
    mixed = {"q": (q.to(low), k, v), "v": (q, k, v.to(low)), "qk": (q.to(low), k.to(low), v)}[which]
    with torch.autocast("cpu", dtype=low):
        ref = TF.scaled_dot_product_attention(*mixed, is_causal=True)
        got = F.diffuse(*mixed, c, is_causal=True, backend=backend)
        got_w, _ = F.diffuse_with_weights(*mixed, c, is_causal=True, backend=backend)
        uniform = F.diffuse(q, k, v, c, is_causal=True, backend=backend)
    assert got.dtype == ref.dtype == uniform.dtype == low
    assert torch.equal(got, got_w)
    assert _rel(got, want) <= 3e-2


@pytest.mark.parametrize("low", [BF16, FP16])
def test_bug_propagate_dense_under_autocast_takes_mixed_input_dtypes_as_sdpa_does(low):
    """Bug: ``propagate_dense`` (one step ``P x`` "through the fused SDPA kernel") refused under autocast the mixed
    dtypes that SDPA takes; now it returns SDPA's result (same kernel, same casts)."""
    q, k, x = _qkv()
    mixed = (q.to(low), k, x)
    with torch.autocast("cpu", dtype=low):
        ref = TF.scaled_dot_product_attention(*mixed, is_causal=True)
        got = F.propagate_dense(*mixed, is_causal=True)
    assert got.dtype == low and torch.equal(got, ref)


def test_pins_mixed_dtypes_are_still_refused_without_autocast_or_with_float64():
    """Guard of the fix: the cast is autocast's, so without autocast mixed dtypes stay a ``TypeError``
    (as SDPA's error), and a float64 input beside float32 ones is not cast (autocast leaves float64 alone)."""
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="same dtype"):
        F.diffuse(q.to(BF16), k, v, [0.5, 0.5])
    with torch.autocast("cpu", dtype=BF16):
        with pytest.raises(TypeError, match="same dtype"):
            F.diffuse(q.double(), k, v, [0.5, 0.5])
        # float64 throughout stays float64 (as SDPA under autocast)
        assert F.diffuse(q.double(), k.double(), v.double(), [0.5, 0.3, 0.2]).dtype == F64


@pytest.mark.parametrize("low", [BF16, FP16])
@pytest.mark.parametrize("backend", ["auto", "csr", "native"])
def test_pins_diffuse_sparse_is_not_an_autocast_operation(low, backend):
    """``diffuse_sparse`` under autocast computes in float32 and returns its input dtype (float32 inputs give a
    float32 output, half inputs their dtype); the sparse layer's output (through its projection) is the autocast
    dtype, as the dense layer's, and both are within bf16 error of float64."""
    g = torch.Generator().manual_seed(1)
    N, H, C = 9, 2, 4
    q, k, v = (torch.randn(N, H, C, generator=g) for _ in range(3))
    ei = torch.randint(0, N, (2, 30), generator=g)
    c = [0.4, 0.3, 0.2, 0.1]
    want = F.diffuse_sparse(q.double(), k.double(), v.double(), ei, c, backend="native")
    with torch.autocast("cpu", dtype=low):
        out32 = F.diffuse_sparse(q, k, v, ei, c, backend=backend)
        outlow = F.diffuse_sparse(q.to(low), k.to(low), v.to(low), ei, c, backend=backend)
    assert out32.dtype == torch.float32 and outlow.dtype == low
    assert _rel(out32, want) <= 1e-5 and _rel(outlow, want) <= 3e-2
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads="heat:1,polynomial:1")
    x = torch.randn(N, 8)
    ref = copy.deepcopy(layer).double()(x.double(), edge_index=ei)
    with torch.autocast("cpu", dtype=low):
        y = layer(x, edge_index=ei)
        y_dense = layer(x[None])
    assert y.dtype == y_dense.dtype == low
    assert _rel(y, ref) <= 3e-2


def _far_mask(B: int, H: int, N: int) -> torch.Tensor:
    """Finite biases beyond float16's range: a row of them only (still attends, uniformly), a key of one."""
    m = torch.zeros(B, H, N, N)
    m[..., 1, :] = -1e9
    m[..., 2, 0] = -1e9
    m[..., 3, :2] = -7e4
    return m


@pytest.mark.parametrize("backend", ["auto", "sdpa", "matrix"])
@pytest.mark.parametrize("coeffs", [[0.0, 1.0], [1.0, -1.0], [0.5, 0.3, 0.2], "tensor"])
def test_bug_fp16_autocast_keeps_far_finite_mask_biases_finite(backend, coeffs):
    """Bug: a float ``attn_mask`` is documented to be clamped to the compute dtype's range (``-1e9`` for
    float16: a row of such biases still attends). With float32 inputs under ``torch.autocast("cpu",
    dtype=torch.float16)`` it was clamped to float32's range only, then autocast's float16 scores and SDPA's
    float16 mask turned it into ``-inf``: the ``"matrix"`` back-end (and ``"auto"``, which picks it for short
    sequences) returned NaN, ``"sdpa"`` a zero row (plain attention) or wrong rows. Now as float16 inputs: the
    float64 reference within float16 tolerance."""
    q, k, v = _qkv(1, 2, 5, 4)
    m = _far_mask(1, 2, 5)
    c = torch.tensor([0.5, 0.3, 0.2]) if coeffs == "tensor" else coeffs
    want = F.diffuse(q.double(), k.double(), v.double(), c if coeffs != "tensor" else c.double(),
                     attn_mask=m.double())
    half = F.diffuse(q.half(), k.half(), v.half(), c, attn_mask=m, backend=backend)  # float16 inputs: clamped
    assert _rel(half, want) <= 1e-2
    with torch.autocast("cpu", dtype=FP16):
        got = F.diffuse(q, k, v, c, attn_mask=m, backend=backend)
        got_causal = F.diffuse(q, k, v, c, attn_mask=m, is_causal=True, backend=backend)
    want_causal = F.diffuse(q.double(), k.double(), v.double(), c if coeffs != "tensor" else c.double(),
                            attn_mask=m.double(), is_causal=True)
    assert got.dtype == FP16 and torch.isfinite(got).all()
    assert _rel(got, want) <= 1e-2 and _rel(got_causal, want_causal) <= 1e-2


@pytest.mark.parametrize("heads", ["attention:2", "laplacian:1,heat:1", "heat-exact:1,ppr-exact:1",
                                   "polynomial:2", "differential:2", "attnscale:2", "grand-nl:2"])
def test_bug_fp16_autocast_layer_with_far_mask_biases_matches_float64(heads):
    """Bug: the same through ``DiffusionAttention(attn_mask=...)``: under float16 autocast a row of ``-1e9``
    biases became a fully masked row (zero output or NaN) instead of uniform attention."""
    torch.manual_seed(0)
    layer = DiffusionAttention(8, 2, heads=heads)
    x = torch.randn(1, 5, 8)
    m = _far_mask(1, 2, 5)
    want = copy.deepcopy(layer).double()(x.double(), attn_mask=m.double())
    with torch.autocast("cpu", dtype=FP16):
        got = layer(x, attn_mask=m)
    assert got.dtype == FP16 and torch.isfinite(got).all()
    assert _rel(got, want) <= 1e-2


@pytest.mark.parametrize("low", [BF16, FP16])
def test_pins_kv_cache_decode_under_autocast_matches_float64(low):
    """The KV-cache decode path under CPU autocast (a float32 model): chunked prefill then single steps, RoPE,
    GQA, K-step, matrix-function and context (rival) heads; the cache holds the autocast dtype, the logits have it
    and stay within its tolerance of the float64 full forward."""
    from diffusionformer.models import create_model

    torch.manual_seed(0)
    model = create_model("gpt-char-tiny", heads="heat(t=2.0, steps=6):1,ppr-exact:1,neutreno:1,differential:1",
                         block_size=12, rope=True, n_kv_head=2).eval()
    idx = torch.randint(0, 65, (2, 12))
    want = copy.deepcopy(model).double()(idx)[0]
    with torch.no_grad(), torch.autocast("cpu", dtype=low):
        cache = model.new_cache()
        parts = [model.forward_cached(idx[:, :5], cache)]
        parts += [model.forward_cached(idx[:, t : t + 1], cache) for t in range(5, 12)]
    got = torch.cat(parts, 1)
    assert got.dtype == low and all(c.keys.dtype == low for c in cache)
    assert _rel(got, want) <= 2e-2


def test_bug_mixed_dtypes_with_a_float64_under_autocast_name_the_dtypes_given():
    """Bug: under bf16 autocast, float32 ``q``, ``k`` beside a float64 ``v`` were refused naming bfloat16 (the dtype
    the internal cast had given ``q``), a dtype the caller never passed; the refusal names float32 and float64."""
    from diffusionformer.functional import diffuse

    q = torch.randn(1, 2, 3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(TypeError, match=r"dtype of q \(torch\.float32\), got torch\.float64"):
            diffuse(q, q, q.double(), [0.0, 1.0])
