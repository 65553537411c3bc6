// Weight dequantization for kv_b_proj (and any linear layer): see mlakv/kv_b_proj.h.
//
// Where each layout comes from (read for facts; nothing copied):
//  - DeepSeek fp8 block: deepseek-ai/DeepSeek-V3 inference/kernel.py `weight_dequant_kernel`
//    and inference/fp8_cast_bf16.py: y = fp8 * s, s = scale_inv[row / 128, col / 128] over a
//    [ceil(M/128), ceil(N/128)] grid, partial edge tiles masked (so N, K need not be
//    multiples of 128). Block shape from config.json `weight_block_size`.
//  - ModelOpt NVFP4: NVIDIA TensorRT-Model-Optimizer
//    modelopt/torch/quantization/qtensor/nvfp4_tensor.py: quantize packs
//    `(q[..., 1::2] << 4) | q[..., 0::2]` (even element in the low nibble); dequantize
//    multiplies e2m1 by `weight_scale (e4m3) * weights_scaling_factor_2`. vLLM's modelopt
//    loader uses `weight_scale_2` as is (a multiplier, amax / (6 * 448)).
//  - compressed-tensors NVFP4: neuralmagic/compressed-tensors
//    compressors/quantized_compressors/nvfp4_quantized.py (`pack_fp4_to_uint8`:
//    `indices[:, 0] | indices[:, 1] << 4`; `unpack_fp4_from_uint8` takes the low nibble
//    first) and quantization/lifecycle/forward.py `_dequantize` (`scale = scale /
//    global_scale`). vLLM compressed_tensors_w4a16_nvfp4.py inverts it on load ("ct stores
//    the inverse of what is expected by the marlin kernel": 1 / weight_global_scale), and
//    compressed_tensors_w4a4_nvfp4.py ("CT stores as divisors, i.e. 1/scale") does the same.
//  - GPTQ: AutoGPTQ auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py `pack`: qweight row r
//    ORs intweight[8r + j] << 4j (input channels along K, low nibble first, N columns kept);
//    `zeros -= 1` before qzeros[:, c] |= zeros[:, 8c + j] << 4j; its torch forward unpacks
//    the zero nibble, adds 1 (no wrap: a stored 15 means 16) and computes scales * (q - z);
//    g_idx defaults to i // group_size; qzeros/scales have ceil(K / G) rows. GPTQModel
//    gptqmodel/utils/model.py `convert_gptq_v1_to_v2_format_module` adds 1 to every packed
//    zero (0x11111111 for 4 bits): v2 ("gptq_v2", quantization_config.checkpoint_format)
//    stores the real zero; vLLM tests load "gptq_v2" checkpoints the same way.
//  - AWQ (GEMM): casper-hansen/AutoAWQ awq/modules/linear/gemm.py `WQLinear_GEMM.from_linear`:
//    order_map = [0, 2, 4, 6, 1, 3, 5, 7] and `qweight[:, col] |= intweight[:, col * 8 +
//    order_map[i]] << (4 * i)`, i.e. nibble i of a word holds output column 8c + order[i];
//    qzeros packed the same way and not offset; intweight = round(w / s + z), so
//    w = (q - z) * s. Unpackers (AutoAWQ packing_utils, vLLM awq_triton) apply the inverse
//    permutation [0, 4, 1, 5, 2, 6, 3, 7] after unpacking nibbles in order.
#include "mlakv/kv_b_proj.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/checked_math.h"
#include "core/untrusted_json.h"
#include "format/load_float.h"
#include "io/config_json.h"
#include "mlakv/file_io.h"
#include "mlakv/numerics.h"
#include "mlakv/untrusted.h"

