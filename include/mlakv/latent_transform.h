// The calibrated latent transform (the mlakv recipe, issue 14; docs/quality.md,
// docs/calibration.md): what the cache writer does to a layer's latent before its
// record format quantizes it, and how the absorbed weights undo it.
//
// Per layer l, the writer stores
//   c' = H D (c - mu)          c = kv_c_normed [512], mu [512] the layer's mean latent,
//                              D = diag(d) (d > 0), H = W S / sqrt(512) when `rotate`
//                              (W the 512-point Walsh-Hadamard matrix, S = diag(signs),
//                              signs +-1 from `sign_seed`), else H = identity
//   k' = H_r k_pe              H_r = W_64 S_r / 8 when `rope_rotate`, else identity
// and the record format then quantizes c' (divided by the layer's outer scale
// `outer_scale` = s_l where the format has one) and k' as usual: records keep their
// layouts, readers and attention kernels are unchanged.
//
// Why the model's function is unchanged: H and H_r are orthogonal, and the latent enters
// attention only through q_lat . c and sum_t p_t c_t (sum_t p_t = 1):
//   q_lat . c = (H D^-1 q_lat) . c' + q_lat . mu        (the last term is the same for
//                                                         every token: softmax drops it)
//   sum_t p_t c_t = D^-1 H^T (sum_t p_t c'_t) + mu
//   q_pe . k_pe = (H_r q_pe) . (H_r k_pe)
// so every row r of kv_b_proj (W_UK rows act on q_lat, W_UV^T rows on the attention
// output; both are rows "r . c") becomes H D^-1 r, the output gains the bias W_UV mu
// per head, and the layer rotates q_pe by H_r after RoPE (fold_row, the model runner's
// Model::fold_latent_transform, fold_latent_transform in mla_layer.h).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mlakv/codec.h"
#include "mlakv/formats.h"
#include "mlakv/status.h"

namespace mlakv {

// The file's "format" (include/mlakv/latent_calib.h): v2 is written; v1 (before the
// nvfp4_scales field; its files mean Nvfp4ScaleMode::kRn) is still read.
inline constexpr std::string_view kLatentTransformFileFormat = "mlakv_latent_transform_v2";
inline constexpr std::string_view kLatentTransformFileFormatV1 = "mlakv_latent_transform_v1";

// One layer's transform. Defaults are the identity (mu = 0, d = 1, no rotation).
struct LatentTransformLayer {
  std::vector<float> mu;  // [512] subtracted first; finite
  std::vector<float> d;   // [512] per-dim scale; finite, > 0, in [2^-40, 2^40]
  bool rotate = false;    // the signed 512-point Hadamard after the scale
  uint64_t sign_seed = 0;  // the signs: latent_transform_signs(sign_seed, 512); < 2^53
  float outer_scale = 1.0f;  // s_l for formats with an outer scale (nvfp4 family); > 0
  bool rope_rotate = false;  // the signed 64-point Hadamard on k_pe (q_pe rotated the same way)
  uint64_t rope_sign_seed = 0;  // < 2^53

