"""A :class:`~diffusionformer.DiffusionAttention` run through the Triton kernels (benchmark column).

Until the engine offers the Triton back-end, this wrapper gives the benchmarks its cost: the
layer's own projections and operators, and per run of heads of equal degree one call of
:func:`diffusionformer.ops.triton.polynomial_attention` (degree 1, i.e. attention, Laplacian
and learned ``c0 I + c1 P`` heads, is the one-launch affine kernel). Dense inputs with the
layer's causal flag only (no padding mask, no dropout).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from diffusionformer import DiffusionAttention
from diffusionformer.models import DiffusionGPT


class TritonAttention(nn.Module):
    """``layer``'s math with the Triton kernels; ``layer`` keeps the parameters."""

    def __init__(self, layer: DiffusionAttention) -> None:
        super().__init__()
        from diffusionformer.ops.triton import polynomial_attention

        self._kernel = polynomial_attention
        self.layer = layer
        runs: list[list[int]] = []  # [start, stop, degree]
        for (start, count), op, poly in zip(layer._groups, layer.operators, layer._polynomial):
            if not poly:
                raise ValueError(f"operator {op.name!r} is not a polynomial in P; the Triton kernels cannot run it")
            degree = max(op.degree, 1)
            if runs and runs[-1][2] == degree and runs[-1][1] == start:
                runs[-1][1] = start + count
            else:
                runs.append([start, start + count, degree])
        self.runs = [tuple(r) for r in runs]

    def forward(self, x: Tensor, **kwargs: object) -> Tensor:
        if kwargs:
            raise ValueError(f"TritonAttention takes dense (B, N, D) inputs only, got {sorted(kwargs)}")
        L = self.layer
        B, N, D = x.shape
        q, k, v = L._project(x)  # (B, N, H, C)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, N, C) views
        coeffs = L._coefficients()  # (H, K_max + 1)
        outs = [self._kernel(q[:, s:e], k[:, s:e], v[:, s:e], coeffs[s:e, : d + 1], is_causal=L.causal)
                for s, e, d in self.runs]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # (B, H, N, C)
        return L.out_proj(y.transpose(1, 2).reshape(B, N, D))


def tritonise_gpt(model: DiffusionGPT) -> DiffusionGPT:
    """Swap every block's attention for :class:`TritonAttention` (in place; parameters shared)."""
    for block in model.blocks:
        block.attn = TritonAttention(block.attn)
    return model
