// Tests for weight absorption (mlakv/absorb.h, docs/absorb.md).
//
// Independent expectations:
//  - W_UK_T / W_UV of tiny kv_b_proj matrices are written out by hand below (literal
//    arrays), for a dense weight and for an fp8-block one whose codes come from this
//    file's own e4m3 table;
//  - allocation order is read from where the blocks land in a fresh segment, against
//    offsets recomputed here from the sizes and the 512-B granule;
//  - the memory figures of GLM-5.2 TP4 are pinned to the values docs/absorb.md quotes,
//    and the requested bytes recomputed from the geometry;
//  - reloads are checked against the tensors' previous addresses and new hand-computed
//    values; errors against the names and shapes the inputs were built with.
#include "mlakv/absorb.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "mlakv/safetensors.h"
#include "mlakv/synthetic_weights.h"

namespace mlakv {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

std::string kvb(int layer) { return fmt::format("model.layers.{}.self_attn.kv_b_proj.", layer); }

// ---- independent number formats ------------------------------------------------------------

// e4m3 codes of the small integers used below: (1 + m/8) 2^(e-7), bias 7.
uint8_t e4m3_int(int v) {
  static const std::map<int, uint8_t> kCode = {{0, 0x00}, {1, 0x38}, {2, 0x40}, {3, 0x44},
                                               {4, 0x48}, {5, 0x4A}, {6, 0x4C}, {7, 0x4E}};
  const uint8_t c = kCode.at(v < 0 ? -v : v);
  return v < 0 ? static_cast<uint8_t>(c | 0x80) : c;
}

float bf16_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// f32 -> bf16, round to nearest even, for finite values (written from the definition).
uint16_t bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t low = u & 0xFFFFu, high = u >> 16;
  if (low > 0x8000u || (low == 0x8000u && (high & 1u))) return static_cast<uint16_t>(high + 1);
  return static_cast<uint16_t>(high);
}

// ---- plumbing --------------------------------------------------------------------------------

template <class T>
void put(TensorMap& m, const std::string& name, DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
  const Status st = m.add(name, dt, std::move(shape), v.data(), v.size() * sizeof(T));
  ASSERT_TRUE(st.ok()) << st.to_string();
}

// A model config with `layers` layers whose kv_b_proj is [H*(P+V), L].
ModelConfig tiny_config(int layers, int H = 2, int P = 3, int V = 2, int L = 4) {
  ModelConfig c;
  c.name = "tiny";
  c.model_type = "deepseek_v3";
  c.hidden_size = 8;
  c.num_layers = layers;
  c.num_heads = H;
  c.kv_lora_rank = L;
  c.qk_nope_head_dim = P;
  c.qk_rope_head_dim = 2;
  c.v_head_dim = V;
  return c;
}

const KvBProjGeometry kTiny{2, 3, 2, 4};  // H, P, V, L: kv_b_proj [10, 4]

// Dense f32 kv_b_proj [10, 4] with W[n][k] = 10 n + k + offset.
void add_dense(TensorMap& m, int layer, float offset = 0) {
  std::vector<float> w(40);
  for (int n = 0; n < 10; ++n) {
    for (int k = 0; k < 4; ++k) w[static_cast<std::size_t>(n * 4 + k)] = static_cast<float>(10 * n + k) + offset;
  }
  put(m, kvb(layer) + "weight", DType::kF32, {10, 4}, w);
}

// Hand-written for W[n][k] = 10 n + k: W_UK_T[h] = rows h*5 .. h*5+2; W_UV[h][l][v] = W[h*5+3+v][l].
const std::vector<float> kDenseUkt = {0,  1,  2,  3,  10, 11, 12, 13, 20, 21, 22, 23,   // head 0, p = 0..2
                                      50, 51, 52, 53, 60, 61, 62, 63, 70, 71, 72, 73};  // head 1
const std::vector<float> kDenseUv = {30, 40, 31, 41, 32, 42, 33, 43,   // head 0, l = 0..3, v = 0..1
                                     80, 90, 81, 91, 82, 92, 83, 93};  // head 1

// fp8 block kv_b_proj [10, 4], blocks of 4 rows x 2 columns: q[n][k] = n - 5 + k,
// scale_inv = [[1, 2], [0.5, 4], [0.25, 8]] (a multiplier).
WeightQuantOptions fp8_tiny_options() {
  WeightQuantOptions o;
  o.fp8_block_rows = 4;
  o.fp8_block_cols = 2;
  return o;
}
void add_fp8(TensorMap& m, int layer) {
  std::vector<uint8_t> q(40);
  for (int n = 0; n < 10; ++n) {
    for (int k = 0; k < 4; ++k) q[static_cast<std::size_t>(n * 4 + k)] = e4m3_int(n - 5 + k);
  }
  put(m, kvb(layer) + "weight", DType::kF8E4M3, {10, 4}, q);
  put(m, kvb(layer) + "weight_scale_inv", DType::kF32, {3, 2}, std::vector<float>{1, 2, 0.5f, 4, 0.25f, 8});
}
// Worked by hand: row n = 0: q -5 -4 | -3 -2 times 1 | 2 -> -5 -4 -6 -4; and so on.
const std::vector<float> kFp8Ukt = {-5, -4, -6, -4, -4, -3, -4, -2, -3, -2, -2, 0,     // head 0: rows 0, 1, 2
                                    0, 0.5f, 8, 12, 0.5f, 1, 12, 16, 1, 1.5f, 16, 20};  // head 1: rows 5, 6, 7
// W_UV[0]: rows 3 = [-2, -1, 0, 2] and 4 = [-0.5, 0, 4, 8]; W_UV[1]: rows 8 = [0.75, 1, 40, 48], 9 = [1, 1.25, 48, 56].
const std::vector<float> kFp8Uv = {-2, -0.5f, -1, 0, 0, 4, 2, 8,  0.75f, 1, 1, 1.25f, 40, 48, 48, 56};

std::vector<float> read(const TensorView& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = t.dtype == DType::kF32 ? t.ptr<const float>()[i] : bf16_value(t.ptr<const uint16_t>()[i]);
  }
  return out;
}

void expect_pair(const AbsorbedLayer& l, const std::vector<float>& ukt, const std::vector<float>& uv,
                 const std::string& what) {
  ASSERT_TRUE(l.has_pair()) << what;
  EXPECT_TRUE(l.values_written) << what;
  EXPECT_EQ(l.w_uk_t().shape_string(), fmt::format("[{}, {}, {}]", l.geometry.num_heads, l.geometry.qk_nope_head_dim,
                                                   l.geometry.kv_lora_rank))
      << what;
  EXPECT_EQ(l.w_uv().shape_string(),
            fmt::format("[{}, {}, {}]", l.geometry.num_heads, l.geometry.kv_lora_rank, l.geometry.v_head_dim))
      << what;
  EXPECT_EQ(read(l.w_uk_t()), ukt) << what;
  EXPECT_EQ(read(l.w_uv()), uv) << what;
}

