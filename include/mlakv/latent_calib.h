// The mlakv recipe's calibration file and statistics (docs/calibration.md "The mlakv
// recipe", docs/quality.md): a LatentTransform (include/mlakv/latent_transform.h) per
// layer, estimated from what the model runner sees on calibration text.
//
// The file, "mlakv_latent_transform_v2", is one JSON object; every key below is
// required unless marked optional, and any other key (top level or per layer) is an error:
//   {"format": "mlakv_latent_transform_v2",  or "mlakv_latent_transform_v1" (read, never
//                                     written): the same without "nvfp4_scales", meaning "rn"
//    "num_layers": 4,                  an integer in [1, 65536]
//    "latent_dim": 512, "rope_dim": 64,  exactly these integers
//    "denominator": 2688.0,            s_l = max |c'| / denominator (exactly 2688 = 6 * 448)
//    "importance": "query",            optional: the importance estimate d was made with
//    "nvfp4_scales": "search",         "rn" or "search" (v2; Nvfp4ScaleMode, codec.h): how the
//                                      nvfp4 writers choose group scale codes for these records
//    "seed_search": {                  optional (audit): how the sign seed was chosen
//      "format": "nvfp4_ds_mla",       a record format name
//      "context": 2048, "windows": 4,  integers >= 2 and >= 1
//      "candidates": [{"seed": 7, "kld_mean": 0.0061}, ...],  >= 2 distinct seeds in
//                                      [0, 2^53), each with a finite kld_mean >= 0
//      "chosen": 7},                   one of the candidates' seeds, the layers' base:
//                                      every rotating layer l has sign_seed chosen + 2 l,
//                                      every RoPE-rotating one rope_sign_seed chosen + 2 l + 1
//    "layers": [                       num_layers objects:
//      {"mu": [512 numbers],           finite, |mu| <= 1e30
//       "d": [512 numbers],            finite, in [2^-40, 2^40]
//       "rotate": true,                a boolean
//       "sign_seed": 7,                an integer in [0, 2^53)
//       "rope_rotate": false,          a boolean
//       "rope_sign_seed": 0,           an integer in [0, 2^53)
//       "outer_scale": 0.0031,         > 0 and > 0 in float32
//       "max_abs": 8.3}, ...]}         optional (audit): max |c'| on the calibration text, >= 0
// Numbers are read as float32 (the nearest); booleans are never numbers, integers must be
// JSON integers. Errors name the file, the layer and the field
// ("t.json: layers[2].d[17] must be a finite number in [2^-40, 2^40], got 0").
// The fork's nvfp4_ds_mla_outer_scale_v1 (include/mlakv/outer_scales.h) is unchanged;
// load_scale_file reads either kind by its "format" key.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mlakv/latent_transform.h"
#include "mlakv/outer_scales.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"

