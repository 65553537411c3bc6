// A whole DeepSeek-V3-family model on the CPU: load a Hugging Face checkpoint directory
// and run prefill chunks and decode steps over the paged latent cache (any record
// format, per-layer outer scales) or over an unquantized float32 reference cache.
// docs/model.md; docs/reference.md sections 1, 2 and 11.
//
// Supported model_type: deepseek_v2, deepseek_v3, kimi_k2 (V3 architecture),
// glm4_moe_lite, and deepseek_v32 / glm_moe_dsa with DENSE attention (the DSA indexer
// is not run: while a sequence is at most index_topk tokens long dense attention is what
// DSA computes, past that it is not - see Model::notes() and dense_beyond_topk()).
//
// The network (transformers 5, modeling_deepseek_v3.py / modeling_deepseek_v2.py):
//   h = embed_tokens[token]                                                   [T, D]
//   per decoder layer i:
//     h += mla_attention(rmsnorm(h; input_layernorm))
//     h += mlp_i(rmsnorm(h; post_attention_layernorm))
//          mlp_i = dense SwiGLU down(silu(gate(x)) * up(x)) for dense layers,
//                  MoE for the others: sum_e w_e * expert_e(x) + shared_experts(x)
//   logits = lm_head(rmsnorm(h; model.norm))   (lm_head = embed_tokens when tied)
// The MTP layer (model.layers.<num_hidden_layers>.*) is recognised and not loaded.
//
// Memory: dense weights (f32, bf16, f16) are used in place from the memory-mapped
// safetensors files, in their checkpoint dtype; quantized encodings (fp8 block, NVFP4,
// GPTQ, AWQ; include/mlakv/kv_b_proj.h) are dequantized once to float32 at load and
// owned (ModelMemory::dequantized_bytes). kv_b_proj is never absorbed into a copy: the
// absorbed products q_lat = q_nope W_UK and o = o_lat W_UV^T read its rows directly.
//
// Arithmetic: float32 activations, float32 FMA accumulation (src/model/linear.h); the
// router in float32 as transformers does; RMSNorm and softmax statistics in float64.
//
// Thread safety: a Model owns a thread pool; run one forward call at a time per Model.
// Nothing throws; every failure is a Status naming the problem.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mlakv/cache.h"
#include "mlakv/latent_transform.h"
#include "mlakv/model_config.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"

namespace mlakv {

// ---- architecture (config.json beyond the attention geometry) --------------------

enum class MoeScoring : uint8_t {
  kSoftmax,  // DeepSeek-V2: softmax over all experts, no renormalisation
  kSigmoid,  // DeepSeek-V3 / Kimi K2 / GLM: sigmoid + e_score_correction_bias
};
enum class MoeTopkMethod : uint8_t {
  kGreedy,              // V2 "greedy": the top_k largest scores
  kGroupLimitedGreedy,  // V2 "group_limited_greedy": groups scored by their max
  kNoAuxTc,             // V3: groups scored by the sum of their top-2 biased scores
};

struct MoeRouting {
  MoeScoring scoring = MoeScoring::kSigmoid;
  MoeTopkMethod method = MoeTopkMethod::kNoAuxTc;
  int num_experts = 0;   // n_routed_experts (E)
  int top_k = 0;         // num_experts_per_tok
  int n_group = 1;       // E must be a multiple
  int topk_group = 1;    // groups kept, <= n_group
  bool norm_topk_prob = false;  // V3 only: divide the picked weights by their sum + 1e-20
  double routed_scaling_factor = 1.0;
};

struct ModelArch {
  ModelConfig mla;  // attention geometry, RoPE, norm eps, indexer fields
  int vocab_size = 0;
  int intermediate_size = 0;      // dense MLP layers
  int moe_intermediate_size = 0;  // each routed expert
  int n_shared_experts = 0;       // one MLP of moe_intermediate_size * n_shared_experts (0: none)
  MoeRouting routing;
  std::vector<bool> moe_layer;    // [num_layers]: true for MoE layers
  bool tie_word_embeddings = false;

