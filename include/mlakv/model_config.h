// MLA model geometry: what the cache, attention, planner and weight loader need to
// know about a DeepSeek-V2/V3/V3.2, Kimi K2, GLM or MiniCPM3 style model. Filled by
// a preset (model_presets.cc) or by reading a Hugging Face config.json (weights/).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mlakv/mla_geometry.h"
#include "mlakv/status.h"

namespace mlakv {

enum class RopeScaling : uint8_t { kNone, kYarn, kLongRope, kLinear };

struct RopeConfig {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 1.0;
  int original_max_position = 4096;
  // YaRN (HF `_compute_yarn_parameters`)
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  // HF rope_parameters "truncate" (default true): floor/ceil the YaRN correction range.
  bool truncate = true;
  // Multiplier on cos/sin (HF `attention_factor` of `_compute_yarn_parameters` /
  // `_compute_longrope_parameters`); 1.0 for every published MLA config.
  double attention_factor = 1.0;
  // LongRoPE (MiniCPM3)
  std::vector<double> long_factor, short_factor;
  // true: pairwise (x0,x1),(x2,x3)... rotation (DeepSeek/Kimi/GLM);
  // false: half-split (x_i, x_{i+R/2}) rotation (MiniCPM3, HF default).
  bool interleaved = true;
};

// Most decoder layers, and most MTP layers, a config may declare (validate() checks;
// keeps cache_layers() and per-token byte counts far from overflow).
inline constexpr int kMaxModelLayers = 1 << 16;

// The model's MLA geometry (hidden_size, num_heads = all H of the model, q_lora_rank,
// kv_lora_rank, qk_nope/rope_head_dim, v_head_dim, qk_head_dim()) is the MlaGeometry
// base: a ModelConfig is passed wherever a layer, dequantization or absorption wants
// the geometry, and geometry() names that view.
struct ModelConfig : MlaGeometry {
  std::string name;        // preset name or the config's path
  std::string model_type;  // config.json model_type
  int num_layers = 0;      // decoder layers with MLA attention
  int num_mtp_layers = 0;  // next-token-prediction layers (they cache KV too)
  double rms_norm_eps = 1e-6;
  double kv_norm_eps = 1e-6;  // HF builds kv_a_layernorm with 1e-6 whatever rms_norm_eps says
  double q_norm_eps = 1e-6;   // ... and q_a_layernorm the same way
  RopeConfig rope;
  // DSA indexer (V3.2 / GLM-5): number of cache layers (MTP included) that keep a
  // 132 B/token indexer key cache; 0 for models without one.
  int indexer_layers = 0;
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  // config.json max_position_embeddings: the longest sequence the model was built for
  // (0 = unknown). `mlakv plan` caps the longest request at it; layer-forward refuses
  // positions at or past it.
  int max_position_embeddings = 0;

  const MlaGeometry& geometry() const { return *this; }
  MlaGeometry& geometry() { return *this; }
  // num_layers + num_mtp_layers, in int64 so an unvalidated config cannot overflow it.
  int64_t cache_layers() const { return int64_t{num_layers} + num_mtp_layers; }
  // (P+R)^-0.5 * m^2 with m = 0.1 * mscale_all_dim * ln(factor) + 1 under YaRN with a
  // non-zero mscale_all_dim (DeepSeek: 0.135234, Kimi K2 f=32: 0.130861, GLM-5: 0.0625).
  double softmax_scale() const;
  Status validate() const;  // positive dims, heads, etc.
};

// Typical deployment used by `mlakv plan` when the user gives no value.
struct DeploymentDefaults {
  int gpus = 1;
  double gpu_mem_gib = 80.0;
  int tp = 1;
  int dcp = 1;
  double mem_util = 0.9;
  double reserved_gib = 0.0;  // weights + activations + graphs, per GPU
  std::string_view note;      // where the numbers come from
  // The published checkpoint's weights in GiB (all ranks together); `mlakv plan` reserves
  // weight_gib / tp + activation_gib per GPU, which is reserved_gib at the preset's tp.
  double weight_gib = 0.0;
  double activation_gib = 4.0;  // activations, CUDA graphs and allocator slack per GPU
};

struct ModelPreset {
  std::string_view name;
  ModelConfig config;
  DeploymentDefaults deploy;
};

std::span<const ModelPreset> model_presets();
std::optional<ModelPreset> find_model_preset(std::string_view name);

}  // namespace mlakv
