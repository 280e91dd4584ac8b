"""Import lightness: a GPT-only or ViT-only user never imports PyG (torch_geometric).

PyG 2.8 calls the deprecated ``torch.jit.script`` at its own import (a ``DeprecationWarning`` on torch 2.13), so
``python -W error -c "from diffusionformer.models import DiffusionGPT"`` failed; the graph pieces now import PyG
on first use. Checks that need a clean ``sys.modules`` run in a fresh interpreter (``sys.executable``, no fork).
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *flags, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": ""})


def test_bug_models_import_pyg_and_fail_under_w_error():
    """Bug: ``import diffusionformer.models`` (and ``diffusionformer.data``) imported torch_geometric at module
    import (models.common, gcn, gin, graph_transformer; data.neighbors through data/__init__), whose
    ``torch.jit.script`` call raised under ``-W error``: a GPT or ViT user could not import the models."""
    code = (
        "import sys, torch\n"
        "import diffusionformer, diffusionformer.nn, diffusionformer.models, diffusionformer.data, diffusionformer.train\n"
        "from diffusionformer.models import DiffusionGPT, DiffusionViT, GPTConfig, ViTConfig\n"
        "torch.manual_seed(0)\n"
        "gpt = DiffusionGPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)).eval()\n"
        "logits = gpt(torch.randint(0, 11, (2, 5)))\n"
        "logits = logits[0] if isinstance(logits, tuple) else logits\n"
        "assert logits.shape[-1] == 11 and bool(torch.isfinite(logits).all())\n"
        "vit = DiffusionViT(ViTConfig(input_size=(8, 8), patch_size=4, num_classes=3, dim=8, depth=1, num_heads=2)).eval()\n"
        "out = vit(torch.randn(2, 1, 8, 8))\n"
        "assert out.shape == (2, 3) and bool(torch.isfinite(out).all())\n"
        "assert 'torch_geometric' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch_geometric'))[:3]\n"
        "print('ok')\n"
    )
    done = _run(code, "-W", "error")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok" and done.stderr == "", done.stderr[-3000:]


def test_pins_graph_models_import_pyg_on_first_use():
    """The graph models, PE transforms and neighbour loader still work when PyG is first imported by using them
    (a fresh interpreter, PyG not yet loaded), and ``from diffusionformer.data import *`` still exports the lazy names."""
    code = (
        "import sys, pickle, torch\n"
        "from diffusionformer.models import GCN, GCNConfig, GIN, GINConfig, DiffusionGraphTransformer, "
        "GraphTransformerConfig, positional_encoding_transform\n"
        "assert 'torch_geometric' not in sys.modules\n"
        "x, ei, b = torch.randn(5, 3), torch.tensor([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]]), torch.tensor([0, 0, 0, 1, 1])\n"
        "assert GCN(GCNConfig(in_channels=3, num_classes=2, task='graph')).eval()(x, ei, b).shape == (2, 2)\n"
        "assert 'torch_geometric' in sys.modules\n"
        "assert GIN(GINConfig(in_channels=3, num_classes=2)).eval()(x, ei, b).shape == (2, 2)\n"
        "gt = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=3, num_classes=2, task='graph', "
        "global_attention=True)).eval()\n"
        "assert gt(x, ei, b).shape == (2, 2)\n"
        "from torch_geometric.data import Data\n"
        "t = positional_encoding_transform(GraphTransformerConfig(in_channels=1, pe='random_walk', pe_dim=3))\n"
        "ring = Data(edge_index=torch.tensor([[0, 1, 2, 1, 2, 0], [1, 2, 0, 0, 1, 2]]), num_nodes=3)\n"
        "assert torch.allclose(pickle.loads(pickle.dumps(t))(ring).pe[0], torch.tensor([0.0, 0.5, 0.25]))\n"
        "from diffusionformer.data import *\n"
        "from diffusionformer.data import neighbors\n"
        "assert neighbor_loader is neighbors.neighbor_loader and TorchNeighborSampler is neighbors.TorchNeighborSampler\n"
        "assert neighbor_batch is neighbors.neighbor_batch and has_compiled_sampler is neighbors.has_compiled_sampler\n"
        "print('ok')\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_pins_lazy_pe_classes_keep_their_module_names():
    """The PE transforms live in the private ``models._graph_pe`` (which imports PyG); their old names
    ``graph_transformer._LaplacianPE`` / ``_RandomWalkPE`` still resolve to the same classes, so a transform pickled
    under the old module path loads; and they compute PyG's PE on a path graph: the Laplacian PE's column is the
    Fiedler vector of ``I - D^-1/2 A D^-1/2`` (float64 ``torch.linalg.eigh``), up to sign."""
    import diffusionformer.models._graph_pe as pe_mod
    import diffusionformer.models.graph_transformer as gt
    from diffusionformer.models import GraphTransformerConfig, positional_encoding_transform
    from torch_geometric.data import Data

    lap = positional_encoding_transform(GraphTransformerConfig(in_channels=1, pe="laplacian", pe_dim=1))
    rw = positional_encoding_transform(GraphTransformerConfig(in_channels=1, pe="random_walk", pe_dim=2))
    assert type(lap) is gt._LaplacianPE is pe_mod._LaplacianPE and type(rw) is gt._RandomWalkPE is pe_mod._RandomWalkPE
    assert type(lap).__qualname__ == "_LaplacianPE" and type(lap).__module__ == pe_mod.__name__
    assert type(pickle.loads(pickle.dumps(lap))) is pe_mod._LaplacianPE
    for obj in (lap, rw):  # protocol 2 names the class as "module\nname\n": the old path, as older pickles have it
        old = pickle.dumps(obj, protocol=2).replace(pe_mod.__name__.encode(), gt.__name__.encode())
        assert gt.__name__.encode() + b"\n_" in old
        again = pickle.loads(old)
        assert type(again) is type(obj) and again.__dict__.keys() == obj.__dict__.keys()
    with pytest.raises(AttributeError, match="has no attribute '_no_such_name'"):
        gt._no_such_name
    ei = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    pe = lap(Data(edge_index=ei, num_nodes=4)).pe[:, 0].double()
    A = torch.zeros(4, 4, dtype=torch.float64)
    A[ei[0], ei[1]] = 1
    d = A.sum(1).rsqrt()
    vec = torch.linalg.eigh(torch.eye(4, dtype=torch.float64) - d[:, None] * A * d[None, :]).eigenvectors[:, 1]
    assert torch.allclose(pe.abs(), vec.abs(), atol=1e-5) and abs(float(pe @ vec)) > 0.999
