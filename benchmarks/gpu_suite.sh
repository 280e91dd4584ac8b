#!/usr/bin/env bash
# Run the whole benchmark suite on one CUDA device and print the tables (about 10 minutes).
#
#   bash benchmarks/gpu_suite.sh [OUT_DIR]          (default OUT_DIR: benchmarks/results-cuda; a relative
#                                                    OUT_DIR is taken from the current directory)
#   bash benchmarks/gpu_suite.sh --smoke [OUT_DIR]  (or GPU_SUITE_SMOKE=1: a CPU smoke run of the
#                                                    issue-15 script at tiny sizes, default OUT_DIR
#                                                    /tmp/df-gpu-suite-smoke; no GPU needed; with
#                                                    GPU_SUITE_STEPS, the scripts of those steps)
#   bash benchmarks/gpu_suite.sh --issue15 [OUT_DIR] (or GPU_SUITE_ISSUE15=1: every step but the grid,
#                                                    step 2, with bench_host.py and bench_memory.py
#                                                    run alone, when GPU time is short)
#
# Steps on the GPU: (1) the Triton kernel tests compiled for the device (tests/ops, float64
# references) and the tests outside tests/ops that run on CUDA where it is (every layer and model on
# the device, the layers' device=/dtype=, the runner's GPU path), written to
# OUT_DIR/triton-tests.txt; a failure is reported and the suite goes on;
# (2) benchmarks/run_all.py (every benchmark of the library, bench_rivals.py, bench_host.py and bench_memory.py
# included; with --issue15 bench_host.py and bench_memory.py run alone); (3) benchmarks/bench_issue15.py
# (issue 15: every head type vs the SDPA reference layer, the profile of SDPA kernels, launches,
# copies, casts and syncs, GPT vs nanoGPT at both sizes, with a Triton column when triton imports;
# the library columns run backend='sdpa', the PyTorch path: 'auto' on CUDA materialises P for K >= 4 steps
# in CUDA_MATERIALISE_ELEMENTS and would take Triton once TRITON_IN_AUTO is set);
# (4) benchmarks/bench_compile.py (torch.compile(fullgraph=True) vs eager, the small GPT in bf16);
# (5) benchmarks/bench_triton_blocks.py (the Triton kernels' block sizes, warps and stages swept
# against the default geometry, with each configuration's output checked; when triton imports).
#
# Uses the python of $PYTHON (default: python3). Fails early when no CUDA device is visible
# (except in smoke mode). GPU_SUITE_STEPS (default: all) names the steps to run, comma-separated,
# from tests, grid, host, memory, issue15, compile, blocks, so that one suite can be split over several
# GPU calls of at most 10 minutes each, e.g. GPU_SUITE_STEPS=tests,issue15 then host,memory,compile,blocks
# (grid is step 2, which --issue15 leaves out; host and memory run alone unless grid, which includes them, runs). Every benchmark writes its tables as they finish,
# so a call cut short keeps them. GPU_SUITE_TEST_WORKERS (default 8) and GPU_SUITE_TEST_TIMEOUT (default
# 300 s) set step 1's pytest-xdist processes and time limit. BENCH_ISSUE15_ARGS passes options to bench_issue15.py, e.g.
# "--parts gpt --gpt-sizes 6L-384" or "--layer-sizes 2".
#
# Issue 15 in one 15-minute device budget (each call <= 600 s; a machine's cold start is 1-2 min):
#   call 1: GPU_SUITE_TEST_TIMEOUT=180 GPU_SUITE_STEPS=tests,issue15 bash benchmarks/gpu_suite.sh --issue15 $OUT
#           (3 files: triton-tests.txt, bench_issue15.md/.json; the tests' limit leaves the benchmark >= 6 min)
#   call 2: GPU_SUITE_STEPS=host,memory,compile,blocks bash benchmarks/gpu_suite.sh --issue15 $OUT
#           (8 files, .md and .json of 4 benchmarks: the most $OUT brings back, so add nothing to this call)
# Try each on CPU first with --smoke and the same GPU_SUITE_STEPS. An unknown step name, an unknown option or a
# second OUT_DIR is an error (exit 2) before anything runs; --smoke and --issue15 may come in either order.
set -euo pipefail
caller="$PWD"  # a relative OUT_DIR names a folder there, not in the checkout the script moves to
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
SMOKE="${GPU_SUITE_SMOKE:-0}"
ISSUE15="${GPU_SUITE_ISSUE15:-0}"
STEPS=",${GPU_SUITE_STEPS:-tests,grid,host,memory,issue15,compile,blocks},"
step() { [[ "$STEPS" == *",$1,"* ]]; }
# a misspelt step name would run nothing and exit 0 (a GPU call wasted): refuse it before anything runs
ALL_STEPS=" tests grid host memory issue15 compile blocks "
IFS=, read -r -a named <<< "${GPU_SUITE_STEPS:-tests}"
for s in ${named[@]+"${named[@]}"}; do
  if [[ -n "$s" && "$ALL_STEPS" != *" $s "* ]]; then
    echo "gpu_suite.sh: unknown step '$s' in GPU_SUITE_STEPS=${GPU_SUITE_STEPS:-}; the steps are:$ALL_STEPS" >&2
    exit 2
  fi
