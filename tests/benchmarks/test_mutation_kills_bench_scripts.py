"""Tests written in a mutation-testing audit of the benchmark scripts that ``benchmarks/gpu_suite.sh`` runs and
that the earlier audit (``test_mutation_kills_benchmarks.py``) left out: ``bench_triton_blocks.py`` (the Triton
launch-geometry sweep), ``bench_kstep.py`` (K-step back-ends and layers), ``bench_sparse.py`` (sparse attention vs
PyG's ``TransformerConv``), ``bench_memory.py`` and ``bench_compile.py``.

Each test kills a mutant of ``benchmarks/`` that the rest of the suite let through (its docstring names it: file and
mutation) and checks the scripts against independent references: coefficients, budgets, ratios and geometric means
worked by hand, tables whose cells are written out by hand, PyG's ``TransformerConv`` for the sparse layer, and
stand-ins (a fake kernel whose output and gradient depend on the launch geometry in a known way, timings and peaks
given per candidate, a recording ``diffuse``, ``torch.compile`` and ``subprocess.run``), so that no test times
anything or needs a GPU or Triton's interpreter. Mutants judged equivalent are listed, with the reason, at the end of
the file. One test, whose docstring starts with "Bug:", pins a defect fixed here: ``bench_triton_blocks.py --sizes``
with no values swept nothing and succeeded, and an index out of range failed with an IndexError (a negative one
silently picked a size from the end). CPU only, deterministic, no network; files only under ``tmp_path``.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _common as C  # noqa: E402
import bench_compile  # noqa: E402
import bench_kstep as KS  # noqa: E402
import bench_memory  # noqa: E402
import bench_sparse as SP  # noqa: E402
import bench_triton_blocks as TB  # noqa: E402
import graphs  # noqa: E402
from diffusionformer import DiffusionAttention  # noqa: E402
from diffusionformer.models import DiffusionGPT, GPTConfig  # noqa: E402

E1 = math.exp(-1.0)


def _timings(times: dict[str, float], rounds: int = 2) -> dict[str, C.Timing]:
    """Stand-in result of ``C.measure``: every round of a candidate takes the same time."""
    return {name: C.Timing([t] * rounds, 1) for name, t in times.items()}


def _argv(tmp_path, *extra):
    return ["--device", "cpu", "--threads", "1", "--out", str(tmp_path), *extra]


# ============================================================================ bench_triton_blocks
class _Record(torch.autograd.Function):
    """Identity whose backward records the incoming gradient and multiplies it by ``scale``."""

    @staticmethod
    def forward(ctx, x, scale, log):  # noqa: ANN001, ANN205
        ctx.scale, ctx.log = scale, log
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        ctx.log.append(g.detach().clone())
        return g * ctx.scale, None, None


class _Kernel:
    """Stand-in for ``polynomial_attention``: ``out = clamp(q, -1, 1) + offset`` (float32) with ``d out / d q =
    scale``, where ``effect(geometry, N) -> (offset, scale)`` (or raises) depends on ``_launch.BLOCKS`` at the call.
    The clamp makes the reference's largest magnitude 1, so that the sweep's relative difference is ``offset``."""

    def __init__(self, effect=None):
        self.effect = effect or (lambda geo, n: (0.0, 1.0))
        self.calls: list[dict] = []
        self.grads: list[torch.Tensor] = []

    def __call__(self, q, k, v, c, is_causal):  # noqa: ANN001, ANN204
        geo = dict(TB._launch.BLOCKS)
        self.calls.append({"blocks": geo, "causal": is_causal, "grad": torch.is_grad_enabled(), "shape": tuple(q.shape),
                           "c": c.detach().clone(), "dtype": q.dtype})
        offset, scale = self.effect(geo, q.shape[2])
        x = q.float()
        x = x + (x.clamp(-1.0, 1.0) - x).detach()  # values clamped, gradient as given
        return _Record.apply(x, scale, self.grads) + offset


def _fwd(geo):
    return (geo["fwd_m"], geo["fwd_n"], geo["num_warps"], geo["num_stages"])


def _bwd(geo):
    return (geo["bwd_m"], geo["bwd_n"], geo["bwd_num_warps"], geo["bwd_num_stages"])


class _BlocksMeasure:
    """Stand-in ``C.measure`` for the sweep: runs each candidate once (the kernel stand-in then knows ``N``) and gives
    it ``times(name, N)`` seconds; records the candidates of each call."""

    def __init__(self, kernel, times):
        self.kernel, self.times, self.seen, self.kwargs = kernel, times, [], []

    def __call__(self, fns, **kw):  # noqa: ANN001, ANN204
        self.seen.append(list(fns))
        self.kwargs.append(kw)
        out = {}
        for name, fn in fns.items():
            fn()
            out[name] = self.times(name, self.kernel.calls[-1]["shape"][2])
        return _timings(out, kw["rounds"])


@pytest.fixture
def blocks_run(monkeypatch):
    """The sweep with the stand-in kernel and timings, under ``TRITON_INTERPRET=1``; ``_launch.BLOCKS`` restored."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("DF_BENCH_SMOKE", raising=False)
    original = dict(TB._launch.BLOCKS)
    yield monkeypatch
    TB._launch.BLOCKS.clear()
    TB._launch.BLOCKS.update(original)


def _install(monkeypatch, effect=None, times=lambda name, n: 1.0):
    kernel = _Kernel(effect)
    measure = _BlocksMeasure(kernel, times)
    monkeypatch.setattr(TB, "polynomial_attention", kernel)
    monkeypatch.setattr(C, "measure", measure)
    return kernel, measure


def test_config_name_and_blocks_for():
    """kills (bench_triton_blocks.py): config_name printing n x m; blocks_for setting num_stages from the warps;
    the backward configuration written into the forward's num_warps/num_stages; the mode test flipped
    (``mode != "forward"``); ``b = default`` (the default geometry overwritten by every configuration)"""
    default = {"fwd_m": 64, "fwd_n": 64, "bwd_m": 32, "bwd_n": 64, "num_warps": None, "num_stages": 2,
               "bwd_num_warps": None, "bwd_num_stages": None}
    keep = dict(default)
    assert TB.config_name("forward", (128, 32, 8, 3)) == "forward 128x32 w8 s3"
    fwd = TB.blocks_for("forward", (128, 32, 8, 3), default)
    assert fwd == {**keep, "fwd_m": 128, "fwd_n": 32, "num_warps": 8, "num_stages": 3}
    bwd = TB.blocks_for("forward+backward", (16, 128, 8, 3), default)
    assert bwd == {**keep, "bwd_m": 16, "bwd_n": 128, "bwd_num_warps": 8, "bwd_num_stages": 3}
    assert default == keep


