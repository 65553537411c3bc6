// config.json -> ModelArch (include/mlakv/model.h): the MoE and MLP fields the model
// runner needs beyond the attention geometry parse_hf_config reads.
//
// Defaults are the transformers 5.17 config classes' (DeepseekV2Config,
// DeepseekV3Config, DeepseekV32Config, Glm4MoeLiteConfig, GlmMoeDsaConfig; kimi_k2
// configs load as DeepseekV3), printed from the installed wheel:
//   type           vocab   inter  moe_inter  E    shared top_k n_group topk_group norm  scale first_k
//   deepseek_v2    102400  11008  1407       64   2      -     -       -          no    1.0   0
//   deepseek_v3    129280  18432  2048       256  1      8     8       4          yes   2.5   3
//   deepseek_v32   as deepseek_v3
//   glm4_moe_lite  154880  10240  1536       64   1      4     1       1          yes   1.8   (layer 0 dense)
//   glm_moe_dsa    154880  12288  2048       256  1      8     1       1          yes   2.5   3
// Dense vs MoE per layer: mlp_layer_types ("dense"/"sparse") when given (glm4_moe_lite,
// glm_moe_dsa, deepseek_v32 read it), else layer i is MoE iff i >= first_k_dense_replace
// (glm4_moe_lite, whose config class ignores first_k_dense_replace: layer 0 dense).
// The router is the V2 one (softmax; topk_method greedy or group_limited_greedy) for
// deepseek_v2 and the V3 one (sigmoid + bias, noaux_tc) for the others; a config whose
// scoring_func / topk_method contradicts its type's router is refused (transformers
// would silently run its own router).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "mlakv/hf_config.h"
#include "mlakv/model.h"
#include "model/moe_router.h"

namespace mlakv {
namespace {

using nlohmann::json;

struct ArchDefaults {
  std::string_view type;
  int vocab, inter, moe_inter, experts, shared, top_k, n_group, topk_group;
  bool norm_topk;
  double scale;
  int first_k_dense;  // -1: glm4_moe_lite's "layer 0 dense"
  bool v2;
};

constexpr ArchDefaults kArch[] = {
    {"deepseek_v2", 102400, 11008, 1407, 64, 2, 0, 0, 0, false, 1.0, 0, true},
    {"deepseek_v3", 129280, 18432, 2048, 256, 1, 8, 8, 4, true, 2.5, 3, false},
    {"kimi_k2", 129280, 18432, 2048, 256, 1, 8, 8, 4, true, 2.5, 3, false},
    {"deepseek_v32", 129280, 18432, 2048, 256, 1, 8, 8, 4, true, 2.5, 3, false},
    {"glm4_moe_lite", 154880, 10240, 1536, 64, 1, 4, 1, 1, true, 1.8, -1, false},
    {"glm_moe_dsa", 154880, 12288, 2048, 256, 1, 8, 1, 1, true, 2.5, 3, false},
};

struct Reader {
  const json& j;
  std::string_view source;
  std::string prefix;

  bool has(const char* k) const { return j.contains(k) && !j.at(k).is_null(); }
  Status bad(const char* k, std::string_view want) const {
    return invalid_argument(fmt::format("{}: field '{}{}' must be {}", source, prefix, k, want));
  }
  StatusOr<int> integer(const char* k, int def, int min) const {
    if (!has(k)) return def;
    const json& v = j.at(k);
    if (!v.is_number_integer() || v.get<int64_t>() < min || v.get<int64_t>() > (int64_t{1} << 30))
      return bad(k, fmt::format("an integer in [{}, 2^30]", min));
    return static_cast<int>(v.get<int64_t>());
  }
  StatusOr<double> number(const char* k, double def) const {
    if (!has(k)) return def;
    const json& v = j.at(k);
    if (!v.is_number() || !std::isfinite(v.get<double>())) return bad(k, "a finite number");
    return v.get<double>();
  }
  StatusOr<bool> boolean(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!j.at(k).is_boolean()) return bad(k, "true or false");
    return j.at(k).get<bool>();
  }
  StatusOr<std::string> string(const char* k, std::string def) const {
    if (!has(k)) return def;
    if (!j.at(k).is_string()) return bad(k, "a string");
    return j.at(k).get<std::string>();
  }
};

}  // namespace

int ModelArch::num_moe_layers() const {
  int n = 0;
  for (bool b : moe_layer) n += b ? 1 : 0;
  return n;
}

