// The caching allocator (include/mlakv/allocator.h, docs/allocator.md).
//
// State, all under one mutex:
//   segments_  base address -> {bytes, pool}: what is held from the backing;
//   blocks_    address -> Block: every block of every segment, allocated or
//              free, so a block's neighbours are its map neighbours (checked to
//              be in the same segment);
//   free_[p]   (size, address) of the free blocks of pool p: best fit is
//              lower_bound({size, nullptr}), the smallest block >= size, ties
//              broken by the lowest address (PyTorch's BlockComparatorSize).
// Invariants: the blocks of a segment tile it exactly; no two free blocks of a
// segment are adjacent (frees coalesce); a segment is fully free iff it is one
// free block; reserved = sum of segment bytes; allocated = sum of allocated
// block bytes.
#include "mlakv/allocator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <utility>

#include "core/check.h"

namespace mlakv {

MemoryBacking::~MemoryBacking() = default;

// ---- host backing ---------------------------------------------------------------

namespace {

class HostBacking final : public MemoryBacking {
 public:
  explicit HostBacking(std::optional<std::size_t> limit) : limit_(limit) {}

  StatusOr<void*> allocate(std::size_t bytes) override {
    if (bytes == 0) return invalid_argument("host backing: allocate(0): a segment must have bytes > 0");
    if (limit_ && bytes > *limit_ - held_) {
      return resource_exhausted(fmt::format("host backing: {} B requested with {} B of the {} B limit held",
                                            bytes, held_, *limit_));
    }
    void* p = ::operator new(bytes, std::align_val_t{alloc_defaults::kHostAlignment}, std::nothrow);
    if (p == nullptr) {
      return resource_exhausted(fmt::format("host backing: the system refused {} B", bytes));
    }
    held_ += bytes;
    return p;
  }

  void release(void* p, std::size_t bytes) override {
    ::operator delete(p, std::align_val_t{alloc_defaults::kHostAlignment});
    held_ -= bytes;
  }

  Device device() const override { return Device::cpu(); }
  std::string name() const override {
    return limit_ ? fmt::format("host(limit {} B)", *limit_) : std::string("host");
  }

 private:
  std::optional<std::size_t> limit_;
  std::size_t held_ = 0;  // bytes currently allocated, checked against limit_
};

// Hands out address ranges above 2^48 without memory behind them (allocator.h).
// Ranges are bump-allocated and never reused: 2^63 - 2^48 bytes of address space
// outlast any experiment, and fresh addresses make a stale pointer obvious.
class VirtualBacking final : public MemoryBacking {
 public:
  static constexpr uintptr_t kBase = uintptr_t{1} << 48;
  static constexpr std::size_t kAlign = std::size_t{2} << 20;  // 2 MiB, like cudaMalloc's large pages

  explicit VirtualBacking(std::size_t capacity) : capacity_(capacity) {}

  StatusOr<void*> allocate(std::size_t bytes) override {
    if (bytes == 0) return invalid_argument("virtual backing: allocate(0): a segment must have bytes > 0");
    if (bytes > capacity_ - held_) {
      return resource_exhausted(fmt::format("virtual backing: {} B requested with {} B of the {} B capacity held",
                                            bytes, held_, capacity_));
    }
    // bytes <= capacity, and next_ grows by at most the total ever allocated
    // (rounded): overflow would need 2^63 B of churn.
    const uintptr_t span = (static_cast<uintptr_t>(bytes) + kAlign - 1) / kAlign * kAlign;
    if (next_ > std::numeric_limits<uintptr_t>::max() / 2 - span) {
      return resource_exhausted("virtual backing: address space exhausted");
    }
    void* p = reinterpret_cast<void*>(next_);
    next_ += span;
    held_ += bytes;
    live_.emplace(p, bytes);
    return p;
  }

  void release(void* p, std::size_t bytes) override {
    auto it = live_.find(p);
    MLAKV_DCHECK(it != live_.end() && it->second == bytes, "virtual backing: release of a range it did not hand out");
    if (it == live_.end()) return;
    held_ -= it->second;
    live_.erase(it);
    (void)bytes;
  }

  Device device() const override { return Device::cuda(0); }
  std::string name() const override { return fmt::format("virtual(capacity {} B)", capacity_); }

