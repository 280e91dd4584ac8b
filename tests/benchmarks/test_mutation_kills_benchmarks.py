"""Tests written in a mutation-testing audit of the benchmark scripts that judge issue 15's GPU targets.

Each test kills a mutant of ``benchmarks/`` that the rest of the suite let through (the docstring of
each test names it) and checks the scripts against independent references: hand-worked ratios,
quartiles and budgets (numpy's percentiles, the issue's formula ``1.05 (1 + (K - 1) G / H)`` worked by
hand), a deterministic stand-in clock and stand-in timings and peaks (so that a verdict at its exact
boundary is tested without timing anything), nanoGPT's own ``model.py`` (``tests/models/nanogpt_reference.py``)
for the baseline model, and a stand-in python for ``gpu_suite.sh``'s GPU path. CPU only, deterministic
(seeded generators), no wall-clock asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _common as C  # noqa: E402
import bench_compile  # noqa: E402
import bench_host  # noqa: E402
import bench_issue15 as B  # noqa: E402
import bench_memory  # noqa: E402
import nanogpt_model  # noqa: E402
from diffusionformer import DiffusionAttention  # noqa: E402


def _timings(times: dict[str, float], rounds: int = 3) -> dict[str, C.Timing]:
    """Stand-in result of ``C.measure``: every round of a candidate takes the same time."""
    return {name: C.Timing([t] * rounds, 1) for name, t in times.items()}


# ---------------------------------------------------------------------------- _common: ratios and quartiles
def test_ratio_is_the_median_of_paired_ratios_with_inclusive_quartiles():
    """kills: _quartiles with method="exclusive"; _quartiles returning (q1, median); ratio using the mean of the
    paired ratios instead of their median"""
    base = [2.0, 1.0, 4.0, 1.0, 1.0]
    cand = [2.0, 2.0, 12.0, 4.0, 50.0]  # paired ratios 1, 2, 3, 4, 50 (rounds drift: base is not constant)
    t = {"c": C.Timing(cand, 1), "b": C.Timing(base, 1)}
    med, lo, hi = C.ratio(t, "c", "b")
    ratios = np.array([1.0, 2.0, 3.0, 4.0, 50.0])
    assert med == pytest.approx(float(np.median(ratios)))  # 3, not the mean 12
    assert lo == pytest.approx(float(np.percentile(ratios, 25)))  # 2 (numpy's linear = "inclusive")
    assert hi == pytest.approx(float(np.percentile(ratios, 75)))  # 4
    assert (lo, hi) == pytest.approx((2.0, 4.0))
    assert C.Timing([5.0, 1.0, 3.0, 2.0, 4.0], 1).quartiles() == pytest.approx((2.0, 4.0))


def test_one_round_gives_its_ratio_as_median_and_both_quartiles():
    """kills: _quartiles' one-sample branch ``len(xs) < 2`` weakened to ``< 1`` (statistics.quantiles then raises)"""
    t = {"c": C.Timing([3.0], 1), "b": C.Timing([2.0], 1)}
    assert C.ratio(t, "c", "b") == pytest.approx((1.5, 1.5, 1.5))
    assert C.Timing([0.25], 7).quartiles() == (0.25, 0.25)


# ---------------------------------------------------------------------------- _common: measure with a stand-in clock
class _FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_measure_times_per_call_in_rotated_rounds_after_warmup(monkeypatch):
    """kills: measure without the rotation of the order each round; n = round(block_s * one) instead of
    block_s / one; _time_block returning the block's time instead of per call; the warm-up loop dropped"""
    clock = _FakeClock()
    monkeypatch.setattr(C, "_CLOCK", clock)
    cost = {"a": 0.001, "b": 0.004, "c": 0.002}
    log: list[str] = []

    def make(name):
        def call():
            log.append(name)
            clock.now += cost[name]
        return call

    fns = {n: make(n) for n in cost}
    t = C.measure(fns, device="cpu", rounds=3, block_s=0.02, warmup=2)
    # n = round(block_s / one call): 20, 5, 10 calls per block
    assert {n: t[n].calls_per_block for n in cost} == {"a": 20, "b": 5, "c": 10}
    for n in cost:  # per-call seconds, one sample per round
        assert t[n].samples == pytest.approx([cost[n]] * 3, rel=1e-9)
    # warm-up: 2 calls, then 1 call timed alone, per candidate in order; then the rounds
    head = ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    assert log[:9] == head
    blocks = log[9:]
    order = []
    for name in blocks:
        if not order or order[-1][0] != name:
            order.append([name, 0])
        order[-1][1] += 1
    assert [n for n, _ in order] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # rotated every round
    assert all(k == {"a": 20, "b": 5, "c": 10}[n] for n, k in order)


