#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <new>

#include "mlakv/cache.h"

namespace mlakv {

BlockManager::BlockManager(int64_t num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size), refcount_(static_cast<std::size_t>(num_blocks), 0) {
  free_.reserve(static_cast<std::size_t>(num_blocks));
  // LIFO: block 0 is handed out first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

StatusOr<BlockManager> BlockManager::create(int64_t num_blocks, int block_size) {
  if (num_blocks < 1 || num_blocks > std::numeric_limits<int32_t>::max()) {
    return invalid_argument(fmt::format("num_blocks must be in [1, 2^31), got {}", num_blocks));
  }
  if (block_size < 1) return invalid_argument(fmt::format("block_size must be >= 1, got {}", block_size));
  if (num_blocks > std::numeric_limits<int64_t>::max() / block_size) {
    return invalid_argument("num_blocks * block_size overflows int64");
  }
  try {  // two tables of num_blocks entries: up to 16 GiB for 2^31 - 1 blocks
    return BlockManager(num_blocks, block_size);
  } catch (const std::bad_alloc&) {
    return resource_exhausted(fmt::format("cannot allocate the tables of {} blocks", num_blocks));
  }
}

SeqId BlockManager::add_sequence() {
  const SeqId id = next_id_++;
  seqs_.emplace(id, Sequence{});
  return id;
}

StatusOr<const BlockManager::Sequence*> BlockManager::find(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found(fmt::format("sequence {} does not exist", seq));
  return &it->second;
}

StatusOr<std::vector<int64_t>> BlockManager::append(SeqId seq, int64_t n) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found(fmt::format("append: sequence {} does not exist", seq));
  if (n < 0) return invalid_argument(fmt::format("append: n must be >= 0, got {}", n));
  Sequence& s = it->second;
  // Computed without s.length + n (n may be near 2^63) and without need_tokens +
  // block_size - 1; the slot vector is allocated only once the blocks are known to exist.
  const int64_t capacity = static_cast<int64_t>(s.blocks.size()) * block_size_;
  const int64_t need_tokens = n - (capacity - s.length);  // capacity >= length
  const int64_t need_blocks = need_tokens > 0 ? need_tokens / block_size_ + (need_tokens % block_size_ != 0) : 0;
  if (need_blocks > num_free_blocks()) {
    return resource_exhausted(fmt::format(
        "append: sequence {} needs {} more blocks for {} tokens, only {} of {} are free", seq, need_blocks, n,
        num_free_blocks(), num_blocks_));
  }
  std::vector<int64_t> slots;
  try {
    slots.resize(static_cast<std::size_t>(n));
    s.blocks.reserve(s.blocks.size() + static_cast<std::size_t>(need_blocks));
  } catch (const std::bad_alloc&) {
    return resource_exhausted(fmt::format("append: cannot allocate {} slots for sequence {}", n, seq));
  }
  for (int64_t i = 0; i < need_blocks; ++i) {
    const int32_t b = free_.back();
    free_.pop_back();
    refcount_[static_cast<std::size_t>(b)] = 1;
    s.blocks.push_back(b);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = s.length + i;
    const int64_t block = s.blocks[static_cast<std::size_t>(pos / block_size_)];
    slots[static_cast<std::size_t>(i)] = block * block_size_ + pos % block_size_;
  }
  s.length += n;
  return slots;
}

StatusOr<BlockManager::Fork> BlockManager::fork(SeqId parent) {
  MLAKV_ASSIGN_OR_RETURN(const Sequence* p, find(parent));
  const bool partial_tail = p->length % block_size_ != 0;
  if (partial_tail && free_.empty()) {
    return resource_exhausted(
        fmt::format("fork: sequence {} has a partial tail block to copy and no block is free", parent));
  }
  Sequence child;
  child.length = p->length;
  child.blocks = p->blocks;
  Fork f;
  for (std::size_t i = 0; i < child.blocks.size(); ++i) {
    if (partial_tail && i + 1 == child.blocks.size()) {
      const int32_t dst = free_.back();
      free_.pop_back();
      refcount_[static_cast<std::size_t>(dst)] = 1;
      f.has_tail_copy = true;
      f.tail_src = child.blocks[i];
      f.tail_dst = dst;
      child.blocks[i] = dst;
    } else {
      ++refcount_[static_cast<std::size_t>(child.blocks[i])];
    }
  }
  f.child = next_id_++;
  seqs_.emplace(f.child, std::move(child));
  return f;
}

Status BlockManager::free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found(fmt::format("free: sequence {} does not exist", seq));
  for (int32_t b : it->second.blocks) {
    if (--refcount_[static_cast<std::size_t>(b)] == 0) free_.push_back(b);
  }
  seqs_.erase(it);
  return Status::Ok();
}

StatusOr<int64_t> BlockManager::length(SeqId seq) const {
  MLAKV_ASSIGN_OR_RETURN(const Sequence* s, find(seq));
  return s->length;
}

StatusOr<std::span<const int32_t>> BlockManager::block_table(SeqId seq) const {
  MLAKV_ASSIGN_OR_RETURN(const Sequence* s, find(seq));
  return std::span<const int32_t>(s->blocks);
}

int BlockManager::ref_count(int32_t block) const {
  if (block < 0 || block >= num_blocks_) return 0;
  return refcount_[static_cast<std::size_t>(block)];
}

Status BlockManager::fill_tables(std::span<const SeqId> seqs, std::vector<int32_t>& table, int64_t& max_blocks,
                                 std::vector<int32_t>& seqlens) const {
  max_blocks = 1;
  for (SeqId id : seqs) {
    MLAKV_ASSIGN_OR_RETURN(const Sequence* s, find(id));
    max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(s->blocks.size()));
    if (s->length > std::numeric_limits<int32_t>::max()) {
      return out_of_range(fmt::format("sequence {} has {} tokens, more than an i32 seqlen holds", id, s->length));
    }
  }
  table.assign(seqs.size() * static_cast<std::size_t>(max_blocks), -1);
  seqlens.assign(seqs.size(), 0);
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = seqs_.at(seqs[i]);
    std::copy(s.blocks.begin(), s.blocks.end(), table.begin() + static_cast<std::ptrdiff_t>(i * static_cast<std::size_t>(max_blocks)));
    seqlens[i] = static_cast<int32_t>(s.length);
  }
  return Status::Ok();
}

}  // namespace mlakv
