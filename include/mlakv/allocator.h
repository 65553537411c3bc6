// A caching allocator behind one backing interface (docs/allocator.md).
//
// The allocator takes large segments from a MemoryBacking (host memory today,
// cudaMalloc segments later), carves them into 512-B-granular blocks, and keeps
// freed blocks cached for reuse. Memory goes back to the backing only through
// an explicit empty_cache() (or the single release-and-retry when the backing
// runs out). The policy follows PyTorch's CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp); docs/allocator.md lists which facts were
// reproduced and where mlakv differs.
//
// Thread safety: every CachingAllocator method, and Allocation::reset / the
// Allocation destructor, takes one mutex around the allocator state, so
// allocations may be made and freed from any thread. The backing is called with
// that mutex held and need not be thread-safe itself.
//
// Lifetime: the CachingAllocator must outlive every Allocation it returned.
// Destroying it with live allocations is a bug (asserted in debug builds); in
// release builds the segments that still hold live blocks are leaked rather
// than released, so the outstanding pointers stay readable, but destroying such
// an Allocation afterwards is undefined behaviour.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "mlakv/status.h"
#include "mlakv/tensor.h"

namespace mlakv {

// Every size constant of the allocator, in one place. The values are PyTorch's
// (kMinBlockSize, kSmallSize, kSmallBuffer, kMinLargeAlloc, kLargeBuffer,
// kRoundLarge); CachingAllocator::Options uses them as defaults.
namespace alloc_defaults {
inline constexpr std::size_t kKiB = std::size_t{1} << 10;
inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kMinBlockSize = 512;           // every request is rounded up to a multiple
inline constexpr std::size_t kSmallSize = 1 * kMiB;         // rounded requests <= this use the small pool
inline constexpr std::size_t kSmallSegment = 2 * kMiB;      // small-pool segments
inline constexpr std::size_t kMinLargeAlloc = 10 * kMiB;    // large requests below this share a segment...
inline constexpr std::size_t kLargeSegment = 20 * kMiB;     // ...of this size
inline constexpr std::size_t kRoundLarge = 2 * kMiB;        // larger requests: segment = request rounded to this
inline constexpr std::size_t kHostAlignment = 256;          // host backing alignment (cudaMalloc's guarantee)
}  // namespace alloc_defaults

// Where segments come from. One backing serves one CachingAllocator, which calls
// it with its lock held. Implementations: make_host_backing() and
// make_virtual_backing() here; a CUDA backing (cudaMalloc / cudaFree on one
// device) implements the same four calls.
class MemoryBacking {
 public:
  virtual ~MemoryBacking();

  // Returns `bytes` (> 0) of memory aligned to at least 256 B, or
  // resource_exhausted when the memory is not available (the allocator then
  // releases its cached segments and retries once). Any other error code is
  // passed through to the caller of CachingAllocator::allocate without a retry.
  virtual StatusOr<void*> allocate(std::size_t bytes) = 0;
  // Returns memory from allocate(); `bytes` is the size it was allocated with.
  virtual void release(void* p, std::size_t bytes) = 0;
  // The device the memory lives on; the allocator never reads or writes it.
  virtual Device device() const = 0;
  virtual std::string name() const = 0;  // "host", "host(limit 1073741824 B)", "cuda:0"
};

// Host memory aligned to alloc_defaults::kHostAlignment (256 B). With a
// capacity_limit, allocate() returns resource_exhausted once the bytes held
// would exceed the limit, which models a GPU of a given size and exercises the
// out-of-memory paths. allocate(0) returns invalid_argument.
std::unique_ptr<MemoryBacking> make_host_backing(std::optional<std::size_t> capacity_limit = {});

// Address ranges without memory behind them, to model a GPU of `capacity_bytes`
// (say 96 GiB) on a machine with less RAM: the caching allocator never reads or
// writes the memory it manages, so its placement decisions, stats and
// out-of-memory behaviour are exactly those of a real backing of that size.
// allocate() hands out distinct, non-overlapping ranges aligned to 2 MiB from a
// region above 2^48 (a non-canonical address on x86-64 and AArch64 user space,
// so an accidental dereference faults instead of corrupting memory); it never
// touches memory and never reuses a released range. resource_exhausted once the
// bytes held would exceed the capacity; allocate(0) returns invalid_argument.
// device() is cuda:0 (it stands in for one), name() "virtual(capacity N B)".
// Never read or write through its pointers: callers that fill memory must check
// that the allocator's device is the CPU first.
std::unique_ptr<MemoryBacking> make_virtual_backing(std::size_t capacity_bytes);

// A snapshot of the allocator's counters. All byte counts are block bytes.
struct AllocatorStats {
  std::size_t allocated_bytes = 0;           // bytes of blocks handed out and not yet freed
  std::size_t reserved_bytes = 0;            // bytes of segments held from the backing
  std::size_t reserved_but_unallocated = 0;  // reserved - allocated: cached free blocks
  std::size_t peak_allocated = 0;            // highest allocated_bytes seen
  std::size_t peak_reserved = 0;             // highest reserved_bytes seen
  std::size_t num_segments = 0;              // segments held from the backing
  std::size_t num_allocations = 0;           // live allocations
  // The largest single free block (either pool): the biggest request that is
  // served without new backing memory. A KV cache larger than this needs a new
  // segment even when reserved_but_unallocated is larger (the free bytes are
  // scattered in holes).
  std::size_t largest_free_block = 0;
  std::size_t num_alloc_retries = 0;   // backing allocations retried after releasing the cache
  std::size_t num_ooms = 0;            // allocate() calls that returned resource_exhausted
  std::size_t num_backing_allocs = 0;  // successful MemoryBacking::allocate calls (segments created)
  std::size_t num_backing_frees = 0;   // MemoryBacking::release calls (segments returned)
};

class CachingAllocator;

// Pool and rounding policy (CachingAllocator::Options); the defaults are
// alloc_defaults, PyTorch's values. The split thresholds derive from these:
// a small-pool block is split when the remainder is >= min_block_size, a
// large-pool block when the remainder is > small_size.
// Valid: min_block_size a power of two, the other sizes positive multiples of
// it, small_segment >= small_size, large_segment >= min_large_alloc;
// validate() returns invalid_argument naming the first violation.
struct CachingAllocatorOptions {
  std::size_t min_block_size = alloc_defaults::kMinBlockSize;
  std::size_t small_size = alloc_defaults::kSmallSize;
  std::size_t small_segment = alloc_defaults::kSmallSegment;
  std::size_t min_large_alloc = alloc_defaults::kMinLargeAlloc;
  std::size_t large_segment = alloc_defaults::kLargeSegment;
  std::size_t round_large = alloc_defaults::kRoundLarge;
  bool expandable_segments = false;  // accepted and ignored for now (no growable segments yet)