def test_workloads_affine_and_heat_coefficients():
    """kills (bench_triton_blocks.py): ``half = H // 2 + 1``; the affine rows' order swapped; the heat series cut at
    j = 7 (K = 7); the K-step workload over all H heads; the tensors in float16 instead of bf16"""
    w = TB.workloads(1, 8, 48, 6, "cpu")
    assert list(w) == ["affine", "K-step (2 heads, K=8)"]
    q, k, v, c = w["affine"]
    assert all(t.shape == (1, 6, 8, 8) and t.dtype == torch.bfloat16 and t.requires_grad for t in (q, k, v))
    assert c.tolist() == [[0.0, 1.0]] * 3 + [[1.0, -1.0]] * 3  # attention heads first, then the Laplacian ones
    q, k, v, c = w["K-step (2 heads, K=8)"]
    assert all(t.shape == (1, 2, 8, 8) and t.dtype == torch.bfloat16 for t in (q, k, v))
    heat = [E1 / math.factorial(j) for j in range(9)]  # e^{-(I - P)} = e^{-1} sum_j P^j / j!
    torch.testing.assert_close(c, torch.tensor([heat, heat]))
    odd = TB.workloads(1, 4, 20, 5, "cpu")["affine"][3]
    assert odd.tolist() == [[0.0, 1.0]] * 3 + [[1.0, -1.0]] * 2


def test_runner_sets_the_geometry_and_returns_output_and_dq(blocks_run):
    """kills (bench_triton_blocks.py): the forward run non-causal; dq taken against ones instead of the given
    gradient; the forward+backward run returning the output without dq"""
    kernel, _ = _install(blocks_run, effect=lambda geo, n: (0.0, 3.0))
    q, k, v, c = TB.workloads(1, 4, 16, 2, "cpu")["affine"]
    g = torch.arange(q.numel(), dtype=torch.float32).reshape(q.shape).to(torch.bfloat16)
    blocks = TB.blocks_for("forward", (128, 64, 8, 3), dict(TB._launch.BLOCKS))
    out = TB.runner(q, k, v, c, False, blocks, g)()
    assert torch.equal(out, q.float().clamp(-1.0, 1.0))
    assert kernel.calls[-1]["causal"] is True and kernel.calls[-1]["grad"] is False
    assert kernel.calls[-1]["blocks"] == blocks and TB._launch.BLOCKS == blocks
    res = TB.runner(q, k, v, c, True, blocks, g)()
    assert isinstance(res, tuple) and len(res) == 4  # (out, dq, dk, dv): the stand-in uses q alone, dk = dv = None
    out, dq = res[:2]
    assert kernel.calls[-1]["causal"] is True and kernel.calls[-1]["grad"] is True
    torch.testing.assert_close(kernel.grads[-1], g.float())
    torch.testing.assert_close(dq.float(), 3.0 * g.float())


def test_max_diff_over_tuples_is_the_largest_relative_difference():
    """kills (bench_triton_blocks.py): max_diff comparing only the first of (out, dq); the signed difference's max
    instead of |difference|; a difference not scaled by the reference's largest magnitude (bf16 gradients of
    magnitude 10 differ by more than 5e-2 from rounding order alone)"""
    a = (torch.tensor([1.0, 2.0]), torch.tensor([0.0, 5.0]))
    b = (torch.tensor([1.5, 2.0]), torch.tensor([0.0, 2.0]))
    assert TB.max_diff(a, b) == 1.5  # 3 / 2 in the second tensor; 0.5 / 2 in the first
    assert TB.max_diff(torch.tensor([0.0, 1.0]), torch.tensor([2.5, 1.0])) == 1.0
    assert TB.max_diff(torch.tensor([10.06, -3.0]), torch.tensor([10.0, -3.0])) == pytest.approx(0.006, rel=1e-3)
    assert TB.max_diff(torch.tensor([0.5]), torch.tensor([0.0])) == 0.5  # a zero reference: absolute


def test_jobs_cover_every_workload_mode_and_configuration_default_first():
    """kills (bench_triton_blocks.py): jobs over the first workload only; jobs without the default geometry (None)"""
    s1, s2 = (1, 8, 16, 2), (1, 12, 16, 2)
    grids = {"forward": [(1, 1, 1, 1)], "forward+backward": [(2, 2, 2, 2), (3, 3, 3, 3)]}
    expected = []
    for w in (0, 1):
        for mode, cfgs in (("forward", [None, (1, 1, 1, 1)]), ("forward+backward", [None, (2, 2, 2, 2), (3, 3, 3, 3)])):
            for cfg in cfgs:
                expected.append([(s1, w, mode, cfg), (s2, w, mode, cfg)])
    assert TB.jobs([s1, s2], grids) == expected


def test_run_job_builds_each_size_and_launches_each_configuration(blocks_run):
    """kills (bench_triton_blocks.py): run_job keeping the first size's tensors for every size; the mode test
    flipped (a forward job run with gradients); every job run at the default geometry"""
    kernel, _ = _install(blocks_run)
    default = dict(TB._launch.BLOCKS)
    group = [((1, 8, 32, 4), 0, "forward", None), ((1, 12, 32, 4), 0, "forward", (128, 64, 8, 3)),
             ((1, 12, 32, 4), 1, "forward+backward", (16, 64, 4, 2))]
    TB.run_job("cpu", default)(group)
    assert [c["shape"] for c in kernel.calls] == [(1, 4, 8, 8), (1, 4, 12, 8), (1, 2, 12, 8)]
    assert [c["grad"] for c in kernel.calls] == [False, False, True]
    assert kernel.calls[0]["blocks"] == default
    assert _fwd(kernel.calls[1]["blocks"]) == (128, 64, 8, 3)
    assert _bwd(kernel.calls[2]["blocks"]) == (16, 64, 4, 2) and _fwd(kernel.calls[2]["blocks"]) == _fwd(default)