namespace mlakv {
namespace {

using nlohmann::json;

constexpr int64_t kNvfp4Group = 16;  // e2m1 values per e4m3 scale
constexpr int64_t kInt4PerWord = 8;  // 4-bit values per int32 (GPTQ / AWQ)
// AWQ GEMM: nibble i of a packed word holds column kAwqOrder[i] of its group of 8.
constexpr std::array<int, 8> kAwqOrder = {0, 2, 4, 6, 1, 3, 5, 7};

// ---- raw loads (memcpy: safetensors data offsets need not be aligned) ------------------
inline uint32_t load_u32(const uint8_t* base, int64_t i) {
  uint32_t v;
  std::memcpy(&v, base + 4 * i, sizeof v);
  return v;
}
inline uint16_t load_u16(const uint8_t* base, int64_t i) {
  uint16_t v;
  std::memcpy(&v, base + 2 * i, sizeof v);
  return v;
}

// Element i of a f32 / bf16 / f16 tensor (contiguous) as float.
inline float load_float(const TensorView& t, int64_t i) { return load_as_f32(t.data, t.dtype, i); }

// ---- output sinks: one instantiation per output dtype, no per-element dispatch -------
struct F32Sink {
  static constexpr bool kValidateOnly = false;
  float* p;
  int64_t ld;
  bool nonfinite = false;
  void put(int64_t n, int64_t k, float v) {
    p[n * ld + k] = v;
    nonfinite |= (f32_bits(v) & 0x7F800000u) == 0x7F800000u;
  }
  float get(int64_t n, int64_t k) const { return p[n * ld + k]; }
};

struct Bf16Sink {
  static constexpr bool kValidateOnly = false;
  uint16_t* p;
  int64_t ld;
  bool nonfinite = false;
  void put(int64_t n, int64_t k, float v) {
    const uint16_t b = f32_to_bf16(v);
    p[n * ld + k] = b;
    nonfinite |= (b & 0x7F80u) == 0x7F80u;
  }
  float get(int64_t n, int64_t k) const { return bf16_to_f32(p[n * ld + k]); }
};

// No output: the decoders stop after their checks (check_weight_storage).
struct CheckOnlySink {
  static constexpr bool kValidateOnly = true;
  bool nonfinite = false;
  void put(int64_t, int64_t, float) {}
  float get(int64_t, int64_t) const { return 0.0f; }
};

// ---- tensor lookup and validation -------------------------------------------------------
std::string normalize_prefix(std::string_view prefix) {
  std::string p(prefix);
  if (!p.empty() && p.back() != '.') p.push_back('.');
  return p;
}

// "a, b, c" (at most 24 names) of the tensors under `prefix`, or "none".
std::string names_under(const TensorSource& src, const std::string& prefix) {
  std::vector<std::string> found;
  for (const std::string& n : src.names()) {
    if (n.size() >= prefix.size() && n.compare(0, prefix.size(), prefix) == 0) found.push_back(escape_untrusted(n));
  }
  if (found.empty()) return "none";
  constexpr std::size_t kMax = 24;
  std::string s = fmt::format("{}", fmt::join(found.begin(), found.begin() + std::min(found.size(), kMax), ", "));
  if (found.size() > kMax) s += fmt::format(", ... ({} more)", found.size() - kMax);
  return s;
}

struct Layer {
  const TensorSource& src;
  std::string prefix;  // empty or ending with '.'
  WeightEncoding encoding;

  std::string name(std::string_view suffix) const { return prefix + std::string(suffix); }

  StatusOr<TensorView> need(std::string_view suffix) const {
    const std::string n = name(suffix);
    std::optional<TensorView> t = src.find(n);
    if (!t) {
      return not_found(fmt::format("{}: missing from {} (the {} encoding needs it); tensors under '{}': {}", n,
                                   src.describe(), weight_encoding_name(encoding), prefix, names_under(src, prefix)));
    }
    return *t;
  }
};

// A per-tensor scale: f32 or bf16, shape [] or [1], finite and > 0.
StatusOr<float> positive_scalar(const TensorView& t, const std::string& name) {
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16) {
    return invalid_argument(fmt::format("{}: expected dtype f32 or bf16, got {}", name, dtype_name(t.dtype)));
  }
  if (!(t.ndim == 0 || (t.ndim == 1 && t.size(0) == 1))) {
    return invalid_argument(
        fmt::format("{}: expected a scalar (shape [] or [1]), got shape {}", name, t.shape_string()));
  }
  if (t.data == nullptr) return invalid_argument(fmt::format("{}: null data pointer", name));
  if (!(t.device == Device::cpu())) {
    return invalid_argument(fmt::format("{}: expected a tensor on cpu, got {}", name, device_name(t.device)));
  }
  const float v = load_float(t, 0);
  if (!std::isfinite(v) || !(v > 0.0f)) {
    return data_loss(fmt::format("{}: per-tensor scale is {} (must be finite and > 0)", name, v));
  }
  return v;
}

// Every element of a float scale tensor [rows, cols] must be finite.
Status check_finite_scales(const TensorView& t, const std::string& name) {
  const int64_t cols = t.size(1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = load_float(t, i);
    if (!std::isfinite(v)) {
      return data_loss(fmt::format("{}: element [{}, {}] is {} (scales must be finite)", name, i / cols, i % cols, v));
    }
  }
  return Status::Ok();
}

// Every byte of an e4m3 scale tensor [rows, cols] must not be the NaN code.
Status check_e4m3_scales(const TensorView& t, const std::string& name) {
  const auto* b = t.ptr<const uint8_t>();
  const int64_t cols = t.size(1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if ((b[i] & 0x7Fu) == kE4m3NaN) {
      return data_loss(
          fmt::format("{}: element [{}, {}] is the e4m3 NaN code 0x{:02x}", name, i / cols, i % cols, b[i]));
    }
  }
  return Status::Ok();
}

std::array<float, 256> e4m3_table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[static_cast<std::size_t>(c)] = e4m3_to_f32(static_cast<uint8_t>(c));
  return t;
}

