// Tests for the caching allocator (include/mlakv/allocator.h, docs/allocator.md).
//
// Independent expectations:
//  - a CountingBacking wraps the host backing and keeps its own ledger of the
//    segments outstanding, so reserved_bytes / num_segments / backing counts are
//    checked against what the backing actually handed out;
//  - rounding and segment sizes are recomputed here from the written policy
//    (expect_rounded / expect_segment), not taken from the allocator;
//  - every allocation is filled with a pattern derived from its own id and
//    checked later, so any overlap or reuse of live memory shows up;
//  - hand-computed layouts (offsets in MiB) for the split / coalesce /
//    best-fit / allocation-order scenarios.
#include "mlakv/allocator.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "mlakv/rng.h"

namespace mlakv {
namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();

// ---- independent expectations ------------------------------------------------------

// Written policy: round up to 512 B.
std::size_t expect_rounded(std::size_t n) { return n == 0 ? 0 : ((n - 1) / 512 + 1) * 512; }
// Written policy: <= 1 MiB small pool (2 MiB segments); < 10 MiB a 20 MiB segment;
// otherwise the rounded request rounded up to 2 MiB.
std::size_t expect_segment(std::size_t n) {
  const std::size_t r = expect_rounded(n);
  if (r <= 1 * MiB) return 2 * MiB;
  if (r < 10 * MiB) return 20 * MiB;
  return ((r - 1) / (2 * MiB) + 1) * (2 * MiB);
}

// ---- a backing that keeps its own ledger ------------------------------------------

struct Ledger {
  std::map<void*, std::size_t> live;  // segments outstanding
  std::vector<std::size_t> allocated_sizes;  // every successful allocate, in order
  std::vector<void*> allocated_ptrs;
  std::size_t allocs = 0, frees = 0, failed = 0;
  int fail_next = 0;  // make the next N allocate calls fail with fail_code
  StatusCode fail_code = StatusCode::kInternal;

  std::size_t bytes() const {
    std::size_t b = 0;
    for (const auto& [p, n] : live) b += n;
    return b;
  }
};

class CountingBacking final : public MemoryBacking {
 public:
  CountingBacking(Ledger* ledger, std::optional<std::size_t> limit) : ledger_(ledger), inner_(make_host_backing(limit)) {}
  StatusOr<void*> allocate(std::size_t bytes) override {
    if (ledger_->fail_next > 0) {
      --ledger_->fail_next;
      ++ledger_->failed;
      return Status(ledger_->fail_code, "injected backing failure");
    }
    StatusOr<void*> p = inner_->allocate(bytes);
    if (!p.ok()) {
      ++ledger_->failed;
      return p;
    }
    ledger_->live.emplace(*p, bytes);
    ledger_->allocated_sizes.push_back(bytes);
    ledger_->allocated_ptrs.push_back(*p);
    ++ledger_->allocs;
    return p;
  }
  void release(void* p, std::size_t bytes) override {
    auto it = ledger_->live.find(p);
    EXPECT_NE(it, ledger_->live.end()) << "release of a pointer the backing never gave out";
    if (it != ledger_->live.end()) {
      EXPECT_EQ(it->second, bytes) << "release with a size different from the allocation";
      ledger_->live.erase(it);
    }
    ++ledger_->frees;
    inner_->release(p, bytes);
  }
  Device device() const override { return inner_->device(); }
  std::string name() const override { return "counting " + inner_->name(); }