def test_set_clock_cpu_is_process_time_and_wall_is_perf_counter(monkeypatch):
    """kills: set_clock's test flipped (``name != "cpu"``: --clock cpu would time the wall clock)"""
    monkeypatch.setattr(C, "_CLOCK", C._CLOCK)  # restored after the test
    C.set_clock("cpu")
    assert C._CLOCK is time.process_time
    C.set_clock("wall")
    assert C._CLOCK is time.perf_counter


def test_cpu_clock_with_cuda_is_refused(monkeypatch, capsys):
    """kills: parse_args dropping the ``--device cuda --clock cpu`` error (a GPU timed by host CPU time)"""
    monkeypatch.setattr(C.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(C, "setup_threads", lambda n: 1)
    monkeypatch.setattr(C, "set_clock", lambda name: None)
    with pytest.raises(SystemExit):
        C.parse_args("t", ["--device", "cuda", "--clock", "cpu"])
    assert "--clock cpu measures host CPU time" in capsys.readouterr().err


# ---------------------------------------------------------------------------- _common: peak memory
def test_cpu_peak_is_measured_from_the_counter_before_the_first_event(monkeypatch):
    """kills: peak_memory subtracting the counter after the first event (totals[0]) instead of before it"""
    # an earlier profiled window left the running total at 1000; the call allocates 400, then 600, frees 400
    monkeypatch.setattr(C, "cpu_allocations", lambda fn: (fn(), [400, 600, -400], [1400, 2000, 1600]))
    assert C.peak_memory(lambda: None) == 1000
    monkeypatch.setattr(C, "cpu_allocations", lambda fn: (fn(), [], []))
    assert C.peak_memory(lambda: None) == 0


def test_cuda_peak_is_net_of_what_was_allocated_before(monkeypatch):
    """kills: peak_memory on CUDA returning max_memory_allocated() without subtracting the memory held before
    the call (parameters, AdamW's state): GPT peaks would then count the model"""
    cuda = C.torch.cuda
    state = {"alloc": 300, "peak": 300}

    def fn():
        state["peak"] = 1000

    monkeypatch.setattr(cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda *a, **k: state.update(peak=state["alloc"]))
    monkeypatch.setattr(cuda, "memory_allocated", lambda *a, **k: state["alloc"])
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda *a, **k: state["peak"])
    assert C.peak_memory(fn, "cuda") == 700


# ---------------------------------------------------------------------------- _common: formatting and reports
def test_rfmt_and_check():
    """kills: rfmt printing the quartiles as q3-q1; check() answering "yes" for a missed target"""
    assert C.rfmt((1.0, 0.9, 1.25)) == "1.000 [0.90-1.25]"
    assert C.check(True) == "yes" and C.check(False) == "**no**"


def test_every_table_is_written_at_once(tmp_path):
    """kills: Report.table not writing the report (a GPU call cut short by its time limit would lose the tables)"""
    args = argparse.Namespace(device="cpu", threads=1, out=str(tmp_path), quick=False, clock="wall")
    rep = C.Report("bench_x", "X", args)
    rep.table("first", ["a", "b"], [["x", 1.5]])
    saved = json.loads((tmp_path / "bench_x.json").read_text())
    assert saved["tables"] == [{"caption": "first", "header": ["a", "b"], "rows": [["x", 1.5]]}]
    assert "**first**" in (tmp_path / "bench_x.md").read_text()


