// Hugging Face config.json -> ModelConfig.
//
// Conventions, checked against transformers 5.23.0 (the PyPI wheel's sources) and the
// 4.5x versions of the same files. Facts only; no code was copied.
//
// * Norm eps. models/deepseek_v3/modeling_deepseek_v3.py, DeepseekV3Attention.__init__,
//   builds q_a_layernorm and kv_a_layernorm as DeepseekV3RMSNorm(rank) with the class
//   default eps 1e-6. config.rms_norm_eps reaches only input_layernorm,
//   post_attention_layernorm and the final norm. deepseek_v2, deepseek_v32,
//   glm4_moe_lite, glm_moe_dsa and minicpm3 do the same, so kv_norm_eps is always 1e-6.
//   vLLM differs: vllm/model_executor/models/deepseek_v2.py (DeepseekV2Attention) builds
//   both norms with eps=config.rms_norm_eps. That is the same value for DeepSeek and
//   Kimi (1e-6), but not for GLM or MiniCPM3 (1e-5).
// * rope_interleave. DeepseekV3Config and Glm4MoeLiteConfig default it to True. Their
//   attention calls apply_rotary_pos_emb_interleave when it is set and the half-split
//   rotate_half path otherwise. deepseek_v2 always rotates pairs (apply_rotary_emb on
//   complex views) and has no such key. deepseek_v32 deletes the attribute
//   (modular_deepseek_v32.py) and, like glm_moe_dsa, always calls the interleaved
//   form. minicpm3 always calls the half-split apply_rotary_pos_emb.
//   KimiK25Config maps a text_config with model_type kimi_k2 onto deepseek_v3.
// * rope_parameters (modeling_rope_utils.py, RotaryEmbeddingConfigMixin):
//   convert_rope_params_to_dict takes `rope_scaling or rope_parameters`, so a non-empty
//   legacy rope_scaling wins. rope_theta inside that dict wins over a top-level
//   rope_theta; otherwise default_theta is 10000. standardize_rope_params sets
//   rope_type from the legacy "type" key, else "default". For yarn and longrope, a
//   top-level original_max_position_embeddings overrides the dict's value, and the
//   dict's value defaults to max_position_embeddings. Transformers 5 configs
//   therefore carry {"rope_type", "rope_theta", "factor", ...} in rope_parameters.
// * YaRN, _compute_yarn_parameters:
//   - factor defaults to max_position_embeddings / original_max_position_embeddings;
//   - beta_fast and beta_slow use `or`, so 0 or null means 32 or 1;
//   - the cos/sin multiplier `attention_factor` is the explicit value if given; else
//     get_mscale(f, mscale) / get_mscale(f, mscale_all_dim) when both are non-zero;
//     else get_mscale(f) = 0.1 ln f + 1 (get_mscale is 1 for f <= 1).
//   DeepSeek-V3 (mscale = mscale_all_dim = 1), V2-Lite (both 0.707) and Kimi K2
//   (both 1) therefore rotate with unscaled cos/sin.
//   LongRoPE (_compute_longrope_parameters): the factor is implied the same way, and
//   attention_factor = sqrt(1 + ln f / ln original) when f > 1.
// * Softmax scale, yarn_apply_mscale (deepseek_v2/v3/v32, glm4_moe_lite, glm_moe_dsa,
//   minicpm3): qk_head_dim^-0.5, multiplied by get_mscale(factor, mscale_all_dim)^2
//   when rope_type is not "default" and mscale_all_dim is non-zero. This confirms
//   docs/reference.md section 1: softmax_scale = (P+R)^-0.5 * m^2, m = 0.1*mscale_all_dim*ln(factor)+1.
//   vLLM applies the same term for its deepseek_yarn type.
// * Absent keys take the 5.23 config-class defaults (kTypeDefaults below). Notably:
//   DeepseekV3Config.num_mtp_layers = 1 (serialized as num_nextn_predict_layers);
//   MiniCPM3Config.v_head_dim = hidden_size / num_attention_heads; GLM rms_norm_eps = 1e-5.
// * DSA indexer layers, GlmMoeDsaConfig.__post_init__: indexer_types ("full" runs the
//   indexer, "shared" reuses the previous layer's top-k); else index_topk_pattern (an
//   'F'/'S' string or a list); else layer i is full iff
//   max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0 (defaults 2 and 1).
//   The MTP layer keeps its own indexer cache: docs/reference.md section 5 counts 21 + 1 for
//   GLM-5.2.
//
// Also accepted: vLLM's rope type name "deepseek_yarn", read as "yarn".
// Deliberate differences: the geometry fields (hidden_size, num_hidden_layers,
// num_attention_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim) are required
// rather than defaulted. Also refused, because ModelConfig::softmax_scale() could not
// honour it: mscale_all_dim on a non-YaRN rope type.
#include "mlakv/hf_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/untrusted_json.h"
#include "io/config_json.h"
#include "mlakv/file_io.h"
#include "mlakv/untrusted.h"

