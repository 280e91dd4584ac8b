"""Follow-ups of an earlier probe: publishing atomically, PyG under ``python -W error``, the command line's error
lines for a broken install, and the Triton version the messages, extras and docs ask for.

Found and fixed (tests named ``test_bug_...``):

- ``publish``: the comparison's files replaced the published folder before the page was made: a failure making the
  page (a table, a figure, a broken install) left the new files next to the old page (or, published for the first
  time, files without a page), and an index whose toctree is not closed was refused only after both were replaced.
- PyG's import gives a ``DeprecationWarning`` (``torch.jit.script`` is deprecated) from torch: with ``python -W
  error`` every graph model, PE transform and graph dataset failed at our lazy import of PyG.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("scipy")

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (never a fork), with the repository on the path and one thread."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, env=full,
                          timeout=600, cwd=ROOT)


# ----------------------------------------------------------------------------- publish: page and files together
def _study(out: Path, shift: float):
    from diffusionformer.experiments import load_experiment_config
    from diffusionformer.experiments.outputs import write_outputs
    from diffusionformer.experiments.results import RunResult

    cfg = load_experiment_config({"name": "probe", "seeds": [0, 1, 2], "operators": [{"name": "base"}, {"name": "x"}],
                                  "tasks": [{"name": "d", "dataset": "digits", "model": "vit-digits",
                                             "train": {"max_steps": 2}}]})
    runs = [RunResult("d", op, s, "completed", "test_acc", v, {"test_acc": v}, 10, 1.0)
            for op, base in (("base", 0.6), ("x", 0.7)) for s in range(3) for v in [base + shift + 0.01 * s]]
    (out / "probe").mkdir(parents=True, exist_ok=True)
    write_outputs(out / "probe", cfg, runs)
    return cfg


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def _boom(*args, **kwargs):
    raise RuntimeError("injected failure")


@pytest.mark.parametrize("where,first", [(w, False) for w in ("format_table", "aggregate", "_image", "_kept_tail",
                                                                 "write_text_atomic", "_copy_files")]
                         + [(w, True) for w in ("format_table", "_image", "write_text_atomic")])
def test_bug_publish_failure_after_the_copy_keeps_page_and_files(tmp_path, monkeypatch, where, first):
    """Bug: ``publish_experiment`` replaced the published folder with the new copy, then made the page: a failure
    making it (``format_table``, ``aggregate``, a figure line) left the new files next to the old page (or, on a
    first publish, files without their page). Now the page is made from the staged copy before anything is replaced,
    and a failure writing it puts the earlier folder back: the docs folder is byte-identical to before, with no
    ``.publishing`` / ``.previous`` folder left."""
    import diffusionformer.experiments.publish as P

    out, docs = tmp_path / "res", tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# R\n\n```{toctree}\n\n```\n")
    cfg = _study(out, 0.0)
    if not first:
        P.publish_experiment(cfg, out, docs)
        (docs / "probe.md").write_text((docs / "probe.md").read_text() + "\n" + P.READING_MARKER + "\nmine\n")
        _study(out, 0.1)  # new results: the page and results.json would change
    before = _snapshot(docs)
    monkeypatch.setattr(P, where, _boom)
    with pytest.raises(RuntimeError, match="injected"):
        P.publish_experiment(cfg, out, docs)
    assert _snapshot(docs) == before
    monkeypatch.undo()
    page = P.publish_experiment(cfg, out, docs)  # and the next publish works
    assert page.is_file() and (docs / "probe" / "results.json").is_file()
    assert sorted(p.name for p in docs.iterdir()) == ["index.md", "probe", "probe.md"]


def test_bug_publish_refuses_an_unclosed_toctree_before_copying(tmp_path):
    """Bug: an ``index.md`` whose toctree is not closed was refused (``ValueError``) only after the new files and
    page had replaced the published ones. Now it is refused before anything is copied."""
    from diffusionformer.experiments.publish import publish_experiment

    out, docs = tmp_path / "res", tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# R\n\n```{toctree}\n\nother\n")
    cfg = _study(out, 0.0)
    before = _snapshot(docs)
    with pytest.raises(ValueError, match="closing"):
        publish_experiment(cfg, out, docs)
    assert _snapshot(docs) == before


def test_pins_publish_in_place_failure_keeps_the_page(tmp_path, monkeypatch):
    """Regenerating a page from the published files (``--out docs --to docs``): a failure making the page leaves the
    docs folder as it was."""
    import diffusionformer.experiments.publish as P

    out, docs = tmp_path / "res", tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# R\n\n```{toctree}\n\n```\n")
    cfg = _study(out, 0.0)
    P.publish_experiment(cfg, out, docs)
    before = _snapshot(docs)
    monkeypatch.setattr(P, "format_table", _boom)
    with pytest.raises(RuntimeError, match="injected"):
        P.publish_experiment(cfg, docs, docs)
    assert _snapshot(docs) == before


# ----------------------------------------------------------------------------- PyG under python -W error
def test_bug_graph_models_work_under_warnings_as_errors():
    """Bug: PyG's import warns that ``torch.jit.script`` is deprecated (a ``DeprecationWarning`` from torch, at
    PyG's own import): under ``python -W error`` our first (lazy) import of PyG raised it, so no graph model, PE
    transform or graph loader could be used. Now PyG is imported through one helper that silences exactly that
    warning; a user's other warnings are still errors."""
    code = (
        "import sys, warnings, torch\n"
        "from diffusionformer.models import (GCN, GCNConfig, GIN, GINConfig, DiffusionGraphTransformer,\n"
        "                                    GraphTransformerConfig, positional_encoding_transform)\n"
        "assert 'torch_geometric' not in sys.modules\n"
        "ei = torch.tensor([[0, 1, 2, 1, 2, 0, 3, 4], [1, 2, 0, 0, 1, 2, 4, 3]])\n"
        "x, batch = torch.randn(5, 4), torch.tensor([0, 0, 0, 1, 1])\n"
        "cfg = GraphTransformerConfig(in_channels=4, num_classes=2, task='graph', pe='random_walk', pe_dim=3)\n"
        "torch.manual_seed(0)\n"
        "model = DiffusionGraphTransformer(cfg)\n"
        "pe = positional_encoding_transform(cfg)\n"
        "from torch_geometric.data import Data  # PyG is imported by now (a user's own first import would warn)\n"
        "d = pe(Data(x=x, edge_index=ei, num_nodes=5))\n"
        "print(model(x, ei, batch=batch, pe=d.pe).shape)\n"
        "print(GCN(GCNConfig(in_channels=4, task='graph'))(x, ei, batch).shape)\n"
        "print(GIN(GINConfig(in_channels=4, task='graph'))(x, ei, batch).shape)\n"
        "from diffusionformer.graph import from_pyg\n"
        "from_pyg(d)\n"
        "try:\n"
        "    warnings.warn('mine', DeprecationWarning)\n"
        "except DeprecationWarning:\n"
        "    print('still an error')\n"
    )
    done = _run(code, "-W", "error")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:4] == ["torch.Size([2, 2])"] * 3 + ["still an error"], done.stdout


