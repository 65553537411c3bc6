// One MLA attention layer on the CPU: hidden states in, attention output out, with the
// latent KV cache in any record format (docs/layer.md; docs/reference.md section 1).
//
// Per token x at position p (x is the attention input, i.e. after input_layernorm):
//   q      = q_b_proj(rmsnorm(q_a_proj(x)))  or  q_proj(x)                 [H, P+R]
//   kv     = kv_a_proj_with_mqa(x) = [c (L) | k_pe (R)]
//   latent = rmsnorm(c)   (kv_c_normed)          k_rot = rope(k_pe, p)
//   q_lat[h] = q[h, :P] @ W_UK_T[h]              q_rot[h] = rope(q[h, P:], p)
//   cache  <- [latent | k_rot] in the layer's record format and outer scale
//   o_lat  = mla_attention_cpu([q_lat | q_rot], cache)  (causal, softmax_scale of the config)
//   out    = o_proj(concat_h o_lat[h] @ W_UV[h])                             [D]
// Biases (attention_bias checkpoints) are added after q_a_proj, kv_a_proj_with_mqa and
// o_proj, as in transformers. RMSNorm is x / sqrt(mean(x^2) + eps) * weight with
// ModelConfig::q_norm_eps / kv_norm_eps (transformers uses 1e-6 for both norms).
// RoPE is src/core/rope.h: k_rot is cached in the model's own layout (pairwise for
// DeepSeek/Kimi/GLM, vLLM's byte layout), so the cache bytes match vLLM's; the layer's
// OUTPUT does not depend on that choice.
//
// Arithmetic: weights and activations are float32; every matmul accumulates in float64
// and rounds once (W_UV and o_proj together: the per-head W_UV products stay float64),
// so the layer is at least as accurate as a float32 framework (the HF parity tests
// check this against transformers in float32 and float64).
//
// All functions validate their arguments and return a Status naming the problem; none
// throws or aborts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mlakv/cache.h"
#include "mlakv/kv_b_proj.h"
#include "mlakv/latent_transform.h"
#include "mlakv/mla_geometry.h"
#include "mlakv/model_config.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"
#include "mlakv/tensor_source.h"

namespace mlakv {

class ThreadPool;

// One layer's weights, dequantized to float32. Linear weights are row-major [out, in]
// like nn.Linear.weight.
struct MlaLayerWeights {
  int layer = -1;
  MlaGeometry geometry;  // D, H, q_lora, L, P, R, V of the vectors below

  std::vector<float> q_a_proj;   // [q_lora, D]      (q_lora > 0)
  std::vector<float> q_a_bias;   // [q_lora] or empty
  std::vector<float> q_a_norm;   // [q_lora]         (q_lora > 0)
  std::vector<float> q_b_proj;   // [H*(P+R), q_lora] (q_lora > 0)
  std::vector<float> q_proj;     // [H*(P+R), D]     (q_lora == 0)
  std::vector<float> kv_a_proj;  // [L+R, D]
  std::vector<float> kv_a_bias;  // [L+R] or empty
  std::vector<float> kv_a_norm;  // [L]
  std::vector<float> w_uk_t;     // [H, P, L]  absorbed: q_lat[h] = q_nope[h] @ w_uk_t[h]
  std::vector<float> w_uv;       // [H, L, V]  absorbed: o[h] = o_lat[h] @ w_uv[h]
  std::vector<float> o_proj;     // [D, H*V]
  std::vector<float> o_bias;     // [D] or empty

