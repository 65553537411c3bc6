// Small elementwise kernels of the GPU layer path: RMSNorm, bias add, RoPE.
#include <cuda_runtime.h>

#include "cuda/kernels.h"

namespace mlakv::cuda::kernels {
namespace {

constexpr int kNormThreads = 256;

// One block per row: y = x / sqrt(mean(x^2) + eps) * w.
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

__global__ void add_bias_kernel(float* x, int64_t stride, const float* b, int n, int64_t rows) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  x[(i / n) * stride + i % n] += b[i % n];
}

// Thread per (token, head, pair): rotates pair i of src[t, h, offset ...] into dst.
__global__ void rope_kernel(RopeArgs a) {
  const int half = a.rope_dim / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= a.tokens * a.heads * half) return;
  const int i = static_cast<int>(idx % half);
  const int h = static_cast<int>((idx / half) % a.heads);
  const int64_t t = idx / (static_cast<int64_t>(half) * a.heads);
  const float* s = a.src + t * a.src_row_stride + h * a.src_head_stride + a.src_offset;
  float* d = a.dst + t * a.dst_row_stride + h * a.dst_head_stride + a.dst_offset;
  const int ia = a.interleaved ? 2 * i : i, ib = a.interleaved ? 2 * i + 1 : i + half;
  const float x0 = s[ia], x1 = s[ib];
  const float c = a.cos[t * half + i], sn = a.sin[t * half + i];
  d[ia] = x0 * c - x1 * sn;
  d[ib] = x1 * c + x0 * sn;
}

}  // namespace

int launch_rmsnorm(const float* x, int64_t x_stride, int n, const float* w, float eps, float* y, int64_t y_stride,
                   int64_t rows, void* stream) {
  if (rows == 0) return 0;
  rmsnorm_kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, x_stride, n, w,
                                                                                                    eps, y, y_stride);
  return static_cast<int>(cudaGetLastError());
}

int launch_add_bias(float* x, int64_t stride, const float* b, int n, int64_t rows, void* stream) {
  const int64_t total = rows * n;
  if (total == 0) return 0;
  add_bias_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(x, stride, b,
                                                                                                          n, rows);
  return static_cast<int>(cudaGetLastError());
}

int launch_rope(const RopeArgs& a, void* stream) {
  const int64_t total = a.tokens * a.heads * (a.rope_dim / 2);
  if (total == 0) return 0;
  rope_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mlakv::cuda::kernels
