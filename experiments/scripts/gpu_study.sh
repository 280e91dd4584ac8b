#!/usr/bin/env bash
# Run (part of) a GPU comparison in one call on a machine with one CUDA GPU, and pack what
# finished so that the next call (or this checkout) resumes from it.
#
# 1. Here, before the call (no GPU needed): stage the data the config reads, compressed,
#    in the git-ignored folder .gpudata/ (solid xz archives: the 60,000 CIFAR JPEGs share their
#    headers, so CIFAR-10 travels as about 19 MB instead of 62):
#
#      bash experiments/scripts/gpu_study.sh stage text      # tinyshakespeare (0.4 MB)
#      bash experiments/scripts/gpu_study.sh stage vision    # cifar10_jpg     (about 19 MB)
#
#    and, to resume, put the results-<name>.tar.gz an earlier call brought back into .gpudata/.
# 2. On the GPU machine (carry .gpudata), e.g. one seed of every setting as 6 concurrent runs:
#
#      bash experiments/scripts/gpu_study.sh run experiments/configs/gpu_text.toml 6 --set seeds=[0]
#
#    unpacks .gpudata/*.tar.xz into $UNPACKED (default /tmp/df-data: .gpudata stays as staged, small enough to
#    carry, after a dry run here too), unpacks .gpudata/results-<name>.tar.gz into the results root,
#    checks CUDA, trains with N worker processes on the GPU (each takes the next run nobody
#    holds; finished runs are skipped) until $ANALYZE_RESERVE seconds (default 0) before $BUDGET seconds
#    (default 540) from the script's start, then, in the time left while the checkpoints are here, analyses the token
#    geometry of the finished runs (`analyze CONFIG --partial $ANALYZE_ARGS`, with the run options but the
#    seeds=/operators=/tasks= selections, so that it covers every finished run of the comparison: the runs of
#    earlier calls, their checkpoints gone, are read from the analysis_cache.pt their call left, not measured
#    again) until $BUDGET seconds from the start (cut there: the files it writes are replaced whole, so
#    a cut analysis leaves the earlier ones), then writes to $OUT (default ./gpu-out):
#    results-<name>.tar.gz (every file of the comparison but the checkpoints: results, logs,
#    analysis/ and each run's analysis_cache.pt), results.md, status.md, analyze.log and the workers'
#    logs (tail). Runs cut short by the budget are lost (their checkpoints stay on the GPU machine):
#    size each call so its runs finish, e.g. one seed per call.
# 3. Here, after the calls: mkdir -p results && tar xzf results-<name>.tar.gz -C results/, then
#      python -m diffusionformer.experiments publish CONFIG --out results --to docs/results
#    with --set seeds=[...] if fewer seeds ran than the config lists, and every --set that changed the runs (a
#    --precision: the --set of every task's train.amp, as run.log's "from another shell: ... status" line names
#    those of the call's tasks)
#    (publish refuses runs of other train or model values, warns of unfinished runs; the page names the --set).
#    The page shows the analysis of the last call; `analyze CONFIG --partial --out results $ANALYZE_ARGS` here
#    draws it again from the runs' caches, with the data root here, without checkpoints (the same options, or the
#    caches are not read)
#
# Environment: PY (python, default python3), BUDGET (seconds, default 540), OUT,
# ANALYZE=0 (no analysis), ANALYZE_RESERVE (seconds of the budget kept from training for it, default 0: the analysis
# takes what training leaves, so it never shortens the training of a call sized for the whole budget),
# ANALYZE_ARGS (analyze's options, default --max-examples 128; the same in every call of a comparison). Sizes: the
# measurements run on the CPU (the GPU only runs the forward passes), about linear in --max-examples; one run of
# gpu_text.toml took 621 s at 512 examples and 69 s at 64 (of which 44 s measuring, 10 s plots, 10 s the forward
# pass) on a loaded 2-core CPU; on the GPU machine's 16 cores about 10 s per run at 128 examples is an estimate,
# not yet measured (the call's "analyze exit code ... after N s" tells): a cut analysis keeps the caches of the runs
# it finished, the others are lost with their checkpoints), ANALYZE_THREADS (its torch threads, default every core),
# RESULTS (working results root, default /tmp/df-results), DATA (default .gpudata), UNPACKED (default /tmp/df-data),
# ALLOW_CPU=1 (a dry run of the whole script on a machine without CUDA, for configs on CPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-python3}"
DATA="${DATA:-.gpudata}"
what="${1:-}"
shift || true

