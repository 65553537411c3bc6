// The mlakv_latent_transform_v1 file and the latent-transform calibration statistics
// (include/mlakv/latent_calib.h).
#include "mlakv/latent_calib.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/untrusted_json.h"
#include "mlakv/file_io.h"

namespace mlakv {
namespace {

using nlohmann::json;

constexpr int kMaxLayers = 1 << 16;
constexpr uint64_t kMaxSeed = (uint64_t{1} << 53) - 1;

std::string shown(const json& v) { return json_util::shown(v); }

Status field_error(std::string_view source, std::string_view field, std::string_view want, const json& got) {
  return invalid_argument(fmt::format("{}: {} must be {}, got {}", source, field, want, shown(got)));
}

// A JSON number read as float32 (booleans are not numbers in nlohmann).
bool as_float(const json& v, float& out) {
  if (!v.is_number()) return false;
  const double x = v.get<double>();
  if (!std::isfinite(x)) return false;
  out = static_cast<float>(x);
  return std::isfinite(out);
}

Status read_vector(const json& layer, std::string_view source, const std::string& where, const char* key,
                   std::vector<float>& out, bool positive) {
  const json& a = layer.at(key);
  const std::string field = fmt::format("{}.{}", where, key);
  if (!a.is_array() || a.size() != static_cast<std::size_t>(kLatentDim))
    return field_error(source, field, fmt::format("a list of {} numbers", kLatentDim), a);
  out.resize(kLatentDim);
  for (int i = 0; i < kLatentDim; ++i) {
    const json& v = a.at(static_cast<std::size_t>(i));
    float x = 0;
    const bool ok = as_float(v, x) && (positive ? (x >= 0x1p-40f && x <= 0x1p40f) : std::abs(x) <= 1e30f);
    if (!ok)
      return field_error(source, fmt::format("{}[{}]", field, i),
                         positive ? "a finite number in [2^-40, 2^40]" : "a finite number of magnitude <= 1e30", v);
    out[static_cast<std::size_t>(i)] = x;
  }
  return Status::Ok();
}

Status read_seed(const json& layer, std::string_view source, const std::string& where, const char* key,
                 uint64_t& out) {
  const json& v = layer.at(key);
  if (!(v.is_number_integer()) || (v.is_number_unsigned() ? v.get<uint64_t>() > kMaxSeed : v.get<int64_t>() < 0 ||
                                                                   static_cast<uint64_t>(v.get<int64_t>()) > kMaxSeed))
    return field_error(source, fmt::format("{}.{}", where, key), "an integer in [0, 2^53)", v);
  out = v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
  return Status::Ok();
}

Status read_bool(const json& layer, std::string_view source, const std::string& where, const char* key, bool& out) {
  const json& v = layer.at(key);
  if (!v.is_boolean()) return field_error(source, fmt::format("{}.{}", where, key), "true or false", v);
  out = v.get<bool>();
  return Status::Ok();
}

// "seed_search": {"format", "context", "windows", "candidates": [{"seed", "kld_mean"}...], "chosen"},
// every key required, no other; the values' ranges are validate_latent_transform's.
StatusOr<LatentSeedSearch> read_seed_search(const json& o, std::string_view source) {
  if (!o.is_object()) return field_error(source, "field 'seed_search'", "an object", o);
  static const char* kKeys[] = {"format", "context", "windows", "candidates", "chosen"};
  for (auto it = o.begin(); it != o.end(); ++it) {
    if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* k) { return it.key() == k; }) ==
        std::end(kKeys))
      return invalid_argument(fmt::format("{}: seed_search: unknown key {} (it has format, context, windows, "
                                          "candidates, chosen)",
                                          source, json_util::shown(json(it.key()))));
  }
  for (const char* k : kKeys) {
    if (!o.contains(k)) return invalid_argument(fmt::format("{}: seed_search: required field '{}' is missing", source, k));
  }
  LatentSeedSearch s;
  if (!o.at("format").is_string()) return field_error(source, "seed_search.format", "a format name", o.at("format"));
  s.format = o.at("format").get<std::string>();
  for (const char* k : {"context", "windows"}) {
    const json& v = o.at(k);
    if (!v.is_number_integer() || v.get<int64_t>() < 1)
      return field_error(source, fmt::format("seed_search.{}", k), "a positive integer", v);
    (std::string_view(k) == "context" ? s.context : s.windows) = v.get<int64_t>();
  }
  MLAKV_RETURN_IF_ERROR(read_seed(o, source, "seed_search", "chosen", s.chosen));
  const json& c = o.at("candidates");
  if (!c.is_array()) return field_error(source, "seed_search.candidates", "a list of {seed, kld_mean} objects", c);
  for (std::size_t i = 0; i < c.size(); ++i) {
    const json& e = c.at(i);
    const std::string where = fmt::format("seed_search.candidates[{}]", i);
    if (!e.is_object() || e.size() != 2 || !e.contains("seed") || !e.contains("kld_mean"))
      return field_error(source, where, "an object of exactly seed and kld_mean", e);
    uint64_t seed = 0;
    MLAKV_RETURN_IF_ERROR(read_seed(e, source, where, "seed", seed));
    const json& k = e.at("kld_mean");
    if (!k.is_number() || !std::isfinite(k.get<double>()) || k.get<double>() < 0.0)
      return field_error(source, where + ".kld_mean", "a finite number >= 0", k);
    s.seeds.push_back(seed);
    s.kld_mean.push_back(k.get<double>());
  }
  return s;
}

