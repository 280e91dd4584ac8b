r"""Mini-batches of node neighbourhoods for graphs too big for one batch (PyG ``NeighborLoader``).

A batch is the ``L``-hop neighbourhood of ``batch_size`` seed nodes, sampled hop by hop
with at most ``num_neighbors[l]`` incoming edges per node at hop ``l`` (Hamilton et al.,
"Inductive Representation Learning on Large Graphs", NeurIPS 2017). The model runs on the
sampled subgraph only, so attention stays inside it, and the loss is taken on the seeds
(the first ``batch_size`` nodes of the batch).

A seed's output depends on its ``R``-hop neighbourhood, where ``R`` is the number of
*propagation steps* of the model, not of layers: a layer whose heads use ``P^K`` reaches
``K`` hops, so ``R = sum_l K_l`` (2 layers of 2-step heat heads: ``R = 4``). With
``num_neighbors = [-1] * R`` (all neighbours) the seeds get exactly their full-batch outputs;
fewer hops or fewer neighbours per hop approximate them.

PyG 2.8's :class:`~torch_geometric.loader.NeighborLoader` samples with ``pyg-lib`` or
``torch-sparse``; with neither installed it has **no fallback**: iterating it raises
``ImportError: 'NeighborSampler' requires either 'pyg-lib' or 'torch-sparse'``.
:func:`neighbor_loader` therefore uses PyG's sampler when one of them is present and
otherwise plugs :class:`TorchNeighborSampler` (pure PyTorch, this module) into the same
``NeighborLoader`` through its ``neighbor_sampler=`` argument, so batches look the same
(``n_id``, ``e_id``, ``batch_size``, ``input_id``, seeds first) either way.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._imports import _import_pyg
from .base import _check_flags
from .splits import _require_generator

_import_pyg()  # without its import-time DeprecationWarning (an error under `python -W error`)
import torch_geometric.typing as pyg_typing  # noqa: E402
from torch_geometric.data import Data  # noqa: E402
from torch_geometric.loader import NeighborLoader  # noqa: E402
from torch_geometric.loader.utils import filter_data  # noqa: E402
from torch_geometric.sampler import BaseSampler, NodeSamplerInput, SamplerOutput  # noqa: E402

__all__ = ["TorchNeighborSampler", "has_compiled_sampler", "neighbor_batch", "neighbor_loader"]


def has_compiled_sampler() -> bool:
    """Whether PyG's own neighbour sampler can run (``pyg-lib`` or ``torch-sparse`` installed)."""
    return bool(pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE)


def _generator_from_bytes(device: str, state: bytes) -> torch.Generator:
    """A generator on ``device`` in the state ``state`` (``get_state()``'s bytes)."""
    g = torch.Generator(device=device)
    g.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    return g


class _BytesPickledGenerator(torch.Generator):
    """A ``torch.Generator`` that pickles its state as bytes, not as a temporary tensor (which a DataLoader's spawn
    workers on Linux get by file descriptor, freed before the worker starts: "bad value(s) in fds_to_keep")."""

    def __reduce__(self) -> tuple[Any, tuple[str, bytes]]:
        return _generator_from_bytes, (str(self.device), self.get_state().numpy().tobytes())


def _bytes_pickled(g: torch.Generator) -> _BytesPickledGenerator:
    """A :class:`_BytesPickledGenerator` in ``g``'s state, on ``g``'s device."""
    out = _BytesPickledGenerator(device=g.device)
    out.set_state(g.get_state())
    return out


def _check_seed_ids(seeds: Tensor, num_nodes: int, who: str, name: str, distinct: str | None) -> None:
    """Integer seed ids ``seeds`` ``(B,)`` in ``[0, num_nodes)`` and, unless ``distinct`` is ``None``, each once
    (a repeated seed's later copies would get no neighbours); else a ``ValueError`` from ``who`` naming the range
    of ``name`` or the repeated ids ("expected distinct{distinct}")."""
    if not seeds.numel():
        return
    lo, hi = int(seeds.min()), int(seeds.max())
    if lo < 0 or hi >= num_nodes:
        raise ValueError(f"{who}: {name} must lie in [0, num_nodes={num_nodes}), got range [{lo}, {hi}]")
    if distinct is not None:
        ids, counts = seeds.unique(return_counts=True)
        if bool((counts > 1).any()):
            raise ValueError(f"{who}: expected distinct{distinct}, got repeated node ids {ids[counts > 1].tolist()[:10]}")


