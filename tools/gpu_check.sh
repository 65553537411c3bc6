#!/usr/bin/env bash
# Runs on a GPU machine (the `device` tool's H200): builds the CUDA targets, runs the
# accelerated-vs-reference harness, compute-sanitizer (memcheck, racecheck, synccheck) on its
# reduced set, and the CUDA benchmark. Logs go to $OUT (or ./gpu-out).
#
# The GPU image has no Debian -dev packages and no network: the project's Debian
# dependencies travel as .deb files in .debs/ (fetch them on a machine with apt:
#   mkdir -p .debs && cd .debs && apt-get download libfmt-dev libfmt9 libcli11-dev \
#     nlohmann-json3-dev libhwy-dev libhwy1 libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian \
#     libpcre2-dev libpcre2-8-0
# ) and are unpacked into a private prefix, never into /.
#   usage: tools/gpu_check.sh [harness|sanitize|bench|profile|all]...   (default: all = the first three)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
want() { for s in "${steps[@]}"; do { [ "$s" = all ] && [ "$1" != profile ]; } || [ "$s" = "$1" ] && return 0; done; return 1; }

DEPS=/tmp/mlakv-deps
if [ -d .debs ]; then
  mkdir -p "$DEPS"
  for f in .debs/*.deb; do dpkg -x "$f" "$DEPS"; done
  export CMAKE_PREFIX_PATH="$DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="$DEPS/usr/include${CPATH:+:$CPATH}"
fi

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee "$OUT/gpu.txt"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | wc -l) uncommitted" \
  | tee -a "$OUT/gpu.txt"

cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAKV_CUDA=ON -DMLAKV_CUDA_ARCHS=90a \
  -DMLAKV_BUILD_TESTS=ON -DMLAKV_BUILD_BENCH=ON >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
time cmake --build build-gpu --target cuda_harness bench_cuda -j "$(nproc)" >"$OUT/build.log" 2>&1 \
  || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "build ok"

rc=0
if want harness; then
  # One gtest case per parameter set (~150): show failures and the summary, count the rest.
  ./build-gpu/tests/cuda_harness 2>&1 | tee "$OUT/harness.log" | grep -E "^\[ +(FAILED|PASSED) |^\[==========\]|Failure|error|Expected|Which is|row" | head -80
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  echo "harness: $(grep -c '^\[       OK \]' "$OUT/harness.log") cases OK"
fi
if want sanitize; then
  for tool in memcheck racecheck synccheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 ./build-gpu/tests/cuda_harness \
      --gtest_filter='*ReducedSanitizerSet*:*MergeAttnStates*' >"$OUT/$tool.log" 2>&1
    s=$?
    echo "compute-sanitizer $tool: exit $s; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -1)"
    [ $s -eq 0 ] || rc=1
  done
fi
if want bench; then
  ./build-gpu/bench/bench_cuda --reps 30 --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if want profile; then
  # Nsight Compute on one attention launch per case (clocks left alone).
  for spec in "fp8_ds_mla 1" "bf16 3"; do
    set -- $spec
    ncu --clock-control none -k regex:"mla_attention_kernel|attention_sm90_kernel" --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
      --section SchedulerStats --section LaunchStats \
      ./build-gpu/bench/bench_cuda --reps 1 --format "$1" --shape "$2" --no-ceilings >"$OUT/ncu_$1_$2.txt" 2>&1
    echo "ncu $1 shape $2: exit $?"
    grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Stall|Warp Cycles Per Issued|Issue Slots Busy|Registers Per|Shared Memory Config|Block Limit" "$OUT/ncu_$1_$2.txt" | head -40
  done
fi
exit $rc