def test_smoke_sweep_tables_threshold_and_summary(blocks_run, tmp_path):
    """kills (bench_triton_blocks.py): the reference run at another geometry than the default; ratios to the last
    row or inverted (base / row); the JSON's seconds of the default instead of the row's; the correctness threshold
    ``< 5e-2`` made ``<= 5e-2``, ``< 5e-1`` or dropped; BLOCKS not restored after the sweep (no ``finally``); the
    gradient of the forward+backward runs not a seeded normal draw (ones); smoke grids of one configuration"""
    def effect(geo, n):
        if _fwd(geo) == (128, 64, 4, 2):
            return 0.05, 1.0  # exactly at the threshold: not "correct"
        if _bwd(geo) == (64, 64, 4, 2):
            return 0.1, 1.0
        return 0.0, 1.0

    times = {"forward 64x64 w4 s2": 1.0, "forward 128x64 w4 s2": 0.5,
             "forward+backward 32x64 w4 s2": 2.0, "forward+backward 64x64 w4 s2": 0.5}
    kernel, measure = _install(blocks_run, effect, lambda name, n: times[name])
    before = dict(TB._launch.BLOCKS)
    rep = TB.main(_argv(tmp_path, "--smoke"))
    assert TB._launch.BLOCKS == before
    assert [kw["rounds"] for kw in measure.kwargs] == [2] * 4
    tables = rep.sections[:-1]
    assert len(tables) == 4  # 2 workloads x 2 modes at the one smoke size
    for caption, header, rows in tables:
        assert "(1, 40, 64, 4)" in caption
        if ", forward," in caption:
            assert rows == [["forward 64x64 w4 s2", "1000.0", "1.000 [1.00-1.00]", "0.00e+00"],
                            ["forward 128x64 w4 s2", "500.0", "0.500 [0.50-0.50]", "5.00e-02"]]
        else:
            assert rows == [["forward+backward 32x64 w4 s2", "2000.0", "1.000 [1.00-1.00]", "0.00e+00"],
                            ["forward+backward 64x64 w4 s2", "500.0", "0.250 [0.25-0.25]", "1.00e-01"]]
    recs = {(r["workload"], r["config"]): r for r in rep.rows}
    assert len(recs) == 8
    assert recs[("affine", "forward 128x64 w4 s2")]["seconds"] == 0.5
    assert recs[("affine", "forward 128x64 w4 s2")]["vs_default"] == pytest.approx((0.5, 0.5, 0.5))
    caption, header, summary = rep.sections[-1]
    assert summary == [["K-step (2 heads, K=8)", "forward", "forward 64x64 w4 s2", "1.000"],
                       ["K-step (2 heads, K=8)", "forward+backward", "forward+backward 32x64 w4 s2", "1.000"],
                       ["affine", "forward", "forward 64x64 w4 s2", "1.000"],
                       ["affine", "forward+backward", "forward+backward 32x64 w4 s2", "1.000"]]
    grads = torch.cat([g.flatten() for g in kernel.grads])
    assert grads.std().item() == pytest.approx(1.0, abs=0.2) and grads.unique().numel() > 100
    saved = json.loads((tmp_path / "bench_triton_blocks.json").read_text())
    assert saved["tables"][-1]["rows"] == summary


def test_a_configuration_that_does_not_run_is_a_row_and_not_timed(blocks_run, tmp_path):
    """kills (bench_triton_blocks.py): the failed configuration timed anyway (``continue`` dropped); its row without
    the exception's type; BLOCKS not restored when the sweep raises"""
    def effect(geo, n):
        if _fwd(geo) == (128, 64, 4, 2):
            raise ValueError("out of resources: shared memory")
        return 0.0, 1.0

    kernel, measure = _install(blocks_run, effect)
    before = dict(TB._launch.BLOCKS)
    rep = TB.main(_argv(tmp_path, "--smoke"))
    caption, header, rows = rep.sections[0]
    assert rows[1] == ["forward 128x64 w4 s2", "", "", "does not run: ValueError: out of resources: shared memory"]
    assert measure.seen[0] == ["forward 64x64 w4 s2"]
    assert TB._launch.BLOCKS == before

    def broken(geo, n):
        raise RuntimeError("no kernel at all")

    _install(blocks_run, broken)
    with pytest.raises(RuntimeError, match="no kernel at all"):  # the default geometry itself fails: no sweep
        TB.main(_argv(tmp_path, "--smoke"))
    assert TB._launch.BLOCKS == before


def test_summary_is_the_geometric_mean_over_sizes_of_configurations_correct_at_every_size(blocks_run, tmp_path):
    """kills (bench_triton_blocks.py): the summary's arithmetic mean instead of the geometric one; ``max`` instead of
    ``min``; configurations correct at only some sizes ranked (``len(rs) >= 1``); the ``if not full: continue`` guard
    dropped (a mode where no configuration is right at every size crashed the report); --rounds ignored"""
    blocks_run.setattr(TB, "SIZES", [(1, 8, 16, 2), (1, 12, 16, 2), (1, 16, 16, 2)])

    def effect(geo, n):
        if _fwd(geo) == (64, 32, 4, 2) and n == 12:
            return 1.0, 1.0  # fast at N = 8, wrong at N = 12
        if geo["bwd_num_warps"] is not None and n == 12:
            return 1.0, 1.0  # every swept backward geometry wrong at N = 12 (the default runs with None)
        return 0.0, 1.0

    special = {("forward 128x64 w4 s2", 8): 0.25, ("forward 128x64 w4 s2", 12): 2.0,  # geometric mean 0.707, mean 1.125
               ("forward 128x64 w8 s2", 8): 0.8, ("forward 128x64 w8 s2", 12): 0.8,  # 0.8 both ways
               ("forward 64x32 w4 s2", 8): 0.1, ("forward 64x32 w4 s2", 12): 0.1}

    def times(name, n):
        if name.endswith("64x64 w4 s2") or name.endswith("32x64 w4 s2"):
            return 1.0
        return special.get((name, n), 1.5)

    kernel, measure = _install(blocks_run, effect, times)
    rep = TB.main(_argv(tmp_path, "--sizes", "0", "1", "--rounds", "3"))
    assert {kw["rounds"] for kw in measure.kwargs} == {3}
    captions = [c for c, _, _ in rep.sections[:-1]]
    assert len(captions) == 8 and not any("(1, 16, 16, 2)" in c for c in captions)
    assert len(rep.sections[0][2]) == len(TB.FWD_GRID)
    caption, header, summary = rep.sections[-1]
    assert summary == [["K-step (2 heads, K=8)", "forward", "forward 128x64 w4 s2", "0.707"],
                       ["affine", "forward", "forward 128x64 w4 s2", "0.707"]]


