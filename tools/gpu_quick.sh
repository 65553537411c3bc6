#!/usr/bin/env bash
# A short device call for kernel work (the `device` tool's H200): builds cuda_harness and
# bench_cuda for sm_90a only, runs the harness (optionally a gtest filter) and bench_cuda
# with the given arguments. Logs under $OUT. Run from a copy of the tree; .debs is looked
# up here or two levels up (the .devwork/<name>/ copies of tools/gpu_session.sh's notes).
#   usage: bash tools/gpu_quick.sh [gtest-filter|-] [bench_cuda args...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
filter="${1:--}"
shift || true
t0=$(date +%s)
stamp() { echo "[gpu_quick +$(( $(date +%s) - t0 ))s] $*"; }
DEBS=.debs
[ -d "$DEBS" ] || DEBS=../../.debs
DEPS=/tmp/mlakv-deps
mkdir -p "$DEPS"
for f in "$DEBS"/*.deb; do dpkg -x "$f" "$DEPS"; done
export CMAKE_PREFIX_PATH="$DEPS/usr" LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CPATH="$DEPS/usr/include${CPATH:+:$CPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAKV_CUDA=ON -DMLAKV_CUDA_ARCHS=90a \
  -DMLAKV_BUILD_TESTS=ON -DMLAKV_BUILD_BENCH=ON >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu --target cuda_harness bench_cuda -j "$(nproc)" >"$OUT/build.log" 2>&1 \
  || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
grep -E "C75[0-9]+|spill" "$OUT/build.log" | sort | uniq -c | head -20
stamp "built"
rc=0
if [ "$filter" != "-" ]; then
  ./build-gpu/tests/cuda_harness --gtest_filter="$filter" 2>&1 | tee "$OUT/harness.log" \
    | grep -E "^\[ +(FAILED|PASSED) |^\[==========\]|Failure|Expected|Which is|row|worst" | head -60
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  stamp "harness done (rc $rc)"
fi
if [ $# -gt 0 ]; then
  ./build-gpu/bench/bench_cuda "$@" 2>&1 | tee "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  stamp "bench done"
fi
exit $rc
