#include "mlakv/synthetic.h"

#include <cmath>
#include <numeric>

namespace mlakv::synthetic {

LatentGenerator::LatentGenerator(const LatentStats& s) : s_(s), state_(s.seed * 0x9E3779B97F4A7C15ull + 1) {
  gamma_.resize(static_cast<std::size_t>(s.latent_dim));
  for (float& g : gamma_) g = s.gamma_median * std::exp(s.gamma_sigma * normal());
  // Outlier channels spread over the latent (so different fp8 tiles / nvfp4 groups get them).
  for (int k = 0; k < s.outlier_channels && s.latent_dim > 0; ++k) {
    const int ch = static_cast<int>((static_cast<int64_t>(k) * 7919 + 13) % s.latent_dim);
    gamma_[static_cast<std::size_t>(ch)] *= 8.0f + 8.0f * static_cast<float>(k) / std::max(1, s.outlier_channels - 1);
  }
}

// splitmix64 + Box-Muller: fast, reproducible across platforms.
float LatentGenerator::normal() {
  auto next = [&] {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const double u1 = (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  const double u2 = static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void LatentGenerator::generate(int64_t n, float* latent, float* rope) {
  const int L = s_.latent_dim, R = s_.rope_dim;
  std::vector<float> z(static_cast<std::size_t>(L));
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0;
    for (float& x : z) {
      x = normal();
      ss += static_cast<double>(x) * x;
    }
    const float inv_rms = static_cast<float>(1.0 / std::sqrt(ss / L + 1e-6));
    for (int i = 0; i < L; ++i) latent[t * L + i] = gamma_[static_cast<std::size_t>(i)] * z[static_cast<std::size_t>(i)] * inv_rms;
    for (int i = 0; i < R; ++i) rope[t * R + i] = s_.rope_std * normal();
  }
}

}  // namespace mlakv::synthetic
