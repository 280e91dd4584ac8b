r"""A contextual stochastic block model (CSBM) with controlled homophily and feature signal.

After Deshpande et al., "Contextual Stochastic Block Models" (NeurIPS 2018), in the form used
to probe GNNs across homophily (e.g. Ma et al., "Is Homophily a Necessity for Graph Neural
Networks?", ICLR 2022). Our generator:

* **labels**: ``N`` nodes in ``C`` balanced classes (``y = arange(N) % C``, shuffled);
* **edges**: ``M = round(N d / 2)`` distinct undirected edges for average degree ``d``;
  :math:`M_{in} \sim \mathrm{Binomial}(M, h)` of them join two nodes of the same class and
  :math:`M - M_{in}` join different classes, so the expected edge homophily
  :math:`\frac{1}{M}\sum_{(i,j)} [y_i = y_j]` is ``h``. An intra-class edge picks a random
  node and a random other node of its class; an inter-class edge a random node and a random
  node of another class; duplicates are redrawn, no self-loops;
* **features**: :math:`x_i = \mu_{y_i} + \varepsilon_i`, :math:`\varepsilon_i \sim N(0, I_D)`,
  with class means :math:`\mu_c = \frac{\mu}{\sqrt 2} q_c` for random orthonormal
  :math:`q_1..q_C` in :math:`R^D`, so any two class means are exactly ``mu`` apart; with
  ``mu = 0`` the features are independent of the labels.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from diffusionformer._imports import _import_pyg
from diffusionformer.config import check_value

from .base import NodeData
from .registry import register_dataset
from .splits import generator as seeded_generator
from .splits import _require_generator, index_to_mask, random_split, require_heldout

__all__ = ["csbm_graph", "edge_homophily", "load_csbm"]


def _sample_unique_pairs(
    m: int, draw: Callable[[int], tuple[Tensor, Tensor]], N: int, g: torch.Generator
) -> Tensor:
    """Keys ``min * N + max`` of ``m`` distinct pairs, drawing with ``draw`` until enough."""
    keys = torch.empty(0, dtype=torch.long)
    while keys.numel() < m:
        need = m - keys.numel()
        u, v = draw(2 * need + 16)
        new = torch.minimum(u, v) * N + torch.maximum(u, v)
        keys = torch.unique(torch.cat([keys, new]))
    return keys[torch.randperm(keys.numel(), generator=g)[:m]]


def csbm_graph(
    num_nodes: int,
    num_classes: int,
    avg_degree: float,
    homophily: float,
    feature_dim: int,
    mu: float,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor]:
    """Sample one CSBM graph (see the module docstring for the model).

    Args:
        num_nodes: ``N`` >= ``2 * num_classes``.
        num_classes: ``C`` >= 2.
        avg_degree: expected node degree ``d = 2M / N``, in ``(0, N - 1]``.
        homophily: ``h`` in [0, 1], expected fraction of intra-class edges.
        feature_dim: ``D`` >= ``C``.
        mu: distance between any two class means (>= 0).
        generator: source of randomness.

    Shapes:
        - x: ``(N, D)`` float32
        - edge_index: ``(2, 2M)`` int64, both directions of each edge, sorted by
          ``(source, target)``, no duplicates, no self-loops
        - y: ``(N,)`` int64

    Examples:
        >>> x, ei, y = csbm_graph(12, 2, 3.0, 1.0, 4, 1.0, torch.Generator().manual_seed(0))
        >>> x.shape, ei.shape, bool((y[ei[0]] == y[ei[1]]).all())
        (torch.Size([12, 4]), torch.Size([2, 36]), True)
    """
    N, C, D = (check_value(v, int, name) for v, name in
               ((num_nodes, "num_nodes"), (num_classes, "num_classes"), (feature_dim, "feature_dim")))
    avg_degree, homophily, mu = (check_value(v, float, name) for v, name in
                                 ((avg_degree, "avg_degree"), (homophily, "homophily"), (mu, "mu")))
    for name, value in (("avg_degree", avg_degree), ("mu", mu)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}")
    if C < 2:
        raise ValueError(f"num_classes must be >= 2, got {C}")
    if N < 2 * C:
        raise ValueError(f"num_nodes must be >= 2 * num_classes = {2 * C}, got {N}")
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must be in [0, 1], got {homophily}")
    if D < C:
        raise ValueError(f"feature_dim must be >= num_classes = {C}, got {D}")
    if mu < 0:
        raise ValueError(f"mu must be >= 0, got {mu}")
    if avg_degree <= 0:
        raise ValueError(f"avg_degree must be > 0, got {avg_degree}")
    _require_generator(generator, "csbm_graph")
    g = generator

    y = (torch.arange(N) % C)[torch.randperm(N, generator=g)]
    order = torch.argsort(y, stable=True)  # nodes grouped by class
    pos = torch.empty(N, dtype=torch.long)
    pos[order] = torch.arange(N)
    counts = torch.bincount(y, minlength=C)
    offsets = torch.cumsum(counts, 0) - counts

    half_degree_sum = N * avg_degree / 2  # inf for an avg_degree near float's top (round(inf): an OverflowError)
    M = round(half_degree_sum) if math.isfinite(half_degree_sum) else math.inf
    if M > N * (N - 1) // 2:  # before the binomial draw, which returns NaN for a count beyond float range
        raise ValueError(
            f"avg_degree={avg_degree} asks for more distinct edges than the {N * (N - 1) // 2} pairs of {N} "
            f"nodes; avg_degree must be at most num_nodes - 1 = {N - 1}"
        )
    intra_pool = int((counts * (counts - 1) // 2).sum())
    inter_pool = N * (N - 1) // 2 - intra_pool
    # float32 counts are exact only up to 2**24 (M = 2**24 + 1 at homophily 1 drew an inter-class edge); float64
    # beyond, float32 below (the draws of earlier versions)
    dtype = torch.float32 if M <= 2**24 else torch.float64
    m_in = int(torch.binomial(torch.tensor(float(M), dtype=dtype), torch.tensor(homophily, dtype=dtype), generator=g))
    m_out = M - m_in
    if m_in > intra_pool or m_out > inter_pool:
        raise ValueError(
            f"avg_degree={avg_degree} needs {m_in} intra-class and {m_out} inter-class edges, "
            f"but only {intra_pool} and {inter_pool} distinct pairs exist; lower avg_degree"
        )

    # the other end of an edge: a float32 uniform has 2**24 values, so past a class of ~2**16 nodes some positions
    # were drawn measurably more often (6 values against 5 at 3 * 2**20 + 1 nodes), and past 2**24 the product could
    # round up into the next class; float64 there, float32 below (the draws of earlier versions)
    rdtype = torch.float32 if N <= 2**16 else torch.float64

    def draw_intra(k: int) -> tuple[Tensor, Tensor]:
        u = torch.randint(0, N, (k,), generator=g)
        c = y[u]
        r = (torch.rand(k, generator=g, dtype=rdtype) * (counts[c] - 1)).long()
        r = r + (r >= pos[u] - offsets[c]).long()  # skip u itself
        return u, order[offsets[c] + r]

    def draw_inter(k: int) -> tuple[Tensor, Tensor]:
        u = torch.randint(0, N, (k,), generator=g)
        c = y[u]
        r = (torch.rand(k, generator=g, dtype=rdtype) * (N - counts[c])).long()
        r = r + (r >= offsets[c]).long() * counts[c]  # skip u's class block
        return u, order[r]

    keys = torch.cat(
        [
            _sample_unique_pairs(m_in, draw_intra, N, g),
            _sample_unique_pairs(m_out, draw_inter, N, g),
        ]
    )
    a, b = keys // N, keys % N
    directed = torch.sort(torch.cat([a * N + b, b * N + a])).values
    edge_index = torch.stack([directed // N, directed % N])  # (2, 2M)

    q, _ = torch.linalg.qr(torch.randn(D, C, generator=g, dtype=torch.float64))  # (D, C)
    means = (mu / math.sqrt(2.0)) * q.T  # (C, D), pairwise distance mu
    x = (means[y] + torch.randn(N, D, generator=g, dtype=torch.float64)).to(torch.float32)
    if not bool(torch.isfinite(x).all()):  # a finite mu beyond float32's range gave inf features without a word
        raise ValueError(f"mu={mu} puts the features beyond float32's range (about 3.4e38); use a smaller mu")
    return x, edge_index, y


def edge_homophily(edge_index: Tensor, y: Tensor) -> float:
    r"""Edge homophily :math:`\frac{1}{|E|} \sum_{(j, i) \in E} [y_i = y_j]`.

    Examples:
        >>> edge_homophily(torch.tensor([[0, 1, 1], [1, 0, 2]]), torch.tensor([0, 0, 1]))
        0.6666666666666666
    """
    _check_edges_and_labels(edge_index, y)
    if edge_index.numel() == 0:
        raise ValueError("edge_homophily is undefined for a graph without edges")
    src, dst = edge_index.long()  # uint8 ids would index y as a boolean mask (a wrong ratio, or a shape error)
    return float((y[src] == y[dst]).double().mean())


def _check_edges_and_labels(edge_index: object, y: object) -> None:
    """``edge_index`` an integer ``(2, E)`` tensor of node ids in ``[0, len(y))``, ``y`` a 1-D tensor of labels (a
    ``(1, E)`` edge_index read its one row as both ends, a negative id wrapped around, a 2-D ``y`` compared rows)."""
    if not isinstance(edge_index, Tensor) or not isinstance(y, Tensor):
        name, value = ("edge_index", edge_index) if not isinstance(edge_index, Tensor) else ("y", y)
        raise TypeError(f"edge_homophily: {name} must be a tensor, got {type(value).__name__}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_homophily: edge_index must have shape (2, E), got {tuple(edge_index.shape)}")
    if edge_index.is_floating_point() or edge_index.is_complex() or edge_index.dtype == torch.bool:
        raise TypeError(f"edge_homophily: edge_index must hold integer node ids, got dtype {edge_index.dtype}")
    if y.dim() != 1:
        raise ValueError(f"edge_homophily: y must be 1-D (one label per node), got shape {tuple(y.shape)}")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= y.shape[0]):
        raise ValueError(f"edge_homophily: edge_index values must lie in [0, {y.shape[0]}) (the nodes of y), got "
                         f"range [{int(edge_index.min())}, {int(edge_index.max())}]")


@register_dataset("csbm", kind="node")
def load_csbm(
    *,
    seed: int = 0,
    num_nodes: int = 1000,
    num_classes: int = 2,
    avg_degree: float = 10.0,
    homophily: float = 0.5,
    feature_dim: int = 16,
    mu: float = 1.0,
    val_fraction: float = 0.2,
    test_fraction: float = 0.2,
) -> NodeData:
    """A seeded CSBM node-classification graph with a seeded random 60/20/20 node split.

    Args:
        seed: seed of the graph, the features and the split.
        num_nodes, num_classes, avg_degree, homophily, feature_dim, mu: see :func:`csbm_graph`.
        val_fraction, test_fraction: shares of the nodes in the val and test masks.
    """
    _import_pyg()
    from torch_geometric.data import Data

    g = seeded_generator(seed)
    x, edge_index, y = csbm_graph(num_nodes, num_classes, avg_degree, homophily, feature_dim, mu, g)
    train_idx, val_idx, test_idx = random_split(num_nodes, val_fraction, test_fraction, seed)
    require_heldout("csbm", (train_idx, val_idx, test_idx), val_fraction, test_fraction)
    data = Data(
        x=x,
        edge_index=edge_index,
        y=y,
        train_mask=index_to_mask(train_idx, num_nodes),
        val_mask=index_to_mask(val_idx, num_nodes),
        test_mask=index_to_mask(test_idx, num_nodes),
    )
    return NodeData(
        name="csbm",
        data=data,
        num_classes=num_classes,
        num_features=feature_dim,
        meta={
            "source": "generated contextual stochastic block model",
            "licence": "synthetic",
            "options": dict(
                num_nodes=num_nodes,
                num_classes=num_classes,
                avg_degree=avg_degree,
                homophily=homophily,
                feature_dim=feature_dim,
                mu=mu,
                seed=seed,
            ),
            "measured_edge_homophily": (
                edge_homophily(edge_index, y) if edge_index.numel() else None
            ),
            "split": f"seeded random, val={val_fraction}, test={test_fraction}",
            "sizes": {"train": len(train_idx), "val": len(val_idx), "test": len(test_idx)},
        },
    )
