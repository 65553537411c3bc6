#include "mlakv/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "core/checked_math.h"

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
  if (!(p.weight_gib >= 0) || !std::isfinite(p.weight_gib)) {
    return invalid_argument(fmt::format("weight GiB must be >= 0, got {}", p.weight_gib));
  }
  if (p.max_model_len < 0) {
    return invalid_argument(fmt::format("max-model-len must be >= 0, got {}", p.max_model_len));
  }
  if (p.max_model_len > 0 && m.max_position_embeddings > 0 && p.max_model_len > m.max_position_embeddings) {
    return invalid_argument(fmt::format("max-model-len {} exceeds the model's max_position_embeddings {}",
                                        p.max_model_len, m.max_position_embeddings));
  }

  PlanResult r;
  r.record_bytes = record_bytes(p.format, m.kv_lora_rank, m.qk_rope_head_dim);
  if (r.record_bytes < 0 && p.format == KvFormat::kBf16) {
    return invalid_argument(fmt::format("model {}: a bf16 record of kv_lora_rank {} + qk_rope_head_dim {} overflows",
                                        m.name, m.kv_lora_rank, m.qk_rope_head_dim));
  }
  if (r.record_bytes < 0) {
    return invalid_argument(fmt::format(
        "format {} needs kv_lora_rank 512 and qk_rope_head_dim 64; model {} has {} and {} (use bf16)",
        format_name(p.format), m.name, m.kv_lora_rank, m.qk_rope_head_dim));
  }
  r.cache_layers = static_cast<int>(p.include_mtp ? m.cache_layers() : m.num_layers);  // validate() bounds it
  // An MTP layer keeps its own indexer cache (the indexer count includes it).
  r.indexer_layers = p.include_mtp ? m.indexer_layers : std::max(0, m.indexer_layers - m.num_mtp_layers);
  r.indexer_bytes_per_token = static_cast<int64_t>(r.indexer_layers) * layout::indexer::kRecordBytes;
  const std::optional<int64_t> layer_bytes = checked::mul<int64_t>(r.cache_layers, r.record_bytes);
  const std::optional<int64_t> per_token =
      layer_bytes ? checked::add<int64_t>(*layer_bytes, r.indexer_bytes_per_token) : std::nullopt;
  const std::optional<int64_t> block = per_token ? checked::mul<int64_t>(*per_token, p.block_size) : std::nullopt;
  if (!block) {
    return invalid_argument(fmt::format("model {}: {} layers x {} B per record x block-size {} overflows 64 bits",
                                        m.name, r.cache_layers, r.record_bytes, p.block_size));
  }
  r.bytes_per_token = *per_token;
  r.block_bytes = *block;
  r.weight_gib_per_gpu = p.weight_gib / p.tp;
  r.reserved_gib_per_gpu = r.weight_gib_per_gpu + p.reserved_gib;
  r.kv_gib_per_gpu = p.gpu_mem_gib * p.mem_util - r.reserved_gib_per_gpu;
  if (r.kv_gib_per_gpu <= 0) {
    const std::string weights =
        p.weight_gib > 0 ? fmt::format("weights {:.1f} GiB / tp {} = {:.2f} GiB per GPU + {} GiB other", p.weight_gib,
                                       p.tp, r.weight_gib_per_gpu, p.reserved_gib)
                         : fmt::format("reserved {} GiB per GPU", p.reserved_gib);
    return resource_exhausted(fmt::format(
        "does not fit: no memory left for the KV cache: {} GiB x mem-util {} = {:.2f} GiB usable per GPU, {}",
        p.gpu_mem_gib, p.mem_util, p.gpu_mem_gib * p.mem_util, weights));
  }
  const double kv_bytes = r.kv_gib_per_gpu * 1024.0 * 1024.0 * 1024.0;
  // double -> int64 only when it fits (--gpu-mem 1e20 would be undefined behaviour).
  const std::optional<int64_t> blocks = checked::floor_to_int64(kv_bytes / static_cast<double>(r.block_bytes), 0);
  r.replicas = p.gpus / p.tp;
  const std::optional<int64_t> tokens = blocks ? checked::mul<int64_t>(*blocks, p.block_size) : std::nullopt;
  const std::optional<int64_t> per_replica = tokens ? checked::mul<int64_t>(*tokens, p.dcp) : std::nullopt;
  const std::optional<int64_t> total = per_replica ? checked::mul<int64_t>(*per_replica, r.replicas) : std::nullopt;
  if (!total) {
    return invalid_argument(fmt::format("{:.6g} GiB per GPU x {} GPUs: the token counts overflow 64 bits",
                                        r.kv_gib_per_gpu, p.gpus));
  }
  r.blocks_per_gpu = *blocks;
  r.tokens_per_gpu = *tokens;
  r.tokens_per_replica = *per_replica;
  r.total_tokens = *total;
  r.pool_request_tokens = r.tokens_per_replica;
  r.max_model_len = p.max_model_len > 0 ? p.max_model_len : m.max_position_embeddings;
  r.max_request_tokens =
      r.max_model_len > 0 ? std::min<int64_t>(r.pool_request_tokens, r.max_model_len) : r.pool_request_tokens;
  r.concurrency_tokens = r.max_model_len > 0 ? r.max_model_len : r.pool_request_tokens;
  if (r.concurrency_tokens > 0) {
    const int64_t per_rank = (r.concurrency_tokens + p.dcp - 1) / p.dcp;
    const int64_t need_blocks = (per_rank + p.block_size - 1) / p.block_size;
    r.max_concurrency = static_cast<double>(r.blocks_per_gpu) / static_cast<double>(need_blocks);
  }
  return r;
}

}  // namespace mlakv
