// DCP on the host: the local metadata (interleaving + the causal rule), the rank's
// partial attention, and the two combines (include/mlakv/dcp.h, docs/parallel.md).
#include "mlakv/dcp.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mlakv/attn_state.h"
#include "mlakv/formats.h"

namespace mlakv {
namespace {

Status check_rank(int rank, int dcp, std::string_view fn) {
  if (dcp < 1) return invalid_argument(fmt::format("{}: dcp must be >= 1, got {}", fn, dcp));
  if (rank < 0 || rank >= dcp) return invalid_argument(fmt::format("{}: rank {} is outside [0, {})", fn, rank, dcp));
  return Status::Ok();
}

// A [B, s_q, ...] tensor viewed [B * s_q, 1, ...] (needs stride(0) == s_q * stride(1)).
StatusOr<TensorView> flatten_queries(const TensorView& t, std::string_view name) {
  if (t.ndim < 2 || t.stride(0) != t.size(1) * t.stride(1)) {
    return invalid_argument(fmt::format("{}: dims 0 and 1 must be contiguous together to view each query row as a "
                                        "request (shape {})",
                                        name, t.shape_string()));
  }
  TensorView v = t;
  v.shape[0] = t.size(0) * t.size(1);
  v.strides[0] = t.stride(1);
  v.shape[1] = 1;
  return v;
}

}  // namespace

StatusOr<DcpLocalMetadata> dcp_local_metadata(int rank, int dcp, const TensorView& block_table,
                                              const TensorView& seqlens, int s_q, bool causal) {
  MLAKV_RETURN_IF_ERROR(check_rank(rank, dcp, "dcp_local_metadata"));
  if (s_q < 1) return invalid_argument(fmt::format("dcp_local_metadata: s_q must be >= 1, got {}", s_q));
  MLAKV_RETURN_IF_ERROR(check_tensor(block_table, "block_table", {{DType::kI32}, {-1, -1}}, Device::cpu()));
  const int64_t B = block_table.size(0), mb = block_table.size(1);
  MLAKV_RETURN_IF_ERROR(check_tensor(seqlens, "seqlens", {{DType::kI32}, {B}}, Device::cpu()));
  DcpLocalMetadata m;
  const bool per_query = causal && s_q > 1;
  m.rows = per_query ? B * s_q : B;
  m.s_q = per_query ? 1 : s_q;
  m.causal = causal;
  m.max_blocks = mb;
  m.block_table.resize(static_cast<std::size_t>(m.rows * mb));
  m.seqlens.resize(static_cast<std::size_t>(m.rows));
  const int rows_per_request = per_query ? s_q : 1;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t len = seqlens.ptr<const int32_t>()[b * seqlens.stride(0)];
    if (len < 0) return invalid_argument(fmt::format("seqlens[{}] = {} is negative", b, len));
    for (int i = 0; i < rows_per_request; ++i) {
      const int64_t row = b * rows_per_request + i;
      for (int64_t k = 0; k < mb; ++k) {
        m.block_table[static_cast<std::size_t>(row * mb + k)] =
            block_table.ptr<const int32_t>()[b * block_table.stride(0) + k * block_table.stride(1)];
      }
      // Query i sees global positions [0, v); rank r holds n_r(v) of them.
      const int64_t v = per_query ? std::clamp<int64_t>(int64_t{len} - s_q + i + 1, 0, len) : len;
      m.seqlens[static_cast<std::size_t>(row)] = static_cast<int32_t>(dcp_local_count(v, rank, dcp));
    }
  }
  return m;
}

