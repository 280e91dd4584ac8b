"""The claims of ``docs/performance.md`` and ``docs/theory/cost.rst`` held against the code and the committed results.

Each test pins one claim of a page (a number quoted from a results table, the rule of ``backend="auto"``, a
benchmark option, the timing method of ``benchmarks/_common.py``) to the code or to the committed
``benchmarks/results*/`` file it cites, and fails if either drifts.

Found and fixed (tests named ``test_bug_...``):

- ``docs/theory/cost.rst`` described the ``backend="auto"`` rule as the CPU limits alone ("otherwise
  ``"sdpa"``", and "short sequences, several steps: ``"matrix"``"), but ``choose_dense_backend`` is
  device-aware: on CUDA it keeps ``"sdpa"`` for short sequences and picks ``"matrix"`` for ``K >= 4`` when
  ``N M`` lies in ``CUDA_MATERIALISE_ELEMENTS``.
- ``ops.dense.choose_dense_backend``'s docstring said causal graphs "halve" the CPU sequence-length limits
  (128, 256, 384, 512); ``MATERIALISE_MAX_ELEMENTS_CAUSAL`` holds 64, 128, 256 and 384 (not 192 and 256).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import torch

import diffusionformer
from diffusionformer.functional import choose_dense_backend
from diffusionformer.ops import dense
from diffusionformer.ops.dense import (
    CUDA_MATERIALISE_ELEMENTS,
    MATERIALISE_MAX_ELEMENTS,
    MATERIALISE_MAX_ELEMENTS_CAUSAL,
)
from docs_tables import markdown_tables  # noqa: E402

ROOT = Path(diffusionformer.__file__).resolve().parent.parent
PERF = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
COST = (ROOT / "docs" / "theory" / "cost.rst").read_text(encoding="utf-8")
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_CUDA = ROOT / "benchmarks" / "results-cuda"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _tables(path: Path) -> list[list[dict[str, str]]]:
    """The markdown tables of a results file, each a list of rows keyed by the header."""
    return [rows for _, rows in markdown_tables(path.read_text(encoding="utf-8"))]


def _num(cell: str) -> float:
    return float(cell.split()[0])


def _common(monkeypatch):
    """``benchmarks/_common.py`` as the benchmark tests import it (the folder on ``sys.path``, for this test only)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import _common

    return _common


# --- bugs ---------------------------------------------------------------------------------------------------


def test_bug_cost_page_states_the_cuda_auto_rule():
    """Bug: cost.rst gave the CPU limits as the whole ``backend="auto"`` rule ("otherwise ``"sdpa"``"; "short
    sequences, several steps: ``"matrix"``"), while on CUDA tensors ``choose_dense_backend`` keeps ``"sdpa"``
    for short sequences and picks ``"matrix"`` for ``K >= 4`` with ``N M`` in ``CUDA_MATERIALISE_ELEMENTS``."""
    text = _flat(COST)
    assert "``CUDA_MATERIALISE_ELEMENTS``" in text
    low, high = CUDA_MATERIALISE_ELEMENTS
    assert (low, high) == (1024 ** 2, 2048 ** 2)
    assert ":math:`1024^2` to :math:`2048^2`, causal or not" in text
    assert '``"matrix"`` for :math:`K \\ge 4` when :math:`N M` lies in the range' in text
    # the rule as the page states it, against the function
    for causal in (False, True):
        for K in (0, 1, 2, 3, 4, 8, 16):
            for N in (64, 256, 512, 1023, 1024, 1536, 2048, 2049, 4096):
                want = "matrix" if K >= 4 and low <= N * N <= high else "sdpa"
                assert choose_dense_backend(N, N, K, is_causal=causal, device_type="cuda") == want, (causal, K, N)
    # a short sequence with several steps: "matrix" on a CPU, "sdpa" on a GPU, as the page now says
    assert choose_dense_backend(64, 64, 4) == "matrix"
    assert choose_dense_backend(64, 64, 4, device_type="cuda") == "sdpa"
    assert '``"matrix"`` on a CPU' in text


def test_bug_choose_dense_backend_docstring_states_the_causal_limits():
    """Bug: the docstring of ``choose_dense_backend`` said causal graphs "halve" the CPU limits (128, 256, 384,
    512 -> 64, 128, 192, 256), but ``MATERIALISE_MAX_ELEMENTS_CAUSAL`` holds 64, 128, 256 and 384."""
    doc = _flat(dense.choose_dense_backend.__doc__)
    assert "halve" not in doc
    m = re.search(r"up to ``N = M = (\d+)`` for ``K = 2``, (\d+) for ``K = 3``, (\d+) for ``K = 4\.\.7`` and "
                  r"(\d+) for ``K >= 8``; on causal graphs up to (\d+), (\d+), (\d+) and (\d+)", doc)
    assert m, doc
    lengths = [int(x) for x in m.groups()]
    for table, said in ((MATERIALISE_MAX_ELEMENTS, lengths[:4]), (MATERIALISE_MAX_ELEMENTS_CAUSAL, lengths[4:])):
        assert sorted(table) == [2, 3, 4, 8]
        assert [int(table[k] ** 0.5) ** 2 for k in (2, 3, 4, 8)] == [table[k] for k in (2, 3, 4, 8)]
        assert [int(table[k] ** 0.5) for k in (2, 3, 4, 8)] == said


