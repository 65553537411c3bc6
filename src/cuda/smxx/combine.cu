// The split-KV combine of the attention op: each output row merges its num_splits
// partials {o, lse} from the workspace with attn_state.h's AttnState rule (the same
// code as the CPU merge and the DCP kernel). Shared by every attention path.
#include <cuda_runtime.h>

#include "cuda/smxx/launch.h"
#include "mlakv/attn_state.h"

namespace mlakv::cuda::kernels {
namespace {

constexpr int kThreads = kLatentDim / 4;  // thread t merges columns [4t, 4t+4)
static_assert(kThreads == 128);

// One CTA per output row.
__global__ void __launch_bounds__(kThreads) combine_kernel(const float* part_o, const float* part_lse, int splits,
                                                           int64_t rows, int s_q, int H, float* out, int64_t o_s0,
                                                           int64_t o_s1, int64_t o_s2, float* lse, int64_t l_s0,
                                                           int64_t l_s1, int64_t l_s2) {
  const int64_t row = blockIdx.x;
  const int h = static_cast<int>(row % H), i = static_cast<int>((row / H) % s_q);
  const int64_t b = row / (static_cast<int64_t>(H) * s_q);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  AttnState st;
  for (int k = 0; k < splits; ++k) {
    const float4 v = reinterpret_cast<const float4*>(part_o + (k * rows + row) * kLatentDim)[threadIdx.x];
    const float part[4] = {v.x, v.y, v.z, v.w};
    st.merge(acc, part, part_lse[k * rows + row], 4);
  }
  float* dst = out + b * o_s0 + i * o_s1 + h * o_s2;
  reinterpret_cast<float4*>(dst)[threadIdx.x] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  if (threadIdx.x == 0) lse[b * l_s0 + i * l_s1 + h * l_s2] = st.lse;
}

}  // namespace

int launch_combine(const CombineParams& p, void* stream) {
  if (p.rows == 0) return 0;
  combine_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      p.part_o, p.part_lse, p.splits, p.rows, p.s_q, p.H, p.out, p.o_s0, p.o_s1, p.o_s2, p.lse, p.l_s0, p.l_s1,
      p.l_s2);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mlakv::cuda::kernels
