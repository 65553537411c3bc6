// KV-cache capacity planning: how many tokens fit per GPU, and the longest request.
#pragma once

#include <cstdint>

#include "mlakv/formats.h"
#include "mlakv/model_config.h"
#include "mlakv/status.h"

namespace mlakv {

struct PlanParams {
  KvFormat format = KvFormat::kFp8DsMla;
  int gpus = 1;              // GPUs in the deployment
  double gpu_mem_gib = 80;   // memory per GPU
  int tp = 1;                // tensor-parallel ranks (MLA's latent cache is replicated across them)
  int dcp = 1;               // decode-context-parallel ranks inside a TP group (divides tp)
  double mem_util = 0.9;     // fraction of GPU memory the engine may use
  double reserved_gib = 0;   // of that, not KV: activations/graphs, plus the weights when weight_gib is 0
  double weight_gib = 0;     // the whole checkpoint's weight bytes (GiB); each GPU holds weight_gib / tp
                             // on top of reserved_gib. 0: already counted in reserved_gib.
  int block_size = 64;       // tokens per cache block
  // The longest request the model accepts (vLLM's --max-model-len): 0 = the model's
  // max_position_embeddings (uncapped when that is 0 too). Larger than the model's is an error.
  int64_t max_model_len = 0;
  bool include_mtp = true;   // MTP layers keep KV (vLLM with speculative decoding); false: --no-mtp
};

struct PlanResult {
  int record_bytes = 0;              // per token per layer (bytes_per_token_per_layer)
  int cache_layers = 0;              // decoder + MTP layers (decoder only with include_mtp false)
  int indexer_layers = 0;            // layers keeping a 132 B/token indexer key cache
  int64_t indexer_bytes_per_token = 0;
  int64_t bytes_per_token = 0;       // whole model: cache_layers*record + indexer_layers*132
  int64_t block_bytes = 0;           // one block of every layer
  double weight_gib_per_gpu = 0;     // weight_gib / tp
  double reserved_gib_per_gpu = 0;   // weight_gib_per_gpu + reserved_gib: everything that is not KV
  double kv_gib_per_gpu = 0;         // gpu_mem*mem_util - reserved_gib_per_gpu
  int64_t blocks_per_gpu = 0;
  int64_t tokens_per_gpu = 0;        // blocks_per_gpu * block_size
  int replicas = 0;                  // gpus / tp (data-parallel copies)
  int64_t tokens_per_replica = 0;    // a TP group's pool: tokens_per_gpu * dcp
  int64_t pool_request_tokens = 0;   // the pool a single request could fill (tokens_per_replica), uncapped
  int64_t max_model_len = 0;         // the cap applied (0 = none known)
  int64_t max_request_tokens = 0;    // min(pool_request_tokens, max_model_len)
  int64_t total_tokens = 0;          // replicas * tokens_per_replica
  // vLLM's startup line "Maximum concurrency for N tokens per request: X.XXx", N =
  // max_model_len (the pool when uncapped): blocks_per_gpu / ceil(ceil(N / dcp) / block_size),
  // per replica (docs/reference.md section 14).
  int64_t concurrency_tokens = 0;
  double max_concurrency = 0;
};

// Fails (naming the argument) on non-positive sizes, tp not dividing gpus or the head
// count, dcp not dividing tp, mem_util outside (0, 1], a max_model_len past the model's
// max_position_embeddings, or (kResourceExhausted, "does not fit: ...", with the weights
// per GPU) no memory left for the cache.
StatusOr<PlanResult> plan_capacity(const ModelConfig& model, const PlanParams& params);

}  // namespace mlakv
