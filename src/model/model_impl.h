// Internals of the model runner (include/mlakv/model.h): the loaded weights and the
// per-layer forward pieces shared by model.cc (loading, the forward driver) and
// decoder.cc / mlp.cc (the layer arithmetic).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/linear.h"
#include "model/rope.h"
#include "mlakv/model.h"
#include "mlakv/safetensors.h"
#include "mlakv/thread_pool.h"

namespace mlakv {

namespace model {

// A linear layer: the weight [out, in] (a view into the mapped checkpoint or into
// `owned`), and an optional bias [out].
struct Linear {
  WeightMatrix w;
  std::vector<float> owned;  // float32 dequantized copy (quantized checkpoints only)
  std::vector<float> bias;   // [out] or empty
  int64_t out() const { return w.rows; }
  int64_t in() const { return w.cols; }
};

struct Mlp {  // down(silu(gate(x)) * up(x))
  Linear gate, up, down;
};

struct AttentionWeights {
  Linear q_a, q_b, q_proj;  // q_a/q_b when q_lora_rank > 0, else q_proj
  Linear kv_a;              // [L+R, D]
  Linear kv_b;              // [H*(P+V), L]: rows of head h: W_UK [P, L] then W_UV^T [V, L]
  Linear o;                 // [D, H*V]
  std::vector<float> q_a_norm, kv_a_norm;
};

struct MoeWeights {
  WeightMatrix router;                 // gate.weight [E, D]
  std::vector<float> router_owned;     // if the router weight had to be copied
  std::vector<float> bias;             // e_score_correction_bias [E] (sigmoid scoring)
  std::vector<Mlp> experts;            // [E]
  bool has_shared = false;
  Mlp shared;
};

struct LayerWeights {
  std::vector<float> input_norm, post_norm;  // [D]
  AttentionWeights attn;
  bool moe = false;
  Mlp mlp;  // dense layers
  MoeWeights moe_w;
};

// y [T, out] = x [T, in] W^T + bias.
void linear_forward(const Linear& l, const float* x, int64_t T, float* y, ThreadPool* pool);
// y [T, n] = x / sqrt(mean(x^2) + eps) * weight, row by row (float64 statistics).
void rms_norm_rows(const float* x, int64_t T, int64_t n, const std::vector<float>& weight, double eps, float* y);
// The SwiGLU MLP on T rows: x [T, D] -> y [T, D].
void mlp_forward(const Mlp& m, const float* x, int64_t T, int64_t D, float* y, ThreadPool* pool);
// The MoE block on T rows (routed experts + shared experts): x [T, D] -> y [T, D].
void moe_forward(const MoeWeights& m, const MoeRouting& r, const float* x, int64_t T, int64_t D, float* y,
                 ThreadPool* pool);

}  // namespace model

// A latent transform folded into one model (include/mlakv/model.h).
struct FoldedLatentTransform::Impl {
  const Model::Impl* model = nullptr;  // the model it was folded for
  LatentTransform transform;
  std::vector<LatentTransformKernel> kernels;  // [num_layers]
  std::vector<std::vector<float>> kv_b;       // [num_layers][H*(P+V) * L]: rows H D^-1 r
  std::vector<std::vector<float>> uv_bias;    // [num_layers][H*V]: W_UV^T rows . mu
};

struct Model::Impl {
  ModelArch arch;
  std::unique_ptr<Checkpoint> ckpt;
  model::WeightMatrix embed;  // [V, D]
  std::vector<float> embed_owned;
  model::Linear lm_head;      // [V, D] (a view of embed when tied)
  std::vector<float> final_norm;
  std::vector<model::LayerWeights> layers;
  std::unique_ptr<rope::RopeTable> rope;
  std::unique_ptr<ThreadPool> pool;
  ModelMemory memory;
  std::vector<std::string> notes;
  bool dense_beyond_topk = false;
};

}  // namespace mlakv