// A host backing that records the segments it hands out.
struct SegmentLog {
  std::vector<std::pair<uintptr_t, std::size_t>> segments;
};
class RecordingBacking final : public MemoryBacking {
 public:
  explicit RecordingBacking(SegmentLog* log) : inner_(make_host_backing()), log_(log) {}
  StatusOr<void*> allocate(std::size_t bytes) override {
    StatusOr<void*> p = inner_->allocate(bytes);
    if (p.ok()) log_->segments.emplace_back(reinterpret_cast<uintptr_t>(*p), bytes);
    return p;
  }
  void release(void* p, std::size_t bytes) override { inner_->release(p, bytes); }
  Device device() const override { return inner_->device(); }
  std::string name() const override { return "recording host"; }

 private:
  std::unique_ptr<MemoryBacking> inner_;
  SegmentLog* log_;
};

std::size_t granule(std::size_t n) { return (n + 511) / 512 * 512; }

// ---- values ---------------------------------------------------------------------------------------

TEST(AbsorbValues, DenseTinyMatchesTheHandComputedPair) {
  TensorMap m;
  add_dense(m, 3);
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (DType sdt : {DType::kF32, DType::kBF16}) {
      for (AllocationOrder order : {AllocationOrder::kPersistentFirst, AllocationOrder::kScratchFirst}) {
        for (bool stage : {false, true}) {
          CachingAllocator alloc(make_host_backing());
          AbsorbOptions opt;
          opt.dtype = dt;
          opt.scratch_dtype = sdt;
          opt.order = order;
          opt.stage_quantized = stage;
          AbsorbedLayer layer;
          LayerStorageChange change;
          const std::string what = fmt::format("dtype {} scratch {} {} stage {}", dtype_name(dt), dtype_name(sdt),
                                               allocation_order_name(order), stage);
          const Status st = absorb_kv_b_proj(m, kvb(3), kTiny, alloc, opt, layer, &change);
          ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
          expect_pair(layer, kDenseUkt, kDenseUv, what);
          EXPECT_EQ(layer.dtype, dt);
          EXPECT_EQ(layer.device, Device::cpu());
          EXPECT_EQ(layer.source_encoding, WeightEncoding::kDense);
          EXPECT_FALSE(change.had_pair);
          // Only the pair stays allocated; scratch and staging went back to the cache.
          EXPECT_EQ(alloc.stats().num_allocations, 2u) << what;
          EXPECT_EQ(alloc.stats().allocated_bytes, granule(24 * dtype_size(dt)) + granule(16 * dtype_size(dt)));
        }
      }
    }
  }
}

TEST(AbsorbValues, Fp8BlockThroughATensorMapMatchesTheHandComputedPair) {
  TensorMap m;
  add_fp8(m, 0);
  for (DType dt : {DType::kBF16, DType::kF32}) {
    CachingAllocator alloc(make_host_backing());
    AbsorbOptions opt;
    opt.dtype = dt;
    opt.quant = fp8_tiny_options();
    AbsorbedLayer layer;
    const Status st = absorb_kv_b_proj(m, kvb(0), kTiny, alloc, opt, layer);
    ASSERT_TRUE(st.ok()) << st.to_string();
    expect_pair(layer, kFp8Ukt, kFp8Uv, std::string(dtype_name(dt)));
    EXPECT_EQ(layer.source_encoding, WeightEncoding::kFp8Block);
  }
}

TEST(AbsorbValues, Bf16PairIsTheSameFromF32AndBf16ScratchAndRoundsOnce) {
  // Random fp8 codes and non-power-of-two scales: products need rounding to bf16. The
  // expectation rounds the exact product (double) to f32, then to bf16 with this file's
  // own RNE: that is one rounding of the correctly rounded f32 value.
  const KvBProjGeometry g{3, 8, 4, 16};  // N = 36
  TensorMap m;
  std::mt19937 rng(7);
  std::vector<uint8_t> q(36 * 16);
  for (uint8_t& c : q) {
    do {
      c = static_cast<uint8_t>(rng());
    } while ((c & 0x7F) == 0x7F);  // no NaN codes
  }
  const std::vector<float> scales = {0.37f, 1.9f, 0.013f, 5.1f, 0.7f, 2.3f};  // blocks of 16 x 8: [3, 2]
  put(m, kvb(0) + "weight", DType::kF8E4M3, {36, 16}, q);
  put(m, kvb(0) + "weight_scale_inv", DType::kF32, {3, 2}, scales);
  auto e4m3 = [](uint8_t c) {
    const int e = (c >> 3) & 15, f = c & 7;
    const double v = e == 0 ? std::ldexp(f, -9) : std::ldexp(8 + f, e - 10);
    return (c & 0x80) ? -v : v;
  };
  std::vector<float> want_ukt, want_uv(3 * 16 * 4);
  auto w = [&](int n, int k) {
    const double exact = e4m3(q[static_cast<std::size_t>(n * 16 + k)]) * scales[static_cast<std::size_t>((n / 16) * 2 + k / 8)];
    return bf16_value(bf16_rne(static_cast<float>(exact)));
  };
  for (int h = 0; h < 3; ++h) {
    for (int p = 0; p < 8; ++p) {
      for (int l = 0; l < 16; ++l) want_ukt.push_back(w(h * 12 + p, l));
    }
    for (int l = 0; l < 16; ++l) {
      for (int v = 0; v < 4; ++v) want_uv[static_cast<std::size_t>((h * 16 + l) * 4 + v)] = w(h * 12 + 8 + v, l);
    }
  }
  for (DType sdt : {DType::kF32, DType::kBF16}) {
    CachingAllocator alloc(make_host_backing());
    AbsorbOptions opt;
    opt.scratch_dtype = sdt;
    opt.quant.fp8_block_rows = 16;
    opt.quant.fp8_block_cols = 8;
    AbsorbedLayer layer;
    const Status st = absorb_kv_b_proj(m, kvb(0), g, alloc, opt, layer);
    ASSERT_TRUE(st.ok()) << st.to_string();
    expect_pair(layer, want_ukt, want_uv, fmt::format("scratch {}", dtype_name(sdt)));
  }
}

// ---- allocation orders -----------------------------------------------------------------------------

