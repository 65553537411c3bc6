// Per-rank cache accounting for DCP: dcp BlockManagers in lockstep, appends split by
// the interleaving, and the writer that routes each token to its rank's cache.
#include <fmt/format.h>

#include <limits>
#include <vector>

#include "mlakv/dcp.h"
#include "mlakv/formats.h"

namespace mlakv {

StatusOr<DcpBlockManager> DcpBlockManager::create(int dcp, int64_t blocks_per_rank, int block_size) {
  if (dcp < 1) return invalid_argument(fmt::format("DcpBlockManager: dcp must be >= 1, got {}", dcp));
  std::vector<BlockManager> ranks;
  ranks.reserve(static_cast<std::size_t>(dcp));
  for (int r = 0; r < dcp; ++r) {
    MLAKV_ASSIGN_OR_RETURN(BlockManager b, BlockManager::create(blocks_per_rank, block_size));
    ranks.push_back(std::move(b));
  }
  return DcpBlockManager(std::move(ranks));
}

SeqId DcpBlockManager::add_sequence() {
  SeqId id = -1;
  for (auto& b : ranks_) id = b.add_sequence();  // every rank hands out the same id
  return id;
}

StatusOr<DcpSlots> DcpBlockManager::append(SeqId seq, int64_t n) {
  if (n < 0) return invalid_argument(fmt::format("append: n must be >= 0, got {}", n));
  MLAKV_ASSIGN_OR_RETURN(const int64_t len, length(seq));
  const int P = dcp();
  // Check every rank first: BlockManager::append is all-or-nothing per rank only.
  std::vector<int64_t> add(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    const BlockManager& b = ranks_[static_cast<std::size_t>(r)];
    const int64_t have = dcp_local_count(len, r, P);
    add[static_cast<std::size_t>(r)] = dcp_local_count(len + n, r, P) - have;
    MLAKV_ASSIGN_OR_RETURN(auto table, b.block_table(seq));
    const int64_t need_blocks = (have + add[static_cast<std::size_t>(r)] + b.block_size() - 1) / b.block_size() -
                                static_cast<int64_t>(table.size());
    if (need_blocks > b.num_free_blocks()) {
      return resource_exhausted(fmt::format(
          "append: sequence {} needs {} more blocks on dcp rank {} for {} of its {} new tokens; {} of {} are free", seq,
          need_blocks, r, add[static_cast<std::size_t>(r)], n, b.num_free_blocks(), b.num_blocks()));
    }
  }
  DcpSlots s;
  s.first_position = len;
  s.per_rank.resize(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    MLAKV_ASSIGN_OR_RETURN(s.per_rank[static_cast<std::size_t>(r)],
                           ranks_[static_cast<std::size_t>(r)].append(seq, add[static_cast<std::size_t>(r)]));
  }
  s.rank.resize(static_cast<std::size_t>(n));
  s.slot.resize(static_cast<std::size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    const int64_t pos = len + k;
    const int r = dcp_owner(pos, P);
    // Local index of pos minus the rank's count before the append.
    const int64_t i = dcp_local_position(pos, P) - dcp_local_count(len, r, P);
    s.rank[static_cast<std::size_t>(k)] = r;
    s.slot[static_cast<std::size_t>(k)] = s.per_rank[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
  }
  return s;
}

Status DcpBlockManager::free(SeqId seq) {
  MLAKV_RETURN_IF_ERROR(length(seq).status());  // exists everywhere, or nothing changes
  for (auto& b : ranks_) MLAKV_RETURN_IF_ERROR(b.free(seq));
  return Status::Ok();
}

StatusOr<int64_t> DcpBlockManager::length(SeqId seq) const {
  int64_t total = 0;
  for (const auto& b : ranks_) {
    MLAKV_ASSIGN_OR_RETURN(const int64_t l, b.length(seq));
    total += l;
  }
  return total;
}

Status DcpBlockManager::fill_tables(int rank, std::span<const SeqId> seqs, std::vector<int32_t>& table,
                                    int64_t& max_blocks, std::vector<int32_t>& local_seqlens,
                                    std::vector<int32_t>& global_seqlens) const {
  if (rank < 0 || rank >= dcp()) return invalid_argument(fmt::format("fill_tables: rank {} is outside [0, {})", rank, dcp()));
  MLAKV_RETURN_IF_ERROR(ranks_[static_cast<std::size_t>(rank)].fill_tables(seqs, table, max_blocks, local_seqlens));
  global_seqlens.clear();
  for (SeqId s : seqs) {
    MLAKV_ASSIGN_OR_RETURN(const int64_t l, length(s));
    if (l > std::numeric_limits<int32_t>::max()) return out_of_range(fmt::format("sequence {} has {} tokens, more than an i32 seqlen holds", s, l));
    global_seqlens.push_back(static_cast<int32_t>(l));
  }
  return Status::Ok();
}

StatusOr<const BlockManager*> DcpBlockManager::rank(int r) const {
  if (r < 0 || r >= dcp()) return invalid_argument(fmt::format("rank {} is outside [0, {})", r, dcp()));
  return &ranks_[static_cast<std::size_t>(r)];
}

Status dcp_write(std::span<KvCache* const> caches, int layer, const DcpSlots& slots, const TensorView& latent,
                 const TensorView& rope) {
  const int P = static_cast<int>(caches.size());
  if (P < 1) return invalid_argument("dcp_write: no caches");
  for (int r = 0; r < P; ++r) {
    if (caches[static_cast<std::size_t>(r)] == nullptr) return invalid_argument(fmt::format("dcp_write: cache {} is null", r));
  }
  const int64_t n = static_cast<int64_t>(slots.slot.size());
  if (static_cast<int64_t>(slots.rank.size()) != n) {
    return invalid_argument(fmt::format("dcp_write: slots has {} ranks for {} slots", slots.rank.size(), n));
  }
  const int L = caches[0]->config().latent_dim, R = caches[0]->config().rope_dim;
  MLAKV_RETURN_IF_ERROR(check_tensor(latent, "latent", {{DType::kF32, DType::kBF16}, {n, L}}, Device::cpu()));
  MLAKV_RETURN_IF_ERROR(check_tensor(rope, "rope", {{DType::kF32, DType::kBF16}, {n, R}}, Device::cpu()));
  for (int64_t k = 0; k < n; ++k) {
    const int r = slots.rank[static_cast<std::size_t>(k)];
    if (r < 0 || r >= P) return out_of_range(fmt::format("dcp_write: token {} names rank {}, have {} caches", k, r, P));
    MLAKV_ASSIGN_OR_RETURN(const CacheLayerView v, caches[static_cast<std::size_t>(r)]->layer(layer));
    const int64_t slot = slots.slot[static_cast<std::size_t>(k)];
    if (slot >= v.num_slots()) {
      return out_of_range(fmt::format("dcp_write: token {}'s slot {} is past rank {}'s {} slots", k, slot, r, v.num_slots()));
    }
  }
  // Gather each rank's rows (keeping the dtype) and write them with one call per rank.
  const std::size_t le = dtype_size(latent.dtype), re = dtype_size(rope.dtype);
  for (int r = 0; r < P; ++r) {
    std::vector<int64_t> s;
    std::vector<uint8_t> lat, rp;
    for (int64_t k = 0; k < n; ++k) {
      if (slots.rank[static_cast<std::size_t>(k)] != r) continue;
      s.push_back(slots.slot[static_cast<std::size_t>(k)]);
      const auto* lrow = static_cast<const uint8_t*>(latent.data) + k * latent.stride(0) * static_cast<int64_t>(le);
      const auto* rrow = static_cast<const uint8_t*>(rope.data) + k * rope.stride(0) * static_cast<int64_t>(re);
      lat.insert(lat.end(), lrow, lrow + L * le);
      rp.insert(rp.end(), rrow, rrow + R * re);
    }
    if (s.empty()) continue;
    const int64_t m = static_cast<int64_t>(s.size());
    MLAKV_RETURN_IF_ERROR(caches[static_cast<std::size_t>(r)]
                              ->write(layer, TensorView::contiguous(s.data(), DType::kI64, {m}),
                                      TensorView::contiguous(lat.data(), latent.dtype, {m, L}),
                                      TensorView::contiguous(rp.data(), rope.dtype, {m, R}))
                              .with_context(fmt::format("dcp_write rank {}", r)));
  }
  return Status::Ok();
}

}  // namespace mlakv