if [ "$what" = "stage" ]; then
  src="${SRC:-${DIFFUSIONFORMER_DATA:-../shared/data}}"
  [ -d "$src" ] || { echo "gpu_study.sh stage: data root '$src' not found; set SRC=<data root>" >&2; exit 2; }
  mkdir -p "$DATA"
  exclude="$(git rev-parse --git-path info/exclude)"  # .git may be a file (worktrees)
  grep -qx '/.gpudata/' "$exclude" 2>/dev/null || echo '/.gpudata/' >> "$exclude"
  case "${1:-}" in
    text)   folder=tinyshakespeare ;;
    vision) folder=cifar10_jpg ;;
    *) echo "usage: gpu_study.sh stage text|vision   (SRC=<data root>, default \$DIFFUSIONFORMER_DATA or ../shared/data)" >&2; exit 2 ;;
  esac
  [ -d "$src/$folder" ] || { echo "gpu_study.sh stage: '$src/$folder' not found" >&2; exit 2; }
  # -h: a data root whose folders or files are symbolic links packs the files they point to, not links that
  # dangle on the GPU machine
  tar -h -C "$src" -cf - "$folder" | xz -T0 -6 > "$DATA/$folder.tar.xz.part"
  mv "$DATA/$folder.tar.xz.part" "$DATA/$folder.tar.xz"
  ls -l "$DATA"
  exit 0
fi
if [ "$what" != "run" ] || [ $# -lt 2 ]; then
  echo "usage: gpu_study.sh run CONFIG WORKERS [run options such as --set seeds=[0]]" >&2
  echo "       gpu_study.sh stage text|vision" >&2
  exit 2
fi
config="$1"; workers="$2"; shift 2
OUT="${OUT:-gpu-out}"
RESULTS="${RESULTS:-/tmp/df-results}"
BUDGET="${BUDGET:-540}"
ANALYZE="${ANALYZE:-1}"
ANALYZE_RESERVE="${ANALYZE_RESERVE:-0}"
read -r -a aargs <<< "${ANALYZE_ARGS---max-examples 128}"  # ANALYZE_ARGS= (empty): analyze's defaults
case "$ANALYZE" in
  0|1) ;;
  *) echo "gpu_study.sh: ANALYZE must be 0 or 1, got '$ANALYZE'" >&2; exit 2 ;;
esac
[ "$ANALYZE" = "1" ] || ANALYZE_RESERVE=0
# whole seconds (the budget is bash arithmetic: BUDGET=9m, which timeout took, stopped the script mid-way)
for var in BUDGET ANALYZE_RESERVE; do
  case "${!var}" in
    ''|*[!0-9]*) echo "gpu_study.sh: $var must be a whole number of seconds, got '${!var}'" >&2; exit 2 ;;
  esac
done
if [ "$ANALYZE_RESERVE" -ge "$BUDGET" ]; then
  echo "gpu_study.sh: ANALYZE_RESERVE ($ANALYZE_RESERVE s) leaves no training time in BUDGET ($BUDGET s)" >&2; exit 2
fi
mkdir -p "$OUT" "$RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export DIFFUSIONFORMER_CACHE="${DIFFUSIONFORMER_CACHE:-/tmp/df-cache}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
t0=$(date +%s)

"$PY" - <<'PY'
import os, sys, torch
if not torch.cuda.is_available() and os.environ.get("ALLOW_CPU") != "1":  # ALLOW_CPU=1: a dry run on CPU
    sys.exit("gpu_study.sh: torch.cuda.is_available() is False; this script needs a CUDA GPU")
if torch.cuda.is_available():
    print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__, "| bf16:", torch.cuda.is_bf16_supported())
PY
# unpacked outside $DATA: $DATA is what the GPU call carries (64 MiB at most), and a dry run here that unpacked into it
# left CIFAR-10 there twice (archive and 62 MB of zips); an archive is unpacked once per version (a stamp beside it)
UNPACKED="${UNPACKED:-/tmp/df-data}"
mkdir -p "$UNPACKED"
for archive in "$DATA"/*.tar.xz; do
  [ -e "$archive" ] || continue
  stamp="$UNPACKED/.$(basename "$archive").unpacked"
  if [ -f "$stamp" ] && [ ! "$archive" -nt "$stamp" ]; then continue; fi
  echo "unpacking $archive"
  tar -C "$UNPACKED" -xJf "$archive"
  touch -r "$archive" "$stamp"
done
for folder in "$DATA"/*/; do  # a data folder put into $DATA as it is (not staged) is read there
  [ -d "$folder" ] || continue
  folder="${folder%/}"
  link="$UNPACKED/$(basename "$folder")"
  # a link left by another checkout's dry run (dangling, or to its data) is replaced; an unpacked folder is kept
  if [ -L "$link" ] || [ ! -e "$link" ]; then ln -sfn "$(cd "$folder" && pwd)" "$link"; fi
done
# the --set overrides (status takes them too): one may rename the comparison (--set name=...); run's --precision
sets=(); prev=""; precision=""
for a in "$@"; do
  [ "$prev" = "--set" ] && sets+=(--set "$a")
  [ "$prev" = "--precision" ] && precision="$a"
  case "$a" in --set=*) sets+=(--set "${a#--set=}") ;; --precision=*) precision="${a#--precision=}" ;; esac
  prev="$a"
