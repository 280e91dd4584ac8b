"""The launches behind :mod:`diffusionformer.ops.triton.attention`: input checks, launch geometry,
the forward and backward recursions, and the :class:`torch.autograd.Function` of the eager path.

Shared by :mod:`~diffusionformer.ops.triton.attention` (the public functions) and
:mod:`~diffusionformer.ops.triton._library` (the custom operators), which both import it.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from diffusionformer.ops._checks import _check_strided

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_LOG2E = 1.4426950408889634

#: Launch geometry of the compiled kernels (CUDA tensors): the query and key block sizes of the
#: forward kernels (``fwd_m`` x ``fwd_n``) and of the backward kernels (``bwd_m`` x ``bwd_n``; the
#: ``dq`` kernel takes them swapped), warps per program (``None``: 8 for head sizes padded to >= 128,
#: else 4) and software-pipeline stages of the forward kernels, and the same two of the backward
#: kernels (``bwd_num_warps``, ``bwd_num_stages``; ``None``: the forward's). Read at every call, so a
#: benchmark or a user may set them; ``benchmarks/bench_triton_blocks.py`` sweeps them on a GPU, the
#: backward's with the forward's left as they are. Block sizes are powers of two >= 16.
BLOCKS: dict[str, int | None] = {"fwd_m": 64, "fwd_n": 64, "bwd_m": 32, "bwd_n": 64, "num_warps": None,
                                 "num_stages": 2, "bwd_num_warps": None, "bwd_num_stages": None}
#: The same under the interpreter (CPU tensors, tests): small and unequal, so that the tests cross
#: every kind of block edge at tiny sizes.
INTERPRETER_BLOCKS: dict[str, int] = {"fwd_m": 32, "fwd_n": 16, "bwd_m": 16, "bwd_n": 32}


def _block_sizes(table: dict, name: str) -> tuple[int, int, int, int]:
    """The four block sizes of ``table``, checked (a clear error instead of a compiler failure)."""
    sizes = []
    for key in ("fwd_m", "fwd_n", "bwd_m", "bwd_n"):
        b = table.get(key)
        if isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 16 or b & (b - 1):  # numpy ints too
            raise ValueError(f"{name}[{key!r}] must be a power of two >= 16, got {b!r}")
        sizes.append(int(b))
    return sizes[0], sizes[1], sizes[2], sizes[3]


def cuda_geometry(block_c: int, backward: bool = False) -> tuple[tuple[int, int, int, int], dict[str, int]]:
    """The launch geometry of the compiled kernels for head blocks of ``block_c`` channels, from :data:`BLOCKS`.

    Returns the block sizes ``(fwd_m, fwd_n, bwd_m, bwd_n)`` (the forward kernels take ``fwd_m x fwd_n``
    blocks, ``_transposed_step`` and ``_bwd_dkdv`` ``bwd_m x bwd_n``, ``_bwd_dq`` ``bwd_n x bwd_m``) and the
    launch options of the forward kernels, or with ``backward`` of the backward kernels: ``num_warps``
    (``BLOCKS["num_warps"]``, for the backward ``BLOCKS["bwd_num_warps"]`` when set, else 8 from
    ``block_c >= 128`` on, else 4) and ``num_stages`` (likewise). Raises ``ValueError`` naming the entry
    of :data:`BLOCKS` that is not valid.
    """
    sizes = _block_sizes(BLOCKS, "BLOCKS")
    entries = {key: BLOCKS.get(key) for key in ("num_warps", "num_stages", "bwd_num_warps", "bwd_num_stages")}
    entries["num_stages"] = BLOCKS.get("num_stages", 2)
    for key, n in entries.items():
        if n is not None and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1):  # numpy ints too
            raise ValueError(f"BLOCKS[{key!r}] must be a positive int or None, got {n!r}")
        if n is not None and key.endswith("num_warps") and n & (n - 1):  # triton asserts it when compiling
            raise ValueError(f"BLOCKS[{key!r}] must be a power of two (warps per program) or None, got {n!r}")
        entries[key] = None if n is None else int(n)
    warps, stages = entries["num_warps"], entries["num_stages"]
    if backward:
        warps = entries["bwd_num_warps"] or warps
        stages = entries["bwd_num_stages"] or stages
    return sizes, {"num_warps": warps or (8 if block_c >= 128 else 4), "num_stages": stages or 2}


#: how to install triton, in the messages of a call that needs it: 3.6 is the oldest release the kernels are known to
#: run with (the GPU image's torch 2.11, whose CUDA wheels pin triton 3.6.0); the dev extra of pyproject.toml asks the same
_TRITON_PIP = "pip install 'triton>=3.6'"


def _kernels_module():
    from diffusionformer.ops.triton import _kernels

    if not _kernels.HAS_TRITON:
        raise ImportError(
            f"diffusionformer.ops.triton needs the 'triton' package ({_TRITON_PIP} on Linux); "
            "use diffusionformer.functional.diffuse for the PyTorch back-ends"
        )
    return _kernels


def _interpreted(kernels) -> bool:
    return type(kernels._first_step).__name__ == "InterpretedFunction"


def _check_device(kernels, device: torch.device, name: str = "") -> None:
    """A RuntimeError unless the kernels run on tensors of ``device``: CUDA, or CPU under the interpreter (a meta
    tensor under the interpreter: not a NotImplementedError from a copy; a CPU tensor without it: not triton's
    "0 active drivers")."""
    if device.type != "cuda" and not (_interpreted(kernels) and device.type == "cpu"):
        raise RuntimeError(
            f"the Triton kernels run on CUDA tensors, got a {device.type} tensor{name}; on CPU set "
            "TRITON_INTERPRET=1 before triton is first imported (interpreter, slow: tests only)"
        )


_MAX_GRID_Y = 65535  # CUDA caps gridDim.y (and z) at 2**16 - 1; the kernels put B * H there


def _check_grid(sequence_heads: int, steps: int = 1) -> None:
    """A ValueError when the launch grid would pass CUDA's cap on its second (``B * H``) or third (``steps``) axis
    (else a launch error that names neither; the back-end's dispatch falls back before this)."""
    for what, unit, n in (("B * H", "sequence-head", sequence_heads), ("steps", "step", steps)):
        if n > _MAX_GRID_Y:
            raise ValueError(f"the Triton kernels launch one program row per {unit} on a CUDA grid axis, which holds "
                             f"at most {_MAX_GRID_Y}; got {what} = {n}")


def _check_inputs(q: object, k: object, v: object, key_padding_mask: object) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (B, H, N, C), got {type(t).__name__}")
        _check_strided(name, t, f"pass {name}.to_dense()")  # else torch's "Cannot access storage", "Internal error"
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, N, C) (4 dims), got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            "q, k and v must have the same shape (B, H, N, C) (self-attention: c0 v needs as many values as "
            f"queries), got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
            got = key_padding_mask.dtype if isinstance(key_padding_mask, Tensor) else type(key_padding_mask).__name__
            raise TypeError(f"key_padding_mask must be a bool tensor (True = padding), got {got}")
        _check_strided("key_padding_mask", key_padding_mask, "pass key_padding_mask.to_dense()")
        B, _, N, _ = q.shape
        if tuple(key_padding_mask.shape) != (B, N):
            raise ValueError(
                f"key_padding_mask must have shape (B, N) = {(B, N)}, got {tuple(key_padding_mask.shape)}"
            )


