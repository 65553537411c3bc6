// The model runner's matrix products (mlakv::linear_cpu, src/model/linear.h) at
// DeepSeek-V2-Lite prefill and decode shapes, bf16 weights x f32 activations, beside the
// single-thread FMA ceiling measured in the same binary (mlakv/roofline.h).
//   GFLOP/s              2 * T * N * K per call
//   fma_frac_per_thread  GFLOP/s / (threads x single-thread FMA ceiling)
//   weight_GB/s          weight bytes read per second (what bounds decode, T = 1)
//   best_GFLOP/s, best_fma_frac   the fastest single call (wall clock) against the best of
//                        several FMA-ceiling probes taken right after: on a machine shared
//                        with other jobs the mean rates mix in other processes' time, the
//                        best-of pair compares like with like.
// Threads: MLAKV_THREADS (default: all hardware threads).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "cpu_bench_util.h"

#include "mlakv/cache.h"
#include "mlakv/latent_transform.h"
#include "mlakv/model.h"
#include "mlakv/roofline.h"
#include "mlakv/numerics.h"
#include "mlakv/thread_pool.h"

namespace {

using namespace mlakv;

using bench::fma_ceiling;
using bench::pool;
using bench::threads;

struct Gemm {
  std::vector<uint16_t> w;
  std::vector<float> x, y;
};

Gemm& gemm(int64_t T, int64_t N, int64_t K) {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<Gemm>> cache;
  auto& g = cache[{T, N, K}];
  if (g) return *g;
  g = std::make_unique<Gemm>();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  g->w.resize(static_cast<std::size_t>(N * K));
  for (auto& v : g->w) v = f32_to_bf16(nd(rng));
  g->x.resize(static_cast<std::size_t>(T * K));
  for (auto& v : g->x) v = nd(rng);
  g->y.resize(static_cast<std::size_t>(T * N));
  return *g;
}

void BM_CeilingFma1Thread(benchmark::State& state) {
  double g = 0;
  for (auto _ : state) g = cpu::measure_fma_gflops(0.2);
  state.counters["GFLOP/s"] = g;
  state.SetLabel("FMA probe");
}
BENCHMARK(BM_CeilingFma1Thread)->Iterations(3)->Unit(benchmark::kMillisecond);

// Args: T tokens, N out features, K in features.
void BM_MatmulBf16(benchmark::State& state) {
  const int64_t T = state.range(0), N = state.range(1), K = state.range(2);
  Gemm& g = gemm(T, N, K);
  const TensorView W = TensorView::contiguous(g.w.data(), DType::kBF16, {N, K});
  const TensorView X = TensorView::contiguous(g.x.data(), DType::kF32, {T, K});
  const TensorView Y = TensorView::contiguous(g.y.data(), DType::kF32, {T, N});
  const double ceiling = fma_ceiling();
  double best = 1e30;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = linear_cpu(X, W, Y, &pool());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    benchmark::DoNotOptimize(g.y.data());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double best_ceiling = 0;
  for (int i = 0; i < 5; ++i) best_ceiling = std::max(best_ceiling, cpu::measure_fma_gflops(0.03));
  const double flops = 2.0 * static_cast<double>(T * N * K);
  state.SetLabel(fmt::format("T={} N={} K={} threads={}", T, N, K, threads()));
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["fma_frac_per_thread"] =
      benchmark::Counter(flops * 1e-9 / (threads() * ceiling), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] =
      benchmark::Counter(static_cast<double>(N * K) * 2e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["fma_ceiling_1t"] = ceiling;
  state.counters["best_GFLOP/s"] = flops * 1e-9 / best;
  state.counters["best_fma_frac"] = flops * 1e-9 / best / (threads() * best_ceiling);
  state.counters["best_ceiling_1t"] = best_ceiling;
}

// DeepSeek-V2-Lite (D 2048, H 16, P+R 192, L+R 576, V 128, dense inter 10944, expert
// inter 1408): q_proj, kv_a_proj, o_proj, dense gate/up and down, one expert's gate/up.
void Shapes(benchmark::internal::Benchmark* b) {
  for (int64_t T : {1, 64, 256}) {
    b->Args({T, 3072, 2048});
    b->Args({T, 576, 2048});
    b->Args({T, 2048, 2048});
    b->Args({T, 10944, 2048});
    b->Args({T, 2048, 10944});
    b->Args({T, 1408, 2048});
  }
}
BENCHMARK(BM_MatmulBf16)->Apply(Shapes)->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseRealTime();

// Cache writers: the scalar codec (PagedKvCache::write, the spec) against the runner's
// SIMD writer (write_records_simd, src/model/record_writer.h) on 4096 tokens.
// Args: format, simd (0/1), mode (0: static outer scale; 1: the nvfp4 per-token scale mode;
// 2: the nvfp4 scale search, Nvfp4ScaleMode::kSearch, at the same static outer scale).
//   in_GB/s   float32 input bytes (576 x 4 per token) encoded per second
void BM_CacheWrite(benchmark::State& state) {
  const auto f = static_cast<KvFormat>(state.range(0));
  const bool simd = state.range(1) != 0;
  const bool token_scale = state.range(2) == 1;
  const bool search = state.range(2) == 2;
  const int64_t n = 4096;
  static std::vector<float> lat, rope;
  static std::vector<int64_t> slots;
  if (lat.empty()) {
    std::mt19937 rng(9);
    std::normal_distribution<float> nd(0.0f, 0.5f);
    lat.resize(static_cast<std::size_t>(n * kLatentDim));
    rope.resize(static_cast<std::size_t>(n * kRopeDim));
    for (float& x : lat) x = nd(rng);
    for (float& x : rope) x = nd(rng);
    slots.resize(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) slots[static_cast<std::size_t>(i)] = i;
  }
  KvCache::Config c;
  c.num_blocks = n / kDefaultBlockSize;
  c.layers = {LayerFormat{f, 1.0f, token_scale, search ? Nvfp4ScaleMode::kSearch : Nvfp4ScaleMode::kRn}};
  auto cache = std::move(PagedKvCache::create_cpu(c).value());
  const TensorView lv = TensorView::contiguous(lat.data(), DType::kF32, {n, kLatentDim});
  const TensorView rv = TensorView::contiguous(rope.data(), DType::kF32, {n, kRopeDim});
  for (auto _ : state) {
    const Status st = simd ? write_records_simd(*cache, 0, slots, lv, rv, &pool()) : cache->write(0, slots, lv, rv);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  }
  state.SetLabel(fmt::format("{}{} {} threads={}", format_name(f),
                             token_scale ? "+token-scale" : (search ? "+scale-search" : ""),
                             simd ? "simd" : "scalar", simd ? threads() : 1));
  state.counters["in_GB/s"] = benchmark::Counter(static_cast<double>(n) * (kLatentDim + kRopeDim) * 4e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_CacheWrite)
    ->ArgsProduct({{0, 1, 2, 3, 5}, {0, 1}, {0}})
    ->ArgsProduct({{2, 3, 5}, {0, 1}, {1}})
    ->ArgsProduct({{2, 3, 5}, {0, 1}, {2}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.3)
    ->UseRealTime();

// The SIMD writer with the mlakv recipe's latent transform fused in (centre, per-dim scale,
// 512-point signed Hadamard per token; Args: format, rope rotation 0/1) against
// BM_CacheWrite/<format>/1, the same writer without it (target: within 10%).
// BM_CacheWriteTransformSearch: the same with the nvfp4 scale search (the mlakv recipe's
// default since mlakv_latent_transform_v2; nvfp4 formats).
void cache_write_transform(benchmark::State& state, bool search) {
  const auto f = static_cast<KvFormat>(state.range(0));
  const int64_t n = 4096;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<float> lat(static_cast<std::size_t>(n * kLatentDim)), rope(static_cast<std::size_t>(n * kRopeDim));
  for (float& x : lat) x = nd(rng);
  for (float& x : rope) x = nd(rng);
  std::vector<int64_t> slots(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) slots[static_cast<std::size_t>(i)] = i;
  LatentTransformLayer tl = LatentTransformLayer::identity();
  for (float& m : tl.mu) m = 0.1f * nd(rng);
  for (float& d : tl.d) d = std::exp(0.5f * nd(rng));
  tl.rotate = true;
  tl.sign_seed = 1;
  tl.rope_rotate = state.range(1) != 0;
  tl.rope_sign_seed = 2;
  auto k = LatentTransformKernel::create(tl);
  if (!k.ok()) {
    state.SkipWithError(k.status().to_string().c_str());
    return;
  }
  KvCache::Config c;
  c.num_blocks = n / kDefaultBlockSize;
  c.layers = {LayerFormat{f, 1.0f, false, search ? Nvfp4ScaleMode::kSearch : Nvfp4ScaleMode::kRn}};
  auto cache = std::move(PagedKvCache::create_cpu(c).value());
  const TensorView lv = TensorView::contiguous(lat.data(), DType::kF32, {n, kLatentDim});
  const TensorView rv = TensorView::contiguous(rope.data(), DType::kF32, {n, kRopeDim});
  for (auto _ : state) {
    const Status st = write_records_simd(*cache, 0, slots, lv, rv, &pool(), &*k);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  }
  state.SetLabel(fmt::format("{} simd+transform{}{} threads={}", format_name(f), tl.rope_rotate ? "+rope" : "",
                             search ? "+scale-search" : "", threads()));
  state.counters["in_GB/s"] = benchmark::Counter(static_cast<double>(n) * (kLatentDim + kRopeDim) * 4e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}
void BM_CacheWriteTransform(benchmark::State& state) { cache_write_transform(state, false); }
void BM_CacheWriteTransformSearch(benchmark::State& state) { cache_write_transform(state, true); }
BENCHMARK(BM_CacheWriteTransform)
    ->ArgsProduct({{0, 1, 2, 3, 5}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.3)
    ->UseRealTime();
BENCHMARK(BM_CacheWriteTransformSearch)
    ->ArgsProduct({{2, 3, 5}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.3)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
