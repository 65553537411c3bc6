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
  double reserved_gib = 0;   // of that, weights/activations/graphs: not KV
  int block_size = 64;       // tokens per cache block
};

struct PlanResult {
  int record_bytes = 0;              // per token per layer (bytes_per_token_per_layer)
  int cache_layers = 0;              // decoder + MTP layers
  int indexer_layers = 0;            // layers keeping a 132 B/token indexer key cache
  int64_t indexer_bytes_per_token = 0;
  int64_t bytes_per_token = 0;       // whole model: cache_layers*record + indexer_layers*132
  int64_t block_bytes = 0;           // one block of every layer
  double kv_gib_per_gpu = 0;         // gpu_mem*mem_util - reserved
  int64_t blocks_per_gpu = 0;
  int64_t tokens_per_gpu = 0;        // blocks_per_gpu * block_size
  int replicas = 0;                  // gpus / tp (data-parallel copies)
  int64_t tokens_per_replica = 0;    // a TP group's pool: tokens_per_gpu * dcp
  int64_t max_request_tokens = 0;    // a single request spread over dcp ranks
  int64_t total_tokens = 0;          // replicas * tokens_per_replica
};

// Fails (naming the argument) on non-positive sizes, tp not dividing gpus or the head
// count, dcp not dividing tp, mem_util outside (0, 1], or no memory left for the cache.
StatusOr<PlanResult> plan_capacity(const ModelConfig& model, const PlanParams& params);

}  // namespace mlakv
