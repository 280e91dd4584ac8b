"""Edge probes (41): tensor layouts, aliasing and in-place safety at the functional entry points and the layers.

Non-contiguous, expanded (stride 0) and permuted inputs, int32 / strided ``edge_index``, masks that are
expanded views, inputs that alias each other, and inputs the caller changes in place after the call:
each output and gradient is compared with the same call on ``.contiguous()`` clones and with an
explicit float64 reference; version counters show that no input is written to.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer import functional as Fn
from diffusionformer.nn import DiffusionAttention
from diffusionformer.nn.kv_cache import LayerKVCache
from diffusionformer.nn.rotary import RotaryEmbedding


# ----------------------------------------------------------------------------- helpers
def _dense_reference(q, k, v, coeffs, mask=None, causal=False):
    """``sum_k c_k P^k v`` with ``P`` built explicitly in float64 (zero rows where no key is admissible)."""
    q, k, v = q.double(), k.double(), v.double()
    S = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    N, M = S.shape[-2:]
    allow = torch.ones_like(S, dtype=torch.bool)
    if mask is not None:
        if mask.dtype == torch.bool:
            allow = allow & mask
        else:
            S = S + mask.double()
    if causal:
        allow = allow & torch.ones(N, M, dtype=torch.bool).tril()
    P = torch.softmax(S.masked_fill(~allow, float("-inf")), -1).nan_to_num(0.0)
    c = torch.as_tensor(coeffs, dtype=torch.float64)
    c = c.expand(q.shape[1], -1) if c.dim() == 1 else c
    out, x = torch.zeros_like(v), v
    for step in range(c.shape[1]):
        if step:
            x = P @ x
        out = out + c[:, step].view(1, -1, 1, 1) * x
    return out


# ----------------------------------------------------------------------------- KV cache keeps copies
@pytest.mark.parametrize("reused", ["x", "positions"])
def test_bug_kv_cache_keeps_a_reference_to_the_callers_input_and_positions(reused):
    """Bug: ``attend_cached`` stored the caller's ``x`` (and rotary ``positions``) of the first call as the cache's
    ``inputs`` (``positions``) by reference (``_cat(None, new)`` returned ``new``). A decoding loop that reuses one
    input buffer (``buf.copy_(next_token)``) or advances its positions in place (``pos += 1``) rewrote the cached
    tokens, and a layer with context heads that re-project (GRAND-nl with rotary / qk_norm) decoded the later tokens
    against the wrong history: outputs off by ~1e-2 from the full forward pass."""
    torch.manual_seed(0)
    D, H, T = 16, 2, 4
    layer = DiffusionAttention(D, H, heads="grand-nl:1,attention:1", causal=True,
                               rotary=RotaryEmbedding(D // H)).double().eval()
    xs = torch.randn(1, T, D, dtype=torch.float64)
    full = layer(xs)
    cache, buf, pos, outs = LayerKVCache(), torch.empty(1, 1, D, dtype=torch.float64), torch.zeros(1, dtype=torch.long), []
    with torch.no_grad():
        for t in range(T):
            if reused == "x":
                buf.copy_(xs[:, t : t + 1])
                x, p = buf, torch.tensor([t])
            else:
                x, p = xs[:, t : t + 1].clone(), pos
            outs.append(layer(x, cache=cache, positions=p))
            pos += 1
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=0, atol=1e-12)
    torch.testing.assert_close(cache.inputs, xs, rtol=0, atol=0)
    assert cache.positions.tolist() == list(range(T))


# ----------------------------------------------------------------------------- edge_index given as (E, 2) pairs
_N, _H, _C = 5, 2, 4


@pytest.mark.parametrize("call", [
    lambda ei: Fn.diffuse_sparse(torch.randn(_N, _H, _C), torch.randn(_N, _H, _C), torch.randn(_N, _H, _C), ei, [0., 1.]),
    lambda ei: Fn.diffuse_sparse_with_weights(torch.randn(_N, _H, _C), torch.randn(_N, _H, _C),
                                              torch.randn(_N, _H, _C), ei, [1., -1.]),
    lambda ei: Fn.edge_attention(torch.randn(_N, _H, _C), torch.randn(_N, _H, _C), ei),
    lambda ei: Fn.propagate_sparse(torch.rand(7, _H), torch.randn(_N, _H, _C), ei),
], ids=["diffuse_sparse", "diffuse_sparse_with_weights", "edge_attention", "propagate_sparse"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_bug_functional_edge_index_as_pairs_gets_the_transpose_hint(call, dtype):
    """Bug: an ``edge_index`` of ``(E, 2)`` (source, target) pairs, given by mistake to the functional API, was refused
    with a bare "must have shape (2, E), got (7, 2)", while the graph API and the layers (``AttentionGraph.sparse``)
    name the fix (``edge_index.t()``). The functional entry points now give the same hint, and the transposed view
    the hint suggests (non-contiguous, int32 or int64) is accepted."""
    pairs = torch.randint(0, _N, (7, 2), generator=torch.Generator().manual_seed(0)).to(dtype)
    with pytest.raises(ValueError, match=r"got \(7, 2\): a list of \(source, target\) pairs .*edge_index\.t\(\)"):
        call(pairs)
    call(pairs.t())  # the hinted fix: a strided (2, E) view


# ----------------------------------------------------------------------------- pins: masks that are strided views (Triton)
def _strided_masks(B, H, N):
    g = torch.Generator().manual_seed(3)
    return {
        "bool_transposed": (torch.rand(B, H, N, N, generator=g) > 0.3).transpose(-1, -2),
        "float_transposed": torch.randn(B, 1, N, N, generator=g).transpose(-1, -2),
        "bool_sliced_keys": (torch.rand(B, H, N, 2 * N, generator=g) > 0.3)[..., ::2],
        "float_flipped_keys": torch.randn(B, H, N, N, generator=g).flip(-1),
        "bool_expanded_queries": (torch.rand(1, H, 1, N, generator=g) > 0.3).expand(B, H, N, N),
        "float_expanded_keys": torch.randn(N, 1, generator=g).expand(N, N),
    }


@pytest.mark.parametrize("name", list(_strided_masks(1, 1, 2)))
def test_pins_triton_reads_masks_given_as_strided_views(triton_kernels, name):
    """The Triton back-end reads a general ``attn_mask`` through its strides: transposed, sliced, flipped and expanded
    masks give the float64 reference (``P`` built by hand) in the output and in the gradients of ``q``, ``k``, ``v``,
    for fixed affine heads beside K-step heads, causal and not; the caller's tensors keep their version."""
    B, H, N, C = 2, 2, 5, 4
    mask = _strided_masks(B, H, N)[name]
    g = torch.Generator().manual_seed(1)
    base = [torch.randn(B, N, H, C, generator=g).transpose(1, 2), torch.randn(B, H, N, 2 * C, generator=g)[..., ::2],
            torch.randn(B, H, N, C, generator=g)]
    coeffs = [[0.0, 1.0, 0.0], [0.2, 0.5, 0.3]]
    for causal in (False, True):
        q, k, v = (t.detach().requires_grad_() for t in base)
        versions = [t._version for t in (q, k, v, mask)]
        out = Fn.diffuse(q, k, v, coeffs, attn_mask=mask, is_causal=causal, backend="triton")
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in base)
        ref = _dense_reference(q64, k64, v64, coeffs, mask, causal)
        torch.testing.assert_close(out.double(), ref.detach(), rtol=0, atol=2e-5)
        grad = torch.randn(out.shape, generator=g)
        got = torch.autograd.grad(out, (q, k, v), grad)
        want = torch.autograd.grad(ref, (q64, k64, v64), grad.double())
        for a, b in zip(got, want):
            torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5)
        assert [t._version for t in (q, k, v, mask)] == versions