// ---- decoders (validate everything first, then write) -----------------------------------
template <class Sink>
Status decode_dense(const Layer& l, int64_t N, int64_t K, Sink& out) {
  MLAKV_ASSIGN_OR_RETURN(const TensorView w, l.need("weight"));
  MLAKV_RETURN_IF_ERROR(check_tensor(
      w, l.name("weight"), {{DType::kBF16, DType::kF16, DType::kF32}, {N, K}, Strides::kContiguous}, Device::cpu()));
  if constexpr (Sink::kValidateOnly) return Status::Ok();
  const auto* b = w.ptr<const uint8_t>();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row = n * K;
    switch (w.dtype) {
      case DType::kF32:
        for (int64_t k = 0; k < K; ++k) out.put(n, k, f32_from_bits(load_u32(b, row + k)));
        break;
      case DType::kBF16:
        for (int64_t k = 0; k < K; ++k) out.put(n, k, bf16_to_f32(load_u16(b, row + k)));
        break;
      default:
        for (int64_t k = 0; k < K; ++k) out.put(n, k, f16_to_f32(load_u16(b, row + k)));
        break;
    }
  }
  return Status::Ok();
}

template <class Sink>
Status decode_fp8_block(const Layer& l, int64_t N, int64_t K, const WeightQuantOptions& opt, Sink& out) {
  const int64_t bn = opt.fp8_block_rows, bk = opt.fp8_block_cols;
  if (bn <= 0 || bk <= 0) {
    return invalid_argument(fmt::format("fp8 block shape [{}, {}]: both extents must be positive", bn, bk));
  }
  // ceil(N / bn) without forming N + bn - 1, which wraps for a block of 2^63 - 1 and
  // would make a 0-row scale grid pass the shape check.
  const int64_t sr = *checked::ceil_div(N, bn), sc = *checked::ceil_div(K, bk);
  MLAKV_ASSIGN_OR_RETURN(const TensorView w, l.need("weight"));
  MLAKV_ASSIGN_OR_RETURN(const TensorView s, l.need("weight_scale_inv"));
  MLAKV_RETURN_IF_ERROR(
      check_tensor(w, l.name("weight"), {{DType::kF8E4M3}, {N, K}, Strides::kContiguous}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(s, l.name("weight_scale_inv"),
                                     {{DType::kF32, DType::kBF16}, {sr, sc}, Strides::kContiguous}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_finite_scales(s, l.name("weight_scale_inv")));
  if constexpr (Sink::kValidateOnly) return Status::Ok();

  const std::array<float, 256> lut = e4m3_table();
  const auto* q = w.ptr<const uint8_t>();
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* qrow = q + n * K;
    const int64_t srow = (n / bn) * sc;
    for (int64_t kb = 0; kb < sc; ++kb) {
      const float scale = load_float(s, srow + kb);
      const int64_t k_end = std::min(K, (kb + 1) * bk);
      for (int64_t k = kb * bk; k < k_end; ++k) out.put(n, k, lut[qrow[k]] * scale);
    }
  }
  return Status::Ok();
}

// kDivide: compressed-tensors (value / global); otherwise ModelOpt (value * scale_2).
template <bool kDivide, class Sink>
Status decode_nvfp4(const Layer& l, int64_t N, int64_t K, Sink& out) {
  const char* packed_name = kDivide ? "weight_packed" : "weight";
  const char* tensor_scale_name = kDivide ? "weight_global_scale" : "weight_scale_2";
  if (K % kNvfp4Group != 0) {
    return invalid_argument(
        fmt::format("{}: K = {} is not a multiple of the NVFP4 group size {}", l.name(packed_name), K, kNvfp4Group));
  }
  const int64_t groups = K / kNvfp4Group;
  MLAKV_ASSIGN_OR_RETURN(const TensorView w, l.need(packed_name));
  MLAKV_ASSIGN_OR_RETURN(const TensorView s, l.need("weight_scale"));
  MLAKV_ASSIGN_OR_RETURN(const TensorView g, l.need(tensor_scale_name));
  MLAKV_RETURN_IF_ERROR(
      check_tensor(w, l.name(packed_name), {{DType::kU8}, {N, K / 2}, Strides::kContiguous}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(
      check_tensor(s, l.name("weight_scale"), {{DType::kF8E4M3}, {N, groups}, Strides::kContiguous}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_e4m3_scales(s, l.name("weight_scale")));
  MLAKV_ASSIGN_OR_RETURN(const float tensor_scale, positive_scalar(g, l.name(tensor_scale_name)));
  if constexpr (Sink::kValidateOnly) return Status::Ok();

  const std::array<float, 256> e4m3 = e4m3_table();
  std::array<float, 16> e2m1{};
  for (int c = 0; c < 16; ++c) e2m1[static_cast<std::size_t>(c)] = e2m1_to_f32(static_cast<uint8_t>(c));
  const auto* packed = w.ptr<const uint8_t>();
  const auto* scales = s.ptr<const uint8_t>();
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* prow = packed + n * (K / 2);
    for (int64_t gi = 0; gi < groups; ++gi) {
      const float bs = e4m3[scales[n * groups + gi]];
      for (int64_t j = 0; j < kNvfp4Group / 2; ++j) {
        const int64_t k = gi * kNvfp4Group + 2 * j;
        const uint8_t byte = prow[k / 2];
        // e2m1 * e4m3 is exact in f32 (<= 6 significant bits); the scalar step rounds once.
        const float lo = e2m1[byte & 0xFu] * bs, hi = e2m1[byte >> 4] * bs;
        if constexpr (kDivide) {
          out.put(n, k, lo / tensor_scale);
          out.put(n, k + 1, hi / tensor_scale);
        } else {
          out.put(n, k, lo * tensor_scale);
          out.put(n, k + 1, hi * tensor_scale);
        }
      }
    }
  }
  return Status::Ok();
}

// The group size from the options and the number of scale rows (see WeightQuantOptions).
StatusOr<int64_t> resolve_group_size(const WeightQuantOptions& opt, int64_t K, int64_t N, const TensorView& scales,
                                     const std::string& scales_name) {
  const int64_t rows = scales.size(0);
  if (opt.group_size == -1) {
    if (rows != 1) {
      return invalid_argument(fmt::format("{}: group_size -1 (one group over K) expects shape [1, {}], got {}",
                                          scales_name, N, scales.shape_string()));
    }
    return K;
  }
  if (opt.group_size > 0) {
    const int64_t want = *checked::ceil_div(K, opt.group_size);
    if (rows != want) {
      return invalid_argument(fmt::format("{}: group_size {} over K = {} expects shape [{}, {}], got {}", scales_name,
                                          opt.group_size, K, want, N, scales.shape_string()));
    }
    return opt.group_size;
  }
  if (opt.group_size < -1) {
    return invalid_argument(
        fmt::format("group_size {}: expected -1 (one group), 0 (infer) or a positive size", opt.group_size));
  }
  if (rows <= 0 || K % rows != 0) {
    return invalid_argument(fmt::format(
        "{}: cannot infer the group size: K = {} is not a multiple of its {} rows (shape {}); set group_size",
        scales_name, K, rows, scales.shape_string()));
  }
  return K / rows;
}

// Common GPTQ / AWQ preparation: validates scales / qzeros, unpacks them into per-group
// float scales and int zeros [groups, N], and resolves the group of every input row.
struct Int4Groups {
  int64_t groups = 0;
  std::vector<float> scale;     // [groups, N]
  std::vector<int32_t> zero;    // [groups, N], the real zero point
  std::vector<int32_t> of_row;  // [K], group of input row k
};

// `column_of_nibble(i)`: which column of its 8-column pack nibble i of a qzeros word holds.
template <class ColumnOfNibble>
StatusOr<Int4Groups> load_int4_groups(const Layer& l, int64_t N, int64_t K, const WeightQuantOptions& opt,
                                      int32_t zero_offset, bool use_g_idx, ColumnOfNibble column_of_nibble) {
  MLAKV_ASSIGN_OR_RETURN(const TensorView s, l.need("scales"));
  MLAKV_ASSIGN_OR_RETURN(const TensorView z, l.need("qzeros"));
  const std::string sname = l.name("scales"), zname = l.name("qzeros");
  MLAKV_RETURN_IF_ERROR(check_tensor(s, sname, {{DType::kF16}, {-1, N}, Strides::kContiguous}, Device::cpu()));
  std::optional<TensorView> g_idx = use_g_idx ? l.src.find(l.name("g_idx")) : std::nullopt;
  // With g_idx the group size is only needed when the caller states one (then checked).
  int64_t G = 0;
  if (!g_idx || opt.group_size != 0) {
    MLAKV_ASSIGN_OR_RETURN(G, resolve_group_size(opt, K, N, s, sname));
  }
  Int4Groups out;
  out.groups = s.size(0);
  if (out.groups <= 0) {
    return invalid_argument(fmt::format("{}: expected at least one group row, got shape {}", sname, s.shape_string()));
  }
  MLAKV_RETURN_IF_ERROR(
      check_tensor(z, zname, {{DType::kI32}, {out.groups, N / kInt4PerWord}, Strides::kContiguous}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_finite_scales(s, sname));

  out.of_row.resize(static_cast<std::size_t>(K));
  if (g_idx) {
    const std::string gname = l.name("g_idx");
    MLAKV_RETURN_IF_ERROR(check_tensor(*g_idx, gname, {{DType::kI32}, {K}, Strides::kContiguous}, Device::cpu()));
    const auto* b = g_idx->ptr<const uint8_t>();
    for (int64_t k = 0; k < K; ++k) {
      const auto g = static_cast<int32_t>(load_u32(b, k));
      if (g < 0 || g >= out.groups) {
        return out_of_range(fmt::format("{}: element [{}] is {}, outside [0, {}) ({} has {} groups)", gname, k, g,
                                        out.groups, sname, out.groups));
      }
      out.of_row[static_cast<std::size_t>(k)] = g;
    }
  } else {
    for (int64_t k = 0; k < K; ++k) out.of_row[static_cast<std::size_t>(k)] = static_cast<int32_t>(k / G);
  }

  const std::size_t cells = static_cast<std::size_t>(out.groups * N);
  out.scale.resize(cells);
  out.zero.resize(cells);
  for (std::size_t i = 0; i < cells; ++i) out.scale[i] = load_float(s, static_cast<int64_t>(i));
  const auto* zb = z.ptr<const uint8_t>();
  const int64_t words = N / kInt4PerWord;
  for (int64_t g = 0; g < out.groups; ++g) {
    for (int64_t c = 0; c < words; ++c) {
      const uint32_t word = load_u32(zb, g * words + c);
      for (int i = 0; i < 8; ++i) {
        const int64_t n = c * kInt4PerWord + column_of_nibble(i);
        out.zero[static_cast<std::size_t>(g * N + n)] = static_cast<int32_t>((word >> (4 * i)) & 0xFu) + zero_offset;
      }
    }
  }
  return out;
}

Status check_int4_options(const Layer& l, int64_t N, int64_t K, const WeightQuantOptions& opt) {
  if (opt.bits != 4) {
    return unimplemented(fmt::format("{}qweight: {}-bit {} is not supported (only 4-bit)", l.prefix, opt.bits,
                                     weight_encoding_name(l.encoding)));
  }
  if (N % kInt4PerWord != 0) {
    return invalid_argument(fmt::format("{}qzeros: N = {} is not a multiple of 8, which 4-bit {} packing needs",
                                        l.prefix, N, weight_encoding_name(l.encoding)));
  }
  if (l.encoding == WeightEncoding::kGptq && K % kInt4PerWord != 0) {
    return invalid_argument(
        fmt::format("{}qweight: K = {} is not a multiple of 8, which 4-bit GPTQ packing needs", l.prefix, K));
  }
  return Status::Ok();
}

template <class Sink>
Status decode_gptq(const Layer& l, int64_t N, int64_t K, const WeightQuantOptions& opt, Sink& out) {
  MLAKV_RETURN_IF_ERROR(check_int4_options(l, N, K, opt));
  MLAKV_ASSIGN_OR_RETURN(const TensorView w, l.need("qweight"));
  MLAKV_RETURN_IF_ERROR(
      check_tensor(w, l.name("qweight"), {{DType::kI32}, {K / kInt4PerWord, N}, Strides::kContiguous}, Device::cpu()));
  const int32_t zero_offset = opt.gptq_format == GptqFormat::kV1 ? 1 : 0;
  MLAKV_ASSIGN_OR_RETURN(const Int4Groups grp,
                         load_int4_groups(l, N, K, opt, zero_offset, /*use_g_idx=*/true, [](int i) { return i; }));
  if constexpr (Sink::kValidateOnly) return Status::Ok();
  const auto* qw = w.ptr<const uint8_t>();
  // n outer: the K/8 words of column n sit N apart, and the next n reuses their lines.
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t r = 0; r < K / kInt4PerWord; ++r) {
      const uint32_t word = load_u32(qw, r * N + n);
      for (int i = 0; i < 8; ++i) {
        const int64_t k = r * kInt4PerWord + i;
        const auto cell = static_cast<std::size_t>(grp.of_row[static_cast<std::size_t>(k)] * N + n);
        const auto q = static_cast<int32_t>((word >> (4 * i)) & 0xFu);
        out.put(n, k, static_cast<float>(q - grp.zero[cell]) * grp.scale[cell]);  // exact
      }
    }
  }
  return Status::Ok();
}

template <class Sink>
Status decode_awq(const Layer& l, int64_t N, int64_t K, const WeightQuantOptions& opt, Sink& out) {
  MLAKV_RETURN_IF_ERROR(check_int4_options(l, N, K, opt));
  MLAKV_ASSIGN_OR_RETURN(const TensorView w, l.need("qweight"));
  const int64_t words = N / kInt4PerWord;
  MLAKV_RETURN_IF_ERROR(
      check_tensor(w, l.name("qweight"), {{DType::kI32}, {K, words}, Strides::kContiguous}, Device::cpu()));
  MLAKV_ASSIGN_OR_RETURN(const Int4Groups grp,
                         load_int4_groups(l, N, K, opt, /*zero_offset=*/0, /*use_g_idx=*/false,
                                          [](int i) { return kAwqOrder[static_cast<std::size_t>(i)]; }));
  if constexpr (Sink::kValidateOnly) return Status::Ok();
  std::array<int, 8> nibble_of_column{};
  for (int i = 0; i < 8; ++i) nibble_of_column[static_cast<std::size_t>(kAwqOrder[static_cast<std::size_t>(i)])] = i;
  const auto* qw = w.ptr<const uint8_t>();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t c = n / kInt4PerWord;
    const int shift = 4 * nibble_of_column[static_cast<std::size_t>(n % kInt4PerWord)];
    for (int64_t k = 0; k < K; ++k) {
      const auto cell = static_cast<std::size_t>(grp.of_row[static_cast<std::size_t>(k)] * N + n);
      const auto q = static_cast<int32_t>((load_u32(qw, k * words + c) >> shift) & 0xFu);
      out.put(n, k, static_cast<float>(q - grp.zero[cell]) * grp.scale[cell]);  // exact
    }
  }
  return Status::Ok();
}

template <class Sink>
Status decode(const Layer& l, int64_t N, int64_t K, const WeightQuantOptions& opt, Sink& out) {
  switch (l.encoding) {
    case WeightEncoding::kDense: return decode_dense(l, N, K, out);
    case WeightEncoding::kFp8Block: return decode_fp8_block(l, N, K, opt, out);
    case WeightEncoding::kModelOptNvfp4: return decode_nvfp4<false>(l, N, K, out);
    case WeightEncoding::kCompressedTensorsNvfp4: return decode_nvfp4<true>(l, N, K, out);
    case WeightEncoding::kGptq: return decode_gptq(l, N, K, opt, out);
    case WeightEncoding::kAwq: return decode_awq(l, N, K, opt, out);
  }
  return invalid_argument(fmt::format("encoding: unknown id {}", static_cast<int>(l.encoding)));
}

template <class Sink>
Status run(const Layer& l, int64_t N, int64_t K, const WeightQuantOptions& opt, Sink out) {
  MLAKV_RETURN_IF_ERROR(decode(l, N, K, opt, out));
  if (!out.nonfinite) return Status::Ok();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const float v = out.get(n, k);
      if (!std::isfinite(v)) {
        return data_loss(
            fmt::format("{}*: {} weight dequantizes to {} at [{}, {}] (a NaN/Inf in the checkpoint "
                        "or an overflow of the output dtype)",
                        l.prefix, weight_encoding_name(l.encoding), v, n, k));
      }
    }
  }
  return Status::Ok();
}

