"""Run the docs' Python blocks that the Sphinx build does not execute.

Plain ```python fences (README) and ``.. code-block:: python`` blocks are shown, not run, by the
docs build; each test here finds one such block by its first line, takes its body and execs it
in a small context, so the snippet fails here when the API it shows changes.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def snippet(relpath: str, first_line: str) -> str:
    """The body of the Python block of ``relpath`` whose first code line is ``first_line``."""
    lines = (ROOT / relpath).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        opener = line.strip()
        if opener not in ("```python", ".. code-block:: python"):
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j >= len(lines) or lines[j].strip() != first_line:
            continue
        body = []
        for k in range(j, len(lines)):
            if opener == "```python" and lines[k].strip() == "```":
                break
            if opener != "```python" and lines[k].strip() and not lines[k].startswith(" "):
                break
            body.append(lines[k])
        return textwrap.dedent("\n".join(body))
    raise AssertionError(f"expected a Python block starting with {first_line!r} in {relpath}, got none")


def run(code: str, **context: object) -> dict:
    namespace: dict = dict(context)
    exec(compile(code, "<docs snippet>", "exec"), namespace)  # noqa: S102
    return namespace


def test_readme_five_lines():
    ns = run(snippet("README.md", "import torch"))
    assert ns["y"].shape == (100, 64)


def test_ssl_tutorial_dino_forward():
    torch.manual_seed(0)
    images = torch.randn(3, 1, 8, 8)
    ns = run(snippet("docs/tutorials/ssl.rst", "from diffusionformer.models import create_model"), images=images)
    assert ns["feats"].shape[0] == 3 and ns["tokens"].shape[:2] == (3, 16)
    assert ns["student_logits"].shape[0] == 3


def test_modern_parts_neighbor_loader():
    pytest.importorskip("torch_geometric")
    import torch.nn.functional as F
    from torch_geometric.data import Data

    from diffusionformer.models import DiffusionGraphTransformer, GraphTransformerConfig

    torch.manual_seed(0)
    n = 200
    data = Data(x=torch.randn(n, 8), edge_index=torch.randint(0, n, (2, 1000)), y=torch.randint(0, 3, (n,)))
    model = DiffusionGraphTransformer(GraphTransformerConfig(in_channels=8, num_classes=3, dim=16, num_heads=2, depth=2))
    ns = run(snippet("docs/tutorials/modern_parts.rst", "from diffusionformer.data import neighbor_loader"),
             data=data, train_idx=torch.arange(50), model=model, F=F)
    assert ns["out"].shape == (50, 3) and torch.isfinite(ns["loss"])
