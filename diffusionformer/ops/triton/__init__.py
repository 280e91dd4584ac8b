"""Triton (GPU) kernels of the dense engine; optional: the library imports and works without triton.

* :func:`affine_attention`: heads ``c0 I + c1 P`` (attention, Laplacian, learned affine) in one
  flash-attention launch whose epilogue forms ``c0 v + c1 P v``;
* :func:`polynomial_attention`: ``sum_k c_k P^k v`` for all K-step heads of a layer, one launch
  per power of ``P``, coefficients accumulated in the kernel, ``P`` never materialised;
* :func:`dropout_scales`: the dropout masks on ``P`` the kernels draw for a seed, written out
  (tests and debugging).

Both are differentiable (``q``, ``k``, ``v`` and the coefficients) and run on CUDA tensors, or on
CPU tensors under the Triton interpreter (``TRITON_INTERPRET=1`` set before triton is first
imported; slow, for tests). triton itself is imported only when a kernel is first called or
:func:`is_available` is asked.
"""

from diffusionformer.ops.triton.attention import affine_attention, dropout_scales, is_available, polynomial_attention

__all__ = ["affine_attention", "dropout_scales", "is_available", "polynomial_attention"]
