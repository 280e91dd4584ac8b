"""Consistency sweep, second pass: the flags of the data loaders, the metrics writers and the models' forwards.

Probed and fixed:

* The public loaders read ``normalize``, ``verify``, ``normalize_features`` and ``use_node_attr`` by truthiness:
  ``load_mnist(normalize="no")`` standardised the images and ``verify="no"`` hashed the files (``bool("no")`` is True),
  and a numpy bool passed unnamed. Each loader now checks its flags first, before any file is read (one private helper,
  ``data.base._check_flags``), with its own name as the prefix: ``load_cora``, ``load_mutag`` ... not the
  ``load_planetoid`` / ``load_tu`` they call.
* ``neighbor_loader(shuffle=..., force_torch=...)``; ``active`` of ``MetricsLog``, ``CSVLog``, ``TensorBoardLog`` and
  ``open_loggers`` (``active="no"`` wrote the files of a non-main rank); ``return_intermediates`` of the GPT, ViT
  (``forward_tokens``) and graph transformer forwards (``"no"`` changed the return type to a tuple);
  ``DiffusionGPT.num_parameters(exclude_embeddings=...)``; ``GraphBlock(global_attention=...)`` (``"no"`` built a
  global attention layer); ``split_task_settings(warn=...)``.

Every site now raises ``TypeError: [<where>: ]<flag> must be a bool, got <type> (<value>)``, the type named by
``diffusionformer.config._value_type`` (``numpy.bool``). Not changed: ``DINO.train(mode)`` (torch's
``nn.Module.train`` already refuses a non-bool, with its own ValueError, for every model alike).
"""

from __future__ import annotations

import typing
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from diffusionformer.data.cifar10 import load_cifar10
from diffusionformer.data.images import build_image_data, load_digits, load_mnist_mini
from diffusionformer.data.mnist import load_mnist
from diffusionformer.data.neighbors import neighbor_loader
from diffusionformer.data.planetoid import load_citeseer, load_cora, load_planetoid
from diffusionformer.data.registry import dataset_spec
from diffusionformer.data.tu import load_tu
from diffusionformer.models import (DiffusionGPT, DiffusionGraphTransformer, DiffusionViT, GPTConfig, GraphBlock,
                                    GraphTransformerConfig, ViTConfig)
from diffusionformer.models.registry import split_task_settings
from diffusionformer.train.loggers import CSVLog, TensorBoardLog, open_loggers
from diffusionformer.train.metrics import MetricsLog

#: a data root that holds nothing: a loader that reads before it checks fails with a missing-file error instead
_NO_ROOT = Path("/nonexistent/diffusionformer-flag-sweep")
_IMAGES = torch.zeros(4, 1, 2, 2, dtype=torch.uint8)
_SPLITS = (torch.tensor([0, 1]), torch.tensor([2]), torch.tensor([3]))
_GRAPH = Data(x=torch.zeros(3, 1), edge_index=torch.tensor([[0, 1], [1, 2]]))


def _gpt() -> DiffusionGPT:
    return DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16)).eval()


def _vit() -> DiffusionViT:
    return DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, dim=16, depth=1, num_heads=2)).eval()


def _gt() -> DiffusionGraphTransformer:
    return DiffusionGraphTransformer(GraphTransformerConfig(in_channels=1, dim=16, depth=1, num_heads=2)).eval()


def _loader(flag: str, where: str, call: typing.Callable[..., object]) -> tuple[str, typing.Callable[[object], object]]:
    return f"{flag} ({where})", lambda v: call(**{flag: v})