 private:
  std::size_t capacity_;
  std::size_t held_ = 0;
  uintptr_t next_ = kBase;
  std::map<void*, std::size_t> live_;  // ranges handed out and not released
};

// x rounded up to a multiple of `granule`, or nothing when that overflows.
std::optional<std::size_t> round_up(std::size_t x, std::size_t granule) {
  if (x > std::numeric_limits<std::size_t>::max() - (granule - 1)) return std::nullopt;
  return (x + granule - 1) / granule * granule;
}

bool is_pow2(std::size_t x) { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace

std::unique_ptr<MemoryBacking> make_host_backing(std::optional<std::size_t> capacity_limit) {
  return std::make_unique<HostBacking>(capacity_limit);
}

std::unique_ptr<MemoryBacking> make_virtual_backing(std::size_t capacity_bytes) {
  return std::make_unique<VirtualBacking>(capacity_bytes);
}

// ---- options --------------------------------------------------------------------

Status CachingAllocatorOptions::validate() const {
  if (!is_pow2(min_block_size)) {
    return invalid_argument(fmt::format("min_block_size: must be a power of two, got {}", min_block_size));
  }
  const std::pair<const char*, std::size_t> granular[] = {
      {"small_size", small_size},       {"small_segment", small_segment}, {"min_large_alloc", min_large_alloc},
      {"large_segment", large_segment}, {"round_large", round_large},
  };
  for (const auto& [name, value] : granular) {
    if (value == 0 || value % min_block_size != 0) {
      return invalid_argument(fmt::format("{}: must be a positive multiple of min_block_size {}, got {}", name,
                                          min_block_size, value));
    }
  }
  // A fresh segment must hold any request routed to it.
  if (small_segment < small_size) {
    return invalid_argument(fmt::format("small_segment {} must be >= small_size {} (a small request must fit one)",
                                        small_segment, small_size));
  }
  if (large_segment < min_large_alloc) {
    return invalid_argument(fmt::format(
        "large_segment {} must be >= min_large_alloc {} (requests below min_large_alloc share one)", large_segment,
        min_large_alloc));
  }
  return Status::Ok();
}

// ---- allocator state --------------------------------------------------------------

namespace {

enum Pool : int { kSmall = 0, kLarge = 1 };

struct Segment {
  std::size_t bytes = 0;
  Pool pool = kSmall;
};

struct Block {
  char* segment = nullptr;  // base of the segment the block lies in
  std::size_t size = 0;     // block bytes
  std::size_t requested = 0;  // bytes asked for (allocated blocks only)
  bool allocated = false;
  Pool pool = kSmall;
};

using FreeSet = std::set<std::pair<std::size_t, char*>>;  // (size, address), best fit first

}  // namespace

struct CachingAllocator::Impl {
  std::unique_ptr<MemoryBacking> backing;
  Status init_status;
  mutable std::mutex mu;

  std::map<char*, Segment> segments;
  std::map<char*, Block> blocks;
  FreeSet free_blocks[2];
  AllocatorStats counters;  // reserved_but_unallocated / largest_free_block are derived in stats()

  void note_allocated(std::ptrdiff_t delta) {
    counters.allocated_bytes = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(counters.allocated_bytes) + delta);
    counters.peak_allocated = std::max(counters.peak_allocated, counters.allocated_bytes);
  }
  void note_reserved(std::ptrdiff_t delta) {
    counters.reserved_bytes = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(counters.reserved_bytes) + delta);
    counters.peak_reserved = std::max(counters.peak_reserved, counters.reserved_bytes);
  }

  std::size_t largest_free() const {
    std::size_t best = 0;
    for (const FreeSet& f : free_blocks) {
      if (!f.empty()) best = std::max(best, f.rbegin()->first);
    }
    return best;
  }

  // Returns `seg` to the backing; the segment must be one free block.
  void release_segment(std::map<char*, Segment>::iterator seg) {
    auto blk = blocks.find(seg->first);
    MLAKV_CHECK(blk != blocks.end() && !blk->second.allocated && blk->second.size == seg->second.bytes,
                "a segment released whole must be one free block");
    free_blocks[seg->second.pool].erase({blk->second.size, blk->first});
    blocks.erase(blk);
    backing->release(seg->first, seg->second.bytes);
    note_reserved(-static_cast<std::ptrdiff_t>(seg->second.bytes));
    counters.num_segments -= 1;
    counters.num_backing_frees += 1;
    segments.erase(seg);
  }