class TorchNeighborSampler(BaseSampler):
    r"""Uniform neighbour sampling without replacement in pure PyTorch (no compiled extension).

    The graph is sorted once by target (CSC): ``colptr[i] .. colptr[i+1]`` are the incoming
    edges of node ``i``. Hop ``l`` takes, for every node first reached at hop ``l - 1``, all
    its incoming edges when it has at most ``k = num_neighbors[l]`` of them, else ``k`` of
    them uniformly without replacement (one random key per edge, the ``k`` smallest keys of
    each node; vectorised over the frontier). Sources not yet in the batch are appended in
    order of first appearance. Sampled edges point from neighbour to the node that sampled
    it (``directional``, as PyG's default).

    Args:
        data: a PyG ``Data`` with ``edge_index`` ``(2, E)`` and ``num_nodes``.
        num_neighbors: neighbours per node at each hop (``-1`` = all).
        generator: random generator (default: torch's global one). In a ``DataLoader`` worker
            (``num_workers > 0``) each worker draws from a generator of its own, seeded from this
            one and the worker's seed (new every epoch unless the workers persist), not from its
            copy of this one, which every worker would hold in the same state.

    Examples:
        >>> data = Data(edge_index=torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]]), num_nodes=4)
        >>> out = TorchNeighborSampler(data, [-1]).sample_from_nodes(
        ...     NodeSamplerInput(input_id=None, node=torch.tensor([0])))
        >>> out.node.tolist(), out.row.tolist(), out.col.tolist()
        ([0, 1, 2, 3], [1, 2, 3], [0, 0, 0])
    """

    def __init__(self, data: Data, num_neighbors: Sequence[int], generator: torch.Generator | None = None) -> None:
        if not isinstance(data, Data) or data.edge_index is None:
            raise TypeError(f"TorchNeighborSampler: expected a PyG Data with edge_index, got {type(data).__name__}")
        try:
            hops = list(num_neighbors)
        except TypeError:
            hops = []
        if not hops or any(isinstance(k, bool) or not isinstance(k, numbers.Integral) or (k < 1 and k != -1)
                           for k in hops):
            raise ValueError(f"num_neighbors: expected a non-empty list of positive ints or -1, got {num_neighbors!r}")
        _require_generator(generator, "TorchNeighborSampler")  # else torch's "rand() received an invalid combination"
        self.num_neighbors = [int(k) for k in hops]
        self.generator = generator
        self._worker_seed: int | None = None  # the DataLoader worker seed _worker_generator was made for
        self._worker_generator: torch.Generator | None = None
        N = int(data.num_nodes)
        ei = data.edge_index
        if not isinstance(ei, Tensor) or ei.dim() != 2 or ei.shape[0] != 2 or ei.dtype == torch.bool \
                or ei.is_floating_point() or ei.is_complex():
            what = f"{ei.dtype} of shape {tuple(ei.shape)}" if isinstance(ei, Tensor) else type(ei).__name__
            raise ValueError(f"TorchNeighborSampler: expected an integer edge_index of shape (2, E), got {what}")
        if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= N):
            raise ValueError(f"TorchNeighborSampler: edge_index holds node ids in [{int(ei.min())}, {int(ei.max())}], "
                             f"outside [0, num_nodes={N})")
        src, dst = ei[0].long().cpu(), ei[1].long().cpu()
        dst_sorted, perm = torch.sort(dst, stable=True)
        self.num_nodes = N
        self._edge_index, self._edge_version = ei, ei._version  # what it was built on, for neighbor_batch's check
        self.perm = perm  # CSC position -> original edge id
        self.row = src[perm]  # sources in CSC order
        self.colptr = torch.zeros(N + 1, dtype=torch.long)
        self.colptr[1:] = torch.cumsum(torch.bincount(dst_sorted, minlength=N), 0)

    def __getstate__(self) -> dict[str, Any]:
        # a torch.Generator pickles its state as a temporary tensor, which a DataLoader's spawn workers on Linux get
        # by file descriptor: freed before the worker starts ("bad value(s) in fds_to_keep"); its bytes travel whole
        state = dict(self.__dict__)
        for key in ("generator", "_worker_generator"):
            g = state.get(key)
            if isinstance(g, torch.Generator):
                state[key] = _bytes_pickled(g)
        return state

    def _built_on(self, edge_index: Any) -> bool:
        """Whether ``edge_index`` holds the edges this sampler was built on, in the same order."""
        if edge_index is self._edge_index and edge_index._version == self._edge_version:
            return True
        if not isinstance(edge_index, Tensor) or tuple(edge_index.shape) != (2, self.perm.numel()):
            return False
        ei = edge_index.long().cpu()[:, self.perm]
        dst = torch.repeat_interleave(torch.arange(self.num_nodes), self.colptr.diff())
        return torch.equal(ei[0], self.row) and torch.equal(ei[1], dst)

    @property
    def edge_permutation(self) -> None:
        return None  # edge ids are returned in the original order

    def _draw_generator(self) -> torch.Generator | None:
        """The generator of this draw: ``self.generator``, or in a ``DataLoader`` worker one of the worker's own.

        Every worker gets a copy of the sampler with ``self.generator`` in the same state (a fresh copy
        each epoch unless the workers persist), so drawing from it would give every worker, and every
        epoch, the same neighbourhoods; the worker's seed differs per worker and per epoch.
        """
        info = torch.utils.data.get_worker_info()
        if info is None or self.generator is None:
            return self.generator
        if self._worker_seed != info.seed:
            base = int(torch.randint(0, 2**62, (1,), generator=self.generator))
            self._worker_seed = info.seed
            self._worker_generator = torch.Generator().manual_seed((base ^ int(info.seed)) % 2**64)
        return self._worker_generator

    def _sample_hop(self, frontier: Tensor, k: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """(CSC positions of the sampled edges, index into ``frontier`` of their target)."""
        start = self.colptr[frontier]
        deg = self.colptr[frontier + 1] - start
        total = int(deg.sum())
        if total == 0:
            empty = torch.empty(0, dtype=torch.long)
            return empty, empty
        seg = torch.repeat_interleave(torch.arange(frontier.numel()), deg)  # (total,)
        seg_start = torch.cumsum(deg, 0) - deg
        offset = torch.arange(total) - seg_start[seg]
        pos = start[seg] + offset
        if k == -1:
            return pos, seg
        keys = torch.rand(total, generator=generator, dtype=torch.float64)
        order = torch.argsort(seg.double() + keys)  # within each segment, by random key
        rank = torch.empty(total, dtype=torch.long)
        rank[order] = offset  # offsets are 0..deg-1 in segment order, so this is the rank
        keep = rank < k
        return pos[keep], seg[keep]

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs: Any) -> SamplerOutput:
        return self._sample_from_nodes(index, self._draw_generator())

    def _sample_from_nodes(self, index: NodeSamplerInput, generator: torch.Generator | None) -> SamplerOutput:
        """One draw of the neighbourhood of ``index.node`` from ``generator`` (``None``: torch's global RNG)."""
        seeds = index.node
        if not isinstance(seeds, Tensor) or seeds.dim() != 1:  # else torch's "repeats must be 0-dim or 1-dim tensor"
            raise ValueError(f"TorchNeighborSampler: expected seed node ids of shape (B,), "
                             f"got {tuple(seeds.shape) if isinstance(seeds, Tensor) else type(seeds).__name__}")
        if seeds.dtype == torch.bool or seeds.is_floating_point() or seeds.is_complex():  # .long() truncated them
            raise TypeError(f"TorchNeighborSampler: expected integer seed node ids, got dtype {seeds.dtype}")
        seeds = seeds.long()
        N = self.num_nodes
        # an id outside the graph, or a repeated seed whose first copy would get no edges
        _check_seed_ids(seeds, N, "TorchNeighborSampler", "seed node ids", " seeds in a batch")
        local = torch.full((N,), -1, dtype=torch.long)
        local[seeds] = torch.arange(seeds.numel())
        nodes, rows, cols, edges = [seeds], [], [], []
        frontier = seeds
        num_nodes, num_edges = [seeds.numel()], []
        count = seeds.numel()
        for k in self.num_neighbors:
            pos, seg = self._sample_hop(frontier, k, generator)
            src = self.row[pos]
            candidates = src[local[src] < 0]
            fresh = candidates
            if candidates.numel():  # the new nodes, in order of first appearance
                uniq, inverse = torch.unique(candidates, return_inverse=True)
                first = torch.full((uniq.numel(),), candidates.numel(), dtype=torch.long).scatter_reduce(
                    0, inverse, torch.arange(candidates.numel()), reduce="amin")
                fresh = uniq[torch.argsort(first)]
                local[fresh] = torch.arange(count, count + fresh.numel())
                count += fresh.numel()
            rows.append(local[src])
            cols.append(local[frontier[seg]])
            edges.append(self.perm[pos])
            nodes.append(fresh)
            num_nodes.append(fresh.numel())
            num_edges.append(pos.numel())
            frontier = fresh
        out = SamplerOutput(
            node=torch.cat(nodes), row=torch.cat(rows), col=torch.cat(cols), edge=torch.cat(edges),
            batch=None, num_sampled_nodes=num_nodes, num_sampled_edges=num_edges,
        )
        out.metadata = (index.input_id, index.time)
        return out

    def sample_from_edges(self, index: Any, neg_sampling: Any = None) -> Any:  # pragma: no cover
        raise NotImplementedError("TorchNeighborSampler samples node neighbourhoods only")


