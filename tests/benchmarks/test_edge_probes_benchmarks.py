"""Edge-case probes of the benchmark scripts' command lines and of the Triton kernels on CPU (``TRITON_INTERPRET=1``).

Probed: ``gpu_suite.sh``'s options and ``GPU_SUITE_STEPS`` (a stand-in python, as in ``test_gpu_suite_smoke.py``);
``_common.parse_args`` / ``Report`` (``--out`` a file, the command written with the tables); ``run_all.py``'s
``--only`` / ``--threads`` / ``--out`` / ``--include`` / ``--report-only``; ``affine_attention`` /
``polynomial_attention`` / ``dropout_scales`` on legal-but-unusual input (N = 1, H = 1, B = 0, N = 0, head sizes
1, 3 and 20 against the interpreter's 16-wide blocks, non-contiguous and stride-0 inputs, causal + padding + bool
mask with fully masked rows, float masks with ``-inf`` rows, bf16 / fp16 with fully masked rows, numpy numbers,
meta tensors), each against an explicit float64 softmax matrix (forward and gradients).

Found and fixed (tests marked "Bug:"):

* ``gpu_suite.sh``: a misspelt step in ``GPU_SUITE_STEPS`` ran nothing for it and exited 0; ``--issue15 --smoke``
  took ``--smoke`` for OUT_DIR and started the GPU path; a misspelt option (``--smok``) was taken for OUT_DIR.
* ``--out`` naming a file: every script measured its first table and then died with a FileExistsError (the
  measurements lost); ``run_all.py`` likewise, with a traceback.
* ``run_all.py --only bench_dens`` ran the rest and recorded a failed script; ``--only`` with no names ran the whole
  suite; ``--threads 0`` silently meant all cores and ``--threads -1`` was a bare RuntimeError of torch;
  ``--include`` of a folder without README.md crashed only after the whole suite had run; ``--report-only`` on a
  folder without ``run_all.json`` was a FileNotFoundError traceback.
* The command written with the tables left out ``--rounds``, so it did not rerun what was measured.
* ``bench_triton_blocks.py --sizes 0 0`` swept a size twice and counted it twice in its summary (``check_indices``
  now refuses an index given twice).
* ``affine_attention`` refused a numpy float32 coefficient ("got float32"); ``dropout_scales`` refused numpy ints
  ("must be a positive int, got np.int64(2)"); meta tensors under the interpreter failed with a NotImplementedError
  from a copy instead of the kernels' own device error.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _common as C  # noqa: E402
import run_all  # noqa: E402

SUITE = BENCH / "gpu_suite.sh"
STUB = """#!/usr/bin/env bash
# a stand-in python: logs its arguments, answers every check (CUDA visible, xdist and triton import)
echo "$*" >> "$STUB_LOG"
exit 0
"""
needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash, timeout")


def _suite(tmp_path: Path, *args: str, steps: str | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log = tmp_path / "calls.txt"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_SUITE_", "BENCH_ISSUE15_ARGS"))}
    env.update(PYTHON=str(stub), STUB_LOG=str(log))
    if steps is not None:
        env["GPU_SUITE_STEPS"] = steps
    res = subprocess.run(["bash", str(SUITE), *args], env=env, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    calls = log.read_text().splitlines() if log.exists() else []
    return res, [c for c in calls if "benchmarks/" in c or "tests/ops" in c]


# ---------------------------------------------------------------------------- gpu_suite.sh
@needs_bash
@pytest.mark.parametrize("smoke", [True, False], ids=["smoke", "gpu"])
def test_gpu_suite_unknown_step_is_refused_before_anything_runs(tmp_path, smoke):
    """Bug: ``GPU_SUITE_STEPS=host,memroy`` silently skipped the misspelt step and exited 0 (a GPU call spent on
    half the work); now exit 2 naming the step and the valid ones, nothing started."""
    args = ["--smoke"] if smoke else ["--issue15"]
    res, calls = _suite(tmp_path, *args, str(tmp_path / "out"), steps="host,memroy")
    assert res.returncode == 2
    assert "unknown step 'memroy'" in res.stderr and "memory" in res.stderr
    assert calls == []


@needs_bash
def test_gpu_suite_issue15_and_smoke_in_either_order(tmp_path):
    """Bug: ``--issue15 --smoke OUT`` took ``--smoke`` for OUT_DIR and went down the GPU path (``mkdir -p --smoke``);
    now both orders are the CPU smoke run into OUT."""
    res, calls = _suite(tmp_path, "--issue15", "--smoke", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    assert len(calls) == 1 and "benchmarks/bench_issue15.py --smoke --device cpu" in calls[0]
    assert f"--out {tmp_path / 'out'}" in calls[0]


@needs_bash
@pytest.mark.parametrize("args, message", [
    (["--smok"], "unknown option '--smok'"),
    (["--smoke", "a", "b"], "one OUT_DIR at most"),
])
def test_gpu_suite_bad_options_are_refused(tmp_path, args, message):
    """Bug: a misspelt option was taken for OUT_DIR (the GPU path started with ``OUT=--smok``) and a second OUT_DIR
    was silently ignored."""
    res, calls = _suite(tmp_path, *args)
    assert res.returncode == 2 and message in res.stderr
    assert calls == []


@needs_bash
def test_gpu_suite_empty_items_in_the_steps_are_skipped(tmp_path):
    """A trailing or doubled comma in ``GPU_SUITE_STEPS`` is not a step name: the named steps run, in order."""
    res, calls = _suite(tmp_path, "--issue15", str(tmp_path / "out"), steps="tests,,issue15,")
    assert res.returncode == 0, res.stderr
    assert [next(w for w in c.split() if w.startswith(("benchmarks/", "tests/"))) for c in calls] == [
        "tests/ops", "benchmarks/bench_issue15.py"]


# ---------------------------------------------------------------------------- _common
def test_out_that_is_a_file_is_a_usage_error_before_any_work(tmp_path, monkeypatch, capsys):
    """Bug: ``bench_dense.py --out results.md`` (a file) measured its first table and then failed with a
    FileExistsError from ``mkdir``, losing the measurement; now a usage error up front."""
    monkeypatch.setattr(C, "setup_threads", lambda n: pytest.fail("threads set up for a bad command line"))
    target = tmp_path / "results.md"
    target.write_text("keep me")
    with pytest.raises(SystemExit) as e:
        C.parse_args("t", ["--device", "cpu", "--out", str(target)])
    assert e.value.code == 2
    assert "--out" in capsys.readouterr().err
    assert target.read_text() == "keep me"


def test_out_folder_is_made_and_the_command_written_reruns_the_rounds(tmp_path, monkeypatch):
    """Bug: the command written with the tables dropped ``--rounds`` (a ``--rounds 3`` run claimed the default
    rounds). A nested ``--out`` that does not exist yet is made."""
    info = {"cpu": "c", "cores": 1, "torch_threads": 1, "torch": "t", "device": "cpu", "clock": "wall",
            "loadavg_1min": 0.0}
    monkeypatch.setattr(C, "machine_info", lambda *a, **k: info)  # importing PyG for it takes seconds
    out = tmp_path / "a" / "b"
    args = C.parse_args("t", ["--device", "cpu", "--threads", "1", "--rounds", "3", "--out", str(out)])
    assert out.is_dir()
    rep = C.Report("bench_x", "X", args)
    rep.table("t", ["a"], [[1.0]])
    assert rep.command() == "python benchmarks/bench_x.py --device cpu --threads 1 --rounds 3"
    assert "--rounds 3" in (out / "bench_x.md").read_text()
    default = C.Report("bench_x", "X", C.parse_args("t", ["--device", "cpu", "--threads", "1", "--out", str(out)]))
    assert default.command() == "python benchmarks/bench_x.py --device cpu --threads 1"


def test_a_size_index_given_twice_is_refused_before_any_work(tmp_path, monkeypatch):
    """Bug: ``bench_triton_blocks.py --sizes 0 0`` swept size 0 twice (its GPU time again) and counted it twice in
    the summary's geometric mean over sizes; now a SystemExit naming the index, nothing written."""
    import bench_triton_blocks as TB

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(TB, "run_job", lambda *a, **k: pytest.fail("work started"), raising=False)
    with pytest.raises(SystemExit, match=r"--sizes names \[0\] more than once"):
        TB.main(["--device", "cpu", "--threads", "1", "--sizes", "0", "1", "0", "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())
    C.check_indices("s", "--sizes", [2, 0, 1], [10, 20, 30], "all")  # distinct indices in any order pass


# ---------------------------------------------------------------------------- run_all.py
@pytest.fixture
def no_subprocess(monkeypatch):
    """run_all.main must refuse before it starts any benchmark."""
    monkeypatch.setattr(run_all.subprocess, "call", lambda *a, **k: pytest.fail(f"a benchmark was started: {a}"))
    monkeypatch.setattr(C, "setup_threads", lambda n: pytest.fail("threads set up for a bad command line"))


@pytest.mark.parametrize("argv, message", [
    (["--only", "bench_dens"], "unknown benchmark 'bench_dens'; did you mean 'bench_dense'?"),
    (["--only", "bench_dense.py"], "did you mean 'bench_dense'?"),
    (["--only"], "--only was given without names"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--threads", "-1"], "--threads must be >= 1, got -1"),
])
def test_run_all_bad_selection_is_refused_up_front(argv, message, tmp_path, no_subprocess, capsys):
    """Bug: ``--only bench_dens`` ran the other names and recorded a failed script; ``--only`` with no names (an
    empty expansion) ran the whole 10-15 min suite; ``--threads 0`` silently meant all cores and ``--threads -1``
    was a bare RuntimeError of torch. Now usage errors before any benchmark."""
    with pytest.raises(SystemExit) as e:
        run_all.main([*argv, "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_run_all_out_file_and_missing_include_are_refused_up_front(tmp_path, no_subprocess, capsys):
    """Bug: ``--include other_run`` without ``other_run/README.md`` crashed with a FileNotFoundError only after the
    whole suite had run (no README.md for it); ``--out`` a file was a FileExistsError traceback."""
    (tmp_path / "other").mkdir()
    with pytest.raises(SystemExit):
        run_all.main(["--out", str(tmp_path / "out"), "--include", str(tmp_path / "other")])
    assert "--include: no README.md in" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        run_all.main(["--out", str(tmp_path / "file")])
    assert "--out" in capsys.readouterr().err


def test_run_all_report_only_without_a_run_is_a_usage_error(tmp_path, capsys):
    """Bug: ``--report-only`` on a folder without ``run_all.json`` was a FileNotFoundError traceback."""
    with pytest.raises(SystemExit) as e:
        run_all.main(["--report-only", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "no run_all.json" in capsys.readouterr().err


def test_run_all_report_only_rebuilds_a_committed_cuda_run(tmp_path):
    """A results folder of the committed CUDA run rebuilds its README with every table and the GPU named."""
    src = BENCH / "results-cuda"
    for f in src.iterdir():
        if f.suffix in (".md", ".json"):
            shutil.copy(f, tmp_path / f.name)
    assert run_all.main(["--report-only", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    for name in ("bench_dense", "bench_kstep", "bench_sparse"):
        assert (src / f"{name}.md").read_text().split("\n", 1)[0] in text  # its title, a level-2 heading
    assert "GPU " in text and "notes below were written about the CPU results" in text


# ---------------------------------------------------------------------------- Triton kernels under the interpreter
@pytest.fixture
def triton_ops(monkeypatch):
    """``diffusionformer.ops.triton`` with its kernels interpreted (CPU); skipped without triton."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    if torch.cuda.is_available():
        pytest.skip("the interpreter probes are for CPU machines")
    import numpy
    import triton

    def version(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("+")[0].split(".")[:2] if p.isdigit())

    if version(triton.__version__) < (3, 7) and version(numpy.__version__) >= (2, 4):
        pytest.skip("this triton's interpreter fails with this numpy")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from diffusionformer.ops.triton import _kernels

    if type(_kernels._first_step).__name__ != "InterpretedFunction":
        importlib.reload(_kernels)
    import diffusionformer.ops.triton as ops

    return ops


def _reference(q, k, v, coeffs, is_causal=False, pad=None, mask=None):
    """sum_j c[h, j] P^j v with the explicit float64 softmax matrix; a row with no admissible key is a zero row."""
    q, k, v, coeffs = (t.double() for t in (q, k, v, coeffs))
    B, H, N, Cd = q.shape
    keep = torch.ones(B, 1, N, N, dtype=torch.bool)
    if is_causal:
        keep = keep & torch.ones(N, N, dtype=torch.bool).tril()
    if pad is not None:
        keep = keep & ~pad[:, None, None, :]
    if mask is not None:
        keep = keep & mask
    s = (q @ k.transpose(-2, -1) / Cd**0.5).masked_fill(~keep, -1e300)
    e = torch.exp(s - s.amax(-1, keepdim=True)) * keep
    P = e / e.sum(-1, keepdim=True).clamp_min(1e-300)
    out, y = coeffs[:, 0].view(1, H, 1, 1) * v, v
    for j in range(1, coeffs.shape[1]):
        y = P @ y
        out = out + coeffs[:, j].view(1, H, 1, 1) * y
    return out


def _leaves(*shape, n=3, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(dtype).requires_grad_() for _ in range(n)]


def _check_grads(ops, q, k, v, c, tol, is_causal=False, pad=None, mask=None):
    """Output and the gradients of q, k, v and c against the float64 reference."""
    out = ops.polynomial_attention(q, k, v, c, is_causal=is_causal, key_padding_mask=pad, attn_mask=mask)
    torch.testing.assert_close(out.double(), _reference(q, k, v, c, is_causal, pad, mask), rtol=tol, atol=tol)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(out.dtype)
    got = torch.autograd.grad(out, (q, k, v, c), go)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, c)]
    want = torch.autograd.grad(_reference(*leaves, is_causal, pad, mask), leaves, go.double())
    for name, a, b in zip("qkvc", got, want):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("B,H,N,Cd,causal", [
    (1, 1, 1, 4, False),  # one token: P = [[1]]
    (2, 1, 1, 4, True),
    (1, 2, 5, 3, True),  # head size 3, padded to the 16-wide block
    (1, 1, 5, 1, False),  # head size 1
    (1, 1, 7, 20, True),  # head size above one block, not a power of two
], ids=["N1", "N1-causal", "C3", "C1", "C20"])
def test_odd_sizes_match_float64_forward_and_backward(triton_ops, B, H, N, Cd, causal):
    q, k, v = _leaves(B, H, N, Cd)
    c = torch.randn(H, 3, generator=torch.Generator().manual_seed(1)).requires_grad_()
    _check_grads(triton_ops, q, k, v, c, 1e-5, is_causal=causal)


def test_empty_batch_and_empty_sequence_give_empty_outputs_and_gradients(triton_ops):
    c = torch.randn(2, 3).requires_grad_()
    for shape in [(0, 2, 5, 4), (1, 2, 0, 4)]:
        q, k, v = _leaves(*shape)
        out = triton_ops.polynomial_attention(q, k, v, c)
        assert out.shape == shape
        gq, gk, gv, gc = torch.autograd.grad(out.sum(), (q, k, v, c))
        assert gq.shape == gk.shape == gv.shape == shape
        assert torch.equal(gc, torch.zeros_like(c))


def test_masks_with_fully_masked_rows_match_float64(triton_ops):
    """causal + key padding + a bool attn_mask with rows left without any key: zero rows of P, finite gradients."""
    q, k, v = _leaves(2, 2, 6, 4, seed=3)
    c = torch.tensor([[0.2, 1.0, -0.5], [1.0, -1.0, 0.3]], requires_grad=True)
    mask = torch.rand(2, 2, 6, 6, generator=torch.Generator().manual_seed(4)) > 0.5
    mask[0, 0, 2] = False
    mask[1, 1] = False  # a whole head without keys
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, :2] = True
    _check_grads(triton_ops, q, k, v, c, 1e-5, is_causal=True, pad=pad, mask=mask)


def test_float_mask_with_minus_inf_rows_and_non_contiguous_stride0_inputs(triton_ops):
    g = torch.Generator().manual_seed(5)
    base = torch.randn(1, 5, 2, 8, generator=g)
    q, k = base[..., :4].transpose(1, 2), base[..., 4:].transpose(1, 2)  # (B, N, H, C) storage, sliced
    v = torch.randn(1, 1, 5, 4, generator=g).expand(1, 2, 5, 4)  # stride 0 over heads
    c = torch.randn(2, 3, generator=g)
    fm = torch.zeros(1, 2, 5, 5)
    fm[0, 0, 3] = -float("inf")
    fm[..., 0] = -float("inf")
    out = triton_ops.polynomial_attention(q, k, v, c, attn_mask=fm)
    torch.testing.assert_close(out.double(), _reference(q, k, v, c, mask=torch.isfinite(fm)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 3e-2), (torch.float16, 4e-3)], ids=["bf16", "fp16"])
def test_half_precision_with_fully_masked_rows(triton_ops, dtype, tol):
    """Leading padding with ``is_causal``: rows 0..1 of batch 1 have no key; outputs and gradients stay finite and
    in the input dtype, close to float64 of the rounded inputs."""
    q, k, v = _leaves(2, 1, 5, 6, dtype=dtype, seed=6)
    c = torch.tensor([[0.5, 1.0, -0.3]])
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, :2] = True
    out = triton_ops.polynomial_attention(q, k, v, c, is_causal=True, key_padding_mask=pad)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), _reference(q, k, v, c, True, pad), rtol=tol, atol=tol)
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(g.dtype == dtype and torch.isfinite(g).all() for g in grads)


def test_numpy_numbers_are_numbers(triton_ops):
    """Bug: ``affine_attention(q, k, v, np.float32(0), np.float32(1))`` was a TypeError "c0 must be a float ...,
    got float32", and ``dropout_scales(seed, np.int64(2), ...)`` a ValueError "batch_size must be a positive int,
    got np.int64(2)" (numpy numbers from a sweep)."""
    q, k, v = _leaves(1, 2, 5, 4, seed=7)
    out = triton_ops.affine_attention(q, k, v, np.float32(1.0), np.float32(-1.0))  # the Laplacian head
    c = torch.tensor([[1.0, -1.0]] * 2)
    torch.testing.assert_close(out.double(), _reference(q, k, v, c), rtol=1e-5, atol=1e-5)
    seed = torch.tensor([3])
    numpy_scales = triton_ops.dropout_scales(seed, np.int64(2), np.int32(1), np.int64(3), np.int8(2), 0.25)
    assert torch.equal(numpy_scales, triton_ops.dropout_scales(seed, 2, 1, 3, 2, 0.25))
    with pytest.raises(TypeError, match="c0 must be a float"):
        triton_ops.affine_attention(q, k, v, True, 1.0)  # a bool is still not a coefficient


def test_meta_tensors_get_the_kernels_device_error(triton_ops):
    """Bug: meta tensors under the interpreter failed with "NotImplementedError: Cannot copy out of meta tensor"
    from inside a launch; now the kernels' RuntimeError naming the device."""
    q = torch.zeros(1, 1, 2, 4, device="meta")
    with pytest.raises(RuntimeError, match="got a meta tensor"):
        triton_ops.affine_attention(q, q, q, 0.0, 1.0)
