// Argument validation for the attention operation (shared by every backend) and the
// public merge_attn_states.
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "attention/token_set.h"
#include "mlakv/attention.h"
#include "mlakv/attn_state.h"

namespace mlakv {

Status validate_mla_attention(const MlaAttentionParams& p) {
  MLAKV_RETURN_IF_ERROR(check_cache_view(p.cache, "cache"));
  if (p.cache.latent_dim != kLatentDim || p.cache.rope_dim != kRopeDim) {
    return invalid_argument(fmt::format("cache: attention needs latent {} + rope {}, got {} + {}", kLatentDim,
                                        kRopeDim, p.cache.latent_dim, p.cache.rope_dim));
  }
  const Device dev = p.cache.device;
  MLAKV_RETURN_IF_ERROR(check_tensor(p.q, "q", {{DType::kF32, DType::kBF16}, {-1, -1, -1, kQkDim}}, dev));
  const int64_t B = p.q.size(0), s_q = p.q.size(1), H = p.q.size(2);
  if (B < 1 || s_q < 1 || H < 1) {
    return invalid_argument(fmt::format("q: batch, s_q and heads must be >= 1, got shape {}", p.q.shape_string()));
  }
  MLAKV_RETURN_IF_ERROR(check_tensor(p.out, "out", {{DType::kF32}, {B, s_q, H, kLatentDim}}, dev));
  MLAKV_RETURN_IF_ERROR(check_tensor(p.lse, "lse", {{DType::kF32}, {B, s_q, H}}, dev));
  if (!std::isfinite(p.softmax_scale) || !(p.softmax_scale > 0.0f)) {
    return invalid_argument(fmt::format("softmax_scale must be finite and > 0, got {}", p.softmax_scale));
  }
  if (p.num_splits < 1 || p.num_splits > kMaxSplits) {
    return invalid_argument(fmt::format("num_splits must be in [1, {}], got {}", kMaxSplits, p.num_splits));
  }
  const bool host = dev.type == DeviceType::kCpu;
  if (p.sparse()) {
    MLAKV_RETURN_IF_ERROR(check_tensor(p.indices, "indices", {{DType::kI32}, {B, s_q, -1}}, dev));
    if (p.topk_length.data != nullptr || p.topk_length.ndim != 0) {
      MLAKV_RETURN_IF_ERROR(check_tensor(p.topk_length, "topk_length", {{DType::kI32}, {B}}, dev));
      if (host) {
        const int64_t topk = p.indices.size(2);
        for (int64_t b = 0; b < B; ++b) {
          const int32_t k = p.topk_length.ptr<const int32_t>()[b * p.topk_length.stride(0)];
          if (k < 0 || k > topk) {
            return invalid_argument(fmt::format("topk_length[{}] = {} is outside [0, {}]", b, k, topk));
          }
        }
      }
    }
    return Status::Ok();
  }
  MLAKV_RETURN_IF_ERROR(check_tensor(p.block_table, "block_table", {{DType::kI32}, {B, -1}}, dev));
  MLAKV_RETURN_IF_ERROR(check_tensor(p.seqlens, "seqlens", {{DType::kI32}, {B}}, dev));
  if (!host) return Status::Ok();  // device tables are checked by the kernels (they skip bad blocks)
  const int64_t max_blocks = p.block_table.size(1);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t len = p.seqlens.ptr<const int32_t>()[b * p.seqlens.stride(0)];
    if (len < 0 || static_cast<int64_t>(len) > max_blocks * p.cache.block_size) {
      return invalid_argument(fmt::format("seqlens[{}] = {} is outside [0, {} blocks x {}]", b, len, max_blocks,
                                          p.cache.block_size));
    }
    const int64_t used = (static_cast<int64_t>(len) + p.cache.block_size - 1) / p.cache.block_size;
    for (int64_t k = 0; k < used; ++k) {
      const int32_t blk = p.block_table.ptr<const int32_t>()[b * p.block_table.stride(0) + k * p.block_table.stride(1)];
      if (blk < 0 || blk >= p.cache.num_blocks) {
        return out_of_range(fmt::format("block_table[{}][{}] = {} is not a block of the cache (it has {})", b, k,
                                        blk, p.cache.num_blocks));
      }
    }
  }
  return Status::Ok();
}

Status merge_attn_states(const TensorView& o_parts, const TensorView& lse_parts, const TensorView& out,
                         const TensorView& lse) {
  MLAKV_RETURN_IF_ERROR(check_tensor(o_parts, "o_parts", {{DType::kF32}, {-1, -1, -1}}, Device::cpu()));
  const int64_t P = o_parts.size(0), N = o_parts.size(1), D = o_parts.size(2);
  MLAKV_RETURN_IF_ERROR(check_tensor(lse_parts, "lse_parts", {{DType::kF32}, {P, N}}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(out, "out", {{DType::kF32}, {N, D}}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(lse, "lse", {{DType::kF32}, {N}}, Device::cpu()));
  if (P < 1) return invalid_argument("o_parts: at least one partial is needed");
  for (int64_t n = 0; n < N; ++n) {
    float* o = out.ptr<float>() + n * out.stride(0);
    for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
    AttnState st;
    for (int64_t k = 0; k < P; ++k) {
      const float* op = o_parts.ptr<const float>() + k * o_parts.stride(0) + n * o_parts.stride(1);
      st.merge(o, op, lse_parts.ptr<const float>()[k * lse_parts.stride(0) + n * lse_parts.stride(1)],
               static_cast<int>(D));
    }
    lse.ptr<float>()[n * lse.stride(0)] = st.lse;
  }
  return Status::Ok();
}

}  // namespace mlakv
