// DCP reduce-scatter combine: scale each partial row by its merge weight and lay the
// rows out head-chunk-major for the reduce-scatter (dcp_kernels.h).
#include <cuda_runtime.h>

#include "mlakv/attn_state.h"
#include "parallel/dcp_kernels.h"

namespace mlakv::cuda::kernels {
namespace {

__global__ void dcp_rescale_permute_kernel(const float* __restrict__ o, const float* __restrict__ lses, int P, int rank,
                                           int64_t N, int H, int Hl, int D, float* __restrict__ send,
                                           float* __restrict__ lse_out) {
  const int64_t n = blockIdx.x;
  // Every thread folds the P lses itself (P is small): no shared memory, no barrier.
  float lse = -INFINITY;
  for (int k = 0; k < P; ++k) lse = merge_weights(lse, lses[k * N + n]).lse;
  const float own = lses[rank * N + n];
  const float w = (lse == -INFINITY || own == -INFINITY) ? 0.0f : expf(own - lse);
  const int64_t bi = n / H;
  const int h = static_cast<int>(n % H), chunk = h / Hl;
  const int64_t rows_per_chunk = N / H * Hl;
  float* dst = send + (chunk * rows_per_chunk + bi * Hl + h % Hl) * D;
  const float* src = o + n * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) dst[d] = w != 0.0f ? w * src[d] : 0.0f;
  if (threadIdx.x == 0 && chunk == rank) lse_out[bi * Hl + h % Hl] = lse;
}

}  // namespace

int launch_dcp_rescale_permute(const float* o, const float* lses, int P, int rank, int64_t N, int H, int Hl, int D,
                               float* send, float* lse_out, void* stream) {
  if (N == 0) return 0;
  dcp_rescale_permute_kernel<<<static_cast<unsigned>(N), 128, 0, static_cast<cudaStream_t>(stream)>>>(
      o, lses, P, rank, N, H, Hl, D, send, lse_out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mlakv::cuda::kernels