def test_pins_pyg_warning_silenced_by_message_only():
    """The helper silences only the ``torch.jit.script`` deprecation: another ``DeprecationWarning`` raised while
    PyG is imported still surfaces, and the filters are as before afterwards."""
    code = (
        "import warnings, sys, torch\n"
        "from diffusionformer._imports import _import_pyg\n"
        "before = list(warnings.filters)\n"
        "_import_pyg()\n"
        "assert 'torch_geometric' in sys.modules and warnings.filters == before\n"
        "try:  # the same warning from the user's own code, later: still an error\n"
        "    warnings.warn('`torch.jit.script` is deprecated. Please switch', DeprecationWarning)\n"
        "except DeprecationWarning:\n"
        "    print('ok')\n"
    )
    done = _run(code, "-W", "error")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_bug_show_graph_study_under_warnings_as_errors():
    """Bug: ``python -W error -m diffusionformer.experiments show experiments/configs/study_graph.toml`` reported
    "dataset 'mutag' does not load: DeprecationWarning: `torch.jit.script` is deprecated" (and cora, proteins): the
    check of the staged data failed at PyG's import. Needs the staged data (``DIFFUSIONFORMER_DATA``)."""
    data = os.environ.get("DIFFUSIONFORMER_DATA")
    if not data or not (Path(data) / "tudataset").is_dir():
        pytest.skip("the staged data (DIFFUSIONFORMER_DATA) is not here")
    done = subprocess.run([sys.executable, "-W", "error", "-m", "diffusionformer.experiments", "show",
                           "experiments/configs/study_graph.toml"], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "does not load" not in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]