def test_default_sizes_are_the_first_two_and_smoke_comes_from_the_environment(blocks_run, tmp_path):
    """kills (bench_triton_blocks.py): the default sizes [0, 1, 2]; DF_BENCH_SMOKE ignored"""
    blocks_run.setattr(TB, "SIZES", [(1, 8, 16, 2), (1, 12, 16, 2), (1, 16, 16, 2)])
    blocks_run.setattr(TB, "FWD_GRID", TB.FWD_GRID[:2])
    blocks_run.setattr(TB, "BWD_GRID", TB.BWD_GRID[:2])
    _install(blocks_run)
    rep = TB.main(_argv(tmp_path))
    sizes = sorted({r["size"] for r in rep.rows})
    assert sizes == [(1, 8, 16, 2), (1, 12, 16, 2)]
    blocks_run.setenv("DF_BENCH_SMOKE", "1")
    rep = TB.main(_argv(tmp_path))
    assert {r["size"] for r in rep.rows} == {(1, 40, 64, 4)}
    assert "smoke run" in rep.notes[0]


def test_warm_up_processes_get_the_sweeps_own_options(blocks_run, tmp_path):
    """kills (bench_triton_blocks.py): the warm-up command line without --smoke or without --sizes (the compile-only
    processes would build other kernels than the timed sweep launches)"""
    _install(blocks_run)
    seen = {}

    def warm(script, argv, args, jobs, run_job):  # noqa: ANN001, ANN202
        seen.update(argv=argv, jobs=jobs)
        return ""

    blocks_run.setattr(C, "warm_kernels", warm)
    TB.main(_argv(tmp_path, "--smoke", "--sizes", "1"))
    assert seen["argv"] == ["--device", "cpu", "--threads", "1", "--smoke", "--sizes", "1"]
    assert len(seen["jobs"]) == 2 * (3 + 3)  # 2 workloads x 2 modes x (default + 2 configurations)


@pytest.mark.parametrize("value", [None, "", "0"])
def test_cpu_without_the_interpreter_is_refused(value, blocks_run, tmp_path):
    """kills (bench_triton_blocks.py): the CPU check dropped; TRITON_INTERPRET="" taken as set"""
    if value is None:
        blocks_run.delenv("TRITON_INTERPRET", raising=False)
    else:
        blocks_run.setenv("TRITON_INTERPRET", value)
    kernel, _ = _install(blocks_run)
    with pytest.raises(SystemExit, match="on CPU with TRITON_INTERPRET=1"):
        TB.main(_argv(tmp_path, "--smoke"))
    assert kernel.calls == []


@pytest.mark.parametrize("sizes, message", [([], "--sizes was given without values"),
                                            (["3"], r"--sizes \[3\] out of range: 0 \.\. 2"),
                                            (["0", "-1"], r"--sizes \[-1\] out of range: 0 \.\. 2")])
def test_sizes_without_values_or_out_of_range_are_refused(sizes, message, blocks_run, tmp_path):
    """Bug: ``bench_triton_blocks.py --sizes`` with no values swept no size and succeeded having checked nothing
    (an empty ``$ARGS`` expansion on a GPU call); ``--sizes 3`` failed with a bare IndexError and ``--sizes -1``
    silently swept the last size; now a usage error before any work"""
    kernel, _ = _install(blocks_run)
    with pytest.raises(SystemExit, match=message):
        TB.main(_argv(tmp_path, "--sizes", *sizes))
    assert kernel.calls == [] and not (tmp_path / "bench_triton_blocks.md").exists()


# ============================================================================ bench_kstep
def test_kstep_coefficients():
    """kills (bench_kstep.py): heat at t = 0.5 instead of 1; PPR at alpha = 0.2 instead of 0.1; K random polynomial
    coefficients instead of K + 1"""
    torch.testing.assert_close(KS.coefficients("heat", 4), torch.tensor([E1 / math.factorial(j) for j in range(5)]))
    # PPR: alpha (1 - alpha)^j for j < K and the rest of the mass (1 - alpha)^K on the last step
    torch.testing.assert_close(KS.coefficients("ppr", 4), torch.tensor([0.1, 0.09, 0.081, 0.0729, 0.6561]))
    p = KS.coefficients("polynomial", 3)
    assert p.shape == (4,) and torch.equal(p, KS.coefficients("polynomial", 3))


def test_kernel_callables_call_diffuse_with_their_backend(monkeypatch):
    """kills (bench_kstep.py): the forward callables non-causal or outside ``no_grad``; the forward+backward
    callables all on the sdpa back-end"""
    log = []

    def diffuse(q, k, v, c, is_causal, backend):  # noqa: ANN001, ANN202
        log.append((backend, is_causal, torch.is_grad_enabled(), q.requires_grad))
        return q + k + v

    monkeypatch.setattr(KS, "diffuse", diffuse)
    q, k, v = (torch.randn(1, 2, 4, 3) for _ in range(3))
    c = torch.tensor([0.5, 0.5])
    for backward in (False, True):
        fns = KS.kernel_callables(q, k, v, c, True, backward)
        assert list(fns) == ["sdpa", "matrix", "auto"]
        log.clear()
        for f in fns.values():
            f()
        assert log == [(b, True, backward, backward) for b in ("sdpa", "matrix", "auto")]


class _Tagged:
    def __init__(self, key):
        self.key = key

    def __call__(self):
        pass


def _kstep_fakes(monkeypatch, time_of):
    """Stand-in kernel callables tagged (N, B, causal, K, backward, backend) and a measure that prices each tag."""
    coeffs = []

    def kernel_callables(q, k, v, c, causal, backward):  # noqa: ANN001, ANN202
        coeffs.append(c.clone())
        return {b: _Tagged((q.shape[2], q.shape[0], causal, c.numel() - 1, backward, b)) for b in ("sdpa", "matrix", "auto")}

    monkeypatch.setattr(KS, "kernel_callables", kernel_callables)
    monkeypatch.setattr(C, "measure", lambda fns, **kw: _timings({n: time_of(f.key) for n, f in fns.items()}, 3))
    return coeffs