// ---- quantization_config parsing ----------------------------------------------------------
StatusOr<std::optional<int64_t>> json_int(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<int64_t>();
  if (!it->is_number_integer()) {
    return invalid_argument(
        fmt::format("quantization_config.{}: expected an integer, got {}", key, json_util::shown(*it)));
  }
  return std::optional<int64_t>(it->get<int64_t>());
}

StatusOr<std::optional<std::string>> json_string(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) {
    return invalid_argument(
        fmt::format("quantization_config.{}: expected a string, got {}", key, json_util::shown(*it)));
  }
  std::string s = it->get<std::string>();
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return std::optional<std::string>(std::move(s));
}

// First present key among `keys`.
StatusOr<std::optional<int64_t>> json_int_any(const json& j, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    MLAKV_ASSIGN_OR_RETURN(std::optional<int64_t> v, json_int(j, key));
    if (v) return v;
  }
  return std::optional<int64_t>();
}

Status read_int4_fields(const json& q, std::initializer_list<const char*> bits_keys,
                        std::initializer_list<const char*> group_keys, WeightQuantOptions& opt) {
  MLAKV_ASSIGN_OR_RETURN(std::optional<int64_t> bits, json_int_any(q, bits_keys));
  MLAKV_ASSIGN_OR_RETURN(std::optional<int64_t> group, json_int_any(q, group_keys));
  if (bits) {
    if (*bits < 1 || *bits > 64) {
      return invalid_argument(fmt::format("quantization_config: bits {} is outside [1, 64]", *bits));
    }
    opt.bits = static_cast<int>(*bits);
  }
  if (group) opt.group_size = *group <= 0 ? -1 : *group;
  return Status::Ok();
}

}  // namespace