# ----------------------------------------------------------------------------- the command line's error lines
_TINY = """name = "tiny"
seeds = [0]
[[operators]]
name = "attention"
[[tasks]]
name = "digits"
dataset = "digits"
model = "vit-digits"
train = {max_steps = 1}
"""


@pytest.mark.parametrize("exc,line", [
    (ImportError("libpyg.so: undefined symbol: _ZN3c10", name="torch_geometric"), True),
    (ImportError("cannot import name 'x' from 'numpy'"), True),
    (ModuleNotFoundError("No module named 'scipy'", name="scipy"), True),
    (ImportError("cannot import name 'gone' from 'diffusionformer.ops'", name="diffusionformer.ops"), False),
])
def test_bug_broken_install_is_one_error_line(tmp_path, monkeypatch, capsys, exc, line):
    """Bug: the command line reported a missing package (``ModuleNotFoundError``) as one ``error:`` line with exit
    status 2, but another ``ImportError`` (a package installed but broken: a compiled extension built for another
    torch, a half-upgraded numpy) as a traceback. Now any ``ImportError`` of a third party is one line, exit 2; one
    naming a module of this package (a bug of ours) keeps its traceback."""
    from diffusionformer.experiments import runner
    from diffusionformer.experiments.cli import main

    def run_experiment(*args, **kwargs):
        raise exc

    monkeypatch.setattr(runner, "run_experiment", run_experiment)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(_TINY)
    if line:
        assert main(["run", "tiny.toml", "--out", str(tmp_path / "out"), "--no-progress"]) == 2
        assert capsys.readouterr().err.endswith(f"error: {exc}\n")
    else:
        with pytest.raises(ImportError, match="gone"):
            main(["run", "tiny.toml", "--out", str(tmp_path / "out"), "--no-progress"])


def test_pins_interrupt_still_exit_130(tmp_path, monkeypatch, capsys):
    """Ctrl-C during a run stays one line and exit status 130 (not caught as an error)."""
    from diffusionformer.experiments import runner
    from diffusionformer.experiments.cli import main

    def run_experiment(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_experiment", run_experiment)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(_TINY)
    assert main(["run", "tiny.toml", "--out", str(tmp_path / "out"), "--no-progress"]) == 130
    assert "interrupted" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the triton version asked for
def _dev_triton_spec() -> str:
    import re

    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    (dev,) = re.findall(r"^dev = \[(.*)\]$", text, re.M)
    (spec,) = re.findall(r"\"(triton[<>=!~][^;\"]*)", dev)
    return spec.strip()


def test_bug_triton_version_asked_agrees_everywhere(monkeypatch):
    """Bug: the messages of a call that needs triton said ``pip install 'triton>=3.3'`` (and the docs page too),
    while the dev extra asked ``triton>=3.7``: neither the truth. The kernels are known to run with 3.6 (the GPU
    image's torch 2.11, whose CUDA wheels pin triton 3.6.0, so ``pip install -e '.[dev]'`` there conflicted with
    torch's own pin); only 3.6's *interpreter* fails, with numpy >= 2.4 (the CPU tests skip saying so). Now the
    extra, both messages and the docs page ask ``triton>=3.6``."""
    from diffusionformer.ops.triton import _launch

    spec = _dev_triton_spec()
    assert spec == "triton>=3.6", spec  # not above the GPU image's triton 3.6
    assert _launch._TRITON_PIP == f"pip install '{spec}'"
    from diffusionformer.ops.triton import backend

    monkeypatch.setattr("diffusionformer.ops.triton.is_available", lambda: False)
    q = torch.zeros(1, 1, 2, 4)
    assert f"pip install '{spec}'" in backend.triton_unsupported(q, q, q, None, False)
    assert f"pip install '{spec}'" in (ROOT / "docs" / "api" / "triton.rst").read_text(encoding="utf-8")


def test_bug_triton_missing_message_names_the_version(monkeypatch):
    """Bug: a kernel called without triton said ``pip install 'triton>=3.3'``, a version never tested (and below the
    dev extra's); now the same requirement as the dev extra."""
    pytest.importorskip("triton")
    from diffusionformer.ops.triton import _kernels, _launch

    monkeypatch.setattr(_kernels, "HAS_TRITON", False)
    with pytest.raises(ImportError, match=r"pip install 'triton>=3\.6' on Linux"):
        _launch._kernels_module()
