"""Datasets as typed tensors and graphs, behind one registry.

>>> from diffusionformer.data import load_dataset, list_datasets
>>> data = load_dataset("csbm", num_nodes=40, avg_degree=4.0, homophily=0.9, seed=1)
>>> data.kind, data.data.x.shape
('node', torch.Size([40, 16]))

``load_dataset(name, root=None, seed=0, **options)`` returns one of the containers of
:mod:`diffusionformer.data.base` (``ClassificationData``, ``TextData``, ``SequenceTaskData``,
``NodeData``, ``GraphSetData``), each with ``name``, ``kind`` and ``meta``.

Embedded datasets (no files needed; the optional ones need ``pip install
"diffusionformer[data]"``): ``digits``, ``mnist1d``, ``mnist-mini``, ``pydoc-chars``,
``karate``, ``csbm``, ``assoc-recall``. Benchmarks read from a data root in their standard
layout (``root=`` or ``$DIFFUSIONFORMER_DATA``; nothing is downloaded): ``tinyshakespeare``,
``mnist``, ``cifar10``, ``cora``, ``citeseer`` and the TU sets ``mutag``, ``proteins``,
``enzymes``, ``nci1``, ``nci109``, ``imdb-binary``, ``imdb-multi``, ``ptc_mr``. Derived files
(copies, unzipped archives, decoded images) go to ``$DIFFUSIONFORMER_CACHE`` (default
``~/.cache/diffusionformer``), never into the data root.
"""

from __future__ import annotations

# Loader modules register themselves on import.
from . import cifar10, csbm, images, mnist, planetoid, recall, sequences, text, tu  # noqa: F401
from .._imports import _lazy_exports
from .base import (
    IGNORE_INDEX,
    ClassificationData,
    GraphSetData,
    NodeData,
    SequenceTaskData,
    TaskData,
    TextData,
)
from .csbm import csbm_graph, edge_homophily
from .paths import (
    CACHE_ENV,
    DATA_ENV,
    ChecksumError,
    CorruptDataError,
    DataRootError,
    cache_dir,
    resolve_root,
)
from .recall import make_assoc_recall
from .registry import DatasetSpec, dataset_spec, list_datasets, load_dataset, register_dataset, unregister_dataset

# The neighbour loader subclasses PyG's classes: imported on first use (PEP 562), so that ``import
# diffusionformer.data`` does not import PyG (PyG 2.8 calls the deprecated ``torch.jit.script`` at import).
_LAZY = {name: "diffusionformer.data.neighbors"
         for name in ("TorchNeighborSampler", "has_compiled_sampler", "neighbor_batch", "neighbor_loader")}


__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)


__all__ = [
    "TorchNeighborSampler",
    "has_compiled_sampler",
    "neighbor_batch",
    "neighbor_loader",
    "load_dataset",
    "list_datasets",
    "dataset_spec",
    "register_dataset",
    "unregister_dataset",
    "DatasetSpec",
    "TaskData",
    "ClassificationData",
    "TextData",
    "SequenceTaskData",
    "NodeData",
    "GraphSetData",
    "IGNORE_INDEX",
    "DataRootError",
    "CorruptDataError",
    "ChecksumError",
    "DATA_ENV",
    "CACHE_ENV",
    "resolve_root",
    "cache_dir",
    "csbm_graph",
    "edge_homophily",
    "make_assoc_recall",
]