done
while [[ "${1:-}" == -* ]]; do  # the two options, in either order; anything else is not taken for OUT_DIR
  case "$1" in
    --smoke) SMOKE=1 ;;
    --issue15) ISSUE15=1 ;;
    *) echo "gpu_suite.sh: unknown option '$1' (options: --smoke, --issue15; then OUT_DIR)" >&2; exit 2 ;;
  esac
  shift
done
if [[ $# -gt 1 ]]; then
  echo "gpu_suite.sh: one OUT_DIR at most, got $*" >&2
  exit 2
fi
if [[ $# -eq 1 && "$1" != /* ]]; then set -- "$caller/$1"; fi
start=$(date +%s)
if [[ "$SMOKE" != "0" ]]; then
  OUT="${1:-/tmp/df-gpu-suite-smoke}"
  # Without GPU_SUITE_STEPS: the issue-15 script alone (< 1 min). With it: each named step's script on CPU at its
  # smoke size (host, memory, compile: --quick; blocks: --smoke under TRITON_INTERPRET=1; tests and grid are CI's),
  # so that each GPU call's split can be tried here first. bench_issue15.py takes the GPU call's options.
  SMOKE_STEPS=",${GPU_SUITE_STEPS:-issue15},"
  sstep() { [[ "$SMOKE_STEPS" == *",$1,"* ]]; }
  echo "gpu_suite.sh: smoke run on CPU (tiny sizes; the numbers mean nothing) -> $OUT"
  failed=()
  cpu=(--device cpu --threads 1 --out "$OUT")
  # named but not run here: say so (a smoke run of "tests,issue15" printed nothing about the tests)
  if sstep tests; then echo "gpu_suite.sh: step tests is not run in a smoke run (on CPU: python -m pytest tests/ops)"; fi
  if sstep grid; then echo "gpu_suite.sh: step grid is not run in a smoke run (on CPU: python benchmarks/run_all.py --quick)"; fi
  if sstep issue15; then
    # shellcheck disable=SC2086  # BENCH_ISSUE15_ARGS is a list of options
    "$PY" benchmarks/bench_issue15.py --smoke "${cpu[@]}" --library-backend sdpa ${BENCH_ISSUE15_ARGS:-} \
      || failed+=(bench_issue15.py)
  fi
  if sstep host; then "$PY" benchmarks/bench_host.py --quick "${cpu[@]}" || failed+=(bench_host.py); fi
  if sstep memory; then "$PY" benchmarks/bench_memory.py --quick "${cpu[@]}" || failed+=(bench_memory.py); fi
  if sstep compile; then "$PY" benchmarks/bench_compile.py --quick "${cpu[@]}" || failed+=(bench_compile.py); fi
  if sstep blocks; then
    if "$PY" -c "import triton" 2>/dev/null; then
      TRITON_INTERPRET=1 "$PY" benchmarks/bench_triton_blocks.py --smoke "${cpu[@]}" || failed+=(bench_triton_blocks.py)
    else
      echo "gpu_suite.sh: triton not installed, no block sweep"
    fi
  fi
  echo "gpu_suite.sh: smoke run done in $(( $(date +%s) - start )) s; tables in $OUT${failed[*]:+; FAILED: ${failed[*]}}"
  [[ ${#failed[@]} -eq 0 ]]
  exit
fi
OUT="${1:-benchmarks/results-cuda}"
"$PY" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_suite.sh: torch.cuda.is_available() is False; nothing to benchmark (try --smoke)")
print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__)
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton: not installed (no Triton column)")
PY
mkdir -p "$OUT"
# (1) the Triton kernels, compiled for this device, against the float64 references
if ! step tests; then
  :
else
  # On a fresh machine the tests' time is compiling: about 45 launch variants (dtype, causal, padding, mask
  # kind, dropout, block shape) of 5-6 kernels each, 2-3 s per kernel in one process, so up to ~10 min;
  # pytest-xdist (in the GPU image and in the dev extra) spreads them over GPU_SUITE_TEST_WORKERS
  # processes, and GPU_SUITE_TEST_TIMEOUT (s) bounds the step so that the benchmarks still run.
  xdist=()
  if "$PY" -c "import xdist" 2>/dev/null; then xdist=(-n "${GPU_SUITE_TEST_WORKERS:-8}"); fi
  # the tests outside tests/ops with cases that run on CUDA only where it is (skipped on a CPU-only machine), and
  # those of code written against private pieces of torch (_Pow.apply's fast path, the nested-jvp count), which
  # must hold under the image's torch too
  cuda_tests=(tests/core/test_devices.py tests/core/test_factory_kwargs_50.py tests/experiments/test_experiments_gpu.py
              tests/graph/test_graph_object.py tests/train/test_train_config.py
              tests/reliability/test_edge_probes_coefficient_overhead_56.py tests/reliability/test_edge_probes_review_56b.py)
  t_tests=$(date +%s)
  if timeout -k 10 "${GPU_SUITE_TEST_TIMEOUT:-300}" "$PY" -m pytest -q tests/ops "${cuda_tests[@]}" -p no:cacheprovider \
      ${xdist[@]+"${xdist[@]}"} > "$OUT/triton-tests.txt" 2>&1; then
    echo "gpu_suite.sh: Triton kernel and device tests passed in $(( $(date +%s) - t_tests )) s ($(tail -n 1 "$OUT/triton-tests.txt"))"
  else
    echo "gpu_suite.sh: Triton kernel and device tests FAILED or timed out after $(( $(date +%s) - t_tests )) s, see $OUT/triton-tests.txt"
    tail -n 30 "$OUT/triton-tests.txt"
  fi
fi
# (2) the library's benchmark grid: on a modern GPU every benchmark finishes in well under a minute
if [[ "$ISSUE15" == "0" ]] && step grid; then
  # run_all.py exits 1 when any of its scripts failed (bench_sparse.py without PyG, say): under set -e that
  # ended the suite here, before the issue-15 step; its README.md names the failed scripts
  "$PY" benchmarks/run_all.py --device cuda --out "$OUT" || echo "gpu_suite.sh: run_all.py FAILED (see $OUT/README.md)"
fi
# host and memory run alone with --issue15, or when grid (run_all.py, which runs them too) is not among the steps:
# GPU_SUITE_STEPS=host,memory without --issue15 ran nothing for them and exited 0 (while its smoke run ran both)
alone() { [[ "$ISSUE15" != "0" ]] || ! step grid; }
# host overhead per call (tiny GPTs, launch-bound; part of run_all.py in the full suite)
if alone && step host; then
  "$PY" benchmarks/bench_host.py --device cuda --out "$OUT" || echo "gpu_suite.sh: bench_host.py FAILED"
fi
if alone && step memory; then
  # peak memory of a training step vs nanoGPT's, with and without recompute (seconds)
  "$PY" benchmarks/bench_memory.py --device cuda --out "$OUT" || echo "gpu_suite.sh: bench_memory.py FAILED"
fi
# (3) issue 15's tables, profile and GPT comparison
if step issue15; then
  # shellcheck disable=SC2086  # BENCH_ISSUE15_ARGS is a list of options
  "$PY" benchmarks/bench_issue15.py --device cuda --library-backend sdpa --out "$OUT" ${BENCH_ISSUE15_ARGS:-} \
    || echo "gpu_suite.sh: bench_issue15.py FAILED"
fi
# (4) torch.compile(fullgraph=True) vs eager, issue 15's small GPT in bf16 (about 1 min per layout to compile)
if step compile; then
  "$PY" benchmarks/bench_compile.py --device cuda --out "$OUT" || echo "gpu_suite.sh: bench_compile.py FAILED"
fi
# (5) the Triton kernels' launch geometry (block sizes, warps, stages), each configuration checked
if step blocks; then
  if "$PY" -c "import triton" 2>/dev/null; then
    "$PY" benchmarks/bench_triton_blocks.py --device cuda --out "$OUT" || echo "gpu_suite.sh: bench_triton_blocks.py FAILED"
  else
    echo "gpu_suite.sh: triton not installed, no block sweep"
  fi
fi
[[ -f "$OUT/README.md" ]] && cat "$OUT/README.md"
[[ -f "$OUT/bench_issue15.md" ]] && cat "$OUT/bench_issue15.md"
alone && [[ -f "$OUT/bench_host.md" ]] && cat "$OUT/bench_host.md"
alone && [[ -f "$OUT/bench_memory.md" ]] && cat "$OUT/bench_memory.md"
[[ -f "$OUT/bench_compile.md" ]] && cat "$OUT/bench_compile.md"
[[ -f "$OUT/bench_triton_blocks.md" ]] && cat "$OUT/bench_triton_blocks.md"
echo "gpu_suite.sh: done in $(( $(date +%s) - start )) s; tables in $OUT/README.md and $OUT/bench_issue15.md"
