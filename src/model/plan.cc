#include "mlakv/plan.h"

#include <fmt/format.h>

#include <cmath>

namespace mlakv {

StatusOr<PlanResult> plan_capacity(const ModelConfig& m, const PlanParams& p) {
  MLAKV_RETURN_IF_ERROR(m.validate());
  if (p.gpus <= 0) return invalid_argument(fmt::format("gpus must be > 0, got {}", p.gpus));
  if (!(p.gpu_mem_gib > 0) || !std::isfinite(p.gpu_mem_gib)) {
    return invalid_argument(fmt::format("gpu-mem must be > 0 GiB, got {}", p.gpu_mem_gib));
  }
  if (p.tp <= 0 || p.gpus % p.tp != 0) {
    return invalid_argument(fmt::format("tp {} must be > 0 and divide gpus {}", p.tp, p.gpus));
  }
  if (m.num_heads % p.tp != 0) {
    return invalid_argument(fmt::format("tp {} must divide the model's {} attention heads", p.tp, m.num_heads));
  }
  if (p.dcp <= 0 || p.tp % p.dcp != 0) {
    return invalid_argument(fmt::format("dcp {} must be > 0 and divide tp {}", p.dcp, p.tp));
  }
  if (!(p.mem_util > 0 && p.mem_util <= 1)) {
    return invalid_argument(fmt::format("mem-util must be in (0, 1], got {}", p.mem_util));
  }
  if (!(p.reserved_gib >= 0) || !std::isfinite(p.reserved_gib)) {
    return invalid_argument(fmt::format("reserved must be >= 0 GiB, got {}", p.reserved_gib));
  }
  if (p.block_size <= 0) return invalid_argument(fmt::format("block-size must be > 0, got {}", p.block_size));

  PlanResult r;
  r.record_bytes = record_bytes(p.format, m.kv_lora_rank, m.qk_rope_head_dim);
  if (r.record_bytes < 0) {
    return invalid_argument(fmt::format(
        "format {} needs kv_lora_rank 512 and qk_rope_head_dim 64; model {} has {} and {} (use bf16)",
        format_name(p.format), m.name, m.kv_lora_rank, m.qk_rope_head_dim));
  }
  r.cache_layers = m.cache_layers();
  r.indexer_layers = m.indexer_layers;
  r.indexer_bytes_per_token = static_cast<int64_t>(m.indexer_layers) * layout::indexer::kRecordBytes;
  r.bytes_per_token = static_cast<int64_t>(r.cache_layers) * r.record_bytes + r.indexer_bytes_per_token;
  r.block_bytes = r.bytes_per_token * p.block_size;
  r.kv_gib_per_gpu = p.gpu_mem_gib * p.mem_util - p.reserved_gib;
  if (r.kv_gib_per_gpu <= 0) {
    return resource_exhausted(fmt::format(
        "no memory left for the KV cache: {} GiB x mem-util {} = {:.2f} GiB, reserved {} GiB", p.gpu_mem_gib,
        p.mem_util, p.gpu_mem_gib * p.mem_util, p.reserved_gib));
  }
  const double kv_bytes = r.kv_gib_per_gpu * 1024.0 * 1024.0 * 1024.0;
  r.blocks_per_gpu = static_cast<int64_t>(std::floor(kv_bytes / static_cast<double>(r.block_bytes)));
  r.tokens_per_gpu = r.blocks_per_gpu * p.block_size;
  r.replicas = p.gpus / p.tp;
  r.tokens_per_replica = r.tokens_per_gpu * p.dcp;
  r.max_request_tokens = r.tokens_per_replica;
  r.total_tokens = r.tokens_per_replica * r.replicas;
  return r;
}

}  // namespace mlakv