 private:
  Ledger* ledger_;
  std::unique_ptr<MemoryBacking> inner_;
};

std::unique_ptr<CachingAllocator> make_allocator(Ledger* ledger, std::optional<std::size_t> limit = {}) {
  return std::make_unique<CachingAllocator>(std::make_unique<CountingBacking>(ledger, limit));
}

Allocation must_allocate(CachingAllocator& a, std::size_t n) {
  StatusOr<Allocation> r = a.allocate(n);
  EXPECT_TRUE(r.ok()) << "allocate(" << n << "): " << r.status().to_string();
  return r.ok() ? std::move(r).value() : Allocation();
}

char* base(const Allocation& a) { return static_cast<char*>(a.data()); }

// ---- byte patterns --------------------------------------------------------------------

uint64_t pattern_word(uint64_t id, std::size_t k) {
  return splitmix64(id) ^ (static_cast<uint64_t>(k) * 0xD6E8FEB86659FD93ull);
}

// Fills the first `n` bytes of p with allocation `id`'s pattern.
void fill(void* p, std::size_t n, uint64_t id) {
  auto* b = static_cast<unsigned char*>(p);
  std::size_t k = 0;
  for (; (k + 1) * 8 <= n; ++k) {
    const uint64_t w = pattern_word(id, k);
    std::memcpy(b + k * 8, &w, 8);
  }
  const uint64_t w = pattern_word(id, k);
  std::memcpy(b + k * 8, &w, n - k * 8);
}
// Returns the first byte offset that differs from the pattern, or n.
std::size_t first_mismatch(const void* p, std::size_t n, uint64_t id) {
  const auto* b = static_cast<const unsigned char*>(p);
  std::size_t k = 0;
  for (; (k + 1) * 8 <= n; ++k) {
    const uint64_t w = pattern_word(id, k);
    if (std::memcmp(b + k * 8, &w, 8) != 0) break;
  }
  for (std::size_t i = k * 8; i < n; ++i) {
    const uint64_t w = pattern_word(id, i / 8);
    if (b[i] != static_cast<unsigned char>(w >> (8 * (i % 8)))) return i;
  }
  return n;
}

struct Live {
  Allocation a;
  uint64_t id = 0;
};

void fill(Live& l) { fill(l.a.data(), l.a.size(), l.id); }
bool intact(const Live& l) { return first_mismatch(l.a.data(), l.a.size(), l.id) == l.a.size(); }

// ---- stats invariants -------------------------------------------------------------------

// Checks the stats against the ledger and the live set; `peaks` tracks the
// highest values this test has observed.
struct Peaks {
  std::size_t allocated = 0, reserved = 0;
};
void check_invariants(const CachingAllocator& alloc, const Ledger& ledger, const std::vector<Live>& live,
                      Peaks& seen, const std::string& where) {
  SCOPED_TRACE(where);
  const AllocatorStats s = alloc.stats();
  std::size_t block_bytes = 0;
  for (const Live& l : live) block_bytes += l.a.block_size();
  EXPECT_EQ(s.allocated_bytes, block_bytes);
  EXPECT_EQ(s.num_allocations, live.size());
  EXPECT_EQ(s.reserved_bytes, ledger.bytes());
  EXPECT_EQ(s.num_segments, ledger.live.size());
  EXPECT_EQ(s.num_backing_allocs, ledger.allocs);
  EXPECT_EQ(s.num_backing_frees, ledger.frees);
  EXPECT_LE(s.allocated_bytes, s.reserved_bytes);
  EXPECT_EQ(s.reserved_but_unallocated, s.reserved_bytes - s.allocated_bytes);
  EXPECT_LE(s.largest_free_block, s.reserved_but_unallocated);
  seen.allocated = std::max(seen.allocated, s.allocated_bytes);
  seen.reserved = std::max(seen.reserved, s.reserved_bytes);
  EXPECT_GE(s.peak_allocated, seen.allocated);
  EXPECT_GE(s.peak_reserved, seen.reserved);
  EXPECT_GE(s.peak_reserved, s.peak_allocated);
}

// ---- host backing -------------------------------------------------------------------------

TEST(HostBacking, AlignmentCapacityAndErrors) {
  auto b = make_host_backing(1 * MiB);
  EXPECT_EQ(b->device(), Device::cpu());
  EXPECT_EQ(b->name(), "host(limit 1048576 B)");
  EXPECT_EQ(make_host_backing()->name(), "host");

  std::vector<std::pair<void*, std::size_t>> held;
  for (std::size_t n : {1u, 255u, 257u, 4096u + 3u}) {
    StatusOr<void*> p = b->allocate(n);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u) << "size " << n;
    std::memset(*p, 0xAB, n);  // the whole range is writable
    held.emplace_back(*p, n);
  }
  const std::size_t used = 1 + 255 + 257 + 4096 + 3;
  StatusOr<void*> too_much = b->allocate(1 * MiB - used + 1);
  ASSERT_FALSE(too_much.ok());
  EXPECT_EQ(too_much.status().code(), StatusCode::kResourceExhausted);
  StatusOr<void*> exact = b->allocate(1 * MiB - used);  // exactly up to the limit
  ASSERT_TRUE(exact.ok()) << exact.status().to_string();
  b->release(*exact, 1 * MiB - used);
  for (auto [p, n] : held) b->release(p, n);
  StatusOr<void*> all = b->allocate(1 * MiB);  // released bytes count again
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  b->release(*all, 1 * MiB);

  StatusOr<void*> zero = b->allocate(0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
}

// Resident set size in bytes, from /proc/self/statm (0 where unavailable).
std::size_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long pages = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &pages, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<std::size_t>(resident) * 4096 : 0;
}

TEST(VirtualBacking, DistinctAlignedRangesCapacityAndErrors) {
  auto b = make_virtual_backing(10 * MiB);
  EXPECT_EQ(b->device(), Device::cuda(0));
  EXPECT_EQ(b->name(), "virtual(capacity 10485760 B)");

  StatusOr<void*> a = b->allocate(4 * MiB), c = b->allocate(6 * MiB - 1), d = b->allocate(1);
  ASSERT_TRUE(a.ok() && c.ok() && d.ok());
  // Ranges: 2 MiB aligned, above 2^48, pairwise disjoint.
  std::vector<std::pair<uintptr_t, std::size_t>> r = {{reinterpret_cast<uintptr_t>(*a), 4 * MiB},
                                                      {reinterpret_cast<uintptr_t>(*c), 6 * MiB - 1},
                                                      {reinterpret_cast<uintptr_t>(*d), 1}};
  std::sort(r.begin(), r.end());
  for (std::size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i].first % (2 * MiB), 0u);
    EXPECT_GE(r[i].first, uintptr_t{1} << 48);
    if (i > 0) {
      EXPECT_GE(r[i].first, r[i - 1].first + r[i - 1].second);
    }
  }
  // 10 MiB held exactly: one more byte is out of capacity.
  StatusOr<void*> over = b->allocate(1);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("10485760 B capacity"), std::string::npos) << over.status().message();
  b->release(*a, 4 * MiB);  // released bytes count again
  StatusOr<void*> again = b->allocate(4 * MiB);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_NE(*again, *a);  // ranges are never reused
  b->release(*again, 4 * MiB);
  b->release(*c, 6 * MiB - 1);
  b->release(*d, 1);

  StatusOr<void*> zero = b->allocate(0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
}