# ---------------------------------------------------------------------------- bench_issue15: budgets and verdicts
@pytest.mark.parametrize("spec", ["attention:8,heat(t=1.0, steps=8):2,ppr(alpha=0.1, steps=4):2",
                                  "attention:8,ppr(alpha=0.1, steps=4):2,heat(t=1.0, steps=8):2"])
def test_budget_of_a_layer_with_two_k_step_groups(spec):
    """kills: budget taking K from the last K-step group (``K = op.degree``) instead of the largest; budget
    counting G as the last group's heads (``G = count``) instead of all K-step heads"""
    layer = DiffusionAttention(96, 12, spec, causal=True, bias=False, backend="sdpa")
    # G = 4 heads with K-step operators, K = 8 the largest: 1.05 (1 + 7 * 4 / 12) = 1.05 * 10 / 3
    assert B.budget(layer)[0] == pytest.approx(3.5)
    assert B.budget(layer)[1] == "1.05(1+7*4/12)"


def test_a_ratio_equal_to_its_budget_meets_it():
    """kills: verdict's ``r <= target`` made strict (a layer exactly at its budget would fail)"""
    t = _timings({B.REFERENCE: 1.0, "all attention": 1.0, "2 heat(t=1, K=8)": 2.0})
    assert B.verdict(t, "all attention", 1.00)[2]
    assert B.verdict(t, "2 heat(t=1, K=8)", 2.0)[2]
    assert not B.verdict(t, "2 heat(t=1, K=8)", 1.99)[2]


def test_layer_table_judges_each_layer_against_its_baseline(monkeypatch, tmp_path):
    """kills: part_layers marking the target "(/ reference)" on the wrong rows; the record's target_baseline not
    the verdict's baseline; (with the boundary rows) verdict's ``<=`` made strict"""
    # smoke size (B, N, D, H) = (2, 32, 64, 4): budgets at H = 4 worked by hand
    budgets = {"all attention": 1.00, "half Laplacian": 1.03, "2 heat(t=1, K=8)": 1.05 * (1 + 7 * 2 / 4),
               "2 ppr(K=10)": 1.05 * (1 + 9 * 2 / 4), "half learned heat(t=0.5)": 1.05 * (1 + 5 * 2 / 4)}
    times = {B.REFERENCE: 1.0, "all attention": 1.0, "half Laplacian": 1.03, "2 heat(t=1, K=8)": 5.0,
             "2 ppr(K=10)": 5.0, "half learned heat(t=0.5)": 3.0}
    expected_met = {"all attention": True, "half Laplacian": True, "2 heat(t=1, K=8)": False, "2 ppr(K=10)": True,
                    "half learned heat(t=0.5)": True}
    monkeypatch.setattr(C, "measure", lambda fns, **kw: _timings({n: times[n] for n in fns}, 2))
    args = argparse.Namespace(device="cpu", threads=1, out=str(tmp_path), quick=False, clock="wall", rounds=None,
                              layer_sizes=None, library_backend="sdpa")
    rep = C.Report("bench_issue15", "t", args)
    B.part_layers(args, rep, True, False)
    assert len(rep.sections) == 2  # causal, forward and forward+backward
    for caption, header, rows in rep.sections:
        assert header[-2:] == ["target", "met"]
        by_name = {r[0]: r for r in rows}
        assert by_name[B.REFERENCE][-3:] == ["", "", ""]
        for name, target in budgets.items():
            row = by_name[name]
            suffix = " (/ reference)" if name == "all attention" else ""
            assert row[-2] == f"{target:.2f}{suffix}", (caption, name)
            assert row[-1] == ("yes" if expected_met[name] else "**no**"), (caption, name)
    recs = [r for r in rep.rows if "target" in r]
    assert len(recs) == 10
    for r in recs:
        assert r["target_baseline"] == (B.REFERENCE if r["layer"] == "all attention" else "all attention")
        assert r["target"] == pytest.approx(budgets[r["layer"]])