TEST(AllocationOrders, PersistentFirstPlacesThePairBelowTheScratchAndLegacyAbove) {
  // All blocks are small-pool (< 1 MiB) and go into one fresh 2 MiB segment in
  // allocation order: offsets reveal the order. Geometry H=4, P=64, V=32, L=128:
  // W_UK_T 64 KiB, W_UV 32 KiB (bf16), scratch [384, 128] f32 = 192 KiB.
  const KvBProjGeometry g{4, 64, 32, 128};
  TensorMap m;
  put(m, kvb(0) + "weight", DType::kBF16, {384, 128}, std::vector<uint16_t>(384 * 128, 0x3F80));  // 1.0
  const std::size_t ukt = 4 * 64 * 128 * 2, uv = 4 * 128 * 32 * 2, scratch = 384 * 128 * 4;
  for (AllocationOrder order : {AllocationOrder::kPersistentFirst, AllocationOrder::kScratchFirst}) {
    SegmentLog log;
    CachingAllocator alloc(std::make_unique<RecordingBacking>(&log));
    AbsorbOptions opt;
    opt.order = order;
    opt.scratch_dtype = DType::kF32;
    AbsorbedLayer layer;
    const Status st = absorb_kv_b_proj(m, kvb(0), g, alloc, opt, layer);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(log.segments.size(), 1u);
    const uintptr_t base = log.segments[0].first;
    const uintptr_t k = reinterpret_cast<uintptr_t>(layer.w_uk_t_storage.data());
    const uintptr_t v = reinterpret_cast<uintptr_t>(layer.w_uv_storage.data());
    if (order == AllocationOrder::kPersistentFirst) {
      EXPECT_EQ(k - base, 0u);
      EXPECT_EQ(v - base, granule(ukt));
    } else {
      EXPECT_EQ(k - base, granule(scratch));
      EXPECT_EQ(v - base, granule(scratch) + granule(ukt));
    }
    // Either way the scratch's bytes were live together with the pair at the peak.
    EXPECT_EQ(alloc.stats().peak_allocated, granule(ukt) + granule(uv) + granule(scratch));
    EXPECT_EQ(read(layer.w_uk_t()), std::vector<float>(4 * 64 * 128, 1.0f));
  }
}

TEST(AllocationOrders, StagedQuantizedCopyIsPartOfTheTransientPeak) {
  TensorMap m;
  add_fp8(m, 0);
  CachingAllocator alloc(make_host_backing());
  AbsorbOptions opt;
  opt.quant = fp8_tiny_options();
  opt.stage_quantized = true;
  opt.scratch_dtype = DType::kF32;
  AbsorbedLayer layer;
  ASSERT_TRUE(absorb_kv_b_proj(m, kvb(0), kTiny, alloc, opt, layer).ok());
  expect_pair(layer, kFp8Ukt, kFp8Uv, "staged");
  // Pair 24 + 16 bf16, staged weight 40 B + scales 24 B, scratch 40 f32: each one granule.
  EXPECT_EQ(alloc.stats().peak_allocated, 5 * 512u);
  EXPECT_EQ(alloc.stats().allocated_bytes, 2 * 512u);
}

// ---- the GLM-5.2 TP4 experiment ---------------------------------------------------------------------

StatusOr<AbsorbMemoryReport> glm52_tp4(WeightEncoding enc, const AbsorbMemoryOptions& mem, int layers = 0) {
  ModelConfig cfg = find_model_preset("glm-5.2")->config;
  if (layers > 0) {
    cfg.num_layers = layers;
    cfg.num_mtp_layers = 0;
    cfg.indexer_layers = std::min(cfg.indexer_layers, layers);
  }
  synthetic::KvBProjCheckpointSpec spec;
  spec.layers = cfg.cache_layers();
  spec.encoding = enc;
  MLAKV_ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> src, synthetic::make_kv_b_proj_checkpoint(cfg, spec));
  AbsorbModelOptions opt;
  opt.tp_size = 4;
  return measure_absorb_memory(*src, cfg, opt, mem);
}

struct Pinned {
  WeightEncoding enc;
  std::size_t quantized_per_layer;          // the rank's tensors, from the format's shapes
  std::size_t sf_rbu, pf_rbu;               // reserved but unallocated after loading
  std::size_t sf_rbu_ec, pf_rbu_ec;         // ... after empty_cache
  std::size_t sf_reserved, pf_reserved;     // after loading
};

TEST(AbsorbMemory, Glm52Tp4PreallocationDoesNotIncreaseFragmentation) {
  // GLM-5.2 at TP4: 79 cache layers (78 + MTP), 16 heads per rank, P 192, V 256, L 512.
  // Per layer: W_UK_T 3 MiB + W_UV 4 MiB bf16, scratch [7168, 512] bf16 7 MiB, and the
  // rank's quantized kv_b_proj kept on a 96 GiB device. Figures quoted in docs/absorb.md.
  const std::size_t N = 7168, L = 512;
  const Pinned cases[] = {
      {WeightEncoding::kFp8Block, N * L + (N / 128) * (L / 128) * 4,  // e4m3 weight + f32 scale_inv
       114213888, 96912384, 114213888, 96912384, 1008730112, 966787072},
      {WeightEncoding::kModelOptNvfp4, N * L / 2 + N * (L / 16) + 4,  // packed e2m1 + e4m3 scales + scale_2
       33481216, 33481216, 33481216, 12509696, 794820608, 794820608},
  };
  for (const Pinned& c : cases) {
    const std::string what(weight_encoding_name(c.enc));
    StatusOr<AbsorbMemoryReport> r = glm52_tp4(c.enc, {});
    ASSERT_TRUE(r.ok()) << what << ": " << r.status().to_string();
    EXPECT_EQ(r->layers, 79);
    EXPECT_EQ(r->rank_geometry.num_heads, 16);
    EXPECT_EQ(r->pair_bytes_per_layer, 7 * MiB);
    EXPECT_EQ(r->scratch_bytes_per_layer, 7 * MiB);
    EXPECT_EQ(r->quantized_bytes_per_layer, c.quantized_per_layer) << what;
    const AbsorbMemoryRun& sf = r->scratch_first;
    const AbsorbMemoryRun& pf = r->persistent_first;
    for (const AbsorbMemoryRun* run : {&sf, &pf}) {
      EXPECT_EQ(run->requested_bytes, 79 * (7 * MiB + c.quantized_per_layer)) << what;
      EXPECT_GE(run->after_load.allocated_bytes, run->requested_bytes);
      EXPECT_EQ(run->after_load.reserved_bytes - run->after_load.allocated_bytes,
                run->after_load.reserved_but_unallocated);
      EXPECT_EQ(run->after_load.num_allocations, 79u * (2 + (c.enc == WeightEncoding::kFp8Block ? 2 : 3)));
    }
    // The pin: persistent-first never holds more reserved-but-unallocated memory, nor
    // reserves more, and leaves at least as large a KV cache allocation.
    EXPECT_LE(pf.after_load.reserved_but_unallocated, sf.after_load.reserved_but_unallocated) << what;
    EXPECT_LE(pf.after_empty_cache.reserved_but_unallocated, sf.after_empty_cache.reserved_but_unallocated) << what;
    EXPECT_LE(pf.after_empty_cache.reserved_bytes, sf.after_empty_cache.reserved_bytes) << what;
    EXPECT_GE(pf.kv_cache_max_bytes, sf.kv_cache_max_bytes) << what;
    // The measured figures (docs/absorb.md).
    EXPECT_EQ(sf.after_load.reserved_but_unallocated, c.sf_rbu) << what;
    EXPECT_EQ(pf.after_load.reserved_but_unallocated, c.pf_rbu) << what;
    EXPECT_EQ(sf.after_empty_cache.reserved_but_unallocated, c.sf_rbu_ec) << what;
    EXPECT_EQ(pf.after_empty_cache.reserved_but_unallocated, c.pf_rbu_ec) << what;
    EXPECT_EQ(sf.after_load.reserved_bytes, c.sf_reserved) << what;
    EXPECT_EQ(pf.after_load.reserved_bytes, c.pf_reserved) << what;
  }
}