# ----------------------------------------------------------------------------- pins: no entry point writes its inputs
class _WritesTo(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every aten operation that writes (in place or ``out=``) into the storage of one of ``inputs``."""

    def __init__(self, inputs):
        super().__init__()
        self.storages = {t.untyped_storage().data_ptr(): name for name, t in inputs.items()}
        self.hits = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = kwargs.get(arg.name, args[i] if i < len(args) else None)
                for t in torch.utils._pytree.tree_flatten(value)[0]:
                    if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                        name = self.storages.get(t.untyped_storage().data_ptr())
                        if name is not None:
                            self.hits.append((str(func), name))
        return func(*args, **kwargs)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "grad"])
def test_pins_entry_points_never_write_into_their_inputs(mode):
    """The in-place affine combination at inference (``c0 v + c1 P v`` written into ``P v``) and the CSR path's
    head-major copies (``.contiguous()`` of a head-major view is the caller's own storage) never write into the
    caller's ``q``, ``k``, ``v``, masks or ``edge_index``, also when ``q is k is v``; outputs match the calls on
    ``.contiguous()`` clones."""
    g = torch.Generator().manual_seed(5)
    B, H, N, C = 2, 2, 5, 4
    dense = dict(q=torch.randn(B, N, H, C, generator=g).transpose(1, 2), k=torch.randn(B, H, N, C, generator=g),
                 v=torch.randn(B, H, N, C, generator=g), m=torch.randn(B, 1, N, N, generator=g))
    sparse = dict(q=torch.randn(H, N, C, generator=g).transpose(0, 1), k=torch.randn(N, H, C, generator=g),
                  v=torch.randn(H, N, C, generator=g).transpose(0, 1),
                  ei=torch.randint(0, N, (2, 9), generator=g).int())
    x = torch.randn(B, N, 8, generator=g)
    layer = DiffusionAttention(8, 2, heads="attention:1,laplacian:1", causal=True).eval()
    calls = []
    for coeffs in ([1.0, -1.0], [[0.0, 1.0], [1.0, -1.0]], [0.2, 0.5, 0.3]):
        calls += [
            (dense, lambda d, c=coeffs: Fn.diffuse(d["q"], d["k"], d["v"], c, attn_mask=d["m"])),
            (dense, lambda d, c=coeffs: Fn.diffuse(d["v"], d["v"], d["v"], c, backend="sdpa")),
            (sparse, lambda d, c=coeffs: Fn.diffuse_sparse(d["q"], d["k"], d["v"], d["ei"], c)),
            (sparse, lambda d, c=coeffs: Fn.diffuse_sparse(d["v"], d["v"], d["v"], d["ei"], c, backend="native")),
        ]
    calls.append(({"x": x}, lambda d: layer(d["x"])))
    ctx = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "grad": torch.enable_grad}[mode]
    for inputs, call in calls:
        inputs = {n: (t.detach().requires_grad_() if mode == "grad" and t.is_floating_point() else t)
                  for n, t in inputs.items()}
        before = {n: t.detach().clone() for n, t in inputs.items()}
        watch = _WritesTo(inputs)
        with ctx(), watch:
            out = call(inputs)
            if mode == "grad":
                out.sum().backward()
        assert watch.hits == []
        for n, t in inputs.items():
            assert torch.equal(t.detach(), before[n]), n
        with torch.no_grad():
            torch.testing.assert_close(out.detach(), call({n: t.contiguous() for n, t in before.items()}))