def test_size_selection():
    """kills: selected_layer_sizes / selected_gpt_sizes keeping the sizes not named (``not in``)"""
    ns = argparse.Namespace(layer_sizes=[0, 2], gpt_sizes=["12L-768"])
    assert B.selected_layer_sizes(ns, False) == [(8, 1024, 768, 12), (64, 256, 384, 6)]
    assert [s[0] for s in B.selected_gpt_sizes(ns, False)] == ["12L-768"]
    everything = argparse.Namespace(layer_sizes=None, gpt_sizes=None)
    assert len(B.selected_layer_sizes(everything, False)) == 3 and len(B.selected_gpt_sizes(everything, False)) == 2
    assert B.selected_layer_sizes(ns, True) == [(2, 32, 64, 4)]


@pytest.mark.parametrize("bad", ["3", "-1"])
def test_layer_size_index_out_of_range_is_an_error(bad, tmp_path):
    """kills: main's range check of --layer-sizes off by one (``i <= len(LAYER_SIZES)``: index 3 would pass and
    silently select no size, so a GPU call would judge nothing); the error is raised before any report is written"""
    with pytest.raises(SystemExit, match=r"--layer-sizes \[-?\d\] out of range: 0 \.\. 2"):
        B.main(["--device", "cpu", "--threads", "1", "--out", str(tmp_path), "--parts", "layers", "--layer-sizes", bad])
    assert not (tmp_path / "bench_issue15.md").exists()


# ---------------------------------------------------------------------------- bench_issue15: GPT vs nanoGPT
def test_gpt_table_throughput_and_memory_verdicts(monkeypatch, tmp_path):
    """kills: part_gpt's throughput ratio inverted (time / nanoGPT's time); ``r >= target`` or ``mem <= 1.05``
    made strict; the recompute rows losing their target (", recompute" not stripped); GPT_TARGETS' 0.97
    changed; the memory ratio inverted; the peak taken without the warm-up step that makes AdamW's state"""
    names: dict[int, str] = {}
    real_models, real_step = B.gpt_models, C.train_step

    def gpt_models(*a, **k):
        ms = real_models(*a, **k)
        names.update({id(m): n for n, m in ms.items()})
        return ms

    def train_step(model, opt, idx, targets, autocast=None):
        step = real_step(model, opt, idx, targets, autocast=autocast)
        step.model, step.opt = model, opt
        return step

    peaks = {"nanoGPT": 1000, "DiffusionGPT attention": 1050, "DiffusionGPT half Laplacian": 1000,
             "DiffusionGPT 2 heat(K=4)": 900, "DiffusionGPT half Laplacian, recompute": 1051,
             "DiffusionGPT 2 heat(K=4), recompute": 800}

    def peak_memory(fn, device="cpu"):
        assert len(fn.opt.state) > 0, "peak measured before a warm-up step made AdamW's state"
        return peaks[names[id(fn.model)]]

    # step times: nanoGPT 0.97, so throughput = 0.97 / time is exactly 1.00 and 0.97 at the boundaries
    times = {"nanoGPT": 0.97, "DiffusionGPT attention": 0.97, "DiffusionGPT half Laplacian": 1.0,
             "DiffusionGPT 2 heat(K=4)": 1.2, "DiffusionGPT half Laplacian, recompute": 1.0,
             "DiffusionGPT 2 heat(K=4), recompute": 0.97}
    monkeypatch.setattr(B, "gpt_models", gpt_models)
    monkeypatch.setattr(C, "train_step", train_step)
    monkeypatch.setattr(C, "peak_memory", peak_memory)
    monkeypatch.setattr(C, "measure", lambda fns, **kw: _timings({n: times[n] for n in fns}, 2))
    args = argparse.Namespace(device="cpu", threads=1, out=str(tmp_path), quick=False, clock="wall", rounds=None,
                              gpt_sizes=None, library_backend="sdpa")
    rep = C.Report("bench_issue15", "t", args)
    B.part_gpt(args, rep, True, False)
    (caption, header, rows), = rep.sections
    assert header[3] == "throughput / nanoGPT" and header[-3:] == ["memory / nanoGPT", "target", "met"]
    got = {r[0]: (r[3], r[5], r[6], r[7]) for r in rows}
    assert got == {
        "nanoGPT": ("1 (baseline)", "1.000", "", ""),
        "DiffusionGPT attention": ("1.000 [1.00-1.00]", "1.050", "1.00", "yes"),  # both at their boundary
        "DiffusionGPT half Laplacian": ("0.970 [0.97-0.97]", "1.000", "0.97", "yes"),  # at the boundary
        "DiffusionGPT 2 heat(K=4)": ("0.808 [0.81-0.81]", "0.900", "0.85", "**no**"),  # 0.97 / 1.2 < 0.85
        "DiffusionGPT half Laplacian, recompute": ("0.970 [0.97-0.97]", "1.051", "0.97", "**no**"),  # memory
        "DiffusionGPT 2 heat(K=4), recompute": ("1.000 [1.00-1.00]", "0.800", "0.85", "yes"),
    }
    rec = {r["model"]: r for r in rep.rows}
    assert rec["DiffusionGPT 2 heat(K=4)"]["throughput_vs_nanogpt"][0] == pytest.approx(0.97 / 1.2)
    assert rec["DiffusionGPT half Laplacian, recompute"]["target"] == 0.97