TEST(AbsorbMemory, InterleavedLayerWeightsShowTheLegacyOrdersHoles) {
  // docs/absorb.md "why": with 5 MiB of other weights per layer the legacy order lets
  // each layer's persistent tensors take the previous scratch's 7 MiB hole and leave
  // 2 MiB that no later request fits; persistent-first keeps the scratch on top.
  AbsorbMemoryOptions mem;
  mem.other_weights_bytes = 5 * MiB;
  StatusOr<AbsorbMemoryReport> r = glm52_tp4(WeightEncoding::kFp8Block, mem);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->scratch_first.after_load.reserved_but_unallocated, 395756544u);   // 377.4 MiB
  EXPECT_EQ(r->persistent_first.after_load.reserved_but_unallocated, 18793472u);  // 17.9 MiB
  EXPECT_EQ(r->scratch_first.after_load.num_segments, r->persistent_first.after_load.num_segments + 16);
}

TEST(AbsorbMemory, PlacementOnlyMatchesALoadThatWritesValues) {
  // The virtual device replays exactly the allocations of a real load: same figures
  // as a host backing of the same capacity that dequantizes and writes every value.
  AbsorbMemoryOptions virt, host;
  host.virtual_device = false;
  for (WeightEncoding enc : {WeightEncoding::kFp8Block, WeightEncoding::kModelOptNvfp4}) {
    StatusOr<AbsorbMemoryReport> a = glm52_tp4(enc, virt, 6), b = glm52_tp4(enc, host, 6);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
    for (auto [x, y] : {std::pair{&a->scratch_first, &b->scratch_first}, {&a->persistent_first, &b->persistent_first}}) {
      EXPECT_EQ(x->after_load.reserved_bytes, y->after_load.reserved_bytes);
      EXPECT_EQ(x->after_load.allocated_bytes, y->after_load.allocated_bytes);
      EXPECT_EQ(x->after_load.largest_free_block, y->after_load.largest_free_block);
      EXPECT_EQ(x->after_load.peak_allocated, y->after_load.peak_allocated);
      EXPECT_EQ(x->after_empty_cache.reserved_bytes, y->after_empty_cache.reserved_bytes);
    }
  }
}

TEST(AbsorbMemory, RejectsAZeroCapacityDevice) {
  TensorMap m;
  add_dense(m, 0);
  AbsorbMemoryOptions mem;
  mem.device_bytes = 0;
  StatusOr<AbsorbMemoryReport> r = measure_absorb_memory(m, tiny_config(1), {}, mem);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("device_bytes"), std::string::npos);
}

// ---- whole models, tensor parallelism -----------------------------------------------------------------