#: ``"<flag> (<where>)" -> call(flag value)``: every public flag of this pass, through the public call that takes it
BOOL_SITES: dict[str, typing.Callable[[object], object]] = dict([
    _loader("normalize", "build_image_data",
            lambda **kw: build_image_data("toy", _IMAGES, torch.tensor([0, 1, 0, 1]), _SPLITS, num_classes=2, meta={},
                                          **kw)),
    _loader("normalize", "load_digits", load_digits),
    _loader("normalize", "load_mnist_mini", load_mnist_mini),
    _loader("normalize", "load_mnist", lambda **kw: load_mnist(root=_NO_ROOT, **kw)),
    _loader("verify", "load_mnist", lambda **kw: load_mnist(root=_NO_ROOT, **kw)),
    _loader("verify", "load_planetoid", lambda **kw: load_planetoid("Cora", root=_NO_ROOT, **kw)),
    _loader("normalize_features", "load_planetoid", lambda **kw: load_planetoid("Cora", root=_NO_ROOT, **kw)),
    _loader("verify", "load_cora", lambda **kw: load_cora(root=_NO_ROOT, **kw)),
    _loader("normalize_features", "load_cora", lambda **kw: load_cora(root=_NO_ROOT, **kw)),
    _loader("verify", "load_citeseer", lambda **kw: load_citeseer(root=_NO_ROOT, **kw)),
    _loader("normalize_features", "load_citeseer", lambda **kw: load_citeseer(root=_NO_ROOT, **kw)),
    _loader("verify", "load_tu", lambda **kw: load_tu("mutag", root=_NO_ROOT, seed=0, **kw)),
    _loader("use_node_attr", "load_tu", lambda **kw: load_tu("mutag", root=_NO_ROOT, seed=0, **kw)),
    _loader("verify", "load_mutag", lambda **kw: dataset_spec("mutag").loader(root=_NO_ROOT, **kw)),
    _loader("use_node_attr", "load_proteins", lambda **kw: dataset_spec("proteins").loader(root=_NO_ROOT, **kw)),
    _loader("normalize", "load_cifar10", lambda **kw: load_cifar10(root=_NO_ROOT, **kw)),
    _loader("verify", "load_cifar10", lambda **kw: load_cifar10(root=_NO_ROOT, **kw)),
    _loader("shuffle", "neighbor_loader", lambda **kw: neighbor_loader(_GRAPH, [2], batch_size=2, **kw)),
    _loader("force_torch", "neighbor_loader", lambda **kw: neighbor_loader(_GRAPH, [2], batch_size=2, **kw)),
    _loader("active", "MetricsLog", lambda **kw: MetricsLog(_NO_ROOT / "metrics.jsonl", **kw)),
    _loader("active", "CSVLog", lambda **kw: CSVLog(_NO_ROOT / "metrics.csv", **kw)),
    _loader("active", "TensorBoardLog", lambda **kw: TensorBoardLog(_NO_ROOT / "tensorboard", **kw)),
    _loader("active", "open_loggers", lambda **kw: open_loggers(["jsonl"], _NO_ROOT, **kw)),
    _loader("return_intermediates", "DiffusionGPT.forward",
            lambda **kw: _gpt()(torch.zeros(1, 4, dtype=torch.long), **kw)),
    _loader("exclude_embeddings", "DiffusionGPT.num_parameters", lambda **kw: _gpt().num_parameters(**kw)),
    _loader("return_intermediates", "DiffusionViT.forward_tokens",
            lambda **kw: _vit().forward_tokens(torch.zeros(1, 1, 8, 8), **kw)),
    _loader("return_intermediates", "DiffusionGraphTransformer.forward",
            lambda **kw: _gt()(torch.zeros(3, 1), torch.tensor([[0, 1], [1, 2]]), **kw)),
    _loader("global_attention", "GraphBlock", lambda **kw: GraphBlock(8, 2, **kw)),
    _loader("warn", "split_task_settings", lambda **kw: split_task_settings("vit-tiny", {}, **kw)),
])

#: the sites whose message starts with the name of the public call (the loaders', the writers')
_PREFIXED = ("load_", "build_image_data", "neighbor_loader", "Log", "open_loggers", "GraphBlock",
             "split_task_settings")


@pytest.mark.parametrize("site", list(BOOL_SITES))
def test_bug_flags_of_loaders_writers_and_forwards_are_checked(site: str):
    """Bug: these flags were read by truthiness: ``"no"`` was True (``load_mnist(normalize="no")`` standardised,
    ``verify="no"`` hashed, ``MetricsLog(active="no")`` wrote on a non-main rank, ``return_intermediates="no"`` returned
    a tuple, ``GraphBlock(global_attention="no")`` built a global layer) and a numpy bool passed unnamed. Each now raises
    a TypeError naming the flag and ``numpy.bool``, before any file is read (a missing data root is not reached)."""
    call = BOOL_SITES[site]
    flag, where = site.split(" ")[0], site.split("(")[1].rstrip(")")
    with pytest.raises(TypeError) as info:
        call(np.True_)
    message = str(info.value)
    assert f"{flag} must be a bool, got numpy.bool" in message and message.endswith(f"({np.True_!r})"), message
    if any(p in where for p in _PREFIXED):
        assert message.startswith(f"{where.split('.')[0]}: "), message
    with pytest.raises(TypeError, match=rf"{flag} must be a bool, got str \('no'\)$"):
        call("no")
    with pytest.raises(TypeError, match=rf"{flag} must be a bool, got int \(1\)$"):
        call(1)


def test_real_bools_still_work(tmp_path: Path):
    """The checks pass Python bools through: the writers write (or not), the forwards return what they did, the
    neighbour loader samples (the loaders' own test files run them on small fake data files)."""
    for active in (True, False):
        log = open_loggers(["jsonl", "csv"], tmp_path / str(active), active=active)
        log.append({"step": 1, "split": "train", "loss": 0.5, "lr": 0.1, "metrics": {}, "elapsed": 1.0, "time": 2.0})
        log.close()
        assert (tmp_path / str(active) / "metrics.jsonl").exists() is active
    assert TensorBoardLog(tmp_path / "tb", active=False).active is False
    idx = torch.zeros(1, 4, dtype=torch.long)
    gpt = _gpt()
    assert len(gpt(idx, return_intermediates=True)) == 3 and len(gpt(idx, return_intermediates=False)) == 2
    assert gpt.num_parameters(exclude_embeddings=True) < gpt.num_parameters()
    assert isinstance(_vit().forward_tokens(torch.zeros(1, 1, 8, 8), return_intermediates=True), tuple)
    assert GraphBlock(8, 2, global_attention=True).global_attn is not None
    batches = list(neighbor_loader(_GRAPH, [2], batch_size=2, shuffle=True, force_torch=True))
    assert sum(int(b.batch_size) for b in batches) == 3
    data = build_image_data("toy", _IMAGES, torch.tensor([0, 1, 0, 1]), _SPLITS, num_classes=2, meta={},
                            normalize=False)
    assert data.mean is None and data.x_train.shape == (2, 1, 2, 2)