StatusOr<LatentTransform> parse(std::string_view text, std::string_view source) {
  json_util::ParseOptions po;
  std::string dup;
  po.duplicate_key = &dup;
  MLAKV_ASSIGN_OR_RETURN(json j, json_util::parse(text, source, po));
  if (!dup.empty()) return invalid_argument(fmt::format("{}: key '{}' appears twice", source, dup));
  if (!j.is_object()) return invalid_argument(fmt::format("{}: the file must hold one JSON object", source));
  // The version first: v2 has "nvfp4_scales" (required), v1 has not (and reads as "rn").
  if (!j.contains("format")) return invalid_argument(fmt::format("{}: required field 'format' is missing", source));
  const json& fmt_v = j.at("format");
  const bool v2 = fmt_v.is_string() && fmt_v.get<std::string>() == kLatentTransformFileFormat;
  const bool v1 = fmt_v.is_string() && fmt_v.get<std::string>() == kLatentTransformFileFormatV1;
  if (!v1 && !v2)
    return field_error(source, "field 'format'",
                       fmt::format("\"{}\" (or \"{}\")", kLatentTransformFileFormat, kLatentTransformFileFormatV1),
                       fmt_v);
  static const char* kTop[] = {"format",     "num_layers", "latent_dim",  "rope_dim",    "denominator",
                               "importance", "seed_search", "nvfp4_scales", "layers"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    const bool known =
        std::find_if(std::begin(kTop), std::end(kTop), [&](const char* k) { return it.key() == k; }) != std::end(kTop) &&
        (v2 || it.key() != "nvfp4_scales");
    if (!known)
      return invalid_argument(fmt::format("{}: unknown key {} (a {} file has {})", source,
                                          json_util::shown(json(it.key())), fmt_v.get<std::string>(),
                                          v2 ? "format, num_layers, latent_dim, rope_dim, denominator, importance, "
                                               "seed_search, nvfp4_scales, layers"
                                             : "format, num_layers, latent_dim, rope_dim, denominator, importance, "
                                               "seed_search, layers; nvfp4_scales came with version 2"));
  }
  for (const char* k : kTop) {
    const std::string_view key(k);
    const bool optional = key == "importance" || key == "seed_search" || (key == "nvfp4_scales" && !v2);
    if (!optional && !j.contains(k))
      return invalid_argument(fmt::format("{}: required field '{}' is missing", source, k));
  }
  const json& nl = j.at("num_layers");
  if (!nl.is_number_integer() || nl.get<int64_t>() < 1 || nl.get<int64_t>() > kMaxLayers)
    return field_error(source, "field 'num_layers'", fmt::format("an integer in [1, {}]", kMaxLayers), nl);
  const int n = static_cast<int>(nl.get<int64_t>());
  if (!j.at("latent_dim").is_number_integer() || j.at("latent_dim").get<int64_t>() != kLatentDim)
    return field_error(source, "field 'latent_dim'", fmt::format("the integer {}", kLatentDim), j.at("latent_dim"));
  if (!j.at("rope_dim").is_number_integer() || j.at("rope_dim").get<int64_t>() != kRopeDim)
    return field_error(source, "field 'rope_dim'", fmt::format("the integer {}", kRopeDim), j.at("rope_dim"));
  if (!j.at("denominator").is_number() || j.at("denominator").get<double>() != layout::kOuterScaleDenominator)
    return field_error(source, "field 'denominator'", "exactly 2688.0 (= 6 * 448)", j.at("denominator"));
  LatentTransform t;
  if (j.contains("importance")) {
    const json& v = j.at("importance");
    if (!v.is_string() || !parse_latent_importance(v.get<std::string>()))
      return field_error(source, "field 'importance'",
                         "one of \"none\", \"uniform\", \"query\", \"output\", \"query+output\"", v);
    t.importance = v.get<std::string>();
  }
  if (j.contains("seed_search")) {
    MLAKV_ASSIGN_OR_RETURN(LatentSeedSearch ss, read_seed_search(j.at("seed_search"), source));
    t.seed_search = std::move(ss);
  }
  if (v2) {
    const json& v = j.at("nvfp4_scales");
    StatusOr<Nvfp4ScaleMode> m =
        v.is_string() ? parse_nvfp4_scale_mode(v.get<std::string>()) : StatusOr<Nvfp4ScaleMode>(invalid_argument(""));
    if (!m.ok()) return field_error(source, "field 'nvfp4_scales'", "\"rn\" or \"search\"", v);
    t.nvfp4_scales = *m;
  }
  const json& layers = j.at("layers");
  if (!layers.is_array() || static_cast<int>(layers.size()) != n)
    return field_error(source, "field 'layers'", fmt::format("a list of num_layers = {} objects", n), layers);
  static const char* kLayer[] = {"mu", "d", "rotate", "sign_seed", "rope_rotate", "rope_sign_seed", "outer_scale",
                                 "max_abs"};
  t.layers.resize(static_cast<std::size_t>(n));
  for (int l = 0; l < n; ++l) {
    const json& o = layers.at(static_cast<std::size_t>(l));
    const std::string where = fmt::format("layers[{}]", l);
    if (!o.is_object()) return field_error(source, where, "an object", o);
    for (auto it = o.begin(); it != o.end(); ++it) {
      if (std::find_if(std::begin(kLayer), std::end(kLayer), [&](const char* k) { return it.key() == k; }) ==
          std::end(kLayer))
        return invalid_argument(fmt::format("{}: {}: unknown key {}", source, where, json_util::shown(json(it.key()))));
    }
    for (const char* k : kLayer) {
      if (std::string_view(k) != "max_abs" && !o.contains(k))
        return invalid_argument(fmt::format("{}: {}: required field '{}' is missing", source, where, k));
    }
    LatentTransformLayer& L = t.layers[static_cast<std::size_t>(l)];
    MLAKV_RETURN_IF_ERROR(read_vector(o, source, where, "mu", L.mu, false));
    MLAKV_RETURN_IF_ERROR(read_vector(o, source, where, "d", L.d, true));
    MLAKV_RETURN_IF_ERROR(read_bool(o, source, where, "rotate", L.rotate));
    MLAKV_RETURN_IF_ERROR(read_seed(o, source, where, "sign_seed", L.sign_seed));
    MLAKV_RETURN_IF_ERROR(read_bool(o, source, where, "rope_rotate", L.rope_rotate));
    MLAKV_RETURN_IF_ERROR(read_seed(o, source, where, "rope_sign_seed", L.rope_sign_seed));
    float s = 0;
    if (!as_float(o.at("outer_scale"), s) || !(s > 0.0f))
      return field_error(source, where + ".outer_scale", "a finite number > 0 that float32 can hold", o.at("outer_scale"));
    L.outer_scale = s;
    if (o.contains("max_abs")) {
      const json& m = o.at("max_abs");
      if (!m.is_number() || !std::isfinite(m.get<double>()) || m.get<double>() < 0.0)
        return field_error(source, where + ".max_abs", "a finite number >= 0", m);
    }
  }
  MLAKV_RETURN_IF_ERROR(validate_latent_transform(t, source));
  return t;
}

}  // namespace