#: NeighborLoader options that only PyG's own sampler implements, with the value that asks for nothing
#: (NeighborLoader hands them to the sampler it builds, so with TorchNeighborSampler plugged in they were dropped)
_COMPILED_ONLY_OPTIONS: dict[str, Any] = {
    "replace": False, "subgraph_type": "directional", "disjoint": False, "temporal_strategy": "uniform",
    "time_attr": None, "weight_attr": None, "input_time": None, "directed": True,
}


def _refuse_compiled_only_options(kwargs: dict[str, Any], why: str) -> None:
    """ValueError for an option of :data:`_COMPILED_ONLY_OPTIONS` away from its default (TorchNeighborSampler
    samples uniformly without replacement, directional, not disjoint, without times or edge weights)."""
    for name, default in _COMPILED_ONLY_OPTIONS.items():
        if name not in kwargs:
            continue
        value = kwargs[name]
        plain = getattr(value, "value", value)  # a SubgraphType member as its string
        if value is None if default is None else (type(plain) is type(default) and plain == default):
            continue
        shown = f"<tensor of shape {tuple(value.shape)}>" if isinstance(value, Tensor) else repr(value)
        raise ValueError(
            f"neighbor_loader: {name}={shown} needs PyG's compiled sampler (pyg-lib or torch-sparse; {why}); "
            "TorchNeighborSampler samples uniformly without replacement, directional, not disjoint, without times "
            f"or edge weights: leave {name} at {default!r}"
        )


