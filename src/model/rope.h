// Rotary position embedding for the MLA rope part (q_pe [H, R] and the shared k_pe [R]).
//
// Inverse frequencies follow transformers' rope init functions (modeling_rope_utils.py,
// checked against 5.17; facts only, no code copied), evaluated in float64:
//   default   inv[i] = theta^(-2i/R)                                  i in [0, R/2)
//   linear    inv[i] = theta^(-2i/R) / factor
//   yarn      _compute_yarn_parameters: with p_i = theta^(2i/R),
//             low/high = find_correction_range(beta_fast, beta_slow): the dimension
//               d(rot) = R ln(orig / (2 pi rot)) / (2 ln theta), low = d(beta_fast),
//               high = d(beta_slow), floored/ceiled when `truncate`, clamped to [0, R-1],
//               high += 0.001 when they meet;
//             ramp_i = clamp((i - low) / (high - low), 0, 1);
//             inv[i] = ramp_i / (factor p_i) + (1 - ramp_i) / p_i
//             (low dims keep the original frequency, high dims are interpolated).
//   longrope  inv[i] = 1 / (ext_i p_i), ext = long_factor when the call's largest
//             position + 1 exceeds original_max_position, else short_factor (HF's
//             longrope_frequency_update decides per forward call the same way).
// cos and sin are multiplied by RopeConfig::attention_factor under yarn and longrope
// (1 otherwise): HF's `attention_scaling`.
//
// Angles are pos * inv[i] in float64, so positions in the millions keep full accuracy.
// transformers and vLLM form the angle in float32 (error up to ~pos * 2^-24 rad); that
// difference is what the parity fixtures' positions near 4096 show (docs/layer.md).
//
// Layouts. interleaved (DeepSeek, Kimi, GLM): pair i is (x[2i], x[2i+1]); half-split
// (MiniCPM3, HF rotate_half): pair i is (x[i], x[i + R/2]). Each pair (a, b) becomes
// (a cos - b sin, b cos + a sin). The rotated vector stays in its input layout: mlakv
// caches k_pe pairwise, byte-compatible with vLLM; HF's rope_interleave path emits
// evens-then-odds instead, which gives the same dot products.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mlakv/model_config.h"
#include "mlakv/status.h"

namespace mlakv::rope {

// The R/2 inverse frequencies. Fails on an odd or non-positive rope_dim, theta <= 0,
// factor <= 0 (yarn, linear), original_max_position < 1 (yarn), or longrope factor
// lists whose length is not R/2 or that hold a non-positive value.
StatusOr<std::vector<double>> inverse_frequencies(const RopeConfig& rope, int rope_dim, bool long_factors = false);

// The cos/sin multiplier (attention_factor for yarn and longrope, else 1).
double cos_sin_multiplier(const RopeConfig& rope);

class RopeTable {
 public:
  // Validates as inverse_frequencies; also the multiplier (finite, > 0).
  static StatusOr<RopeTable> create(const RopeConfig& rope, int rope_dim);

  int rope_dim() const { return rope_dim_; }
  bool interleaved() const { return interleaved_; }
  // longrope: whether a call covering `positions` uses the long factors.
  bool uses_long_factors(std::span<const int64_t> positions) const;

  // cos[i], sin[i] (i < R/2) at `position`, multiplier included.
  void cos_sin(int64_t position, bool long_factors, double* cos, double* sin) const;
  // Rotates x [R] in place at `position` (float64 arithmetic, one rounding per output).
  void rotate(float* x, int64_t position, bool long_factors = false) const;

 private:
  int rope_dim_ = 0;
  bool interleaved_ = true;
  bool longrope_ = false;
  int64_t original_max_position_ = 0;
  double multiplier_ = 1.0;
  std::vector<double> inv_, inv_long_;
};

}  // namespace mlakv::rope
