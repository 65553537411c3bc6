#!/usr/bin/env bash
# One short device call from PREBUILT binaries (cuda_harness and bench_cuda built on the dev
# machine with -DMLAKV_CUDA=ON -DMLAKV_CUDA_ARCHS="90a;80" and copied into BIN_DIR together
# with a COMMIT file): nothing is compiled on the GPU machine, so a call costs its checks and
# timings only. Every step has a timeout; a step that hangs costs that timeout, not the call.
#
#   usage: bash tools/gpu_bin_check.sh [BIN_DIR]      (default: bin/ beside tools/)
#   env (each step runs only when its variable is set):
#     HARNESS_FILTER='NaturalKernel/*:...'   cuda_harness --gtest_filter
#     SAN_TOOLS='memcheck racecheck synccheck' with SAN_FILTER (default: the reduced set)
#     BENCH_ARGS='--reps 20 --format bf16 --shape 3,13'   bench_cuda arguments
#     NCU_CASES='sm90_nat:bf16:3 ...'        Nsight Compute (--set full, clocks as found) of one
#                                            attention launch per kernel:format:shape
#     NCU_KERNEL_REGEX (default: every mlakv attention kernel name)
#     BUDGET_S=420                            no new step starts after this many seconds
# Device call: carry [".devwork/<name>", ".debs"], command
#   cd .devwork/<name> && HARNESS_FILTER=... bash tools/gpu_bin_check.sh
# Logs and summary.txt go to $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
BIN="${1:-bin}"
BUDGET="${BUDGET_S:-420}"
t0=$(date +%s)
stamp() { echo "[gpu_bin_check +$(($(date +%s) - t0))s] $*" | tee -a "$OUT/summary.txt"; }
late() { [ $(($(date +%s) - t0)) -ge "$BUDGET" ] && { stamp "skipped (past ${BUDGET} s): $*"; return 0; }; return 1; }

for b in cuda_harness bench_cuda; do
  [ -x "$BIN/$b" ] || { echo "error: $BIN/$b missing (build it on the dev machine and copy it there)"; exit 2; }
done
DEBS=.debs
[ -d "$DEBS" ] || DEBS=../../.debs
[ -d "$DEBS" ] || { echo "error: no .debs directory (carry .debs)"; exit 2; }
DEPS=/tmp/mlakv-deps
mkdir -p "$DEPS"
for f in "$DEBS"/*.deb; do dpkg -x "$f" "$DEPS"; done
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

: >"$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$OUT/summary.txt"
[ -f "$BIN/COMMIT" ] && echo "binaries: $(cat "$BIN/COMMIT")" | tee -a "$OUT/summary.txt"
rc=0

if [ -n "${HARNESS_FILTER:-}" ] && ! late harness; then
  timeout 240 "$BIN/cuda_harness" --gtest_filter="$HARNESS_FILTER" >"$OUT/harness.log" 2>&1
  h=$?
  [ $h -eq 0 ] || rc=1
  stamp "harness exit $h: $(grep -c '^\[       OK \]' "$OUT/harness.log") ok, $(grep -c '^\[  FAILED  \] [A-Z]' "$OUT/harness.log") failed"
  grep -E "^\[  FAILED  \] [A-Z]|Failure|Which is|worst" "$OUT/harness.log" | head -12 | tee -a "$OUT/summary.txt"
fi

SAN_FILTER="${SAN_FILTER:-*ReducedSanitizerSet*:*MergeAttnStates*}"
for tool in ${SAN_TOOLS:-}; do
  late "$tool" && continue
  timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 9 "$BIN/cuda_harness" --gtest_filter="$SAN_FILTER" \
    >"$OUT/$tool.log" 2>&1
  s=$?
  [ $s -eq 0 ] || rc=1
  stamp "compute-sanitizer $tool: exit $s; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -1)"
  [ $s -eq 0 ] || grep -E "hazard|Error|at .*\.cuh?:[0-9]+" "$OUT/$tool.log" | sort | uniq -c | sort -rn | head -8 | tee -a "$OUT/summary.txt"
done

if [ -n "${BENCH_ARGS:-}" ] && ! late bench; then
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
  timeout 240 "$BIN/bench_cuda" $BENCH_ARGS >"$OUT/bench.log" 2>&1 || rc=1
  stamp "bench_cuda $BENCH_ARGS: done"
  cat "$OUT/bench.log" | tee -a "$OUT/summary.txt" >/dev/null
  grep -E "copy|gemm|ceiling|\*" "$OUT/bench.log" | head -60
fi

REGEX="${NCU_KERNEL_REGEX:-attention_nat_kernel|attention_rows_kernel|attention_wg2_kernel|attention_wg_kernel|attention_sm90_kernel|mla_attention_kernel}"
for spec in ${NCU_CASES:-}; do
  IFS=: read -r kern fmt shape <<<"$spec"
  late "ncu $spec" && continue
  timeout 200 ncu --clock-control none --set full --import-source no -k regex:"$REGEX" --launch-skip 2 --launch-count 1 \
    "$BIN/bench_cuda" --reps 1 --format "$fmt" --shape "$shape" --kernel "$kern" --no-ceilings \
    >"$OUT/ncu_${kern}_${fmt}_${shape}.txt" 2>&1
  stamp "ncu $spec: exit $?"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Shared Memory|Bank|Stall|Registers Per|Executed Ipc" \
    "$OUT/ncu_${kern}_${fmt}_${shape}.txt" | head -30 | tee -a "$OUT/summary.txt" >/dev/null
done
stamp "done (rc $rc)"
exit $rc