  std::size_t bytes() const;  // all the vectors above
};

struct MlaLoadOptions {
  // Checkpoint encodings (detected per projection unless forced; fp8 block shape, GPTQ
  // group size...): load_checkpoint_quant_options(checkpoint) reads them for a checkpoint.
  WeightQuantOptions quant;
  // Tensor name prefix; empty means "model.layers.<layer>.self_attn.".
  std::string prefix;
};

// Loads layer `layer` (0 <= layer < cfg.cache_layers()) of `src`: every projection goes
// through dequantize_weight (dense bf16/f16/f32, DeepSeek fp8 block, ModelOpt and
// compressed-tensors NVFP4, GPTQ, AWQ), the norms and biases may be f32, bf16 or f16.
// Biases are read when present (q_a_proj.bias, kv_a_proj_with_mqa.bias, o_proj.bias).
// Errors: kInvalidArgument for an invalid config (or one whose geometry the layer cannot
// run: odd R, D/H/L/P/R/V out of range) and for a tensor whose shape or dtype does not
// match the config (the message names the tensor, expected and actual shape); kNotFound
// naming the missing tensor and the source; kDataLoss for a non-finite weight, norm or
// bias value. Nothing is returned partially.
StatusOr<MlaLayerWeights> load_mla_layer(const TensorSource& src, const ModelConfig& cfg, int layer,
                                         const MlaLoadOptions& opt = {});

// Checks that `w` holds a layer of `cfg`: the geometry fields agree, the config is one
// the layer can run, and every weight vector has its expected size (optional biases may
// be empty). The message names the mismatching field or weight.
Status validate_mla_layer_weights(const MlaLayerWeights& w, const ModelConfig& cfg);

// The absorbed pair from a dense kv_b_proj (the simple construction this layer uses;
// include/mlakv/absorb.h is the allocator-aware one for serving):
//   kv_b   [H*(P+V), L] f32, viewed [H, P+V, L]: rows [0, P) of head h are W_UK, [P, P+V) W_UV
//   w_uk_t [H, P, L]: w_uk_t[h][p][l] = kv_b[h*(P+V) + p][l]
//   w_uv   [H, L, V]: w_uv[h][l][v]   = kv_b[h*(P+V) + P + v][l]
// H, P, V, L are those of `geo` (a ModelConfig passes as its geometry). Fails on
// non-positive sizes or a buffer of the wrong size.
Status absorb_kv_b_proj(const std::vector<float>& kv_b, const MlaGeometry& geo, std::vector<float>& w_uk_t,
                        std::vector<float>& w_uv);

// Stage 1, no cache involved: projections, norms, RoPE and q absorption for T tokens.
//   hidden    [T, D] f32, CPU, contiguous rows
//   positions [T] i64, each >= 0
//   q         [T, H, L+R] f32 out: q_lat (L) then rotated q_pe (R) per head
//   latent    [T, L] f32 out: kv_c_normed
//   rope      [T, R] f32 out: rotated k_pe
// `cfg` supplies RoPE and the norm eps; its geometry must match `w`.
Status mla_layer_project(const MlaLayerWeights& w, const ModelConfig& cfg, const TensorView& hidden,
                         const TensorView& positions, const TensorView& q, const TensorView& latent,
                         const TensorView& rope, ThreadPool* pool = nullptr);

// Stage 3: attn_latent [T, H, L] f32 (attention output per head) -> out [T, D] f32.
Status mla_layer_output(const MlaLayerWeights& w, const TensorView& attn_latent, const TensorView& out,
                        ThreadPool* pool = nullptr);

// Intermediates of one mla_layer_forward call (for calibration capture and debugging).
struct MlaLayerTrace {
  std::vector<float> kv_c_normed;  // [T, L] before the cache rounds it
  std::vector<float> k_pe;         // [T, R] rotated, cache layout
  std::vector<float> q;            // [T, H, L+R] absorbed query
  std::vector<float> attn_latent;  // [T, H, L] attention output before W_UV
};

struct MlaForwardOptions {
  ThreadPool* pool = nullptr;
  int num_splits = 1;              // split-KV partitions of the attention (>= 1)
  MlaLayerTrace* trace = nullptr;  // filled when not null (kv_c_normed and k_pe untransformed)
  // The mlakv recipe (include/mlakv/latent_transform.h): the latent and k_pe are written
  // transformed and q_pe is rotated like k_pe; `w` must have been folded with the same
  // layer (fold_latent_transform), and the cache layer's outer scale should be its s_l.
  const LatentTransformKernel* transform = nullptr;
};

// Folds one layer's latent transform into `w` (once, before the forward calls that use
// it): every row r of W_UK (w_uk_t[h][p][:]) and of W_UV^T (w_uv[h][:][v]) becomes
// H D^-1 r (computed in float64, rounded once), and o_bias gains o_proj (W_UV^T mu) per
// head (created when empty). Fails on weights of another shape than L = 512 or an invalid
// transform; `w` is unchanged on error.
Status fold_latent_transform(MlaLayerWeights& w, const LatentTransformLayer& t);

// The full layer for T new tokens of sequence `seq`: they must be the LAST T tokens of
// `seq` in `cache` (the caller appends them with cache.append(seq, T) once per step and
// then runs every layer), so one call covers a prefill chunk (T > 1, causal within the
// chunk and over everything cached before) and a decode step (T = 1) alike.
//   cache_layer  the cache layer to write and read (its record format and outer scale
//                apply); the cache must be L = 512, R = 64 (what attention supports)
//   hidden [T, D] f32, positions [T] i64 (>= 0), out [T, D] f32 (may not alias hidden)
// On a validation error nothing is written; an error while writing the cache (a
// non-finite latent) leaves the cache unchanged and `out` unspecified.
Status mla_layer_forward(const MlaLayerWeights& w, const ModelConfig& cfg, PagedKvCache& cache, int cache_layer,
                         SeqId seq, const TensorView& hidden, const TensorView& positions, const TensorView& out,
                         const MlaForwardOptions& opt = {});

}  // namespace mlakv