StatusOr<std::string> latent_transform_to_json(const LatentTransform& t, std::span<const double> max_abs) {
  MLAKV_RETURN_IF_ERROR(validate_latent_transform(t));
  if (!max_abs.empty() && max_abs.size() != t.layers.size())
    return invalid_argument(fmt::format("latent transform: max_abs holds {} layers, the transform {}", max_abs.size(),
                                        t.layers.size()));
  for (double m : max_abs) {
    if (!std::isfinite(m) || m < 0.0)
      return invalid_argument(fmt::format("latent transform: max_abs must be finite and >= 0, got {}", m));
  }
  if (!t.importance.empty() && !parse_latent_importance(t.importance))
    return invalid_argument(fmt::format("latent transform: unknown importance '{}'", t.importance));
  json j = json::object();
  j["format"] = std::string(kLatentTransformFileFormat);
  j["num_layers"] = t.num_layers();
  j["latent_dim"] = kLatentDim;
  j["rope_dim"] = kRopeDim;
  j["denominator"] = layout::kOuterScaleDenominator;
  if (!t.importance.empty()) j["importance"] = t.importance;
  j["nvfp4_scales"] = std::string(nvfp4_scale_mode_name(t.nvfp4_scales));
  if (t.seed_search) {
    const LatentSeedSearch& s = *t.seed_search;
    json c = json::array();
    for (std::size_t i = 0; i < s.seeds.size(); ++i) c.push_back({{"seed", s.seeds[i]}, {"kld_mean", s.kld_mean[i]}});
    j["seed_search"] = {{"format", s.format}, {"context", s.context}, {"windows", s.windows}, {"candidates", c},
                        {"chosen", s.chosen}};
  }
  json layers = json::array();
  for (std::size_t l = 0; l < t.layers.size(); ++l) {
    const LatentTransformLayer& L = t.layers[l];
    json o = json::object();
    // float -> double is exact; nlohmann prints the shortest text that reads back as that double.
    o["mu"] = std::vector<double>(L.mu.begin(), L.mu.end());
    o["d"] = std::vector<double>(L.d.begin(), L.d.end());
    o["rotate"] = L.rotate;
    o["sign_seed"] = L.sign_seed;
    o["rope_rotate"] = L.rope_rotate;
    o["rope_sign_seed"] = L.rope_sign_seed;
    o["outer_scale"] = static_cast<double>(L.outer_scale);
    if (!max_abs.empty()) o["max_abs"] = max_abs[l];
    layers.push_back(std::move(o));
  }
  j["layers"] = std::move(layers);
  return j.dump(1) + "\n";
}