std::string_view weight_encoding_name(WeightEncoding e) {
  switch (e) {
    case WeightEncoding::kDense: return "dense";
    case WeightEncoding::kFp8Block: return "fp8_block";
    case WeightEncoding::kModelOptNvfp4: return "modelopt_nvfp4";
    case WeightEncoding::kCompressedTensorsNvfp4: return "compressed_tensors_nvfp4";
    case WeightEncoding::kGptq: return "gptq";
    case WeightEncoding::kAwq: return "awq";
  }
  return "?";
}

namespace {
StatusOr<WeightQuantOptions> parse_quant_options(std::string_view quantization_config_json) {
  json_util::ParseOptions po;
  po.require_object = false;
  MLAKV_ASSIGN_OR_RETURN(json j, json_util::parse(quantization_config_json, "quantization_config", po));
  if (j.is_object() && j.contains("quantization_config")) {
    json inner = std::move(j["quantization_config"]);
    j = std::move(inner);
  }
  if (j.is_null()) return WeightQuantOptions{};  // "quantization_config": null: not quantized
  if (!j.is_object()) return invalid_argument("quantization_config: expected a JSON object");

  WeightQuantOptions opt;
  MLAKV_ASSIGN_OR_RETURN(std::optional<std::string> method, json_string(j, "quant_method"));
  if (!method) return invalid_argument("quantization_config: no quant_method");
  if (*method == "fp8") {
    auto it = j.find("weight_block_size");
    if (it != j.end() && !it->is_null()) {
      auto extent_ok = [](const json& v) {
        return v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= kMaxFp8BlockExtent;
      };
      if (!it->is_array() || it->size() != 2 || !extent_ok((*it)[0]) || !extent_ok((*it)[1])) {
        return invalid_argument(
            fmt::format("quantization_config.weight_block_size: expected two integers in [1, {}], got {}",
                        kMaxFp8BlockExtent, json_util::shown(*it)));
      }
      opt.fp8_block_rows = (*it)[0].get<int64_t>();
      opt.fp8_block_cols = (*it)[1].get<int64_t>();
    }
  } else if (*method == "gptq") {
    MLAKV_RETURN_IF_ERROR(read_int4_fields(j, {"bits"}, {"group_size"}, opt));
    MLAKV_ASSIGN_OR_RETURN(std::optional<std::string> fmt_name, json_string(j, "checkpoint_format"));
    if (!fmt_name) {
      MLAKV_ASSIGN_OR_RETURN(fmt_name, json_string(j, "format"));
    }
    if (!fmt_name || *fmt_name == "gptq") {
      opt.gptq_format = GptqFormat::kV1;
    } else if (*fmt_name == "gptq_v2") {
      opt.gptq_format = GptqFormat::kV2;
    } else {
      return unimplemented(fmt::format(
          "quantization_config.checkpoint_format {}: only \"gptq\" (v1) and \"gptq_v2\" are supported",
          quote_untrusted(*fmt_name)));
    }
  } else if (*method == "awq") {
    MLAKV_RETURN_IF_ERROR(read_int4_fields(j, {"bits", "w_bit"}, {"group_size", "q_group_size"}, opt));
    MLAKV_ASSIGN_OR_RETURN(std::optional<std::string> version, json_string(j, "version"));
    if (version && *version != "gemm") {
      return unimplemented(fmt::format(
          "quantization_config.version {}: only AWQ GEMM packing (qweight [K, N/8]) is supported",
          quote_untrusted(*version)));
    }
  } else if (*method != "modelopt" && *method != "compressed-tensors") {
    return unimplemented(fmt::format(
        "quantization_config.quant_method {}: supported are fp8, gptq, awq, modelopt, compressed-tensors",
        quote_untrusted(*method)));
  }
  return opt;
}
}  // namespace

