// The CUDA attention API: validation and planning on the host, then kernel launches
// through the path select_attention_path picks at plan time (attention_path.h, kept in
// AttentionPlan::path), then smxx's combine.
#include <fmt/format.h>

#include <algorithm>

#include "cuda/api/attention_path.h"
#include "cuda/common/status.h"
#include "cuda/smxx/launch.h"
#include "mlakv/cuda.h"

namespace mlakv::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

std::size_t align16(std::size_t x) { return (x + 15) & ~std::size_t{15}; }

Status check_device_params(const MlaAttentionParams& p) {
  MLAKV_RETURN_IF_ERROR(validate_mla_attention(p));
  if (p.cache.device.type != DeviceType::kCuda) {
    return invalid_argument(fmt::format("cache: expected a CUDA cache layer, got {}", device_name(p.cache.device)));
  }
  const int64_t B = p.q.size(0), s_q = p.q.size(1);
  if ((p.sparse() ? B * s_q : B) > 65535) {
    return invalid_argument(fmt::format("q: {} {} exceed one launch's grid (65535)", p.sparse() ? "queries" : "requests",
                                        p.sparse() ? B * s_q : B));
  }
  return Status::Ok();
}

}  // namespace

int suggest_num_splits(const MlaAttentionParams& p, int multiprocessors) {
  if (p.q.ndim != 4) return 1;
  const int64_t B = p.q.size(0), s_q = p.q.size(1), H = p.q.size(2);
  // The path the plan would take (sm80 where MLAKV_CUDA_ATTENTION is invalid: planning reports that).
  const StatusOr<AttentionPath> path = select_attention_path(p);
  const AttentionKernels& k = attention_kernels(path.ok() ? *path : AttentionPath::kSm80);
  const int rows = k.rows_per_cta;
  const int64_t ctas = p.sparse() ? B * s_q * ((H + rows - 1) / rows) : B * ((s_q * H + rows - 1) / rows);
  // Fill every CTA slot of the GPU once: slots = SMs x CTAs per SM for this format.
  const int per_sm = std::max(1, k.ctas_per_sm(p.cache.format, p.cache.record_bytes));
  const int64_t slots = static_cast<int64_t>(std::max(1, multiprocessors)) * per_sm;
  int64_t splits = std::clamp<int64_t>(slots / std::max<int64_t>(ctas, 1), 1, 64);
  if (p.sparse()) {
    // A sparse set is short (top-k 2048 = 32 tiles of 64 tokens): the kernel rounds a
    // split's chunk up to whole tiles, so more splits than tiles, or a count that does
    // not divide the tiles evenly, leaves splits empty (at B = 1, 64 splits of 2048
    // tokens were 32 busy CTAs and 32 empty partials for the combine). Split into whole
    // tiles, as few splits as give every split the same tile count. Where one tile per
    // split would put more than one CTA on an SM, give each split two tiles or more
    // (the second tile's copies overlap the first's math): B = 8, H = 8, top-k 2048 on
    // the H200 took 30.0 us at 16 splits against 32.8 at 32 (docs/perf.md, "tp").
    const int64_t granule = k.split_granule != nullptr ? k.split_granule(p.cache.format) : 1;
    const int64_t tiles = std::max<int64_t>(1, (p.indices.size(2) + granule - 1) / granule);
    int64_t cap = tiles;
    if (ctas * std::min(splits, tiles) > multiprocessors) cap = std::max<int64_t>(1, tiles / 2);
    const int64_t s0 = std::min(splits, cap);
    const int64_t per = (tiles + s0 - 1) / s0;
    splits = (tiles + per - 1) / per;
  }
  return static_cast<int>(splits);
}

StatusOr<AttentionPlan> plan_mla_attention(const MlaAttentionParams& p) {
  MLAKV_RETURN_IF_ERROR(check_device_params(p));
  AttentionPlan plan;
  const int64_t B = p.q.size(0), s_q = p.q.size(1), H = p.q.size(2);
  MLAKV_ASSIGN_OR_RETURN(plan.path, select_attention_path(p));
  const AttentionKernels& k = attention_kernels(plan.path);
  const int rows = k.rows_per_cta;
  plan.num_splits = p.num_splits;
  plan.row_blocks = static_cast<int>(p.sparse() ? (H + rows - 1) / rows : (s_q * H + rows - 1) / rows);
  plan.partial_rows = B * s_q * H;
  MLAKV_RETURN_IF_ERROR(cuda_status(k.configure(p.cache.format, p.cache.record_bytes),
                                    "cudaFuncSetAttribute(max dynamic shared memory)"));
  if (plan.num_splits > 1) {
    plan.workspace_bytes = align16(sizeof(float) * static_cast<std::size_t>(plan.num_splits * plan.partial_rows) * kLatentDim) +
                           align16(sizeof(float) * static_cast<std::size_t>(plan.num_splits * plan.partial_rows));
  }
  return plan;
}