TEST(VirtualBacking, ModelsALargeGpuWithoutTouchingMemory) {
  // A 96 GiB device, far beyond this machine's RAM budget for a test: a caching
  // allocator on it places 90 GiB in 9 segments and runs out at the capacity,
  // while the process's resident memory does not grow by the bytes handed out.
  const std::size_t GiB = std::size_t{1} << 30;
  const std::size_t rss_before = resident_bytes();
  CachingAllocator alloc(make_virtual_backing(96 * GiB));
  ASSERT_TRUE(alloc.status().ok());
  EXPECT_EQ(alloc.device(), Device::cuda(0));
  std::vector<Allocation> held;
  for (int i = 0; i < 9; ++i) {
    StatusOr<Allocation> a = alloc.allocate(10 * GiB);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    held.push_back(std::move(*a));
  }
  AllocatorStats st = alloc.stats();
  EXPECT_EQ(st.reserved_bytes, 90 * GiB);
  EXPECT_EQ(st.allocated_bytes, 90 * GiB);
  EXPECT_EQ(st.num_segments, 9u);
  StatusOr<Allocation> too_big = alloc.allocate(7 * GiB);  // 6 GiB left
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  StatusOr<Allocation> fits = alloc.allocate(6 * GiB);
  ASSERT_TRUE(fits.ok()) << fits.status().to_string();
  const std::size_t rss_after = resident_bytes();
  if (rss_before != 0 && rss_after != 0) {
    EXPECT_LT(rss_after, rss_before + 256 * MiB) << "the virtual backing must not touch memory";
  }
  fits->reset();
  held.clear();
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved_bytes, 0u);
  EXPECT_EQ(alloc.stats().num_backing_frees, 10u);
}

// ---- rounding and pools -----------------------------------------------------------------------

struct RoundCase {
  std::size_t request;
  std::size_t rounded;     // 512-B rounding
  std::size_t segment;     // the fresh segment it gets
  std::size_t block;       // block handed out (rounded + unsplit remainder)
  std::size_t free_after;  // the free remainder left in the segment
};

TEST(CachingAllocator, RoundingAndSegmentSizesExact) {
  const RoundCase cases[] = {
      {1, 512, 2 * MiB, 512, 2 * MiB - 512},
      {512, 512, 2 * MiB, 512, 2 * MiB - 512},
      {513, 1024, 2 * MiB, 1024, 2 * MiB - 1024},
      {1 * MiB, 1 * MiB, 2 * MiB, 1 * MiB, 1 * MiB},                         // largest small request
      {1 * MiB + 1, 1 * MiB + 512, 20 * MiB, 1 * MiB + 512, 19 * MiB - 512},  // smallest large request
      {10 * MiB - 512, 10 * MiB - 512, 20 * MiB, 10 * MiB - 512, 10 * MiB + 512},
      {10 * MiB - 1, 10 * MiB, 10 * MiB, 10 * MiB, 0},                  // rounds to 10 MiB: own segment
      {11 * MiB + 1, 11 * MiB + 512, 12 * MiB, 12 * MiB, 0},            // 1 MiB - 512 tail not split
      {12 * MiB + 1, 12 * MiB + 512, 14 * MiB, 12 * MiB + 512, 2 * MiB - 512},  // > 1 MiB tail split
      {17 * MiB, 17 * MiB, 18 * MiB, 18 * MiB, 0},                      // tail of exactly 1 MiB: not split
      {17 * MiB - 512, 17 * MiB - 512, 18 * MiB, 17 * MiB - 512, 1 * MiB + 512},
  };
  for (const RoundCase& c : cases) {
    SCOPED_TRACE(fmt::format("request {}", c.request));
    EXPECT_EQ(expect_rounded(c.request), c.rounded);
    EXPECT_EQ(expect_segment(c.request), c.segment);
    Ledger ledger;
    auto alloc = make_allocator(&ledger);
    Allocation a = must_allocate(*alloc, c.request);
    ASSERT_FALSE(a.empty());
    EXPECT_EQ(a.size(), c.request);
    EXPECT_EQ(a.rounded_size(), c.rounded);
    EXPECT_EQ(a.block_size(), c.block);
    ASSERT_EQ(ledger.allocated_sizes.size(), 1u);
    EXPECT_EQ(ledger.allocated_sizes[0], c.segment);
    EXPECT_EQ(a.data(), ledger.allocated_ptrs[0]);  // first block starts the segment
    const AllocatorStats s = alloc->stats();
    EXPECT_EQ(s.allocated_bytes, c.block);
    EXPECT_EQ(s.reserved_bytes, c.segment);
    EXPECT_EQ(s.reserved_but_unallocated, c.free_after);
    EXPECT_EQ(s.largest_free_block, c.free_after);
  }
}

TEST(CachingAllocator, SmallPoolSplitsOffEvenOneGranule) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  Allocation a = must_allocate(*alloc, 1 * MiB);
  Allocation b = must_allocate(*alloc, 1 * MiB - 512);  // leaves exactly 512 B: split
  EXPECT_EQ(b.block_size(), 1 * MiB - 512);
  EXPECT_EQ(base(b), base(a) + 1 * MiB);
  EXPECT_EQ(alloc->stats().largest_free_block, 512u);
  Allocation c = must_allocate(*alloc, 100);  // served by the 512-B tail, no new segment
  EXPECT_EQ(base(c), base(a) + 2 * MiB - 512);
  EXPECT_EQ(ledger.allocs, 1u);
  EXPECT_EQ(alloc->stats().reserved_but_unallocated, 0u);
  EXPECT_EQ(alloc->stats().largest_free_block, 0u);
}

TEST(CachingAllocator, SmallAndLargePoolsDoNotShareBlocks) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  Allocation big = must_allocate(*alloc, 2 * MiB);  // 20 MiB large segment, 18 MiB free in it
  Allocation small = must_allocate(*alloc, 4 * KiB);  // must not come from the large segment
  EXPECT_EQ(ledger.allocated_sizes, (std::vector<std::size_t>{20 * MiB, 2 * MiB}));
  EXPECT_EQ(small.data(), ledger.allocated_ptrs[1]);
}