TEST(AbsorbModel, EveryLayerAndTheirOrderAndHooks) {
  ModelConfig cfg = tiny_config(2);
  cfg.num_mtp_layers = 1;  // layer 2 is the MTP layer
  TensorMap m;
  for (int i = 0; i < 3; ++i) add_dense(m, i, static_cast<float>(100 * i));
  CachingAllocator alloc(make_host_backing());
  AbsorbModelOptions opt;
  opt.absorb.dtype = DType::kF32;  // 100 i + 10 n + k is exact in f32, not in bf16
  std::vector<int> hooked, progress;
  opt.before_layer = [&](int l) {
    hooked.push_back(l);
    return Status::Ok();
  };
  opt.progress = [&](int done, int total) { progress.push_back(done * 10 + total); };
  StatusOr<std::vector<AbsorbedLayer>> layers = absorb_model(m, cfg, alloc, opt);
  ASSERT_TRUE(layers.ok()) << layers.status().to_string();
  ASSERT_EQ(layers->size(), 3u);
  EXPECT_EQ(hooked, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(progress, (std::vector<int>{13, 23, 33}));
  for (int i = 0; i < 3; ++i) {
    std::vector<float> ukt = kDenseUkt, uv = kDenseUv;
    for (float& x : ukt) x += static_cast<float>(100 * i);
    for (float& x : uv) x += static_cast<float>(100 * i);
    EXPECT_EQ((*layers)[static_cast<std::size_t>(i)].layer, i);
    expect_pair((*layers)[static_cast<std::size_t>(i)], ukt, uv, fmt::format("layer {}", i));
  }
  opt.include_mtp = false;
  StatusOr<std::vector<AbsorbedLayer>> no_mtp = absorb_model(m, cfg, alloc, opt);
  ASSERT_TRUE(no_mtp.ok());
  EXPECT_EQ(no_mtp->size(), 2u);
  // A hook's error stops the load and names the layer.
  opt.before_layer = [](int l) { return l == 1 ? resource_exhausted("no room for o_proj") : Status::Ok(); };
  StatusOr<std::vector<AbsorbedLayer>> stopped = absorb_model(m, cfg, alloc, opt);
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(stopped.status().message().find("layer 1"), std::string::npos) << stopped.status().message();
}

TEST(TensorParallel, EachRankHoldsItsHeadsOfTheFullAbsorption) {
  // H = 4, P = 3, V = 2, L = 4: N = 20, 10 rows per rank of tp 2. fp8 blocks of 5 rows.
  const ModelConfig cfg = tiny_config(1, 4);
  TensorMap dense, fp8;
  std::vector<float> w(80);
  std::vector<uint8_t> q(80);
  for (int n = 0; n < 20; ++n) {
    for (int k = 0; k < 4; ++k) {
      w[static_cast<std::size_t>(n * 4 + k)] = static_cast<float>(10 * n + k);
      q[static_cast<std::size_t>(n * 4 + k)] = e4m3_int((n + k) % 8 - 1);
    }
  }
  put(dense, kvb(0) + "weight", DType::kF32, {20, 4}, w);
  put(fp8, kvb(0) + "weight", DType::kF8E4M3, {20, 4}, q);
  put(fp8, kvb(0) + "weight_scale_inv", DType::kF32, {4, 2}, std::vector<float>{1, 2, 4, 8, 0.5f, 0.25f, 16, 32});
  for (const TensorMap* src : {&dense, &fp8}) {
    CachingAllocator alloc(make_host_backing());
    AbsorbModelOptions opt;
    opt.absorb.dtype = DType::kF32;
    opt.absorb.quant.fp8_block_rows = 5;
    opt.absorb.quant.fp8_block_cols = 2;
    StatusOr<std::vector<AbsorbedLayer>> full = absorb_model(*src, cfg, alloc, opt);
    ASSERT_TRUE(full.ok()) << full.status().to_string();
    const std::vector<float> fk = read((*full)[0].w_uk_t()), fv = read((*full)[0].w_uv());
    for (int rank = 0; rank < 2; ++rank) {
      opt.tp_size = 2;
      opt.tp_rank = rank;
      StatusOr<std::vector<AbsorbedLayer>> part = absorb_model(*src, cfg, alloc, opt);
      ASSERT_TRUE(part.ok()) << part.status().to_string();
      EXPECT_EQ((*part)[0].geometry.num_heads, 2);
      const std::size_t hk = 3 * 4, hv = 4 * 2;  // per-head elements of W_UK_T and W_UV
      EXPECT_EQ(read((*part)[0].w_uk_t()),
                std::vector<float>(fk.begin() + rank * 2 * hk, fk.begin() + (rank + 1) * 2 * hk));
      EXPECT_EQ(read((*part)[0].w_uv()),
                std::vector<float>(fv.begin() + rank * 2 * hv, fv.begin() + (rank + 1) * 2 * hv));
    }
  }
  // Rank 1 of the dense weight, by hand: heads 2, 3 = rows 10..19; W_UK_T[0][0] = W[10] = 100..103.
  CachingAllocator alloc(make_host_backing());
  AbsorbModelOptions opt;
  opt.tp_size = 2;
  opt.tp_rank = 1;
  StatusOr<std::vector<AbsorbedLayer>> r1 = absorb_model(dense, cfg, alloc, opt);
  ASSERT_TRUE(r1.ok());
  const std::vector<float> k1 = read((*r1)[0].w_uk_t());
  EXPECT_EQ(std::vector<float>(k1.begin(), k1.begin() + 4), (std::vector<float>{100, 101, 102, 103}));
}

TEST(TensorParallel, UnsupportedSplitsAreReported) {
  const ModelConfig cfg = tiny_config(1, 4);
  CachingAllocator alloc(make_host_backing());
  AbsorbModelOptions opt;
  opt.tp_size = 3;  // does not divide 4 heads
  TensorMap dense;
  add_dense(dense, 0);
  StatusOr<std::vector<AbsorbedLayer>> r = absorb_model(dense, cfg, alloc, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tp_size 3 does not divide"), std::string::npos) << r.status().message();
  opt.tp_size = 2;
  opt.tp_rank = 2;
  r = absorb_model(dense, cfg, alloc, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tp_rank 2"), std::string::npos) << r.status().message();

  // fp8 blocks of 128 rows cannot be split into 10-row ranks.
  TensorMap fp8;
  put(fp8, kvb(0) + "weight", DType::kF8E4M3, {20, 4}, std::vector<uint8_t>(80, 0x38));
  put(fp8, kvb(0) + "weight_scale_inv", DType::kF32, {1, 1}, std::vector<float>{1});
  opt.tp_rank = 0;
  r = absorb_model(fp8, cfg, alloc, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("layer 0"), std::string::npos);
  EXPECT_NE(r.status().message().find("not a multiple of the fp8 block rows 128"), std::string::npos)
      << r.status().message();

  // GPTQ shards are columns of qweight: not implemented for tp > 1. H 4, P 4, V 4, L 8:
  // qweight [L/8, N] = [1, 32], qzeros [1, 4], scales [1, 32].
  TensorMap gptq;
  put(gptq, kvb(0) + "qweight", DType::kI32, {1, 32}, std::vector<int32_t>(32, 0x76543210));
  put(gptq, kvb(0) + "qzeros", DType::kI32, {1, 4}, std::vector<int32_t>(4, 0x77777777));
  put(gptq, kvb(0) + "scales", DType::kF16, {1, 32}, std::vector<uint16_t>(32, 0x3C00));  // 1.0
  r = absorb_model(gptq, tiny_config(1, 4, 4, 4, 8), alloc, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("tensor-parallel slicing of a gptq kv_b_proj"), std::string::npos)
      << r.status().message();
  opt.tp_size = 1;  // the same tensors absorb unsplit
  EXPECT_TRUE(absorb_model(gptq, tiny_config(1, 4, 4, 4, 8), alloc, opt).ok());
  EXPECT_EQ(alloc.stats().num_allocations, 0u);  // failed calls left nothing allocated
}

// ---- reload ----------------------------------------------------------------------------------------

TEST(Reload, CompatibleReloadKeepsEveryAddressAndWritesTheNewValues) {
  const ModelConfig cfg = tiny_config(3);
  TensorMap first, second;
  for (int i = 0; i < 3; ++i) {
    add_dense(first, i);
    add_dense(second, i, 1000.0f + i);
  }
  CachingAllocator alloc(make_host_backing());
  AbsorbModelOptions opt;
  opt.absorb.dtype = DType::kF32;  // 1000 + i + 10 n + k is exact in f32, not in bf16
  StatusOr<std::vector<AbsorbedLayer>> layers = absorb_model(first, cfg, alloc, opt);
  ASSERT_TRUE(layers.ok()) << layers.status().to_string();
  std::vector<std::pair<void*, void*>> addr;
  for (const AbsorbedLayer& l : *layers) addr.emplace_back(l.w_uk_t_storage.data(), l.w_uv_storage.data());
  const AllocatorStats before = alloc.stats();

  for (AllocationOrder order : {AllocationOrder::kPersistentFirst, AllocationOrder::kScratchFirst}) {
    opt.absorb.order = order;
    StatusOr<std::vector<LayerStorageChange>> changes = reload_model(second, cfg, alloc, opt, *layers);
    ASSERT_TRUE(changes.ok()) << changes.status().to_string();
    ASSERT_EQ(changes->size(), 3u);
    for (int i = 0; i < 3; ++i) {
      const LayerStorageChange& c = (*changes)[static_cast<std::size_t>(i)];
      EXPECT_EQ(c.layer, i);
      EXPECT_TRUE(c.had_pair);
      EXPECT_TRUE(c.reused) << c.reason;
      EXPECT_TRUE(c.reason.empty());
      const AbsorbedLayer& l = (*layers)[static_cast<std::size_t>(i)];
      EXPECT_EQ(l.w_uk_t_storage.data(), addr[static_cast<std::size_t>(i)].first);
      EXPECT_EQ(l.w_uv_storage.data(), addr[static_cast<std::size_t>(i)].second);
      std::vector<float> ukt = kDenseUkt, uv = kDenseUv;
      for (float& x : ukt) x += 1000.0f + static_cast<float>(i);
      for (float& x : uv) x += 1000.0f + static_cast<float>(i);
      expect_pair(l, ukt, uv, fmt::format("layer {} after reload", i));
    }
    // No new persistent storage: the same live blocks, nothing new reserved.
    EXPECT_EQ(alloc.stats().num_allocations, before.num_allocations);
    EXPECT_EQ(alloc.stats().allocated_bytes, before.allocated_bytes);
    EXPECT_EQ(alloc.stats().reserved_bytes, before.reserved_bytes);
  }
}

TEST(Reload, IncompatibleReloadAllocatesNewStorageAndSaysWhy) {
  const ModelConfig cfg = tiny_config(2);
  TensorMap m;
  for (int i = 0; i < 2; ++i) add_dense(m, i);
  CachingAllocator alloc(make_host_backing());
  AbsorbModelOptions opt;
  StatusOr<std::vector<AbsorbedLayer>> layers = absorb_model(m, cfg, alloc, opt);
  ASSERT_TRUE(layers.ok());
  const void* old0 = (*layers)[0].w_uk_t_storage.data();

  opt.absorb.dtype = DType::kF32;  // bf16 -> f32: a different storage size
  StatusOr<std::vector<LayerStorageChange>> changes = reload_model(m, cfg, alloc, opt, *layers);
  ASSERT_TRUE(changes.ok()) << changes.status().to_string();
  for (int i = 0; i < 2; ++i) {
    const LayerStorageChange& c = (*changes)[static_cast<std::size_t>(i)];
    EXPECT_EQ(c.layer, i);
    EXPECT_TRUE(c.had_pair);
    EXPECT_FALSE(c.reused);
    EXPECT_EQ(c.reason, "dtype bf16 -> f32");
    EXPECT_EQ((*layers)[static_cast<std::size_t>(i)].dtype, DType::kF32);
    expect_pair((*layers)[static_cast<std::size_t>(i)], kDenseUkt, kDenseUv, "f32 after reload");
  }
  EXPECT_NE((*layers)[0].w_uk_t_storage.data(), old0);
  EXPECT_EQ(alloc.stats().num_allocations, 4u);  // the old pairs were released

  // A different head count (same layers): shapes change, and the change says which.
  const KvBProjGeometry g4{4, 3, 2, 4};
  TensorMap m4;
  put(m4, kvb(0) + "weight", DType::kF32, {20, 4}, std::vector<float>(80, 2.0f));
  AbsorbedLayer& l0 = (*layers)[0];
  LayerStorageChange c;
  AbsorbOptions o;
  o.dtype = DType::kF32;
  ASSERT_TRUE(absorb_kv_b_proj(m4, kvb(0), g4, alloc, o, l0, &c).ok());
  EXPECT_EQ(c.layer, 0);
  EXPECT_FALSE(c.reused);
  EXPECT_EQ(c.reason, "W_UK_T [2, 3, 4] -> [4, 3, 4], W_UV [2, 4, 2] -> [4, 4, 2]");
  EXPECT_EQ(read(l0.w_uv()), std::vector<float>(32, 2.0f));

  // Different device: a layer whose pair claims to live elsewhere is not reused.
  l0.device = Device::cuda(1);
  ASSERT_TRUE(absorb_kv_b_proj(m4, kvb(0), g4, alloc, o, l0, &c).ok());
  EXPECT_EQ(c.reason, "device cuda:1 -> cpu");
  EXPECT_EQ(l0.device, Device::cpu());
}

TEST(Reload, AFailedReloadLeavesTheLayerUntouched) {
  TensorMap good, bad;
  add_fp8(good, 0);
  add_fp8(bad, 0);
  put(bad, kvb(0) + "weight_scale_inv", DType::kF32, {3, 2},
      std::vector<float>{1, 2, std::nanf(""), 4, 0.25f, 8});
  CachingAllocator alloc(make_host_backing());
  AbsorbOptions opt;
  opt.quant = fp8_tiny_options();
  AbsorbedLayer layer;
  ASSERT_TRUE(absorb_kv_b_proj(good, kvb(0), kTiny, alloc, opt, layer).ok());
  void* k = layer.w_uk_t_storage.data();
  for (AllocationOrder order : {AllocationOrder::kPersistentFirst, AllocationOrder::kScratchFirst}) {
    for (DType dt : {DType::kBF16, DType::kF32}) {  // compatible and incompatible reloads
      opt.order = order;
      opt.dtype = dt;
      LayerStorageChange change;
      change.layer = 42;
      const Status st = absorb_kv_b_proj(bad, kvb(0), kTiny, alloc, opt, layer, &change);
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.code(), StatusCode::kDataLoss);
      EXPECT_NE(st.message().find("weight_scale_inv"), std::string::npos) << st.message();
      EXPECT_EQ(change.layer, 42);  // untouched
      EXPECT_EQ(layer.w_uk_t_storage.data(), k);
      EXPECT_EQ(layer.dtype, DType::kBF16);
      expect_pair(layer, kFp8Ukt, kFp8Uv, "after a failed reload");
      EXPECT_EQ(alloc.stats().num_allocations, 2u);
    }
  }
}

TEST(Reload, ModelConfigMismatchIsAPrecondition) {
  TensorMap m;
  for (int i = 0; i < 3; ++i) add_dense(m, i);
  CachingAllocator alloc(make_host_backing());
  AbsorbModelOptions opt;
  StatusOr<std::vector<AbsorbedLayer>> layers = absorb_model(m, tiny_config(2), alloc, opt);
  ASSERT_TRUE(layers.ok());
  StatusOr<std::vector<LayerStorageChange>> r = reload_model(m, tiny_config(3), alloc, opt, *layers);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("2 absorbed layers held, model tiny gives 3"), std::string::npos)
      << r.status().message();
}

// ---- paths that allocate nothing, virtual devices ---------------------------------------------------

TEST(AbsorbPaths, QuantizedBmmPathAllocatesNothingAndReleasesAnOldPair) {
  TensorMap m;
  add_fp8(m, 0);
  CachingAllocator alloc(make_host_backing());
  AbsorbOptions opt;
  opt.quant = fp8_tiny_options();
  opt.path = AbsorbPath::kQuantizedBmm;
  AbsorbedLayer layer;
  LayerStorageChange c;
  ASSERT_TRUE(absorb_kv_b_proj(m, kvb(0), kTiny, alloc, opt, layer, &c).ok());
  EXPECT_FALSE(layer.has_pair());
  EXPECT_EQ(layer.w_uk_t().data, nullptr);
  EXPECT_EQ(layer.device, Device::cpu());  // resolved from the storage tensor
  EXPECT_EQ(layer.source_encoding, WeightEncoding::kFp8Block);
  EXPECT_EQ(alloc.stats().num_backing_allocs, 0u);
  EXPECT_EQ(alloc.stats().peak_allocated, 0u);

  opt.path = AbsorbPath::kActivation;
  ASSERT_TRUE(absorb_kv_b_proj(m, kvb(0), kTiny, alloc, opt, layer, &c).ok());
  ASSERT_TRUE(layer.has_pair());
  opt.path = AbsorbPath::kQuantizedBmm;
  ASSERT_TRUE(absorb_kv_b_proj(m, kvb(0), kTiny, alloc, opt, layer, &c).ok());
  EXPECT_FALSE(layer.has_pair());
  EXPECT_TRUE(c.had_pair);
  EXPECT_FALSE(c.reused);
  EXPECT_NE(c.reason.find("keeps no absorbed pair"), std::string::npos);
  EXPECT_EQ(alloc.stats().num_allocations, 0u);
}

TEST(AbsorbPaths, VirtualDeviceNeedsPlacementOnly) {
  TensorMap m;
  add_dense(m, 0);
  CachingAllocator alloc(make_virtual_backing(1 * GiB));
  AbsorbOptions opt;
  AbsorbedLayer layer;
  Status st = absorb_kv_b_proj(m, kvb(0), kTiny, alloc, opt, layer);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("cuda:0"), std::string::npos) << st.message();
  EXPECT_EQ(alloc.stats().num_backing_allocs, 0u);
  opt.placement_only = true;
  st = absorb_kv_b_proj(m, kvb(0), kTiny, alloc, opt, layer);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(layer.has_pair());
  EXPECT_FALSE(layer.values_written);
  EXPECT_EQ(layer.device, Device::cuda(0));
  EXPECT_EQ(layer.w_uk_t().device, Device::cuda(0));
  EXPECT_EQ(alloc.stats().peak_allocated, 3 * 512u);  // pair + scratch, one granule each
}