StatusOr<WeightQuantOptions> parse_weight_quant_options(std::string_view quantization_config_json) {
  try {
    return parse_quant_options(quantization_config_json);
  } catch (const std::exception& e) {  // allocation or a library invariant: never across the API
    return internal_error(fmt::format("quantization_config: reading it failed: {}", e.what()));
  }
}

StatusOr<WeightQuantOptions> load_weight_quant_options(const std::string& path) {
  return load_checkpoint_quant_options(path);
}

StatusOr<WeightQuantOptions> parse_checkpoint_quant_options(std::string_view config_json, std::string_view source) {
  try {
    // The nesting-limited parser of untrusted JSON (docs/security.md); a config.json is an object.
    MLAKV_ASSIGN_OR_RETURN(const json j, json_util::parse(config_json, source));
    const auto it = j.find("quantization_config");
    if (it == j.end() || it->is_null()) return WeightQuantOptions{};
    StatusOr<WeightQuantOptions> q = parse_weight_quant_options(it->dump());
    if (!q.ok()) return q.status().with_context(source);
    return q;
  } catch (const std::exception& e) {
    return internal_error(fmt::format("{}: reading quantization_config failed: {}", source, e.what()));
  }
}

StatusOr<WeightQuantOptions> load_checkpoint_quant_options(const std::string& path) {
  MLAKV_ASSIGN_OR_RETURN(const io::ConfigJson c, io::read_config_json(path));
  return parse_checkpoint_quant_options(c.text, c.file);
}

