#include "mlakv/hf_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "core/file_io.h"

namespace mlakv {
namespace {

using nlohmann::json;

struct Reader {
  const json& j;
  std::string_view source;

  Status type_error(std::string_view key, std::string_view want) const {
    return invalid_argument(fmt::format("{}: field '{}' must be {}, got {}", source, key, want, j.at(key).dump()));
  }

  // Integer field; `fallback` < 0 means required. JSON null counts as absent.
  StatusOr<int> get_int(std::string_view key, int fallback = -1) const {
    const std::string k(key);
    if (!j.contains(k) || j.at(k).is_null()) {
      if (fallback < 0) return invalid_argument(fmt::format("{}: required field '{}' is missing", source, key));
      return fallback;
    }
    const json& v = j.at(k);
    if (!v.is_number_integer()) return type_error(key, "an integer");
    const int64_t x = v.get<int64_t>();
    if (x < 0 || x > (1 << 30)) return invalid_argument(fmt::format("{}: field '{}' = {} is out of range", source, key, x));
    return static_cast<int>(x);
  }
};

StatusOr<double> get_number(const json& obj, std::string_view key, double fallback, std::string_view where) {
  const std::string k(key);
  if (!obj.contains(k) || obj.at(k).is_null()) return fallback;
  const json& v = obj.at(k);
  if (!v.is_number() || v.is_boolean()) {
    return invalid_argument(fmt::format("{}: field '{}' must be a number, got {}", where, key, v.dump()));
  }
  return v.get<double>();
}

Status read_rope(const json& j, std::string_view source, RopeConfig& r) {
  // theta: top-level rope_theta, or inside rope_parameters (transformers 5).
  const json* params = nullptr;
  if (j.contains("rope_parameters") && j.at("rope_parameters").is_object()) {
    params = &j.at("rope_parameters");
  } else if (j.contains("rope_scaling") && j.at("rope_scaling").is_object()) {
    params = &j.at("rope_scaling");
  } else if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null()) {
    return invalid_argument(fmt::format("{}: field 'rope_scaling' must be an object or null", source));
  }
  MLAKV_ASSIGN_OR_RETURN(r.theta, get_number(j, "rope_theta", r.theta, source));
  if (params == nullptr) return Status::Ok();
  const std::string where = fmt::format("{}: rope parameters", source);
  MLAKV_ASSIGN_OR_RETURN(r.theta, get_number(*params, "rope_theta", r.theta, where));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (params->contains(key) && params->at(key).is_string()) {
      type = params->at(key).get<std::string>();
      break;
    }
  }
  if (type == "default" || type == "none") {
    r.scaling = RopeScaling::kNone;
    return Status::Ok();
  }
  MLAKV_ASSIGN_OR_RETURN(r.factor, get_number(*params, "factor", 1.0, where));
  MLAKV_ASSIGN_OR_RETURN(double omp, get_number(*params, "original_max_position_embeddings",
                                                static_cast<double>(r.original_max_position), where));
  r.original_max_position = static_cast<int>(omp);
  if (type == "yarn" || type == "deepseek_yarn") {
    r.scaling = RopeScaling::kYarn;
    MLAKV_ASSIGN_OR_RETURN(r.beta_fast, get_number(*params, "beta_fast", 32.0, where));
    MLAKV_ASSIGN_OR_RETURN(r.beta_slow, get_number(*params, "beta_slow", 1.0, where));
    MLAKV_ASSIGN_OR_RETURN(r.mscale, get_number(*params, "mscale", 1.0, where));
    MLAKV_ASSIGN_OR_RETURN(r.mscale_all_dim, get_number(*params, "mscale_all_dim", 0.0, where));
  } else if (type == "longrope") {
    r.scaling = RopeScaling::kLongRope;
    for (const char* key : {"long_factor", "short_factor"}) {
      if (!params->contains(key) || !params->at(key).is_array()) {
        return invalid_argument(fmt::format("{}: longrope needs an array '{}'", where, key));
      }
      auto& dst = std::string_view(key) == "long_factor" ? r.long_factor : r.short_factor;
      for (const json& v : params->at(key)) {
        if (!v.is_number()) return invalid_argument(fmt::format("{}: '{}' holds a non-number", where, key));
        dst.push_back(v.get<double>());
      }
    }
  } else if (type == "linear") {
    r.scaling = RopeScaling::kLinear;
  } else {
    return unimplemented(fmt::format("{}: rope type '{}' is not supported (default, linear, yarn, longrope)", where, type));
  }
  if (!(r.factor > 0)) return invalid_argument(fmt::format("{}: factor must be > 0", where));
  return Status::Ok();
}

}  // namespace