Status dcp_local_attention_cpu(int rank, int dcp, const DcpAttentionParams& p, const TensorView& out_part,
                               const TensorView& lse_part, const CpuAttentionOptions& opt) {
  MLAKV_RETURN_IF_ERROR(check_rank(rank, dcp, "dcp_local_attention_cpu"));
  MLAKV_RETURN_IF_ERROR(check_tensor(p.q, "q", {{DType::kF32, DType::kBF16}, {-1, -1, -1, kQkDim}}, Device::cpu()));
  const int64_t B = p.q.size(0), s_q = p.q.size(1), H = p.q.size(2);
  MLAKV_RETURN_IF_ERROR(check_tensor(out_part, "out_part",
                                     {{DType::kF32}, {B, s_q, H, kLatentDim}, Strides::kContiguous}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(
      check_tensor(lse_part, "lse_part", {{DType::kF32}, {B, s_q, H}, Strides::kContiguous}, Device::cpu()));
  if (p.cache.device.type != DeviceType::kCpu) {
    return invalid_argument(fmt::format("cache: expected a cpu cache, got {}", device_name(p.cache.device)));
  }
  if (B > 0 && p.block_table.ndim == 2 && p.block_table.size(0) != B) {
    return invalid_argument(fmt::format("block_table: expected {} rows (q's batch), got {}", B, p.block_table.size(0)));
  }
  MLAKV_ASSIGN_OR_RETURN(DcpLocalMetadata m,
                         dcp_local_metadata(rank, dcp, p.block_table, p.seqlens, static_cast<int>(s_q), p.causal));
  MlaAttentionParams a;
  a.q = p.q;
  a.out = out_part;
  a.lse = lse_part;
  if (m.s_q != s_q) {  // one request per query row (causal, s_q > 1)
    MLAKV_ASSIGN_OR_RETURN(a.q, flatten_queries(p.q, "q"));
    MLAKV_ASSIGN_OR_RETURN(a.out, flatten_queries(out_part, "out_part"));
    MLAKV_ASSIGN_OR_RETURN(a.lse, flatten_queries(lse_part, "lse_part"));
  }
  a.cache = p.cache;
  a.block_table = TensorView::contiguous(m.block_table.data(), DType::kI32, {m.rows, m.max_blocks});
  a.seqlens = TensorView::contiguous(m.seqlens.data(), DType::kI32, {m.rows});
  a.softmax_scale = p.softmax_scale;
  a.causal = m.causal;
  a.num_splits = p.num_splits;
  return mla_attention_cpu(a, opt).with_context(fmt::format("dcp rank {}/{}", rank, dcp));
}

Status dcp_combine(Communicator& comm, const TensorView& out_part, const TensorView& lse_part, DcpCombine mode,
                   const TensorView& out, const TensorView& lse) {
  // Every rank reaches the collectives even when its own arguments are wrong (the
  // communicator turns a bad argument into an error on all ranks), so no rank hangs.
  const int P = comm.size(), r = comm.rank();
  Status local = Status::Ok();
  if (comm.device().type != DeviceType::kCpu) {
    return invalid_argument(fmt::format("dcp_combine: {} is a device communicator; use cuda::dcp_combine", comm.name()));
  }
  int64_t B = 0, s_q = 0, H = 0;
  local = check_tensor(out_part, "out_part", {{DType::kF32}, {-1, -1, -1, kLatentDim}}, Device::cpu());
  if (local.ok()) {
    B = out_part.size(0), s_q = out_part.size(1), H = out_part.size(2);
    local = check_tensor(out_part, "out_part", {{DType::kF32}, {B, s_q, H, kLatentDim}, Strides::kContiguous},
                         Device::cpu());
  }
  if (local.ok())
    local = check_tensor(lse_part, "lse_part", {{DType::kF32}, {B, s_q, H}, Strides::kContiguous}, Device::cpu());
  const int64_t Hl = mode == DcpCombine::kAllGather ? H : H / P;
  if (local.ok() && mode == DcpCombine::kReduceScatterHeads && H % P != 0) {
    local = invalid_argument(fmt::format("dcp_combine: reduce-scatter over heads needs H ({}) divisible by dcp ({})", H, P));
  }
  if (local.ok())
    local = check_tensor(out, "out", {{DType::kF32}, {B, s_q, Hl, kLatentDim}, Strides::kContiguous}, Device::cpu());
  if (local.ok()) local = check_tensor(lse, "lse", {{DType::kF32}, {B, s_q, Hl}, Strides::kContiguous}, Device::cpu());
  const int64_t N = B * s_q * H;  // partial rows

  // lse of every rank: [P, N]. A bad local argument goes in as a mis-shaped tensor so
  // that every rank's all_gather fails together.
  std::vector<float> lses(local.ok() ? static_cast<std::size_t>(P * N) : 0);
  const TensorView lse_in = local.ok() ? TensorView::contiguous(lse_part.data, DType::kF32, {N}) : TensorView{};
  const Status gathered = comm.all_gather(lse_in, TensorView::contiguous(lses.data(), DType::kF32, {P, N}));
  MLAKV_RETURN_IF_ERROR(local);
  MLAKV_RETURN_IF_ERROR(gathered);

  if (mode == DcpCombine::kAllGather) {
    std::vector<float> outs(static_cast<std::size_t>(P * N * kLatentDim));
    MLAKV_RETURN_IF_ERROR(comm.all_gather(TensorView::contiguous(out_part.data, DType::kF32, {N, kLatentDim}),
                                          TensorView::contiguous(outs.data(), DType::kF32, {P, N, kLatentDim})));
    return merge_attn_states(TensorView::contiguous(outs.data(), DType::kF32, {P, N, kLatentDim}),
                             TensorView::contiguous(lses.data(), DType::kF32, {P, N}),
                             TensorView::contiguous(out.data, DType::kF32, {N, kLatentDim}),
                             TensorView::contiguous(lse.data, DType::kF32, {N}));
  }

  // Reduce-scatter over heads. send [P, B, s_q, Hl, 512]: chunk k holds heads
  // [k * Hl, (k + 1) * Hl) of this rank's out scaled by its merge weight exp(lse_r - lse).
  std::vector<float> send(static_cast<std::size_t>(N * kLatentDim));
  const float* op = out_part.ptr<const float>();
  for (int64_t n = 0; n < N; ++n) {
    AttnState st;  // the merged lse, folded in rank order with attn_state.h's rule
    for (int k = 0; k < P; ++k) st.lse = merge_weights(st.lse, lses[static_cast<std::size_t>(k * N + n)]).lse;
    const float own = lses[static_cast<std::size_t>(r * N + n)];
    // An empty partial (own = -inf) or an all-empty row weighs 0, and its out is never read.
    const float w = (st.lse == -INFINITY || own == -INFINITY) ? 0.0f : std::exp(own - st.lse);
    const int64_t bi = n / H, h = n % H, k = h / Hl;
    float* dst = send.data() + ((k * (B * s_q) + bi) * Hl + h % Hl) * kLatentDim;
    for (int d = 0; d < kLatentDim; ++d) dst[d] = w != 0.0f ? w * op[n * kLatentDim + d] : 0.0f;
    if (k == r) lse.ptr<float>()[bi * Hl + h % Hl] = st.lse;
  }
  return comm.reduce_scatter_sum(TensorView::contiguous(send.data(), DType::kF32, {P, B * s_q * Hl, kLatentDim}),
                                 TensorView::contiguous(out.data, DType::kF32, {B * s_q * Hl, kLatentDim}));
}

Status dcp_attention_cpu(Communicator& comm, const DcpAttentionParams& p, const CpuAttentionOptions& opt) {
  // The partials are sized from a validated q; a bad q still joins the combine (as a
  // failure) so the other ranks do not wait for this one.
  const bool q_ok =
      check_tensor(p.q, "q", {{DType::kF32, DType::kBF16}, {-1, -1, -1, kQkDim}}, Device::cpu()).ok();
  const int64_t B = q_ok ? p.q.size(0) : 0, s_q = q_ok ? p.q.size(1) : 0, H = q_ok ? p.q.size(2) : 0;
  std::vector<float> o(static_cast<std::size_t>(B * s_q * H * kLatentDim)), l(static_cast<std::size_t>(B * s_q * H));
  const TensorView o_part = TensorView::contiguous(o.data(), DType::kF32, {B, s_q, H, kLatentDim});
  const TensorView l_part = TensorView::contiguous(l.data(), DType::kF32, {B, s_q, H});
  const Status local = dcp_local_attention_cpu(comm.rank(), comm.size(), p, o_part, l_part, opt);
  // On a local failure, pass a tensor that fails every rank's collective with it.
  const Status combined =
      dcp_combine(comm, local.ok() ? o_part : TensorView{}, l_part, p.combine, p.out, p.lse);
  MLAKV_RETURN_IF_ERROR(local);
  return combined;
}

}  // namespace mlakv