TEST(CachingAllocator, ZeroSizeIsAnEmptyAllocation) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  StatusOr<Allocation> z = alloc->allocate(0);
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  EXPECT_TRUE(z->empty());
  EXPECT_EQ(z->data(), nullptr);
  EXPECT_EQ(z->size(), 0u);
  EXPECT_EQ(z->block_size(), 0u);
  EXPECT_EQ(ledger.allocs, 0u);
  EXPECT_EQ(alloc->stats().num_allocations, 0u);
  EXPECT_EQ(alloc->stats().reserved_bytes, 0u);
  z->reset();  // no-op
}

TEST(CachingAllocator, OverflowingSizesAreErrorsNamingTheSize) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  // kMax and kMax - 510 overflow the 512-B rounding; kMax - 511 is a multiple
  // of 512 but overflows the 2-MiB segment rounding.
  for (std::size_t n : {kMax, kMax - 510, kMax - 511}) {
    StatusOr<Allocation> r = alloc->allocate(n);
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange) << r.status().to_string();
    EXPECT_NE(r.status().message().find(std::to_string(n)), std::string::npos) << r.status().to_string();
  }
  EXPECT_EQ(ledger.allocs + ledger.failed, 0u);  // the backing was never asked
  EXPECT_EQ(alloc->stats().num_ooms, 0u);
}

// ---- reuse, split, coalesce, best fit -----------------------------------------------------

TEST(CachingAllocator, FreedBlockIsReusedAtTheSameAddress) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  for (std::size_t n : {std::size_t{700}, 64 * KiB, 3 * MiB, 24 * MiB}) {
    SCOPED_TRACE(n);
    Allocation keep = must_allocate(*alloc, 512);  // something else live in the small pool
    Allocation a = must_allocate(*alloc, n);
    void* first = a.data();
    const std::size_t allocs = ledger.allocs;
    a.reset();
    Allocation b = must_allocate(*alloc, n);
    EXPECT_EQ(b.data(), first);
    EXPECT_EQ(ledger.allocs, allocs);  // no new segment
  }
}

TEST(CachingAllocator, SplitThenCoalesceServesTheJoinedRange) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  Live a{must_allocate(*alloc, 4 * KiB), 1}, b{must_allocate(*alloc, 4 * KiB), 2}, c{must_allocate(*alloc, 4 * KiB), 3};
  ASSERT_EQ(ledger.allocs, 1u);  // one 2 MiB segment: [A][B][C][free]
  EXPECT_EQ(base(b.a), base(a.a) + 4 * KiB);
  EXPECT_EQ(base(c.a), base(b.a) + 4 * KiB);
  fill(a), fill(b), fill(c);
  char* a_addr = base(a.a);

  b.a.reset();  // [A][free 4K][C][free]
  a.a.reset();  // [free 8K][C][free]: A and B coalesced
  EXPECT_EQ(alloc->stats().largest_free_block, 2 * MiB - 12 * KiB);
  Allocation ab = must_allocate(*alloc, 8 * KiB);  // exactly the coalesced hole
  EXPECT_EQ(base(ab), a_addr);
  EXPECT_TRUE(intact(c));

  // Free everything in the other order: the segment collapses to one free block.
  c.a.reset();  // [AB][free ...] (C merged with the tail)
  EXPECT_EQ(alloc->stats().largest_free_block, 2 * MiB - 8 * KiB);
  ab.reset();
  EXPECT_EQ(alloc->stats().largest_free_block, 2 * MiB);
  const std::string map = alloc->describe_segments();
  EXPECT_NE(map.find("  +0 2097152 B free\n"), std::string::npos) << map;
  EXPECT_EQ(ledger.frees, 0u);  // freeing never returns memory by itself

  // The mirror order, free D then E: E coalesces into its free predecessor D.
  Allocation d = must_allocate(*alloc, 4 * KiB), e = must_allocate(*alloc, 4 * KiB);
  Allocation f = must_allocate(*alloc, 4 * KiB);
  char* d_addr = base(d);
  d.reset();
  e.reset();
  EXPECT_EQ(base(must_allocate(*alloc, 8 * KiB)), d_addr);
}

TEST(CachingAllocator, BestFitPicksTheSmallestFittingBlockThenTheLowestAddress) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  // One small segment: [h64K][g][h16K][g][h32K][g][h8K][g][h8K][g][tail], g = 512-B guards.
  std::vector<Allocation> holes, guards;
  for (std::size_t n : {64 * KiB, 16 * KiB, 32 * KiB, 8 * KiB, 8 * KiB}) {
    holes.push_back(must_allocate(*alloc, n));
    guards.push_back(must_allocate(*alloc, 512));
  }
  ASSERT_EQ(ledger.allocs, 1u);
  std::vector<char*> at;
  for (Allocation& h : holes) at.push_back(base(h));
  for (Allocation& h : holes) h.reset();  // guards keep the holes apart

  EXPECT_EQ(base(must_allocate(*alloc, 16 * KiB)), at[1]);  // exact fit, not the first or largest
  Allocation x = must_allocate(*alloc, 20 * KiB);           // 32K is the smallest >= 20K
  EXPECT_EQ(base(x), at[2]);
  Allocation y = must_allocate(*alloc, 40 * KiB);  // only 64K fits among the holes
  EXPECT_EQ(base(y), at[0]);
  Allocation t1 = must_allocate(*alloc, 8 * KiB);  // two 8K holes tie: lower address first
  EXPECT_EQ(base(t1), at[3]);
  Allocation t2 = must_allocate(*alloc, 6 * KiB);  // 12K left of the 32K hole loses to the 8K hole
  EXPECT_EQ(base(t2), at[4]);
  EXPECT_EQ(ledger.allocs, 1u);
}

// ---- stats, hand-computed ------------------------------------------------------------------