namespace mlakv {
namespace {

using nlohmann::json;

enum class Interleave : uint8_t { kFromConfig, kAlways, kNever };

// What transformers 5.23 assumes when config.json omits a key (config-class defaults).
struct TypeDefaults {
  std::string_view model_type;
  int q_lora_rank;   // when the key is absent; null always means "no q LoRA"
  int v_head_dim;    // 0: hidden_size / num_attention_heads
  double rms_norm_eps;
  int mtp_layers;
  int max_position_embeddings;
  Interleave interleave;
  bool indexer;       // a DSA indexer even without index_topk in the file
  int index_n_heads;
};

constexpr TypeDefaults kTypeDefaults[] = {
    {"deepseek_v2", 1536, 128, 1e-6, 0, 2048, Interleave::kAlways, false, 0},
    {"deepseek_v3", 1536, 128, 1e-6, 1, 4096, Interleave::kFromConfig, false, 0},
    {"kimi_k2", 1536, 128, 1e-6, 1, 4096, Interleave::kFromConfig, false, 0},  // read as deepseek_v3
    {"deepseek_v32", 1536, 128, 1e-6, 0, 163840, Interleave::kAlways, true, 64},
    {"glm4_moe_lite", 768, 256, 1e-5, 0, 202752, Interleave::kFromConfig, false, 0},
    {"glm_moe_dsa", 2048, 256, 1e-5, 0, 202752, Interleave::kAlways, true, 32},
    {"minicpm3", 768, 0, 1e-5, 0, 32768, Interleave::kNever, false, 0},
};

const TypeDefaults* find_defaults(std::string_view model_type) {
  for (const TypeDefaults& d : kTypeDefaults) {
    if (d.model_type == model_type) return &d;
  }
  return nullptr;
}

std::string shown(const json& v) { return json_util::shown(v); }
std::string quote_str(std::string_view s) { return quote_untrusted(s); }

bool present(const json& obj, const char* key) { return obj.contains(key) && !obj.at(key).is_null(); }

// Typed access to one JSON object; every error names the source file and the field
// ("rope_scaling.factor", "text_config.kv_lora_rank").
struct Fields {
  const json& obj;
  std::string_view source;
  std::string prefix;  // "" or "rope_scaling." ...

  Status bad(std::string_view key, std::string_view want) const {
    const std::string k(key);
    return invalid_argument(fmt::format("{}: field '{}{}' must be {}, got {}", source, prefix, key, want,
                                        obj.contains(k) ? shown(obj.at(k)) : std::string("nothing")));
  }
  Status missing(std::string_view key, std::string_view why = "") const {
    return invalid_argument(fmt::format("{}: required field '{}{}' is missing{}", source, prefix, key, why));
  }