  Status validate() const;
};

// A block handed out by CachingAllocator: move-only, frees back into the
// allocator on destruction or reset(). An empty Allocation (default-constructed,
// moved-from, reset, or the result of allocate(0)) has data() == nullptr and
// does nothing when destroyed.
class Allocation {
 public:
  Allocation() = default;
  ~Allocation() { reset(); }
  Allocation(Allocation&& other) noexcept;
  Allocation& operator=(Allocation&& other) noexcept;  // frees what *this held first
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }                  // bytes requested
  std::size_t rounded_size() const { return rounded_size_; }  // size rounded up to the 512-B granule
  // Bytes the block occupies: rounded_size() plus a remainder that was too small
  // to split off (small pool: never; large pool: up to 1 MiB). This is what
  // AllocatorStats::allocated_bytes counts.
  std::size_t block_size() const { return block_size_; }
  bool empty() const { return data_ == nullptr; }
  explicit operator bool() const { return data_ != nullptr; }

  // Frees the block back into the allocator's cache now; no-op when empty.
  void reset();

 private:
  friend class CachingAllocator;
  Allocation(CachingAllocator* owner, void* data, std::size_t size, std::size_t rounded, std::size_t block)
      : owner_(owner), data_(data), size_(size), rounded_size_(rounded), block_size_(block) {}

  CachingAllocator* owner_ = nullptr;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t rounded_size_ = 0;
  std::size_t block_size_ = 0;
};

class CachingAllocator {
 public:
  using Options = CachingAllocatorOptions;

  // Takes ownership of the backing. Invalid options or a null backing do not
  // abort: status() reports the problem and every allocate() returns it.
  explicit CachingAllocator(std::unique_ptr<MemoryBacking> backing, Options options = {});
  ~CachingAllocator();  // releases every segment without live blocks; see "Lifetime" above
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // OK, or why the allocator could not be set up (failed_precondition).
  Status status() const;

  // Returns a block of at least `bytes` bytes. Blocks start at multiples of
  // min_block_size inside a segment, so data() has the segment's alignment
  // (256 B for the host backing and for cudaMalloc) when min_block_size >= 256.
  //  - bytes == 0: an empty Allocation (data() == nullptr), nothing reserved,
  //    as PyTorch does for zero-size storage.
  //  - bytes so large that rounding it to the block or segment granule would
  //    overflow size_t: out_of_range naming the size.
  //  - the backing has no memory even after releasing every cached free
  //    segment once: resource_exhausted naming the request and the allocator's
  //    allocated / reserved / largest-free-block figures. Live allocations are
  //    untouched; only fully-free cached segments may have been released.
  //  - any other backing error: that error, with context.
  StatusOr<Allocation> allocate(std::size_t bytes);

  // Returns every fully-free segment (a segment whose blocks are all free,
  // hence coalesced into one) to the backing. Live blocks, and free blocks in
  // segments that still hold a live block, stay where they are.
  void empty_cache();

  AllocatorStats stats() const;
  Device device() const;  // the backing's device (cpu when there is no backing)
  const Options& options() const { return options_; }

  // A text map for debugging, one line per segment then one per block, in
  // address order:
  //   caching allocator on cpu (backing host): segments 2, reserved 23068672 B, allocated 1536 B
  //   segment 0x7f3a00000000 small 2097152 B
  //     +0 1024 B allocated (requested 1000 B)
  //     +1024 2096128 B free
  std::string describe_segments() const;

 private:
  friend class Allocation;
  struct Impl;
  void free_block(void* data);  // called by Allocation::reset

  Options options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mlakv
