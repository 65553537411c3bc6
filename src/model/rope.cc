#include "model/rope.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mlakv::rope {
namespace {

// find_correction_dim: the dimension whose wavelength completes `rotations` turns over
// the original context.
double correction_dim(double rotations, int dim, double theta, double original_max) {
  return dim * std::log(original_max / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
}

}  // namespace

StatusOr<std::vector<double>> inverse_frequencies(const RopeConfig& r, int rope_dim, bool long_factors) {
  if (rope_dim < 2 || rope_dim % 2 != 0) {
    return invalid_argument(fmt::format("rope: qk_rope_head_dim must be even and >= 2, got {}", rope_dim));
  }
  if (!(r.theta > 0.0) || !std::isfinite(r.theta)) {
    return invalid_argument(fmt::format("rope: theta must be finite and > 0, got {}", r.theta));
  }
  const int half = rope_dim / 2;
  std::vector<double> pos_freq(static_cast<std::size_t>(half)), inv(static_cast<std::size_t>(half));
  for (int i = 0; i < half; ++i) pos_freq[static_cast<std::size_t>(i)] = std::pow(r.theta, 2.0 * i / rope_dim);

  switch (r.scaling) {
    case RopeScaling::kNone:
      for (int i = 0; i < half; ++i) inv[static_cast<std::size_t>(i)] = 1.0 / pos_freq[static_cast<std::size_t>(i)];
      return inv;
    case RopeScaling::kLinear:
      if (!(r.factor > 0.0) || !std::isfinite(r.factor)) {
        return invalid_argument(fmt::format("rope: linear factor must be finite and > 0, got {}", r.factor));
      }
      for (int i = 0; i < half; ++i)
        inv[static_cast<std::size_t>(i)] = 1.0 / pos_freq[static_cast<std::size_t>(i)] / r.factor;
      return inv;
    case RopeScaling::kYarn: {
      if (!(r.factor > 0.0) || !std::isfinite(r.factor)) {
        return invalid_argument(fmt::format("rope: yarn factor must be finite and > 0, got {}", r.factor));
      }
      if (r.original_max_position < 1) {
        return invalid_argument(
            fmt::format("rope: yarn original_max_position must be >= 1, got {}", r.original_max_position));
      }
      if (!(r.beta_fast > 0.0) || !(r.beta_slow > 0.0)) {
        return invalid_argument(
            fmt::format("rope: yarn beta_fast ({}) and beta_slow ({}) must be > 0", r.beta_fast, r.beta_slow));
      }
      const double orig = r.original_max_position;
      double low = correction_dim(r.beta_fast, rope_dim, r.theta, orig);
      double high = correction_dim(r.beta_slow, rope_dim, r.theta, orig);
      if (r.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(rope_dim - 1));
      if (low == high) high += 0.001;  // HF: "prevent singularity"
      for (int i = 0; i < half; ++i) {
        const double p = pos_freq[static_cast<std::size_t>(i)];
        const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
        inv[static_cast<std::size_t>(i)] = ramp / (r.factor * p) + (1.0 - ramp) / p;
      }
      return inv;
    }
    case RopeScaling::kLongRope: {
      const std::vector<double>& ext = long_factors ? r.long_factor : r.short_factor;
      const char* which = long_factors ? "long_factor" : "short_factor";
      if (static_cast<int>(ext.size()) != half) {
        return invalid_argument(
            fmt::format("rope: longrope {} has {} entries, qk_rope_head_dim / 2 = {}", which, ext.size(), half));
      }
      for (int i = 0; i < half; ++i) {
        const double e = ext[static_cast<std::size_t>(i)];
        if (!(e > 0.0) || !std::isfinite(e)) {
          return invalid_argument(fmt::format("rope: longrope {}[{}] must be finite and > 0, got {}", which, i, e));
        }
        inv[static_cast<std::size_t>(i)] = 1.0 / (e * pos_freq[static_cast<std::size_t>(i)]);
      }
      return inv;
    }
  }
  return invalid_argument(fmt::format("rope: unknown scaling id {}", static_cast<int>(r.scaling)));
}

double cos_sin_multiplier(const RopeConfig& r) {
  return r.scaling == RopeScaling::kYarn || r.scaling == RopeScaling::kLongRope ? r.attention_factor : 1.0;
}

StatusOr<RopeTable> RopeTable::create(const RopeConfig& r, int rope_dim) {
  RopeTable t;
  MLAKV_ASSIGN_OR_RETURN(t.inv_, inverse_frequencies(r, rope_dim, false));
  if (r.scaling == RopeScaling::kLongRope) {
    MLAKV_ASSIGN_OR_RETURN(t.inv_long_, inverse_frequencies(r, rope_dim, true));
    t.longrope_ = true;
  }
  t.rope_dim_ = rope_dim;
  t.interleaved_ = r.interleaved;
  t.original_max_position_ = r.original_max_position;
  t.multiplier_ = cos_sin_multiplier(r);
  if (!(t.multiplier_ > 0.0) || !std::isfinite(t.multiplier_)) {
    return invalid_argument(fmt::format("rope: attention_factor must be finite and > 0, got {}", t.multiplier_));
  }
  return t;
}

bool RopeTable::uses_long_factors(std::span<const int64_t> positions) const {
  if (!longrope_ || positions.empty()) return false;
  const int64_t max_pos = *std::max_element(positions.begin(), positions.end());
  return max_pos + 1 > original_max_position_;
}

void RopeTable::cos_sin(int64_t position, bool long_factors, double* cos, double* sin) const {
  const std::vector<double>& inv = long_factors && longrope_ ? inv_long_ : inv_;
  for (std::size_t i = 0; i < inv.size(); ++i) {
    const double angle = static_cast<double>(position) * inv[i];
    cos[i] = std::cos(angle) * multiplier_;
    sin[i] = std::sin(angle) * multiplier_;
  }
}

void RopeTable::rotate(float* x, int64_t position, bool long_factors) const {
  const int half = rope_dim_ / 2;
  double c[256], s[256];  // rope_dim <= 512 is checked by the layer; chunked below otherwise
  for (int i0 = 0; i0 < half; i0 += 256) {
    const int n = std::min(256, half - i0);
    const std::vector<double>& inv = long_factors && longrope_ ? inv_long_ : inv_;
    for (int j = 0; j < n; ++j) {
      const double angle = static_cast<double>(position) * inv[static_cast<std::size_t>(i0 + j)];
      c[j] = std::cos(angle) * multiplier_;
      s[j] = std::sin(angle) * multiplier_;
    }
    for (int j = 0; j < n; ++j) {
      const int i = i0 + j;
      float& a = interleaved_ ? x[2 * i] : x[i];
      float& b = interleaved_ ? x[2 * i + 1] : x[i + half];
      const double xa = a, xb = b;
      a = static_cast<float>(xa * c[j] - xb * s[j]);
      b = static_cast<float>(xb * c[j] + xa * s[j]);
    }
  }
}

}  // namespace mlakv::rope
