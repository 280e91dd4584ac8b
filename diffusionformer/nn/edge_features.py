r"""Edge features in the attention scores of a sparse :class:`~diffusionformer.nn.DiffusionAttention`.

As in PyG's :class:`~torch_geometric.nn.conv.TransformerConv` with ``edge_dim`` (Shi et al.,
"Masked Label Prediction", IJCAI 2021), an edge ``j -> i`` with features ``e_ij`` shifts the
key it is scored with:

.. math::
    s_{ij} = \frac{q_i^\top (k_j + W_e e_{ij})}{\sqrt C}, \qquad
    P_{ij} = \operatorname{softmax}_{j \to i}(s_{ij}), \qquad
    \mathrm{out} = \Big[\textstyle\sum_k c_{h,k} P_h^k V_h\Big]_h W_O,

so the edge features decide how much each neighbour counts in every power of ``P``.
(``TransformerConv`` also adds ``W_e e_ij`` to the message ``v_j``; a message that carries
its edge does not compose into ``P^k v``, so here edge features act through ``P`` only.)
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from diffusionformer.config import _check_flag
from diffusionformer.graph.core import _check_index_tensor
from diffusionformer.nn.attention import DiffusionAttention
from diffusionformer.operators.base import _label
from diffusionformer.ops import propagate_sparse, segment_softmax
from diffusionformer.ops._checks import _check_strided, check_coefficients, check_tensor
from diffusionformer.ops.engine import work_dtype
from diffusionformer.ops.sparse import check_edge_index

__all__ = ["edge_feature_attention"]


def _check_edge_operators(layer: DiffusionAttention, who: str) -> None:
    """Every operator of ``layer`` a polynomial in one ``P`` that runs on sparse graphs (else ``ValueError``)."""
    for op in layer.operators:
        if not op.supports_sparse:
            raise ValueError(f"{who}: operator {_label(op)} does not support the sparse back-end (it needs a dense P)")
        if op.uses_context or not op.is_polynomial:
            # the edge-aware P enters the polynomial loop; operators that build their own maps
            # (rivals: second map, layer state, re-attention, uniform map) are not served
            raise ValueError(f"{who}: operator {_label(op)} is not a polynomial in one P; "
                             "edge features need polynomial heads (attention, laplacian, heat, ppr, polynomial)")


def edge_feature_attention(
    layer: DiffusionAttention, x: Tensor, edge_index: Tensor, edge_keys: Tensor, *, return_weights: bool = False
) -> Tensor | tuple[Tensor, Tensor]:
    r"""The layer's sparse output with the edge terms ``W_e e_ij`` added to the keys of the scores.

    Args:
        layer: a non-causal :class:`~diffusionformer.nn.DiffusionAttention` whose operators are
            polynomials in ``P`` that run on sparse graphs.
        x: node features ``(N, D)``.
        edge_index: ``(2, E)`` edges ``(source j, target i)``, of any integer dtype (as the layer's
            ``edge_index=`` takes it).
        edge_keys: ``W_e e_ij`` per edge, ``(E, D)`` (split into heads like the keys), floating point;
            cast to the dtype the scores are computed in, as a float ``attn_mask`` is.
        return_weights: also return ``P`` per edge and head ``(E, H)``.

    As the layer's own sparse path, the scores, ``P`` and the sum over powers are computed in the
    working dtype (float32 for half-precision ``x``; see :func:`~diffusionformer.ops.engine.work_dtype`);
    the output and ``P`` are returned in the dtype of the layer's values.

    Shapes:
        ``(N, D)`` -> ``(N, D)`` (and ``(E, H)``).
    """
    if not isinstance(layer, DiffusionAttention):
        raise TypeError(f"layer must be a DiffusionAttention, got {type(layer).__name__}")
    _check_flag(return_weights, "return_weights")
    layer._check_plan()  # the operators may have been replaced since the layer's plan was made
    if layer.causal:
        raise ValueError("edge_feature_attention: expected a non-causal layer (graphs have no token order)")
    _check_edge_operators(layer, "edge_feature_attention")
    N, D = check_tensor("x", x, 2, "(N, D)").shape
    if D != layer.dim:
        raise ValueError(f"x must have last dimension dim={layer.dim}, got shape {tuple(x.shape)}")
    H, C = layer.num_heads, layer.head_dim
    # uint8/16/32/64 and int8/16 are integers too: the layer's own edge_index= (an AttentionGraph) takes them
    edge_index = check_edge_index(_check_index_tensor("edge_index", edge_index, "(2, E)"), N)
    E = edge_index.shape[1]
    if not isinstance(edge_keys, Tensor):
        raise TypeError(f"edge_keys must be a torch.Tensor of shape (E, D), got {type(edge_keys).__name__}")
    _check_strided("edge_keys", edge_keys, "pass edge_keys.to_dense()")  # else torch's bare reshape error
    if edge_keys.shape != (E, D):
        raise ValueError(f"edge_keys: expected shape (E, D) = ({E}, {D}), got {tuple(edge_keys.shape)}")
    if not edge_keys.is_floating_point():  # W_e e_ij: raw integer or bool edge attributes would be added as keys
        raise TypeError(f"edge_keys must be floating point (W_e e_ij, projected edge features), got {edge_keys.dtype}")
    for name, t in (("edge_index", edge_index), ("edge_keys", edge_keys)):
        if t.device != x.device:
            raise ValueError(f"{name} must be on the device of x ({x.device}), got {t.device}")
    q, k, v = layer._project(x)  # (N, H, C)
    # as the layer's sparse path (ops.sparse._diffuse_sparse): scores, P and the powers in the working dtype (float32
    # for half inputs), the result in the values' dtype; float64 edge keys made float64 weights on a float32 layer,
    # and in half precision the coefficients and every power were rounded
    dtype = v.dtype
    work = work_dtype(dtype)
    src, dst = edge_index[0], edge_index[1]
    # cast before the gathers, as the native sparse path: their backward (a scatter-sum over the edges) sums in the
    # working dtype too
    keys = k.to(work).index_select(0, src) + edge_keys.to(work).reshape(E, H, C)  # (E, H, C)
    scores = (q.to(work).index_select(0, dst) * keys).sum(-1) * layer._scale  # (E, H)
    P = segment_softmax(scores, dst, N)
    dropout_p = layer._call_dropout()  # the settable attribute checked as the layer's own calls do
    # (H, K+1) in the working dtype, validated as the layer's sparse path validates them (finite, on CPU)
    coeffs = check_coefficients(layer._coefficients(), H, v).to(work)
    cur = v.to(work)
    out = coeffs[None, :, 0, None] * cur
    for step in range(1, coeffs.shape[1]):
        W = F.dropout(P, p=dropout_p) if dropout_p > 0 else P
        cur = propagate_sparse(W, cur, edge_index, num_nodes=N)
        out = out + coeffs[None, :, step, None] * cur
    y = layer.out_proj(out.to(dtype).reshape(N, D))
    return (y, P.to(dtype)) if return_weights else y
