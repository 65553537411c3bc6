#!/usr/bin/env bash
# Runs every libFuzzer target for a while, one after the other (docs/security.md).
#   tools/fuzz.sh [SECONDS_PER_TARGET=600] [TARGET...]
# Builds build-fuzz (clang, -DMLAKV_FUZZ=ON) unless MLAKV_FUZZ_NO_BUILD=1. Each target
# starts from its seed corpus (tests/fuzz/corpus/<target>, never modified) plus what
# earlier runs found (build-fuzz/corpus/<target>); crashes go to build-fuzz/artifacts/.
# Prints one summary line per target: executions, coverage (cov) and features (ft) at
# the end. Exits non-zero when any target found a crash or an invariant violation.
# Runs under `nice` (MLAKV_FUZZ_NICE, default 10) so it can share a machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_EACH="${1:-600}"
shift || true
BUILD="${MLAKV_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
NICE="${MLAKV_FUZZ_NICE:-10}"
ALL=(fuzz_safetensors_memory fuzz_safetensors_file fuzz_checkpoint_index fuzz_hf_config fuzz_outer_scales fuzz_records fuzz_tokenizer)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL[@]}")

if [ "${MLAKV_FUZZ_NO_BUILD:-0}" != 1 ]; then
  bash "$ROOT/scripts/install-deps.sh" --fuzz
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
        -DMLAKV_FUZZ=ON -DMLAKV_CUDA=OFF -DMLAKV_BUILD_TESTS=OFF -DMLAKV_BUILD_BENCH=OFF >/dev/null
  cmake --build "$BUILD" -j "${MLAKV_JOBS:-$(nproc 2>/dev/null || echo 2)}" --target fuzz_targets >&2
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=0
for t in "${TARGETS[@]}"; do
  work="$BUILD/corpus/$t"; art="$BUILD/artifacts/$t"; log="$BUILD/logs/$t.log"
  mkdir -p "$work" "$art" "$(dirname "$log")"
  rc=0
  nice -n "$NICE" "$BUILD/fuzz/$t" -max_total_time="$SECONDS_EACH" -print_final_stats=1 -rss_limit_mb=4096 \
    -timeout=30 -artifact_prefix="$art/" "$work" "$ROOT/tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  last="$(grep -E '^#[0-9]+' "$log" | tail -1 || true)"
  execs="$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}' || true)"
  echo "$t: rc=$rc executions=${execs:-?} seconds=$SECONDS_EACH last: ${last:-none}"
  if [ "$rc" != 0 ]; then
    failed=1
    grep -E 'violated|ERROR|runtime error|SUMMARY' "$log" | head -5 >&2 || true
  fi
done
exit "$failed"
