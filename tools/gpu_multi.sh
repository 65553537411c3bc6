#!/usr/bin/env bash
# Runs on a multi-GPU machine (the `device` tool's nvidia-h200-x2 / -x4): builds the
# NCCL targets, runs DCP over NCCL against the single-GPU result (tests/parallel/
# nccl_test.cc) and the DCP benchmark (bench/bench_parallel.cc). Logs go to $OUT.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0): using it can take the host's shared
# GPUs out of service. The project's Debian -dev packages travel in .debs/ (gpu_check.sh).
#   usage: tools/gpu_multi.sh [ranks]      (default: every visible GPU, at most 4)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DEPS=/tmp/mlakv-deps
if [ -d .debs ]; then
  mkdir -p "$DEPS"
  for f in .debs/*.deb; do dpkg -x "$f" "$DEPS"; done
  export CMAKE_PREFIX_PATH="$DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# NCCL: the toolkit's, else the one PyTorch's nvidia-nccl wheel carries.
nccl_args=()
if [ ! -f /usr/local/cuda/include/nccl.h ]; then
  root=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null || true)
  if [ -n "$root" ]; then
    [ -e "$root/lib/libnccl.so" ] || ln -sf libnccl.so.2 "$root/lib/libnccl.so" 2>/dev/null || true
    nccl_args=(-DNCCL_ROOT="$root")
    export LD_LIBRARY_PATH="$root/lib:${LD_LIBRARY_PATH:-}"
  fi
fi
nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee "$OUT/gpus.txt"
nvidia-smi topo -m >>"$OUT/gpus.txt" 2>&1
ranks="${1:-$(nvidia-smi -L | wc -l)}"
[ "$ranks" -gt 4 ] && ranks=4
cmake -S . -B build-multi -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAKV_CUDA=ON -DMLAKV_NCCL=ON \
  -DMLAKV_CUDA_ARCHS=90a -DMLAKV_BUILD_TESTS=ON -DMLAKV_BUILD_BENCH=ON "${nccl_args[@]}" \
  >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-multi --target nccl_test bench_parallel long_request_check -j "$(nproc)" >"$OUT/build.log" 2>&1 \
  || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "build ok; $ranks ranks"
rc=0
./build-multi/tests/nccl_test --ranks "$ranks" 2>&1 | tee "$OUT/nccl_test.log" | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
./build-multi/bench/bench_parallel --ranks "$ranks" --json "$OUT/bench_parallel.json" 2>&1 | tee "$OUT/bench_parallel.log" | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
# The genuine long request: 1,048,576 tokens of GLM-5.2's cache layers over $ranks GPUs.
for f in nvfp4_ds_mla_fp8rope fp8_ds_mla; do
  ./build-multi/tests/long_request_check --ranks "$ranks" --format "$f" --json "$OUT/long_request_$f.json" 2>&1 \
    | tee "$OUT/long_request_$f.log" | tail -12
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
done
exit $rc
