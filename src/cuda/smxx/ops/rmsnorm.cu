// RMSNorm of the GPU layer path: y = x / sqrt(mean(x^2) + eps) * w per row.
#include <cuda_runtime.h>

#include "cuda/smxx/launch.h"

namespace mlakv::cuda::kernels {
namespace {

constexpr int kNormThreads = 256;

// One block per row; a warp-shuffle then shared-memory sum of squares.
__global__ void rmsnorm_kernel(const float* x, int64_t x_stride, int n, const float* w, float eps, float* y,
                               int64_t y_stride) {
  const float* xr = x + blockIdx.x * x_stride;
  float* yr = y + blockIdx.x * y_stride;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += kNormThreads) ss += xr[i] * xr[i];
  __shared__ float red[kNormThreads / 32];
  for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < kNormThreads / 32 ? red[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  const float inv = rsqrtf(red[0] / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += kNormThreads) yr[i] = xr[i] * inv * w[i];
}

}  // namespace

int launch_rmsnorm(const RmsNormParams& p, void* stream) {
  if (p.rows == 0) return 0;
  rmsnorm_kernel<<<static_cast<unsigned>(p.rows), kNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      p.x, p.x_stride, p.n, p.w, p.eps, p.y, p.y_stride);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mlakv::cuda::kernels