Status run_mla_attention(const MlaAttentionParams& p, const AttentionPlan& plan, void* workspace, void* stream) {
  MLAKV_RETURN_IF_ERROR(check_device_params(p));
  if (plan.num_splits != p.num_splits) {
    return invalid_argument(fmt::format("plan is for {} splits, params ask for {}", plan.num_splits, p.num_splits));
  }
  const AttentionKernels& k = attention_kernels(plan.path);
  if (!k.serves(p)) {
    return invalid_argument(fmt::format("plan is for the {} kernel path, which cannot run these params on {}", k.name,
                                        device_name(p.cache.device)));
  }
  if (plan.workspace_bytes > 0 && workspace == nullptr) {
    return invalid_argument(fmt::format("workspace: {} bytes needed, got a null pointer", plan.workspace_bytes));
  }
  kernels::AttentionParams kp{};
  kp.q = p.q.data;
  kp.q_bf16 = p.q.dtype == DType::kBF16;
  kp.q_s0 = p.q.stride(0);
  kp.q_s1 = p.q.stride(1);
  kp.q_s2 = p.q.stride(2);
  kp.B = static_cast<int>(p.q.size(0));
  kp.s_q = static_cast<int>(p.q.size(1));
  kp.H = static_cast<int>(p.q.size(2));
  kp.cache = p.cache.data;
  kp.num_blocks = p.cache.num_blocks;
  kp.num_slots = p.cache.num_slots();
  kp.block_size = p.cache.block_size;
  kp.record_bytes = p.cache.record_bytes;
  kp.outer_scale = p.cache.outer_scale;
  kp.token_scale = p.cache.token_scale;
  kp.sparse = p.sparse();
  if (kp.sparse) {
    kp.indices = p.indices.ptr<const int32_t>();
    kp.ix_s0 = p.indices.stride(0);
    kp.ix_s1 = p.indices.stride(1);
    kp.ix_s2 = p.indices.stride(2);
    kp.topk = static_cast<int>(p.indices.size(2));
    if (p.topk_length.data != nullptr) {
      kp.topk_length = p.topk_length.ptr<const int32_t>();
      kp.tl_s0 = p.topk_length.stride(0);
    }
  } else {
    kp.block_table = p.block_table.ptr<const int32_t>();
    kp.bt_s0 = p.block_table.stride(0);
    kp.bt_s1 = p.block_table.stride(1);
    kp.bt_cols = p.block_table.size(1);
    kp.seqlens = p.seqlens.ptr<const int32_t>();
    kp.sl_s0 = p.seqlens.stride(0);
    kp.causal = p.causal;
  }
  kp.scale_log2 = p.softmax_scale * kLog2e;
  kp.num_splits = p.num_splits;
  kp.out = p.out.ptr<float>();
  kp.o_s0 = p.out.stride(0);
  kp.o_s1 = p.out.stride(1);
  kp.o_s2 = p.out.stride(2);
  kp.lse = p.lse.ptr<float>();
  kp.l_s0 = p.lse.stride(0);
  kp.l_s1 = p.lse.stride(1);
  kp.l_s2 = p.lse.stride(2);
  kp.rows_total = plan.partial_rows;
  if (p.num_splits > 1) {
    kp.part_o = static_cast<float*>(workspace);
    kp.part_lse = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) +
                                           align16(sizeof(float) * static_cast<std::size_t>(plan.num_splits * plan.partial_rows) * kLatentDim));
  }
  const int e = k.launch(p.cache.format, kp, plan.row_blocks, stream);
  if (e != 0 || kp.num_splits == 1) return cuda_status(e, "mla_attention kernels");
  const kernels::CombineParams cp{kp.part_o, kp.part_lse, kp.num_splits, kp.rows_total, kp.s_q, kp.H,
                                  kp.out,    kp.o_s0,     kp.o_s1,       kp.o_s2,        kp.lse, kp.l_s0,
                                  kp.l_s1,   kp.l_s2,     k.programmatic_combine};
  return cuda_status(kernels::launch_combine(cp, stream), "mla_attention kernels");
}

Status merge_attn_states(const TensorView& o_parts, const TensorView& lse_parts, const TensorView& out,
                         const TensorView& lse, void* stream) {
  const Device dev = o_parts.device;
  if (dev.type != DeviceType::kCuda) return invalid_argument("o_parts: expected a CUDA tensor");
  MLAKV_RETURN_IF_ERROR(check_tensor(o_parts, "o_parts", {{DType::kF32}, {-1, -1, -1}}, dev));
  const int64_t P = o_parts.size(0), N = o_parts.size(1), D = o_parts.size(2);
  MLAKV_RETURN_IF_ERROR(check_tensor(lse_parts, "lse_parts", {{DType::kF32}, {P, N}}, dev));
  MLAKV_RETURN_IF_ERROR(check_tensor(out, "out", {{DType::kF32}, {N, D}}, dev));
  MLAKV_RETURN_IF_ERROR(check_tensor(lse, "lse", {{DType::kF32}, {N}}, dev));
  if (P < 1) return invalid_argument("o_parts: at least one partial is needed");
  const kernels::MergeParams mp{o_parts.ptr<const float>(), o_parts.stride(0), o_parts.stride(1),
                                lse_parts.ptr<const float>(), lse_parts.stride(0), lse_parts.stride(1),
                                static_cast<int>(P), N, static_cast<int>(D), out.ptr<float>(), out.stride(0),
                                lse.ptr<float>(), lse.stride(0)};
  return cuda_status(kernels::launch_merge(mp, stream), "merge_kernel");
}

}  // namespace mlakv::cuda
