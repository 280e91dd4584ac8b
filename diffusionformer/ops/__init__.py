"""Pure tensor kernels of diffusionformer (made public as :mod:`diffusionformer.functional`).

Glossary used throughout the package:

* ``B`` batch size, ``N`` nodes (tokens) per sequence or graph, ``D = H * C`` model width,
* ``H`` heads, ``C`` head dimension, ``K`` the highest power of ``P`` an operator uses,
* ``E`` edges of a sparse graph (``edge_index[0]`` = source ``j``, ``edge_index[1]`` = target ``i``),
* ``t`` diffusion time, ``P`` the row-stochastic attention matrix ``softmax(q k^T * scale + mask)``.
"""

from diffusionformer.ops.scatter import scatter_max, scatter_sum, segment_softmax
from diffusionformer.ops.dense import (
    DENSE_BACKENDS,
    attention_matrix,
    choose_dense_backend,
    diffuse,
    diffuse_with_weights,
    propagate_dense,
)
from diffusionformer.ops.sparse import (
    diffuse_sparse,
    diffuse_sparse_with_weights,
    edge_attention,
    propagate_sparse,
)
from diffusionformer.ops.reference import (
    dense_attention_reference,
    heat_kernel_reference,
    polynomial_reference,
)

__all__ = [
    "DENSE_BACKENDS",
    "attention_matrix",
    "choose_dense_backend",
    "dense_attention_reference",
    "diffuse",
    "diffuse_sparse",
    "diffuse_sparse_with_weights",
    "diffuse_with_weights",
    "edge_attention",
    "heat_kernel_reference",
    "polynomial_reference",
    "propagate_dense",
    "propagate_sparse",
    "scatter_max",
    "scatter_sum",
    "segment_softmax",
]