Status write_latent_transform(const std::string& path, const LatentTransform& t, std::span<const double> max_abs) {
  MLAKV_ASSIGN_OR_RETURN(std::string text, latent_transform_to_json(t, max_abs));
  return io::write_file(path, text);
}

StatusOr<LatentTransform> parse_latent_transform(std::string_view json_text, std::string_view source) {
  try {
    return parse(json_text, source);
  } catch (const std::exception& e) {
    return internal_error(fmt::format("{}: reading the latent transform failed: {}", source, e.what()));
  }
}

StatusOr<LatentTransform> load_latent_transform(const std::string& path) {
  MLAKV_ASSIGN_OR_RETURN(std::string text, io::read_text_file(path, io::kMaxConfigBytes));
  return parse_latent_transform(text, path);
}

StatusOr<ScaleFile> parse_scale_file(std::string_view json_text, std::string_view source) {
  std::string kind;
  try {
    MLAKV_ASSIGN_OR_RETURN(json j, json_util::parse(json_text, source));
    if (!j.contains("format")) return invalid_argument(fmt::format("{}: required field 'format' is missing", source));
    if (j.at("format").is_string()) kind = j.at("format").get<std::string>();
    if (kind != kOuterScaleFileFormat && kind != kLatentTransformFileFormat && kind != kLatentTransformFileFormatV1)
      return invalid_argument(fmt::format("{}: field 'format' must be \"{}\", \"{}\" or \"{}\", got {}", source,
                                          kOuterScaleFileFormat, kLatentTransformFileFormat,
                                          kLatentTransformFileFormatV1, shown(j.at("format"))));
  } catch (const std::exception& e) {
    return internal_error(fmt::format("{}: reading the scale file failed: {}", source, e.what()));
  }
  ScaleFile f;
  if (kind == kOuterScaleFileFormat) {
    f.kind = ScaleFile::Kind::kOuterScales;
    MLAKV_ASSIGN_OR_RETURN(f.outer_scales, parse_outer_scales(json_text, source));
  } else {
    f.kind = ScaleFile::Kind::kLatentTransform;
    MLAKV_ASSIGN_OR_RETURN(f.transform, parse_latent_transform(json_text, source));
  }
  return f;
}

