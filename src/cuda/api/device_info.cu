// CUDA runtime queries. This translation unit also proves that every architecture of
// MLAKV_CUDA_ARCHS compiles on machines without a GPU.
#include <cuda_runtime.h>

#include "cuda/api/device_info.h"

namespace mlakv::cuda {

namespace {
__global__ void probe_kernel(int* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *out = 1;
}
}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

bool launch_probe() {
  int* d = nullptr;
  if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return false;
  probe_kernel<<<1, 32>>>(d);
  int h = 0;
  const bool ok = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h == 1;
  cudaFree(d);
  return ok;
}

}  // namespace mlakv::cuda