done
name=$("$PY" -c "import sys; from diffusionformer.experiments import load_experiment_config as l; a = sys.argv[2:]
print(l(sys.argv[1], a[1::2]).name)" "$config" ${sets[@]+"${sets[@]}"})
# analyze's: every finished run of the comparison (the run options, without the selections of this call's runs)
asets=()
for ((i = 0; i < ${#sets[@]}; i += 2)); do
  case "${sets[i+1]%%=*}" in seeds|tasks|operators) continue ;; esac
  asets+=(--set "${sets[i+1]}")
done
amp_sets() {  # the --set of every task's train.amp of the config read with the --set overrides "$@", one a line
  "$PY" -c "import sys; a = sys.argv[3:]
from diffusionformer.experiments import load_experiment_config as l
from diffusionformer.experiments.cli import _precision_sets as p
print('\n'.join(p(l(sys.argv[1], a[1::2]), sys.argv[2])))" "$config" "$precision" "$@"
}
if [ -n "$precision" ]; then
  # run's --precision as the --set of every task's train.amp (part of a run's identity), as run's status command
  # gives it: else status and analyze below read every run this call trains as "made with another train"; analyze's
  # of every task (with --set tasks=[...], those of the other tasks, which earlier calls trained, too)
  while IFS= read -r amp_set; do asets+=(--set "$amp_set"); done < <(amp_sets ${asets[@]+"${asets[@]}"})
  while IFS= read -r amp_set; do sets+=(--set "$amp_set"); done < <(amp_sets ${sets[@]+"${sets[@]}"})
fi
if [ -f "$DATA/results-$name.tar.gz" ]; then
  echo "resuming from $DATA/results-$name.tar.gz"
  tar -C "$RESULTS" -xzf "$DATA/results-$name.tar.gz"
fi
# the budget counts from the script's start (setup included), so that setup + training + 30 s of grace + the
# analysis (in the reserve, cut at the budget, 10 s of grace) + packing stays inside the device call's 600 s limit
left=$(( BUDGET - ANALYZE_RESERVE - ($(date +%s) - t0) ))
[ "$left" -ge 1 ] || left=1
echo "setup: $(( $(date +%s) - t0 )) s; training $config with $workers workers for at most $left s" \
  "(then $ANALYZE_RESERVE s kept for the analysis)"

set +e
# SIGINT: the parent stops its workers (KeyboardInterrupt), so nothing writes while we pack
timeout -s INT -k 30 "$left" "$PY" -m diffusionformer.experiments run "$config" --data-root "$UNPACKED" \
  --out "$RESULTS" --workers "$workers" --no-progress "$@" > "$OUT/run.log" 2>&1
code=$?
set -e
echo "run exit code $code after $(( $(date +%s) - t0 )) s (124: stopped by the budget)"
tail -n 30 "$OUT/run.log"

if [ "$ANALYZE" = "1" ]; then
  aleft=$(( BUDGET - ($(date +%s) - t0) ))
  if [ "$aleft" -ge 5 ]; then
    echo "analysing the finished runs for at most $aleft s"
    set +e
    # SIGINT: every file analyze writes replaces the earlier one whole (caches, metrics.json, figures), and the
    # leftover temporaries of a kill (*.tmp) are not packed; its measurements run on the CPU (the captured tokens
    # are copied there): every core, the workers have ended
    timeout -s INT -k 10 "$aleft" "$PY" -m diffusionformer.experiments analyze "$config" --partial \
      --data-root "$UNPACKED" --out "$RESULTS" --no-progress \
      --threads "${ANALYZE_THREADS:-$(nproc 2>/dev/null || echo 2)}" ${aargs[@]+"${aargs[@]}"} ${asets[@]+"${asets[@]}"} > "$OUT/analyze.log" 2>&1
    acode=$?
    set -e
    echo "analyze exit code $acode after $(( $(date +%s) - t0 )) s (124: stopped by the budget)"
    tail -n 5 "$OUT/analyze.log"
  else
    echo "analysis skipped: $aleft s of the budget left (ANALYZE_RESERVE=$ANALYZE_RESERVE)"
  fi
fi

"$PY" -m diffusionformer.experiments status "$config" ${sets[@]+"${sets[@]}"} --out "$RESULTS" > "$OUT/status.md" 2>&1 || true
if grep -q "interrupted" "$OUT/status.md"; then  # the archive carries no checkpoint.pt (below)
  echo "Packed without checkpoints: the interrupted runs above start again from step 0 in the next call." >> "$OUT/status.md"
fi
head -n 1 "$OUT/status.md"
[ -f "$RESULTS/$name/results.md" ] && cp "$RESULTS/$name/results.md" "$OUT/results.md"
if [ -d "$RESULTS/$name/workers" ]; then
  for f in "$RESULTS/$name"/workers/*.log; do echo "== $f"; tail -n 20 "$f"; done > "$OUT/workers.log"
fi
if [ -d "$RESULTS/$name" ]; then
  tar -C "$RESULTS" --exclude='checkpoint.pt' --exclude='.lock' --exclude='*.tmp' -czf "$OUT/results-$name.tar.gz" "$name"
else
  echo "no results folder $RESULTS/$name: nothing to pack"
fi
ls -l "$OUT"
echo "gpu_study.sh: done in $(( $(date +%s) - t0 )) s"
exit $code