def _loader_generator(generator: torch.Generator) -> torch.Generator:
    """The ``DataLoader``'s generator (shuffling, worker seeds): seeded from ``generator``'s state, not drawn from it,
    so the sampler's draws stay those of ``generator`` (as :func:`neighbor_batch`'s from the same state)."""
    digest = hashlib.blake2b(generator.get_state().numpy().tobytes(), digest_size=8).digest()
    # pickled with the loader (its collate_fn is the loader's method) into every spawn worker
    return _BytesPickledGenerator().manual_seed(int.from_bytes(digest, "little") % 2**63)


def _seeds_as_tensor(input_nodes: Any) -> Any:
    """``input_nodes`` given as a list, tuple, range, NumPy array or a single number, as the tensor it holds (an empty
    one as int64): PyG read a bool one as the node ids 0 and 1, not as a mask, left one of floats to be truncated,
    and failed on a number with "Dimension specified as 0 but tensor has no dimensions"; anything else (a tensor,
    ``None``, a heterogeneous ``(node type, ids)`` pair) as given."""
    if isinstance(input_nodes, np.ndarray) and input_nodes.dtype != object:
        # a copy in native byte order and with positive strides, which torch shares: torch.tensor (and PyG) refused
        # a reversed view (argsort()[::-1], seeds by descending degree) and a big-endian array; unsigned ids as int64:
        # torch cannot check or index with uint16/32/64 ("min_all" not implemented for 'UInt32')
        kind = np.dtype(np.int64) if input_nodes.dtype.kind == "u" else input_nodes.dtype.newbyteorder("=")
        input_nodes = np.array(input_nodes, dtype=kind)
    elif isinstance(input_nodes, np.ndarray):  # an object array (from pandas): the Python values it holds
        input_nodes = input_nodes.tolist()
    if not isinstance(input_nodes, (list, tuple, range, np.ndarray, np.generic, numbers.Number)):
        return input_nodes
    try:
        seeds = torch.from_numpy(input_nodes) if isinstance(input_nodes, np.ndarray) else torch.as_tensor(input_nodes)
    except (TypeError, ValueError, RuntimeError):
        return input_nodes  # left to NeighborLoader (e.g. a heterogeneous (node type, ids) pair)
    return seeds if seeds.numel() else seeds.long()