StatusOr<ScaleFile> load_scale_file(const std::string& path) {
  MLAKV_ASSIGN_OR_RETURN(std::string text, io::read_text_file(path, io::kMaxConfigBytes));
  return parse_scale_file(text, path);
}

// ---- calibration ---------------------------------------------------------------------

std::string_view latent_importance_name(LatentImportance k) {
  switch (k) {
    case LatentImportance::kNone: return "none";
    case LatentImportance::kUniform: return "uniform";
    case LatentImportance::kQuery: return "query";
    case LatentImportance::kOutput: return "output";
    case LatentImportance::kQueryOutput: return "query+output";
    case LatentImportance::kFile: return "file";
  }
  return "?";
}

std::optional<LatentImportance> parse_latent_importance(std::string_view name) {
  for (LatentImportance k : {LatentImportance::kNone, LatentImportance::kUniform, LatentImportance::kQuery,
                             LatentImportance::kOutput, LatentImportance::kQueryOutput, LatentImportance::kFile}) {
    if (latent_importance_name(k) == name) return k;
  }
  return std::nullopt;
}

namespace {

StatusOr<LatentImportanceWeights> parse_importance(std::string_view text, std::string_view source) {
  json_util::ParseOptions po;
  std::string dup;
  po.duplicate_key = &dup;
  MLAKV_ASSIGN_OR_RETURN(json j, json_util::parse(text, source, po));
  if (!dup.empty()) return invalid_argument(fmt::format("{}: key '{}' appears twice", source, dup));
  if (!j.is_object()) return invalid_argument(fmt::format("{}: the file must hold one JSON object", source));
  static const char* kTop[] = {"format", "num_layers", "latent_dim", "estimate", "source", "layers"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find_if(std::begin(kTop), std::end(kTop), [&](const char* k) { return it.key() == k; }) == std::end(kTop))
      return invalid_argument(fmt::format("{}: unknown key {} (a {} file has format, num_layers, latent_dim, "
                                          "estimate, source, layers)",
                                          source, json_util::shown(json(it.key())), kLatentImportanceFileFormat));
  }
  for (const char* k : kTop) {
    if (std::string_view(k) != "source" && !j.contains(k))
      return invalid_argument(fmt::format("{}: required field '{}' is missing", source, k));
  }
  if (!j.at("format").is_string() || j.at("format").get<std::string>() != kLatentImportanceFileFormat)
    return field_error(source, "field 'format'", fmt::format("\"{}\"", kLatentImportanceFileFormat), j.at("format"));
  const json& nl = j.at("num_layers");
  if (!nl.is_number_integer() || nl.get<int64_t>() < 1 || nl.get<int64_t>() > kMaxLayers)
    return field_error(source, "field 'num_layers'", fmt::format("an integer in [1, {}]", kMaxLayers), nl);
  const json& ld = j.at("latent_dim");
  if (!ld.is_number_integer() || ld.get<int64_t>() != kLatentDim)
    return field_error(source, "field 'latent_dim'", fmt::format("the integer {}", kLatentDim), ld);
  const json& est = j.at("estimate");
  if (!est.is_string() || (est.get<std::string>() != "fisher" && est.get<std::string>() != "gradient"))
    return field_error(source, "field 'estimate'", "\"fisher\" or \"gradient\"", est);
  if (j.contains("source") && !j.at("source").is_object())
    return field_error(source, "field 'source'", "an object", j.at("source"));
  const json& layers = j.at("layers");
  const auto n = static_cast<std::size_t>(nl.get<int64_t>());
  if (!layers.is_array() || layers.size() != n)
    return field_error(source, "field 'layers'", fmt::format("a list of {} objects (num_layers)", n),
                       layers.is_array() ? json(fmt::format("{} entries", layers.size())) : layers);
  LatentImportanceWeights w;
  w.estimate = est.get<std::string>();
  for (std::size_t l = 0; l < n; ++l) {
    const json& o = layers.at(l);
    const std::string where = fmt::format("layers[{}]", l);
    if (!o.is_object() || o.size() != 1 || !o.contains("w2"))
      return field_error(source, where, "an object of exactly the key w2", o);
    const json& a = o.at("w2");
    if (!a.is_array() || a.size() != static_cast<std::size_t>(kLatentDim))
      return field_error(source, where + ".w2", fmt::format("a list of {} numbers", kLatentDim), a);
    std::vector<double> v(kLatentDim);
    double mx = 0.0;
    for (int i = 0; i < kLatentDim; ++i) {
      const json& x = a.at(static_cast<std::size_t>(i));
      const double d = x.is_number() ? x.get<double>() : -1.0;
      if (!x.is_number() || !std::isfinite(d) || d < 0.0 || d > 1e30)
        return field_error(source, fmt::format("{}.w2[{}]", where, i), "a finite number in [0, 1e30]", x);
      v[static_cast<std::size_t>(i)] = d;
      mx = std::max(mx, d);
    }
    if (!(mx > 0.0))
      return invalid_argument(fmt::format("{}: {}.w2 is all zero (the layer's latent would carry no weight)", source,
                                          where));
    w.w2.push_back(std::move(v));
  }
  return w;
}

}  // namespace