# ---------------------------------------------------------------------------- bench_memory
def test_memory_table_takes_the_better_of_recompute_on_and_off(monkeypatch, tmp_path):
    """kills: bench_memory judging only the peak without recompute (``best = off``); ``best <= 1.05 base`` made
    strict"""
    monkeypatch.setattr(bench_memory, "SIZE", (1, 4, 32, 16, 65))  # tiny GPT: 1 layer, 4 heads, width 32, T 16
    # peaks in call order: nanoGPT; attention; then (off, on) for each of the four recomputing variants
    seq = iter([1000, 1050, 2000, 1000, 1100, 1200, 1051, 1052, 900, 2000])
    monkeypatch.setattr(C, "peak_memory", lambda fn, device="cpu": next(seq))
    rep = bench_memory.main(["--quick", "--device", "cpu", "--threads", "1", "--out", str(tmp_path)])
    (caption, header, rows), = rep.sections
    got = {r[0]: (r[2], r[4], r[5]) for r in rows}
    assert got == {
        "nanoGPT": ("1.000", "", ""),
        "DiffusionGPT attention": ("1.050", "", "yes"),  # exactly 1.05: met
        "DiffusionGPT half Laplacian": ("2.000", "1.000", "yes"),  # met with recompute on
        "DiffusionGPT 2 heat(K=4), fused kernel": ("1.100", "1.200", "**no**"),
        "DiffusionGPT 2 heat(K=4), auto": ("1.051", "1.052", "**no**"),
        "DiffusionGPT half learned heat(t=0.5), fused kernel": ("0.900", "2.000", "yes"),  # met with it off
    }


# ---------------------------------------------------------------------------- bench_compile
def test_compiled_must_be_strictly_faster(monkeypatch, tmp_path):
    """kills: bench_compile's ``compiled / eager < 1`` made ``<= 1`` (a compiled step as slow as eager passing);
    the ratio taken as eager / compiled"""
    monkeypatch.setattr(bench_compile.torch, "compile", lambda model, fullgraph=False: model)
    per_layout = iter([{"eager": 1.0, "compiled": 1.0}, {"eager": 1.0, "compiled": 0.5}])
    monkeypatch.setattr(C, "measure", lambda fns, **kw: _timings(next(per_layout)))
    rep = bench_compile.main(["--quick", "--device", "cpu", "--threads", "1", "--out", str(tmp_path)])
    (caption, header, rows), = rep.sections
    assert [(r[3], r[-1]) for r in rows] == [("1.000 [1.00-1.00]", "**no**"), ("0.500 [0.50-0.50]", "yes")]
    assert [r["compiled_faster"] for r in rep.rows] == [False, True]