StatusOr<ModelArch> parse_model_arch(std::string_view json_text, std::string_view source) {
  ModelArch a;
  MLAKV_ASSIGN_OR_RETURN(a.mla, parse_hf_config(json_text, source));
  const json root = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  // parse_hf_config accepted the text, so it is a JSON object.
  const json* j = &root;
  std::string prefix;
  if (!root.contains("kv_lora_rank") && root.contains("text_config") && root.at("text_config").is_object()) {
    j = &root.at("text_config");
    prefix = "text_config.";
  }
  const Reader r{*j, source, prefix};
  const ArchDefaults* d = nullptr;
  for (const auto& x : kArch)
    if (x.type == a.mla.model_type) d = &x;
  if (d == nullptr) {
    return unimplemented(fmt::format(
        "{}: model_type '{}' is not one the model runner runs (deepseek_v2, deepseek_v3, kimi_k2, deepseek_v32, "
        "glm4_moe_lite, glm_moe_dsa)",
        source, a.mla.model_type));
  }
  MLAKV_ASSIGN_OR_RETURN(a.vocab_size, r.integer("vocab_size", d->vocab, 1));
  MLAKV_ASSIGN_OR_RETURN(a.intermediate_size, r.integer("intermediate_size", d->inter, 1));
  MLAKV_ASSIGN_OR_RETURN(a.moe_intermediate_size, r.integer("moe_intermediate_size", d->moe_inter, 1));
  MLAKV_ASSIGN_OR_RETURN(a.n_shared_experts, r.integer("n_shared_experts", d->shared, 0));
  int experts = d->experts;
  if (r.has("n_routed_experts")) {
    MLAKV_ASSIGN_OR_RETURN(experts, r.integer("n_routed_experts", d->experts, 1));
  } else if (r.has("num_local_experts")) {
    MLAKV_ASSIGN_OR_RETURN(experts, r.integer("num_local_experts", d->experts, 1));
  }
  MoeRouting& m = a.routing;
  m.num_experts = experts;
  MLAKV_ASSIGN_OR_RETURN(m.top_k, r.integer("num_experts_per_tok", d->top_k, 0));
  MLAKV_ASSIGN_OR_RETURN(m.n_group, r.integer("n_group", d->n_group == 0 ? 1 : d->n_group, 1));
  MLAKV_ASSIGN_OR_RETURN(m.topk_group, r.integer("topk_group", d->topk_group == 0 ? 1 : d->topk_group, 1));
  MLAKV_ASSIGN_OR_RETURN(m.norm_topk_prob, r.boolean("norm_topk_prob", d->norm_topk));
  MLAKV_ASSIGN_OR_RETURN(m.routed_scaling_factor, r.number("routed_scaling_factor", d->scale));
  MLAKV_ASSIGN_OR_RETURN(std::string act, r.string("hidden_act", "silu"));
  if (act != "silu") {
    return unimplemented(fmt::format("{}: hidden_act '{}' is not supported (the runner's MLPs are SwiGLU: silu)",
                                     source, act));
  }
  MLAKV_ASSIGN_OR_RETURN(int freq, r.integer("moe_layer_freq", 1, 1));
  if (freq != 1) {
    return unimplemented(fmt::format("{}: moe_layer_freq = {} (transformers and the runner assume 1)", source, freq));
  }
  MLAKV_ASSIGN_OR_RETURN(a.tie_word_embeddings, r.boolean("tie_word_embeddings", false));
  MLAKV_ASSIGN_OR_RETURN(std::string scoring, r.string("scoring_func", d->v2 ? "softmax" : "sigmoid"));
  if (d->v2) {
    m.scoring = MoeScoring::kSoftmax;
    if (scoring != "softmax")
      return unimplemented(fmt::format("{}: scoring_func '{}': the deepseek_v2 router is softmax", source, scoring));
    MLAKV_ASSIGN_OR_RETURN(std::string method, r.string("topk_method", "greedy"));
    if (method == "greedy") {
      m.method = MoeTopkMethod::kGreedy;
    } else if (method == "group_limited_greedy") {
      m.method = MoeTopkMethod::kGroupLimitedGreedy;
    } else {
      return unimplemented(fmt::format(
          "{}: topk_method '{}': transformers' deepseek_v2 router knows greedy and group_limited_greedy", source,
          method));
    }
    m.norm_topk_prob = false;  // DeepseekV2TopkRouter never renormalises
  } else {
    m.scoring = MoeScoring::kSigmoid;
    m.method = MoeTopkMethod::kNoAuxTc;
    if (scoring != "sigmoid")
      return unimplemented(
          fmt::format("{}: scoring_func '{}': the {} router is sigmoid", source, scoring, a.mla.model_type));
    MLAKV_ASSIGN_OR_RETURN(std::string method, r.string("topk_method", "noaux_tc"));
    if (method != "noaux_tc")
      return unimplemented(fmt::format("{}: topk_method '{}': the {} router is noaux_tc", source, method,
                                       a.mla.model_type));
  }

  const int L = a.mla.num_layers;
  a.moe_layer.assign(static_cast<std::size_t>(L), false);
  if (r.has("mlp_layer_types") && a.mla.model_type != "deepseek_v2" && a.mla.model_type != "deepseek_v3" &&
      a.mla.model_type != "kimi_k2") {
    const json& t = j->at("mlp_layer_types");
    if (!t.is_array() || static_cast<int>(t.size()) != L)
      return r.bad("mlp_layer_types", fmt::format("a list of {} \"dense\"/\"sparse\" strings", L));
    for (int i = 0; i < L; ++i) {
      const json& e = t.at(static_cast<std::size_t>(i));
      if (!e.is_string() || (e.get<std::string>() != "dense" && e.get<std::string>() != "sparse"))
        return r.bad("mlp_layer_types", fmt::format("a list of {} \"dense\"/\"sparse\" strings", L));
      a.moe_layer[static_cast<std::size_t>(i)] = e.get<std::string>() == "sparse";
    }
  } else {
    int first_k = d->first_k_dense;
    if (first_k >= 0) {
      MLAKV_ASSIGN_OR_RETURN(first_k, r.integer("first_k_dense_replace", d->first_k_dense, 0));
    } else {
      first_k = 1;  // Glm4MoeLiteConfig: ["dense"] + ["sparse"] * (layers - 1)
    }
    for (int i = 0; i < L; ++i) a.moe_layer[static_cast<std::size_t>(i)] = i >= first_k;
  }
  if (a.num_moe_layers() > 0) {
    Status st = model::validate_routing(m);
    if (!st.ok()) return st.with_context(fmt::format("{}: MoE router", source));
  }
  return a;
}

}  // namespace mlakv
