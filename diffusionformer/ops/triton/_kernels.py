# Triton kernels of diffusionformer.ops.triton (flash-style diffusion with P = softmax(q k^T s + mask)).
#
# The forward pass follows the FlashAttention-2 algorithm (Tri Dao, https://tridao.me/publications/flash2/flash2.pdf)
# in the structure of Triton's fused-attention tutorial (python/tutorials/06-fused-attention.py of
# https://github.com/triton-lang/triton, "Credits: OpenAI kernel team"; Triton is Copyright 2018-2020
# Philippe Tillet and 2020-2022 OpenAI, under the MIT licence): one program per
# (query block, batch * head), keys streamed in blocks, an online softmax in base 2 that keeps the
# row maximum and the row sum, and the log-sum-exp of every row stored for the backward pass.
# What is new here: the epilogue writes c0[h] v + c1[h] (P v) instead of P v; later steps of the
# Krylov sequence reuse the stored log-sum-exp (no online rescaling) and accumulate c_k[h] P^k v in
# the same kernel; the backward pass is the reverse (Horner) recursion of the polynomial, with
# dP = sum_m a_{m+1} y_m^T contracted inside the dq and dk/dv kernels (never N x N in memory);
# boundary blocks are masked (any N, any head dimension), and the key-padding mask, a general
# attn_mask (bool, or float added to the scores; any broadcast over batch, heads, queries and keys),
# empty rows and the causal mask are handled in-kernel. Dropout on P draws a fresh mask per power of P (as the
# PyTorch back-ends do): the mask of entry (i, j) of step t of head bh is a Philox draw keyed by the
# call's seed with the counter (i N + j, bh, t, 0), regenerated wherever the backward pass needs it
# (the approach of FlashAttention's dropout): nothing N x N is stored.
#
# This module defines its kernels only when triton imports, so that the library (and pytest's
# doctest collection) imports without triton; diffusionformer.ops.triton imports it lazily.

from __future__ import annotations

try:  # the library must work without triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None

__all__ = ["HAS_TRITON"]

HAS_TRITON = triton is not None