StatusOr<WeightEncoding> detect_weight_encoding(const TensorSource& src, std::string_view prefix) {
  const std::string p = normalize_prefix(prefix);
  if (std::optional<TensorView> w = src.find(p + "weight")) {
    switch (w->dtype) {
      case DType::kBF16:
      case DType::kF16:
      case DType::kF32: return WeightEncoding::kDense;
      case DType::kU8: return WeightEncoding::kModelOptNvfp4;
      case DType::kF8E4M3:
        if (!src.find(p + "weight_scale_inv") && src.find(p + "weight_scale")) {
          return unimplemented(
              fmt::format("{}weight: f8_e4m3 with {}weight_scale (per-tensor / per-channel fp8) is not supported; "
                          "block fp8 stores weight_scale_inv",
                          p, p));
        }
        return WeightEncoding::kFp8Block;
      default:
        return invalid_argument(fmt::format(
            "{}weight: dtype {} matches no supported encoding (dense bf16/f16/f32, f8_e4m3 block fp8, u8 NVFP4)", p,
            dtype_name(w->dtype)));
    }
  }
  if (std::optional<TensorView> w = src.find(p + "weight_packed")) {
    if (w->dtype == DType::kU8) return WeightEncoding::kCompressedTensorsNvfp4;
    return unimplemented(fmt::format(
        "{}weight_packed: dtype {} is not compressed-tensors NVFP4 (u8); integer pack-quantized layouts are not "
        "supported",
        p, dtype_name(w->dtype)));
  }
  if (std::optional<TensorView> qw = src.find(p + "qweight")) {
    std::optional<TensorView> scales = src.find(p + "scales");
    if (!scales) {
      return not_found(fmt::format("{}scales: missing from {} (needed with {}qweight); tensors under '{}': {}", p,
                                   src.describe(), p, p, names_under(src, p)));
    }
    if (qw->ndim == 2 && scales->ndim == 2 && scales->size(1) > 0) {
      if (qw->size(1) == scales->size(1)) return WeightEncoding::kGptq;
      if (qw->size(1) * kInt4PerWord == scales->size(1)) return WeightEncoding::kAwq;
    }
    return invalid_argument(
        fmt::format("{}qweight {} with {}scales {} matches neither GPTQ (qweight [K/8, N], scales [groups, N]) nor AWQ "
                    "(qweight [K, N/8], scales [groups, N])",
                    p, qw->shape_string(), p, scales->shape_string()));
  }
  return not_found(fmt::format(
      "no weight storage under '{}' in {}: looked for {}weight, {}weight_packed and {}qweight; tensors under the "
      "prefix: {}",
      p, src.describe(), p, p, p, names_under(src, p)));
}