class _Launch:
    """Launch geometry and flags shared by the kernels of one call."""

    def __init__(self, kernels, q: Tensor, is_causal: bool, pad: Tensor | None, scale: float,
                 dropout_p: float = 0.0, seed: Tensor | None = None, mask: Tensor | None = None):
        B, H, N, C = q.shape
        self.B, self.H, self.N, self.C = B, H, N, C
        self.interpreted = _interpreted(kernels)
        _check_device(kernels, q.device)
        _check_grid(B * H)
        self.block_c = max(16, 1 << (C - 1).bit_length())
        if self.interpreted:
            self.fwd_m, self.fwd_n, self.bwd_m, self.bwd_n = _block_sizes(INTERPRETER_BLOCKS, "INTERPRETER_BLOCKS")
            self.warps, self.bwd_warps = {}, {}
        else:
            (self.fwd_m, self.fwd_n, self.bwd_m, self.bwd_n), self.warps = cuda_geometry(self.block_c)
            self.bwd_warps = cuda_geometry(self.block_c, backward=True)[1]
        self.flags = dict(
            CAUSAL=bool(is_causal),
            HAS_PAD=pad is not None,
            UPCAST=self.interpreted and q.dtype == torch.bfloat16,
            IEEE=q.dtype == torch.float32,
            DROPOUT=dropout_p > 0.0,
            MASK_KIND=0 if mask is None else (1 if mask.dtype == torch.bool else 2),
        )
        self.pad = pad if pad is not None else torch.zeros(1, dtype=torch.uint8, device=q.device)
        if dropout_p > 0.0 and seed is None:
            raise ValueError("dropout_p > 0 needs the call's seed (a (1,) int64 tensor on the device)")
        # dropout on P: the kernels drop an entry when its 16-bit draw is < 65536 drop_p and scale the kept ones
        self.seed = seed if dropout_p > 0.0 else self.pad  # any pointer when unused
        self.drop_p, self.inv_keep = dropout_rate(dropout_p)
        self.stride_pb = N
        # a general attn_mask (4-D, broadcastable to (B, H, N, N)): read with stride 0 along broadcast dims
        if mask is None:
            self.mask, self.mask_strides = self.pad, (0, 0, 0, 0)
        else:
            m = mask.expand(B, H, N, N)
            self.mask = m.view(torch.uint8) if m.dtype == torch.bool else m
            self.mask_strides = tuple(m.stride())
        self.sm_scale = scale
        self.qk_scale = scale * _LOG2E

    def grid(self, block: int) -> tuple[int, int]:
        return ((self.N + block - 1) // block, self.B * self.H)


def _forward(kernels, L: _Launch, q: Tensor, k: Tensor, v: Tensor, coeffs: Tensor, save: bool):
    """Run the ``K`` forward launches; returns ``(out, lse, ys)`` (``ys`` = ``y_1..y_K`` when ``save``)."""
    B, H, N, C = L.B, L.H, L.N, L.C
    K = coeffs.shape[1] - 1
    dt = q.dtype
    # lse[0]: the log2-sum-exp of every row; lse[1]: with a float attn_mask, the row maxima of the mask that every
    # launch subtracts from it (so that large negative biases keep the log-sum-exp exact; _kernels._bias_max)
    lse = torch.empty(2, B, H, N, device=q.device, dtype=torch.float32)
    # (B, H, N, C) stored as (B, N, H, C), like SDPA's output: out.transpose(1, 2).reshape(B, N, H * C) is free.
    # Allocated with those strides, not as a transposed view: an output that is a view made inside the autograd
    # Function may not be modified in place (autograd refuses `out += x`, which SDPA's output takes)
    out = torch.empty_strided((B, H, N, C), (N * H * C, C, H * C, 1), device=q.device, dtype=dt)
    if save:
        ys = torch.empty(K, B, H, N, C, device=q.device, dtype=dt)
    else:  # only the last two powers are needed at any time
        ys = torch.empty(min(K, 2), B, H, N, C, device=q.device, dtype=dt)
    slot = (lambda j: ys[j - 1]) if save else (lambda j: ys[(j - 1) % 2])
    # K >= 2: the sum is accumulated in a float32 buffer and cast once by the last step
    acc = out if K == 1 else torch.empty(B, H, N, C, device=q.device, dtype=torch.float32)
    kernels._first_step[L.grid(L.fwd_m)](
        q, k, v, L.pad, coeffs[:, 0], coeffs[:, 1], acc, slot(1), lse, L.seed, L.mask,
        *q.stride(), *k.stride(), *v.stride(), *acc.stride(),
        L.stride_pb, *L.mask_strides, coeffs.stride(0),
        H, N, C, L.qk_scale, L.drop_p, L.inv_keep,
        STORE_Y=save or K > 1, BLOCK_M=L.fwd_m, BLOCK_N=L.fwd_n, BLOCK_C=L.block_c,
        **L.flags, **L.warps,
    )
    for j in range(2, K + 1):
        dst = out if j == K else acc
        kernels._next_step[L.grid(L.fwd_m)](
            q, k, slot(j - 1), L.pad, coeffs[:, j], acc, dst, slot(j), lse, L.seed, L.mask,
            *q.stride(), *k.stride(), *dst.stride(),
            L.stride_pb, *L.mask_strides, coeffs.stride(0),
            H, N, C, L.qk_scale, j, L.drop_p, L.inv_keep,
            STORE_Y=save or j < K, BLOCK_M=L.fwd_m, BLOCK_N=L.fwd_n, BLOCK_C=L.block_c,
            **L.flags, **L.warps,
        )
    return out, lse, ys


def _backward(kernels, L: _Launch, q, k, v, coeffs, lse, ys, g: Tensor):
    B, H, N, C = L.B, L.H, L.N, L.C
    K = coeffs.shape[1] - 1
    dt = q.dtype
    dev = q.device
    # A[m - 1] = a_m, m = 1..K: a_K = c_K g, a_m = c_m g + P^T a_{m+1}; the same launches write
    # delta_i = sum_m <a_m,i, y_m,i> and the rows <g_j, y_m,j> of the coefficient gradients
    A = torch.empty(K, B, H, N, C, device=dev, dtype=dt)
    # float64: a long series sums K terms of delta that cancel against dP in the softmax backward (_kernels._acc_dp)
    delta = torch.empty(B, H, N, device=dev, dtype=torch.float64)
    dcrows = torch.empty(K + 1, B, H, N, device=dev, dtype=torch.float32)
    for m in range(K, 0, -1):
        kernels._transposed_step[L.grid(L.bwd_n)](
            q, k, g, A[m] if m < K else A[m - 1], A[m - 1], ys[m - 1], L.pad, coeffs[:, m], lse, delta, dcrows[m],
            L.seed, L.mask,
            *q.stride(), *k.stride(), *g.stride(),
            L.stride_pb, *L.mask_strides, coeffs.stride(0),
            H, N, C, L.qk_scale, m + 1, L.drop_p, L.inv_keep,
            HAS_IN=m < K, BLOCK_M=L.bwd_m, BLOCK_N=L.bwd_n, BLOCK_C=L.block_c,
            **L.flags, **L.bwd_warps,
        )
    # gradients stored as (B, N, H, C), the layout of a packed qkv projection
    dq = torch.empty(B, N, H, C, device=dev, dtype=dt).transpose(1, 2)
    dk = torch.empty(B, N, H, C, device=dev, dtype=dt).transpose(1, 2)
    dv = torch.empty(B, N, H, C, device=dev, dtype=dt).transpose(1, 2)
    step = B * H * N * C
    kernels._bwd_dkdv[L.grid(L.bwd_n)](
        q, k, v, g, A, ys, L.pad, coeffs[:, 0], lse, delta, dk, dv, dcrows[0], L.seed, L.mask,
        *q.stride(), *k.stride(), *v.stride(), *g.stride(), *dk.stride(),
        L.stride_pb, *L.mask_strides, coeffs.stride(0), step,
        H, N, C, K, L.qk_scale, L.sm_scale, L.drop_p, L.inv_keep,
        BLOCK_M=L.bwd_m, BLOCK_N=L.bwd_n, BLOCK_C=L.block_c,
        **L.flags, **L.bwd_warps,
    )
    kernels._bwd_dq[L.grid(L.bwd_n)](
        q, k, v, A, ys, L.pad, lse, delta, dq, L.seed, L.mask,
        *q.stride(), *k.stride(), *v.stride(), *dq.stride(),
        L.stride_pb, *L.mask_strides, step,
        H, N, C, K, L.qk_scale, L.sm_scale, L.drop_p, L.inv_keep,
        BLOCK_M=L.bwd_n, BLOCK_N=L.bwd_m, BLOCK_C=L.block_c,
        **L.flags, **L.bwd_warps,
    )
    # (H, K + 1), contiguous as the fake implementation of the backward operator says (a compiled graph plans with it)
    dcoeffs = dcrows.sum(dim=(1, 3)).transpose(0, 1).contiguous()
    return dq, dk, dv, dcoeffs.to(coeffs.dtype)


class _PolynomialAttention(torch.autograd.Function):
    """Autograd wrapper: forward by the step kernels, backward by the reverse recursion (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, coeffs, pad, is_causal, scale, dropout_p=0.0, seed=None, mask=None):
        kernels = _kernels_module()
        L = _Launch(kernels, q, is_causal, pad, scale, dropout_p, seed, mask)
        save = any(ctx.needs_input_grad[:4])
        out, lse, ys = _forward(kernels, L, q, k, v, coeffs, save)
        if save:
            ctx.save_for_backward(q, k, v, coeffs, pad, lse, ys, seed, mask)
        ctx.is_causal, ctx.scale, ctx.dropout_p = is_causal, scale, dropout_p
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, coeffs, pad, lse, ys, seed, mask = ctx.saved_tensors
        kernels = _kernels_module()
        with torch.no_grad():
            L = _Launch(kernels, q, ctx.is_causal, pad, ctx.scale, ctx.dropout_p, seed, mask)
            dq, dk, dv, dc = _backward(kernels, L, q, k, v, coeffs, lse, ys, grad_out)
        need = ctx.needs_input_grad
        grads = [dq if need[0] else None, dk if need[1] else None, dv if need[2] else None, dc if need[3] else None]
        if torch.is_grad_enabled():  # create_graph=True: the gradients depend on the inputs, but have no derivative
            kept = [g for g in grads if g is not None]
            tied = iter(_NoDoubleBackward.apply(len(kept), *kept, q, k, v, coeffs, grad_out))
            grads = [None if g is None else next(tied) for g in grads]
        return (*grads, None, None, None, None, None, None)


class _NoDoubleBackward(torch.autograd.Function):
    """The gradients of :class:`_PolynomialAttention` under ``create_graph=True``, tied to the call's inputs: a
    gradient of them (double backward) raises where it is asked for. (``once_differentiable`` ties them only to an
    output gradient that requires grad: after ``grad(loss, q, create_graph=True)`` they were constants, and the
    second-order term of a gradient penalty was zero, silently.)"""

    @staticmethod
    def forward(ctx, n, *tensors):
        # copies, not views: a view made inside a custom Function may not be modified in place (g.mul_(2) on a
        # gradient from grad(..., create_graph=True) raised autograd's "is a view and is being modified inplace")
        return tuple(t.clone() for t in tensors[:n])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(
            "the Triton kernels (polynomial_attention, affine_attention, backend='triton') have no double backward: "
            "a gradient of their gradients (create_graph=True) needs backend='matrix' or 'sdpa'"
        )


def dropout_rate(dropout_p: float) -> tuple[float, float]:
    """The rate the kernels drop at for ``dropout_p``, and the scale of a kept entry.

    A kernel decides an entry with 16 random bits (``_kernels._dropout_scale``), so the rate is ``dropout_p``
    rounded to a multiple of ``2^-16`` (within ``2^-17`` of it; at most ``1 - 2^-16``), and the kept entries
    are scaled by ``1 / (1 - rate)``: unbiased at the rate the kernels draw.
    """
    steps = min(round(float(dropout_p) * 65536.0), 65535)
    rate = steps / 65536.0
    return rate, 1.0 / (1.0 - rate)


def _dropout_scales(seed: Tensor, batch: int, heads: int, n: int, steps: int, dropout_p: float) -> Tensor:
    """The dropout scales the kernels apply under ``seed``: ``(steps, B, H, N, N)`` float32 (0 or ``1 / (1 - rate)``)."""
    kernels = _kernels_module()
    _check_device(kernels, seed.device, " (seed)")
    _check_grid(batch * heads, steps)
    out = torch.empty(steps, batch, heads, n, n, device=seed.device, dtype=torch.float32)
    block = 32
    kernels._dropout_scales[((n + block - 1) // block, batch * heads, steps)](
        seed, out, n, *dropout_rate(dropout_p), BLOCK_M=block, BLOCK_N=block)
    return out