TEST(CachingAllocator, StatsExactInAHandComputedScenario) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  Allocation s = must_allocate(*alloc, 1000);  // small: block 1024 in a 2 MiB segment
  AllocatorStats st = alloc->stats();
  EXPECT_EQ(st.allocated_bytes, 1024u);
  EXPECT_EQ(st.reserved_bytes, 2 * MiB);
  EXPECT_EQ(st.reserved_but_unallocated, 2 * MiB - 1024);
  EXPECT_EQ(st.largest_free_block, 2 * MiB - 1024);
  EXPECT_EQ(st.num_segments, 1u);
  EXPECT_EQ(st.num_allocations, 1u);
  EXPECT_EQ(st.num_backing_allocs, 1u);

  Allocation l = must_allocate(*alloc, 3 * MiB);  // large: 3 MiB of a 20 MiB segment
  st = alloc->stats();
  EXPECT_EQ(st.allocated_bytes, 3 * MiB + 1024);
  EXPECT_EQ(st.reserved_bytes, 22 * MiB);
  EXPECT_EQ(st.reserved_but_unallocated, 19 * MiB - 1024);
  EXPECT_EQ(st.largest_free_block, 17 * MiB);
  EXPECT_EQ(st.num_segments, 2u);
  EXPECT_EQ(st.num_allocations, 2u);

  s.reset();
  st = alloc->stats();
  EXPECT_EQ(st.allocated_bytes, 3 * MiB);
  EXPECT_EQ(st.peak_allocated, 3 * MiB + 1024);
  EXPECT_EQ(st.reserved_bytes, 22 * MiB);
  EXPECT_EQ(st.largest_free_block, 17 * MiB);

  alloc->empty_cache();  // the small segment is fully free; the large one holds `l`
  st = alloc->stats();
  EXPECT_EQ(st.reserved_bytes, 20 * MiB);
  EXPECT_EQ(st.peak_reserved, 22 * MiB);
  EXPECT_EQ(st.num_segments, 1u);
  EXPECT_EQ(st.num_backing_frees, 1u);
  EXPECT_EQ(st.reserved_but_unallocated, 17 * MiB);
  EXPECT_EQ(ledger.bytes(), 20 * MiB);

  l.reset();
  alloc->empty_cache();
  st = alloc->stats();
  EXPECT_EQ(st.reserved_bytes, 0u);
  EXPECT_EQ(st.largest_free_block, 0u);
  EXPECT_EQ(st.num_backing_frees, 2u);
  EXPECT_EQ(st.peak_allocated, 3 * MiB + 1024);
  EXPECT_TRUE(ledger.live.empty());
}

TEST(CachingAllocator, EmptyCacheReleasesOnlyFullyFreeSegmentsAndKeepsData) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  std::vector<Live> live;
  std::vector<Allocation> to_free;
  // Segment 1 (small): one live, one freed. Segment 2 (small): all freed.
  // Segment 3 (large, 20 MiB): one live, 15 MiB free. Segment 4 (16 MiB, too
  // big for segment 3's hole): freed.
  live.push_back({must_allocate(*alloc, 600 * KiB), 11});
  to_free.push_back(must_allocate(*alloc, 900 * KiB));
  to_free.push_back(must_allocate(*alloc, 1 * MiB));  // does not fit segment 1's 548 KiB tail
  to_free.push_back(must_allocate(*alloc, 1 * MiB));
  live.push_back({must_allocate(*alloc, 5 * MiB), 12});
  to_free.push_back(must_allocate(*alloc, 16 * MiB));
  ASSERT_EQ(ledger.allocated_sizes, (std::vector<std::size_t>{2 * MiB, 2 * MiB, 20 * MiB, 16 * MiB}));
  for (Live& l : live) fill(l);
  to_free.clear();

  Peaks seen;
  check_invariants(*alloc, ledger, live, seen, "before empty_cache");
  alloc->empty_cache();
  check_invariants(*alloc, ledger, live, seen, "after empty_cache");
  EXPECT_EQ(ledger.frees, 2u);
  EXPECT_EQ(ledger.live.count(ledger.allocated_ptrs[0]), 1u);  // holds live[0]
  EXPECT_EQ(ledger.live.count(ledger.allocated_ptrs[1]), 0u);
  EXPECT_EQ(ledger.live.count(ledger.allocated_ptrs[2]), 1u);  // holds live[1]
  EXPECT_EQ(ledger.live.count(ledger.allocated_ptrs[3]), 0u);
  for (const Live& l : live) EXPECT_TRUE(intact(l)) << l.id;
  alloc->empty_cache();  // nothing more to release
  EXPECT_EQ(ledger.frees, 2u);
}

// ---- out of memory -------------------------------------------------------------------------

TEST(CachingAllocator, OutOfMemoryReturnsResourceExhaustedAndChangesNothing) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger, 30 * MiB);
  Live a{must_allocate(*alloc, 15 * MiB), 1};  // own 16 MiB segment (1 MiB tail not split)
  Live b{must_allocate(*alloc, 12 * MiB), 2};  // own 12 MiB segment: 28 of 30 MiB held
  fill(a), fill(b);
  const AllocatorStats before = alloc->stats();
  const std::string map_before = alloc->describe_segments();

  StatusOr<Allocation> c = alloc->allocate(12 * MiB);  // needs 12 more MiB: 40 > 30
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("12582912"), std::string::npos) << c.status().to_string();

  const AllocatorStats after = alloc->stats();
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(after.num_segments, before.num_segments);
  EXPECT_EQ(after.num_allocations, before.num_allocations);
  EXPECT_EQ(after.largest_free_block, before.largest_free_block);
  EXPECT_EQ(after.num_backing_allocs, before.num_backing_allocs);
  EXPECT_EQ(after.num_backing_frees, before.num_backing_frees);
  EXPECT_EQ(after.num_alloc_retries, before.num_alloc_retries + 1);  // released nothing, retried once
  EXPECT_EQ(after.num_ooms, before.num_ooms + 1);
  EXPECT_EQ(ledger.failed, 2u);  // first attempt and the retry
  EXPECT_EQ(alloc->describe_segments(), map_before);
  EXPECT_TRUE(intact(a));
  EXPECT_TRUE(intact(b));

  // Once b is freed its cached block serves the same request with no backing call.
  char* b_addr = base(b.a);
  b.a.reset();
  Allocation c2 = must_allocate(*alloc, 12 * MiB);
  EXPECT_EQ(base(c2), b_addr);
  EXPECT_EQ(ledger.allocs, 2u);
  EXPECT_TRUE(intact(a));
}