if HAS_TRITON:

    @triton.jit
    def _dot(a, b, acc, UPCAST: tl.constexpr, IEEE: tl.constexpr):
        """``acc + a @ b`` with fp32 accumulation (UPCAST: fp32 operands, for the interpreter's bf16)."""
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if IEEE:
            return tl.dot(a, b, acc, input_precision="ieee")
        else:
            return tl.dot(a, b, acc)

    @triton.jit
    def _dropout_scale(seed, bh, step, rows, cols, N, drop_p, inv_keep, TRANS: tl.constexpr):
        """float block ``[rows, cols]`` (``[cols, rows]`` with TRANS): ``inv_keep`` where entry ``(row, col)`` of power
        ``step`` of head ``bh`` is kept, else 0.

        ``rows`` (queries) and ``cols`` (keys) are 1-D index ranges; ``cols`` is contiguous and starts at a
        multiple of 8. One Philox draw (4 x 32 bits) decides 8 neighbouring keys of a row, 16 bits each: the
        counter is ``(row * ceil(N / 8) + col // 8, bh, step, high word)`` under the 64-bit ``seed``, and key
        ``col`` takes the 16-bit piece ``col % 8`` (low half of word 0, high half of word 0, low half of word 1,
        ...). An entry is dropped when its piece is ``< 65536 * drop_p`` (the host rounds ``drop_p`` to a
        multiple of 2^-16), so the forward and the backward kernels see the same mask whatever the block
        shapes and orientation, at an eighth of the draws of one per entry.
        """
        BM: tl.constexpr = rows.shape[0]
        BN: tl.constexpr = cols.shape[0]
        groups = tl.max(tl.reshape(cols, [BN // 8, 8]), axis=1) // 8  # col // 8 of each run of 8 keys
        ctr = rows[:, None].to(tl.int64) * ((N + 7) // 8) + groups[None, :]
        c0 = (ctr & 0xFFFFFFFF).to(tl.uint32)
        c3 = (ctr >> 32).to(tl.uint32)
        z = tl.zeros_like(c0)
        r0, r1, r2, r3 = tl.philox(seed, c0, z + bh, z + step, c3)
        thr = (tl.zeros([], dtype=tl.float32) + drop_p * 65536.0).to(tl.uint32)  # exact: the host rounds drop_p
        # tl.join stacks along a new last axis, so the first operand of the outermost join is the lowest bit of
        # the key: join(join(join(piece 0, piece 4), join(piece 2, piece 6)), join(join(piece 1, piece 5),
        # join(piece 3, piece 7))) is [.., g, a, b, c] with piece 4 a + 2 b + c at key 8 g + 4 a + 2 b + c
        # (nesting the pieces in their own order put piece 4 at key 1, piece 1 at key 4, ...)
        k0 = tl.join(tl.join((r0 & 0xFFFF) >= thr, (r2 & 0xFFFF) >= thr), tl.join((r1 & 0xFFFF) >= thr, (r3 & 0xFFFF) >= thr))
        k1 = tl.join(tl.join((r0 >> 16) >= thr, (r2 >> 16) >= thr), tl.join((r1 >> 16) >= thr, (r3 >> 16) >= thr))
        keep = tl.reshape(tl.join(k0, k1), [BM, BN])  # [.., g, a, b, c] -> key 8 g + 4 a + 2 b + c
        d = tl.where(keep, inv_keep, 0.0)
        if TRANS:
            d = tl.trans(d)
        return d

    @triton.jit
    def _seed(SEED, DROPOUT: tl.constexpr):
        """The call's dropout seed (int64, read on the device: no host sync), or 0 without dropout."""
        if DROPOUT:
            return tl.load(SEED)
        else:
            return tl.zeros([], dtype=tl.int64)

    @triton.jit
    def _dropout_scales(SEED, OUT, N, drop_p, inv_keep, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """``OUT[step - 1, bh, i, j]`` = the scale (0 or ``inv_keep``) the kernels give entry ``(i, j)`` of power ``step``
        of head ``bh`` (grid: query blocks, ``B * H``, steps; ``OUT`` contiguous float32)."""
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        bh = tl.program_id(1)
        step = tl.program_id(2) + 1
        seed = tl.load(SEED)
        base = OUT + (tl.program_id(2).to(tl.int64) * tl.num_programs(1) + bh) * N * N
        for start_n in range(0, N, BLOCK_N):
            kn = start_n + tl.arange(0, BLOCK_N)
            d = _dropout_scale(seed, bh, step, offs_m, kn, N, drop_p, inv_keep, False)
            tl.store(base + offs_m[:, None].to(tl.int64) * N + kn[None, :], d, mask=(offs_m[:, None] < N) & (kn[None, :] < N))

    @triton.jit
    def _keep(offs_q, offs_k, N, pad_row, mask_base, stride_mi, stride_mj, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
              MASK_KIND: tl.constexpr):
        """bool block: key ``offs_k`` is admissible for query ``offs_q`` (both 2-D broadcastable index grids).

        MASK_KIND 1: a bool ``attn_mask`` (bytes, nonzero = attend) at ``mask_base`` with strides
        ``stride_mi, stride_mj`` (0 where broadcast) is part of the rule; kind 2 (float) is added to
        the scores by :func:`_bias` instead. Offsets into the mask (and the dropout table, the stacked
        powers of the backward) are int64: ``offs_q * stride_mi`` passes 2**31 for a dense ``(N, N)`` mask
        from N = 46,341 on (``offs_k * stride_mj`` too for a transposed one), and Triton multiplies int32
        block indices by int32 strides in int32. So are the offsets of every strided tensor (``q``, ``k``,
        ``v``, the output and the gradients): a ``(B, N, H, C)`` layout's row stride ``H C`` passes 2**31
        within one head from ``N H C >= 2**31`` on (a long context of a wide model); the index wrapped to a
        negative offset, an illegal address.
        """
        keep = (offs_k < N) & (offs_q < N)
        if HAS_PAD:
            pad = tl.load(pad_row + offs_k, mask=offs_k < N, other=1)
            keep = keep & (pad == 0)
        if MASK_KIND == 1:
            allowed = tl.load(mask_base + offs_q.to(tl.int64) * stride_mi + offs_k.to(tl.int64) * stride_mj, mask=keep, other=0)
            keep = keep & (allowed != 0)
        if CAUSAL:
            keep = keep & (offs_q >= offs_k)
        return keep

    @triton.jit
    def _bias(s, offs_q, offs_k, N, mask_base, stride_mi, stride_mj, shift, MASK_KIND: tl.constexpr):
        """Scores (log2 units) plus a float ``attn_mask`` (MASK_KIND 2) less its row maximum ``shift`` (broadcastable
        like ``offs_q``; see :func:`_bias_max`), times log2(e); unchanged otherwise."""
        if MASK_KIND == 2:
            ok = (offs_q < N) & (offs_k < N)
            m = tl.load(mask_base + offs_q.to(tl.int64) * stride_mi + offs_k.to(tl.int64) * stride_mj, mask=ok, other=0.0)
            s = s + (m.to(tl.float32) - shift) * 1.4426950408889634
        return s

    @triton.jit
    def _bias_max(offs_m, N, hi, pad_row, mask_base, stride_mi, stride_mj, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
                  BLOCK_N: tl.constexpr):
        """Per query ``offs_m``: the largest float ``attn_mask`` entry over its admissible keys (0 when none is finite).

        Softmax ignores a per-row constant, so the kernels add ``mask - shift`` to the scores: a row whose every key
        carries a large negative bias (``-1e9``, ``finfo.min``: padding or a graph as a float mask) keeps its scores
        in float32 range and its log-sum-exp exact, instead of ``m + log2(l)`` losing ``log2(l)`` next to ``m``.
        """
        top = tl.full(offs_m.shape, float("-inf"), dtype=tl.float32)
        for start_n in range(0, hi, BLOCK_N):
            kn = start_n + tl.arange(0, BLOCK_N)
            keep = _keep(offs_m[:, None], kn[None, :], N, pad_row, mask_base, stride_mi, stride_mj, CAUSAL, HAS_PAD, 2)
            b = tl.load(mask_base + offs_m[:, None].to(tl.int64) * stride_mi + kn[None, :].to(tl.int64) * stride_mj, mask=keep, other=float("-inf"))
            top = tl.maximum(top, tl.max(b.to(tl.float32), 1))
        return tl.where(top == float("-inf"), 0.0, top)

    @triton.jit
    def _row_shift(lse_row, offs, N, MASK_KIND: tl.constexpr):
        """The shift of :func:`_bias_max` of queries ``offs`` (stored by the first step in the second plane of
        ``LSE``, ``(2, B, H, N)``; ``lse_row`` points at the head's row of the first plane), 0 without a float mask."""
        if MASK_KIND == 2:
            return tl.load(lse_row + tl.num_programs(1).to(tl.int64) * N + offs, mask=offs < N, other=0.0)
        else:
            return tl.zeros(offs.shape, dtype=tl.float32)

    @triton.jit
    def _free_keys(start_m, N, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
        """End of the key blocks that every query ``start_m ..`` of the block may see without a mask."""
        if CAUSAL:
            free = tl.minimum(N, start_m + 1)
        else:
            free = N
        return (free // BLOCK_N) * BLOCK_N

    @triton.jit
    def _online_block(
        acc, l_i, m_i, q, k_base, v_base, pad_row, mask_base, stride_mi, stride_mj, shift, start_n, offs_m, offs_n, offs_c, c_ok, N,
        qk_scale, stride_kn, stride_kc, stride_vn, stride_vc, seed, bh, drop_p, inv_keep,
        MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, MASK_KIND: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
        DROPOUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        """One key block of the online softmax (MASKED: apply bounds, padding, the causal mask and the attn_mask)."""
        kn = start_n + offs_n
        kT = tl.load(k_base + kn[None, :].to(tl.int64) * stride_kn + offs_c[:, None].to(tl.int64) * stride_kc,
                     mask=(kn[None, :] < N) & c_ok[:, None], other=0.0)
        s = _dot(q, kT, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), UPCAST, IEEE) * qk_scale
        if MASKED:  # a float attn_mask (MASK_KIND 2) joins the scores; with any mask every block is MASKED
            s = _bias(s, offs_m[:, None], kn[None, :], N, mask_base, stride_mi, stride_mj, shift[:, None], MASK_KIND)
            keep = _keep(offs_m[:, None], kn[None, :], N, pad_row, mask_base, stride_mi, stride_mj, CAUSAL, HAS_PAD, MASK_KIND)
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp2(-inf) = 0
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)  # the softmax normaliser counts every key, dropped or not
        if DROPOUT:
            p = p * _dropout_scale(seed, bh, 1, offs_m, kn, N, drop_p, inv_keep, False)
        v = tl.load(v_base + kn[:, None].to(tl.int64) * stride_vn + offs_c[None, :].to(tl.int64) * stride_vc,
                    mask=(kn[:, None] < N) & c_ok[None, :], other=0.0)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], UPCAST, IEEE)
        return acc, l_i, m_new

    @triton.jit
    def _fixed_block(
        acc, q, k_base, x_base, pad_row, mask_base, stride_mi, stride_mj, lse, shift, start_n, offs_m, offs_n, offs_c, c_ok, N, C, qk_scale,
        stride_kn, stride_kc, seed, bh, step, drop_p, inv_keep,
        MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, MASK_KIND: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
        DROPOUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        """One key block of ``P x`` with the stored log2-sum-exp (MASKED as in :func:`_online_block`; DROPOUT:
        the mask of power ``step``)."""
        kn = start_n + offs_n
        kT = tl.load(k_base + kn[None, :].to(tl.int64) * stride_kn + offs_c[:, None].to(tl.int64) * stride_kc,
                     mask=(kn[None, :] < N) & c_ok[:, None], other=0.0)
        s = _dot(q, kT, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), UPCAST, IEEE) * qk_scale
        if MASKED:
            s = _bias(s, offs_m[:, None], kn[None, :], N, mask_base, stride_mi, stride_mj, shift[:, None], MASK_KIND)
        p = tl.math.exp2(s - lse[:, None])
        if MASKED:
            keep = _keep(offs_m[:, None], kn[None, :], N, pad_row, mask_base, stride_mi, stride_mj, CAUSAL, HAS_PAD, MASK_KIND)
            p = tl.where(keep, p, 0.0)
        if DROPOUT:
            p = p * _dropout_scale(seed, bh, step, offs_m, kn, N, drop_p, inv_keep, False)
        x = tl.load(x_base + kn[:, None] * C + offs_c[None, :],
                    mask=(kn[:, None] < N) & c_ok[None, :], other=0.0)
        return _dot(p.to(x.dtype), x, acc, UPCAST, IEEE)

    @triton.jit
    def _first_step(
        Q, K, V, PAD, C0, C1, OUT, Y, LSE, SEED, MASK,
        stride_qb, stride_qh, stride_qn, stride_qc,
        stride_kb, stride_kh, stride_kn, stride_kc,
        stride_vb, stride_vh, stride_vn, stride_vc,
        stride_ob, stride_oh, stride_on, stride_oc,
        stride_pb, stride_mb, stride_mh, stride_mi, stride_mj, stride_cf,
        H, N, C, qk_scale, drop_p, inv_keep,
        CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, MASK_KIND: tl.constexpr, STORE_Y: tl.constexpr,
        UPCAST: tl.constexpr, IEEE: tl.constexpr, DROPOUT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        """``y = P v`` by an online softmax; ``out = c0[h] v + c1[h] y``; stores log2-sum-exp per row."""
        start_m = tl.program_id(0) * BLOCK_M
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_c = tl.arange(0, BLOCK_C)
        c_ok = offs_c < C
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        k_base = K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
        v_base = V + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
        pad_row = PAD + b.to(tl.int64) * stride_pb
        mask_base = MASK + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
        seed = _seed(SEED, DROPOUT)
        row_ok = offs_m < N
        q = tl.load(q_base + offs_m[:, None].to(tl.int64) * stride_qn + offs_c[None, :].to(tl.int64) * stride_qc,
                    mask=row_ok[:, None] & c_ok[None, :], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
        hi = N
        if CAUSAL:
            hi = tl.minimum(N, start_m + BLOCK_M)
        shift = tl.zeros([BLOCK_M], dtype=tl.float32)
        if MASK_KIND == 2:  # the float mask's row maxima, for every later launch too
            shift = _bias_max(offs_m, N, hi, pad_row, mask_base, stride_mi, stride_mj, CAUSAL, HAS_PAD, BLOCK_N)
            tl.store(LSE + (tl.num_programs(1) + bh).to(tl.int64) * N + offs_m, shift, mask=row_ok)
        # key blocks below the diagonal and inside N need no mask (unless keys are padded)
        free = 0
        if not HAS_PAD and MASK_KIND == 0:
            free = _free_keys(start_m, N, CAUSAL, BLOCK_N)
        for start_n in range(0, free, BLOCK_N):
            acc, l_i, m_i = _online_block(
                acc, l_i, m_i, q, k_base, v_base, pad_row, mask_base, stride_mi, stride_mj, shift, start_n, offs_m, offs_n, offs_c, c_ok, N, qk_scale,
                stride_kn, stride_kc, stride_vn, stride_vc, seed, bh, drop_p, inv_keep,
                False, CAUSAL, HAS_PAD, MASK_KIND, UPCAST, IEEE, DROPOUT, BLOCK_M, BLOCK_N)
        for start_n in range(free, hi, BLOCK_N):
            acc, l_i, m_i = _online_block(
                acc, l_i, m_i, q, k_base, v_base, pad_row, mask_base, stride_mi, stride_mj, shift, start_n, offs_m, offs_n, offs_c, c_ok, N, qk_scale,
                stride_kn, stride_kc, stride_vn, stride_vc, seed, bh, drop_p, inv_keep,
                True, CAUSAL, HAS_PAD, MASK_KIND, UPCAST, IEEE, DROPOUT, BLOCK_M, BLOCK_N)
        has = l_i > 0.0
        y = acc / tl.where(has, l_i, 1.0)[:, None]  # a row with no admissible key is a zero row of P
        lse = tl.where(has, m_i + tl.math.log2(tl.where(has, l_i, 1.0)), float("inf"))
        tl.store(LSE + bh.to(tl.int64) * N + offs_m, lse, mask=row_ok)
        io_mask = row_ok[:, None] & c_ok[None, :]
        io_off = bh.to(tl.int64) * N * C + offs_m[:, None] * C + offs_c[None, :]
        if STORE_Y:
            tl.store(Y + io_off, y.to(Y.dtype.element_ty), mask=io_mask)
        c0 = tl.load(C0 + h * stride_cf).to(tl.float32)
        c1 = tl.load(C1 + h * stride_cf).to(tl.float32)
        v_rows = tl.load(v_base + offs_m[:, None].to(tl.int64) * stride_vn + offs_c[None, :].to(tl.int64) * stride_vc,
                         mask=io_mask, other=0.0).to(tl.float32)
        out_off = (b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
                   + offs_m[:, None].to(tl.int64) * stride_on + offs_c[None, :].to(tl.int64) * stride_oc)
        tl.store(OUT + out_off, (c0 * v_rows + c1 * y).to(OUT.dtype.element_ty), mask=io_mask)

    @triton.jit
    def _next_step(
        Q, K, X, PAD, CK, ACC, OUT, Y, LSE, SEED, MASK,
        stride_qb, stride_qh, stride_qn, stride_qc,
        stride_kb, stride_kh, stride_kn, stride_kc,
        stride_ob, stride_oh, stride_on, stride_oc,
        stride_pb, stride_mb, stride_mh, stride_mi, stride_mj, stride_cf,
        H, N, C, qk_scale, step, drop_p, inv_keep,
        CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, MASK_KIND: tl.constexpr, STORE_Y: tl.constexpr,
        UPCAST: tl.constexpr, IEEE: tl.constexpr, DROPOUT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        """``y = P x`` (power ``step``) with the stored log2-sum-exp; ``out = acc + c_k[h] y`` (X, ACC, Y contiguous,
        OUT strided)."""
        start_m = tl.program_id(0) * BLOCK_M
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_c = tl.arange(0, BLOCK_C)
        c_ok = offs_c < C
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        k_base = K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
        x_base = X + bh.to(tl.int64) * N * C
        pad_row = PAD + b.to(tl.int64) * stride_pb
        mask_base = MASK + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
        seed = _seed(SEED, DROPOUT)
        row_ok = offs_m < N
        q = tl.load(q_base + offs_m[:, None].to(tl.int64) * stride_qn + offs_c[None, :].to(tl.int64) * stride_qc,
                    mask=row_ok[:, None] & c_ok[None, :], other=0.0)
        lse = tl.load(LSE + bh.to(tl.int64) * N + offs_m, mask=row_ok, other=float("inf"))
        shift = _row_shift(LSE + bh.to(tl.int64) * N, offs_m, N, MASK_KIND)
        acc = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
        hi = N
        if CAUSAL:
            hi = tl.minimum(N, start_m + BLOCK_M)
        free = 0
        if not HAS_PAD and MASK_KIND == 0:
            free = _free_keys(start_m, N, CAUSAL, BLOCK_N)
        for start_n in range(0, free, BLOCK_N):
            acc = _fixed_block(acc, q, k_base, x_base, pad_row, mask_base, stride_mi, stride_mj, lse, shift, start_n, offs_m, offs_n, offs_c, c_ok, N, C,
                               qk_scale, stride_kn, stride_kc, seed, bh, step, drop_p, inv_keep,
                               False, CAUSAL, HAS_PAD, MASK_KIND, UPCAST, IEEE, DROPOUT, BLOCK_M, BLOCK_N)
        for start_n in range(free, hi, BLOCK_N):
            acc = _fixed_block(acc, q, k_base, x_base, pad_row, mask_base, stride_mi, stride_mj, lse, shift, start_n, offs_m, offs_n, offs_c, c_ok, N, C,
                               qk_scale, stride_kn, stride_kc, seed, bh, step, drop_p, inv_keep,
                               True, CAUSAL, HAS_PAD, MASK_KIND, UPCAST, IEEE, DROPOUT, BLOCK_M, BLOCK_N)
        io_mask = row_ok[:, None] & c_ok[None, :]
        io_off = bh.to(tl.int64) * N * C + offs_m[:, None] * C + offs_c[None, :]
        if STORE_Y:
            tl.store(Y + io_off, acc.to(Y.dtype.element_ty), mask=io_mask)
        ck = tl.load(CK + h * stride_cf).to(tl.float32)
        prev = tl.load(ACC + io_off, mask=io_mask, other=0.0).to(tl.float32)
        out_off = (b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
                   + offs_m[:, None].to(tl.int64) * stride_on + offs_c[None, :].to(tl.int64) * stride_oc)
        tl.store(OUT + out_off, (prev + ck * acc).to(OUT.dtype.element_ty), mask=io_mask)

    @triton.jit
    def _query_ranges(start_n, N, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, MASK_KIND: tl.constexpr,
                      BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
        """For keys ``start_n ..``: query blocks ``[lo, mid)`` need the mask, ``[mid, N)`` do not.

        Queries past ``N`` need none (their log-sum-exp is ``+inf``, so ``P = 0``), nor do keys past
        ``N`` (their rows are never stored); only the causal and the padding masks remain.
        """
        lo = 0
        mid = 0
        if CAUSAL:
            lo = (start_n // BLOCK_M) * BLOCK_M
            # the first query block whose every query i >= every key j of this block
            mid = tl.minimum(((start_n + BLOCK_N - 1 + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, N)
        if HAS_PAD or MASK_KIND != 0:
            mid = N
        return lo, mid

    @triton.jit
    def _transposed_block(
        acc, k, q_base, a_base, lse_base, pad_row, mask_base, stride_mi, stride_mj, start_m, offs_m, offs_n, offs_c, c_ok, N, C, qk_scale,
        stride_qn, stride_qc, seed, bh, step, drop_p, inv_keep,
        MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, MASK_KIND: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
        DROPOUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        """``acc + P^T[key block, query block] a[query block]`` (DROPOUT: ``P`` of power ``step``, dropped)."""
        qm = start_m + offs_m
        qT = tl.load(q_base + qm[None, :].to(tl.int64) * stride_qn + offs_c[:, None].to(tl.int64) * stride_qc,
                     mask=(qm[None, :] < N) & c_ok[:, None], other=0.0)
        lse = tl.load(lse_base + qm, mask=qm < N, other=float("inf"))
        shift = _row_shift(lse_base, qm, N, MASK_KIND)
        sT = _dot(k, qT, tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), UPCAST, IEEE) * qk_scale
        if MASKED:
            sT = _bias(sT, qm[None, :], offs_n[:, None], N, mask_base, stride_mi, stride_mj, shift[None, :], MASK_KIND)
        pT = tl.math.exp2(sT - lse[None, :])
        if MASKED:
            keep = _keep(qm[None, :], offs_n[:, None], N, pad_row, mask_base, stride_mi, stride_mj, CAUSAL, HAS_PAD, MASK_KIND)
            pT = tl.where(keep, pT, 0.0)
        if DROPOUT:
            pT = pT * _dropout_scale(seed, bh, step, qm, offs_n, N, drop_p, inv_keep, True)
        a = tl.load(a_base + qm[:, None] * C + offs_c[None, :], mask=(qm[:, None] < N) & c_ok[None, :], other=0.0)
        return _dot(pT.to(a.dtype), a, acc, UPCAST, IEEE)

    @triton.jit
    def _acc_dp(dp, lost, term, IEEE: tl.constexpr):
        """``dp + term`` and, with IEEE (float32 inputs), the rounding error carried in ``lost`` (Kahan summation:
        the sum is ``dp - lost``).

        ``dS = P * (dP - delta)`` cancels: with a long series (``ppr(alpha=0.01, steps=200)`` on a causal graph)
        ``dP`` and ``delta`` are hundreds of times ``dS``, and their ``K`` float32 roundings (of ``dP`` here, of
        ``delta`` across the transposed launches), which do not match, moved ``dq`` and ``dk`` by 1e-4 (30-270x the
        ``matrix`` back-end's error); even rounding each once left 10x. So ``dP`` is carried as ``dp - lost`` and
        ``delta`` in float64 (its terms too), split into two float32 parts (:func:`_split`) for ``dP - delta``.
        Half inputs store ``a`` and ``y`` in their dtype, whose error dominates: plain sums there (and ``delta``
        takes ``a`` as stored, as ``dP`` reads it: :func:`_transposed_step`).
        """
        if IEEE:
            t = term - lost
            total = dp + t
            lost = (total - dp) - t
            return total, lost
        else:
            return dp + term, lost

    @triton.jit
    def _split(delta):
        """float64 ``delta`` as float32 ``(hi, lo)``, ``hi + lo = delta`` to about 2^-48 (see :func:`_acc_dp`)."""
        hi = delta.to(tl.float32)
        return hi, (delta - hi.to(tl.float64)).to(tl.float32)

    @triton.jit
    def _dkdv_block(
        dk, dv, k, v, q_base, A, YS, lse_base, delta_base, io_base, pad_row, mask_base, stride_mi, stride_mj, start_m, offs_m, offs_n, offs_c, c_ok,
        kv_mask, N, C, STEPS, stride_step, qk_scale, stride_qn, stride_qc, seed, bh, drop_p, inv_keep,
        MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, MASK_KIND: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
        DROPOUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        """One query block of :func:`_bwd_dkdv`.

        With DROPOUT, power ``t`` used its own mask ``D_t``: ``dv`` takes ``(P * D_1)^T`` and the term
        ``a_t y_{t-1}^T`` of ``dP`` is masked by ``D_t`` (``dP = sum_t D_t * a_t y_{t-1}^T``); ``delta`` needs
        no change (it is formed from the dropped powers ``y_t``).
        """
        qm = start_m + offs_m
        qm_ok = qm < N
        q = tl.load(q_base + qm[:, None].to(tl.int64) * stride_qn + offs_c[None, :].to(tl.int64) * stride_qc,
                    mask=qm_ok[:, None] & c_ok[None, :], other=0.0)
        lse = tl.load(lse_base + qm, mask=qm_ok, other=float("inf"))
        shift = _row_shift(lse_base, qm, N, MASK_KIND)
        delta, delta_lo = _split(tl.load(delta_base + qm, mask=qm_ok, other=0.0))
        sT = _dot(k, tl.trans(q), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), UPCAST, IEEE) * qk_scale
        if MASKED:
            sT = _bias(sT, qm[None, :], offs_n[:, None], N, mask_base, stride_mi, stride_mj, shift[None, :], MASK_KIND)
        pT = tl.math.exp2(sT - lse[None, :])
        if MASKED:
            keep = _keep(qm[None, :], offs_n[:, None], N, pad_row, mask_base, stride_mi, stride_mj, CAUSAL, HAS_PAD, MASK_KIND)
            pT = tl.where(keep, pT, 0.0)
        a_off = io_base + qm[None, :] * C + offs_c[:, None]
        a_mask = qm_ok[None, :] & c_ok[:, None]
        a1T = tl.load(A + a_off, mask=a_mask, other=0.0)  # a_1^T: (BLOCK_C, BLOCK_M)
        if DROPOUT:
            d1 = _dropout_scale(seed, bh, 1, qm, offs_n, N, drop_p, inv_keep, True)
            dv = _dot((pT * d1).to(a1T.dtype), tl.trans(a1T), dv, UPCAST, IEEE)
            dpT = d1 * _dot(v, a1T, tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), UPCAST, IEEE)
        else:
            dv = _dot(pT.to(a1T.dtype), tl.trans(a1T), dv, UPCAST, IEEE)
            dpT = _dot(v, a1T, tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), UPCAST, IEEE)
        lost = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for m in range(1, STEPS):
            y = tl.load(YS + tl.cast(m - 1, tl.int64) * stride_step + io_base + offs_n[:, None] * C + offs_c[None, :],
                        mask=kv_mask, other=0.0)
            aT = tl.load(A + tl.cast(m, tl.int64) * stride_step + a_off, mask=a_mask, other=0.0)
            if DROPOUT:  # each term of dP has its own mask: contracted apart, then masked
                term = _dot(y, aT, tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), UPCAST, IEEE)
                term *= _dropout_scale(seed, bh, m + 1, qm, offs_n, N, drop_p, inv_keep, True)
                dpT, lost = _acc_dp(dpT, lost, term, IEEE)
            elif IEEE:
                term = _dot(y, aT, tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), UPCAST, IEEE)
                dpT, lost = _acc_dp(dpT, lost, term, IEEE)
            else:
                dpT = _dot(y, aT, dpT, UPCAST, IEEE)
        dsT = pT * ((dpT - delta[None, :]) - (lost + delta_lo[None, :]))
        dk = _dot(dsT.to(q.dtype), q, dk, UPCAST, IEEE)
        return dk, dv

    @triton.jit
    def _dq_block(
        dq, q, a1, k_base, v_base, A, YS, io_base, a_off, io_mask, pad_row, mask_base, stride_mi, stride_mj, lse, shift,
        delta, delta_lo, start_n,
        offs_m, offs_n,
        offs_c, c_ok, N, C, STEPS, stride_step, qk_scale, stride_kn, stride_kc, stride_vn, stride_vc,
        seed, bh, drop_p, inv_keep,
        MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, MASK_KIND: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
        DROPOUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        """One key block of :func:`_bwd_dq` (DROPOUT: the term ``a_t y_{t-1}^T`` of ``dP`` masked by ``D_t``)."""
        kn = start_n + offs_n
        kT_mask = (kn[None, :] < N) & c_ok[:, None]
        kT = tl.load(k_base + kn[None, :].to(tl.int64) * stride_kn + offs_c[:, None].to(tl.int64) * stride_kc, mask=kT_mask, other=0.0)
        s = _dot(q, kT, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), UPCAST, IEEE) * qk_scale
        if MASKED:
            s = _bias(s, offs_m[:, None], kn[None, :], N, mask_base, stride_mi, stride_mj, shift[:, None], MASK_KIND)
        p = tl.math.exp2(s - lse[:, None])
        if MASKED:
            keep = _keep(offs_m[:, None], kn[None, :], N, pad_row, mask_base, stride_mi, stride_mj, CAUSAL, HAS_PAD, MASK_KIND)
            p = tl.where(keep, p, 0.0)
        vT = tl.load(v_base + kn[None, :].to(tl.int64) * stride_vn + offs_c[:, None].to(tl.int64) * stride_vc, mask=kT_mask, other=0.0)
        dp = _dot(a1, vT, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), UPCAST, IEEE)
        if DROPOUT:
            dp = dp * _dropout_scale(seed, bh, 1, offs_m, kn, N, drop_p, inv_keep, False)
        lost = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for m in range(1, STEPS):
            yT = tl.load(YS + tl.cast(m - 1, tl.int64) * stride_step + io_base + kn[None, :] * C + offs_c[:, None],
                         mask=kT_mask, other=0.0)
            a = tl.load(A + tl.cast(m, tl.int64) * stride_step + a_off, mask=io_mask, other=0.0)
            if DROPOUT:  # each term of dP has its own mask: contracted apart, then masked
                term = _dot(a, yT, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), UPCAST, IEEE)
                term *= _dropout_scale(seed, bh, m + 1, offs_m, kn, N, drop_p, inv_keep, False)
                dp, lost = _acc_dp(dp, lost, term, IEEE)
            elif IEEE:
                term = _dot(a, yT, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), UPCAST, IEEE)
                dp, lost = _acc_dp(dp, lost, term, IEEE)
            else:
                dp = _dot(a, yT, dp, UPCAST, IEEE)
        ds = p * ((dp - delta[:, None]) - (lost + delta_lo[:, None]))
        return _dot(ds.to(kT.dtype), tl.trans(kT), dq, UPCAST, IEEE)

    @triton.jit
    def _transposed_step(
        Q, K, G, A_IN, A_OUT, Y, PAD, CK, LSE, DELTA, DCROW, SEED, MASK,
        stride_qb, stride_qh, stride_qn, stride_qc,
        stride_kb, stride_kh, stride_kn, stride_kc,
        stride_gb, stride_gh, stride_gn, stride_gc,
        stride_pb, stride_mb, stride_mh, stride_mi, stride_mj, stride_cf,
        H, N, C, qk_scale, step, drop_p, inv_keep,
        CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, MASK_KIND: tl.constexpr, HAS_IN: tl.constexpr,
        UPCAST: tl.constexpr, IEEE: tl.constexpr, DROPOUT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        """One step ``m`` of the adjoint recursion: ``a_m = c_m[h] g + P^T a_{m+1}`` (no ``P^T`` term without HAS_IN;
        with DROPOUT, ``P`` carries the mask of power ``step = m + 1``).

        Also per row ``j``: ``DELTA[j] (+)= <a_m, y_m>`` (float64; written fresh without HAS_IN, i.e. for
        ``m = K``, the first launch) and ``DCROW[j] = <g, y_m>`` (summed to ``dc[h, m]`` outside).
        A_IN, A_OUT, Y contiguous ``(B, H, N, C)``; G strided.
        """
        start_n = tl.program_id(0) * BLOCK_N
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_c = tl.arange(0, BLOCK_C)
        c_ok = offs_c < C
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        k_base = K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
        io_base = bh.to(tl.int64) * N * C
        pad_row = PAD + b.to(tl.int64) * stride_pb
        mask_base = MASK + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
        seed = _seed(SEED, DROPOUT)
        key_ok = offs_n < N
        k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kn + offs_c[None, :].to(tl.int64) * stride_kc,
                    mask=key_ok[:, None] & c_ok[None, :], other=0.0)
        acc = tl.zeros([BLOCK_N, BLOCK_C], dtype=tl.float32)
        if HAS_IN:
            lo, mid = _query_ranges(start_n, N, CAUSAL, HAS_PAD, MASK_KIND, BLOCK_M, BLOCK_N)
            lse_base = LSE + bh.to(tl.int64) * N
            for start_m in range(lo, mid, BLOCK_M):
                acc = _transposed_block(acc, k, q_base, A_IN + io_base, lse_base, pad_row, mask_base, stride_mi, stride_mj, start_m, offs_m, offs_n,
                                        offs_c, c_ok, N, C, qk_scale, stride_qn, stride_qc,
                                        seed, bh, step, drop_p, inv_keep,
                                        True, CAUSAL, HAS_PAD, MASK_KIND, UPCAST, IEEE, DROPOUT, BLOCK_M, BLOCK_N)
            for start_m in range(mid, N, BLOCK_M):
                acc = _transposed_block(acc, k, q_base, A_IN + io_base, lse_base, pad_row, mask_base, stride_mi, stride_mj, start_m, offs_m, offs_n,
                                        offs_c, c_ok, N, C, qk_scale, stride_qn, stride_qc,
                                        seed, bh, step, drop_p, inv_keep,
                                        False, CAUSAL, HAS_PAD, MASK_KIND, UPCAST, IEEE, DROPOUT, BLOCK_M, BLOCK_N)
        io_mask = key_ok[:, None] & c_ok[None, :]
        io_off = io_base + offs_n[:, None] * C + offs_c[None, :]
        ck = tl.load(CK + h * stride_cf).to(tl.float32)
        g_off = (b.to(tl.int64) * stride_gb + h.to(tl.int64) * stride_gh
                 + offs_n[:, None].to(tl.int64) * stride_gn + offs_c[None, :].to(tl.int64) * stride_gc)
        g = tl.load(G + g_off, mask=io_mask, other=0.0).to(tl.float32)
        # a_m as stored, i.e. as dP reads it: delta is formed from it too, else half inputs' rounding of a_m
        # (unmatched in delta, which dS = P * (dP - delta) cancels) dominated dq, dk (bf16: 10-20x sdpa's error)
        a_new = (ck * g + acc).to(A_OUT.dtype.element_ty)
        tl.store(A_OUT + io_off, a_new, mask=io_mask)
        y = tl.load(Y + io_off, mask=io_mask, other=0.0).to(tl.float32)
        row = bh.to(tl.int64) * N + offs_n
        delta = tl.sum(a_new.to(tl.float32).to(tl.float64) * y.to(tl.float64), 1)  # float64: see _acc_dp
        if HAS_IN:
            delta += tl.load(DELTA + row, mask=key_ok, other=0.0)
        tl.store(DELTA + row, delta, mask=key_ok)
        tl.store(DCROW + row, tl.sum(g * y, 1), mask=key_ok)

    @triton.jit
    def _bwd_dkdv(
        Q, K, V, G, A, YS, PAD, C0, LSE, DELTA, DK, DV, DCROW, SEED, MASK,
        stride_qb, stride_qh, stride_qn, stride_qc,
        stride_kb, stride_kh, stride_kn, stride_kc,
        stride_vb, stride_vh, stride_vn, stride_vc,
        stride_gb, stride_gh, stride_gn, stride_gc,
        stride_db, stride_dh, stride_dn, stride_dc,
        stride_pb, stride_mb, stride_mh, stride_mi, stride_mj, stride_cf, stride_step,
        H, N, C, STEPS, qk_scale, sm_scale, drop_p, inv_keep,
        CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, MASK_KIND: tl.constexpr,
        UPCAST: tl.constexpr, IEEE: tl.constexpr, DROPOUT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        """Per key block: ``dk = s * dS^T q`` with ``dP = sum_m a_{m+1} y_m^T``, and ``dv = c0 g + P^T a_1``.

        ``A[m]`` holds ``a_{m+1}`` and ``YS[m]`` holds ``y_{m+1}`` (``m = 0..STEPS-1``, stride
        ``stride_step``); ``y_0 = v``. Also ``DCROW[j] = <g_j, v_j>`` (for ``dc[h, 0]``). G, DK, DV strided.
        """
        start_n = tl.program_id(0) * BLOCK_N
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_c = tl.arange(0, BLOCK_C)
        c_ok = offs_c < C
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        k_base = K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
        v_base = V + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
        io_base = bh.to(tl.int64) * N * C
        pad_row = PAD + b.to(tl.int64) * stride_pb
        mask_base = MASK + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
        seed = _seed(SEED, DROPOUT)
        key_ok = offs_n < N
        kv_mask = key_ok[:, None] & c_ok[None, :]
        k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kn + offs_c[None, :].to(tl.int64) * stride_kc, mask=kv_mask, other=0.0)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vn + offs_c[None, :].to(tl.int64) * stride_vc, mask=kv_mask, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_C], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_C], dtype=tl.float32)
        lo, mid = _query_ranges(start_n, N, CAUSAL, HAS_PAD, MASK_KIND, BLOCK_M, BLOCK_N)
        lse_base = LSE + bh.to(tl.int64) * N
        delta_base = DELTA + bh.to(tl.int64) * N
        for start_m in range(lo, mid, BLOCK_M):
            dk, dv = _dkdv_block(dk, dv, k, v, q_base, A, YS, lse_base, delta_base, io_base, pad_row, mask_base, stride_mi, stride_mj, start_m, offs_m,
                                 offs_n, offs_c, c_ok, kv_mask, N, C, STEPS, stride_step, qk_scale, stride_qn, stride_qc,
                                 seed, bh, drop_p, inv_keep,
                                 True, CAUSAL, HAS_PAD, MASK_KIND, UPCAST, IEEE, DROPOUT, BLOCK_M, BLOCK_N)
        for start_m in range(mid, N, BLOCK_M):
            dk, dv = _dkdv_block(dk, dv, k, v, q_base, A, YS, lse_base, delta_base, io_base, pad_row, mask_base, stride_mi, stride_mj, start_m, offs_m,
                                 offs_n, offs_c, c_ok, kv_mask, N, C, STEPS, stride_step, qk_scale, stride_qn, stride_qc,
                                 seed, bh, drop_p, inv_keep,
                                 False, CAUSAL, HAS_PAD, MASK_KIND, UPCAST, IEEE, DROPOUT, BLOCK_M, BLOCK_N)
        c0 = tl.load(C0 + h * stride_cf).to(tl.float32)
        g_off = (b.to(tl.int64) * stride_gb + h.to(tl.int64) * stride_gh
                 + offs_n[:, None].to(tl.int64) * stride_gn + offs_c[None, :].to(tl.int64) * stride_gc)
        g = tl.load(G + g_off, mask=kv_mask, other=0.0).to(tl.float32)
        tl.store(DCROW + bh.to(tl.int64) * N + offs_n, tl.sum(g * v.to(tl.float32), 1), mask=key_ok)
        d_off = (b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dh
                 + offs_n[:, None].to(tl.int64) * stride_dn + offs_c[None, :].to(tl.int64) * stride_dc)
        tl.store(DK + d_off, (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + d_off, (c0 * g + dv).to(DV.dtype.element_ty), mask=kv_mask)

    @triton.jit
    def _bwd_dq(
        Q, K, V, A, YS, PAD, LSE, DELTA, DQ, SEED, MASK,
        stride_qb, stride_qh, stride_qn, stride_qc,
        stride_kb, stride_kh, stride_kn, stride_kc,
        stride_vb, stride_vh, stride_vn, stride_vc,
        stride_db, stride_dh, stride_dn, stride_dc,
        stride_pb, stride_mb, stride_mh, stride_mi, stride_mj, stride_step,
        H, N, C, STEPS, qk_scale, sm_scale, drop_p, inv_keep,
        CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, MASK_KIND: tl.constexpr,
        UPCAST: tl.constexpr, IEEE: tl.constexpr, DROPOUT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        """Per query block: ``dq = s * dS k`` with ``dS = P * (dP - delta)``, ``dP = sum_m a_{m+1} y_m^T``."""
        start_m = tl.program_id(0) * BLOCK_M
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_c = tl.arange(0, BLOCK_C)
        c_ok = offs_c < C
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        k_base = K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
        v_base = V + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
        io_base = bh.to(tl.int64) * N * C
        pad_row = PAD + b.to(tl.int64) * stride_pb
        mask_base = MASK + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
        seed = _seed(SEED, DROPOUT)
        row_ok = offs_m < N
        io_mask = row_ok[:, None] & c_ok[None, :]
        q = tl.load(q_base + offs_m[:, None].to(tl.int64) * stride_qn + offs_c[None, :].to(tl.int64) * stride_qc, mask=io_mask, other=0.0)
        lse = tl.load(LSE + bh.to(tl.int64) * N + offs_m, mask=row_ok, other=float("inf"))
        shift = _row_shift(LSE + bh.to(tl.int64) * N, offs_m, N, MASK_KIND)
        delta, delta_lo = _split(tl.load(DELTA + bh.to(tl.int64) * N + offs_m, mask=row_ok, other=0.0))
        a_off = io_base + offs_m[:, None] * C + offs_c[None, :]
        dq = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
        hi = N
        if CAUSAL:
            hi = tl.minimum(N, start_m + BLOCK_M)
        a1 = tl.load(A + a_off, mask=io_mask, other=0.0)
        free = 0
        if not HAS_PAD and MASK_KIND == 0:
            free = _free_keys(start_m, N, CAUSAL, BLOCK_N)
        for start_n in range(0, free, BLOCK_N):
            dq = _dq_block(dq, q, a1, k_base, v_base, A, YS, io_base, a_off, io_mask, pad_row, mask_base, stride_mi,
                           stride_mj, lse, shift, delta, delta_lo, start_n,
                           offs_m, offs_n, offs_c, c_ok, N, C, STEPS, stride_step, qk_scale, stride_kn, stride_kc,
                           stride_vn, stride_vc, seed, bh, drop_p, inv_keep,
                           False, CAUSAL, HAS_PAD, MASK_KIND, UPCAST, IEEE, DROPOUT, BLOCK_M, BLOCK_N)
        for start_n in range(free, hi, BLOCK_N):
            dq = _dq_block(dq, q, a1, k_base, v_base, A, YS, io_base, a_off, io_mask, pad_row, mask_base, stride_mi,
                           stride_mj, lse, shift, delta, delta_lo, start_n,
                           offs_m, offs_n, offs_c, c_ok, N, C, STEPS, stride_step, qk_scale, stride_kn, stride_kc,
                           stride_vn, stride_vc, seed, bh, drop_p, inv_keep,
                           True, CAUSAL, HAS_PAD, MASK_KIND, UPCAST, IEEE, DROPOUT, BLOCK_M, BLOCK_N)
        d_off = (b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dh
                 + offs_m[:, None].to(tl.int64) * stride_dn + offs_c[None, :].to(tl.int64) * stride_dc)
        tl.store(DQ + d_off, (dq * sm_scale).to(DQ.dtype.element_ty), mask=io_mask)