# ---------------------------------------------------------------------------- bench_host
def test_no_id_check_switches_the_check_off_only_while_active_and_restores_it():
    """kills: no_id_check's ``if not active`` flipped; the original check not restored when the body raises
    (no ``finally``)"""
    gpt = bench_host._gpt
    original = gpt._check_token_ids
    with bench_host.no_id_check(False):
        assert gpt._check_token_ids is original
    with bench_host.no_id_check(True):
        assert gpt._check_token_ids is not original
        assert gpt._check_token_ids(torch.tensor([[10**6]]), 65) is None  # an out-of-vocabulary id passes
    assert gpt._check_token_ids is original
    with pytest.raises(RuntimeError, match="inside"):
        with bench_host.no_id_check(True):
            raise RuntimeError("inside")
    assert gpt._check_token_ids is original


def test_host_ratios_are_time_over_nanogpts_with_the_id_check_off(monkeypatch, tmp_path):
    """kills: bench_host's ratio inverted (nanoGPT / model: lower would no longer be better); main keeping the
    CPU id check on while timing (``no_id_check(args.id_check)``)"""
    original = bench_host._gpt._check_token_ids

    def measure(fns, **kw):
        assert bench_host._gpt._check_token_ids is not original, "the CPU id check is on while timing"
        return _timings({n: (1.0 if n == "nanoGPT" else 1.25) for n in fns})

    monkeypatch.setattr(C, "measure", measure)
    rep = bench_host.main(["--quick", "--device", "cpu", "--threads", "1", "--out", str(tmp_path)])
    assert len(rep.sections) == 2
    for caption, header, rows in rep.sections:
        assert header[3] == "time / nanoGPT"
        assert rows[0][:1] + rows[0][3:4] == ["nanoGPT", "1 (baseline)"]
        assert all(r[3] == "1.250 [1.25-1.25]" for r in rows[1:])
    assert bench_host._gpt._check_token_ids is original


# ---------------------------------------------------------------------------- nanogpt_model against nanoGPT's model.py


def _pair(ref_mod, bias: bool = False):
    kw = dict(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=bias)
    torch.manual_seed(0)
    ref = ref_mod.GPT(ref_mod.GPTConfig(**kw)).double()
    torch.manual_seed(0)
    ours = nanogpt_model.GPT(nanogpt_model.NanoGPTConfig(**kw)).double()
    return ref, ours


@pytest.mark.parametrize("bias", [False, True])
def test_benchmark_nanogpt_is_nanogpts_model(nanogpt_reference, bias):
    """kills (benchmarks/nanogpt_model.py): the residual projections' init std 0.02 / sqrt(L) instead of
    / sqrt(2 L); weight tying dropped; ``is_causal=False``; ``ignore_index=-1`` dropped from the loss; the
    1-dim tensors put in the decaying AdamW group (``dim() > 2``); ``T > block_size`` made ``>=``"""
    ref, ours = _pair(nanogpt_reference, bias)
    rp, op = dict(ref.named_parameters()), dict(ours.named_parameters())
    assert rp.keys() == op.keys()
    for k in rp:  # same seed, same construction: the same GPT-2 initialisation, bit for bit
        assert torch.equal(rp[k], op[k]), k
    assert ours.lm_head.weight is ours.transformer.wte.weight
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 11, (3, 8), generator=g)  # T = block_size: allowed
    targets = torch.randint(0, 11, (3, 8), generator=g)
    targets[0, :3] = -1  # nanoGPT's ignored positions
    lr, loss_r = ref(idx, targets)
    lo, loss_o = ours(idx, targets)
    torch.testing.assert_close(lo, lr, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss_o, loss_r, rtol=1e-12, atol=1e-12)
    loss_r.backward()
    loss_o.backward()
    for k in rp:
        torch.testing.assert_close(op[k].grad, rp[k].grad, rtol=1e-10, atol=1e-12, msg=k)
    ro = ref.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cpu")
    oo = ours.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cpu")
    assert [(len(a["params"]), a["weight_decay"]) for a in oo.param_groups] == \
        [(len(a["params"]), a["weight_decay"]) for a in ro.param_groups]
    with pytest.raises(ValueError, match="exceeds block_size"):
        ours(torch.zeros(1, 9, dtype=torch.long))