def _check_loader_seeds(data: Data, batch_size: Any, input_nodes: Any, distinct: bool) -> None:
    """:func:`neighbor_loader`'s ``batch_size`` and ``input_nodes``, checked when the loader is built: else a bad seed
    surfaced at the batch that held it (an epoch later with ``shuffle``), a mask of the wrong length was accepted
    silently (PyG reads its nonzero entries as ids), and ``batch_size=None`` was reported as a seed shape.
    ``distinct``: refuse a repeated seed (:class:`TorchNeighborSampler` refuses one in a batch)."""
    if not isinstance(batch_size, numbers.Real):  # None, a string: a TypeError (DataLoader's own check is a ValueError)
        raise TypeError(f"neighbor_loader: expected batch_size a positive int (seed nodes per batch), "
                        f"got {type(batch_size).__name__} ({batch_size!r})")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"neighbor_loader: expected batch_size a positive int (seed nodes per batch), "
                         f"got {type(batch_size).__name__} ({batch_size!r})")
    seeds = input_nodes
    if isinstance(data, Data) and isinstance(seeds, tuple) and seeds and isinstance(seeds[0], str):
        # PyG failed with "too many dimensions 'str'"
        raise ValueError(f"neighbor_loader: input_nodes ({seeds[0]!r}, ...) is a (node type, ids) pair of a "
                         f"HeteroData, but data is a homogeneous Data: pass the node ids (or a bool mask) alone")
    if not isinstance(seeds, Tensor):  # None (all nodes), or left to NeighborLoader (a (node type, ids) pair)
        return
    n = getattr(data, "num_nodes", None)
    if not isinstance(n, int):  # a graph without a node count: left to NeighborLoader
        return
    if seeds.dim() != 1:
        raise ValueError(f"neighbor_loader: expected input_nodes of shape (B,) (node ids) or (num_nodes,) (a bool "
                         f"mask), got shape {tuple(seeds.shape)}")
    if seeds.dtype == torch.bool:
        if seeds.numel() != n:  # PyG took its nonzero entries as ids of a graph it does not describe
            raise ValueError(f"neighbor_loader: a bool input_nodes mask needs one entry per node (num_nodes={n}), "
                             f"got {seeds.numel()}")
        return
    if seeds.is_floating_point() or seeds.is_complex():
        raise TypeError(f"neighbor_loader: expected input_nodes integer node ids or a bool mask, got dtype {seeds.dtype}")
    _check_seed_ids(seeds, n, "neighbor_loader", "input_nodes ids", " input_nodes (TorchNeighborSampler refuses a "
                    "repeated seed in a batch)" if distinct else None)


