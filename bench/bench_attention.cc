// CPU attention per format at the shapes, beside the machine ceilings measured
// in the same binary (a large memcpy; a single-thread FMA-bound loop).
//   tokens/s      cache tokens attended per second (B x context per step)
//   cache_GB/s    record bytes read per second
//   GFLOP/s       2 * H * s_q * tokens * (576 + 512) per request
//   fma_frac_per_thread  GFLOP/s / (threads x single-thread FMA ceiling)
// Threads: MLAKV_THREADS (default: all hardware threads).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "cpu_bench_util.h"

#include "mlakv/roofline.h"
#include "mlakv/attention.h"
#include "mlakv/thread_pool.h"

namespace {

using namespace mlakv;

using bench::fma_ceiling;
using bench::pool;
using bench::threads;

struct Workload {
  std::unique_ptr<KvCache> cache;
  std::vector<int32_t> table, seqlens;
  std::vector<float> q, out, lse;
  int64_t B, s_q, H, ctx, max_blocks;
};

// One workload per (format, B, H, s_q, ctx), built once: random RMS-normed-like latents.
Workload& workload(KvFormat f, int64_t B, int64_t H, int64_t s_q, int64_t ctx) {
  static std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t>, std::unique_ptr<Workload>> cache;
  auto& slot = cache[{static_cast<int>(f), B, H, s_q, ctx}];
  if (slot) return *slot;
  slot = std::make_unique<Workload>();
  Workload& w = *slot;
  w.B = B; w.s_q = s_q; w.H = H; w.ctx = ctx;
  const int bs = kDefaultBlockSize;
  w.max_blocks = (ctx + bs - 1) / bs;
  KvCache::Config cfg;
  cfg.num_blocks = B * w.max_blocks;
  cfg.layers = {{f, 1.0f}};
  w.cache = std::move(KvCache::create_cpu(cfg).value());
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const int64_t chunk = 4096;
  std::vector<float> lat(chunk * kLatentDim), rope(chunk * kRopeDim);
  std::vector<int64_t> slots(chunk);
  for (int64_t t0 = 0; t0 < cfg.num_blocks * bs; t0 += chunk) {
    const int64_t n = std::min(chunk, cfg.num_blocks * bs - t0);
    for (int64_t i = 0; i < n * kLatentDim; ++i) lat[static_cast<std::size_t>(i)] = nd(rng);
    for (int64_t i = 0; i < n * kRopeDim; ++i) rope[static_cast<std::size_t>(i)] = nd(rng);
    std::iota(slots.begin(), slots.begin() + n, t0);
    (void)w.cache->write(0, TensorView::contiguous(slots.data(), DType::kI64, {n}),
                         TensorView::contiguous(lat.data(), DType::kF32, {n, kLatentDim}),
                         TensorView::contiguous(rope.data(), DType::kF32, {n, kRopeDim}));
  }
  w.table.resize(static_cast<std::size_t>(B * w.max_blocks));
  std::iota(w.table.begin(), w.table.end(), 0);
  w.seqlens.assign(static_cast<std::size_t>(B), static_cast<int32_t>(ctx));
  w.q.resize(static_cast<std::size_t>(B * s_q * H * kQkDim));
  for (float& x : w.q) x = nd(rng);
  w.out.resize(static_cast<std::size_t>(B * s_q * H * kLatentDim));
  w.lse.resize(static_cast<std::size_t>(B * s_q * H));
  return w;
}

void BM_CeilingFma1Thread(benchmark::State& state) {
  double g = 0;
  for (auto _ : state) g = cpu::measure_fma_gflops(0.2);
  state.counters["GFLOP/s"] = g;
  state.SetLabel(cpu_attention_isa());
}
BENCHMARK(BM_CeilingFma1Thread)->Iterations(3)->Unit(benchmark::kMillisecond);

void BM_CeilingMemcpy(benchmark::State& state) {
  double g = 0;
  for (auto _ : state) g = cpu::measure_memcpy_gbps(std::size_t{256} << 20, 3);
  state.counters["GB/s"] = g;
}
BENCHMARK(BM_CeilingMemcpy)->Iterations(2)->Unit(benchmark::kMillisecond);

void BM_Attention(benchmark::State& state) {
  const auto f = static_cast<KvFormat>(state.range(0));
  const int64_t B = state.range(1), H = state.range(2), s_q = state.range(3), ctx = state.range(4);
  Workload& w = workload(f, B, H, s_q, ctx);
  MlaAttentionParams p;
  p.q = TensorView::contiguous(w.q.data(), DType::kF32, {B, s_q, H, kQkDim});
  p.cache = *w.cache->layer(0);
  p.block_table = TensorView::contiguous(w.table.data(), DType::kI32, {B, w.max_blocks});
  p.seqlens = TensorView::contiguous(w.seqlens.data(), DType::kI32, {B});
  p.softmax_scale = 0.1352f;
  // Keep every thread busy: split the context when there are fewer requests than threads.
  p.num_splits = B >= threads() ? 1 : (threads() + static_cast<int>(B) - 1) / static_cast<int>(B);
  p.out = TensorView::contiguous(w.out.data(), DType::kF32, {B, s_q, H, kLatentDim});
  p.lse = TensorView::contiguous(w.lse.data(), DType::kF32, {B, s_q, H});
  const double ceiling = fma_ceiling();
  for (auto _ : state) {
    const Status st = mla_attention_cpu(p, {&pool()});
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    benchmark::DoNotOptimize(w.out.data());
  }
  const double tokens = static_cast<double>(B * ctx);
  const double flops = 2.0 * static_cast<double>(H * s_q) * tokens * (kQkDim + kLatentDim);
  state.SetLabel(fmt::format("{} threads={} splits={} {}", format_name(f), threads(), p.num_splits,
                             cpu_attention_isa()));
  state.counters["tokens/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["cache_GB/s"] =
      benchmark::Counter(tokens * p.cache.record_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["fma_frac_per_thread"] =
      benchmark::Counter(flops * 1e-9 / (threads() * ceiling), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["fma_ceiling_1t"] = ceiling;
}

void Shapes(benchmark::internal::Benchmark* b) {
  for (int f = 0; f < kNumKvFormats; ++f) {
    b->Args({f, 1, 16, 1, 4096});
    b->Args({f, 1, 16, 1, 32768});
    b->Args({f, 8, 128, 2, 8192});
  }
  b->ArgNames({"fmt", "B", "H", "s_q", "ctx"});
}
BENCHMARK(BM_Attention)->Apply(Shapes)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);

}  // namespace

BENCHMARK_MAIN();