// ---- errors ----------------------------------------------------------------------------------------

TEST(AbsorbErrors, MissingTensorsOfEveryLayerAreListedBeforeAnythingIsAllocated) {
  TensorMap m;
  add_fp8(m, 0);
  put(m, kvb(1) + "weight", DType::kF8E4M3, {10, 4}, std::vector<uint8_t>(40, 0x38));  // no scales
  // layer 2: nothing at all
  CachingAllocator alloc(make_host_backing());
  AbsorbModelOptions opt;
  opt.absorb.quant = fp8_tiny_options();
  StatusOr<std::vector<AbsorbedLayer>> r = absorb_model(m, tiny_config(3), alloc, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  const std::string msg = r.status().message();
  for (const char* want : {"missing for 2 of 3 layers", "model.layers.1.self_attn.kv_b_proj.weight_scale_inv",
                           "model.layers.2.self_attn.kv_b_proj.weight,", "model.layers.2.self_attn.kv_b_proj.weight_scale_inv",
                           "(3 tensors)"}) {
    EXPECT_NE(msg.find(want), std::string::npos) << want << " in: " << msg;
  }
  EXPECT_EQ(msg.find("model.layers.0"), std::string::npos) << msg;
  EXPECT_EQ(alloc.stats().num_backing_allocs, 0u);

  // One layer on its own: the prefix, every missing name and what the prefix holds.
  AbsorbedLayer layer;
  AbsorbOptions o;
  o.quant.encoding = WeightEncoding::kModelOptNvfp4;
  const Status st = absorb_kv_b_proj(m, kvb(1), kTiny, alloc, o, layer);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("kv_b_proj.weight_scale, model.layers.1.self_attn.kv_b_proj.weight_scale_2"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("tensors under the prefix: model.layers.1.self_attn.kv_b_proj.weight"),
            std::string::npos)
      << st.message();
}

TEST(AbsorbErrors, WrongShapesNameTheTensorAndBothShapes) {
  CachingAllocator alloc(make_host_backing());
  AbsorbedLayer layer;
  AbsorbOptions opt;
  // Storage of the wrong shape: the config says [10, 4].
  TensorMap a;
  put(a, kvb(0) + "weight", DType::kF32, {10, 5}, std::vector<float>(50, 1.0f));
  Status st = absorb_kv_b_proj(a, kvb(0), kTiny, alloc, opt, layer);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  for (const char* want : {"model.layers.0.self_attn.kv_b_proj.weight: shape [10, 5]", "stored as [10, 4]",
                           "2 heads x (qk_nope_head_dim 3 + v_head_dim 2), kv_lora_rank 4"}) {
    EXPECT_NE(st.message().find(want), std::string::npos) << want << " in: " << st.message();
  }
  // A scale grid of the wrong shape: the dequantizer names it.
  TensorMap b;
  add_fp8(b, 0);
  put(b, kvb(0) + "weight_scale_inv", DType::kF32, {2, 2}, std::vector<float>(4, 1.0f));
  opt.quant = fp8_tiny_options();
  st = absorb_kv_b_proj(b, kvb(0), kTiny, alloc, opt, layer);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("weight_scale_inv: expected shape [3, 2], got [2, 2]"), std::string::npos)
      << st.message();
  EXPECT_FALSE(layer.has_pair());
  EXPECT_EQ(alloc.stats().num_allocations, 0u);
}