def neighbor_loader(
    data: Data,
    num_neighbors: Sequence[int],
    *,
    batch_size: int,
    input_nodes: Tensor | None = None,
    shuffle: bool = False,
    generator: torch.Generator | None = None,
    force_torch: bool = False,
    **kwargs: Any,
) -> NeighborLoader:
    """A PyG :class:`~torch_geometric.loader.NeighborLoader` that also runs without ``pyg-lib``
    and ``torch-sparse`` (then with :class:`TorchNeighborSampler`).

    Args:
        data: the whole graph (``x``, ``edge_index``, ``y`` ... on the CPU).
        num_neighbors: neighbours per node at each hop (``-1`` = all); one entry per layer.
        batch_size: seed nodes per batch.
        input_nodes: the seeds to iterate over (node ids in ``[0, num_nodes)``, distinct with
            :class:`TorchNeighborSampler`, or a bool mask of ``num_nodes`` entries; default: all nodes),
            as a tensor, a list or a NumPy array, checked here, not at the batch that holds a bad one.
        shuffle: reshuffle the seeds every epoch.
        generator: random generator of :class:`TorchNeighborSampler`, and then also the
            ``DataLoader``'s (its shuffling and its workers' seeds: from a generator seeded from its state,
            which is not drawn from), so the batches follow it alone
            (the PyG samplers use torch's global RNG).
        force_torch: use :class:`TorchNeighborSampler` even when a compiled sampler exists.
        **kwargs: further ``NeighborLoader`` / ``DataLoader`` arguments; with
            :class:`TorchNeighborSampler` the sampling options only PyG's samplers implement
            (``replace``, ``subgraph_type``, ``disjoint``, ``temporal_strategy``, ``time_attr``,
            ``weight_attr``, ``input_time``, ``directed``) must keep their defaults (else a
            ``ValueError``), and a ``neighbor_sampler`` of the caller's is used as is.

    Returns:
        The loader; each batch is a ``Data`` whose first ``batch.batch_size`` nodes are the seeds.
    """
    _check_flags("neighbor_loader", shuffle=shuffle, force_torch=force_torch)
    if kwargs.get("neighbor_sampler") is not None:  # the caller's own sampler, used as is
        if force_torch:
            raise ValueError("neighbor_loader: force_torch=True and neighbor_sampler= both choose the sampler; "
                             "pass one of them")
        if generator is not None:
            raise ValueError("neighbor_loader: generator= seeds the sampler this function builds; a neighbor_sampler= "
                             "of the caller's draws from its own random state, so pass one of them")
    own = kwargs.get("neighbor_sampler") is None and (not has_compiled_sampler() or force_torch)
    input_nodes = _seeds_as_tensor(input_nodes)
    _check_loader_seeds(data, batch_size, input_nodes, distinct=own)
    if own:
        _refuse_compiled_only_options(kwargs, "force_torch=True bypasses it" if force_torch else "not installed")
        kwargs["neighbor_sampler"] = TorchNeighborSampler(data, num_neighbors, generator)
        if generator is not None:  # else the shuffling and the workers' seeds came from torch's global RNG
            kwargs["generator"] = _loader_generator(generator)
    # int(): a numpy int passed the check above, and DataLoader refused it ("should be a positive integer value")
    return NeighborLoader(data, list(num_neighbors), batch_size=int(batch_size), input_nodes=input_nodes,
                          shuffle=shuffle, **kwargs)