TEST(CachingAllocator, OutOfMemoryReleasesCachedSegmentsAndRetriesOnce) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger, 20 * MiB);
  must_allocate(*alloc, 1 * KiB).reset();  // a cached, fully free 2 MiB small segment
  // 18 MiB (own 18 MiB segment) + the cached 2 MiB = 20 MiB: fits without releasing.
  Live big{must_allocate(*alloc, 18 * MiB), 6};
  fill(big);
  EXPECT_EQ(alloc->stats().num_alloc_retries, 0u);
  big.a.reset();
  // 19 MiB needs a 20 MiB segment: 2 + 18 + 20 > 20 fails, releasing both
  // cached segments (2 and 18 MiB) lets the retry succeed.
  Allocation huge = must_allocate(*alloc, 19 * MiB + 1);
  ASSERT_FALSE(huge.empty());
  const AllocatorStats st = alloc->stats();
  EXPECT_EQ(st.num_alloc_retries, 1u);
  EXPECT_EQ(st.num_ooms, 0u);
  EXPECT_EQ(st.num_backing_frees, 2u);
  EXPECT_EQ(st.num_backing_allocs, 3u);
  EXPECT_EQ(st.reserved_bytes, 20 * MiB);
  EXPECT_EQ(st.num_segments, 1u);
  EXPECT_EQ(ledger.bytes(), 20 * MiB);
}

TEST(CachingAllocator, OtherBackingErrorsPassThroughWithoutRetry) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  Allocation cached = must_allocate(*alloc, 1 * KiB);
  cached.reset();
  ledger.fail_next = 1;
  ledger.fail_code = StatusCode::kInternal;
  StatusOr<Allocation> r = alloc->allocate(5 * MiB);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("injected backing failure"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(alloc->stats().num_alloc_retries, 0u);
  EXPECT_EQ(ledger.frees, 0u);  // the cache was not released for a non-OOM error
  EXPECT_EQ(alloc->stats().num_ooms, 0u);
}

// ---- options and RAII -----------------------------------------------------------------------

TEST(CachingAllocator, InvalidSetupIsReportedNotAborted) {
  struct Bad {
    CachingAllocator::Options o;
    const char* names;
  };
  std::vector<Bad> bad;
  CachingAllocator::Options o;
  o.min_block_size = 0;
  bad.push_back({o, "min_block_size"});
  o = {};
  o.min_block_size = 384;
  bad.push_back({o, "min_block_size"});
  o = {};
  o.round_large = 1000;
  bad.push_back({o, "round_large"});
  o = {};
  o.small_segment = 512 * KiB;
  bad.push_back({o, "small_segment"});
  o = {};
  o.large_segment = 8 * MiB;
  bad.push_back({o, "large_segment"});
  for (const Bad& b : bad) {
    EXPECT_FALSE(b.o.validate().ok()) << b.names;
    CachingAllocator alloc(make_host_backing(), b.o);
    EXPECT_EQ(alloc.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(alloc.status().message().find(b.names), std::string::npos) << alloc.status().to_string();
    StatusOr<Allocation> r = alloc.allocate(100);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(CachingAllocator::Options{}.validate().ok());

  CachingAllocator none(nullptr);
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(none.allocate(1).ok());
  none.empty_cache();  // harmless
  EXPECT_EQ(none.stats().reserved_bytes, 0u);
}

TEST(CachingAllocator, RaiiFreesOnDestructionAndMovedFromHandlesDoNothing) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  {
    Allocation a = must_allocate(*alloc, 4 * KiB);
    EXPECT_EQ(alloc->stats().num_allocations, 1u);
  }
  EXPECT_EQ(alloc->stats().num_allocations, 0u);
  EXPECT_EQ(alloc->stats().allocated_bytes, 0u);

  Allocation a = must_allocate(*alloc, 4 * KiB);
  void* p = a.data();
  Allocation b(std::move(a));  // move construction transfers ownership
  EXPECT_TRUE(a.empty());      // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data(), p);
  a.reset();  // moved-from: no-op
  EXPECT_EQ(alloc->stats().num_allocations, 1u);

  Allocation c = must_allocate(*alloc, 8 * KiB);
  c = std::move(b);  // c's 8 KiB block is freed first, then c owns b's block
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(alloc->stats().num_allocations, 1u);
  EXPECT_EQ(alloc->stats().allocated_bytes, 4 * KiB);
  Allocation& alias = c;
  c = std::move(alias);  // self-move keeps the block
  EXPECT_EQ(c.data(), p);
  c.reset();
  c.reset();
  EXPECT_EQ(alloc->stats().num_allocations, 0u);
  EXPECT_EQ(alloc->stats().allocated_bytes, 0u);
}

TEST(CachingAllocator, DescribeSegmentsListsEveryBlockInAddressOrder) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  Allocation x = must_allocate(*alloc, 1000);
  Allocation y = must_allocate(*alloc, 3000);
  const std::string expected = fmt::format(
      "caching allocator on cpu (backing counting host): segments 1, reserved 2097152 B, allocated 4096 B\n"
      "segment {} small 2097152 B\n"
      "  +0 1024 B allocated (requested 1000 B)\n"
      "  +1024 3072 B allocated (requested 3000 B)\n"
      "  +4096 2093056 B free\n",
      static_cast<const void*>(ledger.allocated_ptrs[0]));
  EXPECT_EQ(alloc->describe_segments(), expected);
}