  static LatentTransformLayer identity();  // mu 0, d 1, no rotation, s_l 1
};

// How the sign seed was chosen (the file's optional "seed_search", docs/calibration.md):
// the calibration tried each candidate base seed b (layer l's signs b + 2 l, its RoPE
// signs b + 2 l + 1) on the calibration windows and kept the one whose cache in `format`
// had the lowest mean KLD against the unquantized reference.
struct LatentSeedSearch {
  std::string format;         // the record format it was selected in (a format name)
  int64_t context = 0;        // tokens per calibration window, >= 2
  int64_t windows = 0;        // calibration windows, >= 1
  std::vector<uint64_t> seeds;  // >= 2 distinct candidates, each < 2^53
  std::vector<double> kld_mean;  // per candidate, finite, >= 0
  uint64_t chosen = 0;          // one of `seeds`, the one the layers carry
};

struct LatentTransform {
  std::vector<LatentTransformLayer> layers;  // [num_layers]
  // For the record (the file's "calibration" object): how it was made, free text.
  std::string importance;  // the per-dim importance estimate ("query", "output", ...)
  std::optional<LatentSeedSearch> seed_search;  // for the record: the sign-seed selection
  // How the nvfp4 writers choose group scale codes for this transform's records (codec.h;
  // the file's "nvfp4_scales"): applied to every layer written in an nvfp4 format with it
  // (Model::transform_layer_formats). A v1 file reads as kRn.
  Nvfp4ScaleMode nvfp4_scales = Nvfp4ScaleMode::kRn;
  int num_layers() const { return static_cast<int>(layers.size()); }
};

// Checks every field; errors name `source`, the layer and the field
// ("t.json: layer 2: field 'd'[17] must be a finite number in [2^-40, 2^40], got 0").
Status validate_latent_transform(const LatentTransform& t, std::string_view source = "latent transform");
Status validate_latent_transform_layer(const LatentTransformLayer& l, std::string_view what);

// n values +-1 from SplitMix64(seed): bit 63 of each draw set -> -1.
std::vector<float> latent_transform_signs(uint64_t seed, int n);

// The unnormalised in-place Walsh-Hadamard transform of x[n] (n a power of two):
// x <- W x, W_ij = (-1)^popcount(i & j). float32 and float64 versions.
void fwht(float* x, int n);
void fwht(double* x, int n);

// A layer's transform ready to apply (the gains precomputed). Thread-safe to share.
class LatentTransformKernel {
 public:
  // Fails on an invalid layer (validate_latent_transform_layer).
  static StatusOr<LatentTransformKernel> create(const LatentTransformLayer& layer);

  const LatentTransformLayer& layer() const { return layer_; }
  bool rotates_rope() const { return layer_.rope_rotate; }

  // out[512] = H D (c - mu) in float32 (out may equal c).
  void latent(const float* c, float* out) const;
  // out[64] = H_r k (out may equal k); a copy when !rope_rotate.
  void rope(const float* k, float* out) const;
  // out[512] = H D^-1 r in float64: a weight row acting on c, refitted to act on c'.
  void fold_row(const float* r, double* out) const;
  // r . mu in float64: the constant a row "r . c" gains (the W_UV bias).
  double dot_mu(const float* r) const;
  // The inverse, for tests and tools: c[512] = D^-1 H^T c' + mu (float64).
  void inverse(const float* c_prime, double* c) const;
  // Largest |(c_i - mu_i) d_i| the float32 transform accepts without overflow
  // (|c'_j| <= sqrt(512) max_i |(c_i - mu_i) d_i|, and the butterflies stay within it).
  static constexpr float kMaxScaledInput = 3.0e35f;
  // max |(c_i - mu_i) d_i| over one token (what the writer checks against the bound).
  float max_scaled_input(const float* c) const;
  // A bound on it for every token whose max |c_i| is at most `max_abs_c`:
  // (max_abs_c + max |mu|) max d.
  float scaled_input_bound(float max_abs_c) const { return (max_abs_c + max_abs_mu_) * max_d_; }

  // The precomputed factors, for vectorized writers that reproduce latent() / rope()
  // bit for bit (the same operations in the same order): out = (c - mu) * gain, then the
  // butterflies of fwht (stage h = 1, 2, 4, ...) when rotates_latent().
  bool rotates_latent() const { return layer_.rotate; }
  const float* mu_data() const { return layer_.mu.data(); }
  const float* gain_data() const { return gain_.data(); }
  const float* rope_gain_data() const { return rope_gain_.data(); }  // [64] when rotates_rope()

 private:
  LatentTransformLayer layer_;
  std::vector<float> gain_;       // [512] d_i * s_i / sqrt(512) (rotate) or d_i
  std::vector<double> fold_gain_;  // [512] s_i / (d_i sqrt(512)) (rotate) or 1 / d_i
  std::vector<float> rope_gain_;  // [64] s_r / 8
  float max_abs_mu_ = 0, max_d_ = 0;
};

// One kernel per layer of `t` (validated).
StatusOr<std::vector<LatentTransformKernel>> make_latent_transform_kernels(const LatentTransform& t);

}  // namespace mlakv
