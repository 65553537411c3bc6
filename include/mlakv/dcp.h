// Decode context parallelism (DCP): one request's KV cache spread over `dcp` ranks
// (docs/parallel.md).
//
// Interleaving (vLLM's, interleave size 1): global position p lives on rank p % dcp at
// local position p / dcp. Of a request's first n tokens, rank r holds
//   n_r(n) = floor((n + dcp - 1 - r) / dcp)          (0 when n <= r)
// Every rank keeps its own paged cache (own blocks, own block table); its seqlen for
// the request is n_r(seqlen).
//
// Causal queries: query i of s_q (the newest s_q tokens are the queries) sees the
// global positions [0, v_i), v_i = clamp(seqlen - s_q + i + 1, 0, seqlen). On rank r
// those are exactly its first n_r(v_i) local tokens. n_r(v_i) is NOT
// n_r(seqlen) - s_q + i + 1 (a rank's count grows only at every dcp-th position), so
// for s_q > 1 each query row becomes its own row of the local attention: q viewed
// [B * s_q, 1, H, 576], block table row b repeated s_q times, seqlens n_r(v_i).
// Decode (s_q = 1) and non-causal queries keep [B, s_q] with seqlens n_r(seqlen).
//
// Combine: each rank's (out, lse) is a partial over disjoint token sets; a rank with no
// visible token has lse = -inf (attn_state.h's empty rule) and contributes nothing.
//  - kAllGather: all-gather out and lse, merge_attn_states -> the full [B, s_q, H, 512]
//    result on every rank.
//  - kReduceScatterHeads: all-gather lse only; each rank scales its out by
//    exp(lse_r - lse) and a reduce-scatter sums over ranks, leaving rank r with heads
//    [r * H / dcp, (r + 1) * H / dcp): out [B, s_q, H / dcp, 512], lse [B, s_q, H / dcp].
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "mlakv/attention.h"
#include "mlakv/cache.h"
#include "mlakv/parallel.h"
#include "mlakv/status.h"
#include "mlakv/tensor.h"

namespace mlakv {

// ---- index math ----------------------------------------------------------------------
inline constexpr int dcp_owner(int64_t position, int dcp) { return static_cast<int>(position % dcp); }
inline constexpr int64_t dcp_local_position(int64_t position, int dcp) { return position / dcp; }
// n_r(n): tokens among positions [0, n) that rank r holds (n >= 0, 0 <= r < dcp).
inline constexpr int64_t dcp_local_count(int64_t n, int rank, int dcp) {
  return n <= rank ? 0 : (n - rank + dcp - 1) / dcp;
}
// The longest request whose every rank fits `tokens_per_rank` tokens: rank 0 holds the
// most, ceil(n / dcp), so n <= tokens_per_rank * dcp (mlakv plan's max_request_tokens).
inline constexpr int64_t dcp_max_request_tokens(int64_t tokens_per_rank, int dcp) { return tokens_per_rank * dcp; }

// ---- per-rank cache accounting ----------------------------------------------------------
// Where an append's tokens went: token k (global position first_position + k) is on
// rank[k] at slot[k] of that rank's cache; per_rank[r] lists rank r's new slots in
// position order.
struct DcpSlots {
  int64_t first_position = 0;
  std::vector<int> rank;
  std::vector<int64_t> slot;
  std::vector<std::vector<int64_t>> per_rank;
};

// dcp BlockManagers of equal size, one per rank, kept in lockstep: a sequence id names
// the same request on every rank.
class DcpBlockManager {
 public:
  // Fails on dcp < 1 and on whatever BlockManager::create rejects.
  static StatusOr<DcpBlockManager> create(int dcp, int64_t blocks_per_rank, int block_size = kDefaultBlockSize);

  int dcp() const { return static_cast<int>(ranks_.size()); }
  SeqId add_sequence();
  // Reserves n more tokens of `seq`, interleaved over the ranks. All or nothing across
  // ranks: when any rank lacks blocks, returns kResourceExhausted naming it and changes
  // nothing.
  StatusOr<DcpSlots> append(SeqId seq, int64_t n);
  Status free(SeqId seq);
  StatusOr<int64_t> length(SeqId seq) const;  // global token count
  // Rank r's dense tables for `seqs`: block table [seqs, max_blocks] (-1 unused),
  // local seqlens n_r, and the global seqlens DCP attention takes.
  Status fill_tables(int rank, std::span<const SeqId> seqs, std::vector<int32_t>& table, int64_t& max_blocks,
                     std::vector<int32_t>& local_seqlens, std::vector<int32_t>& global_seqlens) const;
  StatusOr<const BlockManager*> rank(int r) const;

