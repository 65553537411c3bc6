// Params of merge_attn_states on the device (include/mlakv/cuda.h): P partial
// states of N rows of D floats -> one state per row, by attn_state.h's rule.
// Strides in elements; the last dimension of every tensor is contiguous.
#pragma once

#include <cstdint>

namespace mlakv::cuda::kernels {

struct MergeParams {
  const float* o_parts;    // [P, N, D] f32, strides op_s0, op_s1
  int64_t op_s0, op_s1;
  const float* lse_parts;  // [P, N] f32, strides lp_s0, lp_s1 (-inf: an empty partial, its o never read)
  int64_t lp_s0, lp_s1;
  int P;
  int64_t N;
  int D;
  float* out;  // [N, D] f32, stride out_s0
  int64_t out_s0;
  float* lse;  // [N] f32, stride lse_s0
  int64_t lse_s0;
};

}  // namespace mlakv::cuda::kernels
