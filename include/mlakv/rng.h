// Reproducible random numbers (the synthetic weights and latents, tests):
// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014) and Box-Muller normals on top. Same bits on every platform and compiler,
// unlike std::normal_distribution, so generated data (and what tests pin on it) is
// portable. Not for anything needing statistical strength beyond test data.
#pragma once

#include <cmath>
#include <cstdint>

namespace mlakv {

inline constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio

// The splitmix64 output for state `x`: (x + gamma) through the MurmurHash3-style finalizer.
// Also a good 64-bit hash of `x`.
constexpr uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + kSplitMix64Gamma;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  // The seed is spread (seed * gamma + 1) so that small consecutive seeds start far apart.
  explicit SplitMix64(uint64_t seed) : state_(seed * kSplitMix64Gamma + 1) {}

  uint64_t next() {
    const uint64_t r = splitmix64(state_);
    state_ += kSplitMix64Gamma;
    return r;
  }
  // Uniform on (0, 1) (never 0: safe under log) and on [0, 1), 53 random bits each.
  double uniform_open() { return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // N(0, 1) by Box-Muller (the cosine branch; two draws per value).
  float normal() {
    const double u1 = uniform_open();
    const double u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t state_;
};

}  // namespace mlakv
