r"""The positional-encoding transforms of :func:`~diffusionformer.models.positional_encoding_transform`.

Subclasses of PyG's transforms, so this module imports PyG at its top; ``graph_transformer`` imports it on first
use only, so that ``import diffusionformer.models`` does not import PyG (PyG 2.8 calls the deprecated
``torch.jit.script`` at import). ``graph_transformer._LaplacianPE`` / ``_RandomWalkPE`` still resolve here (objects
pickled under that path load).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from diffusionformer._imports import _import_pyg
from diffusionformer.graph._checks import _plain_ids
from diffusionformer.ops._checks import checks_values

_import_pyg()  # without its import-time DeprecationWarning (an error under `python -W error`)
from torch_geometric.transforms import AddLaplacianEigenvectorPE, AddRandomWalkPE  # noqa: E402
from torch_geometric.transforms.add_positional_encoding import add_node_attr  # noqa: E402
from torch_geometric.utils import is_undirected, scatter  # noqa: E402


def _check_pe_edge_weight(data: Any, kind: str) -> None:
    """``data.edge_weight`` (when set) a real ``(E,)`` tensor of finite, non-negative weights (read on CPU in eager
    mode): else a ``ValueError`` naming it. A NaN weight made the Laplacian PE call the graph directed, a negative
    one failed in LAPACK ("Eigenvalues did not converge"), and the random-walk PE returned NaN or negative
    "return probabilities" without a word."""
    w = data.edge_weight
    if w is None:
        return
    if not isinstance(w, Tensor):
        raise TypeError(f"positional_encoding_transform: edge_weight must be a Tensor of shape (E,), "
                        f"got {type(w).__name__}")
    E = data.edge_index.shape[1]
    if w.shape != (E,):
        raise ValueError(f"positional_encoding_transform: edge_weight must have shape (E,) = ({E},), "
                         f"got {tuple(w.shape)}")
    if w.is_complex():
        raise TypeError(f"positional_encoding_transform: edge_weight must hold real weights, got dtype {w.dtype}")
    if checks_values(w) and w.numel():
        if w.is_floating_point() and not bool(torch.isfinite(w).all()):
            raise ValueError(f"positional_encoding_transform: edge_weight holds NaN or inf values "
                             f"({int((~torch.isfinite(w)).sum())} of {E}); the {kind} PE is undefined for them")
        if bool((w < 0).any()):
            raise ValueError(f"positional_encoding_transform: edge_weight must be non-negative for the {kind} PE, "
                             f"got min {float(w.min())}")


class _LaplacianPE(AddLaplacianEigenvectorPE):
    """PyG's Laplacian eigenvector PE of one undirected graph, zero-padded to ``k`` columns when it has ``N <= k``
    nodes (PyG's own transform failed there with a broadcast error: a default ``pe_dim=8`` and a 4-node PROTEINS
    graph). A directed graph (``eigh`` read one triangle of its Laplacian: eigenvectors of no matrix of the
    graph) and a ``Batch`` of several graphs (eigenvectors of the union, mixing the graphs) are refused. A graph of
    several components of up to ``_DENSE_MAX_NODES`` nodes goes to the dense solver at every size: PyG's ARPACK, from
    100 nodes on, missed eigenvectors of the eigenvalue 0 that each component has."""

    def forward(self, data: Any) -> Any:
        _import_pyg()
        from torch_geometric.data import Batch, Data

        N = data.num_nodes
        _check_pe_edge_weight(data, "Laplacian")
        if isinstance(data, Batch) and data.num_graphs > 1:
            raise ValueError(f"positional_encoding_transform: the Laplacian PE is per graph, got a Batch of "
                             f"{data.num_graphs} graphs (the eigenvectors of their union mix them); apply it to each "
                             "graph, e.g. as the dataset's transform")
        edge_index = _plain_ids(data.edge_index)  # (PyG's is_undirected fails on an EdgeIndex)
        if N and not is_undirected(edge_index, data.edge_weight, num_nodes=N):
            raise ValueError("positional_encoding_transform: the Laplacian PE needs an undirected graph (every edge "
                             "in both directions, with equal weights), got a directed edge_index; make it undirected "
                             "first (torch_geometric.utils.to_undirected)")
        weight = data.edge_weight
        if weight is not None and not weight.is_floating_point():  # integer counts (as the random-walk PE takes
            weight = weight.to(torch.get_default_dtype())  # them): PyG's D^-1/2 W D^-1/2 failed to cast back to int
        graph = Data(edge_index=edge_index, edge_weight=weight, num_nodes=N)
        with _PrivateDraws():  # PyG's random sign flip (undone below) drew from the global generator
            if N > self.k + 1:
                # ARPACK (PyG's solver from SPARSE_THRESHOLD nodes on) starts from a random vector of numpy's global
                # generator unless given one: a fixed start, so that the same graph gets the same eigenvectors
                import numpy as np

                start = {"v0": np.random.default_rng(0).uniform(0.5, 1.5, N)}
                inner = AddLaplacianEigenvectorPE(self.k, attr_name="pe", is_undirected=True,
                                                  **{**start, **self.kwargs})
                # a graph of several components has eigenvalue 0 once per component, and ARPACK (one start vector)
                # missed some of its eigenvectors: the PE held eigenvectors of larger eigenvalues in their place, and
                # in other columns for another node order. The dense solver finds them all
                # (an edge of weight 0 joins no components: the Laplacian has no entry for it)
                joined = edge_index if weight is None else edge_index[:, weight != 0]
                inner.SPARSE_THRESHOLD = (N + 1 if N <= _DENSE_MAX_NODES and _components(joined, N) > 1
                                          else self.SPARSE_THRESHOLD)
                return add_node_attr(data, _canonical_signs(inner(graph).pe), attr_name=self.attr_name)
            pe = torch.zeros(N, 0)
            if N > 1:  # all N - 1 non-trivial eigenvectors: the dense solver (ARPACK's finds fewer than N)
                inner = AddLaplacianEigenvectorPE(N - 1, attr_name="pe", is_undirected=True)
                inner.SPARSE_THRESHOLD = N + 1
                pe = _canonical_signs(inner(graph).pe)
        return add_node_attr(data, torch.nn.functional.pad(pe, (0, self.k - pe.shape[1])), attr_name=self.attr_name)


# the largest disconnected graph whose Laplacian PE the dense solver computes (an (N, N) float64 matrix, 32 MB); as
# the random-walk PE's dense path
_DENSE_MAX_NODES = 2000


def _components(edge_index: Tensor, num_nodes: int) -> int:
    """The number of connected components of the undirected graph ``edge_index`` (isolated nodes included; every
    edge joins its nodes, whatever its weight: pass the edges of non-zero weight only)."""
    from scipy.sparse.csgraph import connected_components  # (PyG's Laplacian PE reads the graph with scipy too)
    from torch_geometric.utils import to_scipy_sparse_matrix

    return int(connected_components(to_scipy_sparse_matrix(edge_index.cpu(), num_nodes=num_nodes), directed=False)[0])


class _PrivateDraws(torch.overrides.TorchFunctionMode):
    """Random factories called without a generator (PyG's ``torch.randint`` sign flip) draw from a private one.

    The global generator is neither advanced nor saved and restored: ``torch.random.fork_rng`` rewound the draws
    other threads made meanwhile. The mode is thread-local, as torch's function modes are.
    """

    _RANDOM = frozenset({torch.randint, torch.rand, torch.randn, torch.randperm, torch.bernoulli, torch.normal,
                         torch.multinomial})

    def __init__(self) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(0)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in self._RANDOM and kwargs.get("generator") is None:
            kwargs["generator"] = self.generator
        return func(*args, **kwargs)


def _canonical_signs(pe: Tensor) -> Tensor:
    """Each eigenvector (column) signed so that its first entry of largest magnitude is positive: the PE of a graph
    is a function of the graph. PyG's transform flips every column at random, so the same graph got another PE at
    every call (an on-the-fly dataset transform changed the eval logits from one epoch to the next, and
    ``pe_sign_flip=False`` could not turn the random signs off); random signs are the model's, in training."""
    if pe.numel() == 0:
        return pe
    pivot = pe.gather(0, pe.abs().argmax(0, keepdim=True))  # (1, k); argmax takes the first of equal magnitudes
    return pe * torch.where(pivot < 0, -1.0, 1.0).to(pe.dtype)


class _RandomWalkPE(AddRandomWalkPE):
    """PyG's random-walk PE, with a repeated edge counted in the walk's matrix on graphs of up to 2000 nodes too:
    PyG's dense path there wrote ``1 / deg`` once per node pair (rows summing below 1: no probabilities), its
    sparse path for larger graphs summed them, so the same graph got another PE inside a larger one. An edge of
    weight ``w`` is taken with probability ``w / sum of its source's weights`` (``D^-1 A``): PyG gave every edge
    ``1 / max(1, sum)``, its own weight ignored (weights 2 and 3: rows summing below 1; weights 0.5: "return
    probabilities" of 2)."""

    def forward(self, data: Any) -> Any:
        _import_pyg()
        from torch_geometric.utils import get_self_loop_attr, to_edge_index, to_torch_csr_tensor

        N = data.num_nodes
        _check_pe_edge_weight(data, "random-walk")
        edge_index = _plain_ids(data.edge_index)  # (PyG's coalesce, in to_torch_csr_tensor, fails on an EdgeIndex)
        row, col = edge_index
        value = torch.ones(row.shape[0], device=row.device) if data.edge_weight is None else data.edge_weight
        value = value.to(torch.promote_types(value.dtype, torch.get_default_dtype()))  # integer weights divide
        deg = scatter(value, row, dim_size=N, reduce="sum")[row]
        value = torch.where(deg != 0, value / torch.where(deg != 0, deg, 1), 0)  # D^-1 A (a zero-weight row: 0)
        sparse = N > 2000  # as PyG: a CSR matrix (which sums repeated entries) for large graphs

        def diag(out: Tensor) -> Tensor:
            return get_self_loop_attr(*to_edge_index(out), num_nodes=N) if sparse else out.diagonal()

        if sparse:
            adj = to_torch_csr_tensor(edge_index, value, size=(N, N))
        else:
            adj = torch.zeros(N, N, dtype=value.dtype, device=row.device).index_put_((row, col), value,
                                                                                     accumulate=True)
        out, pe = adj, [diag(adj)]
        for _ in range(self.walk_length - 1):
            out = out @ adj
            pe.append(diag(out))
        return add_node_attr(data, torch.stack(pe, dim=-1), attr_name=self.attr_name)
