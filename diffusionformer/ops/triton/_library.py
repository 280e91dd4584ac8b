"""The Triton kernels as PyTorch custom operators, so ``torch.compile(fullgraph=True)`` captures them.

``diffusionformer::triton_polynomial_fwd`` (the ``K`` forward launches) and
``diffusionformer::triton_polynomial_bwd`` (the reverse recursion) are opaque to the compiler
(:func:`torch.library.custom_op`, present in torch >= 2.4): a compiled graph calls them as one
node each, with shapes and strides from their fake implementations, and
:func:`torch.library.register_autograd` ties the backward operator to the forward one. The
kernels themselves (and triton) are imported only when an operator runs.

No ``from __future__ import annotations`` here: the schemas are inferred from the annotations.
"""

from typing import Optional

import torch
from torch import Tensor

__all__ = ["polynomial"]


def _kernels():
    from diffusionformer.ops.triton._launch import _kernels_module

    return _kernels_module()


def _slots(K: int, save: bool) -> int:
    return K if save else min(K, 2)


@torch.library.custom_op("diffusionformer::triton_polynomial_fwd", mutates_args=())
def _fwd(q: Tensor, k: Tensor, v: Tensor, coeffs: Tensor, pad: Optional[Tensor], is_causal: bool, scale: float,
         save: bool, dropout_p: float, seed: Optional[Tensor], mask: Optional[Tensor]
         ) -> tuple[Tensor, Tensor, Tensor]:
    from diffusionformer.ops.triton._launch import _Launch, _forward

    kernels = _kernels()
    L = _Launch(kernels, q, is_causal, pad, scale, dropout_p, seed, mask)
    return _forward(kernels, L, q, k, v, coeffs, save)


@_fwd.register_fake
def _fwd_fake(q, k, v, coeffs, pad, is_causal, scale, save, dropout_p, seed, mask):
    B, H, N, C = q.shape
    K = coeffs.shape[1] - 1
    out = q.new_empty_strided((B, H, N, C), (N * H * C, C, H * C, 1))
    lse = q.new_empty(2, B, H, N, dtype=torch.float32)
    ys = q.new_empty(_slots(K, save), B, H, N, C)
    return out, lse, ys


@torch.library.custom_op("diffusionformer::triton_polynomial_bwd", mutates_args=())
def _bwd(q: Tensor, k: Tensor, v: Tensor, coeffs: Tensor, pad: Optional[Tensor], lse: Tensor, ys: Tensor, g: Tensor,
         is_causal: bool, scale: float, dropout_p: float, seed: Optional[Tensor], mask: Optional[Tensor]
         ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from diffusionformer.ops.triton._launch import _Launch, _backward

    kernels = _kernels()
    L = _Launch(kernels, q, is_causal, pad, scale, dropout_p, seed, mask)
    return _backward(kernels, L, q, k, v, coeffs, lse, ys, g)


@_bwd.register_fake
def _bwd_fake(q, k, v, coeffs, pad, lse, ys, g, is_causal, scale, dropout_p, seed, mask):
    B, H, N, C = q.shape
    grads = [q.new_empty(B, N, H, C).transpose(1, 2) for _ in range(3)]
    return grads[0], grads[1], grads[2], coeffs.new_empty(coeffs.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, coeffs, pad, is_causal, scale, save, dropout_p, seed, mask = inputs
    _, lse, ys = output
    if save:
        ctx.save_for_backward(q, k, v, coeffs, pad, lse, ys, seed, mask)
    ctx.is_causal, ctx.scale, ctx.save, ctx.dropout_p = is_causal, scale, save, dropout_p


def _backward_rule(ctx, grad_out, grad_lse, grad_ys):
    if not ctx.save:
        raise RuntimeError("triton_polynomial_fwd ran without saving its powers (no input required grad)")
    q, k, v, coeffs, pad, lse, ys, seed, mask = ctx.saved_tensors
    dq, dk, dv, dc = _bwd(q, k, v, coeffs, pad, lse, ys, grad_out, ctx.is_causal, ctx.scale, ctx.dropout_p, seed, mask)
    need = ctx.needs_input_grad
    return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
            dc if need[3] else None, None, None, None, None, None, None, None)


_fwd.register_autograd(_backward_rule, setup_context=_setup_context)


def new_seed(device: torch.device) -> Tensor:
    """A fresh dropout seed: a ``(1,)`` int64 tensor drawn from PyTorch's generator of ``device``.

    Drawn on the device (no host synchronisation; ``torch.manual_seed`` makes calls reproducible).
    """
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)


def polynomial(q: Tensor, k: Tensor, v: Tensor, coeffs: Tensor, pad: Optional[Tensor], is_causal: bool,
               scale: float, dropout_p: float = 0.0, seed: Optional[Tensor] = None,
               mask: Optional[Tensor] = None) -> Tensor:
    """``sum_k c_k P^k v`` on validated inputs (``coeffs`` float32 contiguous ``(H, K+1)``).

    With ``dropout_p > 0`` every power of ``P`` is dropped with its own mask (as on the PyTorch
    back-ends), drawn from ``seed`` (default a fresh :func:`new_seed`), which the backward pass
    reuses to regenerate the masks. ``mask``: a validated 4-D ``attn_mask`` (bool, True = attend, or
    float added to the scores) broadcastable to ``(B, H, N, N)``, or ``None``.

    Eager calls take the :class:`torch.autograd.Function` (a custom operator costs tens of
    microseconds of Python dispatch per call, which matters next to a layer's few hundred);
    calls traced by ``torch.compile`` take the custom operators, which the graph can hold.
    """
    if dropout_p > 0.0 and seed is None:
        seed = new_seed(q.device)
    elif dropout_p == 0.0:
        seed = None
    if torch.compiler.is_compiling():
        save = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, coeffs))
        return _fwd(q, k, v, coeffs, pad, is_causal, scale, save, dropout_p, seed, mask)[0]
    from diffusionformer.ops.triton._launch import _PolynomialAttention

    return _PolynomialAttention.apply(q, k, v, coeffs, pad, is_causal, scale, dropout_p, seed, mask)
