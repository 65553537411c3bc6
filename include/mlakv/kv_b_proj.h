// Dequantizes a linear layer's weight from the checkpoint encodings found in MLA
// checkpoints into a dense [N, K] matrix (N = out_features, K = in_features).
//
// Written for `kv_b_proj` (docs/reference.md sections 1, 6, 7): its weight is
// [H*(P+V), L], viewed [H, P+V, L] the first P rows of each head are W_UK, the last
// V rows W_UV. The dense matrix is the transient scratch from which the absorbed pair
// W_UK_T / W_UV is built; nothing here is kept. The code is generic: any linear layer
// stored in one of these encodings dequantizes the same way.
//
// Encodings (tensor names are relative to the layer prefix, e.g.
// "model.layers.3.self_attn.kv_b_proj."):
//   kDense                  weight              bf16/f16/f32 [N, K]
//   kFp8Block  (DeepSeek)   weight              e4m3 [N, K]
//                           weight_scale_inv    f32 [ceil(N/bn), ceil(K/bk)], bn = bk = 128
//                           W[n,k] = e4m3(q[n,k]) * S[n/bn, k/bk]   (a multiplier despite the name)
//   kModelOptNvfp4          weight              u8 [N, K/2], low nibble = even k
//                           weight_scale        e4m3 [N, K/16]
//                           weight_scale_2      f32 scalar ([] or [1])
//                           W[n,k] = e2m1 * e4m3(scale[n,k/16]) * scale_2
//   kCompressedTensorsNvfp4 weight_packed       u8 [N, K/2], low nibble = even k
//                           weight_scale        e4m3 [N, K/16]
//                           weight_global_scale f32 scalar, a DIVISOR
//                           W[n,k] = e2m1 * e4m3(scale[n,k/16]) / global
//   kGptq (4-bit)           qweight             i32 [K/8, N]: bits [4i, 4i+4) of qweight[r, n] = q[n, 8r+i]
//                           qzeros              i32 [ceil(K/G), N/8]: bits [4j, 4j+4) of qzeros[g, c] = z[g, 8c+j]
//                           scales              f16 [ceil(K/G), N]
//                           g_idx (optional)    i32 [K], group of input row k (default k / G;
//                                               with g_idx, G need not be known)
//                           W[n,k] = (q - z) * s with z = stored + 1 (v1, "gptq") or stored (v2, "gptq_v2")
//   kAwq (4-bit, GEMM)      qweight             i32 [K, N/8]: bits [4i, 4i+4) of qweight[k, c] = q[8c + order[i], k]
//                           qzeros              i32 [K/G, N/8], same packing as qweight
//                           scales              f16 [K/G, N]
//                           order = {0, 2, 4, 6, 1, 3, 5, 7};  W[n,k] = (q - z) * s
// Float scale tensors (weight_scale_inv, weight_scale_2, weight_global_scale) may also
// be bf16. The sources for each layout are cited in src/weights/kv_b_proj.cc.
//
// Numerics: GPTQ/AWQ values and e2m1 * e4m3 products are exact in f32; the one f32
// multiply (fp8 block, ModelOpt) or division (compressed-tensors) that follows is the
// only rounding, so f32 output is the correctly rounded value. bf16 output rounds that
// f32 value once more (round to nearest even).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "mlakv/mla_geometry.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"
#include "mlakv/tensor_source.h"

