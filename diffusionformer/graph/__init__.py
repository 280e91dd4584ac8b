"""Token graphs for attention: one :class:`~diffusionformer.graph.AttentionGraph` type, builders and conversions.

A layer attends over a graph of tokens: ``DiffusionAttention(...)(x, graph=g)``. Graphs come
in a dense layout (sequences with padding, causal and window flags, or an explicit allowed
mask) and a sparse layout (PyG ``edge_index``); the builders produce either, and
:meth:`AttentionGraph.to_sparse` / :meth:`AttentionGraph.to_dense` convert between them.
:func:`to_networkx` exports a layer's attention weights for inspection and drawing.
"""

from diffusionformer.graph.builders import GRID_METRICS, causal, complete, grid, sliding_window
from diffusionformer.graph.core import LAYOUTS, AttentionGraph
from diffusionformer.graph.export import draw_attention_graph, grid_layout, to_networkx
from diffusionformer.graph.interop import from_edge_index, from_networkx, from_pyg
from diffusionformer.graph.knn import KNN_METRICS, knn

__all__ = [
    "GRID_METRICS",
    "KNN_METRICS",
    "LAYOUTS",
    "AttentionGraph",
    "causal",
    "complete",
    "draw_attention_graph",
    "from_edge_index",
    "from_networkx",
    "from_pyg",
    "grid",
    "grid_layout",
    "knn",
    "sliding_window",
    "to_networkx",
]