def test_kernel_table_rule_loss_and_worst(monkeypatch, tmp_path):
    """kills (bench_kstep.py): B = 1024 // N; quick K = [2]; the rule's other back-end the chosen one; the loss
    without ``max(1, ...)`` or inverted; the worst kept as the smallest; ``loss <= 1.10`` made strict or 1.05; the
    matrix / sdpa column inverted; the rule asked without the call's causality; the auto column showing sdpa's time;
    the operator table without forward+backward or with its columns out of order; its coefficients"""
    rule_calls = []

    def rule(n, m, k, is_causal, device_type):  # noqa: ANN001, ANN202
        rule_calls.append((n, m, k, is_causal, device_type))
        return "matrix" if is_causal else "sdpa"

    def time_of(key):
        n, b, causal, k, backward, backend = key
        if backend == "sdpa":
            return 1.0
        if backend == "auto":
            return 0.7
        return (1.1 if n == 64 else 1.5) if causal else 2.0  # matrix

    coeffs = _kstep_fakes(monkeypatch, time_of)
    monkeypatch.setattr(KS, "choose_dense_backend", rule)
    args = argparse.Namespace(device="cpu", threads=1, out=str(tmp_path), quick=True, clock="wall", rounds=None)
    rep = C.Report("bench_kstep", "t", args)
    KS.part_kernels(args, rep)
    (cap1, head1, rows), (cap2, head2, op_rows) = rep.sections
    expected = []
    for n, b in ((64, 32), (256, 8)):
        for causal in (False, True):
            for k in (2, 4):
                for mode in ("fwd", "fwd+bwd"):
                    matrix = (1.1 if n == 64 else 1.5) if causal else 2.0
                    loss = matrix if causal else 1.0
                    expected.append([n, b, "yes" if causal else "no", k, mode, "1000.0", f"{matrix * 1e3:.1f}", "700.0",
                                     "matrix" if causal else "sdpa", f"{matrix:.3f} [{matrix:.2f}-{matrix:.2f}]",
                                     f"{loss:.3f}", "**no**" if loss > 1.1 else "yes"])
    assert rows == expected
    assert {c[3] for c in rule_calls} == {False, True} and all(c[4] == "cpu" and c[0] == c[1] for c in rule_calls)
    assert rep.notes[0].startswith("Worst rule loss over the grid: 1.500 (N=256, K=2, causal, fwd).")
    assert op_rows == [[op, 4, 256, mode, "1000.0", "2000.0", "700.0"]
                       for mode in ("fwd", "fwd+bwd") for op in ("heat", "ppr", "polynomial")]
    heat = torch.tensor([E1 / math.factorial(j) for j in range(5)])
    torch.testing.assert_close(coeffs[-3], heat)
    torch.testing.assert_close(coeffs[-2], torch.tensor([0.1, 0.09, 0.081, 0.0729, 0.6561]))


def test_layer_table_budget_and_layers(monkeypatch, tmp_path):
    """kills (bench_kstep.py): the budget ``1.05 (1 + K G / H)`` or without the 1.05; ``r <= target`` made strict;
    the ratio inverted; the worst not divided by its target; G and K read in the wrong order; the layer with G
    attention heads and H - G heat heads; the qkv weights not shared with the attention layer; every layer in train
    mode"""
    budget = 1.05 * (1 + (4 - 1) * 2 / 8)  # 1.8375
    seen = []
    real = C.step_callables

    def step_callables(layers, x, backward, grad=None):  # noqa: ANN001, ANN202
        seen.append((dict(layers), backward))
        return real(layers, x, backward, grad)

    monkeypatch.setattr(C, "step_callables", step_callables)
    per_mode = iter([{"attention": 1.0, "G=2,K=4": 2.0}, {"attention": 1.0, "G=2,K=4": budget}])
    monkeypatch.setattr(C, "measure", lambda fns, **kw: _timings(next(per_mode), 3))
    args = argparse.Namespace(device="cpu", threads=1, out=str(tmp_path), quick=True, clock="wall", rounds=None)
    rep = C.Report("bench_kstep", "t", args)
    KS.part_layers(args, rep)
    (caption, header, rows), = rep.sections
    assert [r[:6] for r in rows] == [[256, 8, "no", "fwd", 2, 4], [256, 8, "no", "fwd+bwd", 2, 4]]
    assert [r[9:] for r in rows] == [[f"{budget:.3f}", "**no**"], [f"{budget:.3f}", "yes"]]  # at the budget: met
    assert rows[0][8] == "2.000 [2.00-2.00]"
    assert [r["target"] for r in rep.rows] == pytest.approx([1.8375, 1.8375])
    worst = 2.0 / budget  # the forward row; comparing the raw ratio 1.84 with the stored 1.09 would take the next
    assert rep.notes[-1] == f"Layer ratio / target, worst: {worst:.3f} (N=256, G=2, K=4, full, fwd)."
    for layers, backward in seen:
        att, m = layers["attention"], layers["G=2,K=4"]
        ops = [(type(o).__name__, o.num_heads) for o in m.operators]
        assert ops == [("AttentionOperator", 6), ("HeatOperator", 2)]
        assert m.operators[1].steps == 4
        assert torch.equal(m.qkv.weight, att.qkv.weight) and torch.equal(m.out_proj.weight, att.out_proj.weight)
        assert all(layer.training == backward for layer in layers.values())


# ============================================================================ bench_sparse
needs_pyg = pytest.mark.skipif(importlib.util.find_spec("torch_geometric") is None, reason="needs torch_geometric")


@needs_pyg
def test_sparse_graphs_and_models():
    """kills (bench_sparse.py): the random graph of average degree 8; TransformerConv with its root weight (then not
    the layer ours reproduces); make_models ignoring ``heads``; runners leaving the models in train mode"""
    ei, n = SP.build_graph("random", 50, "cpu")
    assert n == 50 and ei.shape == (2, 50 * 16)
    gi, gn = SP.build_graph("grid", 49, "cpu")
    assert gn == 49 and torch.equal(gi, graphs.grid_graph(49)[0])
    conv, ours = SP.make_models("cpu")
    assert conv.root_weight is False
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, SP.D, generator=g)
    ei = graphs.random_graph(30, 4)
    conv.eval(), ours.eval()
    with torch.no_grad():  # same math: PyG's TransformerConv is the reference
        torch.testing.assert_close(ours(x, edge_index=ei), conv(x, ei), atol=1e-5, rtol=1e-4)
    _, heat = SP.make_models("cpu", "heat(t=1.0, steps=2)")
    assert [type(o).__name__ for o in heat.operators] == ["HeatOperator"] and heat.operators[0].steps == 2
    for backward in (False, True):
        SP.runners(conv, ours, x, ei, backward)
        assert conv.training is backward and ours.training is backward