# --- true claims, pinned --------------------------------------------------------------------------------------


def test_cpu_summary_auto_backend_cells_match_bench_kstep():
    """performance.md: auto within 10% of the better back-end on 46 of 48 cells; the two others 1.22x at N = 256,
    K = 4 forward and 1.30x at N = 2048, K = 8 forward + backward; and the committed "auto picks" column is
    what the rule picks today (the crossovers of bench_kstep.py set MATERIALISE_MAX_ELEMENTS)."""
    kernel = _tables(RESULTS / "bench_kstep.md")[0]
    assert len(kernel) == 48
    losses = [(_num(r["rule loss"]), r) for r in kernel]
    bad = [(loss, r) for loss, r in losses if loss > 1.10]
    assert len(kernel) - len(bad) == 46
    got = sorted((round(loss, 2), int(r["N"]), int(r["K"]), r["mode"]) for loss, r in bad)
    assert got == [(1.22, 256, 4, "fwd"), (1.30, 2048, 8, "fwd+bwd")]
    text = _flat(PERF)
    assert "within 10% of the better back-end on 46 of 48 cells" in text
    assert "(1.22x at N = 256, K = 4 forward; 1.30x at N = 2048, K = 8 forward + backward)" in text
    for r in kernel:
        N, K = int(r["N"]), int(r["K"])
        assert choose_dense_backend(N, N, K, is_causal=r["causal"] == "yes") == r["auto picks"], r


def test_cuda_auto_backend_cells_match_results_cuda():
    """performance.md (GPU): within 1.10x on 45 of 48 cells, the worst 1.28x at N = 2048, K = 2 (1.22x forward +
    backward); the committed CUDA "auto picks" column is the device-aware rule of today."""
    kernel = _tables(RESULTS_CUDA / "bench_kstep.md")[0]
    assert len(kernel) == 48
    assert sum(_num(r["rule loss"]) <= 1.10 for r in kernel) == 45
    worst = max(kernel, key=lambda r: _num(r["rule loss"]))
    assert (round(_num(worst["rule loss"]), 2), worst["N"], worst["K"], worst["causal"]) == (1.28, "2048", "2", "no")
    text = _flat(PERF)
    assert "within 1.10x on 45 of 48 cells" in text
    assert "to 1.28x (`N = 2048, K = 2`, non-causal" in text
    for r in kernel:
        N, K = int(r["N"]), int(r["K"])
        assert choose_dense_backend(N, N, K, is_causal=r["causal"] == "yes", device_type="cuda") == r["auto picks"]


def test_cpu_summary_dense_layer_and_sparse_numbers():
    """performance.md: attention/MHA at most 0.99x; mix forward at most 1.028x; sparse vs TransformerConv at
    1.6M edges 5.6-7.6x forward, 3.3-7.9x forward + backward, 0.12x peak memory; GPT 1.00x and 0.98x."""
    dense_rows = _tables(RESULTS / "bench_dense.md")[0]
    assert max(_num(r["attention / MHA"]) for r in dense_rows) <= 0.99
    assert max(_num(r["mixed / attention"]) for r in dense_rows if r["mode"] == "fwd") == 1.028
    speed, memory = _tables(RESULTS / "bench_sparse.md")[:2]
    big = [r for r in speed if int(r["E"]) > 1_000_000]
    fwd = sorted(_num(r["speed-up"]) for r in big if r["mode"] == "fwd")
    fb = sorted(_num(r["speed-up"]) for r in big if r["mode"] == "fwd+bwd")
    assert (round(fwd[0], 1), round(fwd[-1], 1), round(fb[0], 1), round(fb[-1], 1)) == (5.6, 7.6, 3.3, 7.9)
    assert {round(_num(r["ratio"]), 2) for r in memory if int(r["E"]) > 1_000_000} == {0.12}
    gpt = {r["model"]: r for r in _tables(RESULTS / "bench_gpt.md")[0]}
    assert round(_num(gpt["DiffusionGPT attention"]["throughput vs plain"]), 2) == 1.00
    assert round(_num(gpt["DiffusionGPT laplacian_heads=2"]["throughput vs plain"]), 2) == 0.98
    text = _flat(PERF)
    for claim in ("at most 0.99x (target 1.05)", "at most 1.028x everywhere", "5.6-7.6x faster forward",
                  "3.3-7.9x faster forward+backward, 0.12x the peak memory", "1.00x with attention heads, 0.98x"):
        assert claim in text, claim