  // Releases every fully-free segment; returns how many.
  std::size_t release_free_segments() {
    std::size_t released = 0;
    for (auto seg = segments.begin(); seg != segments.end();) {
      auto next = std::next(seg);
      const Block& head = blocks.at(seg->first);
      if (!head.allocated && head.size == seg->second.bytes) {
        release_segment(seg);
        ++released;
      }
      seg = next;
    }
    return released;
  }
};

CachingAllocator::CachingAllocator(std::unique_ptr<MemoryBacking> backing, Options options)
    : options_(options), impl_(std::make_unique<Impl>()) {
  impl_->backing = std::move(backing);
  if (impl_->backing == nullptr) {
    impl_->init_status = failed_precondition("caching allocator: constructed with a null MemoryBacking");
  } else if (Status s = options_.validate(); !s.ok()) {
    impl_->init_status = failed_precondition("caching allocator: invalid options: " + s.message());
  }
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  MLAKV_DCHECK(impl_->counters.num_allocations == 0, "CachingAllocator destroyed while Allocations are live");
  if (impl_->backing == nullptr) return;
  // Segments that still hold a live block are leaked, not released (header, "Lifetime").
  impl_->release_free_segments();
}

Status CachingAllocator::status() const { return impl_->init_status; }

Device CachingAllocator::device() const {
  return impl_->backing ? impl_->backing->device() : Device::cpu();
}

StatusOr<Allocation> CachingAllocator::allocate(std::size_t bytes) {
  MLAKV_RETURN_IF_ERROR(impl_->init_status);
  if (bytes == 0) return Allocation();

  // Sizes first, outside the lock: they depend only on the request.
  const std::optional<std::size_t> rounded = round_up(bytes, options_.min_block_size);
  if (!rounded) {
    return out_of_range(fmt::format("allocate: {} B overflows when rounded up to a multiple of {} B", bytes,
                                    options_.min_block_size));
  }
  const Pool pool = *rounded <= options_.small_size ? kSmall : kLarge;
  std::optional<std::size_t> segment_bytes;
  if (pool == kSmall) {
    segment_bytes = options_.small_segment;
  } else if (*rounded < options_.min_large_alloc) {
    segment_bytes = options_.large_segment;
  } else {
    segment_bytes = round_up(*rounded, options_.round_large);
    if (!segment_bytes) {
      return out_of_range(fmt::format("allocate: {} B overflows when its segment is rounded up to a multiple of {} B",
                                      bytes, options_.round_large));
    }
  }

  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);

  // 1. Best fit among the cached free blocks of the pool.
  char* addr = nullptr;
  FreeSet& free_set = s.free_blocks[pool];
  if (auto it = free_set.lower_bound({*rounded, nullptr}); it != free_set.end()) {
    addr = it->second;
    free_set.erase(it);
  } else {
    // 2. A new segment; on resource_exhausted release the cache and retry once.
    StatusOr<void*> got = s.backing->allocate(*segment_bytes);
    if (!got.ok() && got.status().code() == StatusCode::kResourceExhausted) {
      s.release_free_segments();
      s.counters.num_alloc_retries += 1;
      got = s.backing->allocate(*segment_bytes);
    }
    if (!got.ok()) {
      const std::string what = fmt::format(
          "allocate {} B (rounded {} B, new {} segment of {} B) on {} backing {}", bytes, *rounded,
          pool == kSmall ? "small" : "large", *segment_bytes, device_name(s.backing->device()), s.backing->name());
      if (got.status().code() != StatusCode::kResourceExhausted) return got.status().with_context(what);
      s.counters.num_ooms += 1;
      return resource_exhausted(fmt::format(
          "{}: out of memory after releasing cached segments ({}); allocator holds {} B allocated, {} B reserved, "
          "{} B reserved but unallocated, largest free block {} B",
          what, got.status().message(), s.counters.allocated_bytes, s.counters.reserved_bytes,
          s.counters.reserved_bytes - s.counters.allocated_bytes, s.largest_free()));
    }
    if (*got == nullptr) {
      return internal_error(fmt::format("backing {} returned a null pointer for {} B", s.backing->name(),
                                        *segment_bytes));
    }
    addr = static_cast<char*>(*got);
    s.segments.emplace(addr, Segment{*segment_bytes, pool});
    s.blocks.emplace(addr, Block{addr, *segment_bytes, 0, false, pool});
    s.note_reserved(static_cast<std::ptrdiff_t>(*segment_bytes));
    s.counters.num_segments += 1;
    s.counters.num_backing_allocs += 1;
  }