// ---- allocation order (docs/reference.md section 6) ------------------------------------------------

// Per "layer": a persistent 4 MiB tensor (the absorbed pair) and an 8 MiB
// transient scratch (the dequantized kv_b_proj), four layers, on a 40 MiB
// device. Layouts below are offsets in MiB inside 20 MiB large segments.
struct OrderResult {
  AllocatorStats stats;
  bool kv_fits = false;  // a 20 MiB KV cache afterwards, without empty_cache
  std::size_t released_by_empty_cache = 0;
};
OrderResult run_layers(bool persistent_first) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger, 40 * MiB);
  std::vector<Allocation> persistent;
  for (int layer = 0; layer < 4; ++layer) {
    if (persistent_first) {
      persistent.push_back(must_allocate(*alloc, 4 * MiB));
      Allocation scratch = must_allocate(*alloc, 8 * MiB);
    } else {
      Allocation scratch = must_allocate(*alloc, 8 * MiB);
      persistent.push_back(must_allocate(*alloc, 4 * MiB));
    }
  }
  OrderResult r;
  r.stats = alloc->stats();
  StatusOr<Allocation> kv = alloc->allocate(20 * MiB);
  r.kv_fits = kv.ok();
  if (kv.ok()) kv->reset();
  const std::size_t frees = ledger.frees;
  alloc->empty_cache();
  r.released_by_empty_cache = ledger.frees - frees;
  return r;
}

TEST(CachingAllocator, PersistentBeforeScratchKeepsAWholeSegmentFree) {
  // Scratch first:  seg1 after layer 1 [S 0-8][P 8-12][free 12-20]; layer 2
  // reuses S at 0 (best fit, lowest address) and puts P at 12; layer 3 P at 16;
  // layer 4's P finds no hole and opens seg2. End: seg1 [free 0-8][P][P][P],
  // seg2 [P 0-4][free 4-20]: holes of 8 and 16 MiB, nothing releasable.
  const OrderResult bad = run_layers(false);
  EXPECT_EQ(bad.stats.allocated_bytes, 16 * MiB);
  EXPECT_EQ(bad.stats.reserved_bytes, 40 * MiB);
  EXPECT_EQ(bad.stats.reserved_but_unallocated, 24 * MiB);
  EXPECT_EQ(bad.stats.largest_free_block, 16 * MiB);
  EXPECT_FALSE(bad.kv_fits);
  EXPECT_EQ(bad.released_by_empty_cache, 0u);

  // Persistent first: the persistent tensors pack seg1 from the bottom
  // [P][P][P][P][free 16-20]; the scratch always sits above them and its hole
  // coalesces away, and layer 4's scratch opens seg2, which is whole and free
  // once the scratch goes.
  const OrderResult good = run_layers(true);
  EXPECT_EQ(good.stats.allocated_bytes, 16 * MiB);
  EXPECT_EQ(good.stats.reserved_bytes, 40 * MiB);
  EXPECT_EQ(good.stats.reserved_but_unallocated, 24 * MiB);
  EXPECT_EQ(good.stats.largest_free_block, 20 * MiB);
  EXPECT_TRUE(good.kv_fits);
  EXPECT_EQ(good.released_by_empty_cache, 1u);
}

// ---- random stress with patterns --------------------------------------------------------

TEST(CachingAllocator, RandomAllocFreeKeepsEveryLivePatternAndInvariant) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  std::mt19937_64 rng(20240611);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto log_uniform = [&](double lo, double hi) {
    return static_cast<std::size_t>(std::exp(std::log(lo) + unit(rng) * (std::log(hi) - std::log(lo))));
  };
  std::vector<Live> live;
  std::map<char*, char*> ranges;  // live [begin, begin + block_size)
  Peaks seen;
  uint64_t next_id = 1;
  std::size_t small_seen = 0, large_seen = 0, huge_seen = 0;
  const int kOps = 4000;
  for (int op = 0; op < kOps; ++op) {
    const bool do_alloc = live.empty() || unit(rng) < (live.size() < 40 ? 0.6 : 0.4);
    if (do_alloc) {
      const double pick = unit(rng);
      std::size_t n;
      if (pick < 0.75) {
        n = log_uniform(1, 1 * MiB);
        ++small_seen;
      } else if (pick < 0.96) {
        n = log_uniform(1 * MiB + 1, 10 * MiB);
        ++large_seen;
      } else {
        n = log_uniform(10 * MiB, 24 * MiB);
        ++huge_seen;
      }
      Live l{must_allocate(*alloc, n), next_id++};
      ASSERT_FALSE(l.a.empty()) << "op " << op;
      ASSERT_EQ(reinterpret_cast<uintptr_t>(l.a.data()) % 256, 0u);
      ASSERT_EQ(l.a.rounded_size(), expect_rounded(n));
      if (l.a.rounded_size() <= 1 * MiB) {
        ASSERT_EQ(l.a.block_size(), l.a.rounded_size());  // small pool always splits
      } else {
        ASSERT_GE(l.a.block_size(), l.a.rounded_size());
        ASSERT_LE(l.a.block_size() - l.a.rounded_size(), 1 * MiB);  // large: unsplit tail <= 1 MiB
      }
      // No overlap with any live block (independent of the patterns).
      char* b = base(l.a);
      char* e = b + l.a.block_size();
      auto after = ranges.lower_bound(b);
      if (after != ranges.end()) {
        ASSERT_LE(e, after->first) << "op " << op;
      }
      if (after != ranges.begin()) {
        ASSERT_LE(std::prev(after)->second, b) << "op " << op;
      }
      ranges.emplace(b, e);
      fill(l);
      live.push_back(std::move(l));
    } else {
      const std::size_t i = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      ASSERT_TRUE(intact(live[i])) << "op " << op << " id " << live[i].id;
      ranges.erase(base(live[i].a));
      std::swap(live[i], live.back());
      live.pop_back();
    }
    if (unit(rng) < 0.01) alloc->empty_cache();
    check_invariants(*alloc, ledger, live, seen, fmt::format("op {}", op));
    if (op % 500 == 499) {
      for (const Live& l : live) ASSERT_TRUE(intact(l)) << "op " << op << " id " << l.id;
    }
  }
  for (const Live& l : live) EXPECT_TRUE(intact(l)) << "end, id " << l.id;
  EXPECT_GT(small_seen, 1000u);
  EXPECT_GT(large_seen, 200u);
  EXPECT_GT(huge_seen, 20u);
  live.clear();
  alloc->empty_cache();
  EXPECT_EQ(alloc->stats().reserved_bytes, 0u);
  EXPECT_TRUE(ledger.live.empty());
}