# ---------------------------------------------------------------------------- gpu_suite.sh: the GPU path's steps
SUITE = BENCH / "gpu_suite.sh"
STUB = """#!/usr/bin/env bash
# a stand-in python: logs its arguments, answers every check (CUDA visible, xdist and triton import)
echo "$*" >> "$STUB_LOG"
exit 0
"""


def _gpu_suite(tmp_path: Path, *flags: str, steps: str | None = None) -> list[str]:
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log = tmp_path / "calls.txt"
    log.unlink(missing_ok=True)  # one suite run per log
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_SUITE_", "BENCH_ISSUE15_ARGS"))}
    env.update(PYTHON=str(stub), STUB_LOG=str(log))
    if steps is not None:
        env["GPU_SUITE_STEPS"] = steps
    res = subprocess.run(["bash", str(SUITE), *flags, str(tmp_path / "out")], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return [c for c in log.read_text().splitlines() if "benchmarks/" in c or "tests/ops" in c]


def _scripts(calls: list[str]) -> list[str]:
    return [next(w for w in c.split() if w.startswith(("benchmarks/", "tests/"))) for c in calls]


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash, timeout")
def test_gpu_suite_issue15_calls_run_their_steps_on_cuda(tmp_path):
    """kills (gpu_suite.sh): the GPU call of bench_issue15.py without ``--library-backend sdpa``; ``step`` always
    true; the memory step's ``--issue15`` test flipped"""
    first = _gpu_suite(tmp_path, "--issue15", steps="tests,issue15")
    assert _scripts(first) == ["tests/ops", "benchmarks/bench_issue15.py"]
    assert "--device cuda" in first[1] and "--library-backend sdpa" in first[1]
    second = _gpu_suite(tmp_path, "--issue15", steps="host,memory,compile,blocks")
    assert _scripts(second) == ["benchmarks/bench_host.py", "benchmarks/bench_memory.py", "benchmarks/bench_compile.py",
                                "benchmarks/bench_triton_blocks.py"]
    assert all("--device cuda" in c for c in second)


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash, timeout")
def test_gpu_suite_grid_only_without_issue15_and_host_memory_only_with_it(tmp_path):
    """kills (gpu_suite.sh): the grid step (run_all.py) run under ``--issue15``; bench_host.py run on its own in the
    full suite, where run_all.py already runs it"""
    full = _scripts(_gpu_suite(tmp_path))
    assert full == ["tests/ops", "benchmarks/run_all.py", "benchmarks/bench_issue15.py", "benchmarks/bench_compile.py",
                    "benchmarks/bench_triton_blocks.py"]
    issue15 = _scripts(_gpu_suite(tmp_path, "--issue15"))
    assert issue15 == ["tests/ops", "benchmarks/bench_host.py", "benchmarks/bench_memory.py",
                       "benchmarks/bench_issue15.py", "benchmarks/bench_compile.py", "benchmarks/bench_triton_blocks.py"]


# ---------------------------------------------------------------------------- bench_gpt (issue 7's CPU comparison)
def test_bench_gpt_throughput_is_baseline_time_over_time(monkeypatch, tmp_path):
    """kills: bench_gpt's throughput ratio inverted (time / baseline time); its ``>= 0.95`` made strict"""
    import bench_gpt

    times = {"plain (F.sdpa)": 0.95, "DiffusionGPT attention": 1.0, "DiffusionGPT laplacian_heads=2": 1.25}
    monkeypatch.setattr(C, "measure", lambda fns, **kw: _timings({n: times[n] for n in fns}))
    rep = bench_gpt.main(["--quick", "--device", "cpu", "--threads", "1", "--out", str(tmp_path)])
    (caption, header, rows), = rep.sections
    assert header[-2:] == ["throughput vs plain", ">= 0.95"]
    assert [(r[0], r[-2], r[-1]) for r in rows] == [
        ("plain (F.sdpa)", "1 (baseline)", ""),
        ("DiffusionGPT attention", "0.950 [0.95-0.95]", "yes"),  # exactly at the target
        ("DiffusionGPT laplacian_heads=2", "0.760 [0.76-0.76]", "**no**"),  # 0.95 / 1.25
    ]


def test_bench_gpt_plain_baseline_is_nanogpt(nanogpt_reference):
    """kills: bench_gpt's PlainGPT (the issue-7 baseline) with the residual projections' init std 0.02 / sqrt(L)
    instead of / sqrt(2 L), or its attention not causal: checked against nanoGPT's model.py with bias=True"""
    import bench_gpt

    ref_mod = nanogpt_reference
    pc = bench_gpt.PlainConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)
    torch.manual_seed(0)
    ref = ref_mod.GPT(ref_mod.GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16, dropout=0.0,
                                        bias=True)).double()
    plain = bench_gpt.PlainGPT(pc).double()
    plain.load_state_dict({k.removeprefix("transformer."): v for k, v in ref.state_dict().items()})
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 11, (3, 8), generator=g)
    targets = torch.randint(0, 11, (3, 8), generator=g)
    lr, loss_r = ref(idx, targets)
    lp, loss_p = plain(idx, targets)
    torch.testing.assert_close(lp, lr, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss_p, loss_r, rtol=1e-12, atol=1e-12)
    # GPT-2 initialisation at a size where the sample std is within 3% of its target
    big = bench_gpt.PlainGPT(bench_gpt.PlainConfig(n_layer=8, n_embd=256))
    for name, p in big.named_parameters():
        if name.endswith("c_proj.weight"):
            assert p.std().item() == pytest.approx(0.02 / (2 * 8) ** 0.5, rel=0.03), name
        elif name.endswith("c_attn.weight"):
            assert p.std().item() == pytest.approx(0.02, rel=0.03), name
    assert big.wte.weight is big.lm_head.weight


