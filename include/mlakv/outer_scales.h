// NVFP4 outer scales: the per-layer s_l that nvfp4_ds_mla records divide the latent by
// before quantizing (docs/reference.md sections 3 and 4; docs/calibration.md).
//
// The scale file, "nvfp4_ds_mla_outer_scale_v1" (the local-inference-lab vLLM fork's
// format, PR #95/#145), is one JSON object:
//   {"format": "nvfp4_ds_mla_outer_scale_v1",   exactly this string
//    "num_layers": 79,                            an integer >= 1
//    "latent_dim": 512,                           an integer, 512
//    "denominator": 2688.0,                       exactly 2688 (= 6 * 448)
//    "scales": [s_0, ..., s_78],                  num_layers finite numbers > 0 (no booleans)
//    "max_abs": [m_0, ..., m_78]}                 for audit: absent, or num_layers finite numbers >= 0
// s_l = max_abs_l / 2688, max_abs_l measured over layer l's kv_c_normed on calibration
// text. Layers at or past num_layers (an MTP layer the file does not cover) use 1.0.
// Other keys are ignored. The loader is strict about everything listed: each error
// names the file, the field and, for list entries, the layer.
//
// Calibration input (the capture format, any engine can dump it): one or more
// safetensors files holding tensors "layers.<i>.kv_c_normed" of shape [T_i, 512]
// (f32, bf16 or f16; T_i >= 1 may differ per layer); other tensors are ignored.
// `mlakv layer-forward --capture` writes it.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mlakv/cache.h"
#include "mlakv/formats.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"
#include "mlakv/tensor_source.h"

namespace mlakv {

inline constexpr std::string_view kOuterScaleFileFormat = "nvfp4_ds_mla_outer_scale_v1";

struct OuterScales {
  int latent_dim = kLatentDim;
  std::vector<double> scales;   // [num_layers] s_l, finite and > 0
  std::vector<double> max_abs;  // [num_layers] or empty (a file without the audit field)

  int num_layers() const { return static_cast<int>(scales.size()); }
  // s_l as the cache uses it (float32); 1.0 for layer >= num_layers() or layer < 0.
  float scale_for(int layer) const;
};

// s_l = max_abs[l] / 2688 for every layer. Fails (naming the layer) on an empty list or a
// max_abs that is not finite and > 0 (a layer whose latent was all zero has no scale).
StatusOr<OuterScales> outer_scales_from_max_abs(std::span<const double> max_abs);

// The JSON text of the file (2-space indented, numbers round-trip exactly).
// Fails when `s` itself is invalid (the checks of parse_outer_scales).
StatusOr<std::string> outer_scales_to_json(const OuterScales& s);
// Writes the file atomically (temporary + rename).
Status write_outer_scales(const std::string& path, const OuterScales& s);

// Strict parse; `source` names the file in messages ("scales.json: field 'scales'[3] ...").
StatusOr<OuterScales> parse_outer_scales(std::string_view json_text, std::string_view source);
StatusOr<OuterScales> load_outer_scales(const std::string& path);

// Per-layer cache formats for `num_layers` cache layers all in `format`, with the outer
// scales applied where the format has one. `warning` is non-empty when scales were given
// for a format without an outer scale (bf16, fp8_ds_mla: the scales are not applied), or
// when num_layers exceeds the file's (the layers past it use 1.0; the message names them).
// Fails on num_layers < 1, or scales whose latent_dim differs from 512.
struct CacheLayerFormats {
  std::vector<LayerFormat> layers;
  std::string warning;
};
StatusOr<CacheLayerFormats> cache_layer_formats(KvFormat format, int num_layers, const OuterScales* scales);

// ---- calibration ---------------------------------------------------------------------

// "layers.<i>.kv_c_normed"
std::string capture_tensor_name(int layer);

// Accumulates max |kv_c_normed| per layer over any number of captures.
class OuterScaleCalibrator {
 public:
  // kv_c_normed [T, 512] f32, bf16 or f16, CPU. Fails (naming `what`, the layer and the
  // first bad [t, d]) on a non-finite value, a shape or dtype error, or layer < 0.
  Status add(int layer, const TensorView& kv_c_normed, std::string_view what = "kv_c_normed");
  // Every "layers.<i>.kv_c_normed" tensor of `capture`; returns how many were read.
  // Fails when there is none, or on a name with a malformed layer index.
  StatusOr<int> add_capture(const TensorSource& capture);
  // The scales for layers [0, num_layers) (num_layers 0: one past the highest layer
  // seen). Fails naming the first layer that has no capture or whose max is 0, and
  // (kInvalidArgument) naming the captured layers at or past num_layers.
  StatusOr<OuterScales> finish(int num_layers = 0) const;

  const std::vector<double>& max_abs() const { return max_abs_; }  // -1 for layers not seen
  const std::vector<int64_t>& tokens() const { return tokens_; }

 private:
  std::vector<double> max_abs_;
  std::vector<int64_t> tokens_;
};

}  // namespace mlakv