namespace {

// The checks and the encoding (given or detected) both entry points below start with.
StatusOr<WeightEncoding> weight_encoding_for(const TensorSource& src, std::string_view prefix, int64_t N, int64_t K,
                                             const WeightQuantOptions& opt) {
  if (N <= 0 || K <= 0) {
    return invalid_argument(fmt::format("N = {}, K = {}: both must be positive", N, K));
  }
  if (opt.encoding) return *opt.encoding;
  return detect_weight_encoding(src, prefix);
}

}  // namespace

Status dequantize_weight(const TensorSource& src, std::string_view prefix, int64_t N, int64_t K,
                         const WeightQuantOptions& opt, const TensorView& out) {
  if (N > 0 && K > 0) {
    MLAKV_RETURN_IF_ERROR(check_tensor(out, "out", {{DType::kF32, DType::kBF16}, {N, K}}, Device::cpu()));
    if (!out.is_contiguous()) {
      return invalid_argument(fmt::format("out: expected a contiguous [{}, {}] tensor", N, K));
    }
  }
  MLAKV_ASSIGN_OR_RETURN(const WeightEncoding enc, weight_encoding_for(src, prefix, N, K, opt));
  const Layer layer{src, normalize_prefix(prefix), enc};
  try {
    if (out.dtype == DType::kF32) return run(layer, N, K, opt, F32Sink{out.ptr<float>(), K});
    return run(layer, N, K, opt, Bf16Sink{out.ptr<uint16_t>(), K});
  } catch (const std::bad_alloc&) {  // the GPTQ / AWQ group tables
    return resource_exhausted(fmt::format("{}: out of memory dequantizing [{}, {}]", layer.prefix, N, K));
  }
}

Status check_weight_storage(const TensorSource& src, std::string_view prefix, int64_t N, int64_t K,
                            const WeightQuantOptions& opt) {
  MLAKV_ASSIGN_OR_RETURN(const WeightEncoding enc, weight_encoding_for(src, prefix, N, K, opt));
  const Layer layer{src, normalize_prefix(prefix), enc};
  try {
    return run(layer, N, K, opt, CheckOnlySink{});
  } catch (const std::bad_alloc&) {
    return resource_exhausted(fmt::format("{}: out of memory checking [{}, {}]", layer.prefix, N, K));
  }
}

Status dequantize_kv_b_proj(const TensorSource& src, std::string_view prefix, const MlaGeometry& geo,
                            const WeightQuantOptions& opt, const TensorView& out) {
  if (geo.num_heads <= 0 || geo.qk_nope_head_dim <= 0 || geo.v_head_dim <= 0 || geo.kv_lora_rank <= 0) {
    return invalid_argument(fmt::format(
        "kv_b_proj geometry: num_heads {}, qk_nope_head_dim {}, v_head_dim {}, kv_lora_rank {} must all be positive",
        geo.num_heads, geo.qk_nope_head_dim, geo.v_head_dim, geo.kv_lora_rank));
  }
  const std::optional<int64_t> pv = checked::add<int64_t>(geo.qk_nope_head_dim, geo.v_head_dim);
  if (!pv || !checked::product({int64_t{geo.num_heads}, *pv, int64_t{geo.kv_lora_rank}})) {
    return invalid_argument(fmt::format("kv_b_proj geometry: {} heads x ({} + {}) x {} overflows 64 bits", geo.num_heads,
                                        geo.qk_nope_head_dim, geo.v_head_dim, geo.kv_lora_rank));
  }
  const int64_t N = geo.kv_b_rows(), K = geo.kv_lora_rank;
  if (out.ndim != 3) return dequantize_weight(src, prefix, N, K, opt, out);
  MLAKV_RETURN_IF_ERROR(
      check_tensor(out, "out", {{DType::kF32, DType::kBF16}, {geo.num_heads, geo.qk_nope_head_dim + geo.v_head_dim, K}},
                   Device::cpu()));
  if (!out.is_contiguous()) {
    return invalid_argument(fmt::format("out: expected a contiguous tensor, got shape {}", out.shape_string()));
  }
  return dequantize_weight(src, prefix, N, K, opt, TensorView::contiguous(out.data, out.dtype, {N, K}));
}

}  // namespace mlakv