namespace mlakv {

// ---- the file ------------------------------------------------------------------------

// The JSON text (1-space indented; every float32 round-trips exactly). `max_abs` (optional,
// [num_layers] or empty) is written as each layer's audit field. Fails on an invalid
// transform (validate_latent_transform).
StatusOr<std::string> latent_transform_to_json(const LatentTransform& t, std::span<const double> max_abs = {});
// Writes the file atomically (io::AtomicFile: temporary + rename; a failure leaves an
// existing file untouched).
Status write_latent_transform(const std::string& path, const LatentTransform& t, std::span<const double> max_abs = {});
// Strict parse; `source` names the file in messages.
StatusOr<LatentTransform> parse_latent_transform(std::string_view json_text, std::string_view source);
StatusOr<LatentTransform> load_latent_transform(const std::string& path);

// Either kind of scale file, told apart by its "format" key.
struct ScaleFile {
  enum class Kind { kOuterScales, kLatentTransform } kind = Kind::kOuterScales;
  OuterScales outer_scales;   // kOuterScales (the fork's recipe)
  LatentTransform transform;  // kLatentTransform (the mlakv recipe)
};
// Fails naming the file when "format" is missing or names neither kind, and with the
// strict parser's error of that kind otherwise.
StatusOr<ScaleFile> parse_scale_file(std::string_view json_text, std::string_view source);
StatusOr<ScaleFile> load_scale_file(const std::string& path);

// ---- calibration ---------------------------------------------------------------------

// The per-dim importance w_i that sets d_i = sqrt(w_i / sd_i) (sd_i: the RMS of the
// centred latent on dim i). With a Hadamard after D the quantization error is spread
// evenly over c' with a variance proportional to sum_j d_j^2 sd_j^2, and comes back on
// dim i divided by d_i, so a loss sum_i w_i^2 err_i^2 is proportional to
// (sum_j d_j^2 sd_j^2)(sum_i w_i^2 / d_i^2), least at d_i^2 proportional to w_i / sd_i
// (Cauchy-Schwarz). The estimates of w_i (gradient-free, from what the runner sees):
enum class LatentImportance {
  kNone,         // d_i = 1 (centring and rotation only)
  kUniform,      // w_i = 1: d_i = sd_i^-1/2
  kQuery,        // w_i = sqrt(sum_h E[q_lat_hi^2]): what an error on c_i moves scores by
  kOutput,       // w_i = sqrt(e_i), e_i = Model::latent_output_energy: what it moves the output by
  kQueryOutput,  // w_i^2 = q_i / mean(q) + e_i / mean(e)
  // And one measured outside (LatentTransformRecipe::weights, an mlakv_latent_importance_v1
  // file): w_i^2 = w2_i / mean(w2), e.g. the Fisher diagonal of the model's output w.r.t. the
  // latent from autograd (tools/latent_importance.py).
  kFile,
};
// "none", "uniform", "query", "output", "query+output", "file"
std::string_view latent_importance_name(LatentImportance k);
std::optional<LatentImportance> parse_latent_importance(std::string_view name);

// ---- the importance file: mlakv_latent_importance_v1 ------------------------------------
//
// Per-layer, per-dim loss weights of the cached latent (docs/calibration.md "The importance
// file"), one JSON object; every key required unless marked optional, no other key:
//   {"format": "mlakv_latent_importance_v1",
//    "num_layers": 4,                 an integer in [1, 65536]
//    "latent_dim": 512,               exactly
//    "estimate": "fisher",            "fisher" or "gradient" (how w2 was measured)
//    "source": {...},                 optional (audit): any object (the tool's provenance)
//    "layers": [{"w2": [512 numbers]}, ...]}   num_layers objects of exactly that key; finite,
//                                     in [0, 1e30], at least one > 0 per layer
// Errors name the file, the layer and the field.
inline constexpr std::string_view kLatentImportanceFileFormat = "mlakv_latent_importance_v1";
struct LatentImportanceWeights {
  std::string estimate;                 // "fisher" or "gradient"
  std::vector<std::vector<double>> w2;  // [num_layers][512]
  int num_layers() const { return static_cast<int>(w2.size()); }
};
StatusOr<LatentImportanceWeights> parse_latent_importance_file(std::string_view json_text, std::string_view source);
StatusOr<LatentImportanceWeights> load_latent_importance_file(const std::string& path);

struct LatentTransformRecipe {
  bool center = true;   // mu = the mean latent (else 0)
  // The defaults are the best measured on the shipped model (docs/quality.md).
  LatentImportance importance = LatentImportance::kUniform;
  bool rotate = true;       // the signed 512-point Hadamard
  bool rope_rotate = true;  // the signed 64-point Hadamard on k_pe (q_pe rotated in the layer)
  // d_i = sqrt(w_i) / sd_i^sd_power: 0.5 is the optimum of the error model above; 0 keeps
  // only the importance, 1 whitens fully (for studies; in [0, 1]).
  double sd_power = 0.5;
  uint64_t seed = 0x6D6C616B76;  // layer l's signs: seed + 2 l (latent), seed + 2 l + 1 (rope)
  // The sign seed is a lottery (on the shipped model the held-out 432 B KLD ratio to the fork's
  // recipe spans 0.57-0.69 over six seeds, docs/quality.md): calibrate_latent_transform (eval.h)
  // tries `seed_candidates` base seeds seed + k * kLatentSeedStride (k = 0 .. n - 1) on the
  // calibration windows and keeps the one whose cache in `select_format` has the lowest mean
  // KLD against the unquantized reference (recorded as LatentTransform::seed_search). 1: the
  // seed as given, no selection. Only where something rotates (rotate or rope_rotate).
  int seed_candidates = 4;  // in [1, 64]
  KvFormat select_format = KvFormat::kNvfp4DsMla;
  // How the nvfp4 writers choose group scale codes for the transform's records (recorded as
  // LatentTransform::nvfp4_scales, in effect during the seed selection too). kSearch: the
  // group scale chosen among RN - 1, RN, RN + 1 by its squared error, measured 11% lower
  // KLD on the shipped model (docs/quality.md).
  Nvfp4ScaleMode nvfp4_scales = Nvfp4ScaleMode::kSearch;
  // importance kFile: the weights (one entry per model layer), else unused.
  LatentImportanceWeights weights;
};
// The CLI's --importance value: a name above, or "file:PATH" (kFile, the file loaded into
// recipe.weights). kInvalidArgument naming the option for an unknown name; the file's own
// error (path, layer, field) for a bad file.
Status set_latent_importance(LatentTransformRecipe& recipe, std::string_view option);
// Base seeds of successive candidates are this far apart, so that no two candidates share a
// layer's seed (layer l uses base + 2 l and base + 2 l + 1, l < 2^16).
inline constexpr uint64_t kLatentSeedStride = uint64_t{1} << 20;

// Accumulates per-layer latent and query moments (float64 sums) over any number of tokens.
class LatentTransformCalibrator {
 public:
  explicit LatentTransformCalibrator(int num_layers);
  int num_layers() const { return static_cast<int>(layers_.size()); }
  // kv_c_normed [T, 512] f32 CPU (contiguous rows). Fails on a bad layer or shape, or a
  // non-finite value (naming `what`, the token and dim).
  Status add_latent(int layer, const TensorView& kv_c_normed, std::string_view what = "kv_c_normed");
  // The absorbed query [T, H, 512 + R] f32 CPU: its q_lat part's per-dim second moments.
  Status add_query(int layer, const TensorView& q, std::string_view what = "q");
  // The transform for every layer with outer_scale 1.0 (the caller then measures max |c'|
  // and sets s_l = max / 2688). `output_energy`: per layer [512] (Model::latent_output_energy),
  // needed by kOutput / kQueryOutput, may be empty otherwise. Fails naming a layer with no
  // latents (or no queries when the importance needs them), or kFile weights that do not hold
  // exactly num_layers() layers of 512 dims.
  StatusOr<LatentTransform> finish(const LatentTransformRecipe& recipe,
                                   std::span<const std::vector<double>> output_energy = {}) const;

 private:
  struct Layer {
    int64_t tokens = 0, queries = 0;
    std::vector<double> sum, sum_sq, q_sum_sq;
  };
  std::vector<Layer> layers_;
};

// Sets every layer's outer_scale from max |c'| (s_l = max_abs[l] / 2688). Fails naming a
// layer whose max is not finite and > 0.
Status set_transform_outer_scales(LatentTransform& t, std::span<const double> max_abs);

}  // namespace mlakv