@needs_pyg
def test_set_pyg_scatter_never_turns_on_a_missing_torch_scatter(monkeypatch):
    """kills (bench_sparse.py): set_pyg_scatter(True) without ``and HAS_TORCH_SCATTER`` (PyG would import a
    torch-scatter that is not installed)"""
    import torch_geometric.typing as tgt

    monkeypatch.setattr(tgt, "WITH_TORCH_SCATTER", tgt.WITH_TORCH_SCATTER)
    monkeypatch.setattr(SP, "HAS_TORCH_SCATTER", False)
    SP.set_pyg_scatter(True)
    assert tgt.WITH_TORCH_SCATTER is False
    monkeypatch.setattr(SP, "HAS_TORCH_SCATTER", True)
    SP.set_pyg_scatter(True)
    assert tgt.WITH_TORCH_SCATTER is True
    SP.set_pyg_scatter(False)
    assert tgt.WITH_TORCH_SCATTER is False


def test_rss_kib_reads_its_field(monkeypatch):
    """kills (bench_sparse.py): _rss_kib taking the line's last word (the unit) instead of the number"""
    status = "Name:\tpython\nVmPeak:\t  900 kB\nVmHWM:\t  4321 kB\nVmRSS:\t  1234 kB\n"
    monkeypatch.setattr(SP, "open", lambda path, *a, **k: io.StringIO(status), raising=False)
    assert SP._rss_kib("VmRSS") == 1234 and SP._rss_kib("VmHWM") == 4321
    with pytest.raises(RuntimeError, match="VmSwap not in /proc/self/status"):
        SP._rss_kib("VmSwap")


def test_rss_crosscheck_runs_a_worker_with_the_allocator_settings(monkeypatch, capsys):
    """kills (bench_sparse.py): the glibc variable misspelt (MALLOC_MMAP_THRESHOLD without the underscore, ignored by
    glibc); the worker's first output line parsed instead of its last; a failed worker's output parsed (no
    ``return None``)"""
    calls = []
    answer = {"rc": 0, "out": "loading\n" + json.dumps({"ours/fwd": 1.5}) + "\n"}

    def run(cmd, env, capture_output, text):  # noqa: ANN001, ANN202
        calls.append((cmd, env))
        return subprocess.CompletedProcess(cmd, answer["rc"], answer["out"], "worker died: boom")

    monkeypatch.setattr(SP.sys, "platform", "linux")
    monkeypatch.setattr(SP.os, "access", lambda path, mode: True)
    monkeypatch.setattr(SP.subprocess, "run", run)
    assert SP.rss_crosscheck("random", 100, 2) == {"ours/fwd": 1.5}
    cmd, env = calls[0]
    assert cmd[:3] == [sys.executable, SP.__file__, "--rss-worker"]
    assert json.loads(cmd[3]) == {"graph": "random", "n": 100, "threads": 2}
    assert env["MALLOC_MMAP_THRESHOLD_"] == "131072" and env["MALLOC_TRIM_THRESHOLD_"] == "131072"
    assert env["MKL_DISABLE_FAST_MM"] == "1"
    answer.update(rc=1, out="")
    assert SP.rss_crosscheck("random", 100, 2) is None
    assert "worker died: boom" in capsys.readouterr().err


def test_rss_worker_command_line(monkeypatch, capsys):
    """kills (bench_sparse.py): main looking for --rss-worker as the last argument instead of the first"""
    monkeypatch.setattr(SP, "rss_worker", lambda spec: {"n": spec["n"] * 1.0})
    with pytest.raises(SystemExit) as e:
        SP.main(["--rss-worker", json.dumps({"n": 3})])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == '{"n": 3.0}'


def _sparse_fakes(monkeypatch, k_times=None, peaks=None, rss=None):
    """Tiny graphs (random: 30 nodes, 120 edges; grid: 5 x 5), recorded models, scatter modes and RSS calls;
    ``measure`` runs every candidate once and prices the comparisons by name."""
    rec = {"graphs": [], "heads": [], "scatter": [], "rss": [], "models": []}

    def build_graph(kind, n, device):  # noqa: ANN001, ANN202
        rec["graphs"].append((kind, n))
        return (graphs.random_graph(30, 4), 30) if kind == "random" else graphs.grid_graph(25)

    real_make = SP.make_models

    def make_models(device, heads=None):  # noqa: ANN001, ANN202
        rec["heads"].append(heads)
        conv, ours = real_make(device, heads)
        rec["models"].append((conv, ours))
        return conv, ours

    k_iter = iter(k_times or [])

    def measure(fns, **kw):  # noqa: ANN001, ANN202
        for f in fns.values():
            f()
        if list(fns) == ["k"]:
            return {"k": C.Timing([next(k_iter, 0.001)] * 2, 1)}
        backward = fns["ours"].__qualname__.startswith("step_callables.<locals>.fb")
        times = {"TransformerConv": 1.0, "ours": 1.0} if backward else {"TransformerConv": 1.5, "ours": 1.0}
        return _timings(times)

    def peak_memory(fn, device="cpu"):  # noqa: ANN001, ANN202
        conv, ours = rec["models"][0]
        assert all(p.grad is None for p in list(conv.parameters()) + list(ours.parameters())), "grads left from timing"
        return next(peaks) if peaks is not None else 1000

    monkeypatch.setattr(SP, "build_graph", build_graph)
    monkeypatch.setattr(SP, "make_models", make_models)
    monkeypatch.setattr(SP, "HAS_TORCH_SCATTER", True)
    monkeypatch.setattr(SP, "set_pyg_scatter", lambda enabled: rec["scatter"].append(enabled))
    monkeypatch.setattr(SP, "rss_crosscheck", lambda g, n, t: rec["rss"].append((g, n, t)) or rss)
    monkeypatch.setattr(C, "measure", measure)
    monkeypatch.setattr(C, "peak_memory", peak_memory)
    return rec


