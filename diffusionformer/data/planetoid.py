"""Node classification graphs from PyG: Zachary's karate club and the Planetoid citation graphs.

* ``"karate"``: ``torch_geometric.datasets.KarateClub`` (Zachary 1977; 34 nodes, 156 directed
  edges, 4 communities from modularity-based clustering, one-hot identity features). PyG
  labels one node per class; we draw a seeded split instead: ``num_train_per_class`` random
  nodes per class (default 2, so 8) for train, and the other 26 nodes shuffled and halved
  into val (13) and test (13).
* ``"cora"``, ``"citeseer"``: Planetoid (Yang, Cohen & Salakhutdinov, ICML 2016) with its
  public split (Cora 140/500/1,000 of 2,708 nodes, 7 classes; CiteSeer 120/500/1,000 of
  3,327 nodes, 6 classes). The raw files ``<root>/planetoid/<Name>/raw/ind.<name>.*`` are
  checked, copied to ``$DIFFUSIONFORMER_CACHE/planetoid/<Name>/raw`` and processed there by
  ``torch_geometric.datasets.Planetoid`` (which writes ``processed/`` beside ``raw/``).
"""

from __future__ import annotations

from pathlib import Path

from .base import NodeData
from .checksums import verify_file
from .paths import cache_dir, copy_into_cache, require_files
from .registry import register_dataset
from .splits import index_to_mask, per_class_split

__all__ = ["load_karate", "load_planetoid", "load_cora", "load_citeseer"]

PLANETOID_FILES = ["x", "tx", "allx", "y", "ty", "ally", "graph", "test.index"]


@register_dataset("karate", kind="node")
def load_karate(*, seed: int = 0, num_train_per_class: int = 2) -> NodeData:
    """Zachary's karate club (PyG ``KarateClub``), 4 classes, seeded few-label split.

    Args:
        seed: seed of the split.
        num_train_per_class: labelled training nodes per class.
    """
    from torch_geometric.datasets import KarateClub

    data = KarateClub()[0]
    train_idx, val_idx, test_idx = per_class_split(data.y, num_train_per_class, 0.5, seed)
    N = data.num_nodes
    data.train_mask = index_to_mask(train_idx, N)
    data.val_mask = index_to_mask(val_idx, N)
    data.test_mask = index_to_mask(test_idx, N)
    return NodeData(
        name="karate",
        data=data,
        num_classes=int(data.y.max()) + 1,
        num_features=data.num_features,
        meta={
            "source": "torch_geometric.datasets.KarateClub (Zachary 1977)",
            "licence": "public research data, bundled in PyG (MIT)",
            "split": f"{num_train_per_class} train nodes per class, rest halved into val/test "
            f"(seed={seed})",
            "sizes": {"train": len(train_idx), "val": len(val_idx), "test": len(test_idx)},
        },
    )


def load_planetoid(name: str, *, root: Path | None, verify: bool = True, normalize_features: bool = True) -> NodeData:
    """A Planetoid graph (``"Cora"``, ``"CiteSeer"``, ...) with the public split.

    Args:
        name: PyG's spelling of the dataset name.
        root: data root holding ``planetoid/<name>/raw/ind.<name lower>.*``.
        verify: check the raw files' SHA256 against the staged ones.
        normalize_features: divide every node's bag-of-words row by its sum (PyG's
            ``NormalizeFeatures``, as in the reference GCN example); rows of zeros stay zero.
    """
    from torch_geometric.datasets import Planetoid

    key = name.lower()
    rels = [f"planetoid/{name}/raw/ind.{key}.{part}" for part in PLANETOID_FILES]
    paths = require_files(key, root, rels)
    if verify:
        for path, rel in zip(paths, rels):
            verify_file(path, rel)
    work = cache_dir("planetoid")
    copy_into_cache(paths, work / name / "raw")
    dataset = Planetoid(str(work), name, split="public")
    data = dataset[0]
    if normalize_features:
        data.x = data.x / data.x.sum(dim=1, keepdim=True).clamp_min(1.0)
    return NodeData(
        name=key,
        data=data,
        num_classes=dataset.num_classes,
        num_features=dataset.num_features,
        meta={
            "source": "Planetoid (Yang, Cohen & Salakhutdinov 2016), kimiyoung/planetoid",
            "licence": "MIT (kimiyoung/planetoid)",
            "split": "public Planetoid split",
            "sizes": {s: int(getattr(data, f"{s}_mask").sum()) for s in ("train", "val", "test")},
            "processed_in": str(work / name),
            "features": "row-normalised (sum 1)" if normalize_features else "raw binary bag of words",
        },
    )


@register_dataset("cora", kind="node", needs_root=True)
def load_cora(*, root: Path | None, seed: int = 0, verify: bool = True, normalize_features: bool = True) -> NodeData:
    """Cora citation graph, public split (140/500/1,000), 1,433 features, 7 classes.

    Args:
        root: data root.
        seed: unused (the public split is fixed); accepted for a uniform interface.
        verify: check the raw files' SHA256.
        normalize_features: row-normalise the features (PyG's ``NormalizeFeatures``).
    """
    return load_planetoid("Cora", root=root, verify=verify, normalize_features=normalize_features)


@register_dataset("citeseer", kind="node", needs_root=True)
def load_citeseer(*, root: Path | None, seed: int = 0, verify: bool = True, normalize_features: bool = True) -> NodeData:
    """CiteSeer citation graph, public split (120/500/1,000), 3,703 features, 6 classes.

    Args:
        root: data root.
        seed: unused (the public split is fixed); accepted for a uniform interface.
        verify: check the raw files' SHA256.
        normalize_features: row-normalise the features (PyG's ``NormalizeFeatures``).
    """
    return load_planetoid("CiteSeer", root=root, verify=verify, normalize_features=normalize_features)
