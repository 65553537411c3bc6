// The nvfp4_ds_mla outer-scale file and its calibration (include/mlakv/outer_scales.h,
// docs/calibration.md).
#include "mlakv/outer_scales.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/untrusted_json.h"
#include "format/load_float.h"
#include "mlakv/file_io.h"
#include "mlakv/numerics.h"

namespace mlakv {
namespace {

using nlohmann::json;

constexpr int kMaxLayers = 1 << 16;

std::string shown(const json& v) { return json_util::shown(v); }

// A scale the cache can hold: finite, > 0, and still so in float32.
bool valid_scale(double s) {
  const float f = static_cast<float>(s);
  return std::isfinite(s) && s > 0.0 && std::isfinite(f) && f > 0.0f;
}

Status check_scales(const OuterScales& s, std::string_view source) {
  if (s.latent_dim != kLatentDim) {
    return invalid_argument(fmt::format("{}: field 'latent_dim' must be {}, got {}", source, kLatentDim, s.latent_dim));
  }
  if (s.scales.empty() || s.num_layers() > kMaxLayers) {
    return invalid_argument(
        fmt::format("{}: field 'num_layers' must be in [1, {}], got {}", source, kMaxLayers, s.scales.size()));
  }
  for (int l = 0; l < s.num_layers(); ++l) {
    if (!valid_scale(s.scales[static_cast<std::size_t>(l)])) {
      return invalid_argument(
          fmt::format("{}: field 'scales'[{}] (layer {}) must be a finite number > 0 that float32 "
                      "can hold, got {}",
                      source, l, l, s.scales[static_cast<std::size_t>(l)]));
    }
  }
  if (!s.max_abs.empty()) {
    if (s.max_abs.size() != s.scales.size()) {
      return invalid_argument(fmt::format("{}: field 'max_abs' must hold num_layers = {} numbers, got {}", source,
                                          s.scales.size(), s.max_abs.size()));
    }
    for (int l = 0; l < s.num_layers(); ++l) {
      const double m = s.max_abs[static_cast<std::size_t>(l)];
      if (!std::isfinite(m) || m < 0.0) {
        return invalid_argument(
            fmt::format("{}: field 'max_abs'[{}] (layer {}) must be a finite number >= 0, got {}", source, l, l, m));
      }
    }
  }
  return Status::Ok();
}

StatusOr<OuterScales> parse(std::string_view text, std::string_view source) {
  MLAKV_ASSIGN_OR_RETURN(json j, json_util::parse(text, source));
  auto missing = [&](const char* key) {
    return invalid_argument(fmt::format("{}: required field '{}' is missing", source, key));
  };
  auto bad = [&](const char* key, std::string_view want) {
    return invalid_argument(fmt::format("{}: field '{}' must be {}, got {}", source, key, want, shown(j.at(key))));
  };

  if (!j.contains("format")) return missing("format");
  if (!j.at("format").is_string() || j.at("format").get<std::string>() != kOuterScaleFileFormat) {
    return bad("format", fmt::format("\"{}\"", kOuterScaleFileFormat));
  }
  if (!j.contains("num_layers")) return missing("num_layers");
  const json& nl = j.at("num_layers");
  if (!nl.is_number_integer() || nl.get<int64_t>() < 1 || nl.get<int64_t>() > kMaxLayers) {
    return bad("num_layers", fmt::format("an integer in [1, {}]", kMaxLayers));
  }
  const int n = static_cast<int>(nl.get<int64_t>());
  if (!j.contains("latent_dim")) return missing("latent_dim");
  if (!j.at("latent_dim").is_number_integer() || j.at("latent_dim").get<int64_t>() != kLatentDim) {
    return bad("latent_dim", fmt::format("the integer {}", kLatentDim));
  }
  if (!j.contains("denominator")) return missing("denominator");
  if (!j.at("denominator").is_number() || j.at("denominator").get<double>() != layout::kOuterScaleDenominator) {
    return bad("denominator", "exactly 2688.0 (= 6 * 448)");
  }

  OuterScales s;
  s.latent_dim = kLatentDim;
  auto read_list = [&](const char* key, bool positive, std::vector<double>& out) -> Status {
    const json& arr = j.at(key);
    if (!arr.is_array() || static_cast<int>(arr.size()) != n) {
      return bad(key, fmt::format("a list of num_layers = {} numbers", n));
    }
    out.resize(static_cast<std::size_t>(n));
    for (int l = 0; l < n; ++l) {
      const json& v = arr.at(static_cast<std::size_t>(l));
      const double x = v.is_number() ? v.get<double>() : 0.0;
      const bool ok = v.is_number() && (positive ? valid_scale(x) : (std::isfinite(x) && x >= 0.0));
      if (!ok) {
        return invalid_argument(fmt::format("{}: field '{}'[{}] (layer {}) must be a finite number {}, got {}", source,
                                            key, l, l, positive ? "> 0 that float32 can hold" : ">= 0", shown(v)));
      }
      out[static_cast<std::size_t>(l)] = x;
    }
    return Status::Ok();
  };
  if (!j.contains("scales")) return missing("scales");
  MLAKV_RETURN_IF_ERROR(read_list("scales", true, s.scales));
  if (j.contains("max_abs") && !j.at("max_abs").is_null()) {
    MLAKV_RETURN_IF_ERROR(read_list("max_abs", false, s.max_abs));
  }
  return s;
}

}  // namespace

float OuterScales::scale_for(int layer) const {
  if (layer < 0 || layer >= num_layers()) return 1.0f;
  return static_cast<float>(scales[static_cast<std::size_t>(layer)]);
}

StatusOr<OuterScales> outer_scales_from_max_abs(std::span<const double> max_abs) {
  if (max_abs.empty() || max_abs.size() > static_cast<std::size_t>(kMaxLayers)) {
    return invalid_argument(fmt::format("outer scales: need 1 to {} layers, got {}", kMaxLayers, max_abs.size()));
  }
  OuterScales s;
  for (std::size_t l = 0; l < max_abs.size(); ++l) {
    const double m = max_abs[l];
    const double sc = m / layout::kOuterScaleDenominator;
    if (!std::isfinite(m) || !(m > 0.0) || !valid_scale(sc)) {
      return invalid_argument(
          fmt::format("outer scales: layer {}: max |kv_c_normed| must be finite and > 0, got {}", l, m));
    }
    s.max_abs.push_back(m);
    s.scales.push_back(sc);
  }
  return s;
}

StatusOr<std::string> outer_scales_to_json(const OuterScales& s) {
  MLAKV_RETURN_IF_ERROR(check_scales(s, "outer scales"));
  json j = json::object();
  j["format"] = std::string(kOuterScaleFileFormat);
  j["num_layers"] = s.num_layers();
  j["latent_dim"] = s.latent_dim;
  j["denominator"] = layout::kOuterScaleDenominator;
  j["scales"] = s.scales;
  if (!s.max_abs.empty()) j["max_abs"] = s.max_abs;
  return j.dump(2) + "\n";
}

Status write_outer_scales(const std::string& path, const OuterScales& s) {
  MLAKV_ASSIGN_OR_RETURN(std::string text, outer_scales_to_json(s));
  return io::write_file(path, text);
}

StatusOr<OuterScales> parse_outer_scales(std::string_view json_text, std::string_view source) {
  try {
    return parse(json_text, source);
  } catch (const std::exception& e) {  // nlohmann type errors are ruled out above; never across the API anyway
    return internal_error(fmt::format("{}: reading the scale file failed: {}", source, e.what()));
  }
}

StatusOr<OuterScales> load_outer_scales(const std::string& path) {
  MLAKV_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, io::read_file(path, io::kMaxConfigBytes));
  return parse_outer_scales(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
}

StatusOr<CacheLayerFormats> cache_layer_formats(KvFormat format, int num_layers, const OuterScales* scales) {
  if (num_layers < 1) return invalid_argument(fmt::format("num_layers must be >= 1, got {}", num_layers));
  if (static_cast<int>(format) >= kNumKvFormats) {
    return invalid_argument(fmt::format("unknown format id {}", static_cast<int>(format)));
  }
  if (scales != nullptr) MLAKV_RETURN_IF_ERROR(check_scales(*scales, "outer scales"));
  CacheLayerFormats r;
  const bool has_outer = format_info(format).has_outer_scale;
  if (scales != nullptr && !has_outer) {
    r.warning = fmt::format(
        "format {} has no outer scale: the {}-layer scale file is ignored (outer scales apply to "
        "nvfp4_ds_mla, nvfp4_ds_mla_fp8rope and nvfp4_ds_mla_int8rope)",
        format_name(format), scales->num_layers());
  }
  if (scales != nullptr && has_outer && num_layers > scales->num_layers()) {
    const int n = scales->num_layers();
    const std::string past = num_layers - n == 1
                                 ? fmt::format("layer {} is past it and uses", n)
                                 : fmt::format("layers [{}, {}) are past it and use", n, num_layers);
    r.warning = fmt::format(
        "the scale file covers layers [0, {}); {} outer scale 1.0 (right only for an MTP layer left out on "
        "purpose; otherwise recalibrate with every layer)",
        n, past);
  }
  for (int l = 0; l < num_layers; ++l) {
    r.layers.push_back({format, has_outer && scales != nullptr ? scales->scale_for(l) : 1.0f});
  }
  return r;
}

std::string capture_tensor_name(int layer) { return fmt::format("layers.{}.kv_c_normed", layer); }

Status OuterScaleCalibrator::add(int layer, const TensorView& x, std::string_view what) {
  if (layer < 0 || layer >= kMaxLayers) {
    return out_of_range(fmt::format("{}: layer {} is outside [0, {})", what, layer, kMaxLayers));
  }
  MLAKV_RETURN_IF_ERROR(
      check_tensor(x, what, {{DType::kF32, DType::kBF16, DType::kF16}, {-1, kLatentDim}}, Device::cpu()));
  if (x.size(0) < 1)
    return invalid_argument(fmt::format("{}: needs at least one token, got shape {}", what, x.shape_string()));
  double m = 0.0;
  for (int64_t t = 0; t < x.size(0); ++t) {
    const auto* row = static_cast<const uint8_t*>(x.data) + t * x.stride(0) * static_cast<int64_t>(dtype_size(x.dtype));
    for (int d = 0; d < kLatentDim; ++d) {
      const float v = load_as_f32(row, x.dtype, d);
      if (!std::isfinite(v)) {
        return data_loss(fmt::format("{} (layer {}): value at [{}, {}] is not finite ({})", what, layer, t, d, v));
      }
      m = std::max(m, static_cast<double>(std::fabs(v)));
    }
  }
  if (static_cast<int>(max_abs_.size()) <= layer) {
    max_abs_.resize(static_cast<std::size_t>(layer) + 1, -1.0);
    tokens_.resize(static_cast<std::size_t>(layer) + 1, 0);
  }
  max_abs_[static_cast<std::size_t>(layer)] = std::max(max_abs_[static_cast<std::size_t>(layer)], m);
  tokens_[static_cast<std::size_t>(layer)] += x.size(0);
  return Status::Ok();
}

StatusOr<int> OuterScaleCalibrator::add_capture(const TensorSource& capture) {
  constexpr std::string_view kPrefix = "layers.", kSuffix = ".kv_c_normed";
  int read = 0;
  for (const std::string& name : capture.names()) {
    const std::string_view n(name);
    if (n.size() <= kPrefix.size() + kSuffix.size() || n.substr(0, kPrefix.size()) != kPrefix ||
        n.substr(n.size() - kSuffix.size()) != kSuffix) {
      continue;
    }
    const std::string_view idx = n.substr(kPrefix.size(), n.size() - kPrefix.size() - kSuffix.size());
    const bool digits = !idx.empty() && idx.size() <= 5 &&
                        std::all_of(idx.begin(), idx.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                        (idx.size() == 1 || idx[0] != '0');
    if (!digits) {
      return invalid_argument(fmt::format("{}: tensor '{}' has a malformed layer index (want layers.<i>.kv_c_normed)",
                                          capture.describe(), name));
    }
    const int layer = std::stoi(std::string(idx));
    const std::optional<TensorView> t = capture.find(name);
    if (!t) return internal_error(fmt::format("{}: tensor '{}' vanished", capture.describe(), name));
    MLAKV_RETURN_IF_ERROR(add(layer, *t, fmt::format("{}: tensor '{}'", capture.describe(), name)));
    ++read;
  }
  if (read == 0) {
    return invalid_argument(
        fmt::format("{}: no layers.<i>.kv_c_normed tensor (the capture format of "
                    "docs/calibration.md)",
                    capture.describe()));
  }
  return read;
}

StatusOr<OuterScales> OuterScaleCalibrator::finish(int num_layers) const {
  if (num_layers < 0 || num_layers > kMaxLayers) {
    return invalid_argument(fmt::format("num_layers must be in [0, {}], got {}", kMaxLayers, num_layers));
  }
  const int n = num_layers > 0 ? num_layers : static_cast<int>(max_abs_.size());
  if (n == 0) return failed_precondition("calibration: no kv_c_normed was added");
  std::string dropped;
  for (int l = n; l < static_cast<int>(max_abs_.size()); ++l) {
    if (max_abs_[static_cast<std::size_t>(l)] >= 0.0) dropped += fmt::format("{}{}", dropped.empty() ? "" : ", ", l);
  }
  if (!dropped.empty()) {
    return invalid_argument(fmt::format(
        "calibration: num_layers {} leaves out captured layer(s) {}: their captures would be dropped (give "
        "num_layers {} or 0 = one past the highest captured)",
        n, dropped, max_abs_.size()));
  }
  std::vector<double> m(static_cast<std::size_t>(n));
  for (int l = 0; l < n; ++l) {
    const double v = l < static_cast<int>(max_abs_.size()) ? max_abs_[static_cast<std::size_t>(l)] : -1.0;
    if (v < 0.0) {
      return failed_precondition(
          fmt::format("calibration: layer {} of {} has no capture ({})", l, n, capture_tensor_name(l)));
    }
    if (v == 0.0) return failed_precondition(fmt::format("calibration: layer {}: max |kv_c_normed| is 0", l));
    m[static_cast<std::size_t>(l)] = v;
  }
  return outer_scales_from_max_abs(m);
}

}  // namespace mlakv
