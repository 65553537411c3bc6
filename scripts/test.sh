#!/usr/bin/env bash
# Installs what is missing, builds everything (tests, benchmarks, and the CUDA
# targets when nvcc is present) and runs the whole test suite.
#   --sanitize   build into build-asan with AddressSanitizer + UBSan, CPU only
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
dir="$ROOT/build"
args=(-DMLAKV_BUILD_TESTS=ON -DMLAKV_BUILD_BENCH=ON)
# The Python package and its pytest suite (a virtual environment with nanobind, numpy
# and pytest from PyPI; scripts/python-env.sh).
py="$(bash "$ROOT/scripts/python-env.sh")"
args+=(-DMLAKV_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$py")
if [ "${1:-}" = "--sanitize" ]; then
  dir="$ROOT/build-asan"
  # (no Python module here: an ASan-instrumented extension needs the runtime preloaded)
  args=(-DMLAKV_BUILD_TESTS=ON -DMLAKV_BUILD_BENCH=OFF -DMLAKV_SANITIZE=ON -DMLAKV_CUDA=OFF
        -DCMAKE_BUILD_TYPE=RelWithDebInfo)
fi
mlakv_configure_and_build "$dir" "${args[@]}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --test-dir "$dir" --output-on-failure -j "$JOBS" --timeout 900