StatusOr<LatentImportanceWeights> parse_latent_importance_file(std::string_view json_text, std::string_view source) {
  try {
    return parse_importance(json_text, source);
  } catch (const std::exception& e) {
    return internal_error(fmt::format("{}: reading the importance file failed: {}", source, e.what()));
  }
}

StatusOr<LatentImportanceWeights> load_latent_importance_file(const std::string& path) {
  MLAKV_ASSIGN_OR_RETURN(std::string text, io::read_text_file(path, io::kMaxConfigBytes));
  return parse_latent_importance_file(text, path);
}

Status set_latent_importance(LatentTransformRecipe& recipe, std::string_view option) {
  constexpr std::string_view kPrefix = "file:";
  if (option.substr(0, kPrefix.size()) == kPrefix) {
    const std::string path(option.substr(kPrefix.size()));
    if (path.empty()) return invalid_argument("--importance file:PATH: the path is empty");
    MLAKV_ASSIGN_OR_RETURN(recipe.weights, load_latent_importance_file(path));
    recipe.importance = LatentImportance::kFile;
    return Status::Ok();
  }
  const auto k = parse_latent_importance(option);
  if (!k || *k == LatentImportance::kFile) {
    return invalid_argument(fmt::format(
        "--importance: unknown estimate '{}' (none, uniform, query, output, query+output, or file:PATH: an {} file)",
        option, kLatentImportanceFileFormat));
  }
  recipe.importance = *k;
  recipe.weights = {};
  return Status::Ok();
}

LatentTransformCalibrator::LatentTransformCalibrator(int num_layers) {
  layers_.resize(static_cast<std::size_t>(std::max(num_layers, 0)));
  for (Layer& l : layers_) {
    l.sum.assign(kLatentDim, 0.0);
    l.sum_sq.assign(kLatentDim, 0.0);
    l.q_sum_sq.assign(kLatentDim, 0.0);
  }
}

Status LatentTransformCalibrator::add_latent(int layer, const TensorView& kv, std::string_view what) {
  if (layer < 0 || layer >= num_layers())
    return out_of_range(fmt::format("{}: layer {} is outside [0, {})", what, layer, num_layers()));
  MLAKV_RETURN_IF_ERROR(check_tensor(kv, what, {{DType::kF32}, {-1, kLatentDim}, Strides::kContiguous}, Device::cpu()));
  const int64_t T = kv.size(0);
  const float* x = kv.ptr<const float>();
  for (int64_t i = 0; i < T * kLatentDim; ++i) {
    if (!std::isfinite(x[i]))
      return invalid_argument(fmt::format("{}: layer {}: [{}, {}] is not finite", what, layer, i / kLatentDim,
                                          i % kLatentDim));
  }
  Layer& L = layers_[static_cast<std::size_t>(layer)];
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < kLatentDim; ++i) {
      const double v = x[t * kLatentDim + i];
      L.sum[static_cast<std::size_t>(i)] += v;
      L.sum_sq[static_cast<std::size_t>(i)] += v * v;
    }
  }
  L.tokens += T;
  return Status::Ok();
}