  // Absent or null -> nullopt.
  StatusOr<std::optional<int>> opt_int(const char* key) const {
    if (!present(obj, key)) return std::optional<int>();
    const json& v = obj.at(key);
    if (!v.is_number_integer()) return bad(key, "an integer");
    const int64_t x = v.get<int64_t>();
    if (x < 0 || x > (int64_t{1} << 30)) {
      return invalid_argument(fmt::format("{}: field '{}{}' = {} is out of range [0, 2^30]", source, prefix, key, x));
    }
    return std::optional<int>(static_cast<int>(x));
  }
  StatusOr<int> req_int(const char* key) const {
    MLAKV_ASSIGN_OR_RETURN(std::optional<int> v, opt_int(key));
    if (!v) return missing(key);
    return *v;
  }
  StatusOr<int> int_or(const char* key, int fallback) const {
    MLAKV_ASSIGN_OR_RETURN(std::optional<int> v, opt_int(key));
    return v.value_or(fallback);
  }
  StatusOr<std::optional<double>> opt_number(const char* key) const {
    if (!present(obj, key)) return std::optional<double>();
    const json& v = obj.at(key);
    if (!v.is_number()) return bad(key, "a number");
    return std::optional<double>(v.get<double>());
  }
  StatusOr<double> number_or(const char* key, double fallback) const {
    MLAKV_ASSIGN_OR_RETURN(std::optional<double> v, opt_number(key));
    return v.value_or(fallback);
  }
  StatusOr<std::optional<std::string>> opt_string(const char* key) const {
    if (!present(obj, key)) return std::optional<std::string>();
    const json& v = obj.at(key);
    if (!v.is_string()) return bad(key, "a string");
    return std::optional<std::string>(v.get<std::string>());
  }
  StatusOr<std::optional<bool>> opt_bool(const char* key) const {
    if (!present(obj, key)) return std::optional<bool>();
    const json& v = obj.at(key);
    if (!v.is_boolean()) return bad(key, "true or false");
    return std::optional<bool>(v.get<bool>());
  }
  // A positive integral position count, written as 4096 or 4096.0.
  StatusOr<std::optional<int>> opt_positions(const char* key) const {
    MLAKV_ASSIGN_OR_RETURN(std::optional<double> v, opt_number(key));
    if (!v) return std::optional<int>();
    if (!(*v >= 1.0 && *v <= double(int64_t{1} << 30) && std::floor(*v) == *v)) {
      return bad(key, "a positive whole number of positions");
    }
    return std::optional<int>(static_cast<int>(*v));
  }
};

// HF get_mscale: the YaRN magnitude correction, 1 for factors <= 1.
double get_mscale(double factor, double mscale) { return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

// The rope dict: `rope_scaling or rope_parameters` (an empty object counts as absent),
// un-nested when transformers 5 keyed it by layer type.
StatusOr<std::pair<const json*, std::string>> rope_dict(const json& j, std::string_view source, std::string_view prefix) {
  for (const char* name : {"rope_scaling", "rope_parameters"}) {
    if (!present(j, name)) continue;
    const json& v = j.at(name);
    if (!v.is_object()) {
      return invalid_argument(
          fmt::format("{}: field '{}{}' must be an object or null, got {}", source, prefix, name, shown(v)));
    }
    if (v.empty()) continue;
    const json* chosen = &v;
    if (present(j, "layer_types") && j.at("layer_types").is_array()) {
      const json* first = nullptr;
      for (const json& lt : j.at("layer_types")) {
        if (!lt.is_string() || !v.contains(lt.get<std::string>())) continue;
        const json& nested = v.at(lt.get<std::string>());
        if (first != nullptr && nested != *first) {
          return unimplemented(fmt::format("{}: field '{}{}' differs between layer types; one RoPE per model is "
                                           "supported",
                                           source, prefix, name));
        }
        if (first == nullptr) first = &nested;
      }
      if (first != nullptr) {
        if (!first->is_object()) {
          return invalid_argument(fmt::format("{}: field '{}{}' per-layer entries must be objects", source, prefix, name));
        }
        chosen = first;
      }
    }
    return std::pair<const json*, std::string>(chosen, std::string(name));
  }
  return std::pair<const json*, std::string>(nullptr, std::string());
}

// `rope_dim` is qk_rope_head_dim: LongRoPE needs one factor per rotated pair.
Status read_rope(const json& j, const Fields& top, int max_positions, int rope_dim, RopeConfig& r) {
  MLAKV_ASSIGN_OR_RETURN(auto dict, rope_dict(j, top.source, top.prefix));
  MLAKV_ASSIGN_OR_RETURN(r.theta, top.number_or("rope_theta", 10000.0));
  if (!(r.theta > 0.0)) return top.bad("rope_theta", "> 0");
  if (dict.first == nullptr) {
    r.scaling = RopeScaling::kNone;
    return Status::Ok();
  }
  const Fields p{*dict.first, top.source, top.prefix + dict.second + "."};
  MLAKV_ASSIGN_OR_RETURN(r.theta, p.number_or("rope_theta", r.theta));
  if (!(r.theta > 0.0)) return p.bad("rope_theta", "> 0");  // only a dict value can fail here

  // rope_type, else the legacy "type", else "default".
  const char* type_key = present(*dict.first, "rope_type") ? "rope_type" : "type";
  MLAKV_ASSIGN_OR_RETURN(std::optional<std::string> type, p.opt_string(type_key));
  const std::string t = type.value_or("default");
  if (t == "default") {
    r.scaling = RopeScaling::kNone;
    return Status::Ok();
  }
  if (t != "yarn" && t != "deepseek_yarn" && t != "longrope" && t != "linear") {
    return unimplemented(fmt::format("{}: field '{}{}' = {} is not supported (default, linear, yarn, longrope)",
                                     top.source, p.prefix, type_key, quote_str(t)));
  }

  // original_max_position_embeddings: top level (Phi-3 style) > dict > max_position_embeddings.
  MLAKV_ASSIGN_OR_RETURN(std::optional<int> orig, top.opt_positions("original_max_position_embeddings"));
  if (!orig) {
    MLAKV_ASSIGN_OR_RETURN(orig, p.opt_positions("original_max_position_embeddings"));
  }
  r.original_max_position = orig.value_or(max_positions);

  // factor is required for yarn and linear (HF raises KeyError); longrope implies it.
  MLAKV_ASSIGN_OR_RETURN(std::optional<double> factor, p.opt_number("factor"));
  if (!factor && t != "longrope") return p.missing("factor", fmt::format(" (rope_type '{}' needs it)", t));
  if (factor && !(*factor > 0.0)) return p.bad("factor", "> 0");
  r.factor = factor.value_or(static_cast<double>(max_positions) / r.original_max_position);
  MLAKV_ASSIGN_OR_RETURN(std::optional<double> attention_factor, p.opt_number("attention_factor"));
  if (attention_factor && !(*attention_factor > 0.0)) return p.bad("attention_factor", "> 0");
  MLAKV_ASSIGN_OR_RETURN(std::optional<double> mscale, p.opt_number("mscale"));
  MLAKV_ASSIGN_OR_RETURN(std::optional<double> mscale_all_dim, p.opt_number("mscale_all_dim"));

  if (t == "yarn" || t == "deepseek_yarn") {
    r.scaling = RopeScaling::kYarn;
    MLAKV_ASSIGN_OR_RETURN(double beta_fast, p.number_or("beta_fast", 0.0));
    MLAKV_ASSIGN_OR_RETURN(double beta_slow, p.number_or("beta_slow", 0.0));
    r.beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;  // `or 32`: 0 means the default
    r.beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
    r.mscale = mscale.value_or(1.0);
    r.mscale_all_dim = mscale_all_dim.value_or(0.0);
    if (attention_factor) {
      r.attention_factor = *attention_factor;
    } else if (mscale && *mscale != 0.0 && mscale_all_dim && *mscale_all_dim != 0.0) {  // both given
      r.attention_factor = get_mscale(r.factor, r.mscale) / get_mscale(r.factor, r.mscale_all_dim);
    } else {
      r.attention_factor = get_mscale(r.factor, 1.0);
    }
    return Status::Ok();
  }

  // Non-YaRN types: HF would still fold mscale_all_dim into the softmax scale, which
  // ModelConfig::softmax_scale() does only under YaRN.
  if (mscale_all_dim && *mscale_all_dim != 0.0 && r.factor > 1.0) {
    return unimplemented(fmt::format("{}: field '{}mscale_all_dim' with rope_type '{}' is not supported", top.source,
                                     p.prefix, t));
  }
  if (t == "linear") {
    r.scaling = RopeScaling::kLinear;
    r.attention_factor = 1.0;
    return Status::Ok();
  }
  r.scaling = RopeScaling::kLongRope;
  for (const char* key : {"long_factor", "short_factor"}) {
    if (!present(*dict.first, key)) return p.missing(key, " (longrope needs it)");
    const json& arr = dict.first->at(key);
    if (!arr.is_array()) return p.bad(key, "an array of numbers");
    auto& dst = std::string_view(key) == "long_factor" ? r.long_factor : r.short_factor;
    dst.clear();
    for (const json& v : arr) {
      if (!v.is_number()) return p.bad(key, "an array of numbers");
      dst.push_back(v.get<double>());
    }
    if (static_cast<int>(dst.size()) != rope_dim / 2) {
      return p.bad(key, fmt::format("an array of qk_rope_head_dim / 2 = {} numbers", rope_dim / 2));
    }
  }
  if (attention_factor) {
    r.attention_factor = *attention_factor;
  } else {
    r.attention_factor =
        r.factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(r.factor) / std::log(static_cast<double>(r.original_max_position)));
  }
  return Status::Ok();
}

// Number of decoder layers that run the DSA indexer (see the header comment).
StatusOr<int> full_indexer_layers(const Fields& f, int layers) {
  auto count_list = [&](const char* key) -> StatusOr<int> {
    const json& arr = f.obj.at(key);
    if (!arr.is_array() || static_cast<int>(arr.size()) != layers) {
      return f.bad(key, fmt::format("a list of {} \"full\"/\"shared\" entries (one per layer)", layers));
    }
    int full = 0;
    for (const json& v : arr) {
      if (!v.is_string() || (v != "full" && v != "shared")) return f.bad(key, "a list of \"full\"/\"shared\" entries");
      full += v == "full";
    }
    return full;
  };
  if (present(f.obj, "indexer_types")) return count_list("indexer_types");
  if (present(f.obj, "index_topk_pattern")) {
    const json& pat = f.obj.at("index_topk_pattern");
    if (!pat.is_string()) return count_list("index_topk_pattern");
    const std::string s = pat.get<std::string>();
    if (static_cast<int>(s.size()) != layers || s.find_first_not_of("FS") != std::string::npos) {
      return f.bad("index_topk_pattern", fmt::format("a string of {} 'F'/'S' letters", layers));
    }
    return static_cast<int>(std::count(s.begin(), s.end(), 'F'));
  }
  MLAKV_ASSIGN_OR_RETURN(int freq, f.int_or("index_topk_freq", 1));
  MLAKV_ASSIGN_OR_RETURN(int offset, f.int_or("index_skip_topk_offset", 2));
  freq = std::max(freq, 1);
  int full = 0;
  for (int i = 0; i < layers; ++i) full += std::max(i - offset + 1, 0) % freq == 0;
  return full;
}

StatusOr<ModelConfig> parse(std::string_view text, std::string_view source) {
  MLAKV_ASSIGN_OR_RETURN(json root, json_util::parse(text, source));
  // Multimodal wrappers (Kimi K2.5) keep the language model under text_config.
  const json* j = &root;
  std::string prefix;
  if (!root.contains("kv_lora_rank") && present(root, "text_config") && root.at("text_config").is_object()) {
    j = &root.at("text_config");
    prefix = "text_config.";
  }
  const Fields f{*j, source, prefix};

  ModelConfig c;
  c.name = std::string(source);
  MLAKV_ASSIGN_OR_RETURN(std::optional<std::string> model_type, f.opt_string("model_type"));
  c.model_type = model_type.value_or("unknown");
  if (!j->contains("kv_lora_rank")) {
    return invalid_argument(fmt::format("{}: model_type {} is not an MLA model (no field '{}kv_lora_rank')", source,
                                        quote_str(c.model_type), prefix));
  }
  const TypeDefaults* td = find_defaults(c.model_type);

  MLAKV_ASSIGN_OR_RETURN(c.hidden_size, f.req_int("hidden_size"));
  MLAKV_ASSIGN_OR_RETURN(c.num_layers, f.req_int("num_hidden_layers"));
  MLAKV_ASSIGN_OR_RETURN(c.num_heads, f.req_int("num_attention_heads"));
  MLAKV_ASSIGN_OR_RETURN(c.kv_lora_rank, f.req_int("kv_lora_rank"));
  MLAKV_ASSIGN_OR_RETURN(c.qk_nope_head_dim, f.req_int("qk_nope_head_dim"));
  MLAKV_ASSIGN_OR_RETURN(c.qk_rope_head_dim, f.req_int("qk_rope_head_dim"));

  // q_lora_rank: null means a plain q_proj (DeepSeek-V2-Lite); absent means the type's default.
  if (j->contains("q_lora_rank")) {
    MLAKV_ASSIGN_OR_RETURN(c.q_lora_rank, f.int_or("q_lora_rank", 0));
  } else if (td != nullptr) {
    c.q_lora_rank = td->q_lora_rank;
  } else {
    return f.missing("q_lora_rank", " (null selects a plain q_proj)");
  }
  MLAKV_ASSIGN_OR_RETURN(std::optional<int> v_head_dim, f.opt_int("v_head_dim"));
  if (v_head_dim) {
    c.v_head_dim = *v_head_dim;
  } else if (td != nullptr) {
    c.v_head_dim = td->v_head_dim != 0 ? td->v_head_dim : (c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  } else {
    return f.missing("v_head_dim");
  }
  MLAKV_ASSIGN_OR_RETURN(std::optional<int> mtp, f.opt_int("num_nextn_predict_layers"));
  if (!mtp) {
    MLAKV_ASSIGN_OR_RETURN(mtp, f.opt_int("num_mtp_layers"));
  }
  c.num_mtp_layers = mtp.value_or(td != nullptr ? td->mtp_layers : 0);
  if (c.num_layers > kMaxModelLayers || c.num_mtp_layers > kMaxModelLayers) {  // before any sum or per-layer walk
    return invalid_argument(fmt::format("{}: field '{}num_hidden_layers' = {} / MTP layers = {}: each must be at most {}",
                                        source, prefix, c.num_layers, c.num_mtp_layers, kMaxModelLayers));
  }
  MLAKV_ASSIGN_OR_RETURN(c.rms_norm_eps, f.number_or("rms_norm_eps", td != nullptr ? td->rms_norm_eps : 1e-6));
  if (!(c.rms_norm_eps > 0.0)) return f.bad("rms_norm_eps", "> 0");
  c.kv_norm_eps = 1e-6;  // kv_a_layernorm uses the RMSNorm class default in transformers

  const Interleave il = td != nullptr ? td->interleave : Interleave::kFromConfig;
  c.rope.interleaved = il != Interleave::kNever;
  if (il == Interleave::kFromConfig) {
    MLAKV_ASSIGN_OR_RETURN(std::optional<bool> ri, f.opt_bool("rope_interleave"));
    c.rope.interleaved = ri.value_or(true);
  }
  MLAKV_ASSIGN_OR_RETURN(std::optional<int> max_pos, f.opt_positions("max_position_embeddings"));
  c.max_position_embeddings = max_pos.value_or(td != nullptr ? td->max_position_embeddings : 0);
  MLAKV_RETURN_IF_ERROR(
      read_rope(*j, f, max_pos.value_or(td != nullptr ? td->max_position_embeddings : 4096), c.qk_rope_head_dim,
                c.rope));

  if (present(*j, "index_topk") || (td != nullptr && td->indexer)) {
    MLAKV_ASSIGN_OR_RETURN(c.index_topk, f.int_or("index_topk", 2048));
    MLAKV_ASSIGN_OR_RETURN(std::optional<int> heads, f.opt_int("index_n_heads"));
    if (!heads && (td == nullptr || td->index_n_heads == 0)) return f.missing("index_n_heads");
    c.index_n_heads = heads.value_or(td != nullptr ? td->index_n_heads : 0);
    MLAKV_ASSIGN_OR_RETURN(c.index_head_dim, f.int_or("index_head_dim", 128));
    MLAKV_ASSIGN_OR_RETURN(int full, full_indexer_layers(f, c.num_layers));
    c.indexer_layers = full + c.num_mtp_layers;  // each MTP layer keeps its own indexer cache
  }
  MLAKV_RETURN_IF_ERROR(c.validate());  // its messages name c.name, the source
  return c;
}

}  // namespace

StatusOr<ModelConfig> parse_hf_config(std::string_view text, std::string_view source) {
  try {
    return parse(text, source);
  } catch (const std::exception& e) {  // a library invariant or allocation failure: never across the API
    return internal_error(fmt::format("{}: reading the config failed: {}", source, e.what()));
  }
}

StatusOr<ModelConfig> load_hf_config(const std::string& path) {
  MLAKV_ASSIGN_OR_RETURN(const io::ConfigJson c, io::read_config_json(path));
  return parse_hf_config(c.text, c.file);
}

}  // namespace mlakv