TEST(AbsorbErrors, CheckpointAndConfigDisagree) {
  // The checkpoint has 2 heads ([10, 4]); the config claims 3 heads and L = 4.
  TensorMap m;
  add_dense(m, 0);
  CachingAllocator alloc(make_host_backing());
  StatusOr<std::vector<AbsorbedLayer>> r = absorb_model(m, tiny_config(1, 3), alloc, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("layer 0: model.layers.0.self_attn.kv_b_proj.weight: shape [10, 4] does not "
                                      "match the model config"),
            std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("stored as [15, 4]"), std::string::npos) << r.status().message();
  // An invalid config is reported as such.
  ModelConfig broken = tiny_config(1);
  broken.kv_lora_rank = 0;
  r = absorb_model(m, broken, alloc, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("kv_lora_rank"), std::string::npos) << r.status().message();
}

TEST(AbsorbErrors, InvalidOptionsAndGeometry) {
  TensorMap m;
  add_dense(m, 0);
  CachingAllocator alloc(make_host_backing());
  AbsorbedLayer layer;
  AbsorbOptions opt;
  opt.dtype = DType::kF16;
  Status st = absorb_kv_b_proj(m, kvb(0), kTiny, alloc, opt, layer);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("dtype f16 is not an activation dtype"), std::string::npos) << st.message();
  opt.dtype = DType::kBF16;
  opt.scratch_dtype = DType::kI32;
  st = absorb_kv_b_proj(m, kvb(0), kTiny, alloc, opt, layer);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("scratch_dtype i32"), std::string::npos) << st.message();
  opt.scratch_dtype.reset();
  st = absorb_kv_b_proj(m, kvb(0), KvBProjGeometry{2, 0, 2, 4}, alloc, opt, layer);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("qk_nope_head_dim 0"), std::string::npos) << st.message();
  EXPECT_EQ(alloc.stats().num_backing_allocs, 0u);
}

// ---- synthetic checkpoints --------------------------------------------------------------------------