StatusOr<ModelConfig> parse_hf_config(std::string_view text, std::string_view source) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(fmt::format("{}: not valid JSON", source));
  if (!j.is_object()) return invalid_argument(fmt::format("{}: top level must be a JSON object", source));
  // Multimodal wrappers keep the language model under text_config.
  if (j.contains("text_config") && j.at("text_config").is_object() && !j.contains("kv_lora_rank")) {
    j = j.at("text_config");
  }
  Reader rd{j, source};
  ModelConfig c;
  c.name = std::string(source);
  c.model_type = j.value("model_type", std::string("unknown"));
  if (!j.contains("kv_lora_rank")) {
    return invalid_argument(fmt::format("{}: model_type '{}' is not an MLA model (no 'kv_lora_rank')", source,
                                        c.model_type));
  }
  MLAKV_ASSIGN_OR_RETURN(c.hidden_size, rd.get_int("hidden_size"));
  MLAKV_ASSIGN_OR_RETURN(c.num_layers, rd.get_int("num_hidden_layers"));
  MLAKV_ASSIGN_OR_RETURN(c.num_heads, rd.get_int("num_attention_heads"));
  MLAKV_ASSIGN_OR_RETURN(c.q_lora_rank, rd.get_int("q_lora_rank", 0));
  MLAKV_ASSIGN_OR_RETURN(c.kv_lora_rank, rd.get_int("kv_lora_rank"));
  MLAKV_ASSIGN_OR_RETURN(c.qk_nope_head_dim, rd.get_int("qk_nope_head_dim"));
  MLAKV_ASSIGN_OR_RETURN(c.qk_rope_head_dim, rd.get_int("qk_rope_head_dim"));
  // MiniCPM3 has no v_head_dim: its attention uses hidden_size / num_heads.
  const int v_default = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
  MLAKV_ASSIGN_OR_RETURN(c.v_head_dim, rd.get_int("v_head_dim", v_default));
  MLAKV_ASSIGN_OR_RETURN(c.num_mtp_layers, rd.get_int("num_nextn_predict_layers", 0));
  MLAKV_ASSIGN_OR_RETURN(c.rms_norm_eps, get_number(j, "rms_norm_eps", 1e-6, source));
  c.kv_norm_eps = 1e-6;

  c.rope.interleaved = c.model_type != "minicpm3";
  if (j.contains("rope_interleave") && j.at("rope_interleave").is_boolean()) {
    c.rope.interleaved = j.at("rope_interleave").get<bool>();
  }
  MLAKV_RETURN_IF_ERROR(read_rope(j, source, c.rope));

  if (j.contains("index_topk") && !j.at("index_topk").is_null()) {
    MLAKV_ASSIGN_OR_RETURN(c.index_topk, rd.get_int("index_topk"));
    MLAKV_ASSIGN_OR_RETURN(c.index_n_heads, rd.get_int("index_n_heads", 0));
    MLAKV_ASSIGN_OR_RETURN(c.index_head_dim, rd.get_int("index_head_dim", 128));
    // Every cache layer keeps an indexer key cache unless the config lists which do.
    c.indexer_layers = c.cache_layers();
    for (const char* key : {"indexer_layers", "index_layers"}) {
      if (j.contains(key) && j.at(key).is_array()) {
        c.indexer_layers = static_cast<int>(j.at(key).size());
      }
    }
  }
  MLAKV_RETURN_IF_ERROR(c.validate());
  return c;
}

StatusOr<ModelConfig> load_hf_config(const std::string& path) {
  std::string file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) file = (std::filesystem::path(path) / "config.json").string();
  MLAKV_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, io::read_file(file));
  return parse_hf_config(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), file);
}

}  // namespace mlakv