  int num_moe_layers() const;
};

// config.json -> ModelArch. Reads the MLA part with parse_hf_config, then vocab_size,
// intermediate_size, moe_intermediate_size, n_routed_experts (n_routed_experts or
// num_local_experts), n_shared_experts, num_experts_per_tok, n_group, topk_group,
// norm_topk_prob, routed_scaling_factor, topk_method (V2), first_k_dense_replace /
// mlp_layer_types (GLM), moe_layer_freq (must be 1), hidden_act (must be silu),
// tie_word_embeddings; absent keys take the transformers 5 config-class defaults of the
// model_type. Errors: kInvalidArgument naming the field; kUnimplemented for a model_type
// or setting the runner cannot run (for instance scoring_func other than the type's).
StatusOr<ModelArch> parse_model_arch(std::string_view json_text, std::string_view source);

// ---- the float32 reference cache ------------------------------------------------

// The unquantized reference: every layer's [kv_c_normed (L) | rope(k_pe) (R)] per token
// kept in float32 exactly as computed, attended in float32 - what `mlakv eval` measures
// every record format against (a lossless format would give KLD 0).
class ReferenceKvCache {
 public:
  // Fails on num_layers < 1, latent_dim < 1, rope_dim < 0.
  static StatusOr<std::unique_ptr<ReferenceKvCache>> create(int num_layers, int latent_dim, int rope_dim);

  SeqId add_sequence();
  Status free(SeqId seq);
  StatusOr<int64_t> length(SeqId seq) const;
  int num_layers() const { return num_layers_; }
  int latent_dim() const { return latent_dim_; }
  int rope_dim() const { return rope_dim_; }
  std::size_t bytes() const;

  // Internal to the runner: layer l's rows [length, L+R] of `seq` (nullptr if absent).
  std::vector<float>* rows(SeqId seq, int layer);

 private:
  ReferenceKvCache() = default;
  int num_layers_ = 0, latent_dim_ = 0, rope_dim_ = 0;
  struct Seq {
    int64_t length = 0;
    std::vector<std::vector<float>> layers;
  };
  std::vector<std::pair<SeqId, Seq>> seqs_;
  SeqId next_ = 0;
  friend class Model;
};

// ---- the model ------------------------------------------------------------------

struct ModelLoadOptions {
  int threads = 0;  // thread pool size (the calling thread included); 0: all cores
};

struct ModelMemory {
  std::size_t checkpoint_bytes = 0;   // bytes of the checkpoint tensors the model uses
  std::size_t mapped_bytes = 0;       // of those, used in place from the mapped files
  std::size_t dequantized_bytes = 0;  // owned float32 copies: quantized weights, norms, biases
  std::size_t routed_expert_bytes = 0;  // of the resident bytes, the routed experts' weights
  std::size_t resident_bytes() const { return mapped_bytes + dequantized_bytes; }
};

// Called once per decoder layer and forward call with that layer's kv_c_normed
// [T, L] f32 before any cache rounds it (calibration takes max |.| from here).
using LatentObserver = std::function<void(int layer, const TensorView& kv_c_normed)>;
// Called once per decoder layer and forward call with that layer's absorbed query
// [T, H, L+R] f32 (q_lat = q_nope W_UK, then the RoPE-rotated q_pe), as the untransformed
// model computes it (calibration takes the per-dim second moments of q_lat from here).
using QueryObserver = std::function<void(int layer, const TensorView& q)>;

// A latent transform (include/mlakv/latent_transform.h) folded into one model's weights by
// Model::fold_latent_transform: per layer a float32 copy of kv_b_proj with every row r
// replaced by H D^-1 r (the W_UK rows that make q_lat and the W_UV^T rows that read the
// attention output), and the W_UV bias (W_UV^T rows . mu, added before o_proj). Made once,
// shared by any number of caches and forward calls of that model.
class FoldedLatentTransform {
 public:
  struct Impl;
  explicit FoldedLatentTransform(std::unique_ptr<Impl> impl);
  ~FoldedLatentTransform();
  const LatentTransform& transform() const;
  std::size_t bytes() const;  // the folded weights held
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

struct ForwardOptions {
  // Only the last token's logits (logits is then [1, vocab]): what decode needs.
  bool last_token_only = false;
  // Split-KV partitions of the paged attention (>= 1). With 1, prefill in any chunks and
  // decode give bit-identical logits; more splits use more threads on long contexts but
  // the split points move with the sequence length, so chunkings then differ by float32
  // rounding.
  int num_splits = 1;
  LatentObserver observer;
  QueryObserver query_observer;
  // Paged caches only: the writer stores every layer's latent (and k_pe) transformed and
  // the layer reads through the folded weights, so the model computes the same function.
  // A cache must be forwarded with the same transform in every call (its records hold
  // transformed latents), its per-layer outer scales must be the transform's s_l where
  // the format has an outer scale, and its layers' nvfp4_scales the transform's on the
  // nvfp4 formats (kRn elsewhere): Model::transform_layer_formats gives both; a mismatch is
  // kInvalidArgument naming the layer and both values. nullptr: no transform.
  const FoldedLatentTransform* transform = nullptr;
};

class Model {
 public:
  // `dir`: a directory with config.json and model.safetensors(.index.json). Errors name
  // the file and tensor: kNotFound (a missing file or tensor), kInvalidArgument (a
  // tensor of the wrong shape or dtype, a bad config), kUnimplemented (a model_type or
  // setting the runner cannot run), kDataLoss (a malformed file, a non-finite norm).
  static StatusOr<std::unique_ptr<Model>> load(const std::string& dir, const ModelLoadOptions& opt = {});
  ~Model();