 private:
  explicit DcpBlockManager(std::vector<BlockManager> ranks) : ranks_(std::move(ranks)) {}
  std::vector<BlockManager> ranks_;
};

// Encodes an append's tokens into the per-rank caches: token k of latent [n, L] /
// rope [n, R] (f32 or bf16, CPU) goes to slots.slot[k] of layer `layer` of
// caches[slots.rank[k]]. Records are per token, so every rank stores exactly the
// bytes a single cache would. Shape, rank and slot errors fail before anything is
// written; a non-finite input fails that rank's write (earlier ranks are written).
Status dcp_write(std::span<KvCache* const> caches, int layer, const DcpSlots& slots, const TensorView& latent,
                 const TensorView& rope);

// ---- local attention metadata --------------------------------------------------------------
// What rank `rank` passes to the attention operation for a batch (see the header
// comment). Inputs are host tensors: block_table [B, max_blocks] i32 (the rank's own
// table), seqlens [B] i32 GLOBAL token counts.
struct DcpLocalMetadata {
  int64_t rows = 0;       // B, or B * s_q when each query row is its own request
  int s_q = 1;            // s_q of the local call (1 when rows = B * s_q)
  bool causal = true;     // causal flag of the local call
  int64_t max_blocks = 0;
  std::vector<int32_t> block_table;  // [rows, max_blocks]
  std::vector<int32_t> seqlens;      // [rows] local visible-token counts
};
StatusOr<DcpLocalMetadata> dcp_local_metadata(int rank, int dcp, const TensorView& block_table,
                                              const TensorView& seqlens, int s_q, bool causal);

// ---- DCP attention on the host ---------------------------------------------------------------
enum class DcpCombine { kAllGather, kReduceScatterHeads };

struct DcpAttentionParams {
  TensorView q;            // [B, s_q, H, 576] f32/bf16, identical on every rank
  CacheLayerView cache;    // this rank's cache layer
  TensorView block_table;  // [B, max_blocks] i32: this rank's table (local positions)
  TensorView seqlens;      // [B] i32: GLOBAL token counts, identical on every rank
  float softmax_scale = 0.0f;
  bool causal = true;
  int num_splits = 1;      // split-KV inside each rank
  DcpCombine combine = DcpCombine::kAllGather;
  TensorView out;          // kAllGather: [B, s_q, H, 512] f32; kReduceScatterHeads: [B, s_q, H/dcp, 512]
  TensorView lse;          // kAllGather: [B, s_q, H] f32;      kReduceScatterHeads: [B, s_q, H/dcp]
};

// This rank's partial: attention over its own tokens only.
//   out_part [B, s_q, H, 512] f32, lse_part [B, s_q, H] f32 (contiguous, CPU).
Status dcp_local_attention_cpu(int rank, int dcp, const DcpAttentionParams& p, const TensorView& out_part,
                               const TensorView& lse_part, const CpuAttentionOptions& opt = {});

// Combines every rank's partial through `comm` (a host communicator):
//   out_part [B, s_q, H, 512], lse_part [B, s_q, H] -> out / lse per `mode` (header).
// kReduceScatterHeads needs H % comm.size() == 0.
Status dcp_combine(Communicator& comm, const TensorView& out_part, const TensorView& lse_part, DcpCombine mode,
                   const TensorView& out, const TensorView& lse);

// dcp_local_attention_cpu + dcp_combine: rank comm.rank() of comm.size(). Every rank
// calls it with its own cache and table and the same q, seqlens and options.
Status dcp_attention_cpu(Communicator& comm, const DcpAttentionParams& p, const CpuAttentionOptions& opt = {});

// ---- DCP combine on the device (library mlakv_nccl) ---------------------------------------------
namespace cuda {
// Device bytes dcp_combine needs for `rows` = B * s_q * H partial rows.
std::size_t dcp_combine_workspace_bytes(int dcp, int64_t rows, DcpCombine mode);
// The device twin of mlakv::dcp_combine: tensors on comm.device(), everything enqueued
// on comm.stream() (kernels and collectives), no allocation, no host synchronisation;
// makes comm's GPU the calling thread's current device. `workspace` holds
// dcp_combine_workspace_bytes(comm.size(), B * s_q * H, mode) bytes of that GPU.
// The merge is mlakv::cuda::merge_attn_states; the reduce-scatter variant scales and
// permutes with one kernel.
Status dcp_combine(Communicator& comm, const TensorView& out_part, const TensorView& lse_part, DcpCombine mode,
                   const TensorView& out, const TensorView& lse, void* workspace, std::size_t workspace_bytes);
}  // namespace cuda

}  // namespace mlakv
