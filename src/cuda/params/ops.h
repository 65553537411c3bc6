// Params of the small ops of the GPU layer path (smxx/ops/): RMSNorm, bias add, RoPE.
// Strides in elements; rows are contiguous along their n (or head) dimension.
#pragma once

#include <cstdint>

namespace mlakv::cuda::kernels {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for `rows` rows of n floats.
struct RmsNormParams {
  const float* x;  // [rows, n] f32, row stride x_stride
  int64_t x_stride;
  int n;
  const float* w;  // [n] f32
  float eps;
  float* y;        // [rows, n] f32, row stride y_stride (may alias x)
  int64_t y_stride;
  int64_t rows;
};

// x[r][i] += b[i].
struct AddBiasParams {
  float* x;        // [rows, n] f32, row stride `stride`, updated in place
  int64_t stride;
  const float* b;  // [n] f32
  int n;
  int64_t rows;
};

// Rotates the rope_dim dims at `offset` of every (token, head) of src into dst.
struct RopeParams {
  const float* src;  // [tokens, heads, ...] f32: element i of (t, h) at t * src_row_stride + h * src_head_stride + src_offset + i
  int64_t src_row_stride, src_head_stride, src_offset;
  float* dst;        // same indexing with the dst_* strides (may alias src)
  int64_t dst_row_stride, dst_head_stride, dst_offset;
  const float* cos;  // [tokens, rope_dim / 2] f32, contiguous
  const float* sin;  // [tokens, rope_dim / 2] f32, contiguous
  int64_t tokens;
  int heads, rope_dim;
  bool interleaved;  // pairs (2i, 2i+1); else (i, i + R/2)
};
// The name the GPU layer (src/model/cuda_layer.cc) spells; one struct, two spellings
// until that file is next edited.
using RopeArgs = RopeParams;

}  // namespace mlakv::cuda::kernels