TEST(SyntheticWeights, ServeEveryLayerAndDequantizeToTheIntendedScale) {
  ModelConfig cfg = tiny_config(3, 4, 16, 16, 64);  // N = 128, L = 64
  for (WeightEncoding enc : {WeightEncoding::kDense, WeightEncoding::kFp8Block, WeightEncoding::kModelOptNvfp4,
                             WeightEncoding::kCompressedTensorsNvfp4}) {
    synthetic::KvBProjCheckpointSpec spec;
    spec.layers = 3;
    spec.encoding = enc;
    StatusOr<std::unique_ptr<TensorSource>> src = synthetic::make_kv_b_proj_checkpoint(cfg, spec);
    ASSERT_TRUE(src.ok()) << src.status().to_string();
    const std::vector<std::string> names = (*src)->names();
    EXPECT_EQ(names.size() % 3, 0u);
    for (const std::string& n : names) EXPECT_TRUE((*src)->find(n).has_value()) << n;
    EXPECT_FALSE((*src)->find(kvb(3) + "weight").has_value());
    EXPECT_FALSE((*src)->find("model.layers.01.self_attn.kv_b_proj.weight").has_value());
    StatusOr<WeightEncoding> detected = detect_weight_encoding(**src, kvb(2));
    ASSERT_TRUE(detected.ok());
    EXPECT_EQ(*detected, enc);
    std::vector<float> w(128 * 64);
    ASSERT_TRUE(dequantize_weight(**src, kvb(2), 128, 64, {}, TensorView::contiguous(w.data(), DType::kF32, {128, 64}))
                    .ok());
    double ss = 0;
    for (float x : w) ss += static_cast<double>(x) * x;
    const double rms = std::sqrt(ss / static_cast<double>(w.size()));
    // N(0, 0.02^2) over 8192 samples: the sample RMS is within 3% of 0.02 with
    // overwhelming probability; fp4's coarse grid adds < 10% RMS error.
    EXPECT_NEAR(rms, 0.02, 0.02 * 0.12) << weight_encoding_name(enc);
  }
  synthetic::KvBProjCheckpointSpec spec;
  spec.layers = 0;
  EXPECT_EQ(synthetic::make_kv_b_proj_checkpoint(cfg, spec).status().code(), StatusCode::kInvalidArgument);
  spec.layers = 1;
  spec.encoding = WeightEncoding::kGptq;
  EXPECT_EQ(synthetic::make_kv_b_proj_checkpoint(cfg, spec).status().code(), StatusCode::kUnimplemented);
}

// ---- the command line ------------------------------------------------------------------------------

std::string slurp(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return "";
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  return text;
}

TEST(AbsorbCli, ReportJsonCarriesTheLibraryFigures) {
  const std::string out = ::testing::TempDir() + "absorb_report.json";
  const std::string cmd = std::string(MLAKV_CLI_PATH) +
                          " absorb --synthetic glm-5.2 --tp 4 --encoding fp8 --report --json >" + out + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const nlohmann::json j = nlohmann::json::parse(slurp(out));
  EXPECT_EQ(j["layers"], 79);
  EXPECT_EQ(j["heads_per_rank"], 16);
  EXPECT_EQ(j["scratch_first"]["reserved_but_unallocated_bytes"], 114213888u);
  EXPECT_EQ(j["persistent_first"]["reserved_but_unallocated_bytes"], 96912384u);
  EXPECT_EQ(j["reserved_but_unallocated_change_bytes"], 96912384 - 114213888);

  const std::string bad = std::string(MLAKV_CLI_PATH) + " absorb --synthetic glm-5.2 --encoding gptq --report 2>" +
                          out + " >/dev/null";
  EXPECT_NE(std::system(bad.c_str()), 0);
}

TEST(AbsorbCli, CheckpointDirectoryWithItsQuantizationConfig) {
  // A two-layer checkpoint: config.json (fp8 blocks of 4 x 2 rows x columns, which only
  // its quantization_config says) and model.safetensors with the hand-worked fp8 layer.
  const std::string dir = ::testing::TempDir() + "absorb_ckpt_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  {
    std::FILE* f = std::fopen((dir + "/config.json").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string cfg = R"({"model_type": "deepseek_v3", "hidden_size": 8, "num_hidden_layers": 2,
      "num_attention_heads": 2, "kv_lora_rank": 4, "qk_nope_head_dim": 3, "qk_rope_head_dim": 2, "v_head_dim": 2,
      "q_lora_rank": null, "num_nextn_predict_layers": 0, "rope_theta": 10000,
      "quantization_config": {"quant_method": "fp8", "weight_block_size": [4, 2]}})";
    std::fwrite(cfg.data(), 1, cfg.size(), f);
    std::fclose(f);
  }
  TensorMap m;
  add_fp8(m, 0);
  add_fp8(m, 1);
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const std::string& n : m.names()) tensors.emplace_back(n, *m.find(n));
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", tensors).ok());

  const std::string cli = std::string(MLAKV_CLI_PATH);
  const std::string out = dir + "/out.json", err = dir + "/err.txt", absorbed = dir + "/absorbed.safetensors";
  ASSERT_EQ(std::system((cli + " absorb " + dir + " --json --out " + absorbed + " >" + out + " 2>" + err).c_str()), 0)
      << slurp(err);
  const nlohmann::json j = nlohmann::json::parse(slurp(out));
  EXPECT_EQ(j["layers"], 2);
  EXPECT_EQ(j["encoding"], "fp8_block");
  StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(absorbed);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  for (int layer = 0; layer < 2; ++layer) {
    std::optional<TensorView> k = (*file)->find(fmt::format("model.layers.{}.self_attn.W_UK_T", layer));
    std::optional<TensorView> v = (*file)->find(fmt::format("model.layers.{}.self_attn.W_UV", layer));
    ASSERT_TRUE(k && v);
    EXPECT_EQ(k->shape_string(), "[2, 3, 4]");
    EXPECT_EQ(v->shape_string(), "[2, 4, 2]");
    EXPECT_EQ(read(*k), kFp8Ukt);
    EXPECT_EQ(read(*v), kFp8Uv);
  }
  ASSERT_EQ(std::system((cli + " absorb " + dir + " --report --gpu-mem 1 --json >" + out + " 2>" + err).c_str()), 0)
      << slurp(err);
  const nlohmann::json rep = nlohmann::json::parse(slurp(out));
  EXPECT_EQ(rep["layers"], 2);
  EXPECT_EQ(rep["quantized_bytes_per_layer"], 40 + 24);  // e4m3 [10, 4] + f32 [3, 2]
  // Two ranks would need 5-row fp8 blocks: the error names the problem.
  EXPECT_NE(std::system((cli + " absorb " + dir + " --tp 2 >" + out + " 2>" + err).c_str()), 0);
  EXPECT_NE(slurp(err).find("error: layer 0: model.layers.0.self_attn.kv_b_proj.weight_scale_inv: the rank's 5 "
                            "rows are not a multiple of the fp8 block rows 4"),
            std::string::npos)
      << slurp(err);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mlakv
