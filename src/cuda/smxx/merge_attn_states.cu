// merge_attn_states on the device: a generic [P, N, D] merge of partial attention
// states by attn_state.h's AttnState rule (DCP ranks and callers with their own splits).
#include <cuda_runtime.h>

#include "cuda/smxx/launch.h"
#include "mlakv/attn_state.h"

namespace mlakv::cuda::kernels {
namespace {

// One CTA per row n; threads stride over the D columns.
__global__ void merge_kernel(const float* o_parts, int64_t op_s0, int64_t op_s1, const float* lse_parts,
                             int64_t lp_s0, int64_t lp_s1, int P, int D, float* out, int64_t out_s0, float* lse,
                             int64_t lse_s0) {
  const int64_t n = blockIdx.x;
  for (int d0 = threadIdx.x; d0 < D; d0 += blockDim.x) {
    float acc = 0.0f;
    AttnState st;
    for (int k = 0; k < P; ++k) st.merge(&acc, o_parts + k * op_s0 + n * op_s1 + d0, lse_parts[k * lp_s0 + n * lp_s1], 1);
    out[n * out_s0 + d0] = acc;
    if (d0 == 0) lse[n * lse_s0] = st.lse;
  }
}

}  // namespace

int launch_merge(const MergeParams& p, void* stream) {
  if (p.N == 0) return 0;
  merge_kernel<<<static_cast<unsigned>(p.N), 128, 0, static_cast<cudaStream_t>(stream)>>>(
      p.o_parts, p.op_s0, p.op_s1, p.lse_parts, p.lp_s0, p.lp_s1, p.P, p.D, p.out, p.out_s0, p.lse, p.lse_s0);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mlakv::cuda::kernels
