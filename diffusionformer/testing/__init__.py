"""Public test helpers: tiny graphs and the operator property harness."""

from diffusionformer.testing.graphs import causal_edge_index, complete_edge_index, dense_allowed_from_edges, random_qkv
from diffusionformer.testing.harness import apply_operator_dense, apply_operator_sparse, assert_operator

__all__ = [
    "apply_operator_dense",
    "apply_operator_sparse",
    "assert_operator",
    "causal_edge_index",
    "complete_edge_index",
    "dense_allowed_from_edges",
    "random_qkv",
]
