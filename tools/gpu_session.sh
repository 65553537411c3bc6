#!/usr/bin/env bash
# One device call that does a session's GPU work: builds the CUDA targets and the Python
# package, runs the harness + compute-sanitizer + the CUDA benchmark (tools/gpu_check.sh),
# the Python package's tests on CUDA tensors (torch) and, when .ext/flashmla is carried
# (../shared/tools/flashmla-bench/prepare.sh), with FlashMLA built and importable (the interop
# tests), then FlashMLA's benchmark on the same GPU right after mlakv's. Logs under $OUT (all of them in logs.tar.xz).
#   usage (device tool): bash tools/gpu_session.sh        carry: .debs [.ext]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
stamp() { echo "[gpu_session +$(( $(date +%s) - t0 ))s] $*"; }

# FlashMLA builds on the CPU cores while mlakv builds; it is timed later, alone.
if [ -d .ext/flashmla ]; then
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
  CCCL=""; for d in "$CUDA_ROOT/include/cccl" "$CUDA_ROOT/targets/x86_64-linux/include/cccl"; do [ -d "$d" ] && CCCL=$d && break; done
  ( cd .ext/flashmla && env CPATH="$CCCL" FLASH_MLA_DISABLE_SM100=1 FLASH_MLA_DISABLE_FP16=1 NVCC_THREADS=2 MAX_JOBS=4 \
      timeout 480 python3 setup.py build_ext --inplace >"$OUT/flashmla_build.log" 2>&1; echo "flashmla build exit $?" >>"$OUT/flashmla_build.log" ) &
  fm_pid=$!
fi

# The Python package in the same build tree (the image's python3 has torch, nanobind, pytest).
DEPS=/tmp/mlakv-deps
mkdir -p "$DEPS"; for f in .debs/*.deb; do dpkg -x "$f" "$DEPS"; done
export CMAKE_PREFIX_PATH="$DEPS/usr" LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CPATH="$DEPS/usr/include${CPATH:+:$CPATH}"
# NCCL, for the one-GPU rehearsal of the long request (tests/parallel/long_request_check.cc):
# the toolkit's, else the one PyTorch's nvidia-nccl wheel carries (as tools/gpu_multi.sh).
if [ ! -f /usr/local/cuda/include/nccl.h ]; then
  nccl_root=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null || true)
  if [ -n "$nccl_root" ]; then
    [ -e "$nccl_root/lib/libnccl.so" ] || ln -sf libnccl.so.2 "$nccl_root/lib/libnccl.so" 2>/dev/null || true
    export NCCL_ROOT="$nccl_root" LD_LIBRARY_PATH="$nccl_root/lib:${LD_LIBRARY_PATH:-}"
  fi
fi
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAKV_CUDA=ON -DMLAKV_CUDA_ARCHS=90a \
  -DMLAKV_BUILD_TESTS=ON -DMLAKV_BUILD_BENCH=ON -DMLAKV_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" \
  -DCMAKE_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu" -DCMAKE_INCLUDE_PATH="$DEPS/usr/include" \
  >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu --target cuda_harness bench_cuda mlakv_python mlakv_cli -j 12 >"$OUT/build.log" 2>&1 \
  || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
cmake --build build-gpu --target mlakv_torch_ops -j 12 >"$OUT/build_torch_ops.log" 2>&1 \
  && { echo "torch ops built"; python3 -c "import torch, ctypes; ctypes.CDLL('build-gpu/python/mlakv/_torch_ops.so'); print('torch ops load: ok')" 2>&1 | tail -2; } || { echo "torch ops build FAILED"; grep -E "error" -A4 "$OUT/build_torch_ops.log" | head -40; }
cmake --build build-gpu --target long_request_check -j 12 >"$OUT/build_long_request.log" 2>&1 \
  && echo "long_request_check built" || echo "long_request_check not built (no NCCL?): $(grep -E "error|unknown target" "$OUT/build_long_request.log" | head -3)"
stamp "built"

rc=0
bash tools/gpu_check.sh harness sanitize bench || rc=1
stamp "harness, sanitizers, bench done (rc $rc)"

# One 1,048,576-token request on this one GPU (dcp = 1), every GLM-5.2 cache layer filled by
# the CUDA writers, checked against float64 (the 4-GPU run is tools/gpu_multi.sh 4).
if [ -x build-gpu/tests/long_request_check ] && [ "${MLAKV_SKIP_LONG_REQUEST:-0}" != 1 ]; then
  for f in nvfp4_ds_mla_fp8rope fp8_ds_mla; do
    timeout 240 ./build-gpu/tests/long_request_check --ranks 1 --format "$f" --json "$OUT/long_request_$f.json" 2>&1 \
      | tee "$OUT/long_request_$f.log" | tail -8
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  done
  stamp "long request done"
fi

# The Python tests run after FlashMLA's build, with flash_mla importable, so that
# python/tests/test_interop.py compares FlashMLA's decode with mlakv's on the same records.
pypath=build-gpu/python
if [ -n "${fm_pid:-}" ]; then
  wait "$fm_pid"; tail -2 "$OUT/flashmla_build.log"
  pypath="$pypath:$PWD/.ext/flashmla"
  fm_waited=1
fi
PYTHONPATH="$pypath" MLAKV_CLI="$PWD/build-gpu/mlakv" timeout 300 python3 -m pytest -q -rs -p no:cacheprovider python/tests 2>&1 \
  | tee "$OUT/pytest.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
stamp "python tests done"

if [ -n "${fm_waited:-}" ]; then
  PYTHONUNBUFFERED=1 timeout 240 python3 tools/flashmla-bench/bench_flashmla.py --flashmla .ext/flashmla \
    --out "$OUT/flashmla.json" >"$OUT/flashmla.log" 2>&1; echo "flashmla bench exit $?"; tail -25 "$OUT/flashmla.log"
  stamp "flashmla done"
fi
# The device tool returns a limited number of files: every log goes back in one archive, with the
# few a reader opens first left beside it.
( cd "$OUT" && tar -cJf logs.tar.xz --exclude=logs.tar.xz . && find . -maxdepth 1 -type f ! -name logs.tar.xz \
    ! -name bench.log ! -name bench.json ! -name flashmla.log ! -name harness.log -delete ) || true
exit $rc
