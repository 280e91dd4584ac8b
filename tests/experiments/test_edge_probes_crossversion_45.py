"""Results and checkpoints crossing torch versions (edge probes, 45): the GPU study's workflow, where a GPU call
(torch 2.11) trains part of a comparison and this machine (another torch) resumes, reports and publishes it.

Probed by hand with two interpreters (torch 2.11 and 2.13 on CPU): a run killed under 2.11 resumed under 2.13 and
one killed under 2.13 resumed under 2.11 end bit-identical to the resume under the version that started them (the
checkpoints, their optimiser, generators and loop state load with ``weights_only=True`` either way); ``status``,
``summary``, ``analyze`` and ``publish`` read the other version's folders. Found: the comparison's record of which
torch (and GPU) trained it kept the last invocation's only; ``analyze`` of a GPU call's results (packed without
checkpoints) advised ``--restart``, which discards every run, and ``--partial`` refused them too. The cross-interpreter test here skips without
``/work/venv211`` (or ``$DIFFUSIONFORMER_OTHER_TORCH_PYTHON``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffusionformer.experiments.cli import main
from experiments_tiny_configs import TINY_DIGITS_TOML

_OTHER = os.environ.get("DIFFUSIONFORMER_OTHER_TORCH_PYTHON", "/work/venv211/bin/python")
_REPO = str(Path(__file__).resolve().parents[2])


_GPU_TORCH, _GPU = "2.11.0+cu130", "NVIDIA H100 80GB HBM3"


def _as_a_gpu_call(manifest: Path) -> None:
    """Rewrite ``manifest.json`` as a GPU call's invocation (torch 2.11, an H100) would have written it."""
    record = json.loads(manifest.read_text(encoding="utf-8"))
    record["torch"], record["cuda"] = _GPU_TORCH, _GPU
    for many, one in (("torch_versions", _GPU_TORCH), ("cuda_devices", _GPU)):
        if many in record:
            record[many] = [one]
    manifest.write_text(json.dumps(record), encoding="utf-8")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Seed 0 of the tiny comparison trained by a "GPU call" (its manifest rewritten so), seed 1 here, published:
    (manifest, what the second ``run`` said, the page's lines, what a re-run of the finished runs said)."""
    tmp = tmp_path_factory.mktemp("mixed")
    cfg = tmp / "tiny.toml"
    cfg.write_text(TINY_DIGITS_TOML.replace("seeds = [0]", "seeds = [0, 1]"), encoding="utf-8")
    out = tmp / "results"
    import contextlib
    import io
    said = io.StringIO()
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", str(cfg), "--out", str(out), "--no-progress", "--set", "seeds=[0]"]) == 0
    _as_a_gpu_call(out / "tiny" / "manifest.json")
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
        assert main(["run", str(cfg), "--out", str(out), "--no-progress"]) == 0
    docs = tmp / "docs"
    with contextlib.redirect_stdout(io.StringIO()), pytest.warns(RuntimeWarning, match="toctree"):  # no index.md
        assert main(["publish", str(cfg), "--out", str(out), "--to", str(docs)]) == 0
    page = next(p for p in docs.rglob("*.md") if "**Versions:**" in p.read_text(encoding="utf-8"))
    again = io.StringIO()
    with contextlib.redirect_stderr(again), contextlib.redirect_stdout(again):
        assert main(["run", str(cfg), "--out", str(out), "--no-progress"]) == 0
    record = json.loads((out / "tiny" / "manifest.json").read_text(encoding="utf-8"))
    return record, said.getvalue(), page.read_text(encoding="utf-8").splitlines(), again.getvalue(), cfg, out


def test_bug_a_comparison_trained_under_two_torch_versions_names_both(mixed):
    """Bug: ``manifest.json`` keeps every git commit (``git_commits``) and CPU kernel set (``cpu_kernel_sets``) that
    trained a comparison, but its ``torch`` held only the last ``run`` invocation's version: seed 0 trained by a GPU
    call under torch 2.11, seed 1 here under 2.13, and the manifest said 2.13 alone, ``run`` said nothing about the
    change (it notes a change of CPU kernel set), and ``publish`` printed ``Versions: torch 2.13`` for a table whose
    rows mix the two versions (a seed's numbers differ across them: seen by hand, lap seed 1 trained under 2.11 and
    2.13 ended at another test accuracy)."""
    record, said, lines, again, _, _ = mixed
    assert record["torch"] == torch.__version__
    assert record.get("torch_versions") == [_GPU_TORCH, torch.__version__], record
    assert f"torch {_GPU_TORCH}" in said and "manifest.json lists both" in said, said
    line = next(x for x in lines if "**Versions:**" in x)
    assert _GPU_TORCH in line and torch.__version__ in line and "2 torch versions" in line, line
    assert "torch versions" not in again  # a re-run of finished runs trains nothing and says nothing


def test_bug_a_comparison_partly_trained_on_a_gpu_names_the_gpu(mixed):
    """Bug: the manifest's ``cuda`` held the last invocation's GPU only: seeds trained by a GPU call on an H100, the
    rest resumed here on the CPU, and ``publish`` printed ``CUDA: none`` on the Machine line (and the manifest no
    longer named the H100 anywhere)."""
    record, _, lines, _, _, _ = mixed
    assert record.get("cuda_devices") == [_GPU], record
    line = next(x for x in lines if "**Machine:**" in x)
    assert _GPU in line and "CUDA: none" not in line, line


def test_bug_analyze_of_runs_brought_back_without_checkpoints(mixed, tmp_path, capsys):
    """Bug: ``gpu_study.sh`` packs a GPU call's results without ``checkpoint.pt``; here, ``analyze`` of the
    comparison refused its first such run with the advice to ``run ... again with --restart``, which discards every
    run of the comparison (the GPU call's too, whose checkpoints are gone), and ``analyze --partial`` refused alike,
    so not even the runs trained here could be analysed. Now ``--partial`` analyses the runs that have their
    checkpoint and names the others, and the refusal says what ``--restart`` does and how to retrain one run."""
    *_, cfg, out = mixed
    shutil.copytree(out, tmp_path / "results")
    out = tmp_path / "results"
    gone = sorted((out / "tiny" / "runs").glob("*/*/seed0/checkpoint.pt"))  # the GPU call's seed, as packed
    assert len(gone) == 2
    for ckpt in gone:
        ckpt.unlink()
    capsys.readouterr()
    assert main(["analyze", str(cfg), "--out", str(out), "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "seed0" in err and "discards them all" in err and "--partial" in err and "without --restart" in err, err
    with pytest.warns(RuntimeWarning, match="checkpoint.pt is missing"):
        assert main(["analyze", str(cfg), "--out", str(out), "--no-progress", "--partial"]) == 0
    metrics = json.loads((out / "tiny" / "analysis" / "metrics.json").read_text(encoding="utf-8"))
    assert sorted(Path(p).name for p in metrics["skipped_runs"]) == ["seed0", "seed0"], metrics["skipped_runs"]
    assert all(sorted(op["seeds"]) == ["1"] for op in metrics["tasks"]["digits"]["operators"].values()), metrics


_STATES = r'''
import json, sys, torch
from diffusionformer.train.checkpoint import save_checkpoint
from diffusionformer.train.rng import capture_rng_state, restore_rng_state


def states(load, save):
    g = torch.Generator().manual_seed(3)
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    if load:  # the other interpreter's states
        payload = torch.load(load, map_location="cpu", weights_only=True)
        restore_rng_state(payload["rng"], torch.device("cpu"), g)
        m.load_state_dict(payload["model"])
        opt.load_state_dict(payload["optimizer"])
        scaler.load_state_dict(payload["scaler"])
        assert payload["half"].dtype == torch.bfloat16 and payload["half"].tolist() == [1.5, -2.0]
    else:
        torch.manual_seed(5)
        torch.rand(7, generator=g)
        scaler.scale(m(torch.randn(4, 3)).sum()).backward()
        opt.step()
        scaler.update(512.0)
        save_checkpoint(save, {"rng": capture_rng_state(torch.device("cpu"), g), "optimizer": opt.state_dict(),
                               "model": m.state_dict(), "scaler": scaler.state_dict(),
                               "half": torch.tensor([1.5, -2.0], dtype=torch.bfloat16)})
    opt.zero_grad()
    m(torch.randn(4, 3)).sum().backward()
    opt.step()
    return {"torch": torch.__version__, "draws": torch.rand(3, generator=g).tolist() + torch.rand(2).tolist(),
            "weights": [p.tolist() for p in m.parameters()], "scale": scaler.get_scale()}


load, save = sys.argv[1], sys.argv[2]  # "-": none
out = {}
if load != "-":
    out["read"] = states(load, None)
if save != "-":
    out["wrote"] = states(None, save)
print(json.dumps(out))
'''


@pytest.mark.skipif(not os.access(_OTHER, os.X_OK), reason=f"no interpreter with another torch at {_OTHER} "
                    "(set $DIFFUSIONFORMER_OTHER_TORCH_PYTHON)")
def test_pins_generator_optimizer_and_scaler_states_cross_torch_versions(tmp_path):
    """Pin: the states a checkpoint holds (every generator, an AdamW state, a loss scaler, bf16 tensors), written
    under one torch (the GPU image's 2.11, or this one) and restored under the other with ``weights_only=True``,
    continue exactly as under the version that wrote them (next random draws, the next optimiser step)."""
    env = {**os.environ, "PYTHONPATH": _REPO, "OMP_NUM_THREADS": "1"}
    script = tmp_path / "states.py"
    script.write_text(_STATES, encoding="utf-8")

    def call(python, load, save):
        done = subprocess.run([python, str(script), str(load), str(save)], env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    other, here = tmp_path / "other.pt", tmp_path / "here.pt"
    first = call(_OTHER, "-", other)
    second = call(sys.executable, other, here)
    third = call(_OTHER, here, "-")
    assert first["wrote"]["torch"] != second["wrote"]["torch"], "both interpreters run one torch version"
    for wrote, read in ((first["wrote"], second["read"]), (second["wrote"], third["read"])):
        assert (read["draws"], read["weights"], read["scale"]) == (wrote["draws"], wrote["weights"], wrote["scale"])
        assert read["scale"] == 512.0
