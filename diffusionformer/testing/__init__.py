"""Public test helpers: tiny graphs, the operator property harness, simulated kills and CPU memory."""

from diffusionformer.testing.faults import assert_same_checkpoint_weights, interrupt_on_call
from diffusionformer.testing.graphs import (causal_edge_index, complete_edge_index, dense_allowed_from_edges, random_qkv,
                                            reference_qkv)
from diffusionformer.testing.harness import apply_operator_dense, apply_operator_sparse, assert_operator
from diffusionformer.testing.memory import cpu_allocations

__all__ = [
    "apply_operator_dense",
    "apply_operator_sparse",
    "assert_same_checkpoint_weights",
    "assert_operator",
    "causal_edge_index",
    "complete_edge_index",
    "cpu_allocations",
    "dense_allowed_from_edges",
    "interrupt_on_call",
    "random_qkv",
    "reference_qkv",
]
