// RoPE of the GPU layer path: rotates the rope dims of every (token, head) by the
// per-token cos/sin table (model/rope.h builds it on the host).
#include <cuda_runtime.h>

#include "cuda/smxx/launch.h"

namespace mlakv::cuda::kernels {
namespace {

// Thread per (token, head, pair): rotates pair i of src[t, h, offset ...] into dst.
__global__ void rope_kernel(RopeParams a) {
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

int launch_rope(const RopeParams& a, void* stream) {
  const int64_t total = a.tokens * a.heads * (a.rope_dim / 2);
  if (total == 0) return 0;
  rope_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mlakv::cuda::kernels
