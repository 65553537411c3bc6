// Synthetic MLA latents with the statistics of a real RMS-normed kv_c_normed, for the
// demo, benchmarks and quality experiments when no checkpoint is at hand.
//
// Assumptions (docs/demo.md): kv_c_normed = gamma * z / rms(z), z ~ N(0, I) per token,
// so every token has RMS ~ |gamma|. gamma (kv_a_layernorm's weight) is log-normal per
// channel (median 0.3, sigma 0.6), with `outlier_channels` channels 8-16x larger - the
// few high-magnitude channels seen in trained MLA layers, which is what stresses
// per-tile / per-group scales. Rotated k_pe ~ N(0, rope_std^2).
#pragma once

#include <cstdint>
#include <vector>

namespace mlakv::synthetic {

struct LatentStats {
  int latent_dim = 512;
  int rope_dim = 64;
  int outlier_channels = 6;
  float gamma_median = 0.3f;
  float gamma_sigma = 0.6f;
  float rope_std = 1.0f;
  uint64_t seed = 2026;
};

class LatentGenerator {
 public:
  explicit LatentGenerator(const LatentStats& s);
  const std::vector<float>& gamma() const { return gamma_; }
  // Writes n tokens: latent [n, latent_dim] and rope [n, rope_dim] (row-major).
  void generate(int64_t n, float* latent, float* rope);

 private:
  LatentStats s_;
  std::vector<float> gamma_;
  uint64_t state_;
  float normal();
};

}  // namespace mlakv::synthetic