@needs_pyg
def test_sparse_quick_tables(monkeypatch, tmp_path):
    """kills (bench_sparse.py): quick sizes [10k, 100k]; the speed-up inverted (ours / TransformerConv); the forward
    and forward+backward targets swapped; ``speed >= target`` or ``mem_ratio <= 0.75`` made strict; the memory
    ratio inverted; bytes per node instead of per edge; the gradients of the timed runs left in place for the
    peak; the K table's base the current time or inverted; K = 1 as heat(steps=1) instead of attention; the K table
    for the grid too; the "+ts" baseline tag dropped; the JSON's conv and ours times swapped; RSS in quick runs"""
    peaks = iter([960, 720, 1000, 900, 960, 720, 1000, 900, 2**20, 2**21, 2**21, 3 * 2**20,
                  960, 720, 1000, 900, 960, 720, 1000, 900])
    rec = _sparse_fakes(monkeypatch, k_times=[0.002, 0.004, 0.006, 0.016], peaks=peaks)
    rep = SP.main(_argv(tmp_path, "--quick"))
    assert rec["graphs"] == [("random", 10_000), ("grid", 10_000)]
    assert rec["scatter"] == [False, True, True] * 2
    assert rec["heads"] == [None, None, "heat(t=1.0, steps=2)", "heat(t=1.0, steps=4)", "heat(t=1.0, steps=8)", None]
    assert rec["rss"] == []
    (tc, th, time_rows), (mc, mh, mem_rows), (kc, kh, k_rows) = rep.sections
    ge = graphs.grid_graph(25)[0].shape[1]
    exp_time, exp_mem = [], []
    for graph, n, e in (("random", 30, 120), ("grid", 25, ge)):
        for tag in ("conv", "conv+ts"):
            exp_time += [[graph, n, e, "fwd", tag, "1500.0", "1000.0", "1.500 [1.50-1.50]", ">= 2", "**no**"],
                         [graph, n, e, "fwd+bwd", tag, "1000.0", "1000.0", "1.000 [1.00-1.00]", ">= 1", "yes"]]
            exp_mem += [[graph, n, e, "fwd", tag, "0.0", "0.0", "0.750", "yes", f"{720 / e:.1f}"],
                        [graph, n, e, "fwd+bwd", tag, "0.0", "0.0", "0.900", "**no**", f"{900 / e:.1f}"]]
    assert time_rows == exp_time
    assert mem_rows == exp_mem
    assert k_rows == [[1, "2.00", "1.00", "1.0"], [2, "4.00", "2.00", "2.0"], [4, "6.00", "3.00", "2.0"],
                      [8, "16.00", "8.00", "3.0"]]
    r0 = rep.rows[0]
    assert (r0["conv_s"], r0["ours_s"], r0["speedup"][0]) == (1.5, 1.0, 1.5)


@needs_pyg
def test_sparse_full_run_cross_checks_rss_of_the_largest_random_graph(monkeypatch, tmp_path):
    """kills (bench_sparse.py): the RSS rows' TransformerConv and ours columns swapped"""
    rss = {"TransformerConv/fwd": 10.0, "ours/fwd": 5.0, "TransformerConv/fwd+bwd": 20.0, "ours/fwd+bwd": 30.0}
    rec = _sparse_fakes(monkeypatch, rss=rss)
    rep = SP.main(_argv(tmp_path))
    assert rec["rss"] == [("random", 100_000, 1)]
    cap, head, rows = rep.sections[2]
    assert cap.startswith("Cross-check")
    assert rows == [["random", 30, 120, "fwd", "10.0", "5.0", "0.500"], ["random", 30, 120, "fwd+bwd", "20.0", "30.0", "1.500"]]


# ============================================================================ bench_memory
def test_memory_models_batch_recompute_and_ratios(monkeypatch, tmp_path):
    """kills (bench_memory.py): the default batch of --quick 4 instead of 2; --batch ignored; half Laplacian as 2
    heads (not H // 2); the fused-kernel heat model on "auto"; heat with K = 2; nanoGPT with biases; the recompute
    switch not set before the "on" peak; the step without bf16 autocast; the JSON ratios inverted or taken from the
    peak without recompute"""
    monkeypatch.setattr(bench_memory, "SIZE", (1, 6, 48, 16, 65))  # 6 heads: H // 2 = 3
    seen = []
    real_step = C.train_step

    def train_step(model, opt, idx, targets, autocast=None):  # noqa: ANN001, ANN202
        step = real_step(model, opt, idx, targets, autocast=autocast)
        step.model = model
        seen.append((model, tuple(idx.shape), autocast))
        return step

    values = iter([1000, 1100, 1200, 1000, 900, 800, 1000, 1000, 2000, 1500])
    expect_on = iter([False, False, False, True, False, True, False, True, False, True])

    def peak_memory(fn, device="cpu"):  # noqa: ANN001, ANN202
        layers = [m for m in fn.model.modules() if isinstance(m, DiffusionAttention)]
        on = next(expect_on)
        assert all(m.recompute is on for m in layers)
        return next(values)

    monkeypatch.setattr(C, "train_step", train_step)
    monkeypatch.setattr(C, "peak_memory", peak_memory)
    rep = bench_memory.main(_argv(tmp_path, "--quick"))
    assert [s[1:] for s in seen] == [((2, 16), "cpu")] * 6
    models = [s[0] for s in seen]
    assert not any(n.endswith("bias") for n, _ in models[0].named_parameters())  # nanoGPT, bias=False
    ops = [[(type(o).__name__, o.num_heads, getattr(o, "steps", None)) for o in
            next(m for m in model.modules() if isinstance(m, DiffusionAttention)).operators] for model in models[1:]]
    assert ops[1] == [("AttentionOperator", 3, None), ("LaplacianOperator", 3, None)]
    assert ops[2] == ops[3] == [("AttentionOperator", 4, None), ("HeatOperator", 2, 4)]
    backends = [next(m for m in model.modules() if isinstance(m, DiffusionAttention)).backend for model in models[1:]]
    assert backends == ["auto", "auto", "sdpa", "auto", "sdpa"]
    rows = {r["model"]: (r["vs_nanogpt"], r["vs_nanogpt_recompute"]) for r in rep.rows}
    assert rows == {"nanoGPT": (1.0, None), "DiffusionGPT attention": (1.1, None),
                    "DiffusionGPT half Laplacian": (1.2, 1.0), "DiffusionGPT 2 heat(K=4), fused kernel": (0.9, 0.8),
                    "DiffusionGPT 2 heat(K=4), auto": (1.0, 1.0),
                    "DiffusionGPT half learned heat(t=0.5), fused kernel": (2.0, 1.5)}
    seen.clear()
    monkeypatch.setattr(C, "peak_memory", lambda fn, device="cpu": 1000)
    bench_memory.main(_argv(tmp_path, "--batch", "3"))
    assert {s[1] for s in seen} == {(3, 16)}