Status LatentTransformCalibrator::add_query(int layer, const TensorView& q, std::string_view what) {
  if (layer < 0 || layer >= num_layers())
    return out_of_range(fmt::format("{}: layer {} is outside [0, {})", what, layer, num_layers()));
  MLAKV_RETURN_IF_ERROR(check_tensor(q, what, {{DType::kF32}, {-1, -1, -1}, Strides::kContiguous}, Device::cpu()));
  const int64_t T = q.size(0), H = q.size(1), W = q.size(2);
  if (W < kLatentDim)
    return invalid_argument(fmt::format("{}: the last dim must hold the {} q_lat dims first, got {}", what, kLatentDim, W));
  const float* x = q.ptr<const float>();
  Layer& L = layers_[static_cast<std::size_t>(layer)];
  for (int64_t r = 0; r < T * H; ++r) {
    for (int i = 0; i < kLatentDim; ++i) {
      const double v = x[r * W + i];
      if (!std::isfinite(v))
        return invalid_argument(fmt::format("{}: layer {}: row {} dim {} is not finite", what, layer, r, i));
      L.q_sum_sq[static_cast<std::size_t>(i)] += v * v;
    }
  }
  L.queries += T;  // per token: the heads' moments add up (w_i^2 sums over heads)
  return Status::Ok();
}