  const ModelArch& arch() const;
  const ModelConfig& config() const { return arch().mla; }
  int vocab_size() const { return arch().vocab_size; }
  int num_layers() const { return config().num_layers; }  // cache layers the runner fills
  const ModelMemory& memory() const;
  // Load-time facts a frontend should print (dense attention for DSA models, skipped
  // MTP tensors, dequantized encodings).
  const std::vector<std::string>& notes() const;
  // True once some sequence ran past index_topk with dense attention (DSA models only).
  bool dense_beyond_topk() const;

  // A paged cache for this model: one layer per decoder layer in `layers` (one entry
  // for all, or one per layer), room for `max_tokens` tokens in blocks of `block_size`.
  StatusOr<std::unique_ptr<PagedKvCache>> create_cache(const std::vector<LayerFormat>& layers, int64_t max_tokens,
                                                       int block_size = kDefaultBlockSize) const;
  StatusOr<std::unique_ptr<ReferenceKvCache>> create_reference_cache() const;

  // Folds `t` (one layer per decoder layer, validated) into this model's absorbed weights
  // (FoldedLatentTransform). Memory: a float32 kv_b_proj per layer.
  StatusOr<std::shared_ptr<const FoldedLatentTransform>> fold_latent_transform(const LatentTransform& t) const;
  // Cache layer formats for a transformed cache: `format` in every layer with the
  // transform's outer scale s_l where the format has one (1.0 otherwise), and its
  // nvfp4_scales on the nvfp4 formats (kRn otherwise).
  StatusOr<std::vector<LayerFormat>> transform_layer_formats(KvFormat format, const LatentTransform& t) const;
  // The output importance of each latent dim of `layer`: e_i = sum_h ||W_o,h W_UV,h e_i||^2
  // (W_o,h the o_proj columns of head h, [D, V]; W_UV,h [V, L]), the squared norm of what
  // a unit error in dim i of the attention output moves the layer's output by. [L] float64.
  StatusOr<std::vector<double>> latent_output_energy(int layer) const;

  // Runs `tokens` (T >= 1 ids in [0, vocab)) as the next tokens of `seq`: appends them
  // to the sequence (positions length .. length+T-1), writes every layer's records and
  // attends causally to everything cached before and within the chunk, so one call is a
  // prefill chunk of any size and T = 1 a decode step.
  //   logits [T, vocab] f32 (or [1, vocab] with last_token_only), CPU, contiguous
  // Validation errors (token range, shapes, cache geometry or layer count, unknown
  // sequence, cache full) change nothing. A later failure (a non-finite activation)
  // leaves the T tokens appended with unspecified records: free the sequence.
  Status forward(PagedKvCache& cache, SeqId seq, std::span<const int32_t> tokens, const TensorView& logits,
                 const ForwardOptions& opt = {});
  Status forward(ReferenceKvCache& cache, SeqId seq, std::span<const int32_t> tokens, const TensorView& logits,
                 const ForwardOptions& opt = {});

  struct Impl;

 private:
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- the runner's kernels, for tools and benchmarks -------------------------------

class ThreadPool;

// y = x @ w^T with the runner's SIMD matrix product (src/model/linear.h):
//   x [T, K] f32, w [N, K] f32/bf16/f16 (rows may be strided, columns contiguous),
//   y [T, N] f32 (contiguous rows, overwritten); all CPU. Threads over output rows
// when `pool` is not null. Fails naming the argument on a dtype, shape or device error.
Status linear_cpu(const TensorView& x, const TensorView& w, const TensorView& y, ThreadPool* pool = nullptr);

// Encodes n tokens into `slots` of cache layer `layer` with the runner's SIMD record
// writers (byte for byte what PagedKvCache::write stores; src/model/record_writer.h),
// threaded over tokens. latent [n, latent_dim], rope [n, rope_dim] f32 contiguous CPU;
// slots < 0 are skipped. Validation (shapes, a slot past the cache, a non-finite value)
// happens before any byte is written.
// With `transform`, each token's latent and k_pe go through it first (what the runner
// writes under ForwardOptions::transform); a latent the float32 transform would overflow
// on is an error before any byte is written.
Status write_records_simd(PagedKvCache& cache, int layer, std::span<const int64_t> slots, const TensorView& latent,
                          const TensorView& rope, ThreadPool* pool = nullptr,
                          const LatentTransformKernel* transform = nullptr);

}  // namespace mlakv
