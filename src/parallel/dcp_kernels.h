// The device kernel of DCP's reduce-scatter combine (dcp_cuda.cu), called by the
// validated API layer (dcp_cuda.cc) with raw pointers; returns the launch's cudaError_t.
#pragma once

#include <cstdint>

namespace mlakv::cuda::kernels {

// For each partial row n = (b, i, h) of N = B * s_q * H rows:
//   lse_n = merge of lses[0..P)[n] (attn_state.h's rule, rank order),
//   w     = exp(lses[rank][n] - lse_n), 0 for an empty partial or an all-empty row,
//   send[h / Hl][(n / H) * Hl + h % Hl][:] = w * o[n][:]      (D floats; o unread when w = 0)
//   lse_out[(n / H) * Hl + h % Hl] = lse_n                     when h / Hl == rank.
int launch_dcp_rescale_permute(const float* o, const float* lses, int P, int rank, int64_t N, int H, int Hl, int D,
                               float* send, float* lse_out, void* stream);

}  // namespace mlakv::cuda::kernels
