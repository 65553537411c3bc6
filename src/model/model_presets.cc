// Model presets: geometries from each model's published config.json (docs/reference.md
// section 2) and the deployment `mlakv plan` assumes when the user gives none. Reserved
// memory = weight bytes per GPU + ~4 GiB for activations, CUDA graphs and the
// allocator's slack: weight_gib (the whole checkpoint) = (reserved_gib - 4) * tp.
#include <array>
#include <cmath>

#include <fmt/format.h>

#include "mlakv/model_config.h"

namespace mlakv {
namespace {

RopeConfig yarn(double theta, double factor, double mscale, double mscale_all_dim, double beta_fast = 32.0,
                double beta_slow = 1.0) {
  RopeConfig r;
  r.theta = theta;
  r.scaling = RopeScaling::kYarn;
  r.factor = factor;
  r.original_max_position = 4096;
  r.beta_fast = beta_fast;
  r.beta_slow = beta_slow;
  r.mscale = mscale;
  r.mscale_all_dim = mscale_all_dim;
  return r;
}

RopeConfig plain(double theta) {
  RopeConfig r;
  r.theta = theta;
  return r;
}

ModelConfig mla(std::string name, std::string type, int d, int layers, int mtp, int heads, int q_lora, int p,
                int v, RopeConfig rope, double eps) {
  ModelConfig c;
  c.name = std::move(name);
  c.model_type = std::move(type);
  c.hidden_size = d;
  c.num_layers = layers;
  c.num_mtp_layers = mtp;
  c.num_heads = heads;
  c.q_lora_rank = q_lora;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = p;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = v;
  c.rope = std::move(rope);
  c.rms_norm_eps = eps;
  return c;
}

ModelConfig ctx(ModelConfig c, int max_position_embeddings) {
  c.max_position_embeddings = max_position_embeddings;
  return c;
}

DeploymentDefaults deploy(int gpus, double gpu_mem, double reserved, std::string_view note) {
  DeploymentDefaults d{gpus, gpu_mem, gpus, 1, 0.9, reserved, note};
  d.weight_gib = (reserved - d.activation_gib) * gpus;
  return d;
}

ModelConfig with_indexer(ModelConfig c, int layers, int heads, int dim, int topk) {
  c.indexer_layers = layers;
  c.index_n_heads = heads;
  c.index_head_dim = dim;
  c.index_topk = topk;
  return c;
}

const std::array<ModelPreset, 7>& presets() {
  static const std::array<ModelPreset, 7> kPresets = {{
      {"deepseek-v2-lite",
       ctx(mla("deepseek-v2-lite", "deepseek_v2", 2048, 27, 0, 16, 0, 128, 128, yarn(10000, 40, 0.707, 0.707), 1e-6),
           163840),
       deploy(1, 80.0, 33.0, "1 x 80 GiB, bf16 weights (15.7B params = 29 GiB) + 4 GiB")},
      {"deepseek-v3",
       ctx(mla("deepseek-v3", "deepseek_v3", 7168, 61, 1, 128, 1536, 128, 128, yarn(10000, 40, 1.0, 1.0), 1e-6),
           163840),
       deploy(8, 140.0, 84.0, "8 x H200 (140 GiB), fp8 weights (~687 GB = 640 GiB / 8 = 80 GiB) + 4 GiB")},
      {"deepseek-v3.2",
       ctx(with_indexer(mla("deepseek-v3.2", "deepseek_v32", 7168, 61, 1, 128, 1536, 128, 128,
                            yarn(10000, 40, 1.0, 1.0), 1e-6),
                        62, 64, 128, 2048),
           163840),
       deploy(8, 140.0, 84.0, "8 x H200 (140 GiB), fp8 weights (~687 GB = 640 GiB / 8 = 80 GiB) + 4 GiB")},
      {"kimi-k2",
       ctx(mla("kimi-k2", "kimi_k2", 7168, 61, 0, 64, 1536, 128, 128, yarn(50000, 32, 1.0, 1.0, 1.0, 1.0), 1e-6),
           131072),
       deploy(16, 140.0, 64.0, "16 x H200 (140 GiB), fp8 weights (~1.03 TB = 960 GiB / 16 = 60 GiB) + 4 GiB")},
      {"glm-4.7-flash",
       ctx(mla("glm-4.7-flash", "glm4_moe_lite", 2048, 47, 0, 20, 768, 192, 256, plain(1e6), 1e-5), 202752),
       deploy(1, 140.0, 60.0, "1 x H200 (140 GiB), bf16 weights (~30B params = 56 GiB) + 4 GiB")},
      {"glm-5",
       ctx(with_indexer(mla("glm-5", "glm_moe_dsa", 6144, 78, 1, 64, 2048, 192, 256, plain(1e6), 1e-5), 79, 32,
                        128, 2048),
           202752),
       deploy(8, 140.0, 90.6, "8 x H200 (140 GiB), fp8 weights (~744 GB = 692.8 GiB / 8 = 86.6 GiB) + 4 GiB")},
      {"glm-5.2",
       // max_position_embeddings as GLM-5, whose shape GLM-5.2 keeps (docs/reference.md section 2).
       ctx(with_indexer(mla("glm-5.2", "glm_moe_dsa", 6144, 78, 1, 64, 2048, 192, 256, plain(1e6), 1e-5), 22, 32,
                        128, 2048),
           202752),
       deploy(4, 96.0, 67.4,
              "4 x 96 GiB, the published deployment (docs/reference.md section 5); reserved chosen so the KV "
              "share (86.4 - 67.4 = 19.0 GiB) matches its published ~373k-token fp8 pool, i.e. 63.4 GiB of "
              "weights per GPU (253.6 GiB in all)")},
  }};
  return kPresets;
}

}  // namespace

double ModelConfig::softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope.scaling == RopeScaling::kYarn && rope.mscale_all_dim != 0.0 && rope.factor > 1.0) {
    const double m = 0.1 * rope.mscale_all_dim * std::log(rope.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

Status ModelConfig::validate() const {
  auto positive = [&](int v, const char* what) -> Status {
    if (v <= 0) return invalid_argument(fmt::format("model {}: {} must be > 0, got {}", name, what, v));
    return Status::Ok();
  };
  MLAKV_RETURN_IF_ERROR(positive(hidden_size, "hidden_size"));
  MLAKV_RETURN_IF_ERROR(positive(num_layers, "num_hidden_layers"));
  MLAKV_RETURN_IF_ERROR(positive(num_heads, "num_attention_heads"));
  MLAKV_RETURN_IF_ERROR(positive(kv_lora_rank, "kv_lora_rank"));
  MLAKV_RETURN_IF_ERROR(positive(qk_nope_head_dim, "qk_nope_head_dim"));
  MLAKV_RETURN_IF_ERROR(positive(qk_rope_head_dim, "qk_rope_head_dim"));
  MLAKV_RETURN_IF_ERROR(positive(v_head_dim, "v_head_dim"));
  if (qk_rope_head_dim % 2 != 0) {
    return invalid_argument(fmt::format("model {}: qk_rope_head_dim {} must be even", name, qk_rope_head_dim));
  }
  // Bounded before cache_layers() adds them: each is accepted up to 2^30 by config.json.
  if (num_layers > kMaxModelLayers || num_mtp_layers > kMaxModelLayers) {
    return invalid_argument(fmt::format("model {}: num_hidden_layers {} and MTP layers {} must each be at most {}",
                                        name, num_layers, num_mtp_layers, kMaxModelLayers));
  }
  if (num_mtp_layers < 0 || q_lora_rank < 0 || indexer_layers < 0 || indexer_layers > cache_layers()) {
    return invalid_argument(fmt::format(
        "model {}: invalid counts (mtp {}, q_lora_rank {}, indexer layers {} of {} cache layers)", name,
        num_mtp_layers, q_lora_rank, indexer_layers, cache_layers()));
  }
  if (!(rope.theta > 0.0)) return invalid_argument(fmt::format("model {}: rope theta must be > 0", name));
  return Status::Ok();
}

std::span<const ModelPreset> model_presets() { return presets(); }

std::optional<ModelPreset> find_model_preset(std::string_view name) {
  for (const ModelPreset& p : presets()) {
    if (p.name == name) return p;
  }
  return std::nullopt;
}

}  // namespace mlakv