def test_recompute_host_time_claim_matches_bench_host():
    """performance.md: with recompute, 12% and 15% more host time per forward + backward call
    (1.129x -> 1.268x half Laplacian, 1.876x -> 2.151x 2 heat heads on the fused kernel)."""
    fb = {r["model"]: _num(r["time / nanoGPT"]) for r in _tables(RESULTS / "bench_host.md")[1]}
    lap = fb["DiffusionGPT half Laplacian, recompute"] / fb["DiffusionGPT half Laplacian"]
    heat = fb["DiffusionGPT 2 heat(K=4), fused kernel, recompute"] / fb["DiffusionGPT 2 heat(K=4), fused kernel"]
    assert (round(100 * (lap - 1)), round(100 * (heat - 1))) == (12, 15)
    text = _flat(PERF)
    assert "1.129x [1.09-1.18] nanoGPT's time as it comes and 1.268x [1.24-1.33]" in text
    assert "1.876x [1.81-1.94] and 2.151x [2.08-2.22]" in text


def test_methodology_interleaved_rotation_and_paired_ratio(monkeypatch):
    """performance.md / _common.py: candidates run in interleaved rounds whose order rotates each round; a ratio
    is the median of the per-round paired ratios with its inclusive inter-quartile range."""
    C = _common(monkeypatch)
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in "abc"}
    C.measure(fns, rounds=3, block_s=0.0, warmup=0)
    timed = order[3:]  # after one untimed probe call each (calls per block = 1 with block_s = 0)
    assert timed == list("abc") + list("bca") + list("cab")
    timings = {"x": C.Timing([2.0, 4.0, 9.0, 1.0], 1), "base": C.Timing([1.0, 2.0, 3.0, 1.0], 1)}
    rs = [2.0, 2.0, 3.0, 1.0]
    q = statistics.quantiles(rs, n=4, method="inclusive")
    assert C.ratio(timings, "x", "base") == (statistics.median(rs), q[0], q[2])
    text = _flat(PERF)
    assert "a **ratio** is the median over rounds of the paired ratios" in text
    assert "with `time.process_time` under `--clock cpu`" in text


def test_methodology_clock_option(monkeypatch, tmp_path):
    """performance.md: `--clock cpu` times with time.process_time, the default with time.perf_counter."""
    import time

    C = _common(monkeypatch)
    try:
        C.set_clock("cpu")
        assert C._CLOCK is time.process_time
        C.set_clock("wall")
        assert C._CLOCK is time.perf_counter
    finally:
        C.set_clock("wall")
    # the process's thread count given, as parse_args sets it (a benchmark script's own process): else every core
    args = C.parse_args("x", ["--threads", str(torch.get_num_threads()), "--out", str(tmp_path)])
    assert args.clock == "wall"


def test_page_commands_use_existing_options():
    """Every `python benchmarks/<script>.py --option` the page quotes names an option its script defines."""
    commands = set(re.findall(r"`(?:python )?benchmarks/(\w+)\.py((?: --?[\w-]+(?: [\w.]+)?)*)`", PERF))
    assert len(commands) >= 5
    for script, tail in commands:
        source = (ROOT / "benchmarks" / f"{script}.py").read_text(encoding="utf-8")
        for shared in ("_common.py", "_warm.py"):  # the options every script shares
            source += (ROOT / "benchmarks" / shared).read_text(encoding="utf-8")
        for option in re.findall(r"(--[\w-]+)", tail):
            assert f'"{option}"' in source, (script, option)


def test_run_all_runs_every_benchmark_the_methodology_names():
    """performance.md: the one-script-per-item benchmarks named under Methodology are the ones run_all.py runs,
    and run_all's committed run used the command the page gives to regenerate the tables."""
    source = (ROOT / "benchmarks" / "run_all.py").read_text(encoding="utf-8")
    for name in ("bench_dense", "bench_kstep", "bench_sparse", "bench_crossover", "bench_gpt", "bench_host",
                 "profile_gaps"):
        assert f"`{name}.py`" in PERF
        assert f'"{name}"' in source, name
    run = json.loads((RESULTS / "run_all.json").read_text(encoding="utf-8"))
    assert run["command"] == "python benchmarks/run_all.py --device cpu --threads 1 --clock cpu"
    assert f"`{run['command']}`" in PERF