def neighbor_batch(data: Data, sampler: TorchNeighborSampler, seeds: Tensor,
                   generator: torch.Generator | None = None) -> Data:
    r"""The sampled neighbourhood of ``seeds`` as one batch, laid out as :func:`neighbor_loader`'s.

    One draw of ``sampler`` (:class:`TorchNeighborSampler`) from ``generator``, without a
    loader: for a training loop that picks its own seeds each step and must draw all its
    randomness from one checkpointed generator (the experiment runner's mini-batch node task).
    Node attributes (``x``, ``y``, masks ...) are gathered by ``n_id``, edge attributes by
    ``e_id``, exactly as PyG's ``NeighborLoader`` does (``filter_data``).

    Args:
        data: the whole graph ``sampler`` was built on.
        sampler: a :class:`TorchNeighborSampler` of ``data``.
        seeds: the seed node ids ``(B,)`` (distinct).
        generator: random generator of this draw (default: the sampler's own).

    Returns:
        A ``Data`` whose first ``batch_size = B`` nodes are ``seeds``, in order, with ``n_id``
        ``(N_b,)`` (global ids), ``e_id`` ``(E_b,)``, ``input_id`` and ``edge_index`` ``(2, E_b)``
        in local ids (source, target).

    Shapes:
        ``seeds``: ``(B,)`` -> a batch over ``N_b >= B`` nodes and ``E_b`` edges.

    Examples:
        >>> data = Data(x=torch.arange(4.).view(4, 1), edge_index=torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]]))
        >>> b = neighbor_batch(data, TorchNeighborSampler(data, [-1]), torch.tensor([1]))
        >>> b.n_id.tolist(), b.edge_index.tolist(), b.x.view(-1).tolist(), b.batch_size
        ([1, 0], [[1], [0]], [1.0, 0.0], 1)
    """
    if not isinstance(sampler, TorchNeighborSampler):
        raise TypeError(f"neighbor_batch: expected a TorchNeighborSampler, got {type(sampler).__name__}")
    if (sampler.num_nodes, sampler.perm.numel()) != (data.num_nodes, data.num_edges):  # else the other graph's edges
        raise ValueError(f"neighbor_batch: sampler was built on a graph of {sampler.num_nodes} nodes and "
                         f"{sampler.perm.numel()} edges, data has {data.num_nodes} nodes and {data.num_edges} edges; "
                         "build the sampler on data")
    if not sampler._built_on(data.edge_index):
        # same sizes, other edges (reordered, reversed, changed in place): the sampled edges and e_id are not data's
        raise ValueError("neighbor_batch: sampler was built on a graph with other edges than data.edge_index "
                         f"(same {data.num_nodes} nodes and {data.num_edges} edges); build the sampler on data")
    _require_generator(generator, "neighbor_batch")
    if not isinstance(seeds, Tensor) or seeds.dim() != 1:
        raise ValueError(f"neighbor_batch: expected seeds of shape (B,), got {getattr(seeds, 'shape', type(seeds))}")
    if seeds.dtype == torch.bool or seeds.is_floating_point() or seeds.is_complex():  # .long() would read a mask as ids 0/1
        hint = " (for a node mask, pass mask.nonzero().view(-1))" if seeds.dtype == torch.bool else ""
        raise TypeError(f"neighbor_batch: expected integer seed node ids, got dtype {seeds.dtype}{hint}")
    seeds = seeds.long().cpu()
    _check_seed_ids(seeds, data.num_nodes, "neighbor_batch", "seed node ids", " seeds")
    # an explicit generator is drawn from as is, also in a DataLoader worker (where sample_from_nodes would
    # replace it by the worker's own generator, so the same generator state gave other neighbourhoods)
    out = sampler._sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds),
                                     sampler._draw_generator() if generator is None else generator)
    batch = filter_data(data, out.node, out.row, out.col, out.edge, sampler.edge_permutation)
    batch.n_id = out.node
    batch.e_id = out.edge
    batch.input_id = torch.arange(seeds.numel())
    batch.batch_size = seeds.numel()
    return batch
