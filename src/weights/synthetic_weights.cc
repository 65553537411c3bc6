#include "mlakv/synthetic_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <vector>

#include "mlakv/numerics.h"

namespace mlakv::synthetic {
namespace {

constexpr float kWeightStd = 0.02f;
constexpr int64_t kFp8Block = 128;
constexpr int64_t kNvfp4Group = 16;

// splitmix64 + Box-Muller, reproducible across platforms.
class Normal {
 public:
  explicit Normal(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  float operator()() {
    const double u1 = (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    const double u2 = static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

struct Tensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

TensorView view_of(const Tensor& t) {
  TensorView v;
  v.data = const_cast<uint8_t*>(t.bytes.data());
  v.dtype = t.dtype;
  v.ndim = static_cast<int>(t.shape.size());
  int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.shape[static_cast<std::size_t>(d)] = t.shape[static_cast<std::size_t>(d)];
    v.strides[static_cast<std::size_t>(d)] = stride;
    stride *= t.shape[static_cast<std::size_t>(d)];
  }
  return v;
}

template <class T>
Tensor make(DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
  Tensor t{dt, std::move(shape), {}};
  t.bytes.resize(v.size() * sizeof(T));
  std::copy_n(reinterpret_cast<const uint8_t*>(v.data()), t.bytes.size(), t.bytes.data());
  return t;
}

// One layer's tensors (suffix -> tensor) for W [N, K] in `enc`.
std::map<std::string, Tensor> quantize(const std::vector<float>& w, int64_t N, int64_t K, WeightEncoding enc) {
  std::map<std::string, Tensor> out;
  if (enc == WeightEncoding::kDense) {
    std::vector<uint16_t> b(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) b[i] = f32_to_bf16(w[i]);
    out["weight"] = make(DType::kBF16, {N, K}, b);
    return out;
  }
  if (enc == WeightEncoding::kFp8Block) {
    const int64_t sr = (N + kFp8Block - 1) / kFp8Block, sc = (K + kFp8Block - 1) / kFp8Block;
    std::vector<float> s(static_cast<std::size_t>(sr * sc));
    std::vector<uint8_t> q(w.size());
    for (int64_t bi = 0; bi < sr; ++bi) {
      for (int64_t bj = 0; bj < sc; ++bj) {
        float amax = 0;
        for (int64_t n = bi * kFp8Block; n < std::min(N, (bi + 1) * kFp8Block); ++n) {
          for (int64_t k = bj * kFp8Block; k < std::min(K, (bj + 1) * kFp8Block); ++k) {
            amax = std::max(amax, std::fabs(w[static_cast<std::size_t>(n * K + k)]));
          }
        }
        const float scale = amax > 0 ? amax / kE4m3Max : 1.0f;
        s[static_cast<std::size_t>(bi * sc + bj)] = scale;
        for (int64_t n = bi * kFp8Block; n < std::min(N, (bi + 1) * kFp8Block); ++n) {
          for (int64_t k = bj * kFp8Block; k < std::min(K, (bj + 1) * kFp8Block); ++k) {
            const std::size_t i = static_cast<std::size_t>(n * K + k);
            q[i] = f32_to_e4m3_satfinite(w[i] / scale);
          }
        }
      }
    }
    out["weight"] = make(DType::kF8E4M3, {N, K}, q);
    out["weight_scale_inv"] = make(DType::kF32, {sr, sc}, s);
    return out;
  }
  // NVFP4 (both flavours share the codes).
  float amax = 0;
  for (float x : w) amax = std::max(amax, std::fabs(x));
  const float scale_2 = amax > 0 ? amax / (kE2m1Max * kE4m3Max) : 1.0f;
  const int64_t groups = K / kNvfp4Group;
  std::vector<uint8_t> packed(static_cast<std::size_t>(N * K / 2)), scales(static_cast<std::size_t>(N * groups));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < groups; ++g) {
      float gmax = 0;
      for (int64_t j = 0; j < kNvfp4Group; ++j) {
        gmax = std::max(gmax, std::fabs(w[static_cast<std::size_t>(n * K + g * kNvfp4Group + j)]));
      }
      uint8_t sc = f32_to_e4m3_satfinite(gmax / kE2m1Max / scale_2);
      if (e4m3_to_f32(sc) == 0.0f) sc = 0x08;  // smallest normal: keeps the division finite
      scales[static_cast<std::size_t>(n * groups + g)] = sc;
      const float step = e4m3_to_f32(sc) * scale_2;
      for (int64_t j = 0; j < kNvfp4Group; j += 2) {
        const int64_t k = g * kNvfp4Group + j;
        const uint8_t lo = f32_to_e2m1_satfinite(w[static_cast<std::size_t>(n * K + k)] / step);
        const uint8_t hi = f32_to_e2m1_satfinite(w[static_cast<std::size_t>(n * K + k + 1)] / step);
        packed[static_cast<std::size_t>(n * K / 2 + k / 2)] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
  const bool ct = enc == WeightEncoding::kCompressedTensorsNvfp4;
  out[ct ? "weight_packed" : "weight"] = make(DType::kU8, {N, K / 2}, packed);
  out["weight_scale"] = make(DType::kF8E4M3, {N, groups}, scales);
  const std::vector<float> tensor_scale = {ct ? 1.0f / scale_2 : scale_2};
  out[ct ? "weight_global_scale" : "weight_scale_2"] = make(DType::kF32, {1}, tensor_scale);
  return out;
}

// Serves the same tensors under every layer's prefix.
class SharedLayerSource final : public TensorSource {
 public:
  SharedLayerSource(std::map<std::string, Tensor> tensors, int layers, std::string layer_prefix, std::string what)
      : tensors_(std::move(tensors)), layers_(layers), prefix_(std::move(layer_prefix)), what_(std::move(what)) {}

  std::optional<TensorView> find(std::string_view name) const override {
    if (name.substr(0, prefix_.size()) != prefix_) return std::nullopt;
    name.remove_prefix(prefix_.size());
    int layer = -1;
    const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), layer);
    if (ec != std::errc() || layer < 0 || layer >= layers_ || end == name.data()) return std::nullopt;
    if (name.front() == '0' && end - name.data() > 1) return std::nullopt;  // no leading zeros
    std::string_view rest(end, static_cast<std::size_t>(name.data() + name.size() - end));
    constexpr std::string_view kMid = ".self_attn.kv_b_proj.";
    if (rest.substr(0, kMid.size()) != kMid) return std::nullopt;
    auto it = tensors_.find(std::string(rest.substr(kMid.size())));
    if (it == tensors_.end()) return std::nullopt;
    return view_of(it->second);
  }

  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (int i = 0; i < layers_; ++i) {
      for (const auto& kv : tensors_) out.push_back(fmt::format("{}{}.self_attn.kv_b_proj.{}", prefix_, i, kv.first));
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string describe() const override { return what_; }

 private:
  std::map<std::string, Tensor> tensors_;
  int layers_;
  std::string prefix_, what_;
};

}  // namespace

StatusOr<std::unique_ptr<TensorSource>> make_kv_b_proj_checkpoint(const ModelConfig& config,
                                                                  const KvBProjCheckpointSpec& spec) {
  MLAKV_RETURN_IF_ERROR(config.validate());
  if (spec.layers < 1) return invalid_argument(fmt::format("synthetic checkpoint: layers {} must be >= 1", spec.layers));
  if (spec.encoding == WeightEncoding::kGptq || spec.encoding == WeightEncoding::kAwq) {
    return unimplemented(fmt::format("synthetic checkpoint: the {} encoding is not generated",
                                     weight_encoding_name(spec.encoding)));
  }
  const int64_t N = static_cast<int64_t>(config.num_heads) * (config.qk_nope_head_dim + config.v_head_dim);
  const int64_t K = config.kv_lora_rank;
  if ((spec.encoding == WeightEncoding::kModelOptNvfp4 || spec.encoding == WeightEncoding::kCompressedTensorsNvfp4) &&
      K % kNvfp4Group != 0) {
    return invalid_argument(fmt::format("synthetic checkpoint: kv_lora_rank {} is not a multiple of the NVFP4 group {}",
                                        K, kNvfp4Group));
  }
  Normal normal(spec.seed);
  std::vector<float> w(static_cast<std::size_t>(N * K));
  for (float& x : w) x = kWeightStd * normal();
  std::string what = fmt::format("synthetic {} kv_b_proj ({}, {} layers sharing one set of bytes)", config.name,
                                 weight_encoding_name(spec.encoding), spec.layers);
  return std::unique_ptr<TensorSource>(std::make_unique<SharedLayerSource>(quantize(w, N, K, spec.encoding),
                                                                           spec.layers, spec.layer_prefix,
                                                                           std::move(what)));
}

}  // namespace mlakv::synthetic