# ============================================================================ bench_compile
def _tiny_gpt():
    torch.manual_seed(0)
    return DiffusionGPT(GPTConfig(vocab_size=65, block_size=8, n_layer=1, n_head=2, n_embd=16))


def test_compile_step_runs_backward_and_clears_the_gradients():
    """kills (bench_compile.py): the step without ``loss.backward()``; the gradients not cleared after the step"""
    model = _tiny_gpt()
    fired = []
    for p in model.parameters():
        p.register_hook(lambda g: fired.append(1))
    idx = torch.randint(0, 65, (2, 8), generator=torch.Generator().manual_seed(0))
    bench_compile.step(model, idx, idx)()
    assert len(fired) == len(list(model.parameters()))
    assert all(p.grad is None for p in model.parameters())


class _Compiled(torch.nn.Module):
    def __init__(self, model, log, kw):
        super().__init__()
        self.model, self.log, self.kw = model, log, kw

    def forward(self, idx, targets):  # noqa: ANN001, ANN201
        self.log.append(("compiled", tuple(idx.shape)))
        return self.model(idx, targets)


def test_compile_quick_run_compiles_fullgraph_times_eager_against_compiled_and_writes_each_row(monkeypatch, tmp_path):
    """kills (bench_compile.py): quick batch x block 12 x 64 instead of 4 x 32; --rounds ignored; torch.compile
    without ``fullgraph=True``; the eager candidate running the compiled model; each layout's row not written as it
    finishes (on success or on failure); the models not seeded alike (``torch.manual_seed(0)`` dropped)"""
    log, compiled, json_rows, rounds, calls = [], [], [], [], []
    state = {"fail_first": False}

    def compile_(model, **kw):  # noqa: ANN001, ANN202
        json_path = tmp_path / "bench_compile.json"
        json_rows.append(json.loads(json_path.read_text())["rows"] if json_path.exists() else None)
        wrapper = _Compiled(model, log, kw)
        compiled.append(wrapper)
        if len(compiled) == 1 and state["fail_first"]:
            raise RuntimeError("graph break")
        return wrapper

    def measure(fns, **kw):  # noqa: ANN001, ANN202
        rounds.append(kw["rounds"])
        n = len(log)
        fns["eager"]()
        fns["compiled"]()
        calls.append(len(log) - n)  # recorded, not asserted here: main turns an exception into a "does not compile" row
        return _timings({"eager": 1.0, "compiled": 0.5})

    monkeypatch.setattr(bench_compile.torch, "compile", compile_)
    monkeypatch.setattr(C, "measure", measure)
    torch.manual_seed(123)
    torch.randn(7)
    bench_compile.main(_argv(tmp_path, "--quick", "--rounds", "4"))
    assert rounds == [4, 4]
    assert calls == [1, 1]  # one call of the compiled model per measure: the eager candidate ran the model itself
    assert all(c.kw == {"fullgraph": True} for c in compiled)
    assert {shape for _, shape in log} == {(4, 32)}
    assert json_rows[1] is not None and [r["layout"] for r in json_rows[1]] == ["attention"]
    torch.manual_seed(0)
    fresh = DiffusionGPT(GPTConfig(vocab_size=65, block_size=32, n_layer=4, n_head=4, n_embd=128))
    for a, b in zip(compiled[0].model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    # a layout that does not compile is written at once too
    (tmp_path / "bench_compile.json").unlink()
    log.clear(), compiled.clear(), json_rows.clear()
    state["fail_first"] = True
    bench_compile.main(_argv(tmp_path, "--quick"))
    assert json_rows[1] == [{"layout": "attention", "error": "RuntimeError: graph break"}]


def test_layout_labels_match_their_specs():
    """kills (bench_compile.py): a layout's K in its spec not the K of its label (``ppr(K=4)`` run with steps=2)"""
    for layouts in (bench_compile.LAYOUTS, bench_compile.CUDA_LAYOUTS):
        for name, extra in layouts.items():
            for k in re.findall(r"K=(\d+)", name):
                assert f"steps={k}" in extra["heads"], name


# ============================================================================ equivalent mutants
# bench_triton_blocks.py
# - runner without ``_launch.BLOCKS.clear()`` before ``update(blocks)``: every caller passes a full copy of the
#   default table (``default`` or ``blocks_for(...)``, which starts from ``dict(default)``), so updating every key
#   leaves the same table as clearing first.
# - ``args.sizes if args.sizes else [0, 1]`` for ``is not None``: since the fix, an empty ``--sizes`` stops before
#   the selection, so both pick the same sizes.
# bench_kstep.py
# - ``del fns["auto"]`` for N >= 1024 also in --quick runs: the quick sizes are 64 and 256, so the branch never runs.
# bench_sparse.py
# - build_graph's ``kind == "random"`` as ``kind != "grid"``: main only asks for "random" and "grid".
# - runners' gradient ``None`` for forward+backward: step_callables then draws ``randn_like(x)``, the same shape
#   (N, D) from the same global generator as ``randn(x.shape[0], D)``: the same numbers.
# - _rss_kib's ``startswith(field + ":")`` as ``startswith(field)``: no other line of /proc/self/status starts with
#   "VmRSS" or "VmHWM", the two fields read.
# bench_memory.py
# - the first warm-up ``step()`` dropped: each measured path still runs its own warm-up step first, so AdamW's
#   state and the layers' caches exist at every measurement; the peaks are the same.
# bench_compile.py
# - ``cuda = dev.startswith("cuda")`` (also with --quick): differs only with a CUDA device (--quick on CUDA would
#   take the GPU config); not observable on CPU, where ``--device cuda`` is refused. Not killed here: needs a GPU.