  // 3. Split off the remainder when it is worth keeping as its own block:
  // small pool, any remainder of at least one granule; large pool, only a
  // remainder above small_size (smaller tails would only serve small requests,
  // which never come to the large pool).
  Block& blk = s.blocks.at(addr);
  const std::size_t remainder = blk.size - *rounded;
  const bool split = pool == kSmall ? remainder >= options_.min_block_size : remainder > options_.small_size;
  if (split) {
    char* rest = addr + *rounded;
    s.blocks.emplace(rest, Block{blk.segment, remainder, 0, false, pool});
    free_set.insert({remainder, rest});
    blk.size = *rounded;
  }
  blk.allocated = true;
  blk.requested = bytes;
  s.note_allocated(static_cast<std::ptrdiff_t>(blk.size));
  s.counters.num_allocations += 1;
  return Allocation(this, addr, bytes, *rounded, blk.size);
}

void CachingAllocator::free_block(void* data) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.blocks.find(static_cast<char*>(data));
  if (it == s.blocks.end() || !it->second.allocated) {
    MLAKV_DCHECK(false, "Allocation freed into an allocator that does not hold it");
    return;
  }
  Block& blk = it->second;
  blk.allocated = false;
  blk.requested = 0;
  s.note_allocated(-static_cast<std::ptrdiff_t>(blk.size));
  s.counters.num_allocations -= 1;

  // Coalesce with free neighbours of the same segment; the lower block survives.
  FreeSet& free_set = s.free_blocks[blk.pool];
  if (it != s.blocks.begin()) {
    auto prev = std::prev(it);
    if (prev->second.segment == blk.segment && !prev->second.allocated) {
      free_set.erase({prev->second.size, prev->first});
      prev->second.size += blk.size;
      s.blocks.erase(it);
      it = prev;
    }
  }
  if (auto next = std::next(it); next != s.blocks.end()) {
    if (next->second.segment == it->second.segment && !next->second.allocated) {
      free_set.erase({next->second.size, next->first});
      it->second.size += next->second.size;
      s.blocks.erase(next);
    }
  }
  free_set.insert({it->second.size, it->first});
}

void CachingAllocator::empty_cache() {
  if (impl_->backing == nullptr) return;
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->release_free_segments();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  AllocatorStats out = impl_->counters;
  out.reserved_but_unallocated = out.reserved_bytes - out.allocated_bytes;
  out.largest_free_block = impl_->largest_free();
  return out;
}

std::string CachingAllocator::describe_segments() const {
  const Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  std::string out = fmt::format("caching allocator on {} (backing {}): segments {}, reserved {} B, allocated {} B\n",
                                device_name(device()), s.backing ? s.backing->name() : std::string("none"),
                                s.segments.size(), s.counters.reserved_bytes, s.counters.allocated_bytes);
  for (const auto& [base, seg] : s.segments) {
    out += fmt::format("segment {} {} {} B\n", static_cast<const void*>(base), seg.pool == kSmall ? "small" : "large",
                       seg.bytes);
    for (auto it = s.blocks.find(base); it != s.blocks.end() && it->second.segment == base; ++it) {
      const Block& b = it->second;
      if (b.allocated) {
        out += fmt::format("  +{} {} B allocated (requested {} B)\n", it->first - base, b.size, b.requested);
      } else {
        out += fmt::format("  +{} {} B free\n", it->first - base, b.size);
      }
    }
  }
  return out;
}

// ---- Allocation -------------------------------------------------------------------

Allocation::Allocation(Allocation&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      rounded_size_(std::exchange(other.rounded_size_, 0)),
      block_size_(std::exchange(other.block_size_, 0)) {}

Allocation& Allocation::operator=(Allocation&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    rounded_size_ = std::exchange(other.rounded_size_, 0);
    block_size_ = std::exchange(other.block_size_, 0);
  }
  return *this;
}

void Allocation::reset() {
  if (data_ != nullptr && owner_ != nullptr) owner_->free_block(data_);
  owner_ = nullptr;
  data_ = nullptr;
  size_ = rounded_size_ = block_size_ = 0;
}

}  // namespace mlakv
