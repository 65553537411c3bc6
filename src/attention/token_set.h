// Helpers shared by the CPU attention implementations (reference and optimized):
// how a request's token set is enumerated, so both read exactly the same slots.
#pragma once

#include <algorithm>
#include <cstdint>

#include "mlakv/attention.h"
#include "mlakv/numerics.h"

namespace mlakv {

inline constexpr int kMaxSplits = 256;

namespace attn {

inline int32_t i32_at(const TensorView& t, int64_t i) { return t.ptr<const int32_t>()[i * t.stride(0)]; }

// Number of tokens query i of request b may attend to (dense mode).
inline int64_t visible_tokens(const MlaAttentionParams& p, int64_t b, int64_t i) {
  const int64_t len = i32_at(p.seqlens, b);
  if (!p.causal) return len;
  const int64_t s_q = p.q.size(1);
  return std::clamp<int64_t>(len - s_q + i + 1, 0, len);
}

// Slot of position `pos` of request b (dense mode).
inline int64_t dense_slot(const MlaAttentionParams& p, int64_t b, int64_t pos) {
  const int bs = p.cache.block_size;
  const int32_t blk = p.block_table.ptr<const int32_t>()[b * p.block_table.stride(0) + (pos / bs) * p.block_table.stride(1)];
  return static_cast<int64_t>(blk) * bs + pos % bs;
}

// Number of index entries of request b that count (sparse mode).
inline int64_t sparse_count(const MlaAttentionParams& p, int64_t b) {
  const int64_t topk = p.indices.size(2);
  if (p.topk_length.data == nullptr) return topk;
  return std::min<int64_t>(topk, i32_at(p.topk_length, b));
}

// Slot of entry k for query (b, i), or -1 when the entry is skipped (sparse mode).
inline int64_t sparse_slot(const MlaAttentionParams& p, int64_t b, int64_t i, int64_t k) {
  const int32_t s = p.indices.ptr<const int32_t>()[b * p.indices.stride(0) + i * p.indices.stride(1) + k * p.indices.stride(2)];
  return (s < 0 || s >= p.cache.num_slots()) ? -1 : s;
}

// q[b, i, h, d] as float.
inline float q_at(const MlaAttentionParams& p, int64_t b, int64_t i, int64_t h, int64_t d) {
  const int64_t off = b * p.q.stride(0) + i * p.q.stride(1) + h * p.q.stride(2) + d;
  return p.q.dtype == DType::kF32 ? p.q.ptr<const float>()[off] : bf16_to_f32(p.q.ptr<const uint16_t>()[off]);
}

inline float* out_row(const MlaAttentionParams& p, int64_t b, int64_t i, int64_t h) {
  return p.out.ptr<float>() + b * p.out.stride(0) + i * p.out.stride(1) + h * p.out.stride(2);
}
inline float& lse_at(const MlaAttentionParams& p, int64_t b, int64_t i, int64_t h) {
  return p.lse.ptr<float>()[b * p.lse.stride(0) + i * p.lse.stride(1) + h * p.lse.stride(2)];
}

}  // namespace attn
}  // namespace mlakv
