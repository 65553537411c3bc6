// Plain parameter structs and launchers shared by the CUDA API layer (.cc, compiled by
// the host compiler: validation, messages) and the kernels (.cu). Kernels receive
// validated raw pointers and strides; launchers return the CUDA error of the launch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mlakv/formats.h"

namespace mlakv::cuda::kernels {

struct AttentionParams {
  const void* q;
  bool q_bf16;
  int64_t q_s0, q_s1, q_s2;
  int B, s_q, H;
  const uint8_t* cache;
  int64_t num_blocks, num_slots;
  int block_size, record_bytes;
  float outer_scale;
  const int32_t* block_table;
  int64_t bt_s0, bt_s1;
  int64_t bt_cols;  // max_blocks: positions past bt_cols * block_size are never read
  const int32_t* seqlens;
  int64_t sl_s0;
  bool causal;
  bool sparse;
  const int32_t* indices;
  int64_t ix_s0, ix_s1, ix_s2;
  int topk;
  const int32_t* topk_length;
  int64_t tl_s0;
  float scale_log2;  // softmax_scale * log2(e)
  int num_splits;
  float* out;
  int64_t o_s0, o_s1, o_s2;
  float* lse;
  int64_t l_s0, l_s1, l_s2;
  float* part_o;    // [splits][rows_total][512]
  float* part_lse;  // [splits][rows_total]
  int64_t rows_total;
};

inline constexpr int kAttentionRows = 16;  // query rows per CTA

// Raises the kernel's dynamic shared-memory limit (host call; done at plan time so
// that run_mla_attention issues nothing but launches, e.g. under graph capture).
int configure_attention(KvFormat format, int record_bytes);
// CTAs of the attention kernel that fit on one SM (occupancy API); 0 on error.
int attention_ctas_per_sm(KvFormat format, int record_bytes);
// Launches the attention kernel (grid: row blocks x requests-or-queries x splits) and,
// with splits, the combine kernel. Returns a cudaError_t as int (0 = success).
int launch_attention(KvFormat format, const AttentionParams& p, int row_blocks, void* stream);
int launch_merge(const float* o_parts, int64_t op_s0, int64_t op_s1, const float* lse_parts, int64_t lp_s0,
                 int64_t lp_s1, int P, int64_t N, int D, float* out, int64_t out_s0, float* lse, int64_t lse_s0,
                 void* stream);

enum class Fp8Mode : uint8_t { kPow2 = 0, kExact = 1 };

struct WriterParams {
  uint8_t* cache;
  int64_t num_slots;
  int record_bytes;
  float outer_scale;
  Fp8Mode fp8_mode;
  const int64_t* slots;
  int64_t n;
  const void* latent;
  int64_t latent_stride;
  const void* rope;
  int64_t rope_stride;
  bool bf16_input;
  int* error_count;
};

int launch_write_cache(KvFormat format, const WriterParams& p, void* stream);

// ---- the layer path ---------------------------------------------------------------
// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for `rows` rows of n floats.
int launch_rmsnorm(const float* x, int64_t x_stride, int n, const float* w, float eps, float* y, int64_t y_stride,
                   int64_t rows, void* stream);
// x[r][i] += b[i].
int launch_add_bias(float* x, int64_t stride, const float* b, int n, int64_t rows, void* stream);

struct RopeArgs {
  const float* src;  // src[t * src_row_stride + h * src_head_stride + src_offset + i]
  int64_t src_row_stride, src_head_stride, src_offset;
  float* dst;        // same indexing with the dst_* strides
  int64_t dst_row_stride, dst_head_stride, dst_offset;
  const float* cos;  // [tokens, rope_dim / 2]
  const float* sin;
  int64_t tokens;
  int heads, rope_dim;
  bool interleaved;  // pairs (2i, 2i+1); else (i, i + R/2)
};
int launch_rope(const RopeArgs& a, void* stream);

}  // namespace mlakv::cuda::kernels