namespace mlakv {

enum class WeightEncoding : uint8_t {
  kDense,
  kFp8Block,
  kModelOptNvfp4,
  kCompressedTensorsNvfp4,
  kGptq,
  kAwq,
};
// "dense", "fp8_block", "modelopt_nvfp4", "compressed_tensors_nvfp4", "gptq", "awq".
std::string_view weight_encoding_name(WeightEncoding e);

// How GPTQ stores its zero points (quantization_config.checkpoint_format).
enum class GptqFormat : uint8_t {
  kV1,  // "gptq" (AutoGPTQ and most published checkpoints): stored zero = real zero - 1
  kV2,  // "gptq_v2" (GPTQModel): stored zero = real zero
};

// What the checkpoint's quantization_config says and the tensors cannot: every field
// has a default that is right for the common checkpoints.
struct WeightQuantOptions {
  // nullopt: detect_weight_encoding decides (recommended: layers listed in a config's
  // ignore / modules_to_not_convert stay dense even in a quantized checkpoint).
  std::optional<WeightEncoding> encoding;
  // GPTQ / AWQ bit width; only 4 is implemented (other values fail with kUnimplemented).
  int bits = 4;
  // GPTQ / AWQ group size G: 0 infers G = K / scales.shape[0] (K must divide evenly);
  // -1 means one group spanning all of K (a config's group_size -1); > 0 is checked
  // against scales.shape[0] == ceil(K / G).
  int64_t group_size = 0;
  GptqFormat gptq_format = GptqFormat::kV1;
  // fp8 block shape (quantization_config.weight_block_size), rows x columns; a config
  // may give at most kMaxFp8BlockExtent for each.
  int64_t fp8_block_rows = 128;
  int64_t fp8_block_cols = 128;
};

inline constexpr int64_t kMaxFp8BlockExtent = int64_t{1} << 20;

// Reads the options from a Hugging Face `quantization_config` object (the JSON text
// of that object, or of a whole config.json holding one). Understands quant_method
// "fp8" (weight_block_size), "gptq" (bits, group_size, checkpoint_format), "awq"
// (bits / w_bit, group_size / q_group_size; version must be "gemm"), "modelopt" and
// "compressed-tensors" (nothing to read). Never forces `encoding`. A null object (the
// text `null`, or a config.json with `"quantization_config": null`) means "not
// quantized" and returns the defaults, as load_checkpoint_quant_options does. Fails on
// malformed JSON, a missing or unknown quant_method, a field of the wrong type, a GPTQ
// checkpoint_format other than gptq / gptq_v2, or an AWQ version other than GEMM.
StatusOr<WeightQuantOptions> parse_weight_quant_options(std::string_view quantization_config_json);
// The options of a checkpoint: `path` is its config.json or the directory holding it.
// Defaults when config.json has no (or a null) quantization_config; errors name the file.
StatusOr<WeightQuantOptions> load_weight_quant_options(const std::string& path);

// THE reader of a checkpoint's quantization settings (every command and loader uses it).
// `config_json` is a whole config.json; a `quantization_config` that is absent or null
// means the same thing: no settings, the defaults above (each layer's encoding is still
// detected from its tensors, so a dense checkpoint loads). An object is read by
// parse_weight_quant_options, its errors prefixed with `source` (a path). Fails with
// kInvalidArgument naming `source` when the text is not a JSON object.
StatusOr<WeightQuantOptions> parse_checkpoint_quant_options(std::string_view config_json, std::string_view source);
// The same from `path`, a config.json file or a checkpoint directory holding one
// (kNotFound / kIoError from reading it).
StatusOr<WeightQuantOptions> load_checkpoint_quant_options(const std::string& path);

// Which encoding the layer under `prefix` uses, from whichever storage tensor exists:
// `weight` (its dtype decides: bf16/f16/f32 dense, e4m3 fp8 block, u8 ModelOpt NVFP4),
// `weight_packed` (u8: compressed-tensors NVFP4) or `qweight` (GPTQ when
// qweight.shape[1] == scales.shape[1], AWQ when qweight.shape[1] * 8 == scales.shape[1]).
// A prefix without a trailing '.' gets one. Fails with kNotFound listing the tensor
// names found under the prefix when no storage tensor exists, and with
// kInvalidArgument / kUnimplemented naming the tensor for storage no encoding matches
// (e.g. an i32 weight_packed, or per-tensor fp8 with `weight_scale`).
StatusOr<WeightEncoding> detect_weight_encoding(const TensorSource& src, std::string_view prefix);

// Dequantizes the layer under `prefix` into `out`.
//   N, K   the dense weight's [out_features, in_features] (kv_b_proj: H*(P+V), L)
//   out    [N, K] f32 or bf16, CPU, contiguous
// Every tensor's dtype and shape is checked against N and K first; an error names the
// tensor (prefix + name) with the expected and actual shape or dtype, and `out` is
// untouched. Fails with kOutOfRange for a g_idx entry outside [0, groups); with
// kDataLoss, also before writing, for a non-finite scale, an e4m3 NaN scale code, or a
// per-tensor scale that is not finite and > 0; and with kDataLoss when a dequantized
// value is NaN/Inf (a NaN weight code, an overflow of the output dtype): the message
// gives its [n, k], and `out` is then partly written.
Status dequantize_weight(const TensorSource& src, std::string_view prefix, int64_t N, int64_t K,
                         const WeightQuantOptions& opt, const TensorView& out);
// Every check dequantize_weight makes before writing, without an output: callers run it
// before allocating the [N, K] result, so a config's geometry cannot make them allocate
// more than the tensors actually present justify.
Status check_weight_storage(const TensorSource& src, std::string_view prefix, int64_t N, int64_t K,
                            const WeightQuantOptions& opt);

// dequantize_weight for kv_b_proj: `out` is [H*(P+V), L] or the per-head view
// [H, P+V, L] (f32 or bf16, CPU, contiguous). Of `geo` only H (num_heads: the heads the
// source holds, a tensor-parallel shard's when it holds one shard), P, V and L are read;
// a ModelConfig passes as its geometry.
Status dequantize_kv_b_proj(const TensorSource& src, std::string_view prefix, const MlaGeometry& geo,
                            const WeightQuantOptions& opt, const TensorView& out);

}  // namespace mlakv