StatusOr<LatentTransform> LatentTransformCalibrator::finish(const LatentTransformRecipe& r,
                                                            std::span<const std::vector<double>> energy) const {
  if (layers_.empty()) return invalid_argument("latent transform calibration: no layers");
  const bool need_q = r.importance == LatentImportance::kQuery || r.importance == LatentImportance::kQueryOutput;
  const bool need_e = r.importance == LatentImportance::kOutput || r.importance == LatentImportance::kQueryOutput;
  const bool need_w = r.importance == LatentImportance::kFile;
  if (need_w && r.weights.w2.size() != layers_.size())
    return invalid_argument(fmt::format("latent transform calibration: the importance file holds {} layers, the model "
                                        "{}",
                                        r.weights.w2.size(), layers_.size()));
  if (need_e && energy.size() != layers_.size())
    return invalid_argument(fmt::format("latent transform calibration: importance '{}' needs the output energy of {} "
                                        "layers, got {}",
                                        latent_importance_name(r.importance), layers_.size(), energy.size()));
  if (!(r.sd_power >= 0.0 && r.sd_power <= 1.0))
    return invalid_argument(fmt::format("latent transform calibration: sd_power must be in [0, 1], got {}", r.sd_power));
  if (r.seed > kMaxSeed - 2 * static_cast<uint64_t>(layers_.size()))
    return invalid_argument(fmt::format("latent transform calibration: seed {} must leave room below 2^53", r.seed));
  LatentTransform t;
  t.importance = std::string(latent_importance_name(r.importance));
  t.nvfp4_scales = r.nvfp4_scales;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    if (L.tokens == 0)
      return failed_precondition(fmt::format("latent transform calibration: layer {} saw no latents", l));
    if (need_q && L.queries == 0)
      return failed_precondition(fmt::format("latent transform calibration: layer {} saw no queries", l));
    if (need_w && r.weights.w2[l].size() != static_cast<std::size_t>(kLatentDim))
      return invalid_argument(fmt::format("latent transform calibration: layer {}: the importance holds {} dims, not {}",
                                          l, r.weights.w2[l].size(), kLatentDim));
    if (need_e && energy[l].size() != static_cast<std::size_t>(kLatentDim))
      return invalid_argument(fmt::format("latent transform calibration: layer {}: output energy holds {} dims, not {}",
                                          l, energy[l].size(), kLatentDim));
    LatentTransformLayer out = LatentTransformLayer::identity();
    std::vector<double> sd(kLatentDim), w(kLatentDim, 1.0);
    double sd_max = 0.0;
    for (int i = 0; i < kLatentDim; ++i) {
      const double mean = L.sum[static_cast<std::size_t>(i)] / static_cast<double>(L.tokens);
      const double mu = r.center ? mean : 0.0;
      out.mu[static_cast<std::size_t>(i)] = static_cast<float>(mu);
      // E[(c - mu)^2] = E[c^2] - 2 mu E[c] + mu^2.
      const double m2 = L.sum_sq[static_cast<std::size_t>(i)] / static_cast<double>(L.tokens);
      const double var = std::max(0.0, m2 - 2.0 * static_cast<double>(out.mu[static_cast<std::size_t>(i)]) * mean +
                                           static_cast<double>(out.mu[static_cast<std::size_t>(i)]) *
                                               out.mu[static_cast<std::size_t>(i)]);
      sd[static_cast<std::size_t>(i)] = std::sqrt(var);
      sd_max = std::max(sd_max, sd[static_cast<std::size_t>(i)]);
    }
    if (!(sd_max > 0.0))
      return failed_precondition(fmt::format("latent transform calibration: layer {}'s latent is constant", l));
    if (r.importance != LatentImportance::kNone) {
      double qm = 0.0, em = 0.0, wm = 0.0;
      for (int i = 0; i < kLatentDim; ++i) {
        if (need_q) qm += L.q_sum_sq[static_cast<std::size_t>(i)] / kLatentDim;
        if (need_e) em += energy[l][static_cast<std::size_t>(i)] / kLatentDim;
        if (need_w) wm += r.weights.w2[l][static_cast<std::size_t>(i)] / kLatentDim;
      }
      if ((need_q && !(qm > 0.0)) || (need_e && !(em > 0.0)) || (need_w && !(wm > 0.0)) || !std::isfinite(qm) ||
          !std::isfinite(em) || !std::isfinite(wm))
        return failed_precondition(fmt::format("latent transform calibration: layer {}: the importance is all zero", l));
      std::vector<double> d(kLatentDim);
      double log_sum = 0.0;
      for (int i = 0; i < kLatentDim; ++i) {
        double w2 = 1.0;
        if (r.importance == LatentImportance::kQuery) w2 = L.q_sum_sq[static_cast<std::size_t>(i)] / qm;
        if (r.importance == LatentImportance::kOutput) w2 = energy[l][static_cast<std::size_t>(i)] / em;
        if (need_w) w2 = r.weights.w2[l][static_cast<std::size_t>(i)] / wm;
        if (r.importance == LatentImportance::kQueryOutput)
          w2 = L.q_sum_sq[static_cast<std::size_t>(i)] / qm + energy[l][static_cast<std::size_t>(i)] / em;
        // Floors keep d finite for dead dims: 1e-6 of the mean importance, 1e-6 of the widest dim.
        const double wi = std::sqrt(std::max(w2, 1e-6));
        const double si = std::max(sd[static_cast<std::size_t>(i)], 1e-6 * sd_max);
        d[static_cast<std::size_t>(i)] = std::sqrt(wi) / std::pow(si, r.sd_power);
        log_sum += std::log(d[static_cast<std::size_t>(i)]);
      }
      // Geometric mean 1 (the outer scale takes the overall size), then within [2^-20, 2^20].
      const double g = std::exp(log_sum / kLatentDim);
      for (int i = 0; i < kLatentDim; ++i)
        out.d[static_cast<std::size_t>(i)] =
            static_cast<float>(std::clamp(d[static_cast<std::size_t>(i)] / g, 0x1p-20, 0x1p20));
    }
    out.rotate = r.rotate;
    out.sign_seed = r.rotate ? r.seed + 2 * l : 0;
    out.rope_rotate = r.rope_rotate;
    out.rope_sign_seed = r.rope_rotate ? r.seed + 2 * l + 1 : 0;
    t.layers.push_back(std::move(out));
  }
  MLAKV_RETURN_IF_ERROR(validate_latent_transform(t));
  return t;
}

Status set_transform_outer_scales(LatentTransform& t, std::span<const double> max_abs) {
  if (max_abs.size() != t.layers.size())
    return invalid_argument(fmt::format("latent transform: {} max_abs values for {} layers", max_abs.size(),
                                        t.layers.size()));
  for (std::size_t l = 0; l < max_abs.size(); ++l) {
    const double s = max_abs[l] / layout::kOuterScaleDenominator;
    const float f = static_cast<float>(s);
    if (!std::isfinite(max_abs[l]) || !(max_abs[l] > 0.0) || !std::isfinite(f) || !(f > 0.0f))
      return invalid_argument(
          fmt::format("latent transform: layer {}: max |c'| must be finite and > 0, got {}", l, max_abs[l]));
    t.layers[l].outer_scale = f;
  }
  return Status::Ok();
}

}  // namespace mlakv
