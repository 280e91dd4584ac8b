#!/usr/bin/env bash
# Run the whole benchmark suite on one CUDA device and print the tables (about 3-5 minutes).
#
#   bash benchmarks/gpu_suite.sh [OUT_DIR]     (default OUT_DIR: benchmarks/results-cuda)
#
# Uses the python of $PYTHON (default: python3). Fails early when no CUDA device is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${1:-benchmarks/results-cuda}"
"$PY" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_suite.sh: torch.cuda.is_available() is False; nothing to benchmark")
print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__)
PY
start=$(date +%s)
# the full grid: on a modern GPU every benchmark finishes in well under a minute
"$PY" benchmarks/run_all.py --device cuda --out "$OUT"
cat "$OUT/README.md"
echo "gpu_suite.sh: done in $(( $(date +%s) - start )) s; tables in $OUT/README.md"
