// The latent transform (include/mlakv/latent_transform.h): validation, signs, the
// Walsh-Hadamard butterflies and the per-layer kernel.
#include "mlakv/latent_transform.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "mlakv/rng.h"

namespace mlakv {
namespace {

constexpr double kMinD = 0x1p-40, kMaxD = 0x1p40;
constexpr uint64_t kMaxSeed = (uint64_t{1} << 53) - 1;  // a JSON integer every reader holds exactly

template <class T>
void fwht_impl(T* x, int n) {
  // Radix-2 butterflies; the inner loop over j is contiguous and independent, so the
  // compiler vectorizes every stage with h >= the vector width.
  for (int h = 1; h < n; h <<= 1) {
    for (int i = 0; i < n; i += 2 * h) {
      T* a = x + i;
      T* b = x + i + h;
      for (int j = 0; j < h; ++j) {
        const T u = a[j], v = b[j];
        a[j] = u + v;
        b[j] = u - v;
      }
    }
  }
}

}  // namespace

LatentTransformLayer LatentTransformLayer::identity() {
  LatentTransformLayer l;
  l.mu.assign(kLatentDim, 0.0f);
  l.d.assign(kLatentDim, 1.0f);
  return l;
}

Status validate_latent_transform_layer(const LatentTransformLayer& l, std::string_view what) {
  if (l.mu.size() != static_cast<std::size_t>(kLatentDim)) {
    return invalid_argument(fmt::format("{}: field 'mu' must hold {} numbers, got {}", what, kLatentDim, l.mu.size()));
  }
  if (l.d.size() != static_cast<std::size_t>(kLatentDim)) {
    return invalid_argument(fmt::format("{}: field 'd' must hold {} numbers, got {}", what, kLatentDim, l.d.size()));
  }
  for (int i = 0; i < kLatentDim; ++i) {
    if (!std::isfinite(l.mu[static_cast<std::size_t>(i)]) || std::abs(l.mu[static_cast<std::size_t>(i)]) > 1e30f)
      return invalid_argument(fmt::format("{}: field 'mu'[{}] must be a finite number of magnitude <= 1e30, got {}",
                                          what, i, l.mu[static_cast<std::size_t>(i)]));
    const double d = l.d[static_cast<std::size_t>(i)];
    if (!std::isfinite(d) || d < kMinD || d > kMaxD)
      return invalid_argument(
          fmt::format("{}: field 'd'[{}] must be a finite number in [2^-40, 2^40], got {}", what, i, d));
  }
  if (!std::isfinite(l.outer_scale) || !(l.outer_scale > 0.0f))
    return invalid_argument(
        fmt::format("{}: field 'outer_scale' must be a finite number > 0 that float32 can hold, got {}", what,
                    l.outer_scale));
  if (l.sign_seed > kMaxSeed)
    return invalid_argument(fmt::format("{}: field 'sign_seed' must be an integer in [0, 2^53), got {}", what,
                                        l.sign_seed));
  if (l.rope_sign_seed > kMaxSeed)
    return invalid_argument(fmt::format("{}: field 'rope_sign_seed' must be an integer in [0, 2^53), got {}", what,
                                        l.rope_sign_seed));
  return Status::Ok();
}

Status validate_latent_transform(const LatentTransform& t, std::string_view source) {
  if (t.layers.empty() || t.layers.size() > (1u << 16))
    return invalid_argument(fmt::format("{}: field 'num_layers' must be in [1, 65536], got {}", source,
                                        t.layers.size()));
  for (int l = 0; l < t.num_layers(); ++l)
    MLAKV_RETURN_IF_ERROR(validate_latent_transform_layer(t.layers[static_cast<std::size_t>(l)],
                                                          fmt::format("{}: layer {}", source, l)));
  if (t.nvfp4_scales != Nvfp4ScaleMode::kRn && t.nvfp4_scales != Nvfp4ScaleMode::kSearch)
    return invalid_argument(fmt::format("{}: field 'nvfp4_scales' holds the unknown mode {}", source,
                                        static_cast<int>(t.nvfp4_scales)));
  if (!t.seed_search) return Status::Ok();
  const LatentSeedSearch& s = *t.seed_search;
  auto bad = [&](std::string_view what) { return invalid_argument(fmt::format("{}: seed_search: {}", source, what)); };
  if (!parse_format(s.format)) return bad(fmt::format("format '{}' is not a record format", s.format));
  if (s.context < 2) return bad(fmt::format("context must be >= 2, got {}", s.context));
  if (s.windows < 1) return bad(fmt::format("windows must be >= 1, got {}", s.windows));
  if (s.seeds.size() < 2 || s.seeds.size() != s.kld_mean.size())
    return bad(fmt::format("needs >= 2 candidates, each with a kld_mean (got {} seeds, {} kld_mean)", s.seeds.size(),
                           s.kld_mean.size()));
  for (std::size_t i = 0; i < s.seeds.size(); ++i) {
    if (s.seeds[i] > kMaxSeed) return bad(fmt::format("candidates[{}].seed {} is not below 2^53", i, s.seeds[i]));
    if (!std::isfinite(s.kld_mean[i]) || s.kld_mean[i] < 0.0)
      return bad(fmt::format("candidates[{}].kld_mean must be finite and >= 0, got {}", i, s.kld_mean[i]));
    for (std::size_t j = 0; j < i; ++j)
      if (s.seeds[j] == s.seeds[i]) return bad(fmt::format("seed {} is a candidate twice", s.seeds[i]));
  }
  if (std::find(s.seeds.begin(), s.seeds.end(), s.chosen) == s.seeds.end())
    return bad(fmt::format("chosen {} is not one of the candidates", s.chosen));
  for (int l = 0; l < t.num_layers(); ++l) {
    const LatentTransformLayer& L = t.layers[static_cast<std::size_t>(l)];
    const uint64_t want = s.chosen + 2 * static_cast<uint64_t>(l);
    if (L.rotate && L.sign_seed != want)
      return bad(fmt::format("chosen {} means layer {}'s sign_seed {}, the layer has {}", s.chosen, l, want,
                             L.sign_seed));
    if (L.rope_rotate && L.rope_sign_seed != want + 1)
      return bad(fmt::format("chosen {} means layer {}'s rope_sign_seed {}, the layer has {}", s.chosen, l, want + 1,
                             L.rope_sign_seed));
  }
  return Status::Ok();
}

std::vector<float> latent_transform_signs(uint64_t seed, int n) {
  SplitMix64 rng(seed);
  std::vector<float> s(static_cast<std::size_t>(std::max(n, 0)));
  for (float& v : s) v = (rng.next() >> 63) != 0 ? -1.0f : 1.0f;
  return s;
}

void fwht(float* x, int n) { fwht_impl(x, n); }
void fwht(double* x, int n) { fwht_impl(x, n); }

StatusOr<LatentTransformKernel> LatentTransformKernel::create(const LatentTransformLayer& layer) {
  MLAKV_RETURN_IF_ERROR(validate_latent_transform_layer(layer, "latent transform layer"));
  LatentTransformKernel k;
  k.layer_ = layer;
  const std::vector<float> s =
      layer.rotate ? latent_transform_signs(layer.sign_seed, kLatentDim) : std::vector<float>(kLatentDim, 1.0f);
  const double norm = layer.rotate ? 1.0 / std::sqrt(static_cast<double>(kLatentDim)) : 1.0;
  k.gain_.resize(kLatentDim);
  k.fold_gain_.resize(kLatentDim);
  for (int i = 0; i < kLatentDim; ++i) {
    const double d = layer.d[static_cast<std::size_t>(i)];
    k.gain_[static_cast<std::size_t>(i)] = static_cast<float>(d * s[static_cast<std::size_t>(i)] * norm);
    k.fold_gain_[static_cast<std::size_t>(i)] = s[static_cast<std::size_t>(i)] * norm / d;
  }
  for (int i = 0; i < kLatentDim; ++i) {
    k.max_abs_mu_ = std::max(k.max_abs_mu_, std::abs(layer.mu[static_cast<std::size_t>(i)]));
    k.max_d_ = std::max(k.max_d_, layer.d[static_cast<std::size_t>(i)]);
  }
  if (layer.rope_rotate) {
    k.rope_gain_ = latent_transform_signs(layer.rope_sign_seed, kRopeDim);
    for (float& g : k.rope_gain_) g *= 0.125f;  // 1 / sqrt(64), exact
  }
  return k;
}

void LatentTransformKernel::latent(const float* c, float* out) const {
  const float* mu = layer_.mu.data();
  const float* g = gain_.data();
  for (int i = 0; i < kLatentDim; ++i) out[i] = (c[i] - mu[i]) * g[i];
  if (layer_.rotate) fwht(out, kLatentDim);
}

void LatentTransformKernel::rope(const float* k, float* out) const {
  if (!layer_.rope_rotate) {
    if (out != k) std::copy_n(k, kRopeDim, out);
    return;
  }
  for (int i = 0; i < kRopeDim; ++i) out[i] = k[i] * rope_gain_[static_cast<std::size_t>(i)];
  fwht(out, kRopeDim);
}

void LatentTransformKernel::fold_row(const float* r, double* out) const {
  for (int i = 0; i < kLatentDim; ++i) out[i] = static_cast<double>(r[i]) * fold_gain_[static_cast<std::size_t>(i)];
  if (layer_.rotate) fwht(out, kLatentDim);
}

double LatentTransformKernel::dot_mu(const float* r) const {
  double s = 0.0;
  for (int i = 0; i < kLatentDim; ++i) s += static_cast<double>(r[i]) * layer_.mu[static_cast<std::size_t>(i)];
  return s;
}

void LatentTransformKernel::inverse(const float* c_prime, double* c) const {
  for (int i = 0; i < kLatentDim; ++i) c[i] = c_prime[i];
  if (layer_.rotate) fwht(c, kLatentDim);
  // H^T = S W / sqrt(n): W first, then the signs, the norm and D^-1 (fold_gain_).
  for (int i = 0; i < kLatentDim; ++i)
    c[i] = c[i] * fold_gain_[static_cast<std::size_t>(i)] + layer_.mu[static_cast<std::size_t>(i)];
}

float LatentTransformKernel::max_scaled_input(const float* c) const {
  float m = 0.0f;
  for (int i = 0; i < kLatentDim; ++i)
    m = std::max(m, std::abs((c[i] - layer_.mu[static_cast<std::size_t>(i)]) * layer_.d[static_cast<std::size_t>(i)]));
  return m;
}

StatusOr<std::vector<LatentTransformKernel>> make_latent_transform_kernels(const LatentTransform& t) {
  MLAKV_RETURN_IF_ERROR(validate_latent_transform(t));
  std::vector<LatentTransformKernel> out;
  out.reserve(t.layers.size());
  for (const LatentTransformLayer& l : t.layers) {
    MLAKV_ASSIGN_OR_RETURN(LatentTransformKernel k, LatentTransformKernel::create(l));
    out.push_back(std::move(k));
  }
  return out;
}

}  // namespace mlakv