TEST(CachingAllocator, ConcurrentThreadsKeepTheirPatterns) {
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  constexpr int kThreads = 4;
  std::vector<int> corrupt(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      std::vector<Live> mine;
      for (int op = 0; op < 600; ++op) {
        if (mine.empty() || rng() % 5 < 3) {
          const std::size_t n = rng() % 4 == 0 ? 1 * MiB + rng() % (3 * MiB) : 1 + rng() % (64 * KiB);
          StatusOr<Allocation> r = alloc->allocate(n);
          if (!r.ok()) {
            ++corrupt[t];
            continue;
          }
          mine.push_back({std::move(r).value(), static_cast<uint64_t>(t) << 32 | static_cast<uint64_t>(op)});
          fill(mine.back());
        } else {
          const std::size_t i = rng() % mine.size();
          if (!intact(mine[i])) ++corrupt[t];
          std::swap(mine[i], mine.back());
          mine.pop_back();
        }
      }
      for (const Live& l : mine) {
        if (!intact(l)) ++corrupt[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(corrupt[t], 0) << "thread " << t;
  const AllocatorStats st = alloc->stats();
  EXPECT_EQ(st.num_allocations, 0u);
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.reserved_bytes, ledger.bytes());
}

// ---- overhead bounds ------------------------------------------------------------------------

// Uniform requests of size r (a multiple of 512 B) in segments of S bytes:
// every block boundary lies at a multiple of r from the segment base (splits
// cut r bytes from the front of a free block whose offset is a multiple of r),
// so every free block except the tail is a multiple of r and fits a request,
// and with the large-pool rule the remainders never go unsplit (checked per
// case below). A new segment is therefore opened only when every segment holds
// k = floor(S / r) live blocks, so at all times
//     num_segments <= ceil(peak live count / k),
//     reserved <= S * ceil(peak / k)   and, at a peak of n = m*k blocks,
//     reserved / allocated <= S / (k * r).
// Small (r = 3072, S = 2 MiB): k = 682, ratio <= 1.001. Large (r = 3 MiB,
// S = 20 MiB): k = 6 with a 2 MiB tail; free blocks are 3j or 3j+2 MiB, so
// taking 3 MiB leaves 0 or >= 2 MiB (> 1 MiB, split): ratio <= 20/18 = 1.11.
void run_uniform_workload(std::size_t r, std::size_t segment, std::size_t max_live, int ops, uint64_t seed) {
  SCOPED_TRACE(fmt::format("r {} segment {}", r, segment));
  Ledger ledger;
  auto alloc = make_allocator(&ledger);
  const std::size_t k = segment / r;
  std::mt19937_64 rng(seed);
  std::vector<Allocation> live;
  std::size_t peak = 0;
  for (int op = 0; op < ops; ++op) {
    const bool grow = live.empty() || (live.size() < max_live && rng() % 100 < 60);
    if (grow) {
      live.push_back(must_allocate(*alloc, r));
      ASSERT_EQ(live.back().block_size(), r);
      // Touch both ends so the test notices a block outside its segment.
      *static_cast<char*>(live.back().data()) = 1;
      static_cast<char*>(live.back().data())[r - 1] = 2;
    } else {
      const std::size_t i = rng() % live.size();
      std::swap(live[i], live.back());
      live.pop_back();
    }
    peak = std::max(peak, live.size());
    const AllocatorStats st = alloc->stats();
    const std::size_t bound_segments = (peak + k - 1) / k;
    ASSERT_LE(st.num_segments, bound_segments) << "op " << op << " peak " << peak;
    ASSERT_LE(st.reserved_bytes, segment * bound_segments);
  }
  const AllocatorStats st = alloc->stats();
  EXPECT_GE(peak, 2 * k);  // the workload really spanned several segments
  const double ratio = static_cast<double>(st.peak_reserved) / static_cast<double>(st.peak_allocated);
  const double bound = static_cast<double>(segment * ((peak + k - 1) / k)) / static_cast<double>(peak * r);
  EXPECT_LE(ratio, bound + 1e-12) << "peak reserved " << st.peak_reserved << " peak allocated " << st.peak_allocated;
}

TEST(CachingAllocator, OverheadBoundUniformSmallRequests) {
  run_uniform_workload(3072, 2 * MiB, 3000, 12000, 7);
}

TEST(CachingAllocator, OverheadBoundUniformLargeRequests) {
  run_uniform_workload(3 * MiB, 20 * MiB, 40, 3000, 8);
}

}  // namespace
}  // namespace mlakv
