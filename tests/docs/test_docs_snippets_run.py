"""Run the docs' Python blocks that the Sphinx build does not execute.

Plain ```python fences (README) and ``.. code-block:: python`` blocks are shown, not run, by the
docs build; each test here finds one such block by its first line, takes its body and execs it
in a small context, so the snippet fails here when the API it shows changes.
"""
from __future__ import annotations

import os
import subprocess
import sys
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


def test_pins_ssl_tutorial_build_tasksnippet():
    """The SSL tutorial's ``build_task(data, dino, ssl=SSLConfig(...))`` block runs, and its claim holds: an
    ``ssl`` given in Python replaces the preset's defaults whole (``blur_sigma`` is SSLConfig's, not the preset's)."""
    from diffusionformer.data.registry import load_dataset
    from diffusionformer.data.ssl import SSLConfig
    from diffusionformer.models import create_model

    dino = create_model("dino-digits", schedule_steps=600)
    assert tuple(dino.task_config.blur_sigma) == (0.1, 0.6)
    ns: dict = {"data": load_dataset("digits"), "dino": dino}
    exec(compile(snippet("docs/tutorials/ssl.rst", "from diffusionformer.data.ssl import SSLConfig"),  # noqa: S102
                 "<ssl.rst>", "exec"), ns)
    ssl = ns["task"].ssl
    assert (ssl.local_crops, ssl.knn_k) == (2, 10)
    assert tuple(ssl.blur_sigma) == tuple(SSLConfig().blur_sigma) == (0.1, 1.0)


def test_pins_readme_load_runsnippet(tmp_path):
    """The README's ``create_model`` / ``load_run`` block runs as shown on a finished run of the main job's
    layout (``results/default/runs/digits/laplacian-half/seed0``, a 4-step run): an eval-mode ViT, its
    ``ViTConfig`` and the metric records."""
    code = snippet("README.md", "from diffusionformer import create_model, load_run")
    script = textwrap.dedent(f"""
        import contextlib, io
        from diffusionformer.experiments.cli import main
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            rc = main(["run", {str(ROOT / "experiments/configs/default.toml")!r}, "--set", "seeds=[0]",
                       "--set", "tasks=digits", "--set", "operators=laplacian-half",
                       "--set", "tasks.digits.train.max_steps=4", "--set", "tasks.digits.train.warmup_steps=0",
                       "--out", "results", "--no-progress", "--threads", "1"])
        assert rc == 0, rc
    """) + code + textwrap.dedent("""
        assert type(gpt).__name__ == "DiffusionGPT", type(gpt)
        assert type(run.model).__name__ == "DiffusionViT" and not run.model.training
        assert type(run.config).__name__ == "ViTConfig" and isinstance(run.metrics, list) and run.metrics
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
