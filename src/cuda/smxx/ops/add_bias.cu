// Bias add of the GPU layer path: x[r][i] += b[i].
#include <cuda_runtime.h>

#include "cuda/smxx/launch.h"

namespace mlakv::cuda::kernels {
namespace {

// One thread per element.
__global__ void add_bias_kernel(float* x, int64_t stride, const float* b, int n, int64_t rows) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  x[(i / n) * stride + i % n] += b[i % n];
}

}  // namespace

int launch_add_bias(const AddBiasParams& p, void* stream) {
  const int64_t total = p.rows * p.n;
  if (total == 0) return 0;
  add_bias_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      p.x, p.stride, p.b, p.n, p.rows);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mlakv::cuda::kernels
