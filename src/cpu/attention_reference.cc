// The float64 specification of MLA attention: no tiling, no splits, no shortcuts.
#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "format/record_codec.h"
#include "attention/token_set.h"

namespace mlakv {
namespace {

// loader(slot, k) fills k[0..575] with the slot's decoded [latent | rope].
using Loader = std::function<void(int64_t slot, double* k)>;

void reference_impl(const MlaAttentionParams& p, const Loader& load) {
  const int64_t B = p.q.size(0), s_q = p.q.size(1), H = p.q.size(2);
  std::vector<double> keys, s;
  std::vector<double> q(kQkDim), o(kLatentDim);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < s_q; ++i) {
      // The token set of query (b, i), decoded once for all heads.
      std::vector<int64_t> slots;
      if (p.sparse()) {
        for (int64_t k = 0; k < attn::sparse_count(p, b); ++k) {
          const int64_t slot = attn::sparse_slot(p, b, i, k);
          if (slot >= 0) slots.push_back(slot);
        }
      } else {
        for (int64_t pos = 0; pos < attn::visible_tokens(p, b, i); ++pos) slots.push_back(attn::dense_slot(p, b, pos));
      }
      const std::size_t n = slots.size();
      keys.resize(n * kQkDim);
      for (std::size_t t = 0; t < n; ++t) load(slots[t], keys.data() + t * kQkDim);
      s.resize(n);
      for (int64_t h = 0; h < H; ++h) {
        for (int d = 0; d < kQkDim; ++d) q[static_cast<std::size_t>(d)] = attn::q_at(p, b, i, h, d);
        double mx = -std::numeric_limits<double>::infinity();
        for (std::size_t t = 0; t < n; ++t) {
          double dot = 0;
          for (int d = 0; d < kQkDim; ++d) dot += q[static_cast<std::size_t>(d)] * keys[t * kQkDim + static_cast<std::size_t>(d)];
          s[t] = dot * static_cast<double>(p.softmax_scale);
          mx = std::max(mx, s[t]);
        }
        std::fill(o.begin(), o.end(), 0.0);
        double sum = 0;
        for (std::size_t t = 0; t < n; ++t) {
          const double w = std::exp(s[t] - mx);
          sum += w;
          for (int d = 0; d < kLatentDim; ++d) o[static_cast<std::size_t>(d)] += w * keys[t * kQkDim + static_cast<std::size_t>(d)];
        }
        float* out = attn::out_row(p, b, i, h);
        if (n == 0) {
          for (int d = 0; d < kLatentDim; ++d) out[d] = 0.0f;
          attn::lse_at(p, b, i, h) = -std::numeric_limits<float>::infinity();
        } else {
          for (int d = 0; d < kLatentDim; ++d) out[d] = static_cast<float>(o[static_cast<std::size_t>(d)] / sum);
          attn::lse_at(p, b, i, h) = static_cast<float>(mx + std::log(sum));
        }
      }
    }
  }
}

}  // namespace

Status mla_attention_reference(const MlaAttentionParams& p) {
  MLAKV_RETURN_IF_ERROR(validate_mla_attention(p));
  if (p.cache.device.type != DeviceType::kCpu) return invalid_argument("the reference runs on CPU tensors only");
  reference_impl(p, [&](int64_t slot, double* k) {
    float lat[kLatentDim], rope[kRopeDim];
    codec::decode_record(p.cache.format, p.cache.record(slot), p.cache.outer_scale, lat, rope, p.cache.token_scale);
    for (int d = 0; d < kLatentDim; ++d) k[d] = lat[d];
    for (int d = 0; d < kRopeDim; ++d) k[kLatentDim + d] = rope[d];
  });
  return Status::Ok();
}

Status mla_attention_reference_unquantized(const MlaAttentionParams& p, const TensorView& kv) {
  MLAKV_RETURN_IF_ERROR(validate_mla_attention(p));
  if (p.cache.device.type != DeviceType::kCpu) return invalid_argument("the reference runs on CPU tensors only");
  MLAKV_RETURN_IF_ERROR(check_tensor(kv, "kv", {{DType::kF32}, {p.cache.num_slots(), kQkDim}}, Device::cpu()));
  reference_impl(p, [&](int64_t slot, double* k) {
    const float* row = kv.ptr<const float>() + slot * kv.stride(0);
    for (int d = 0; d < kQkDim; ++d) k[d] = row[d];
  });
  return Status::Ok();
}

}  // namespace mlakv