# ---------------------------------------------------------------------------- defect found in the audit
@pytest.mark.parametrize("flag,value", [("--rounds", "0"), ("--rounds", "-1"), ("--threads", "0"), ("--threads", "-2")])
def test_rounds_and_threads_below_one_are_refused_up_front(flag, value, monkeypatch, capsys):
    """defect (fixed): ``--rounds -1`` ran every warm-up and timed nothing, then failed with an IndexError of empty
    samples (``--rounds 0`` silently meant the default; ``--threads -2`` a bare RuntimeError of torch); now a
    usage error naming the option, before any work"""
    monkeypatch.setattr(C, "setup_threads", lambda n: pytest.fail("threads set up for a bad command line"))
    with pytest.raises(SystemExit) as e:
        C.parse_args("t", ["--device", "cpu", flag, value])
    assert e.value.code == 2
    assert f"{flag} must be >= 1, got {value}" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--layer-sizes"], "--layer-sizes was given without values"),
    (["--gpt-sizes"], "--gpt-sizes was given without values"),
    (["--parts"], "--parts was given without values"),
])
def test_issue15_options_given_without_values_are_refused_not_judging_nothing(argv, message, monkeypatch):
    """defect (fixed): ``--layer-sizes`` with no values (an empty ``$BENCH_ISSUE15_ARGS`` expansion) selected no
    size, and the call succeeded having judged nothing; now an error before any work"""
    monkeypatch.setattr(B, "triton_ready", lambda device: pytest.fail("work started for a bad command line"))
    with pytest.raises(SystemExit, match=message):
        B.main(["--device", "cpu", "--smoke", *argv])


def test_memory_batch_below_one_is_refused(tmp_path):
    """defect (fixed): ``bench_memory --batch 0`` silently meant the default batch (``--out`` under tmp_path, so
    that a regression cannot overwrite the committed ``benchmarks/results/bench_memory.*``)"""
    with pytest.raises(SystemExit, match="--batch must be >= 1, got 0"):
        bench_memory.main(["--device", "cpu", "--batch", "0", "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())
